//! TLS at the NIC: flows (`TLS_FLOWS4`, `TLS_FLOWS`, `TLS_REFUSED`), issued keys and their places (`TLS_ISSUED`,
//! `TLS_HOLDS`), ticket tag keys (`TLS_TAG_KEYS`), counters (`TLS_COUNTERS`) and reject events (`TLS_REJECTS`).

use super::SWEEP_INTERVAL_NS;

super::pinned_maps! {
    /// IPv4 TLS connections by 4-tuple ([`crate::maps::FlowKey4`] to [`crate::maps::TlsFlow`]):
    /// a 12-byte key, which the kernel hashes in one round where an IPv6 key takes four.
    TLS_FLOWS4: FlowKey4 => TlsFlow,
    /// IPv6 TLS connections by 4-tuple ([`crate::maps::FlowKey`] to [`crate::maps::TlsFlow`]).
    /// Builds before `TLS_FLOWS4` kept IPv4 connections here too, by their IPv4-mapped
    /// addresses; an upgrade moves them over.
    TLS_FLOWS: FlowKey => TlsFlow,
    /// Keys of the sessions the server issued ([`crate::maps::IssuedKey`] to [`crate::maps::IssuedValue`]).
    TLS_ISSUED: IssuedKey => IssuedValue,
    /// Ticket tag keys by listener port and rotation period ([`crate::maps::TagKeyId`] to
    /// [`crate::maps::TagKey`]), written by the daemon from the shared ticket secret: with them
    /// the NIC verifies tickets any node sharing the secret issued.
    TLS_TAG_KEYS: TagKeyId => TagKey,
    /// Per-CPU TLS counters ([`crate::maps::TlsCounters`]).
    TLS_COUNTERS: u32 => TlsCounters,
    /// Rejected TLS connections, for the daemon to tear down ([`crate::maps::RejectEvent`]).
    TLS_REJECTS: () => (),
    /// Resumed TLS connections the server answered that are still open, each holding a place
    /// of its issued key until it ends ([`crate::maps::FlowKey`] to [`crate::maps::TlsHold`]): not LRU.
    TLS_HOLDS: FlowKey => TlsHold,
    /// Connections refused on their first segment, by slot ([`FlowKey::refused_slot`]):
    /// a direct-mapped table of [`crate::maps::FlowKey`], all-zero where empty.
    TLS_REFUSED: u32 => FlowKey,
    /// The SYN cookies' secret ([`CookieKey`]), one entry: written once by the daemon, kept
    /// across restarts and upgrades so that cookies in flight stay good.
    SYN_COOKIE_KEY: u32 => CookieKey,
    /// The terms under which the NIC learns the sessions a server it does not terminate
    /// issues, by listener port (`u32` port to [`crate::maps::LearnTerms`]): written by the
    /// daemon for each TLS service with a `server:` section.
    TLS_LEARN: u32 => LearnTerms,
    /// A server's session ticket keys, by listener port and key name
    /// ([`crate::maps::TicketKeyId`] to [`crate::maps::TicketMacKey`]): read by the daemon from
    /// the server's own key files; with them the NIC checks an offered ticket's MAC.
    TLS_TICKET_KEYS: TicketKeyId => TicketMacKey,
}

/// Entries of each TLS flow table, IPv4's and IPv6's (LRU: the least recently used flow is
/// evicted when full).
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

/// The SYN cookies' secret (`crate::syncookie`): a SipHash-2-4 key, written by the daemon
/// (random, once per attachment). All zero means not set yet: no cookie is sent.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CookieKey {
    /// First half of the key.
    pub k0: u64,
    /// Second half.
    pub k1: u64,
}

impl CookieKey {
    /// Whether the key was set.
    #[inline(always)]
    pub const fn is_set(&self) -> bool {
        self.k0 != 0 || self.k1 != 0
    }
}

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

/// An IPv4 TCP connection as seen from its client: the key of `TLS_FLOWS4`. Its addresses are
/// a [`FlowKey`]'s last four bytes, its ports the same ([`FlowKey::v4`], [`FlowKey4::mapped`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey4 {
    /// Client address, network order.
    pub saddr: [u8; 4],
    /// Server address, network order.
    pub daddr: [u8; 4],
    /// Client port, host order.
    pub sport: u16,
    /// Server port, host order.
    pub dport: u16,
}

/// The twelve bytes in front of an IPv4 address mapped into IPv6 (`::ffff:a.b.c.d`).
const V4_MAPPED: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

