use alloc::vec::Vec;

use super::*;
use crate::testing::HelloBuilder;

fn key(fill: u8) -> Vec<u8> {
    (0..32).map(|i| fill.wrapping_add(i)).collect()
}

/// Feeds `data` split at the given points, as consecutive segments.
fn feed_split(data: &[u8], cuts: &[usize]) -> HelloState {
    let mut st = HelloState::default();
    let mut start = 0;
    for &end in cuts.iter().chain([&data.len()]) {
        st.feed(&data[start..end], start as u32);
        start = end;
    }
    st
}

#[test]
fn verdicts() {
    let cases: [(HelloBuilder, Verdict, Offer); 7] = [
        (HelloBuilder::default(), Verdict::New, Offer::None),
        (
            HelloBuilder {
                session_id: key(1),
                ..Default::default()
            },
            Verdict::Offer,
            Offer::SessionId,
        ),
        (
            HelloBuilder {
                session_id: key(1),
                ticket: Some(key(2)),
                ..Default::default()
            },
            Verdict::Offer,
            Offer::Ticket,
        ),
        (
            HelloBuilder {
                ticket: Some(Vec::new()),
                ..Default::default()
            },
            Verdict::New,
            Offer::None,
        ),
        // TLS 1.3: the session id means nothing.
        (HelloBuilder::tls13(), Verdict::New, Offer::None),
        (
            HelloBuilder {
                psk_identity: Some(key(3)),
                ..HelloBuilder::tls13()
            },
            Verdict::Offer,
            Offer::Psk,
        ),
        (
            HelloBuilder {
                psk_identity: Some(key(3)),
                versions_after_key_share: true,
                ..HelloBuilder::tls13()
            },
            Verdict::Offer,
            Offer::Psk,
        ),
    ];
    for (i, (b, verdict, offer)) in cases.iter().enumerate() {
        let st = parse_hello(&b.build());
        assert_eq!(st.verdict(), *verdict, "case {i}: {st:?}");
        assert_eq!(st.offer(), *offer, "case {i}");
    }
}

#[test]
fn an_offer_key_is_the_digest_of_the_whole_value_never_a_prefix() {
    let key_of = |b: HelloBuilder| parse_hello(&b.build()).offer_key();
    let sid = key(9);
    assert_eq!(
        key_of(HelloBuilder {
            session_id: sid.clone(),
            ..Default::default()
        }),
        Some(offer_digest(&sid))
    );
    let ticket: alloc::vec::Vec<u8> = (0..200).map(|i| i as u8).collect();
    // A ticket's key leaves its clear tail out (`tag`): all of the rest, never a prefix.
    let ticket_key = tag::ticket_key(&ticket);
    assert_eq!(issued_key(Offer::Ticket, &ticket), ticket_key);
    assert_eq!(issued_key(Offer::SessionId, &sid), Some(offer_digest(&sid)));
    assert_eq!(
        key_of(HelloBuilder {
            ticket: Some(ticket.clone()),
            ..Default::default()
        }),
        ticket_key
    );
    assert_eq!(
        key_of(HelloBuilder {
            psk_identity: Some(ticket.clone()),
            ..HelloBuilder::tls13()
        }),
        ticket_key
    );
    let mut body = ticket.clone();
    body[183] ^= 1;
    assert_ne!(tag::ticket_key(&body), ticket_key);
    // Too short to carry a tail after a key's worth of bytes: no key.
    assert_eq!(
        key_of(HelloBuilder {
            ticket: Some(ticket[..tag::MIN_TICKET - 1].to_vec()),
            ..Default::default()
        }),
        None
    );
    // The same first 16 bytes and anything after them: another key (the prefix of a TLS 1.2
    // session id is public, it travels in clear in the ServerHello).
    let mut forged = sid.clone();
    forged[20] ^= 1;
    assert_ne!(offer_digest(&forged), offer_digest(&sid));
    assert_ne!(offer_digest(&sid[..31]), offer_digest(&sid));
    // Too short to be verified.
    let st = parse_hello(
        &HelloBuilder {
            session_id: key(1)[..8].to_vec(),
            ..Default::default()
        }
        .build(),
    );
    assert_eq!(st.offer(), Offer::SessionId);
    assert_eq!(st.offer_key(), None);
    // Longer than MAX_OFFER: malformed.
    let huge = alloc::vec![7u8; MAX_OFFER as usize + 1];
    let st = parse_hello(
        &HelloBuilder {
            ticket: Some(huge),
            ..Default::default()
        }
        .build(),
    );
    assert_eq!(st.verdict(), Verdict::Malformed);
}

