//! Key and value types of the maps shared by the eBPF programs and the daemon.
//!
//! Every type is `#[repr(C)]` with explicit padding fields and no implicit padding (checked by the
//! tests below), so the kernel, the daemon and `bpftool` (through BTF) agree on every byte.

use crate::class::NUM_CLASSES;

/// Declares the table of maps: each map's name (as declared in the eBPF object and used as its
/// pin file name) with its key and value types, from which [`names`] and [`layout`] follow.
macro_rules! map_table {
    ($( $(#[doc = $doc:literal])* $name:ident: $key:ty => $value:ty, )*) => {
        /// Map names, as declared in the eBPF object and used as pin file names.
        pub mod names {
            $(
                $(#[doc = $doc])*
                pub const $name: &str = stringify!($name);
            )*

            /// Every map the gateway pins, in a fixed order.
            pub const ALL: &[&str] = &[$($name),*];
        }

        /// The key and value sizes the map `name` has in this build; `None` for an unknown
        /// name, `(0, 0)` for the ring buffer (which has neither).
        pub const fn layout(name: &str) -> Option<(usize, usize)> {
            $(
                if const_eq(name, names::$name) {
                    return Some((core::mem::size_of::<$key>(), core::mem::size_of::<$value>()));
                }
            )*
            None
        }
    };
}

/// `a == b` for strings, in a `const fn`.
const fn const_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

map_table! {
    /// Per-class, per-CPU packet and admission counters ([`super::ClassStats`]).
    CLASS_STATS: u32 => ClassStats,
    /// Per-class admission limits ([`super::ClassPolicy`]).
    CLASS_POLICY: u32 => ClassPolicy,
    /// Per-class admission state ([`super::ClassState`]).
    CLASS_STATE: u32 => ClassState,
    /// Protected services, keyed by [`super::ServiceKey`]: the operator-facing source of truth.
    SERVICES: ServiceKey => ServiceValue,
    /// The datapath's index of [`SERVICES`]: one byte of service kind per (protocol, port), see
    /// [`super::service_port_index`].
    SERVICE_PORTS: u32 => u8,
    /// Per-CPU parser counters ([`super::DatapathCounters`]).
    DP_COUNTERS: u32 => DatapathCounters,
    /// Datapath-wide settings ([`super::DatapathConfig`]).
    DP_CONFIG: u32 => DatapathConfig,
    /// TLS connections by 4-tuple ([`super::FlowKey`] to [`super::TlsFlow`]).
    TLS_FLOWS: FlowKey => TlsFlow,
    /// Keys of the sessions the server issued ([`super::IssuedKey`] to [`super::IssuedValue`]).
    TLS_ISSUED: IssuedKey => IssuedValue,
    /// Per-CPU TLS counters ([`super::TlsCounters`]).
    TLS_COUNTERS: u32 => TlsCounters,
    /// Rejected TLS connections, for the daemon to tear down ([`super::RejectEvent`]).
    TLS_REJECTS: () => (),
    /// SIP transactions seen (transaction key to [`super::SipTxn`]).
    SIP_TXNS: u64 => SipTxn,
    /// Per-class, per-CPU service-time histograms ([`super::LatencyHistogram`]).
    SERVICE_LATENCY: u32 => LatencyHistogram,
    /// The XDP hook's jump table (index 0: the SIP program). Pinned: the kernel empties a program
    /// array when its last userspace reference goes away, and a pin is one.
    XDP_JUMP: u32 => u32,
    /// The TC hook's jump table (index 0: the SIP program, 1: the reply program), pinned
    /// likewise.
    TC_JUMP: u32 => u32,
    /// Admitted TLS connections the server has not answered yet ([`super::FlowKey`] to
    /// [`super::Pending`]): not LRU, so nothing can evict them.
    TLS_PENDING: FlowKey => Pending,
    /// Admitted SIP requests the server has not answered yet (unit key, see
    /// `SipInfo::unit_key`, to [`super::Pending`]): not LRU either.
    SIP_PENDING: u64 => Pending,
    /// SIP dialogs the server established (dialog key, see `SipInfo::dialog_key`, to
    /// [`super::SipDialog`]), learnt from its 2xx responses to INVITEs.
    SIP_DIALOGS: u64 => SipDialog,
    /// Resumed TLS connections the server answered that are still open, each holding a place
    /// of its issued key until it ends ([`super::FlowKey`] to [`super::TlsHold`]): not LRU.
    TLS_HOLDS: FlowKey => TlsHold,
}

/// Program names in the eBPF object.
pub mod programs {
    /// The XDP ingress classifier.
    pub const XDP: &str = "gateway_xdp";
    /// The same classifier as a TC ingress program (fallback hook).
    pub const TC_INGRESS: &str = "gateway_tc_ingress";
    /// The TC egress program: completions of TLS connections and SIP transactions (the server's
    /// answers), and SIP service times.
    pub const TC_EGRESS: &str = "gateway_tc_egress";
    /// The SIP classifier of the XDP hook, reached by tail call from [`XDP`].
    pub const XDP_SIP: &str = "gateway_xdp_sip";
    /// The SIP classifier of the TC hook, reached by tail call from [`TC_INGRESS`].
    pub const TC_SIP: &str = "gateway_tc_sip";
    /// The reply program of the XDP hook (a reset or a 503 to a refused client), reached by
    /// tail call from [`XDP`] and [`XDP_SIP`].
    pub const XDP_REPLY: &str = "gateway_xdp_reply";
    /// The reply program of the TC hook, reached by tail call from [`TC_INGRESS`] and
    /// [`TC_SIP`].
    pub const TC_REPLY: &str = "gateway_tc_reply";
    /// The finishing program at the TC ingress of an XDP attachment: for a refused segment the
    /// XDP program turned into the server's reset, it sends the client its reset (a copy) and
    /// passes the server's on.
    pub const TC_FINISH: &str = "gateway_tc_finish";

    /// A bare `XDP_PASS` program, the baseline of the per-packet cost benchmark.
    pub const XDP_BARE_PASS: &str = "gateway_bare_pass";
    /// The sweep program: ends expired units now. Attached nowhere; the daemon runs it by
    /// `BPF_PROG_TEST_RUN`.
    pub const SWEEP: &str = "gateway_sweep";
}

/// Maximum number of protected services (entries of the services map).
pub const MAX_SERVICES: u32 = 256;

/// Entries of the `SERVICE_PORTS` array: every port of TCP, then every port of UDP.
pub const SERVICE_PORT_ENTRIES: u32 = 2 * 65536;

/// Index of (`proto`, `port`) in the `SERVICE_PORTS` array, whose byte holds the
/// [`ServiceKind`] id (0: not protected). The datapath reads this array rather than the hash map:
/// an array lookup is inlined by the verifier, so traffic to unprotected ports costs no hash
/// lookup. `None` for protocols other than TCP and UDP.
#[inline(always)]
pub const fn service_port_index(proto: u8, port: u16) -> Option<u32> {
    match proto {
        IPPROTO_TCP => Some(port as u32),
        IPPROTO_UDP => Some(65536 + port as u32),
        _ => None,
    }
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
/// Every admitted unit (a TLS connection, a SIP request) is a [`Pending`] entry until it ends,
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
    /// When the datapath next looks for expired units of this class (`bpf_ktime_get_ns`).
    pub sweep_ns: u64,
}

impl ClassState {
    /// Current backlog: see [`backlog`].
    pub const fn backlog(&self) -> u64 {
        backlog(self.admitted, self.completed, self.expired)
    }
}

/// The backlog of a class: units admitted and not yet ended, `admitted - completed - expired`
/// (never negative). The one formula the datapath, the CLI and the metrics use.
#[inline(always)]
pub const fn backlog(admitted: u64, completed: u64, expired: u64) -> u64 {
    admitted.saturating_sub(completed).saturating_sub(expired)
}

/// How often the datapath looks for expired units of a class, in nanoseconds.
pub const SWEEP_INTERVAL_NS: u64 = 100_000_000;

/// Entries of each pending table (`TLS_PENDING`, `SIP_PENDING`). When one is full, new work of
/// its classes is refused (counted in [`DatapathCounters::pending_full`]) and admitted work keeps
/// its place.
pub const MAX_PENDING: u32 = 65536;

/// An admitted unit that has not ended yet.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    /// When it was admitted (`bpf_ktime_get_ns`).
    pub admitted_ns: u64,
    /// When it expires unless answered (`bpf_ktime_get_ns`).
    pub deadline_ns: u64,
    /// Its class id.
    pub class: u32,
    /// `PENDING_*` flags.
    pub flags: u32,
    /// For a `tls-resumed` connection, the issued key ([`IssuedKey`]) its offer holds a place of
    /// ([`IssuedValue::in_use`]), given back when the unit ends; zero otherwise.
    pub offer: [u8; crate::tls::KEY_LEN],
}

/// [`Pending::flags`]: no answer can ever match this unit (a SIP first fragment with no readable
/// message, keyed by its source), so it ends at its timeout. The server may well be working on
/// it: the controller counts it as live work, never as work the server passed over.
pub const PENDING_UNMATCHED: u32 = 1;

/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// Key of the services map: the L4 protocol and destination port of a protected service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// Destination port, host byte order.
    pub port: u16,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub proto: u8,
    /// Padding, zero.
    pub pad: u8,
}

impl ServiceKey {
    /// A key for `proto`/`port`.
    pub const fn new(proto: u8, port: u16) -> Self {
        ServiceKey {
            port,
            proto,
            pad: 0,
        }
    }
}

/// What kind of protected service a port carries.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceKind {
    /// TLS over TCP.
    Tls = 1,
    /// SIP (over UDP; SIP over TCP is counted but not classified).
    Sip = 2,
}

