//! The `proxies` section of the configuration: TLS listeners, their backend pools and timeouts.

use std::{net::SocketAddr, time::Duration};

use serde::{Deserialize, Deserializer, Serialize};

pub use crate::span::{MAX_SPAN, Span};
use crate::tls::config::TlsConfig;

/// One TLS listener proxying to a backend pool.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, try_from = "RawProxy")]
pub struct ProxyConfig {
    /// Address to listen on (its port becomes a protected, daemon-terminated TLS service).
    pub listen: SocketAddr,
    /// Certificates, sessions and tickets.
    pub tls: TlsConfig,
    /// The pool.
    pub backends: Vec<BackendConfig>,
    /// Send a PROXY protocol v2 header with the client's address to each backend connection.
    pub proxy_protocol: bool,
    /// Timeouts.
    pub timeouts: Timeouts,
    /// How long a member that failed `max_fails` times in a row stays marked down.
    pub retry_interval: Span,
    /// Failed connects in a row (each within `retry_interval` of the last) that mark a member
    /// down (nginx's `max_fails`, HAProxy's `fall`). The last member up is never marked down
    /// for connects that timed out (a busy member, not a dead one).
    pub max_fails: u32,
    /// The listen queue: connections the kernel holds for the proxy to accept.
    pub listen_backlog: u32,
    /// What the clients speak inside TLS: with `http`, a client refused after its handshake (no
    /// member, queue deadline passed) gets an HTTP 503 with Retry-After before the close.
    pub protocol: AppProtocol,
    /// Application protocols offered by ALPN, in the server's order of preference (`h2`,
    /// `http/1.1`); empty: none negotiated. A connection that negotiated one goes only to the
    /// members whose `alpn` lists it.
    pub alpn: Vec<String>,
    /// Active checks of the members, apart from client traffic; absent: none (a member is
    /// marked down only by the connects it fails, `max_fails`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Connections of one client address (an IPv6 /64) that may hold backend places at once
    /// (nginx's `limit_conn`); past them a connection is refused after its handshake, as when no
    /// member has room. 0: no bound. Default 32.
    pub max_per_client: u32,
    /// The backends speak first (IMAP, POP3, SMTP over TLS): a connection reserves its backend
    /// place right after its handshake. Otherwise (default) only once the client has sent its
    /// first byte, within `timeouts.request`: a connection that finished its handshake and sends
    /// nothing holds no backend place.
    pub server_speaks_first: bool,
    /// One line per connection in the daemon's log (target `gateway::access`: client, SNI, TLS
    /// version, resumed or not, backend, bytes each way, duration, outcome; JSON with
    /// `--log-format json`), as nginx's `access_log`. Default on; `false` writes none.
    pub access_log: bool,
}

