//! Replies from the NIC: a refused packet is answered in its protocol's words, built in place
//! from the packet being refused and sent back out of the interface it came in on, with no
//! daemon involved.
//!
//! - **TCP**: the client gets a reset (`RST|ACK`, with the sequence number it acknowledged and
//!   acknowledging all it sent). Where the hook can send a copy (TC), the same frame then becomes
//!   a reset for the server's socket (sequence number: the refused segment's own) handed to the
//!   local stack, so both ends die at once.
//! - **SIP over UDP**: a `503 Service Unavailable` built from the request
//!   (`gateway_common::sip::reply`).
//! - Ethernet addresses are swapped (VLAN tags kept as they are), IP addresses swapped, lengths,
//!   TTL and checksums set. A reply is never longer than the packet it answers (no
//!   amplification), and carries plain headers only: a TCP segment's IPv4 options or IPv6
//!   extension headers are taken out of the frame first ([`make_plain`]); a SIP request with
//!   them is not answered (dropped and counted as withheld).
//! - Whether a refusal is answered at all, and how often, is the class's policy
//!   (`crate::admission::answer`: a reply rate per class), decided before the jump here.

use gateway_common::{
    maps::{FINISHER_ATTACHED, FINISHER_SENDS_REPLIES, IPPROTO_TCP, IPPROTO_UDP},
    packet::{Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
};

use crate::{
    bytes::opaque,
    context::{Action, CopyOut, Handover, MAX_EXTRA, MAX_KEEP, Rewrite},
    maps::{count, finisher},
};

/// A reply's payload, built elsewhere (a SIP 503: `crate::sip::compose_reply`): its bytes, its
/// length and their one's-complement sum.
#[derive(Clone, Copy)]
pub struct Payload {
    /// The bytes (a per-CPU buffer of at least 2048 bytes).
    pub bytes: *const u8,
    /// How many.
    pub len: u32,
    /// Their sum of big-endian 16-bit words.
    pub sum: u64,
}

/// Sum of the big-endian 16-bit words of `n` bytes at `p` (n even).
///
/// # Safety
/// `p .. p + n` must be inside the packet (checked by the caller).
#[inline(always)]
unsafe fn sum16(p: *const u8, n: usize) -> u64 {
    let mut sum = 0u64;
    let mut i = 0;
    while i < n {
        // SAFETY: within the caller's bounds.
        sum += u64::from(unsafe { u16::from_be_bytes([*p.add(i), *p.add(i + 1)]) });
        i += 2;
    }
    sum
}

/// One's-complement fold of a sum into a checksum.
#[inline(always)]
fn fold(mut sum: u64) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    !(sum as u16)
}

/// Writes `v` big-endian at `p`.
///
/// # Safety
/// Two bytes at `p` inside the packet.
#[inline(always)]
unsafe fn put16(p: *mut u8, v: u16) {
    let b = v.to_be_bytes();
    // SAFETY: the caller's bounds.
    unsafe {
        *p = b[0];
        *p.add(1) = b[1];
    }
}

/// Swaps `n` bytes at `a` with those at `b`.
///
/// # Safety
/// Both ranges inside the packet and not overlapping.
#[inline(always)]
unsafe fn swap(a: *mut u8, b: *mut u8, n: usize) {
    for i in 0..n {
        // SAFETY: within the caller's bounds.
        unsafe { core::ptr::swap(a.add(i), b.add(i)) };
    }
}

/// Where a reply's headers are: the IP header at `l3` (masked for the verifier), IPv4 or IPv6.
#[derive(Clone, Copy)]
struct Headers {
    l3: usize,
    v4: bool,
}

impl Headers {
    /// The headers of `pkt` when they are plain enough to answer for `proto`: no IPv4 options, no
    /// IPv6 extension headers, at most two VLAN tags.
    #[inline(always)]
    fn of(pkt: &Packet, proto: u8) -> Option<Self> {
        let v4 = pkt.ip_version == 4;
        let l3 = pkt.l3_offset as usize;
        let ip_len = if v4 { 20 } else { 40 };
        if pkt.transport.proto != proto
            || (v4 && pkt.ipv4_options)
            || pkt.transport.l4_offset as usize != l3 + ip_len
            || l3 > 30
        {
            return None;
        }
        Some(Headers { l3, v4 })
    }