impl ServiceKind {
    /// The kind with this numeric id.
    pub const fn from_id(id: u32) -> Option<ServiceKind> {
        match id {
            1 => Some(ServiceKind::Tls),
            2 => Some(ServiceKind::Sip),
            _ => None,
        }
    }

    /// Name used by the CLI and the config file.
    pub const fn name(self) -> &'static str {
        match self {
            ServiceKind::Tls => "tls",
            ServiceKind::Sip => "sip",
        }
    }
}

/// Value of the services map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceValue {
    /// A [`ServiceKind`] id.
    pub kind: u32,
    /// `SERVICE_*` bits.
    pub flags: u32,
}

/// [`ServiceValue::flags`]: the gateway daemon terminates this (TLS) service itself (its own
/// proxy listener). Informational: completions are counted the same way for every service.
pub const SERVICE_TERMINATED: u32 = 1 << 0;

impl ServiceValue {
    /// The service's byte in the `SERVICE_PORTS` array: its [`ServiceKind`] id.
    pub const fn port_byte(&self) -> u8 {
        self.kind as u8
    }
}

/// The service kind a `SERVICE_PORTS` byte carries (`None`: not protected).
#[inline(always)]
pub const fn port_kind(byte: u8) -> Option<ServiceKind> {
    ServiceKind::from_id(byte as u32)
}

