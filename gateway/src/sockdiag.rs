//! Destroys TCP sockets through sock_diag's `SOCK_DESTROY` (the mechanism behind `ss -K`), and
//! asks whether one still exists.
//!
//! When the datapath rejects a TLS connection it drops the ClientHello at the NIC. The server's
//! socket for that connection already exists (the TCP handshake finished before the hello was
//! sent), and left alone it would wait for a hello that never comes until the server times it
//! out. Destroying it calls the kernel's `tcp_abort`, which frees the socket and sends the client
//! a reset: the client hears at once, and nothing lingers. It needs `CONFIG_INET_DIAG_DESTROY`
//! and CAP_NET_ADMIN, and it works in the network namespace the daemon runs in.
//!
//! The kernel's lookup by 4-tuple falls back to the listening socket when the connection is gone,
//! and destroying that would take the whole service down. So each destruction is two requests:
//! first the socket is looked up (`SOCK_DIAG_BY_FAMILY`); a listener, or any socket whose peer is
//! not the client, is left alone; then it is destroyed by its cookie, which the kernel checks, so a
//! socket that changed in between is refused (ESTALE) rather than hit.

use std::{
    io,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
};

use thiserror::Error;

const NETLINK_SOCK_DIAG: i32 = 4;
const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const TCP_LISTEN: u8 = 10;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;
const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: usize = 16;
/// inet_diag_req_v2: family, protocol, ext, pad, states, then inet_diag_sockid (48 bytes).
const REQ_LEN: usize = 8 + 48;

/// Errors of socket destruction.
#[derive(Debug, Error)]
pub enum SockDiagError {
    /// The netlink socket could not be used.
    #[error("sock_diag netlink: {0}")]
    Netlink(io::Error),
    /// The kernel refused (ENOENT: no such socket; EOPNOTSUPP: no INET_DIAG_DESTROY).
    #[error("SOCK_DESTROY {local} <- {remote}: {source}")]
    Destroy {
        /// Server side.
        local: SocketAddr,
        /// Client side.
        remote: SocketAddr,
        /// The kernel's answer.
        source: io::Error,
    },
}

impl SockDiagError {
    /// Whether the connection's socket simply was not there (already closed, or another
    /// namespace).
    pub fn is_not_found(&self) -> bool {
        matches!(self, SockDiagError::Destroy { source, .. } if source.raw_os_error() == Some(libc::ENOENT))
    }
}

/// A netlink sock_diag socket.
pub struct SockDiag {
    fd: std::os::fd::OwnedFd,
    seq: u32,
}

