//! The YAML configuration.
//!
//! Parsed with serde_norway, the maintained fork of the deprecated serde_yaml. Every check runs
//! inside deserialization, so each error names the field path and its line; unknown fields are
//! errors; a config with any error is refused whole.

use std::{
    collections::{BTreeMap, BTreeSet},
    fmt,
    path::PathBuf,
};

use gateway_common::{
    Class,
    maps::{
        CONFIG_DROP_FRAGMENTS, CONFIG_DROP_UNPARSEABLE, ClassPolicy, IPPROTO_TCP, IPPROTO_UDP,
        POLICY_LIMIT_BACKLOG, POLICY_LIMIT_RATE, SERVICE_TERMINATED, ServiceKey, ServiceKind,
        ServiceValue,
    },
};
use serde::{Deserialize, Deserializer, Serialize, de::Error as _};
use thiserror::Error;

use crate::loader::ModeRequest;

/// The embedded default configuration.
pub const DEFAULT_YAML: &str = include_str!("../../deploy/gateway.default.yaml");

/// Largest accepted backlog limit.
pub const MAX_BACKLOG: u64 = 10_000_000;
/// Largest accepted rate, per second.
pub const MAX_RATE: u64 = 100_000_000;
/// Largest accepted burst.
pub const MAX_BURST: u64 = gateway_common::maps::MAX_BURST;

/// Errors of loading a configuration.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("config {path}: {source}")]
    Read {
        /// File path.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The YAML is invalid, has a wrong type, an unknown field or a value out of range.
    #[error("config {origin}: {source}")]
    Invalid {
        /// File path or "embedded default".
        origin: String,
        /// The error, with field path and line.
        source: serde_norway::Error,
    },
    /// Two parts of a valid document contradict each other.
    #[error("config {origin}: {reason}")]
    Conflict {
        /// File path or "embedded default".
        origin: String,
        /// What conflicts, by field path.
        reason: String,
    },
}

/// The whole configuration.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// bpffs root of the per-interface pin directories.
    #[serde(default = "default_bpffs")]
    pub bpffs: PathBuf,
    /// Interfaces to protect.
    #[serde(default)]
    pub interfaces: Interfaces,
    /// Protected services.
    #[serde(default)]
    pub services: Services,
    /// Admission limits per class; unlisted classes are unlimited.
    #[serde(default)]
    pub policy: Policies,
    /// Datapath-wide settings.
    #[serde(default)]
    pub datapath: Datapath,
    /// What `gateway run` does with the datapath when it exits.
    #[serde(default)]
    pub on_exit: OnExit,
    /// TLS listeners that terminate admitted connections and proxy them to backend pools. Each
    /// listener's port is a protected TLS service whose completions the daemon counts.
    #[serde(default)]
    pub proxies: Vec<crate::proxy::config::ProxyConfig>,
    /// Where the daemon serves Prometheus metrics (`GET /metrics`); absent: not served.
    #[serde(default)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Worker threads of the daemon's runtime; 0 (the default) is one per CPU.
    #[serde(default)]
    pub workers: usize,
}

fn default_bpffs() -> PathBuf {
    PathBuf::from(crate::pins::DEFAULT_ROOT)
}

impl Config {
    /// Parses YAML; `origin` names the source in errors.
    pub fn parse(yaml: &str, origin: &str) -> Result<Self, ConfigError> {
        let invalid = |source| ConfigError::Invalid {
            origin: origin.into(),
            source,
        };
        let config: Config = serde_norway::from_str(yaml).map_err(invalid)?;
        serde_norway::from_str::<DuplicateCheck>(yaml).map_err(invalid)?;
        config
            .check_proxies()
            .map_err(|reason| ConfigError::Conflict {
                origin: origin.into(),
                reason,
            })?;
        Ok(config)
    }

