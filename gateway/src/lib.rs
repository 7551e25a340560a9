//! The `gateway` daemon and CLI: loads the eBPF datapath, attaches and pins it per interface,
//! and manages its services, policies and counters through the pinned maps.
#![deny(missing_docs)]

pub mod accept;
pub mod apply;
pub mod attached;
pub mod bpfsys;
pub mod btf;
pub mod caps;
pub mod carry;
pub mod client_places;
pub mod cmd;
pub mod config;
pub mod controller;
pub mod count;
pub mod daemon;
pub mod datapath_metrics;
pub mod ethtool;
pub mod health;
pub mod issued;
pub mod kfunc;
pub mod layouts;
pub mod loader;
pub mod logging;
pub mod maps;
pub mod memory;
pub mod metrics;
pub mod notify;
pub mod output;
pub mod pinned_layout;
pub mod pins;
pub mod plot;
pub mod probe;
pub mod proxy;
pub mod rekey;
pub mod reload;
pub mod sockdiag;
pub mod tls;

/// The compiled eBPF object (built from source or the committed copy, see `build.rs`).
pub static EBPF_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/gateway"));
