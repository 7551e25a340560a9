//! TC programs: the fallback hook for devices without usable XDP.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};

use crate::{
    bytes::SkbBytes,
    datapath::{Verdict, process},
};

/// The ingress classifier as a TC (tcx) program.
#[classifier]
pub fn gateway_tc_ingress(ctx: TcContext) -> i32 {
    let len = u64::from(ctx.len());
    match process(&ctx, &SkbBytes::new(&ctx), len) {
        Verdict::Pass => TC_ACT_OK,
        Verdict::Drop => TC_ACT_SHOT,
    }
}
