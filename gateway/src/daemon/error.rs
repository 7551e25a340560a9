//! What ends a daemon's start or its serving.

use thiserror::Error;

use crate::{
    datapath::{self, LoaderError, maps::MapsError},
    proxy::descriptors::DescriptorError,
};

/// Errors of the daemon.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// The config lists no interface.
    #[error("the config lists no interfaces: add one under `interfaces` or pass --iface")]
    NoInterfaces,
    /// Attaching failed.
    #[error(transparent)]
    Loader(#[from] LoaderError),
    /// Applying the config to the maps failed.
    #[error("applying the config: {0}")]
    Maps(#[from] MapsError),
    /// The runtime or a signal handler could not be set up.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
    /// A proxy listener's TLS set-up failed (certificate, key, ticket key file).
    #[error("proxies[{index}] ({listen}): {source}")]
    Tls {
        /// Index in the config.
        index: usize,
        /// Its listen address.
        listen: std::net::SocketAddr,
        /// The error.
        source: crate::tls::TlsError,
    },
    /// The interface's datapath is held by another process, or its pin directory is unusable.
    #[error(transparent)]
    Pins(#[from] datapath::pins::PinsError),
    /// The open-files limit leaves the proxies too little room, or could not be read.
    #[error(transparent)]
    Descriptors(#[from] DescriptorError),
    /// A listening address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: std::net::SocketAddr,
        /// The error.
        source: std::io::Error,
    },
}

impl DaemonError {
    /// Whether the error is the caller's input.
    pub fn is_input_error(&self) -> bool {
        match self {
            DaemonError::NoInterfaces
            | DaemonError::Tls { .. }
            | DaemonError::Descriptors(DescriptorError::TooLow { .. }) => true,
            DaemonError::Pins(e) => !matches!(e, datapath::pins::PinsError::Io { .. }),
            DaemonError::Loader(e) => e.is_input_error(),
            _ => false,
        }
    }
}