/// Active checks of a listener's members (HAProxy's `check`, nginx's `health_check`): each is
/// probed every `interval`, a TCP connect or an HTTP GET, and marked down after `fall` failed
/// probes in a row, up again after `rise` passed ones. The first probe, made before the
/// listener accepts its first connection, decides alone: a member dead at start is down before
/// any client meets it.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, try_from = "RawHealthCheck")]
pub struct HealthCheck {
    /// How often each member is probed.
    pub interval: Span,
    /// How long a probe may take (at most `interval`).
    pub timeout: Span,
    /// Failed probes in a row that mark a member down, 1 to 100.
    pub fall: u32,
    /// Passed probes in a row that bring it back, 1 to 100.
    pub rise: u32,
    /// An HTTP/1.1 `GET` of this path (from `/`), passed by a 2xx or 3xx status; absent: a
    /// TCP connect.
    pub http_path: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHealthCheck {
    #[serde(default = "t2")]
    interval: Span,
    #[serde(default = "t1")]
    timeout: Span,
    #[serde(default = "three")]
    fall: u32,
    #[serde(default = "two")]
    rise: u32,
    #[serde(default)]
    http_path: Option<String>,
}

fn t1() -> Span {
    Span(Duration::from_secs(1))
}
fn t2() -> Span {
    Span(Duration::from_secs(2))
}
fn two() -> u32 {
    2
}
fn three() -> u32 {
    3
}

impl TryFrom<RawHealthCheck> for HealthCheck {
    type Error = String;
    fn try_from(r: RawHealthCheck) -> Result<Self, String> {
        for (what, v) in [("fall", r.fall), ("rise", r.rise)] {
            if !(1..=100).contains(&v) {
                return Err(format!("health_check.{what} {v} out of range 1..=100"));
            }
        }
        if r.timeout.0 > r.interval.0 {
            return Err(format!(
                "health_check.timeout {} is longer than its interval {}",
                humantime::format_duration(r.timeout.0),
                humantime::format_duration(r.interval.0)
            ));
        }
        if let Some(path) = &r.http_path
            && (!path.starts_with('/')
                || path.len() > 1024
                || path.chars().any(|c| c.is_whitespace() || c.is_control()))
        {
            return Err(format!(
                "health_check.http_path {path:?}: a path from '/', without spaces or controls, at most 1024 bytes"
            ));
        }
        Ok(HealthCheck {
            interval: r.interval,
            timeout: r.timeout,
            fall: r.fall,
            rise: r.rise,
            http_path: r.http_path,
        })
    }
}

/// What a listener's clients speak inside TLS.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AppProtocol {
    /// Any bytes: a refusal after the handshake is a close with close_notify.
    #[default]
    Tcp,
    /// HTTP/1.x: a refusal after the handshake is a `503 Service Unavailable` with Retry-After.
    Http,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProxy {
    #[serde(deserialize_with = "crate::address::de_addr")]
    listen: SocketAddr,
    #[serde(default)]
    tls: TlsConfig,
    backends: Vec<BackendConfig>,
    #[serde(default)]
    proxy_protocol: bool,
    #[serde(default)]
    timeouts: Timeouts,
    #[serde(default = "default_retry")]
    retry_interval: Span,
    #[serde(default = "default_max_fails", deserialize_with = "de_max_fails")]
    max_fails: u32,
    #[serde(
        default = "default_listen_backlog",
        deserialize_with = "de_listen_backlog"
    )]
    listen_backlog: u32,
    #[serde(default)]
    protocol: AppProtocol,
    #[serde(default)]
    alpn: Vec<String>,
    #[serde(default)]
    health_check: Option<HealthCheck>,
    #[serde(
        default = "default_max_per_client",
        deserialize_with = "de_max_per_client"
    )]
    max_per_client: u32,
    #[serde(default)]
    server_speaks_first: bool,
    #[serde(default = "yes")]
    access_log: bool,
}

fn yes() -> bool {
    true
}

/// One address's share of a listener's backend places: room for a busy NAT or a browser's
/// parallel connections, far from a default member's 200.
fn default_max_per_client() -> u32 {
    32
}

fn default_retry() -> Span {
    Span(Duration::from_secs(10))
}

/// HAProxy's `fall` default: one failure is a blip, three in a row a member in trouble.
fn default_max_fails() -> u32 {
    3
}

/// The default listen queue: nginx's 511 doubled, as a proxy holds a connection only for its
/// handshake before it is served.
fn default_listen_backlog() -> u32 {
    1024
}

impl TryFrom<RawProxy> for ProxyConfig {
    type Error = String;
    fn try_from(r: RawProxy) -> Result<Self, String> {
        if r.backends.is_empty() {
            return Err("backends: at least one backend is needed".into());
        }
        if let Some((i, b)) = r
            .backends
            .iter()
            .enumerate()
            .find(|(i, b)| r.backends[..*i].iter().any(|o| o.address == b.address))
        {
            return Err(format!("backends[{i}]: duplicate address {}", b.address));
        }
        check_alpn("alpn", &r.alpn)?;
        for (i, b) in r.backends.iter().enumerate() {
            check_alpn(&format!("backends[{i}].alpn"), &b.alpn)?;
        }
        if let Some((i, p)) = r
            .alpn
            .iter()
            .enumerate()
            .find(|(_, p)| !r.backends.iter().any(|b| b.alpn.contains(p)))
        {
            return Err(format!(
                "alpn[{i}]: no backend takes {p:?}: list it in the `alpn` of the members that speak it (in cleartext; h2 with prior knowledge)"
            ));
        }
        Ok(ProxyConfig {
            listen: r.listen,
            tls: r.tls,
            backends: r.backends,
            proxy_protocol: r.proxy_protocol,
            timeouts: r.timeouts,
            retry_interval: r.retry_interval,
            max_fails: r.max_fails,
            listen_backlog: r.listen_backlog,
            protocol: r.protocol,
            alpn: r.alpn,
            health_check: r.health_check,
            max_per_client: r.max_per_client,
            server_speaks_first: r.server_speaks_first,
            access_log: r.access_log,
        })
    }
}