    /// Bytes of the IP header.
    #[inline(always)]
    fn ip_len(self) -> usize {
        if self.v4 { 20 } else { 40 }
    }

    /// Offset of the transport header.
    #[inline(always)]
    fn l4(self) -> usize {
        (self.l3 & 0x1f) + self.ip_len()
    }

    /// Sets the frame's link and IP headers for a transport segment of `l4_len` bytes of
    /// protocol `proto`, turned around (going back to the sender) when `turn`; returns the
    /// transport header and its pseudo-header sum. `None` when the frame is shorter than the
    /// headers.
    #[inline(always)]
    fn rewrite<R: Rewrite>(
        self,
        ctx: &R,
        l4_len: u16,
        proto: u8,
        turn: bool,
    ) -> Option<(*mut u8, u64)> {
        // A masked offset the verifier can follow, and bounds checked from the IP header with
        // constant lengths per branch (headers plus 20 transport bytes, the most this module
        // writes directly).
        let l3 = self.l3 & 0x1f;
        let (data, end) = ctx.writable(l3 + self.ip_len() + 20)?;
        if data + 12 > end {
            return None;
        }
        let p = data as *mut u8;
        // SAFETY: the MACs are within the 12 bytes checked above, the headers within the bounds
        // each branch checks.
        unsafe {
            if turn {
                swap(p, p.add(6), 6);
            }
            let ip = p.add(l3);
            if self.v4 {
                if data + l3 + 40 > end {
                    return None;
                }
                if turn {
                    swap(ip.add(12), ip.add(16), 4);
                }
                put16(ip.add(2), 20 + l4_len);
                put16(ip.add(4), 0); // id
                put16(ip.add(6), 0x4000); // DF
                *ip.add(8) = 64;
                put16(ip.add(10), 0);
                put16(ip.add(10), fold(sum16(ip, 20)));
                Some((
                    ip.add(20),
                    sum16(ip.add(12), 8) + u64::from(proto) + u64::from(l4_len),
                ))
            } else {
                if data + l3 + 60 > end {
                    return None;
                }
                if turn {
                    swap(ip.add(8), ip.add(24), 16);
                }
                put16(ip.add(4), l4_len);
                *ip.add(7) = 64;
                Some((
                    ip.add(40),
                    sum16(ip.add(8), 32) + u64::from(proto) + u64::from(l4_len),
                ))
            }
        }
    }
}

/// Writes a bare TCP reset header at `tcp` (ports swapped from what is there when `turn`) with
/// `seq` and `ack`, and its checksum over `pseudo`.
///
/// # Safety
/// 20 bytes at `tcp` inside the packet.
#[inline(always)]
unsafe fn write_reset(tcp: *mut u8, pseudo: u64, seq: u32, ack: u32, turn: bool) {
    // SAFETY: the caller's bounds.
    unsafe {
        if turn {
            swap(tcp, tcp.add(2), 2);
        }
        let s = seq.to_be_bytes();
        let a = ack.to_be_bytes();
        for i in 0..4 {
            *tcp.add(4 + i) = s[i];
            *tcp.add(8 + i) = a[i];
        }
        *tcp.add(12) = 5 << 4;
        *tcp.add(13) = TCP_RST | TCP_ACK;
        for i in 14..20 {
            *tcp.add(i) = 0;
        }
        put16(tcp.add(16), fold(pseudo + sum16(tcp, 20)));
    }
}

