//! The interfaces to protect, and the hook each asks for.

use gateway_common::maps::AttachMode;
use serde::{Deserialize, Serialize};

/// The hook an attach asks for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModeRequest {
    /// Native (driver) XDP.
    #[default]
    Native,
    /// Generic (SKB) XDP.
    Generic,
    /// TC ingress (tcx link).
    Tc,
    /// Native XDP, falling back to generic XDP when the driver refuses (reported).
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

/// One protected interface.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Interface {
    /// Interface name.
    pub name: String,
    /// Hook.
    #[serde(default)]
    pub mode: ModeRequest,
}

/// The interface list; names are unique.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Interfaces(pub Vec<Interface>);