/// One member of a backend pool (seed 004's cluster member).
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    /// Plain TCP address (`IP:PORT` or `HOST:PORT`, looked up when the config is read).
    #[serde(deserialize_with = "crate::address::de_addr")]
    pub address: SocketAddr,
    /// Share of new connections relative to the other members, 1 to 1000.
    #[serde(default = "one", deserialize_with = "de_weight")]
    pub weight: u32,
    /// Connections it serves at once (its worker threads), at least 1.
    #[serde(default = "default_active", deserialize_with = "de_active")]
    pub max_active: u32,
    /// Connections that may wait for one of those; beyond, the member is full.
    #[serde(default = "default_backlog", deserialize_with = "de_backlog")]
    pub backlog: u32,
    /// The application protocols it takes in cleartext (`h2` with prior knowledge, `http/1.1`),
    /// for listeners that negotiate ALPN: a connection that negotiated one is sent only to
    /// members that list it. Default: `[http/1.1]`.
    #[serde(default = "default_member_alpn")]
    pub alpn: Vec<String>,
}

fn default_member_alpn() -> Vec<String> {
    vec!["http/1.1".to_string()]
}

/// Checks an ALPN list named `what`: each name 1 to 255 bytes (RFC 7301), none twice.
fn check_alpn(what: &str, list: &[String]) -> Result<(), String> {
    for (i, p) in list.iter().enumerate() {
        if p.is_empty() || p.len() > 255 {
            return Err(format!(
                "{what}[{i}]: a protocol name is 1 to 255 bytes, got {}",
                p.len()
            ));
        }
        if list[..i].contains(p) {
            return Err(format!("{what}[{i}]: {p:?} is listed twice"));
        }
    }
    Ok(())
}

fn one() -> u32 {
    1
}
fn default_active() -> u32 {
    100
}
fn default_backlog() -> u32 {
    100
}

fn ranged<'de, D: Deserializer<'de>>(
    d: D,
    what: &'static str,
    min: u32,
    max: u32,
) -> Result<u32, D::Error> {
    let v = crate::count::Count {
        what,
        min: u64::from(min),
        max: u64::from(max),
    }
    .read(d)?;
    Ok(v as u32)
}
fn de_max_fails<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "max_fails", 1, 100)
}
fn de_max_per_client<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "max_per_client", 0, 1_000_000)
}
fn de_listen_backlog<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "listen_backlog", 1, 65535)
}
fn de_weight<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "weight", 1, 1000)
}
fn de_active<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "max_active", 1, 1_000_000)
}
fn de_backlog<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    ranged(d, "backlog", 0, 1_000_000)
}

/// Timeouts of a listener.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Timeouts {
    /// From accept to the end of the TLS handshake (slowloris bound).
    #[serde(default = "t10")]
    pub handshake: Span,
    /// A proxied connection with no bytes either way for this long is closed.
    #[serde(default = "t60")]
    pub idle: Span,
    /// Connecting to a backend member; beyond, it is marked down.
    #[serde(default = "t3")]
    pub connect: Span,
    /// A client's whole wait for a backend slot, across every member's backlog it waits in
    /// (HAProxy's `timeout queue`); beyond, it is refused.
    #[serde(default = "t10")]
    pub queue: Span,
    /// From the end of the handshake to the client's first byte (HAProxy's `timeout
    /// http-request`, nginx's `client_header_timeout`); beyond, the connection is closed, having
    /// held no backend place. Not for a listener whose servers speak first.
    #[serde(default = "t10")]
    pub request: Span,
    /// On SIGTERM, how long in-flight connections may take to finish.
    #[serde(default = "t30")]
    pub drain: Span,
}

