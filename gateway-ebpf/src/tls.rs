//! TLS at the NIC: ClientHello classification with flow state and verified resumption.
// Map keys and values go by reference: by value, the 40-byte key and 88-byte flow were copied onto
// the 512-byte BPF stack and the verifier refused the combined stack size.
#![allow(clippy::needless_borrows_for_generic_args)]
//!
//! A segment that starts a TLS handshake record on a connection the flow table does not know
//! opens a flow. Its payload is copied into per-CPU scratch memory, and the shared ClientHello
//! parser (`gateway_common::tls`) runs over it under `bpf_loop`, six steps to a call of a global
//! function (`gateway_hello_step`). The verifier checks that function once, however many steps a
//! hello takes.
//!
//! - A hello that needs more bytes leaves the flow pending. Its segment passes as `tls-flow`, and
//!   the next in-order segment resumes the parse. A segment out of order decides the hello as
//!   `tls-new`.
//! - A complete hello is decided. An offer whose key is in `TLS_ISSUED` and has a free place
//!   (`crate::resume`) is `tls-resumed`. An offer of a key whose places are all held is `tls-new`
//!   and counted as `replays_bounded`; one offered faster than its resumption rate is `tls-new`
//!   and counted as `resumptions_too_fast`; any other offer is `tls-new` and counted as
//!   unverified, and so are new and malformed hellos.
//! - An admitted connection is a pending unit (`crate::pending`) until the server answers: its
//!   first flight (a handshake or alert record) or its close, seen by the egress program
//!   ([`answer::tls_answer`]). Nothing the client sends completes it; unanswered, it expires.
//! - Later packets of a decided connection cost one flow-table lookup: `tls-flow` when admitted,
//!   dropped (or answered) when rejected. A connection refused on its first segment makes no
//!   flow entry: it is remembered in a direct-mapped table ([`refused`]) until a later refusal
//!   takes its slot, so a flood of refused hellos costs no LRU insert and evicts no admitted
//!   connection's entry.
//! - A SYN on a 4-tuple the table knows ends the old entry, so the new connection is judged
//!   afresh, once the kernel holds no live connection there (the client reused its port); while
//!   it does, a SYN (spoofed, or a retransmission) changes nothing. Data in a SYN (TCP Fast
//!   Open) is judged as a first segment, once a listener is found for it.
//! - State is made only for connections the kernel has (a socket lookup): established, a
//!   request socket, or one it makes from the very segment judged (an acknowledgement with a
//!   valid SYN cookie, checked with the kernel's own `bpf_tcp_check_syncookie`).
//! - An IP-fragmented segment of a connection not yet decided is a malformed hello (tls-new),
//!   whatever its first fragment holds: the rest comes in fragments that carry no ports.
//! - On a connection the table does not know, ChangeCipherSpec and alert records before the
//!   hello are skipped (`gateway_common::tls::first_records`), so they cannot hide it. A first
//!   segment that is not TLS (SSLv2, HTTP, garbage) is a malformed hello and judged as
//!   `tls-new`; one that starts with application data passes as `tls-flow`, being most likely a
//!   connection whose entry the LRU evicted.

pub mod answer;

pub(crate) mod flows;
pub mod mac;
mod refused;

use core::ffi::c_void;

use aya_ebpf::{
    btf_maps::{PerCpuArray, RingBuf},
    macros::btf_map,
};
use gateway_common::{
    Class,
    bytes::PacketBytes,
    maps::{
        FINISHER_ATTACHED, FLOW_ADMITTED, FLOW_AWAITING_FIRST, FLOW_HELD, FLOW_KEY_EXCHANGE,
        FLOW_PENDING, FLOW_REJECTED, FlowKey, FlowKey4, RejectEvent, TLS_REJECTS_BYTES, TlsFlow,
    },
    packet::{Packet, TCP_ACK, TCP_FIN, TCP_RST, TCP_SYN, Transport},
    reasons::Refusal,
    tls::{
        FIRST_CONTINUES, FIRST_HELLO, FIRST_NO_HELLO_YET, HelloState, MAX_STEPS, MAX_WINDOWS,
        Segment, Verdict, WINDOW, first_records,
    },
};

use crate::{
    admission::{answer, count_refusal, refusal, refusing},
    bytes::{ScratchBytes, copy, opaque, zero},
    context::{Action, ConnectionLookup, CopyOut, Reach, Rewrite, Wanted},
    maps::finisher,
    pending::{self, TLS_PENDING},
    resume::{self, Place},
    steps,
    sync::now_ns,
    tcp::{
        TcpEvent, TcpScratch, TcpService, cookie, fill_tuple, flow_key, held,
        lookup::{kernel_has, kernel_has_live_connection, trusting},
    },
    tls_counters::count,
};

/// TLS as a service of the TCP layer (`crate::tcp`): its scratch is [`TLS_SCRATCH`], its
/// counters the TLS counters, and a joined hello's flow is admitted.
pub struct Tls;

