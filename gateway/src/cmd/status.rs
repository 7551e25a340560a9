//! `gateway status`: every attachment.

use std::path::Path;

use clap::Args;

use super::CommandError;
use crate::{
    caps::{self, Need},
    loader, pins,
};

/// `gateway status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Shows every attachment: interface, mode, link and program ids.
pub fn run(root: &Path, args: StatusArgs) -> Result<(), CommandError> {
    let json = args.json;
    caps::require(Need::Maps)?;
    pins::check_bpffs(root)?;
    let infos = pins::attached(root)?
        .iter()
        .map(loader::info)
        .collect::<Result<Vec<_>, _>>()?;
    if json {
        println!("{}", serde_json::to_string(&infos).expect("serializable"));
    } else if infos.is_empty() {
        println!("not attached anywhere under {}", root.display());
    } else {
        let id = |v: Option<u32>| v.map_or("none".to_string(), |v| v.to_string());
        for i in infos {
            println!(
                "{}: {} mode, ifindex {}, link {}, program {} ({} verified instructions), egress link {}, finish link {}, daemon {}, pins {}",
                i.iface,
                i.mode,
                i.ifindex,
                i.link_id,
                i.program_id,
                i.verified_insns.map_or("?".into(), |n| n.to_string()),
                id(i.egress_link_id),
                id(i.finish_link_id),
                i.daemon_pid
                    .map_or("none".to_string(), |p| format!("pid {p}")),
                i.pin_dir
            );
        }
    }
    Ok(())
}
