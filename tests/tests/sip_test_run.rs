//! SIP classification through the real program (BPF_PROG_TEST_RUN, XDP and TC): originals,
//! retransmissions by transaction key (the marker only demotes), exempt messages, and bad input.

use gateway_common::Class;
use gateway_tests::{
    frames::Frame,
    have_root,
    testrun::{Hook, TestProgram},
};

fn invite(branch: &str, extra_uri: &str) -> Vec<u8> {
    format!(
        "INVITE sip:service@10.99.0.1:5060{extra_uri} SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.99.0.2:5061;branch={branch}\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\n\
To: service <sip:service@10.99.0.1:5060>\r\n\
Call-ID: 1-{branch}@10.99.0.2\r\n\
CSeq: 1 INVITE\r\n\
Contact: sip:sipp@10.99.0.2:5061\r\n\
Max-Forwards: 70\r\n\
Content-Type: application/sdp\r\n\
Content-Length: 0\r\n\r\n"
    )
    .into_bytes()
}

/// The CANCEL of [`invite`]`(branch, "")`.
fn cancel(branch: &str) -> String {
    String::from_utf8(invite(branch, ""))
        .unwrap()
        .replacen("INVITE sip", "CANCEL sip", 1)
        .replacen("CSeq: 1 INVITE", "CSeq: 1 CANCEL", 1)
}

fn class_of(prog: &TestProgram, hook: Hook, payload: &[u8]) -> Option<Class> {
    let before = prog.counters();
    prog.run(hook, &Frame::udp(5060, payload).build(), 1);
    prog.counters().class_since(&before)
}

#[test]
fn a_request_seen_before_is_a_retransmission() {
    if !have_root("a_request_seen_before_is_a_retransmission") {
        return;
    }
    let prog = TestProgram::new();
    let first = invite("z9hG4bK-1", "");
    // The original through XDP, its retransmissions through XDP and TC (one table).
    assert_eq!(class_of(&prog, Hook::Xdp, &first), Some(Class::SipOriginal));
    assert_eq!(
        class_of(&prog, Hook::Xdp, &first),
        Some(Class::SipRetransmission)
    );
    assert_eq!(
        class_of(&prog, Hook::Tc, &first),
        Some(Class::SipRetransmission)
    );
    let txns = prog.maps.sip_txns().unwrap();
    assert_eq!(txns.len(), 1);
    assert_eq!(txns[0].1.requests, 3);
    // Another transaction (another branch) is an original.
    assert_eq!(
        class_of(&prog, Hook::Tc, &invite("z9hG4bK-2", "")),
        Some(Class::SipOriginal)
    );
    // The same transaction written in compact form is still a retransmission.
    let compact = b"INVITE sip:service@10.99.0.1:5060 SIP/2.0\r\n\
v: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-1\r\n\
i: 1-z9hG4bK-1@10.99.0.2\r\n\
cseq: 1 INVITE\r\n\r\n";
    assert_eq!(
        class_of(&prog, Hook::Xdp, compact),
        Some(Class::SipRetransmission)
    );
}

/// Retransmissions of admitted work are never refused while the server answers (the
/// controller holds their threshold at the originals' upper bound), so one admitted request
/// buys at most `MAX_TXN_COPIES` copies: as many as an RFC 3261 client sends within Timer F;
/// past them a copy is refused and counted.
#[test]
fn an_admitted_request_buys_at_most_max_txn_copies_copies() {
    use gateway_common::maps::MAX_TXN_COPIES;
    if !have_root("an_admitted_request_buys_at_most_max_txn_copies") {
        return;
    }
    let prog = TestProgram::new();
    let first = invite("z9hG4bK-copies", "");
    assert_eq!(action(&prog, &first), XDP_PASS);
    for n in 1..=MAX_TXN_COPIES {
        assert_eq!(action(&prog, &first), XDP_PASS, "copy {n}");
    }
    let before = prog.counters();
    assert_ne!(action(&prog, &first), XDP_PASS, "a copy past the bound");
    assert_eq!(
        prog.counters().class_since(&before),
        Some(Class::SipRetransmission)
    );
    assert_eq!(prog.counters().datapath.sip_copies_over, 1);
    // Another transaction has its own.
    assert_eq!(action(&prog, &invite("z9hG4bK-copies-2", "")), XDP_PASS);
}

#[test]
fn the_request_line_marker_only_demotes() {
    if !have_root("the_request_line_marker") {
        return;
    }
    let mut prog = TestProgram::new();
    // sip-original closed by rate: marked fresh INVITEs obey it like unmarked ones.
    set(&mut prog, Class::SipOriginal, None, Some(0));
    for hook in [Hook::Xdp, Hook::Tc] {
        for n in 0..20 {
            let marked = invite(&format!("z9hG4bK-m{hook:?}{n}"), ";x-retransmit");
            assert_eq!(
                class_of(&prog, hook, &marked),
                Some(Class::SipOriginal),
                "{hook:?}"
            );
        }
    }
    let c = prog.counters().classes[Class::SipOriginal.id() as usize];
    assert_eq!((c.admitted, c.dropped_rate), (0, 40));
    // Marked, a request that would be exempt is a retransmission.
    let bye = "BYE sip:s@h;x-retransmit SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-b\r\nCSeq: 2 BYE\r\n\r\n";
    assert_eq!(
        class_of(&prog, Hook::Xdp, bye.as_bytes()),
        Some(Class::SipRetransmission)
    );
}

