//! The `gateway` daemon and CLI: loads the eBPF datapath, attaches and pins it per interface,
//! and manages its services, policies and counters through the pinned maps.
#![deny(missing_docs)]

pub mod accept;
pub mod address;
pub mod apply;
pub mod caps;
pub mod cgroup;
pub mod client_places;
pub mod cmd;
pub mod config;
pub mod controller;
pub mod count;
pub mod daemon;
pub mod datapath;
pub mod datapath_metrics;
pub mod health;
pub mod issued;
pub mod logging;
pub mod memory;
pub mod metrics;
pub mod notify;
pub mod output;
pub mod plot;
pub mod probe;
pub mod proxy;
pub mod reload;
pub mod sockdiag;
pub mod span;
pub mod tls;

/// The compiled eBPF object (built from source or the committed copy, see `build.rs`).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gateway"));
