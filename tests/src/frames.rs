//! Crafted Ethernet frames with known header boundaries, for `BPF_PROG_TEST_RUN` and for the
//! userspace parser, so both can be held to the same expectations.

/// 802.1Q tag protocol id.
pub const TPID_8021Q: u16 = 0x8100;
/// 802.1ad (QinQ outer) tag protocol id.
pub const TPID_8021AD: u16 = 0x88a8;

/// IPv6 extension header numbers.
pub mod ext {
    /// Hop-by-hop options.
    pub const HOP_BY_HOP: u8 = 0;
    /// Routing.
    pub const ROUTING: u8 = 43;
    /// Fragment.
    pub const FRAGMENT: u8 = 44;
    /// Authentication header.
    pub const AH: u8 = 51;
    /// Destination options.
    pub const DEST_OPTS: u8 = 60;
}

/// Network layer of a frame.
#[derive(Clone, Debug)]
pub enum Ip {
    /// IPv4 with optional options (padded to 4 bytes) and a flags/fragment-offset field.
    V4 {
        /// Option bytes.
        options: Vec<u8>,
        /// The flags + fragment offset field.
        frag: u16,
    },
    /// IPv6 with extension headers: (type, total length in bytes, a multiple of 8; AH: of 4).
    V6 {
        /// Extension headers in order.
        ext: Vec<(u8, usize)>,
    },
}

/// A frame description.
#[derive(Clone, Debug)]
pub struct Frame {
    /// VLAN tag protocol ids, outermost first.
    pub vlans: Vec<u16>,
    /// Network layer.
    pub ip: Ip,
    /// 6 (TCP) or 17 (UDP) or anything else.
    pub proto: u8,
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// TCP flags.
    pub tcp_flags: u8,
    /// TCP sequence number.
    pub seq: u32,
    /// TCP options (a multiple of 4 bytes, at most 40).
    pub tcp_options: Vec<u8>,
    /// Transport payload.
    pub payload: Vec<u8>,
    /// Sent by the server (10.99.0.1, fd00:99::1) to the client, rather than the other way.
    pub from_server: bool,
}

impl Frame {
    /// A UDP/IPv4 frame.
    pub fn udp(dst_port: u16, payload: &[u8]) -> Self {
        Frame {
            vlans: Vec::new(),
            ip: Ip::V4 {
                options: Vec::new(),
                frag: 0x4000,
            },
            proto: 17,
            src_port: 40000,
            dst_port,
            tcp_flags: 0,
            seq: 1,
            tcp_options: Vec::new(),
            payload: payload.to_vec(),
            from_server: false,
        }
    }

    /// A TCP/IPv4 frame (PSH|ACK).
    pub fn tcp(dst_port: u16, payload: &[u8]) -> Self {
        Frame {
            proto: 6,
            tcp_flags: 0x18,
            ..Frame::udp(dst_port, payload)
        }
    }

    /// Sets the source port.
    pub fn from_port(mut self, port: u16) -> Self {
        self.src_port = port;
        self
    }

    /// A frame the server sends: the addresses swap (set the ports with [`Frame::from_port`]
    /// and the destination port as usual).
    pub fn from_server(mut self) -> Self {
        self.from_server = true;
        self
    }

    /// Sets the TCP sequence number.
    pub fn seq(mut self, seq: u32) -> Self {
        self.seq = seq;
        self
    }

    /// Sets the TCP flags.
    pub fn flags(mut self, flags: u8) -> Self {
        self.tcp_flags = flags;
        self
    }

    /// Sets the TCP options (a multiple of 4 bytes, at most 40).
    pub fn tcp_options(mut self, options: &[u8]) -> Self {
        assert!(
            options.len().is_multiple_of(4) && options.len() <= 40,
            "TCP options"
        );
        self.tcp_options = options.to_vec();
        self
    }

    /// Adds a VLAN tag inside the existing ones.
    pub fn vlan(mut self, tpid: u16) -> Self {
        self.vlans.push(tpid);
        self
    }

    /// Switches to IPv6 with these extension headers.
    pub fn ipv6(mut self, ext: &[(u8, usize)]) -> Self {
        self.ip = Ip::V6 { ext: ext.to_vec() };
        self
    }

    /// Adds IPv4 options (NOPs then End, padded to a multiple of 4).
    pub fn ipv4_options(mut self, len: usize) -> Self {
        let mut options = vec![1u8; len];
        if let Some(last) = options.last_mut() {
            *last = 0;
        }
        options.resize(len.div_ceil(4) * 4, 0);
        if let Ip::V4 { options: o, .. } = &mut self.ip {
            *o = options;
        }
        self
    }