    /// Reads and parses a file.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let yaml = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&yaml, &path.display().to_string())
    }

    /// Proxy listeners must not share an address, nor take a port the services list gives to SIP.
    fn check_proxies(&self) -> Result<(), String> {
        for (i, p) in self.proxies.iter().enumerate() {
            if let Some(j) = self.proxies[..i].iter().position(|q| q.listen == p.listen) {
                return Err(format!(
                    "proxies[{i}].listen: {} is also proxies[{j}].listen",
                    p.listen
                ));
            }
            let key = ServiceKey::new(IPPROTO_TCP, p.listen.port());
            if let Some(j) = self
                .services
                .0
                .iter()
                .position(|s| s.key() == key && s.kind != Kind::Tls)
            {
                return Err(format!(
                    "proxies[{i}].listen: port tcp/{} is services[{j}], which is not tls",
                    p.listen.port()
                ));
            }
        }
        Ok(())
    }

    /// Every protected service: the services list, then each proxy listener's port (tls,
    /// terminated by the daemon) that the list does not already carry.
    pub fn all_services(&self) -> Vec<(ServiceKey, ServiceValue)> {
        let terminated: BTreeSet<ServiceKey> = self
            .proxies
            .iter()
            .map(|p| ServiceKey::new(IPPROTO_TCP, p.listen.port()))
            .collect();
        let mut out: Vec<(ServiceKey, ServiceValue)> = self
            .services
            .0
            .iter()
            .map(|s| {
                let flags = if terminated.contains(&s.key()) {
                    SERVICE_TERMINATED
                } else {
                    0
                };
                let kind = s.kind.service_kind() as u32;
                (s.key(), ServiceValue { kind, flags })
            })
            .collect();
        for key in terminated {
            if !out.iter().any(|(k, _)| *k == key) {
                let value = ServiceValue {
                    kind: ServiceKind::Tls as u32,
                    flags: SERVICE_TERMINATED,
                };
                out.push((key, value));
            }
        }
        out
    }

    /// The embedded default.
    pub fn embedded_default() -> Self {
        Self::parse(DEFAULT_YAML, "embedded default").expect("the embedded default config is valid")
    }
}

/// One protected interface.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Hook.
    #[serde(default)]
    pub mode: ModeRequest,
}

/// The interface list; names are unique.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Interfaces(pub Vec<Interface>);

/// The duplicate check, a second pass over a document that already parsed: every element of
/// `interfaces` and `services` is read through a map visitor that refuses a key seen before. An
/// error raised inside a visitor is the only kind serde_norway gives a position, so this pass
/// names the duplicate's own line.
#[derive(Deserialize)]
struct DuplicateCheck {
    #[serde(default, deserialize_with = "unique_interfaces")]
    #[allow(dead_code)]
    interfaces: (),
    #[serde(default, deserialize_with = "unique_services")]
    #[allow(dead_code)]
    services: (),
}

fn unique_interfaces<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    unique_seq(
        d,
        |i: &Interface| i.name.clone(),
        |i, j, k| format!("duplicate interface '{}' (entries {j} and {k})", i.name),
    )
}

fn unique_services<'de, D: Deserializer<'de>>(d: D) -> Result<(), D::Error> {
    unique_seq(d, Service::key, |s, j, k| {
        format!(
            "duplicate service {}/{} (services[{j}] and services[{k}])",
            s.proto().name(),
            s.port.0
        )
    })
}

type Describe<T> = fn(&T, usize, usize) -> String;

fn unique_seq<'de, D, T, K>(d: D, key: fn(&T) -> K, describe: Describe<T>) -> Result<(), D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
    K: PartialEq,
{
    struct Element<'a, T, K> {
        seen: &'a [T],
        key: fn(&T) -> K,
        describe: Describe<T>,
    }
    impl<'de, T: Deserialize<'de>, K: PartialEq> serde::de::DeserializeSeed<'de> for Element<'_, T, K> {
        type Value = T;
        fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<T, D::Error> {
            d.deserialize_map(self)
        }
    }
    impl<'de, T: Deserialize<'de>, K: PartialEq> serde::de::Visitor<'de> for Element<'_, T, K> {
        type Value = T;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a mapping")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
            let item = T::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
            let k = (self.key)(&item);
            match self.seen.iter().position(|o| (self.key)(o) == k) {
                Some(j) => Err(A::Error::custom((self.describe)(&item, j, self.seen.len()))),
                None => Ok(item),
            }
        }
    }
    struct Seq<T, K> {
        key: fn(&T) -> K,
        describe: Describe<T>,
    }
    impl<'de, T: Deserialize<'de>, K: PartialEq> serde::de::Visitor<'de> for Seq<T, K> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a sequence")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
            let mut seen: Vec<T> = Vec::new();
            while let Some(item) = seq.next_element_seed(Element {
                seen: &seen,
                key: self.key,
                describe: self.describe,
            })? {
                seen.push(item);
            }
            Ok(())
        }
    }
    d.deserialize_seq(Seq { key, describe })
}

