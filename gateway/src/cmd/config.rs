//! `gateway config check|default`: configuration files, checked as `gateway run` would check
//! them short of attaching: parsed and cross-checked, every interface present on this host,
//! every listener's certificate, key and ticket key file read and matched.

use std::path::PathBuf;

use clap::Subcommand;

use super::CommandError;
use crate::config::{Config, DEFAULT_YAML};

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Validate a configuration file as `run` would, short of attaching: fields and their
    /// rules, interfaces present on this host, certificates and keys read and matched.
    Check {
        /// The file.
        file: PathBuf,
    },
    /// Print the embedded default configuration.
    Default,
    /// Print the config the running daemon holds (as `nginx -T` does): the file's as last
    /// applied, with the command line's overrides and every default written out.
    Show {
        /// Which attachment's daemon.
        #[command(flatten)]
        target: super::Target,
    },
}

/// Runs a `config` subcommand (`root`: where the pins are, for `show`).
pub fn run(
    root: impl FnOnce() -> Result<PathBuf, CommandError>,
    action: ConfigAction,
) -> Result<(), CommandError> {
    match action {
        ConfigAction::Show { target } => {
            let (pd, maps) = super::open(&root()?, target.iface.as_deref())?;
            let pid = maps.config()?.daemon_pid;
            if pid == 0 || pd.holder() != Some(pid) {
                return Err(CommandError::Usage(format!(
                    "no daemon serves {} (start one with `gateway run`)",
                    pd.iface
                )));
            }
            let path = crate::reload::running_config_path(pid);
            let text = std::fs::read_to_string(&path).map_err(|e| {
                CommandError::Usage(format!(
                    "the daemon (pid {pid}) of {} left no config at {}: {e}",
                    pd.iface,
                    path.display()
                ))
            })?;
            print!("{text}");
        }
        ConfigAction::Check { file } => {
            let cfg = Config::load(&file)?;
            check_system(&cfg)
                .map_err(|e| CommandError::Usage(format!("{}: {e}", file.display())))?;
            println!("{}: ok ({cfg})", file.display());
        }
        ConfigAction::Default => print!("{DEFAULT_YAML}"),
    }
    Ok(())
}

/// What `run` would find wrong with `cfg` on this host before it attached anything.
fn check_system(cfg: &Config) -> Result<(), String> {
    crate::datapath::pins::check_bpffs(&cfg.bpffs).map_err(|e| format!("bpffs: {e}"))?;
    if cfg.interfaces.0.is_empty() {
        return Err(
            "interfaces: none listed (`gateway run` needs one here, or --iface on its command line)"
                .into(),
        );
    }
    for (i, iface) in cfg.interfaces.0.iter().enumerate() {
        if nix::net::if_::if_nametoindex(iface.name.as_str()).is_err() {
            return Err(format!(
                "interfaces[{i}].name: no interface '{}' on this host",
                iface.name
            ));
        }
    }
    for (i, p) in cfg.proxies.iter().enumerate() {
        let keys = std::sync::Arc::new(crate::issued::IssuedKeys::none(p.tls.session_lifetime.0));
        crate::tls::server_config(&p.tls, keys)
            .map_err(|e| format!("proxies[{i}].tls ({}): {e}", p.listen))?;
    }
    Ok(())
}
