//! The server's side of a handshake, read where its packets leave the host (the egress
//! program): what its ServerHello says about the offer it was made, and what its TLS 1.2
//! second flight issues.
//!
//! A server the gateway does not terminate (nginx, HAProxy, Envoy) tells the NIC nothing but
//! its packets. In TLS 1.2 they say enough in clear:
//! - the ServerHello either resumes the offered session (its next message is the
//!   ChangeCipherSpec, or a NewSessionTicket renewing the ticket) or starts a full handshake
//!   (a Certificate, ServerKeyExchange, CertificateRequest or ServerHelloDone follows);
//! - after a full handshake, the server's second flight (an optional NewSessionTicket, then
//!   its ChangeCipherSpec) is sent only once the server verified the client's Finished: the
//!   session id of the ServerHello and the ticket of that flight are then sessions the server
//!   really issued, to a client that really completed a handshake.
//!
//! In TLS 1.3 the ServerHello shows whether a PSK was accepted (its `pre_shared_key`
//! extension); tickets travel encrypted.
//!
//! Everything here reads at fixed or bounded offsets from the start of a segment's payload and
//! answers [`Answer::Unknown`] (or no ticket) when a message is not where it should be: the
//! caller then grants nothing.

use super::{KEY_LEN, MAX_OFFER, digest_byte, digest_finish, digest_start, tag::TAIL_LEN};
use crate::bytes::PacketBytes;

/// Record content type: ChangeCipherSpec.
pub const RECORD_CCS: u8 = 20;
/// Record content type: alert.
pub const RECORD_ALERT: u8 = 21;
/// Record content type: handshake.
pub const RECORD_HANDSHAKE: u8 = 22;

/// Handshake message types this module reads.
const HS_SERVER_HELLO: u8 = 2;
const HS_NEW_SESSION_TICKET: u8 = 4;
const HS_FINISHED: u8 = 20;

/// Extensions walked in a ServerHello, at most (a ServerHello carries a handful).
const MAX_EXTENSIONS: usize = 16;

/// The first eight bytes of the random of a HelloRetryRequest (RFC 8446 §4.1.3).
const RETRY_RANDOM: [u8; 8] = [0xcf, 0x21, 0xad, 0x74, 0xe5, 0x9a, 0x61, 0x11];

/// What a server's first flight answers to the hello it got.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// Not a ServerHello where one was expected, or one that could not be read whole: nothing
    /// is concluded from it.
    Unknown,
    /// A HelloRetryRequest: the server asks for another hello, and has not judged the offer.
    Retry,
    /// TLS 1.2, a full handshake: the offer (if any) was not resumed.
    Tls12Full,
    /// TLS 1.2, the offered session resumed.
    Tls12Resumed,
    /// TLS 1.3 with the offered PSK accepted.
    Tls13Resumed,
    /// TLS 1.3, a full handshake: the offered PSK (if any) was not accepted.
    Tls13Full,
}

impl Answer {
    /// Whether the server did not resume what it was offered (a full handshake).
    pub const fn declined(self) -> bool {
        matches!(self, Answer::Tls12Full | Answer::Tls13Full)
    }
}

/// A ServerHello read at the start of a segment's payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerHello {
    /// What it answers.
    pub answer: Answer,
    /// Packet offset of its session id.
    pub sid_at: usize,
    /// Length of its session id (0 to 32).
    pub sid_len: u8,
}

impl ServerHello {
    const UNKNOWN: ServerHello = ServerHello {
        answer: Answer::Unknown,
        sid_at: 0,
        sid_len: 0,
    };
}

#[inline(always)]
fn byte<B: PacketBytes>(b: &B, at: usize) -> Option<u8> {
    let mut x = [0u8; 1];
    b.read(at, &mut x).then_some(x[0])
}

#[inline(always)]
fn u16_at<B: PacketBytes>(b: &B, at: usize) -> Option<u16> {
    let mut x = [0u8; 2];
    b.read(at, &mut x).then_some(u16::from_be_bytes(x))
}

