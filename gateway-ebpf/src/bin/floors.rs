//! The floors: for each class of packet, an XDP program doing only the steps that class cannot
//! do without, so the benchmark can read the classifier's cost as a multiple of the least work
//! its packets need ("gateway / floor"), measured in the same run as the classifier and the bare
//! program. Attached nowhere, loaded by the benchmark alone (`gateway-tests`' `floors`).
//!
//! What each floor does (and what it leaves out: no Via branch or Call-ID is found or hashed, no
//! hello is validated, no IPv6, VLAN or IP options are walked; the classifier does all of that):
//! - [`floor_non_service`]: a per-CPU counter, Ethernet/IPv4/TCP-or-UDP parsed, the destination
//!   port looked up in an ARRAY (the classifier's own kind of service table), passed.
//! - [`floor_flow`]: and the flow looked up by its 4-tuple in a HASH (a hit after the first run).
//! - [`floor_new_hello`]: and, the flow unknown, the hello's extensions walked in a bounded loop,
//!   the coarse clock read, a per-CPU token bucket checked, one insert of a fresh key into an
//!   LRU table without a common list (`BPF_F_NO_COMMON_LRU`).
//! - [`floor_resumed_hello`]: and the PSK identity's first 16 bytes looked up in a HASH of issued
//!   keys (a hit after the first run).
//! - [`floor_sip_retransmission`]: the header block's end found eight bytes at a time in a bounded
//!   loop, the transaction looked up (a hit after the first run).
//! - [`floor_new_invite`]: the same, the transaction unknown, then the clock, the bucket and one
//!   insert of a fresh key.
//!
//!
//! And three floors of what this classifier must also keep, beyond the least work above (the
//! benchmark reports them apart, beside the targets' floors):
//! - [`floor_sip_retransmission_keyed`]: the retransmission's floor, and the transaction key
//!   the classifier's pinned tables are keyed by (`gateway_common::sip`): FNV-1a over as many
//!   bytes, in as many values, as the benchmark's INVITE has in its branch, sent-by, From tag,
//!   Call-ID and CSeq method (66, in five), then the five mixed into one key (40 more bytes).
//!   A datapath upgrade keeps those values, so in-flight transactions and dialogs stay matched.
//! - [`floor_new_invite_keyed`]: the new INVITE's floor, the same hashing, and the pending unit
//!   that holds the admitted request until the server answers: one insert more, into a
//!   preallocated HASH (a unit is never evicted, or the backlog would drift).
//! - [`floor_new_hello_unit`]: the new hello's floor and its pending unit, likewise.
//! - [`floor_resumed_hello_unit`]: the resumed hello's floor and its pending unit, likewise.
//!
//! A floor's "fresh key" is its CPU's run count: every repeated run inserts a new entry, as a
//! flood of new connections or transactions would.

#![no_std]
#![no_main]
#![allow(internal_features)]
#![feature(asm_experimental_arch)]

use aya_ebpf::{
    bindings::{BPF_NOEXIST, xdp_action},
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray},
    helpers::{bpf_get_smp_processor_id, bpf_ktime_get_coarse_ns},
    macros::{btf_map, xdp},
    programs::XdpContext,
};
use gateway_common::maps::{
    IPPROTO_TCP, IPPROTO_UDP, SERVICE_PORT_ENTRIES, port_kind, service_port_index,
};

/// Entries of the floors' flow, unit and transaction tables.
const TABLE: usize = 65_536;
/// `BPF_F_NO_COMMON_LRU`: each CPU evicts from its own list.
const NO_COMMON_LRU: usize = 2;
/// Bytes of a SIP message the word walk reads at most.
const MAX_SIP_BYTES: usize = 1_504;
/// Extensions of a hello the walk reads at most.
const MAX_EXTENSIONS: usize = 24;
/// The largest offset read: packet offsets are capped to it before the bounds check, as the
/// verifier needs.
const MAX_OFFSET: usize = 0xfff;

/// A flow, transaction or unit: a 4-tuple, its protocol and a tag.
#[repr(C)]
#[derive(Clone, Copy)]
struct Key {
    saddr: u32,
    daddr: u32,
    sport: u16,
    dport: u16,
    proto: u8,
    tag: u8,
    pad: [u8; 2],
}

/// What a table holds: 64 bytes, about a unit's or a flow's size in the classifier.
#[repr(C)]
#[derive(Clone, Copy)]
struct Entry {
    words: [u64; 8],
}

