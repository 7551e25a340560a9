//! Bounded Ethernet / VLAN / IPv4 / IPv6 / TCP / UDP header parsing.
//!
//! The parser never reads beyond [`crate::bytes::MAX_READ_OFFSET`], follows at most
//! [`MAX_VLAN_TAGS`] VLAN tags and [`MAX_IPV6_EXT_HEADERS`] IPv6 extension headers, and refuses to
//! look for a transport header past [`MAX_L4_OFFSET`]. Those bounds hold every chain RFC 8200
//! allows (each header once, destination options twice) with room to spare, and any header
//! chain of a 1500-byte frame. Anything it cannot follow within them is reported as
//! [`PacketKind::Unparseable`], never guessed at: the caller refuses it where it may reach a
//! protected service (fail closed), and it is never counted as an admitted class.
//!
//! A first fragment whose transport header is cut short (a "tiny fragment", RFC 1858) but
//! whose ports are present is still a [`PacketKind::Transport`], with [`Packet::l4_partial`] set: the
//! caller judges it by its ports as the least privileged class of their service.
//!
//! The result is a plain struct, zero-initialized and then filled in, not an enum with payloads:
//! an enum's unused payload bytes are undefined, and LLVM filled them with whatever register was
//! at hand, the packet pointer included, which the verifier refuses. [`Packet::outcome`] gives
//! userspace the enum view.

use crate::bytes::PacketBytes;

/// Length of an Ethernet header without VLAN tags.
pub const ETH_HLEN: usize = 14;
/// VLAN tags (802.1Q or 802.1ad) followed before giving up.
pub const MAX_VLAN_TAGS: usize = 2;
/// IPv6 extension headers followed before giving up.
pub const MAX_IPV6_EXT_HEADERS: usize = 8;
/// The transport header must start at or before this offset: past any header chain a
/// 1500-byte frame can hold.
pub const MAX_L4_OFFSET: usize = 1536;

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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transport {
    /// `6` (TCP) or `17` (UDP).
    pub proto: u8,
    /// Source port, host order.
    pub src_port: u16,
    /// Destination port, host order.
    pub dst_port: u16,
    /// Offset of the transport header from the start of the frame.
    pub l4_offset: u16,
    /// Offset of the transport payload from the start of the frame.
    pub payload_offset: u16,
    /// TCP flags byte (FIN 0x01, SYN 0x02, RST 0x04, PSH 0x08, ACK 0x10); zero for UDP.
    pub tcp_flags: u8,
    /// TCP sequence number; zero for UDP.
    pub seq: u32,
    /// TCP acknowledgment number; zero for UDP.
    pub ack: u32,
}

/// TCP FIN flag.
pub const TCP_FIN: u8 = 0x01;
/// TCP SYN flag.
pub const TCP_SYN: u8 = 0x02;
/// TCP RST flag.
pub const TCP_RST: u8 = 0x04;
/// TCP ACK flag.
pub const TCP_ACK: u8 = 0x10;

/// What the parser found.
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PacketKind {
    /// Not IPv4 or IPv6.
    #[default]
    NotIp,
    /// The frame ends inside the header at [`Packet::offset`].
    Truncated,
    /// The header at [`Packet::offset`] has an impossible field.
    Malformed,
    /// An IPv4 or IPv6 fragment other than the first (no transport header to look at). A first
    /// fragment is parsed as far as its transport header, with [`Packet::fragmented`] set.
    Fragment,
    /// Headers that cannot be followed within the parser's bounds, from [`Packet::offset`].
    Unparseable,
    /// An IP packet that is neither TCP nor UDP; [`Packet::proto`] says what.
    OtherL4,
    /// A TCP or UDP packet; [`Packet::transport`] holds its header.
    Transport,
}

/// Result of parsing one frame. Every field is defined on every path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Packet {
    /// What was found.
    pub kind: PacketKind,
    /// For `Truncated`, `Malformed` and `Unparseable`: offset of the header concerned.
    pub offset: u16,
    /// IP protocol (or IPv6 next header) number, when known.
    pub proto: u8,
    /// Number of VLAN tags in front of the network header.
    pub vlan_tags: u8,
    /// 4 or 6 when the frame carries IP, else 0.
    pub ip_version: u8,
    /// Whether an IPv4 header carries options.
    pub ipv4_options: bool,
    /// Offset of the IP header (0 when not IP).
    pub l3_offset: u16,
    /// Offset just past the IP datagram, per its length field (Ethernet padding excluded).
    pub ip_end: u16,
    /// The first fragment of a fragmented datagram: its transport header and the start of its
    /// payload are here, the rest comes in fragments that carry no ports.
    pub fragmented: bool,
    /// For `Transport` in a first fragment: the transport header is cut short after its ports
    /// (its other fields are zero, and it has no payload here).
    pub l4_partial: bool,
    /// The transport header, for `Transport` (zero otherwise).
    pub transport: Transport,
}

