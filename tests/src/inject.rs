//! Hand-made IP packets for the real kernel: the segments and datagrams a hostile or unusual
//! sender puts on the wire (tiny first fragments, long IPv6 header chains), sent from a raw
//! socket in the peer's namespace, so the gateway's program and then the gateway namespace's
//! kernel (which reassembles them and delivers them to the server) both see them.
//!
//! TCP needs a connection the kernel knows: a real client socket makes the handshake, and
//! [`tcp_next_seqs`] reads its sequence numbers (`TCP_REPAIR`), so an injected segment carries
//! exactly what that client would send next.

use std::{
    net::{IpAddr, Ipv4Addr, Ipv6Addr, TcpStream},
    os::fd::AsRawFd as _,
};

/// IP protocol numbers.
pub const TCP: u8 = 6;
/// UDP.
pub const UDP: u8 = 17;
const DEST_OPTS: u8 = 60;

/// The next sequence number a connected client sends and the one it expects from the server
/// (`snd_nxt`, `rcv_nxt`), read from its socket in repair mode, which it leaves without sending
/// anything.
pub fn tcp_next_seqs(stream: &TcpStream) -> (u32, u32) {
    const TCP_REPAIR: i32 = 19;
    const TCP_REPAIR_QUEUE: i32 = 20;
    const TCP_QUEUE_SEQ: i32 = 21;
    const TCP_RECV_QUEUE: i32 = 1;
    const TCP_SEND_QUEUE: i32 = 2;
    const TCP_REPAIR_OFF_NO_WP: i32 = -1;
    let fd = stream.as_raw_fd();
    let set = |opt: i32, value: i32| {
        // SAFETY: an int option on a socket this process owns.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_TCP,
                opt,
                (&raw const value).cast(),
                size_of::<i32>() as u32,
            )
        };
        assert_eq!(
            r,
            0,
            "setsockopt {opt}: {}",
            std::io::Error::last_os_error()
        );
    };
    let seq = || {
        let mut value = 0u32;
        let mut len = size_of::<u32>() as u32;
        // SAFETY: as above, into a local of the option's size.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_TCP,
                TCP_QUEUE_SEQ,
                (&raw mut value).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "TCP_QUEUE_SEQ: {}", std::io::Error::last_os_error());
        value
    };
    set(TCP_REPAIR, 1);
    set(TCP_REPAIR_QUEUE, TCP_SEND_QUEUE);
    let snd = seq();
    set(TCP_REPAIR_QUEUE, TCP_RECV_QUEUE);
    let rcv = seq();
    set(TCP_REPAIR, TCP_REPAIR_OFF_NO_WP);
    (snd, rcv)
}

/// A TCP handshake made by hand from the peer's namespace, with no socket of the peer's kernel
/// behind it: a SYN from `from` (sequence number `isn`, no options) sent from a raw socket, and
/// the server's SYN-ACK read off `ifname` (an AF_PACKET socket opened first). Returns the next
/// sequence numbers of each side (`isn + 1`, the server's ISN + 1): with SYN cookies on, the
/// server holds nothing until an acknowledgement carrying its cookie arrives. The peer's kernel
/// answers the SYN-ACK with a reset, which a server holding nothing ignores.
pub fn handshake_by_hand(
    ifname: &str,
    from: std::net::SocketAddrV4,
    to: std::net::SocketAddrV4,
    isn: u32,
) -> (u32, u32) {
    let name = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: socket syscalls on a descriptor this function owns and closes; reads into a
    // local buffer of the size passed.
    unsafe {
        let fd = libc::socket(
            libc::AF_PACKET,
            libc::SOCK_RAW,
            i32::from((libc::ETH_P_ALL as u16).to_be()),
        );
        assert!(fd >= 0, "AF_PACKET: {}", std::io::Error::last_os_error());
        let mut sll: libc::sockaddr_ll = std::mem::zeroed();
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
        sll.sll_ifindex = libc::if_nametoindex(name.as_ptr()) as i32;
        let r = libc::bind(
            fd,
            (&raw const sll).cast(),
            size_of::<libc::sockaddr_ll>() as u32,
        );
        assert_eq!(r, 0, "bind AF_PACKET: {}", std::io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: 100_000,
        };
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            size_of::<libc::timeval>() as u32,
        );
        let syn = tcp_segment(
            IpAddr::V4(*from.ip()),
            IpAddr::V4(*to.ip()),
            from.port(),
            to.port(),
            isn,
            0,
            SYN,
            &[],
        );
        send_ip(
            IpAddr::V4(*to.ip()),
            &[ipv4_packet(*from.ip(), *to.ip(), TCP, &syn)],
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
        let mut buf = [0u8; 2048];
        let found = loop {
            assert!(
                std::time::Instant::now() < deadline,
                "no SYN-ACK for {from} -> {to}"
            );
            let n = libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0);
            if n < 14 + 20 + 20 {
                continue;
            }
            let f = &buf[..n as usize];
            let (ip, l4) = (&f[14..], &f[14 + 20..]);
            if f[12..14] != [0x08, 0x00] || ip[9] != TCP || ip[0] != 0x45 {
                continue;
            }
            let (sport, dport) = (
                u16::from_be_bytes([l4[0], l4[1]]),
                u16::from_be_bytes([l4[2], l4[3]]),
            );
            if sport == to.port() && dport == from.port() && l4[13] & 0x12 == 0x12 {
                break u32::from_be_bytes([l4[4], l4[5], l4[6], l4[7]]);
            }
        };
        libc::close(fd);
        (isn.wrapping_add(1), found.wrapping_add(1))
    }
}