#[test]
fn fresh_invites_reusing_a_known_branch_are_originals() {
    if !have_root("fresh_invites_reusing_a_known_branch") {
        return;
    }
    let prog = TestProgram::new();
    let first = invite("z9hG4bK-shared", "");
    assert_eq!(class_of(&prog, Hook::Xdp, &first), Some(Class::SipOriginal));
    assert_eq!(
        class_of(&prog, Hook::Xdp, &first),
        Some(Class::SipRetransmission),
        "a byte-identical retransmission"
    );
    // Same branch and sent-by, another Call-ID or CSeq number: new work, not a free ride.
    let text = String::from_utf8(first).unwrap();
    for fresh in [
        text.replacen("Call-ID: 1-", "Call-ID: 2-", 1),
        text.replacen("CSeq: 1 INVITE", "CSeq: 2 INVITE", 1),
    ] {
        assert_eq!(
            class_of(&prog, Hook::Xdp, fresh.as_bytes()),
            Some(Class::SipOriginal)
        );
    }
}

/// A request of the dialog the SIPp-like caller of [`invite`] has with the server, once the
/// server answered `branch`'s INVITE with 200 (its tag `srv`).
fn in_dialog(method: &str, branch: &str, cseq: u32, tag: &str) -> String {
    format!(
        "{method} sip:service@10.99.0.1:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.99.0.2:5061;branch={branch}-{method}\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\n\
To: service <sip:service@10.99.0.1:5060>;tag={tag}\r\n\
Call-ID: 1-{branch}@10.99.0.2\r\n\
CSeq: {cseq} {method}\r\n\r\n"
    )
}

/// The server's 200 OK to `branch`'s INVITE, with its tag `srv`, leaving through egress.
fn server_ok(prog: &TestProgram, branch: &str) {
    let ok = format!(
        "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch={branch}\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\n\
To: service <sip:service@10.99.0.1:5060>;tag=srv\r\n\
Call-ID: 1-{branch}@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n"
    );
    prog.run(
        Hook::TcEgress,
        &Frame::udp(5061, ok.as_bytes()).from_port(5060).build(),
        1,
    );
}

#[test]
fn exemptions_are_earned_from_what_the_server_made() {
    if !have_root("exemptions_are_earned") {
        return;
    }
    let mut prog = TestProgram::new();
    // sip-original closed: only what is really exempt gets through.
    set(&mut prog, Class::SipOriginal, None, Some(0));
    let unearned = prog.counters().datapath.sip_unearned;
    // Forged: a To tag, a BYE, an ACK and a CANCEL of no dialog or transaction the server made.
    let forged = |branch: &str| {
        [
            in_dialog("INVITE", branch, 2, "forged"),
            in_dialog("BYE", branch, 3, "forged"),
            in_dialog("ACK", branch, 1, "forged"),
            cancel(branch),
        ]
    };
    for hook in [Hook::Xdp, Hook::Tc] {
        for msg in forged(&format!("z9hG4bK-f{hook:?}")) {
            assert_eq!(
                class_of(&prog, hook, msg.as_bytes()),
                Some(Class::SipOriginal),
                "{hook:?} {msg}"
            );
        }
    }
    assert_eq!(prog.counters().datapath.sip_unearned - unearned, 8);
    // An INVITE that was refused (or any request naming CSeq INVITE) buys its CANCEL nothing:
    // only an INVITE the server took on does (found by the mutation campaign).
    assert_eq!(action(&prog, &invite("z9hG4bK-r", "")), XDP_DROP);
    assert_eq!(
        class_of(&prog, Hook::Xdp, cancel("z9hG4bK-r").as_bytes()),
        Some(Class::SipOriginal)
    );
    let orig = prog.counters().classes[Class::SipOriginal.id() as usize];
    assert_eq!(orig.admitted, 0, "none reached the server");
    // Responses stay exempt.
    let trying = "SIP/2.0 100 Trying\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-d\r\nCSeq: 1 INVITE\r\n\r\n";
    assert_eq!(action(&prog, trying.as_bytes()), XDP_PASS);
    // A real dialog: the INVITE (admitted while open), the server's 200 OK, then its ACK,
    // re-INVITE and BYE are exempt with sip-original closed again.
    set(&mut prog, Class::SipOriginal, None, None);
    assert_eq!(action(&prog, &invite("z9hG4bK-d", "")), XDP_PASS);
    server_ok(&prog, "z9hG4bK-d");
    set(&mut prog, Class::SipOriginal, None, Some(0));
    for (method, cseq) in [("ACK", 1), ("INVITE", 2), ("BYE", 3)] {
        let msg = in_dialog(method, "z9hG4bK-d", cseq, "srv");
        assert_eq!(
            class_of(&prog, Hook::Xdp, msg.as_bytes()),
            Some(Class::SipExempt),
            "{msg}"
        );
    }
    // The same BYE again is a retransmission, not exempt.
    let bye = in_dialog("BYE", "z9hG4bK-d", 3, "srv");
    assert_eq!(
        class_of(&prog, Hook::Xdp, bye.as_bytes()),
        Some(Class::SipRetransmission)
    );
    // CANCEL of an INVITE transaction the gateway saw (no dialog yet) is exempt.
    set(&mut prog, Class::SipOriginal, None, None);
    assert_eq!(action(&prog, &invite("z9hG4bK-c", "")), XDP_PASS);
    set(&mut prog, Class::SipOriginal, None, Some(0));
    assert_eq!(
        class_of(&prog, Hook::Xdp, cancel("z9hG4bK-c").as_bytes()),
        Some(Class::SipExempt)
    );
}