/// Transport protocol of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Proto {
    /// IP protocol number.
    pub const fn number(self) -> u8 {
        match self {
            Proto::Tcp => IPPROTO_TCP,
            Proto::Udp => IPPROTO_UDP,
        }
    }

    /// From an IP protocol number.
    pub const fn from_number(n: u8) -> Option<Proto> {
        match n {
            IPPROTO_TCP => Some(Proto::Tcp),
            IPPROTO_UDP => Some(Proto::Udp),
            _ => None,
        }
    }

    /// Name.
    pub const fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// Kind of a service, as written in the config and on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// TLS.
    Tls,
    /// SIP.
    Sip,
}

impl Kind {
    /// The datapath's kind.
    pub const fn service_kind(self) -> ServiceKind {
        match self {
            Kind::Tls => ServiceKind::Tls,
            Kind::Sip => ServiceKind::Sip,
        }
    }

    /// The transport the kind uses unless told otherwise.
    pub const fn default_proto(self) -> Proto {
        match self {
            Kind::Tls => Proto::Tcp,
            Kind::Sip => Proto::Udp,
        }
    }
}

/// A port number, 1 to 65535.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Port(pub u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = i64::deserialize(d)?;
        match u16::try_from(v) {
            Ok(p) if p != 0 => Ok(Port(p)),
            _ => Err(D::Error::custom(format!("port {v} out of range 1..=65535"))),
        }
    }
}

/// One protected service.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// What it speaks.
    pub kind: Kind,
    /// Destination port.
    pub port: Port,
    /// Transport; defaults per kind.
    #[serde(default)]
    pub proto: Option<Proto>,
}

impl Service {
    /// The transport in effect.
    pub fn proto(&self) -> Proto {
        self.proto.unwrap_or(self.kind.default_proto())
    }

    /// The services-map key.
    pub fn key(&self) -> ServiceKey {
        ServiceKey::new(self.proto().number(), self.port.0)
    }
}

/// The service list; (proto, port) pairs are unique.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Services(pub Vec<Service>);

/// A bounded count.
fn bounded<'de, D: Deserializer<'de>>(d: D, what: &str, max: u64) -> Result<Option<u64>, D::Error> {
    let v = Option::<i64>::deserialize(d)?;
    match v {
        None => Ok(None),
        Some(v) if v >= 0 && (v as u64) <= max => Ok(Some(v as u64)),
        Some(v) => Err(D::Error::custom(format!(
            "{what} {v} out of range 0..={max}"
        ))),
    }
}

/// Limits of one class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Maximum backlog; absent means unlimited.
    #[serde(default, deserialize_with = "de_backlog")]
    pub backlog: Option<u64>,
    /// Sustained rate per second; absent means unlimited.
    #[serde(default, deserialize_with = "de_rate")]
    pub rate: Option<u64>,
    /// Burst above the rate.
    #[serde(default, deserialize_with = "de_burst")]
    pub burst: Option<u64>,
    /// How long an admitted unit (a TLS connection, a SIP request) may go unanswered before it
    /// expires and frees its place; absent means the class's default (TLS 10 s, SIP 2 s).
    #[serde(default)]
    pub timeout: Option<crate::proxy::config::Span>,
}

fn de_backlog<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "backlog", MAX_BACKLOG)
}
fn de_rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "rate", MAX_RATE)
}
fn de_burst<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "burst", MAX_BURST)
}

