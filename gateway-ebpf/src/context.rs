//! The hook context: what the XDP and TC programs share (a packet's fate, copies of its bytes, the
//! socket lookup, the tail calls and the jump tables they go through), each implemented once per
//! hook, in the manner of cilium's per-hook `ctx` headers. Everything above this module is
//! written against these traits and never names a hook.

use aya_ebpf::{
    EbpfContext,
    bindings::{TC_ACT_OK, TC_ACT_SHOT, bpf_sock_tuple, xdp_action},
    btf_maps::ProgramArray,
    helpers::generated::{
        bpf_clone_redirect, bpf_csum_level, bpf_redirect, bpf_sk_release, bpf_skb_adjust_room,
        bpf_skb_change_tail, bpf_skb_load_bytes, bpf_skb_pull_data, bpf_skb_store_bytes,
        bpf_skc_lookup_tcp, bpf_tcp_check_syncookie, bpf_xdp_adjust_head, bpf_xdp_adjust_meta,
        bpf_xdp_adjust_tail, bpf_xdp_load_bytes, bpf_xdp_store_bytes,
    },
    macros::btf_map,
    programs::{TcContext, XdpContext},
};
use gateway_common::programs::Jump;

use crate::bytes::opaque;

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
    /// Let it through to the kernel's listener with the request socket made for it: the first
    /// data segment of a connection the NIC answered with a SYN cookie, its hello admitted (or
    /// pending). XDP hands it to the finishing program at TC ingress ([`Handover::Handoff`]), which makes
    /// the socket; TC makes it at once (`crate::tcp::handoff`).
    Handoff,
    /// Answered from the NIC with the segment `crate::tcp::cookie` prepared in scratch (a
    /// SYN-ACK carrying a cookie), by the reply program.
    Answer,
    /// The same, counted as admitted: the segment that admitted a held hello, by the reply
    /// program joined with the held first segment to the listener (`crate::tcp::held`), or
    /// else answered with the acknowledgement that asks the client for its first segment again
    /// (`crate::tcp::cookie::hold`).
    Hold,
}

impl Action {
    /// The XDP program's return value.
    #[inline(always)]
    pub fn xdp(self) -> u32 {
        match self {
            Action::Pass | Action::Handoff => xdp_action::XDP_PASS,
            // Answer and Hold reach a hook only when the reply program could not be jumped to.
            Action::Drop | Action::Reject | Action::Answer | Action::Hold => xdp_action::XDP_DROP,
            Action::Tx => xdp_action::XDP_TX,
        }
    }

    /// The TC program's return value for a packet of `ctx` (`Tx`: redirected to the egress of
    /// the device it came in on).
    #[inline(always)]
    pub fn tc(self, ctx: &TcContext) -> i32 {
        match self {
            Action::Pass | Action::Handoff => TC_ACT_OK,
            Action::Drop | Action::Reject | Action::Answer | Action::Hold => TC_ACT_SHOT,
            // SAFETY: a plain helper call on the program's own device.
            Action::Tx => unsafe { bpf_redirect((*ctx.skb.skb).ifindex, 0) as i32 },
        }
    }
}

/// Rewriting a frame into a reply, for either hook (`crate::reply`).
pub trait Rewrite {
    /// Sets the frame's length to `len` bytes, shorter or longer; whether it could.
    fn resize(&self, len: usize) -> bool;

    /// Whether the hook can also hand the local stack a frame (a reset for the server's socket)
    /// after sending a copy out with [`Rewrite::send_copy`].
    const SENDS_COPIES: bool;

    /// Whether [`Rewrite::resize`] can grow a frame by a segment's worth: TC reallocates the
    /// skb as needed; XDP grows only into the driver's tailroom, which a full frame seldom has.
    const GROWS: bool;

    /// Cuts the frame to `len` bytes (at most its length); whether it could.
    fn truncate(&self, len: usize) -> bool;