    /// Sets the IPv4 flags/fragment-offset field.
    pub fn ipv4_frag(mut self, field: u16) -> Self {
        if let Ip::V4 { frag, .. } = &mut self.ip {
            *frag = field;
        }
        self
    }

    /// The frame's bytes and the offsets at which each header starts (and the payload, and the
    /// end), in order.
    pub fn build_with_boundaries(&self) -> (Vec<u8>, Vec<usize>) {
        let mut f = Vec::new();
        let mut marks = vec![0];
        f.extend_from_slice(&[0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2]);
        for tpid in &self.vlans {
            f.extend_from_slice(&tpid.to_be_bytes());
            f.extend_from_slice(&[0x00, 0x64]);
        }
        let l4 = self.l4();
        match &self.ip {
            Ip::V4 { options, frag } => {
                f.extend_from_slice(&0x0800u16.to_be_bytes());
                marks.push(f.len());
                let hlen = 20 + options.len();
                let total = (hlen + l4.len()) as u16;
                f.push(0x40 | (hlen / 4) as u8);
                f.push(0);
                f.extend_from_slice(&total.to_be_bytes());
                f.extend_from_slice(&[0x12, 0x34]);
                f.extend_from_slice(&frag.to_be_bytes());
                f.extend_from_slice(&[64, self.proto, 0, 0]);
                if self.from_server {
                    f.extend_from_slice(&[10, 99, 0, 1, 10, 99, 0, 2]);
                } else {
                    f.extend_from_slice(&[10, 99, 0, 2, 10, 99, 0, 1]);
                }
                f.extend_from_slice(options);
            }
            Ip::V6 { ext } => {
                f.extend_from_slice(&0x86ddu16.to_be_bytes());
                marks.push(f.len());
                let ext_len: usize = ext.iter().map(|e| e.1).sum();
                f.extend_from_slice(&[0x60, 0, 0, 0]);
                f.extend_from_slice(&((ext_len + l4.len()) as u16).to_be_bytes());
                f.push(ext.first().map_or(self.proto, |e| e.0));
                f.push(64);
                let (src, dst) = if self.from_server { (1, 2) } else { (2, 1) };
                f.extend_from_slice(&[0xfd, 0, 0, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, src]);
                f.extend_from_slice(&[0xfd, 0, 0, 0x99, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, dst]);
                for (i, (kind, len)) in ext.iter().enumerate() {
                    marks.push(f.len());
                    let next = ext.get(i + 1).map_or(self.proto, |e| e.0);
                    let len_field = if *kind == ext::AH {
                        len / 4 - 2
                    } else {
                        len / 8 - 1
                    };
                    f.push(next);
                    f.push(if *kind == ext::FRAGMENT {
                        0
                    } else {
                        len_field as u8
                    });
                    f.resize(f.len() + len - 2, 0);
                }
            }
        }
        marks.push(f.len());
        let l4_header = l4.len() - self.payload.len();
        f.extend_from_slice(&l4[..l4_header]);
        marks.push(f.len());
        f.extend_from_slice(&self.payload);
        marks.push(f.len());
        (f, marks)
    }

    /// The frame's bytes.
    pub fn build(&self) -> Vec<u8> {
        self.build_with_boundaries().0
    }

    fn l4(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(&self.src_port.to_be_bytes());
        h.extend_from_slice(&self.dst_port.to_be_bytes());
        match self.proto {
            6 => {
                h.extend_from_slice(&self.seq.to_be_bytes());
                h.extend_from_slice(&[0, 0, 0, 0]);
                h.push((((20 + self.tcp_options.len()) / 4) as u8) << 4);
                h.push(self.tcp_flags);
                h.extend_from_slice(&[0xff, 0xff, 0, 0, 0, 0]);
                h.extend_from_slice(&self.tcp_options);
            }
            17 => {
                h.extend_from_slice(&((8 + self.payload.len()) as u16).to_be_bytes());
                h.extend_from_slice(&[0, 0]);
            }
            _ => {}
        }
        h.extend_from_slice(&self.payload);
        h
    }
}

/// The first 64 bytes of a TLS ClientHello record (the rest of the hello missing).
pub fn client_hello_head() -> Vec<u8> {
    let mut h = client_hello();
    h.truncate(64);
    h
}

/// A complete small TLS 1.3 ClientHello without a resumption offer.
pub fn client_hello() -> Vec<u8> {
    gateway_common::testing::HelloBuilder {
        key_share_len: 32,
        ..gateway_common::testing::HelloBuilder::tls13()
    }
    .build()
}