impl TcpService for Tls {
    type Scratch = Scratch;

    #[inline(always)]
    fn scratch() -> Option<*mut Scratch> {
        TLS_SCRATCH.get_ptr_mut(0)
    }

    #[inline(always)]
    fn tcp(s: &mut Scratch) -> &mut TcpScratch {
        &mut s.tcp
    }

    #[inline(always)]
    fn count(event: TcpEvent) {
        count(|c| match event {
            TcpEvent::CookieSent => c.cookies_sent += 1,
            TcpEvent::HoldOverBudget => c.holds_over_budget += 1,
            // The counter keeps the name its pinned field and the stats have always had.
            TcpEvent::HeldJoined => c.held_carried += 1,
            TcpEvent::Handoff => c.handoffs += 1,
            TcpEvent::HandoffFailed => c.handoffs_failed += 1,
        });
    }

    #[inline(always)]
    fn joined(s: &mut Scratch, v4: bool) {
        if let Some(f) = flows::get(s, v4) {
            // SAFETY: the entry of this connection, touched only by its packets.
            unsafe { (*f).state = FLOW_ADMITTED };
        }
    }
}

/// Per-CPU scratch space of the ClientHello parser (not pinned).
#[btf_map]
pub static TLS_SCRATCH: PerCpuArray<Scratch, 1> = PerCpuArray::new();

/// Rejected TLS connections, for the daemon to tear down.
#[btf_map]
pub static TLS_REJECTS: RingBuf<RejectEvent, { TLS_REJECTS_BYTES as usize }> = RingBuf::new();

/// Bytes of a segment the parser looks at in one go: one window (a longer segment is copied and
/// parsed window by window), as much as the TCP layer's payload copy holds.
pub const SCRATCH_LEN: usize = WINDOW as usize;
const _: () = assert!(SCRATCH_LEN == crate::tcp::PAYLOAD_LEN);

/// Per-CPU scratch: a copy of the segment's payload, the live parser state, and the flow key and
/// new flow record. They live here rather than on the stack, which is 512 bytes for the program
/// and its callback together.
#[repr(C, align(8))]
pub struct Scratch {
    /// The TCP layer's part: the payload bytes copied (`tcp.buf`), the connection's key and
    /// socket tuple, header copies and the SYN cookie's work.
    pub(crate) tcp: TcpScratch,
    /// Payload bytes copied.
    len: u32,
    /// Stream offset of the payload's first byte.
    stream_offset: u32,
    /// The parser.
    state: HelloState,
    /// The packet's connection, an IPv4 one's, as the IPv4 flow table's key (`flows::get`).
    key4: FlowKey4,
    /// 1 when `flows::admitted4` found no entry for this segment's IPv4 connection; read and
    /// cleared by `flows::first`.
    absent4: u32,
    /// A flow record being created.
    flow: TlsFlow,
    /// 1 when the segment being judged starts its connection by a good cookie (handed to the
    /// kernel unless refused). In scratch rather than a local, so that the verifier does not
    /// follow the hello's judgment once for each value.
    handoff: u32,
    /// 1 while a held hello's segment is judged (likewise).
    held: u32,
}

/// Parser steps one call of [`gateway_hello_step`] runs.
const STEPS_PER_STEP_CALL: usize = 6;
/// Calls of [`gateway_hello_step`] one `bpf_loop` callback makes ([`hello_step`]): the loop runs
/// `MAX_STEPS / (STEPS_PER_CALL * STEPS_PER_STEP_CALL)` of them, so a window gets exactly
/// `MAX_STEPS` steps, as the parser's own loop gives it. The steps are a global function,
/// which the verifier checks once with none of its caller's state: as the callback's body they
/// were checked in more states (gateway_xdp verified 434,681 instructions with one step there,
/// 370,402 with it apart).
const STEPS_PER_CALL: usize = 2;
const _: () = assert!(MAX_STEPS.is_multiple_of(STEPS_PER_CALL * STEPS_PER_STEP_CALL));

/// [`STEPS_PER_CALL`] calls of [`gateway_hello_step`], as a `bpf_loop` callback: returns 1 to
/// stop.
#[inline(never)]
extern "C" fn hello_step(_index: u64, ctx: *mut c_void) -> i64 {
    steps::call(ctx, STEPS_PER_CALL, gateway_hello_step)
}

