//! `gateway mount-bpffs`: the bpf filesystem a daemon that runs as its own user pins in.

use std::path::PathBuf;

use clap::Args;

use super::CommandError;

/// `gateway mount-bpffs`.
#[derive(Debug, Args)]
pub struct MountArgs {
    /// The user (a name or a uid) who owns the mount; its primary group owns it too.
    #[arg(long)]
    pub owner: String,
    /// Where to mount it (created if missing): the `bpffs:` of the daemon's config.
    pub dir: PathBuf,
}

/// Mounts the bpffs (`crate::datapath::pins::mount_owned_bpffs`) and says what it did.
pub fn run(args: MountArgs) -> Result<(), CommandError> {
    use nix::unistd::{Uid, User};
    let found = match args.owner.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(&args.owner),
    };
    let user = found
        .ok()
        .flatten()
        .ok_or_else(|| CommandError::Usage(format!("--owner: no user '{}'", args.owner)))?;
    let (uid, gid) = (user.uid.as_raw(), user.gid.as_raw());
    let mounted = crate::datapath::pins::mount_owned_bpffs(&args.dir, uid, gid)?;
    let what = if mounted { "mounted" } else { "already" };
    println!(
        "{what} a bpf filesystem at {} owned by {} (uid {uid}, gid {gid})",
        args.dir.display(),
        user.name
    );
    Ok(())
}
