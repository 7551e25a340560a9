//! A million mutated TLS and SIP packets through the loaded program (BPF_PROG_TEST_RUN), seeded
//! from real captures: none buys a privilege it did not earn (issue 10). Deterministic: a fixed
//! seed, the same packets every run.
//!
//! The program's verdict is the oracle, per packet. tls-new is closed (backlog 0), so a hello
//! passes only as tls-resumed (a key the server issued), as part of a flow, or as other, and the
//! userspace model must agree. sip-original and sip-retransmission are closed (rate 0), so no
//! INVITE is ever admitted, and no dialog exists (nothing leaves through egress): no request may
//! pass at all, whatever its method, tags or marker; only responses are exempt. And nothing that
//! arrives counts a completion.
//!
//! Each packet takes one of several shapes in turn (whole, IP-fragmented, a tiny first
//! fragment, IPv6 behind long header chains, a hello in a SYN), and every SIP datagram is sent
//! twice.
//!
//! (The campaign found one: a request of any method with `CSeq: 1 INVITE`, refused, was still
//! recorded as a transaction, and an ACK or CANCEL of it then passed as exempt. An INVITE
//! transaction now earns its ACK and CANCEL only once admitted.)

use gateway_common::{
    Class,
    bytes::SliceBytes,
    maps::{IssuedKey, IssuedValue},
    sip::{MessageKind, parse_sip},
    testing::HelloBuilder,
    tls::{Offer, issued_key},
};
use gateway_tests::{
    frames::{Frame, ext},
    have_root,
    testrun::{Hook, TestProgram, expected_class, expected_refused},
    tls::{capture_hello, s_client},
};

const PACKETS: usize = 1_000_000;
/// TLS packets between two clearings of the program's state (below the pending table's size).
const BATCH: usize = 60_000;
const XDP_PASS: u32 = 2;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// One to four random bytes of `payload` changed (its length kept: the frame stays a packet of
/// the same connection).
fn mutate(rng: &mut Rng, payload: &[u8]) -> Vec<u8> {
    let mut p = payload.to_vec();
    for _ in 0..1 + rng.next() % 4 {
        let at = (rng.next() as usize) % p.len();
        p[at] = rng.next() as u8;
    }
    p
}

/// The shapes the campaign's packets take in turn: whole (twice as often as any other), a
/// first fragment, a tiny first fragment (8 bytes of the transport header), IPv6 behind seven
/// destination-options headers (which the parser follows), and behind nine (which it does not).
fn shaped(frame: Frame, turn: usize) -> Vec<u8> {
    match turn % 6 {
        0 | 1 => frame.build(),
        2 => frame.ipv4_frag(0x2000).build(),
        3 => {
            let mut f = frame.ipv4_frag(0x2000).build();
            f.truncate(14 + 20 + 8);
            f[14 + 2..14 + 4].copy_from_slice(&28u16.to_be_bytes());
            f
        }
        4 => frame.ipv6(&[(ext::DEST_OPTS, 8); 7]).build(),
        _ => frame.ipv6(&[(ext::DEST_OPTS, 8); 9]).build(),
    }
}

fn policy(prog: &mut TestProgram, class: Class, p: gateway_common::policy::Policy) {
    prog.maps.set_policy(class, p.to_map()).unwrap();
}

const SIP_SEEDS: [&str; 7] = [
    "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-1\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\nTo: <sip:service@10.99.0.1:5060>;tag=s\r\n\
Call-ID: 1@10.99.0.2\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n",
    "INVITE sip:service@10.99.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-1\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\nTo: <sip:service@10.99.0.1:5060>\r\n\
Call-ID: 1@10.99.0.2\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n",
    "ACK sip:service@10.99.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-1\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\nTo: <sip:service@10.99.0.1:5060>;tag=s\r\n\
Call-ID: 1@10.99.0.2\r\nCSeq: 1 ACK\r\nContent-Length: 0\r\n\r\n",
    "CANCEL sip:service@10.99.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-1\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\nTo: <sip:service@10.99.0.1:5060>\r\n\
Call-ID: 1@10.99.0.2\r\nCSeq: 1 CANCEL\r\nContent-Length: 0\r\n\r\n",
    "BYE sip:service@10.99.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-2\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\nTo: <sip:service@10.99.0.1:5060>;tag=s\r\n\
Call-ID: 1@10.99.0.2\r\nCSeq: 2 BYE\r\nContent-Length: 0\r\n\r\n",
    "INVITE sip:service@10.99.0.1:5060;x-retransmit SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-3\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\nTo: <sip:service@10.99.0.1:5060>;tag=s\r\n\
Call-ID: 3@10.99.0.2\r\nCSeq: 2 INVITE\r\nContent-Length: 0\r\n\r\n",
    "OPTIONS sip:service@10.99.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-4\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\nTo: <sip:service@10.99.0.1:5060>\r\n\
Call-ID: 4@10.99.0.2\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n",
];

