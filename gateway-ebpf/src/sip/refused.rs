//! Refused SIP originals, remembered only to count their copies (`sip_copies_of_refused`): a
//! direct-mapped table of unit keys, one per slot, where a later refusal takes the slot of an
//! earlier one. A copy is judged as an original whether it is found here or not, so the table
//! decides nothing: it spares a flood of refused originals an LRU insert each, and spares the
//! admitted transactions' entries in `SIP_TXNS` from being evicted by them.

use aya_ebpf::{btf_maps::Array, macros::btf_map};

/// Slots of [`SIP_REFUSED`] (a power of two).
const SLOTS: u32 = 4096;

/// The unit keys of recently refused originals, by their low bits (not pinned: a replaced
/// program starts with an empty one, which only undercounts copies).
#[btf_map]
static SIP_REFUSED: Array<u64, { SLOTS as usize }> = Array::new();

/// The slot of `key`.
#[inline(always)]
fn slot(key: u64) -> u32 {
    key as u32 & (SLOTS - 1)
}

/// Remembers that the original of unit key `key` was refused.
#[inline(always)]
pub fn remember(key: u64) {
    if let Some(s) = SIP_REFUSED.get_ptr_mut(slot(key)) {
        // SAFETY: a word of a live array slot; a racing CPU's store wins or loses whole.
        unsafe { core::ptr::write_volatile(s, key) };
    }
}

/// Whether the original of unit key `key` was refused, as far as its slot remembers.
#[inline(always)]
pub fn copy_of_refused(key: u64) -> bool {
    // SAFETY: a word of a live array slot.
    SIP_REFUSED
        .get_ptr(slot(key))
        .is_some_and(|s| unsafe { core::ptr::read_volatile(s) } == key)
}
