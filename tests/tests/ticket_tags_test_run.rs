//! Issue 26, resumption verified at every node's NIC: a ticket whose key no daemon published on
//! this node is classed tls-resumed when its clear tail carries a good tag under a tag key of its
//! period (`TLS_TAG_KEYS`, which every node sharing the ticket secret derives), through the real
//! program (BPF_PROG_TEST_RUN, XDP and TC). Forged tags, retired periods, other secrets, expired
//! tickets and withdrawn keys get tls-new; a vouched key keeps the per-key bound.

use std::time::{SystemTime, UNIX_EPOCH};

use gateway_common::{
    Class,
    maps::{ISSUED_BY_TAG, ISSUED_WITHDRAWN, IssuedKey, IssuedValue, TagKey, TlsCounters},
    testing::HelloBuilder,
    tls::{
        Offer,
        tag::{TAIL_LEN, Tail, tag, ticket_key},
    },
};
use gateway_tests::{
    frames::Frame,
    have_root,
    testrun::{Hook, TestProgram},
};

/// The tag key of the tests' "secret", and another secret's.
const K: (u64, u64) = (0x0123_4567_89ab_cdef, 0x0fed_cba9_8765_4321);
const OTHER: (u64, u64) = (0x1111, 0x2222);
/// The period the tests' tickets were sealed in.
const PERIOD: u32 = 493_000;

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Writes the tag key `k` of `periods` for port 443, with `limit` connections a key it vouches
/// for may hold at once.
fn write_keys(prog: &mut TestProgram, k: (u64, u64), periods: &[u32], limit: u32) {
    let clock_ns = gateway::datapath::maps::wall_clock_offset_ns();
    let keys: Vec<(u32, TagKey)> = periods
        .iter()
        .map(|&p| {
            let key = TagKey {
                k0: k.0,
                k1: k.1,
                limit,
                per_minute: u32::MAX,
                clock_ns,
            };
            (p, key)
        })
        .collect();
    prog.maps.set_tag_keys(443, &keys).unwrap();
}

/// A ticket of 80 bytes (`fill`) sealed in `period`, expiring at `expires`, tagged under `k`.
fn ticket(fill: u8, k: (u64, u64), period: u32, expires: u64) -> Vec<u8> {
    let mut t: Vec<u8> = (0..80)
        .map(|i| fill.wrapping_mul(31).wrapping_add(i))
        .collect();
    let key = ticket_key(&t).unwrap();
    let expires = expires as u32;
    let tail = Tail {
        period,
        expires,
        tag: tag(k.0, k.1, &key, period, expires),
    };
    let n = t.len();
    t[n - TAIL_LEN..].copy_from_slice(&tail.to_bytes());
    t
}

/// A hello offering `ticket`: a TLS 1.2 ticket, or a TLS 1.3 PSK identity.
fn hello(ticket: &[u8], tls13: bool) -> Vec<u8> {
    if tls13 {
        HelloBuilder {
            psk_identity: Some(ticket.to_vec()),
            key_share_len: 32,
            ..HelloBuilder::tls13()
        }
        .build()
    } else {
        HelloBuilder {
            ticket: Some(ticket.to_vec()),
            ..Default::default()
        }
        .build()
    }
}

/// Offers `ticket` (TLS 1.3 or 1.2) on a new connection from `port`: its class, and the TLS
/// counters before and after.
fn offer(
    prog: &TestProgram,
    hook: Hook,
    ticket: &[u8],
    tls13: bool,
    port: u16,
) -> (Option<Class>, TlsCounters, TlsCounters) {
    let before = prog.counters();
    let frame = Frame::tcp(443, &hello(ticket, tls13))
        .from_port(port)
        .build();
    prog.run(hook, &frame, 1);
    let after = prog.counters();
    (after.class_since(&before), before.tls, after.tls)
}

/// The entry of `key` in the issued-keys table, if any.
fn issued_entry(prog: &TestProgram, key: &IssuedKey) -> Option<IssuedValue> {
    prog.maps
        .issued()
        .unwrap()
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v)
}

