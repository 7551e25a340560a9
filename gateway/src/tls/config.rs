//! The TLS settings of a listener, as the config writes them: certificates (one, or one per
//! server name), session cache and tickets, versions and cipher suites.

use std::{path::PathBuf, time::Duration};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _};

use crate::span::Span;

/// Certificates, session cache and tickets of a listener.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, try_from = "RawTls")]
pub struct TlsConfig {
    /// PEM certificate chain and PEM private key; absent: a self-signed certificate for
    /// `localhost` is generated at start.
    pub cert_key: Option<(PathBuf, PathBuf)>,
    /// A file of at least 32 secret bytes shared by gateway nodes so they resume each other's
    /// tickets; absent: a random secret per process.
    pub ticket_key_file: Option<PathBuf>,
    /// How often ticket keys rotate (every node derives the same key for the same period).
    pub ticket_rotation: Span,
    /// How long an issued session (cache entry or ticket) may be resumed.
    pub session_lifetime: Span,
    /// Entries of the server-side session cache (TLS 1.2 session ids).
    pub session_cache: usize,
    /// Connections one issued session may hold in the tls-resumed class at once (the datapath
    /// counts them; a replayed or shared key gets no more).
    pub resume_limit: u32,
    /// Resumptions one issued session buys per minute beyond `resume_limit` at once (the
    /// datapath's per-key GCRA: a farmed ticket gets one client's worth). Configured as
    /// `resume_rate`, per second.
    pub resume_per_minute: u32,
    /// More certificates, each served to the clients that name one of its `names` (SNI); the
    /// `cert` above to every other client.
    pub sni: Vec<SniCert>,
    /// The oldest TLS version served: 1.2 (default) or 1.3.
    pub min_version: TlsVersion,
    /// The cipher suites offered, by rustls's names (`TLS13_AES_256_GCM_SHA384`); empty: the
    /// provider's defaults.
    pub cipher_suites: Vec<String>,
}

/// A certificate served to the clients that name one of its `names` in their hello (SNI).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SniCert {
    /// Host names (lower case), exact or `*.` and a suffix (one label).
    pub names: Vec<String>,
    /// PEM certificate chain.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

impl SniCert {
    /// Whether `name` (lower case) is one of this certificate's names.
    pub fn serves(&self, name: &str) -> bool {
        self.names.iter().any(|n| name_matches(n, name))
    }
}

/// Whether host `name` matches `pattern`: the same, or `*.` and the same suffix after exactly
/// one label.
pub fn name_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(suffix) => name
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
        None => pattern == name,
    }
}

/// A TLS protocol version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum TlsVersion {
    /// TLS 1.2.
    #[default]
    V12,
    /// TLS 1.3.
    V13,
}

impl<'de> Deserialize<'de> for TlsVersion {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // `min_version: 1.3` reads as a number in YAML, `"1.3"` as a string: both are taken.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Text(String),
            Number(f64),
        }
        let text = match Raw::deserialize(d)? {
            Raw::Text(t) => t,
            Raw::Number(n) => format!("{n:.1}"),
        };
        match text.as_str() {
            "1.2" => Ok(TlsVersion::V12),
            "1.3" => Ok(TlsVersion::V13),
            _ => Err(D::Error::custom(format!(
                "min_version {text:?} is not one of: 1.2, 1.3"
            ))),
        }
    }
}

impl Serialize for TlsVersion {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(match self {
            TlsVersion::V12 => "1.2",
            TlsVersion::V13 => "1.3",
        })
    }
}

/// The name rustls gives a cipher suite (`TLS13_AES_128_GCM_SHA256`).
pub fn suite_name(suite: &rustls::SupportedCipherSuite) -> String {
    format!("{:?}", suite.suite())
}

