//! Where the gateway pins its objects: one directory per interface under a bpffs root.
//!
//! ```text
//! <root>/<iface>/link            the XDP or tcx ingress link (bpf_link), kept across restarts
//! <root>/<iface>/egress-link     the tcx egress link (SIP completions and service times)
//! <root>/<iface>/<MAP_NAME>      every map of gateway_common::maps::all()
//! <root>/<iface>/layouts         the BTF those maps were made with (`crate::datapath::layouts`)
//! ```

use std::{
    fs, io,
    os::fd::AsRawFd as _,
    path::{Path, PathBuf},
};

use crate::datapath::bpfsys;
use nix::sys::statfs::{BPF_FS_MAGIC, statfs};
use thiserror::Error;

/// The default bpffs root.
pub const DEFAULT_ROOT: &str = "/sys/fs/bpf/gateway";

/// Errors about the pin directory.
#[derive(Debug, Error)]
pub enum PinsError {
    /// The root (or the nearest existing ancestor) is not on a bpf filesystem.
    #[error(
        "{0} is not on a bpf filesystem: mount one (mount -t bpf bpf /sys/fs/bpf) or pass --bpffs DIR"
    )]
    NotBpffs(PathBuf),
    /// Nothing is attached on this interface under this root.
    #[error("no gateway attachment for interface '{iface}' under {root}")]
    NotAttached {
        /// Interface name.
        iface: String,
        /// bpffs root.
        root: PathBuf,
    },
    /// No attachment at all under the root, or more than one where one was needed.
    #[error("{0}")]
    Ambiguous(String),
    /// Another gateway datapath, pinned under another bpffs root, serves the interface.
    #[error(
        "interface '{iface}' carries a gateway datapath pinned under {other}{owner}: one \
         datapath per interface; detach that one first (`gateway --bpffs {root} detach --iface \
         {iface}`), or use its root"
    )]
    Stacked {
        /// Interface name.
        iface: String,
        /// The other pin directory.
        other: String,
        /// Its root.
        root: String,
        /// `, served by pid N` when a process holds it.
        owner: String,
    },
    /// Another process holds the interface's datapath (a running `gateway run`, or an attach
    /// in progress).
    #[error("{owner} serves interface '{iface}': stop it first (one daemon per datapath)")]
    Owned {
        /// Interface name.
        iface: String,
        /// Who holds it, as far as the datapath says (`gateway run` pid N).
        owner: String,
    },
    /// A pinned map has another layout than this build's.
    #[error(
        "pinned map {map} has {found}, this gateway expects {expected}: detach the interface \
         first (its counters and policy go with it) to move to this version's maps"
    )]
    MapLayout {
        /// Map name.
        map: &'static str,
        /// Its layout.
        found: String,
        /// This build's.
        expected: String,
    },
    /// A pinned map's fields are not this build's, though its sizes are.
    #[error(
        "pinned map {map}'s {what} is not this build's: {difference}; detach the interface \
         first (its counters and policy go with it) to move to this version's maps"
    )]
    MapFields {
        /// Map name.
        map: &'static str,
        /// `key` or `value`.
        what: &'static str,
        /// The first field that differs, both ways.
        difference: String,
    },
    /// A filesystem operation failed.
    #[error("{path}: {source}")]
    Io {
        /// The path operated on.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> PinsError + '_ {
    move |source| PinsError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Checks that `root` lives on bpffs: the root itself if it exists, else its nearest existing
/// ancestor (the root is created on first attach).
pub fn check_bpffs(root: &Path) -> Result<(), PinsError> {
    let mut p = root;
    loop {
        if p.exists() {
            let fs = statfs(p).map_err(|e| io_err(p)(e.into()))?;
            return if fs.filesystem_type() == BPF_FS_MAGIC {
                Ok(())
            } else {
                Err(PinsError::NotBpffs(root.to_path_buf()))
            };
        }
        match p.parent() {
            Some(parent) => p = parent,
            None => return Err(PinsError::NotBpffs(root.to_path_buf())),
        }
    }
}

/// Mounts a bpf filesystem of its own at `dir` (created if missing), owned by `uid` and `gid`
/// with mode 0700: where a daemon that runs as that user pins its datapath (the systemd unit's
/// privileged `ExecStartPre=` runs it, `gateway mount-bpffs`). Nothing when `dir` already is the
/// root of a bpf filesystem that user owns (a restart); returns whether it mounted one.
pub fn mount_owned_bpffs(dir: &Path, uid: u32, gid: u32) -> Result<bool, PinsError> {
    use std::os::unix::fs::MetadataExt as _;
    fs::create_dir_all(dir).map_err(io_err(dir))?;
    let fs = statfs(dir).map_err(|e| io_err(dir)(e.into()))?;
    let meta = fs::metadata(dir).map_err(io_err(dir))?;
    // The root of a bpffs instance has inode 1.
    if fs.filesystem_type() == BPF_FS_MAGIC && meta.ino() == 1 && meta.uid() == uid {
        return Ok(false);
    }
    use nix::mount::{MsFlags, mount};
    mount(
        Some("bpf"),
        dir,
        Some("bpf"),
        MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
        Some(format!("uid={uid},gid={gid},mode=0700").as_str()),
    )
    .map_err(|e| io_err(dir)(e.into()))?;
    Ok(true)
}

/// An interface's datapath held by this process ([`PinDir::lock`]); released on drop, when the
/// directory is also removed if the lock created it and nothing was pinned in it since.
#[derive(Debug)]
pub struct DirLock {
    _dir: fs::File,
    created: Option<PathBuf>,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        if let Some(dir) = &self.created {
            // Fails, as it should, unless the directory is empty.
            let _ = fs::remove_dir(dir);
        }
    }
}

