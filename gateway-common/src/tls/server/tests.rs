use alloc::{vec, vec::Vec};

use super::*;
use crate::{
    bytes::SliceBytes,
    tls::{Offer, issued_key, tag::ticket_key},
};

/// Packet bytes before the payload in these tests (as an IPv4 TCP segment's headers would be).
const AT: usize = 54;

fn handshake(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![kind];
    m.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    m.extend_from_slice(body);
    m
}

fn record(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut r = vec![kind, 3, 3];
    r.extend_from_slice(&(body.len() as u16).to_be_bytes());
    r.extend_from_slice(body);
    r
}

fn server_hello_body(random: [u8; 32], sid: &[u8], exts: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut b = vec![3, 3];
    b.extend_from_slice(&random);
    b.push(sid.len() as u8);
    b.extend_from_slice(sid);
    b.extend_from_slice(&[0xc0, 0x2f, 0]);
    let mut e = Vec::new();
    for (t, v) in exts {
        e.extend_from_slice(&t.to_be_bytes());
        e.extend_from_slice(&(v.len() as u16).to_be_bytes());
        e.extend_from_slice(v);
    }
    if !exts.is_empty() {
        b.extend_from_slice(&(e.len() as u16).to_be_bytes());
        b.extend_from_slice(&e);
    }
    b
}

fn segment(payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; AT];
    p.extend_from_slice(payload);
    p
}

fn read(payload: &[u8]) -> ServerHello {
    let p = segment(payload);
    server_hello(&SliceBytes(&p), AT)
}

const SID: [u8; 32] = [0xab; 32];
const RENEG: (u16, Vec<u8>) = (0xff01, Vec::new());

fn hello12(sid: &[u8]) -> Vec<u8> {
    record(
        22,
        &handshake(
            2,
            &server_hello_body([7; 32], sid, &[RENEG, (0x0017, vec![])]),
        ),
    )
}

#[test]
fn a_tls12_full_handshake_is_told_by_the_certificate_after_the_hello() {
    let mut flight = hello12(&SID);
    flight.extend(record(22, &handshake(11, &[0; 40])));
    let h = read(&flight);
    assert_eq!(h.answer, Answer::Tls12Full);
    assert_eq!(h.sid_len, 32);
    let p = segment(&flight);
    let key = session_id_key(&SliceBytes(&p), h.sid_at, h.sid_len as usize);
    assert_eq!(
        key,
        issued_key(Offer::SessionId, &SID),
        "the key an offer of it gets"
    );
    // The same messages in one record.
    let mut one = handshake(2, &server_hello_body([7; 32], &SID, &[RENEG]));
    one.extend(handshake(11, &[0; 40]));
    assert_eq!(read(&record(22, &one)).answer, Answer::Tls12Full);
    // No extensions at all.
    let mut bare = record(22, &handshake(2, &server_hello_body([7; 32], &SID, &[])));
    bare.extend(record(22, &handshake(14, &[])));
    assert_eq!(read(&bare).answer, Answer::Tls12Full);
}

#[test]
fn a_tls12_resumption_is_told_by_what_follows_the_hello() {
    let mut ccs = hello12(&SID);
    ccs.extend(record(20, &[1]));
    assert_eq!(read(&ccs).answer, Answer::Tls12Resumed);
    let mut renewed = hello12(&SID);
    renewed.extend(record(22, &handshake(4, &[0; 60])));
    assert_eq!(read(&renewed).answer, Answer::Tls12Resumed);
}

#[test]
fn tls13_answers_are_told_by_the_psk_extension() {
    let versions = (43u16, vec![3, 4]);
    let full = record(
        22,
        &handshake(
            2,
            &server_hello_body([7; 32], &SID, &[versions.clone(), (51, vec![0; 36])]),
        ),
    );
    assert_eq!(read(&full).answer, Answer::Tls13Full);
    let resumed = record(
        22,
        &handshake(
            2,
            &server_hello_body([7; 32], &SID, &[versions.clone(), (41, vec![0, 0])]),
        ),
    );
    assert_eq!(read(&resumed).answer, Answer::Tls13Resumed);
    let mut random = [7u8; 32];
    random[..8].copy_from_slice(&RETRY_RANDOM);
    let retry = record(
        22,
        &handshake(2, &server_hello_body(random, &SID, &[versions])),
    );
    assert_eq!(read(&retry).answer, Answer::Retry);
}