/// [`STEPS_PER_STEP_CALL`] parser steps over the window in the scratch slot `s`: 1 when nothing
/// more can be done with it (`HelloState::step`). A global function's pointer may be null to
/// the verifier, so it is checked.
///
/// Each step reads the parser's state afresh ([`steps::reread`]), so the verifier checks the
/// step once for each of them. What the grouping saves is calls (see [`steps`]): a hello took a
/// call per step.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_hello_step(s: *mut Scratch) -> i32 {
    // SAFETY: the caller's per-CPU scratch slot (or null), used only by this program run.
    unsafe {
        steps::repeat(s, STEPS_PER_STEP_CALL, |s| {
            let seg = Segment {
                offset: 0,
                len: s.len,
                stream_offset: s.stream_offset,
            };
            let bytes = ScratchBytes::<SCRATCH_LEN, { 2 * SCRATCH_LEN }> {
                buf: &s.tcp.buf,
                len: s.len,
            };
            s.state.step(&bytes, &seg)
        })
    }
}

/// Runs the parser's steps over the window in the scratch slot `s` (`bpf_loop`, [`hello_step`]).
///
/// A global function: the verifier checks it once, on its own, with nothing of its caller's
/// state, and each call of it as one instruction that returns an unknown number. A static
/// function (or the loop inlined) is checked again for every state its call is reached in: the
/// path through the headers, the window, what the flow entry said.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_hello_steps(s: *mut Scratch) -> i32 {
    steps::run(
        s,
        (MAX_STEPS / (STEPS_PER_CALL * STEPS_PER_STEP_CALL)) as u32,
        hello_step,
    );
    0
}

/// Runs the parser over one segment's payload, window by window (`gateway_common::tls::WINDOW`
/// bytes copied to scratch at a time), continuing from `s.state` (which it updates). Returns
/// `false` when the payload could not be copied.
#[inline(always)]
fn parse_segment<C: CopyOut>(
    ctx: &C,
    s: &mut Scratch,
    payload_offset: u32,
    payload_len: u32,
    stream_offset: u32,
) -> bool {
    let seg = Segment {
        offset: 0,
        len: payload_len,
        stream_offset,
    };
    s.state.begin_segment(&seg);
    for w in 0..MAX_WINDOWS {
        if s.state.verdict() != Verdict::Pending {
            break;
        }
        let Some(win) = seg.window(w) else {
            break;
        };
        let len = if win.len > SCRATCH_LEN as u32 {
            SCRATCH_LEN as u64
        } else {
            u64::from(win.len)
        };
        // The zero test must be on the very register passed to the helper: without the barrier
        // LLVM merged it with the clamp into one compare on a copy, and with a u32 it tested a
        // zero-extended copy; either way the verifier refused the size as possibly zero.
        let len = opaque(len);
        if len == 0 || !ctx.copy_out(payload_offset + w * WINDOW, s.tcp.buf.as_mut_ptr(), len) {
            return false;
        }
        s.len = len as u32;
        s.stream_offset = win.stream_offset;
        gateway_hello_steps(s);
    }
    s.state.end_segment(&seg);
    true
}

