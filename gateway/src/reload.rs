//! Reloading the daemon's config (SIGHUP, `gateway reload`), all or nothing: the new config is
//! read and checked, and everything it needs is built (its TLS configurations), before anything
//! changes. What cannot change while running (interfaces, bpffs, the number of listeners and
//! their addresses and listen queues, the metrics address, workers, the node's name) makes the
//! reload refuse,
//! saying what to restart for. A listener's backends, weights, limits, timeouts and TLS change
//! without dropping a connection.

use std::sync::Arc;

use gateway_common::{
    Class,
    maps::{ClassPolicy, ServiceKey, ServiceValue},
    reasons::Owner,
};

use crate::{
    apply::apply,
    config::{Config, ConfigSource},
    datapath::attached::Attached,
    proxy::Proxy,
};

/// A checked reload, ready to apply.
pub struct Plan {
    cfg: Config,
    tls: Vec<rustls::ServerConfig>,
    certificates: Certificates,
}

/// The content of each listener's certificate, key and ticket key files, digested: a rotation
/// writes new content under the same paths, which the config's own values do not show.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Certificates(Vec<u64>);

impl Certificates {
    /// The digests of `cfg`'s listeners' files as they are now (an unreadable file digests as
    /// absent: the reload that needs it is refused elsewhere).
    pub fn of(cfg: &Config) -> Self {
        use std::hash::{Hash as _, Hasher as _};
        Certificates(
            cfg.proxies
                .iter()
                .map(|p| {
                    let mut h = std::collections::hash_map::DefaultHasher::new();
                    let files = p
                        .tls
                        .cert_key
                        .iter()
                        .flat_map(|(c, k)| [c, k])
                        .chain(p.tls.sni.iter().flat_map(|e| [&e.cert, &e.key]))
                        .chain(p.tls.ticket_key_file.as_ref());
                    for f in files {
                        std::fs::read(f).ok().hash(&mut h);
                    }
                    h.finish()
                })
                .collect(),
        )
    }

    /// The listeners whose files' content differs from `before`'s, as `proxies[i].tls (...)`.
    pub fn changed_since(&self, before: &Certificates) -> Vec<String> {
        self.0
            .iter()
            .zip(&before.0)
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| format!("proxies[{i}].tls (the certificate or key files' content)"))
            .collect()
    }
}

/// What an attachment's maps hold that a reload writes: its services, and each class's policy
/// with who set it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Datapath {
    services: Vec<(ServiceKey, ServiceValue)>,
    policies: Vec<(Class, ClassPolicy)>,
}

impl Datapath {
    /// What `a`'s maps hold now (what cannot be read is left out).
    pub fn of(a: &Attached) -> Self {
        let maps = a.maps();
        Datapath {
            services: maps.services().unwrap_or_default(),
            policies: Class::ALL
                .iter()
                .filter_map(|&c| Some((c, maps.policy(c).ok()?)))
                .collect(),
        }
    }

    /// The changes made by hand (`gateway service add/del`, `gateway policy set`) between the
    /// `running` config's apply and `before`, that the reload undid to reach `self` on `iface`:
    /// a service added or removed by hand, a class's policy changed with `policy set` (unpinned). Each is
    /// named with what it was, so that an undone change is never silent.
    pub fn undone_since(&self, before: &Datapath, running: &Config, iface: &str) -> Vec<String> {
        let name = |(k, v): &(ServiceKey, ServiceValue)| {
            format!(
                "{} {}/{}",
                gateway_common::maps::ServiceKind::from_id(v.kind).map_or("?", |k| k.name()),
                if k.proto == gateway_common::maps::IPPROTO_TCP {
                    "tcp"
                } else {
                    "udp"
                },
                k.port
            )
        };
        let configured = running.all_services();
        let mut out = Vec::new();
        for s in &before.services {
            if !configured.contains(s) && !self.services.contains(s) {
                out.push(format!(
                    "{iface}: service {} added by hand, removed (not in the config)",
                    name(s)
                ));
            }
        }
        for s in &configured {
            if !before.services.contains(s) && self.services.contains(s) {
                out.push(format!(
                    "{iface}: service {} removed by hand, protected again (in the config)",
                    name(s)
                ));
            }
        }
        for (class, was) in &before.policies {
            // The controller's moves and an operator's pinned limits are no hand changes a
            // reload undoes (it leaves both).
            if !class.is_limitable() || was.pinned() || was.owned_by(Owner::Controller) {
                continue;
            }
            let limits = |p: &ClassPolicy| gateway_common::policy::Policy::from_map(p);
            let now = self
                .policies
                .iter()
                .find(|(c, _)| c == class)
                .map(|(_, p)| p);
            let (was_set, configured) = (limits(was), running.policy.of(*class));
            if was_set != configured && now.is_some_and(|n| limits(n) != was_set) {
                out.push(format!(
                    "{iface}: policy {} changed by hand ({}), replaced by the config's",
                    class.name(),
                    crate::output::describe_policy(&was_set)
                ));
            }
        }
        out
    }
}

