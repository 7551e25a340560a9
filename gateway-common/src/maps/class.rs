//! The classes' entries: their counters (`CLASS_STATS`), limits (`CLASS_POLICY`) and admission
//! state (`CLASS_STATE`), with the rules the datapath and the daemon read them by.

super::pinned_maps! {
    /// Per-class, per-CPU packet and admission counters ([`crate::maps::ClassStats`]).
    CLASS_STATS: u32 => ClassStats,
    /// Per-class admission limits ([`crate::maps::ClassPolicy`]).
    CLASS_POLICY: u32 => ClassPolicy,
    /// Per-class admission state ([`crate::maps::ClassState`]).
    CLASS_STATE: u32 => ClassState,
}

crate::counters! {
    /// Per-class counters. One copy per CPU; userspace sums them.
    pub struct ClassStats {
        /// Packets classified into this class.
        pub packets: u64,
        /// Bytes of those packets (whole frames).
        pub bytes: u64,
        /// Packets (or, for classes with a notion of connection or request, admissions) let through.
        pub admitted: u64,
        /// Dropped because the class's backlog was at its limit.
        pub dropped_backlog: u64,
        /// Dropped because the class's rate limit was exceeded.
        pub dropped_rate: u64,
        /// Refusals answered (a TCP reset, a SIP 503), within the class's reply rate.
        pub rejected: u64,
        /// Refusals left unanswered because the class's reply rate was spent.
        pub replies_limited: u64,
    }
}

/// Largest burst a policy may carry; the datapath clamps to it, so `burst * interval` (interval at
/// most 1e9 ns) always fits in a u64.
pub const MAX_BURST: u64 = 10_000_000;

/// [`ClassPolicy::flags`]: the backlog limit is in force.
pub const POLICY_LIMIT_BACKLOG: u64 = 1 << 0;
/// [`ClassPolicy::flags`]: the rate limit is in force.
pub const POLICY_LIMIT_RATE: u64 = 1 << 1;
/// [`ClassPolicy::flags`]: an operator fixed these limits (`policy set --pin`); the controller
/// leaves the class alone.
pub const POLICY_PINNED: u64 = 1 << 2;
/// [`ClassPolicy::flags`]: refusals are dropped silently.
pub const POLICY_REFUSE_DROP: u64 = 1 << 3;
/// [`ClassPolicy::flags`]: refusals are answered (a TCP reset, a SIP 503), within the class's
/// reply rate.
pub const POLICY_REFUSE_REJECT: u64 = 1 << 4;

/// Admission limits of one class. A limit applies only when its flag is set, so that a limit of
/// zero ("admit nothing") is distinct from "no limit".
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassPolicy {
    /// Maximum backlog (see [`ClassState::backlog`]).
    pub backlog_limit: u64,
    /// Sustained admissions per second (GCRA emission interval = 1 s / rate).
    pub rate_per_sec: u64,
    /// Admissions allowed in a burst above the sustained rate.
    pub burst: u64,
    /// `POLICY_*` bits.
    pub flags: u64,
    /// How long an admitted unit may go unanswered before it expires, in nanoseconds; 0: the
    /// class's default ([`default_timeout_ns`]).
    pub timeout_ns: u64,
    /// Who set these limits ([`crate::reasons::Owner`]). The datapath reads none of the fields
    /// from here on: they say, in `bpftool map dump` and `policy show`, who set a limit, when
    /// and why.
    pub owner: u32,
    /// Why they were last changed ([`crate::reasons::Reason`]).
    pub reason: u32,
    /// When they were last changed, `CLOCK_MONOTONIC` nanoseconds.
    pub changed_ns: u64,
    /// The lowest limit the controller may set (its lower bound); 0 with no controller.
    pub bound_min: u64,
    /// The highest limit the controller may set (its upper bound); 0 with no controller.
    pub bound_max: u64,
    /// Replies (resets, 503s) the class may send for its refusals per second, all CPUs
    /// together; 0: [`DEFAULT_REPLY_RATE`]. See [`replies_to_refusals`].
    pub reply_rate: u64,
    /// A SIP 503's `Retry-After`, in seconds; 0: the header is left out.
    pub retry_after_s: u32,
    /// Padding, zero.
    pub pad: u32,
}

