//! The YAML configuration: the schema of the whole document (here), its parts in modules of
//! their own (interfaces, services, policies, datapath settings), and the duplicate-key check.
//!
//! Parsed with serde_norway, the maintained fork of the deprecated serde_yaml. Every check runs
//! inside deserialization, so each error names the field path and its line; unknown fields are
//! errors; a config with any error is refused whole.

mod controller;
mod datapath;
mod interfaces;
mod node;
mod policy;
mod server;
mod services;
mod unique;

use std::{collections::BTreeSet, fmt, path::PathBuf};

use gateway_common::{
    Class,
    maps::{self, IPPROTO_TCP, SERVICE_SYN_COOKIES, SERVICE_TERMINATED, ServiceKey, ServiceValue},
};
use serde::{Deserialize, Serialize};
use thiserror::Error;

pub use controller::{ClassControl, ControllerConfig, DEFAULT_RESUMED_WAIT, Mode};
pub use datapath::{Datapath, EbpfLogLevel, OnExit, PassDrop};
pub use interfaces::{Interface, Interfaces, parse_iface};
pub use node::NodeName;
pub use policy::{
    MAX_UNIT_TIMEOUT, Policies, PolicyConfig, parse_unit_timeout, unknown_class, unlimitable_class,
};
pub use server::TlsServer;
pub use services::{
    Port, Proto, Service, ServiceKind, Services, check_proto, cookies_by_default, default_proto,
    parse_kind,
};

/// The embedded default configuration.
pub const DEFAULT_YAML: &str = include_str!("../../../deploy/gateway.default.yaml");

/// `metrics`, named in its error (a top-level field's error carries no path of its own).
fn de_metrics<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<std::net::SocketAddr>, D::Error> {
    use serde::de::Error as _;
    crate::address::de_opt_addr(d).map_err(|e| D::Error::custom(format!("metrics: {e}")))
}

/// Where the daemon's config comes from, read again on every reload: a file (or the embedded
/// default) and the command line's overrides.
#[derive(Clone, Debug, Default)]
pub struct ConfigSource {
    /// The file; `None`: the embedded default.
    pub path: Option<PathBuf>,
    /// `--bpffs`, replacing the config's.
    pub bpffs: Option<PathBuf>,
    /// `--iface` or `--iface-of` (and `--mode`), replacing the config's interfaces.
    pub iface: Option<(IfaceOverride, crate::datapath::ModeRequest)>,
    /// `--metrics`, replacing the config's.
    pub metrics: Option<std::net::SocketAddr>,
    /// `--reload-on-change`: the daemon reloads when the file's content changes, as on SIGHUP.
    pub reload_on_change: bool,
}

/// The interface the command line names in place of the config's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IfaceOverride {
    /// By name (`--iface`).
    Name(String),
    /// The one carrying this address (`--iface-of`).
    Carrying(std::net::IpAddr),
}

impl IfaceOverride {
    /// The interface's name: looked up now for an address.
    pub fn name(&self) -> Result<String, ConfigError> {
        match self {
            IfaceOverride::Name(name) => Ok(name.clone()),
            IfaceOverride::Carrying(addr) => {
                interface_carrying(*addr).ok_or_else(|| ConfigError::Conflict {
                    origin: "--iface-of".into(),
                    reason: format!("no interface here carries the address {addr}"),
                })
            }
        }
    }
}

/// The interface that carries `addr`, from the host's address list (`getifaddrs`).
pub fn interface_carrying(addr: std::net::IpAddr) -> Option<String> {
    nix::ifaddrs::getifaddrs().ok()?.find_map(|a| {
        let ours = a.address?;
        let found = match addr {
            std::net::IpAddr::V4(v4) => ours.as_sockaddr_in().map(|s| s.ip() == v4),
            std::net::IpAddr::V6(v6) => ours.as_sockaddr_in6().map(|s| s.ip() == v6),
        };
        found.unwrap_or(false).then_some(a.interface_name)
    })
}

