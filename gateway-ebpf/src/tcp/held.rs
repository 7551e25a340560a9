//! A held hello's first segment joined with the segment that admitted it, for the kernel
//! (SYN-cookie mode, while the service refuses new connections: `super::cookie`).
//!
//! The first segment of a hello that takes two is held back (the kernel makes no connection
//! before the hello is judged), and its payload kept here ([`keep`]). When the next segment
//! admits the hello (a resumption), its frame is made into one segment of both payloads, from
//! the first one's sequence number ([`join`]), and handed to the listener: the kernel gets the
//! whole hello at once, acknowledges all of it, and the client sends nothing again.
//!
//! The frame grows by a segment's worth, which an XDP buffer seldom has room for (a driver's
//! buffer is often half a page; veth's is cut to the frame), so it is done at TC ingress, where
//! the skb is reallocated as needed: by the TC program itself, or on an XDP attachment by the
//! finishing program, which the XDP reply program hands the frame to ([`Handover::Join`]).
//!
//! Where it cannot be done (the first payload no longer kept, a hello of three segments, no
//! finishing program), the client is asked for its first segment again instead
//! (`super::cookie::gateway_held_answer`), which costs it two of its timer ticks and ten
//! milliseconds more.
//!
//! The bytes joined are the very bytes the classifier judged: they are kept when they are
//! parsed, never taken from a later copy the client sends.

use aya_ebpf::programs::TcContext;
use aya_ebpf::{
    btf_maps::{Array, LruHashMap},
    helpers::generated::bpf_csum_diff,
    macros::btf_map,
};
use gateway_common::{
    maps::{
        FINISHER_ATTACHED, FlowKey, HOLDS_PER_SOURCE_BURST, HOLDS_PER_SOURCE_PER_SECOND,
        IPPROTO_TCP,
    },
    packet::{Packet, PacketKind, parse},
};

use super::{PAYLOAD_LEN, TcpEvent, TcpScratch, TcpService, cookie, flow_key};
use crate::{
    bytes::{SkbBytes, opaque},
    context::{Action, CopyOut, Handover, Rewrite},
    maps::finisher,
    reply::resegment,
    sync::{gcra, now_ns},
};

/// Most payload bytes of a held first segment kept: one full segment at an MTU of 1500.
pub const HELD_MAX: u32 = 1500;
/// Bytes of a kept payload's buffer: [`HELD_MAX`] rounded up to whole checksum chunks, zero
/// past the payload.
const HELD_BYTES: usize = 1536;
/// Held first segments kept at most within their addresses' budgets (about 6 MB): a flood of
/// held hellos from many addresses evicts the oldest, which a client's next segment follows by
/// microseconds (after a loss, by a retransmission timeout: such a client is reset).
const MAX_HELD: usize = 4096;
/// Bytes `bpf_csum_diff` sums in one call at most.
const CSUM_CHUNK: u32 = 512;

/// A held first segment's payload.
#[repr(C, align(8))]
pub struct HeldSegment {
    /// Its sequence number.
    seq: u32,
    /// Its length; 0 when it could not be copied.
    len: u32,
    /// The bytes, zero past `len`.
    bytes: [u8; HELD_BYTES],
}

/// Held first segments' payloads by connection (LRU; not pinned: a hello's two segments come
/// microseconds apart), each client address within its budget ([`may_hold`]).
#[btf_map]
static HELD_SEGMENTS: LruHashMap<FlowKey, HeldSegment, MAX_HELD> = LruHashMap::new();

/// Payloads held past their client address's budget (LRU, not pinned): one address holding
/// faster than its budget churns this table, not the payloads of other clients' holds, which
/// may wait a retransmission timeout for a lost segment. Its own clients' hellos are still
/// joined (their two segments come microseconds apart), unless they meet a loss.
#[btf_map]
static HELD_OVER_BUDGET: LruHashMap<FlowKey, HeldSegment, MAX_HELD_OVER_BUDGET> = LruHashMap::new();

/// Payloads held past their address's budget kept at most (about 1.5 MB).
const MAX_HELD_OVER_BUDGET: usize = 1024;

/// An all-zero [`HeldSegment`], the value each kept payload starts from (never written).
#[btf_map]
static HELD_EMPTY: Array<HeldSegment, 1> = Array::new();

/// Client addresses whose holds are budgeted at most: an address evicted from here starts a
/// fresh budget, which only many addresses can make happen.
const MAX_HOLDERS: usize = 4096;

