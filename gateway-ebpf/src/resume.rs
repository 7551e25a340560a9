//! Places of issued keys: a published key buys the `tls-resumed` class for at most its limit of
//! connections at a time, and for its resumption rate beyond that (one client's worth:
//! `gateway_common::maps::IssuedValue`). A resumed connection takes a place when it is admitted
//! and holds it until the connection ends: while its unit is pending (`in_use`, given back if
//! the unit expires), then, once the server answered, as a hold (`TLS_HOLDS`, counted in
//! `open`) until the server's FIN or RST leaves, or the daemon finds its socket gone, or an
//! hour passed. So a key read off the wire, replayed on many connections at once or farmed one
//! connection after another buys one client's share.
// Map keys go by reference, as in the TLS module (the BPF stack is 512 bytes).
#![allow(clippy::needless_borrows_for_generic_args)]

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    btf_maps::HashMap,
    helpers::generated::{bpf_for_each_map_elem, bpf_map_delete_elem},
    macros::btf_map,
};
use gateway_common::{
    Class,
    maps::{
        BPF_F_NO_PREALLOC, DEFAULT_TLS_ISSUED, FlowKey, ISSUED_BY_SERVER, ISSUED_BY_TAG,
        ISSUED_WITHDRAWN, IssuedKey, IssuedValue, LearnTerms, MAX_HOLD_NS, MAX_LEARN_PORTS,
        MAX_PENDING, MAX_TAG_KEYS, TagKey, TagKeyId, TlsHold, resume_holders, resume_interval_ns,
        resume_limit,
    },
    tls::{
        HelloState, KEY_LEN, Offer,
        tag::{Tail, tag},
    },
};

use crate::{
    admission,
    pending::Pass,
    sync::{atomic_add, compare_and_swap, gcra, now_ns},
    tls_counters::count,
};

/// Keys of the sessions the server issued, published by userspace. Not an LRU: a key lives for
/// its session's lifetime whatever the load (userspace sizes the table at load and withdraws
/// keys as their lifetime ends).
#[btf_map]
pub static TLS_ISSUED: HashMap<
    IssuedKey,
    IssuedValue,
    { DEFAULT_TLS_ISSUED as usize },
    BPF_F_NO_PREALLOC,
> = HashMap::new();

/// Ticket tag keys by listener port and rotation period, written by the daemon from the shared
/// ticket secret ([`gateway_common::tls::tag`]).
#[btf_map]
pub static TLS_TAG_KEYS: HashMap<TagKeyId, TagKey, { MAX_TAG_KEYS as usize }> = HashMap::new();

/// How the NIC learns the sessions of servers it does not terminate, by listener port: written
/// by the daemon (a TLS service's `server:` section).
#[btf_map]
pub static TLS_LEARN: HashMap<u32, LearnTerms, { MAX_LEARN_PORTS as usize }> = HashMap::new();

/// Resumed TLS connections the server answered that are still open, each holding a place of its
/// issued key until it ends. Not LRU: no traffic can evict a hold.
#[btf_map]
pub static TLS_HOLDS: HashMap<FlowKey, TlsHold, { MAX_PENDING as usize }> = HashMap::new();

/// What an offer's key got.
pub enum Place {
    /// The key was issued and had room: the connection holds one of its places.
    Taken,
    /// The key was issued but every place is held.
    Full,
    /// The key was issued but offered faster than its resumption rate.
    TooFast,
    /// The key was never published (its ticket's tag may still vouch for it: [`gateway_vouch`]).
    Unknown,
    /// The key was withdrawn (an offer of it did not resume): nothing vouches for it again.
    Withdrawn,
}

/// `key` as the issued-keys table's key, in place: a copy of 16 bytes costs a byte-at-a-time
/// loop here.
#[inline(always)]
fn issued(key: &[u8; KEY_LEN]) -> &IssuedKey {
    const { assert!(size_of::<IssuedKey>() == KEY_LEN && align_of::<IssuedKey>() == 1) };
    // SAFETY: IssuedKey is `#[repr(C)]` around exactly the key's bytes (same size, alignment 1).
    unsafe { &*(key as *const [u8; KEY_LEN]).cast::<IssuedKey>() }
}