impl Packet {
    /// Bytes of transport payload, per the IP length (0 when the frame is shorter than that).
    pub const fn payload_len(&self) -> u16 {
        self.ip_end.saturating_sub(self.transport.payload_offset)
    }
}

/// The parser's finding as an enum, for userspace code and tests.
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
    /// An IPv4 or IPv6 fragment.
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

impl Packet {
    /// The IP version, when the frame carries IP.
    pub const fn ip(&self) -> Option<IpVersion> {
        match self.ip_version {
            4 => Some(IpVersion::V4),
            6 => Some(IpVersion::V6),
            _ => None,
        }
    }

    /// The finding as an enum (not for eBPF code paths: see the module docs).
    pub const fn outcome(&self) -> Outcome {
        let offset = self.offset;
        match self.kind {
            PacketKind::NotIp => Outcome::NotIp,
            PacketKind::Truncated => Outcome::Truncated { offset },
            PacketKind::Malformed => Outcome::Malformed { offset },
            PacketKind::Fragment => Outcome::Fragment,
            PacketKind::Unparseable => Outcome::Unparseable { offset },
            PacketKind::OtherL4 => Outcome::OtherL4 { proto: self.proto },
            PacketKind::Transport => Outcome::Transport(self.transport),
        }
    }

    #[inline(always)]
    fn stop(&mut self, kind: PacketKind, offset: usize) {
        self.kind = kind;
        self.offset = offset as u16;
    }
}

/// Parses the headers of an Ethernet frame.
#[inline(always)]
pub fn parse<B: PacketBytes>(b: &B) -> Packet {
    let mut pkt = Packet::default();
    let mut off = ETH_HLEN - 2;
    let mut et = [0u8; 2];
    if !b.read(off, &mut et) {
        pkt.stop(PacketKind::Truncated, 0);
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
            pkt.stop(PacketKind::Truncated, off - 2);
            return pkt;
        }
        ethertype = u16::from_be_bytes(et);
        pkt.vlan_tags += 1;
    }
    let l3 = off + 2;
    match ethertype {
        ETH_P_8021Q | ETH_P_8021AD => pkt.stop(PacketKind::Unparseable, l3),
        ETH_P_IP => {
            pkt.ip_version = 4;
            parse_ipv4(b, l3, &mut pkt);
        }
        ETH_P_IPV6 => {
            pkt.ip_version = 6;
            parse_ipv6(b, l3, &mut pkt);
        }
        _ => pkt.kind = PacketKind::NotIp,
    }
    pkt
}

/// The most common frame (untagged Ethernet, IPv4 without options, not a fragment, a whole UDP
/// or TCP header) as [`plain_ipv4`] reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PlainIpv4 {
    /// [`PROTO_TCP`] or [`PROTO_UDP`].
    pub proto: u8,
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// TCP flags (0 for UDP).
    pub tcp_flags: u8,
}

impl PlainIpv4 {
    /// `plain` as one word, 0 for `None` (no reading has protocol 0): it crosses a call between
    /// eBPF functions in one register.
    #[inline(always)]
    pub const fn word(plain: Option<Self>) -> u64 {
        match plain {
            Some(p) => {
                p.proto as u64
                    | (p.tcp_flags as u64) << 8
                    | (p.src_port as u64) << 16
                    | (p.dst_port as u64) << 32
            }
            None => 0,
        }
    }

    /// The reading [`PlainIpv4::word`] made `word` of.
    #[inline(always)]
    pub const fn from_word(word: u64) -> Option<Self> {
        if word & 0xff == 0 {
            return None;
        }
        Some(PlainIpv4 {
            proto: word as u8,
            tcp_flags: (word >> 8) as u8,
            src_port: (word >> 16) as u16,
            dst_port: (word >> 32) as u16,
        })
    }
}

