//! Checks the process's effective capabilities up front, so that a missing privilege is reported
//! by name instead of as an `EPERM` from deep inside a syscall.

use std::fs;

use thiserror::Error;

/// A Linux capability the gateway needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Capability {
    /// CAP_NET_ADMIN: attach programs to interfaces.
    NetAdmin,
    /// CAP_SYS_ADMIN: the pre-5.8 catch-all that also grants BPF.
    SysAdmin,
    /// CAP_PERFMON: pointer arithmetic in programs (with CAP_BPF).
    Perfmon,
    /// CAP_BPF: load programs and maps.
    Bpf,
}

impl Capability {
    const fn bit(self) -> u32 {
        match self {
            Capability::NetAdmin => 12,
            Capability::SysAdmin => 21,
            Capability::Perfmon => 38,
            Capability::Bpf => 39,
        }
    }

    /// The capability's name as in capabilities(7).
    pub const fn name(self) -> &'static str {
        match self {
            Capability::NetAdmin => "CAP_NET_ADMIN",
            Capability::SysAdmin => "CAP_SYS_ADMIN",
            Capability::Perfmon => "CAP_PERFMON",
            Capability::Bpf => "CAP_BPF",
        }
    }
}

/// Errors of the capability check.
#[derive(Debug, Error)]
pub enum CapsError {
    /// A required capability is not in the effective set.
    #[error("missing capability {}: run as root or grant it (e.g. setcap cap_bpf,cap_perfmon,cap_net_admin+ep)", .0.name())]
    Missing(Capability),
    /// /proc/self/status could not be read or parsed.
    #[error("cannot read effective capabilities from /proc/self/status: {0}")]
    Unreadable(String),
}

/// What an operation needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Need {
    /// Read or write pinned maps.
    Maps,
    /// Load and attach programs.
    Attach,
}

/// Fails with the first missing capability `need` requires.
pub fn require(need: Need) -> Result<(), CapsError> {
    let eff = effective()?;
    let has = |c: Capability| eff & (1u64 << c.bit()) != 0;
    let sys_admin = has(Capability::SysAdmin);
    if !sys_admin && !has(Capability::Bpf) {
        return Err(CapsError::Missing(Capability::Bpf));
    }
    if need == Need::Attach {
        if !sys_admin && !has(Capability::Perfmon) {
            return Err(CapsError::Missing(Capability::Perfmon));
        }
        if !has(Capability::NetAdmin) {
            return Err(CapsError::Missing(Capability::NetAdmin));
        }
    }
    Ok(())
}

fn effective() -> Result<u64, CapsError> {
    let status = fs::read_to_string("/proc/self/status")
        .map_err(|e| CapsError::Unreadable(e.to_string()))?;
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .ok_or_else(|| CapsError::Unreadable("no CapEff line".into()))?;
    u64::from_str_radix(hex.trim(), 16).map_err(|e| CapsError::Unreadable(e.to_string()))
}
