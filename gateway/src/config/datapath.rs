//! Datapath-wide settings and what `gateway run` does with the datapath on exit.

use gateway_common::maps::{
    CONFIG_DROP_FRAGMENTS, CONFIG_DROP_UNPARSEABLE, DEFAULT_TLS_ISSUED, MAX_TLS_ISSUED,
};
use serde::{Deserialize, Serialize};

/// Pass or drop.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PassDrop {
    /// Let it through (counted).
    #[default]
    Pass,
    /// Drop it (counted).
    Drop,
}

/// aya-log level of the eBPF programs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum EbpfLogLevel {
    /// Nothing.
    Off,
    /// Errors.
    Error,
    /// Warnings and errors.
    #[default]
    Warn,
    /// Informational.
    Info,
    /// Debug (per-anomaly messages).
    Debug,
    /// Everything.
    Trace,
}

impl EbpfLogLevel {
    /// The value of aya-log-ebpf's `AYA_LOG_LEVEL` global.
    pub const fn value(self) -> u8 {
        self as u8
    }
}

/// Datapath-wide settings.
#[derive(Clone, Copy, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Datapath {
    /// IP fragments.
    #[serde(default)]
    pub fragments: PassDrop,
    /// Headers beyond the parser's bounds.
    #[serde(default)]
    pub unparseable: PassDrop,
    /// aya-log level.
    #[serde(default)]
    pub ebpf_log_level: EbpfLogLevel,
    /// Entries of the issued-keys table (`TLS_ISSUED`): the session keys the proxies publish
    /// live there for their whole lifetime, never evicted; when it is full a new key is not
    /// published (counted). Size it as handshakes per second x tickets per handshake (1) x
    /// `session_lifetime` in seconds. Fixed when the datapath is first loaded.
    #[serde(default = "default_issued_keys", deserialize_with = "issued_keys")]
    pub issued_keys: u32,
}

impl Default for Datapath {
    fn default() -> Self {
        Datapath {
            fragments: PassDrop::default(),
            unparseable: PassDrop::default(),
            ebpf_log_level: EbpfLogLevel::default(),
            issued_keys: default_issued_keys(),
        }
    }
}

fn default_issued_keys() -> u32 {
    DEFAULT_TLS_ISSUED
}

/// `issued_keys`, within `1..=MAX_TLS_ISSUED`.
fn issued_keys<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let n = crate::count::Count {
        what: "issued_keys",
        min: 1,
        max: u64::from(MAX_TLS_ISSUED),
    }
    .read(d)?;
    Ok(n as u32)
}

impl Datapath {
    /// `DatapathConfig::flags`.
    pub fn flags(&self) -> u64 {
        let mut f = 0;
        if self.fragments == PassDrop::Drop {
            f |= CONFIG_DROP_FRAGMENTS;
        }
        if self.unparseable == PassDrop::Drop {
            f |= CONFIG_DROP_UNPARSEABLE;
        }
        f
    }
}

/// What `gateway run` does on exit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum OnExit {
    /// Leave the datapath attached and pinned (protection continues through restarts).
    #[default]
    Keep,
    /// Detach and unpin.
    Detach,
}
