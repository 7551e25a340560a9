//! The CPU time of a server the gateway does not terminate, read from its cgroup: the cgroup v2
//! `cpu.stat` file's `usage_usec` (user and system time of every process in it; cgroup v1's
//! `cpuacct.usage` where that is what the directory has), where systemd
//! (`/sys/fs/cgroup/system.slice/nginx.service`) and Kubernetes (the pod's or container's
//! cgroup) place a server. The tls law budgets that CPU, not the daemon's, when the handshake
//! costs are inferred at the NIC (no proxy of the gateway's measures them).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

/// `usage_usec` of a `cpu.stat` text.
pub fn usage_usec(stat: &str) -> Option<u64> {
    stat.lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .and_then(|v| v.trim().parse().ok())
}

/// The CPU time the processes of the cgroup directory `dir` have used: cgroup v2's `cpu.stat`
/// (`usage_usec`), else cgroup v1's `cpuacct.usage` (nanoseconds).
pub fn usage(dir: &Path) -> Result<Duration, String> {
    let v1 = dir.join("cpuacct.usage");
    if !dir.join("cpu.stat").exists()
        && let Ok(text) = std::fs::read_to_string(&v1)
    {
        return text
            .trim()
            .parse()
            .map(Duration::from_nanos)
            .map_err(|_| format!("{}: not a count of nanoseconds", v1.display()));
    }
    let path = dir.join("cpu.stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    usage_usec(&text).map(Duration::from_micros).ok_or_else(|| {
        format!(
            "{}: no usage_usec (not a cgroup v2 cpu.stat)",
            path.display()
        )
    })
}

/// The servers' cgroups, read together.
#[derive(Clone, Debug, Default)]
pub struct ServerCpu {
    dirs: Vec<PathBuf>,
}

impl ServerCpu {
    /// The cgroups `dirs` (duplicates read once).
    pub fn new(mut dirs: Vec<PathBuf>) -> Self {
        dirs.sort();
        dirs.dedup();
        ServerCpu { dirs }
    }

    /// Whether any cgroup is named.
    pub fn is_empty(&self) -> bool {
        self.dirs.is_empty()
    }

    /// The CPU time all of them used; `None` when one cannot be read (then nothing is
    /// concluded of the interval).
    pub fn usage(&self) -> Option<Duration> {
        self.dirs.iter().map(|d| usage(d).ok()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_is_read_from_cpu_stat() {
        let stat = "usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\nnr_periods 0\n";
        assert_eq!(usage_usec(stat), Some(1_234_567));
        assert_eq!(usage_usec("user_usec 5\n"), None);
        let dir = std::env::temp_dir().join(format!("gw-cg-{}", std::process::id()));
        let (a, b) = (dir.join("a"), dir.join("b"));
        for (d, n) in [(&a, 1_000_000), (&b, 500_000)] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("cpu.stat"), format!("usage_usec {n}\n")).unwrap();
        }
        let cpu = ServerCpu::new(vec![a.clone(), b.clone(), a.clone()]);
        assert_eq!(cpu.usage(), Some(Duration::from_millis(1500)));
        let gone = ServerCpu::new(vec![a, dir.join("none")]);
        assert_eq!(gone.usage(), None);
        let e = usage(&dir.join("none")).unwrap_err();
        assert!(e.contains("none/cpu.stat"), "{e}");
        // cgroup v1's cpuacct.
        let v1 = dir.join("v1");
        std::fs::create_dir_all(&v1).unwrap();
        std::fs::write(v1.join("cpuacct.usage"), "2500000000\n").unwrap();
        assert_eq!(usage(&v1), Ok(Duration::from_millis(2500)));
    }
}