#[test]
fn exempt_traffic_has_a_ceiling_of_its_own() {
    if !have_root("exempt_traffic_has_a_ceiling") {
        return;
    }
    let mut prog = TestProgram::new();
    assert_eq!(action(&prog, &invite("z9hG4bK-e", "")), XDP_PASS);
    server_ok(&prog, "z9hG4bK-e");
    // Two exempt requests a second, no burst: the first passes, the next two in a row do not.
    set(&mut prog, Class::SipExempt, None, Some(2));
    let actions: Vec<u32> = (0..3u32)
        .map(|n| {
            action(
                &prog,
                in_dialog("INFO", "z9hG4bK-e", 10 + n, "srv").as_bytes(),
            )
        })
        .collect();
    assert_eq!(actions, [XDP_PASS, XDP_DROP, XDP_DROP]);
    let exempt = prog.counters().classes[Class::SipExempt.id() as usize];
    assert_eq!(exempt.dropped_rate, 2);
}

#[test]
fn bad_input_is_an_original_never_exempt_and_sip_over_tcp_is_other() {
    if !have_root("sip_bad_input") {
        return;
    }
    let prog = TestProgram::new();
    let mut huge = b"OPTIONS sip:s@h SIP/2.0\r\nSubject: ".to_vec();
    huge.extend(std::iter::repeat_n(b'x', 900));
    huge.extend_from_slice(b"\r\n\r\n");
    for (name, msg) in [
        ("binary garbage", b"\x00\xffBYE \x13\x37".to_vec()),
        ("truncated start line", b"BYE sip:s@h SI".to_vec()),
        (
            "no via",
            b"INVITE sip:s@h SIP/2.0\r\nCSeq: 1 INVITE\r\n\r\n".to_vec(),
        ),
        ("huge header", huge),
    ] {
        for hook in [Hook::Xdp, Hook::Tc] {
            assert_eq!(
                class_of(&prog, hook, &msg),
                Some(Class::SipOriginal),
                "{hook:?} {name}"
            );
        }
    }
    let before = prog.counters();
    prog.run(
        Hook::Xdp,
        &Frame::tcp(5060, &invite("z9hG4bK-3", "")).build(),
        1,
    );
    assert_eq!(prog.counters().class_since(&before), Some(Class::Other));
}

const XDP_DROP: u32 = 1;
const XDP_PASS: u32 = 2;

fn set(prog: &mut TestProgram, class: Class, backlog: Option<u64>, rate: Option<u64>) {
    prog.maps
        .set_policy(
            class,
            gateway_common::policy::Policy {
                backlog,
                rate,
                burst: rate.map(|_| 0),
                ..Default::default()
            }
            .to_map(),
        )
        .unwrap();
}

fn action(prog: &TestProgram, payload: &[u8]) -> u32 {
    prog.run(Hook::Xdp, &Frame::udp(5060, payload).build(), 1).0
}

#[test]
fn originals_are_admitted_up_to_their_backlog_and_retransmissions_only_below_theirs() {
    if !have_root("sip_backlog_limits") {
        return;
    }
    let mut prog = TestProgram::new();
    set(&mut prog, Class::SipOriginal, Some(3), None);
    // Retransmissions only while the originals' backlog is under 2.
    set(&mut prog, Class::SipRetransmission, Some(2), None);
    let (a, b, c, d) = (
        invite("z9hG4bK-a", ""),
        invite("z9hG4bK-b", ""),
        invite("z9hG4bK-c", ""),
        invite("z9hG4bK-d", ""),
    );
    assert_eq!(action(&prog, &a), XDP_PASS);
    // Backlog 1 < 2: a's retransmission passes (and adds nothing to the backlog).
    assert_eq!(action(&prog, &a), XDP_PASS);
    assert_eq!(action(&prog, &b), XDP_PASS);
    // Backlog 2: retransmissions are shed first...
    assert_eq!(action(&prog, &a), XDP_DROP);
    assert_eq!(action(&prog, &b), XDP_DROP);
    // ...while originals still get in, up to their own limit of 3.
    assert_eq!(action(&prog, &c), XDP_PASS);
    assert_eq!(action(&prog, &d), XDP_DROP);
    let state = prog.maps.class_state().unwrap();
    assert_eq!(state[Class::SipOriginal.id() as usize].backlog(), 3);
    let stats = prog.counters().classes;
    let orig = stats[Class::SipOriginal.id() as usize];
    let rtx = stats[Class::SipRetransmission.id() as usize];
    assert_eq!((orig.admitted, orig.dropped_backlog), (3, 1));
    assert_eq!((rtx.admitted, rtx.dropped_backlog), (1, 2));
    assert_eq!(
        orig.rejected + rtx.rejected,
        0,
        "SIP refusals are drops, not resets"
    );
}