/// Answers the refused TCP segment `pkt` with a reset to its sender, and the server's socket
/// with one too where the hook can:
///
/// - TC sends the client's reset as a copy, then turns the frame back into the server's reset
///   (sequence number: the refused segment's own, the one the server expects next; RFC 5961
///   accepts no other) and hands it to the local stack ([`Action::Pass`]);
/// - XDP with the finishing program attached (`DatapathConfig::finisher`) turns the segment into
///   the server's reset in place and hands it over with the client's acknowledgement number in
///   metadata ([`Action::Pass`]; [`finish`] sends the client's reset);
/// - XDP alone resets the client ([`Action::Tx`]) and leaves the server's socket to the daemon.
///
/// `None` when the segment is not one this answers, or the frame could not be rewritten (the
/// caller drops it).
#[inline(always)]
pub fn reset<R: Rewrite>(ctx: &R, pkt: &Packet, frame_len: usize) -> Option<Action> {
    let t = &pkt.transport;
    if t.tcp_flags & TCP_RST != 0 {
        return None;
    }
    let h = Headers::of(pkt, IPPROTO_TCP)?;
    let new_len = h.l4() + 20;
    if frame_len < new_len {
        return None;
    }
    // What the client sent: its payload, and SYN or FIN, each count one.
    let mut sent = u32::from(pkt.payload_len());
    if t.tcp_flags & TCP_SYN != 0 {
        sent += 1;
    }
    if t.tcp_flags & TCP_FIN != 0 {
        sent += 1;
    }
    let (seq, ack) = (t.seq, t.ack);
    let client_ack = seq.wrapping_add(sent);
    if !ctx.truncate(new_len) {
        return None;
    }
    if !R::SENDS_COPIES && finisher_attached() && ctx.hand_over(Handover::Reset, client_ack) {
        let (tcp, pseudo) = h.rewrite(ctx, 20, IPPROTO_TCP, false)?;
        // SAFETY: rewrite checked 20 transport bytes.
        unsafe { write_reset(tcp, pseudo, seq, ack, false) };
        return Some(Action::Pass);
    }
    let (tcp, pseudo) = h.rewrite(ctx, 20, IPPROTO_TCP, true)?;
    // SAFETY: as above.
    unsafe { write_reset(tcp, pseudo, ack, client_ack, true) };
    if !R::SENDS_COPIES {
        return Some(Action::Tx);
    }
    if !ctx.send_copy() {
        return None;
    }
    let (tcp, pseudo) = h.rewrite(ctx, 20, IPPROTO_TCP, true)?;
    // SAFETY: as above.
    unsafe { write_reset(tcp, pseudo, seq, ack, true) };
    Some(Action::Pass)
}

/// Makes the headers of the TCP segment `pkt` (of a frame of `len` bytes) plain, so that they
/// can be answered: IPv4 options or IPv6 extension headers taken out of the frame
/// ([`Rewrite::remove_after`]), the IP header's length (and IPv4's header length and checksum,
/// IPv6's next header) set to match, and `pkt` and `len` moved to the new frame. A SYN with
/// options (any client may set them, `IP_OPTIONS`) is then answered from the NIC like any
/// other, and so is a refused segment with its reset: an answer carries no options of the
/// client's. False when the frame was changed and could not be finished (the caller drops it);
/// true otherwise, changed or not (not for a segment already plain, a fragment, or headers
/// past the bounds).
#[inline(always)]
pub fn make_plain<R: Rewrite + CopyOut>(ctx: &R, pkt: &mut Packet, len: &mut usize) -> bool {
    let v4 = pkt.ip_version == 4;
    let l3 = u32::from(pkt.l3_offset);
    let base: u32 = if v4 { 20 } else { 40 };
    let l4 = u32::from(pkt.transport.l4_offset);
    if pkt.transport.proto != IPPROTO_TCP || pkt.fragmented || l4 <= l3 + base || l3 > 30 {
        return true;
    }
    let extra = l4 - l3 - base;
    if extra > MAX_EXTRA || l3 + base > MAX_KEEP || !ctx.remove_after(l3 + base, extra) {
        return true;
    }
    let mut ip = [0u8; 40];
    let n = opaque(u64::from(base));
    if n != 20 && n != 40 || !ctx.copy_out(l3, ip.as_mut_ptr(), n) {
        return false;
    }
    let extra16 = extra as u16;
    if v4 {
        ip[0] = 0x45;
        let total = u16::from_be_bytes([ip[2], ip[3]]).wrapping_sub(extra16);
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        ip[10] = 0;
        ip[11] = 0;
        // SAFETY: 20 bytes of the buffer.
        let sum = fold(unsafe { sum16(ip.as_ptr(), 20) });
        ip[10..12].copy_from_slice(&sum.to_be_bytes());
    } else {
        ip[6] = IPPROTO_TCP;
        let payload = u16::from_be_bytes([ip[4], ip[5]]).wrapping_sub(extra16);
        ip[4..6].copy_from_slice(&payload.to_be_bytes());
    }
    if !ctx.store(l3, ip.as_ptr(), n as u32) {
        return false;
    }
    pkt.ipv4_options = false;
    pkt.ip_end = pkt.ip_end.wrapping_sub(extra16);
    pkt.transport.l4_offset -= extra16;
    pkt.transport.payload_offset = pkt.transport.payload_offset.wrapping_sub(extra16);
    *len = len.saturating_sub(extra as usize);
    count(|c| c.ip_options_removed += 1);
    true
}