#[inline(always)]
fn u24_at<B: PacketBytes>(b: &B, at: usize) -> Option<u32> {
    let mut x = [0u8; 3];
    b.read(at, &mut x)
        .then_some(u32::from_be_bytes([0, x[0], x[1], x[2]]))
}

/// A record header at `at`: its content type and length.
#[inline(always)]
fn record<B: PacketBytes>(b: &B, at: usize) -> Option<(u8, usize)> {
    let kind = byte(b, at)?;
    let len = u16_at(b, at + 3)?;
    Some((kind, len as usize))
}

/// Reads the ServerHello that the segment payload at `at` starts with.
pub fn server_hello<B: PacketBytes>(b: &B, at: usize) -> ServerHello {
    read_server_hello(b, at).unwrap_or(ServerHello::UNKNOWN)
}

fn read_server_hello<B: PacketBytes>(b: &B, at: usize) -> Option<ServerHello> {
    let (kind, rec_len) = record(b, at)?;
    if kind != RECORD_HANDSHAKE || byte(b, at + 5)? != HS_SERVER_HELLO {
        return None;
    }
    let hs_len = u24_at(b, at + 6)? as usize;
    // Version (2), random (32), session id length (1), the id, suite (2), compression (1).
    let body = at + 9;
    let msg_end = body + hs_len;
    let rec_end = at + 5 + rec_len;
    if hs_len < 38 || msg_end > rec_end {
        return None;
    }
    let mut random = [0u8; 8];
    if !b.read(body + 2, &mut random) {
        return None;
    }
    let sid_len = byte(b, body + 34)?;
    if sid_len > 32 {
        return None;
    }
    let sid_at = body + 35;
    let mut cursor = sid_at + sid_len as usize + 3;
    if cursor > msg_end {
        return None;
    }
    let hello = |answer| {
        Some(ServerHello {
            answer,
            sid_at,
            sid_len,
        })
    };
    if random == RETRY_RANDOM {
        return hello(Answer::Retry);
    }
    // Extensions: supported_versions says TLS 1.3, pre_shared_key an accepted PSK.
    let (mut tls13, mut psk) = (false, false);
    if cursor < msg_end {
        let ext_len = u16_at(b, cursor)? as usize;
        cursor += 2;
        if cursor + ext_len != msg_end {
            return None;
        }
        for _ in 0..MAX_EXTENSIONS {
            if cursor >= msg_end {
                break;
            }
            let ext = u16_at(b, cursor)?;
            let len = u16_at(b, cursor + 2)? as usize;
            match ext {
                43 if len == 2 => tls13 = u16_at(b, cursor + 4)? == 0x0304,
                41 => psk = true,
                _ => {}
            }
            cursor += 4 + len;
        }
        if cursor != msg_end {
            return None;
        }
    }
    if tls13 {
        return hello(if psk {
            Answer::Tls13Resumed
        } else {
            Answer::Tls13Full
        });
    }
    // TLS 1.2: the message after the ServerHello, in the same record or the next.
    let next = if msg_end < rec_end {
        byte(b, msg_end)?
    } else {
        match record(b, rec_end)? {
            (RECORD_CCS, _) => return hello(Answer::Tls12Resumed),
            (RECORD_HANDSHAKE, _) => byte(b, rec_end + 5)?,
            _ => return None,
        }
    };
    match next {
        HS_NEW_SESSION_TICKET | HS_FINISHED => hello(Answer::Tls12Resumed),
        // Certificate, ServerKeyExchange, CertificateRequest, ServerHelloDone.
        11..=14 => hello(Answer::Tls12Full),
        _ => None,
    }
}

/// A TLS 1.2 server's second flight, read at the start of a segment's payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SecondFlight {
    /// The flight's ChangeCipherSpec is in the segment: the server verified the client's
    /// Finished and completed the handshake.
    pub ccs: bool,
    /// Packet offset of the ticket of its NewSessionTicket (with `ticket_len`), 0 for none.
    pub ticket_at: usize,
    /// Length of that ticket.
    pub ticket_len: u16,
    /// The ticket's lifetime hint, seconds (0: unspecified).
    pub lifetime_hint: u32,
}

