//! `gateway service add|del|list`: the protected ports.

use std::path::Path;

use clap::Subcommand;
use gateway_common::maps::{SERVICE_SYN_COOKIES, ServiceKey, ServiceValue};

use super::{CommandError, Target, open};
use crate::{
    config::{Proto, ServiceKind, check_proto, cookies_by_default, default_proto, parse_kind},
    output,
};

/// `service` subcommands.
#[derive(Debug, Subcommand)]
pub enum ServiceAction {
    /// Protect a port.
    Add {
        /// What the port speaks.
        #[arg(value_parser = parse_kind())]
        kind: ServiceKind,
        /// Destination port.
        #[arg(value_parser = clap::value_parser!(u16).range(1..))]
        port: u16,
        /// Transport [default: tcp for tls, udp for sip].
        #[arg(long, value_enum)]
        proto: Option<Proto>,
        /// TLS over TCP: answer SYNs from the NIC with SYN cookies and judge each new
        /// connection's hello before the kernel holds anything for it; refused where the kernel
        /// cannot (before Linux 6.9) [default: on for tls over tcp where the kernel can].
        #[arg(long, conflicts_with = "no_syn_cookies")]
        syn_cookies: bool,
        /// Leave the port's SYNs to the kernel.
        #[arg(long)]
        no_syn_cookies: bool,
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

/// Runs a `service` subcommand.
pub fn run(root: &Path, action: ServiceAction) -> Result<(), CommandError> {
    match action {
        ServiceAction::Add {
            kind,
            port,
            proto,
            syn_cookies,
            no_syn_cookies,
            target,
        } => {
            let proto = proto.unwrap_or(default_proto(kind));
            check_proto(kind, proto).map_err(|e| CommandError::Usage(format!("--proto: {e}")))?;
            let (pd, mut maps) = open(root, target.iface.as_deref())?;
            let syn_cookies = syn_cookies
                || (!no_syn_cookies
                    && cookies_by_default(kind, proto)
                    && crate::datapath::kfunc::handoff_available());
            let flags = if syn_cookies { SERVICE_SYN_COOKIES } else { 0 };
            maps.add_service(
                ServiceKey::new(proto.number(), port),
                ServiceValue {
                    kind: kind as u32,
                    flags,
                },
            )?;
            println!(
                "{} {}/{port} protected on {}{}",
                kind.name(),
                proto.name(),
                pd.iface,
                if syn_cookies {
                    ", SYNs answered with cookies from the NIC"
                } else {
                    ""
                }
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
