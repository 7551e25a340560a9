//! The command line: one module per subcommand, each with its arguments and what it does; here
//! the top-level parser, the shared `--iface` target, the error type and the dispatch.

mod attach;
mod config;
mod docs;
mod mount;
mod policy;
mod probe;
mod reload;
mod run;
mod service;
mod stats;
mod status;
mod tls;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use thiserror::Error;

pub use attach::{AttachArgs, DetachArgs};
pub use config::ConfigAction;
pub use policy::PolicyAction;
pub use probe::ProbeArgs;
pub use reload::ReloadArgs;
pub use run::RunArgs;
pub use service::ServiceAction;
pub use stats::StatsArgs;
pub use status::StatusArgs;
pub use tls::{IssuedAction, TlsAction};

use crate::{
    caps::{self, CapsError, Need},
    config::ConfigError,
    daemon::DaemonError,
    datapath::loader::LoaderError,
    datapath::maps::{Maps, MapsError},
    datapath::pins::{self, DEFAULT_ROOT, PinsError},
    logging::LogFormat,
};

/// Linux admission gateway: classifies and admits traffic of protected services at the NIC.
#[derive(Debug, Parser)]
#[command(name = "gateway", version, about)]
pub struct Cli {
    /// bpffs root of the per-interface pin directories [default: the `bpffs` of --config,
    /// else /sys/fs/bpf/gateway].
    #[arg(long, global = true, value_name = "DIR", env = "GATEWAY_BPFFS")]
    pub bpffs: Option<PathBuf>,
    /// Configuration file: the one `run` serves [default: the embedded default]; every other
    /// command finds the bpffs root in its `bpffs` unless --bpffs says otherwise.
    #[arg(long, global = true, value_name = "FILE", env = "GATEWAY_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log lines as `text` or `json` (one object per line: timestamp, level, target, fields), for
    /// log shippers.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load the datapath, attach it to an interface and pin it (or replace the program of an
    /// existing attachment through its pinned link), then exit leaving it in place.
    Attach(AttachArgs),
    /// Detach the datapath from an interface and remove its pins.
    Detach(DetachArgs),
    /// Show every attachment: interface, mode, link and program ids.
    Status(StatusArgs),
    /// Show per-class and parser counters.
    Stats(StatsArgs),
    /// Show or change per-class admission limits.
    Policy {
        /// Policy subcommand.
        #[command(subcommand)]
        action: PolicyAction,
    },
    /// Manage the protected services.
    Service {
        /// Service subcommand.
        #[command(subcommand)]
        action: ServiceAction,
    },
    /// TLS: the keys of issued sessions the datapath verifies resumption offers against.
    Tls {
        /// TLS subcommand.
        #[command(subcommand)]
        action: TlsAction,
    },
    /// Run the daemon: attach (or adopt) per the config, apply it, serve until SIGTERM/SIGINT;
    /// SIGHUP (or `gateway reload`) reads the config again.
    Run(RunArgs),
    /// Make the running daemon read its config again: applied whole, or refused with nothing
    /// changed.
    Reload(ReloadArgs),
    /// Find a server's limits: synchronized crowds of clients, growing until the median
    /// response time rises by a threshold (the mini-flash-crowd probe).
    Probe(ProbeArgs),
    /// Configuration files.
    Config {
        /// Config subcommand.
        #[command(subcommand)]
        action: ConfigAction,
    },
    /// Mount a bpf filesystem of its own at DIR, owned by a user (mode 0700), for a daemon that
    /// runs as that user to pin its datapath in (the systemd unit runs it before the daemon);
    /// nothing when DIR already is one that user owns.
    MountBpffs(mount::MountArgs),
    /// Print the shell completion script for SHELL (bash, zsh, fish, elvish, powershell).
    Completions(docs::CompletionsArgs),
    /// Print the manual page (roff, section 8), or write every page with --dir.
    Man(docs::ManArgs),
}

/// The interface a map command works on.
#[derive(Debug, Args)]
pub struct Target {
    /// Interface [default: the only attached one].
    #[arg(long, value_parser = crate::config::parse_iface)]
    pub iface: Option<String>,
}

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
    /// Writing the output failed.
    #[error("writing the output: {0}")]
    Output(String),
    /// An attachment is not ready (what `/readyz` would say).
    #[error("not ready: {0}")]
    NotReady(String),
}

