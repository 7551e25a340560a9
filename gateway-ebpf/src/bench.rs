//! The benchmark's programs, attached nowhere by the daemon: the bare baselines, and the
//! classifier on a packet made new for every repeated run.

use aya_ebpf::{
    bindings::xdp_action,
    btf_maps::{Array, ProgramArray},
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use gateway_common::maps::{BenchFresh, FRESH_BYTES, FRESH_LETTERS, FRESH_PORT, MAX_FRESH_OFFSET};

use crate::bytes::{XdpBytes, opaque};

/// How [`gateway_bench_fresh`] changes its packet (set by the benchmark; not pinned). One value
/// for all CPUs, not one per CPU: a repeated test run that yields to the scheduler may go on
/// on another CPU, and its runs must go on numbering where they were (one run at a time
/// writes it: the benchmark's).
#[btf_map]
static BENCH_FRESH: Array<BenchFresh, 1> = Array::new();

/// A program that passes everything and does nothing else: the benchmark's baseline.
#[xdp]
pub fn gateway_bare_pass(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_PASS
}

/// A program that drops everything and does nothing else: the baseline of a refusal (the
/// cheapest drop there is).
#[xdp]
pub fn gateway_bare_drop(_ctx: XdpContext) -> u32 {
    xdp_action::XDP_DROP
}

/// The benchmark's jump to the classifier: slot 0 holds `gateway_xdp` (set by the benchmark;
/// not pinned).
#[btf_map]
static BENCH_JUMP: ProgramArray<1> = ProgramArray::new();

/// The ingress classifier (`gateway_xdp` itself, by tail call) on its packet after
/// [`BENCH_FRESH`]'s change: repeated test runs of one frame keep the writes, so each run
/// classifies a new connection's hello or a new transaction's request, as a flood of them would
/// be. What the change and the jump cost is measured beside it (the same program on a packet of
/// no service). A tail call, not a copy of the classifier: a second copy in the object cost the
/// daemon, which parses the whole object, 15 MB of memory.
#[xdp]
pub fn gateway_bench_fresh(ctx: XdpContext) -> u32 {
    freshen(&ctx);
    // SAFETY: a tail call never returns on success; on failure the run is aborted, which the
    // benchmark checks.
    unsafe { BENCH_JUMP.tail_call(&ctx, 0) };
    xdp_action::XDP_ABORTED
}

/// Writes the run's number into the packet per [`BENCH_FRESH`].
#[inline(always)]
fn freshen(ctx: &XdpContext) {
    let Some(f) = BENCH_FRESH.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: written by the benchmark's test runs alone, one at a time.
    let f = unsafe { &mut *f };
    f.runs = f.runs.wrapping_add(1);
    let bytes = match f.mode {
        FRESH_PORT => {
            let [hi, lo] = (f.runs as u16).to_be_bytes();
            [hi, lo, 0, 0]
        }
        FRESH_LETTERS => BenchFresh::letters(f.runs),
        _ => return,
    };
    let width = if f.mode == FRESH_PORT { 2 } else { FRESH_BYTES };
    let at = opaque(u64::from(f.offset)) as usize;
    if at > MAX_FRESH_OFFSET as usize {
        return;
    }
    let frame = XdpBytes::new(ctx);
    let Some(p) = frame.writable_at::<FRESH_BYTES>(at) else {
        return;
    };
    // SAFETY: FRESH_BYTES bytes at `p` lie inside the frame (checked by `writable_at`).
    unsafe {
        for (i, b) in bytes.iter().enumerate().take(width) {
            core::ptr::write_volatile(p.add(i), *b);
        }
    }
}