#[test]
fn a_million_mutated_packets_buy_no_privilege() {
    if !have_root("a_million_mutated_packets") {
        return;
    }
    let mut prog = TestProgram::new();
    // Seeds: hellos captured from openssl (TLS 1.2 and 1.3), and hellos offering every kind of
    // resumption, half of them with keys the "server" issued (published), half forged.
    let mut tls_seeds: Vec<Vec<u8>> = ["-tls1_2", "-tls1_3"]
        .iter()
        .map(|v| capture_hello(|addr| drop(s_client(&[], &addr, &[v]))))
        .collect();
    let mut issued = Vec::new();
    let room = IssuedValue {
        limit: gateway_common::maps::MAX_RESUME_LIMIT,
        // No rate binds: these keys stand for many clients.
        per_minute: u32::MAX,
        ..Default::default()
    };
    for (n, published) in [(1u8, true), (2, false), (3, true), (4, false)] {
        let value: Vec<u8> = (0..48)
            .map(|i| n.wrapping_mul(37).wrapping_add(i))
            .collect();
        let builders = [
            HelloBuilder {
                session_id: value[..32].to_vec(),
                ..Default::default()
            },
            HelloBuilder {
                ticket: Some(value.clone()),
                ..Default::default()
            },
            HelloBuilder {
                psk_identity: Some(value.clone()),
                ..HelloBuilder::tls13()
            },
        ];
        for b in builders {
            tls_seeds.push(b.build());
        }
        if published {
            for (kind, v) in [
                (Offer::SessionId, &value[..32]),
                (Offer::Ticket, &value[..]),
            ] {
                let key = issued_key(kind, v).unwrap();
                issued.push(key);
                prog.maps.add_issued(IssuedKey { key }, room).unwrap();
            }
        }
    }
    // The privileges under test: tls-new, sip-original and sip-retransmission closed.
    let closed_backlog = gateway_common::policy::Policy {
        backlog: Some(0),
        ..Default::default()
    };
    let closed_rate = gateway_common::policy::Policy {
        rate: Some(0),
        ..Default::default()
    };
    policy(&mut prog, Class::TlsNew, closed_backlog);
    policy(&mut prog, Class::SipOriginal, closed_rate);
    policy(&mut prog, Class::SipRetransmission, closed_rate);

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let (mut resumed, mut tls_refused, mut responses) = (0u64, 0u64, 0u64);
    for i in 0..PACKETS {
        let n = i / 2;
        if i % 2 == 0 {
            // A hello on a connection of its own (state forgotten every BATCH hellos).
            if n % BATCH == 0 {
                prog.forget();
                policy(&mut prog, Class::TlsNew, closed_backlog);
            }
            if n % 500 == 0 {
                // The resumed hellos of a batch are never answered: their places of the keys
                // are given back by hand (the limit on places is tested on its own).
                for key in &issued {
                    prog.maps.add_issued(IssuedKey { key: *key }, room).unwrap();
                }
            }
            let seed = &tls_seeds[n % tls_seeds.len()];
            let payload = mutate(&mut rng, seed);
            let mut frame = Frame::tcp(443, &payload).from_port(1024 + (n % BATCH) as u16);
            // Every seventh hello rides in a SYN (TCP Fast Open).
            if n % 7 == 3 {
                frame = frame.flags(0x02);
            }
            let frame = shaped(frame, n / tls_seeds.len());
            let action = prog.run(Hook::Xdp, &frame, 1).0;
            let model = expected_class(&frame, &issued);
            if action == XDP_PASS {
                assert!(
                    matches!(model, Class::TlsResumed | Class::TlsFlow | Class::Other),
                    "packet {i}: passed, but the model says {model:?}: {frame:02x?}"
                );
                assert!(!expected_refused(&frame), "packet {i}: {frame:02x?}");
                resumed += u64::from(model == Class::TlsResumed);
            } else {
                assert!(
                    model == Class::TlsNew || expected_refused(&frame),
                    "packet {i}: refused, but the model says {model:?}: {frame:02x?}"
                );
                tls_refused += 1;
            }
        } else {
            let seed = SIP_SEEDS[n % SIP_SEEDS.len()].as_bytes();
            let payload = mutate(&mut rng, seed);
            let info = parse_sip(&SliceBytes(&payload), payload.len());
            let frame = shaped(Frame::udp(5060, &payload), n / SIP_SEEDS.len());
            // Every datagram is sent twice: a copy of a refused request buys nothing either.
            for copy in 0..2 {
                let action = prog.run(Hook::Xdp, &frame, 1).0;
                if action == XDP_PASS {
                    assert_eq!(
                        info.kind(),
                        MessageKind::Response,
                        "packet {i} (copy {copy}): a request passed: {info:?}"
                    );
                    responses += 1;
                }
            }
        }
    }
    // Nothing that arrived counted a completion.
    let state = prog.maps.class_state().unwrap();
    assert!(state.iter().all(|s| s.completed == 0), "{state:?}");
    assert_eq!(prog.counters().tls.completions, 0);
    eprintln!(
        "{PACKETS} packets: {resumed} hellos resumed with a published key, {tls_refused} refused \
         as tls-new, {responses} SIP responses passed and no request"
    );
    // The campaign exercised both sides of each check.
    assert!(
        resumed > 10_000 && tls_refused > 100_000 && responses > 1_000,
        "{resumed} {tls_refused} {responses}"
    );
}