/// A client socket of the peer's kernel put straight into the established state of a
/// connection whose handshake was made by hand ([`handshake_by_hand`]), with no packet sent:
/// `TCP_REPAIR`, as checkpoint/restore uses it. What is written to it next goes out as the
/// acknowledgement of the server's SYN-ACK, data riding on it.
pub fn established_by_repair(
    from: std::net::SocketAddrV4,
    to: std::net::SocketAddrV4,
    snd_nxt: u32,
    rcv_nxt: u32,
) -> TcpStream {
    use std::os::fd::FromRawFd as _;
    const TCP_REPAIR: i32 = 19;
    const TCP_REPAIR_QUEUE: i32 = 20;
    const TCP_QUEUE_SEQ: i32 = 21;
    const TCP_REPAIR_WINDOW: i32 = 29;
    const TCP_RECV_QUEUE: i32 = 1;
    const TCP_SEND_QUEUE: i32 = 2;
    const TCP_REPAIR_OFF_NO_WP: i32 = -1;
    let sockaddr = |a: std::net::SocketAddrV4| {
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sa.sin_family = libc::AF_INET as u16;
        sa.sin_port = a.port().to_be();
        sa.sin_addr.s_addr = u32::from_ne_bytes(a.ip().octets());
        sa
    };
    // SAFETY: socket syscalls on a new descriptor, owned by the returned stream.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let set = |opt: i32, value: *const libc::c_void, len: usize| {
            let r = libc::setsockopt(fd, libc::SOL_TCP, opt, value, len as u32);
            assert_eq!(
                r,
                0,
                "setsockopt {opt}: {}",
                std::io::Error::last_os_error()
            );
        };
        let int = |opt: i32, v: i32| set(opt, (&raw const v).cast(), 4);
        int(TCP_REPAIR, 1);
        int(TCP_REPAIR_QUEUE, TCP_SEND_QUEUE);
        int(TCP_QUEUE_SEQ, snd_nxt as i32);
        int(TCP_REPAIR_QUEUE, TCP_RECV_QUEUE);
        int(TCP_QUEUE_SEQ, rcv_nxt as i32);
        let (local, remote) = (sockaddr(from), sockaddr(to));
        let r = libc::bind(
            fd,
            (&raw const local).cast(),
            size_of::<libc::sockaddr_in>() as u32,
        );
        assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
        let r = libc::connect(
            fd,
            (&raw const remote).cast(),
            size_of::<libc::sockaddr_in>() as u32,
        );
        assert_eq!(r, 0, "repair connect: {}", std::io::Error::last_os_error());
        // struct tcp_repair_window: snd_wl1, snd_wnd, max_window, rcv_wnd, rcv_wup.
        let window: [u32; 5] = [rcv_nxt, 65535, 65535, 65535, rcv_nxt];
        set(TCP_REPAIR_WINDOW, window.as_ptr().cast(), 20);
        int(TCP_REPAIR, TCP_REPAIR_OFF_NO_WP);
        TcpStream::from_raw_fd(fd)
    }
}

/// One's-complement sum of `bytes` (an odd tail padded with a zero), folded to 16 bits.
fn fold(mut sum: u32, bytes: &[u8]) -> u16 {
    for pair in bytes.chunks(2) {
        sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}

/// The transport checksum of `l4` (its checksum field zero) between `src` and `dst`.
fn l4_checksum(src: IpAddr, dst: IpAddr, proto: u8, l4: &[u8]) -> u16 {
    let mut pseudo = Vec::new();
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&[0, proto]);
            pseudo.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        }
        (IpAddr::V6(s), IpAddr::V6(d)) => {
            pseudo.extend_from_slice(&s.octets());
            pseudo.extend_from_slice(&d.octets());
            pseudo.extend_from_slice(&(l4.len() as u32).to_be_bytes());
            pseudo.extend_from_slice(&[0, 0, 0, proto]);
        }
        _ => panic!("mixed address families"),
    }
    let sum = u32::from(fold(0, &pseudo));
    match !fold(sum, l4) {
        0 if proto == UDP => 0xffff,
        c => c,
    }
}