#[test]
fn every_split_point_gives_the_same_verdict() {
    let hellos = [
        HelloBuilder {
            session_id: key(1),
            ticket: Some(key(2)),
            key_share_len: 1248,
            ..Default::default()
        },
        HelloBuilder {
            psk_identity: Some(key(3)),
            versions_after_key_share: true,
            ..HelloBuilder::tls13()
        },
    ];
    for b in &hellos {
        let data = b.build();
        assert!(data.len() > 1300, "post-quantum sized");
        let whole = parse_hello(&data);
        for cut in 1..data.len() {
            assert_eq!(feed_split(&data, &[cut]), whole, "cut at {cut}");
        }
        // Three segments.
        for cut in (1..data.len() - 1).step_by(97) {
            assert_eq!(feed_split(&data, &[cut, cut + 1]), whole, "cuts at {cut}");
        }
    }
}

#[test]
fn prefixes_are_pending_never_offers() {
    let data = HelloBuilder {
        psk_identity: Some(key(3)),
        ..HelloBuilder::tls13()
    }
    .build();
    for len in 0..data.len() {
        let st = parse_hello(&data[..len]);
        assert_eq!(st.verdict(), Verdict::Pending, "prefix {len}");
    }
}

#[test]
fn a_gap_or_overlap_between_segments_is_malformed() {
    let data = HelloBuilder::tls13().build();
    let mut st = HelloState::default();
    st.feed(&data[..100], 0);
    assert_eq!(st.verdict(), Verdict::Pending);
    st.feed(&data[150..], 150);
    assert_eq!(st.verdict(), Verdict::Malformed);
}