/// [`DatapathConfig::flags`]: drop IP fragments instead of passing them.
pub const CONFIG_DROP_FRAGMENTS: u64 = 1 << 0;
/// [`DatapathConfig::flags`]: drop packets whose headers cannot be parsed within the bounds
/// instead of passing them.
pub const CONFIG_DROP_UNPARSEABLE: u64 = 1 << 1;

/// [`DatapathConfig::flags`]: judge TLS hellos without asking whether the kernel has their
/// connection. Only for test fixtures that replay synthetic frames with no socket behind them
/// (BPF_PROG_TEST_RUN); the loader and the config never set it.
pub const CONFIG_TRUST_UNCONNECTED: u64 = 1 << 2;

/// [`DatapathConfig::finisher`]: the finishing program is attached.
pub const FINISHER_ATTACHED: u32 = 1 << 0;
/// [`DatapathConfig::finisher`]: the XDP reply program hands its SIP 503s to the finishing
/// program, which sends them out of the device (`bpf_redirect` to its egress), rather than
/// sending them itself with XDP_TX. For devices whose XDP_TX may not deliver: a veth delivers
/// what XDP_TX sends only to a peer that runs NAPI (an XDP program of its own), which a
/// container host's side of a pod does not.
pub const FINISHER_SENDS_REPLIES: u32 = 1 << 1;

/// How the program is attached, as recorded by the loader in [`DatapathConfig::attach_mode`].
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// Not recorded.
    Unknown = 0,
    /// Native (driver) XDP.
    Native = 1,
    /// Generic (SKB) XDP.
    Generic = 2,
    /// TC ingress (tcx).
    Tc = 3,
}

impl AttachMode {
    /// The mode with this numeric id.
    pub const fn from_id(id: u32) -> AttachMode {
        match id {
            1 => AttachMode::Native,
            2 => AttachMode::Generic,
            3 => AttachMode::Tc,
            _ => AttachMode::Unknown,
        }
    }

    /// Name used by the CLI, status output and metrics.
    pub const fn name(self) -> &'static str {
        match self {
            AttachMode::Unknown => "unknown",
            AttachMode::Native => "native",
            AttachMode::Generic => "generic",
            AttachMode::Tc => "tc",
        }
    }
}

/// Datapath-wide settings, the single entry of the `DP_CONFIG` array.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DatapathConfig {
    /// `CONFIG_*` bits.
    pub flags: u64,
    /// The [`AttachMode`] the loader used (informational; the program does not read it).
    pub attach_mode: u32,
    /// Interface index the program is attached to (informational).
    pub ifindex: u32,
    /// PID of the `gateway run` daemon serving this attachment; 0 when none runs (`gateway
    /// reload` signals it).
    pub daemon_pid: u32,
    /// Reloads the daemon applied.
    pub reloads: u32,
    /// Reloads the daemon refused (the config was bad; nothing changed).
    pub reloads_refused: u32,
    /// `FINISHER_*` bits. [`FINISHER_ATTACHED`] when the loader attached the finishing program
    /// (`programs::TC_FINISH`) at this XDP attachment's TC ingress: the XDP reply program then
    /// hands a refused TCP segment to the stack as the server's reset, and the finishing
    /// program sends the client's; without it, the XDP program resets the client alone
    /// (XDP_TX). [`FINISHER_SENDS_REPLIES`] too where XDP_TX may not deliver (native XDP on a
    /// veth): SIP 503s are handed to the finishing program, which sends them out.
    pub finisher: u32,
}

