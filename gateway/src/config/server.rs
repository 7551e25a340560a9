//! A TLS service's `server:` section: a server the gateway does not terminate (nginx, HAProxy,
//! Envoy), whose sessions the NIC learns from the server's own packets.

use std::time::Duration;

use gateway_common::maps::{
    DEFAULT_RESUME_LIMIT, DEFAULT_RESUME_PER_MINUTE, LearnTerms, MAX_RESUME_LIMIT,
    MAX_RESUME_PER_MINUTE,
};
use serde::{Deserialize, Serialize};

use crate::{
    proxy::config::Span,
    tls::server_keys::{self, KeyFormat},
};

/// How the sessions of a TLS server the gateway does not terminate are recognised at the NIC.
///
/// TLS 1.2 sessions are learnt from the server's packets: the session id of a full handshake's
/// ServerHello and the ticket of its second flight, once the server sent its ChangeCipherSpec
/// (it verified the client's Finished). Each is published under the same bounds as the
/// daemon's own keys (`resume_limit` at once, `resume_rate` beyond) for `session_lifetime`
/// (a ticket's lifetime hint shortens it); an offer the server then answers with a full
/// handshake withdraws its key.
#[derive(Clone, Debug, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, try_from = "RawServer", into = "RawServer")]
pub struct TlsServer {
    /// How long the server resumes a session it issued: its own setting (nginx
    /// `ssl_session_timeout`, 5 minutes by default; HAProxy `tune.ssl.lifetime`, 5 minutes).
    pub session_lifetime: Span,
    /// Connections one learnt session may hold in the tls-resumed class at once.
    pub resume_limit: u32,
    /// Resumptions one learnt session buys per minute beyond `resume_limit` (configured as
    /// `resume_rate`, per second).
    pub resume_per_minute: u32,
    /// The server's session ticket key files: with them the NIC checks the MAC of the TLS 1.3
    /// tickets (PSK identities) it issued. Watched: a rotated file takes effect within a
    /// second.
    pub ticket_keys: Option<TicketKeys>,
    /// The server's cgroup (cgroup v2: a directory with `cpu.stat`, e.g.
    /// `/sys/fs/cgroup/system.slice/nginx.service`): the tls law budgets its CPU, not the
    /// daemon's.
    pub cgroup: Option<std::path::PathBuf>,
}

/// A server's ticket key files and their format.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct TicketKeys {
    /// Whose files: `nginx` (`ssl_session_ticket_key`), `haproxy` (`tls-ticket-keys`) or
    /// `envoy` (`session_ticket_keys`).
    pub format: KeyFormat,
    /// The files, as the server names them.
    pub files: Vec<std::path::PathBuf>,
}

impl Default for TlsServer {
    fn default() -> Self {
        TlsServer {
            session_lifetime: Span(DEFAULT_LIFETIME),
            resume_limit: DEFAULT_RESUME_LIMIT,
            resume_per_minute: DEFAULT_RESUME_PER_MINUTE,
            ticket_keys: None,
            cgroup: None,
        }
    }
}

/// nginx's default `ssl_session_timeout` (and HAProxy's `tune.ssl.lifetime`).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(300);

impl TlsServer {
    /// The datapath's terms, with the NIC's wall clock `clock_ns`
    /// (`crate::datapath::maps::wall_clock_offset_ns`).
    pub fn terms(&self, clock_ns: u64) -> LearnTerms {
        LearnTerms {
            lifetime_s: self.session_lifetime.0.as_secs() as u32,
            limit: self.resume_limit,
            per_minute: self.resume_per_minute,
            pad: 0,
            clock_ns,
        }
    }
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    #[serde(default = "default_lifetime")]
    session_lifetime: Span,
    #[serde(default = "default_resume_limit")]
    resume_limit: u32,
    #[serde(default = "default_resume_rate")]
    resume_rate: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ticket_keys: Option<TicketKeys>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cgroup: Option<std::path::PathBuf>,
}

fn default_lifetime() -> Span {
    Span(DEFAULT_LIFETIME)
}
fn default_resume_limit() -> u32 {
    DEFAULT_RESUME_LIMIT
}
fn default_resume_rate() -> f64 {
    f64::from(DEFAULT_RESUME_PER_MINUTE) / 60.0
}