impl FlowKey4 {
    /// The same connection as a [`FlowKey`] (IPv4-mapped addresses).
    pub fn mapped(&self) -> FlowKey {
        let mut key = FlowKey {
            sport: self.sport,
            dport: self.dport,
            ..FlowKey::default()
        };
        key.saddr[..12].copy_from_slice(&V4_MAPPED);
        key.saddr[12..].copy_from_slice(&self.saddr);
        key.daddr[..12].copy_from_slice(&V4_MAPPED);
        key.daddr[12..].copy_from_slice(&self.daddr);
        key
    }
}

/// Slots of `TLS_REFUSED` (a power of two): a connection refused on its first segment is
/// remembered there, in the slot of its key, until a later refusal takes the slot. 160 KiB.
pub const TLS_REFUSED_SLOTS: u32 = 4096;

impl FlowKey {
    /// The client's address as a per-client budget counts it: an IPv4 address whole (mapped),
    /// an IPv6 address's /64 (its last eight bytes zero), since one host has a whole /64.
    pub fn client_source(&self) -> [u8; 16] {
        let mut source = self.saddr;
        if self.saddr[..12] != V4_MAPPED {
            source[8..].copy_from_slice(&[0; 8]);
        }
        source
    }

    /// The key of an IPv4 connection (both addresses IPv4-mapped, no padding set) as a
    /// [`FlowKey4`]; `None` for any other key.
    pub fn v4(&self) -> Option<FlowKey4> {
        if self.saddr[..12] != V4_MAPPED || self.daddr[..12] != V4_MAPPED || self.pad != 0 {
            return None;
        }
        let mut key = FlowKey4 {
            sport: self.sport,
            dport: self.dport,
            ..FlowKey4::default()
        };
        key.saddr.copy_from_slice(&self.saddr[12..]);
        key.daddr.copy_from_slice(&self.daddr[12..]);
        Some(key)
    }

    /// The key's slot in `TLS_REFUSED`: its ten 32-bit words folded by multiplication (a key
    /// all of whose words are zero is never a connection's: an IPv4 key has its `ffff` marks,
    /// an IPv6 one a server address).
    #[inline(always)]
    pub fn refused_slot(&self) -> u32 {
        const WORDS: usize = size_of::<FlowKey>() / 4;
        const { assert!(WORDS * 4 == size_of::<FlowKey>() && align_of::<FlowKey>() >= 4) };
        let words = (self as *const FlowKey).cast::<u32>();
        let mut h = 0u32;
        for i in 0..WORDS {
            // SAFETY: word `i` of the key, which is ten aligned words of integers (no padding).
            h = (h ^ unsafe { words.add(i).read() }).wrapping_mul(0x9e37_79b1);
        }
        h >> (32 - TLS_REFUSED_SLOTS.trailing_zeros())
    }
}

/// [`TlsFlow::state`]: the ClientHello is still arriving.
pub const FLOW_PENDING: u8 = 0;
/// [`TlsFlow::state`]: admitted; later packets are `tls-flow`.
pub const FLOW_ADMITTED: u8 = 1;
/// [`TlsFlow::state`]: rejected; later packets are dropped (or answered). A connection refused
/// on its first segment has no flow entry: it is remembered in `TLS_REFUSED` instead.
pub const FLOW_REJECTED: u8 = 2;
/// [`TlsFlow::state`]: a connection started by a SYN cookie whose hello takes several segments,
/// its first segment held back (dropped, its bytes parsed) because tls-new was refusing: the
/// kernel has nothing of it until the hello is judged.
pub const FLOW_HELD: u8 = 3;
/// [`TlsFlow::state`]: such a connection admitted, its first segment still to come again (the
/// client sends it once its retransmission timer fires) and be handed to the listener; until
/// then its other segments are dropped (they come again too).
pub const FLOW_AWAITING_FIRST: u8 = 4;

/// [`TlsFlow::state`]: admitted, a TLS 1.2 full handshake whose server sent its first flight
/// (seen at egress): the client's next handshake record, its key exchange, starts the server's
/// second piece of work ([`crate::maps::PENDING_KEY_EXCHANGE`]); the flow is then admitted as
/// before. Every other packet passes as `tls-flow`.
pub const FLOW_KEY_EXCHANGE: u8 = 5;

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

/// Key of the issued-sessions map: the key (`gateway_common::tls::issued_key`) of a session
/// id, ticket or PSK identity the server issued.
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
    /// When the key stops buying anything, unix seconds: a ticket's expiry (its clear tail,
    /// `crate::tls::tag::Tail`), after which the daemon removes the entry; 0 for a key the
    /// daemon withdraws itself when its lifetime ends (session ids).
    pub expires: u64,
}

