//! The hook an attach asks for, and what each request allows.

use gateway_common::maps::AttachMode;
use serde::{Deserialize, Serialize};

/// The hook an attach asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModeRequest {
    /// Native (driver) XDP.
    Native,
    /// Generic (SKB) XDP.
    Generic,
    /// TC ingress (tcx link).
    Tc,
    /// Native XDP, falling back to generic XDP when the driver refuses, and to TC ingress when
    /// the kernel refuses XDP programs frame metadata (each fallback reported). The default.
    #[default]
    Auto,
}

impl ModeRequest {
    /// The single mode this request demands, `None` for `auto`.
    pub const fn exact(self) -> Option<AttachMode> {
        match self {
            ModeRequest::Native => Some(AttachMode::Native),
            ModeRequest::Generic => Some(AttachMode::Generic),
            ModeRequest::Tc => Some(AttachMode::Tc),
            ModeRequest::Auto => None,
        }
    }
}