impl TryFrom<RawServer> for TlsServer {
    type Error = String;
    fn try_from(r: RawServer) -> Result<Self, String> {
        if r.session_lifetime.0 > Duration::from_secs(7 * 86400) {
            return Err("session_lifetime: at most 7 days (RFC 8446, 4.6.1)".into());
        }
        if r.session_lifetime.0 < Duration::from_secs(1) {
            return Err("session_lifetime: at least 1s".into());
        }
        if !(1..=MAX_RESUME_LIMIT).contains(&r.resume_limit) {
            return Err(format!(
                "resume_limit: {} is out of range, need 1 to {MAX_RESUME_LIMIT}",
                r.resume_limit
            ));
        }
        let per_minute = (r.resume_rate * 60.0).round();
        if !(1.0..=f64::from(MAX_RESUME_PER_MINUTE)).contains(&per_minute) {
            return Err(format!(
                "resume_rate: {} is out of range, need 1/60 (one a minute) to {} per second",
                r.resume_rate,
                MAX_RESUME_PER_MINUTE / 60
            ));
        }
        if let Some(k) = &r.ticket_keys {
            if k.files.is_empty() {
                return Err("ticket_keys.files: at least one file".into());
            }
            server_keys::read(k.format, &k.files).map_err(|e| format!("ticket_keys: {e}"))?;
        }
        if let Some(dir) = &r.cgroup {
            crate::cgroup::usage(dir).map_err(|e| format!("cgroup: {e}"))?;
        }
        Ok(TlsServer {
            session_lifetime: r.session_lifetime,
            resume_limit: r.resume_limit,
            resume_per_minute: per_minute as u32,
            ticket_keys: r.ticket_keys,
            cgroup: r.cgroup,
        })
    }
}

impl From<TlsServer> for RawServer {
    fn from(s: TlsServer) -> Self {
        RawServer {
            session_lifetime: s.session_lifetime,
            resume_limit: s.resume_limit,
            resume_rate: f64::from(s.resume_per_minute) / 60.0,
            ticket_keys: s.ticket_keys,
            cgroup: s.cgroup,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(yaml: &str) -> Result<TlsServer, String> {
        serde_norway::from_str(yaml).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_are_nginx_s() {
        let s = parse("{}").unwrap();
        assert_eq!(s, TlsServer::default());
        let t = s.terms(7);
        assert_eq!(t.lifetime_s, 300);
        assert_eq!((t.limit, t.per_minute, t.clock_ns), (6, 60, 7));
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        for (yaml, field) in [
            ("{session_lifetime: 8d}", "session_lifetime"),
            ("{session_lifetime: 500ms}", "session_lifetime"),
            ("{resume_limit: 0}", "resume_limit"),
            ("{resume_rate: 0}", "resume_rate"),
            ("{resume_rate: 100000}", "resume_rate"),
            ("{ticket: x}", "ticket"),
        ] {
            let e = parse(yaml).unwrap_err();
            assert!(e.contains(field), "{yaml}: {e}");
        }
        let e =
            parse("{ticket_keys: {format: nginx, files: [/nonexistent/ticket.key]}}").unwrap_err();
        assert!(e.contains("ticket_keys: /nonexistent/ticket.key"), "{e}");
        let e = parse("{ticket_keys: {format: nginx, files: []}}").unwrap_err();
        assert!(e.contains("ticket_keys.files"), "{e}");
        let e = parse("{cgroup: /nonexistent/nginx.service}").unwrap_err();
        assert!(
            e.contains("cgroup: /nonexistent/nginx.service/cpu.stat"),
            "{e}"
        );
        let e = parse("{ticket_keys: {format: apache, files: [x]}}").unwrap_err();
        assert!(e.contains("apache"), "{e}");
        let s = parse("{session_lifetime: 10m, resume_limit: 2, resume_rate: 0.5}").unwrap();
        assert_eq!(s.session_lifetime.0, Duration::from_secs(600));
        assert_eq!((s.resume_limit, s.resume_per_minute), (2, 30));
    }
}