/// Reads the segment payload at `at` as the start of a TLS 1.2 server's second flight:
/// `[NewSessionTicket] ChangeCipherSpec`. A ticket is reported only with its ChangeCipherSpec
/// in the same segment, and only when its message fills its record exactly.
pub fn second_flight<B: PacketBytes>(b: &B, at: usize) -> SecondFlight {
    let none = SecondFlight::default();
    let Some((kind, rec_len)) = record(b, at) else {
        return none;
    };
    if kind == RECORD_CCS {
        return SecondFlight {
            ccs: change_cipher_spec(b, at),
            ..none
        };
    }
    if kind != RECORD_HANDSHAKE || byte(b, at + 5) != Some(HS_NEW_SESSION_TICKET) {
        return none;
    }
    let (Some(hs_len), Some(lifetime_hint), Some(ticket_len)) =
        (u24_at(b, at + 6), read_u32(b, at + 9), u16_at(b, at + 13))
    else {
        return none;
    };
    let ccs = change_cipher_spec(b, at + 5 + rec_len);
    if !ccs {
        return none;
    }
    let whole = hs_len as usize == 6 + ticket_len as usize && rec_len == 4 + hs_len as usize;
    if !whole {
        return SecondFlight { ccs, ..none };
    }
    SecondFlight {
        ccs,
        ticket_at: at + 15,
        ticket_len,
        lifetime_hint,
    }
}

/// Whether a whole ChangeCipherSpec record is at `at`.
#[inline(always)]
fn change_cipher_spec<B: PacketBytes>(b: &B, at: usize) -> bool {
    matches!(record(b, at), Some((RECORD_CCS, 1))) && byte(b, at + 5) == Some(1)
}

#[inline(always)]
fn read_u32<B: PacketBytes>(b: &B, at: usize) -> Option<u32> {
    let mut x = [0u8; 4];
    b.read(at, &mut x).then_some(u32::from_be_bytes(x))
}

/// Feeds the `n` bytes at `at` into `d` (at most `CHUNKS` eight-byte steps and seven bytes:
/// the bound the verifier follows), eight at a time while eight are left. `false` when any of
/// them cannot be read.
#[inline(always)]
fn digest_run<B: PacketBytes, const CHUNKS: usize>(
    b: &B,
    at: usize,
    n: usize,
    d: &mut [u64; 2],
) -> bool {
    let mut done = 0;
    for _ in 0..CHUNKS {
        if done + 8 > n {
            break;
        }
        let mut w = [0u8; 8];
        if !b.read(at + done, &mut w) {
            return false;
        }
        for x in w {
            digest_byte(d, x);
        }
        done += 8;
    }
    for _ in 0..8 {
        if done >= n {
            break;
        }
        let mut x = [0u8; 1];
        if !b.read(at + done, &mut x) {
            return false;
        }
        digest_byte(d, x[0]);
        done += 1;
    }
    done == n
}

/// The datapath's key of the session id of `len` bytes at `at`, as a hello offering it gets
/// ([`super::offer_digest`]); `None` for an id shorter than [`KEY_LEN`] (never verified).
pub fn session_id_key<B: PacketBytes>(b: &B, at: usize, len: usize) -> Option<[u8; KEY_LEN]> {
    if !(KEY_LEN..=32).contains(&len) {
        return None;
    }
    let mut d = digest_start(len as u32);
    digest_run::<B, 4>(b, at, len, &mut d).then(|| digest_finish(&d))
}

/// The datapath's key of the ticket of `len` bytes at `at`, as a hello offering it gets
/// ([`super::tag::ticket_key`]); `None` for a ticket the datapath never verifies.
pub fn ticket_key_at<B: PacketBytes>(b: &B, at: usize, len: usize) -> Option<[u8; KEY_LEN]> {
    if !(super::tag::MIN_TICKET..=MAX_OFFER as usize).contains(&len) {
        return None;
    }
    let mut d = digest_start(len as u32);
    digest_run::<B, { MAX_OFFER as usize / 8 }>(b, at, len - TAIL_LEN, &mut d)
        .then(|| digest_finish(&d))
}

#[cfg(test)]
mod tests;
