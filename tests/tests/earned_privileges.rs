//! Every privilege a packet gets is earned (issue 10), with real clients and servers in
//! namespaces and no daemon: what a client can put on the wire for free buys nothing.

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream, UdpSocket},
    time::Duration,
};

use gateway_common::testing::HelloBuilder;
use gateway_tests::{
    have_root,
    netns::{GW_V4, TestNet, class_counter},
    sipserver::SlowSipServer,
    tls::{Cert, RustlsServer},
};

/// Sends `payload` on a new connection to 443 and reads one byte back (waiting at most `wait`):
/// what the read gave, and how long after the send.
fn send_and_read(
    net: &TestNet,
    payload: &[u8],
    wait: Duration,
) -> (Result<usize, std::io::ErrorKind>, Duration) {
    net.in_peer(|| {
        let mut s = TcpStream::connect((GW_V4, 443)).expect("connect");
        s.set_read_timeout(Some(wait)).unwrap();
        let start = std::time::Instant::now();
        s.write_all(payload).expect("send");
        let mut byte = [0u8; 1];
        let got = s.read(&mut byte).map_err(|e| e.kind());
        (got, start.elapsed())
    })
}

/// Whether the server answered `payload` within a second (any byte back).
fn answered(net: &TestNet, payload: &[u8]) -> bool {
    send_and_read(net, payload, Duration::from_secs(1)).0 == Ok(1)
}

#[test]
fn an_alert_in_front_of_a_hello_obeys_tls_new() {
    if !have_root("an_alert_in_front_of_a_hello_obeys_tls_new") {
        return;
    }
    let net = TestNet::new();
    let cert = Cert::new();
    let listener = net.in_gw(|| TcpListener::bind((GW_V4, 443)).expect("bind"));
    let _server = RustlsServer::start(&cert, listener);
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "tls", "443"]);
    // A warning alert (close_notify) in the same segment as the hello: rustls skips it and
    // answers the hello, so the server really does the work.
    let alert = [21u8, 3, 3, 0, 2, 1, 0];
    let hello = HelloBuilder::tls13().build();
    let sneaky = [&alert[..], &hello].concat();
    assert!(
        answered(&net, &sneaky),
        "the server answers an alert-prefixed hello"
    );
    assert_eq!(class_counter(&net.stats(), "tls-new", "admitted"), 1);
    // With tls-new closed, the alert buys nothing: refused at the NIC, no answer.
    net.gateway_ok(&["policy", "set", "tls-new", "--backlog", "0"]);
    for _ in 0..5 {
        assert!(
            !answered(&net, &sneaky),
            "an alert-prefixed hello got through"
        );
    }
    let stats = net.stats();
    assert_eq!(class_counter(&stats, "tls-new", "admitted"), 1);
    assert_eq!(class_counter(&stats, "tls-new", "dropped_backlog"), 5);
}

/// Namespaces with the datapath attached (no daemon) protecting sip/5060, a SIP server behind
/// it that answers INVITEs and BYEs (200 OK, its tag `server1`), and a client socket.
fn sip_behind_the_gateway() -> (TestNet, SlowSipServer, UdpSocket) {
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "sip", "5060"]);
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).expect("bind"));
    let server = SlowSipServer::start(socket, 1 << 20, Duration::ZERO, Duration::ZERO);
    let client = net.in_peer(|| UdpSocket::bind("10.99.0.2:5061").expect("bind"));
    (net, server, client)
}