impl ConfigSource {
    /// Reads and checks the config, with the overrides applied.
    ///
    /// # Errors
    /// [`ConfigError`] naming the file, the field and the line.
    pub fn load(&self) -> Result<Config, ConfigError> {
        let mut cfg = match &self.path {
            Some(path) => Config::load(path)?,
            None => Config::embedded_default(),
        };
        if let Some(root) = &self.bpffs {
            cfg.bpffs = root.clone();
        }
        if let Some((iface, mode)) = &self.iface {
            cfg.interfaces.0 = vec![Interface {
                name: iface.name()?,
                mode: *mode,
            }];
        }
        if let Some(addr) = self.metrics {
            cfg.metrics = Some(addr);
        }
        Ok(cfg)
    }
}

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
    /// Admission limits per class, the operator's; a class with none written is moved by the
    /// controller when its service has a law, else unlimited.
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
    /// Where the daemon serves Prometheus metrics (`GET /metrics`; `IP:PORT` or `HOST:PORT`);
    /// absent: not served.
    #[serde(default, deserialize_with = "de_metrics")]
    pub metrics: Option<std::net::SocketAddr>,
    /// Worker threads of the proxies' runtime; 0 (the default) is one per CPU. The daemon's own
    /// work (controller, metrics, signals) runs on one more thread, apart from them.
    #[serde(default)]
    pub workers: usize,
    /// The adaptive controller: which classes it moves, and how.
    #[serde(default)]
    pub controller: ControllerConfig,
    /// This node's name in a fleet (`gateway_build_info`'s `node` label); absent: the host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<NodeName>,
}

fn default_bpffs() -> PathBuf {
    PathBuf::from(crate::datapath::pins::DEFAULT_ROOT)
}

impl Config {
    /// This node's name: the configured one, else the host's ([`NodeName::this_host`]).
    pub fn node(&self) -> NodeName {
        self.node.clone().unwrap_or_else(NodeName::this_host)
    }

    /// Parses YAML; `origin` names the source in errors.
    pub fn parse(yaml: &str, origin: &str) -> Result<Self, ConfigError> {
        let invalid = |source| ConfigError::Invalid {
            origin: origin.into(),
            source,
        };
        let mut config: Config = serde_norway::from_str(yaml).map_err(invalid)?;
        serde_norway::from_str::<unique::DuplicateCheck>(yaml).map_err(invalid)?;
        config
            .check_proxies()
            .map_err(|reason| ConfigError::Conflict {
                origin: origin.into(),
                reason,
            })?;
        let (wanted, policy) = (config.served_classes(), config.policy.clone());
        config.controller.adopt(wanted, |class| policy.owns(class));
        Ok(config)
    }

    /// The classes the configured services have a law for: sip-original where a SIP service
    /// is protected, tls-new where a TLS service is (a proxy listener's port included).
    fn served_classes(&self) -> Vec<Class> {
        let kinds: BTreeSet<u32> = self.all_services().iter().map(|(_, v)| v.kind).collect();
        let mut out = Vec::new();
        if kinds.contains(&(maps::ServiceKind::Sip as u32)) {
            out.push(Class::SipOriginal);
        }
        if kinds.contains(&(maps::ServiceKind::Tls as u32)) {
            out.push(Class::TlsNew);
        }
        out
    }

    /// Reads and parses a file.
    pub fn load(path: &std::path::Path) -> Result<Self, ConfigError> {
        let yaml = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(&yaml, &path.display().to_string())
    }

