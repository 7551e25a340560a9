//! TLS classification through the real program (BPF_PROG_TEST_RUN, XDP and TC): verified
//! resumption, hellos split over segments, out-of-order fallback, flow packets and the backlog.

use gateway_common::{
    Class,
    maps::{IssuedKey, IssuedValue},
    packet::TCP_FIN as TCP_FIN_FLAG,
    testing::HelloBuilder,
    tls::parse_hello,
};
use gateway_tests::{
    frames::{Frame, check_rewritten, ext, ones_sum},
    have_root,
    testrun::{Hook, TestProgram},
};

fn key(fill: u8) -> Vec<u8> {
    (0..32).map(|i| fill.wrapping_add(i)).collect()
}

/// Publishes the key `hello` offers, with room for as many resumed connections at once as a
/// key may have (these tests admit many that no server answers).
fn publish(prog: &mut TestProgram, hello: &[u8]) {
    let key = parse_hello(hello).offer_key().expect("an offer with a key");
    let value = IssuedValue {
        limit: gateway_common::maps::MAX_RESUME_LIMIT,
        // No rate binds: these keys stand for many clients.
        per_minute: u32::MAX,
        ..Default::default()
    };
    prog.maps.add_issued(IssuedKey { key }, value).unwrap();
}

/// A hello resuming TLS 1.2 session id `key(fill)`, its key published with `value`.
fn published_session(prog: &mut TestProgram, fill: u8, value: IssuedValue) -> (Vec<u8>, IssuedKey) {
    let hello = HelloBuilder {
        session_id: key(fill),
        ..Default::default()
    }
    .build();
    let issued = IssuedKey {
        key: parse_hello(&hello).offer_key().unwrap(),
    };
    prog.maps.add_issued(issued, value).unwrap();
    (hello, issued)
}

/// Runs one frame; returns the class it was counted in.
fn class_of(prog: &TestProgram, hook: Hook, frame: &[u8]) -> Option<Class> {
    let before = prog.counters();
    prog.run(hook, frame, 1);
    prog.counters().class_since(&before)
}

fn offers() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        (
            "tls1.2 session id",
            HelloBuilder {
                session_id: key(1),
                ..Default::default()
            }
            .build(),
        ),
        (
            "tls1.2 ticket",
            HelloBuilder {
                session_id: key(2),
                ticket: Some(key(3)),
                ..Default::default()
            }
            .build(),
        ),
        (
            "tls1.3 psk",
            HelloBuilder {
                psk_identity: Some(key(4)),
                key_share_len: 32,
                ..HelloBuilder::tls13()
            }
            .build(),
        ),
    ]
}

#[test]
fn an_offer_is_resumed_only_when_its_key_was_issued() {
    if !have_root("an_offer_is_resumed_only_when_its_key_was_issued") {
        return;
    }
    let mut prog = TestProgram::new();
    for hook in [Hook::Xdp, Hook::Tc] {
        for (i, (name, hello)) in offers().into_iter().enumerate() {
            let port = 20000 + i as u16 + if hook == Hook::Tc { 100 } else { 0 };
            let unpublished = Frame::tcp(443, &hello).from_port(port).build();
            let before = prog.counters();
            assert_eq!(
                class_of(&prog, hook, &unpublished),
                Some(Class::TlsNew),
                "{hook:?} {name}"
            );
            assert_eq!(
                prog.counters().tls.unverified_offers,
                before.tls.unverified_offers + 1,
                "{name}"
            );
            publish(&mut prog, &hello);
            let again = Frame::tcp(443, &hello).from_port(port + 50).build();
            assert_eq!(
                class_of(&prog, hook, &again),
                Some(Class::TlsResumed),
                "{hook:?} {name}"
            );
        }
        prog.maps.clear_tls_flows().unwrap();
        for (k, _) in prog.maps.issued().unwrap() {
            assert!(prog.maps.remove_issued(&k).unwrap());
        }
    }
    // TLS 1.3's session id is not an offer, even when that id was published.
    let hello = HelloBuilder {
        key_share_len: 32,
        ..HelloBuilder::tls13()
    }
    .build();
    let sid = gateway_common::tls::offer_digest(&HelloBuilder::tls13().session_id);
    prog.maps
        .add_issued(IssuedKey { key: sid }, IssuedValue::default())
        .unwrap();
    let frame = Frame::tcp(443, &hello).from_port(30000).build();
    assert_eq!(class_of(&prog, Hook::Xdp, &frame), Some(Class::TlsNew));
}

/// The PQ-sized TLS 1.3 hello with its PSK in the second segment.
fn split_hello() -> (Vec<u8>, usize) {
    let hello = HelloBuilder {
        psk_identity: Some(key(9)),
        versions_after_key_share: true,
        ..HelloBuilder::tls13()
    }
    .build();
    assert!(hello.len() > 1300);
    (hello, 1000)
}

/// The two segments of `hello` cut at `cut`, from `port`, the first at `seq`; the second `gap`
/// bytes later than in order.
fn split_frames(hello: &[u8], cut: usize, port: u16, seq: u32, gap: u32) -> (Vec<u8>, Vec<u8>) {
    let first = Frame::tcp(443, &hello[..cut])
        .from_port(port)
        .seq(seq)
        .build();
    let second = Frame::tcp(443, &hello[cut..])
        .from_port(port)
        .seq(seq + cut as u32 + gap)
        .build();
    (first, second)
}

#[test]
fn a_hello_over_two_segments_is_decided_when_the_evidence_arrives() {
    if !have_root("a_hello_over_two_segments") {
        return;
    }
    let mut prog = TestProgram::new();
    let (hello, cut) = split_hello();
    publish(&mut prog, &hello);
    for (hook, port) in [(Hook::Xdp, 40001), (Hook::Tc, 40002)] {
        let (first, second) = split_frames(&hello, cut, port, 7000, 0);
        let before = prog.counters();
        assert_eq!(
            class_of(&prog, hook, &first),
            Some(Class::TlsFlow),
            "{hook:?} first"
        );
        assert_eq!(
            prog.counters().tls.multi_segment,
            before.tls.multi_segment + 1
        );
        assert_eq!(
            prog.counters().tls.hellos,
            before.tls.hellos,
            "not decided yet"
        );
        assert_eq!(
            class_of(&prog, hook, &second),
            Some(Class::TlsResumed),
            "{hook:?} second"
        );
        assert_eq!(prog.counters().tls.hellos, before.tls.hellos + 1);
        // Later packets of the connection cost a lookup and are tls-flow.
        let data = Frame::tcp(443, &[23, 3, 3, 0, 1, 0])
            .from_port(port)
            .seq(7000 + hello.len() as u32)
            .build();
        assert_eq!(class_of(&prog, hook, &data), Some(Class::TlsFlow));
    }
    // Without the key published: the same split hello is tls-new.
    let mut fresh = TestProgram::new();
    let first = Frame::tcp(443, &hello[..cut]).from_port(1).seq(5).build();
    let second = Frame::tcp(443, &hello[cut..])
        .from_port(1)
        .seq(5 + cut as u32)
        .build();
    class_of(&fresh, Hook::Xdp, &first);
    assert_eq!(class_of(&fresh, Hook::Xdp, &second), Some(Class::TlsNew));
    assert_eq!(fresh.counters().tls.unverified_offers, 1);
    fresh.maps.clear_tls_flows().unwrap();
}

#[test]
fn an_out_of_order_segment_falls_back_to_new() {
    if !have_root("an_out_of_order_segment_falls_back_to_new") {
        return;
    }
    let mut prog = TestProgram::new();
    let (hello, cut) = split_hello();
    publish(&mut prog, &hello);
    for (hook, port) in [(Hook::Xdp, 41001), (Hook::Tc, 41002)] {
        // The second segment, but with a gap before it.
        let (first, late) = split_frames(&hello, cut, port, 100, 1448);
        class_of(&prog, hook, &first);
        let before = prog.counters();
        assert_eq!(
            class_of(&prog, hook, &late),
            Some(Class::TlsNew),
            "{hook:?}"
        );
        assert_eq!(
            prog.counters().tls.out_of_order,
            before.tls.out_of_order + 1
        );
    }
    prog.maps.clear_tls_flows().unwrap();
}

/// The server's FIN to client `port` (it ends the connection), leaving the host.
fn server_fin_to(port: u16) -> Vec<u8> {
    Frame::tcp(port, &[])
        .from_port(443)
        .from_server()
        .flags(0x11)
        .build()
}

/// The server's first flight to client `port` (a ServerHello record), leaving the host.
fn server_hello_to(port: u16) -> Vec<u8> {
    Frame::tcp(port, &[22, 3, 3, 0, 4, 2, 0, 0, 0])
        .from_port(443)
        .from_server()
        .build()
}

