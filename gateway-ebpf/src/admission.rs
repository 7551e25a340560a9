//! The classes: their limits, their admission state and their counters, and admission against
//! the limits (a backlog limit, see `gateway_common::maps::backlog`, and a GCRA rate limit).
//! Shared by the TLS and SIP datapaths. What an admitted unit becomes is in [`crate::pending`].

use aya_ebpf::{
    btf_maps::{Array, PerCpuArray},
    macros::btf_map,
};
use gateway_common::{
    Class, NUM_CLASSES,
    maps::{
        ClassPolicy, ClassState, ClassStats, MAX_BURST, REPLY_BURST, backlog, replies_to_refusals,
        reply_rate, timeout_ns,
    },
    reasons::Refusal,
};

use crate::{
    context::Action,
    maps,
    sync::{gcra, now_ns},
};

/// Per-class counters, per CPU.
#[btf_map]
pub static CLASS_STATS: PerCpuArray<ClassStats, NUM_CLASSES> = PerCpuArray::new();

/// Per-class admission limits, written by userspace.
#[btf_map]
pub static CLASS_POLICY: Array<ClassPolicy, NUM_CLASSES> = Array::new();

/// Per-class admission state (monotonic admitted/completed counters, GCRA state).
#[btf_map]
pub static CLASS_STATE: Array<ClassState, NUM_CLASSES> = Array::new();

/// The limits of `class`.
#[inline(always)]
pub fn policy(class: Class) -> Option<&'static ClassPolicy> {
    CLASS_POLICY.get(class.id())
}

/// The unit timeout in force for `class`.
#[inline(always)]
pub fn timeout(class: Class) -> u64 {
    policy(class).map_or(timeout_ns(class, &ClassPolicy::default()), |p| {
        timeout_ns(class, p)
    })
}

/// The shared admission state of the class of id `class`.
#[inline(always)]
pub fn state(class: u32) -> Option<*mut ClassState> {
    CLASS_STATE.get_ptr_mut(class)
}

/// Counts a packet of `len` bytes in its class; `passed` when it goes on.
#[inline(always)]
pub fn count_class(class: Class, passed: bool, len: u64) {
    if let Some(s) = CLASS_STATS.get_ptr_mut(class.id()) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        unsafe {
            (*s).packets += 1;
            (*s).bytes += len;
            if passed {
                (*s).admitted += 1;
            }
        }
    }
}

/// Whether one arrival may be admitted under the policy of `policy_of`, or why not: the backlog of `backlog_of` is at the policy's backlog limit, or the GCRA rate
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
/// nothing. `now`: the packet's time (`crate::sync::now_ns`, read once for its admission).
#[inline(always)]
pub fn admission(policy_of: Class, backlog_of: Class, now: u64) -> Result<(), Refusal> {
    let (Some(st), Some(rate_st), Some(p)) = (
        state(backlog_of.id()),
        state(policy_of.id()),
        policy(policy_of),
    ) else {
        // Not reached: every class has its entries in these arrays.
        return Ok(());
    };
    if backlog_full(st, p) {
        return Err(Refusal::Backlog);
    }
    if let Some(rate) = p.rate_in_force() {
        if rate == 0 {
            return Err(Refusal::Rate);
        }
        // SAFETY: a field of a live map value.
        if !gcra(
            unsafe { &raw mut (*rate_st).gcra_tat_ns },
            1_000_000_000 / rate,
            if p.burst > MAX_BURST {
                MAX_BURST
            } else {
                p.burst
            },
            now,
        ) {
            return Err(Refusal::Rate);
        }
    }
    Ok(())
}

/// Whether the backlog of the class whose state is `st` is at the limit its policy `p` sets.
#[inline(always)]
fn backlog_full(st: *mut ClassState, p: &ClassPolicy) -> bool {
    let Some(limit) = p.backlog_in_force() else {
        return false;
    };
    // SAFETY: reads of counters other CPUs add to atomically, in a live map value.
    let held = unsafe {
        backlog(
            core::ptr::read_volatile(&raw const (*st).admitted)
                .saturating_add(core::ptr::read_volatile(&raw const (*st).continued)),
            core::ptr::read_volatile(&raw const (*st).completed),
            core::ptr::read_volatile(&raw const (*st).expired),
        )
    };
    held >= limit
}

/// Whether `class` refuses an arrival at `now`, as [`admission`] would judge it, without taking
/// anything: its backlog at its limit, or its rate with no room.
#[inline(always)]
pub fn refusing(class: Class, now: u64) -> bool {
    let (Some(st), Some(p)) = (state(class.id()), policy(class)) else {
        return false;
    };
    if backlog_full(st, p) {
        return true;
    }
    if let Some(rate) = p.rate_in_force() {
        if rate == 0 {
            return true;
        }
        let interval = 1_000_000_000 / rate;
        let burst = if p.burst > MAX_BURST {
            MAX_BURST
        } else {
            p.burst
        };
        // SAFETY: a field of a live map value.
        let tat = unsafe { core::ptr::read_volatile(&raw const (*st).gcra_tat_ns) };
        // The GCRA's test (`crate::sync::gcra`) without its advance.
        if tat > now && tat - now > burst * interval {
            return true;
        }
    }
    false
}

/// How a refusal of `class` (for `reason`) ends: [`Action::Reject`] when the
/// class answers its refusals ([`replies_to_refusals`]) and its reply rate has room, else
/// [`Action::Drop`]. Counted either way.
#[inline(always)]
pub fn refusal(class: Class, reason: Refusal) -> Action {
    let action = answer(class);
    count_refusal(class, reason, action == Action::Reject);
    action
}

/// Whether a refused packet of `class` gets an answer ([`Action::Reject`]) or is dropped: the
/// class's policy, then its reply rate (a source address cannot be verified, so replies are
/// bounded per class, all CPUs together). A reply the rate withholds is counted.
#[inline(always)]
pub fn answer(class: Class) -> Action {
    let Some(p) = policy(class) else {
        return Action::Drop;
    };
    if !replies_to_refusals(class, p) {
        return Action::Drop;
    }
    let Some(st) = state(class.id()) else {
        return Action::Drop;
    };
    // SAFETY: a field of a live map value.
    if gcra(
        unsafe { &raw mut (*st).reply_tat_ns },
        1_000_000_000 / reply_rate(p),
        REPLY_BURST,
        now_ns(),
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
pub fn count_refusal(class: Class, reason: Refusal, rejected: bool) {
    if reason == Refusal::Full {
        maps::count(|c| c.pending_full += 1);
    }
    if let Some(s) = CLASS_STATS.get_ptr_mut(class.id()) {
        // SAFETY: per-CPU slot.
        unsafe {
            if rejected {
                (*s).rejected += 1;
            }
            if reason == Refusal::Rate {
                (*s).dropped_rate += 1;
            } else {
                (*s).dropped_backlog += 1;
            }
        }
    }
}