/// A plain IPv4 frame's ports and TCP flags in the fewest reads (its addresses are at
/// [`ETH_HLEN`] + 12, for whoever needs them); `None` for every other frame, which only [`parse`]
/// judges.
///
/// Where it answers, [`parse`] finds a [`PacketKind::Transport`] with the same protocol, ports
/// and flags at IPv4 offset [`ETH_HLEN`], and nothing the parser counters count (no VLAN tag, IP
/// options, IPv6 or fragment): the datapath passes packets of no service, and packets of admitted
/// connections, on this answer alone.
#[inline(always)]
pub fn plain_ipv4<B: PacketBytes>(b: &B) -> Option<PlainIpv4> {
    // Ethernet, the IPv4 header without options and a UDP header (or a TCP header's first 8
    // bytes).
    let mut h = [0u8; 42];
    if !b.read(0, &mut h) {
        return None;
    }
    let ethertype = u16::from_be_bytes([h[12], h[13]]);
    let total_len = u16::from_be_bytes([h[16], h[17]]);
    let frag = u16::from_be_bytes([h[20], h[21]]);
    // Version 4, a 20-byte header; no fragment offset, no more fragments.
    if ethertype != ETH_P_IP || h[14] != 0x45 || total_len < 20 || frag & 0x3fff != 0 {
        return None;
    }
    let mut plain = PlainIpv4 {
        proto: h[23],
        src_port: u16::from_be_bytes([h[34], h[35]]),
        dst_port: u16::from_be_bytes([h[36], h[37]]),
        tcp_flags: 0,
    };
    match plain.proto {
        PROTO_UDP if u16::from_be_bytes([h[38], h[39]]) >= 8 => Some(plain),
        PROTO_TCP => {
            // Data offset and flags.
            let mut t = [0u8; 2];
            if !b.read(ETH_HLEN + 20 + 12, &mut t) {
                return None;
            }
            let hlen = ((t[0] >> 4) as usize) * 4;
            // The whole header, options included, as `parse` wants it.
            if hlen < 20 || !present(b, ETH_HLEN + 20 + hlen - 2) {
                return None;
            }
            plain.tcp_flags = t[1];
            Some(plain)
        }
        _ => None,
    }
}

/// Whether the two bytes at `offset` are in the frame. Variable offsets are always checked with a
/// two-byte read, the smallest the verifier reliably tracks.
#[inline(always)]
fn present<B: PacketBytes>(b: &B, offset: usize) -> bool {
    let mut two = [0u8; 2];
    b.read(offset, &mut two)
}

#[inline(always)]
fn parse_ipv4<B: PacketBytes>(b: &B, off: usize, pkt: &mut Packet) {
    let mut h = [0u8; 20];
    if !b.read(off, &mut h) {
        return pkt.stop(PacketKind::Truncated, off);
    }
    if h[0] >> 4 != 4 {
        return pkt.stop(PacketKind::Malformed, off);
    }
    let hlen = ((h[0] & 0x0f) as usize) * 4;
    let total_len = u16::from_be_bytes([h[2], h[3]]) as usize;
    if hlen < 20 || total_len < hlen {
        return pkt.stop(PacketKind::Malformed, off);
    }
    pkt.l3_offset = off as u16;
    pkt.ip_end = (off + total_len) as u16;
    if hlen > 20 {
        pkt.ipv4_options = true;
        // The options must be present: read the header's last two bytes.
        if !present(b, off + hlen - 2) {
            return pkt.stop(PacketKind::Truncated, off);
        }
    }
    pkt.proto = h[9];
    let frag = u16::from_be_bytes([h[6], h[7]]);
    // A non-zero fragment offset: no transport header here.
    if frag & 0x1fff != 0 {
        return pkt.stop(PacketKind::Fragment, off);
    }
    // More fragments follow: this first one carries the transport header.
    pkt.fragmented = frag & 0x2000 != 0;
    parse_transport(b, off + hlen, pkt);
}