#[test]
fn fragmented_invites_obey_the_original_limits() {
    if !have_root("fragmented_invites_obey_the_original_limits") {
        return;
    }
    let (net, _server, client) = sip_behind_the_gateway();
    client
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    // INVITEs with a 2 KB body: over the veth's 1500-byte MTU, the kernel sends them as IP
    // fragments.
    let invite = |n: usize| {
        let body = "v".repeat(2048);
        format!(
            "INVITE sip:service@{GW_V4}:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-frag-{n}\r\n\
From: <sip:c@10.99.0.2>;tag={n}\r\nTo: <sip:service@{GW_V4}>\r\n\
Call-ID: frag-{n}@10.99.0.2\r\nCSeq: 1 INVITE\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        )
    };
    let mut buf = [0u8; 4096];
    let mut answers = |from: usize, n: usize| {
        (from..from + n)
            .filter(|&k| {
                client
                    .send_to(invite(k).as_bytes(), (GW_V4, 5060))
                    .expect("send");
                client.recv_from(&mut buf).is_ok()
            })
            .count()
    };
    // Open, they are answered (so they really reach the server in fragments).
    assert_eq!(answers(0, 5), 5);
    let fragments = net.stats()["datapath"]["fragments"].as_u64().unwrap();
    assert!(fragments >= 10, "{fragments} fragments seen");
    // sip-original closed: none is answered, and each is refused as an original.
    net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0"]);
    assert_eq!(answers(100, 50), 0);
    let stats = net.stats();
    assert_eq!(class_counter(&stats, "sip-original", "dropped_rate"), 50);
}

#[test]
fn forged_dialogs_buy_nothing_and_real_ones_keep_working_with_originals_closed() {
    if !have_root("forged_dialogs_buy_nothing") {
        return;
    }
    let (net, _server, client) = sip_behind_the_gateway();
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let request = dialog_request;
    let send = |msg: String| -> Option<String> {
        let mut buf = [0u8; 2048];
        client.send_to(msg.as_bytes(), (GW_V4, 5060)).expect("send");
        client
            .recv_from(&mut buf)
            .ok()
            .map(|(n, _)| String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0"]);
    // Forged: new INVITEs dressed as in-dialog, BYEs and ACKs of dialogs nobody made.
    let forged = (0..1000)
        .map(|n| request("INVITE", &format!("forged-{n}"), 1, "x"))
        .chain((0..20).map(|n| request("BYE", &format!("nodialog-{n}"), 2, "x")))
        .chain((0..20).map(|n| request("ACK", &format!("nodialog-{n}"), 1, "x")));
    for msg in forged {
        client.send_to(msg.as_bytes(), (GW_V4, 5060)).expect("send");
    }
    // Nothing comes back: the server never saw them.
    client
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    let mut buf = [0u8; 2048];
    assert!(
        client.recv_from(&mut buf).is_err(),
        "the server answered a forged request"
    );
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let stats = net.stats();
    assert_eq!(class_counter(&stats, "sip-exempt", "packets"), 0);
    assert_eq!(class_counter(&stats, "sip-original", "admitted"), 0);
    assert!(
        stats["datapath"]["sip_unearned"].as_u64().unwrap() >= 1040,
        "{stats}"
    );
    // A real dialog: its INVITE while originals are open, the server's 200 OK (with its tag)...
    net.gateway_ok(&["policy", "clear", "sip-original"]);
    let ok = send(request("INVITE", "real", 1, "")).expect("the INVITE answered");
    assert!(ok.starts_with("SIP/2.0 200 OK"), "{ok}");
    assert!(ok.contains(";tag=server1"), "{ok}");
    // ...then, originals closed again, its ACK, re-INVITE and BYE still reach the server.
    net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0"]);
    assert_eq!(
        send(request("ACK", "real", 1, "server1")),
        None,
        "ACK has no answer"
    );
    let reinvite = send(request("INVITE", "real", 2, "server1")).expect("re-INVITE answered");
    assert!(reinvite.starts_with("SIP/2.0 200 OK"), "{reinvite}");
    let bye = send(request("BYE", "real", 3, "server1")).expect("BYE answered");
    assert!(bye.starts_with("SIP/2.0 200 OK"), "{bye}");
    assert_eq!(class_counter(&net.stats(), "sip-exempt", "packets"), 3);
}

/// A request of the dialog `call` from the peer's 10.99.0.2:5061, with `to_tag` (none if empty).
fn dialog_request(method: &str, call: &str, cseq: u32, to_tag: &str) -> String {
    let to_tag = if to_tag.is_empty() {
        String::new()
    } else {
        format!(";tag={to_tag}")
    };
    format!(
        "{method} sip:service@{GW_V4}:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-{call}-{method}-{cseq}\r\n\
From: <sip:c@10.99.0.2>;tag=caller\r\nTo: <sip:service@{GW_V4}>{to_tag}\r\n\
Call-ID: {call}@10.99.0.2\r\nCSeq: {cseq} {method}\r\nMax-Forwards: 70\r\n\
Content-Length: 0\r\n\r\n"
    )
}

/// Sends `msg` from `client` and waits for one datagram back (the socket's read timeout).
fn exchange(client: &UdpSocket, msg: &str) -> Option<String> {
    let mut buf = [0u8; 2048];
    client.send_to(msg.as_bytes(), (GW_V4, 5060)).expect("send");
    client
        .recv_from(&mut buf)
        .ok()
        .map(|(n, _)| String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// Whether `answer` is the server's 200 OK (not a refusal, not silence).
fn is_ok(answer: Option<String>) -> bool {
    answer.is_some_and(|a| a.starts_with("SIP/2.0 200 OK"))
}

#[test]
fn copies_of_refused_invites_are_judged_as_originals_not_retransmissions() {
    if !have_root("copies_of_refused_invites_are_judged_as_originals") {
        return;
    }
    let (net, _server, client) = sip_behind_the_gateway();
    client
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0"]);
    // Every INVITE sent twice, back to back: the copy asks for work the server never took on.
    for n in 0..50 {
        let invite = dialog_request("INVITE", &format!("twice-{n}"), 1, "");
        for _ in 0..2 {
            client
                .send_to(invite.as_bytes(), (GW_V4, 5060))
                .expect("send");
        }
    }
    let mut buf = [0u8; 2048];
    assert!(
        client.recv_from(&mut buf).is_err(),
        "the server answered a copy of a refused INVITE"
    );
    let stats = net.stats();
    assert_eq!(class_counter(&stats, "sip-original", "dropped_rate"), 100);
    assert_eq!(class_counter(&stats, "sip-retransmission", "packets"), 0);
    assert_eq!(stats["datapath"]["sip_copies_of_refused"], 50, "{stats}");
    // Open again: a copy of a refused INVITE is an original the server now takes on, and a copy
    // of admitted work is a retransmission.
    net.gateway_ok(&["policy", "clear", "sip-original"]);
    let again = dialog_request("INVITE", "twice-0", 1, "");
    assert!(is_ok(exchange(&client, &again)));
    assert!(is_ok(exchange(&client, &again)));
    let stats = net.stats();
    assert_eq!(class_counter(&stats, "sip-original", "admitted"), 1);
    assert_eq!(class_counter(&stats, "sip-retransmission", "admitted"), 1);
}

#[test]
fn a_dialog_buys_a_bounded_number_of_exempt_requests_and_ends_with_its_bye() {
    if !have_root("a_dialog_buys_a_bounded_number_of_exempt_requests") {
        return;
    }
    let ceiling = gateway_common::maps::MAX_DIALOG_REQUESTS as usize;
    let (net, _server, client) = sip_behind_the_gateway();
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let send = |msg: String| exchange(&client, &msg);
    // One real call, then originals closed: its re-INVITEs are exempt up to the ceiling.
    assert!(is_ok(send(dialog_request("INVITE", "long", 1, ""))));
    net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0"]);
    let answered = (0..ceiling + 20)
        .filter(|&n| {
            is_ok(send(dialog_request(
                "INVITE",
                "long",
                2 + n as u32,
                "server1",
            )))
        })
        .count();
    assert_eq!(
        answered, ceiling,
        "re-INVITEs answered with originals closed"
    );
    // Past the ceiling the dialog's BYE is an original too.
    assert!(!is_ok(send(dialog_request("BYE", "long", 9999, "server1"))));
    let stats = net.stats();
    assert_eq!(stats["datapath"]["sip_dialog_spent"], 21, "{stats}");
    assert_eq!(
        class_counter(&stats, "sip-exempt", "admitted"),
        ceiling as u64
    );
    // Another call ends with its BYE's answer: nothing of it is exempt afterwards.
    net.gateway_ok(&["policy", "clear", "sip-original"]);
    assert!(is_ok(send(dialog_request("INVITE", "short", 1, ""))));
    net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0"]);
    assert!(is_ok(send(dialog_request("INVITE", "short", 2, "server1"))));
    assert!(is_ok(send(dialog_request("BYE", "short", 3, "server1"))));
    assert_eq!(net.stats()["datapath"]["sip_dialogs_ended"], 1);
    for cseq in 4..14 {
        assert!(
            !is_ok(send(dialog_request("INVITE", "short", cseq, "server1"))),
            "a request of an ended dialog was answered"
        );
    }
    let stats = net.stats();
    assert_eq!(
        class_counter(&stats, "sip-original", "dropped_rate"),
        21 + 10
    );
}

#[test]
fn a_real_kamailio_dialog_passes_with_originals_closed_and_forgeries_do_not() {
    if !have_root("a_real_kamailio_dialog_passes_with_originals_closed") {
        return;
    }
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "sip", "5060"]);
    let _kamailio = gateway_tests::kamailio::Kamailio::start(
        &["ip", "netns", "exec", &net.gw_ns],
        format!("{GW_V4}:5060").parse().unwrap(),
    );
    let client = net.in_peer(|| UdpSocket::bind("10.99.0.2:5061").expect("bind"));
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let send = |msg: &str| -> Option<String> {
        let mut buf = [0u8; 2048];
        client.send_to(msg.as_bytes(), (GW_V4, 5060)).expect("send");
        client
            .recv_from(&mut buf)
            .ok()
            .map(|(n, _)| String::from_utf8_lossy(&buf[..n]).into_owned())
    };
    // Kamailio takes a moment to start: OPTIONS until it answers (bounded).
    let ready =
        (0..50).any(|n| send(&dialog_request("OPTIONS", &format!("up-{n}"), 1, "")).is_some());
    assert!(ready, "kamailio never answered");
    // The dialog's INVITE while originals are open; Kamailio's 200 OK carries its To tag.
    let ok = send(&dialog_request("INVITE", "kam", 1, "")).expect("the INVITE answered");
    assert!(ok.starts_with("SIP/2.0 200 OK"), "{ok}");
    let tag = ok
        .lines()
        .find(|l| l.starts_with("To:") || l.starts_with("t:"))
        .and_then(|l| l.split(";tag=").nth(1))
        .map(|t| t.trim().to_string())
        .expect("a To tag");
    // Originals closed: forged in-dialog requests get nothing, the real dialog goes on.
    net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0"]);
    assert_eq!(send(&dialog_request("INVITE", "forged", 1, &tag)), None);
    assert_eq!(send(&dialog_request("BYE", "nodialog", 2, &tag)), None);
    assert_eq!(send(&dialog_request("INVITE", "kam-other", 2, "x")), None);
    let exempt = class_counter(&net.stats(), "sip-exempt", "packets");
    assert_eq!(exempt, 0);
    assert_eq!(
        send(&dialog_request("ACK", "kam", 1, &tag)),
        None,
        "ACK has no answer"
    );
    let reinvite = send(&dialog_request("INVITE", "kam", 2, &tag)).expect("re-INVITE answered");
    assert!(reinvite.starts_with("SIP/2.0 200 OK"), "{reinvite}");
    assert_eq!(send(&dialog_request("ACK", "kam", 2, &tag)), None);
    let bye = send(&dialog_request("BYE", "kam", 3, &tag)).expect("BYE answered");
    assert!(bye.starts_with("SIP/2.0 200 OK"), "{bye}");
    let stats = net.stats();
    assert_eq!(class_counter(&stats, "sip-exempt", "packets"), 4, "{stats}");
    assert_eq!(class_counter(&stats, "sip-original", "dropped_rate"), 3);
}

#[test]
fn a_refused_client_is_reset_from_the_nic_with_no_daemon() {
    if !have_root("a_refused_client_is_reset_from_the_nic") {
        return;
    }
    refused_clients_are_reset(&[]);
}

#[test]
fn through_the_tc_fallback_both_ends_of_a_refused_connection_are_reset() {
    if !have_root("through_the_tc_fallback_both_ends_are_reset") {
        return;
    }
    refused_clients_are_reset(&["--mode", "tc"]);
}

/// With no daemon and tls-new closed, refused clients (raw hellos and a real openssl) get a
/// reset from the hook attached with `attach_args`, within 10 ms (median), and the server's
/// sockets for them are reset too: none is left in the server's namespace (`ss`).
fn refused_clients_are_reset(attach_args: &[&str]) {
    let net = TestNet::new();
    let cert = Cert::new();
    let listener = net.in_gw(|| TcpListener::bind((GW_V4, 443)).expect("bind"));
    let _server = RustlsServer::start(&cert, listener);
    let mut attach = vec!["attach", "--iface", &net.gw_if];
    attach.extend_from_slice(attach_args);
    net.gateway_ok(&attach);
    net.gateway_ok(&["service", "add", "tls", "443"]);
    net.gateway_ok(&["policy", "set", "tls-new", "--backlog", "0"]);
    let hello = HelloBuilder::tls13().build();
    // A client's hello is refused: the reset comes from the NIC, at once.
    let mut waits = Vec::new();
    for _ in 0..10 {
        let (got, waited) = send_and_read(&net, &hello, Duration::from_secs(2));
        assert_eq!(
            got,
            Err(std::io::ErrorKind::ConnectionReset),
            "{}",
            net.stats()
        );
        waits.push(waited);
    }
    waits.sort();
    eprintln!("waits for the reset from the NIC: {waits:?}");
    assert!(
        waits[waits.len() / 2] < Duration::from_millis(10),
        "median wait for the reset: {waits:?}"
    );
    // A real openssl client sees the reset too.
    let out = gateway_tests::tls::s_client(
        &["ip", "netns", "exec", &net.peer_ns],
        &format!("{GW_V4}:443"),
        &["-tls1_3"],
    );
    assert!(
        out.contains("Connection reset by peer") || out.contains("errno=104"),
        "{out}"
    );
    // A resumed client's class stays open: an offer of a published key is answered.
    let identity = [0x5a_u8; 32];
    let hex: String = identity.iter().map(|b| format!("{b:02x}")).collect();
    net.gateway_ok(&["tls", "issued", "add", &hex, "--kind", "psk"]);
    let resuming = HelloBuilder {
        psk_identity: Some(identity.to_vec()),
        ..HelloBuilder::tls13()
    }
    .build();
    assert!(answered(&net, &resuming), "{}", net.stats());
    assert_eq!(class_counter(&net.stats(), "tls-resumed", "admitted"), 1);
    let tls = &net.stats()["tls"];
    assert!(tls["resets_sent"].as_u64().unwrap() >= 11, "{tls}");
    assert_eq!(tls["resets_withheld"], 0, "{tls}");
    // The server's sockets got their resets too (XDP hands the server's reset to the stack and
    // the finishing program at TC ingress sends the client's; TC does both itself).
    let left = net.exec(
        &net.gw_ns,
        "ss",
        &["-Htn", "state", "established", "( sport = :443 )"],
    );
    let left = String::from_utf8_lossy(&left.stdout).to_string();
    assert!(left.trim().is_empty(), "server sockets left: {left}");
}

#[test]
fn with_refusals_answered_kamailio_answers_every_call_while_open_and_the_nic_the_rest() {
    if !have_root("kamailio_with_refusals_answered") {
        return;
    }
    let net = TestNet::new();
    let dir = gateway_tests::fresh_temp_dir("gwt-kam-503");
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "sip", "5060"]);
    net.gateway_ok(&[
        "policy",
        "set",
        "sip-original",
        "--refuse",
        "reject",
        "--retry-after",
        "5",
    ]);
    let _kamailio = gateway_tests::kamailio::Kamailio::start(
        &["ip", "netns", "exec", &net.gw_ns],
        format!("{GW_V4}:5060").parse().unwrap(),
    );
    // Kamailio takes a moment to start: OPTIONS until it answers (bounded). It answers the
    // Via's port, 5061, which SIPp takes over afterwards.
    let probe = net.in_peer(|| UdpSocket::bind("10.99.0.2:5061").expect("bind"));
    probe
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let ready = (0..50).any(|n| {
        let options = dialog_request("OPTIONS", &format!("up-{n}"), 1, "");
        probe.send_to(options.as_bytes(), (GW_V4, 5060)).unwrap();
        probe.recv_from(&mut [0u8; 2048]).is_ok()
    });
    assert!(ready, "kamailio never answered");
    drop(probe);
    let sent = |net: &TestNet| {
        net.stats()["datapath"]["sip_replies_sent"]
            .as_u64()
            .unwrap()
    };
    // Open: Kamailio answers every call; the NIC answers nothing.
    let open = gateway_tests::sipp::run_uac(&net, &dir, 20, 2);
    assert_eq!(open.total("SuccessfulCall"), 40, "{:?}", open.totals);
    assert_eq!(open.total("FailedCall"), 0, "{:?}", open.totals);
    assert_eq!(sent(&net), 0);
    // Closed: every call fails on the NIC's 503, none retransmitted.
    net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0"]);
    let closed = gateway_tests::sipp::run_uac(&net, &dir, 20, 1);
    assert_eq!(closed.total("SuccessfulCall"), 0, "{:?}", closed.totals);
    assert_eq!(closed.total("FailedCall"), 20, "{:?}", closed.totals);
    assert_eq!(closed.total("Retransmissions"), 0, "{:?}", closed.totals);
    assert_eq!(sent(&net), 20);
    let _ = std::fs::remove_dir_all(&dir);
}
