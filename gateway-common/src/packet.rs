//! Bounded Ethernet / VLAN / IPv4 / IPv6 / TCP / UDP header parsing.
//!
//! The parser never reads beyond [`crate::bytes::MAX_READ_OFFSET`], follows at most
//! [`MAX_VLAN_TAGS`] VLAN tags and [`MAX_IPV6_EXT_HEADERS`] IPv6 extension headers, and refuses to
//! look for a transport header past [`MAX_L4_OFFSET`]. Anything it cannot follow within those
//! bounds is reported as [`Outcome::Unparseable`], never guessed at: the caller decides by policy
//! what to do with it, and it is never counted as a protected class.

use crate::bytes::PacketBytes;

/// Length of an Ethernet header without VLAN tags.
pub const ETH_HLEN: usize = 14;
/// VLAN tags (802.1Q or 802.1ad) followed before giving up.
pub const MAX_VLAN_TAGS: usize = 2;
/// IPv6 extension headers followed before giving up.
pub const MAX_IPV6_EXT_HEADERS: usize = 6;
/// The transport header must start at or before this offset.
pub const MAX_L4_OFFSET: usize = 512;

const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88a8;

const IPV6_HOP_BY_HOP: u8 = 0;
const IPV6_ROUTING: u8 = 43;
const IPV6_FRAGMENT: u8 = 44;
const IPV6_ESP: u8 = 50;
const IPV6_AH: u8 = 51;
const IPV6_NO_NEXT: u8 = 59;
const IPV6_DEST_OPTS: u8 = 60;

const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;

/// IP version of a parsed packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IpVersion {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// The transport header of a TCP or UDP packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transport {
    /// `6` (TCP) or `17` (UDP).
    pub proto: u8,
    /// Source port, host order.
    pub src_port: u16,
    /// Destination port, host order.
    pub dst_port: u16,
    /// Offset of the transport payload from the start of the frame.
    pub payload_offset: u16,
    /// TCP flags byte (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10); zero for UDP.
    pub tcp_flags: u8,
}

/// What the parser found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Not IPv4 or IPv6.
    NotIp,
    /// The frame ends inside the header that starts at `offset`.
    Truncated {
        /// Offset of the header that was cut short.
        offset: u16,
    },
    /// The header at `offset` has an impossible field.
    Malformed {
        /// Offset of the offending header.
        offset: u16,
    },
    /// An IPv4 or IPv6 fragment; ports are not looked at.
    Fragment,
    /// Headers that cannot be followed within the parser's bounds, starting at `offset`.
    Unparseable {
        /// Offset of the header the parser gave up on.
        offset: u16,
    },
    /// An IP packet that is neither TCP nor UDP.
    OtherL4 {
        /// The IP protocol (or IPv6 next header) number.
        proto: u8,
    },
    /// A TCP or UDP packet.
    Transport(Transport),
}

/// Result of parsing one frame: what was found plus facts the counters record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Packet {
    /// Number of VLAN tags in front of the network header.
    pub vlan_tags: u8,
    /// IP version, when the frame carries IP.
    pub ip: Option<IpVersion>,
    /// Whether an IPv4 header carries options.
    pub ipv4_options: bool,
    /// What the parser found.
    pub outcome: Outcome,
}

/// Parses the headers of an Ethernet frame.
#[inline(always)]
pub fn parse<B: PacketBytes>(b: &B) -> Packet {
    let mut pkt = Packet {
        vlan_tags: 0,
        ip: None,
        ipv4_options: false,
        outcome: Outcome::NotIp,
    };
    let mut off = ETH_HLEN - 2;
    let mut et = [0u8; 2];
    if !b.read(off, &mut et) {
        pkt.outcome = truncated(0);
        return pkt;
    }
    let mut ethertype = u16::from_be_bytes(et);
    for _ in 0..MAX_VLAN_TAGS {
        if ethertype != ETH_P_8021Q && ethertype != ETH_P_8021AD {
            break;
        }
        // A tag is 2 bytes of TCI followed by the next ethertype.
        off += 4;
        if !b.read(off, &mut et) {
            pkt.outcome = truncated(off - 2);
            return pkt;
        }
        ethertype = u16::from_be_bytes(et);
        pkt.vlan_tags += 1;
    }
    let l3 = off + 2;
    pkt.outcome = match ethertype {
        ETH_P_8021Q | ETH_P_8021AD => Outcome::Unparseable { offset: l3 as u16 },
        ETH_P_IP => {
            pkt.ip = Some(IpVersion::V4);
            parse_ipv4(b, l3, &mut pkt.ipv4_options)
        }
        ETH_P_IPV6 => {
            pkt.ip = Some(IpVersion::V6);
            parse_ipv6(b, l3)
        }
        _ => Outcome::NotIp,
    };
    pkt
}