/// Whether the reply program answers the TCP segment `pkt`: plain headers, or ones
/// [`make_plain`] makes plain.
#[inline(always)]
pub fn answerable(pkt: &Packet) -> bool {
    let base = if pkt.ip_version == 4 { 20 } else { 40 };
    let (l3, l4) = (u32::from(pkt.l3_offset), u32::from(pkt.transport.l4_offset));
    pkt.transport.proto == IPPROTO_TCP
        && !pkt.fragmented
        && l3 <= 30
        && l4 >= l3 + base
        && l4 - l3 - base <= MAX_EXTRA
}

/// Answers the TCP segment `pkt` with a segment of the NIC's own back to its sender: `seq`,
/// `ack`, `flags` and `window`, with the first `opts_len` bytes of `opts` (a multiple of four, at
/// most 24; the rest zero) as its options and no payload. The frame is cut or grown to fit. The
/// SYN-ACK of a SYN cookie, and the acknowledgement of a held hello's later segment
/// (`crate::tcp::cookie`). `None` when the headers are not ones this answers, or the frame could
/// not be rewritten.
#[inline(always)]
pub fn answer_tcp<R: Rewrite>(
    ctx: &R,
    pkt: &Packet,
    (seq, ack, flags, window): (u32, u32, u8, u16),
    opts: &[u8; 24],
    opts_len: usize,
) -> Option<Action> {
    let h = Headers::of(pkt, IPPROTO_TCP)?;
    let n = opts_len & 0x3c;
    if n != opts_len || n > 24 {
        return None;
    }
    let tcp_len = 20 + n;
    if !ctx.resize(h.l4() + tcp_len)
        || (n > 0 && !ctx.store((h.l4() + 20) as u32, opts.as_ptr(), n as u32))
    {
        return None;
    }
    let (tcp, pseudo) = h.rewrite(ctx, tcp_len as u16, IPPROTO_TCP, true)?;
    // SAFETY: rewrite checked 20 transport bytes; the options were stored above, and are summed
    // from their copy (zero past `n`, so the whole copy sums to theirs).
    unsafe {
        swap(tcp, tcp.add(2), 2);
        let s = seq.to_be_bytes();
        let a = ack.to_be_bytes();
        for i in 0..4 {
            *tcp.add(4 + i) = s[i];
            *tcp.add(8 + i) = a[i];
        }
        *tcp.add(12) = ((tcp_len / 4) as u8) << 4;
        *tcp.add(13) = flags;
        put16(tcp.add(14), window);
        put16(tcp.add(16), 0);
        put16(tcp.add(18), 0);
        put16(
            tcp.add(16),
            fold(pseudo + sum16(tcp, 20) + sum16(opts.as_ptr(), 24)),
        );
    }
    if !R::SENDS_COPIES && finisher_sends_replies() {
        return ctx.hand_over(Handover::SendOut, 0).then_some(Action::Pass);
    }
    Some(Action::Tx)
}

/// Turns the frame of the TCP segment `pkt`, its payload replaced by `payload_len` bytes already
/// in place after its header (their sum `payload_sum`, as big-endian words), into a segment
/// from `seq` for the local stack: its IP length and checksum, sequence number and TCP checksum
/// set, its addresses, ports and options kept (`opts`: a copy of its options, zero past them to
/// 40 bytes). The joined segment of a held hello (`crate::tcp::held`). `false` when the
/// headers are not ones this rewrites or the frame is shorter than them.
#[inline(always)]
pub fn resegment<R: Rewrite>(
    ctx: &R,
    pkt: &Packet,
    seq: u32,
    payload_len: u16,
    payload_sum: u64,
    opts: &[u8; 40],
) -> bool {
    let Some(h) = Headers::of(pkt, IPPROTO_TCP) else {
        return false;
    };
    let t = &pkt.transport;
    let header = t.payload_offset.saturating_sub(t.l4_offset);
    if !(20..=60).contains(&header) {
        return false;
    }
    let Some((tcp, pseudo)) = h.rewrite(ctx, header + payload_len, IPPROTO_TCP, false) else {
        return false;
    };
    // SAFETY: rewrite checked 20 transport bytes; the options are summed from their copy.
    unsafe {
        for (i, b) in seq.to_be_bytes().into_iter().enumerate() {
            *tcp.add(4 + i) = b;
        }
        put16(tcp.add(16), 0);
        put16(
            tcp.add(16),
            fold(pseudo + sum16(tcp, 20) + sum16(opts.as_ptr(), 40) + payload_sum),
        );
    }
    true
}