impl SockDiag {
    /// Opens the netlink socket.
    pub fn new() -> Result<Self, SockDiagError> {
        use std::os::fd::FromRawFd as _;
        // SAFETY: plain socket(2); the fd is owned from here on.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(SockDiagError::Netlink(io::Error::last_os_error()));
        }
        // SAFETY: fd was just returned by socket(2) and is owned by nobody else.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        Ok(SockDiag { fd, seq: 0 })
    }

    /// Destroys the TCP socket whose local end is `local` and whose peer is `remote`. An IPv4
    /// connection is looked for as AF_INET, then as an IPv4-mapped AF_INET6 socket (a dual-stack
    /// listener's).
    pub fn destroy_tcp(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Result<(), SockDiagError> {
        let mut last = io::Error::from_raw_os_error(libc::ENOENT);
        for (family, src, dst) in families(local, remote) {
            match self.request(family, local.port(), &src, remote.port(), &dst) {
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => last = e,
                other => {
                    return other.map_err(|source| SockDiagError::Destroy {
                        local,
                        remote,
                        source,
                    });
                }
            }
        }
        Err(SockDiagError::Destroy {
            local,
            remote,
            source: last,
        })
    }

    /// Whether the kernel still has the TCP connection whose local end is `local` and whose
    /// peer is `remote` (established, a request socket, or closing), as AF_INET and then as an
    /// IPv4-mapped AF_INET6 socket; a lookup that falls back to the listener is no connection.
    pub fn tcp_exists(
        &mut self,
        local: SocketAddr,
        remote: SocketAddr,
    ) -> Result<bool, SockDiagError> {
        for (family, src, dst) in families(local, remote) {
            match self.lookup(family, local.port(), &src, remote.port(), &dst) {
                Ok(Some(_)) => return Ok(true),
                Ok(None) => {}
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => {}
                Err(source) => {
                    return Err(SockDiagError::Destroy {
                        local,
                        remote,
                        source,
                    });
                }
            }
        }
        Ok(false)
    }

    /// Looks a connection up: its cookie, or `None` when the lookup fell back to the listener
    /// (the connection is gone).
    fn lookup(
        &mut self,
        family: u8,
        sport: u16,
        src: &[u8; 16],
        dport: u16,
        dst: &[u8; 16],
    ) -> io::Result<Option<[u8; 8]>> {
        let reply = self.exchange(
            SOCK_DIAG_BY_FAMILY,
            family,
            sport,
            src,
            dport,
            dst,
            [0xff; 8],
        )?;
        // inet_diag_msg: family, state, timer, retrans, then the sockid (48 bytes: ports,
        // addresses, interface, cookie).
        let msg = &reply[NLMSG_HDRLEN..];
        if msg.len() < 4 + 48 {
            return Err(io::Error::other("short sock_diag reply"));
        }
        let state = msg[1];
        let peer_port = u16::from_be_bytes([msg[6], msg[7]]);
        if state == TCP_LISTEN || peer_port != dport {
            return Ok(None);
        }
        let mut cookie = [0u8; 8];
        cookie.copy_from_slice(&msg[4 + 40..4 + 48]);
        Ok(Some(cookie))
    }

    /// Looks the connection up, then destroys it by cookie.
    fn request(
        &mut self,
        family: u8,
        sport: u16,
        src: &[u8; 16],
        dport: u16,
        dst: &[u8; 16],
    ) -> io::Result<()> {
        // A lookup that fell back to the listener: the connection is gone.
        let cookie = self
            .lookup(family, sport, src, dport, dst)?
            .ok_or_else(|| io::Error::from_raw_os_error(libc::ENOENT))?;
        self.exchange(SOCK_DESTROY, family, sport, src, dport, dst, cookie)
            .map(drop)
    }

    /// Sends one request and returns its reply (an NLMSG_ERROR with code 0 for an ACK, or the
    /// answer message); a non-zero error code is returned as the error.
    #[allow(clippy::too_many_arguments)]
    fn exchange(
        &mut self,
        kind: u16,
        family: u8,
        sport: u16,
        src: &[u8; 16],
        dport: u16,
        dst: &[u8; 16],
        cookie: [u8; 8],
    ) -> io::Result<Vec<u8>> {
        use std::os::fd::AsRawFd as _;
        self.seq = self.seq.wrapping_add(1);
        let mut msg = [0u8; NLMSG_HDRLEN + REQ_LEN];
        msg[0..4].copy_from_slice(&((NLMSG_HDRLEN + REQ_LEN) as u32).to_ne_bytes());
        msg[4..6].copy_from_slice(&kind.to_ne_bytes());
        let flags = if kind == SOCK_DESTROY {
            NLM_F_REQUEST | NLM_F_ACK
        } else {
            NLM_F_REQUEST
        };
        msg[6..8].copy_from_slice(&flags.to_ne_bytes());
        msg[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        let req = &mut msg[NLMSG_HDRLEN..];
        req[0] = family;
        req[1] = libc::IPPROTO_TCP as u8;
        // idiag_states: any.
        req[4..8].copy_from_slice(&u32::MAX.to_ne_bytes());
        let id = &mut req[8..];
        id[0..2].copy_from_slice(&sport.to_be_bytes());
        id[2..4].copy_from_slice(&dport.to_be_bytes());
        id[4..20].copy_from_slice(src);
        id[20..36].copy_from_slice(dst);
        // idiag_if 0, then the cookie (all ones: INET_DIAG_NOCOOKIE).
        id[40..48].copy_from_slice(&cookie);
        let fd = self.fd.as_raw_fd();
        let mut reply = vec![0u8; 1024];
        // SAFETY: send and recv on an owned socket with buffers of the given lengths.
        let n = unsafe {
            let mut addr: libc::sockaddr_nl = std::mem::zeroed();
            addr.nl_family = libc::AF_NETLINK as u16;
            let sent = libc::sendto(
                fd,
                msg.as_ptr().cast(),
                msg.len(),
                0,
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            );
            if sent < 0 {
                return Err(io::Error::last_os_error());
            }
            libc::recv(fd, reply.as_mut_ptr().cast(), reply.len(), 0)
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        reply.truncate(n as usize);
        if reply.len() < NLMSG_HDRLEN + 4 {
            return Err(io::Error::other("short sock_diag reply"));
        }
        if u16::from_ne_bytes([reply[4], reply[5]]) == NLMSG_ERROR {
            let code = i32::from_ne_bytes([reply[16], reply[17], reply[18], reply[19]]);
            if code != 0 {
                return Err(io::Error::from_raw_os_error(-code));
            }
        }
        Ok(reply)
    }
}

/// The families and addresses a connection from `remote` to `local` may be found under, in
/// order: an IPv4 one as AF_INET, then as an IPv4-mapped AF_INET6 socket (a dual-stack
/// listener's); any other as AF_INET6.
fn families(local: SocketAddr, remote: SocketAddr) -> Vec<(u8, [u8; 16], [u8; 16])> {
    match (local.ip(), remote.ip()) {
        (IpAddr::V4(l), IpAddr::V4(r)) => vec![
            (libc::AF_INET as u8, v4(l), v4(r)),
            (
                libc::AF_INET6 as u8,
                l.to_ipv6_mapped().octets(),
                r.to_ipv6_mapped().octets(),
            ),
        ],
        (l, r) => vec![(libc::AF_INET6 as u8, v6(l).octets(), v6(r).octets())],
    }
}

fn v4(a: Ipv4Addr) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..4].copy_from_slice(&a.octets());
    out
}