crate::counters! {
    /// Parser counters, the single entry of the per-CPU `DP_COUNTERS` array. Touched only when a
    /// packet has something to count here (the total is the sum of the per-class packet counts).
    pub struct DatapathCounters {
        /// Not IPv4 or IPv6 (ARP, LLDP, ...), passed.
        pub not_ip: u64,
        /// Frames that ended inside a header.
        pub truncated: u64,
        /// Headers with impossible fields (IPv4 IHL < 5, TCP data offset < 5, wrong IP version).
        pub malformed: u64,
        /// IPv4 or IPv6 fragments. A first fragment is also classified (it carries the ports and
        /// the start of the message); later ones are passed or dropped by policy.
        pub fragments: u64,
        /// Headers beyond the parser's bounds (too many VLAN tags or IPv6 extension headers, ESP).
        pub unparseable: u64,
        /// Packets dropped by the fragment or unparseable policy.
        pub policy_dropped: u64,
        /// Packets refused whatever the policy says, since they may reach a protected service
        /// and cannot be judged: IPv6 header chains past the parser's bounds, first fragments
        /// that end before their ports.
        pub unjudgeable: u64,
        /// Frames carrying at least one VLAN tag.
        pub vlan: u64,
        /// IPv6 packets.
        pub ipv6: u64,
        /// IPv4 packets carrying options.
        pub ipv4_options: u64,
        /// Units refused because their pending table was full.
        pub pending_full: u64,
        /// SIP requests that claimed an exemption (ACK, CANCEL, BYE, a To tag) for a dialog or
        /// transaction the server never made: judged as originals.
        pub sip_unearned: u64,
        /// SIP 503s sent from the NIC for refused requests.
        pub sip_replies_sent: u64,
        /// Refused SIP requests the class would answer that got no 503: the frame was not one the
        /// datapath answers (IP options, extension headers, headers past the parser's reach, a
        /// reply that would be longer than the request).
        pub sip_replies_withheld: u64,
        /// ACKs for the NIC's own 503s, absorbed (the server never sent what they acknowledge).
        pub sip_acks_absorbed: u64,
        /// Requests of a dialog that had spent its exemption (past its ceiling of exempt
        /// requests, or idle too long): judged as originals.
        pub sip_dialog_spent: u64,
        /// Dialogs ended by the server's answer to their BYE.
        pub sip_dialogs_ended: u64,
        /// Copies of a SIP request whose original was refused (never admitted): judged as
        /// originals again, not as retransmissions.
        pub sip_copies_of_refused: u64,
    }
}

/// Entries of the TLS flow table (LRU: the least recently used flow is evicted when full).
pub const MAX_TLS_FLOWS: u32 = 65536;
/// Entries of the issued-sessions table unless configured (`datapath.issued_keys`): a hash map,
/// not an LRU, so that load never evicts a key its session still needs; when it is full, a new
/// key is not published (the daemon counts it). Its elements are allocated as keys are
/// published (`BPF_F_NO_PREALLOC`), so an empty table costs next to nothing.
pub const DEFAULT_TLS_ISSUED: u32 = 65536;
/// Most entries of the issued-sessions table the configuration accepts (about 2 GiB of kernel
/// memory when full).
pub const MAX_TLS_ISSUED: u32 = 16 * 1024 * 1024;
/// `BPF_F_NO_PREALLOC`: a hash map's elements are allocated as they are inserted.
pub const BPF_F_NO_PREALLOC: usize = 1;

/// A TCP connection as seen from its client: addresses (IPv4 as IPv4-mapped IPv6) and ports.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// Client address.
    pub saddr: [u8; 16],
    /// Server address.
    pub daddr: [u8; 16],
    /// Client port, host order.
    pub sport: u16,
    /// Server port, host order.
    pub dport: u16,
    /// Padding, zero.
    pub pad: u32,
}

/// [`TlsFlow::state`]: the ClientHello is still arriving.
pub const FLOW_PENDING: u8 = 0;
/// [`TlsFlow::state`]: admitted; later packets are `tls-flow`.
pub const FLOW_ADMITTED: u8 = 1;
/// [`TlsFlow::state`]: rejected; later packets are dropped.
pub const FLOW_REJECTED: u8 = 2;

/// State of one TLS connection.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsFlow {
    /// The ClientHello parser's state (while pending) and its result.
    pub hello: crate::tls::HelloState,
    /// TCP sequence number of the hello's first byte.
    pub hello_seq: u32,
    /// TCP sequence number the next in-order segment must carry.
    pub next_seq: u32,
    /// `FLOW_*`.
    pub state: u8,
    /// The class the connection was admitted or rejected in.
    pub class: u8,
    /// Padding, zero.
    pub pad: u8,
    /// Segments the hello took.
    pub segments: u8,
    /// Padding, zero.
    pub reserved: u32,
}

/// Key of the issued-sessions map: the digest (`gateway_common::tls::offer_digest`) of a whole
/// session id, ticket or PSK identity the server issued.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IssuedKey {
    /// The bytes.
    pub key: [u8; crate::tls::KEY_LEN],
}