/// Whether the finishing program is attached at this XDP attachment's TC ingress.
#[inline(always)]
fn finisher_attached() -> bool {
    finisher(FINISHER_ATTACHED)
}

/// Whether the XDP reply program hands its replies to the finishing program to send
/// (`FINISHER_SENDS_REPLIES`: a device whose XDP_TX may not deliver).
#[inline(always)]
fn finisher_sends_replies() -> bool {
    finisher(FINISHER_SENDS_REPLIES)
}

/// The finishing program's body (TC ingress of an XDP attachment): a frame the XDP reply program
/// handed over (`pkt`, the server's reset, with the client's acknowledgement number
/// `client_ack`) is sent to the client as its reset (a copy), then turned back and passed on to
/// the stack as the server's. `false` when the copy could not be made (the server's reset is
/// passed on all the same).
#[inline(always)]
pub fn finish<R: Rewrite>(ctx: &R, pkt: &Packet, client_ack: u32) -> bool {
    let Some(h) = Headers::of(pkt, IPPROTO_TCP) else {
        return false;
    };
    let (seq, ack) = (pkt.transport.seq, pkt.transport.ack);
    let Some((tcp, pseudo)) = h.rewrite(ctx, 20, IPPROTO_TCP, true) else {
        return false;
    };
    // SAFETY: rewrite checked 20 transport bytes.
    unsafe { write_reset(tcp, pseudo, ack, client_ack, true) };
    let sent = ctx.send_copy();
    if let Some((tcp, pseudo)) = h.rewrite(ctx, 20, IPPROTO_TCP, true) {
        // SAFETY: as above.
        unsafe { write_reset(tcp, pseudo, seq, ack, true) };
    }
    sent
}

/// Answers the refused SIP request `pkt` with the 503 `compose` makes (the one the SIP program
/// prepared for it, composed only once the headers are known to be answerable) to its sender
/// ([`Action::Tx`]). `None` when the request is not one this answers, or the reply would be
/// longer than the request.
#[inline(always)]
pub fn sip_503<R: Rewrite>(
    ctx: &R,
    pkt: &Packet,
    frame_len: usize,
    compose: impl FnOnce() -> Option<Payload>,
) -> Option<Action> {
    let h = Headers::of(pkt, IPPROTO_UDP)?;
    let Payload {
        bytes: out,
        len,
        sum,
    } = compose()?;
    let new_len = h.l4() + 8 + len as usize;
    // Never more bytes than the request had.
    if new_len > frame_len {
        return None;
    }
    if !ctx.truncate(new_len) {
        return None;
    }
    // A length the verifier can bound: 1..=2047, within the 2048-byte reply buffer.
    let n = len & 0x7ff;
    if n == 0 || !ctx.store((h.l4() + 8) as u32, out, n) {
        return None;
    }
    let udp_len = 8 + n as u16;
    let (udp, pseudo) = h.rewrite(ctx, udp_len, IPPROTO_UDP, true)?;
    // SAFETY: rewrite checked 20 transport bytes, of which the UDP header is 8.
    unsafe {
        swap(udp, udp.add(2), 2);
        put16(udp.add(4), udp_len);
        put16(udp.add(6), 0);
        let c = fold(pseudo + sum16(udp, 8) + sum);
        // A computed zero is sent as all ones (zero means "no checksum", which IPv6 forbids).
        put16(udp.add(6), if c == 0 { 0xffff } else { c });
    }
    // Where XDP_TX may not deliver, the finishing program sends it (the frame goes up as far
    // as TC ingress, and out from there).
    if !R::SENDS_COPIES && finisher_sends_replies() {
        return ctx.hand_over(Handover::SendOut, 0).then_some(Action::Pass);
    }
    Some(Action::Tx)
}
