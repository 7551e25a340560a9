//! Datapath-wide settings and what `gateway run` does with the datapath on exit.

use gateway_common::maps::{CONFIG_DROP_FRAGMENTS, CONFIG_DROP_UNPARSEABLE};
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
#[derive(Clone, Copy, Debug, Default, Deserialize, Serialize)]
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
