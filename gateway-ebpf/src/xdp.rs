//! XDP programs.

use aya_ebpf::{bindings::xdp_action, macros::xdp, programs::XdpContext};

use gateway_common::packet::{PlainIpv4, plain_ipv4};

use crate::{
    bytes::XdpBytes,
    context::{Action, Handover, Rewrite},
    datapath::{pass_no_service, process, process_reply, process_sip},
    pending::sweep_now,
    tls_counters,
};

/// The ingress classifier at the NIC.
#[xdp]
pub fn gateway_xdp(ctx: XdpContext) -> u32 {
    let bytes = XdpBytes::new(&ctx);
    let plain = plain_ipv4(&bytes);
    if pass_no_service(plain, bytes.len()) {
        return xdp_action::XDP_PASS;
    }
    classify(&ctx, PlainIpv4::word(plain))
}

/// The classifier of every frame [`pass_no_service`] leaves: a function of its own, so the packets
/// of no service pay for no call. `plain`: what `plain_ipv4` read of the frame, as a word
/// (`PlainIpv4::word`), so the classifier does not read it again.
#[inline(never)]
fn classify(ctx: &XdpContext, plain: u64) -> u32 {
    // The frame's bounds read again here: the verifier tracks packet pointers through a call
    // only in registers.
    let bytes = XdpBytes::new(ctx);
    let action = process(ctx, &bytes, bytes.len(), PlainIpv4::from_word(plain));
    // A connection's first segment to hand to its listener: the finishing program at TC
    // ingress makes its socket (kfuncs that make one run at TC only).
    if action == Action::Handoff && !ctx.hand_over(Handover::Handoff, 0) {
        tls_counters::count(|c| c.handoffs_failed += 1);
    }
    action.xdp()
}

/// The SIP classifier, reached from `gateway_xdp` by tail call.
#[xdp]
pub fn gateway_xdp_sip(ctx: XdpContext) -> u32 {
    let bytes = XdpBytes::new(&ctx);
    process_sip(&ctx, &bytes, bytes.len()).xdp()
}

/// The reply program, reached by tail call for a refused TLS segment or SIP request: a reset or
/// a 503 to its sender (XDP_TX), or a drop.
#[xdp]
pub fn gateway_xdp_reply(ctx: XdpContext) -> u32 {
    let bytes = XdpBytes::new(&ctx);
    process_reply(&ctx, &bytes, bytes.len()).xdp()
}

/// Ends the expired units of the TLS and SIP tables now, and the holds of resumed connections
/// that are gone (the sweep the datapath otherwise runs at admissions, each table's pass when
/// its earliest entry is due). Attached nowhere: the daemon runs it by `BPF_PROG_TEST_RUN` after
/// marking the units and holds whose connection is gone, so they end (and are counted, by the
/// datapath alone) without waiting for the next arrival.
#[xdp]
pub fn gateway_sweep(_ctx: XdpContext) -> u32 {
    sweep_now();
    xdp_action::XDP_PASS
}
