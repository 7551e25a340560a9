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

use gateway_common::{
    Class,
    bytes::PacketBytes,
    maps::{FlowKey, PENDING_ANSWERED, PENDING_KEY_EXCHANGE, PENDING_LEARN_SID, Pending},
    packet::{Packet, TCP_FIN, TCP_RST},
    tls::{
        Offer,
        server::{
            Answer, RECORD_ALERT, RECORD_CCS, RECORD_HANDSHAKE, SecondFlight, second_flight,
            server_hello, session_id_key, ticket_key_at,
        },
    },
};

use crate::{
    bytes::zero,
    pending::{self, TLS_PENDING},
    resume,
    sync::now_ns,
    tls::{count, flow_key, flows},
};

/// A TCP segment leaving from a TLS port: see the module's doc. Bulk data passes with one byte
/// read.
#[inline(always)]
pub fn tls_answer<B: PacketBytes>(b: &B, pkt: &Packet) {
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
            let flight = second_flight(b, at);
            if !flight.ccs {
                return;
            }
            if flags & PENDING_ANSWERED != 0 {
                learn_second_flight(b, t.src_port, flags, unit, &flight);
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
    if timed {
        let hello = server_hello(b, at);
        if hello.answer.declined() && class == Class::TlsResumed.id() {
            // SAFETY: as above.
            resume::decline(unsafe { &(*unit).offer });
            declined = true;
        }
        if hello.answer == Answer::Tls12Full && class == Class::TlsNew.id() {
            // The client's key exchange will be the server's second piece of work.
            flows::await_key_exchange(key, pkt.ip_version == 4);
            if resume::learns(t.src_port) {
                // The unit ends now; its entry waits for the second flight.
                count(|c| c.completions += 1);
                // SAFETY: as above.
                unsafe { pending::answer_and_keep(unit) };
                if let Some(k) = session_id_key(b, hello.sid_at, hello.sid_len as usize) {
                    // SAFETY: as above; a tls-new unit's offer is unused until now.
                    unsafe {
                        (*unit).offer = k;
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

/// Publishes what a learning port's server confirmed with its ChangeCipherSpec (`flight`): the
/// session id its ServerHello gave (kept in the unit `unit`), and the ticket of the same flight.
#[inline(always)]
fn learn_second_flight<B: PacketBytes>(
    b: &B,
    port: u16,
    flags: u32,
    unit: *mut Pending,
    flight: &SecondFlight,
) {
    let now = now_ns();
    if flags & PENDING_LEARN_SID != 0 {
        // SAFETY: the caller's live entry.
        let sid = unsafe { (*unit).offer };
        resume::learn(port, &sid, Offer::SessionId, 0, now);
    }
    if flight.ticket_at != 0
        && let Some(k) = ticket_key_at(b, flight.ticket_at, flight.ticket_len as usize)
    {
        resume::learn(port, &k, Offer::Ticket, flight.lifetime_hint, now);
    }
}
