//! The per-packet logic shared by the XDP and TC ingress programs: parse, look the destination up
//! in the services map, classify, count, and apply the fragment / unparseable policy.

use aya_ebpf::EbpfContext;
use aya_log_ebpf::debug;
use gateway_common::{
    Class,
    bytes::PacketBytes,
    maps::{
        CONFIG_DROP_FRAGMENTS, CONFIG_DROP_UNPARSEABLE, DatapathCounters, IPPROTO_TCP, IPPROTO_UDP,
        ServiceKind, TlsCounters, port_kind, service_port_index,
    },
    packet::{Kind, Packet, parse},
};

/// IPv6's next header for ESP.
const IPPROTO_ESP: u8 = 50;

use crate::{
    context::{Action, ConnectionLookup, CopyOut, JumpToSip, Rewrite},
    maps::{CLASS_STATS, DP_CONFIG, DP_COUNTERS, SERVICE_PORTS, TLS_COUNTERS},
    reply::{reset, sip_503},
    sip::sip_packet,
    tls::tls_packet,
};

/// Classifies and counts one frame of `len` bytes. `ctx` serves aya-log records (compiled in at
/// debug level, off unless the loader raises the level) and copies of TLS payloads.
#[inline(always)]
pub fn process<
    C: EbpfContext + CopyOut + ConnectionLookup + JumpToSip + Rewrite,
    B: PacketBytes,
>(
    ctx: &C,
    b: &B,
    len: u64,
) -> Action {
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
        count_class(Class::Other, Action::Drop, len);
        return Action::Drop;
    }
    let (class, verdict) = match pkt.kind {
        Kind::Transport => {
            let t = &pkt.transport;
            match service_kind(t.proto, t.dst_port) {
                Some(ServiceKind::Tls) if t.proto == IPPROTO_TCP => {
                    match tls_packet(ctx, b, &pkt) {
                        (class, Action::Reject) => {
                            // Counted here; the reply program (its own, verified on its own)
                            // answers the sender and counts the reset.
                            count_class(class, Action::Drop, len);
                            ctx.jump_to_reply();
                            // Only when the jump table is empty.
                            count_tls(|c| c.resets_withheld += 1);
                            return Action::Drop;
                        }
                        decided => decided,
                    }
                }
                Some(ServiceKind::Sip) if t.proto == IPPROTO_UDP => {
                    // SIP runs in a program of its own, verified on its own (its parser would
                    // otherwise be verified again for every path that reaches it here).
                    ctx.jump_to_sip();
                    // Only when the jump table is empty: an original, never exempt.
                    (Class::SipOriginal, Action::Pass)
                }
                // A service over the other transport (SIP over TCP, TLS over UDP): counted, passed.
                Some(_) => (Class::Other, Action::Pass),
                None => (Class::Other, Action::Pass),
            }
        }
        Kind::NotIp => {
            count(|c| c.not_ip += 1);
            (Class::Other, Action::Pass)
        }
        Kind::OtherL4 => (Class::Other, Action::Pass),
        Kind::Truncated if pkt.fragmented => {
            // A first fragment that ends before its ports: where the datagram goes cannot be
            // told, and the kernel would reassemble it. Refused (fail closed).
            count(|c| {
                c.truncated += 1;
                c.unjudgeable += 1;
            });
            (Class::Other, Action::Drop)
        }
        // Anything else cut short is dropped by the kernel itself.
        Kind::Truncated => {
            count(|c| c.truncated += 1);
            (Class::Other, Action::Pass)
        }
        Kind::Malformed => {
            debug!(ctx, "malformed header at offset {}", pkt.offset);
            count(|c| c.malformed += 1);
            (Class::Other, Action::Pass)
        }
        Kind::Fragment => {
            count(|c| c.fragments += 1);
            (Class::Other, policy(CONFIG_DROP_FRAGMENTS))
        }
        Kind::Unparseable => {
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
    count_class(class, verdict, len);
    verdict
}

/// The SIP classifier's program body: the headers are parsed again (the parser counters were
/// counted by the program that jumped here), the datagram classified and admitted or not, and its
/// class counted.
#[inline(always)]
pub fn process_sip<C: CopyOut + JumpToSip, B: PacketBytes>(ctx: &C, b: &B, len: u64) -> Action {
    let pkt = parse(b);
    let (class, verdict) = if pkt.kind == Kind::Transport {
        sip_packet(ctx, b, &pkt)
    } else {
        // Not reached: only a parsed datagram jumps here. Least privileged all the same.
        (Class::SipOriginal, Action::Drop)
    };
    count_class(class, verdict, len);
    if verdict == Action::Reject {
        // The reply program answers with a 503.
        ctx.jump_to_reply();
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

/// The kind of service protected on (`proto`, `port`), if any: one inlined array lookup.
#[inline(always)]
pub fn service_kind(proto: u8, port: u16) -> Option<ServiceKind> {
    service_port_index(proto, port)
        .and_then(|i| SERVICE_PORTS.get(i))
        .and_then(|k| port_kind(*k))
}

/// The reply program's body: the frame (a refused TLS segment or SIP request) parsed again and
/// answered (`crate::reply`); else dropped. Counted either way.
#[inline(always)]
pub fn process_reply<R: Rewrite, B: PacketBytes>(ctx: &R, b: &B, len: u64) -> Action {
    let pkt = parse(b);
    if pkt.kind != Kind::Transport {
        return Action::Drop;
    }
    let len = len as usize;
    if pkt.transport.proto == IPPROTO_TCP {
        let answered = reset(ctx, &pkt, len);
        count_tls(|c| {
            if answered.is_some() {
                c.resets_sent += 1;
            } else {
                c.resets_withheld += 1;
            }
        });
        answered.unwrap_or(Action::Drop)
    } else {
        let answered = sip_503(ctx, &pkt, len);
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

/// Counts a refused segment whose client got no reset after all (the finishing program could
/// not send its copy).
#[inline(always)]
pub fn count_withheld_reset() {
    count_tls(|c| c.resets_withheld += 1);
}

/// Counts in the TLS counters.
#[inline(always)]
fn count_tls(f: impl FnOnce(&mut TlsCounters)) {
    if let Some(c) = TLS_COUNTERS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        f(unsafe { &mut *c });
    }
}

/// Counts a packet of `len` bytes in its class.
#[inline(always)]
fn count_class(class: Class, verdict: Action, len: u64) {
    if let Some(s) = CLASS_STATS.get_ptr_mut(class.id()) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe {
            (*s).packets += 1;
            (*s).bytes += len;
            if verdict == Action::Pass {
                (*s).admitted += 1;
            }
        }
    }
}

/// Drop (and count it) when the datapath config has `flag` set. Only fragments and unparseable
/// packets consult the config, so other traffic never pays for its lookup.
#[inline(always)]
fn policy(flag: u64) -> Action {
    if DP_CONFIG.get(0).is_some_and(|c| c.flags & flag != 0) {
        count(|c| c.policy_dropped += 1);
        Action::Drop
    } else {
        Action::Pass
    }
}

#[inline(always)]
fn count(f: impl FnOnce(&mut DatapathCounters)) {
    if let Some(c) = DP_COUNTERS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        f(unsafe { &mut *c });
    }
}