#[test]
fn a_ticket_no_key_was_published_for_resumes_by_its_tag_and_nothing_else_does() {
    if !have_root("a_ticket_no_key_was_published_for_resumes_by_its_tag_and_nothing_else_does") {
        return;
    }
    let mut prog = TestProgram::new();
    let later = unix_now() + 3600;
    // Periods written: PERIOD and the one before; PERIOD - 5 retired.
    write_keys(&mut prog, K, &[PERIOD, PERIOD - 1], 6);
    let mut port = 20000;
    let mut next_port = || {
        port += 1;
        port
    };
    let mut fill = 0u8;
    for hook in [Hook::Xdp, Hook::Tc] {
        for tls13 in [false, true] {
            let what = format!("{hook:?} tls13={tls13}");
            fill += 1;
            // A good tag: tls-resumed, its key published by the NIC with the tag key's terms
            // and the ticket's expiry.
            let good = ticket(fill, K, PERIOD, later);
            let (class, before, after) = offer(&prog, hook, &good, tls13, next_port());
            assert_eq!(class, Some(Class::TlsResumed), "{what}");
            assert_eq!(after.tags_verified, before.tags_verified + 1, "{what}");
            assert_eq!(after.tags_refused, before.tags_refused, "{what}");
            let key = IssuedKey {
                key: ticket_key(&good).unwrap(),
            };
            let v = issued_entry(&prog, &key).expect("the NIC published the key");
            let kind = if tls13 { Offer::Psk } else { Offer::Ticket };
            assert_eq!(v.kind, kind as u32 | ISSUED_BY_TAG, "{what}");
            assert_eq!(v.expires, later, "{what}");
            assert_eq!(v.limit, 6, "{what}");
            // Offered again: found, not vouched for twice.
            let (class, _, again) = offer(&prog, hook, &good, tls13, next_port());
            assert_eq!(class, Some(Class::TlsResumed), "{what}");
            assert_eq!(again.tags_verified, after.tags_verified, "{what}");

            // What must not resume: a forged tag (each of its bytes), another secret's tag, a
            // retired period, a period with no key yet, an expired ticket, a changed body.
            let mut refused: Vec<(String, Vec<u8>)> = Vec::new();
            for i in 0..8 {
                fill += 1;
                let mut t = ticket(fill, K, PERIOD, later);
                let n = t.len();
                t[n - 8 + i] ^= 0x40;
                refused.push((format!("tag byte {i} flipped"), t));
            }
            for (name, k, period, expires) in [
                ("another secret", OTHER, PERIOD, later),
                ("a retired period", K, PERIOD - 5, later),
                ("a period with no key", K, PERIOD + 7, later),
                ("expired", K, PERIOD, unix_now() - 1),
            ] {
                fill += 1;
                refused.push((name.into(), ticket(fill, k, period, expires)));
            }
            fill += 1;
            let mut changed = ticket(fill, K, PERIOD, later);
            changed[20] ^= 1;
            refused.push(("a byte of the body changed".into(), changed));
            for (name, t) in refused {
                let (class, before, after) = offer(&prog, hook, &t, tls13, next_port());
                assert_eq!(class, Some(Class::TlsNew), "{what}: {name}");
                assert_eq!(
                    after.tags_refused,
                    before.tags_refused + 1,
                    "{what}: {name}"
                );
                assert_eq!(after.tags_verified, before.tags_verified, "{what}: {name}");
                assert_eq!(
                    after.unverified_offers,
                    before.unverified_offers + 1,
                    "{what}: {name}"
                );
                let key = IssuedKey {
                    key: ticket_key(&t).unwrap(),
                };
                assert!(!prog.maps.is_issued(&key).unwrap(), "{what}: {name}");
            }
        }
        prog.maps.clear_tls_flows().unwrap();
        prog.maps.forget_pending().unwrap();
    }
}

#[test]
fn a_withdrawn_key_stays_withdrawn_and_a_vouched_key_keeps_the_per_key_bound() {
    if !have_root("a_withdrawn_key_stays_withdrawn_and_a_vouched_key_keeps_the_per_key_bound") {
        return;
    }
    let mut prog = TestProgram::new();
    let later = unix_now() + 3600;
    write_keys(&mut prog, K, &[PERIOD], 1);
    let t = ticket(9, K, PERIOD, later);
    let key = IssuedKey {
        key: ticket_key(&t).unwrap(),
    };
    for hook in [Hook::Xdp, Hook::Tc] {
        let base = if hook == Hook::Xdp { 21000 } else { 22000 };
        // One connection at a time: the first holds the key's one place, the second is bounded.
        let (class, _, _) = offer(&prog, hook, &t, true, base);
        assert_eq!(class, Some(Class::TlsResumed), "{hook:?}");
        let (class, before, after) = offer(&prog, hook, &t, true, base + 1);
        assert_eq!(class, Some(Class::TlsNew), "{hook:?}");
        assert_eq!(
            after.replays_bounded,
            before.replays_bounded + 1,
            "{hook:?}: the tag buys one client's share"
        );
        prog.maps.clear_tls_flows().unwrap();
        prog.maps.forget_pending().unwrap();
    }
    // The offer did not resume at the server: the daemon withdraws the key. It stays, withdrawn,
    // until the ticket expires, so the tag cannot publish it again.
    assert!(prog.maps.withdraw_issued(&key).unwrap());
    let v = issued_entry(&prog, &key).expect("kept as withdrawn");
    assert_ne!(v.kind & ISSUED_WITHDRAWN, 0);
    assert!(!prog.maps.is_issued(&key).unwrap());
    for hook in [Hook::Xdp, Hook::Tc] {
        let port = if hook == Hook::Xdp { 23000 } else { 24000 };
        let (class, before, after) = offer(&prog, hook, &t, true, port);
        assert_eq!(class, Some(Class::TlsNew), "{hook:?}");
        assert_eq!(after.tags_verified, before.tags_verified, "{hook:?}");
        assert_eq!(after.unverified_offers, before.unverified_offers + 1);
    }
    // The sweep removes it once the ticket expired, and not before.
    assert_eq!(prog.maps.sweep_issued(later - 1).unwrap(), 0);
    assert_eq!(prog.maps.sweep_issued(later).unwrap(), 1);
    assert!(prog.maps.issued().unwrap().iter().all(|(k, _)| *k != key));
    // A tag key written for another port vouches for nothing on 443.
    prog.maps.set_tag_keys(443, &[]).unwrap();
    let clock_ns = gateway::datapath::maps::wall_clock_offset_ns();
    let elsewhere = TagKey {
        k0: K.0,
        k1: K.1,
        limit: 6,
        per_minute: u32::MAX,
        clock_ns,
    };
    prog.maps
        .set_tag_keys(8443, &[(PERIOD, elsewhere)])
        .unwrap();
    assert_eq!(prog.maps.tag_keys().unwrap().len(), 1);
    let (class, before, after) = offer(&prog, Hook::Xdp, &t, true, 25000);
    assert_eq!(class, Some(Class::TlsNew));
    assert_eq!(after.tags_refused, before.tags_refused + 1);
}
