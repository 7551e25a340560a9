//! The TLS counters (`TLS_COUNTERS`, per CPU), which the TLS classifier, the places of issued
//! keys, the hooks and TLS's events of the TCP layer count in: a home of their own, below all
//! of them, so that counting imports nothing else.

use aya_ebpf::{btf_maps::PerCpuArray, macros::btf_map};
use gateway_common::maps::TlsCounters;

/// TLS counters, per CPU.
#[btf_map]
pub static TLS_COUNTERS: PerCpuArray<TlsCounters, 1> = PerCpuArray::new();

/// Counts in this CPU's TLS counters.
#[inline(always)]
pub fn count(f: impl FnOnce(&mut TlsCounters)) {
    if let Some(c) = TLS_COUNTERS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        f(unsafe { &mut *c });
    }
}
