//! Whether the kernel has a segment's connection: the socket lookup on its 4-tuple, the key
//! it is known by here ([`flow_key`]) and the tuple the lookup takes ([`fill_tuple`]).

use gateway_common::{
    bytes::PacketBytes,
    maps::{CONFIG_TRUST_UNCONNECTED, FlowKey},
    packet::Packet,
};

use super::TcpScratch;
use crate::{
    bytes::zero,
    context::{ConnectionLookup, CookieAck, Wanted},
    maps::setting,
};

/// Whether the datapath config says to trust that segments have connections (test fixtures
/// only: synthetic frames have no socket behind them).
#[inline(always)]
pub fn trusting() -> bool {
    setting(CONFIG_TRUST_UNCONNECTED)
}

/// Whether the kernel has what `wanted` asks for on the 4-tuple of `s.key` (the segment
/// `pkt`'s, client to server): for a connection, one it holds or one it makes from this very
/// segment (an acknowledgement carrying a valid SYN cookie, when the listener sends cookies).
/// Always, when [`trusting`].
#[inline(always)]
pub fn kernel_has<C: ConnectionLookup, B: PacketBytes>(
    ctx: &C,
    b: &B,
    pkt: &Packet,
    s: &mut TcpScratch,
    wanted: Wanted,
) -> bool {
    trusting() || lookup(ctx, Some((b, pkt)), s, pkt.ip_version == 4, wanted)
}

/// Whether the kernel still holds a live connection (not one in TIME_WAIT or closed) on the
/// 4-tuple of `s.key`. Never, when [`trusting`] (a fixture's reused port is a new connection).
#[inline(always)]
pub fn kernel_has_live_connection<C: ConnectionLookup, B: PacketBytes>(
    ctx: &C,
    s: &mut TcpScratch,
    v4: bool,
) -> bool {
    !trusting() && lookup::<C, B>(ctx, None, s, v4, Wanted::Connection)
}

/// The socket lookup; with `segment`, the headers it copies for the SYN-cookie check.
#[inline(always)]
fn lookup<C: ConnectionLookup, B: PacketBytes>(
    ctx: &C,
    segment: Option<(&B, &Packet)>,
    s: &mut TcpScratch,
    v4: bool,
    wanted: Wanted,
) -> bool {
    let size = fill_tuple(&s.key, &mut s.tuple, v4);
    let tuple = s.tuple.as_mut_ptr();
    let ack = CookieAck {
        iph: s.iph.as_mut_ptr(),
        th: s.th.as_mut_ptr(),
    };
    let (iph, th) = (&mut s.iph, &mut s.th);
    ctx.has(tuple, size, wanted, ack, || {
        segment.map_or(0, |(b, pkt)| cookie_headers(b, pkt, iph, th, v4))
    })
}

/// Copies the IP and TCP headers of the segment (`b`, `pkt`) for the SYN-cookie check into
/// `iph` and `th`; the IP header's length, 0 when they cannot be read.
#[inline(always)]
fn cookie_headers<B: PacketBytes>(
    b: &B,
    pkt: &Packet,
    iph: &mut [u8; 40],
    th: &mut [u8; 20],
    v4: bool,
) -> u32 {
    let l3 = pkt.l3_offset as usize;
    let l4 = pkt.transport.l4_offset as usize;
    let iph_len = if v4 {
        let Ok(h) = <&mut [u8; 20]>::try_from(&mut iph[..20]) else {
            return 0;
        };
        if !b.read(l3, h) {
            return 0;
        }
        20
    } else if b.read(l3, iph) {
        40
    } else {
        return 0;
    };
    if b.read(l4, th) { iph_len } else { 0 }
}

/// Writes the socket lookup's tuple (`bpf_sock_tuple`, the packet's direction) of the
/// connection `k` into `t`; its size.
#[inline(always)]
pub fn fill_tuple(k: &FlowKey, t: &mut [u8; 40], v4: bool) -> u32 {
    if v4 {
        t[0..4].copy_from_slice(&k.saddr[12..16]);
        t[4..8].copy_from_slice(&k.daddr[12..16]);
        t[8..10].copy_from_slice(&k.sport.to_be_bytes());
        t[10..12].copy_from_slice(&k.dport.to_be_bytes());
        12
    } else {
        t[0..16].copy_from_slice(&k.saddr);
        t[16..32].copy_from_slice(&k.daddr);
        t[32..34].copy_from_slice(&k.sport.to_be_bytes());
        t[34..36].copy_from_slice(&k.dport.to_be_bytes());
        36
    }
}

/// Writes the connection's key, client first, into `key`: the packet's source is the client
/// unless `from_server`.
#[inline(always)]
pub fn flow_key<B: PacketBytes>(b: &B, pkt: &Packet, key: &mut FlowKey, from_server: bool) -> bool {
    let (src, dst) = (pkt.transport.src_port, pkt.transport.dst_port);
    // SAFETY: a FlowKey of integers, aligned.
    unsafe { zero(key) };
    key.sport = if from_server { dst } else { src };
    key.dport = if from_server { src } else { dst };
    let (client, server) = if from_server {
        (&mut key.daddr, &mut key.saddr)
    } else {
        (&mut key.saddr, &mut key.daddr)
    };
    let l3 = pkt.l3_offset as usize;
    if pkt.ip_version == 4 {
        let mut a = [0u8; 8];
        if !b.read(l3 + 12, &mut a) {
            return false;
        }
        client[10] = 0xff;
        client[11] = 0xff;
        server[10] = 0xff;
        server[11] = 0xff;
        client[12..16].copy_from_slice(&a[..4]);
        server[12..16].copy_from_slice(&a[4..]);
        true
    } else {
        b.read(l3 + 8, client) && b.read(l3 + 24, server)
    }
}