/// The pin directory of one interface.
#[derive(Clone, Debug)]
pub struct PinDir {
    /// Interface name.
    pub iface: String,
    /// `<root>/<iface>`.
    pub dir: PathBuf,
}

impl PinDir {
    /// The pin directory of `iface` under `root`.
    pub fn new(root: &Path, iface: &str) -> Self {
        PinDir {
            iface: iface.to_owned(),
            dir: root.join(iface),
        }
    }

    /// Path of the pinned ingress link (XDP or tcx ingress).
    pub fn link(&self) -> PathBuf {
        self.dir.join("link")
    }

    /// Path of the pinned tcx egress link (SIP completions).
    pub fn egress_link(&self) -> PathBuf {
        self.dir.join("egress-link")
    }

    /// Path of the pinned tcx ingress link of an XDP attachment's finishing program (the
    /// client's reset for a refused connection whose server's reset XDP handed over).
    pub fn finish_link(&self) -> PathBuf {
        self.dir.join("finish-link")
    }

    /// Path of a pinned map.
    pub fn map(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Whether a link is pinned here.
    pub fn is_attached(&self) -> bool {
        self.link().exists()
    }

    /// Creates the directory; returns whether it had to be created.
    pub fn create(&self) -> Result<bool, PinsError> {
        if self.dir.is_dir() {
            return Ok(false);
        }
        fs::create_dir_all(&self.dir).map_err(io_err(&self.dir))?;
        Ok(true)
    }

    /// Takes the interface's datapath for this process: an exclusive, non-blocking `flock` on
    /// its pin directory (created if missing), held until the returned guard drops (or the
    /// process ends, however it ends). `None` when another process holds it.
    pub fn lock(&self) -> Result<Option<DirLock>, PinsError> {
        if let Some(root) = self.dir.parent() {
            check_bpffs(root)?;
        }
        let created = self.create()?;
        let dir = fs::File::open(&self.dir).map_err(io_err(&self.dir))?;
        // SAFETY: flock on a descriptor this function owns.
        let r = unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if r == 0 {
            return Ok(Some(DirLock {
                _dir: dir,
                created: created.then(|| self.dir.clone()),
            }));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
            Ok(None)
        } else {
            Err(PinsError::Io {
                path: self.dir.clone(),
                source: e,
            })
        }
    }

    /// The pid of the process that holds the interface's datapath ([`PinDir::lock`]: a running
    /// `gateway run`, or an attach in progress), as the kernel lists its `flock` in
    /// /proc/locks; `None` when no process holds it (one killed drops it with its descriptors).
    pub fn holder(&self) -> Option<u32> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = fs::metadata(&self.dir).ok()?;
        let dev = meta.dev();
        // The kernel writes a lock's file as MAJOR:MINOR:INODE, the device numbers in hex.
        let file = format!(
            "{:02x}:{:02x}:{}",
            libc::major(dev),
            libc::minor(dev),
            meta.ino()
        );
        let locks = fs::read_to_string("/proc/locks").ok()?;
        holder_of(&locks, &file)
    }

    /// Removes every pin and the directory itself.
    pub fn remove(&self) -> Result<(), PinsError> {
        match fs::remove_dir_all(&self.dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_err(&self.dir)(e)),
            _ => Ok(()),
        }
    }

    /// The names of the entries in the directory now (none when it does not exist).
    pub fn entries(&self) -> Vec<std::ffi::OsString> {
        fs::read_dir(&self.dir)
            .map(|d| d.filter_map(Result::ok).map(|e| e.file_name()).collect())
            .unwrap_or_default()
    }

    /// Removes the entries that are not in `before` (what a failed attempt pinned), and the
    /// directory itself if it is then empty: what was there before stays as it was.
    pub fn remove_new(&self, before: &[std::ffi::OsString]) {
        for name in self.entries() {
            if !before.contains(&name) {
                let _ = fs::remove_file(self.dir.join(&name));
            }
        }
        let _ = fs::remove_dir(&self.dir);
    }
}