/// [`IssuedValue::kind`] flag: the key was published by the NIC, vouched for by its ticket's tag
/// (a node sharing the ticket secret issued it), under the terms of the period's tag key.
pub const ISSUED_BY_TAG: u32 = 1 << 8;
/// [`IssuedValue::kind`] flag: the key was withdrawn (an offer of it did not resume). The entry
/// stays until [`IssuedValue::expires`] so that its ticket's tag cannot vouch for it again; it
/// buys nothing.
pub const ISSUED_WITHDRAWN: u32 = 1 << 9;

/// [`IssuedValue::kind`] flag: the key was published by the NIC from the server's own packets
/// (a session id its ServerHello gave and a ticket its second flight sent, after a full
/// handshake it completed: [`crate::tls::server`]), under its port's [`LearnTerms`], until
/// [`IssuedValue::expires`] (the daemon removes it then).
pub const ISSUED_BY_SERVER: u32 = 1 << 10;

/// Value of `TLS_LEARN`: how the NIC publishes what a server it does not terminate issues on
/// one port.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LearnTerms {
    /// How long a learnt session resumes, seconds (the server's own session lifetime; a
    /// ticket's lifetime hint shortens it).
    pub lifetime_s: u32,
    /// [`IssuedValue::limit`] of a learnt key.
    pub limit: u32,
    /// [`IssuedValue::per_minute`] of a learnt key.
    pub per_minute: u32,
    /// Padding, zero.
    pub pad: u32,
    /// Unix time in nanoseconds when `bpf_ktime_get_ns` read zero (as [`TagKey::clock_ns`]):
    /// the NIC's wall clock for a learnt key's expiry.
    pub clock_ns: u64,
}

impl LearnTerms {
    /// When a key learnt at monotonic time `now_ns` stops resuming, unix seconds: after the
    /// configured lifetime, or the ticket's lifetime hint `hint_s` when shorter (0: none).
    #[inline(always)]
    pub const fn expires(&self, now_ns: u64, hint_s: u32) -> u64 {
        let lifetime = if hint_s != 0 && hint_s < self.lifetime_s {
            hint_s
        } else {
            self.lifetime_s
        };
        self.clock_ns.wrapping_add(now_ns) / 1_000_000_000 + lifetime as u64
    }
}

/// [`IssuedValue::kind`] flag: the key was published by the NIC for a ticket (or PSK identity)
/// whose MAC it checked with the server's ticket key (`TLS_TICKET_KEYS`), under its port's
/// [`LearnTerms`]. The daemon removes every such key when a ticket key is removed from the
/// server's files (their next offers are checked again).
pub const ISSUED_BY_KEY: u32 = 1 << 11;

/// Key of `TLS_TICKET_KEYS`: a listener's port and the 16-byte name a ticket starts with.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TicketKeyId {
    /// The listener's port.
    pub port: u16,
    /// Padding, zero.
    pub pad: u16,
    /// The key name.
    pub name: [u8; 16],
}

/// Value of `TLS_TICKET_KEYS`: the HMAC-SHA256 key of one server ticket key, as the states after
/// its inner and outer keyed blocks ([`crate::sha256::pads`]): the NIC hashes only the ticket.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TicketMacKey {
    /// SHA-256 state after `key ^ ipad`.
    pub inner: [u32; 8],
    /// SHA-256 state after `key ^ opad`.
    pub outer: [u32; 8],
}

/// Ticket keys the NIC holds, at most (entries of `TLS_TICKET_KEYS`).
pub const MAX_TICKET_KEYS: u32 = 256;

/// Shortest ticket whose MAC the NIC checks: a key name (16), an IV (16), one cipher block (16)
/// and the MAC (32), the format of OpenSSL's and BoringSSL's ticket callbacks (nginx, HAProxy,
/// Envoy).
pub const MIN_MAC_TICKET: u32 = 80;

/// Ports whose sessions the NIC learns, at most (entries of `TLS_LEARN`).
pub const MAX_LEARN_PORTS: u32 = 256;

/// Key of the ticket tag keys map (`TLS_TAG_KEYS`): a listener's port and a rotation period.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TagKeyId {
    /// The port of the listener whose tickets the key tags, host order.
    pub port: u16,
    /// Padding, zero.
    pub pad: u16,
    /// The low 32 bits of the rotation period (`crate::tls::tag::Tail::period`).
    pub period: u32,
}