/// Each client address's budget of holds (an IPv6 /64's; LRU, not pinned): the theoretical
/// arrival time of its next hold, in ns ([`may_hold`]).
#[btf_map]
static HOLDS_BY_SOURCE: LruHashMap<[u8; 16], u64, MAX_HOLDERS> = LruHashMap::new();

/// Whether the client of `key` may have one more first segment kept in [`HELD_SEGMENTS`] at
/// `now`: within [`HOLDS_PER_SOURCE_PER_SECOND`] a second and [`HOLDS_PER_SOURCE_BURST`] at
/// once, counted per address (an IPv6 /64: one host has a whole one).
#[inline(always)]
fn may_hold(key: &FlowKey, now: u64) -> bool {
    let interval = 1_000_000_000 / HOLDS_PER_SOURCE_PER_SECOND;
    let source = key.client_source();
    if let Some(tat) = HOLDS_BY_SOURCE.get_ptr_mut(&source) {
        return gcra(tat, interval, HOLDS_PER_SOURCE_BURST, now);
    }
    // The address's first hold (or first since its budget was evicted).
    let _ = HOLDS_BY_SOURCE.insert(&source, &(now + interval), 0);
    true
}

/// The payload kept for the connection `key`, in either table.
#[inline(always)]
fn kept(key: &FlowKey) -> Option<*mut HeldSegment> {
    HELD_SEGMENTS
        .get_ptr_mut(key)
        .or_else(|| HELD_OVER_BUDGET.get_ptr_mut(key))
}

/// Keeps the payload (`payload_len` bytes) of `pkt`, the held first segment of the connection
/// `key`: in [`HELD_SEGMENTS`] within its client address's budget, else in
/// [`HELD_OVER_BUDGET`]. Nothing is kept for a payload longer than [`HELD_MAX`].
#[inline(always)]
pub fn keep<C: CopyOut, S: TcpService>(ctx: &C, pkt: &Packet, key: &FlowKey, payload_len: u32) {
    let n = opaque(u64::from(payload_len));
    if n == 0 || n > u64::from(HELD_MAX) {
        return;
    }
    let Some(empty) = HELD_EMPTY.get_ptr(0) else {
        return;
    };
    // SAFETY: the array's one entry, never written.
    let empty = unsafe { &*empty };
    // In one table, and not the other (a payload of an earlier connection of the same
    // 4-tuple would be found first).
    let inserted = if may_hold(key, now_ns()) {
        let _ = HELD_OVER_BUDGET.remove(key);
        HELD_SEGMENTS.insert(key, empty, 0)
    } else {
        S::count(TcpEvent::HoldOverBudget);
        let _ = HELD_SEGMENTS.remove(key);
        HELD_OVER_BUDGET.insert(key, empty, 0)
    };
    if inserted.is_err() {
        return;
    }
    let Some(h) = kept(key) else {
        return;
    };
    // SAFETY: the entry just inserted, touched only by this connection's packets.
    let h = unsafe { &mut *h };
    let t = &pkt.transport;
    if ctx.copy_out(u32::from(t.payload_offset), h.bytes.as_mut_ptr(), n) {
        h.seq = t.seq;
        h.len = n as u32;
    }
}

/// Forgets the first segment kept for the connection `key` (its hello was refused, or its
/// payload went to the listener).
#[inline(always)]
pub fn forget(key: &FlowKey) {
    let _ = HELD_SEGMENTS.remove(key);
    let _ = HELD_OVER_BUDGET.remove(key);
}

/// Whether the `len` payload bytes copied into `s.buf` (zero past them to a word), from `seq`,
/// are the first segment kept for the connection `s.key`, byte for byte: 1 when they are, 0
/// when they differ, -1 when nothing is kept for it. A global function, checked once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_kept_matches(s: *const TcpScratch, seq: u32, len: u32) -> i32 {
    if s.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU scratch.
    let s = unsafe { &*s };
    let Some(h) = kept(&s.key) else {
        return -1;
    };
    // SAFETY: this connection's entry, touched only by its packets.
    let h = unsafe { &*h };
    // A payload that could not be copied when it was held was never kept.
    if h.len == 0 {
        return -1;
    }
    if h.seq != seq || h.len != len || len == 0 || len > HELD_MAX {
        return 0;
    }
    // The words to compare, hidden from LLVM so that it keeps the constant bound below (which
    // the verifier needs: it does not carry `len`'s bound over from the copy tested above).
    let words = (opaque(u64::from(len)) as usize).div_ceil(8);
    let mut i = 0;
    while i < HELD_BYTES / 8 {
        if i >= words {
            break;
        }
        // SAFETY: word `i` of both buffers (1536 and 4096 bytes, each 8-aligned at its start):
        // `i` is below 192.
        let (a, b) = unsafe {
            (
                h.bytes.as_ptr().cast::<u64>().add(i).read(),
                s.buf.as_ptr().cast::<u64>().add(i).read(),
            )
        };
        if a != b {
            return 0;
        }
        i += 1;
    }
    1
}

