//! Places of issued keys: a published key buys the `tls-resumed` class for at most its limit of
//! connections at a time, and for its resumption rate beyond that (one client's worth:
//! `gateway_common::maps::IssuedValue`). A resumed connection takes a place when it is admitted
//! and gives it back when its unit ends (`crate::pending`), so a key read off the wire, replayed
//! on many connections at once or farmed one connection after another buys little.
// Map keys go by reference, as in the TLS module (the BPF stack is 512 bytes).
#![allow(clippy::needless_borrows_for_generic_args)]

use gateway_common::{
    Class,
    maps::{IssuedKey, resume_holders, resume_interval_ns, resume_limit, timeout_ns},
    tls::KEY_LEN,
};

use crate::{
    maps::{CLASS_POLICY, TLS_ISSUED},
    sync::{compare_and_swap, gcra, now_ns},
};

/// What an offer's key got.
pub enum Place {
    /// The key was issued and had room: the connection holds one of its places.
    Taken,
    /// The key was issued but every place is held.
    Full,
    /// The key was issued but offered faster than its resumption rate.
    TooFast,
    /// The key was never issued (or was withdrawn).
    Unknown,
}

/// Attempts at a compare-and-swap before an offer counts as having lost the race (each failed
/// attempt means another CPU took or gave back a place in between).
const TRIES: usize = 4;

/// Takes a place of the issued key `key`. The caller releases expired resumed units first
/// (`crate::pending::sweep_if_due`), so their places are free before the count is read; the
/// healing rule of `resume_holders` is only the safety net for a release lost to contention.
#[inline(always)]
pub fn take(key: &[u8; KEY_LEN]) -> Place {
    let Some(v) = TLS_ISSUED.get_ptr_mut(&IssuedKey { key: *key }) else {
        return Place::Unknown;
    };
    let timeout = CLASS_POLICY
        .get(Class::TlsResumed.id())
        .map_or(0, |p| timeout_ns(Class::TlsResumed, p));
    let now = now_ns();
    // SAFETY: `in_use` is only changed by compare-and-swap; `granted_ns` is informational for
    // the healing rule, a racing write at worst keeps a count a little longer.
    unsafe {
        let limit = resume_limit(core::ptr::read_volatile(&raw const (*v).limit));
        let in_use = &raw mut (*v).in_use;
        let interval = resume_interval_ns(core::ptr::read_volatile(&raw const (*v).per_minute));
        let mut rated = false;
        for _ in 0..TRIES {
            let seen = core::ptr::read_volatile(in_use);
            let granted = core::ptr::read_volatile(&raw const (*v).granted_ns);
            let held = resume_holders(seen, granted, now, timeout);
            if held >= limit {
                return Place::Full;
            }
            // With a place free, the rate: `limit` at once, then one per interval. Tested
            // once, so an offer that loses a race for a place pays for one resumption only.
            if !rated {
                if !gcra(&raw mut (*v).tat_ns, interval, limit - 1) {
                    return Place::TooFast;
                }
                rated = true;
            }
            if compare_and_swap(in_use, seen, held + 1) {
                core::ptr::write_volatile(&raw mut (*v).granted_ns, now);
                return Place::Taken;
            }
        }
    }
    Place::Full
}

/// Gives back a place of the issued key `key` (a resumed unit ended). Never below zero: a key
/// withdrawn and published again in between starts from its own count.
#[inline(always)]
pub fn give_back(key: &[u8; KEY_LEN]) {
    let Some(v) = TLS_ISSUED.get_ptr_mut(&IssuedKey { key: *key }) else {
        return;
    };
    // SAFETY: as in `take`.
    unsafe {
        let in_use = &raw mut (*v).in_use;
        for _ in 0..TRIES {
            let seen = core::ptr::read_volatile(in_use);
            if seen == 0 || compare_and_swap(in_use, seen, seen - 1) {
                return;
            }
        }
    }
}
