//! TC programs: the fallback hook for devices without usable XDP.

use aya_ebpf::{bindings::TC_ACT_OK, macros::classifier, programs::TcContext};

use gateway_common::{
    maps::{IPPROTO_TCP, IPPROTO_UDP, ServiceKind},
    packet::{PacketKind, parse, plain_ipv4},
};

use crate::{
    bytes::SkbBytes,
    context::{Action, Handover, handed_over},
    datapath::{pass_no_service, process, process_reply, process_sip},
    maps::service_kind,
    reply::finish,
    sip::sip_response,
    tcp::{handoff::handoff, held::join_handed_over},
    tls::{Tls, answer::tls_answer},
    tls_counters,
};

/// The ingress classifier as a TC (tcx) program.
#[classifier]
pub fn gateway_tc_ingress(ctx: TcContext) -> i32 {
    let len = u64::from(ctx.len());
    let bytes = SkbBytes::new(&ctx);
    let plain = plain_ipv4(&bytes);
    if pass_no_service(plain, len) {
        return Action::Pass.tc(&ctx);
    }
    let action = process(&ctx, &bytes, len, plain);
    if action == Action::Handoff {
        handoff::<Tls>(&ctx);
    }
    action.tc(&ctx)
}

/// The SIP classifier, reached from `gateway_tc_ingress` by tail call.
#[classifier]
pub fn gateway_tc_sip(ctx: TcContext) -> i32 {
    let len = u64::from(ctx.len());
    process_sip(&ctx, &SkbBytes::new(&ctx), len).tc(&ctx)
}

/// The reply program, reached by tail call for a refused TLS segment or SIP request: a reset or
/// a 503 to its sender (redirected to the device's egress; for TCP, a copy, and the server's
/// reset to the local stack), or a drop.
#[classifier]
pub fn gateway_tc_reply(ctx: TcContext) -> i32 {
    let len = u64::from(ctx.len());
    let action = process_reply(&ctx, &SkbBytes::new(&ctx), len);
    // A held hello joined with the segment that admitted it, for its listener.
    if action == Action::Handoff {
        handoff::<Tls>(&ctx);
    }
    action.tc(&ctx)
}

/// The finishing program at the TC ingress of an XDP attachment: a frame the XDP reply program
/// handed over (the server's reset of a refused connection) gets the client's reset sent as a
/// copy, and goes on to the stack; a reply handed over to be sent (a 503, where XDP_TX may not
/// deliver) goes out of the device. Every other frame passes untouched, after one metadata
/// check. A first data segment the XDP program admitted on its SYN cookie is handed to its
/// listener (`crate::tcp::handoff`), and so is the segment that admitted a held hello, once the
/// held first segment is joined with it (`crate::tcp::held`).
#[classifier]
pub fn gateway_tc_finish(ctx: TcContext) -> i32 {
    let Some((tag, client_ack)) = handed_over(&ctx) else {
        return TC_ACT_OK;
    };
    match tag {
        Handover::SendOut => Action::Tx.tc(&ctx),
        Handover::Handoff => {
            handoff::<Tls>(&ctx);
            TC_ACT_OK
        }
        Handover::Join => {
            let action = join_handed_over::<Tls>(&ctx, client_ack);
            if action == Action::Handoff {
                handoff::<Tls>(&ctx);
            }
            action.tc(&ctx)
        }
        Handover::Reset => {
            let pkt = parse(&SkbBytes::new(&ctx));
            if pkt.kind != PacketKind::Transport || !finish(&ctx, &pkt, client_ack) {
                tls_counters::count(|c| c.resets_withheld += 1);
            }
            TC_ACT_OK
        }
    }
}

/// The egress classifier: completions of the units the server answers (TLS connections, SIP
/// requests) and SIP service times, from what the server sends leaving the host. It never
/// changes a packet's fate.
#[classifier]
pub fn gateway_tc_egress(ctx: TcContext) -> i32 {
    let bytes = SkbBytes::new(&ctx);
    let pkt = parse(&bytes);
    if pkt.kind == PacketKind::Transport {
        let t = &pkt.transport;
        match service_kind(t.proto, t.src_port) {
            Some(ServiceKind::Sip) if t.proto == IPPROTO_UDP => sip_response(&ctx, &pkt),
            Some(ServiceKind::Tls) if t.proto == IPPROTO_TCP => tls_answer(&ctx, &bytes, &pkt),
            _ => {}
        }
    }
    TC_ACT_OK
}
