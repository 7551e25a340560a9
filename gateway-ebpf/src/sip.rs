//! SIP at the NIC: originals, retransmissions and exempt messages.
//!
//! A datagram to a SIP port is copied into per-CPU scratch memory (its first `MAX_SCAN` bytes) and
//! parsed by the shared parser (`gateway_common::sip`), step by step under `bpf_loop`, about a
//! line's steps per call of a global function ([`gateway_sip_line`]).
//! Responses are `sip-exempt`. ACK, CANCEL, BYE and in-dialog requests are exempt only when they
//! belong to what the server made: a dialog it established (learnt from its 2xx responses to
//! INVITEs, [`sip_response`]), or, for ACK and CANCEL, an INVITE transaction seen; otherwise they
//! are judged as originals (a method name or a To tag costs an attacker nothing). A dialog buys
//! at most `MAX_DIALOG_REQUESTS` exempt requests, ends with the server's final answer to its
//! BYE, and is forgotten after `DIALOG_IDLE_NS` without a request. An exempt
//! request seen before is a retransmission, and exempt traffic has its own ceiling (the
//! `sip-exempt` policy). The request-line marker only demotes. Any other request is keyed by its unit
//! key (`SipInfo::unit_key`): one whose unit is pending (admitted, unanswered: `SIP_PENDING`, which
//! nothing evicts) or whose original was admitted (`SIP_TXNS`, an LRU) is a `sip-retransmission`;
//! a copy of a refused original is judged as an original again (copies are counted from a small
//! table of refused keys, [`refused`], never from `SIP_TXNS`), and so is a new one, stored in
//! `SIP_TXNS` once admitted. Anything the parser cannot follow is an original, never exempt;
//! a request with no key at all is refused, since no response could ever complete it.
//!
//! An admitted original is a pending unit until the server's first response to it leaves the
//! host ([`sip_response`], from the egress program), or until its class's timeout.
// Map keys and values go by reference, as in the TLS module: values copied onto the 512-byte BPF
// stack crowd out the rest of the program.
#![allow(clippy::needless_borrows_for_generic_args)]

mod refused;

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    btf_maps::{LruHashMap, PerCpuArray},
    macros::btf_map,
};
use gateway_common::{
    Class,
    bytes::PacketBytes,
    maps::{
        DIALOG_IDLE_NS, MAX_DIALOG_REQUESTS, MAX_SIP_DIALOGS, MAX_SIP_TXNS, MAX_TXN_COPIES,
        PENDING_INVITE, PENDING_UNMATCHED, SipDialog, SipTxn, TXN_ADMITTED,
    },
    packet::Packet,
    reasons::Refusal,
    sip::{
        HAVE_CALL_ID, HAVE_TO_TAG, MAX_SCAN, MAX_STEPS, MessageKind, Method, Phase, SipInfo,
        SipState, fragment_unit_key,
        reply::{MAX_REPLY_STEPS, REPLY_BUF, ReplyState, reply_tag_hash},
    },
};

use crate::{
    admission::{self, count_refusal, refusal},
    bytes::{ScratchBytes, opaque, zero},
    context::{Action, CopyOut},
    maps::count,
    pending::{self, SIP_PENDING},
    reply::Payload,
    steps,
    sync::now_ns,
};

/// SIP transactions seen, by transaction key.
#[btf_map]
pub static SIP_TXNS: LruHashMap<u64, SipTxn, { MAX_SIP_TXNS as usize }> = LruHashMap::new();

/// SIP dialogs the server established, by dialog key: learnt on egress from its 2xx responses
/// to INVITEs; only their requests are exempt.
#[btf_map]
pub static SIP_DIALOGS: LruHashMap<u64, SipDialog, { MAX_SIP_DIALOGS as usize }> =
    LruHashMap::new();

/// Per-CPU scratch space of the SIP parser (not pinned).
#[btf_map]
pub static SIP_SCRATCH: PerCpuArray<Scratch, 1> = PerCpuArray::new();

