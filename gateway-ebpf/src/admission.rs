//! Admission against per-class limits: a backlog limit (see `gateway_common::maps::backlog`) and
//! a GCRA rate limit. Shared by the TLS and SIP datapaths. What an admitted unit becomes is in
//! [`crate::pending`].

use gateway_common::{
    Class,
    maps::{
        MAX_BURST, POLICY_LIMIT_BACKLOG, POLICY_LIMIT_RATE, REJECT_BACKLOG, REJECT_FULL,
        REJECT_RATE, REPLY_BURST, backlog, replies_to_refusals, reply_rate,
    },
};

use crate::{
    context::Action,
    maps::{CLASS_POLICY, CLASS_STATE, CLASS_STATS, DP_COUNTERS},
    sync::gcra,
};

/// Whether one arrival may be admitted under the policy of `policy_of`, or why not
/// (`REJECT_*`): the backlog of `backlog_of` is at the policy's backlog limit, or the GCRA rate
/// limiter of `policy_of` has no room. Callers go through `crate::pending`, which releases the
/// expired units of `backlog_of` first (so a class never stays shut on work nobody answers) and
/// then holds the admitted unit, counting its admission.
///
/// A class normally answers for itself (`admission(c, c)`). SIP retransmissions are admitted
/// under their own policy but against the originals' backlog, and add nothing to it: with the
/// retransmission limit below the originals' (RFC 7415's TAU1 < TAU2), retransmissions are shed
/// first and originals keep strict priority.
///
/// GCRA (RFC 7415's leaky bucket, [`crate::sync::gcra`]): a connection conforms when the theoretical arrival
/// time is at most `burst * T` ahead of now, and then advances it by `T`. A rate of zero admits
/// nothing.
#[inline(always)]
pub fn admission(policy_of: Class, backlog_of: Class) -> Option<u8> {
    let st = CLASS_STATE.get_ptr_mut(backlog_of.id())?;
    let rate_st = CLASS_STATE.get_ptr_mut(policy_of.id())?;
    let p = CLASS_POLICY.get(policy_of.id())?;
    if p.flags & POLICY_LIMIT_BACKLOG != 0 {
        // SAFETY: reads of counters other CPUs add to atomically.
        let held = unsafe {
            backlog(
                core::ptr::read_volatile(&raw const (*st).admitted),
                core::ptr::read_volatile(&raw const (*st).completed),
                core::ptr::read_volatile(&raw const (*st).expired),
            )
        };
        if held >= p.backlog_limit {
            return Some(REJECT_BACKLOG);
        }
    }
    if p.flags & POLICY_LIMIT_RATE != 0 {
        if p.rate_per_sec == 0 {
            return Some(REJECT_RATE);
        }
        // SAFETY: a field of a live map value.
        if !gcra(
            unsafe { &raw mut (*rate_st).gcra_tat_ns },
            1_000_000_000 / p.rate_per_sec,
            if p.burst > MAX_BURST {
                MAX_BURST
            } else {
                p.burst
            },
        ) {
            return Some(REJECT_RATE);
        }
    }
    None
}

/// How a refusal of `class` (for `reason`, a `REJECT_*`) ends: [`Action::Reject`] when the
/// class answers its refusals ([`replies_to_refusals`]) and its reply rate has room, else
/// [`Action::Drop`]. Counted either way.
#[inline(always)]
pub fn refusal(class: Class, reason: u8) -> Action {
    let action = answer(class);
    count_refusal(class, reason, action == Action::Reject);
    action
}

/// Whether a refused packet of `class` gets an answer ([`Action::Reject`]) or is dropped: the
/// class's policy, then its reply rate (a source address cannot be verified, so replies are
/// bounded per class, all CPUs together). A reply the rate withholds is counted.
#[inline(always)]
pub fn answer(class: Class) -> Action {
    let Some(p) = CLASS_POLICY.get(class.id()) else {
        return Action::Drop;
    };
    if !replies_to_refusals(class, p) {
        return Action::Drop;
    }
    let Some(st) = CLASS_STATE.get_ptr_mut(class.id()) else {
        return Action::Drop;
    };
    // SAFETY: a field of a live map value.
    if gcra(
        unsafe { &raw mut (*st).reply_tat_ns },
        1_000_000_000 / reply_rate(p),
        REPLY_BURST,
    ) {
        return Action::Reject;
    }
    if let Some(s) = CLASS_STATS.get_ptr_mut(class.id()) {
        // SAFETY: per-CPU slot.
        unsafe { (*s).replies_limited += 1 };
    }
    Action::Drop
}

/// Counts a refusal in `class`'s counters by reason; `rejected` when the client is answered (a
/// reset, a 503) rather than silently dropped.
#[inline(always)]
pub fn count_refusal(class: Class, reason: u8, rejected: bool) {
    if reason == REJECT_FULL
        && let Some(c) = DP_COUNTERS.get_ptr_mut(0)
    {
        // SAFETY: per-CPU slot.
        unsafe { (*c).pending_full += 1 };
    }
    if let Some(s) = CLASS_STATS.get_ptr_mut(class.id()) {
        // SAFETY: per-CPU slot.
        unsafe {
            if rejected {
                (*s).rejected += 1;
            }
            if reason == REJECT_RATE {
                (*s).dropped_rate += 1;
            } else {
                (*s).dropped_backlog += 1;
            }
        }
    }
}