/// Admits a new connection (a hello with no offer, `seq` 10) from each client port of `ports`;
/// returns the hello.
fn admit_new_from(prog: &TestProgram, ports: &[u16]) -> Vec<u8> {
    let hello = HelloBuilder::default().build();
    for port in ports {
        let f = Frame::tcp(443, &hello).from_port(*port).seq(10).build();
        assert_eq!(class_of(prog, Hook::Xdp, &f), Some(Class::TlsNew));
    }
    hello
}

/// Issue 50: only a handshake flight times a connection's unit. A server's alert (a hello it
/// refuses at once) and its close end the unit, but their times are no handshake's cost: the
/// cost inferred for a server the gateway does not terminate reads `SERVICE_TIMES`, which they
/// leave alone.
#[test]
fn an_alert_or_a_close_ends_a_unit_untimed_and_a_handshake_flight_times_it() {
    if !have_root("an_alert_or_a_close_ends_a_unit_untimed") {
        return;
    }
    let prog = TestProgram::new();
    admit_new_from(&prog, &[1, 2, 3]);
    let timed = |p: &TestProgram| p.maps.service_times(Class::TlsNew.id()).unwrap().count();
    // An alert (handshake_failure) to 1, a reset to 2: both end their units, untimed.
    let alert = Frame::tcp(1, &[21, 3, 3, 0, 2, 2, 40])
        .from_port(443)
        .from_server()
        .build();
    prog.run(Hook::TcEgress, &alert, 1);
    let reset = Frame::tcp(2, &[])
        .from_port(443)
        .from_server()
        .flags(0x04)
        .build();
    prog.run(Hook::TcEgress, &reset, 1);
    assert_eq!(backlog(&prog), 1);
    assert_eq!(timed(&prog), 0, "an alert and a reset are no handshake");
    // A ServerHello to 3 is.
    prog.run(Hook::TcEgress, &server_hello_to(3), 1);
    assert_eq!(backlog(&prog), 0);
    assert_eq!(timed(&prog), 1);
    assert_eq!(prog.counters().tls.completions, 3);
}

#[test]
fn only_the_servers_answer_completes_a_connection() {
    if !have_root("only_the_servers_answer_completes_a_connection") {
        return;
    }
    let prog = TestProgram::new();
    // Three connections admitted.
    let hello = admit_new_from(&prog, &[1, 2, 3]);
    assert_eq!(backlog(&prog), 3);
    // What the client sends releases nothing: a ChangeCipherSpec right after the hello, a close.
    let ccs = Frame::tcp(443, &[20, 3, 3, 0, 1, 1])
        .from_port(1)
        .seq(10 + hello.len() as u32);
    class_of(&prog, Hook::Xdp, &ccs.build());
    let fin = Frame::tcp(443, &[])
        .from_port(2)
        .flags(TCP_FIN_FLAG | 0x10)
        .seq(10 + hello.len() as u32);
    class_of(&prog, Hook::Tc, &fin.build());
    assert_eq!(backlog(&prog), 3);
    assert_eq!(prog.counters().tls.completions, 0);
    // The server answers 1 (its first flight) and closes 2; 3 stays unanswered.
    assert_eq!(prog.run(Hook::TcEgress, &server_hello_to(1), 1).0, 0);
    let server_fin = Frame::tcp(2, &[])
        .from_port(443)
        .from_server()
        .flags(TCP_FIN_FLAG | 0x10)
        .build();
    prog.run(Hook::TcEgress, &server_fin, 1);
    assert_eq!(backlog(&prog), 1);
    // A completion is counted once; later data and answers to unknown clients count nothing.
    prog.run(Hook::TcEgress, &server_hello_to(1), 1);
    prog.run(Hook::TcEgress, &server_fin, 1);
    prog.run(Hook::TcEgress, &server_hello_to(9), 1);
    let data = Frame::tcp(3, &[23, 3, 3, 0, 1, 0])
        .from_port(443)
        .from_server()
        .build();
    prog.run(Hook::TcEgress, &data, 1);
    assert_eq!(backlog(&prog), 1);
    assert_eq!(prog.counters().tls.completions, 2);
    let st = prog.maps.class_state().unwrap()[Class::TlsNew.id() as usize];
    assert_eq!((st.admitted, st.completed, st.expired), (3, 2, 0));
}

#[test]
fn an_unanswered_connection_expires_and_frees_its_place() {
    if !have_root("an_unanswered_connection_expires_and_frees_its_place") {
        return;
    }
    let mut prog = TestProgram::new();
    let hello = HelloBuilder::default().build();
    let timeout = std::time::Duration::from_millis(300);
    set_policy(
        &mut prog,
        Class::TlsNew,
        gateway_common::policy::Policy {
            backlog: Some(2),
            timeout: Some(timeout),
            ..Default::default()
        },
    );
    let hello_from = |port: u16| Frame::tcp(443, &hello).from_port(port).seq(1).build();
    // Two silent clients fill the class (the server never answers them).
    assert_eq!(prog.run(Hook::Xdp, &hello_from(1), 1).0, XDP_PASS);
    assert_eq!(prog.run(Hook::Xdp, &hello_from(2), 1).0, XDP_PASS);
    assert_eq!(prog.run(Hook::Xdp, &hello_from(3), 1).0, XDP_REFUSED);
    let admitted_at = std::time::Instant::now();
    // Past their timeout (and the sweep interval), with no daemon, the next hello is admitted
    // and the two are counted as expired.
    let deadline = admitted_at + timeout + std::time::Duration::from_secs(2);
    let mut port = 10;
    while prog.run(Hook::Xdp, &hello_from(port), 1).0 != XDP_PASS {
        assert!(std::time::Instant::now() < deadline, "never healed");
        std::thread::sleep(std::time::Duration::from_millis(20));
        port += 1;
    }
    assert!(admitted_at.elapsed() >= timeout, "expired early");
    let st = prog.maps.class_state().unwrap()[Class::TlsNew.id() as usize];
    assert_eq!(st.expired, 2);
    assert_eq!(st.backlog(), 1);
    // An expired connection the server answers late counts nothing more.
    prog.run(Hook::TcEgress, &server_hello_to(1), 1);
    let st = prog.maps.class_state().unwrap()[Class::TlsNew.id() as usize];
    assert_eq!((st.completed, st.expired, st.backlog()), (0, 2, 1));
}

const XDP_DROP: u32 = 1;
/// A refused TLS segment on the XDP hook: turned into a reset to its sender (XDP_TX).
const XDP_REFUSED: u32 = 3;
/// What the TC hook returns for a refused segment it answers: `TC_ACT_OK`, the frame having
/// become the server's reset (the client's went out as a copy).
const TC_RESET: u32 = 0;
const XDP_PASS: u32 = 2;

/// The tls-new backlog (admitted minus every completion).
fn backlog(prog: &TestProgram) -> u64 {
    prog.maps.class_state().unwrap()[Class::TlsNew.id() as usize].backlog()
}

fn set_policy(prog: &mut TestProgram, class: Class, p: gateway_common::policy::Policy) {
    prog.maps.set_policy(class, p.to_map()).unwrap();
}

/// Closes tls-new: its backlog limit zero.
fn close_tls_new(prog: &mut TestProgram) {
    let closed = gateway_common::policy::Policy {
        backlog: Some(0),
        ..Default::default()
    };
    set_policy(prog, Class::TlsNew, closed);
}