/// Counters: 0 packets, 1 the run count (fresh keys), 2 the token bucket's next time.
#[btf_map]
static FLOOR_COUNTERS: PerCpuArray<u64, 4> = PerCpuArray::new();
/// Service kind per (protocol, port), as the classifier's `SERVICE_PORTS` (set by the benchmark).
#[btf_map]
static FLOOR_PORTS: Array<u8, { SERVICE_PORT_ENTRIES as usize }> = Array::new();
/// Known flows and transactions (a hit after a packet's first run).
#[btf_map]
static FLOOR_FLOWS: HashMap<Key, Entry, TABLE> = HashMap::new();
/// Issued keys (a hit after the first run).
#[btf_map]
static FLOOR_ISSUED: HashMap<[u8; 16], Entry, 1024> = HashMap::new();
/// Pending units of the keyed floors (a preallocated HASH, as the classifier's).
#[btf_map]
static FLOOR_PENDING: HashMap<Key, Entry, TABLE> = HashMap::new();
/// New connections' and transactions' units.
#[btf_map]
static FLOOR_UNITS: LruHashMap<Key, Entry, TABLE, NO_COMMON_LRU> = LruHashMap::new();

/// The parsed headers: the 4-tuple and where the payload starts.
struct Headers {
    key: Key,
    payload: usize,
}

/// A frame's bounds.
struct Frame {
    start: usize,
    end: usize,
}

impl Frame {
    #[inline(always)]
    fn new(ctx: &XdpContext) -> Self {
        // SAFETY: ctx.ctx points at the kernel's xdp_md for the whole run.
        unsafe {
            Frame {
                start: core::ptr::read_volatile(&(*ctx.ctx).data) as usize,
                end: core::ptr::read_volatile(&(*ctx.ctx).data_end) as usize,
            }
        }
    }

    /// A pointer to `n` bytes at `offset`, if they are in the frame.
    #[inline(always)]
    fn at(&self, offset: usize, n: usize) -> Option<*const u8> {
        let p = self.start + (offset & MAX_OFFSET);
        if opaque((p + n) as u64) as usize > self.end {
            return None;
        }
        Some(p as *const u8)
    }

    /// The byte at `offset`.
    #[inline(always)]
    fn byte(&self, offset: usize) -> Option<u8> {
        // SAFETY: checked to be in the frame.
        self.at(offset, 1).map(|p| unsafe { *p })
    }

    /// The big-endian 16-bit word at `offset`.
    #[inline(always)]
    fn be16(&self, offset: usize) -> Option<u16> {
        // SAFETY: checked to be in the frame.
        self.at(offset, 2)
            .map(|p| unsafe { u16::from_be_bytes([*p, *p.add(1)]) })
    }
}

/// Hides `v` from LLVM, so a bounds check written on it stays the comparison the verifier reads.
#[inline(always)]
fn opaque(mut v: u64) -> u64 {
    // SAFETY: a register-to-itself move.
    unsafe {
        core::arch::asm!("{0} = {0}", inout(reg) v, options(nomem, nostack, preserves_flags))
    };
    v
}

/// Adds one to counter `i` and returns its value before.
#[inline(always)]
fn count(i: u32) -> u64 {
    match FLOOR_COUNTERS.get_ptr_mut(i) {
        // SAFETY: this CPU's slot.
        Some(c) => unsafe {
            let n = *c;
            *c = n + 1;
            n
        },
        None => 0,
    }
}

/// Ethernet, IPv4 without options or fragments, TCP or UDP; `None` for anything else.
#[inline(always)]
fn parse(f: &Frame) -> Option<Headers> {
    let eth = f.at(0, 34)?;
    // SAFETY: 34 bytes checked above.
    let (ethertype, ip) = unsafe {
        (
            u16::from_be_bytes([*eth.add(12), *eth.add(13)]),
            eth.add(14),
        )
    };
    if ethertype != 0x0800 {
        return None;
    }
    // SAFETY: the IPv4 header's 20 bytes are within the 34 checked.
    let (vihl, frag, proto, saddr, daddr) = unsafe {
        (
            *ip,
            u16::from_be_bytes([*ip.add(6), *ip.add(7)]),
            *ip.add(9),
            (ip.add(12) as *const u32).read_unaligned(),
            (ip.add(16) as *const u32).read_unaligned(),
        )
    };
    if vihl != 0x45 || frag & 0x3fff != 0 {
        return None;
    }
    let payload = match proto {
        IPPROTO_UDP => {
            f.at(34, 8)?;
            42
        }
        IPPROTO_TCP => {
            let doff = f.byte(46)?;
            34 + usize::from(doff >> 4) * 4
        }
        _ => return None,
    };
    Some(Headers {
        key: Key {
            saddr,
            daddr,
            sport: f.be16(34)?,
            dport: f.be16(36)?,
            proto,
            tag: 0,
            pad: [0; 2],
        },
        payload,
    })
}