#[test]
fn the_first_response_leaving_completes_the_transaction_and_records_its_service_time() {
    if !have_root("sip_egress_completion") {
        return;
    }
    let prog = TestProgram::new();
    let req = invite("z9hG4bK-e1", "");
    assert_eq!(action(&prog, &req), XDP_PASS);
    let backlog =
        |p: &TestProgram| p.maps.class_state().unwrap()[Class::SipOriginal.id() as usize].backlog();
    assert_eq!(backlog(&prog), 1);
    // The server's 100 Trying leaves from port 5060 (egress sees server to client).
    let trying = "SIP/2.0 100 Trying\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-e1\r\nCall-ID: 1-z9hG4bK-e1@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";
    let out = Frame::udp(5061, trying.as_bytes()).from_port(5060).build();
    assert_eq!(prog.run(Hook::TcEgress, &out, 1).0, 0, "egress never drops");
    assert_eq!(backlog(&prog), 0);
    let h = prog.maps.latency(Class::SipOriginal).unwrap();
    assert_eq!(h.count(), 1);
    // Later responses of the same transaction change nothing.
    let ok = trying.replace("100 Trying", "200 OK");
    prog.run(
        Hook::TcEgress,
        &Frame::udp(5061, ok.as_bytes()).from_port(5060).build(),
        1,
    );
    assert_eq!(prog.maps.latency(Class::SipOriginal).unwrap().count(), 1);
    assert_eq!(
        prog.maps.class_state().unwrap()[Class::SipOriginal.id() as usize].completed,
        1
    );
    // A response to a transaction never admitted (or never seen) is ignored.
    let other = trying.replace("branch=z9hG4bK-e1", "branch=z9hG4bK-none");
    prog.run(
        Hook::TcEgress,
        &Frame::udp(5061, other.as_bytes()).from_port(5060).build(),
        1,
    );
    assert_eq!(
        prog.maps.class_state().unwrap()[Class::SipOriginal.id() as usize].completed,
        1
    );
}

/// `sip-original`'s INVITEs and its other methods hold places in backlogs of their own, under
/// limits of their own (`SIP_FAMILY_LIMITS`, which the controller sets), and their service
/// times go into slots of their own (`SERVICE_TIMES`): INVITEs at their limit leave OPTIONS
/// their places, and an INVITE's answer frees an INVITE's place.
#[test]
fn each_method_family_has_its_own_backlog_limit_and_service_times() {
    use gateway_common::maps::{SIP_FAMILY_INVITE, SIP_FAMILY_OTHER, SLOT_SIP_INVITE};
    if !have_root("each_method_family_has_its_own_backlog") {
        return;
    }
    let mut prog = TestProgram::new();
    prog.maps
        .set_sip_family_limit(SIP_FAMILY_INVITE, 1)
        .unwrap();
    let options = |branch: &str| {
        String::from_utf8(invite(branch, ""))
            .unwrap()
            .replacen("INVITE sip", "OPTIONS sip", 1)
            .replacen("CSeq: 1 INVITE", "CSeq: 1 OPTIONS", 1)
            .into_bytes()
    };
    assert_eq!(action(&prog, &invite("z9hG4bK-f1", "")), XDP_PASS);
    // The second INVITE finds its family full; an OPTIONS does not.
    assert_ne!(action(&prog, &invite("z9hG4bK-f2", "")), XDP_PASS);
    assert_eq!(action(&prog, &options("z9hG4bK-f3")), XDP_PASS);
    assert_eq!(action(&prog, &options("z9hG4bK-f4")), XDP_PASS);
    let family = |p: &TestProgram, i| p.maps.sip_family(i).unwrap().0.backlog();
    assert_eq!(family(&prog, SIP_FAMILY_INVITE), 1);
    assert_eq!(family(&prog, SIP_FAMILY_OTHER), 2);
    // The INVITE's answer ends its unit in its family, and its time goes to the INVITE slot.
    let trying = "SIP/2.0 100 Trying\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-f1\r\nCall-ID: 1-z9hG4bK-f1@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";
    prog.run(
        Hook::TcEgress,
        &Frame::udp(5061, trying.as_bytes()).from_port(5060).build(),
        1,
    );
    assert_eq!(family(&prog, SIP_FAMILY_INVITE), 0);
    assert_eq!(prog.maps.service_times(SLOT_SIP_INVITE).unwrap().count(), 1);
    assert_eq!(
        prog.maps
            .service_times(Class::SipOriginal.id())
            .unwrap()
            .count(),
        0
    );
    assert_eq!(action(&prog, &invite("z9hG4bK-f5", "")), XDP_PASS);
    // An OPTIONS answered: its time goes to the class's own slot.
    let ok = trying
        .replace("100 Trying", "200 OK")
        .replace("z9hG4bK-f1", "z9hG4bK-f3")
        .replace("CSeq: 1 INVITE", "CSeq: 1 OPTIONS");
    prog.run(
        Hook::TcEgress,
        &Frame::udp(5061, ok.as_bytes()).from_port(5060).build(),
        1,
    );
    assert_eq!(family(&prog, SIP_FAMILY_OTHER), 1);
    assert_eq!(
        prog.maps
            .service_times(Class::SipOriginal.id())
            .unwrap()
            .count(),
        1
    );
    // No family limit: the class's alone.
    prog.maps
        .set_sip_family_limit(SIP_FAMILY_INVITE, 0)
        .unwrap();
    assert_eq!(action(&prog, &invite("z9hG4bK-f6", "")), XDP_PASS);
    assert_eq!(family(&prog, SIP_FAMILY_INVITE), 2);
}