/// Value of the issued-sessions map.
///
/// A key travels in clear (a TLS 1.2 session id in the ServerHello) or can be replayed by whoever
/// saw it, so it buys the `tls-resumed` class for at most `limit` connections at a time: each
/// admitted resumed connection holds one place (`in_use`) until its unit ends (the server
/// answered, or it expired). See [`resume_holders`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IssuedValue {
    /// What was issued: 1 session id, 2 ticket, 3 TLS 1.3 PSK identity (an `Offer` id).
    pub kind: u32,
    /// Connections the key may hold in the resumed class at once; 0 means
    /// [`DEFAULT_RESUME_LIMIT`]. Set by whoever published it.
    pub limit: u32,
    /// When it was published, `CLOCK_MONOTONIC` nanoseconds (informational).
    pub issued_ns: u64,
    /// Resumed connections holding a place now (the datapath's count).
    pub in_use: u64,
    /// When the datapath last gave a place, `bpf_ktime_get_ns`.
    pub granted_ns: u64,
    /// Resumptions the key buys per minute beyond its first `limit` at once (a GCRA on
    /// [`Self::tat_ns`], see [`resume_interval_ns`]); 0 means [`DEFAULT_RESUME_PER_MINUTE`].
    pub per_minute: u32,
    /// Padding, zero.
    pub pad: u32,
    /// The key's GCRA theoretical arrival time, `bpf_ktime_get_ns` (the datapath's).
    pub tat_ns: u64,
    /// Resumed connections the server answered that are still open, each holding a place until
    /// it ends ([`TlsHold`]); with [`Self::in_use`], what [`Self::limit`] bounds.
    pub open: u64,
}

/// A resumed connection past its first flight that holds a place of its issued key
/// ([`IssuedValue::open`]) until it ends: the server's FIN or RST seen leaving, or the daemon
/// finding its socket gone (it sets [`Self::gone`] and runs the sweep), or [`MAX_HOLD_NS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsHold {
    /// The issued key whose place it holds.
    pub offer: [u8; crate::tls::KEY_LEN],
    /// Since when, `bpf_ktime_get_ns`.
    pub since_ns: u64,
    /// Set by the daemon when the connection's socket is gone: the next sweep releases it.
    pub gone: u32,
    /// Padding, zero.
    pub pad: u32,
}

/// The longest a connection holds its key's place (one hour): past it, the place is given
/// back though the connection lives on, so a lost end (no FIN seen, no daemon) costs a key one
/// place for an hour at most.
pub const MAX_HOLD_NS: u64 = 3600 * 1_000_000_000;

/// Resumed connections one issued key may hold at once unless its publisher says otherwise:
/// browsers open up to six connections to one origin at once, and HTTP/1.1 clients share one
/// TLS 1.2 session between them.
pub const DEFAULT_RESUME_LIMIT: u32 = 6;
/// Largest accepted per-key resume limit.
pub const MAX_RESUME_LIMIT: u32 = 1024;

/// Resumptions per minute one issued key buys unless its publisher says otherwise, beyond the
/// `limit` it buys at once: one a second. A browser opens its handful of connections to an
/// origin at once and then keeps them; a ticket replayed a thousand times a second is a farm.
pub const DEFAULT_RESUME_PER_MINUTE: u32 = 60;
/// Largest per-key resumption rate the configuration accepts, per minute (a thousand a second).
/// The datapath takes any value: test fixtures publish `u32::MAX` (an interval of 13 ns) for
/// keys no rate should bind.
pub const MAX_RESUME_PER_MINUTE: u32 = 60_000;

/// The GCRA emission interval of a key resumed at most `per_minute` times a minute (0: the
/// default), in nanoseconds.
#[inline(always)]
pub const fn resume_interval_ns(per_minute: u32) -> u64 {
    let n = if per_minute == 0 {
        DEFAULT_RESUME_PER_MINUTE
    } else {
        per_minute
    };
    60_000_000_000 / n as u64
}

/// The places of an issued key that are still held at `now_ns`: `in_use`, unless its last place
/// was given more than `timeout_ns` plus [`RESUME_HEAL_MARGIN_NS`] ago, in which case every unit
/// that held one has ended and been released (a unit lives at most its class's timeout, and is
/// released by the first sweep after it, which comes within a sweep interval and runs before
/// any place is taken), and a count left too high by a lost release heals to zero. Healing any
/// sooner gave a place back before the sweep had released its unit, and the unit's release
/// then took the count below what was held.
#[inline(always)]
pub const fn resume_holders(in_use: u64, granted_ns: u64, now_ns: u64, timeout_ns: u64) -> u64 {
    if now_ns.saturating_sub(granted_ns) > timeout_ns.saturating_add(RESUME_HEAL_MARGIN_NS) {
        0
    } else {
        in_use
    }
}

/// How long past a unit's timeout [`resume_holders`] waits before healing a key's count: a
/// sweep interval, and a millisecond for the time between a place's grant and its unit's
/// admission.
pub const RESUME_HEAL_MARGIN_NS: u64 = SWEEP_INTERVAL_NS + 1_000_000;