/// Per-CPU scratch: the datagram's first bytes and the parser state, and a 503 being built for
/// it when it is refused (`crate::reply`).
#[repr(C, align(8))]
pub struct Scratch {
    /// Payload bytes, in the first half (the second half is slack for masked reads).
    buf: [u8; 2 * MAX_SCAN],
    /// Bytes copied.
    len: u32,
    /// Whether `reply` was set up for the datagram in `buf` (by [`sip_packet`], for the reply
    /// program it jumps to); cleared when used.
    reply_ready: u32,
    /// The parser.
    state: SipState,
    /// Parser steps run ([`gateway_sip_line`]).
    steps: u32,
    /// The 503's builder.
    reply: ReplyState,
    /// The 503's bytes.
    out: [u8; REPLY_BUF],
}

/// Calls of [`gateway_sip_line`] one `bpf_loop` callback makes (the loop runs `MAX_STEPS /
/// STEPS_PER_CALL` of them: every call runs a parser step at least, so a message can have its
/// `MAX_STEPS` steps, which [`gateway_sip_line`] counts, as the parser's own loop gives it).
const STEPS_PER_CALL: usize = 16;
const _: () = assert!(
    MAX_STEPS.is_multiple_of(STEPS_PER_CALL) && MAX_REPLY_STEPS.is_multiple_of(STEPS_PER_CALL)
);

/// [`STEPS_PER_CALL`] calls of [`gateway_sip_line`], as a `bpf_loop` callback: returns 1 to
/// stop.
#[inline(never)]
extern "C" fn sip_step(_index: u64, ctx: *mut c_void) -> i64 {
    steps::call(ctx, STEPS_PER_CALL, gateway_sip_line)
}

/// Cheap parser steps (a parameter searched, a value hashed, a Via's protocol, a CSeq number)
/// one call of [`gateway_sip_line`] runs after a line's end and its look at the line.
const CHEAP_STEPS: usize = 4;

/// The parser's steps of about a line of the datagram in `s` (the caller's scratch slot), in
/// the order the parser runs them: the line's end found (`Phase::FindEol`), the line looked at
/// (`Phase::Dispatch`), then up to [`CHEAP_STEPS`] of the steps that read its value; each
/// runs only when it is the parser's next, so the steps are the parser's own, one after another.
/// 1 when parsing is over.
///
/// A global function, which the verifier checks once, on its own. Each step reads the parser's
/// state back from map memory (through a barrier), so the places one step can end at do not
/// multiply into the next one's paths: the verifier's cost is the sum of the steps', as it was
/// when each was a call of its own. What the grouping saves is the calls: on this machine kind
/// every return is mispredicted (`spec_rstack_overflow: Safe RET`), and a message took a call
/// per step (31 for the benchmark's 1 KB INVITE; about 10 this way).
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_sip_line(s: *mut Scratch) -> i32 {
    // A global function's pointer may be null to the verifier.
    if s.is_null() {
        return 1;
    }
    let mut ran = false;
    // A line's end, then the look at it, each when it is the parser's next step.
    match phase_step(s, Phase::FindEol) {
        Some(true) => return 1,
        Some(false) => ran = true,
        None => {}
    }
    match phase_step(s, Phase::Dispatch) {
        Some(true) => return 1,
        Some(false) => ran = true,
        None => {}
    }
    for _ in 0..CHEAP_STEPS {
        // SAFETY: the caller's per-CPU scratch slot, used only by this program run.
        let next = unsafe { steps::reread(s) }.state.phase();
        // Each arm names its phase, so that only that phase's code is in it.
        let done = match next {
            Phase::Semi => phase_step(s, Phase::Semi),
            Phase::ViaProtocol => phase_step(s, Phase::ViaProtocol),
            Phase::Hash => phase_step(s, Phase::Hash),
            Phase::ViaComma => phase_step(s, Phase::ViaComma),
            Phase::CSeqNumber => phase_step(s, Phase::CSeqNumber),
            _ => break,
        };
        match done {
            Some(true) => return 1,
            Some(false) => ran = true,
            None => break,
        }
    }
    // Nothing ran: the parse is over (or out of steps).
    i32::from(!ran)
}