#[test]
fn over_its_limits_a_new_connection_is_rejected_and_remembered() {
    if !have_root("over_its_limits_a_new_connection_is_rejected") {
        return;
    }
    let mut prog = TestProgram::new();
    let mut rejects = gateway::datapath::maps::open_rejects(&prog.pins).unwrap();
    let hello = HelloBuilder::default().build();
    let resumable = HelloBuilder {
        session_id: key(7),
        ..Default::default()
    }
    .build();
    publish(&mut prog, &resumable);
    // tls-new closed.
    close_tls_new(&mut prog);
    // TC passes the frame on, turned into the server's reset (see the reset test below).
    for (hook, port, drop) in [(Hook::Xdp, 100u16, XDP_REFUSED), (Hook::Tc, 101, TC_RESET)] {
        let f = Frame::tcp(443, &hello).from_port(port).seq(1).build();
        let before = prog.counters();
        assert_eq!(prog.run(hook, &f, 1).0, drop, "{hook:?}");
        let after = prog.counters();
        let c = Class::TlsNew.id() as usize;
        assert_eq!(after.classes[c].rejected, before.classes[c].rejected + 1);
        assert_eq!(
            after.classes[c].dropped_backlog,
            before.classes[c].dropped_backlog + 1
        );
        assert_eq!(after.classes[c].admitted, before.classes[c].admitted);
        // Its retransmission is dropped by the flow table, cheaply.
        assert_eq!(prog.run(hook, &f, 1).0, drop);
        assert_eq!(
            prog.counters().tls.rejected_flow_packets,
            before.tls.rejected_flow_packets + 1
        );
        if hook == Hook::Tc {
            // TC reset the server's socket itself: the daemon has nothing to do.
            assert!(rejects.next().is_none());
            continue;
        }
        // XDP can only answer the client: the daemon hears of it, for the server's socket.
        let item = rejects.next().expect("a reject event");
        let ev = gateway::datapath::maps::decode_reject(&item).unwrap();
        assert_eq!(ev.key.sport, port);
        assert_eq!(ev.key.dport, 443);
        assert_eq!(ev.class, Class::TlsNew as u8);
        assert_eq!(ev.reason, gateway_common::reasons::Refusal::Backlog.id());
    }
    // Resumed sessions are not limited by tls-new's policy.
    let f = Frame::tcp(443, &resumable).from_port(102).seq(1).build();
    assert_eq!(prog.run(Hook::Xdp, &f, 1).0, XDP_PASS);
    assert!(rejects.next().is_none());
}

#[test]
fn the_backlog_limit_admits_again_after_a_completion() {
    if !have_root("the_backlog_limit_admits_again_after_a_completion") {
        return;
    }
    let mut prog = TestProgram::new();
    let hello = HelloBuilder::default().build();
    set_policy(
        &mut prog,
        Class::TlsNew,
        gateway_common::policy::Policy {
            backlog: Some(2),
            ..Default::default()
        },
    );
    let hello_from = |port: u16| Frame::tcp(443, &hello).from_port(port).seq(1).build();
    assert_eq!(prog.run(Hook::Xdp, &hello_from(1), 1).0, XDP_PASS);
    assert_eq!(prog.run(Hook::Xdp, &hello_from(2), 1).0, XDP_PASS);
    assert_eq!(prog.run(Hook::Xdp, &hello_from(3), 1).0, XDP_REFUSED);
    // The server answers connection 1: room for one more.
    prog.run(Hook::TcEgress, &server_hello_to(1), 1);
    assert_eq!(prog.run(Hook::Xdp, &hello_from(4), 1).0, XDP_PASS);
    assert_eq!(prog.run(Hook::Xdp, &hello_from(5), 1).0, XDP_REFUSED);
}

#[test]
fn the_rate_limit_allows_a_burst_then_rejects() {
    if !have_root("the_rate_limit_allows_a_burst_then_rejects") {
        return;
    }
    let mut prog = TestProgram::new();
    let hello = HelloBuilder::default().build();
    // One per second, burst of two: three back to back conform, the fourth does not.
    set_policy(
        &mut prog,
        Class::TlsNew,
        gateway_common::policy::Policy {
            rate: Some(1),
            burst: Some(2),
            ..Default::default()
        },
    );
    let actions: Vec<u32> = (1..=4u16)
        .map(|p| {
            prog.run(Hook::Xdp, &Frame::tcp(443, &hello).from_port(p).build(), 1)
                .0
        })
        .collect();
    assert_eq!(actions, [XDP_PASS, XDP_PASS, XDP_PASS, XDP_REFUSED]);
    let c = prog.counters().classes[Class::TlsNew.id() as usize];
    assert_eq!((c.dropped_rate, c.rejected, c.dropped_backlog), (1, 1, 0));
    // Rate zero admits nothing.
    set_policy(
        &mut prog,
        Class::TlsNew,
        gateway_common::policy::Policy {
            rate: Some(0),
            ..Default::default()
        },
    );
    let f = Frame::tcp(443, &hello).from_port(9).build();
    let (action, out) = prog.run_out_on(Hook::Tc, &f);
    assert_eq!(action, TC_RESET);
    assert_eq!(out[f.len() - hello.len() - 20 + 13], 0x14, "RST|ACK");
}

#[test]
fn bad_hellos_are_new_and_malformed_never_resumed() {
    if !have_root("bad_hellos_are_new_and_malformed") {
        return;
    }
    let mut prog = TestProgram::new();
    let good = HelloBuilder {
        session_id: key(5),
        ..Default::default()
    }
    .build();
    publish(&mut prog, &good);
    let mut truncated_record = good.clone();
    truncated_record[4] = truncated_record[4].wrapping_sub(10);
    let mut lying_ext = good.clone();
    let ext_len_at = 5 + 4 + 2 + 32 + 1 + 32 + 2 + 8 + 2;
    lying_ext[ext_len_at] ^= 0x01;
    let cases: [(&str, Vec<u8>); 5] = [
        (
            "sslv2 hello",
            vec![0x80, 0x2e, 0x01, 0x03, 0x01, 0x00, 0x15, 0, 0, 0, 0x10],
        ),
        ("plain http", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec()),
        ("record shorter than the hello", truncated_record),
        ("extensions length lies", lying_ext),
        ("binary garbage", vec![0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3]),
    ];
    for hook in [Hook::Xdp, Hook::Tc] {
        for (i, (name, payload)) in cases.iter().enumerate() {
            let f = Frame::tcp(443, payload).from_port(50 + i as u16).build();
            let before = prog.counters();
            assert_eq!(
                class_of(&prog, hook, &f),
                Some(Class::TlsNew),
                "{hook:?} {name}"
            );
            assert_eq!(
                prog.counters().tls.malformed,
                before.tls.malformed + 1,
                "{hook:?} {name} counted as malformed"
            );
        }
        prog.maps.clear_tls_flows().unwrap();
    }
    // The well-formed offer with the same key is resumed, so the key was there all along.
    let f = Frame::tcp(443, &good).from_port(99).build();
    assert_eq!(class_of(&prog, Hook::Xdp, &f), Some(Class::TlsResumed));
}

/// xorshift64*, for reproducible mutations.
fn rng(state: &mut u64) -> u64 {
    *state ^= *state >> 12;
    *state ^= *state << 25;
    *state ^= *state >> 27;
    state.wrapping_mul(0x2545_f491_4f6c_dd1d)
}

#[test]
fn mutated_offers_are_resumed_only_when_the_model_says_so() {
    if !have_root("mutated_offers_are_resumed_only_when_the_model_says_so") {
        return;
    }
    let mut prog = TestProgram::new();
    let offers = offers();
    let mut issued = Vec::new();
    for (_, hello) in &offers {
        publish(&mut prog, hello);
        issued.push(parse_hello(hello).offer_key().unwrap());
    }
    let mut s = 0xfeed_f00d_u64;
    let mut resumed = 0;
    for i in 0..3000 {
        let (_, hello) = &offers[i % offers.len()];
        let mut bytes = Frame::tcp(443, hello).from_port(1000).build();
        for _ in 0..1 + rng(&mut s) % 3 {
            // Mutate within the TLS payload (54 = the frame's payload offset).
            let at = 54 + (rng(&mut s) as usize) % (bytes.len() - 54);
            bytes[at] = rng(&mut s) as u8;
        }
        let hook = if i % 2 == 0 { Hook::Xdp } else { Hook::Tc };
        let before = prog.counters();
        prog.run_fresh(hook, &bytes).unwrap();
        let got = prog.counters().class_since(&before);
        let want = gateway_tests::testrun::expected_class(&bytes, &issued);
        assert_eq!(got, Some(want), "mutation {i}: {bytes:02x?}");
        resumed += usize::from(want == Class::TlsResumed);
    }
    // Mutations outside the key leave most offers valid: the test did exercise resumption.
    assert!(resumed > 300, "only {resumed} resumed");
}

#[test]
fn a_terminated_service_completes_like_any_other() {
    if !have_root("a_terminated_service_completes_like_any_other") {
        return;
    }
    use gateway_common::maps::{SERVICE_TERMINATED, ServiceKey, ServiceKind, ServiceValue};
    let mut prog = TestProgram::new();
    prog.maps
        .add_service(
            ServiceKey::new(6, 8443),
            ServiceValue {
                kind: ServiceKind::Tls as u32,
                flags: SERVICE_TERMINATED,
            },
        )
        .unwrap();
    set_policy(
        &mut prog,
        Class::TlsNew,
        gateway_common::policy::Policy {
            backlog: Some(1),
            ..Default::default()
        },
    );
    let hello = HelloBuilder::default().build();
    let hello_from = |port: u16| Frame::tcp(8443, &hello).from_port(port).seq(1).build();
    assert_eq!(prog.run(Hook::Xdp, &hello_from(1), 1).0, XDP_PASS);
    assert_eq!(prog.run(Hook::Xdp, &hello_from(2), 1).0, XDP_REFUSED);
    // The daemon's proxy answers from 8443: the one owner of completions is the egress program,
    // whichever listener (or server) answered.
    let answer = Frame::tcp(1, &[22, 3, 3, 0, 4, 2, 0, 0, 0])
        .from_port(8443)
        .from_server()
        .build();
    prog.run(Hook::TcEgress, &answer, 1);
    prog.run(Hook::TcEgress, &answer, 1);
    assert_eq!(backlog(&prog), 0);
    assert_eq!(prog.run(Hook::Xdp, &hello_from(3), 1).0, XDP_PASS);
    assert_eq!(backlog(&prog), 1);
}

