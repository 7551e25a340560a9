//! The hook context: what the XDP and TC programs share (a packet's fate, copies of its bytes, the
//! socket lookup, the tail call to the SIP program), each implemented once per hook, in the
//! manner of cilium's per-hook `ctx` headers. Everything above this module is written against
//! these traits and never names a hook.

use aya_ebpf::{
    EbpfContext,
    bindings::{TC_ACT_OK, TC_ACT_SHOT, bpf_sock_tuple, xdp_action},
    helpers::generated::{
        bpf_sk_release, bpf_skb_load_bytes, bpf_skc_lookup_tcp, bpf_xdp_load_bytes,
    },
    programs::{TcContext, XdpContext},
};

use crate::maps::{TC_JUMP, XDP_JUMP};

/// What to do with a packet.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Let it through.
    Pass,
    /// Drop it here.
    Drop,
    /// A refused segment of a connection the kernel has: drop it, and answer its sender with a
    /// reset where the hook can ([`Reply`]).
    Reject,
    /// Send the (rewritten) frame back out of the interface it came in on.
    Tx,
}

impl Action {
    /// The XDP program's return value.
    #[inline(always)]
    pub fn xdp(self) -> u32 {
        match self {
            Action::Pass => xdp_action::XDP_PASS,
            Action::Drop | Action::Reject => xdp_action::XDP_DROP,
            Action::Tx => xdp_action::XDP_TX,
        }
    }

    /// The TC program's return value.
    #[inline(always)]
    pub fn tc(self) -> i32 {
        match self {
            Action::Pass => TC_ACT_OK,
            Action::Drop | Action::Reject | Action::Tx => TC_ACT_SHOT,
        }
    }
}

/// Copies packet bytes out, for either hook.
pub trait CopyOut {
    /// Copies `len` (1..=`crate::tls::SCRATCH_LEN`) bytes at `offset` into `dst`.
    fn copy_out(&self, offset: u32, dst: *mut u8, len: u64) -> bool;
}

impl CopyOut for XdpContext {
    #[inline(always)]
    fn copy_out(&self, offset: u32, dst: *mut u8, len: u64) -> bool {
        // SAFETY: dst has room for SCRATCH_LEN bytes and len is at most that.
        unsafe { bpf_xdp_load_bytes(self.ctx, offset, dst.cast(), len as u32) == 0 }
    }
}

impl CopyOut for TcContext {
    #[inline(always)]
    fn copy_out(&self, offset: u32, dst: *mut u8, len: u64) -> bool {
        // SAFETY: as above.
        unsafe { bpf_skb_load_bytes(self.skb.skb.cast(), offset, dst.cast(), len as u32) == 0 }
    }
}

/// Whether the kernel has a connection (not just a listener) for a 4-tuple: a socket lookup, as
/// xdp_synproxy does, so that segments of connections that do not exist create no state.
pub trait ConnectionLookup {
    /// Looks `tuple` (`size` bytes, the packet's own direction) up in the device's namespace.
    fn has_connection(&self, tuple: *mut u8, size: u32) -> bool;
}

/// `struct sock` states that are a connection the client really made: established, and a
/// request socket awaiting the handshake's last ACK (SYN_RECV, NEW_SYN_RECV).
const TCP_ESTABLISHED: u32 = 1;
const TCP_SYN_RECV: u32 = 3;
const TCP_NEW_SYN_RECV: u32 = 12;

#[inline(always)]
fn lookup<C: EbpfContext>(ctx: &C, tuple: *mut u8, size: u32) -> bool {
    // SAFETY: `tuple` points to 40 bytes of map memory; the result is released below.
    let sk = unsafe {
        bpf_skc_lookup_tcp(
            ctx.as_ptr(),
            tuple.cast::<bpf_sock_tuple>(),
            size,
            u64::MAX, // BPF_F_CURRENT_NETNS: the device's namespace
            0,
        )
    };
    if sk.is_null() {
        return false;
    }
    // SAFETY: a live socket reference, released right after the read.
    let state = unsafe { (*sk).state };
    unsafe { bpf_sk_release(sk.cast()) };
    matches!(state, TCP_ESTABLISHED | TCP_SYN_RECV | TCP_NEW_SYN_RECV)
}

impl ConnectionLookup for XdpContext {
    #[inline(always)]
    fn has_connection(&self, tuple: *mut u8, size: u32) -> bool {
        lookup(self, tuple, size)
    }
}

impl ConnectionLookup for TcContext {
    #[inline(always)]
    fn has_connection(&self, tuple: *mut u8, size: u32) -> bool {
        lookup(self, tuple, size)
    }
}

/// Tail calls into the hook's SIP program.
pub trait JumpToSip {
    /// Jumps; returns only when the jump table is empty.
    fn jump_to_sip(&self);

    /// Jumps to the hook's reply program (`crate::reply`), which answers a refused segment;
    /// returns only when the hook has none (TC) or its table is empty.
    fn jump_to_reply(&self);
}

/// Index of the SIP program in a hook's jump table.
pub const JUMP_SIP: u32 = 0;
/// Index of the reply program in the XDP hook's jump table.
pub const JUMP_REPLY: u32 = 1;

impl JumpToSip for XdpContext {
    #[inline(always)]
    fn jump_to_sip(&self) {
        // SAFETY: a tail call never returns on success; on failure we carry on.
        unsafe { XDP_JUMP.tail_call(self, JUMP_SIP) };
    }

    #[inline(always)]
    fn jump_to_reply(&self) {
        // SAFETY: as above.
        unsafe { XDP_JUMP.tail_call(self, JUMP_REPLY) };
    }
}

impl JumpToSip for TcContext {
    #[inline(always)]
    fn jump_to_sip(&self) {
        // SAFETY: as above.
        unsafe { TC_JUMP.tail_call(self, JUMP_SIP) };
    }

    #[inline(always)]
    fn jump_to_reply(&self) {
        // The TC hook answers through the daemon's socket destroy instead.
    }
}