/// Classifies a TCP packet to a TLS port; `cookies`: the port is in SYN-cookie mode
/// ([`cookie`]): its SYNs are answered here, and a connection's first data segment that
/// acknowledges a good cookie is judged here, then handed to the kernel ([`Action::Handoff`])
/// unless refused.
#[inline(always)]
pub fn tls_packet<C: CopyOut + ConnectionLookup + Rewrite, B: PacketBytes>(
    ctx: &C,
    b: &B,
    pkt: &Packet,
    cookies: bool,
) -> (Class, Action) {
    let t = &pkt.transport;
    let payload_len = u32::from(pkt.payload_len());
    let Some(s) = TLS_SCRATCH.get_ptr_mut(0) else {
        return (Class::TlsFlow, Action::Pass);
    };
    // SAFETY: per-CPU slot, used only by this program run (and its bpf_loop callback).
    let s = unsafe { &mut *s };
    if !flow_key(b, pkt, &mut s.tcp.key, false) {
        return (Class::TlsFlow, Action::Pass);
    }
    let v4 = pkt.ip_version == 4;
    // SAFETY: the flow entry is only touched by packets of its own connection.
    let mut flow = flows::first(s, v4).map(|f| unsafe { &mut *f });
    let syn = t.tcp_flags & (TCP_SYN | TCP_ACK) == TCP_SYN && !pkt.fragmented;
    if syn {
        if cookies {
            return cookie_syn::<C, B>(ctx, pkt, s, v4, flow.is_some());
        }
        if flow.is_none() && refused::holds(&s.tcp.key) {
            // A connection refused on its first segment has no entry; its slot may remember it.
            return refused_syn::<C, B>(ctx, s, v4, payload_len);
        } else if flow.is_some() {
            // While the kernel holds a live connection on this 4-tuple, a SYN changes nothing
            // there (it gets a challenge ACK, RFC 5961), and nothing here either: a spoofed SYN
            // must not end an admitted connection's entry. Otherwise the client reused its
            // port for a new connection: the old entry goes, so the new hello is judged afresh.
            // The old connection's unit, if the server never answered it, ends by its own
            // timeout (or when the new one is admitted, as expired).
            if kernel_has_live_connection::<C, B>(ctx, &mut s.tcp, v4) {
                return (Class::TlsFlow, Action::Pass);
            }
            flows::remove(s, v4);
            flow = None;
        }
        if payload_len == 0 {
            return (Class::TlsFlow, Action::Pass);
        }
        // Data in the SYN (TCP Fast Open): the hello is judged here like any connection's
        // first segment; a listener must be there to take it.
        count(|c| c.syn_payloads += 1);
    }
    if let Some(f) = flow {
        if cookies && late_cookie_ack(t, f, payload_len) {
            count(|c| c.cookie_acks += 1);
            return (Class::TlsFlow, Action::Drop);
        }
        match f.state {
            FLOW_ADMITTED => return (Class::TlsFlow, Action::Pass),
            FLOW_KEY_EXCHANGE => {
                // The client's next data after its hello: a handshake record is its key
                // exchange, the server's second piece of work.
                let mut first = [0u8; 1];
                if payload_len > 0
                    && t.seq == f.next_seq
                    && b.read(t.payload_offset as usize, &mut first)
                {
                    if first[0] == 22 {
                        pending::key_exchange(&s.tcp.key);
                    }
                    f.state = FLOW_ADMITTED;
                }
                return (Class::TlsFlow, Action::Pass);
            }
            FLOW_REJECTED => return rejected_packet(t.tcp_flags),
            FLOW_AWAITING_FIRST => return awaiting_first(ctx, pkt, s, payload_len),
            // Its first segment held back: the kernel has nothing of this connection, so
            // nothing goes on until the hello is judged.
            FLOW_HELD if payload_len == 0 => return (Class::TlsFlow, Action::Drop),
            FLOW_HELD if t.seq != f.next_seq => {
                if let Some(answered) = held_again(pkt, s, f, payload_len) {
                    return answered;
                }
                // Otherwise decided below with what came, as new (out of order).
            }
            _ => {}
        }
        // In scratch rather than a local, so that the verifier does not follow the parse once
        // for each value.
        s.held = u32::from(f.state == FLOW_HELD);
        let first_seq = f.hello_seq;
        let result = pending_segment::<C>(ctx, pkt, s, f, payload_len);
        if s.held == 0 {
            return result;
        }
        if f.state != FLOW_ADMITTED {
            if f.state == FLOW_REJECTED {
                // Refused: its kept first segment has no more use.
                held::forget(&s.tcp.key);
            }
            return after_hold(s, f, &pkt.transport, v4, result);
        }
        // A held hello admitted: the client is told at once to send its first segment again
        // (by the reply program).
        f.state = FLOW_AWAITING_FIRST;
        cookie::hold(&mut s.tcp, first_seq);
        return (result.0, Action::Hold);
    }
    // A connection we do not know, in SYN-cookie mode: an acknowledgement of a good cookie is
    // the handshake's end (dropped: nothing is kept, and the kernel would answer it with a
    // reset) or the connection's first data segment, judged here before the kernel hears of it.
    s.handoff = 0;
    if cookies
        && !syn
        && !pkt.fragmented
        && t.tcp_flags & (TCP_ACK | TCP_SYN | TCP_RST | TCP_FIN) == TCP_ACK
        && cookie::check(ctx, pkt, &mut s.tcp)
    {
        if payload_len == 0 {
            count(|c| c.cookie_acks += 1);
            return (Class::TlsFlow, Action::Drop);
        }
        count(|c| c.cookie_hellos += 1);
        s.handoff = 1;
    }
    // A connection we do not know. Without payload (the TCP handshake, bare ACKs) it passes;
    // a fragment never does (what it carries comes with fragments nobody judges).
    if payload_len == 0 && !pkt.fragmented {
        return (Class::TlsFlow, Action::Pass);
    }
    // State only for connections the kernel really has (or, for a SYN's data, a listener that
    // takes it): a spoofed segment costs one lookup, and neither a flow entry nor a unit of the
    // backlog (the kernel would discard it anyway).
    let wanted = if syn {
        Wanted::Listener
    } else {
        Wanted::Connection
    };
    if s.handoff == 0 && !kernel_has(ctx, b, pkt, &mut s.tcp, wanted) {
        count(|c| c.no_connection += 1);
        return (Class::TlsFlow, Action::Drop);
    }
    // A connection refused on its first segment has no entry; its slot may remember it. Asked
    // after the socket lookup, so that a flood of spoofed segments does not pay for it (and a
    // refused connection whose socket the refusal ended is dropped there, unanswered: its client
    // had its reset).
    if refused::holds(&s.tcp.key) {
        return rejected_packet(t.tcp_flags);
    }
    // A SYN's data starts one past its sequence number.
    let data_seq = if syn { t.seq.wrapping_add(1) } else { t.seq };
    // SAFETY: a parser state of integers, aligned.
    unsafe { zero(&raw mut s.state) };
    s.state.start_zeroed();
    let first = first_records(b, t.payload_offset as usize, payload_len);
    if pkt.fragmented {
        count(|c| c.fragmented_hellos += 1);
    }
    let skip = if pkt.fragmented { 0 } else { first.skip };
    let what = if pkt.fragmented { 0xff } else { first.what };
    match what {
        // The hello, after any ChangeCipherSpec or alert records in front of it: parsed.
        FIRST_HELLO => {
            let at = u32::from(t.payload_offset) + skip;
            if !parse_segment(ctx, s, at, payload_len - skip, 0) {
                // Unreadable: a connection the kernel has goes on; one that starts here by its
                // cookie does not (its client sends the segment again).
                let action = if s.handoff != 0 {
                    Action::Drop
                } else {
                    Action::Pass
                };
                return (Class::TlsFlow, action);
            }
        }
        // Application data or a later handshake message on a connection the kernel has: one
        // whose flow entry the LRU evicted (or an error the server ends the connection on at
        // once); a SYN's data never continues anything. Or records that servers ignore, with
        // the hello still to come (its segment is judged as a first one).
        // Not for a connection that starts here by its cookie: it has no hello yet to have been
        // evicted after, and must not get a socket for records in front of one (judged as a
        // malformed hello below).
        FIRST_CONTINUES if !syn && s.handoff == 0 => return (Class::TlsFlow, Action::Pass),
        FIRST_NO_HELLO_YET if s.handoff == 0 => return (Class::TlsFlow, Action::Pass),
        // Anything else (an SSLv2 hello, plain HTTP, garbage, a record cut short) where a
        // ClientHello must be: a malformed hello, judged as tls-new, so no bytes bypass
        // admission.
        _ => s.state.verdict = Verdict::Malformed as u8,
    }
    // The new flow record, field by field (the parser state a word at a time).
    // SAFETY: scratch's parser state into scratch's flow record, both aligned.
    unsafe { copy(&raw mut s.flow.hello, &raw const s.state) };
    let flow = &mut s.flow;
    flow.hello_seq = data_seq.wrapping_add(skip);
    flow.next_seq = data_seq.wrapping_add(payload_len);
    flow.state = FLOW_PENDING;
    flow.class = Class::TlsNew as u8;
    flow.pad = 0;
    flow.segments = 1;
    flow.reserved = 0;
    let result = if s.flow.hello.verdict() == Verdict::Pending {
        count(|c| c.multi_segment += 1);
        if s.handoff != 0 && skip == 0 && refusing(Class::TlsNew, now_ns()) {
            // A connection that starts here by its cookie, while tls-new refuses: its first
            // segment is held back (dropped, its bytes parsed and kept), so that the kernel
            // makes no connection before the hello is judged. Admitted, it is joined with the
            // listener inside the segment that admitted it (`join`), or else handed over when
            // the client sends it again.
            s.flow.state = FLOW_HELD;
            count(|c| c.hellos_held += 1);
            held::keep::<_, Tls>(ctx, pkt, &s.tcp.key, payload_len);
            held_answer(s, t, data_seq, v4)
        } else {
            (Class::TlsFlow, Action::Pass)
        }
    } else {
        // A fragment is refused without a reset (its sequence numbers would come from a
        // segment only partly seen), and so is a SYN (the kernel holds nothing to reset).
        decide::<C>(&s.tcp.key, &mut s.flow, !pkt.fragmented && !syn)
    };
    if s.flow.state == FLOW_REJECTED {
        // Refused at once: remembered in its slot, not in the flow table (no LRU insert, and no
        // other connection's entry evicted for it).
        refused::remember(&s.tcp.key);
    } else {
        flows::insert(s, v4);
    }
    match result {
        // Admitted, or its hello pending: the kernel makes the connection from this segment.
        (class, Action::Pass) if s.handoff != 0 => (class, Action::Handoff),
        other => other,
    }
}