    /// Proxy listeners must not share an address, nor take a port the services list gives to SIP;
    /// SYN cookies are for TLS over TCP only.
    fn check_proxies(&self) -> Result<(), String> {
        for (i, s) in self.services.0.iter().enumerate() {
            check_proto(s.kind, s.proto()).map_err(|e| format!("services[{i}].proto: {e}"))?;
            if s.syn_cookies == Some(true) && !services::cookies_by_default(s.kind, s.proto()) {
                return Err(format!(
                    "services[{i}].syn_cookies: only a tls service over tcp answers SYNs with cookies"
                ));
            }
            if s.server.is_some() && s.kind != ServiceKind::Tls {
                return Err(format!(
                    "services[{i}].server: only a tls service names a server whose sessions are learnt"
                ));
            }
        }
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
                .position(|s| s.key() == key && s.server.is_some())
            {
                return Err(format!(
                    "services[{j}].server: port tcp/{} is proxies[{i}].listen: the daemon \
                     terminates it and publishes its own sessions",
                    p.listen.port()
                ));
            }
            if let Some(j) = self
                .services
                .0
                .iter()
                .position(|s| s.key() == key && s.kind != ServiceKind::Tls)
            {
                return Err(format!(
                    "proxies[{i}].listen: port tcp/{} is services[{j}], which is not tls",
                    p.listen.port()
                ));
            }
        }
        Ok(())
    }

    /// Who answers each TLS-over-TCP service's SYNs and why, one line each, for the log:
    /// the operator sees a default at work, and where the kernel takes it away.
    pub fn syn_answers(&self, kernel_can: bool) -> Vec<String> {
        self.all_services_where(kernel_can)
            .iter()
            .filter(|(k, v)| k.proto == IPPROTO_TCP && v.kind == maps::ServiceKind::Tls as u32)
            .map(|(k, v)| {
                let set = self
                    .services
                    .0
                    .iter()
                    .find(|s| s.key() == *k)
                    .and_then(|s| s.syn_cookies);
                let on = v.flags & SERVICE_SYN_COOKIES != 0;
                let why = match (set, on) {
                    (Some(_), _) => "as the config sets",
                    (None, true) => "the default; syn_cookies: false leaves them to the kernel",
                    (None, false) => {
                        "this kernel cannot hand connections to listeners from BPF \
                         (bpf_sk_assign_tcp_reqsk, Linux 6.9 and later)"
                    }
                };
                let who = if on {
                    "answered from the NIC with SYN cookies"
                } else {
                    "left to the kernel"
                };
                format!("tls tcp/{}: SYNs {who} ({why})", k.port)
            })
            .collect()
    }

    /// Every protected service, as [`Config::all_services_where`] on this machine's kernel.
    pub fn all_services(&self) -> Vec<(ServiceKey, ServiceValue)> {
        self.all_services_where(crate::datapath::kfunc::available(
            crate::datapath::kfunc::HANDOFF_KFUNC,
        ))
    }

    /// Every protected service: the services list, then each proxy listener's port (tls,
    /// terminated by the daemon) that the list does not already carry. SYN cookies where a
    /// service sets them, and by default for TLS over TCP where `kernel_can` hand connections
    /// to listeners from BPF (a proxy's port too).
    pub fn all_services_where(&self, kernel_can: bool) -> Vec<(ServiceKey, ServiceValue)> {
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
                let mut flags = if terminated.contains(&s.key()) {
                    SERVICE_TERMINATED
                } else {
                    0
                };
                if s.syn_cookies(kernel_can) {
                    flags |= SERVICE_SYN_COOKIES;
                }
                let kind = s.kind as u32;
                (s.key(), ServiceValue { kind, flags })
            })
            .collect();
        for key in terminated {
            if !out.iter().any(|(k, _)| *k == key) {
                let cookies = if kernel_can { SERVICE_SYN_COOKIES } else { 0 };
                let value = ServiceValue {
                    kind: maps::ServiceKind::Tls as u32,
                    flags: SERVICE_TERMINATED | cookies,
                };
                out.push((key, value));
            }
        }
        out
    }

    /// The TLS ports whose sessions the NIC learns from the server's packets, with how.
    pub fn learnt_ports(&self) -> Vec<(u16, &TlsServer)> {
        self.services
            .0
            .iter()
            .filter_map(|s| Some((s.port.0, s.server.as_ref()?)))
            .collect()
    }

    /// The embedded default.
    pub fn embedded_default() -> Self {
        Self::parse(DEFAULT_YAML, "embedded default").expect("the embedded default config is valid")
    }
}

