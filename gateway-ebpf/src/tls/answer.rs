//! What the server sends back on a TLS port (the egress program): its answers end the
//! connections' pending units, and its handshakes say what it resumed and what it issued
//! (`gateway_common::tls::server`).
//!
//! - A first flight (a handshake record) or an alert or close ends the unit; only a handshake
//!   flight's time is recorded.
//! - A resumed connection whose server started a full handshake had its offer declined: the
//!   key is withdrawn ([`resume::decline`]).
//! - A TLS 1.2 full handshake's unit ends at the first flight as any does (a client that goes
//!   silent holds no place), and its flow then awaits the client's key exchange
//!   (`FLOW_KEY_EXCHANGE`): that record starts the server's second piece of work, a unit of its
//!   own ([`pending::key_exchange`]) ended by the server's ChangeCipherSpec.
//! - On a port whose sessions the NIC learns, the first flight's entry stays, uncounted
//!   ([`pending::answer_and_keep`]), with the ServerHello's session id; at the server's
//!   ChangeCipherSpec (sent once it verified the client's Finished) that id and the ticket of
//!   the same flight are published: only a client that completed the handshake gets one.

use core::ffi::c_void;

use aya_ebpf::{btf_maps::PerCpuArray, macros::btf_map};
use gateway_common::{
    Class,
    bytes::PacketBytes,
    maps::{FlowKey, PENDING_ANSWERED, PENDING_KEY_EXCHANGE, PENDING_LEARN_SID, Pending},
    packet::{Packet, TCP_FIN, TCP_RST},
    tls::{
        KEY_LEN, MAX_OFFER, Offer, ValueDigest,
        server::{
            Answer, RECORD_ALERT, RECORD_CCS, RECORD_HANDSHAKE, second_flight, server_hello,
            session_id_key,
        },
        tag::{MIN_TICKET, TAIL_LEN},
    },
};

use crate::{
    bytes::{ScratchBytes, opaque, zero},
    context::CopyOut,
    pending::{self, TLS_PENDING},
    resume,
    sync::now_ns,
    tcp::flow_key,
    tls::{SCRATCH_LEN, flows},
    tls_counters::count,
};

/// Per-CPU copy of a server segment's first bytes and what was read of them (not pinned): the
/// flights are read there by global functions, which the verifier checks once each.
#[btf_map]
static TLS_ANSWER_SCRATCH: PerCpuArray<AnswerScratch, 1> = PerCpuArray::new();

/// A server segment's first bytes and what its flight says.
#[repr(C, align(8))]
pub struct AnswerScratch {
    /// The payload's first bytes, in the first half; the second half is slack for masked reads
    /// (as the hello scratch's).
    buf: [u8; 2 * SCRATCH_LEN],
    /// Bytes copied.
    len: u32,
    /// [`Answer`] of a first flight, as a number (`answer_id`).
    answer: u32,
    /// 1 when [`Self::sid_key`] holds the key of the ServerHello's session id.
    has_sid: u32,
    /// 1 when a second flight's ChangeCipherSpec is in the segment.
    ccs: u32,
    /// 1 when [`Self::ticket_key`] holds the key of the second flight's ticket.
    has_ticket: u32,
    /// The ticket's lifetime hint, seconds.
    hint: u32,
    /// The session id's key.
    sid_key: [u8; KEY_LEN],
    /// The ticket's key.
    ticket_key: [u8; KEY_LEN],
    /// The ticket's digest while it is fed ([`digest_chunk`]).
    digest: ValueDigest,
    /// Where the bytes the digest covers start in [`Self::buf`].
    digest_at: u32,
    /// How many bytes it covers.
    digest_len: u32,
}

/// [`Answer`] as stored in [`AnswerScratch::answer`].
const fn answer_id(a: Answer) -> u32 {
    match a {
        Answer::Unknown => 0,
        Answer::Retry => 1,
        Answer::Tls12Full => 2,
        Answer::Tls12Resumed => 3,
        Answer::Tls13Resumed => 4,
        Answer::Tls13Full => 5,
    }
}

/// The bytes copied in `a`.
#[inline(always)]
fn copied(a: &AnswerScratch) -> ScratchBytes<'_, SCRATCH_LEN, { 2 * SCRATCH_LEN }> {
    ScratchBytes {
        buf: &a.buf,
        len: a.len,
    }
}