/// Whether `t`, with no payload, is the last ACK of a handshake the NIC answered by cookie,
/// come after the connection's first data segment (`f`'s, which the kernel made the connection
/// from): the client sends the two back to back, and they can take different CPUs' queues. It
/// acknowledges nothing that segment did not, and passed on it could reach the listener
/// before the connection is in place, and draw a reset that ends the client's connection (one
/// connection in some 8,000 of a test's). So it is dropped, as before the hello. Only for a
/// connection the kernel has or is making (a held hello's segments are answered apart).
#[inline(always)]
fn late_cookie_ack(t: &Transport, f: &TlsFlow, payload_len: u32) -> bool {
    payload_len == 0
        && t.tcp_flags & (TCP_ACK | TCP_SYN | TCP_RST | TCP_FIN) == TCP_ACK
        && t.seq == f.hello_seq
        && matches!(f.state, FLOW_ADMITTED | FLOW_KEY_EXCHANGE | FLOW_PENDING)
}

/// A later segment of a pending hello (`f`, the flow entry of `s.tcp.key`): parsed from where the
/// last one left off, and the hello decided once complete.
#[inline(always)]
fn pending_segment<C: CopyOut + Rewrite>(
    ctx: &C,
    pkt: &Packet,
    s: &mut Scratch,
    f: &mut TlsFlow,
    payload_len: u32,
) -> (Class, Action) {
    let t = &pkt.transport;
    if pkt.fragmented {
        // An IP-fragmented segment: the kernel reassembles it from fragments that carry no
        // ports, so the hello cannot be followed to its end. Decided now as malformed:
        // tls-new, never resumed, whatever this fragment holds (even nothing).
        count(|c| c.fragmented_hellos += 1);
        f.hello.verdict = Verdict::Malformed as u8;
        return decide::<C>(&s.tcp.key, f, false);
    }
    if payload_len == 0 {
        return (Class::TlsFlow, Action::Pass);
    }
    f.segments = f.segments.saturating_add(1);
    // SAFETY: the flow's parser state into scratch, both aligned.
    unsafe { copy(&raw mut s.state, &raw const f.hello) };
    let in_order = t.seq == f.next_seq;
    if !in_order {
        count(|c| c.out_of_order += 1);
    }
    if !in_order
        || !parse_segment(
            ctx,
            s,
            u32::from(t.payload_offset),
            payload_len,
            t.seq.wrapping_sub(f.hello_seq),
        )
    {
        // Out of order or unreadable: decided as a new session.
        f.hello.verdict = Verdict::New as u8;
        return decide::<C>(&s.tcp.key, f, true);
    }
    // SAFETY: back, as above.
    unsafe { copy(&raw mut f.hello, &raw const s.state) };
    f.next_seq = t.seq.wrapping_add(payload_len);
    if f.hello.verdict() == Verdict::Pending {
        return (Class::TlsFlow, Action::Pass);
    }
    decide::<C>(&s.tcp.key, f, true)
}

