//! The CLI commands that work on pinned objects, with or without a running daemon.

use std::{path::PathBuf, thread, time::Duration};

use gateway_common::{
    Class,
    maps::{ServiceKey, ServiceValue},
};
use thiserror::Error;

use crate::{
    caps::{self, CapsError, Need},
    cli::{
        Cli, Command, ConfigAction, IssuedAction, IssuedKind, PolicyAction, ServiceAction,
        TlsAction,
    },
    config::{Config, ConfigError, PolicyConfig},
    daemon::{self, DaemonError},
    loader::{self, AttachOptions, LoaderError},
    maps::{Maps, MapsError},
    output::{self, StatsView},
    pins::{self, DEFAULT_ROOT, PinsError},
};

/// Errors of a command; each renders as one line.
#[derive(Debug, Error)]
pub enum CommandError {
    /// Loading, attaching, detaching.
    #[error(transparent)]
    Loader(#[from] LoaderError),
    /// Pin directory.
    #[error(transparent)]
    Pins(#[from] PinsError),
    /// Maps.
    #[error(transparent)]
    Maps(#[from] MapsError),
    /// Capabilities.
    #[error(transparent)]
    Caps(#[from] CapsError),
    /// Configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The daemon.
    #[error(transparent)]
    Daemon(#[from] DaemonError),
    /// Bad arguments the parser could not catch.
    #[error("{0}")]
    Usage(String),
}

impl CommandError {
    /// Process exit code: 2 for bad input (arguments, config, missing privilege, unknown
    /// interface or attachment), 1 for failures of the system.
    pub fn exit_code(&self) -> i32 {
        let input = match self {
            CommandError::Loader(e) => e.is_input_error(),
            CommandError::Pins(e) => !matches!(e, PinsError::Io { .. }),
            CommandError::Maps(_) => false,
            CommandError::Daemon(e) => e.is_input_error(),
            CommandError::Caps(_) | CommandError::Config(_) | CommandError::Usage(_) => true,
        };
        if input { 2 } else { 1 }
    }
}

fn root(cli_root: &Option<PathBuf>) -> PathBuf {
    cli_root
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_ROOT))
}

/// Opens the maps of the selected attachment.
fn open(root: &std::path::Path, iface: Option<&str>) -> Result<(pins::PinDir, Maps), CommandError> {
    caps::require(Need::Maps)?;
    let pd = pins::select(root, iface)?;
    let maps = Maps::open(&pd)?;
    Ok((pd, maps))
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> Result<(), CommandError> {
    let bpffs = cli.bpffs;
    match cli.command {
        Command::Attach { iface, mode } => {
            let a = loader::attach(&AttachOptions {
                iface,
                mode,
                root: root(&bpffs),
                ebpf_log_level: crate::config::EbpfLogLevel::default().value(),
            })?;
            if let Some(reason) = &a.fallback_reason {
                eprintln!(
                    "warning: native XDP refused on {} ({reason}); using generic XDP",
                    a.iface
                );
            }
            println!(
                "{} {} in {} mode (link {}, program {})",
                if a.replaced {
                    "replaced program on"
                } else {
                    "attached to"
                },
                a.iface,
                a.mode.name(),
                a.link_id,
                a.program_id
            );
        }
        Command::Detach { iface } => {
            loader::detach(&root(&bpffs), &iface)?;
            println!("detached from {iface}");
        }
        Command::Status { json } => {
            caps::require(Need::Maps)?;
            let root = root(&bpffs);
            pins::check_bpffs(&root)?;
            let infos = pins::attached(&root)?
                .iter()
                .map(loader::info)
                .collect::<Result<Vec<_>, _>>()?;
            if json {
                println!("{}", serde_json::to_string(&infos).expect("serializable"));
            } else if infos.is_empty() {
                println!("not attached anywhere under {}", root.display());
            } else {
                for i in infos {
                    println!(
                        "{}: {} mode, ifindex {}, link {}, program {} ({} verified instructions), pins {}",
                        i.iface,
                        i.mode,
                        i.ifindex,
                        i.link_id,
                        i.program_id,
                        i.verified_insns.map_or("?".into(), |n| n.to_string()),
                        i.pin_dir
                    );
                }
            }
        }
        Command::Stats {
            target,
            json,
            watch,
            count,
        } => {
            let (pd, maps) = open(&root(&bpffs), target.iface.as_deref())?;
            let mut printed = 0u64;
            loop {
                let info = loader::info(&pd)?;
                let classes = maps.class_stats()?;
                let state = maps.class_state()?;
                let counters = maps.counters()?;
                let tls = maps.tls_counters()?;
                let sip_latency = maps.latency(gateway_common::Class::SipOriginal)?;
                let view = StatsView {
                    info: &info,
                    classes: &classes,
                    state: &state,
                    counters: &counters,
                    tls: &tls,
                    sip_latency: &sip_latency,
                };
                if json {
                    println!("{}", view.json());
                } else {
                    print!("{}", view.table());
                }
                printed += 1;
                match watch {
                    Some(secs) if count.is_none_or(|n| printed < n) => {
                        thread::sleep(Duration::from_secs(secs));
                    }
                    _ => break,
                }
            }
        }
        Command::Policy { action } => policy(&root(&bpffs), action)?,
        Command::Service { action } => service(&root(&bpffs), action)?,
        Command::Tls {
            action: TlsAction::Issued { action },
        } => issued(&root(&bpffs), action)?,
        Command::Run {
            config,
            iface,
            mode,
        } => {
            let mut cfg = match &config {
                Some(path) => Config::load(path)?,
                None => Config::embedded_default(),
            };
            if let Some(root) = bpffs {
                cfg.bpffs = root;
            }
            if let Some(iface) = iface {
                cfg.interfaces.0 = vec![crate::config::Interface {
                    name: iface,
                    mode: mode.unwrap_or_default(),
                }];
            }
            daemon::run(cfg)?;
        }
        Command::Config { action } => match action {
            ConfigAction::Check { file } => {
                let cfg = Config::load(&file)?;
                println!("{}: ok ({cfg})", file.display());
            }
            ConfigAction::Default => print!("{}", crate::config::DEFAULT_YAML),
        },
    }
    Ok(())
}

fn policy(root: &std::path::Path, action: PolicyAction) -> Result<(), CommandError> {
    match action {
        PolicyAction::Show { target, json } => {
            let (_, maps) = open(root, target.iface.as_deref())?;
            let state = maps.class_state()?;
            let rows = Class::ALL
                .into_iter()
                .filter(|c| c.is_limitable())
                .map(|c| Ok((c, maps.policy(c)?, state[c.id() as usize])))
                .collect::<Result<Vec<_>, MapsError>>()?;
            print!("{}", output::policies(&rows, json));
            if json {
                println!();
            }
        }
        PolicyAction::Set {
            class,
            backlog,
            rate,
            burst,
            timeout,
            target,
        } => {
            if backlog.is_none() && rate.is_none() && burst.is_none() && timeout.is_none() {
                return Err(CommandError::Usage(
                    "policy set needs at least one of --backlog, --rate, --burst, --timeout".into(),
                ));
            }
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            let mut p = PolicyConfig::from_map(&maps.policy(class)?);
            p.backlog = backlog.or(p.backlog);
            p.rate = rate.or(p.rate);
            p.burst = burst.or(p.burst);
            p.timeout = timeout.or(p.timeout);
            if p.burst.is_some() && p.rate.is_none() {
                return Err(CommandError::Usage(format!(
                    "--burst needs a rate: class {} has none, pass --rate",
                    class.name()
                )));
            }
            maps.set_policy(class, p.to_map())?;
            println!("{} on {}: {}", class.name(), pd.iface, describe(&p));
        }
        PolicyAction::Clear { class, target } => {
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            maps.set_policy(class, PolicyConfig::default().to_map())?;
            println!("{} on {}: unlimited", class.name(), pd.iface);
        }
    }
    Ok(())
}

fn describe(p: &PolicyConfig) -> String {
    let show = |v: Option<u64>| v.map_or("unlimited".to_owned(), |v| v.to_string());
    let timeout = p.timeout.map_or("default".to_owned(), |t| {
        humantime::format_duration(t.0).to_string()
    });
    format!(
        "backlog {}, rate {}/s, burst {}, timeout {timeout}",
        show(p.backlog),
        show(p.rate),
        p.burst.unwrap_or(0)
    )
}

fn service(root: &std::path::Path, action: ServiceAction) -> Result<(), CommandError> {
    match action {
        ServiceAction::Add {
            kind,
            port,
            proto,
            target,
        } => {
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            let proto = proto.unwrap_or(kind.default_proto());
            maps.add_service(
                ServiceKey::new(proto.number(), port),
                ServiceValue {
                    kind: kind.service_kind() as u32,
                    flags: 0,
                },
            )?;
            println!(
                "{} {}/{port} protected on {}",
                kind.service_kind().name(),
                proto.name(),
                pd.iface
            );
        }
        ServiceAction::Del {
            port,
            proto,
            target,
        } => {
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            let on_port: Vec<ServiceKey> = maps
                .services()?
                .into_iter()
                .map(|(k, _)| k)
                .filter(|k| k.port == port && proto.is_none_or(|p| p.number() == k.proto))
                .collect();
            let key = match on_port.as_slice() {
                [k] => *k,
                [] => {
                    return Err(CommandError::Usage(format!(
                        "no service on port {port} on {}",
                        pd.iface
                    )));
                }
                _ => {
                    return Err(CommandError::Usage(format!(
                        "port {port} is protected for tcp and udp: pass --proto"
                    )));
                }
            };
            maps.remove_service(key)?;
            println!("port {port} no longer protected on {}", pd.iface);
        }
        ServiceAction::List { target, json } => {
            let (_, maps) = open(root, target.iface.as_deref())?;
            print!("{}", output::services(&maps.services()?, json));
            if json {
                println!();
            }
        }
    }
    Ok(())
}

fn issued(root: &std::path::Path, action: IssuedAction) -> Result<(), CommandError> {
    use gateway_common::maps::IssuedValue;
    let hex = |k: &gateway_common::maps::IssuedKey| {
        k.key.iter().map(|b| format!("{b:02x}")).collect::<String>()
    };
    match action {
        IssuedAction::Add {
            key,
            kind,
            limit,
            target,
        } => {
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            let kind = match kind {
                IssuedKind::SessionId => gateway_common::tls::Offer::SessionId,
                IssuedKind::Ticket => gateway_common::tls::Offer::Ticket,
                IssuedKind::Psk => gateway_common::tls::Offer::Psk,
            };
            maps.add_issued(
                key,
                IssuedValue {
                    kind: kind as u32,
                    limit,
                    issued_ns: crate::maps::monotonic_ns(),
                    ..Default::default()
                },
            )?;
            println!("published {} on {}", hex(&key), pd.iface);
        }
        IssuedAction::Del { key, target } => {
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            if !maps.remove_issued(&key)? {
                return Err(CommandError::Usage(format!(
                    "{} is not published on {}",
                    hex(&key),
                    pd.iface
                )));
            }
            println!("withdrew {} on {}", hex(&key), pd.iface);
        }
        IssuedAction::List { target, json } => {
            let (_, maps) = open(root, target.iface.as_deref())?;
            let rows = maps.issued()?;
            let kind = |v: &IssuedValue| match v.kind {
                1 => "session-id",
                2 => "ticket",
                3 => "psk",
                _ => "unknown",
            };
            if json {
                let v: Vec<serde_json::Value> = rows
                    .iter()
                    .map(|(k, v)| {
                        serde_json::json!({
                            "key": hex(k), "kind": kind(v),
                            "limit": gateway_common::maps::resume_limit(v.limit),
                            "in_use": v.in_use,
                        })
                    })
                    .collect();
                println!("{}", serde_json::Value::Array(v));
            } else {
                for (k, v) in rows {
                    println!(
                        "{} {} limit {} in-use {}",
                        hex(&k),
                        kind(&v),
                        gateway_common::maps::resume_limit(v.limit),
                        v.in_use
                    );
                }
            }
        }
        IssuedAction::Count { target } => {
            let (_, maps) = open(root, target.iface.as_deref())?;
            println!("{}", maps.issued()?.len());
        }
    }
    Ok(())
}