#[test]
fn anything_else_concludes_nothing() {
    let mut flight = hello12(&SID);
    flight.extend(record(22, &handshake(11, &[0; 40])));
    // Every cut short of the next message's type.
    let need = flight.len() - 40 - 3;
    for cut in 0..need {
        assert_eq!(read(&flight[..cut]).answer, Answer::Unknown, "cut at {cut}");
    }
    assert_eq!(read(&flight[..need]).answer, Answer::Tls12Full);
    // Not a ServerHello, or not a handshake record.
    let mut other = flight.clone();
    other[5] = 1;
    assert_eq!(read(&other).answer, Answer::Unknown);
    let mut app = flight.clone();
    app[0] = 23;
    assert_eq!(read(&app).answer, Answer::Unknown);
    // A session id longer than 32 bytes; extensions that overrun the message.
    let mut long = flight.clone();
    long[5 + 4 + 34] = 33;
    assert_eq!(read(&long).answer, Answer::Unknown);
    let mut overrun = flight.clone();
    let ext_len_at = 5 + 4 + 35 + 32 + 3;
    overrun[ext_len_at + 1] += 1;
    assert_eq!(read(&overrun).answer, Answer::Unknown);
    // A message after the hello that no server sends there.
    let mut odd = hello12(&SID);
    odd.extend(record(22, &handshake(1, &[0; 40])));
    assert_eq!(read(&odd).answer, Answer::Unknown);
}

fn ticket_flight(ticket: &[u8], ccs: bool) -> Vec<u8> {
    let mut nst = 7200u32.to_be_bytes().to_vec();
    nst.extend_from_slice(&(ticket.len() as u16).to_be_bytes());
    nst.extend_from_slice(ticket);
    let mut f = record(22, &handshake(4, &nst));
    if ccs {
        f.extend(record(20, &[1]));
    }
    f.extend(record(22, &[0; 40]));
    f
}

#[test]
fn a_second_flight_gives_its_ticket_with_its_change_cipher_spec() {
    let ticket: Vec<u8> = (0..=200u8).collect();
    let p = segment(&ticket_flight(&ticket, true));
    let f = second_flight(&SliceBytes(&p), AT);
    assert!(f.ccs);
    assert_eq!(f.lifetime_hint, 7200);
    assert_eq!(f.ticket_len as usize, ticket.len());
    let key = ticket_key_at(&SliceBytes(&p), f.ticket_at, f.ticket_len as usize);
    assert_eq!(key, ticket_key(&ticket), "the key an offer of it gets");
    assert_eq!(key, issued_key(Offer::Ticket, &ticket));
    // Every length from the shortest verified up to the longest keys as an offer would.
    for len in [32usize, 33, 39, 40, 41, 47, 48, 255, 1024] {
        let t: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
        let p = segment(&ticket_flight(&t, true));
        let f = second_flight(&SliceBytes(&p), AT);
        let key = ticket_key_at(&SliceBytes(&p), f.ticket_at, f.ticket_len as usize);
        assert_eq!(key, ticket_key(&t), "{len}");
    }
    // A ChangeCipherSpec alone.
    let p = segment(&record(20, &[1]));
    assert_eq!(
        second_flight(&SliceBytes(&p), AT),
        SecondFlight {
            ccs: true,
            ..SecondFlight::default()
        }
    );
}

#[test]
fn a_ticket_without_its_change_cipher_spec_or_whole_record_is_not_given() {
    let ticket = [9u8; 64];
    let p = segment(&ticket_flight(&ticket, false));
    assert_eq!(second_flight(&SliceBytes(&p), AT), SecondFlight::default());
    // The ticket's length disagreeing with its message's.
    let mut f = ticket_flight(&ticket, true);
    f[5 + 4 + 4 + 1] -= 1;
    let p = segment(&f);
    let got = second_flight(&SliceBytes(&p), AT);
    assert!(got.ccs && got.ticket_at == 0, "{got:?}");
    // Cut anywhere before the ChangeCipherSpec's end.
    let f = ticket_flight(&ticket, true);
    let ccs_end = 5 + 4 + 6 + 64 + 6;
    for cut in 0..ccs_end {
        let p = segment(&f[..cut]);
        assert_eq!(
            second_flight(&SliceBytes(&p), AT),
            SecondFlight::default(),
            "cut at {cut}"
        );
    }
    // A short ticket is never a key; nor a short session id.
    let p = segment(&[0u8; 64]);
    assert_eq!(ticket_key_at(&SliceBytes(&p), AT, 31), None);
    assert_eq!(session_id_key(&SliceBytes(&p), AT, 15), None);
    assert_eq!(session_id_key(&SliceBytes(&p), AT, 33), None);
}

#[test]
fn a_value_digest_fed_byte_by_byte_is_the_ticket_key() {
    use crate::tls::ValueDigest;
    for len in [32usize, 33, 100, 1024] {
        let t: alloc::vec::Vec<u8> = (0..len).map(|i| (i * 11) as u8).collect();
        let mut d = ValueDigest::start(len as u32);
        t[..len - crate::tls::tag::TAIL_LEN]
            .iter()
            .for_each(|&b| d.byte(b));
        assert_eq!(Some(d.finish()), ticket_key(&t), "{len}");
    }
}
