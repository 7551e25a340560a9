//! The per-packet logic shared by the XDP and TC ingress programs: parse, look the destination up
//! in the services map, classify, count, and apply the fragment / unparseable policy.

use aya_ebpf::EbpfContext;
use aya_log_ebpf::debug;
use gateway_common::{
    Class,
    bytes::PacketBytes,
    maps::{
        CONFIG_DROP_FRAGMENTS, CONFIG_DROP_UNPARSEABLE, IPPROTO_TCP, IPPROTO_UDP, ServiceKind,
        port_kind, port_syn_cookies,
    },
    packet::{Packet, PacketKind, PlainIpv4, TCP_SYN, parse},
    programs::Jump,
};

use crate::{
    admission::count_class,
    context::{Action, ConnectionLookup, CopyOut, Rewrite, TailCall},
    maps::{count, service_byte, setting},
    reply::{make_plain, reset, sip_503},
    sip::{compose_reply, sip_packet},
    tcp,
    tls::{self, tls_packet},
    tls_counters,
};

/// IPv6's next header for ESP.
const IPPROTO_ESP: u8 = 50;

/// Passes and counts a frame of `len` bytes that is plain IPv4 to no service (`plain`, what
/// `plain_ipv4` read of it), and says so; every other frame is left to [`process`] (given the
/// same reading), which would find for these the same class and verdict and nothing else to
/// count. Most packets a host receives are such. The programs run this before they call the
/// classifier as a function of its own, so that these packets pay for no call; it keeps its
/// stack small (the classifier's deepest chain of calls is near the verifier's 512 bytes).
#[inline(always)]
pub fn pass_no_service(plain: Option<PlainIpv4>, len: u64) -> bool {
    let Some(p) = plain else {
        return false;
    };
    if port_kind(service_byte(p.proto, p.dst_port).unwrap_or(0)).is_some() {
        return false;
    }
    count_class(Class::Other, true, len);
    true
}

/// Passes and counts a plain IPv4 segment (`plain`) that is not a SYN, of an admitted TLS
/// connection, and says so; every other frame is left to the full parse, which would find for
/// these the same class and verdict (`tls_packet`: an admitted flow's segment passes as
/// `tls-flow`) and nothing else to count. Every packet of an admitted connection but its first
/// few is such (not one that starts where the hello did: see `tls::flows::admitted4`).
#[inline(always)]
fn pass_admitted<B: PacketBytes>(b: &B, plain: Option<PlainIpv4>, len: u64) -> bool {
    let Some(p) = plain else {
        return false;
    };
    // A SYN on a known connection's 4-tuple is judged in full (`tls_packet`).
    if p.proto != IPPROTO_TCP
        || p.tcp_flags & TCP_SYN != 0
        || port_kind(service_byte(p.proto, p.dst_port).unwrap_or(0)) != Some(ServiceKind::Tls)
        || !tls::flows::admitted4(b, p.src_port, p.dst_port)
    {
        return false;
    }
    count_class(Class::TlsFlow, true, len);
    true
}

/// Classifies and counts one frame of `len` bytes, of which `plain_ipv4` read `plain` (the
/// caller's reading, not read again). `ctx` serves aya-log records (compiled in at debug
/// level, off unless the loader raises the level) and copies of TLS payloads.
#[inline(always)]
pub fn process<C: EbpfContext + CopyOut + ConnectionLookup + TailCall + Rewrite, B: PacketBytes>(
    ctx: &C,
    b: &B,
    len: u64,
    plain: Option<PlainIpv4>,
) -> Action {
    if pass_admitted(b, plain, len) {
        return Action::Pass;
    }
    let pkt = parse(b);
    // The parser counters are looked up only when there is something to count, so plain IPv4
    // traffic pays for one per-CPU lookup (its class's counters) and no more.
    if pkt.vlan_tags > 0 || pkt.ipv4_options || pkt.ip_version == 6 || pkt.fragmented {
        count(|c| {
            if pkt.fragmented {
                c.fragments += 1;
            }
            if pkt.vlan_tags > 0 {
                c.vlan += 1;
            }
            if pkt.ip_version == 6 {
                c.ipv6 += 1;
            }
            if pkt.ipv4_options {
                c.ipv4_options += 1;
            }
        });
    }

    // A first fragment is classified like the whole datagram, unless fragments are dropped by
    // policy (then all of them are, the first included).
    if pkt.fragmented && policy(CONFIG_DROP_FRAGMENTS) == Action::Drop {
        count_class(Class::Other, false, len);
        return Action::Drop;
    }
    let (class, verdict) = match pkt.kind {
        PacketKind::Transport => {
            let t = &pkt.transport;
            let byte = service_byte(t.proto, t.dst_port).unwrap_or(0);
            match port_kind(byte) {
                Some(ServiceKind::Tls) if t.proto == IPPROTO_TCP => {
                    match tls_packet(ctx, b, &pkt, port_syn_cookies(byte)) {
                        (class, Action::Reject) => {
                            // Counted here; the reply program (its own, verified on its own)
                            // answers the sender and counts the reset.
                            count_class(class, false, len);
                            ctx.jump(Jump::Reply);
                            // Only when the jump table is empty.
                            tls_counters::count(|c| c.resets_withheld += 1);
                            return Action::Drop;
                        }
                        (class, verdict @ (Action::Answer | Action::Hold)) => {
                            // The reply program sends what `tcp::cookie` prepared.
                            count_class(class, verdict == Action::Hold, len);
                            ctx.jump(Jump::Reply);
                            // Only when the jump table is empty.
                            tcp::send::forget_answer::<tls::Tls>();
                            return Action::Drop;
                        }
                        decided => decided,
                    }
                }
                Some(ServiceKind::Sip) if t.proto == IPPROTO_UDP => {
                    // SIP runs in a program of its own, verified on its own (its parser would
                    // otherwise be verified again for every path that reaches it here).
                    ctx.jump(Jump::Sip);
                    // Only when the jump table is empty: an original, never exempt.
                    (Class::SipOriginal, Action::Pass)
                }
                // A service over the other transport (SIP over TCP, TLS over UDP): counted, passed.
                Some(_) => (Class::Other, Action::Pass),
                None => (Class::Other, Action::Pass),
            }
        }
        PacketKind::NotIp => {
            count(|c| c.not_ip += 1);
            (Class::Other, Action::Pass)
        }
        PacketKind::OtherL4 => (Class::Other, Action::Pass),
        PacketKind::Truncated if pkt.fragmented => {
            // A first fragment that ends before its ports: where the datagram goes cannot be
            // told, and the kernel would reassemble it. Refused (fail closed).
            count(|c| {
                c.truncated += 1;
                c.unjudgeable += 1;
            });
            (Class::Other, Action::Drop)
        }
        // Anything else cut short is dropped by the kernel itself.
        PacketKind::Truncated => {
            count(|c| c.truncated += 1);
            (Class::Other, Action::Pass)
        }
        PacketKind::Malformed => {
            debug!(ctx, "malformed header at offset {}", pkt.offset);
            count(|c| c.malformed += 1);
            (Class::Other, Action::Pass)
        }
        PacketKind::Fragment => {
            count(|c| c.fragments += 1);
            (Class::Other, policy(CONFIG_DROP_FRAGMENTS))
        }
        PacketKind::Unparseable => {
            debug!(
                ctx,
                "headers beyond the parser's bounds at offset {}", pkt.offset
            );
            count(|c| c.unparseable += 1);
            if may_reach_a_service(&pkt) {
                count(|c| c.unjudgeable += 1);
                (Class::Other, Action::Drop)
            } else {
                (Class::Other, policy(CONFIG_DROP_UNPARSEABLE))
            }
        }
    };
    count_class(
        class,
        matches!(verdict, Action::Pass | Action::Handoff),
        len,
    );
    verdict
}