/// The parser's next step in `s`, when it is of `phase` (not `Phase::Done`): `Some(true)` when
/// parsing is then over, or the message is out of steps; `None` when the next step is another
/// phase's.
#[inline(always)]
fn phase_step(s: *mut Scratch, phase: Phase) -> Option<bool> {
    // SAFETY: the caller's per-CPU scratch slot (not null), used only by this program run.
    let s = unsafe { steps::reread(s) };
    if s.state.phase() != phase {
        return None;
    }
    if s.steps >= MAX_STEPS as u32 {
        return Some(true);
    }
    s.steps += 1;
    let bytes = ScratchBytes::<MAX_SCAN, { 2 * MAX_SCAN }> {
        buf: &s.buf,
        len: s.len,
    };
    let len = s.len as usize;
    Some(s.state.step_in(phase, &bytes, len))
}

/// Steps of a 503 one call of [`gateway_sip_reply_step`] runs.
const REPLY_STEPS_PER_STEP_CALL: usize = 4;
const _: () = assert!(MAX_REPLY_STEPS.is_multiple_of(STEPS_PER_CALL * REPLY_STEPS_PER_STEP_CALL));

/// [`STEPS_PER_CALL`] calls of [`gateway_sip_reply_step`], as a `bpf_loop` callback: returns 1
/// to stop.
#[inline(never)]
extern "C" fn reply_step(_index: u64, ctx: *mut c_void) -> i64 {
    steps::call(ctx, STEPS_PER_CALL, gateway_sip_reply_step)
}

/// [`REPLY_STEPS_PER_STEP_CALL`] steps of the 503 in `s` (the caller's scratch slot): 1 when it
/// is built or cannot be. A step writes a byte: one call each was a call per byte of the 503.
/// Each step reads the builder's state afresh ([`steps::reread`]), as [`gateway_sip_line`]'s
/// do.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_sip_reply_step(s: *mut Scratch) -> i32 {
    // SAFETY: the caller's per-CPU scratch slot (or null), used only by this program run.
    unsafe {
        steps::repeat(s, REPLY_STEPS_PER_STEP_CALL, |s| {
            let bytes = ScratchBytes::<MAX_SCAN, { 2 * MAX_SCAN }> {
                buf: &s.buf,
                len: s.len,
            };
            let len = s.len as usize;
            s.reply.step(&bytes, len, &mut s.out)
        })
    }
}

/// Parses the datagram in the scratch slot `s` ([`sip_step`] by `bpf_loop`).
///
/// A global function, as `tls::gateway_hello_steps`: the verifier checks it once, on its own,
/// not again for every state its call is reached in.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_sip_steps(s: *mut Scratch) -> i32 {
    steps::run(s, (MAX_STEPS / STEPS_PER_CALL) as u32, sip_step);
    0
}

/// Builds the 503 set up in the scratch slot `s` ([`reply_step`] by `bpf_loop`); a global
/// function, as [`gateway_sip_steps`].
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_sip_reply_steps(s: *mut Scratch) -> i32 {
    steps::run(
        s,
        (MAX_REPLY_STEPS / (STEPS_PER_CALL * REPLY_STEPS_PER_STEP_CALL)) as u32,
        reply_step,
    );
    0
}

/// Builds the 503 that [`sip_packet`] set up for the refused request of this program run (the
/// reply program runs right after it, by tail call, on the same CPU). `None` when none was set
/// up or it cannot be made.
#[inline(always)]
pub fn compose_reply() -> Option<Payload> {
    let s = SIP_SCRATCH.get_ptr_mut(0)?;
    // SAFETY: per-CPU slot, used only by this program run (and its bpf_loop callback).
    let s = unsafe { &mut *s };
    if s.reply_ready == 0 {
        return None;
    }
    s.reply_ready = 0;
    gateway_sip_reply_steps(s);
    if !s.reply.done() {
        return None;
    }
    Some(Payload {
        bytes: s.out.as_ptr(),
        len: s.reply.len,
        sum: s.reply.sum,
    })
}

