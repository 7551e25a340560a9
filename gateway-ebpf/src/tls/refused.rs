//! Connections refused on their first segment: a direct-mapped table of flow keys, one per
//! slot ([`FlowKey::refused_slot`]), where a later refusal takes the slot of an earlier one.
//!
//! A refusal made no `TLS_FLOWS` entry: under a flood of refused hellos, an LRU insert each
//! cost about a microsecond, and every one of them evicted some other connection's entry (an
//! admitted connection's among them). Here the refused connection's later segments with
//! payload (a retransmitted hello, data sent blind) are answered like the refusal while the
//! kernel holds its socket and its slot remembers it; without a connection in the kernel (the
//! refusal's resets end it) they are dropped, and once a later refusal took the slot, a hello
//! is judged afresh against the limits.

use aya_ebpf::{btf_maps::Array, macros::btf_map};
use gateway_common::maps::{FlowKey, TLS_REFUSED_SLOTS};

use crate::bytes::{copy, equal, zero};

/// `BPF_F_MMAPABLE`: userspace maps the slots into its memory to read or clear them all at once.
const BPF_F_MMAPABLE: usize = 1 << 10;

/// Connections refused on their first segment, by the slot of their key; all-zero where empty.
#[btf_map]
pub static TLS_REFUSED: Array<FlowKey, { TLS_REFUSED_SLOTS as usize }, BPF_F_MMAPABLE> =
    Array::new();

/// Remembers that the connection of `key` was refused on its first segment.
#[inline(always)]
pub fn remember(key: &FlowKey) {
    if let Some(s) = TLS_REFUSED.get_ptr_mut(key.refused_slot()) {
        // SAFETY: a live slot, aligned like `key`. Two CPUs refusing into one slot at once may
        // leave words of both keys, which matches neither (nor, but by an attacker's luck in
        // a race, any other connection, whose first segment would then be refused once).
        unsafe { copy(s, key) };
    }
}

/// Whether the connection of `key` was refused, as far as its slot remembers.
#[inline(always)]
pub fn holds(key: &FlowKey) -> bool {
    // SAFETY: a live slot, aligned like `key`.
    TLS_REFUSED
        .get_ptr(key.refused_slot())
        .is_some_and(|s| unsafe { equal(s, key) })
}

/// Forgets the refused connection of `key` (its client reused the port for a new one).
#[inline(always)]
pub fn forget(key: &FlowKey) {
    if let Some(s) = TLS_REFUSED.get_ptr_mut(key.refused_slot()) {
        // SAFETY: a live slot, aligned; all-zero is its empty value. Only called after `holds`
        // found the key there.
        unsafe { zero(s) };
    }
}