    /// Makes the frame's first `len` bytes writable in place; returns the frame's bounds
    /// (`data`, `data_end`), valid until the next call that changes the frame. The caller
    /// checks its accesses against them.
    fn writable(&self, len: usize) -> Option<(usize, usize)>;

    /// Writes `len` bytes from `src` at `offset`; whether it could.
    fn store(&self, offset: u32, src: *const u8, len: u32) -> bool;

    /// Takes `extra` bytes (at most [`MAX_EXTRA`]) out of the frame right after its link and
    /// base IP headers (`keep` bytes, at most [`MAX_KEEP`]): IPv4 options or IPv6 extension
    /// headers. Whether it could; the caller then sets the IP header's fields.
    fn remove_after(&self, keep: u32, extra: u32) -> bool;

    /// Sends a copy of the frame as it is now out of the device it came in on, and keeps the
    /// frame; whether the copy went (the TC hook only).
    fn send_copy(&self) -> bool;

    /// Marks the frame for the finishing program at TC ingress (XDP only): metadata holding
    /// `tag` and `value`. Whether it could.
    fn hand_over(&self, tag: Handover, value: u32) -> bool;
}

/// Most bytes [`Rewrite::remove_after`] keeps in front: two VLAN tags and an IPv6 header.
pub const MAX_KEEP: u32 = 72;
/// Most bytes [`Rewrite::remove_after`] takes out.
pub const MAX_EXTRA: u32 = 256;

/// What a frame XDP hands to the finishing program at TC ingress is for: the word in front of
/// it in its metadata (XORed with the attachment's handover key), the ASCII of four letters.
/// Every kind of handover, and only these, in one place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Handover {
    /// `b"GWRS"`: the server's reset of a refused connection, made by the XDP reply program,
    /// whose client still needs its own (the value: the client's acknowledgement number).
    Reset = u32::from_be_bytes(*b"GWRS"),
    /// `b"GWTX"`: a reply the XDP reply program made, to send out of the device where XDP_TX
    /// may not deliver.
    SendOut = u32::from_be_bytes(*b"GWTX"),
    /// `b"GWHO"`: a first data segment the XDP program checked the SYN cookie of and admitted:
    /// the finishing program hands it to the listener ([`Action::Handoff`]).
    Handoff = u32::from_be_bytes(*b"GWHO"),
    /// `b"GWCA"`: a segment to join a held first segment with (the value: the first
    /// segment's sequence number), `crate::tcp::held`.
    Join = u32::from_be_bytes(*b"GWCA"),
}

impl Handover {
    /// The handover a metadata word (its key taken off) names, if it names one.
    #[inline(always)]
    fn from_word(word: u32) -> Option<Self> {
        [Self::Reset, Self::SendOut, Self::Handoff, Self::Join]
            .into_iter()
            .find(|h| *h as u32 == word)
    }
}

impl Rewrite for XdpContext {
    const SENDS_COPIES: bool = false;
    const GROWS: bool = false;

    #[inline(always)]
    fn truncate(&self, len: usize) -> bool {
        let cut = (self.data_end() - self.data()) as i64 - len as i64;
        // SAFETY: shrinking the frame by what lies past `len`.
        cut >= 0 && (cut == 0 || unsafe { bpf_xdp_adjust_tail(self.ctx, -(cut as i32)) } == 0)
    }

    #[inline(always)]
    fn resize(&self, len: usize) -> bool {
        let delta = len as i64 - (self.data_end() - self.data()) as i64;
        // SAFETY: moving the frame's end by `delta` bytes (the helper refuses what the buffer
        // cannot take).
        delta == 0 || unsafe { bpf_xdp_adjust_tail(self.ctx, delta as i32) } == 0
    }

    #[inline(always)]
    fn writable(&self, _len: usize) -> Option<(usize, usize)> {
        Some((self.data(), self.data_end()))
    }

    #[inline(always)]
    fn store(&self, offset: u32, src: *const u8, len: u32) -> bool {
        // SAFETY: `src` holds `len` bytes (the caller's bound).
        unsafe { bpf_xdp_store_bytes(self.ctx, offset, src as *mut _, len) == 0 }
    }

