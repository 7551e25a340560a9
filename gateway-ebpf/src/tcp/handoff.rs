//! The handoff of a connection the NIC answered with a SYN cookie (`super::cookie`): its
//! first data segment, admitted by its service (or pending), goes to the kernel's listener with the
//! request socket made for it from what the cookie kept (`bpf_sk_assign_tcp_reqsk`, a kfunc of
//! kernel 6.9 and later, at TC ingress only). The kernel then makes the connection's socket
//! from that segment, as from an ACK carrying one of its own SYN cookies.
//!
//! The cookie is checked again here, from the segment itself: nothing travels from the XDP
//! program but the one metadata word saying to hand the segment over.

use core::ffi::c_void;

use aya_ebpf::{
    EbpfContext,
    bindings::{__sk_buff, bpf_sock_tuple},
    helpers::generated::{bpf_sk_release, bpf_skc_lookup_tcp, bpf_skc_to_tcp_sock},
    programs::TcContext,
};
use gateway_common::{
    maps::IPPROTO_TCP,
    packet::{PacketKind, parse},
    syncookie::OUR_WSCALE,
};

use super::{TcpEvent, TcpService, cookie, fill_tuple, flow_key};
use crate::{bytes::SkbBytes, context::TCP_LISTEN};

/// `struct bpf_tcp_req_attrs`: the request socket's options, as the kernel takes them.
#[repr(C)]
struct ReqAttrs {
    rcv_tsval: u32,
    rcv_tsecr: u32,
    mss: u16,
    rcv_wscale: u8,
    snd_wscale: u8,
    ecn_ok: u8,
    wscale_ok: u8,
    sack_ok: u8,
    tstamp_ok: u8,
    usec_ts_ok: u8,
    reserved: [u8; 3],
}

unsafe extern "C" {
    /// The kernel's kfunc (net/core/filter.c). The loader resolves the call against the
    /// running kernel's BTF (`gateway::kfunc`); on a kernel without it, the call becomes
    /// `r0 = -EOPNOTSUPP`, and every handoff fails (counted).
    fn bpf_sk_assign_tcp_reqsk(
        skb: *mut __sk_buff,
        sk: *mut c_void,
        attrs: *mut ReqAttrs,
        attrs_sz: u32,
    ) -> i32;
}

/// Hands the segment of `ctx`, of service `S`, to its listener with a request socket, counting
/// the outcome; whether it went. On failure the segment goes on all the same: the kernel, finding no socket
/// and no cookie of its own, answers it with a reset.
#[inline(always)]
pub fn handoff<S: TcpService>(ctx: &TcContext) -> bool {
    let done = hand::<S>(ctx);
    S::count(if done {
        TcpEvent::Handoff
    } else {
        TcpEvent::HandoffFailed
    });
    done
}

#[inline(always)]
fn hand<S: TcpService>(ctx: &TcContext) -> bool {
    let b = SkbBytes::new(ctx);
    let pkt = parse(&b);
    if pkt.kind != PacketKind::Transport || pkt.transport.proto != IPPROTO_TCP {
        return false;
    }
    let Some(s) = S::scratch() else {
        return false;
    };
    // SAFETY: per-CPU slot, used only by this program run.
    let s = S::tcp(unsafe { &mut *s });
    if !flow_key(&b, &pkt, &mut s.key, false) {
        return false;
    }
    if !cookie::check(ctx, &pkt, s) {
        return false;
    }
    let (kept, o) = (s.cookie.kept, s.cookie.parsed);
    let scaled = cookie::scaled(&kept);
    let mut attrs = ReqAttrs {
        rcv_tsval: o.tsval,
        rcv_tsecr: o.tsecr,
        mss: kept.mss,
        rcv_wscale: if scaled { OUR_WSCALE } else { 0 },
        snd_wscale: if scaled { kept.wscale } else { 0 },
        ecn_ok: 0,
        wscale_ok: u8::from(scaled),
        sack_ok: u8::from(kept.sack),
        tstamp_ok: u8::from(o.ts),
        usec_ts_ok: 0,
        reserved: [0; 3],
    };
    let size = fill_tuple(&s.key, &mut s.tuple, pkt.ip_version == 4);
    // SAFETY: the tuple is in map memory of 40 bytes; the reference is released below.
    let skc = unsafe {
        bpf_skc_lookup_tcp(
            ctx.as_ptr(),
            s.tuple.as_mut_ptr().cast::<bpf_sock_tuple>(),
            size,
            u64::MAX, // BPF_F_CURRENT_NETNS
            0,
        )
    };
    if skc.is_null() {
        return false;
    }
    // SAFETY: a live socket reference, released once below.
    let listening = unsafe { (*skc).state } == TCP_LISTEN;
    let mut done = false;
    if listening {
        // SAFETY: the socket found above; the cast helper takes any socket.
        let sk = unsafe { bpf_skc_to_tcp_sock(skc.cast()) };
        if !sk.is_null() {
            // SAFETY: the listener's socket, the program's own skb and attributes on the stack,
            // of the size the kernel checks.
            done = unsafe {
                bpf_sk_assign_tcp_reqsk(
                    ctx.skb.skb,
                    sk.cast(),
                    &raw mut attrs,
                    size_of::<ReqAttrs>() as u32,
                )
            } == 0;
        }
    }
    // SAFETY: the reference taken above.
    unsafe { bpf_sk_release(skc.cast()) };
    done
}
