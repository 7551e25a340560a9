//! The access log: one line per connection a listener accepted, when it ends (nginx's
//! `access_log`, HAProxy's `option tcplog`), through the daemon's log under the target
//! `gateway::access`: text or JSON as `--log-format` says, written by the log's own thread
//! (`crate::logging`), so a slow reader never stalls a worker. `RUST_LOG=gateway::access=off`
//! or a listener's `access_log: false` turns it off.

use std::{fmt, net::SocketAddr, time::Duration};

use super::{relay::Bytes, stats::HandshakeKind, stats::Outcome};

/// What one connection was, filled in as it goes.
#[derive(Debug, Default)]
pub struct Entry {
    /// The server name the client asked for (SNI), once the handshake finished.
    pub sni: Option<String>,
    /// The TLS version negotiated.
    pub version: Option<rustls::ProtocolVersion>,
    /// The handshake's kind.
    pub kind: Option<HandshakeKind>,
    /// The backend member that served it (or the last one tried, when none could).
    pub backend: Option<SocketAddr>,
    /// Application bytes read from the client (its first bytes, read before a backend place,
    /// included) and from the backend.
    pub bytes: Bytes,
}

/// Logs the connection of `client` to `listener`, ended with `outcome` after `took`.
pub fn log(listener: &str, client: SocketAddr, e: &Entry, outcome: Outcome, took: Duration) {
    tracing::info!(
        target: "gateway::access",
        listener,
        client = %client,
        sni = e.sni.as_deref().unwrap_or("-"),
        tls = version_name(e.version),
        handshake = e.kind.map_or("-", HandshakeKind::name),
        backend = %Dash(e.backend),
        bytes_in = e.bytes.from_client,
        bytes_out = e.bytes.to_client,
        duration_ms = (took.as_secs_f64() * 1e6).round() / 1e3,
        outcome = outcome.name(),
        "connection"
    );
}

/// The version's name as OpenSSL and nginx's `$ssl_protocol` write it; `-` before one.
fn version_name(v: Option<rustls::ProtocolVersion>) -> &'static str {
    match v {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
        Some(_) => "other",
        None => "-",
    }
}

/// A value, or `-` where there is none (as access logs write an empty field).
struct Dash<T>(Option<T>);

impl<T: fmt::Display> fmt::Display for Dash<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("-"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_named_as_openssl_names_them_and_missing_values_are_dashes() {
        assert_eq!(
            version_name(Some(rustls::ProtocolVersion::TLSv1_3)),
            "TLSv1.3"
        );
        assert_eq!(
            version_name(Some(rustls::ProtocolVersion::TLSv1_2)),
            "TLSv1.2"
        );
        assert_eq!(version_name(None), "-");
        let none: Option<SocketAddr> = None;
        assert_eq!(Dash(none).to_string(), "-");
        let some: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        assert_eq!(Dash(Some(some)).to_string(), "127.0.0.1:8080");
    }
}
