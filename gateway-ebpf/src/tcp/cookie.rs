//! SYN cookies at the NIC (`gateway_common::syncookie`): a SYN to a port in SYN-cookie mode is
//! answered here, and the cookie its connection's first data segment acknowledges is checked
//! here, so that the kernel hears of a new connection only once its hello was admitted.
//!
//! The hashing and the options' walk are global functions ([`gateway_syn_cookie`],
//! [`gateway_cookie_check`]): the verifier checks each once, on its own, rather than again for
//! every path of the classifier that reaches them.

use core::ffi::c_void;

use aya_ebpf::{btf_maps::Array, macros::btf_map};
use gateway_common::{
    packet::{Packet, TCP_ACK, TCP_SYN},
    syncookie::{
        CookieKey, CookieOptions, MAX_OPTION_STEPS, OUR_WSCALE, OptionWalk, SYNACK_WINDOW,
        TcpOptions, WSCALE_NONE, check_cookie, cookie_hash, decode_options, held_ack_options,
        options_byte, period_of, synack_options, synack_tsval,
    },
};

use super::TcpScratch;
use crate::{
    bytes::{opaque, zero},
    context::{Action, CopyOut},
    reply::answerable,
    steps,
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
    /// The NIC's answer the reply program sends ([`super::send::send_answer`]): 1 while one is prepared,
    /// [`HELD_ANSWER`] while a held hello's is to be made there.
    answer_pending: u32,
    /// Its sequence and acknowledgement numbers, flags and window.
    answer_seq: u32,
    answer_ack: u32,
    answer_flags: u32,
    answer_window: u32,
    /// Its options' length, and the options (a SYN-ACK's, or a held hello's acknowledgement's).
    answer_len: u32,
    answer: [u8; 24],
    /// Out: what a good cookie kept ([`gateway_cookie_check`]).
    pub kept: CookieOptions,
    /// Out: the segment's options, parsed ([`gateway_cookie_check`]).
    pub parsed: TcpOptions,
    /// The options' walk ([`walk_options`]).
    walk: OptionWalk,
}

impl CookieScratch {
    /// The answer prepared for the reply program ([`hold`], [`sack_held`], [`answer_syn`]),
    /// taken: 0 when none is, else which ([`HELD_ANSWER`], [`SACK_ANSWER`], or 1 for a
    /// SYN-ACK).
    #[inline(always)]
    pub fn take_prepared(&mut self) -> u32 {
        let pending = self.answer_pending;
        self.answer_pending = 0;
        pending
    }

    /// A held segment's answer's first sequence number (the held hello's first byte).
    #[inline(always)]
    pub fn held_from(&self) -> u32 {
        self.answer_ack
    }

    /// The answer made: its sequence and acknowledgement numbers, flags and window, its
    /// options and their length.
    #[inline(always)]
    pub fn made(&self) -> ((u32, u32, u8, u16), &[u8; 24], usize) {
        (
            (
                self.answer_seq,
                self.answer_ack,
                self.answer_flags as u8,
                self.answer_window as u16,
            ),
            &self.answer,
            self.answer_len as usize,
        )
    }

    /// The TCP options of the segment last copied ([`take_segment`]), zero past them.
    #[inline(always)]
    pub fn options(&self) -> &[u8; 40] {
        self.opts.0.first_chunk().unwrap_or(&[0; 40])
    }
}

/// Steps of the options' walk one `bpf_loop` callback runs: a SYN's options (MSS, SACK, time
/// stamps, a NOP, window scale) in one callback rather than one each, since on this machine
/// kind every call's return is mispredicted (`spec_rstack_overflow: Safe RET`).
const OPTION_STEPS_PER_CALL: u32 = 8;
const _: () = assert!(MAX_OPTION_STEPS.is_multiple_of(OPTION_STEPS_PER_CALL));