/// TCP flags of a data segment (PSH|ACK).
pub const PSH_ACK: u8 = 0x18;
/// TCP flags of a SYN.
pub const SYN: u8 = 0x02;

/// A TCP segment (header of 20 bytes, checksum set) from `src` to `dst`.
#[allow(clippy::too_many_arguments)]
pub fn tcp_segment(
    src: IpAddr,
    dst: IpAddr,
    sport: u16,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let mut h = Vec::with_capacity(20 + payload.len());
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&seq.to_be_bytes());
    h.extend_from_slice(&ack.to_be_bytes());
    h.extend_from_slice(&[5 << 4, flags, 0xff, 0xff, 0, 0, 0, 0]);
    h.extend_from_slice(payload);
    let c = l4_checksum(src, dst, TCP, &h);
    h[16..18].copy_from_slice(&c.to_be_bytes());
    h
}

/// A UDP datagram (checksum set) from `src` to `dst`.
pub fn udp_datagram(src: IpAddr, dst: IpAddr, sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut h = Vec::with_capacity(8 + payload.len());
    h.extend_from_slice(&sport.to_be_bytes());
    h.extend_from_slice(&dport.to_be_bytes());
    h.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    h.extend_from_slice(&[0, 0]);
    h.extend_from_slice(payload);
    let c = l4_checksum(src, dst, UDP, &h);
    h[6..8].copy_from_slice(&c.to_be_bytes());
    h
}