#[test]
fn unanswered_requests_expire_and_key_less_ones_still_complete() {
    if !have_root("unanswered_requests_expire") {
        return;
    }
    let mut prog = TestProgram::new();
    let timeout = std::time::Duration::from_millis(300);
    prog.maps
        .set_policy(
            Class::SipOriginal,
            gateway_common::policy::Policy {
                backlog: Some(2),
                timeout: Some(timeout),
                ..Default::default()
            }
            .to_map(),
        )
        .unwrap();
    let state = |p: &TestProgram| p.maps.class_state().unwrap()[Class::SipOriginal.id() as usize];
    // The server is down: two originals fill the class, a third is refused.
    assert_eq!(action(&prog, &invite("z9hG4bK-down1", "")), XDP_PASS);
    assert_eq!(action(&prog, &invite("z9hG4bK-down2", "")), XDP_PASS);
    assert_eq!(action(&prog, &invite("z9hG4bK-down3", "")), XDP_DROP);
    let filled = std::time::Instant::now();
    // With no daemon, after the timeout the class admits again: the two expired.
    let deadline = filled + timeout + std::time::Duration::from_secs(2);
    let mut n = 0;
    while action(&prog, &invite(&format!("z9hG4bK-up{n}"), "")) != XDP_PASS {
        assert!(std::time::Instant::now() < deadline, "never healed");
        std::thread::sleep(std::time::Duration::from_millis(20));
        n += 1;
    }
    assert!(filled.elapsed() >= timeout, "expired early");
    assert_eq!((state(&prog).expired, state(&prog).backlog()), (2, 1));
    // A request without a Via branch is keyed by Call-ID and CSeq, which its response carries:
    // answered, it leaves nothing in the backlog.
    let no_branch = String::from_utf8(invite("z9hG4bK-x", ""))
        .unwrap()
        .replacen(";branch=z9hG4bK-x", "", 1);
    let before = state(&prog);
    assert_eq!(action(&prog, no_branch.as_bytes()), XDP_PASS);
    assert_eq!(state(&prog).backlog(), before.backlog() + 1);
    let call_id = no_branch
        .lines()
        .find(|l| l.starts_with("Call-ID"))
        .unwrap()
        .to_string();
    let trying = format!(
        "SIP/2.0 100 Trying\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;received=10.99.0.2\r\n{call_id}\r\nCSeq: 1 INVITE\r\n\r\n"
    );
    prog.run(
        Hook::TcEgress,
        &Frame::udp(5061, trying.as_bytes()).from_port(5060).build(),
        1,
    );
    assert_eq!(state(&prog).backlog(), before.backlog());
    assert_eq!(state(&prog).completed, before.completed + 1);
    // A request with no key at all (no branch, no Call-ID) is refused: nothing could complete it.
    let bare = no_branch.replacen(&format!("{call_id}\r\n"), "", 1);
    let dropped = prog.counters().classes[Class::SipOriginal.id() as usize].dropped_backlog;
    assert_eq!(action(&prog, bare.as_bytes()), XDP_DROP);
    assert_eq!(
        prog.counters().classes[Class::SipOriginal.id() as usize].dropped_backlog,
        dropped + 1
    );
}

#[test]
fn two_cpus_racing_on_one_rate_limiter_admit_no_more_than_it_allows() {
    if !have_root("two_cpus_racing_on_one_rate_limiter") {
        return;
    }
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        eprintln!("skipped: needs two CPUs");
        return;
    }
    const RATE: u64 = 100_000;
    // Copies of as many admitted INVITEs, each CPU sending each one COPIES times: together the
    // MAX_TXN_COPIES an admitted request buys, so none is refused for its count.
    const TXNS: u32 = 2_000;
    const COPIES: u32 = gateway_common::maps::MAX_TXN_COPIES / 2;
    let mut prog = TestProgram::new();
    // The retransmissions, through the retransmission class's limiter: one slot every 10 µs,
    // far less than two CPUs replaying the frames offer, so they contend for every slot; a
    // small burst keeps the theoretical arrival time ahead of the clock, so it advances by
    // exactly one interval per admission.
    prog.maps
        .set_policy(
            Class::SipRetransmission,
            gateway_common::policy::Policy {
                rate: Some(RATE),
                burst: Some(10),
                ..Default::default()
            }
            .to_map(),
        )
        .unwrap();
    let frames: Vec<Vec<u8>> = (0..TXNS)
        .map(|n| {
            let frame = Frame::udp(5060, &invite(&format!("z9hG4bK-race-{n}"), "")).build();
            prog.run(Hook::Xdp, &frame, 1);
            frame
        })
        .collect();
    let originals = prog.counters().classes[Class::SipOriginal.id() as usize];
    assert_eq!(originals.admitted, u64::from(TXNS), "{originals:?}");
    // The kernel's clock (bpf_ktime_get_ns is CLOCK_MONOTONIC).
    let start_ns = gateway::datapath::maps::monotonic_ns();
    std::thread::scope(|s| {
        for cpu in 0..2 {
            let (prog, frames) = (&prog, &frames);
            s.spawn(move || {
                // SAFETY: a zeroed cpu_set_t with one bit set, for this thread.
                unsafe {
                    let mut set: libc::cpu_set_t = std::mem::zeroed();
                    libc::CPU_SET(cpu, &mut set);
                    libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
                }
                for frame in frames {
                    prog.run(Hook::Xdp, frame, COPIES);
                }
            });
        }
    });
    let c = prog.counters().classes[Class::SipRetransmission.id() as usize];
    assert_eq!(c.packets, 2 * u64::from(TXNS * COPIES));
    assert_eq!(c.admitted + c.dropped_rate, c.packets);
    // Every admission advances the theoretical arrival time by at least one interval from where
    // the run started, so admissions fit in the span it advanced over; two CPUs passing on one
    // slot would advance it once for two admissions.
    let tat = prog.maps.class_state().unwrap()[Class::SipRetransmission.id() as usize].gcra_tat_ns;
    let slots = (tat - start_ns) * RATE / 1_000_000_000;
    eprintln!("{} admitted of {}, {slots} slots", c.admitted, c.packets);
    assert!(
        c.admitted <= slots,
        "{} admitted in {slots} slots",
        c.admitted
    );
    assert!(c.admitted > 1000, "{} admitted", c.admitted);
}

