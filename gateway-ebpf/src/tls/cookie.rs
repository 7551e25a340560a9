//! SYN cookies at the NIC (`gateway_common::syncookie`): a SYN to a port in SYN-cookie mode is
//! answered here, and the cookie its connection's first data segment acknowledges is checked
//! here, so that the kernel hears of a new connection only once its hello was admitted.
//!
//! The hashing and the options' walk are global functions ([`gateway_syn_cookie`],
//! [`gateway_cookie_check`]): the verifier checks each once, on its own, rather than again for
//! every path of the classifier that reaches them.

use core::ffi::c_void;

use aya_ebpf::{btf_maps::Array, helpers::generated::bpf_loop, macros::btf_map};
use gateway_common::{
    Class,
    packet::Packet,
    syncookie::{
        CookieKey, CookieOptions, MAX_OPTION_STEPS, OptionWalk, TcpOptions, WSCALE_NONE,
        check_cookie, cookie_hash, options_byte, period_of, synack_options, synack_tsval,
    },
};

use super::{Scratch, count};
use crate::{
    bytes::{opaque, zero},
    context::{Action, CopyOut, Rewrite},
    reply::syn_ack,
    sync::now_ns,
};

/// The cookies' secret (`SYN_COOKIE_KEY`): written by the daemon; all zero until then, and no
/// cookie is sent while it is.
#[btf_map]
pub static SYN_COOKIE_KEY: Array<CookieKey, 1> = Array::new();

/// What the cookie's global functions read and write, in the per-CPU scratch.
#[repr(C, align(8))]
pub struct CookieScratch {
    /// The segment's TCP options, copied ([`take_segment`]); zero past them.
    opts: Options,
    /// Their length.
    opts_len: u32,
    /// The segment's sequence number.
    seq: u32,
    /// Its acknowledgement number.
    ack: u32,
    /// 1 for IPv4.
    v4: u32,
    /// Out: the SYN-ACK's sequence number.
    cookie: u32,
    /// Out: the SYN-ACK's options' length.
    synack_len: u32,
    /// Out: the SYN-ACK's options.
    synack: [u8; 20],
    /// Out: what a good cookie kept ([`gateway_cookie_check`]).
    pub kept: CookieOptions,
    /// Out: the segment's options, parsed ([`gateway_cookie_check`]).
    pub parsed: TcpOptions,
    /// The options' walk ([`walk_options`]).
    walk: OptionWalk,
}

