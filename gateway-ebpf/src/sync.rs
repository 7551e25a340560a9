//! Primitives for state that CPUs share: atomic add, compare-and-swap, and the monotonic clock
//! deadlines and rate limits are measured on.

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