/// Reads the config from `source` and checks it against the running `current`; builds the
/// proxies' new TLS configurations. Nothing changes here.
///
/// # Errors
/// Why the reload is refused, naming the field.
pub fn prepare(
    current: &Config,
    source: &ConfigSource,
    proxies: &[Arc<Proxy>],
) -> Result<Plan, String> {
    let cfg = source.load().map_err(|e| e.to_string())?;
    let restart = |what: &str| Err(format!("{what} changed: restart the daemon to change it"));
    let ifaces = |c: &Config| {
        c.interfaces
            .0
            .iter()
            .map(|i| (i.name.clone(), i.mode))
            .collect::<Vec<_>>()
    };
    if ifaces(&cfg) != ifaces(current) {
        return restart("interfaces");
    }
    if cfg.bpffs != current.bpffs {
        return restart("bpffs");
    }
    if cfg.metrics != current.metrics {
        return restart("metrics");
    }
    if cfg.workers != current.workers {
        return restart("workers");
    }
    if cfg.node() != current.node() {
        return restart("node");
    }
    if cfg.datapath.issued_keys != current.datapath.issued_keys {
        return restart("datapath.issued_keys (the table's size)");
    }
    if cfg.proxies.len() != current.proxies.len() {
        return restart("proxies (the number of listeners)");
    }
    // A listener keeps its socket: its address and listen queue stay.
    for (i, (new, old)) in cfg.proxies.iter().zip(&current.proxies).enumerate() {
        if new.listen != old.listen {
            return restart(&format!("proxies[{i}].listen"));
        }
        if new.listen_backlog != old.listen_backlog {
            return restart(&format!("proxies[{i}].listen_backlog"));
        }
    }
    let tls = cfg
        .proxies
        .iter()
        .zip(proxies)
        .enumerate()
        .map(|(i, (p, proxy))| {
            crate::tls::server_config(&p.tls, proxy.issued().clone())
                .map_err(|e| format!("proxies[{i}] ({}): {e}", p.listen))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let certificates = Certificates::of(&cfg);
    Ok(Plan {
        cfg,
        tls,
        certificates,
    })
}

impl Plan {
    /// The new config.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Applies the plan: services, policies and datapath settings to every interface, the new
    /// certificates, session terms (lifetime, resume limit), backends and timeouts to every
    /// listener (for new connections and the session keys issued from now on; open connections
    /// carry on, and members removed drain). Returns the new config. (The daemon restarts its
    /// controller with the new settings.)
    ///
    /// With the config, what the reload changed that the config's values do not show: in each
    /// attachment's maps, what had been changed by hand since `running_cfg` was applied and is
    /// put back to the config's ([`Datapath::undone_since`]), and the certificates' content
    /// against `running` ([`Certificates::changed_since`]).
    ///
    /// # Errors
    /// A map write failed on some interface (named); what was written stays.
    pub fn apply(
        self,
        attached: &[Arc<Attached>],
        proxies: &[Arc<Proxy>],
        running_cfg: &Config,
        running: &Certificates,
    ) -> Result<Applied, String> {
        let mut changed = self.certificates.changed_since(running);
        for a in attached {
            let before = Datapath::of(a);
            apply(&mut a.maps(), &self.cfg).map_err(|e| format!("{}: {e}", a.iface()))?;
            changed.extend(Datapath::of(a).undone_since(&before, running_cfg, a.iface()));
        }
        for ((proxy, tls), p) in proxies.iter().zip(self.tls).zip(&self.cfg.proxies) {
            proxy.reconfigure(p.clone());
            proxy.set_tls(tls);
            // Session keys issued from now on: the new lifetime, resume limit and rate.
            proxy.issued().set_terms(p.tls.terms());
        }
        Ok(Applied {
            cfg: self.cfg,
            certificates: self.certificates,
            changed,
        })
    }
}

/// An applied reload.
pub struct Applied {
    /// The config now running.
    pub cfg: Config,
    /// Its certificates' content.
    pub certificates: Certificates,
    /// What changed that the config's values do not show.
    pub changed: Vec<String>,
}

/// Where a daemon leaves the outcome of its last reload for `gateway reload` to print: one file
/// per daemon pid under `/run/gateway` (the systemd unit's `RuntimeDirectory=`).
pub fn outcome_path(pid: u32) -> std::path::PathBuf {
    std::path::Path::new(RUN_DIR).join(format!("reload-{pid}"))
}

/// The runtime directory of the daemon's files.
pub const RUN_DIR: &str = "/run/gateway";

/// Records the outcome of this daemon's last reload (best effort: without it, `gateway reload`
/// still reports applied or refused, and the log has the reason).
pub fn record_outcome(text: &str) {
    write_run_file(&outcome_path(std::process::id()), text);
}

/// Writes `text` to `path` under [`RUN_DIR`] whole (a file beside it, renamed over it), so a
/// reader never sees half of it; best effort.
fn write_run_file(path: &std::path::Path, text: &str) {
    let _ = std::fs::create_dir_all(RUN_DIR);
    let tmp = path.with_extension("tmp");
    if std::fs::write(&tmp, text).is_ok() {
        let _ = std::fs::rename(&tmp, path);
    }
}

/// Where a daemon leaves the config it runs, as it holds it (the file's, with the command
/// line's overrides and every default written out), for `gateway config show`.
pub fn running_config_path(pid: u32) -> std::path::PathBuf {
    std::path::Path::new(RUN_DIR).join(format!("config-{pid}.yaml"))
}

/// Records the config this daemon runs now (at its start and after each applied reload; best
/// effort, as the outcome).
pub fn record_running(cfg: &Config) {
    let Ok(text) = serde_norway::to_string(cfg) else {
        return;
    };
    let header = "# The config the daemon runs, as it holds it: the file's, with the command line's\n\
                  # overrides and every default written out (gateway config show).\n";
    write_run_file(
        &running_config_path(std::process::id()),
        &format!("{header}{text}"),
    );
}

/// Removes this daemon's outcome file (on exit).
pub fn forget_outcome() {
    let _ = std::fs::remove_file(outcome_path(std::process::id()));
    let _ = std::fs::remove_file(running_config_path(std::process::id()));
}

/// What a reload changed, as the config's own field paths (`services`, `policy`,
/// `proxies[0].tls`, `proxies[0].backends`, ...): the top-level sections whose values differ,
/// and for proxies each listener's fields that differ.
pub fn changes(old: &Config, new: &Config) -> Vec<String> {
    let (a, b) = (
        serde_json::to_value(old).unwrap_or_default(),
        serde_json::to_value(new).unwrap_or_default(),
    );
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return Vec::new();
    };
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = Vec::new();
    for k in keys {
        if a.get(k) == b.get(k) {
            continue;
        }
        match (
            k.as_str(),
            a.get(k).and_then(|v| v.as_array()),
            b.get(k).and_then(|v| v.as_array()),
        ) {
            ("proxies", Some(x), Some(y)) if x.len() == y.len() => {
                for (i, (p, q)) in x.iter().zip(y).enumerate() {
                    let (Some(p), Some(q)) = (p.as_object(), q.as_object()) else {
                        continue;
                    };
                    let mut fields: Vec<&String> = p.keys().chain(q.keys()).collect();
                    fields.sort();
                    fields.dedup();
                    for f in fields.into_iter().filter(|f| p.get(*f) != q.get(*f)) {
                        out.push(format!("proxies[{i}].{f}"));
                    }
                }
            }
            _ => out.push(k.clone()),
        }
    }
    out
}