#[test]
fn a_full_pending_table_refuses_new_work_and_keeps_what_it_holds() {
    if !have_root("a_full_pending_table_refuses_new_work") {
        return;
    }
    let mut prog = TestProgram::new();
    let max = gateway_common::maps::MAX_PENDING as usize;
    // No limits: every distinct INVITE is admitted and held until answered. Filling the table
    // takes seconds on a busy machine, longer than the class's 2 s default timeout: with an
    // hour's, no unit expires while it fills.
    prog.maps
        .set_policy(
            Class::SipOriginal,
            gateway_common::policy::Policy {
                timeout: Some(std::time::Duration::from_secs(3600)),
                ..Default::default()
            }
            .to_map(),
        )
        .unwrap();
    for n in 0..max {
        assert_eq!(
            action(&prog, &invite(&format!("z9hG4bK-f{n}"), "")),
            XDP_PASS,
            "{n}"
        );
    }
    let st = |p: &TestProgram| p.maps.class_state().unwrap()[Class::SipOriginal.id() as usize];
    assert_eq!(st(&prog).backlog(), max as u64);
    // Full: the next one is refused and counted, and what is held stays held.
    assert_eq!(action(&prog, &invite("z9hG4bK-over", "")), XDP_DROP);
    assert_eq!(prog.counters().datapath.pending_full, 1);
    assert_eq!(st(&prog).backlog(), max as u64);
    // The server answers one: its place is free again.
    let trying = "SIP/2.0 100 Trying\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-f7\r\nCall-ID: 1-z9hG4bK-f7@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";
    prog.run(
        Hook::TcEgress,
        &Frame::udp(5061, trying.as_bytes()).from_port(5060).build(),
        1,
    );
    assert_eq!(st(&prog).backlog(), max as u64 - 1);
    assert_eq!(action(&prog, &invite("z9hG4bK-over", "")), XDP_PASS);
    assert_eq!(prog.counters().datapath.pending_full, 1);
}

const XDP_TX: u32 = 3;
/// `TC_ACT_REDIRECT`: the TC hook sends its reply out of the device the request came in on.
const TC_REDIRECT: u32 = 7;

/// sip-original closed, refusals answered with a 503 (`Retry-After: 30`) at `reply_rate`.
fn closed_with_503(prog: &mut TestProgram, reply_rate: Option<u64>) {
    prog.maps
        .set_policy(
            Class::SipOriginal,
            gateway_common::policy::Policy {
                rate: Some(0),
                refuse: Some(gateway_common::policy::Refuse::Reject),
                reply_rate,
                retry_after: Some(30),
                ..Default::default()
            }
            .to_map(),
        )
        .unwrap();
}

/// The SIP payload of a checked reply.
fn sip_payload(r: &gateway_tests::frames::Rewritten) -> String {
    assert_eq!(r.proto, 17);
    String::from_utf8(r.segment[8..].to_vec()).unwrap()
}

