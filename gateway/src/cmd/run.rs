//! `gateway run`: the daemon (see `crate::daemon`), with the config given, or the embedded
//! default.

use std::path::PathBuf;

use clap::Args;

use super::CommandError;
use crate::{
    config::{ConfigSource, IfaceOverride},
    daemon,
    datapath::ModeRequest,
};

/// `gateway run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Protect this interface instead of the config's `interfaces`.
    #[arg(long, value_parser = crate::config::parse_iface)]
    pub iface: Option<String>,
    /// Protect the interface that carries this address instead of the config's `interfaces`
    /// (a node's own address: `$(NODE_IP)` from the downward API in a DaemonSet, where
    /// interface names differ from node to node). Looked up again at each reload.
    #[arg(long, value_name = "ADDR", conflicts_with = "iface")]
    pub iface_of: Option<std::net::IpAddr>,
    /// With --iface or --iface-of: the hook to use.
    #[arg(long, value_enum)]
    pub mode: Option<ModeRequest>,
    /// Serve metrics and health at this address instead of the config's `metrics` (a node's own
    /// address in a DaemonSet on the host network, not every address the node has).
    #[arg(long, value_name = "ADDR", value_parser = crate::address::resolve)]
    pub metrics: Option<std::net::SocketAddr>,
    /// Reload when the config file's content changes (looked at every 2 s), as on SIGHUP: a
    /// Kubernetes ConfigMap edited in place reaches every node.
    #[arg(long, requires = "config")]
    pub reload_on_change: bool,
}

/// Runs the daemon until SIGTERM or SIGINT with `config` (the global `--config`; the embedded
/// default without one, see `gateway config default`); `bpffs` overrides the config's.
pub fn run(
    bpffs: Option<PathBuf>,
    config: Option<PathBuf>,
    args: RunArgs,
) -> Result<(), CommandError> {
    let RunArgs {
        iface,
        iface_of,
        mode,
        metrics,
        reload_on_change,
    } = args;
    if mode.is_some() && iface.is_none() && iface_of.is_none() {
        return Err(CommandError::Usage(
            "--mode goes with --iface or --iface-of (the config's interfaces say their own)".into(),
        ));
    }
    let mode = mode.unwrap_or_default();
    let source = ConfigSource {
        path: config,
        bpffs,
        iface: match (iface, iface_of) {
            (Some(name), _) => Some((IfaceOverride::Name(name), mode)),
            (None, Some(addr)) => Some((IfaceOverride::Carrying(addr), mode)),
            (None, None) => None,
        },
        metrics,
        reload_on_change,
    };
    let cfg = source.load()?;
    daemon::run(cfg, source)?;
    Ok(())
}
