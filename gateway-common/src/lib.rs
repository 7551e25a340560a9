//! Types shared by the gateway's eBPF programs and its userspace daemon, and the packet parsers and
//! classifiers that both of them run.
//!
//! Everything here is `no_std` and allocation-free so that the same code is compiled into the eBPF
//! object and into the userspace unit tests and fuzzers. Map value types are `#[repr(C)]` with
//! explicit padding fields, so their layout is the same on both sides and their BTF shows every
//! byte.
#![no_std]
#![deny(missing_docs)]

#[cfg(any(test, feature = "testing"))]
extern crate alloc;

pub mod bytes;
pub mod class;
pub mod counters;
pub mod maps;
pub mod packet;
pub mod policy;
pub mod programs;
pub mod reasons;
pub mod sha256;
pub mod sip;
pub mod siphash;
pub mod syncookie;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod tls;

#[cfg(feature = "user")]
mod pod;

pub use class::{Class, NUM_CLASSES};