/// Sets up a 503 for the request in scratch (see [`compose_reply`]) when `action` is to answer
/// it.
#[inline(always)]
fn prepare_reply(info: &SipInfo, class: Class, action: Action) -> Action {
    if action != Action::Reject {
        return action;
    }
    let retry_after = admission::policy(class).map_or(0, |p| p.retry_after_s);
    let Some(s) = SIP_SCRATCH.get_ptr_mut(0) else {
        return Action::Drop;
    };
    // SAFETY: per-CPU slot, used only by this program run.
    let s = unsafe { &mut *s };
    s.reply = ReplyState::new(info.have & HAVE_TO_TAG != 0, info.call_id_hash, retry_after);
    s.reply_ready = 1;
    Action::Reject
}

/// Whether `info` is the ACK a client sends for a 503 the datapath sent: its To tag is the one
/// the datapath gives its Call-ID (`gateway_common::sip::reply::reply_tag`). The server never
/// saw the INVITE, so the ACK would be work for nothing.
#[inline(always)]
fn acks_our_503(info: &SipInfo) -> bool {
    info.method() == Method::Ack
        && info.have & (HAVE_TO_TAG | HAVE_CALL_ID) == HAVE_TO_TAG | HAVE_CALL_ID
        && info.to_tag_hash == reply_tag_hash(info.call_id_hash)
}

/// Parses the SIP message in the packet's UDP payload; `None` when it cannot be copied.
#[inline(always)]
fn parse_payload<C: CopyOut>(ctx: &C, pkt: &Packet) -> Option<SipInfo> {
    let payload_len = u64::from(pkt.payload_len());
    let s = SIP_SCRATCH.get_ptr_mut(0)?;
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
        return None;
    }
    s.len = len as u32;
    s.reply_ready = 0;
    // SipState::default() is all zero (and 8-aligned): written a word at a time.
    // SAFETY: the scratch's own field.
    unsafe { zero(&raw mut s.state) };
    s.steps = 0;
    gateway_sip_steps(s);
    Some(s.state.finish())
}

