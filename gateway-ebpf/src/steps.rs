//! Step machines under `bpf_loop`: the parsers and builders that keep their state in a per-CPU
//! scratch slot and run a bounded number of steps over it.
//!
//! A step that is a global function is checked by the verifier once, with none of its caller's
//! state. Several steps run in one call, each reading the slot afresh ([`reread`]): on this
//! machine kind every return is mispredicted (`spec_rstack_overflow: Safe RET`), so calls, not
//! steps, are what the machines' time went to.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_loop;

use crate::bytes::opaque;

/// Runs `callback` over `slot`, `iterations` times at most (`bpf_loop`); the callback's context
/// points at the slot's pointer ([`call`]). Nothing runs for a null slot (a global function's
/// pointer may be null to the verifier).
#[inline(always)]
pub fn run<T>(slot: *mut T, iterations: u32, callback: extern "C" fn(u64, *mut c_void) -> i64) {
    if slot.is_null() {
        return;
    }
    // The callback gets the slot by pointer rather than looking it up at each iteration.
    let mut p = slot;
    // SAFETY: `callback` is a static subprogram with the callback signature bpf_loop expects,
    // and its context is the slot pointer on this frame, alive for the call.
    unsafe {
        bpf_loop(iterations, callback as *mut c_void, (&raw mut p).cast(), 0);
    }
}

/// The body of a `bpf_loop` callback of [`run`]: `calls` calls of the global function `step`
/// over the slot, until one returns non-zero (then 1: stop).
#[inline(always)]
pub fn call<T>(ctx: *mut c_void, calls: usize, step: extern "C" fn(*mut T) -> i32) -> i64 {
    // SAFETY: `ctx` points at the pointer `run` left on its frame.
    let slot = unsafe { *ctx.cast::<*mut T>() };
    for _ in 0..calls {
        // The verifier wants a callback's return in [0, 1], and takes a global function's for
        // any number: the test stays behind the barrier (LLVM knows the functions return 0 or
        // 1).
        if opaque(step(slot) as u64) != 0 {
            return 1;
        }
    }
    0
}

/// The slot `p` points at, read afresh: through the barrier LLVM keeps nothing of it in
/// registers from the step before, so where one step can stop does not multiply the next
/// one's paths for the verifier (which does not track map memory).
///
/// # Safety
/// `p` points at a live slot that nothing else uses while the reference lives.
#[inline(always)]
pub unsafe fn reread<'a, T>(p: *mut T) -> &'a mut T {
    // SAFETY: as the caller promises.
    unsafe { &mut *core::hint::black_box(p) }
}

/// Runs `step` over the slot `p` up to `times` times, each time on the slot read afresh
/// ([`reread`]), until it returns `true` (done): then 1, else 0. 1 for a null slot.
///
/// # Safety
/// `p` is null or points at a live slot that nothing else uses during the call.
#[inline(always)]
pub unsafe fn repeat<T>(p: *mut T, times: usize, mut step: impl FnMut(&mut T) -> bool) -> i32 {
    if p.is_null() {
        return 1;
    }
    for _ in 0..times {
        // SAFETY: not null, and as the caller promises.
        if step(unsafe { reread(p) }) {
            return 1;
        }
    }
    0
}