#[test]
fn a_refused_request_is_answered_with_a_503_from_the_nic() {
    if !have_root("a_refused_request_is_answered_with_a_503_from_the_nic") {
        return;
    }
    use gateway_common::{
        bytes::SliceBytes,
        sip::{HAVE_TO_TAG, parse_sip},
    };
    use gateway_tests::frames::check_rewritten;
    let mut prog = TestProgram::new();
    closed_with_503(&mut prog, None);
    let mut n = 0;
    for (hook, want) in [(Hook::Xdp, XDP_TX), (Hook::Tc, TC_REDIRECT)] {
        for (name, frame) in [
            ("ipv4", Frame::udp(5060, b"")),
            ("ipv6", Frame::udp(5060, b"").ipv6(&[])),
            ("802.1Q", Frame::udp(5060, b"").vlan(0x8100)),
            (
                "802.1ad + 802.1Q, ipv6",
                Frame::udp(5060, b"").vlan(0x88a8).vlan(0x8100).ipv6(&[]),
            ),
        ] {
            if hook == Hook::Tc && name.contains("802.1") {
                // A TC program sees tags the device did not take off; test_run builds none.
                continue;
            }
            n += 1;
            let req = invite(&format!("z9hG4bK-503-{n}"), "");
            let f = Frame {
                payload: req.clone(),
                ..frame
            }
            .from_port(5061)
            .build();
            let before = prog.counters();
            let (action, out) = prog.run_out_on(hook, &f);
            assert_eq!(action, want, "{hook:?} {name}");
            let r = check_rewritten(&f, &out, true).unwrap_or_else(|e| panic!("{name}: {e}"));
            let text = sip_payload(&r);
            assert!(
                text.starts_with("SIP/2.0 503 Service Unavailable\r\n"),
                "{text}"
            );
            assert!(text.contains("\r\nRetry-After: 30\r\n"), "{text}");
            assert!(text.ends_with("\r\nContent-Length: 0\r\n\r\n"), "{text}");
            assert!(
                !text.contains("Contact:") && !text.contains("Max-Forwards"),
                "{text}"
            );
            // The response belongs to the request's transaction, with a To tag added.
            let (q, a) = (
                parse_sip(&SliceBytes(&req), req.len()),
                parse_sip(&SliceBytes(text.as_bytes()), text.len()),
            );
            assert_eq!((a.status, a.unit_key()), (503, q.unit_key()), "{name}");
            assert_ne!(a.have & HAVE_TO_TAG, 0, "{name}");
            let after = prog.counters();
            assert_eq!(
                after.datapath.sip_replies_sent,
                before.datapath.sip_replies_sent + 1
            );
            let c = Class::SipOriginal.id() as usize;
            assert_eq!(after.classes[c].rejected, before.classes[c].rejected + 1);
            // The client's ACK for that 503 is absorbed at the NIC.
            let to = text.lines().find(|l| l.starts_with("To:")).unwrap();
            let ack = format!(
                "ACK sip:service@10.99.0.1:5060 SIP/2.0\r\n\
                 Via: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-503-{n}\r\n\
                 From: sipp <sip:sipp@10.99.0.2:5061>;tag=1\r\n{to}\r\n\
                 Call-ID: 1-z9hG4bK-503-{n}@10.99.0.2\r\nCSeq: 1 ACK\r\n\
                 Content-Length: 0\r\n\r\n"
            );
            let before = prog.counters();
            let dropped = if hook == Hook::Xdp { XDP_DROP } else { 2 };
            assert_eq!(
                prog.run(hook, &Frame::udp(5060, ack.as_bytes()).build(), 1)
                    .0,
                dropped
            );
            assert_eq!(
                prog.counters().datapath.sip_acks_absorbed,
                before.datapath.sip_acks_absorbed + 1
            );
        }
    }
    // An ACK is never answered, and an ACK with another tag is not absorbed: it is judged
    // (here refused, as an original of no transaction the server took on).
    let before = prog.counters();
    let ack = b"ACK sip:service@10.99.0.1:5060 SIP/2.0\r\n\
        Via: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-x\r\n\
        From: <sip:sipp@10.99.0.2>;tag=1\r\nTo: <sip:service@10.99.0.1>;tag=gw0000000000000000\r\n\
        Call-ID: x@10.99.0.2\r\nCSeq: 1 ACK\r\n\r\n";
    assert_eq!(action(&prog, ack), XDP_DROP);
    let after = prog.counters();
    assert_eq!(
        after.datapath.sip_acks_absorbed,
        before.datapath.sip_acks_absorbed
    );
    assert_eq!(
        after.datapath.sip_replies_sent,
        before.datapath.sip_replies_sent
    );
    // A request whose 503 would be longer than itself gets none (no amplification).
    let tiny = b"OPTIONS sip:a SIP/2.0\r\nv:SIP/2.0/UDP h;branch=z9hG4bKt\r\nt:<sip:a>\r\n\
        f:<sip:b>;tag=1\r\ni:c\r\nCSeq:1 OPTIONS\r\n\r\n";
    let before = prog.counters();
    assert_eq!(action(&prog, tiny), XDP_DROP);
    assert_eq!(
        prog.counters().datapath.sip_replies_withheld,
        before.datapath.sip_replies_withheld + 1
    );
}