/// Value of the ticket tag keys map: the SipHash key of one period's ticket tags, derived by the
/// daemon from the listener's ticket secret, and the terms a key it vouches for is published
/// under at the NIC.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TagKey {
    /// The SipHash key, first half.
    pub k0: u64,
    /// The SipHash key, second half.
    pub k1: u64,
    /// [`IssuedValue::limit`] of a key it vouches for.
    pub limit: u32,
    /// [`IssuedValue::per_minute`] of a key it vouches for.
    pub per_minute: u32,
    /// Unix time in nanoseconds when `bpf_ktime_get_ns` (`CLOCK_MONOTONIC`) read zero: the
    /// NIC's wall clock for ticket expiry, set by the daemon whenever it writes the key.
    pub clock_ns: u64,
}

/// Entries of the ticket tag keys map: 64 periods of 16 listener ports.
pub const MAX_TAG_KEYS: u32 = 1024;
/// Periods per listener whose tag keys the daemon writes: the current one, the next (a node
/// whose clock runs early) and the ones before it whose tickets may still be alive.
pub const MAX_TAG_PERIODS: u64 = 64;

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
        /// Resumed connections the server answered that found the holds table (`TLS_HOLDS`)
        /// full: their key's place was given back at once, so they no longer count against its
        /// limit of connections at a time.
        pub holds_full: u64,
        /// SYNs to a port in SYN-cookie mode answered from the NIC with a cookie (no socket, no
        /// place in any queue of the kernel).
        pub cookies_sent: u64,
        /// Handshake-ending ACKs (no data) that carried a good cookie: dropped, nothing kept
        /// (the first data segment carries the cookie again).
        pub cookie_acks: u64,
        /// First data segments whose cookie checked: their hello judged before the kernel heard
        /// of the connection.
        pub cookie_hellos: u64,
        /// Connections handed to the kernel's listener with the socket made for them
        /// (`bpf_sk_assign_tcp_reqsk`): admitted, or pending a hello's later segments.
        pub handoffs: u64,
        /// Handoffs that failed (no listener, or the kernel refused): the kernel then answers
        /// the segment with a reset.
        pub handoffs_failed: u64,
        /// SYNs in SYN-cookie mode left to the kernel: their 4-tuple still had a socket there
        /// (TIME_WAIT, a client reusing its port), which the kernel ends before it answers.
        pub cookies_declined: u64,
        /// First segments of multi-segment hellos held back (SYN-cookie mode, while tls-new
        /// refused): the kernel made no connection unless the hello was then admitted.
        pub hellos_held: u64,
        /// Held hellos admitted and handed to the listener when their first segment came again.
        pub held_handoffs: u64,
        /// Held hellos admitted and handed to the listener at once, their first segment carried
        /// inside the segment that admitted them (one segment of both payloads).
        pub held_carried: u64,
        /// First segments sent again for a held hello admitted (where it was not carried) that
        /// were not the bytes judged: dropped; or that had nothing kept to be compared with (a
        /// flood evicted it): refused with a reset.
        pub held_unmatched: u64,
        /// Offers of a ticket no key was published for whose tag vouched for it (a node sharing
        /// the ticket secret issued it): its key published at the NIC ([`ISSUED_BY_TAG`]).
        pub tags_verified: u64,
        /// Offers of a ticket no key was published for whose tail did not vouch for it (no tag
        /// key for its period, expired, or a wrong tag): classed tls-new, also counted in
        /// `unverified_offers`.
        pub tags_refused: u64,
        /// Session ids and tickets a server the gateway does not terminate issued, learnt from
        /// its packets after a full handshake it completed, and published ([`ISSUED_BY_SERVER`]).
        pub keys_learnt: u64,
        /// Keys learnt that could not be published (the issued-keys table was full).
        pub keys_unlearnt: u64,
        /// Offers whose server answered with a full handshake (its ServerHello did not resume
        /// them): their key, if published, withdrawn.
        pub offers_declined: u64,
        /// Offers of a ticket no key was published for whose MAC checked out under the
        /// server's ticket key of its name: its key published ([`ISSUED_BY_KEY`]).
        pub macs_verified: u64,
        /// Offers of a ticket whose name is a server ticket key's but whose MAC is wrong:
        /// tls-new (a forgery, or a ticket cut or lengthened).
        pub macs_refused: u64,
        /// Offers of a ticket whose name a port's ticket key might be but whose bytes were not
        /// all in the segment that ended the hello: not checked, tls-new.
        pub macs_unchecked: u64,
        /// Segments of held hellos answered with a SACK of themselves (the first one held, or
        /// bytes held sent again), so that the client sends what follows them.
        pub held_sacked: u64,
        /// Segments of held hellos sent again (bytes already held: the client's timer fired, the
        /// segment after them lost or dropped).
        pub held_resent: u64,
        /// SYNs in SYN-cookie mode left to the kernel because no listener in the device's
        /// namespace takes their port (the connection is forwarded to a server elsewhere, or
        /// the kernel resets it): a cookie would be handed to nobody.
        pub cookies_no_listener: u64,
        /// First segments of held hellos kept apart, in a small table of their own, because
        /// their client's address (an IPv6 /64) was over its budget of holds
        /// ([`HOLDS_PER_SOURCE_PER_SECOND`]): they cannot evict other clients' held payloads.
        pub holds_over_budget: u64,
    }
}