/// Attempts at a compare-and-swap before an offer counts as having lost the race (each failed
/// attempt means another CPU took or gave back a place in between).
const TRIES: usize = 4;

/// Takes a place of the issued key `key`. The caller releases expired resumed units first
/// (`crate::pending::sweep_if_due`), so their places are free before the count is read; the
/// healing rule of `resume_holders` is only the safety net for a release lost to contention.
/// `now`: the clock read of that sweep.
#[inline(always)]
pub fn take(key: &[u8; KEY_LEN], now: u64) -> Place {
    let Some(v) = TLS_ISSUED.get_ptr_mut(issued(key)) else {
        return Place::Unknown;
    };
    let timeout = admission::timeout(Class::TlsResumed);
    // SAFETY: `in_use` is only changed by compare-and-swap; `granted_ns` is informational for
    // the healing rule, a racing write at worst keeps a count a little longer.
    unsafe {
        if core::ptr::read_volatile(&raw const (*v).kind) & ISSUED_WITHDRAWN != 0 {
            return Place::Withdrawn;
        }
        let limit = resume_limit(core::ptr::read_volatile(&raw const (*v).limit));
        let in_use = &raw mut (*v).in_use;
        // Connections past their first flight still hold theirs.
        let open = core::ptr::read_volatile(&raw const (*v).open);
        let interval = resume_interval_ns(core::ptr::read_volatile(&raw const (*v).per_minute));
        let mut rated = false;
        for _ in 0..TRIES {
            let seen = core::ptr::read_volatile(in_use);
            let granted = core::ptr::read_volatile(&raw const (*v).granted_ns);
            let held = resume_holders(seen, granted, now, timeout);
            if held.saturating_add(open) >= limit {
                return Place::Full;
            }
            // With a place free, the rate: `limit` at once, then one per interval. Tested
            // once, so an offer that loses a race for a place pays for one resumption only.
            if !rated {
                if !gcra(&raw mut (*v).tat_ns, interval, limit - 1, now) {
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

/// Publishes the key of the ticket or PSK identity the complete hello `hello` offers, to a
/// connection to `port`, if its clear tail vouches for it ([`gateway_common::tls::tag`]): a tag
/// key of its period for the port, not expired, and its tag right. The key is then published as
/// a key the daemon publishes is, under the tag key's terms, until the ticket expires (the
/// daemon removes it then). Returns 1 when the key is published (by this call, or a racing
/// one), 0 otherwise: no tail, a tail that does not vouch (counted, `tags_refused`), or no room
/// in the table. A global function, checked once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_vouch(hello: *const HelloState, port: u32) -> i32 {
    if hello.is_null() {
        return 0;
    }
    // SAFETY: the caller's flow entry, touched only by its connection's packets.
    let hello = unsafe { &*hello };
    let (Some(key), Some(tail)) = (hello.offer_key_ref(), hello.ticket_tail()) else {
        return 0;
    };
    let tail = Tail::parse(tail);
    let id = TagKeyId {
        port: port as u16,
        pad: 0,
        period: tail.period,
    };
    let now = now_ns();
    // The terms of the key it vouches for, if it does.
    let terms = match TLS_TAG_KEYS.get_ptr(&id) {
        // SAFETY: a live map value; the daemon rewrites it whole, a torn read fails the tag.
        Some(k) => unsafe {
            let k = &*k;
            let now_s = k.clock_ns.wrapping_add(now) / 1_000_000_000;
            (u64::from(tail.expires) > now_s
                && tag(k.k0, k.k1, key, tail.period, tail.expires) == tail.tag)
                .then_some((k.limit, k.per_minute))
        },
        None => None,
    };
    let Some((limit, per_minute)) = terms else {
        count(|c| c.tags_refused += 1);
        return 0;
    };
    let value = IssuedValue {
        kind: u32::from(hello.offer) | ISSUED_BY_TAG,
        limit,
        per_minute,
        issued_ns: now,
        expires: u64::from(tail.expires),
        ..IssuedValue::default()
    };
    if TLS_ISSUED
        .insert(issued(key), &value, u64::from(BPF_NOEXIST))
        .is_ok()
    {
        count(|c| c.tags_verified += 1);
        return 1;
    }
    // Published meanwhile by another CPU (or the daemon), else the table is full.
    i32::from(TLS_ISSUED.get_ptr(issued(key)).is_some())
}

/// Publishes `key`, of a session id or ticket (`offer`) the server on `port` issued after a
/// full handshake it completed (seen in its packets: `gateway_common::tls::server`), under the
/// port's learning terms; `hint_s` is a ticket's lifetime hint (0 for none). Nothing when the
/// port learns nothing, or the key is already published (its entry, and a withdrawal in it,
/// stays). Counted: learnt, or not for want of room.
#[inline(always)]
pub fn learn(port: u16, key: &[u8; KEY_LEN], offer: Offer, hint_s: u32, now: u64) {
    if matches!(
        learn_by(port, key, offer as u32 | ISSUED_BY_SERVER, hint_s, now),
        Learnt::New
    ) {
        count(|c| c.keys_learnt += 1);
    }
}

/// What [`learn_by`] did.
pub enum Learnt {
    /// Published by this call.
    New,
    /// Already published (by a racing CPU, the daemon, or earlier).
    Present,
    /// Not published: the port learns nothing, or the table is full (counted).
    No,
}

/// Publishes `key` as [`IssuedValue::kind`] `kind` under the learning terms of `port` (see
/// [`learn`]). Counted when there was no room (`keys_unlearnt`).
#[inline(always)]
pub fn learn_by(port: u16, key: &[u8; KEY_LEN], kind: u32, hint_s: u32, now: u64) -> Learnt {
    // SAFETY: a live map value, rewritten whole by the daemon; a torn read at worst gives one
    // key a mixed lifetime.
    let Some(terms) = TLS_LEARN.get_ptr(&u32::from(port)).map(|t| unsafe { *t }) else {
        return Learnt::No;
    };
    let value = IssuedValue {
        kind,
        limit: terms.limit,
        per_minute: terms.per_minute,
        issued_ns: now,
        expires: terms.expires(now, hint_s),
        ..IssuedValue::default()
    };
    match TLS_ISSUED.insert(issued(key), &value, u64::from(BPF_NOEXIST)) {
        Ok(()) => Learnt::New,
        Err(_) if TLS_ISSUED.get_ptr(issued(key)).is_some() => Learnt::Present,
        Err(_) => {
            count(|c| c.keys_unlearnt += 1);
            Learnt::No
        }
    }
}

/// Whether the port's sessions are learnt at the NIC (`TLS_LEARN` has terms for it).
#[inline(always)]
pub fn learns(port: u16) -> bool {
    TLS_LEARN.get_ptr(&u32::from(port)).is_some()
}

/// The server declined the offer of `key` (its ServerHello started a full handshake): the key,
/// if published, is withdrawn, as the daemon withdraws one ([`ISSUED_WITHDRAWN`]: it buys
/// nothing until its entry ends).
#[inline(always)]
pub fn decline(key: &[u8; KEY_LEN]) {
    count(|c| c.offers_declined += 1);
    if let Some(v) = TLS_ISSUED.get_ptr_mut(issued(key)) {
        // SAFETY: a field of a live map value; the daemon rewrites `kind` only when it publishes
        // the entry again, which a withdrawal racing it may lose (the next decline withdraws).
        unsafe {
            let kind = core::ptr::read_volatile(&raw const (*v).kind);
            core::ptr::write_volatile(&raw mut (*v).kind, kind | ISSUED_WITHDRAWN);
        }
    }
}

/// Gives back a place of the issued key `key` (a resumed unit ended). Never below zero: a key
/// withdrawn and published again in between starts from its own count.
#[inline(always)]
pub fn give_back(key: &[u8; KEY_LEN]) {
    let Some(v) = TLS_ISSUED.get_ptr_mut(issued(key)) else {
        return;
    };
    // SAFETY: a field of a live map value, only changed by compare-and-swap.
    unsafe { decrement(&raw mut (*v).in_use) };
}

/// Takes one off the count at `count`, never below zero.
///
/// # Safety
/// `count` must point to a live, aligned u64 only changed by atomic operations.
#[inline(always)]
unsafe fn decrement(count: *mut u64) {
    for _ in 0..DECREMENT_TRIES {
        // SAFETY: upheld by the caller.
        let seen = unsafe { core::ptr::read_volatile(count) };
        if seen == 0 || unsafe { compare_and_swap(count, seen, seen - 1) } {
            return;
        }
    }
}

/// Attempts at giving a place back: a count left one too high holds a place until its key's
/// lifetime ends, so this tries harder than taking does.
const DECREMENT_TRIES: usize = 16;

/// The resumed connection `flow` was answered by the server (its unit completed): the place its
/// unit held of the issued key `offer` becomes a hold until the connection ends. With no room
/// for the hold (the table is full), the place is simply given back, as before holds. Returns
/// false only then: the key was still published and the hold found no room (the caller counts
/// it, `TlsCounters::holds_full`).
#[inline(always)]
pub fn hold_open(flow: &FlowKey, offer: &[u8; KEY_LEN]) -> bool {
    let mut held = true;
    if let Some(v) = TLS_ISSUED.get_ptr_mut(issued(offer)) {
        // A hold left on this 4-tuple by an earlier connection (the client reused its port)
        // ends first.
        close(flow);
        let hold = TlsHold {
            offer: *offer,
            since_ns: now_ns(),
            gone: 0,
            pad: 0,
        };
        if TLS_HOLDS
            .insert(flow, &hold, u64::from(BPF_NOEXIST))
            .is_ok()
        {
            // SAFETY: a field of a live map value, only changed by atomic operations. Counted
            // open before the unit's place goes, so the key is never briefly under-counted.
            unsafe { atomic_add(&raw mut (*v).open, 1) };
        } else {
            held = false;
        }
    }
    give_back(offer);
    held
}

/// The connection `flow` ended (the server's FIN or RST left): its hold, if any, gives its place
/// back, once (whoever deletes the entry).
#[inline(always)]
pub fn close(flow: &FlowKey) {
    // SAFETY: a copy is taken before the entry goes.
    let Some(hold) = TLS_HOLDS.get_ptr(flow).map(|h| unsafe { *h }) else {
        return;
    };
    if TLS_HOLDS.remove(flow).is_ok() {
        release(&hold.offer);
    }
}

/// Gives back the place a hold had of `offer`.
#[inline(always)]
fn release(offer: &[u8; KEY_LEN]) {
    if let Some(v) = TLS_ISSUED.get_ptr_mut(issued(offer)) {
        // SAFETY: a field of a live map value, only changed by atomic operations.
        unsafe { decrement(&raw mut (*v).open) };
    }
}

/// Releases the holds the daemon marked gone (their socket is gone) and those older than
/// [`MAX_HOLD_NS`]: part of the TLS sweep (`crate::pending`), whose `pass` learns when the
/// earliest hold left is due.
#[inline(always)]
pub fn sweep_holds(pass: &mut Pass) {
    // SAFETY: `end_hold` has the callback signature the helper expects; `pass` outlives the call.
    unsafe {
        bpf_for_each_map_elem(
            (&raw const TLS_HOLDS).cast_mut().cast::<c_void>(),
            end_hold as *mut c_void,
            (pass as *mut Pass).cast(),
            0,
        );
    }
}

/// One entry of [`sweep_holds`] (a `bpf_for_each_map_elem` callback). Returns 0 to go on.
#[inline(never)]
extern "C" fn end_hold(
    map: *mut c_void,
    key: *mut FlowKey,
    hold: *mut TlsHold,
    pass: *mut c_void,
) -> i64 {
    let pass = pass.cast::<Pass>();
    // SAFETY: the helper passes a live entry and the caller's pass.
    let (h, now) = unsafe { (*hold, (*pass).now) };
    let due = h.since_ns.saturating_add(MAX_HOLD_NS);
    if h.gone == 0 && due >= now {
        // SAFETY: as above.
        unsafe {
            if due < (*pass).earliest {
                (*pass).earliest = due;
            }
        }
    } else {
        // SAFETY: deleting the entry being visited is allowed for hash maps; the copy was taken.
        if unsafe { bpf_map_delete_elem(map, key.cast()) } == 0 {
            release(&h.offer);
        }
    }
    0
}