/// Reads the first flight copied in `a`: its [`Answer`] and its session id's key. A global
/// function: checked once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_read_first_flight(a: *mut AnswerScratch) -> i32 {
    if a.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU slot, used by this program run alone.
    let a = unsafe { &mut *a };
    let b = copied(a);
    let hello = server_hello(&b, 0);
    let sid = session_id_key(&b, hello.sid_at, hello.sid_len as usize);
    a.answer = answer_id(hello.answer);
    a.has_sid = u32::from(sid.is_some());
    if let Some(k) = sid {
        a.sid_key = k;
    }
    0
}

/// Reads the TLS 1.2 second flight copied in `a`: its ChangeCipherSpec, and its ticket's key
/// and lifetime hint. A global function: checked once.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_read_second_flight(a: *mut AnswerScratch) -> i32 {
    if a.is_null() {
        return 0;
    }
    // SAFETY: the caller's per-CPU slot, used by this program run alone.
    let slot = a;
    // SAFETY: as above.
    let a = unsafe { &mut *slot };
    let flight = second_flight(&copied(a), 0);
    a.ccs = u32::from(flight.ccs);
    a.hint = flight.lifetime_hint;
    let len = u32::from(flight.ticket_len);
    // The ticket's key: the digest of all of it but its tail (`tag::ticket_key`), eight bytes
    // a step of a `bpf_loop`.
    if flight.ticket_at != 0 && (MIN_TICKET as u32..=MAX_OFFER).contains(&len) {
        a.digest = ValueDigest::start(len);
        a.digest_at = flight.ticket_at as u32;
        a.digest_len = len - TAIL_LEN as u32;
        crate::steps::run(slot, a.digest_len.div_ceil(8), digest_chunk);
        a.ticket_key = a.digest.finish();
        a.has_ticket = 1;
    }
    0
}

