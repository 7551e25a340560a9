//! A cgroup v2 of a test's or a benchmark's own, for a server the gateway does not terminate
//! (`services[].server.cgroup`): a private mount of the hierarchy, the server's processes moved
//! in, put back and the cgroup removed on drop.

use std::path::{Path, PathBuf};

/// The cgroup and the mount it was made in.
pub struct ServerCgroup {
    mount: PathBuf,
    dir: PathBuf,
}

impl ServerCgroup {
    /// Mounts cgroup v2 in a fresh directory and makes the cgroup `name` in it; `None` where
    /// the kernel has no cgroup v2.
    pub fn new(name: &str) -> Option<Self> {
        if !std::fs::read_to_string("/proc/filesystems")
            .ok()?
            .contains("cgroup2")
        {
            return None;
        }
        let mount = crate::fresh_temp_dir("gwt-cgroup2");
        nix::mount::mount(
            Some("cgroup2"),
            &mount,
            Some("cgroup2"),
            nix::mount::MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount cgroup2");
        let dir = mount.join(format!("{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("make the cgroup");
        Some(ServerCgroup { mount, dir })
    }

    /// The cgroup's directory (what a config names).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Moves `pid` and every process under it into the cgroup (from the caller's mount
    /// namespace: `ip netns exec` mounts a /sys of its own, without the hierarchy).
    pub fn take(&self, pid: u32) {
        let procs = self.dir.join("cgroup.procs");
        for p in std::iter::once(pid as i32).chain(descendants(pid)) {
            std::fs::write(&procs, p.to_string()).expect("move a process into the cgroup");
        }
    }
}

impl Drop for ServerCgroup {
    fn drop(&mut self) {
        // Its processes back to the root first (the server is gone by now; anything left moves).
        if let Ok(left) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in left.lines() {
                let _ = std::fs::write(self.mount.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
        let _ = nix::mount::umount(&self.mount);
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// Every process under `pid`, at any depth.
pub fn descendants(pid: u32) -> Vec<i32> {
    let mut all = Vec::new();
    let mut next = vec![pid as i32];
    while let Some(p) = next.pop() {
        for c in children(p as u32) {
            all.push(c);
            next.push(c);
        }
    }
    all
}

/// The child processes of every thread of `pid`.
fn children(pid: u32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(Result::ok)
        .flat_map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .filter_map(|c| c.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}