/// The answer to a segment of a hello being held (of `s.tcp.key`, from `first_seq`; `t`, with the
/// cookie's acknowledgement): a SACK of it where the client permitted SACK
/// ([`cookie::sack_held`]), else nothing (dropped).
#[inline(always)]
fn held_answer(s: &mut Scratch, t: &Transport, first_seq: u32, v4: bool) -> (Class, Action) {
    if cookie::sack_permitted(t.ack, v4) {
        count(|c| c.held_sacked += 1);
        cookie::sack_held(&mut s.tcp, first_seq);
        (Class::TlsFlow, Action::Answer)
    } else {
        (Class::TlsFlow, Action::Drop)
    }
}

/// A segment of a held hello (`f`, of `s.tcp.key`) other than the next one the parse needs. A real
/// TCP sends bytes again only from its first unacknowledged one, at its retransmission timer,
/// and then waits for an acknowledgement: after a loss (or the next segment coming first, and
/// dropped: nothing here knew its connection yet), waiting for the next segment would hold the
/// client for good. So:
/// - bytes already held, sent again: acknowledged with a SACK of them ([`held_answer`]), so
///   that the client sends what follows;
/// - bytes past a gap: dropped (the client sends the gap first);
/// - otherwise (a client that cannot be told that, without SACK; a segment reaching past the
///   bytes held) `None`: the hello cannot be had whole, so the caller decides it with what
///   came, as new (the least privilege). Refused, the client gets a reset; admitted (tls-new
///   has room by now), the connection goes on as any admitted held hello's.
#[inline(always)]
fn held_again(
    pkt: &Packet,
    s: &mut Scratch,
    f: &TlsFlow,
    payload_len: u32,
) -> Option<(Class, Action)> {
    let t = &pkt.transport;
    let held = f.next_seq.wrapping_sub(f.hello_seq);
    let at = t.seq.wrapping_sub(f.hello_seq);
    if at >= held {
        return Some((Class::TlsFlow, Action::Drop));
    }
    count(|c| c.held_resent += 1);
    if payload_len > held - at || pkt.fragmented {
        return None;
    }
    let answer = held_answer(s, t, f.hello_seq, pkt.ip_version == 4);
    (answer.1 == Action::Answer).then_some(answer)
}

/// What becomes of a held hello's segment `t` that did not admit it (`result`, from
/// [`pending_segment`]): still pending, held too, and told with a SACK of it
/// ([`held_answer`]) so that the client sends what follows at once; refused, as decided (a
/// reset from the NIC: the kernel never had the connection).
#[inline(always)]
fn after_hold(
    s: &mut Scratch,
    f: &TlsFlow,
    t: &Transport,
    v4: bool,
    result: (Class, Action),
) -> (Class, Action) {
    if f.state == FLOW_REJECTED {
        result
    } else {
        held_answer(s, t, f.hello_seq, v4)
    }
}