#[test]
fn a_reused_client_port_starts_afresh() {
    if !have_root("a_reused_client_port_starts_afresh") {
        return;
    }
    let mut prog = TestProgram::new();
    let hello = HelloBuilder::default().build();
    close_tls_new(&mut prog);
    let from = |port: u16| Frame::tcp(443, &hello).from_port(port).seq(1).build();
    let syn = |port: u16| Frame::tcp(443, &[]).from_port(port).flags(0x02).build();
    // Rejected; its entry drops every later packet of that connection.
    assert_eq!(prog.run(Hook::Xdp, &from(7), 1).0, XDP_REFUSED);
    assert_eq!(prog.run(Hook::Xdp, &from(7), 1).0, XDP_REFUSED);
    // The client reuses the port for a new connection: its SYN passes and its hello is judged.
    set_policy(&mut prog, Class::TlsNew, Default::default());
    assert_eq!(prog.run(Hook::Xdp, &syn(7), 1).0, XDP_PASS);
    assert_eq!(prog.run(Hook::Xdp, &from(7), 1).0, XDP_PASS);
    assert_eq!(backlog(&prog), 1);
    // Reused again before the server answered: judged afresh; the old unanswered unit ends as
    // expired when the new one takes its key, so the backlog holds one, not two.
    assert_eq!(prog.run(Hook::Xdp, &syn(7), 1).0, XDP_PASS);
    assert_eq!(
        class_of(&prog, Hook::Xdp, &from(7)),
        Some(Class::TlsNew),
        "judged afresh, not passed as tls-flow"
    );
    let st = prog.maps.class_state().unwrap()[Class::TlsNew.id() as usize];
    assert_eq!((st.backlog(), st.expired), (1, 1));
}

/// A hello in a SYN (TCP Fast Open) refused on a port the client then reuses: the refused
/// connection is remembered without a flow entry, the next SYN forgets it and is dropped once
/// unjudged (its data came with a SYN the kernel holds nothing for), and the one after is judged
/// afresh.
#[test]
fn a_refused_fast_open_hello_is_forgotten_by_the_next_syn() {
    if !have_root("a_refused_fast_open_hello_is_forgotten_by_the_next_syn") {
        return;
    }
    let mut prog = TestProgram::new();
    let hello = HelloBuilder::default().build();
    close_tls_new(&mut prog);
    let fast_open = Frame::tcp(443, &hello)
        .from_port(9)
        .seq(1)
        .flags(0x02)
        .build();
    // Refused, and without a reset (a SYN's connection is nothing the kernel holds yet).
    let before = prog.counters();
    assert_eq!(prog.run(Hook::Xdp, &fast_open, 1).0, XDP_DROP);
    assert_eq!(prog.counters().class_since(&before), Some(Class::TlsNew));
    assert!(prog.maps.tls_flows().unwrap().is_empty());
    assert_eq!(prog.maps.tls_refused().unwrap().len(), 1);
    // Sent again: forgotten as refused, dropped unjudged.
    set_policy(&mut prog, Class::TlsNew, Default::default());
    let before = prog.counters();
    assert_eq!(prog.run(Hook::Xdp, &fast_open, 1).0, XDP_DROP);
    assert_eq!(prog.counters().class_since(&before), Some(Class::TlsFlow));
    assert!(prog.maps.tls_refused().unwrap().is_empty());
    // Once more: judged afresh, and admitted now that tls-new is open.
    let before = prog.counters();
    assert_eq!(prog.run(Hook::Xdp, &fast_open, 1).0, XDP_PASS);
    assert_eq!(prog.counters().class_since(&before), Some(Class::TlsNew));
    assert_eq!(backlog(&prog), 1);
}

#[test]
fn an_alert_in_front_of_a_hello_does_not_hide_it() {
    if !have_root("an_alert_in_front_of_a_hello") {
        return;
    }
    let mut prog = TestProgram::new();
    let resumable = HelloBuilder {
        session_id: key(9),
        ..Default::default()
    }
    .build();
    publish(&mut prog, &resumable);
    close_tls_new(&mut prog);
    let alert = [21u8, 3, 3, 0, 2, 1, 0];
    let ccs = [20u8, 3, 3, 0, 1, 1];
    let hello = HelloBuilder::default().build();
    for (port, payload) in [
        (1u16, [&alert[..], &hello].concat()),
        (2, [&ccs[..], &alert, &hello].concat()),
    ] {
        let f = Frame::tcp(443, &payload).from_port(port).build();
        assert_eq!(
            class_of(&prog, Hook::Xdp, &f),
            Some(Class::TlsNew),
            "{port}"
        );
        assert_eq!(prog.run(Hook::Xdp, &f, 1).0, XDP_REFUSED, "{port}");
    }
    // A verified resumption behind an alert stays resumed (it is judged, not refused).
    let f = Frame::tcp(443, &[&alert[..], &resumable].concat())
        .from_port(3)
        .build();
    assert_eq!(class_of(&prog, Hook::Xdp, &f), Some(Class::TlsResumed));
    // An alert alone passes without state; the hello in the next segment is judged.
    let alone = Frame::tcp(443, &alert).from_port(4).seq(1).build();
    assert_eq!(class_of(&prog, Hook::Xdp, &alone), Some(Class::TlsFlow));
    let next = Frame::tcp(443, &hello).from_port(4).seq(8).build();
    assert_eq!(class_of(&prog, Hook::Xdp, &next), Some(Class::TlsNew));
    assert_eq!(prog.run(Hook::Xdp, &next, 1).0, XDP_REFUSED);
}