#[test]
fn bad_input_is_malformed_never_an_offer() {
    let good = HelloBuilder {
        psk_identity: Some(key(3)),
        ..HelloBuilder::tls13()
    }
    .build();
    let mut cases: Vec<(&str, Vec<u8>)> = Vec::new();
    // SSLv2-style hello.
    cases.push((
        "sslv2",
        alloc::vec![0x80, 0x2e, 0x01, 0x03, 0x01, 0x00, 0x15],
    ));
    cases.push(("http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()));
    let mut c = good.clone();
    c[5] = 2; // ServerHello
    cases.push(("not a client hello", c));
    let mut c = good.clone();
    c[3] = 0;
    c[4] = 40; // record shorter than the handshake message
    cases.push(("handshake across records", c));
    let mut c = good.clone();
    c[43] = 33; // session id length > 32
    cases.push(("session id too long", c));
    // Lying extensions length.
    let ext_len_at = 5 + 4 + 2 + 32 + 1 + 32 + 2 + 8 + 2;
    let mut c = good.clone();
    c[ext_len_at + 1] ^= 0x10;
    cases.push(("extensions length", c));
    // An extension whose length runs past the block.
    let mut c = good.clone();
    c[ext_len_at + 2 + 2] = 0xff;
    cases.push(("extension past the end", c));
    // pre_shared_key not last.
    let mut psk_first = HelloBuilder {
        psk_identity: Some(key(3)),
        padding_extensions: alloc::vec![],
        ..HelloBuilder::tls13()
    }
    .build();
    psk_first.extend_from_slice(&[0, 21, 0, 0]);
    let total = psk_first.len();
    // Patch record, handshake and extensions lengths for the extra empty extension.
    let rec = (total - 5) as u16;
    psk_first[3..5].copy_from_slice(&rec.to_be_bytes());
    let hs = (total - 9) as u32;
    psk_first[6..9].copy_from_slice(&hs.to_be_bytes()[1..]);
    let exts = u16::from_be_bytes([psk_first[ext_len_at], psk_first[ext_len_at + 1]]) + 4;
    psk_first[ext_len_at..ext_len_at + 2].copy_from_slice(&exts.to_be_bytes());
    cases.push(("psk not last", psk_first));
    for (name, data) in cases {
        let st = parse_hello(&data);
        assert_eq!(st.verdict(), Verdict::Malformed, "{name}: {st:?}");
        assert_eq!(st.offer_key(), None, "{name}");
    }
    // Zero-length extensions are fine.
    let st = parse_hello(
        &HelloBuilder {
            padding_extensions: alloc::vec![(0xfafa, 0), (21, 0)],
            ..HelloBuilder::tls13()
        }
        .build(),
    );
    assert_eq!(st.verdict(), Verdict::New);
}

/// xorshift64*, for reproducible mutations.
fn rng(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[test]
fn mutations_never_panic_and_splitting_never_changes_the_verdict() {
    let base = HelloBuilder {
        session_id: key(1),
        ticket: Some(key(2)),
        psk_identity: Some(key(3)),
        ..HelloBuilder::tls13()
    }
    .build();
    let mut s = 0x1234_5678_9abc_def0u64;
    for _ in 0..3000 {
        let mut data = base.clone();
        for _ in 0..1 + rng(&mut s) % 6 {
            let at = (rng(&mut s) as usize) % data.len();
            data[at] = rng(&mut s) as u8;
        }
        let whole = parse_hello(&data);
        let cut = 1 + (rng(&mut s) as usize) % (data.len() - 1);
        assert_eq!(feed_split(&data, &[cut]).verdict(), whole.verdict());
        if whole.verdict() == Verdict::Offer {
            assert!(whole.offer() != Offer::None);
        }
    }
}

/// Found by the fuzzer: PSK lengths near 64 KiB made the bounds check's u16 sums wrap.
#[test]
fn psk_lengths_near_64k_are_malformed_not_overflowing() {
    let hello = HelloBuilder {
        psk_identity: Some(key(3)),
        ..HelloBuilder::tls13()
    }
    .build();
    // The PSK extension is last: its data starts with identities(2), identity(2).
    let psk_data = hello.len() - (2 + 2 + 32 + 4 + 2 + 1 + 32);
    for (identities, identity) in [(0xffffu16, 0xfffeu16), (0xfffe, 0xfffb), (40, 0xffff)] {
        let mut h = hello.clone();
        h[psk_data..psk_data + 2].copy_from_slice(&identities.to_be_bytes());
        h[psk_data + 2..psk_data + 4].copy_from_slice(&identity.to_be_bytes());
        let st = parse_hello(&h);
        assert_eq!(
            st.verdict(),
            Verdict::Malformed,
            "{identities:#x}/{identity:#x}"
        );
        assert_eq!(st.offer_key(), None);
    }
}

#[test]
fn the_field_budget_belongs_to_the_hello_not_the_segment() {
    // Enough empty extensions to pass the budget in one hello: each costs one field. Before the
    // budget was per hello, one shot ran out of steps (malformed) while two segments got twice
    // the steps (an offer): the fuzzer's split divergence.
    for extra in [MAX_FIELDS as usize / 2, MAX_FIELDS as usize] {
        let data = HelloBuilder {
            session_id: key(1),
            padding_extensions: (0..extra).map(|i| (0xff00 + i as u16, 0)).collect(),
            ..Default::default()
        }
        .build();
        let whole = parse_hello(&data);
        let expect = if extra == MAX_FIELDS as usize {
            Verdict::Malformed
        } else {
            Verdict::Offer
        };
        assert_eq!(whole.verdict(), expect, "{extra} extensions");
        for cut in (1..data.len()).step_by(7) {
            assert_eq!(
                feed_split(&data, &[cut]),
                whole,
                "{extra} extensions, cut at {cut}"
            );
        }
    }
}

#[test]
fn a_segment_longer_than_a_window_reads_on() {
    // A post-quantum hello padded past one window, with the PSK identity beyond it: one segment
    // (as over loopback or jumbo frames) gives the offer, like any split.
    let data = HelloBuilder {
        psk_identity: Some(key(4)),
        padding_extensions: alloc::vec![(21, 1500)],
        ..HelloBuilder::tls13()
    }
    .build();
    assert!(
        data.len() > WINDOW as usize + 500,
        "the PSK lies past the first window"
    );
    let whole = parse_hello(&data);
    assert_eq!(whole.verdict(), Verdict::Offer);
    assert_eq!(whole.offer_key(), tag::ticket_key(&key(4)));
    assert_eq!(whole.ticket_tail().map(|t| &t[..]), Some(&key(4)[16..]));
    for cut in (1..data.len()).step_by(61) {
        assert_eq!(feed_split(&data, &[cut]), whole, "cut at {cut}");
    }
}

#[test]
fn a_hello_longer_than_the_cap_is_malformed_however_cut() {
    let data = HelloBuilder {
        session_id: key(1),
        padding_extensions: alloc::vec![(21, MAX_HELLO as usize)],
        ..Default::default()
    }
    .build();
    let whole = parse_hello(&data);
    assert_eq!(whole.verdict(), Verdict::Malformed);
    for cut in (1..data.len()).step_by(509) {
        assert_eq!(feed_split(&data, &[cut]), whole, "cut at {cut}");
    }
}

#[test]
fn tls13_cannot_hide_past_the_versions_followed() {
    // 0x0304 as the 17th entry, with a session id of published shape: before, the entries past
    // the 16th were skipped, the hello read as TLS 1.2 and its session id counted as an offer.
    let mut list = alloc::vec![0x0a0a; MAX_VERSIONS as usize];
    list.push(0x0304);
    let hidden = HelloBuilder {
        session_id: key(1),
        versions: Some(list),
        ..Default::default()
    }
    .build();
    assert_eq!(parse_hello(&hidden).verdict(), Verdict::Malformed);
    // Sixteen entries with 0x0304 last are followed: TLS 1.3, the session id means nothing.
    let mut list = alloc::vec![0x0a0a; MAX_VERSIONS as usize - 1];
    list.push(0x0304);
    let fits = HelloBuilder {
        session_id: key(1),
        versions: Some(list),
        ..Default::default()
    }
    .build();
    let st = parse_hello(&fits);
    assert!(st.tls13());
    assert_eq!(st.verdict(), Verdict::New);
}

#[test]
fn records_before_the_hello_never_hide_it() {
    use crate::bytes::SliceBytes;
    let hello = HelloBuilder::default().build();
    let alert = [21u8, 3, 3, 0, 2, 1, 0];
    let ccs = [20u8, 3, 3, 0, 1, 1];
    let at = |parts: &[&[u8]]| {
        let data: alloc::vec::Vec<u8> = parts.concat();
        first_records(&SliceBytes(&data), 0, data.len() as u32)
    };
    assert_eq!(at(&[&hello]).what, FIRST_HELLO);
    let r = at(&[&alert, &ccs, &hello]);
    assert_eq!((r.what, r.skip), (FIRST_HELLO, 13));
    assert_eq!(at(&[&alert]).what, FIRST_NO_HELLO_YET);
    assert_eq!(at(&[&[23, 3, 3, 0, 1, 0]]).what, FIRST_CONTINUES);
    // A TLS 1.2 client's second flight (ClientKeyExchange first), on a connection whose flow
    // entry is gone: continuing. A hello whose type byte is not yet in the segment: arriving.
    let cke = [22u8, 3, 3, 0, 6, 16, 0, 0, 2, 0xab, 0xcd];
    assert_eq!(at(&[&cke]).what, FIRST_CONTINUES);
    assert_eq!(at(&[&hello[..5]]).what, FIRST_HELLO);
    // Behind a leading record, a handshake message is judged as the hello it must be.
    assert_eq!(at(&[&alert, &cke]).what, FIRST_HELLO);
    // Data after an alert, a record cut by the segment's end, too many records, not TLS.
    assert_eq!(at(&[&alert, &[23, 3, 3, 0, 1, 0]]).what, FIRST_MALFORMED);
    assert_eq!(at(&[&[21, 3, 3, 0, 9, 1]]).what, FIRST_MALFORMED);
    assert_eq!(
        at(&[&alert, &alert, &alert, &alert, &alert, &hello]).what,
        FIRST_MALFORMED
    );
    assert_eq!(at(&[b"GET / HTTP/1.1\r\n"]).what, FIRST_MALFORMED);
}

#[test]
fn a_zeroed_state_once_started_is_a_new_one() {
    // The datapath clears the state with zero words and `start_zeroed` instead of assigning
    // `HelloState::new()` (which LLVM compiles to a byte-at-a-time memset): the same state.
    // SAFETY: every field of HelloState is an integer or an array of them.
    let mut zeroed: HelloState = unsafe { core::mem::zeroed() };
    assert_ne!(zeroed, HelloState::new());
    zeroed.start_zeroed();
    assert_eq!(zeroed, HelloState::new());
    assert_eq!(core::mem::size_of::<HelloState>() % 8, 0);
    assert!(core::mem::align_of::<HelloState>() >= 8);
}

#[test]
fn a_tickets_tail_is_kept_apart_however_the_hello_is_cut() {
    // A TLS 1.2 hello with a session id and a ticket (the ticket is the offer: its tail takes
    // the session id's place), and a TLS 1.3 one with a PSK identity.
    let ticket: Vec<u8> = (0..90).map(|i| (i * 7) as u8).collect();
    for b in [
        HelloBuilder {
            session_id: key(40),
            ticket: Some(ticket.clone()),
            ..Default::default()
        },
        HelloBuilder {
            psk_identity: Some(ticket.clone()),
            ..HelloBuilder::tls13()
        },
    ] {
        let data = b.build();
        let whole = parse_hello(&data);
        assert_eq!(whole.verdict(), Verdict::Offer);
        assert_eq!(whole.offer_key(), tag::ticket_key(&ticket));
        assert_eq!(whole.ticket_tail().map(|t| &t[..]), Some(&ticket[74..]));
        for a in 1..data.len() {
            assert_eq!(feed_split(&data, &[a]), whole, "cut at {a}");
        }
        for a in (1..data.len()).step_by(5) {
            for c in (a + 1..data.len()).step_by(3) {
                assert_eq!(feed_split(&data, &[a, c]), whole, "cut at {a}, {c}");
            }
        }
    }
    // A session id offer has no tail.
    let st = parse_hello(
        &HelloBuilder {
            session_id: key(3),
            ..Default::default()
        }
        .build(),
    );
    assert_eq!(st.offer(), Offer::SessionId);
    assert_eq!(st.ticket_tail(), None);
}

#[test]
fn the_ticket_span_points_at_the_offered_psk_identity() {
    let ticket: Vec<u8> = (0..150u8).map(|i| i.wrapping_mul(13)).collect();
    for b in [
        HelloBuilder {
            psk_identity: Some(ticket.clone()),
            ..HelloBuilder::tls13()
        },
        HelloBuilder {
            psk_identity: Some(ticket.clone()),
            padding_extensions: alloc::vec![(21, 1500)],
            ..HelloBuilder::tls13()
        },
    ] {
        let data = b.build();
        let whole = parse_hello(&data);
        let (at, len) = whole.ticket_span().expect("a PSK offer");
        assert_eq!(&data[at as usize..][..len as usize], &ticket[..]);
        // However the hello is split.
        for cut in (1..data.len()).step_by(37) {
            assert_eq!(feed_split(&data, &[cut]).ticket_span(), Some((at, len)));
        }
    }
    // A TLS 1.2 ticket's place is not kept; a session id offer has none.
    for b in [
        HelloBuilder {
            session_id: key(32),
            ticket: Some(ticket.clone()),
            ..Default::default()
        },
        HelloBuilder {
            session_id: key(32),
            ..Default::default()
        },
    ] {
        let st = parse_hello(&b.build());
        assert_eq!(st.verdict(), Verdict::Offer);
        assert_eq!(st.ticket_span(), None);
    }
}