impl fmt::Display for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} interface(s), {} service(s), {} proxy listener(s), {} class policy(ies), bpffs {}",
            self.interfaces.0.len(),
            self.services.0.len(),
            self.proxies.len(),
            self.policy.len(),
            self.bpffs.display()
        )?;
        let c = &self.controller;
        if !c.enabled {
            return f.write_str(", controller off");
        }
        let moved: Vec<String> = c
            .classes
            .keys()
            .map(|class| match c.defaulted.contains(class) {
                true => format!("{} (by default)", class.name()),
                false => class.name().to_string(),
            })
            .collect();
        match moved.is_empty() {
            true => f.write_str(", no class under the controller"),
            false => write!(f, ", controller moves {}", moved.join(", ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_common::{Class, policy::Policy};

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
        let c = Config::parse(
            include_str!("../../../deploy/gateway.example.yaml"),
            "example",
        )
        .unwrap();
        assert_eq!(c.policy.of(Class::SipOriginal).backlog, Some(500));
        assert_eq!(c.node().as_str(), "gw-eu-1");
    }

    #[test]
    fn a_bad_node_name_is_refused_naming_the_field_and_an_absent_one_is_the_hosts() {
        let e = err("node: gw a\n");
        assert!(e.contains("node: \"gw a\" has ' '"), "{e}");
        let c = Config::parse("{}", "test").unwrap();
        assert_eq!(c.node(), NodeName::this_host());
    }

    #[test]
    fn syn_cookies_are_on_by_default_for_tls_over_tcp_where_the_kernel_can() {
        let c = Config::parse(
            "services:\n  - {kind: tls, port: 443}\n  - {kind: tls, port: 8443, syn_cookies: false}\n  - {kind: sip, port: 5060}\n  - {kind: tls, port: 9443, syn_cookies: true}\nproxies:\n  - listen: 127.0.0.1:7443\n    backends: [{address: 127.0.0.1:1}]\n",
            "t",
        )
        .unwrap();
        let cookies = |kernel_can: bool| -> Vec<(u16, bool)> {
            c.all_services_where(kernel_can)
                .iter()
                .map(|(k, v)| (k.port, v.flags & SERVICE_SYN_COOKIES != 0))
                .collect()
        };
        assert_eq!(
            cookies(true),
            [
                (443, true),
                (8443, false),
                (5060, false),
                (9443, true),
                (7443, true)
            ]
        );
        // A kernel that cannot hand connections over: the default is off; a service that
        // asks for them keeps asking (and is refused whole where it is written to the maps).
        assert_eq!(
            cookies(false),
            [
                (443, false),
                (8443, false),
                (5060, false),
                (9443, true),
                (7443, false)
            ]
        );
        // The log says who answers and why.
        let said = c.syn_answers(false).join("\n");
        assert!(
            said.contains("tls tcp/443: SYNs left to the kernel (this kernel cannot"),
            "{said}"
        );
        assert!(said.contains("tls tcp/8443: SYNs left to the kernel (as the config sets)"));
        assert!(said.contains("tls tcp/9443: SYNs answered from the NIC with SYN cookies"));
        let said = c.syn_answers(true).join("\n");
        assert!(
            said.contains("tls tcp/7443: SYNs answered from the NIC with SYN cookies (the default"),
            "{said}"
        );
        // Said as written when the config is shown: unset stays unset.
        let shown = serde_norway::to_string(&c.services).unwrap();
        assert_eq!(shown.matches("syn_cookies").count(), 2, "{shown}");
        let e = err("services:\n  - {kind: sip, port: 5060, syn_cookies: true}\n");
        assert!(e.contains("services[0].syn_cookies"), "{e}");
        // Off for a service that cannot have them is no error.
        Config::parse(
            "services:\n  - {kind: sip, port: 5060, syn_cookies: false}\n",
            "t",
        )
        .unwrap();
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
        for rate in ["0", "0.001", "5000"] {
            let e = err(&format!(
                "proxies:\n  - listen: 127.0.0.1:8443\n    tls: {{resume_rate: {rate}}}\n    backends: [{{address: 127.0.0.1:1}}]\n"
            ));
            assert!(
                e.contains(&format!("tls.resume_rate: {rate} is out of range")),
                "{e}"
            );
        }
    }

    /// Issue 29, case 3: errors found in a value point at that value, with its field path, in
    /// the config's own words.
    #[test]
    fn errors_point_at_the_offending_line_with_its_path() {
        let e = err(
            "interfaces:\n  - name: lo\npolicy:\n  sip-original:\n    backlog: 30\n  sip-orignal:\n    backlog: 20\n",
        );
        assert!(e.contains("policy: unknown class 'sip-orignal'"), "{e}");
        assert!(e.contains("at line 6 column 3"), "{e}");
        let e = err("policy:\n  tls-new:\n    rate: 10\n    burst: -5\n");
        assert!(
            e.contains("policy.tls-new.burst: burst -5 out of range"),
            "{e}"
        );
        assert!(e.contains("at line 4"), "{e}");
        let e = err("policy:\n  tls-new:\n    rate: fast\n");
        assert!(
            e.contains("expected rate: a whole number from 0 to") && !e.contains("i64"),
            "{e}"
        );
        let e = err("controller:\n  classes:\n    sip-orignal: {mode: sip, target: 100ms}\n");
        assert!(
            e.contains("unknown class 'sip-orignal'") && e.contains("line 3 column 5"),
            "{e}"
        );
        let e = err("services:\n  - {kind: sip, port: 5060}\n  - {kind: tls, port: 0}\n");
        assert!(
            e.contains("port 0 out of range 1..=65535") && e.contains("line 3"),
            "{e}"
        );
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
    fn the_interface_carrying_an_address_is_found_and_an_absent_one_is_named() {
        assert_eq!(
            interface_carrying("127.0.0.1".parse().unwrap()).as_deref(),
            Some("lo")
        );
        let e = IfaceOverride::Carrying("192.0.2.250".parse().unwrap())
            .name()
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("no interface here carries the address 192.0.2.250"),
            "{e}"
        );
    }

    #[test]
    fn a_server_section_is_for_a_tls_service_the_daemon_does_not_terminate() {
        let c = Config::parse(
            "services:\n  - {kind: tls, port: 443, server: {session_lifetime: 10m}}\n  \
             - {kind: tls, port: 8443}\n",
            "t",
        )
        .unwrap();
        let ports = c.learnt_ports();
        assert_eq!(ports.len(), 1);
        assert_eq!(ports[0].0, 443);
        assert_eq!(ports[0].1.terms(0).lifetime_s, 600);
        let e = err("services:\n  - {kind: sip, port: 5060, server: {}}\n");
        assert!(e.contains("services[0].server: only a tls service"), "{e}");
        let e = err("services:\n  - {kind: tls, port: 443, server: {resume_limit: 0}}\n");
        assert!(e.contains("resume_limit"), "{e}");
        let e = err(
            "services:\n  - {kind: tls, port: 8443, server: {}}\nproxies:\n  - listen: 127.0.0.1:8443\n    backends: [{address: 127.0.0.1:8080}]\n",
        );
        assert!(
            e.contains("services[0].server: port tcp/8443 is proxies[0].listen"),
            "{e}"
        );
    }

    #[test]
    fn same_port_different_proto_is_fine() {
        let c = Config::parse(
            "services:\n  - {kind: sip, port: 5060}\n  - {kind: tls, port: 5060}\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.services.0.len(), 2);
    }

    #[test]
    fn a_kind_over_a_transport_the_nic_does_not_classify_is_refused() {
        let e = err("services:\n  - {kind: tls, port: 443, proto: udp}\n");
        assert!(e.contains("services[0].proto: tls runs over tcp"), "{e}");
        let e =
            err("services:\n  - {kind: tls, port: 443}\n  - {kind: sip, port: 5060, proto: tcp}\n");
        assert!(
            e.contains("services[1].proto: sip is classified over udp only"),
            "{e}"
        );
    }

    #[test]
    fn absurd_durations_and_names_are_refused_with_their_bounds() {
        let e = err("policy:\n  tls-new: {timeout: 99999999999h}\n");
        assert!(
            e.contains("over the longest any setting takes, 30 days"),
            "{e}"
        );
        let e = err("policy:\n  tls-new: {timeout: 2h}\n");
        assert!(
            e.contains("timeout '2h' out of range") && e.contains("1h"),
            "{e}"
        );
        let e = err("interfaces:\n  - name: ''\n");
        assert!(e.contains("interface name '' is empty"), "{e}");
        let ok = Config::parse("policy:\n  tls-new: {timeout: 1h}\n", "t").unwrap();
        assert_eq!(ok.policy.of(Class::TlsNew).timeout, Some(MAX_UNIT_TIMEOUT));
    }

    #[test]
    fn controller_sections_are_checked_whole() {
        let c = Config::parse(
            "controller:\n  interval: 50ms\n  classes:\n    sip-original: {mode: sip, target: 80ms, max: 500}\n",
            "t.yaml",
        )
        .unwrap();
        let sip = c.controller.classes[&Class::SipOriginal];
        assert_eq!(
            sip.mode,
            Mode::Sip {
                target: std::time::Duration::from_millis(80)
            }
        );
        assert_eq!((sip.min, sip.max), (1, 500));
        let c = Config::parse(
            "controller:\n  classes:\n    tls-resumed: {mode: pdd, ratio: 3}\n",
            "t.yaml",
        )
        .unwrap();
        let pdd = c.controller.classes[&Class::TlsResumed];
        let c = Config::parse(
            "controller:\n  classes:\n    tls-new: {mode: tls, resumed_wait: 2}\n",
            "t.yaml",
        )
        .unwrap();
        assert_eq!(
            c.controller.classes[&Class::TlsNew].mode,
            Mode::Tls {
                cpu_target: 0.8,
                wait: 2.0
            }
        );
        assert_eq!(pdd.mode, Mode::Pdd { ratio: 3.0 });
        assert_eq!((pdd.min, pdd.max), (5, 95));
        for (yaml, needle) in [
            ("sip-original: {mode: sip, target: 600ms}", "well under T1"),
            ("sip-original: {mode: fifo}", "unknown mode 'fifo'"),
            ("sip-original: {mode: pdd}", "controls tls-resumed only"),
            ("tls-resumed: {mode: pdd, ratio: 0.5}", "ratio: 0.5"),
            ("tls-resumed: {mode: pdd, max: 120}", "share bounds"),
            (
                "tls-resumed: {mode: pdd, target: 80ms}",
                "target: only for mode sip",
            ),
            ("tls-new: {mode: sip}", "controls sip-original only"),
            ("tls-new: {mode: tls, cpu_target: 1.5}", "cpu_target"),
            ("tls-new: {mode: tls, resumed_wait: 0}", "resumed_wait: 0"),
            (
                "sip-original: {mode: sip, resumed_wait: 1}",
                "resumed_wait: only for mode tls",
            ),
            ("sip-original: {mode: sip, min: 9, max: 3}", "bounds 9..=3"),
            ("other: {mode: sip}", "never limited"),
        ] {
            let e = err(&format!("controller:\n  classes:\n    {yaml}\n"));
            assert!(e.contains(needle), "{yaml}: {e}");
            assert!(e.contains("line"), "{yaml}: {e}");
        }
    }

    /// Issue 27: adaptive by default. Every class a configured service has a law for is the
    /// controller's unless the operator wrote its limits, listed it as static, or turned the
    /// controller off.
    #[test]
    fn classes_of_configured_services_are_adaptive_unless_the_operator_owns_them() {
        let moved = |yaml: &str| -> Vec<(Class, bool)> {
            let c = Config::parse(yaml, "t.yaml").unwrap();
            c.controller
                .classes
                .keys()
                .map(|k| (*k, c.controller.defaulted.contains(k)))
                .collect()
        };
        let sip = "services:\n  - {kind: sip, port: 5060}\n";
        assert_eq!(moved(sip), [(Class::SipOriginal, true)]);
        let c = Config::parse(sip, "t").unwrap();
        assert_eq!(
            c.controller.classes[&Class::SipOriginal],
            ControllerConfig::default_for(Class::SipOriginal).unwrap()
        );
        assert_eq!(
            c.controller.classes[&Class::SipOriginal].mode,
            Mode::Sip {
                target: std::time::Duration::from_millis(100)
            }
        );
        let proxy =
            "proxies:\n  - listen: 127.0.0.1:8443\n    backends: [{address: 127.0.0.1:1}]\n";
        assert_eq!(moved(proxy), [(Class::TlsNew, true)]);
        assert!(matches!(
            Config::parse(proxy, "t").unwrap().controller.classes[&Class::TlsNew].mode,
            Mode::Tls { .. }
        ));
        let both = Config::embedded_default();
        assert_eq!(
            both.controller
                .defaulted
                .iter()
                .copied()
                .collect::<Vec<_>>(),
            [Class::TlsNew, Class::SipOriginal]
        );
        assert!(both.to_string().contains("controller moves"), "{both}");
        // Limits written under policy: the operator's (sip-retransmission's are sip-original's
        // law's too); how refusals are answered is no limit.
        assert_eq!(
            moved(&format!("{sip}policy:\n  sip-original: {{backlog: 30}}\n")),
            []
        );
        assert_eq!(
            moved(&format!(
                "{sip}policy:\n  sip-retransmission: {{backlog: 3}}\n"
            )),
            []
        );
        assert_eq!(
            moved(&format!(
                "{sip}policy:\n  sip-original: {{refuse: reject}}\n"
            )),
            [(Class::SipOriginal, true)]
        );
        // Listed: as written, not by default; static: left alone.
        assert_eq!(
            moved(&format!(
                "{sip}controller:\n  classes:\n    sip-original: {{mode: sip, max: 500}}\n"
            )),
            [(Class::SipOriginal, false)]
        );
        let fixed = format!("{sip}controller:\n  classes:\n    sip-original: {{mode: static}}\n");
        assert_eq!(moved(&fixed), []);
        // A static class keeps being static through a round trip of the config.
        let c = Config::parse(&fixed, "t").unwrap();
        let again = serde_norway::to_string(&c).unwrap();
        assert_eq!(moved(&again), [], "{again}");
        // Off: nothing moves, and listing a controlled class then is a contradiction.
        let off = format!("{sip}{proxy}controller:\n  enabled: false\n");
        assert_eq!(moved(&off), []);
        assert!(
            Config::parse(&off, "t")
                .unwrap()
                .to_string()
                .contains("controller off")
        );
        let e = err(&format!(
            "{off}  classes:\n    sip-original: {{mode: sip}}\n"
        ));
        assert!(e.contains("the controller is off"), "{e}");
        let e = err(&format!(
            "{sip}controller:\n  classes:\n    sip-original: {{mode: static, target: 80ms}}\n"
        ));
        assert!(e.contains("sip-original.target: a static class"), "{e}");
        assert!(e.contains("line 5"), "{e}");
        // No service, nothing to move.
        assert_eq!(moved("policy: {}\n"), []);
    }

    #[test]
    fn a_policy_section_reads_into_the_domain_type_and_back() {
        let c = Config::parse(
            "policy:\n  tls-new: {backlog: 0, timeout: 1500ms}\n",
            "t.yaml",
        )
        .unwrap();
        let p = c.policy.of(Class::TlsNew);
        assert_eq!(p.backlog, Some(0));
        assert_eq!(p.timeout, Some(std::time::Duration::from_millis(1500)));
        assert_eq!(c.policy.of(Class::TlsResumed), Policy::UNLIMITED);
        assert_eq!(PolicyConfig::of(p).policy(), p);
    }

    #[test]
    fn how_refusals_are_answered_is_policy_and_checked() {
        let c = Config::parse(
            "policy:
  sip-original: {backlog: 30, refuse: reject, reply_rate: 500, retry_after: 5}
",
            "t.yaml",
        )
        .unwrap();
        let p = c.policy.of(Class::SipOriginal);
        assert_eq!(p.refuse, Some(gateway_common::policy::Refuse::Reject));
        assert_eq!((p.reply_rate, p.retry_after), (Some(500), Some(5)));
        assert_eq!(PolicyConfig::of(p).policy(), p);
        let e = err("policy:\n  sip-original:\n    refuse: bounce\n");
        assert!(
            e.contains("refuse 'bounce' is not one of: drop, reject"),
            "{e}"
        );
        assert!(e.contains("policy.sip-original"), "{e}");
        let e = err("policy:\n  sip-original:\n    retry_after: 0\n");
        assert!(e.contains("retry_after 0 out of range"), "{e}");
        let e = err("policy:\n  tls-new:\n    reply_rate: 2000000\n");
        assert!(e.contains("reply_rate 2000000 out of range"), "{e}");
    }
}