impl TlsConfig {
    /// The terms the issued keys of this listener are published on.
    pub fn terms(&self) -> crate::issued::Terms {
        crate::issued::Terms {
            lifetime: self.session_lifetime.0,
            resume_limit: self.resume_limit,
            per_minute: self.resume_per_minute,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    #[serde(default)]
    cert: Option<PathBuf>,
    #[serde(default)]
    key: Option<PathBuf>,
    #[serde(default)]
    ticket_key_file: Option<PathBuf>,
    #[serde(default = "default_rotation")]
    ticket_rotation: Span,
    #[serde(default = "default_lifetime")]
    session_lifetime: Span,
    #[serde(default = "default_cache")]
    session_cache: usize,
    #[serde(default = "default_resume_limit")]
    resume_limit: u32,
    #[serde(default = "default_resume_rate")]
    resume_rate: f64,
    #[serde(default)]
    sni: Vec<SniCert>,
    #[serde(default)]
    min_version: TlsVersion,
    #[serde(default)]
    cipher_suites: Vec<String>,
}

fn default_rotation() -> Span {
    Span(Duration::from_secs(3600))
}
fn default_lifetime() -> Span {
    Span(Duration::from_secs(7200))
}
fn default_cache() -> usize {
    10_000
}
fn default_resume_limit() -> u32 {
    gateway_common::maps::DEFAULT_RESUME_LIMIT
}
fn default_resume_rate() -> f64 {
    gateway_common::maps::DEFAULT_RESUME_PER_MINUTE as f64 / 60.0
}

impl TryFrom<RawTls> for TlsConfig {
    type Error = String;
    fn try_from(r: RawTls) -> Result<Self, String> {
        let cert_key = match (r.cert, r.key) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => return Err("cert is given without key".into()),
            (None, Some(_)) => return Err("key is given without cert".into()),
        };
        if r.session_lifetime.0 > Duration::from_secs(7 * 86400) {
            return Err("session_lifetime: at most 7 days (RFC 8446, 4.6.1)".into());
        }
        let max = gateway_common::maps::MAX_RESUME_LIMIT;
        if !(1..=max).contains(&r.resume_limit) {
            return Err(format!(
                "tls.resume_limit: {} is out of range, need 1 to {max}",
                r.resume_limit
            ));
        }
        let per_minute = r.resume_rate * 60.0;
        let most = gateway_common::maps::MAX_RESUME_PER_MINUTE;
        if !(1.0..=most as f64).contains(&per_minute.round()) {
            return Err(format!(
                "tls.resume_rate: {} is out of range, need 1/60 (one a minute) to {} per second",
                r.resume_rate,
                most / 60
            ));
        }
        for (i, c) in r.sni.iter().enumerate() {
            if c.names.is_empty() {
                return Err(format!("tls.sni[{i}].names: at least one name"));
            }
            for (j, n) in c.names.iter().enumerate() {
                let bare = n.strip_prefix("*.").unwrap_or(n);
                let valid = !bare.is_empty()
                    && bare.len() <= 253
                    && bare.split('.').all(|l| {
                        !l.is_empty()
                            && l.len() <= 63
                            && l.bytes()
                                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    });
                if !valid {
                    return Err(format!(
                        "tls.sni[{i}].names[{j}]: {n:?} is not a lower-case host name (or `*.` and one)"
                    ));
                }
                if let Some(k) = r.sni[..i].iter().position(|o| o.names.contains(n)) {
                    return Err(format!(
                        "tls.sni[{i}].names[{j}]: {n:?} is also tls.sni[{k}]'s"
                    ));
                }
            }
        }
        let known: Vec<String> = rustls::crypto::aws_lc_rs::ALL_CIPHER_SUITES
            .iter()
            .map(suite_name)
            .collect();
        for (i, name) in r.cipher_suites.iter().enumerate() {
            if !known.contains(name) {
                return Err(format!(
                    "tls.cipher_suites[{i}]: {name:?} is not one of: {}",
                    known.join(", ")
                ));
            }
        }
        if !r.cipher_suites.is_empty() {
            let v13 = rustls::crypto::aws_lc_rs::ALL_CIPHER_SUITES
                .iter()
                .any(|s| {
                    r.cipher_suites.contains(&suite_name(s))
                        && s.version() == &rustls::version::TLS13
                });
            if !v13 {
                return Err(
                    "tls.cipher_suites: none for TLS 1.3 (list one of the TLS13_ suites)".into(),
                );
            }
        }
        Ok(TlsConfig {
            cert_key,
            ticket_key_file: r.ticket_key_file,
            ticket_rotation: r.ticket_rotation,
            session_lifetime: r.session_lifetime,
            session_cache: r.session_cache,
            resume_limit: r.resume_limit,
            resume_per_minute: per_minute.round() as u32,
            sni: r.sni,
            min_version: r.min_version,
            cipher_suites: r.cipher_suites,
        })
    }
}

impl Default for TlsConfig {
    fn default() -> Self {
        TlsConfig {
            cert_key: None,
            ticket_key_file: None,
            ticket_rotation: default_rotation(),
            session_lifetime: default_lifetime(),
            session_cache: default_cache(),
            resume_limit: default_resume_limit(),
            resume_per_minute: gateway_common::maps::DEFAULT_RESUME_PER_MINUTE,
            sni: Vec::new(),
            min_version: TlsVersion::V12,
            cipher_suites: Vec::new(),
        }
    }
}

impl Serialize for TlsConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = s.serialize_struct("TlsConfig", 11)?;
        st.serialize_field("cert", &self.cert_key.as_ref().map(|c| &c.0))?;
        st.serialize_field("key", &self.cert_key.as_ref().map(|c| &c.1))?;
        st.serialize_field("ticket_key_file", &self.ticket_key_file)?;
        st.serialize_field("ticket_rotation", &self.ticket_rotation)?;
        st.serialize_field("session_lifetime", &self.session_lifetime)?;
        st.serialize_field("session_cache", &self.session_cache)?;
        st.serialize_field("resume_limit", &self.resume_limit)?;
        st.serialize_field("resume_rate", &(self.resume_per_minute as f64 / 60.0))?;
        st.serialize_field("sni", &self.sni)?;
        st.serialize_field("min_version", &self.min_version)?;
        st.serialize_field("cipher_suites", &self.cipher_suites)?;
        st.end()
    }
}