/// The limit in force for an issued key whose value says `limit`.
#[inline(always)]
pub const fn resume_limit(limit: u32) -> u64 {
    if limit == 0 {
        DEFAULT_RESUME_LIMIT as u64
    } else {
        limit as u64
    }
}

crate::counters! {
    /// TLS counters, the single entry of the per-CPU `TLS_COUNTERS` array.
    pub struct TlsCounters {
        /// ClientHellos decided (admitted or rejected).
        pub hellos: u64,
        /// Hellos that offered a resumption whose key the server never issued (classed tls-new).
        pub unverified_offers: u64,
        /// Hellos that took more than one segment.
        pub multi_segment: u64,
        /// Hellos that were not well formed (classed tls-new).
        pub malformed: u64,
        /// Hellos whose next segment did not arrive in order (classed tls-new).
        pub out_of_order: u64,
        /// Packets of rejected connections, dropped.
        pub rejected_flow_packets: u64,
        /// Admitted connections the server answered (its first flight, or its close, seen leaving).
        pub completions: u64,
        /// Segments with payload on a 4-tuple the kernel has no connection for (spoofed, or left
        /// over): dropped after one socket lookup, no state created.
        pub no_connection: u64,
        /// Offers of an issued key that already held its limit of resumed connections (a replayed
        /// or shared key): classed tls-new.
        pub replays_bounded: u64,
        /// Resets sent to clients of refused connections, from the NIC (on XDP with the
        /// finishing program: handed over to it, which counts a copy it could not send as
        /// withheld).
        pub resets_sent: u64,
        /// Refused segments the class would answer that got no reset: the frame was not one the
        /// datapath answers (IPv4 options, IPv6 extension headers), or a copy failed.
        pub resets_withheld: u64,
        /// Rejections the `TLS_REJECTS` ring buffer had no room for (the daemon did not hear of
        /// them; the connections were refused all the same).
        pub reject_events_lost: u64,
        /// SYNs carrying data (TCP Fast Open): their hello judged like a first segment's.
        pub syn_payloads: u64,
        /// IP-fragmented segments of connections not yet decided: judged as malformed hellos
        /// (tls-new), since what they carry comes with fragments that carry no ports.
        pub fragmented_hellos: u64,
        /// Offers of an issued key faster than its resumption rate allows (one client's worth,
        /// [`IssuedValue::per_minute`]): classed tls-new.
        pub resumptions_too_fast: u64,
    }
}

/// Bytes of the `TLS_REJECTS` ring buffer.
pub const TLS_REJECTS_BYTES: u32 = 64 * 1024;

/// A connection the datapath rejected: the daemon destroys the server's socket for it, which
/// also resets the client.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RejectEvent {
    /// The connection.
    pub key: FlowKey,
    /// Its class.
    pub class: u8,
    /// Why ([`crate::reasons::Refusal`]).
    pub reason: u8,
    /// Padding, zero.
    pub pad: [u8; 6],
}

/// Entries of the SIP transaction table (LRU).
pub const MAX_SIP_TXNS: u32 = 65536;

/// A SIP transaction the datapath has seen a request of (LRU: it only tells retransmissions
/// from originals; what the backlog holds is in `SIP_PENDING`, which nothing evicts).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SipTxn {
    /// When its first request was seen, `CLOCK_MONOTONIC` ns.
    pub first_ns: u64,
    /// Requests of it seen (the original and its retransmissions).
    pub requests: u32,
    /// `TXN_*` bits.
    pub flags: u32,
}

/// [`SipTxn::flags`]: its original was admitted (the server took the work on). Only such an
/// INVITE transaction lets its ACK and CANCEL be exempt: one that was refused (or merely seen)
/// buys them nothing.
pub const TXN_ADMITTED: u32 = 1 << 0;

/// Entries of the SIP dialog table (LRU: losing a dialog only makes its requests originals).
pub const MAX_SIP_DIALOGS: u32 = 65536;

/// A dialog the server established: its requests (in-dialog, ACK, BYE) are exempt, up to
/// [`MAX_DIALOG_REQUESTS`] of them, until the server answers its BYE or it has been idle for
/// [`DIALOG_IDLE_NS`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SipDialog {
    /// When the server's 2xx left, `CLOCK_MONOTONIC` ns.
    pub established_ns: u64,
    /// When it was last used (established, or an exempt request of it seen), `CLOCK_MONOTONIC`
    /// ns.
    pub last_ns: u64,
    /// Exempt requests of it seen so far (retransmissions included).
    pub requests: u32,
    /// Padding, zero.
    pub pad: u32,
}

/// Exempt requests one dialog buys (its ACK, re-INVITEs, UPDATEs, INFOs, its BYE, and their
/// retransmissions): past this, its requests are judged as originals. A call makes a handful;
/// an IVR's DTMF by INFO some dozens.
pub const MAX_DIALOG_REQUESTS: u32 = 256;