    #[inline(always)]
    fn remove_after(&self, keep: u32, extra: u32) -> bool {
        let mut front = [0u8; MAX_KEEP as usize];
        let keep = opaque(u64::from(keep));
        let extra = opaque(u64::from(extra));
        if keep == 0 || keep > u64::from(MAX_KEEP) || extra == 0 || extra > u64::from(MAX_EXTRA) {
            return false;
        }
        // The headers in front moved up by `extra`, then the frame's start too.
        // SAFETY: `keep` bytes into and out of a buffer of MAX_KEEP; the frame's start moved
        // forward inside the frame (the helper refuses more).
        unsafe {
            bpf_xdp_load_bytes(self.ctx, 0, front.as_mut_ptr().cast(), keep as u32) == 0
                && bpf_xdp_adjust_head(self.ctx, extra as i32) == 0
                && bpf_xdp_store_bytes(self.ctx, 0, front.as_mut_ptr().cast(), keep as u32) == 0
        }
    }

    #[inline(always)]
    fn send_copy(&self) -> bool {
        false
    }

    #[inline(always)]
    fn hand_over(&self, tag: Handover, value: u32) -> bool {
        // A kernel without XDP metadata: the loader attached no finishing program to XDP.
        if crate::maps::XDP_METADATA.load() == 0 {
            return false;
        }
        // Tagged with this attachment's key, which only its finishing program knows.
        let key = crate::maps::handover_key();
        if key == 0 {
            return false;
        }
        let tag = tag as u32 ^ key;
        // SAFETY: growing the metadata area by 8 bytes in front of the frame.
        if unsafe { bpf_xdp_adjust_meta(self.ctx, -8) } != 0 {
            return false;
        }
        let meta = self.metadata();
        if meta + 8 > self.data() {
            return false;
        }
        // SAFETY: the 8 metadata bytes just checked.
        unsafe {
            *(meta as *mut [u8; 4]) = tag.to_ne_bytes();
            *((meta + 4) as *mut [u8; 4]) = value.to_ne_bytes();
        }
        true
    }
}

impl Rewrite for TcContext {
    const SENDS_COPIES: bool = true;
    const GROWS: bool = true;

    #[inline(always)]
    fn truncate(&self, len: usize) -> bool {
        // SAFETY: plain helper calls on the program's own skb.
        unsafe { bpf_skb_change_tail(self.skb.skb, len as u32, 0) == 0 }
    }

    #[inline(always)]
    fn resize(&self, len: usize) -> bool {
        self.truncate(len)
    }

    #[inline(always)]
    fn writable(&self, len: usize) -> Option<(usize, usize)> {
        // SAFETY: as above; the checksum state is reset because the frame is rewritten by hand
        // (its checksums computed here), so nothing trusts a stale hardware sum.
        unsafe {
            if bpf_skb_pull_data(self.skb.skb, len as u32) != 0 {
                return None;
            }
            bpf_csum_level(
                self.skb.skb,
                u64::from(aya_ebpf::bindings::BPF_CSUM_LEVEL_RESET),
            );
        }
        Some((self.data(), self.data_end()))
    }

    #[inline(always)]
    fn store(&self, offset: u32, src: *const u8, len: u32) -> bool {
        // SAFETY: as for XDP.
        unsafe { bpf_skb_store_bytes(self.skb.skb, offset, src.cast(), len, 0) == 0 }
    }

    #[inline(always)]
    fn remove_after(&self, _keep: u32, extra: u32) -> bool {
        // The kernel takes the bytes out right after the base IP header (`BPF_ADJ_ROOM_NET`,
        // its network header's offset plus 20 or 40 bytes), which is `keep`.
        let extra = opaque(u64::from(extra));
        if extra == 0 || extra > u64::from(MAX_EXTRA) {
            return false;
        }
        // SAFETY: a plain helper call on the program's own skb.
        unsafe {
            bpf_skb_adjust_room(
                self.skb.skb,
                -(extra as i32),
                aya_ebpf::bindings::bpf_adj_room_mode::BPF_ADJ_ROOM_NET,
                0,
            ) == 0
        }
    }