impl PolicyConfig {
    /// The datapath's policy value.
    pub fn to_map(self) -> ClassPolicy {
        let mut flags = 0;
        if self.backlog.is_some() {
            flags |= POLICY_LIMIT_BACKLOG;
        }
        if self.rate.is_some() {
            flags |= POLICY_LIMIT_RATE;
        }
        ClassPolicy {
            backlog_limit: self.backlog.unwrap_or(0),
            rate_per_sec: self.rate.unwrap_or(0),
            burst: self.burst.unwrap_or(0),
            flags,
            timeout_ns: self
                .timeout
                .map_or(0, |t| t.0.as_nanos().min(u128::from(u64::MAX)) as u64),
        }
    }

    /// From the datapath's policy value.
    pub fn from_map(p: &ClassPolicy) -> Self {
        PolicyConfig {
            backlog: (p.flags & POLICY_LIMIT_BACKLOG != 0).then_some(p.backlog_limit),
            rate: (p.flags & POLICY_LIMIT_RATE != 0).then_some(p.rate_per_sec),
            burst: (p.flags & POLICY_LIMIT_RATE != 0).then_some(p.burst),
            timeout: (p.timeout_ns != 0)
                .then(|| crate::proxy::config::Span(std::time::Duration::from_nanos(p.timeout_ns))),
        }
    }
}

/// Error text for a class name that is not one.
pub fn unknown_class(name: &str) -> String {
    format!(
        "unknown class '{name}' (valid: {})",
        Class::ALL.map(Class::name).join(", ")
    )
}

/// Error text for a class that cannot be limited.
pub fn unlimitable_class(class: Class) -> String {
    format!(
        "class '{}' is never limited (limitable: {})",
        class.name(),
        Class::ALL
            .into_iter()
            .filter(|c| c.is_limitable())
            .map(Class::name)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Per-class limits keyed by class.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Policies(pub BTreeMap<String, PolicyConfig>);

impl Policies {
    /// Limits by class.
    pub fn iter(&self) -> impl Iterator<Item = (Class, PolicyConfig)> + '_ {
        self.0
            .iter()
            .filter_map(|(n, p)| Class::from_name(n).map(|c| (c, *p)))
    }
}

impl<'de> Deserialize<'de> for Policies {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, PolicyConfig>::deserialize(d)?;
        for name in map.keys() {
            match Class::from_name(name) {
                None => return Err(D::Error::custom(unknown_class(name))),
                Some(c) if !c.is_limitable() => return Err(D::Error::custom(unlimitable_class(c))),
                Some(_) => {}
            }
        }
        Ok(Policies(map))
    }
}

/// Pass or drop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PassDrop {
    /// Let it through (counted).
    #[default]
    Pass,
    /// Drop it (counted).
    Drop,
}

/// aya-log level of the eBPF programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EbpfLogLevel {
    /// Nothing.
    Off,
    /// Errors.
    Error,
    /// Warnings and errors.
    #[default]
    Warn,
    /// Informational.
    Info,
    /// Debug (per-anomaly messages).
    Debug,
    /// Everything.
    Trace,
}

impl EbpfLogLevel {
    /// The value of aya-log-ebpf's `AYA_LOG_LEVEL` global.
    pub const fn value(self) -> u8 {
        self as u8
    }
}

/// Datapath-wide settings.
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Datapath {
    /// IP fragments.
    #[serde(default)]
    pub fragments: PassDrop,
    /// Headers beyond the parser's bounds.
    #[serde(default)]
    pub unparseable: PassDrop,
    /// aya-log level.
    #[serde(default)]
    pub ebpf_log_level: EbpfLogLevel,
}

impl Datapath {
    /// `DatapathConfig::flags`.
    pub fn flags(&self) -> u64 {
        let mut f = 0;
        if self.fragments == PassDrop::Drop {
            f |= CONFIG_DROP_FRAGMENTS;
        }
        if self.unparseable == PassDrop::Drop {
            f |= CONFIG_DROP_UNPARSEABLE;
        }
        f
    }
}

