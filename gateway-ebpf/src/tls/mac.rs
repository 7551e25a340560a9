//! Tickets checked by the server's own ticket key: a ticket (or TLS 1.3 PSK identity) of
//! OpenSSL's and BoringSSL's callback format (nginx, HAProxy, Envoy) is `key name (16) | IV
//! (16) | ciphertext | HMAC-SHA256 (32)`, the MAC over everything before it. An offer whose key
//! was never published and whose name is one of the port's ticket keys (`TLS_TICKET_KEYS`,
//! read by the daemon from the server's key files) has its MAC computed here; a right one
//! publishes the ticket's key under the port's learning terms ([`resume::learn_by`]). Only offers
//! whose name matches pay for the MAC; a ticket not wholly in the segment that ended the hello
//! is not checked (tls-new).

use aya_ebpf::{
    btf_maps::{HashMap, PerCpuArray},
    macros::btf_map,
};
use gateway_common::{
    maps::{ISSUED_BY_KEY, MAX_TICKET_KEYS, MIN_MAC_TICKET, TicketKeyId, TicketMacKey},
    sha256::{self, BLOCK, DIGEST},
    tls::{HelloState, MAX_OFFER},
};

use crate::{
    resume,
    sync::now_ns,
    tls::{SCRATCH_LEN, Scratch, TLS_SCRATCH},
    tls_counters::count,
};

/// The servers' ticket keys by port and name, written by the daemon.
#[btf_map]
pub static TLS_TICKET_KEYS: HashMap<TicketKeyId, TicketMacKey, { MAX_TICKET_KEYS as usize }> =
    HashMap::new();

/// Per-CPU work space of the MAC (not pinned): too big for the stack beside the hello's.
#[btf_map]
static TLS_MAC_SCRATCH: PerCpuArray<MacScratch, 1> = PerCpuArray::new();

/// The MAC's work space.
#[repr(C)]
pub struct MacScratch {
    /// The hash state.
    state: [u32; 8],
    /// The key's outer state, for the end.
    outer: [u32; 8],
    /// The block(s) being hashed: one whole block, or the padded end.
    block: [u8; 2 * BLOCK],
    /// The message's bytes after its whole blocks.
    rest: [u8; BLOCK],
    /// The key looked up.
    id: TicketKeyId,
    /// The message schedule.
    w: [u32; 16],
    /// The working variables.
    v: [u32; 8],
    /// Where the ticket starts in the hello scratch.
    at: u32,
    /// Whole blocks of its body (all of it but the MAC).
    blocks: u32,
    /// Bytes of its body after those.
    rest_len: u32,
    /// Bytes of its body.
    body: u32,
}

/// Whole blocks a ticket's MAC covers, at most.
const MAX_BLOCKS: u32 = MAX_OFFER / BLOCK as u32 + 1;

/// Index mask of the hello scratch buffer (twice its window: an index under the mask never
/// leaves it).
const MASK: u32 = 2 * SCRATCH_LEN as u32 - 1;

/// Hashes the first block of `m.block` into `m.state`. A global function: the verifier checks
/// its 64 rounds once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_sha256_block(m: *mut MacScratch) -> i32 {
    if m.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU slot, used by this program run alone.
    let m = unsafe { &mut *m };
    // SAFETY: the first BLOCK bytes of a 2 * BLOCK array.
    let block = unsafe { &*m.block.as_ptr().cast::<[u8; BLOCK]>() };
    sha256::compress_in(&mut m.state, block, &mut m.w, &mut m.v);
    0
}

/// Copies the `BLOCK` bytes of the hello scratch `buf` from `at` (masked) to `out`.
#[inline(always)]
fn load(buf: &[u8; 2 * SCRATCH_LEN], at: u32, out: &mut [u8; BLOCK]) {
    for (i, o) in out.iter_mut().enumerate() {
        *o = buf[((at + i as u32) & MASK) as usize];
    }
}