/// One step of the options' walk, as a `bpf_loop` callback: returns 1 to stop.
#[inline(never)]
extern "C" fn option_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` points at the caller's pointer to its per-CPU scratch.
    let c = unsafe { &mut **ctx.cast::<*mut CookieScratch>() };
    i64::from(!c.walk.step(&c.opts.0))
}

/// Walks the options copied into `c` (`bpf_loop`: the verifier checks one step, not every
/// layout of options).
#[inline(always)]
fn walk_options(c: &mut CookieScratch) -> TcpOptions {
    c.walk = OptionWalk::new(c.opts_len as usize);
    let mut p: *mut CookieScratch = c;
    // SAFETY: option_step has the callback signature bpf_loop expects; its context is the
    // scratch pointer on this frame.
    unsafe {
        bpf_loop(
            MAX_OPTION_STEPS,
            option_step as *mut c_void,
            (&raw mut p).cast(),
            0,
        );
    }
    c.walk.found
}

/// The secret, once set.
#[inline(always)]
fn secret() -> Option<&'static CookieKey> {
    SYN_COOKIE_KEY.get(0).filter(|k| k.is_set())
}

/// The TCP options of a segment, copied ([`take_segment`]): in a type of whole words so that
/// it is cleared a word at a time.
#[repr(C, align(8))]
pub struct Options(pub [u8; 64]);

/// Copies the TCP options and numbers of `pkt` into `c` (the options zero past their end, in one
/// copy from the packet).
#[inline(always)]
fn take_segment<C: CopyOut>(ctx: &C, pkt: &Packet, c: &mut CookieScratch) {
    let t = &pkt.transport;
    let header = u32::from(t.payload_offset).saturating_sub(u32::from(t.l4_offset));
    let len = header.saturating_sub(20);
    // SAFETY: bytes in a type of whole words.
    unsafe { zero(&raw mut c.opts) };
    // A length the verifier can bound, tested on the register passed to the helper.
    let n = opaque(u64::from(len & 63));
    if n == 0 || n > 40 || !ctx.copy_out(u32::from(t.l4_offset) + 20, c.opts.0.as_mut_ptr(), n) {
        c.opts_len = 0;
    } else {
        c.opts_len = n as u32;
    }
    c.seq = t.seq;
    c.ack = t.ack;
    c.v4 = u32::from(pkt.ip_version == 4);
}

/// Makes the cookie and the SYN-ACK's options for the SYN in `s` (`s.key`, `s.cookie`'s
/// segment fields): their length, 0 when the secret is not set.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_syn_cookie(s: *mut Scratch) -> i32 {
    // A global function's pointer may be null to the verifier.
    if s.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU scratch.
    let s = unsafe { &mut *s };
    let Some(k) = secret() else {
        return 0;
    };
    let c = &mut s.cookie;
    let o = walk_options(c);
    let now = now_ns();
    let period = period_of(now);
    let (byte, mss) = options_byte(&o, c.v4 != 0, period);
    let hash = cookie_hash(k, &s.key, c.seq, period, byte);
    c.cookie = ((hash as u32) & 0xffff_ff00) | u32::from(byte);
    let (opts, n) = synack_options(&o, mss, synack_tsval(hash, now));
    c.synack = opts;
    c.synack_len = n as u32;
    n as i32
}

/// Checks the cookie the segment in `s` acknowledges (`s.key`, `s.cookie`'s segment fields):
/// 1 when good (its options in `s.cookie.kept`, the segment's in `s.cookie.parsed`), else 0.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_cookie_check(s: *mut Scratch) -> i32 {
    if s.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU scratch.
    let s = unsafe { &mut *s };
    let Some(k) = secret() else {
        return 0;
    };
    let c = &mut s.cookie;
    match check_cookie(k, &s.key, c.seq, c.ack, now_ns(), c.v4 != 0) {
        Some(kept) => {
            c.kept = kept;
            c.parsed = walk_options(c);
            1
        }
        None => 0,
    }
}

/// Answers the SYN `pkt` (of the connection `s.key`) with a SYN-ACK carrying a cookie, from the
/// NIC: nothing is kept, and the kernel never sees the SYN. Passed to the kernel instead when
/// the secret is not set yet or the headers are not ones the NIC answers (IPv4 options, IPv6
/// extension headers): the kernel then makes the connection as it would without this mode,
/// and its hello is judged as any connection's the kernel has.
#[inline(always)]
pub fn answer_syn<R: Rewrite + CopyOut>(ctx: &R, pkt: &Packet, s: &mut Scratch) -> (Class, Action) {
    take_segment(ctx, pkt, &mut s.cookie);
    let n = gateway_syn_cookie(s);
    if n <= 0 {
        return (Class::TlsFlow, Action::Pass);
    }
    let c = &s.cookie;
    match syn_ack(ctx, pkt, c.cookie, &c.synack, n as usize) {
        Some(action) => {
            count(|c| c.cookies_sent += 1);
            (Class::TlsFlow, action)
        }
        None => (Class::TlsFlow, Action::Pass),
    }
}

/// Whether the segment `pkt` (of the connection `s.key`) acknowledges a cookie of ours still
/// good, being the first after the handshake; if so, what the cookie kept is in
/// `s.cookie.kept` and the segment's own options in `s.cookie.parsed`.
#[inline(always)]
pub fn check<C: CopyOut>(ctx: &C, pkt: &Packet, s: &mut Scratch) -> bool {
    take_segment(ctx, pkt, &mut s.cookie);
    gateway_cookie_check(s) == 1
}

/// Whether a window scale was kept.
#[inline(always)]
pub fn scaled(kept: &CookieOptions) -> bool {
    kept.wscale != WSCALE_NONE
}