/// The pid holding a `flock` on `file` (`MAJOR:MINOR:INODE`) in the text of /proc/locks:
/// `1: FLOCK  ADVISORY  WRITE 1234 00:2d:5678 0 EOF` (a waiter's line, `1: -> FLOCK ...`, holds
/// nothing).
fn holder_of(locks: &str, file: &str) -> Option<u32> {
    locks.lines().find_map(|line| {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.get(1) != Some(&"FLOCK") || f.get(5) != Some(&file) {
            return None;
        }
        f.get(4)?.parse().ok()
    })
}

/// The gateway datapaths pinned for interface `iface` (index `ifindex`) under a bpffs other
/// than `root`: the pin directories `<mount>[/A[/B]]/<iface>` of every bpf filesystem mounted
/// here whose ingress link is bound to that interface. A second datapath stacked on the first
/// (tcx allows several programs) would judge every packet twice, each against its own policy.
pub fn other_attachments(root: &Path, iface: &str, ifindex: u32) -> Vec<PinDir> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found = Vec::new();
    for line in mounts.lines() {
        // `ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS... - FSTYPE SOURCE SUPER`.
        let Some((front, back)) = line.split_once(" - ") else {
            continue;
        };
        if back.split_whitespace().next() != Some("bpf") {
            continue;
        }
        let Some(mount) = front.split_whitespace().nth(4) else {
            continue;
        };
        // Octal escapes (`\040` for a space) are left as they are: such a mount is skipped.
        // The mount and the directories one and two levels under it.
        let mut level = vec![Path::new(mount).to_path_buf()];
        let mut roots = level.clone();
        for _ in 0..2 {
            level = level
                .iter()
                .flat_map(|r| fs::read_dir(r).into_iter().flatten().flatten())
                .map(|e| e.path())
                .filter(|p| p.is_dir())
                .collect();
            roots.extend(level.iter().cloned());
        }
        let ours = fs::canonicalize(root).unwrap_or_else(|_| root.to_path_buf());
        for r in roots {
            let pd = PinDir::new(&r, iface);
            let same = fs::canonicalize(&r).is_ok_and(|r| r == ours);
            if same || !pd.is_attached() || found.iter().any(|f: &PinDir| f.dir == pd.dir) {
                continue;
            }
            if bpfsys::link_ifindex(&pd.link()).is_ok_and(|i| i == ifindex) {
                found.push(pd);
            }
        }
    }
    found
}

/// Every interface with a pinned link under `root`, sorted by name.
pub fn attachments(root: &Path) -> Result<Vec<PinDir>, PinsError> {
    let entries = match fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(root)(e)),
    };
    let mut out: Vec<PinDir> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .map(|name| PinDir::new(root, &name))
        .filter(PinDir::is_attached)
        .collect();
    out.sort_by(|a, b| a.iface.cmp(&b.iface));
    Ok(out)
}

/// The pin directory to operate on: `iface` when given (it must be attached), else the only
/// attached interface.
pub fn select(root: &Path, iface: Option<&str>) -> Result<PinDir, PinsError> {
    check_bpffs(root)?;
    if let Some(iface) = iface {
        let pd = PinDir::new(root, iface);
        return if pd.is_attached() {
            Ok(pd)
        } else {
            Err(PinsError::NotAttached {
                iface: iface.to_owned(),
                root: root.to_path_buf(),
            })
        };
    }
    let mut all = attachments(root)?;
    match all.len() {
        1 => Ok(all.remove(0)),
        0 => Err(PinsError::Ambiguous(format!(
            "no interface is attached under {}: run `gateway attach --iface IF`",
            root.display()
        ))),
        _ => Err(PinsError::Ambiguous(format!(
            "several interfaces are attached ({}): pass --iface",
            all.iter()
                .map(|p| p.iface.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_the_process_with_the_lock_on_that_file_not_a_waiter() {
        let locks = "1: POSIX  ADVISORY  WRITE 900 00:2d:5678 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 1234 00:2d:999 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 77 00:2d:5678 0 EOF\n\
                     3: FLOCK  ADVISORY  WRITE 4321 00:2d:5678 0 EOF\n";
        assert_eq!(holder_of(locks, "00:2d:5678"), Some(4321));
        assert_eq!(holder_of(locks, "00:2d:999"), Some(1234));
        assert_eq!(holder_of(locks, "00:2e:5678"), None);
        assert_eq!(holder_of("", "00:2d:5678"), None);
    }

    #[test]
    fn this_process_holds_the_directory_it_locked_and_nobody_after() {
        let root = std::env::temp_dir().join(format!("gw-holder-{}", std::process::id()));
        let pd = PinDir::new(&root, "lo");
        pd.create().unwrap();
        let file = fs::File::open(&pd.dir).unwrap();
        assert_eq!(pd.holder(), None);
        // SAFETY: flock on a descriptor this test owns.
        assert_eq!(unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) }, 0);
        assert_eq!(pd.holder(), Some(std::process::id()));
        drop(file);
        assert_eq!(pd.holder(), None);
        fs::remove_dir_all(&root).unwrap();
    }
}