/// Copies the block of the hello scratch `s` at offset `from` to `m.block`. A leaf global
/// function: checked once, and off the hashing's call chain.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_mac_load(s: *const Scratch, m: *mut MacScratch, from: u32) -> i32 {
    if s.is_null() || m.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU slots, used by this program run alone.
    let (s, m) = unsafe { (&*s, &mut *m) };
    // SAFETY: the first BLOCK bytes of a 2 * BLOCK array.
    let first = unsafe { &mut *m.block.as_mut_ptr().cast::<[u8; BLOCK]>() };
    load(&s.tcp.buf, from, first);
    0
}

/// Pads the last `r` bytes of a `msg`-byte ticket body (after its whole blocks), at offset
/// `from` of the hello scratch `s`, into `m.block`; returns the blocks to hash (1 or 2). A leaf
/// global function: checked once, and its stack is not on the hashing's call chain.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_mac_tail(
    s: *const Scratch,
    m: *mut MacScratch,
    from: u32,
    r: u32,
    msg: u32,
) -> i32 {
    if s.is_null() || m.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU slots, used by this program run alone.
    let (s, m) = unsafe { (&*s, &mut *m) };
    load(&s.tcp.buf, from, &mut m.rest);
    sha256::tail(&m.rest, r, u64::from(BLOCK as u32 + msg), &mut m.block) as i32
}

/// Moves the second padded block of `m.block` to its first. A leaf global function.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_mac_second(m: *mut MacScratch) -> i32 {
    if m.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU slot.
    let m = unsafe { &mut *m };
    for i in 0..BLOCK {
        m.block[i] = m.block[BLOCK + i];
    }
    0
}

/// Readies the outer hash: the inner digest (`m.state`) and its padding as `m.block`, and the
/// key's outer state as `m.state`. A leaf global function.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_mac_outer(m: *mut MacScratch) -> i32 {
    if m.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU slot.
    let m = unsafe { &mut *m };
    for i in 0..BLOCK {
        m.block[i] = 0;
    }
    for i in 0..8 {
        let b = m.state[i].to_be_bytes();
        for (j, x) in b.iter().enumerate() {
            m.block[(4 * i + j) & (BLOCK - 1)] = *x;
        }
    }
    m.block[DIGEST] = 0x80;
    let bits = ((BLOCK + DIGEST) * 8) as u64;
    for i in 0..8 {
        m.block[BLOCK - 8 + i] = (bits >> (56 - 8 * i)) as u8;
    }
    m.state = m.outer;
    0
}

/// Whether `m.state` is the MAC the ticket carries at offset `at` of the hello scratch `s`:
/// 1 when it is. A leaf global function.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_mac_equal(s: *const Scratch, m: *const MacScratch, at: u32) -> i32 {
    if s.is_null() || m.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU slots.
    let (s, m) = unsafe { (&*s, &*m) };
    let mut diff = 0u32;
    for i in 0..8 {
        let x = at + 4 * i as u32;
        let want = u32::from_be_bytes([
            s.tcp.buf[(x & MASK) as usize],
            s.tcp.buf[((x + 1) & MASK) as usize],
            s.tcp.buf[((x + 2) & MASK) as usize],
            s.tcp.buf[((x + 3) & MASK) as usize],
        ]);
        diff |= m.state[i] ^ want;
    }
    i32::from(diff == 0)
}

/// The per-CPU scratch slots of the hello and of the MAC.
#[inline(always)]
fn slots() -> Option<(*mut Scratch, *mut MacScratch)> {
    Some((TLS_SCRATCH.get_ptr_mut(0)?, TLS_MAC_SCRATCH.get_ptr_mut(0)?))
}