/// A frame the datapath wrote (a reply, or a segment it rewrote), checked against the frame it
/// came from by [`check_rewritten`].
#[derive(Clone, Debug)]
pub struct Rewritten {
    /// IP protocol of its transport segment.
    pub proto: u8,
    /// Its transport segment (header and payload), checksum verified.
    pub segment: Vec<u8>,
}

/// The one's-complement sum of `bytes` as 16-bit big-endian words, folded (0xffff over data
/// that includes a correct checksum).
pub fn ones_sum(bytes: &[u8]) -> u32 {
    let mut sum: u32 = bytes
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum
}

/// Where the IP header of `f` starts, past any VLAN tags, and whether it is IPv4.
fn l3_of(f: &[u8]) -> Result<(usize, bool), String> {
    let mut at = 12;
    loop {
        let t = u16::from_be_bytes([*f.get(at).ok_or("short frame")?, f[at + 1]]);
        match t {
            TPID_8021Q | TPID_8021AD => at += 4,
            0x0800 => return Ok((at + 2, true)),
            0x86dd => return Ok((at + 2, false)),
            other => return Err(format!("ethertype {other:#06x} at offset {at}")),
        }
    }
}

/// Checks `out`, written by the datapath from `req`, as a frame a receiver accepts: no longer
/// than `req`; its link header (VLAN tags included) kept; when `turned`, Ethernet addresses, IP
/// addresses and ports swapped (a reply), else as in `req`; IPv4 header checksum and total
/// length, or IPv6 payload length, right for the frame; TCP or UDP checksum right over the
/// pseudo-header. Plain IPv4 (no options) and IPv6 (no extension headers) only.
pub fn check_rewritten(req: &[u8], out: &[u8], turned: bool) -> Result<Rewritten, String> {
    if out.len() > req.len() {
        return Err(format!("{} bytes answer {}", out.len(), req.len()));
    }
    let (l3, v4) = l3_of(req)?;
    if l3_of(out)? != (l3, v4) || out[12..l3] != req[12..l3] {
        return Err("link header (VLAN tags, EtherType) changed".into());
    }
    let swap = |a: std::ops::Range<usize>, b: std::ops::Range<usize>, what: &str| {
        let (want_a, want_b) = if turned {
            (&req[b.clone()], &req[a.clone()])
        } else {
            (&req[a.clone()], &req[b.clone()])
        };
        if &out[a] == want_a && &out[b] == want_b {
            Ok(())
        } else {
            Err(format!(
                "{what} not {}",
                if turned { "swapped" } else { "kept" }
            ))
        }
    };
    swap(0..6, 6..12, "MACs")?;
    let ip = &out[l3..];
    let (l4, proto, pseudo_addrs, l4_len) = if v4 {
        if ip[0] != 0x45 {
            return Err(format!("IPv4 version/IHL {:#04x}", ip[0]));
        }
        if ones_sum(&ip[..20]) != 0xffff {
            return Err("IPv4 header checksum".into());
        }
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        if l3 + total != out.len() {
            return Err(format!(
                "IPv4 total length {total} in a frame of {}",
                out.len()
            ));
        }
        swap(l3 + 12..l3 + 16, l3 + 16..l3 + 20, "IPv4 addresses")?;
        (l3 + 20, ip[9], ip[12..20].to_vec(), total - 20)
    } else {
        let payload = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
        if l3 + 40 + payload != out.len() {
            return Err(format!(
                "IPv6 payload length {payload} in a frame of {}",
                out.len()
            ));
        }
        swap(l3 + 8..l3 + 24, l3 + 24..l3 + 40, "IPv6 addresses")?;
        (l3 + 40, ip[6], ip[8..40].to_vec(), payload)
    };
    swap(l4..l4 + 2, l4 + 2..l4 + 4, "ports")?;
    let segment = out[l4..].to_vec();
    let mut pseudo = pseudo_addrs;
    pseudo.extend_from_slice(&[0, proto]);
    pseudo.extend_from_slice(&(l4_len as u16).to_be_bytes());
    if proto == 17 {
        if usize::from(u16::from_be_bytes([segment[4], segment[5]])) != l4_len {
            return Err("UDP length".into());
        }
        if segment[6..8] == [0, 0] && !v4 {
            return Err("IPv6 UDP without a checksum".into());
        }
    }
    // An odd-length segment is padded with a zero byte for its checksum.
    if ones_sum(&[&pseudo[..], &segment[..]].concat()) != 0xffff {
        return Err(format!("protocol {proto} checksum"));
    }
    Ok(Rewritten { proto, segment })
}
