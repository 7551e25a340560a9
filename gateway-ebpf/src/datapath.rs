//! The per-packet logic shared by the XDP and TC ingress programs: parse, look the destination up
//! in the services map, classify, count, and apply the fragment / unparseable policy.

use aya_ebpf::EbpfContext;
use aya_log_ebpf::debug;
use gateway_common::{
    Class,
    bytes::PacketBytes,
    classify::classify,
    maps::{
        CONFIG_DROP_FRAGMENTS, CONFIG_DROP_UNPARSEABLE, DatapathCounters, ServiceKey, ServiceKind,
    },
    packet::{Outcome, parse},
};

use crate::maps::{CLASS_STATS, DP_CONFIG, DP_COUNTERS, SERVICES};

/// What to do with a packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Let it through.
    Pass,
    /// Drop it here.
    Drop,
}

/// Classifies and counts one frame of `len` bytes. `ctx` is only used for aya-log records, which
/// are compiled in at debug level and off unless the loader raises the level.
#[inline(always)]
pub fn process<C: EbpfContext, B: PacketBytes>(ctx: &C, b: &B, len: u64) -> Verdict {
    let pkt = parse(b);
    let flags = DP_CONFIG.get(0).map_or(0, |c| c.flags);
    let counters = DP_COUNTERS.get_ptr_mut(0);
    count(counters, |c| {
        c.packets += 1;
        if pkt.vlan_tags > 0 {
            c.vlan += 1;
        }
        if matches!(pkt.ip, Some(gateway_common::packet::IpVersion::V6)) {
            c.ipv6 += 1;
        }
        if pkt.ipv4_options {
            c.ipv4_options += 1;
        }
    });

    let (class, verdict) = match pkt.outcome {
        Outcome::Transport(t) => {
            // SAFETY: the value is copied out at once; no reference is kept across helper calls.
            let kind = unsafe { SERVICES.get(ServiceKey::new(t.proto, t.dst_port)) }
                .and_then(|v| ServiceKind::from_id(v.kind));
            let class = match kind {
                Some(kind) => classify(b, &t, kind),
                None => Class::Other,
            };
            (class, Verdict::Pass)
        }
        Outcome::NotIp | Outcome::OtherL4 { .. } => {
            if matches!(pkt.outcome, Outcome::NotIp) {
                count(counters, |c| c.not_ip += 1);
            }
            (Class::Other, Verdict::Pass)
        }
        Outcome::Truncated { .. } => {
            count(counters, |c| c.truncated += 1);
            (Class::Other, Verdict::Pass)
        }
        Outcome::Malformed { offset } => {
            debug!(ctx, "malformed header at offset {}", offset);
            count(counters, |c| c.malformed += 1);
            (Class::Other, Verdict::Pass)
        }
        Outcome::Fragment => {
            count(counters, |c| c.fragments += 1);
            (Class::Other, policy(flags & CONFIG_DROP_FRAGMENTS != 0))
        }
        Outcome::Unparseable { offset } => {
            debug!(
                ctx,
                "headers beyond the parser's bounds at offset {}", offset
            );
            count(counters, |c| c.unparseable += 1);
            (Class::Other, policy(flags & CONFIG_DROP_UNPARSEABLE != 0))
        }
    };
    if verdict == Verdict::Drop {
        count(counters, |c| c.policy_dropped += 1);
    }
    if let Some(s) = CLASS_STATS.get_ptr_mut(class.id()) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe {
            (*s).packets += 1;
            (*s).bytes += len;
            if verdict == Verdict::Pass {
                (*s).admitted += 1;
            }
        }
    }
    verdict
}

#[inline(always)]
fn policy(drop: bool) -> Verdict {
    if drop { Verdict::Drop } else { Verdict::Pass }
}

#[inline(always)]
fn count(counters: Option<*mut DatapathCounters>, f: impl FnOnce(&mut DatapathCounters)) {
    if let Some(c) = counters {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        f(unsafe { &mut *c });
    }
}