    #[inline(always)]
    fn send_copy(&self) -> bool {
        // SAFETY: a clone of the program's own skb, to its own device's egress.
        unsafe { bpf_clone_redirect(self.skb.skb, (*self.skb.skb).ifindex, 0) == 0 }
    }

    #[inline(always)]
    fn hand_over(&self, _tag: Handover, _value: u32) -> bool {
        false
    }
}

/// The tag and value the XDP reply program handed over with a frame ([`Rewrite::hand_over`]),
/// if it did: read by the finishing program at TC ingress. Only a tag made with this
/// attachment's key is one: metadata that came with the frame from elsewhere (a veth carries
/// it over from its peer, whose own gateway may have tagged it) is not.
#[inline(always)]
pub fn handed_over(ctx: &TcContext) -> Option<(Handover, u32)> {
    // SAFETY: reads of the skb's metadata bounds, then of the 8 bytes checked against them.
    unsafe {
        let skb = ctx.skb.skb;
        let meta = core::ptr::read_volatile(&(*skb).data_meta) as usize;
        let data = core::ptr::read_volatile(&(*skb).data) as usize;
        if meta + 8 > data {
            return None;
        }
        // Read only for a frame with metadata: the others pay nothing more for it.
        let key = crate::maps::handover_key();
        if key == 0 {
            return None;
        }
        let tag = u32::from_ne_bytes(*(meta as *const [u8; 4])) ^ key;
        let value = u32::from_ne_bytes(*((meta + 4) as *const [u8; 4]));
        Handover::from_word(tag).map(|h| (h, value))
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

/// What a socket lookup must find ([`ConnectionLookup::has`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Wanted {
    /// A connection the client really made (not just a listener): established, or a request
    /// socket awaiting the handshake's last ACK.
    Connection,
    /// A listener that takes a new connection on the tuple's port.
    Listener,
}

/// What a SYN's 4-tuple reaches in the device's namespace ([`ConnectionLookup::reach`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// Nothing: no listener here takes the port (the connection is forwarded to a server
    /// elsewhere, or the kernel resets it).
    Nothing,
    /// A listener that takes a new connection on the port.
    Listener,
    /// A socket of the tuple's own: a connection in any state, TIME_WAIT included (a SYN there
    /// is the kernel's to answer: it ends the TIME_WAIT first).
    Socket,
}

/// Where a segment's IP and TCP headers are copied for the kernel's SYN-cookie check
/// (`bpf_tcp_check_syncookie`): room for 40 bytes of IP header and 20 of TCP header.
#[derive(Clone, Copy)]
pub struct CookieAck {
    /// The IP header's copy.
    pub iph: *mut u8,
    /// The TCP header's copy.
    pub th: *mut u8,
}

/// Whether the kernel has a connection (or a listener) for a 4-tuple: a socket lookup, as
/// xdp_synproxy does, so that segments of connections that do not exist create no state.
pub trait ConnectionLookup {
    /// Looks `tuple` (`size` bytes, the packet's own direction) up in the device's namespace.
    /// For [`Wanted::Connection`], where only a listener is found, `cookie` (called then only)
    /// copies the segment's headers to `ack` and returns the IP header's length (0 when it
    /// cannot): an acknowledgement carrying a SYN cookie the listener accepts counts as a
    /// connection, since the kernel makes it from that very segment. (The length comes back in
    /// a register: a closure that LLVM does not inline returns a larger value through a
    /// pointer to the caller's stack, which the verifier refuses.)
    fn has(
        &self,
        tuple: *mut u8,
        size: u32,
        wanted: Wanted,
        ack: CookieAck,
        cookie: impl FnOnce() -> u32,
    ) -> bool;

    /// What `tuple` (`size` bytes, the packet's own direction) reaches in the device's
    /// namespace: one lookup.
    fn reach(&self, tuple: *mut u8, size: u32) -> Reach;
}