/// [`OPTION_STEPS_PER_CALL`] steps of the options' walk, as a `bpf_loop` callback: returns 1 to
/// stop. Each step reads the walk afresh ([`steps::reread`]).
#[inline(never)]
extern "C" fn option_step(_index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` points at the pointer `steps::run` left on its frame, to the caller's
    // per-CPU scratch.
    let p = unsafe { *ctx.cast::<*mut CookieScratch>() };
    // SAFETY: as above.
    let done = unsafe {
        steps::repeat(p, OPTION_STEPS_PER_CALL as usize, |c| {
            !c.walk.step(&c.opts.0)
        })
    };
    i64::from(done)
}

/// Walks the options copied into `c` (`bpf_loop`: the verifier checks a callback's steps, not
/// every layout of options; a walk gets exactly `MAX_OPTION_STEPS` steps).
#[inline(always)]
fn walk_options(c: &mut CookieScratch) -> TcpOptions {
    c.walk = OptionWalk::new(c.opts_len as usize);
    steps::run(
        &raw mut *c,
        MAX_OPTION_STEPS / OPTION_STEPS_PER_CALL,
        option_step,
    );
    c.walk.found
}

/// [`CookieScratch::answer_pending`] of a held hello's acknowledgement, made by the reply
/// program from the segment ([`hold`]).
pub(super) const HELD_ANSWER: u32 = 2;
/// [`CookieScratch::answer_pending`] of a held segment's own acknowledgement ([`sack_held`]):
/// made the same way, never joined.
pub(super) const SACK_ANSWER: u32 = 3;

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
pub(super) fn take_segment<C: CopyOut>(ctx: &C, pkt: &Packet, c: &mut CookieScratch) {
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

/// A global function's scratch (`s`, which may be null to the verifier) and the secret, once
/// set.
#[inline(always)]
fn with_secret(s: *mut TcpScratch) -> Option<(&'static mut TcpScratch, &'static CookieKey)> {
    if s.is_null() {
        return None;
    }
    // SAFETY: the caller's per-CPU scratch, used only by this program run.
    Some((unsafe { &mut *s }, secret()?))
}

/// Makes the cookie and the SYN-ACK's options for the SYN in `s` (`s.key`, `s.cookie`'s
/// segment fields): their length, 0 when the secret is not set.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_syn_cookie(s: *mut TcpScratch) -> i32 {
    let Some((s, k)) = with_secret(s) else {
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
    c.answer = [0; 24];
    c.answer[..20].copy_from_slice(&opts);
    c.answer_len = n as u32;
    n as i32
}

/// Checks the cookie the segment in `s` acknowledges (`s.key`, `s.cookie`'s segment fields):
/// 1 when good (its options in `s.cookie.kept`, the segment's in `s.cookie.parsed`), else 0.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_cookie_check(s: *mut TcpScratch) -> i32 {
    let Some((s, k)) = with_secret(s) else {
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

/// Marks the answer to a later segment of a held hello whose connection was just admitted
/// (by the service), for the reply program to make and send ([`super::send::send_answer`]): an acknowledgement
/// back to the client that acknowledges nothing new (the kernel has nothing of the connection
/// yet; the client's bytes start at `first_seq`) and, when the client permitted SACK (the cookie
/// kept that), carries a SACK block of the segment, so that the client sends its first segment
/// again at once rather than at its retransmission timer. Its sequence number is the one the
/// SYN-ACK promised next; its timestamp goes on from the one the client echoes.
#[inline(always)]
pub fn hold(s: &mut TcpScratch, first_seq: u32) {
    s.cookie.answer_ack = first_seq;
    s.cookie.answer_pending = HELD_ANSWER;
}

/// Marks the answer to a segment of a hello being held (the first one, or one the client sent
/// again), for the reply program to make and send ([`super::send::send_answer`]): an acknowledgement of
/// nothing new (from `first_seq`) with a SACK block of the segment, so that the client knows
/// these bytes arrived and sends what follows them. Without it, a client whose next segment was
/// lost (or came first, and was dropped: nothing here knew its connection yet) would only ever
/// send the held one again at its retransmission timer, and never be acknowledged. Only for a
/// client that permitted SACK ([`sack_permitted`]).
#[inline(always)]
pub fn sack_held(s: &mut TcpScratch, first_seq: u32) {
    s.cookie.answer_ack = first_seq;
    s.cookie.answer_pending = SACK_ANSWER;
}

/// Whether the client of a connection the NIC answered permitted SACK, from the cookie its
/// segment acknowledges (`ack`, which the caller checked once already).
#[inline(always)]
pub fn sack_permitted(ack: u32, v4: bool) -> bool {
    decode_options(ack.wrapping_sub(1) as u8, v4).sack
}

/// [`hold`]'s and [`sack_held`]'s answer made on the segment copied into `s`, as a global function (the verifier
/// checks it once, with its own stack).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_held_answer(s: *mut TcpScratch, payload_len: u32, first_seq: u32) -> i32 {
    if s.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU scratch.
    let c = unsafe { &mut (*s).cookie };
    c.parsed = walk_options(c);
    let kept = decode_options(c.ack.wrapping_sub(1) as u8, c.v4 != 0);
    let o = c.parsed;
    let (opts, n) = held_ack_options(&o, kept.sack, c.seq, payload_len, o.tsecr.wrapping_add(1));
    c.answer = opts;
    c.answer_len = n as u32;
    c.answer_seq = c.ack;
    c.answer_ack = first_seq;
    c.answer_flags = u32::from(TCP_ACK);
    c.answer_window = u32::from(if scaled(&kept) {
        SYNACK_WINDOW >> OUR_WSCALE
    } else {
        SYNACK_WINDOW
    });
    1
}

/// Answers the SYN `pkt` (of the connection `s.key`) with a SYN-ACK carrying a cookie, from the
/// NIC: prepared here, sent by the reply program ([`Action::Answer`], `super::send::send_answer`); nothing is
/// kept, and the kernel never sees the SYN. IPv4 options and IPv6 extension headers are taken
/// out of the answer (`crate::reply::make_plain`). Passed to the kernel instead when the
/// secret is not set yet (the kernel then makes the connection as it would without this mode,
/// and its first segment is judged as any connection's the kernel has); dropped when its headers are
/// past the bounds an answer is made within (never to the kernel unjudged).
#[inline(always)]
pub fn answer_syn<C: CopyOut>(ctx: &C, pkt: &Packet, s: &mut TcpScratch) -> Action {
    if !answerable(pkt) {
        crate::maps::count(|c| c.syns_unanswerable += 1);
        return Action::Drop;
    }
    take_segment(ctx, pkt, &mut s.cookie);
    if gateway_syn_cookie(s) <= 0 {
        return Action::Pass;
    }
    let c = &mut s.cookie;
    c.answer_seq = c.cookie;
    c.answer_ack = pkt.transport.seq.wrapping_add(1);
    c.answer_flags = u32::from(TCP_SYN | TCP_ACK);
    c.answer_window = u32::from(SYNACK_WINDOW);
    c.answer_pending = 1;
    Action::Answer
}

/// Whether the segment `pkt` (of the connection `s.key`) acknowledges a cookie of ours still
/// good, being the first after the handshake; if so, what the cookie kept is in
/// `s.cookie.kept` and the segment's own options in `s.cookie.parsed`.
#[inline(always)]
pub fn check<C: CopyOut>(ctx: &C, pkt: &Packet, s: &mut TcpScratch) -> bool {
    take_segment(ctx, pkt, &mut s.cookie);
    gateway_cookie_check(s) == 1
}

/// Whether a window scale was kept.
#[inline(always)]
pub fn scaled(kept: &CookieOptions) -> bool {
    kept.wscale != WSCALE_NONE
}