impl ClassPolicy {
    /// The backlog limit, when one is in force.
    #[inline(always)]
    pub const fn backlog_in_force(&self) -> Option<u64> {
        if self.flags & POLICY_LIMIT_BACKLOG != 0 {
            Some(self.backlog_limit)
        } else {
            None
        }
    }

    /// The rate limit (per second), when one is in force.
    #[inline(always)]
    pub const fn rate_in_force(&self) -> Option<u64> {
        if self.flags & POLICY_LIMIT_RATE != 0 {
            Some(self.rate_per_sec)
        } else {
            None
        }
    }

    /// Whether any limit is in force.
    #[inline(always)]
    pub const fn limits(&self) -> bool {
        self.flags & (POLICY_LIMIT_BACKLOG | POLICY_LIMIT_RATE) != 0
    }

    /// Puts the backlog limit `limit` in force.
    #[inline(always)]
    pub fn limit_backlog(&mut self, limit: u64) {
        self.backlog_limit = limit;
        self.flags |= POLICY_LIMIT_BACKLOG;
    }

    /// Puts the rate limit `rate` (per second) in force.
    #[inline(always)]
    pub fn limit_rate(&mut self, rate: u64) {
        self.rate_per_sec = rate;
        self.flags |= POLICY_LIMIT_RATE;
    }

    /// Whether an operator fixed these limits (`policy set --pin`): the controller leaves the
    /// class alone.
    #[inline(always)]
    pub const fn pinned(&self) -> bool {
        self.flags & POLICY_PINNED != 0
    }

    /// Pins the limits, or unpins them.
    #[inline(always)]
    pub fn set_pinned(&mut self, pinned: bool) {
        if pinned {
            self.flags |= POLICY_PINNED;
        } else {
            self.flags &= !POLICY_PINNED;
        }
    }

    /// Whether `owner` set these limits.
    #[inline(always)]
    pub const fn owned_by(&self, owner: crate::reasons::Owner) -> bool {
        self.owner == owner.id()
    }

    /// These limits with the reply settings of `other` (refused arrivals dropped or answered,
    /// the reply rate, a 503's `Retry-After`), the rest kept.
    pub const fn with_replies_of(self, other: &ClassPolicy) -> ClassPolicy {
        let bits = POLICY_REFUSE_DROP | POLICY_REFUSE_REJECT;
        ClassPolicy {
            flags: (self.flags & !bits) | (other.flags & bits),
            reply_rate: other.reply_rate,
            retry_after_s: other.retry_after_s,
            ..self
        }
    }

    /// The name of who set these limits.
    pub const fn owner_name(&self) -> &'static str {
        crate::reasons::Owner::name_of(self.owner)
    }

    /// The name of why they last changed.
    pub fn reason_name(&self) -> &'static str {
        crate::reasons::Reason::name_of(self.reason)
    }
}

/// Replies per second a class sends for its refusals unless its policy says otherwise.
pub const DEFAULT_REPLY_RATE: u64 = 20_000;
/// Replies a class may send at once above its reply rate.
pub const REPLY_BURST: u64 = 64;

/// Whether refusals of `class` are answered (a TCP reset, a SIP 503) rather than dropped
/// silently: as the policy says ([`POLICY_REFUSE_REJECT`], [`POLICY_REFUSE_DROP`]), else the
/// class's default: TLS classes reset (a TCP client would otherwise hang on a connection the
/// kernel has), SIP classes drop (a 503 goes to an address nobody verified; operators opt in).
#[inline(always)]
pub const fn replies_to_refusals(class: crate::Class, policy: &ClassPolicy) -> bool {
    if policy.flags & POLICY_REFUSE_REJECT != 0 {
        return true;
    }
    if policy.flags & POLICY_REFUSE_DROP != 0 {
        return false;
    }
    matches!(
        class,
        crate::Class::TlsNew | crate::Class::TlsResumed | crate::Class::TlsFlow
    )
}

