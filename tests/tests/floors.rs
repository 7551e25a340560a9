//! The benchmark's floor programs (`gateway-ebpf/src/bin/floors.rs`) load, and each does its
//! class's least work: what `bench floors` divides the classifier's time by must be that work
//! and no less.

use gateway_common::testing::HelloBuilder;
use gateway_tests::{
    floors::{Floor, Floors},
    frames::Frame,
    have_root,
};

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

const INVITE: &[u8] =
    b"INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2;branch=z9hG4bK1\r\n\
Call-ID: c1@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";

/// Another INVITE from the same 4-tuple, different in its first bytes (the keyed floors hash as
/// many bytes as a transaction key covers from the message's start: finding the fields is the
/// classifier's parser's work, not the floor's).
const OTHER_INVITE: &[u8] =
    b"INVITE sip:eve@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2;branch=z9hG4bK1\r\n\
Call-ID: c1@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";

#[test]
fn the_floors_look_up_what_they_learnt_and_key_sip_by_its_bytes() {
    if !have_root("the_floors_look_up_what_they_learnt_and_key_sip_by_its_bytes") {
        return;
    }
    let floors = Floors::load();
    // No service: passed; a service's packet goes on past the port lookup.
    let other = Frame::udp(9999, INVITE).build();
    let sip = Frame::udp(5060, INVITE).build();
    assert_eq!(floors.run(Floor::NonService, &other, 1).0, XDP_PASS);
    assert_eq!(floors.run(Floor::NonService, &sip, 1).0, XDP_DROP);
    // A flow or transaction is unknown on its first run, known from the second.
    let data = Frame::tcp(443, &[23, 3, 3, 0, 4, 1, 2, 3, 4]).build();
    for (floor, frame) in [
        (Floor::Flow, &data),
        (Floor::SipRetransmission, &sip),
        (Floor::SipRetransmissionKeyed, &sip),
    ] {
        assert_eq!(floors.run(floor, frame, 1).0, XDP_DROP, "{floor:?} first");
        assert_eq!(floors.run(floor, frame, 1).0, XDP_PASS, "{floor:?} again");
    }
    // The keyed floor's transaction is its key's, so other bytes are another transaction; the
    // plain floor's is its 4-tuple's, which the two share.
    let other_request = Frame::udp(5060, OTHER_INVITE).build();
    assert_eq!(
        floors
            .run(Floor::SipRetransmissionKeyed, &other_request, 1)
            .0,
        XDP_DROP
    );
    assert_eq!(
        floors.run(Floor::SipRetransmission, &other_request, 1).0,
        XDP_PASS
    );
}

#[test]
fn the_new_work_floors_insert_a_fresh_entry_each_run_and_the_kept_ones_a_unit_too() {
    if !have_root("the_new_work_floors_insert_a_fresh_entry_each_run_and_the_kept_ones_a_unit_too")
    {
        return;
    }
    const RUNS: u32 = 100;
    let mut floors = Floors::load();
    let hello = Frame::tcp(443, &HelloBuilder::default().build()).build();
    let resuming = Frame::tcp(
        443,
        &HelloBuilder {
            psk_identity: Some(vec![9; 32]),
            ..HelloBuilder::tls13()
        }
        .build(),
    )
    .build();
    let invite = Frame::udp(5060, INVITE).build();
    for (floor, frame, unit) in [
        (Floor::NewHello, &hello, false),
        (Floor::NewHelloUnit, &hello, true),
        (Floor::ResumedHello, &resuming, false),
        (Floor::ResumedHelloUnit, &resuming, true),
        (Floor::NewInvite, &invite, false),
        (Floor::NewInviteKeyed, &invite, true),
    ] {
        floors.forget();
        assert_eq!(floors.held(), (0, 0), "{floor:?}: emptied");
        assert_eq!(floors.run(floor, frame, RUNS).0, XDP_PASS, "{floor:?}");
        let pending = if unit { RUNS as usize } else { 0 };
        assert_eq!(floors.held(), (RUNS as usize, pending), "{floor:?}");
    }
    // A resumed hello's floor needs its PSK identity: a hello without one is not its work.
    assert_eq!(floors.run(Floor::ResumedHello, &hello, 1).0, XDP_DROP);
}