/// What the client's first segment sent again after its held hello was admitted (`pkt`, of
/// `payload_len` bytes; the join was not done) is to the bytes judged: [`Kept::Same`] when it
/// is them, byte for byte.
#[inline(always)]
pub fn compare_kept<C: CopyOut>(
    ctx: &C,
    pkt: &Packet,
    s: &mut TcpScratch,
    payload_len: u32,
) -> Kept {
    let n = opaque(u64::from(payload_len));
    if n == 0 {
        return Kept::Differs;
    }
    // Longer than any payload kept: its first segment's was not (a larger MTU's), or this is
    // not it.
    if n > u64::from(HELD_MAX) {
        return Kept::Gone;
    }
    let t = &pkt.transport;
    if !ctx.copy_out(u32::from(t.payload_offset), s.buf.as_mut_ptr(), n) {
        return Kept::Differs;
    }
    let end = (n as usize) & (2 * PAYLOAD_LEN - 1);
    if let Some(pad) = s.buf.get_mut(end..end + 8) {
        pad.copy_from_slice(&[0; 8]);
    }
    match gateway_kept_matches(s, t.seq, n as u32) {
        1 => {
            forget(&s.key);
            Kept::Same
        }
        -1 => Kept::Gone,
        _ => Kept::Differs,
    }
}

/// What [`compare_kept`] found.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kept {
    /// The bytes judged.
    Same,
    /// Other bytes (or another length, or sequence number).
    Differs,
    /// Nothing kept for the connection (evicted by a flood of held hellos, or a first payload
    /// longer than [`HELD_MAX`]): the segment cannot be shown to be the one judged.
    Gone,
}

/// The one's-complement sum of the first `n` bytes at `p` (zero past them to a multiple of
/// four; at most `chunks` times [`CSUM_CHUNK`]), as big-endian 16-bit words at an even offset
/// (`odd` false) or at an odd one; folded to 16 bits.
#[inline(always)]
fn sum_at(p: *const u8, n: u32, chunks: u32, odd: bool) -> u64 {
    let n = (n + 3) & !3;
    let mut sum = 0u64;
    for i in 0..chunks {
        let off = i * CSUM_CHUNK;
        if off >= n {
            break;
        }
        let len = opaque(u64::from(n - off));
        let len = if len > u64::from(CSUM_CHUNK) {
            u64::from(CSUM_CHUNK)
        } else {
            len
        };
        // SAFETY: `len` bytes at `off` inside the caller's buffer (its bound); a multiple of
        // four, at most one chunk.
        let part = unsafe {
            bpf_csum_diff(
                core::ptr::null_mut(),
                0,
                p.add(off as usize) as *mut u32,
                len as u32,
                0,
            )
        };
        sum += u64::from(part as u32);
    }
    // The helper sums words as this (little-endian) machine reads them: byte-swapped big-endian
    // words, which are what bytes at an odd offset make.
    let mut folded = (sum & 0xffff) + (sum >> 16);
    folded = (folded & 0xffff) + (folded >> 16);
    folded = (folded & 0xffff) + (folded >> 16);
    let folded = folded as u16;
    u64::from(if odd { folded } else { folded.swap_bytes() })
}

/// The first segment kept for the connection `s.key` when `pkt` is the one right after it
/// and both can be joined in one segment: its payload's length.
#[inline(always)]
fn held(s: &TcpScratch, pkt: &Packet, first_seq: u32) -> Option<(*const HeldSegment, u32)> {
    let h: *const HeldSegment = kept(&s.key)?;
    // SAFETY: this connection's entry, touched only by its packets.
    let (seq, l1) = unsafe { ((*h).seq, (*h).len) };
    let l2 = u32::from(pkt.payload_len());
    (seq == first_seq
        && l1 != 0
        && l1 <= HELD_MAX
        && first_seq.wrapping_add(l1) == pkt.transport.seq
        && l2 != 0
        && l2 <= PAYLOAD_LEN as u32)
        .then_some((h, l1))
}

