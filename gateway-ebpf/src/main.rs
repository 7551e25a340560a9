//! The gateway's eBPF programs: the XDP ingress classifier, the same logic as a TC ingress
//! classifier (the fallback hook), and the benchmark's programs (`bench`): a bare `XDP_PASS`
//! baseline and the classifier on packets made new for every run.
#![no_std]
#![no_main]
// Atomic adds on shared map values (the bpf target has no atomic types).
#![allow(internal_features)]
#![feature(core_intrinsics)]
// A value barrier for the verifier's sake (see tls::opaque).
#![feature(asm_experimental_arch)]

mod admission;
mod bench;
mod bytes;
mod context;
mod datapath;
mod maps;
mod pending;
mod reply;
mod resume;
mod sip;
mod steps;
mod sync;
mod tc;
mod tcp;
mod tls;
mod tls_counters;
mod xdp;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