#[test]
fn a_published_key_buys_the_resumed_class_for_its_limit_of_connections_at_a_time() {
    if !have_root("a_published_key_buys_the_resumed_class_for_its_limit") {
        return;
    }
    let mut prog = TestProgram::new();
    let timeout = std::time::Duration::from_millis(300);
    set_policy(
        &mut prog,
        Class::TlsResumed,
        gateway_common::policy::Policy {
            timeout: Some(timeout),
            ..Default::default()
        },
    );
    // A TLS 1.2 session id travels in clear in the ServerHello: anyone can replay it.
    let hello = HelloBuilder {
        session_id: key(7),
        ..Default::default()
    }
    .build();
    let issued = IssuedKey {
        key: parse_hello(&hello).offer_key().unwrap(),
    };
    prog.maps
        .add_issued(
            issued,
            IssuedValue {
                limit: 2,
                // Places, not the rate, are under test here.
                per_minute: u32::MAX,
                ..Default::default()
            },
        )
        .unwrap();
    let in_use = |prog: &TestProgram| {
        prog.maps
            .issued()
            .unwrap()
            .into_iter()
            .find(|(k, _)| *k == issued)
            .map(|(_, v)| v.in_use)
    };
    let open = |prog: &TestProgram| {
        prog.maps
            .issued()
            .unwrap()
            .into_iter()
            .find(|(k, _)| *k == issued)
            .map(|(_, v)| v.open)
    };
    let from = |port: u16| Frame::tcp(443, &hello).from_port(port).seq(1).build();
    // Four connections replay it at once: two are resumed, the others judged as new.
    let classes: Vec<_> = (1..=4)
        .map(|port| class_of(&prog, Hook::Xdp, &from(port)))
        .collect();
    assert_eq!(
        classes,
        [
            Some(Class::TlsResumed),
            Some(Class::TlsResumed),
            Some(Class::TlsNew),
            Some(Class::TlsNew)
        ]
    );
    assert_eq!(prog.counters().tls.replays_bounded, 2);
    assert_eq!(prog.counters().tls.unverified_offers, 0);
    assert_eq!(in_use(&prog), Some(2));
    // The server answers connection 1 (its unit completes): the connection goes on and holds
    // its place (a hold, `open`), so the key is still full.
    prog.run(Hook::TcEgress, &server_hello_to(1), 1);
    prog.run(Hook::TcEgress, &server_hello_to(1), 1);
    assert_eq!(in_use(&prog), Some(1));
    assert_eq!(open(&prog), Some(1));
    assert_eq!(class_of(&prog, Hook::Xdp, &from(5)), Some(Class::TlsNew));
    // The server ends connection 1: its place is free again, once.
    prog.run(Hook::TcEgress, &server_fin_to(1), 1);
    prog.run(Hook::TcEgress, &server_fin_to(1), 1);
    assert_eq!(open(&prog), Some(0));
    assert!(prog.maps.tls_holds().unwrap().is_empty());
    assert_eq!(
        class_of(&prog, Hook::Xdp, &from(7)),
        Some(Class::TlsResumed)
    );
    assert_eq!(class_of(&prog, Hook::Xdp, &from(6)), Some(Class::TlsNew));
    // Connections the server never answers give their places back when they expire, with no
    // daemon: past the timeout (and the sweep interval) the key resumes again.
    let deadline = std::time::Instant::now() + timeout + std::time::Duration::from_secs(2);
    let mut port = 100;
    while class_of(&prog, Hook::Xdp, &from(port)) != Some(Class::TlsResumed) {
        assert!(
            std::time::Instant::now() < deadline,
            "places never came back"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
        port += 1;
    }
    let st = prog.maps.class_state().unwrap()[Class::TlsResumed.id() as usize];
    assert_eq!(
        st.expired, 2,
        "the two unanswered resumed connections expired"
    );
    assert_eq!(in_use(&prog), Some(1));
    // Withdrawn, the key buys nothing; a late answer to its holder takes no count below zero.
    assert!(prog.maps.remove_issued(&issued).unwrap());
    prog.maps
        .add_issued(issued, IssuedValue::default())
        .unwrap();
    prog.run(Hook::TcEgress, &server_hello_to(port), 1);
    assert_eq!(in_use(&prog), Some(0));
}

#[test]
fn a_published_key_buys_its_limit_at_once_then_only_its_rate_of_resumptions() {
    if !have_root("a_published_key_buys_its_limit_at_once_then_only_its_rate") {
        return;
    }
    let mut prog = TestProgram::new();
    // Three at once, then one a minute: a test that runs for less than a minute sees no more.
    let (hello, _) = published_session(
        &mut prog,
        9,
        IssuedValue {
            limit: 3,
            per_minute: 1,
            ..Default::default()
        },
    );
    let from = |port: u16| Frame::tcp(443, &hello).from_port(port).seq(1).build();
    // One connection after another, each answered and ended by the server before the next (its
    // place free again): a farm of one ticket. Three are resumed, the rest are new.
    let classes: Vec<_> = (1..=8u16)
        .map(|port| {
            let class = class_of(&prog, Hook::Xdp, &from(port));
            prog.run(Hook::TcEgress, &server_hello_to(port), 1);
            prog.run(Hook::TcEgress, &server_fin_to(port), 1);
            class
        })
        .collect();
    assert_eq!(
        classes
            .iter()
            .filter(|c| **c == Some(Class::TlsResumed))
            .count(),
        3,
        "{classes:?}"
    );
    assert!(classes[..3].iter().all(|c| *c == Some(Class::TlsResumed)));
    assert!(classes[3..].iter().all(|c| *c == Some(Class::TlsNew)));
    let c = prog.counters().tls;
    assert_eq!(c.resumptions_too_fast, 5, "counted by their reason");
    assert_eq!(c.replays_bounded, 0, "a place was free each time");
    // Another client's key is its own share.
    let other = HelloBuilder {
        session_id: key(10),
        ..Default::default()
    }
    .build();
    publish(&mut prog, &other);
    let f = Frame::tcp(443, &other).from_port(50).seq(1).build();
    assert_eq!(class_of(&prog, Hook::Xdp, &f), Some(Class::TlsResumed));
}

/// A resumed connection whose socket the daemon found gone (its client reset it, so no FIN
/// from the server follows) gives its key's place back at the next TLS sweep: the daemon marks
/// the hold and runs the sweep program, as its watch does; the datapath alone changes the
/// count. The datapath's own sweep is not due until a timeout of the class has passed (no unit
/// or hold of the table expires sooner), so until the daemon's sweep the place stays held.
#[test]
fn a_hold_marked_gone_gives_its_place_back_at_the_next_sweep() {
    if !have_root("a_hold_marked_gone_gives_its_place_back") {
        return;
    }
    let mut prog = TestProgram::new();
    // A timeout no test run outlasts: the datapath's own sweep is not due before it.
    let long = gateway_common::policy::Policy {
        timeout: Some(std::time::Duration::from_secs(600)),
        ..Default::default()
    };
    prog.maps
        .set_policy(Class::TlsResumed, long.to_map())
        .unwrap();
    let (hello, _) = published_session(
        &mut prog,
        12,
        IssuedValue {
            limit: 1,
            per_minute: u32::MAX,
            ..Default::default()
        },
    );
    let from = |port: u16| Frame::tcp(443, &hello).from_port(port).seq(1).build();
    assert_eq!(
        class_of(&prog, Hook::Xdp, &from(1)),
        Some(Class::TlsResumed)
    );
    prog.run(Hook::TcEgress, &server_hello_to(1), 1);
    let holds = prog.maps.tls_holds().unwrap();
    assert_eq!(holds.len(), 1);
    assert_eq!(class_of(&prog, Hook::Xdp, &from(2)), Some(Class::TlsNew));
    let (flow, hold) = holds[0];
    assert!(prog.maps.mark_tls_hold_gone(&flow, hold).unwrap());
    assert_eq!(
        class_of(&prog, Hook::Xdp, &from(3)),
        Some(Class::TlsNew),
        "marked, not yet swept: the place is still held"
    );
    prog.load_sweep();
    prog.run(Hook::Sweep, &from(4), 1);
    assert!(prog.maps.tls_holds().unwrap().is_empty());
    assert_eq!(
        class_of(&prog, Hook::Xdp, &from(5)),
        Some(Class::TlsResumed)
    );
}

/// Issue 28: no key is evicted by load. The issued-keys table is a hash map, not an LRU: after
/// 100,000 more keys offered to a table of 65,536, the first key published still verifies, and
/// the table refuses what does not fit (E2BIG, which the daemon counts as unpublished).
#[test]
fn a_full_issued_keys_table_refuses_new_keys_and_keeps_the_first() {
    if !have_root("a_full_issued_keys_table_refuses_new_keys") {
        return;
    }
    let mut prog = TestProgram::new();
    let hello = HelloBuilder {
        session_id: key(11),
        ..Default::default()
    }
    .build();
    publish(&mut prog, &hello);
    let (mut added, mut full) = (0u32, 0u32);
    for i in 0..100_000u32 {
        let mut k = [0u8; gateway_common::tls::KEY_LEN];
        k[..4].copy_from_slice(&i.to_le_bytes());
        k[4] = 0xee;
        match prog
            .maps
            .add_issued(IssuedKey { key: k }, IssuedValue::default())
        {
            Ok(()) => added += 1,
            Err(e) if e.is_full() => full += 1,
            Err(e) => panic!("key {i}: {e}"),
        }
    }
    let size = gateway_common::maps::DEFAULT_TLS_ISSUED;
    assert_eq!(added, size - 1, "the table holds its size");
    assert_eq!(full, 100_000 - (size - 1));
    let f = Frame::tcp(443, &hello).from_port(7).seq(1).build();
    assert_eq!(class_of(&prog, Hook::Xdp, &f), Some(Class::TlsResumed));
}

/// The hello segment of `frame` from client port `port`: sequence number 1000, PSH|ACK, the
/// client having acknowledged the server's SYN-ACK up to 777; with the offset of its TCP header
/// (`hello_len` bytes of payload follow it).
fn hello_segment(frame: Frame, port: u16, hello_len: usize) -> (Vec<u8>, usize) {
    let mut f = frame.from_port(port).seq(1000).flags(0x18).build();
    let l4 = f.len() - hello_len - 20;
    f[l4 + 8..l4 + 12].copy_from_slice(&777u32.to_be_bytes());
    (f, l4)
}

#[test]
fn a_refused_hello_is_answered_with_a_reset_from_the_nic() {
    if !have_root("a_refused_hello_is_answered_with_a_reset_from_the_nic") {
        return;
    }
    let mut prog = TestProgram::new();
    close_tls_new(&mut prog);
    let hello = HelloBuilder::default().build();
    const XDP_TX: u32 = XDP_REFUSED;
    for (i, (name, frame)) in [
        ("ipv4", Frame::tcp(443, &hello)),
        ("ipv6", Frame::tcp(443, &hello).ipv6(&[])),
        ("802.1Q", Frame::tcp(443, &hello).vlan(0x8100)),
        (
            "802.1ad + 802.1Q, ipv6",
            Frame::tcp(443, &hello).vlan(0x88a8).vlan(0x8100).ipv6(&[]),
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let (f, l4) = hello_segment(frame, 3000 + i as u16, hello.len());
        let before = prog.counters().tls;
        let (action, out) = prog.run_out(&f);
        assert_eq!(action, XDP_TX, "{name}");
        assert_eq!(
            out.len(),
            l4 + 20,
            "{name}: headers only, never longer than the hello"
        );
        assert_eq!(
            (&out[..6], &out[6..12]),
            (&f[6..12], &f[..6]),
            "{name}: MACs"
        );
        let v4 = !name.contains("ipv6");
        let l3 = l4 - if v4 { 20 } else { 40 };
        assert_eq!(
            out[12..l3],
            f[12..l3],
            "{name}: VLAN tags and EtherType kept"
        );
        let ip = &out[l3..l4];
        let pseudo = if v4 {
            assert_eq!(
                (&ip[12..16], &ip[16..20]),
                (&f[l3 + 16..l3 + 20], &f[l3 + 12..l3 + 16])
            );
            assert_eq!(
                u16::from_be_bytes([ip[2], ip[3]]),
                40,
                "{name}: IPv4 total length"
            );
            assert_eq!(ones_sum(ip), 0xffff, "{name}: IPv4 header checksum");
            [&ip[12..20], &[0, 6, 0, 20][..]].concat()
        } else {
            assert_eq!(
                (&ip[8..24], &ip[24..40]),
                (&f[l3 + 24..l3 + 40], &f[l3 + 8..l3 + 24])
            );
            assert_eq!(
                u16::from_be_bytes([ip[4], ip[5]]),
                20,
                "{name}: IPv6 payload length"
            );
            [&ip[8..40], &[0, 0, 0, 20, 0, 0, 0, 6][..]].concat()
        };
        let tcp = &out[l4..];
        assert_eq!(
            (&tcp[0..2], &tcp[2..4]),
            (&f[l4 + 2..l4 + 4], &f[l4..l4 + 2]),
            "{name}: ports"
        );
        assert_eq!(
            u32::from_be_bytes(tcp[4..8].try_into().unwrap()),
            777,
            "{name}: seq"
        );
        assert_eq!(
            u32::from_be_bytes(tcp[8..12].try_into().unwrap()),
            1000 + hello.len() as u32,
            "{name}: ack"
        );
        assert_eq!(tcp[13], 0x14, "{name}: RST|ACK");
        assert_eq!(
            ones_sum(&[&pseudo[..], tcp].concat()),
            0xffff,
            "{name}: TCP checksum"
        );
        let after = prog.counters().tls;
        assert_eq!(after.resets_sent, before.resets_sent + 1, "{name}");
    }
    // A segment with IPv4 options (any client may set them): the options taken out, and the
    // reset made as for any other (issue 52, case 3: before, dropped unanswered).
    let f = Frame::tcp(443, &hello)
        .from_port(4000)
        .ipv4_options(4)
        .build();
    let before = prog.counters();
    let (action, out) = prog.run_out(&f);
    assert_eq!(action, XDP_TX);
    // Checked as the answer to the same segment without options.
    let plain = Frame::tcp(443, &hello).from_port(4000).build();
    let reset = check_rewritten(&plain, &out, true).expect("a plain reset");
    assert_eq!(out.len(), 14 + 20 + 20, "no options, no payload");
    assert_eq!(reset.segment[13], 0x14, "RST|ACK");
    let after = prog.counters();
    assert_eq!(after.tls.resets_sent, before.tls.resets_sent + 1);
    assert_eq!(after.tls.resets_withheld, before.tls.resets_withheld);
    assert_eq!(
        after.datapath.ip_options_removed,
        before.datapath.ip_options_removed + 1
    );
    // Likewise an IPv6 segment behind a destination options header: the header taken out.
    let f = Frame::tcp(443, &hello)
        .from_port(4001)
        .ipv6(&[(ext::DEST_OPTS, 16)])
        .build();
    let before = prog.counters();
    let (action, out) = prog.run_out(&f);
    assert_eq!(action, XDP_TX);
    let plain = Frame::tcp(443, &hello).from_port(4001).ipv6(&[]).build();
    let reset = check_rewritten(&plain, &out, true).expect("a plain IPv6 reset");
    assert_eq!(out.len(), 14 + 40 + 20, "no extension header, no payload");
    assert_eq!(reset.segment[13], 0x14, "RST|ACK");
    assert_eq!(
        prog.counters().datapath.ip_options_removed,
        before.datapath.ip_options_removed + 1
    );
    // The client's own reset on a refused connection passes, so the server's socket ends too;
    // its other segments are answered again.
    let rst = Frame::tcp(443, &[])
        .from_port(3000)
        .seq(1000 + hello.len() as u32)
        .flags(0x04)
        .build();
    assert_eq!(prog.run(Hook::Xdp, &rst, 1).0, XDP_PASS);
    let again = Frame::tcp(443, &[23, 3, 3, 0, 1, 0])
        .from_port(3000)
        .seq(2000)
        .flags(0x18)
        .build();
    assert_eq!(prog.run_out(&again).0, XDP_TX);

    if !gateway::datapath::loader::xdp_metadata() {
        eprintln!(
            "a_refused_hello_is_answered_with_a_reset_from_the_nic: the handover in metadata not tried: this kernel refuses XDP programs bpf_xdp_adjust_meta"
        );
        return;
    }
    // XDP with the finishing program attached: the frame becomes the server's reset in place
    // (same direction, the hello's own sequence number), handed to the stack with the client's
    // acknowledgement number in metadata for the finishing program at TC ingress.
    let cfg = prog.maps.config().unwrap();
    prog.maps
        .set_config(gateway_common::maps::DatapathConfig { finisher: 1, ..cfg })
        .unwrap();
    let (f, _) = hello_segment(Frame::tcp(443, &hello), 4500, hello.len());
    let (action, out) = prog.run_out(&f);
    assert_eq!(action, XDP_PASS);
    // The test run returns the metadata in front of the frame.
    let (meta, out) = out.split_at(8);
    assert_eq!(&meta[..4], &prog.meta_tag(b"GWRS"));
    assert_eq!(meta[4..8], (1000 + hello.len() as u32).to_ne_bytes());
    let server = check_rewritten(&f, out, false).unwrap();
    assert_eq!(server.segment.len(), 20);
    assert_eq!(
        u32::from_be_bytes(server.segment[4..8].try_into().unwrap()),
        1000
    );
    assert_eq!(
        u32::from_be_bytes(server.segment[8..12].try_into().unwrap()),
        777
    );
    assert_eq!(server.segment[13], 0x14, "RST|ACK");
    prog.maps
        .set_config(gateway_common::maps::DatapathConfig { finisher: 0, ..cfg })
        .unwrap();

    // The TC hook answers both ends: the client's reset goes out as a copy, and the frame,
    // turned back, becomes a reset of the server's socket with the hello's own sequence number
    // (the one the server expects next), handed to the local stack.
    for (i, (name, frame)) in [
        ("ipv4", Frame::tcp(443, &hello)),
        ("ipv6", Frame::tcp(443, &hello).ipv6(&[])),
    ]
    .into_iter()
    .enumerate()
    {
        let (f, _) = hello_segment(frame, 5000 + i as u16, hello.len());
        let before = prog.counters().tls;
        let (action, out) = prog.run_out_on(Hook::Tc, &f);
        assert_eq!(action, TC_RESET, "{name}");
        let server = check_rewritten(&f, &out, false).unwrap_or_else(|e| panic!("{name}: {e}"));
        let tcp = &server.segment;
        assert_eq!(tcp.len(), 20, "{name}: headers only");
        assert_eq!(
            u32::from_be_bytes(tcp[4..8].try_into().unwrap()),
            1000,
            "{name}: seq"
        );
        assert_eq!(
            u32::from_be_bytes(tcp[8..12].try_into().unwrap()),
            777,
            "{name}: ack"
        );
        assert_eq!(tcp[13], 0x14, "{name}: RST|ACK");
        assert_eq!(
            prog.counters().tls.resets_sent,
            before.resets_sent + 1,
            "{name}"
        );
    }
}

/// A flood of refused hellos (tls-new closed, refusals dropped) makes no flow entry: each is
/// remembered in its slot of `TLS_REFUSED` instead of an LRU insert, so an admitted connection's
/// entry is not evicted by twice as many refused connections as the flow table holds, and the
/// refused ones' retransmissions are still refused.
#[test]
fn a_flood_of_refused_hellos_evicts_no_admitted_connection() {
    if !have_root("a_flood_of_refused_hellos_evicts_no_admitted_connection") {
        return;
    }
    use gateway_common::maps::{FRESH_PORT, MAX_TLS_FLOWS, TLS_REFUSED_SLOTS};
    let mut prog = TestProgram::new();
    let hello = HelloBuilder::default().build();
    // An admitted connection, over IPv6 (the flood's source ports cover every IPv4 one).
    let admitted = Frame::tcp(443, &hello)
        .ipv6(&[])
        .from_port(7)
        .seq(1)
        .build();
    assert_eq!(prog.run(Hook::Xdp, &admitted, 1).0, XDP_PASS);
    assert_eq!(prog.maps.tls_flows().unwrap().len(), 1);
    set_policy(
        &mut prog,
        Class::TlsNew,
        gateway_common::policy::Policy {
            rate: Some(0),
            burst: Some(0),
            refuse: Some(gateway_common::policy::Refuse::Drop),
            ..Default::default()
        },
    );
    let c = Class::TlsNew.id() as usize;
    let before = prog.counters();
    // Twice as many distinct connections as the flow table holds: every source port, from two
    // client addresses.
    for client in [2u8, 3] {
        let mut flood = Frame::tcp(443, &hello).seq(1).build();
        // The IPv4 source address's last byte (no checksum is checked).
        flood[14 + 15] = client;
        prog.freshen(14 + 20, FRESH_PORT);
        assert_eq!(prog.run(Hook::Fresh, &flood, MAX_TLS_FLOWS).0, XDP_DROP);
    }
    let after = prog.counters();
    assert_eq!(
        after.classes[c].packets - before.classes[c].packets,
        2 * u64::from(MAX_TLS_FLOWS)
    );
    assert_eq!(
        (
            after.classes[c].admitted - before.classes[c].admitted,
            after.classes[c].dropped_rate - before.classes[c].dropped_rate
        ),
        (0, 2 * u64::from(MAX_TLS_FLOWS)),
        "every hello of the flood was refused by the rate limit"
    );
    // The admitted connection's entry is the only one: the flood made none, so evicted none.
    let flows = prog.maps.tls_flows().unwrap();
    assert_eq!(flows.len(), 1, "{} flow entries", flows.len());
    assert_eq!(flows[0].0.sport, 7);
    // The refused connections are remembered by slot, as many as there are slots at most.
    let remembered = prog.maps.tls_refused().unwrap();
    assert!(
        remembered.len() > TLS_REFUSED_SLOTS as usize / 2
            && remembered.len() <= TLS_REFUSED_SLOTS as usize,
        "{} refused connections remembered",
        remembered.len()
    );
    // A remembered one's retransmission is refused again by its slot (answered as tls-flow
    // refusals are: reset), not judged afresh.
    let last = remembered[0];
    let mut again = Frame::tcp(443, &hello).from_port(last.sport).seq(1).build();
    again[14 + 15] = last.saddr[15];
    let judged = prog.counters();
    assert_eq!(prog.run(Hook::Xdp, &again, 1).0, XDP_REFUSED);
    let now = prog.counters();
    assert_eq!(
        now.tls.rejected_flow_packets,
        judged.tls.rejected_flow_packets + 1
    );
    assert_eq!(
        now.classes[c].packets, judged.classes[c].packets,
        "not judged again"
    );
}

/// Issue 26's upgrades, for a release that adds a map: this build starts on the maps pinned by
/// a build before `TLS_REFUSED` (simulated by removing that one pin), adopting every other map
/// with what it holds (an admitted connection's entry) and creating the added one, which its
/// program then uses.
#[test]
fn a_build_that_adds_a_map_adopts_a_datapath_pinned_without_it() {
    if !have_root("a_build_that_adds_a_map_adopts_a_datapath_pinned_without_it") {
        return;
    }
    use aya::programs::{TestRun, TestRunOptions, Xdp};
    use gateway_common::{
        maps::{DEFAULT_TLS_ISSUED, FLOW_ADMITTED, names},
        programs,
    };
    let mut prog = TestProgram::new();
    let hello = HelloBuilder::default().build();
    let admitted = Frame::tcp(443, &hello).from_port(5).seq(1).build();
    assert_eq!(prog.run(Hook::Xdp, &admitted, 1).0, XDP_PASS);
    let added = prog.pins.map(names::TLS_REFUSED);
    std::fs::remove_file(&added).unwrap();
    let mut ebpf = gateway::datapath::loader::load_pinned_object(
        &prog.pins,
        0,
        DEFAULT_TLS_ISSUED,
        gateway::EBPF_OBJECT,
    )
    .expect("this build adopts the older pins");
    assert!(added.exists(), "the added map is pinned");
    let flows = prog.maps.tls_flows().unwrap();
    assert_eq!(flows.len(), 1, "the admitted connection's entry is kept");
    assert_eq!((flows[0].0.sport, flows[0].1.state), (5, FLOW_ADMITTED));
    assert!(prog.maps.tls_refused().unwrap().is_empty());
    // The new program refuses a hello (tls-new closed, refusals dropped: no jump to the reply
    // program, which this load did not wire) into the added map.
    set_policy(
        &mut prog,
        Class::TlsNew,
        gateway_common::policy::Policy {
            backlog: Some(0),
            refuse: Some(gateway_common::policy::Refuse::Drop),
            ..Default::default()
        },
    );
    let xdp: &mut Xdp = ebpf.program_mut(programs::XDP).unwrap().try_into().unwrap();
    xdp.load().unwrap();
    let refused = Frame::tcp(443, &hello).from_port(6).seq(1).build();
    let r = xdp
        .test_run(TestRunOptions {
            data_in: Some(&refused),
            repeat: 1,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(r.return_value, XDP_DROP);
    let remembered = prog.maps.tls_refused().unwrap();
    assert_eq!(remembered.len(), 1);
    assert_eq!(remembered[0].sport, 6);
}

/// A resumed connection the server answered while the holds table is full takes no hold: its
/// key's place is given back at once (so the next offer of the key finds it free) and the
/// datapath counts it (`holds_full`), where it used to go uncounted.
#[test]
fn a_full_holds_table_gives_the_place_back_and_counts_it() {
    if !have_root("a_full_holds_table_gives_the_place_back_and_counts_it") {
        return;
    }
    use aya::maps::{HashMap, MapData};
    use gateway_common::maps::{FlowKey, MAX_PENDING, TlsHold, names};
    let mut prog = TestProgram::new();
    let (hello, _) = published_session(
        &mut prog,
        13,
        IssuedValue {
            limit: 1,
            per_minute: u32::MAX,
            ..Default::default()
        },
    );
    // Every place of the table taken by other connections, none of them old enough to end.
    let mut holds: HashMap<MapData, FlowKey, TlsHold> =
        gateway::datapath::maps::open_as(&prog.pins, names::TLS_HOLDS).unwrap();
    let since_ns = gateway::datapath::maps::monotonic_ns();
    for i in 0..MAX_PENDING {
        let mut saddr = [0u8; 16];
        saddr[..4].copy_from_slice(&i.to_be_bytes());
        let flow = FlowKey {
            saddr,
            sport: 9,
            dport: 443,
            ..Default::default()
        };
        let hold = TlsHold {
            since_ns,
            ..Default::default()
        };
        holds.insert(flow, hold, 0).unwrap();
    }
    let from = |port: u16| Frame::tcp(443, &hello).from_port(port).seq(1).build();
    assert_eq!(
        class_of(&prog, Hook::Xdp, &from(1)),
        Some(Class::TlsResumed)
    );
    prog.run(Hook::TcEgress, &server_hello_to(1), 1);
    let c = prog.maps.tls_counters().unwrap();
    assert_eq!((c.completions, c.holds_full), (1, 1), "{c:?}");
    assert_eq!(prog.maps.tls_holds().unwrap().len(), MAX_PENDING as usize);
    // The key's one place was given back: the next offer is resumed too.
    assert_eq!(
        class_of(&prog, Hook::Xdp, &from(2)),
        Some(Class::TlsResumed)
    );
}

/// Issue 25's IPv4 flow table under issue 26's upgrades: the IPv4 connections a build before
/// `TLS_FLOWS4` kept in `TLS_FLOWS` (by their IPv4-mapped keys) are moved to `TLS_FLOWS4`,
/// where this build's program goes on with them: a hello half parsed under the older build is
/// decided by its second segment (resumed), not judged afresh. IPv6 connections stay where they
/// are. An IPv4 entry left in `TLS_FLOWS` is one this build's program never reads.
#[test]
fn an_upgrade_moves_the_ipv4_flows_an_older_build_kept_beside_the_ipv6_ones() {
    if !have_root("an_upgrade_moves_the_ipv4_flows_an_older_build_kept") {
        return;
    }
    use aya::maps::{HashMap, MapData};
    use gateway::{datapath::maps::open_as, datapath::rekey::Moving};
    use gateway_common::maps::{
        FLOW_ADMITTED, FLOW_PENDING, FLOW_REJECTED, FlowKey, FlowKey4, TlsFlow, names,
    };
    let mut prog = TestProgram::new();
    let (hello, cut) = split_hello();
    publish(&mut prog, &hello);
    let mut v4: HashMap<MapData, FlowKey4, TlsFlow> =
        open_as(&prog.pins, names::TLS_FLOWS4).unwrap();
    let mut v6: HashMap<MapData, FlowKey, TlsFlow> = open_as(&prog.pins, names::TLS_FLOWS).unwrap();
    // The hello's first segment under "the older build": its pending flow where that build
    // kept it.
    let as_older_build_kept = |v4: &mut HashMap<MapData, FlowKey4, TlsFlow>,
                               v6: &mut HashMap<MapData, FlowKey, TlsFlow>,
                               first: &[u8],
                               port: u16| {
        assert_eq!(class_of(&prog, Hook::Xdp, first), Some(Class::TlsFlow));
        let entries: Vec<_> = v4
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .unwrap()
            .into_iter()
            .filter(|(k, _)| k.sport == port)
            .collect();
        assert_eq!(
            entries.len(),
            1,
            "the pending hello's flow is in TLS_FLOWS4"
        );
        let (key, flow) = entries[0];
        assert_eq!(flow.state, FLOW_PENDING);
        v4.remove(&key).unwrap();
        v6.insert(key.mapped(), flow, 0).unwrap();
        key
    };
    let (first, second) = split_frames(&hello, cut, 40003, 7000, 0);
    let key = as_older_build_kept(&mut v4, &mut v6, &first, 40003);
    // An admitted IPv6 connection, which stays.
    let ipv6 = Frame::tcp(443, &HelloBuilder::default().build())
        .ipv6(&[])
        .from_port(41)
        .seq(1)
        .build();
    assert_eq!(class_of(&prog, Hook::Xdp, &ipv6), Some(Class::TlsNew));

    // A copy an earlier, failed start left in TLS_FLOWS4 (no program of this build ran on it),
    // older than what the older build's map holds now: the older map's value wins.
    let stale = TlsFlow {
        state: FLOW_REJECTED,
        ..v6.get(&key.mapped(), 0).unwrap()
    };
    v4.insert(key, stale, 0).unwrap();

    // An upgrade finds the older build's programs in the jump tables, which do not know
    // TLS_FLOWS4; a test run loads this build's there (its reply program sets the state of
    // a carried hello's flow in TLS_FLOWS4), which would say the move already happened. Emptied
    // here: nothing this test sends jumps.
    for table in [names::XDP_JUMP, names::TC_JUMP] {
        let data = MapData::from_pin(prog.pins.map(table)).unwrap();
        let mut jumps =
            aya::maps::ProgramArray::try_from(aya::maps::Map::ProgramArray(data)).unwrap();
        for slot in 0..gateway_common::programs::Jump::ALL.len() as u32 {
            let _ = jumps.clear_index(&slot);
        }
    }
    let moved = Moving::begin(&prog.pins).unwrap().finish().unwrap();
    assert_eq!(moved.len(), 1);
    assert_eq!(
        (moved[0].from, moved[0].to, moved[0].entries),
        (names::TLS_FLOWS, names::TLS_FLOWS4, 1)
    );
    let left: Vec<FlowKey> = v6.keys().collect::<Result<_, _>>().unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!((left[0].v4(), left[0].sport), (None, 41), "the IPv6 one");
    assert_eq!(v4.get(&key, 0).unwrap().state, FLOW_PENDING);
    let before = prog.counters();
    assert_eq!(
        class_of(&prog, Hook::Xdp, &second),
        Some(Class::TlsResumed),
        "the moved hello goes on where the older build left it"
    );
    assert_eq!(prog.counters().tls.malformed, before.tls.malformed);
    assert_eq!(v4.get(&key, 0).unwrap().state, FLOW_ADMITTED);

    // Not moved, the same hello's second segment is judged afresh, as a connection this
    // build's program does not know: a malformed hello, never resumed.
    let (first, second) = split_frames(&hello, cut, 40004, 9000, 0);
    as_older_build_kept(&mut v4, &mut v6, &first, 40004);
    let before = prog.counters();
    assert_eq!(class_of(&prog, Hook::Xdp, &second), Some(Class::TlsNew));
    assert_eq!(prog.counters().tls.malformed, before.tls.malformed + 1);
}

/// Both TLS classes' units are in one table, whose pass is due at the earliest deadline held
/// (not every 100 ms per class) and is run by an arrival of either class: a `tls-new` unit,
/// once past its deadline, ends at the next resumed hello, as when each class swept every
/// 100 ms. Here only a resumed hello comes after it. The table's schedule is kept in
/// `tls-new`'s `sweep_ns`, the holds' (an hour away) in `tls-flow`'s.
#[test]
fn a_new_connections_unit_ends_at_a_resumed_arrival_past_its_deadline() {
    if !have_root("a_new_connections_unit_ends_at_a_resumed_arrival") {
        return;
    }
    use gateway::datapath::maps::monotonic_ns;
    use std::time::{Duration, Instant};
    let mut prog = TestProgram::new();
    let (resumed, _) = published_session(
        &mut prog,
        13,
        IssuedValue {
            limit: 8,
            per_minute: u32::MAX,
            ..Default::default()
        },
    );
    let state = |prog: &TestProgram, class: Class| prog.maps.class_state().unwrap()[class as usize];
    let timeout = |t: Duration| {
        gateway_common::policy::Policy {
            timeout: Some(t),
            ..Default::default()
        }
        .to_map()
    };
    // Timeouts no test run outlasts.
    for class in [Class::TlsNew, Class::TlsResumed] {
        prog.maps
            .set_policy(class, timeout(Duration::from_secs(600)))
            .unwrap();
    }
    let resumed_from = |port: u16| Frame::tcp(443, &resumed).from_port(port).seq(1).build();
    // The passes, due at once, find nothing: the table's next is a timeout away, the holds'
    // an hour.
    assert_eq!(
        class_of(&prog, Hook::Xdp, &resumed_from(1)),
        Some(Class::TlsResumed)
    );
    let after_first = state(&prog, Class::TlsNew).sweep_ns;
    assert!(
        after_first > monotonic_ns() + 60_000_000_000,
        "due {after_first}"
    );
    let holds = state(&prog, Class::TlsFlow).sweep_ns;
    assert!(
        holds > monotonic_ns() + 3_000_000_000_000,
        "the holds' pass is due an hour after the first: {holds}"
    );
    // A new connection's unit of a short timeout brings the table's pass forward.
    prog.maps
        .set_policy(Class::TlsNew, timeout(Duration::from_millis(300)))
        .unwrap();
    let new = HelloBuilder::default().build();
    assert_eq!(
        class_of(
            &prog,
            Hook::Xdp,
            &Frame::tcp(443, &new).from_port(2).seq(1).build()
        ),
        Some(Class::TlsNew)
    );
    let unit = prog
        .maps
        .tls_pending()
        .unwrap()
        .into_iter()
        .map(|(_, u)| u)
        .find(|u| u.class == Class::TlsNew.id())
        .expect("the new connection's unit");
    assert_eq!(unit.deadline_ns, unit.admitted_ns + 300_000_000);
    assert_eq!(state(&prog, Class::TlsNew).sweep_ns, unit.deadline_ns);
    // Past its deadline (time itself is what this waits for, bounded), a resumed hello's pass
    // ends it.
    let until = Instant::now() + Duration::from_secs(10);
    while monotonic_ns() <= unit.deadline_ns {
        assert!(
            Instant::now() < until,
            "the clock did not pass the deadline"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let expired = state(&prog, Class::TlsNew).expired;
    assert_eq!(
        class_of(&prog, Hook::Xdp, &resumed_from(3)),
        Some(Class::TlsResumed)
    );
    assert_eq!(state(&prog, Class::TlsNew).expired, expired + 1);
    assert!(
        prog.maps
            .tls_pending()
            .unwrap()
            .iter()
            .all(|(_, u)| u.class != Class::TlsNew.id()),
        "no new connection's unit is left"
    );
}