/// The reply rate in force under `policy`.
#[inline(always)]
pub const fn reply_rate(policy: &ClassPolicy) -> u64 {
    if policy.reply_rate != 0 {
        policy.reply_rate
    } else {
        DEFAULT_REPLY_RATE
    }
}

/// The default unit timeout of a class, in nanoseconds: for a TLS connection, a handshake
/// timeout (10 s: the server answers a hello within milliseconds unless it is lost or
/// overwhelmed); for a SIP request, 2 s, well under Timer B (32 s): by then an unanswered client
/// has retransmitted twice (T1 = 500 ms), and its retransmissions are judged on their own.
pub const fn default_timeout_ns(class: crate::Class) -> u64 {
    match class {
        crate::Class::SipOriginal | crate::Class::SipRetransmission | crate::Class::SipExempt => {
            2_000_000_000
        }
        _ => 10_000_000_000,
    }
}

/// The unit timeout in force for `class` under `policy`.
#[inline(always)]
pub const fn timeout_ns(class: crate::Class, policy: &ClassPolicy) -> u64 {
    if policy.timeout_ns != 0 {
        policy.timeout_ns
    } else {
        default_timeout_ns(class)
    }
}

/// Admission state of one class, shared by all CPUs and updated atomically.
///
/// Every admitted unit (a TLS connection, a SIP request) is a [`super::Pending`] entry until it ends,
/// exactly once: it completes when the server answers (seen leaving the host), or it expires
/// when its class's timeout passes first. Whoever deletes the entry counts the end, so the three
/// counters only ever grow and never race: see [`backlog`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassState {
    /// Admissions so far (monotonic).
    pub admitted: u64,
    /// Units the server answered (monotonic).
    pub completed: u64,
    /// Units that went unanswered past their timeout and were released (monotonic): the signal
    /// of a lost or overwhelmed server, or of an attack.
    pub expired: u64,
    /// GCRA theoretical arrival time, in nanoseconds of `bpf_ktime_get_ns`.
    pub gcra_tat_ns: u64,
    /// The reply limiter's GCRA theoretical arrival time (see [`reply_rate`]).
    pub reply_tat_ns: u64,
    /// When the datapath's next pass over a table of units is due (`bpf_ktime_get_ns`), kept
    /// in the state of one class per table: `tls-new`'s for `TLS_PENDING` (both TLS classes'
    /// units), `tls-flow`'s for `TLS_HOLDS`, `sip-original`'s for `SIP_PENDING`. The other
    /// classes' are unused.
    pub sweep_ns: u64,
    /// Units an admitted one went on to (monotonic), held without an admission of their own: a
    /// TLS 1.2 full handshake's key exchange, the server's second piece of work
    /// ([`crate::maps::PENDING_KEY_EXCHANGE`]). In the backlog; `admitted` counts arrivals.
    pub continued: u64,
}

impl ClassState {
    /// Current backlog: see [`backlog`].
    pub const fn backlog(&self) -> u64 {
        backlog(
            self.admitted.saturating_add(self.continued),
            self.completed,
            self.expired,
        )
    }
}

/// The backlog of a class: units held and not yet ended, `held - completed - expired` (never
/// negative), where `held` is what was admitted and what admitted units went on to
/// ([`ClassState::continued`]). The one formula the datapath, the CLI and the metrics use.
#[inline(always)]
pub const fn backlog(admitted: u64, completed: u64, expired: u64) -> u64 {
    admitted.saturating_sub(completed).saturating_sub(expired)
}