fn t3() -> Span {
    Span(Duration::from_secs(3))
}
fn t10() -> Span {
    Span(Duration::from_secs(10))
}
fn t30() -> Span {
    Span(Duration::from_secs(30))
}
fn t60() -> Span {
    Span(Duration::from_secs(60))
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            handshake: t10(),
            idle: t60(),
            connect: t3(),
            queue: t10(),
            request: t10(),
            drain: t30(),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Config;
    use crate::tls::config::TlsVersion;
    use gateway_common::maps::{SERVICE_SYN_COOKIES, SERVICE_TERMINATED};

    fn err(yaml: &str) -> String {
        Config::parse(yaml, "t.yaml").unwrap_err().to_string()
    }

    #[test]
    fn a_full_proxy_section_parses() {
        let c = Config::parse(
            "proxies:\n  - listen: 127.0.0.1:8443\n    tls: {cert: /c.pem, key: /k.pem, ticket_rotation: 30m}\n    backends:\n      - {address: 127.0.0.1:8080, weight: 3, max_active: 4, backlog: 2}\n    proxy_protocol: true\n    timeouts: {handshake: 500ms}\n",
            "t",
        )
        .unwrap();
        let p = &c.proxies[0];
        assert_eq!(p.backends[0].weight, 3);
        assert_eq!(p.timeouts.handshake.0.as_millis(), 500);
        assert_eq!(p.timeouts.idle.0.as_secs(), 60);
        assert_eq!(p.tls.ticket_rotation.0.as_secs(), 1800);
        assert!(p.tls.cert_key.is_some());
        // The listener's port is a terminated tls service.
        let (key, value) = c.all_services_where(false)[0];
        assert_eq!((key.port, value.flags), (8443, SERVICE_TERMINATED));
        // With SYN cookies where the kernel can hand connections over.
        let (_, value) = c.all_services_where(true)[0];
        assert_eq!(value.flags, SERVICE_TERMINATED | SERVICE_SYN_COOKIES);
    }

    #[test]
    fn bad_proxy_sections_name_the_field() {
        let e = err("proxies:\n  - listen: 127.0.0.1:8443\n    backends: []\n");
        assert!(e.contains("at least one backend"), "{e}");
        assert!(e.contains("proxies"), "{e}");
        assert!(e.contains("line 2"), "{e}");
        let e = err(
            "proxies:\n  - listen: 127.0.0.1:8443\n    tls: {cert: /c.pem}\n    backends: [{address: 127.0.0.1:1}]\n",
        );
        assert!(e.contains("cert is given without key"), "{e}");
        let e = err(
            "proxies:\n  - listen: 127.0.0.1:8443\n    backends: [{address: 127.0.0.1:1, weight: 0}]\n",
        );
        assert!(e.contains("weight 0 out of range"), "{e}");
        assert!(e.contains("line 3"), "{e}");
        let e = err(
            "proxies:\n  - listen: 127.0.0.1:8443\n    backends: [{address: 127.0.0.1:1}]\n    timeouts: {idle: soon}\n",
        );
        assert!(e.contains("invalid duration 'soon'"), "{e}");
        let e = err(
            "proxies:\n  - listen: 127.0.0.1:8443\n    backends: [{address: 127.0.0.1:1}, {address: 127.0.0.1:1}]\n",
        );
        assert!(e.contains("backends[1]: duplicate address"), "{e}");
        // A proxy's port given to SIP over TCP: SIP is classified over UDP only, which says
        // so first.
        let e = err(
            "services: [{kind: sip, port: 8443, proto: tcp}]\nproxies:\n  - listen: 127.0.0.1:8443\n    backends: [{address: 127.0.0.1:1}]\n",
        );
        assert!(
            e.contains("services[0].proto: sip is classified over udp only"),
            "{e}"
        );
        // SNI certificates, the oldest version, the suites: each named where it is wrong.
        let tls = |body: &str| {
            err(&format!(
                "proxies:\n  - listen: 127.0.0.1:8443\n    backends: [{{address: 127.0.0.1:1}}]\n    tls: {body}\n"
            ))
        };
        assert!(
            tls("{sni: [{names: [Two.Test], cert: c, key: k}]}")
                .contains("tls.sni[0].names[0]: \"Two.Test\" is not a lower-case host name")
        );
        assert!(
            tls("{sni: [{names: [a.test], cert: c, key: k}, {names: [b.test, a.test], cert: c, key: k}]}")
                .contains("tls.sni[1].names[1]: \"a.test\" is also tls.sni[0]'s")
        );
        assert!(tls("{sni: [{names: [], cert: c, key: k}]}").contains("tls.sni[0].names"));
        assert!(tls("{min_version: 1.4}").contains("min_version \"1.4\" is not one of: 1.2, 1.3"));
        assert!(
            tls("{cipher_suites: [TLS13_ROT13]}")
                .contains("tls.cipher_suites[0]: \"TLS13_ROT13\" is not one of: TLS13_")
        );
        assert!(
            tls("{cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]}")
                .contains("none for TLS 1.3")
        );
        let c = crate::config::Config::parse(
            "proxies:\n  - listen: 127.0.0.1:8443\n    backends: [{address: 127.0.0.1:1}]\n    tls: {min_version: 1.3, cipher_suites: [TLS13_AES_256_GCM_SHA384], sni: [{names: ['*.a.test'], cert: c, key: k}]}\n",
            "t",
        )
        .unwrap();
        let t = &c.proxies[0].tls;
        assert_eq!(t.min_version, TlsVersion::V13);
        assert!(t.sni[0].serves("x.a.test") && !t.sni[0].serves("a.test"));
        // Active checks: bounds named.
        let hc = |body: &str| {
            err(&format!(
                "proxies:\n  - listen: 127.0.0.1:8443\n    backends: [{{address: 127.0.0.1:1}}]\n    health_check: {body}\n"
            ))
        };
        assert!(hc("{fall: 0}").contains("health_check.fall 0 out of range 1..=100"));
        assert!(hc("{interval: 1s, timeout: 2s}").contains("longer than its interval"));
        assert!(hc("{http_path: 'no slash'}").contains("health_check.http_path"));
        let c = crate::config::Config::parse(
            "proxies:\n  - listen: 127.0.0.1:8443\n    backends: [{address: 127.0.0.1:1}]\n    health_check: {http_path: /healthz}\n",
            "t",
        )
        .unwrap();
        let h = c.proxies[0].health_check.clone().unwrap();
        assert_eq!(
            (h.interval.0, h.timeout.0, h.fall, h.rise),
            (
                std::time::Duration::from_secs(2),
                std::time::Duration::from_secs(1),
                3,
                2
            )
        );
        // ALPN: h2 offered with no member that takes it; a name twice; an empty name.
        let e = err(
            "proxies:\n  - listen: 127.0.0.1:8443\n    alpn: [h2, http/1.1]\n    backends: [{address: 127.0.0.1:1}]\n",
        );
        assert!(e.contains("alpn[0]: no backend takes \"h2\""), "{e}");
        let e = err(
            "proxies:\n  - listen: 127.0.0.1:8443\n    alpn: [h2, h2]\n    backends: [{address: 127.0.0.1:1, alpn: [h2]}]\n",
        );
        assert!(e.contains("alpn[1]: \"h2\" is listed twice"), "{e}");
        let e = err(
            "proxies:\n  - listen: 127.0.0.1:8443\n    backends: [{address: 127.0.0.1:1, alpn: [\"\"]}]\n",
        );
        assert!(
            e.contains("backends[0].alpn[0]: a protocol name is 1 to 255 bytes"),
            "{e}"
        );
    }

    #[test]
    fn alpn_defaults_to_none_offered_and_members_taking_http1() {
        let c = Config::parse(
            "proxies:\n  - listen: 127.0.0.1:8443\n    alpn: [h2, http/1.1]\n    backends: [{address: 127.0.0.1:1, alpn: [h2, http/1.1]}, {address: 127.0.0.1:2}]\n  - listen: 127.0.0.1:9443\n    backends: [{address: 127.0.0.1:3}]\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.proxies[0].alpn, ["h2", "http/1.1"]);
        assert_eq!(c.proxies[0].backends[1].alpn, ["http/1.1"]);
        assert!(c.proxies[1].alpn.is_empty());
    }
}