/// First segments of multi-segment hellos one client address (an IPv6 /64) may have kept in the
/// main table of held payloads a second, on average (SYN-cookie mode, while tls-new refuses).
/// That table is bounded (4,096, LRU) and a client whose next segment was lost needs its
/// payload kept for a retransmission timeout: so one address finishing handshakes faster has
/// its further holds kept in a small table of their own, which only it churns.
pub const HOLDS_PER_SOURCE_PER_SECOND: u64 = 64;
/// Holds one client address may have in the main table at once beyond its rate (the burst).
pub const HOLDS_PER_SOURCE_BURST: u64 = 256;

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

#[cfg(test)]
mod tests {
    use alloc::{vec, vec::Vec};

    use super::*;

    fn v4_key(client: [u8; 4], port: u16) -> FlowKey {
        let mut key = FlowKey {
            sport: port,
            dport: 443,
            ..Default::default()
        };
        key.saddr[10..12].copy_from_slice(&[0xff, 0xff]);
        key.saddr[12..].copy_from_slice(&client);
        key.daddr[10..12].copy_from_slice(&[0xff, 0xff]);
        key.daddr[12..].copy_from_slice(&[10, 99, 0, 1]);
        key
    }

    /// An IPv4 client is budgeted by its address, an IPv6 one by its /64.
    #[test]
    fn a_client_source_is_an_ipv4_address_or_an_ipv6_64() {
        let key = v4_key([10, 99, 0, 2], 40000);
        assert_eq!(key.client_source(), key.saddr);
        let mut other = v4_key([10, 99, 0, 3], 40000);
        assert_ne!(other.client_source(), key.client_source());
        other.saddr = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 7, 1, 2, 3, 4, 5, 6, 7, 8];
        let mut same_64 = other;
        same_64.saddr[15] = 9;
        same_64.sport = 1;
        assert_eq!(other.client_source(), same_64.client_source());
        assert_eq!(other.client_source()[8..], [0; 8]);
        let mut next_64 = other;
        next_64.saddr[7] = 8;
        assert_ne!(other.client_source(), next_64.client_source());
    }

    /// An IPv4 key goes to a `FlowKey4` and back unchanged; an IPv6 key (even one of the
    /// IPv4-mapped addresses on one side only) has none.
    #[test]
    fn v4_keys_convert_both_ways() {
        let key = v4_key([10, 99, 0, 2], 40000);
        let short = key.v4().expect("an IPv4 key");
        assert_eq!(short.saddr, [10, 99, 0, 2]);
        assert_eq!(short.daddr, [10, 99, 0, 1]);
        assert_eq!((short.sport, short.dport), (40000, 443));
        assert_eq!(short.mapped(), key);
        let mut v6 = key;
        v6.saddr[10] = 0;
        assert_eq!(v6.v4(), None);
        let mut v6 = key;
        v6.daddr[0] = 0x20;
        assert_eq!(v6.v4(), None);
        assert_eq!(FlowKey::default().v4(), None);
    }

    /// The slots of one client's consecutive ports, and of one port's neighbouring clients,
    /// spread over the table: a flood from one address does not crowd into a few slots.
    #[test]
    fn refused_slots_spread_over_the_table() {
        let n = TLS_REFUSED_SLOTS as usize;
        for keys in [
            (0..n as u16)
                .map(|p| v4_key([10, 99, 0, 2], 1024 + p))
                .collect::<Vec<_>>(),
            (0..n as u32)
                .map(|c| v4_key((0x0a00_0000 + c).to_be_bytes(), 5555))
                .collect(),
        ] {
            let mut used = vec![false; n];
            for k in &keys {
                let slot = k.refused_slot() as usize;
                assert!(slot < n, "slot {slot} out of the table");
                used[slot] = true;
            }
            let distinct = used.iter().filter(|u| **u).count();
            // Uniform hashing of n keys into n slots fills about 63% of them.
            assert!(distinct > n / 2, "{distinct} of {n} slots used");
        }
    }
}