/// Whether the destination is a service (the ARRAY lookup).
#[inline(always)]
fn is_service(h: &Headers) -> bool {
    service_port_index(h.key.proto, h.key.dport)
        .and_then(|i| FLOOR_PORTS.get(i))
        .is_some_and(|b| port_kind(*b).is_some())
}

/// Whether the flow (or transaction) of `key` is known; inserts it when not, so repeated runs of
/// one packet hit.
#[inline(always)]
fn known(key: &Key) -> bool {
    if FLOOR_FLOWS.get_ptr(key).is_some() {
        return true;
    }
    let _ = FLOOR_FLOWS.insert(key, Entry { words: [0; 8] }, 0);
    false
}

/// The coarse clock, a per-CPU token bucket (which always admits here), and one insert of a
/// fresh key into the unit table.
#[inline(always)]
fn admit_new(h: &Headers) -> u32 {
    match admit_fresh(h) {
        Some(_) => xdp_action::XDP_PASS,
        None => xdp_action::XDP_DROP,
    }
}

/// [`admit_new`]'s work: the fresh key inserted and its entry, or `None` when the bucket refused.
#[inline(always)]
fn admit_fresh(h: &Headers) -> Option<(Key, Entry)> {
    let now = unsafe { bpf_ktime_get_coarse_ns() };
    let bucket = FLOOR_COUNTERS.get_ptr_mut(2)?;
    // SAFETY: this CPU's slot.
    unsafe {
        if *bucket > now {
            return None;
        }
        *bucket = now - 1;
    }
    let n = count(1);
    let key = Key {
        saddr: n as u32,
        sport: (n >> 32) as u16,
        tag: unsafe { bpf_get_smp_processor_id() } as u8,
        ..h.key
    };
    let mut entry = Entry { words: [0; 8] };
    entry.words[0] = now;
    let _ = FLOOR_UNITS.insert(key, entry, 0);
    Some((key, entry))
}

