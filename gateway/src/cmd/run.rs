//! `gateway run`: the daemon (see `crate::daemon`), with the config given, or the embedded
//! default.

use std::path::PathBuf;

use clap::Args;

use super::CommandError;
use crate::{
    config::{ConfigSource, ModeRequest},
    daemon,
};

/// `gateway run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Protect this interface instead of the config's `interfaces`.
    #[arg(long)]
    pub iface: Option<String>,
    /// With --iface: the hook to use.
    #[arg(long, value_enum, requires = "iface")]
    pub mode: Option<ModeRequest>,
}

/// Runs the daemon until SIGTERM or SIGINT with `config` (the global `--config`; the embedded
/// default without one, see `gateway config default`); `bpffs` overrides the config's.
pub fn run(
    bpffs: Option<PathBuf>,
    config: Option<PathBuf>,
    args: RunArgs,
) -> Result<(), CommandError> {
    let RunArgs { iface, mode } = args;
    let source = ConfigSource {
        path: config,
        bpffs,
        iface: iface.map(|i| (i, mode.unwrap_or_default())),
    };
    let cfg = source.load()?;
    daemon::run(cfg, source)?;
    Ok(())
}