/// Classifies a UDP datagram to a SIP port, and admits it or not.
#[inline(always)]
pub fn sip_packet<C: CopyOut, B: PacketBytes>(ctx: &C, b: &B, pkt: &Packet) -> (Class, Action) {
    let Some(info) = parse_payload(ctx, pkt) else {
        // A first fragment that ends inside or right after the UDP header: its message, which
        // the kernel reassembles, is in fragments that carry no ports. Judged as the least
        // privileged request, an original under the class's limits, holding a unit keyed by
        // its source until its timeout (no response can be matched to it). The server may be
        // working on it: the controller counts it as live work, never as passed over.
        if pkt.fragmented {
            count(|c| c.unjudgeable += 1);
            if let Some(key) = fragment_key(b, pkt) {
                let class = Class::SipOriginal;
                let unmatched = PENDING_UNMATCHED;
                return match pending::admit(&SIP_PENDING, &key, class, None, unmatched) {
                    Ok(()) => (class, Action::Pass),
                    Err(reason) => {
                        count_refusal(class, reason, false);
                        (class, Action::Drop)
                    }
                };
            }
        }
        // Nothing to judge (an empty datagram): refused.
        count_refusal(Class::SipOriginal, Refusal::Backlog, false);
        return (Class::SipOriginal, Action::Drop);
    };
    if acks_our_503(&info) {
        count(|c| c.sip_acks_absorbed += 1);
        return (Class::SipExempt, Action::Drop);
    }
    let mut class = info.class();
    if class == Class::SipExempt && info.kind() == MessageKind::Request {
        class = earned_exemption(&info);
    }
    let key = info.unit_key();
    // Whether the transaction table has an entry for it (then its flag is set on admission).
    let mut seen = false;
    if class == Class::SipOriginal {
        let Some(key) = key else {
            // No response could match it: admitting it would hold a unit until it expires.
            count_refusal(class, Refusal::Backlog, false);
            return (class, Action::Drop);
        };
        if let Some(t) = SIP_TXNS.get_ptr_mut(&key) {
            seen = true;
            // SAFETY: a plain counter and the flags of a live entry; races only undercount it.
            let (admitted, requests) = unsafe {
                (*t).requests = (*t).requests.saturating_add(1);
                ((*t).flags & TXN_ADMITTED != 0, (*t).requests)
            };
            // A retransmission is a copy of admitted work: at most MAX_TXN_COPIES of them pass.
            if admitted || SIP_PENDING.get_ptr(&key).is_some() {
                class = Class::SipRetransmission;
                if requests > MAX_TXN_COPIES + 1 {
                    count(|c| c.sip_copies_over += 1);
                    count_refusal(class, Refusal::Backlog, false);
                    return (class, Action::Drop);
                }
            }
        } else if SIP_PENDING.get_ptr(&key).is_some() {
            // Evicted from the LRU while its unit is still pending (which nothing evicts): a
            // retransmission of admitted work all the same.
            let txn = SipTxn {
                first_ns: now_ns(),
                requests: 2,
                flags: TXN_ADMITTED,
            };
            let _ = SIP_TXNS.insert(&key, &txn, u64::from(BPF_NOEXIST));
            class = Class::SipRetransmission;
        } else if refused::copy_of_refused(key) {
            // A copy of a refused original asks for work the server never took on: judged as
            // an original again, under the originals' limits, so sending every request twice
            // buys nothing.
            count(|c| c.sip_copies_of_refused += 1);
        }
    }
    // Originals first: each original is held as a pending unit under its class's limits;
    // retransmissions only while the originals' backlog is under the retransmission policy's
    // threshold (see admission::admission). Exempt messages finish work: never dropped.
    let admitted = match (class, key) {
        (Class::SipOriginal, Some(key)) => {
            let family = if info.method() == Method::Invite {
                PENDING_INVITE
            } else {
                0
            };
            pending::admit(&SIP_PENDING, &key, class, None, family)
        }
        (Class::SipRetransmission, _) => pending::admit_against(class, Class::SipOriginal),
        // Exempt work has a ceiling of its own (a rate; nothing of it is held).
        (Class::SipExempt, _) => pending::admit_against(class, class),
        _ => Ok(()),
    };
    if let Err(reason) = admitted {
        if class == Class::SipOriginal
            && let Some(key) = key
        {
            // Remembered without a transaction entry: a flood of refused originals makes no
            // LRU insert and evicts no admitted transaction's entry.
            refused::remember(key);
        }
        // Responses and ACKs are never answered (RFC 3261 §17); other requests are as their
        // class says.
        let action = if info.kind() == MessageKind::Request && info.method() != Method::Ack {
            prepare_reply(&info, class, refusal(class, reason))
        } else {
            count_refusal(class, reason, false);
            Action::Drop
        };
        return (class, action);
    }
    if class == Class::SipOriginal
        && let Some(key) = key
    {
        // The server takes it on: its copies are retransmissions, and its ACK and CANCEL may be
        // exempt from now on.
        let entry = if seen {
            SIP_TXNS.get_ptr_mut(&key)
        } else {
            None
        };
        match entry {
            // SAFETY: the flags of this transaction's entry.
            Some(t) => unsafe { (*t).flags |= TXN_ADMITTED },
            None => {
                let txn = SipTxn {
                    first_ns: now_ns(),
                    requests: 1,
                    flags: TXN_ADMITTED,
                };
                let _ = SIP_TXNS.insert(&key, &txn, 0);
            }
        }
    }
    (class, Action::Pass)
}

/// The unit key of a first fragment with no readable message: its source address and port
/// (`gateway_common::sip::fragment_unit_key`).
#[inline(always)]
fn fragment_key<B: PacketBytes>(b: &B, pkt: &Packet) -> Option<u64> {
    let l3 = pkt.l3_offset as usize;
    let mut source = [0u8; 16];
    let read = if pkt.ip_version == 4 {
        let mut a = [0u8; 4];
        let ok = b.read(l3 + 12, &mut a);
        source[10] = 0xff;
        source[11] = 0xff;
        source[12..16].copy_from_slice(&a);
        ok
    } else {
        b.read(l3 + 8, &mut source)
    };
    read.then(|| fragment_unit_key(&source, pkt.transport.src_port))
}