/// [`admit_new`], and the pending unit of the fresh key (`BPF_NOEXIST`, as the classifier's).
#[inline(always)]
fn admit_with_unit(h: &Headers) -> u32 {
    let Some((key, entry)) = admit_fresh(h) else {
        return xdp_action::XDP_DROP;
    };
    match FLOOR_PENDING.insert(key, entry, u64::from(BPF_NOEXIST)) {
        Ok(()) => xdp_action::XDP_PASS,
        Err(_) => xdp_action::XDP_DROP,
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// Lengths of the values the keyed floors hash: the benchmark INVITE's branch, sent-by, From
/// tag, Call-ID and CSeq method.
const KEYED_VALUES: [usize; 5] = [16, 14, 14, 16, 6];

/// FNV-1a over `n` (at most 16) bytes at `offset`, read as two words.
#[inline(always)]
fn fnv(f: &Frame, offset: usize, n: usize) -> Option<u64> {
    let q = f.at(offset, 16)?;
    // SAFETY: sixteen bytes checked above.
    let words = unsafe {
        [
            (q as *const u64).read_unaligned(),
            (q.add(8) as *const u64).read_unaligned(),
        ]
    };
    let mut h = FNV_OFFSET;
    for i in 0..16 {
        if i < n {
            h ^= (words[i / 8] >> (8 * (i % 8))) & 0xff;
            h = h.wrapping_mul(FNV_PRIME);
        }
    }
    Some(h)
}

/// The transaction key the keyed floors need: the five values of [`KEYED_VALUES`] hashed from
/// the message's first bytes, then mixed byte by byte into one key, as
/// `gateway_common::sip::SipInfo::transaction_key` does.
#[inline(always)]
fn transaction_key(f: &Frame, payload: usize) -> Option<u64> {
    let mut key = FNV_OFFSET;
    let mut at = payload;
    for n in KEYED_VALUES {
        let v = fnv(f, at, n)?;
        at += n;
        for i in 0..8 {
            key ^= (v >> (8 * i)) & 0xff;
            key = key.wrapping_mul(FNV_PRIME);
        }
    }
    Some(key)
}

/// Walks a hello's extensions; returns how many, and the offset of the pre_shared_key
/// extension's (0 when none), or `None` when the record is not a hello.
#[inline(always)]
fn walk_hello(f: &Frame, payload: usize) -> Option<(u32, usize)> {
    let p = payload & 0x7f;
    if f.byte(p)? != 22 || f.byte(p + 5)? != 1 {
        return None;
    }
    let mut off = p + 43;
    off += 1 + usize::from(f.byte(off)?);
    off += 2 + usize::from(f.be16(off)?);
    off += 1 + usize::from(f.byte(off)?);
    let end = off + 2 + usize::from(f.be16(off)?);
    off += 2;
    let (mut n, mut psk) = (0, 0);
    for _ in 0..MAX_EXTENSIONS {
        if off + 4 > end {
            break;
        }
        let (Some(kind), Some(len)) = (f.be16(off), f.be16(off + 2)) else {
            break;
        };
        if kind == 41 {
            psk = off;
        }
        n += 1;
        off = (off + 4 + usize::from(len)) & 0x7ff;
    }
    Some((n, psk))
}

/// The offset of the CRLF CRLF that ends a SIP message's headers, read eight bytes at a time.
#[inline(always)]
fn sip_headers_end(f: &Frame, payload: usize) -> Option<usize> {
    const CR: u64 = 0x0d0d_0d0d_0d0d_0d0d;
    const LOW: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    for i in 0..MAX_SIP_BYTES / 8 {
        let at = payload + i * 8;
        let q = f.at(at, 8)?;
        // SAFETY: eight bytes checked above.
        let x = unsafe { (q as *const u64).read_unaligned() } ^ CR;
        // A byte of `x` is zero where the word holds a CR: its high bit set here.
        let crs = !(((x & LOW) + LOW) | x | LOW);
        if crs == 0 {
            continue;
        }
        for k in 0..8 {
            if crs & (0x80 << (8 * k)) != 0 {
                let w = f.at(at + k, 4)?;
                // SAFETY: four bytes checked above.
                if unsafe { (w as *const u32).read_unaligned() } == 0x0a0d_0a0d {
                    return Some(at + k);
                }
            }
        }
    }
    None
}

/// The steps every floor starts with: the counter, the parse and the service port's lookup.
/// `None` for a frame that is not plain IPv4 TCP or UDP to a service (over UDP alone with
/// `udp`): the floor passes it.
#[inline(always)]
fn service_packet(f: &Frame, udp: bool) -> Option<Headers> {
    count(0);
    let h = parse(f)?;
    if (udp && h.key.proto != IPPROTO_UDP) || !is_service(&h) {
        return None;
    }
    Some(h)
}

/// Whether the packet starts a connection or transaction (its 4-tuple, tagged as a new one's,
/// is in no table: a miss, as a flood's packets are).
#[inline(always)]
fn unknown(h: &mut Headers) -> bool {
    h.key.tag = 1;
    FLOOR_FLOWS.get_ptr(h.key).is_none()
}

/// The non-service floor.
#[xdp]
pub fn floor_non_service(ctx: XdpContext) -> u32 {
    match service_packet(&Frame::new(&ctx), false) {
        Some(_) => xdp_action::XDP_DROP,
        None => xdp_action::XDP_PASS,
    }
}

/// The floor of a packet of a known flow.
#[xdp]
pub fn floor_flow(ctx: XdpContext) -> u32 {
    match service_packet(&Frame::new(&ctx), false) {
        Some(h) if !known(&h.key) => xdp_action::XDP_DROP,
        _ => xdp_action::XDP_PASS,
    }
}

/// The floor of a new connection's hello.
#[xdp]
pub fn floor_new_hello(ctx: XdpContext) -> u32 {
    new_hello(&ctx, admit_new)
}

/// The new hello's floor with the pending unit.
#[xdp]
pub fn floor_new_hello_unit(ctx: XdpContext) -> u32 {
    new_hello(&ctx, admit_with_unit)
}

/// A new hello's floor, admitted by `admit`.
#[inline(always)]
fn new_hello(ctx: &XdpContext, admit: impl Fn(&Headers) -> u32) -> u32 {
    let f = Frame::new(ctx);
    let Some(mut h) = service_packet(&f, false) else {
        return xdp_action::XDP_PASS;
    };
    if !unknown(&mut h) {
        return xdp_action::XDP_PASS;
    }
    match walk_hello(&f, h.payload) {
        Some((n, _)) if n > 0 => admit(&h),
        _ => xdp_action::XDP_DROP,
    }
}

/// The floor of a resumed connection's hello: a new one's, and its PSK identity looked up.
#[xdp]
pub fn floor_resumed_hello(ctx: XdpContext) -> u32 {
    resumed_hello(&ctx, admit_new)
}

/// The resumed hello's floor with the pending unit.
#[xdp]
pub fn floor_resumed_hello_unit(ctx: XdpContext) -> u32 {
    resumed_hello(&ctx, admit_with_unit)
}

/// A resumed hello's floor, admitted by `admit`.
#[inline(always)]
fn resumed_hello(ctx: &XdpContext, admit: impl Fn(&Headers) -> u32) -> u32 {
    let f = Frame::new(ctx);
    let Some(mut h) = service_packet(&f, false) else {
        return xdp_action::XDP_PASS;
    };
    if !unknown(&mut h) {
        return xdp_action::XDP_PASS;
    }
    let Some((n, psk)) = walk_hello(&f, h.payload) else {
        return xdp_action::XDP_DROP;
    };
    // The identity: past the extension's type and length, the identities' length and its own.
    let identity = match f.at(psk + 8, 16) {
        // SAFETY: sixteen bytes checked.
        Some(q) if n > 0 && psk > 0 => unsafe { (q as *const [u8; 16]).read_unaligned() },
        _ => return xdp_action::XDP_DROP,
    };
    match FLOOR_ISSUED.get_ptr_mut(identity) {
        // SAFETY: a hash value; the benchmark runs one program at a time.
        Some(e) => unsafe { (*e).words[1] += 1 },
        None => {
            let _ = FLOOR_ISSUED.insert(identity, Entry { words: [0; 8] }, 0);
        }
    }
    admit(&h)
}

/// The floor of a SIP request's retransmission: the headers' end found, the transaction known.
#[xdp]
pub fn floor_sip_retransmission(ctx: XdpContext) -> u32 {
    sip_retransmission(&ctx, false)
}

/// The retransmission's floor with the transaction key this classifier keys its tables by.
#[xdp]
pub fn floor_sip_retransmission_keyed(ctx: XdpContext) -> u32 {
    sip_retransmission(&ctx, true)
}

/// The floor of a new SIP transaction's request.
#[xdp]
pub fn floor_new_invite(ctx: XdpContext) -> u32 {
    new_invite(&ctx, false, admit_new)
}

/// The new INVITE's floor with the transaction key and the pending unit.
#[xdp]
pub fn floor_new_invite_keyed(ctx: XdpContext) -> u32 {
    new_invite(&ctx, true, admit_with_unit)
}

/// A SIP request to a service with its headers' end found, and with `keyed` its transaction
/// key ([`transaction_key`]) in its 4-tuple's place (the same for every run of one packet);
/// `Err(action)` when the floor ends there.
#[inline(always)]
fn sip_request(f: &Frame, keyed: bool) -> Result<Headers, u32> {
    let Some(mut h) = service_packet(f, true) else {
        return Err(xdp_action::XDP_PASS);
    };
    if sip_headers_end(f, 42).is_none() {
        return Err(xdp_action::XDP_DROP);
    }
    if keyed {
        let Some(key) = transaction_key(f, 42) else {
            return Err(xdp_action::XDP_DROP);
        };
        h.key.saddr = key as u32;
        h.key.daddr = (key >> 32) as u32;
    }
    Ok(h)
}

/// A retransmission's floor: the request, its transaction known (a hit after the first run).
#[inline(always)]
fn sip_retransmission(ctx: &XdpContext, keyed: bool) -> u32 {
    match sip_request(&Frame::new(ctx), keyed) {
        Ok(h) if known(&h.key) => xdp_action::XDP_PASS,
        Ok(_) => xdp_action::XDP_DROP,
        Err(action) => action,
    }
}

/// A new request's floor: the request, its transaction unknown, admitted by `admit`.
#[inline(always)]
fn new_invite(ctx: &XdpContext, keyed: bool, admit: impl Fn(&Headers) -> u32) -> u32 {
    let mut h = match sip_request(&Frame::new(ctx), keyed) {
        Ok(h) => h,
        Err(action) => return action,
    };
    if !unknown(&mut h) {
        return xdp_action::XDP_PASS;
    }
    admit(&h)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
