//! Addresses as operators write them: `IP:PORT`, `[IPv6]:PORT`, or `HOST:PORT` looked up when
//! the config is read (at start, at each reload, by `config check`), its first IPv4 address
//! before any IPv6 one. A name is resolved then and not followed after: a backend whose
//! address changes in DNS is reached at its new address after the next reload.

use std::net::{SocketAddr, ToSocketAddrs as _};

use serde::{Deserialize as _, Deserializer, de::Error as _};

/// `text` as a socket address; why not, naming it.
pub fn resolve(text: &str) -> Result<SocketAddr, String> {
    if let Ok(addr) = text.parse() {
        return Ok(addr);
    }
    let shape = || format!("address {text:?}: write IP:PORT, [IPv6]:PORT or HOST:PORT");
    let (host, port) = text.rsplit_once(':').ok_or_else(shape)?;
    if host.is_empty() || host.contains(['[', ']', ' ']) {
        return Err(shape());
    }
    let port: u16 = port
        .parse()
        .map_err(|_| format!("address {text:?}: port {port:?} is not 0 to 65535"))?;
    let found: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("address {text:?}: {host} does not resolve ({e})"))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .ok_or_else(|| format!("address {text:?}: {host} resolves to no address"))
}

/// Deserializes an address written as [`resolve`] takes it.
pub fn de_addr<'de, D: Deserializer<'de>>(d: D) -> Result<SocketAddr, D::Error> {
    resolve(&String::deserialize(d)?).map_err(D::Error::custom)
}

/// [`de_addr`] of an optional address.
pub fn de_opt_addr<'de, D: Deserializer<'de>>(d: D) -> Result<Option<SocketAddr>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|t| resolve(&t).map_err(D::Error::custom))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_taken_as_written_and_names_looked_up() {
        assert_eq!(resolve("10.0.0.1:443"), Ok("10.0.0.1:443".parse().unwrap()));
        assert_eq!(resolve("[::1]:9477"), Ok("[::1]:9477".parse().unwrap()));
        // localhost: IPv4 first, whatever order the resolver gives.
        assert_eq!(
            resolve("localhost:9477"),
            Ok("127.0.0.1:9477".parse().unwrap())
        );
        for (bad, said) in [
            ("localhost", "write IP:PORT"),
            (":443", "write IP:PORT"),
            ("localhost:99999", "port \"99999\" is not 0 to 65535"),
            (
                "no-such-host.invalid:443",
                "no-such-host.invalid does not resolve",
            ),
        ] {
            let e = resolve(bad).unwrap_err();
            assert!(e.contains(said) && e.contains(&format!("{bad:?}")), "{e}");
        }
    }
}