#[test]
fn a_spoofed_flood_gets_replies_at_no_more_than_the_reply_rate() {
    if !have_root("a_spoofed_flood_gets_replies_at_no_more_than_the_reply_rate") {
        return;
    }
    let mut prog = TestProgram::new();
    let rate = 10;
    closed_with_503(&mut prog, Some(rate));
    let start = std::time::Instant::now();
    let sent = 500u64;
    let mut replies = 0u64;
    for i in 0..sent {
        let f = Frame::udp(5060, &invite(&format!("z9hG4bK-flood-{i}"), "")).build();
        let (action, out) = prog.run_out(&f);
        if action == XDP_TX {
            replies += 1;
            assert!(out.len() <= f.len(), "a reply longer than its request");
        } else {
            assert_eq!(action, XDP_DROP);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    // The burst, and the rate over the time the flood took.
    let bound = gateway_common::maps::REPLY_BURST + 1 + (rate as f64 * elapsed).ceil() as u64;
    assert!(
        replies >= 1 && replies <= bound,
        "{replies} replies, bound {bound}"
    );
    let c = prog.counters().classes[Class::SipOriginal.id() as usize];
    assert_eq!(c.rejected, replies);
    assert_eq!(c.replies_limited, sent - replies);
}

#[test]
fn a_flood_of_refused_invites_evicts_no_admitted_transaction() {
    if !have_root("a_flood_of_refused_invites_evicts_no_admitted_transaction") {
        return;
    }
    use gateway_common::maps::{FRESH_LETTERS, MAX_SIP_TXNS};
    let mut prog = TestProgram::new();
    // An INVITE the server took on and answered with 100 Trying: its unit completed, so only its
    // transaction's entry lets its CANCEL be exempt.
    assert_eq!(action(&prog, &invite("z9hG4bK-kept", "")), XDP_PASS);
    let trying = "SIP/2.0 100 Trying\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-kept\r\nCall-ID: 1-z9hG4bK-kept@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";
    let out = Frame::udp(5061, trying.as_bytes()).from_port(5060).build();
    prog.run(Hook::TcEgress, &out, 1);
    let state = |p: &TestProgram| p.maps.class_state().unwrap()[Class::SipOriginal.id() as usize];
    assert_eq!(state(&prog).completed, 1);
    // sip-original closed; then twice as many distinct INVITEs as the transaction table holds
    // (two batches of the fresh-packet program, each numbering 65,536 branches), all refused.
    set(&mut prog, Class::SipOriginal, None, Some(0));
    let before = prog.counters().classes[Class::SipOriginal.id() as usize];
    for batch in ["a", "b"] {
        let flood = Frame::udp(5060, &invite(&format!("z9hG4bK-0000-{batch}"), "")).build();
        let at = flood.windows(4).position(|w| w == b"0000").unwrap() as u16;
        prog.freshen(at, FRESH_LETTERS);
        assert_eq!(prog.run(Hook::Fresh, &flood, MAX_SIP_TXNS).0, XDP_DROP);
    }
    let after = prog.counters().classes[Class::SipOriginal.id() as usize];
    assert_eq!(after.packets - before.packets, 2 * u64::from(MAX_SIP_TXNS));
    assert_eq!(
        after.admitted, before.admitted,
        "the flood admitted nothing"
    );
    // The admitted INVITE's CANCEL is still exempt: the refused flood made no transaction
    // entries, so it evicted none.
    assert_eq!(
        class_of(&prog, Hook::Xdp, cancel("z9hG4bK-kept").as_bytes()),
        Some(Class::SipExempt)
    );
    assert_eq!(
        prog.maps.sip_txns().unwrap().len(),
        2,
        "the INVITE's and its CANCEL's"
    );
}

/// A class's sweep of expired units is due when the earliest unit it may find expired is, not
/// every 100 ms: a pass walks every bucket of its table whatever it holds (about 0.8 ms for
/// 65,536), so a table whose units the server answers was walked ten times a second for
/// nothing. A unit held brings the sweep forward to its own deadline, and one past it ends at
/// the next arrival, as before.
#[test]
fn the_sweep_is_due_at_the_earliest_deadline_held() {
    if !have_root("the_sweep_is_due_at_the_earliest_deadline_held") {
        return;
    }
    use gateway::datapath::maps::monotonic_ns;
    use std::time::Duration;
    let mut prog = TestProgram::new();
    let timeout = |t: Duration| {
        gateway_common::policy::Policy {
            timeout: Some(t),
            ..Default::default()
        }
        .to_map()
    };
    let state = |prog: &TestProgram| prog.maps.class_state().unwrap()[Class::SipOriginal as usize];
    let held = |prog: &TestProgram| {
        let mut units = prog.maps.sip_pending(16).unwrap();
        units.sort_by_key(|u| u.admitted_ns);
        units
    };
    prog.maps
        .set_policy(Class::SipOriginal, timeout(Duration::from_secs(600)))
        .unwrap();
    let before = monotonic_ns();
    assert_eq!(
        class_of(&prog, Hook::Xdp, &invite("z9hG4bK-long", "")),
        Some(Class::SipOriginal)
    );
    let long = held(&prog)[0];
    let due = state(&prog).sweep_ns;
    // Before: due 100 ms after this arrival's pass, whatever the table held.
    assert!(
        due > before + 60_000_000_000 && due <= long.deadline_ns,
        "the sweep is due by the one unit's deadline, not before: due {due}, unit's deadline {}, \
         arrival after {before}",
        long.deadline_ns
    );
    // A unit of a shorter timeout brings the sweep forward to its deadline.
    prog.maps
        .set_policy(Class::SipOriginal, timeout(Duration::from_millis(300)))
        .unwrap();
    assert_eq!(
        class_of(&prog, Hook::Xdp, &invite("z9hG4bK-short", "")),
        Some(Class::SipOriginal)
    );
    let short = held(&prog)[1];
    assert_eq!(short.deadline_ns, short.admitted_ns + 300_000_000);
    assert_eq!(state(&prog).sweep_ns, short.deadline_ns);
    // Past its deadline (time itself is what this waits for, bounded), the next arrival's sweep
    // ends it and leaves the long one.
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while monotonic_ns() <= short.deadline_ns {
        assert!(
            std::time::Instant::now() < until,
            "the clock did not pass the deadline"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    let expired = state(&prog).expired;
    assert_eq!(
        class_of(&prog, Hook::Xdp, &invite("z9hG4bK-next", "")),
        Some(Class::SipOriginal)
    );
    assert_eq!(state(&prog).expired, expired + 1, "the short unit expired");
    let units = held(&prog);
    assert_eq!(
        units.iter().map(|u| u.admitted_ns).collect::<Vec<_>>(),
        vec![long.admitted_ns, units[1].admitted_ns],
        "the short unit ended, the long one and the new one are held"
    );
    assert!(units[1].admitted_ns > short.deadline_ns);
    let due = state(&prog).sweep_ns;
    assert!(
        due <= units[1].deadline_ns && due < long.deadline_ns,
        "due {due}: by the new unit's deadline {}",
        units[1].deadline_ns
    );
}
