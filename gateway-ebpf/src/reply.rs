//! Replies from the NIC: the client of a refused TLS connection gets a TCP reset, built in place
//! from the segment being refused and sent back out of the interface it came in on (XDP_TX), so
//! it learns at once, with no daemon involved.
//!
//! - The reset is the refused segment cut to its headers: Ethernet addresses swapped (VLAN tags
//!   kept as they are), IP addresses swapped, ports swapped, `RST|ACK` with the sequence number
//!   the client acknowledged and acknowledging all it sent. It is never longer than the segment
//!   it answers.
//! - Only plain headers are answered: IPv4 without options, IPv6 without extension headers.
//!   Anything else is dropped as before and counted as withheld.
//! - Replies are bounded by a budget per CPU (`MAX_RESETS_PER_SEC_PER_CPU`): a source address
//!   cannot be verified, so the gateway must not become a reflector.

use aya_ebpf::{helpers::generated::bpf_xdp_adjust_tail, programs::XdpContext};
use gateway_common::{
    maps::{IPPROTO_TCP, MAX_RESETS_PER_SEC_PER_CPU},
    packet::{Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN},
};

use crate::{maps::REPLY_BUDGET, sync::now_ns};

/// Replies one CPU may send in a burst above its rate.
const BURST: u64 = 64;

/// Whether this CPU's reply budget allows one more reply now (and spends it).
#[inline(always)]
pub fn budget() -> bool {
    let Some(next) = REPLY_BUDGET.get_ptr_mut(0) else {
        return false;
    };
    let interval = 1_000_000_000 / MAX_RESETS_PER_SEC_PER_CPU;
    let now = now_ns();
    // SAFETY: a per-CPU slot, only this CPU touches it while the program runs.
    unsafe {
        let at = if *next < now { now } else { *next };
        if at - now > BURST * interval {
            return false;
        }
        *next = at + interval;
    }
    true
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

/// Turns the refused segment `pkt` of `ctx` into a reset to its sender. `false` (and the frame
/// left as it is, or cut short: the caller drops it either way) when the frame is not one this
/// answers or the bounds do not hold.
#[inline(always)]
pub fn reset_xdp(ctx: &XdpContext, pkt: &Packet) -> bool {
    let t = &pkt.transport;
    let v4 = pkt.ip_version == 4;
    let l3 = pkt.l3_offset as usize;
    let ip_len = if v4 { 20 } else { 40 };
    if t.proto != IPPROTO_TCP
        || t.tcp_flags & TCP_RST != 0
        || (v4 && pkt.ipv4_options)
        || t.l4_offset as usize != l3 + ip_len
        || l3 > 30
    {
        return false;
    }
    let new_len = l3 + ip_len + 20;
    let old_len = ctx.data_end() - ctx.data();
    if old_len < new_len {
        return false;
    }
    // What the client sent: its payload, and SYN or FIN, each count one.
    let mut sent = u32::from(pkt.payload_len());
    if t.tcp_flags & TCP_SYN != 0 {
        sent += 1;
    }
    if t.tcp_flags & TCP_FIN != 0 {
        sent += 1;
    }
    let (seq, ack) = (t.ack, t.seq.wrapping_add(sent));
    let cut = (old_len - new_len) as i32;
    // SAFETY: shrinking the frame by what lies past the headers kept.
    if cut > 0 && unsafe { bpf_xdp_adjust_tail(ctx.ctx, -cut) } != 0 {
        return false;
    }
    // The frame moved or shrank: bounds again, on a masked offset the verifier can follow.
    let l3 = l3 & 0x1f;
    let data = ctx.data();
    if data + 12 > ctx.data_end() {
        return false;
    }
    let p = data as *mut u8;
    // SAFETY: the MACs are within the 12 bytes checked above, the headers within the bounds each
    // branch checks.
    unsafe {
        swap(p, p.add(6), 6);
        let ip = p.add(l3);
        let tcp;
        let pseudo;
        if v4 {
            if data + l3 + 40 > ctx.data_end() {
                return false;
            }
            swap(ip.add(12), ip.add(16), 4);
            *ip.add(2) = 0;
            *ip.add(3) = 40;
            *ip.add(4) = 0;
            *ip.add(5) = 0;
            *ip.add(6) = 0x40; // DF
            *ip.add(7) = 0;
            *ip.add(8) = 64;
            *ip.add(10) = 0;
            *ip.add(11) = 0;
            let c = fold(sum16(ip, 20)).to_be_bytes();
            *ip.add(10) = c[0];
            *ip.add(11) = c[1];
            tcp = ip.add(20);
            pseudo = sum16(ip.add(12), 8);
        } else {
            if data + l3 + 60 > ctx.data_end() {
                return false;
            }
            swap(ip.add(8), ip.add(24), 16);
            *ip.add(4) = 0;
            *ip.add(5) = 20;
            *ip.add(7) = 64;
            tcp = ip.add(40);
            pseudo = sum16(ip.add(8), 32);
        }
        swap(tcp, tcp.add(2), 2);
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
        let c = fold(pseudo + u64::from(IPPROTO_TCP) + 20 + sum16(tcp, 20)).to_be_bytes();
        *tcp.add(16) = c[0];
        *tcp.add(17) = c[1];
    }
    true
}
