//! Admitted units that have not ended (`TLS_PENDING`, `SIP_PENDING`).

use super::FlowKey;

super::pinned_maps! {
    /// Admitted TLS connections the server has not answered yet ([`crate::maps::FlowKey`] to
    /// [`crate::maps::Pending`]): not LRU, so nothing can evict them.
    TLS_PENDING: FlowKey => Pending,
    /// Admitted SIP requests the server has not answered yet (unit key, see
    /// `SipInfo::unit_key`, to [`crate::maps::Pending`]): not LRU either.
    SIP_PENDING: u64 => Pending,
    /// `sip-original`'s units by method family ([`crate::maps::SipFamily`], index
    /// [`SIP_FAMILY_INVITE`] or [`SIP_FAMILY_OTHER`]): their own backlog. Written by the
    /// datapath alone.
    SIP_FAMILIES: u32 => SipFamily,
    /// The backlog limit of each of `sip-original`'s method families (same index; 0 for none:
    /// the class's limit alone). Written by the daemon's controller alone.
    SIP_FAMILY_LIMITS: u32 => u64,
}

/// [`SipFamily`] index of `sip-original`'s INVITEs ([`PENDING_INVITE`]).
pub const SIP_FAMILY_INVITE: u32 = 0;
/// [`SipFamily`] index of `sip-original`'s other methods.
pub const SIP_FAMILY_OTHER: u32 = 1;
/// Entries of `SIP_FAMILIES`.
pub const SIP_FAMILIES_LEN: u32 = 2;

/// One method family of `sip-original`: a backlog of its own, under a limit of its own
/// (`SIP_FAMILY_LIMITS`) inside the class's. The controller sets the limit (mode sip), so that
/// INVITEs queueing at the server cannot take the places of OPTIONS it answers on a fast path,
/// nor the other way round. `admitted` and `ended` only grow (atomic adds by whoever holds or
/// ends a unit), as the class's own counters do.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SipFamily {
    /// Units of the family admitted.
    pub admitted: u64,
    /// Units of the family ended (answered or expired).
    pub ended: u64,
}

impl SipFamily {
    /// Units of the family outstanding.
    pub const fn backlog(&self) -> u64 {
        self.admitted.saturating_sub(self.ended)
    }

    /// Whether one more unit fits under `limit` (0: no limit).
    pub const fn has_room(&self, limit: u64) -> bool {
        limit == 0 || self.backlog() < limit
    }
}

/// The `SIP_FAMILIES` index of a `sip-original` unit with `PENDING_*` flags `flags`.
pub const fn sip_family(flags: u32) -> u32 {
    if flags & PENDING_INVITE != 0 {
        SIP_FAMILY_INVITE
    } else {
        SIP_FAMILY_OTHER
    }
}

/// How often the datapath looks for expired units of a class, in nanoseconds.
pub const SWEEP_INTERVAL_NS: u64 = 100_000_000;

/// Entries of each pending table (`TLS_PENDING`, `SIP_PENDING`). When one is full, new work of
/// its classes is refused (counted in [`super::DatapathCounters::pending_full`]) and admitted work keeps
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
    /// For a `tls-resumed` connection, the issued key ([`super::IssuedKey`]) its offer holds a place of
    /// ([`super::IssuedValue::in_use`]), given back when the unit ends; zero otherwise.
    pub offer: [u8; crate::tls::KEY_LEN],
}

/// [`Pending::flags`]: no answer can ever match this unit (a SIP first fragment with no readable
/// message, keyed by its source), so it ends at its timeout. The server may well be working on
/// it: the controller counts it as live work, never as work the server passed over.
pub const PENDING_UNMATCHED: u32 = 1;

/// [`Pending::flags`]: a `sip-original` INVITE. Its service time goes into its own slot of
/// `SERVICE_TIMES` ([`super::SLOT_SIP_INVITE`]), and the controller counts it apart from the
/// class's other methods: an INVITE's time is its own, not an OPTIONS' answered on a fast path.
pub const PENDING_INVITE: u32 = 2;

/// [`Pending::flags`]: a `tls-new` TLS 1.2 connection, on a port whose sessions the NIC learns
/// (`TLS_LEARN`), whose server answered with the first flight of a full handshake. The unit was
/// completed then (its class's place freed: a client that goes silent holds none); the entry
/// stays, uncounted, to carry what the server's second flight confirms (its ChangeCipherSpec:
/// the client finished), until then, the connection's close, or its timeout.
pub const PENDING_ANSWERED: u32 = 4;

/// [`Pending::flags`], with [`PENDING_ANSWERED`]: the server's ServerHello issued a session id;
/// [`Pending::offer`] holds its key until the server's ChangeCipherSpec publishes it.
pub const PENDING_LEARN_SID: u32 = 8;

/// [`Pending::flags`]: the second piece of a TLS 1.2 full handshake's work, a `tls-new` unit of
/// its own: the client's key exchange arrived (its first handshake record after the server's
/// first flight), and the server works on it (an RSA server's private-key operation, an ECDH)
/// until its ChangeCipherSpec. Admitted without a limit (refusing it would break a handshake
/// already under way), counted in the class's backlog, ended by the CCS, an alert or close,
/// or its timeout (expired).
pub const PENDING_KEY_EXCHANGE: u32 = 16;

/// Whether the unit `unit` is in its class's counts: every unit but an answered one kept only
/// to carry what the server's second flight confirms ([`PENDING_ANSWERED`] without
/// [`PENDING_KEY_EXCHANGE`]).
pub const fn pending_counted(unit: &Pending) -> bool {
    unit.flags & PENDING_ANSWERED == 0 || unit.flags & PENDING_KEY_EXCHANGE != 0
}
