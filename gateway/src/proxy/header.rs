//! The PROXY protocol v2 header a backend receives first, carrying the client's address.

use std::net::{IpAddr, SocketAddr};

use ppp::v2::{Builder, Command, Protocol, Version};

/// The header for a TCP connection from `client` to `local` (IPv4-mapped addresses are sent as
/// IPv4 when both ends are; otherwise both are sent as IPv6).
pub fn proxy_v2(client: SocketAddr, local: SocketAddr) -> std::io::Result<Vec<u8>> {
    let canon = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (mut c, mut l) = (canon(client), canon(local));
    if c.is_ipv4() != l.is_ipv4() {
        let v6 = |a: SocketAddr| match a.ip() {
            IpAddr::V4(v4) => SocketAddr::new(IpAddr::V6(v4.to_ipv6_mapped()), a.port()),
            IpAddr::V6(_) => a,
        };
        (c, l) = (v6(c), v6(l));
    }
    Builder::with_addresses(Version::Two | Command::Proxy, Protocol::Stream, (c, l)).build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn carries_the_client_address() {
        let h = proxy_v2(
            "10.99.0.2:40000".parse().unwrap(),
            "10.99.0.1:443".parse().unwrap(),
        )
        .unwrap();
        let parsed = ppp::v2::Header::try_from(h.as_slice()).unwrap();
        assert_eq!(
            parsed.addresses,
            ppp::v2::Addresses::IPv4(ppp::v2::IPv4::new(
                [10, 99, 0, 2],
                [10, 99, 0, 1],
                40000,
                443
            ))
        );
        // Mapped IPv4 on a dual-stack socket goes out as IPv4; a real mix goes out as IPv6.
        let h = proxy_v2(
            "[::ffff:10.99.0.2]:1".parse().unwrap(),
            "10.99.0.1:2".parse().unwrap(),
        )
        .unwrap();
        assert!(matches!(
            ppp::v2::Header::try_from(h.as_slice()).unwrap().addresses,
            ppp::v2::Addresses::IPv4(_)
        ));
        let h = proxy_v2(
            "10.0.0.1:1".parse().unwrap(),
            "[fd00::1]:2".parse().unwrap(),
        )
        .unwrap();
        assert!(matches!(
            ppp::v2::Header::try_from(h.as_slice()).unwrap().addresses,
            ppp::v2::Addresses::IPv6(_)
        ));
    }
}