#[inline(always)]
fn parse_ipv6<B: PacketBytes>(b: &B, off: usize, pkt: &mut Packet) {
    let mut h = [0u8; 8];
    if !b.read(off, &mut h) {
        return pkt.stop(PacketKind::Truncated, off);
    }
    if h[0] >> 4 != 6 {
        return pkt.stop(PacketKind::Malformed, off);
    }
    // The addresses must be there too.
    if !present(b, off + 38) {
        return pkt.stop(PacketKind::Truncated, off);
    }
    pkt.l3_offset = off as u16;
    pkt.ip_end = (off + 40 + u16::from_be_bytes([h[4], h[5]]) as usize) as u16;
    let mut next = h[6];
    let mut off = off + 40;
    for _ in 0..MAX_IPV6_EXT_HEADERS {
        let len = match next {
            IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTS | IPV6_AH => {
                if off > MAX_L4_OFFSET {
                    return pkt.stop(PacketKind::Unparseable, off);
                }
                let mut e = [0u8; 2];
                if !b.read(off, &mut e) {
                    return pkt.stop(PacketKind::Truncated, off);
                }
                let len = if next == IPV6_AH {
                    (e[1] as usize + 2) * 4
                } else {
                    (e[1] as usize + 1) * 8
                };
                next = e[0];
                len
            }
            IPV6_FRAGMENT => {
                // next header, reserved, offset (13 bits) | 2 reserved | M, identification.
                let mut f = [0u8; 4];
                if off > MAX_L4_OFFSET || !b.read(off, &mut f) {
                    pkt.proto = next;
                    return pkt.stop(PacketKind::Fragment, off);
                }
                let frag = u16::from_be_bytes([f[2], f[3]]);
                if frag & 0xfff8 != 0 {
                    pkt.proto = next;
                    return pkt.stop(PacketKind::Fragment, off);
                }
                // The first fragment: the walk ends here, and its transport header must follow
                // (any other header after it is unparseable). Ending the walk keeps the loop
                // free of state the verifier would have to follow through every iteration.
                pkt.fragmented = true;
                next = f[0];
                off += 8;
                break;
            }
            IPV6_ESP => {
                pkt.proto = next;
                return pkt.stop(PacketKind::Unparseable, off);
            }
            _ => break,
        };
        off += len;
    }
    pkt.proto = next;
    match next {
        IPV6_HOP_BY_HOP | IPV6_ROUTING | IPV6_DEST_OPTS | IPV6_AH | IPV6_FRAGMENT | IPV6_ESP => {
            pkt.stop(PacketKind::Unparseable, off)
        }
        IPV6_NO_NEXT => pkt.kind = PacketKind::OtherL4,
        _ => parse_transport(b, off, pkt),
    }
}

#[inline(always)]
fn parse_transport<B: PacketBytes>(b: &B, off: usize, pkt: &mut Packet) {
    let proto = pkt.proto;
    if proto != PROTO_TCP && proto != PROTO_UDP {
        pkt.kind = PacketKind::OtherL4;
        return;
    }
    if off > MAX_L4_OFFSET {
        return pkt.stop(PacketKind::Unparseable, off);
    }
    if proto == PROTO_UDP {
        let mut h = [0u8; 8];
        if !b.read(off, &mut h) {
            return partial(b, off, pkt);
        }
        let udp_len = u16::from_be_bytes([h[4], h[5]]) as usize;
        if udp_len < 8 {
            return pkt.stop(PacketKind::Malformed, off);
        }
        pkt.kind = PacketKind::Transport;
        pkt.transport = Transport {
            proto,
            src_port: u16::from_be_bytes([h[0], h[1]]),
            dst_port: u16::from_be_bytes([h[2], h[3]]),
            l4_offset: off as u16,
            payload_offset: (off + 8) as u16,
            tcp_flags: 0,
            seq: 0,
            ack: 0,
        };
        return;
    }
    let mut h = [0u8; 14];
    if !b.read(off, &mut h) {
        return partial(b, off, pkt);
    }
    let hlen = ((h[12] >> 4) as usize) * 4;
    if hlen < 20 {
        return pkt.stop(PacketKind::Malformed, off);
    }
    // The whole header, options included, must be present.
    if !present(b, off + hlen - 2) {
        return partial(b, off, pkt);
    }
    pkt.kind = PacketKind::Transport;
    pkt.transport = Transport {
        proto,
        src_port: u16::from_be_bytes([h[0], h[1]]),
        dst_port: u16::from_be_bytes([h[2], h[3]]),
        l4_offset: off as u16,
        payload_offset: (off + hlen) as u16,
        tcp_flags: h[13],
        seq: u32::from_be_bytes([h[4], h[5], h[6], h[7]]),
        ack: u32::from_be_bytes([h[8], h[9], h[10], h[11]]),
    };
}

/// A transport header cut short at `off`. In a first fragment whose ports are present: a
/// `Transport` with only its ports, [`Packet::l4_partial`] set and no payload (the kernel
/// reassembles the rest from fragments that carry no ports, so the caller must judge it by its
/// ports). Anywhere else: `Truncated` (the kernel drops such a packet itself).
#[inline(always)]
fn partial<B: PacketBytes>(b: &B, off: usize, pkt: &mut Packet) {
    let mut ports = [0u8; 4];
    if !pkt.fragmented || !b.read(off, &mut ports) {
        return pkt.stop(PacketKind::Truncated, off);
    }
    pkt.kind = PacketKind::Transport;
    pkt.l4_partial = true;
    pkt.transport = Transport {
        proto: pkt.proto,
        src_port: u16::from_be_bytes([ports[0], ports[1]]),
        dst_port: u16::from_be_bytes([ports[2], ports[3]]),
        l4_offset: off as u16,
        payload_offset: pkt.ip_end,
        tcp_flags: 0,
        seq: 0,
        ack: 0,
    };
}
