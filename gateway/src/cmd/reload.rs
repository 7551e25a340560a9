//! `gateway reload`: asks the daemon serving an attachment to read its config again (SIGHUP)
//! and waits for its answer: applied, or refused with nothing changed (its log says why).

use std::{
    path::Path,
    time::{Duration, Instant},
};

use clap::Args;
use nix::{sys::signal, unistd::Pid};

use super::{CommandError, Target, open};

/// `gateway reload`.
#[derive(Debug, Args)]
pub struct ReloadArgs {
    /// Which attachment's daemon.
    #[command(flatten)]
    pub target: Target,
}

/// How long the daemon may take to answer.
const ANSWER: Duration = Duration::from_secs(15);

/// Signals the daemon and waits for the outcome.
pub fn run(root: &Path, args: ReloadArgs) -> Result<(), CommandError> {
    let (pd, maps) = open(root, args.target.iface.as_deref())?;
    let before = maps.config()?;
    if before.daemon_pid == 0 {
        return Err(CommandError::Usage(format!(
            "no daemon serves {} (start one with `gateway run`)",
            pd.iface
        )));
    }
    // The pid is the daemon's only while that process holds the datapath's lock: one killed
    // without its exit path leaves the pid behind, and it may belong to another process since.
    if pd.holder() != Some(before.daemon_pid) {
        return Err(CommandError::Usage(format!(
            "no daemon serves {}: pid {} recorded in DP_CONFIG is not a running `gateway run` \
             (the daemon did not exit cleanly)",
            pd.iface, before.daemon_pid
        )));
    }
    let pid = Pid::from_raw(before.daemon_pid as i32);
    signal::kill(pid, signal::Signal::SIGHUP).map_err(|e| {
        CommandError::Usage(format!(
            "cannot signal the daemon of {} (pid {pid}): {e}",
            pd.iface
        ))
    })?;
    let deadline = Instant::now() + ANSWER;
    loop {
        let now = maps.config()?;
        // What the daemon recorded of it (its reason, or what changed); its log has it too.
        let outcome = || {
            std::fs::read_to_string(crate::reload::outcome_path(before.daemon_pid))
                .ok()
                .and_then(|t| t.split_once('\n').map(|(_, rest)| rest.trim().to_string()))
        };
        if now.reloads != before.reloads {
            let changed = outcome().map(|c| format!(": {c}")).unwrap_or_default();
            println!("reloaded (daemon pid {pid}, {}){changed}", pd.iface);
            return Ok(());
        }
        if now.reloads_refused != before.reloads_refused {
            let why = outcome().unwrap_or_else(|| "its log says why".to_string());
            return Err(CommandError::Usage(format!(
                "the daemon (pid {pid}) refused the config and changed nothing: {why}"
            )));
        }
        if Instant::now() > deadline {
            return Err(CommandError::Usage(format!(
                "the daemon (pid {pid}) did not answer within {ANSWER:?}"
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