/// The class an exempt-looking request (ACK, CANCEL, BYE, a To tag) really gets: exempt when it
/// belongs to a dialog the server established or (ACK, CANCEL) to an INVITE transaction seen,
/// and then a retransmission when the same request was seen before; otherwise an original.
#[inline(always)]
fn earned_exemption(info: &SipInfo) -> Class {
    let in_dialog = info.dialog_key().is_some_and(|k| spend_dialog(&k));
    // An INVITE transaction the server took on (admitted): pending, or flagged so in SIP_TXNS.
    // One that was refused, or merely seen, buys its ACK and CANCEL nothing.
    let of_invite = matches!(info.method(), Method::Ack | Method::Cancel)
        && info.invite_key().is_some_and(|k| {
            SIP_PENDING.get_ptr(&k).is_some()
                // SAFETY: the flags of a transaction entry, a plain load.
                || SIP_TXNS
                    .get_ptr(&k)
                    .is_some_and(|t| unsafe { (*t).flags } & TXN_ADMITTED != 0)
        });
    if !in_dialog && !of_invite {
        count(|c| c.sip_unearned += 1);
        return Class::SipOriginal;
    }
    let Some(key) = info.transaction_key() else {
        return Class::SipExempt;
    };
    if let Some(t) = SIP_TXNS.get_ptr_mut(&key) {
        // SAFETY: a plain counter; races only undercount it.
        unsafe { (*t).requests = (*t).requests.wrapping_add(1) };
        return Class::SipRetransmission;
    }
    let txn = SipTxn {
        first_ns: now_ns(),
        requests: 1,
        flags: 0,
    };
    let _ = SIP_TXNS.insert(&key, &txn, 0);
    Class::SipExempt
}

/// Whether the dialog `key` is one the server established and still has an exempt request to
/// give: known, used within `DIALOG_IDLE_NS`, and under `MAX_DIALOG_REQUESTS`. Spends one.
#[inline(always)]
fn spend_dialog(key: &u64) -> bool {
    let Some(d) = SIP_DIALOGS.get_ptr_mut(key) else {
        return false;
    };
    let now = now_ns();
    // SAFETY: fields of a live entry; a race between CPUs at worst lets one request more
    // through than the ceiling.
    let (last, requests) = unsafe { ((*d).last_ns, (*d).requests) };
    if requests >= MAX_DIALOG_REQUESTS || now.saturating_sub(last) > DIALOG_IDLE_NS {
        count(|c| c.sip_dialog_spent += 1);
        return false;
    }
    // SAFETY: as above.
    unsafe {
        (*d).requests = requests + 1;
        (*d).last_ns = now;
    }
    true
}

/// A datagram leaving from a SIP port: a 2xx to an INVITE establishes a dialog; when it is the
/// server's first response to a pending request, the request completes (the backlog shrinks; its
/// service time, admission to first response, goes into its class's histogram). The server needs no change and no userspace hop.
#[inline(always)]
pub fn sip_response<C: CopyOut>(ctx: &C, pkt: &Packet) {
    let Some(info) = parse_payload(ctx, pkt) else {
        return;
    };
    if info.kind() != MessageKind::Response {
        return;
    }
    // A 2xx to an INVITE: the server established a dialog, whose requests are exempt.
    if info.establishes_dialog()
        && let Some(dialog) = info.dialog_key()
    {
        let now = now_ns();
        let d = SipDialog {
            established_ns: now,
            last_ns: now,
            requests: 0,
            pad: 0,
        };
        match SIP_DIALOGS.get_ptr_mut(&dialog) {
            // A retransmitted 2xx (its ACK lost) or a re-INVITE's leaves the dialog's count;
            // one to a dialog forgotten for idleness starts it afresh.
            // SAFETY: fields of a live entry.
            Some(e) => unsafe {
                if now.saturating_sub((*e).last_ns) > DIALOG_IDLE_NS {
                    *e = d;
                }
            },
            None => {
                let _ = SIP_DIALOGS.insert(&dialog, &d, u64::from(BPF_NOEXIST));
            }
        }
    }
    // The server's final answer to a BYE: the dialog is over, and buys nothing more.
    if info.ends_dialog()
        && let Some(dialog) = info.dialog_key()
        && SIP_DIALOGS.remove(&dialog).is_ok()
    {
        count(|c| c.sip_dialogs_ended += 1);
    }
    let Some(key) = info.unit_key() else {
        return;
    };
    let _ = pending::complete(&SIP_PENDING, &key, true);
}
