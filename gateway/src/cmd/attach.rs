//! `gateway attach` and `gateway detach`: the datapath on an interface, left in place.

use std::path::Path;

use clap::Args;

use super::CommandError;
use crate::{
    config::EbpfLogLevel,
    datapath::{self, AttachOptions, ModeRequest, pins::PinDir},
};

/// `gateway attach`.
#[derive(Debug, Args)]
pub struct AttachArgs {
    /// Interface.
    #[arg(long, value_parser = crate::config::parse_iface)]
    pub iface: String,
    /// Hook: native XDP, generic XDP, TC ingress, or auto (native, falling back to generic XDP,
    /// and to TC ingress where the kernel refuses XDP frame metadata).
    #[arg(long, value_enum, default_value_t = ModeRequest::Auto)]
    pub mode: ModeRequest,
}

/// `gateway detach`.
#[derive(Debug, Args)]
pub struct DetachArgs {
    /// Interface.
    #[arg(long, value_parser = crate::config::parse_iface)]
    pub iface: String,
}

/// Attaches (or replaces the program of an existing attachment).
pub fn attach(root: &Path, args: AttachArgs) -> Result<(), CommandError> {
    let AttachArgs { iface, mode } = args;
    // Not under a running daemon: it owns the program and the maps it serves from.
    let _held = datapath::attached::hold(&PinDir::new(root, &iface))?;
    let a = datapath::attach(&AttachOptions {
        iface,
        mode,
        root: root.to_path_buf(),
        ebpf_log_level: EbpfLogLevel::default().value(),
        issued_keys: gateway_common::maps::DEFAULT_TLS_ISSUED,
    })?;
    if let Some(reason) = &a.fallback_reason {
        eprintln!(
            "warning: native XDP refused on {} ({reason}); using {} mode",
            a.iface,
            a.mode.name()
        );
    }
    for map in &a.finished {
        println!("finished carrying {map} over, which an earlier start left unfinished");
    }
    for c in &a.carried {
        println!("{c}");
    }
    for m in &a.moved {
        println!("{m}");
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
    Ok(())
}

/// Detaches and removes the pins; refused while a daemon serves the interface (it would run
/// on with its maps gone, its health failing for good): stop it, and its `on_exit` decides.
pub fn detach(root: &Path, args: DetachArgs) -> Result<(), CommandError> {
    let _held = datapath::attached::hold(&PinDir::new(root, &args.iface))?;
    datapath::detach(root, &args.iface)?;
    println!("detached from {}", args.iface);
    Ok(())
}
