//! Admitted units that have not ended (`TLS_PENDING`, `SIP_PENDING`).

use super::FlowKey;

super::pinned_maps! {
    /// Admitted TLS connections the server has not answered yet ([`crate::maps::FlowKey`] to
    /// [`crate::maps::Pending`]): not LRU, so nothing can evict them.
    TLS_PENDING: FlowKey => Pending,
    /// Admitted SIP requests the server has not answered yet (unit key, see
    /// `SipInfo::unit_key`, to [`crate::maps::Pending`]): not LRU either.
    SIP_PENDING: u64 => Pending,
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
