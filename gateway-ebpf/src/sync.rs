//! Primitives for state that CPUs share: atomic add, compare-and-swap, the monotonic clock
//! deadlines and rate limits are measured on, and the GCRA rate test every limiter uses.

use aya_ebpf::helpers::generated::bpf_ktime_get_ns;

/// A relaxed atomic add (BPF_ATOMIC | BPF_ADD).
///
/// # Safety
/// `dst` must point to a live, aligned u64.
#[inline(always)]
pub unsafe fn atomic_add(dst: *mut u64, v: u64) {
    // SAFETY: upheld by the caller.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            dst, v,
        );
    }
}

/// Sets `*dst` to `new` if it holds `old` (BPF_ATOMIC | BPF_CMPXCHG); whether it did.
///
/// # Safety
/// `dst` must point to a live, aligned u64.
#[inline(always)]
pub unsafe fn compare_and_swap(dst: *mut u64, old: u64, new: u64) -> bool {
    // SAFETY: upheld by the caller.
    unsafe {
        core::intrinsics::atomic_cxchg::<
            u64,
            { core::intrinsics::AtomicOrdering::SeqCst },
            { core::intrinsics::AtomicOrdering::SeqCst },
        >(dst, old, new)
        .1
    }
}

/// Nanoseconds of `CLOCK_MONOTONIC`.
#[inline(always)]
pub fn now_ns() -> u64 {
    // SAFETY: no arguments.
    unsafe { bpf_ktime_get_ns() }
}

/// Attempts at advancing a GCRA state before an arrival counts as refused (each failed attempt
/// means another CPU passed in between).
const GCRA_TRIES: usize = 4;

/// One GCRA conformance test on the theoretical arrival time at `tat_ptr`: emission interval
/// `interval_ns` (above 0), tolerance `burst * interval_ns`. Advances the TAT by
/// compare-and-swap, so CPUs testing at the same instant never both pass on one slot, at `now`
/// (the caller's clock read). Used by
/// the classes' rate limits, their reply limits, and each issued key's resumption rate.
#[inline(always)]
pub fn gcra(tat_ptr: *mut u64, interval_ns: u64, burst: u64, now: u64) -> bool {
    let tolerance = burst * interval_ns;
    for _ in 0..GCRA_TRIES {
        // SAFETY: the TAT is only changed by compare-and-swap, so of two CPUs that read the same
        // TAT only one advances it; the other tries again from the new value.
        let seen = unsafe { core::ptr::read_volatile(tat_ptr) };
        let tat = if seen < now { now } else { seen };
        if tat - now > tolerance {
            return false;
        }
        if unsafe { compare_and_swap(tat_ptr, seen, tat + interval_ns) } {
            return true;
        }
    }
    // Lost every race: as many CPUs passed at once, so the limiter is busy anyway.
    false
}