/// Begins the MAC check of the ticket the complete hello `hello` offers to `port`, its last
/// window being in this CPU's hello scratch: 1 when its name is a ticket key of the port's and
/// its bytes are all in the window (the MAC's state then set up: [`gateway_mac_blocks`],
/// [`gateway_mac_finish`]), 0 otherwise (counted when the name matched).
///
/// The check runs as global functions called one after another by the classifier, never
/// nested more than two deep: every frame of a call chain shares the 512-byte stack with the
/// classifier's own.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_mac_begin(hello: *const HelloState, port: u32) -> i32 {
    if hello.is_null() {
        return 0;
    }
    // SAFETY: the caller's flow entry, touched only by its connection's packets.
    let hello = unsafe { &*hello };
    let Some((at, len)) = hello.ticket_span() else {
        return 0;
    };
    if !(MIN_MAC_TICKET..=MAX_OFFER).contains(&len) {
        return 0;
    }
    let Some((s, m)) = slots() else {
        return 0;
    };
    // SAFETY: per-CPU slots, used by this program run alone.
    let (s, m) = unsafe { (&*s, &mut *m) };
    m.id.port = port as u16;
    m.id.pad = 0;
    // The window must hold the whole ticket; its name is read as far as the window goes.
    let whole = at >= s.stream_offset && at + len <= s.stream_offset.wrapping_add(s.len);
    let o = at.wrapping_sub(s.stream_offset) & MASK;
    for i in 0..16 {
        m.id.name[i] = s.tcp.buf[((o + i as u32) & MASK) as usize];
    }
    let Some(key) = TLS_TICKET_KEYS.get_ptr(&m.id) else {
        return 0;
    };
    if !whole {
        count(|c| c.macs_unchecked += 1);
        return 0;
    }
    // SAFETY: a live map value, rewritten whole by the daemon.
    unsafe {
        m.state = (*key).inner;
        m.outer = (*key).outer;
    }
    let body = len - DIGEST as u32;
    m.at = o;
    m.body = body;
    m.blocks = body / BLOCK as u32;
    m.rest_len = body - m.blocks * BLOCK as u32;
    1
}

/// Hashes the whole blocks of the ticket body [`gateway_mac_begin`] set up.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_mac_blocks() -> i32 {
    let Some((s, m)) = slots() else {
        return 0;
    };
    // SAFETY: a per-CPU slot; read only here, the callees write their own fields.
    let (at, blocks) = unsafe { ((*m).at, (*m).blocks) };
    for b in 0..MAX_BLOCKS {
        if b >= blocks {
            break;
        }
        gateway_mac_load(s, m, at + b * BLOCK as u32);
        gateway_sha256_block(m);
    }
    0
}

/// Ends the MAC [`gateway_mac_begin`] set up (after [`gateway_mac_blocks`]): pads and hashes
/// the body's last bytes, hashes the inner digest under the key's outer state, and compares
/// the result with the ticket's last 32 bytes: 1 when equal (counted either way).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_mac_finish() -> i32 {
    let Some((s, m)) = slots() else {
        return 0;
    };
    // SAFETY: a per-CPU slot; read only here.
    let (at, blocks, rest_len, body) = unsafe { ((*m).at, (*m).blocks, (*m).rest_len, (*m).body) };
    let tail_at = at + blocks * BLOCK as u32;
    let n = gateway_mac_tail(s, m, tail_at, rest_len, body);
    gateway_sha256_block(m);
    if n == 2 {
        gateway_mac_second(m);
        gateway_sha256_block(m);
    }
    gateway_mac_outer(m);
    gateway_sha256_block(m);
    if gateway_mac_equal(s, m, tail_at + rest_len) != 1 {
        count(|c| c.macs_refused += 1);
        return 0;
    }
    count(|c| c.macs_verified += 1);
    1
}

/// Publishes the key of the ticket the hello `hello` offers to `port`, whose MAC
/// [`gateway_mac_finish`] found right, under the port's learning terms: 1 when it is published
/// (by this call or a racing one). A global function apart from the MAC's, so that the two
/// frames are never on one call chain.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_mac_publish(hello: *const HelloState, port: u32) -> i32 {
    if hello.is_null() {
        return 0;
    }
    // SAFETY: the caller's flow entry, touched only by its connection's packets.
    let hello = unsafe { &*hello };
    let Some(ticket_key) = hello.offer_key_ref() else {
        return 0;
    };
    let kind = u32::from(hello.offer) | ISSUED_BY_KEY;
    i32::from(!matches!(
        resume::learn_by(port as u16, ticket_key, kind, 0, now_ns()),
        resume::Learnt::No
    ))
}