/// A segment of a held hello's connection, admitted and waiting for its first segment
/// ([`FLOW_AWAITING_FIRST`]): that segment (its cookie checks again, and its bytes are the ones
/// judged, as kept: `held::compare_kept`) is handed to the listener now, and the connection is
/// admitted as any other; the client's reset passes; anything else is dropped, to come again
/// once the kernel has the connection.
#[inline(always)]
fn awaiting_first<C: CopyOut>(
    ctx: &C,
    pkt: &Packet,
    s: &mut Scratch,
    payload_len: u32,
) -> (Class, Action) {
    let t = &pkt.transport;
    if t.tcp_flags & TCP_RST != 0 {
        return (Class::TlsFlow, Action::Pass);
    }
    if payload_len == 0 || !cookie::check(ctx, pkt, &mut s.tcp) {
        return (Class::TlsFlow, Action::Drop);
    }
    // Only the bytes that were judged go to the kernel: other bytes are dropped (the client's
    // own copy may still come); with nothing kept to compare against, the client gets a reset
    // and connects again.
    match held::compare_kept(ctx, pkt, &mut s.tcp, payload_len) {
        held::Kept::Same => {}
        kept => {
            count(|c| c.held_unmatched += 1);
            let action = if kept == held::Kept::Gone {
                Action::Reject
            } else {
                Action::Drop
            };
            return (Class::TlsFlow, action);
        }
    }
    let v4 = pkt.ip_version == 4;
    if let Some(f) = flows::get(s, v4) {
        // SAFETY: the entry of this connection, touched only by its packets.
        unsafe { (*f).state = FLOW_ADMITTED };
    }
    count(|c| c.held_handoffs += 1);
    (Class::TlsFlow, Action::Handoff)
}

/// A SYN to a port in SYN-cookie mode, of the connection `s.tcp.key` (whose flow entry exists when
/// `known`). What the kernel holds on the 4-tuple is looked up once (nothing, for the usual
/// SYN), and only where it holds a socket and this side remembers the 4-tuple, whether that
/// socket is a live connection:
/// - a live connection: nothing changes, here or there (a SYN gets a challenge ACK, RFC 5961;
///   a spoofed SYN must not end an admitted connection's entry);
/// - otherwise the client reused its port: the old entry or refused slot goes, so that the new
///   hello is judged afresh;
/// - a socket that is not live (TIME_WAIT) is the kernel's to answer, which ends it first (the
///   NIC's cookie would leave it in the way of the connection handed over), and the hello is
///   judged as any connection's the kernel has (`cookies_declined`);
/// - no socket and no listener in the device's namespace: the kernel's (it forwards the SYN
///   to a server elsewhere, or resets it): a cookie would be handed to nobody
///   (`cookies_no_listener`);
/// - a listener: answered from the NIC with a cookie, data and all (TCP Fast Open's data is
///   sent again once the client is connected): nothing kept, nothing in the kernel.
#[inline(always)]
fn cookie_syn<C: CopyOut + ConnectionLookup, B: PacketBytes>(
    ctx: &C,
    pkt: &Packet,
    s: &mut Scratch,
    v4: bool,
    known: bool,
) -> (Class, Action) {
    // A fixture with no sockets at all (`trusting`) has a listener for every port.
    let reach = if trusting() {
        Reach::Listener
    } else {
        let size = fill_tuple(&s.tcp.key, &mut s.tcp.tuple, v4);
        ctx.reach(s.tcp.tuple.as_mut_ptr(), size)
    };
    let remembered = !known && refused::holds(&s.tcp.key);
    if known || remembered {
        if reach == Reach::Socket && kernel_has_live_connection::<C, B>(ctx, &mut s.tcp, v4) {
            return (Class::TlsFlow, Action::Pass);
        }
        if remembered {
            refused::forget(&s.tcp.key);
        } else {
            flows::remove(s, v4);
        }
    }
    match reach {
        Reach::Listener => (Class::TlsFlow, cookie::answer_syn(ctx, pkt, &mut s.tcp)),
        Reach::Socket => {
            count(|c| c.cookies_declined += 1);
            (Class::TlsFlow, Action::Pass)
        }
        Reach::Nothing => {
            count(|c| c.cookies_no_listener += 1);
            (Class::TlsFlow, Action::Pass)
        }
    }
}

/// A SYN on the 4-tuple of a connection [`refused`] remembers (in `s.tcp.key`): nothing changes
/// while the kernel holds a live connection there (as on a known connection); otherwise the
/// client reused its port for a new connection, which is forgotten as refused so that its hello
/// is judged afresh. A SYN carrying data (TCP Fast Open) is then dropped once, unjudged: its
/// retransmission is judged as any first segment.
#[inline(always)]
fn refused_syn<C: ConnectionLookup, B: PacketBytes>(
    ctx: &C,
    s: &mut Scratch,
    v4: bool,
    payload_len: u32,
) -> (Class, Action) {
    if kernel_has_live_connection::<C, B>(ctx, &mut s.tcp, v4) {
        return (Class::TlsFlow, Action::Pass);
    }
    refused::forget(&s.tcp.key);
    if payload_len == 0 {
        (Class::TlsFlow, Action::Pass)
    } else {
        (Class::TlsFlow, Action::Drop)
    }
}