/// `struct sock` states that are a connection the client really made: established, and a
/// request socket awaiting the handshake's last ACK (SYN_RECV, NEW_SYN_RECV).
const TCP_ESTABLISHED: u32 = 1;
const TCP_SYN_RECV: u32 = 3;
pub const TCP_LISTEN: u32 = 10;
const TCP_NEW_SYN_RECV: u32 = 12;

#[inline(always)]
fn lookup<C: EbpfContext>(
    ctx: &C,
    tuple: *mut u8,
    size: u32,
    wanted: Wanted,
    ack: CookieAck,
    cookie: impl FnOnce() -> u32,
) -> bool {
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
    // SAFETY: a live socket reference, released right after its use.
    let state = unsafe { (*sk).state };
    let found = match wanted {
        Wanted::Connection => {
            matches!(state, TCP_ESTABLISHED | TCP_SYN_RECV | TCP_NEW_SYN_RECV)
                || (state == TCP_LISTEN && {
                    let iph_len = cookie();
                    // SAFETY: the listener found above; header copies of the sizes given.
                    iph_len != 0
                        && unsafe {
                            bpf_tcp_check_syncookie(
                                sk.cast(),
                                ack.iph.cast(),
                                iph_len,
                                ack.th.cast(),
                                20,
                            ) == 0
                        }
                })
        }
        Wanted::Listener => state == TCP_LISTEN,
    };
    // SAFETY: the reference taken above, released once.
    unsafe { bpf_sk_release(sk.cast()) };
    found
}

#[inline(always)]
fn reach<C: EbpfContext>(ctx: &C, tuple: *mut u8, size: u32) -> Reach {
    // SAFETY: as in [`lookup`].
    let sk = unsafe {
        bpf_skc_lookup_tcp(
            ctx.as_ptr(),
            tuple.cast::<bpf_sock_tuple>(),
            size,
            u64::MAX,
            0,
        )
    };
    if sk.is_null() {
        return Reach::Nothing;
    }
    // SAFETY: a live socket reference, released right after its use.
    let listener = unsafe { (*sk).state } == TCP_LISTEN;
    // SAFETY: the reference taken above, released once.
    unsafe { bpf_sk_release(sk.cast()) };
    if listener {
        Reach::Listener
    } else {
        Reach::Socket
    }
}

/// The same helpers serve both hooks.
impl<C: EbpfContext> ConnectionLookup for C {
    #[inline(always)]
    fn has(
        &self,
        tuple: *mut u8,
        size: u32,
        wanted: Wanted,
        ack: CookieAck,
        cookie: impl FnOnce() -> u32,
    ) -> bool {
        lookup(self, tuple, size, wanted, ack, cookie)
    }

    #[inline(always)]
    fn reach(&self, tuple: *mut u8, size: u32) -> Reach {
        reach(self, tuple, size)
    }
}

/// The XDP hook's jump table, by [`Jump`] slot.
#[btf_map]
pub static XDP_JUMP: ProgramArray<{ Jump::ALL.len() }> = ProgramArray::new();

/// The TC hook's jump table, by [`Jump`] slot.
#[btf_map]
pub static TC_JUMP: ProgramArray<{ Jump::ALL.len() }> = ProgramArray::new();

/// Tail calls into the programs of the hook's jump table.
pub trait TailCall {
    /// Jumps to the program in slot `to`; returns only when the slot is empty.
    fn jump(&self, to: Jump);
}

impl TailCall for XdpContext {
    #[inline(always)]
    fn jump(&self, to: Jump) {
        // SAFETY: a tail call never returns on success; on failure we carry on.
        unsafe { XDP_JUMP.tail_call(self, to.slot()) };
    }
}

impl TailCall for TcContext {
    #[inline(always)]
    fn jump(&self, to: Jump) {
        // SAFETY: as above.
        unsafe { TC_JUMP.tail_call(self, to.slot()) };
    }
}