fn v6(a: IpAddr) -> Ipv6Addr {
    match a {
        IpAddr::V4(a) => a.to_ipv6_mapped(),
        IpAddr::V6(a) => a,
    }
}

/// The (server, client) socket addresses of a datapath flow key.
pub fn flow_addrs(key: &gateway_common::maps::FlowKey) -> (SocketAddr, SocketAddr) {
    let ip = |b: [u8; 16]| {
        let a = Ipv6Addr::from(b);
        a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4)
    };
    (
        SocketAddr::new(ip(key.daddr), key.dport),
        SocketAddr::new(ip(key.saddr), key.sport),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flow_keys_map_to_socket_addresses() {
        let mut key = gateway_common::maps::FlowKey {
            sport: 40000,
            dport: 443,
            ..Default::default()
        };
        key.saddr[10..].copy_from_slice(&[0xff, 0xff, 10, 99, 0, 2]);
        key.daddr[10..].copy_from_slice(&[0xff, 0xff, 10, 99, 0, 1]);
        let (server, client) = flow_addrs(&key);
        assert_eq!(server, "10.99.0.1:443".parse().unwrap());
        assert_eq!(client, "10.99.0.2:40000".parse().unwrap());
        key.saddr = "fd00::2".parse::<Ipv6Addr>().unwrap().octets();
        assert_eq!(flow_addrs(&key).1, "[fd00::2]:40000".parse().unwrap());
    }

    /// A real loopback connection is destroyed: the accepted socket errors and the client reads a
    /// reset. (Needs CAP_NET_ADMIN; skipped without it.)
    #[test]
    fn destroys_a_real_loopback_connection() {
        use std::io::Read as _;
        if !nix::unistd::geteuid().is_root() {
            eprintln!("SKIP destroys_a_real_loopback_connection: needs CAP_NET_ADMIN (not root)");
            return;
        }
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        let (local, remote) = (server.local_addr().unwrap(), server.peer_addr().unwrap());
        let mut diag = SockDiag::new().unwrap();
        diag.destroy_tcp(local, remote).unwrap();
        let mut buf = [0u8; 1];
        let err = client.read(&mut buf).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
        // Gone now: a second destruction finds only the listener and must leave it alone.
        let again = diag.destroy_tcp(local, remote).unwrap_err();
        assert!(again.is_not_found(), "{again}");
        let mut next = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (mut accepted, _) = listener.accept().unwrap();
        std::io::Write::write_all(&mut next, b"x").unwrap();
        let mut one = [0u8; 1];
        accepted.read_exact(&mut one).unwrap();
        assert_eq!(&one, b"x", "the listener still serves");
    }
}