/// A dialog none of whose requests was seen for this long is forgotten (its requests are then
/// judged as originals): one hour, longer than the session-refresh interval of RFC 4028's
/// timers (at most half of Session-Expires, whose default is 30 minutes).
pub const DIALOG_IDLE_NS: u64 = 3600 * 1_000_000_000;

/// Buckets of a [`LatencyHistogram`].
pub const LATENCY_BUCKETS: usize = 32;

/// A service-time histogram: bucket `i` counts times in `[2^i, 2^(i+1))` microseconds (bucket 0
/// also counts times under 1 µs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// The counts.
    pub buckets: [u64; LATENCY_BUCKETS],
}

impl LatencyHistogram {
    /// The bucket of a time in nanoseconds.
    pub const fn bucket(ns: u64) -> usize {
        let us = ns / 1000;
        if us == 0 {
            return 0;
        }
        let b = 63 - us.leading_zeros() as usize;
        if b < LATENCY_BUCKETS {
            b
        } else {
            LATENCY_BUCKETS - 1
        }
    }

    /// Adds another CPU's counts.
    pub fn accumulate(&mut self, o: &LatencyHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
    }

    /// Samples counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The bucket holding the quantile `permille`/1000, the samples in buckets below it and its
    /// own count; `None` when empty.
    fn rank_bucket(&self, permille: u64) -> Option<(usize, u64, u64)> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = (permille * total).div_ceil(1000).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            if seen + n >= rank {
                return Some((i, rank - seen, *n));
            }
            seen += n;
        }
        None
    }

    /// The upper bound, in microseconds, of the bucket holding the quantile `permille`/1000;
    /// `None` when empty.
    pub fn quantile_us(&self, permille: u64) -> Option<u64> {
        self.count().checked_sub(1)?;
        Some(
            self.rank_bucket(permille)
                .map_or(1u64 << LATENCY_BUCKETS, |(i, _, _)| 1u64 << (i + 1)),
        )
    }

    /// The quantile `permille`/1000 in microseconds, placed linearly within its bucket (so it
    /// moves smoothly as samples shift, where [`Self::quantile_us`] jumps by factors of two);
    /// `None` when empty.
    pub fn quantile_within_us(&self, permille: u64) -> Option<u64> {
        self.count().checked_sub(1)?;
        Some(
            self.rank_bucket(permille)
                .map_or(1u64 << LATENCY_BUCKETS, |(i, into, n)| {
                    let lo = if i == 0 { 0 } else { 1u64 << i };
                    let hi = 1u64 << (i + 1);
                    lo + (hi - lo) * into / n
                }),
        )
    }

    /// The counts added since `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &LatencyHistogram) -> LatencyHistogram {
        let mut out = LatencyHistogram::default();
        for (i, b) in out.buckets.iter_mut().enumerate() {
            *b = self.buckets[i].saturating_sub(earlier.buckets[i]);
        }
        out
    }
}