/// Whether the two bytes at `offset` are in the frame. Variable offsets are always checked with a
/// two-byte read, the smallest the verifier reliably tracks.
#[inline(always)]
fn present<B: PacketBytes>(b: &B, offset: usize) -> bool {
    let mut two = [0u8; 2];
    b.read(offset, &mut two)
}

#[inline(always)]
const fn truncated(offset: usize) -> Outcome {
    Outcome::Truncated {
        offset: offset as u16,
    }
}

#[inline(always)]
fn parse_ipv4<B: PacketBytes>(b: &B, off: usize, has_options: &mut bool) -> Outcome {
    let mut h = [0u8; 20];
    if !b.read(off, &mut h) {
        return truncated(off);
    }
    if h[0] >> 4 != 4 {
        return Outcome::Malformed { offset: off as u16 };
    }
    let hlen = ((h[0] & 0x0f) as usize) * 4;
    let total_len = u16::from_be_bytes([h[2], h[3]]) as usize;
    if hlen < 20 || total_len < hlen {
        return Outcome::Malformed { offset: off as u16 };
    }
    if hlen > 20 {
        *has_options = true;
        // The options must be present: read the header's last two bytes.
        if !present(b, off + hlen - 2) {
            return truncated(off);
        }
    }
    let frag = u16::from_be_bytes([h[6], h[7]]);
    // More-fragments flag or a non-zero fragment offset.
    if frag & 0x3fff != 0 {
        return Outcome::Fragment;
    }
    parse_transport(b, h[9], off + hlen)
}

#[inline(always)]
fn parse_ipv6<B: PacketBytes>(b: &B, off: usize) -> Outcome {
    let mut h = [0u8; 8];
    if !b.read(off, &mut h) {
        return truncated(off);
    }
    if h[0] >> 4 != 6 {
        return Outcome::Malformed { offset: off as u16 };
    }
    // The addresses must be there too.
    if !present(b, off + 38) {
        return truncated(off);
    }
    let mut next = h[6];
    let mut off = off + 40;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        let len = match next {
            IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTS | IPV6_AH => {
                if off > MAX_L4_OFFSET {
                    return Outcome::Unparseable { offset: off as u16 };
                }
                let mut e = [0u8; 2];
                if !b.read(off, &mut e) {
                    return truncated(off);
                }
                let len = if next == IPV6_AH {
                    (e[1] as usize + 2) * 4
                } else {
                    (e[1] as usize + 1) * 8
                };
                next = e[0];
                len
            }
            IPV6_FRAGMENT => return Outcome::Fragment,
            IPV6_ESP => return Outcome::Unparseable { offset: off as u16 },
            _ => break,
        };
        off += len;
    }
    match next {
        IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTS | IPV6_AH | IPV6_FRAGMENT | IPV6_ESP => {
            Outcome::Unparseable { offset: off as u16 }
        }
        IPV6_NO_NEXT => Outcome::OtherL4 { proto: next },
        _ => parse_transport(b, next, off),
    }
}

#[inline(always)]
fn parse_transport<B: PacketBytes>(b: &B, proto: u8, off: usize) -> Outcome {
    if proto != PROTO_TCP && proto != PROTO_UDP {
        return Outcome::OtherL4 { proto };
    }
    if off > MAX_L4_OFFSET {
        return Outcome::Unparseable { offset: off as u16 };
    }
    if proto == PROTO_UDP {
        let mut h = [0u8; 8];
        if !b.read(off, &mut h) {
            return truncated(off);
        }
        let udp_len = u16::from_be_bytes([h[4], h[5]]) as usize;
        if udp_len < 8 {
            return Outcome::Malformed { offset: off as u16 };
        }
        return Outcome::Transport(Transport {
            proto,
            src_port: u16::from_be_bytes([h[0], h[1]]),
            dst_port: u16::from_be_bytes([h[2], h[3]]),
            payload_offset: (off + 8) as u16,
            tcp_flags: 0,
        });
    }
    let mut h = [0u8; 14];
    if !b.read(off, &mut h) {
        return truncated(off);
    }
    let hlen = ((h[12] >> 4) as usize) * 4;
    if hlen < 20 {
        return Outcome::Malformed { offset: off as u16 };
    }
    // The whole header, options included, must be present.
    if !present(b, off + hlen - 2) {
        return truncated(off);
    }
    Outcome::Transport(Transport {
        proto,
        src_port: u16::from_be_bytes([h[0], h[1]]),
        dst_port: u16::from_be_bytes([h[2], h[3]]),
        payload_offset: (off + hlen) as u16,
        tcp_flags: h[13],
    })
}
