//! SIP at the NIC: originals, retransmissions and exempt messages.
//!
//! A datagram to a SIP port is copied into per-CPU scratch memory (its first `MAX_SCAN` bytes) and
//! parsed by the shared parser (`gateway_common::sip`), one step (one bounded scan) per `bpf_loop`
//! callback.
//! Responses, ACK, CANCEL, BYE and in-dialog requests are `sip-exempt`. A request carrying the
//! request-line marker is a `sip-retransmission` outright. Any other request whose transaction key
//! is already in `SIP_TXNS` is a `sip-retransmission`, and one whose key is new is stored and is
//! `sip-original`. Anything the parser cannot follow is an original: never exempt.
// Map keys and values go by reference, as in the TLS module: values copied onto the 512-byte BPF
// stack crowd out the rest of the program.
#![allow(clippy::needless_borrows_for_generic_args)]

use core::ffi::c_void;

use aya_ebpf::helpers::generated::bpf_loop;
use gateway_common::{
    Class,
    bytes::PacketBytes,
    maps::SipTxn,
    packet::Packet,
    sip::{MAX_SCAN, MAX_STEPS, SipState},
};

use crate::{
    admission::{admission, count_refusal},
    bytes::{ScratchBytes, opaque},
    datapath::Verdict as Action,
    maps::{SIP_SCRATCH, SIP_TXNS},
    tls::{CopyOut, now_ns},
};

/// Per-CPU scratch: the datagram's first bytes and the parser state.
#[repr(C)]
pub struct Scratch {
    /// Payload bytes, in the first half (the second half is slack for masked reads).
    buf: [u8; 2 * MAX_SCAN],
    /// Bytes copied.
    len: u32,
    /// Padding.
    pad: u32,
    /// The parser.
    state: SipState,
}

/// One line, as a `bpf_loop` callback: returns 1 to stop.
#[inline(never)]
extern "C" fn sip_step(_index: u64, _ctx: *mut c_void) -> i64 {
    let Some(s) = SIP_SCRATCH.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: per-CPU slot, used only by this program run.
    let s = unsafe { &mut *s };
    let bytes = ScratchBytes::<MAX_SCAN, { 2 * MAX_SCAN }> {
        buf: &s.buf,
        len: s.len,
    };
    let len = s.len as usize;
    i64::from(s.state.step(&bytes, len))
}

/// Classifies a UDP datagram to a SIP port.
#[inline(always)]
pub fn sip_packet<C: CopyOut, B: PacketBytes>(ctx: &C, _b: &B, pkt: &Packet) -> (Class, Action) {
    let payload_len = u64::from(pkt.payload_len());
    let Some(s) = SIP_SCRATCH.get_ptr_mut(0) else {
        return (Class::SipOriginal, Action::Pass);
    };
    // SAFETY: per-CPU slot, used only by this program run (and its bpf_loop callback).
    let s = unsafe { &mut *s };
    let len = if payload_len > MAX_SCAN as u64 {
        MAX_SCAN as u64
    } else {
        payload_len
    };
    // See tls::parse_segment for why the zero test sits behind the barrier.
    let len = opaque(len);
    if len == 0
        || !ctx.copy_out(
            u32::from(pkt.transport.payload_offset),
            s.buf.as_mut_ptr(),
            len,
        )
    {
        return (Class::SipOriginal, Action::Pass);
    }
    s.len = len as u32;
    s.state = SipState::default();
    // SAFETY: sip_step is a static subprogram with the callback signature bpf_loop expects.
    unsafe {
        bpf_loop(
            MAX_STEPS as u32,
            sip_step as *mut c_void,
            core::ptr::null_mut(),
            0,
        );
    }
    let info = s.state.finish();
    let mut class = info.class();
    if class == Class::SipOriginal
        && let Some(key) = info.transaction_key()
    {
        match SIP_TXNS.get_ptr_mut(&key) {
            Some(t) => {
                // SAFETY: a plain counter; races only undercount it.
                unsafe { (*t).requests = (*t).requests.wrapping_add(1) };
                class = Class::SipRetransmission;
            }
            None => {
                let txn = SipTxn {
                    first_ns: now_ns(),
                    requests: 1,
                    flags: 0,
                };
                let _ = SIP_TXNS.insert(&key, &txn, 0);
            }
        }
    }
    // Originals first: each original counts into the backlog under its class's limits;
    // retransmissions only while the originals' backlog is under the retransmission policy's
    // threshold (see admission::admission). Exempt messages finish work: never dropped.
    let refused = match class {
        Class::SipOriginal => admission(Class::SipOriginal, Class::SipOriginal, true),
        Class::SipRetransmission => admission(Class::SipRetransmission, Class::SipOriginal, false),
        _ => None,
    };
    match refused {
        None => (class, Action::Pass),
        Some(reason) => {
            count_refusal(class, reason, false);
            (class, Action::Drop)
        }
    }
}