/// The reply program's part, for the segment `pkt` that admitted the held hello of `s.key`
/// (starting at `first_seq`; its options copied into `s.cookie`): joined here when the hook
/// can grow the frame ([`join`]), else handed to the finishing program to be joined there
/// ([`Handover::Join`], [`Action::Pass`]). `None` when neither can be done, the frame unchanged.
#[inline(always)]
pub fn join_or_hand_over<R: Rewrite + CopyOut, S: TcpService>(
    ctx: &R,
    pkt: &Packet,
    s: &mut S::Scratch,
    first_seq: u32,
) -> Option<Action> {
    held(S::tcp(s), pkt, first_seq)?;
    if R::GROWS {
        join::<R, S>(ctx, pkt, s, first_seq)
    } else if finisher(FINISHER_ATTACHED) && ctx.hand_over(Handover::Join, first_seq) {
        Some(Action::Pass)
    } else {
        None
    }
}

/// The finishing program's part: the frame the XDP reply program handed over ([`Handover::Join`], the
/// held first segment's sequence number `first_seq`) joined with it and handed to the listener
/// ([`Action::Handoff`]), else dropped (the client sends its segments again at its timer).
#[inline(always)]
pub fn join_handed_over<S: TcpService>(ctx: &TcContext, first_seq: u32) -> Action {
    let b = SkbBytes::new(ctx);
    let pkt = parse(&b);
    if pkt.kind != PacketKind::Transport || pkt.transport.proto != IPPROTO_TCP {
        return Action::Drop;
    }
    let Some(full) = S::scratch() else {
        return Action::Drop;
    };
    // SAFETY: per-CPU slot, used only by this program run.
    let full = unsafe { &mut *full };
    let s = S::tcp(full);
    if !flow_key(&b, &pkt, &mut s.key, false) {
        return Action::Drop;
    }
    cookie::take_segment(ctx, &pkt, &mut s.cookie);
    join::<_, S>(ctx, &pkt, full, first_seq).unwrap_or(Action::Drop)
}

/// Joins the first segment kept for the connection `s.key` (starting at `first_seq`) into the
/// frame of `pkt`, the segment after it, which admitted its hello (its options copied into
/// `s.cookie`): the frame becomes one segment of both payloads from `first_seq` (headers kept,
/// lengths and checksums set), for the listener ([`Action::Handoff`]). `None` when it cannot be
/// done and the frame is unchanged; [`Action::Drop`] when the frame was changed and then could
/// not be finished (the client sends it again at its timer).
#[inline(always)]
fn join<R: Rewrite + CopyOut, S: TcpService>(
    ctx: &R,
    pkt: &Packet,
    full: &mut S::Scratch,
    first_seq: u32,
) -> Option<Action> {
    let s = S::tcp(full);
    let (h, l1) = held(s, pkt, first_seq)?;
    // SAFETY: as in `held`.
    let h = unsafe { &*h };
    let l2 = u32::from(pkt.payload_len());
    let at = u32::from(pkt.transport.payload_offset);
    // The segment's own payload, out of the way of the first one's, zero past it.
    let n = opaque(u64::from(l2));
    if n == 0 || n > PAYLOAD_LEN as u64 || !ctx.copy_out(at, s.buf.as_mut_ptr(), n) {
        return None;
    }
    let end = (n as usize) & (2 * PAYLOAD_LEN - 1);
    if let Some(pad) = s.buf.get_mut(end..end + 4) {
        pad.copy_from_slice(&[0; 4]);
    }
    if !ctx.resize((at + l1 + l2) as usize) {
        return None;
    }
    let l1 = opaque(u64::from(l1));
    let l2 = opaque(n);
    if l1 == 0
        || l1 > u64::from(HELD_MAX)
        || !ctx.store(at, h.bytes.as_ptr(), l1 as u32)
        || !ctx.store(at + l1 as u32, s.buf.as_ptr(), l2 as u32)
    {
        return Some(Action::Drop);
    }
    let sum = sum_at(
        h.bytes.as_ptr(),
        l1 as u32,
        HELD_BYTES as u32 / CSUM_CHUNK,
        false,
    ) + sum_at(
        s.buf.as_ptr(),
        l2 as u32,
        PAYLOAD_LEN as u32 / CSUM_CHUNK,
        l1 & 1 == 1,
    );
    if !resegment(
        ctx,
        pkt,
        first_seq,
        (l1 + l2) as u16,
        sum,
        s.cookie.options(),
    ) {
        return Some(Action::Drop);
    }
    forget(&s.key);
    // The kernel has the connection now: its later segments (and copies of these) pass.
    S::joined(full, pkt.ip_version == 4);
    S::count(TcpEvent::HeldJoined);
    Some(Action::Handoff)
}