/// One step of a ticket's digest (a `bpf_loop` callback): its bytes `8 * index` to
/// `8 * index + 7`, those under [`AnswerScratch::digest_len`]. Returns 0 to go on.
#[inline(never)]
extern "C" fn digest_chunk(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` points at the caller's pointer to its per-CPU slot, used only by this
    // program run.
    let a = unsafe { &mut **ctx.cast::<*mut AnswerScratch>() };
    let first = 8 * index as u32;
    for j in 0..8u32 {
        if first + j < a.digest_len {
            let at = (a.digest_at + first + j) & (2 * SCRATCH_LEN as u32 - 1);
            a.digest.byte(a.buf[at as usize]);
        }
    }
    0
}

/// Copies the first bytes of the payload of `pkt` (at most a window) to this CPU's answer
/// scratch; the slot, or `None` when nothing could be copied.
#[inline(always)]
fn copy_payload<C: CopyOut>(ctx: &C, pkt: &Packet) -> Option<*mut AnswerScratch> {
    let a = TLS_ANSWER_SCRATCH.get_ptr_mut(0)?;
    let len = u64::from(pkt.payload_len()).min(SCRATCH_LEN as u64);
    // The zero test on the register passed to the helper (see `tls::parse_segment`).
    let len = opaque(len);
    // SAFETY: the per-CPU slot; its buffer has room for SCRATCH_LEN bytes.
    unsafe {
        if len == 0
            || !ctx.copy_out(
                u32::from(pkt.transport.payload_offset),
                (*a).buf.as_mut_ptr(),
                len,
            )
        {
            return None;
        }
        (*a).len = len as u32;
        (*a).answer = 0;
        (*a).has_sid = 0;
        (*a).ccs = 0;
        (*a).has_ticket = 0;
    }
    Some(a)
}

/// A TCP segment leaving from a TLS port: see the module's doc. Bulk data passes with one byte
/// read.
#[inline(always)]
pub fn tls_answer<C: CopyOut, B: PacketBytes>(ctx: &C, b: &B, pkt: &Packet) {
    let t = &pkt.transport;
    let closing = t.tcp_flags & (TCP_FIN | TCP_RST) != 0;
    let at = t.payload_offset as usize;
    let mut first = [0u8; 1];
    let kind = if pkt.payload_len() > 0 && b.read(at, &mut first) {
        first[0]
    } else {
        0
    };
    if !closing && !matches!(kind, RECORD_CCS | RECORD_ALERT | RECORD_HANDSHAKE) {
        return;
    }
    let mut key = core::mem::MaybeUninit::<FlowKey>::uninit();
    // SAFETY: zeroed whole first, which is a valid FlowKey (as `FlowKey::default()`, without
    // its byte-at-a-time memset).
    let key = unsafe {
        zero(key.as_mut_ptr());
        key.assume_init_mut()
    };
    if !flow_key(b, pkt, key, true) {
        return;
    }
    let Some(unit) = TLS_PENDING.get_ptr_mut(&*key) else {
        // The server ends a connection: a resumed one gives its key's place back.
        if closing {
            resume::close(key);
        }
        return;
    };
    // SAFETY: a live entry of this connection, whose segments leave one at a time.
    let (class, flags) = unsafe { ((*unit).class, (*unit).flags) };
    if flags & (PENDING_ANSWERED | PENDING_KEY_EXCHANGE) != 0 {
        // A TLS 1.2 full handshake past its first flight: the server's second piece of work
        // (its unit, when the client's key exchange came), and what its second flight
        // confirms.
        if !closing && kind != RECORD_ALERT {
            let Some(a) = copy_payload(ctx, pkt) else {
                return;
            };
            gateway_read_second_flight(a);
            // SAFETY: the per-CPU slot just filled.
            let a = unsafe { &*a };
            if a.ccs == 0 {
                return;
            }
            if flags & PENDING_ANSWERED != 0 {
                learn_second_flight(a, t.src_port, flags, unit);
            }
        }
        // Counted only when it is the key exchange's unit; untimed (timed at the first flight).
        if pending::complete(&TLS_PENDING, key, false).is_some()
            && flags & PENDING_KEY_EXCHANGE != 0
        {
            count(|c| c.completions += 1);
        }
        return;
    }
    // A ChangeCipherSpec alone answers nothing yet.
    if !closing && kind == RECORD_CCS {
        return;
    }
    // Only a handshake flight measures the server's work (a ServerHello follows its key
    // exchange); an alert or a close answered at once ends the unit untimed, or a server's
    // fast refusals would read as cheap handshakes.
    let timed = !closing && kind == RECORD_HANDSHAKE;
    let mut declined = false;
    if timed && let Some(a) = copy_payload(ctx, pkt) {
        gateway_read_first_flight(a);
        // SAFETY: the per-CPU slot just filled.
        let a = unsafe { &*a };
        let answer = a.answer;
        let declined_answer =
            answer == answer_id(Answer::Tls12Full) || answer == answer_id(Answer::Tls13Full);
        if declined_answer && class == Class::TlsResumed.id() {
            // SAFETY: as above.
            resume::decline(unsafe { &(*unit).offer });
            declined = true;
        }
        if answer == answer_id(Answer::Tls12Full) && class == Class::TlsNew.id() {
            // The client's key exchange will be the server's second piece of work.
            flows::await_key_exchange(key, pkt.ip_version == 4);
            if resume::learns(t.src_port) {
                // The unit ends now; its entry waits for the second flight.
                count(|c| c.completions += 1);
                // SAFETY: as above.
                unsafe { pending::answer_and_keep(unit) };
                if a.has_sid != 0 {
                    // SAFETY: as above; a tls-new unit's offer is unused until now.
                    unsafe {
                        (*unit).offer = a.sid_key;
                        (*unit).flags |= PENDING_LEARN_SID;
                    }
                }
                return;
            }
        }
    }
    // `None`: ended meanwhile by another CPU's sweep.
    let Some(unit) = pending::complete(&TLS_PENDING, key, timed) else {
        return;
    };
    count(|c| c.completions += 1);
    if unit.class == Class::TlsResumed.id() {
        // Answered with its first flight, resumed and not closing: the connection goes on and
        // holds its key's place until it ends. Otherwise the place goes now.
        if timed && !declined {
            if !resume::hold_open(key, &unit.offer) {
                count(|c| c.holds_full += 1);
            }
        } else {
            resume::give_back(&unit.offer);
        }
    }
}

/// Publishes what a learning port's server confirmed with its ChangeCipherSpec (read into
/// `a`): the session id its ServerHello gave (kept in the unit `unit`), and the ticket of the
/// same flight.
#[inline(always)]
fn learn_second_flight(a: &AnswerScratch, port: u16, flags: u32, unit: *mut Pending) {
    let now = now_ns();
    if flags & PENDING_LEARN_SID != 0 {
        // SAFETY: the caller's live entry.
        let sid = unsafe { (*unit).offer };
        resume::learn(port, &sid, Offer::SessionId, 0, now);
    }
    if a.has_ticket != 0 {
        resume::learn(port, &a.ticket_key, Offer::Ticket, a.hint, now);
    }
}