/// A later packet of a refused connection: answered like the refusal (within the reply
/// rate), except the client's own reset, which ends the server's socket too and passes.
#[inline(always)]
fn rejected_packet(tcp_flags: u8) -> (Class, Action) {
    if tcp_flags & TCP_RST != 0 {
        return (Class::TlsFlow, Action::Pass);
    }
    count(|c| c.rejected_flow_packets += 1);
    (Class::TlsFlow, answer(Class::TlsFlow))
}

/// Decides the complete hello in `f`: its class, then admission against the class's limits.
/// `answerable`: a refusal may be answered with resets from the NIC (not for a fragment).
#[inline(always)]
fn decide<C: Rewrite>(key: &FlowKey, f: &mut TlsFlow, answerable: bool) -> (Class, Action) {
    count(|c| c.hellos += 1);
    let port = u32::from(key.dport);
    // The issued key whose place a resumed hello takes: read where the parser left it.
    let mut offer = None;
    let class = match f.hello.verdict() {
        Verdict::Offer => match f.hello.offer_key_ref() {
            Some(key) => {
                // Places of expired resumed units and holds are given back before this one is
                // taken.
                pending::sweep_holds_if_due();
                let now = pending::sweep_if_due(Class::TlsResumed);
                let mut place = resume::take(key, now);
                // A ticket no key was published for: its tag may vouch for it (a node sharing
                // the ticket secret issued it).
                // Or the server's own ticket key its MAC (a server the gateway does not
                // terminate).
                if matches!(place, Place::Unknown)
                    && (resume::gateway_vouch(&f.hello, port) == 1
                        || (mac::gateway_mac_begin(&f.hello, port) == 1
                            && mac::gateway_mac_blocks() == 0
                            && mac::gateway_mac_finish() == 1
                            && mac::gateway_mac_publish(&f.hello, port) == 1))
                {
                    place = resume::take(key, now);
                }
                match place {
                    Place::Taken => {
                        offer = Some(key);
                        Class::TlsResumed
                    }
                    Place::Full => {
                        count(|c| c.replays_bounded += 1);
                        Class::TlsNew
                    }
                    Place::TooFast => {
                        count(|c| c.resumptions_too_fast += 1);
                        Class::TlsNew
                    }
                    Place::Unknown | Place::Withdrawn => {
                        count(|c| c.unverified_offers += 1);
                        Class::TlsNew
                    }
                }
            }
            None => {
                count(|c| c.unverified_offers += 1);
                Class::TlsNew
            }
        },
        Verdict::Malformed => {
            count(|c| c.malformed += 1);
            Class::TlsNew
        }
        _ => Class::TlsNew,
    };
    f.class = class as u8;
    match pending::admit(&TLS_PENDING, key, class, offer, 0) {
        Ok(()) => {
            f.state = FLOW_ADMITTED;
            (class, Action::Pass)
        }
        Err(reason) => {
            if let Some(offer) = offer {
                resume::give_back(offer);
            }
            f.state = FLOW_REJECTED;
            (class, reject::<C>(key, class, reason, answerable))
        }
    }
}

/// Counts a rejection by reason and decides its answer (`crate::admission::refusal`; a drop
/// when not `answerable`). Unless that answer resets the server's socket in the kernel (the
/// hook's reply does, `Rewrite::SENDS_COPIES`; on XDP the finishing program, when attached),
/// tells the daemon, which destroys the socket (and with it resets the client, if the NIC did
/// not).
#[inline(always)]
fn reject<C: Rewrite>(key: &FlowKey, class: Class, reason: Refusal, answerable: bool) -> Action {
    let action = if answerable {
        refusal(class, reason)
    } else {
        count_refusal(class, reason, false);
        Action::Drop
    };
    if action == Action::Reject && (C::SENDS_COPIES || finisher(FINISHER_ATTACHED)) {
        return action;
    }
    // A full ring buffer loses the event (counted), not the rejection: the connection is still
    // refused.
    if let Some(mut entry) = TLS_REJECTS.reserve(0) {
        let event = entry.as_mut_ptr();
        // SAFETY: the reserved event, aligned, written whole before it is submitted.
        unsafe {
            zero(event);
            copy(&raw mut (*event).key, key);
            (*event).class = class as u8;
            (*event).reason = reason.id();
        }
        entry.submit(0);
    } else {
        count(|c| c.reject_events_lost += 1);
    }
    action
}