/// What `gateway run` does on exit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnExit {
    /// Leave the datapath attached and pinned (protection continues through restarts).
    #[default]
    Keep,
    /// Detach and unpin.
    Detach,
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} interface(s), {} service(s), {} proxy listener(s), {} class policy(ies), bpffs {}",
            self.interfaces.0.len(),
            self.services.0.len(),
            self.proxies.len(),
            self.policy.0.len(),
            self.bpffs.display()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(yaml: &str) -> String {
        Config::parse(yaml, "t.yaml").unwrap_err().to_string()
    }

    #[test]
    fn embedded_default_parses() {
        let c = Config::embedded_default();
        assert_eq!(c.interfaces.0[0].name, "lo");
        assert_eq!(c.services.0.len(), 2);
        assert_eq!(c.services.0[1].proto(), Proto::Udp);
        assert_eq!(c.on_exit, OnExit::Detach);
    }

    #[test]
    fn example_parses() {
        let c =
            Config::parse(include_str!("../../deploy/gateway.example.yaml"), "example").unwrap();
        let (class, p) = c.policy.iter().next().unwrap();
        assert_eq!(class, Class::SipOriginal);
        assert_eq!(p.backlog, Some(500));
    }

    #[test]
    fn unknown_field_names_field_and_line() {
        let e =
            err("bpffs: /sys/fs/bpf/x\nservices:\n  - kind: tls\n    port: 443\n    prot: tcp\n");
        assert!(e.contains("prot"), "{e}");
        assert!(e.contains("line 5"), "{e}");
        assert!(e.contains("services[0]"), "{e}");
    }

    #[test]
    fn wrong_type_names_field_and_line() {
        let e = err("services:\n  - kind: tls\n    port: https\n");
        assert!(e.contains("services[0].port"), "{e}");
        assert!(e.contains("line 3"), "{e}");
    }

    #[test]
    fn out_of_range_values_are_refused() {
        let e = err("services:\n  - kind: tls\n    port: 70000\n");
        assert!(e.contains("port 70000 out of range"), "{e}");
        let e = err("policy:\n  tls-new:\n    rate: -1\n");
        assert!(e.contains("rate -1 out of range"), "{e}");
        assert!(e.contains("policy.tls-new"), "{e}");
        assert!(e.contains("line 3"), "{e}");
        let e = err(
            "proxies:\n  - listen: 127.0.0.1:8443\n    tls: {resume_limit: 0}\n    backends: [{address: 127.0.0.1:1}]\n",
        );
        assert!(e.contains("tls.resume_limit: 0 is out of range"), "{e}");
        assert!(e.contains("proxies[0]"), "{e}");
    }

    #[test]
    fn duplicates_and_unknown_classes_are_refused() {
        let e = err(
            "services:\n  - {kind: sip, port: 5060}\n  - {kind: tls, port: 443}\n  - {kind: sip, port: 5060, proto: udp}\n",
        );
        assert!(e.contains("duplicate service udp/5060"), "{e}");
        assert!(e.contains("services[2]"), "{e}");
        assert!(e.contains("line 4"), "{e}");
        let e = err("policy:\n  tls-old: {rate: 5}\n");
        assert!(e.contains("unknown class 'tls-old'"), "{e}");
        assert!(e.contains("tls-resumed"), "{e}");
        let e = err("policy:\n  other: {rate: 5}\n");
        assert!(e.contains("never limited"), "{e}");
        let e = err("interfaces:\n  - name: a\n  - name: a\n");
        assert!(e.contains("duplicate interface 'a'"), "{e}");
    }

    #[test]
    fn same_port_different_proto_is_fine() {
        let c = Config::parse(
            "services:\n  - {kind: sip, port: 5060}\n  - {kind: sip, port: 5060, proto: tcp}\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.services.0.len(), 2);
    }

    #[test]
    fn policy_round_trips_through_the_map_type() {
        let p = PolicyConfig {
            backlog: Some(0),
            rate: None,
            burst: None,
            timeout: Some(crate::proxy::config::Span(
                std::time::Duration::from_millis(1500),
            )),
        };
        let m = p.to_map();
        assert_eq!(m.flags, POLICY_LIMIT_BACKLOG);
        assert_eq!(PolicyConfig::from_map(&m), p);
    }
}