/// An IPv4 packet (not fragmented) carrying the transport bytes `l4`.
pub fn ipv4_packet(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> Vec<u8> {
    let mut p = ipv4_header(src, dst, proto, 0, 0x4000, l4.len());
    p.extend_from_slice(l4);
    p
}

/// An IPv4 header (checksum set) for `len` bytes of transport data.
fn ipv4_header(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, id: u16, frag: u16, len: usize) -> Vec<u8> {
    let mut p = Vec::with_capacity(20 + len);
    p.extend_from_slice(&[0x45, 0]);
    p.extend_from_slice(&((20 + len) as u16).to_be_bytes());
    p.extend_from_slice(&id.to_be_bytes());
    p.extend_from_slice(&frag.to_be_bytes());
    p.extend_from_slice(&[64, proto, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let c = !fold(0, &p);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p
}

/// The IPv4 fragments of the transport bytes `l4`: the first carries `first` bytes of it (a
/// multiple of 8: 8 is a "tiny fragment" that ends inside a TCP header), the second the rest.
pub fn ipv4_fragments(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    id: u16,
    l4: &[u8],
    first: usize,
) -> Vec<Vec<u8>> {
    assert!(first.is_multiple_of(8) && first < l4.len());
    [(0, &l4[..first], true), (first, &l4[first..], false)]
        .into_iter()
        .map(|(offset, part, more)| {
            let frag = (offset / 8) as u16 | if more { 0x2000 } else { 0 };
            let mut p = ipv4_header(src, dst, proto, id, frag, part.len());
            p.extend_from_slice(part);
            p
        })
        .collect()
}

/// A destination-options header of `len` bytes (a multiple of 8, at least 8) whose options
/// Linux accepts and skips: PadN of at most 5 bytes between experimental options (type 0x1e,
/// RFC 4727, "skip if unknown"), at most 255 bytes of data each and so few of them that
/// `net.ipv6.max_dst_opts_number` (8) is never reached.
fn dest_opts(next: u8, len: usize) -> Vec<u8> {
    assert!(len >= 8 && len.is_multiple_of(8));
    let mut h = vec![next, (len / 8 - 1) as u8];
    let mut left = len - 2;
    while left > 0 {
        if left <= 7 {
            // PadN (or Pad1 for a single byte) fills the end.
            if left == 1 {
                h.push(0);
            } else {
                h.extend_from_slice(&[1, (left - 2) as u8]);
                h.resize(h.len() + left - 2, 0);
            }
            left = 0;
        } else {
            // An experimental option, leaving at least 2 bytes (PadN of 0) or nothing.
            let mut data = (left - 2).min(255);
            if left - 2 - data == 1 {
                data -= 1;
            }
            h.extend_from_slice(&[0x1e, data as u8]);
            h.resize(h.len() + data, 0);
            left -= 2 + data;
        }
    }
    h
}

/// An IPv6 packet carrying `l4` behind destination-options headers of the lengths given, in
/// order.
pub fn ipv6_with_dest_opts(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    proto: u8,
    l4: &[u8],
    headers: &[usize],
) -> Vec<u8> {
    let mut chain = Vec::new();
    for (i, &len) in headers.iter().enumerate() {
        let next = if i + 1 < headers.len() {
            DEST_OPTS
        } else {
            proto
        };
        chain.extend_from_slice(&dest_opts(next, len));
    }
    let mut p = Vec::with_capacity(40 + chain.len() + l4.len());
    p.extend_from_slice(&[0x60, 0, 0, 0]);
    p.extend_from_slice(&((chain.len() + l4.len()) as u16).to_be_bytes());
    p.push(if headers.is_empty() { proto } else { DEST_OPTS });
    p.push(64);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&chain);
    p.extend_from_slice(l4);
    p
}

/// Sends whole IP packets (headers included) towards `dst` from a raw socket. Call it inside
/// the namespace the packets leave from.
pub fn send_ip(dst: IpAddr, packets: &[Vec<u8>]) {
    let family = if dst.is_ipv4() {
        libc::AF_INET
    } else {
        libc::AF_INET6
    };
    // SAFETY: plain socket syscalls on a descriptor this function owns and closes.
    unsafe {
        let fd = libc::socket(family, libc::SOCK_RAW, libc::IPPROTO_RAW);
        assert!(fd >= 0, "raw socket: {}", std::io::Error::last_os_error());
        for p in packets {
            let n = match dst {
                IpAddr::V4(a) => {
                    let mut sa: libc::sockaddr_in = std::mem::zeroed();
                    sa.sin_family = libc::AF_INET as u16;
                    sa.sin_addr.s_addr = u32::from_ne_bytes(a.octets());
                    libc::sendto(
                        fd,
                        p.as_ptr().cast(),
                        p.len(),
                        0,
                        (&raw const sa).cast(),
                        size_of::<libc::sockaddr_in>() as u32,
                    )
                }
                IpAddr::V6(a) => {
                    let mut sa: libc::sockaddr_in6 = std::mem::zeroed();
                    sa.sin6_family = libc::AF_INET6 as u16;
                    sa.sin6_addr.s6_addr = a.octets();
                    libc::sendto(
                        fd,
                        p.as_ptr().cast(),
                        p.len(),
                        0,
                        (&raw const sa).cast(),
                        size_of::<libc::sockaddr_in6>() as u32,
                    )
                }
            };
            assert_eq!(
                n,
                p.len() as isize,
                "raw sendto: {}",
                std::io::Error::last_os_error()
            );
        }
        libc::close(fd);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destination_options_fill_their_length_with_valid_options() {
        for len in [8, 16, 64, 520, 2048] {
            let h = dest_opts(6, len);
            assert_eq!(h.len(), len);
            // Walk the options: each fits, and padding never runs over 7 bytes (Linux's rule).
            let (mut at, mut options) = (2, 0);
            while at < len {
                match h[at] {
                    0 => at += 1,
                    1 => {
                        assert!(h[at + 1] <= 5, "PadN of {} at {at}", h[at + 1]);
                        at += 2 + h[at + 1] as usize;
                    }
                    0x1e => {
                        options += 1;
                        at += 2 + h[at + 1] as usize;
                    }
                    t => panic!("option {t} at {at}"),
                }
            }
            assert_eq!(at, len);
            assert!(options <= 8, "{options} options in {len} bytes");
        }
    }

    #[test]
    fn checksums_verify() {
        let (s, d) = (IpAddr::from([10, 0, 0, 2]), IpAddr::from([10, 0, 0, 1]));
        let seg = tcp_segment(s, d, 1, 2, 3, 4, PSH_ACK, b"hello");
        // A correct checksum sums (with the pseudo header) to all ones.
        let mut zeroed = seg.clone();
        zeroed[16..18].copy_from_slice(&[0, 0]);
        assert_eq!(
            l4_checksum(s, d, TCP, &zeroed),
            u16::from_be_bytes([seg[16], seg[17]])
        );
        let frags = ipv4_fragments([10, 0, 0, 2].into(), [10, 0, 0, 1].into(), TCP, 7, &seg, 8);
        assert_eq!(frags.len(), 2);
        assert_eq!(fold(0, &frags[0][..20]), 0xffff);
        assert_eq!(&frags[0][20..], &seg[..8]);
        assert_eq!(&frags[1][20..], &seg[8..]);
    }
}