/// The SIP classifier's program body: the headers are parsed again (the parser counters were
/// counted by the program that jumped here), the datagram classified and admitted or not, and its
/// class counted.
#[inline(always)]
pub fn process_sip<C: CopyOut + TailCall, B: PacketBytes>(ctx: &C, b: &B, len: u64) -> Action {
    let pkt = parse(b);
    let (class, verdict) = if pkt.kind == PacketKind::Transport {
        sip_packet(ctx, b, &pkt)
    } else {
        // Not reached: only a parsed datagram jumps here. Least privileged all the same.
        (Class::SipOriginal, Action::Drop)
    };
    count_class(class, verdict == Action::Pass, len);
    if verdict == Action::Reject {
        // The reply program answers with a 503.
        ctx.jump(Jump::Reply);
        // Only when the jump table is empty.
        count(|c| c.sip_replies_withheld += 1);
        return Action::Drop;
    }
    verdict
}

/// Whether a packet the parser could not follow may still reach a protected service: an IPv6
/// header chain longer than the parser follows, which the kernel walks to its end (ESP, whose
/// payload only an IPsec SA the operator made can open, and VLAN stacks deeper than the parser
/// follows, which no host delivers without devices made for them, are left to the
/// `unparseable` policy).
#[inline(always)]
fn may_reach_a_service(pkt: &Packet) -> bool {
    pkt.ip_version == 6 && pkt.proto != IPPROTO_ESP
}

/// The reply program's body: the frame (a refused TLS segment or SIP request) parsed again and
/// answered (`crate::reply`); else dropped. Counted either way.
#[inline(always)]
pub fn process_reply<R: Rewrite + CopyOut, B: PacketBytes>(ctx: &R, b: &B, len: u64) -> Action {
    let mut pkt = parse(b);
    if pkt.kind != PacketKind::Transport {
        return Action::Drop;
    }
    let mut len = len as usize;
    if pkt.transport.proto == IPPROTO_TCP {
        // Options of the client's taken out of the frame first, so it can be answered.
        if !make_plain(ctx, &mut pkt, &mut len) {
            return Action::Drop;
        }
        // A SYN-ACK or a held hello's acknowledgement, prepared by the classifier.
        if let Some(answered) = tcp::send::send_answer::<_, tls::Tls>(ctx, &pkt) {
            return answered;
        }
        let answered = reset(ctx, &pkt, len);
        tls_counters::count(|c| {
            if answered.is_some() {
                c.resets_sent += 1;
            } else {
                c.resets_withheld += 1;
            }
        });
        answered.unwrap_or(Action::Drop)
    } else {
        let answered = sip_503(ctx, &pkt, len, compose_reply);
        count(|c| {
            if answered.is_some() {
                c.sip_replies_sent += 1;
            } else {
                c.sip_replies_withheld += 1;
            }
        });
        answered.unwrap_or(Action::Drop)
    }
}

/// Drop (and count it) when the datapath config has `flag` set. Only fragments and unparseable
/// packets consult the config, so other traffic never pays for its lookup.
#[inline(always)]
fn policy(flag: u64) -> Action {
    if setting(flag) {
        count(|c| c.policy_dropped += 1);
        Action::Drop
    } else {
        Action::Pass
    }
}
