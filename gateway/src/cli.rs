//! Command-line interface.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use gateway_common::Class;

use crate::{
    config::{self, Kind, Proto},
    loader::ModeRequest,
};

/// Linux admission gateway: classifies and admits traffic of protected services at the NIC.
#[derive(Debug, Parser)]
#[command(name = "gateway", version, about)]
pub struct Cli {
    /// bpffs root of the per-interface pin directories [default: /sys/fs/bpf/gateway, or the
    /// config's `bpffs` for `run`].
    #[arg(long, global = true, value_name = "DIR")]
    pub bpffs: Option<PathBuf>,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load the datapath, attach it to an interface and pin it (or replace the program of an
    /// existing attachment through its pinned link), then exit leaving it in place.
    Attach {
        /// Interface.
        #[arg(long)]
        iface: String,
        /// Hook: native XDP, generic XDP, TC ingress, or native falling back to generic.
        #[arg(long, value_enum, default_value_t = ModeRequest::Native)]
        mode: ModeRequest,
    },
    /// Detach the datapath from an interface and remove its pins.
    Detach {
        /// Interface.
        #[arg(long)]
        iface: String,
    },
    /// Show every attachment: interface, mode, link and program ids.
    Status {
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Show per-class and parser counters.
    Stats {
        /// Which attachment.
        #[command(flatten)]
        target: Target,
        /// JSON output.
        #[arg(long)]
        json: bool,
        /// Print again every SECS seconds.
        #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..=3600))]
        watch: Option<u64>,
        /// With --watch: stop after N prints.
        #[arg(long, value_name = "N", requires = "watch")]
        count: Option<u64>,
    },
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
    /// Run the daemon: attach (or adopt) per the config, apply it, serve until SIGTERM/SIGINT.
    Run {
        /// Configuration file [default: the embedded default, see `gateway config default`].
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// Protect this interface instead of the config's `interfaces`.
        #[arg(long)]
        iface: Option<String>,
        /// With --iface: the hook to use.
        #[arg(long, value_enum, requires = "iface")]
        mode: Option<ModeRequest>,
    },
    /// Configuration files.
    Config {
        /// Config subcommand.
        #[command(subcommand)]
        action: ConfigAction,
    },
}

/// The interface a map command works on.
#[derive(Debug, Args)]
pub struct Target {
    /// Interface [default: the only attached one].
    #[arg(long)]
    pub iface: Option<String>,
}

/// `policy` subcommands.
#[derive(Debug, Subcommand)]
pub enum PolicyAction {
    /// Show every class's limits and backlog.
    Show {
        /// Which attachment.
        #[command(flatten)]
        target: Target,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Set limits of a class; limits not given stay as they are.
    Set {
        /// Class name.
        #[arg(value_parser = parse_limitable_class)]
        class: Class,
        /// Maximum backlog (admitted minus completed).
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=config::MAX_BACKLOG))]
        backlog: Option<u64>,
        /// Sustained admissions per second.
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=config::MAX_RATE))]
        rate: Option<u64>,
        /// Admissions allowed in a burst above the rate.
        #[arg(long, allow_negative_numbers = true, value_parser = clap::value_parser!(u64).range(0..=config::MAX_BURST))]
        burst: Option<u64>,
        /// How long an admitted unit may go unanswered before it expires (`500ms`, `10s`).
        #[arg(long)]
        timeout: Option<crate::proxy::config::Span>,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
    /// Remove every limit of a class.
    Clear {
        /// Class name.
        #[arg(value_parser = parse_limitable_class)]
        class: Class,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
}

/// `service` subcommands.
#[derive(Debug, Subcommand)]
pub enum ServiceAction {
    /// Protect a port.
    Add {
        /// What the port speaks.
        #[arg(value_enum)]
        kind: Kind,
        /// Destination port.
        #[arg(value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
        /// Transport [default: tcp for tls, udp for sip].
        #[arg(long, value_enum)]
        proto: Option<Proto>,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
    /// Stop protecting a port.
    Del {
        /// Destination port.
        #[arg(value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
        /// Transport [default: the only one registered on the port].
        #[arg(long, value_enum)]
        proto: Option<Proto>,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
    /// List protected ports.
    List {
        /// Which attachment.
        #[command(flatten)]
        target: Target,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
}

/// `tls` subcommands.
#[derive(Debug, Subcommand)]
pub enum TlsAction {
    /// Issued session keys (filled by the TLS proxy; by hand for tests and other servers).
    Issued {
        /// Issued subcommand.
        #[command(subcommand)]
        action: IssuedAction,
    },
}

/// What was issued.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum IssuedKind {
    /// A TLS 1.2 session id.
    SessionId,
    /// A TLS 1.2 session ticket.
    Ticket,
    /// A TLS 1.3 PSK identity (ticket).
    Psk,
}

/// `tls issued` subcommands.
#[derive(Debug, Subcommand)]
pub enum IssuedAction {
    /// Publish the key of an issued session id, ticket or PSK identity: give the whole value (at
    /// least 16 bytes, in hex); its digest is what the datapath matches offers against.
    Add {
        /// The whole issued value, in hex.
        #[arg(value_parser = parse_key)]
        key: gateway_common::maps::IssuedKey,
        /// What was issued.
        #[arg(long, value_enum, default_value_t = IssuedKind::SessionId)]
        kind: IssuedKind,
        /// Connections the key may hold in the tls-resumed class at once.
        #[arg(long, default_value_t = gateway_common::maps::DEFAULT_RESUME_LIMIT,
              value_parser = clap::value_parser!(u32).range(1..=i64::from(gateway_common::maps::MAX_RESUME_LIMIT)))]
        limit: u32,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
    /// Withdraw the key of an issued value.
    Del {
        /// The whole issued value, in hex.
        #[arg(value_parser = parse_key)]
        key: gateway_common::maps::IssuedKey,
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
    /// List published keys.
    List {
        /// Which attachment.
        #[command(flatten)]
        target: Target,
        /// JSON output.
        #[arg(long)]
        json: bool,
    },
    /// Count published keys.
    Count {
        /// Which attachment.
        #[command(flatten)]
        target: Target,
    },
}

/// The key of an issued value given in hex: its digest (`gateway_common::tls::offer_digest`).
fn parse_key(s: &str) -> Result<gateway_common::maps::IssuedKey, String> {
    let (min, max) = (
        gateway_common::tls::KEY_LEN,
        gateway_common::tls::MAX_OFFER as usize,
    );
    if s.len() < 2 * min || s.len() > 2 * max || !s.len().is_multiple_of(2) {
        return Err(format!(
            "need the whole issued value: an even number of hex digits, {} to {}, got {}",
            2 * min,
            2 * max,
            s.len()
        ));
    }
    let value = (0..s.len() / 2)
        .map(|i| {
            u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                .map_err(|_| format!("not hex at digit {}: {s}", 2 * i))
        })
        .collect::<Result<Vec<u8>, _>>()?;
    Ok(gateway_common::maps::IssuedKey {
        key: gateway_common::tls::offer_digest(&value),
    })
}

/// `config` subcommands.
#[derive(Debug, Subcommand)]
pub enum ConfigAction {
    /// Validate a configuration file without touching the system.
    Check {
        /// The file.
        file: PathBuf,
    },
    /// Print the embedded default configuration.
    Default,
}

fn parse_limitable_class(s: &str) -> Result<Class, String> {
    let class = Class::from_name(s).ok_or_else(|| config::unknown_class(s))?;
    if class.is_limitable() {
        Ok(class)
    } else {
        Err(config::unlimitable_class(class))
    }
}