/// Compile-time check that per-class arrays cover every class.
const _: () = assert!(NUM_CLASSES == 7);

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::size_of;

    #[test]
    fn a_quantile_within_its_bucket_moves_smoothly() {
        let mut h = LatencyHistogram::default();
        assert_eq!(h.quantile_within_us(900), None);
        // Ten samples in [64, 128) µs: the 90th is 9/10 of the way through the bucket.
        h.buckets[6] = 10;
        assert_eq!(h.quantile_within_us(900), Some(64 + 64 * 9 / 10));
        assert_eq!(h.quantile_us(900), Some(128));
        let mut later = h;
        later.buckets[10] = 5;
        let d = later.since(&h);
        assert_eq!(d.count(), 5);
        assert_eq!(d.quantile_within_us(1000), Some(2048));
    }

    #[test]
    fn a_resume_place_is_held_until_released_or_healed_after_a_timeout() {
        let t = 10;
        let m = RESUME_HEAL_MARGIN_NS;
        assert_eq!(resume_holders(3, 100, 105, t), 3);
        assert_eq!(resume_holders(3, 100, 110, t), 3);
        // Past the timeout but within a sweep interval: the holders may not be released yet.
        assert_eq!(resume_holders(3, 100, 111, t), 3);
        assert_eq!(resume_holders(3, 100, 110 + m, t), 3);
        // Nobody was given a place for longer than a unit lives and a sweep takes: every holder
        // has ended and been released.
        assert_eq!(resume_holders(3, 100, 111 + m, t), 0);
        // A clock that reads earlier than the grant (another CPU) keeps the count.
        assert_eq!(resume_holders(3, 100, 90, t), 3);
        assert_eq!(resume_limit(0), u64::from(DEFAULT_RESUME_LIMIT));
        assert_eq!(resume_limit(1), 1);
    }

    /// Sum of field sizes equals the struct size: no implicit padding anywhere.
    #[test]
    fn no_implicit_padding() {
        assert_eq!(size_of::<ClassStats>(), 7 * 8);
        assert_eq!(size_of::<ClassPolicy>(), 5 * 8 + 4 + 4 + 3 * 8 + 8 + 4 + 4);
        assert_eq!(size_of::<ClassState>(), 6 * 8);
        assert_eq!(size_of::<Pending>(), 8 + 8 + 4 + 4 + 16);
        assert_eq!(size_of::<ServiceKey>(), 2 + 1 + 1);
        assert_eq!(size_of::<ServiceValue>(), 4 + 4);
        assert_eq!(size_of::<DatapathConfig>(), 8 + 4 * 6);
        assert_eq!(size_of::<DatapathCounters>(), 18 * 8);
        assert_eq!(size_of::<SipDialog>(), 8 + 8 + 4 + 4);
        assert_eq!(size_of::<FlowKey>(), 16 + 16 + 2 + 2 + 4);
        assert_eq!(
            size_of::<crate::tls::HelloState>(),
            4 * 4 + 2 + 6 + 2 + 2 + 4 + 3 * 16 + 2 * 8
        );
        assert_eq!(
            size_of::<TlsFlow>(),
            size_of::<crate::tls::HelloState>() + 4 + 4 + 4 + 4
        );
        assert_eq!(size_of::<IssuedKey>(), 16);
        assert_eq!(size_of::<IssuedValue>(), 4 + 4 + 8 + 8 + 8 + 4 + 4 + 8 + 8);
        assert_eq!(size_of::<TlsHold>(), 16 + 8 + 4 + 4);
        assert_eq!(size_of::<TlsCounters>(), 8 * 15);
        assert_eq!(size_of::<RejectEvent>(), size_of::<FlowKey>() + 8);
        assert_eq!(size_of::<SipTxn>(), 8 + 4 + 4);
        assert_eq!(size_of::<LatencyHistogram>(), LATENCY_BUCKETS * 8);
        assert_eq!(size_of::<crate::sip::SipInfo>(), 6 * 8 + 4 + 2 + 5 + 5);
    }

    #[test]
    fn port_byte_carries_the_kind_whatever_the_flags() {
        for flags in [0, SERVICE_TERMINATED] {
            let v = ServiceValue {
                kind: ServiceKind::Tls as u32,
                flags,
            };
            assert_eq!(v.port_byte(), 1);
            assert_eq!(port_kind(v.port_byte()), Some(ServiceKind::Tls));
        }
        assert_eq!(port_kind(0), None);
    }

    #[test]
    fn backlog_is_admitted_minus_completed_minus_expired() {
        let s = ClassState {
            admitted: 10,
            completed: 7,
            ..Default::default()
        };
        assert_eq!(s.backlog(), 3);
        let s = ClassState {
            admitted: 10,
            completed: 7,
            expired: 2,
            ..Default::default()
        };
        assert_eq!(s.backlog(), 1);
        let s = ClassState {
            admitted: 1,
            completed: 2,
            ..Default::default()
        };
        assert_eq!(s.backlog(), 0);
    }

    #[test]
    fn service_port_indexes_are_distinct_and_in_range() {
        assert_eq!(service_port_index(IPPROTO_TCP, 0), Some(0));
        assert_eq!(service_port_index(IPPROTO_TCP, 443), Some(443));
        assert_eq!(service_port_index(IPPROTO_UDP, 443), Some(65536 + 443));
        assert_eq!(
            service_port_index(IPPROTO_UDP, u16::MAX),
            Some(SERVICE_PORT_ENTRIES - 1)
        );
        assert_eq!(service_port_index(1, 443), None);
    }

    #[test]
    fn latency_buckets_and_quantiles() {
        assert_eq!(LatencyHistogram::bucket(500), 0);
        assert_eq!(LatencyHistogram::bucket(1_500), 0);
        assert_eq!(LatencyHistogram::bucket(2_000), 1);
        assert_eq!(LatencyHistogram::bucket(250_000_000), 17);
        assert_eq!(LatencyHistogram::bucket(u64::MAX), LATENCY_BUCKETS - 1);
        let mut h = LatencyHistogram::default();
        assert_eq!(h.quantile_us(500), None);
        h.buckets[LatencyHistogram::bucket(300_000_000)] += 9;
        h.buckets[LatencyHistogram::bucket(5_000)] += 1;
        // 300 ms lies in [2^18, 2^19) us.
        assert_eq!(h.quantile_us(500), Some(1 << 19));
        assert_eq!(h.quantile_us(100), Some(1 << 3));
    }

    #[test]
    fn kinds_and_modes_round_trip() {
        for k in [ServiceKind::Tls, ServiceKind::Sip] {
            assert_eq!(ServiceKind::from_id(k as u32), Some(k));
        }
        assert_eq!(ServiceKind::from_id(0), None);
        for m in [AttachMode::Native, AttachMode::Generic, AttachMode::Tc] {
            assert_eq!(AttachMode::from_id(m as u32), m);
        }
        assert_eq!(AttachMode::from_id(99), AttachMode::Unknown);
    }
}