impl CommandError {
    /// Process exit code: 2 for bad input (arguments, config, missing privilege, unknown
    /// interface or attachment), 1 for failures of the system.
    pub fn exit_code(&self) -> i32 {
        let input = match self {
            CommandError::Loader(e) => e.is_input_error(),
            CommandError::Pins(e) => !matches!(e, PinsError::Io { .. }),
            CommandError::Maps(_) | CommandError::Output(_) | CommandError::NotReady(_) => false,
            CommandError::Daemon(e) => e.is_input_error(),
            CommandError::Caps(_) | CommandError::Config(_) | CommandError::Usage(_) => true,
        };
        if input { 2 } else { 1 }
    }
}

/// The bpffs root: `--bpffs` (or `GATEWAY_BPFFS`), else the `bpffs` of `--config` (or
/// `GATEWAY_CONFIG`), else the default. A config that does not load is refused, naming it.
fn root(bpffs: &Option<PathBuf>, config: &Option<PathBuf>) -> Result<PathBuf, CommandError> {
    if let Some(root) = bpffs {
        return Ok(root.clone());
    }
    match config {
        Some(path) => Ok(crate::config::Config::load(path)?.bpffs),
        None => Ok(PathBuf::from(DEFAULT_ROOT)),
    }
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
    let (bpffs, config) = (cli.bpffs, cli.config);
    let root = || root(&bpffs, &config);
    match cli.command {
        Command::Attach(args) => attach::attach(&root()?, args),
        Command::Detach(args) => attach::detach(&root()?, args),
        Command::Status(args) => status::run(&root()?, args),
        Command::Stats(args) => stats::run(&root()?, args),
        Command::Policy { action } => policy::run(&root()?, action),
        Command::Service { action } => service::run(&root()?, action),
        Command::Tls { action } => tls::run(&root()?, action),
        Command::Run(args) => run::run(bpffs, config, args),
        Command::Reload(args) => reload::run(&root()?, args),
        Command::Config { action } => config::run(root, action),
        Command::Probe(args) => probe::run(args),
        Command::MountBpffs(args) => mount::run(args),
        Command::Completions(args) => docs::completions(args),
        Command::Man(args) => docs::man(args),
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::Cli;

    /// Values that break naive parsers: multi-byte characters at odd byte offsets, controls,
    /// signs, overflows, empty, odd lengths.
    const NASTY: &[&str] = &[
        "",
        "-",
        "--",
        "a€€€€€€€€€€€",
        "€",
        "0€0€0€0€0€0€0€0€0€0€0€0€0€0€0€0€",
        "\u{0}",
        "ff\u{7f}",
        "0",
        "-1",
        "18446744073709551616",
        "99999999999999999999999999",
        "1e400",
        "NaN",
        "0x10",
        "ffffffffffffffffffffffffffffffff",
        "fffffffffffffffffffffffffffffffff",
        "1ms",
        "10x",
        "🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀🦀",
    ];

    /// Every subcommand's arguments, `{}` standing for a value under test.
    const SHAPES: &[&[&str]] = &[
        &["tls", "issued", "add", "{}"],
        &["tls", "issued", "add", "{}", "--limit", "{}"],
        &[
            "tls",
            "issued",
            "add",
            "00112233445566778899aabbccddeeff",
            "--per-minute",
            "{}",
        ],
        &[
            "tls",
            "issued",
            "add",
            "00112233445566778899aabbccddeeff",
            "--kind",
            "{}",
        ],
        &["tls", "issued", "del", "{}"],
        &["policy", "set", "{}", "--backlog", "{}"],
        &["policy", "set", "tls-new", "--rate", "{}", "--burst", "{}"],
        &["policy", "set", "tls-new", "--timeout", "{}"],
        &["policy", "unpin", "{}"],
        &["service", "add", "{}", "{}"],
        &["attach", "--iface", "{}", "--mode", "{}"],
        &["stats", "--iface", "{}"],
        &["probe", "{}"],
        &["config", "check", "{}"],
        &["--bpffs", "{}", "status"],
        &["{}"],
    ];

    /// No argument a person can type makes the CLI panic: every parser answers with an error
    /// or a value (issue 29: a multi-byte character in a hex key did).
    #[test]
    fn no_cli_input_panics() {
        for shape in SHAPES {
            for a in NASTY {
                for b in NASTY {
                    let mut filled = 0;
                    let argv: Vec<String> = std::iter::once("gateway".to_string())
                        .chain(shape.iter().map(|s| {
                            if *s == "{}" {
                                filled += 1;
                                if filled == 1 { a } else { b }.to_string()
                            } else {
                                s.to_string()
                            }
                        }))
                        .collect();
                    let _ = Cli::try_parse_from(&argv);
                }
            }
        }
    }
}
