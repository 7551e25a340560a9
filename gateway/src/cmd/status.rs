//! `gateway status`: every attachment.

use std::path::Path;

use clap::Args;

use super::CommandError;
use crate::{
    caps::{self, Need},
    datapath::loader,
    datapath::pins,
};

/// `gateway status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Shows every attachment: interface, mode, link and program ids; fails (exit 1) when an
/// attachment is not ready (its link detached, its maps of another layout), saying why.
pub fn run(root: &Path, args: StatusArgs) -> Result<(), CommandError> {
    let json = args.json;
    caps::require(Need::Maps)?;
    pins::check_bpffs(root)?;
    let dirs = pins::attachments(root)?;
    let infos = dirs
        .iter()
        .map(loader::info)
        .collect::<Result<Vec<_>, _>>()?;
    // The checks /readyz makes of an attachment: its link bound to the interface, its maps of
    // this build's layout.
    let mut problems: Vec<String> = dirs
        .iter()
        .filter_map(|pd| crate::health::attachment_ready(pd).err())
        .collect();
    problems.extend(infos.iter().filter_map(|i| {
        Some(format!(
            "{}: the daemon that served it (pid {}) is gone without stopping (killed?): its \
             last policy holds, and nothing moves it or answers a reload; start `gateway run` \
             again",
            i.iface, i.daemon_gone?
        ))
    }));
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
                match (i.daemon_pid, i.daemon_gone) {
                    (Some(p), _) => format!("pid {p}"),
                    (None, Some(p)) => format!("gone (pid {p})"),
                    (None, None) => "none".to_string(),
                },
                i.pin_dir
            );
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(CommandError::NotReady(problems.join("; ")))
    }
}
