//! TC programs: the fallback hook for devices without usable XDP.

use aya_ebpf::{
    bindings::{TC_ACT_OK, TC_ACT_SHOT},
    macros::classifier,
    programs::TcContext,
};

use gateway_common::{
    maps::{IPPROTO_UDP, ServiceKind, service_port_index},
    packet::{Kind, parse},
};

use crate::{
    bytes::SkbBytes,
    datapath::{Verdict, process, process_sip},
    maps::SERVICE_PORTS,
    sip::sip_response,
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

/// The SIP classifier, reached from `gateway_tc_ingress` by tail call.
#[classifier]
pub fn gateway_tc_sip(ctx: TcContext) -> i32 {
    let len = u64::from(ctx.len());
    match process_sip(&ctx, &SkbBytes::new(&ctx), len) {
        Verdict::Pass => TC_ACT_OK,
        Verdict::Drop => TC_ACT_SHOT,
    }
}

/// The egress classifier: completions and service times of SIP transactions, from the server's
/// responses leaving the host. It never changes a packet's fate.
#[classifier]
pub fn gateway_tc_egress(ctx: TcContext) -> i32 {
    let bytes = SkbBytes::new(&ctx);
    let pkt = parse(&bytes);
    if pkt.kind == Kind::Transport && pkt.transport.proto == IPPROTO_UDP {
        let is_sip = service_port_index(IPPROTO_UDP, pkt.transport.src_port)
            .and_then(|i| SERVICE_PORTS.get(i))
            .is_some_and(|k| u32::from(*k) == ServiceKind::Sip as u32);
        if is_sip {
            sip_response(&ctx, &pkt);
        }
    }
    TC_ACT_OK
}
