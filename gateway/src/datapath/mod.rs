//! The pinned datapath's lifecycle: everything between the eBPF object and an interface it
//! protects, from the first attach to the last detach.
//!
//! One entry point: [`attach`] (and [`detach`]) takes an interface and returns an attachment
//! ([`AttachOutcome`]), whatever it found there: nothing (a fresh attachment), this build's
//! pins (adopted, the program replaced in place), or an older build's (its maps carried over to
//! this build's layout, its IPv4 flows moved). The daemon holds an attachment as [`Attached`].
//!
//! Below it, one concern a module:
//! - [`loader`]: load, attach, pin, replace, detach; the attach modes and their fallbacks; the
//!   sweep program; an attachment's status;
//! - [`mode`]: the hook an attach asks for;
//! - [`pins`]: where things are pinned (one directory per interface under a bpffs root), the
//!   directory's lock, other attachments of an interface;
//! - [`attached`]: one attached interface as the daemon's parts share it;
//! - [`pinned_layout`], [`layouts`], [`btf`]: whether pinned maps have this build's layout,
//!   the layout record pinned beside them, and the BTF reader both use;
//! - [`carry`], [`rekey`]: an older build's map state carried to this build's layout, and
//!   moved to the map this build keeps it in;
//! - [`kfunc`]: the object's kernel-function calls resolved against the running kernel;
//! - [`maps`]: typed access to the pinned maps, one handle per feature as
//!   `gateway_common::maps` declares them;
//! - [`bpfsys`]: the `bpf(2)` commands aya does not expose;
//! - [`ethtool`]: what kind of device an interface is (whether XDP_TX leaves it).

pub mod attached;
pub mod bpfsys;
pub mod btf;
pub mod carry;
pub mod ethtool;
pub mod kfunc;
pub mod layouts;
pub mod loader;
pub mod maps;
pub mod mode;
pub mod pinned_layout;
pub mod pins;
pub mod rekey;

pub use attached::Attached;
pub use loader::{AttachOptions, AttachOutcome, LoaderError, attach, detach};
pub use mode::ModeRequest;
