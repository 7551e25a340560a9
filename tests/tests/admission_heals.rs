//! Admission state that heals itself (issue 9), with real clients and servers in namespaces and
//! no daemon: the datapath is attached with the CLI, so whatever heals does so in the kernel.
//!
//! Each test turns one way a class could be wedged into a check that it no longer is: a silent
//! client, a server that never answers, a client that releases its own slot, a flood of spoofed
//! segments, a SIP server that was down.

use std::{
    io::Write as _,
    net::{TcpListener, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use gateway_common::testing::HelloBuilder;
use gateway_tests::{
    frames::Frame,
    have_root,
    netns::{GW_V4, TestNet, class_counter, send_raw_frames},
    sipserver::SlowSipServer,
    tls::{Cert, RustlsServer, rustls_config, rustls_get},
};

/// Attaches the datapath (no daemon) and protects tls/443 and tls/444 and sip/5060.
fn attach(net: &TestNet) {
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "tls", "443"]);
    net.gateway_ok(&["service", "add", "tls", "444"]);
    net.gateway_ok(&["service", "add", "sip", "5060"]);
}

fn policy(net: &TestNet, class: &str, backlog: u64, timeout: &str) {
    net.gateway_ok(&[
        "policy",
        "set",
        class,
        "--backlog",
        &backlog.to_string(),
        "--timeout",
        timeout,
    ]);
}

fn counter(net: &TestNet, class: &str, field: &str) -> u64 {
    class_counter(&net.stats(), class, field)
}

/// Waits (bounded) until `done`.
fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `n` clients from the peer namespace that connect to `port`, send a ClientHello and then
/// `after` (nothing, for silent ones), and stay connected.
fn clients(net: &TestNet, port: u16, n: usize, after: &[u8]) -> Vec<TcpStream> {
    let hello = HelloBuilder::default().build();
    net.in_peer(|| {
        (0..n)
            .map(|_| {
                let mut s = TcpStream::connect((GW_V4, port)).expect("connect");
                let mut first = hello.clone();
                first.extend_from_slice(after);
                s.write_all(&first).expect("hello");
                s
            })
            .collect()
    })
}

/// A listener on `port` in the gateway namespace that never accepts: the kernel completes the
/// TCP handshakes and nothing ever answers a hello (a hung or overwhelmed server).
fn mute_server(net: &TestNet, port: u16) -> TcpListener {
    net.in_gw(|| TcpListener::bind((GW_V4, port)).expect("bind"))
}

/// A real rustls server on 443 in the gateway namespace, one thread per connection.
fn answering_server(net: &TestNet, cert: &Cert) -> RustlsServer {
    let listener = net.in_gw(|| TcpListener::bind((GW_V4, 443)).expect("bind"));
    RustlsServer::start(cert, listener)
}

fn served(net: &TestNet, cert: &Cert) -> bool {
    let config = rustls_config(cert);
    net.in_peer(|| rustls_get(&config, &format!("{GW_V4}:443")).is_ok())
}

#[test]
fn silent_clients_hold_no_place_once_the_server_answered() {
    if !have_root("silent_clients_hold_no_place") {
        return;
    }
    let net = TestNet::new();
    let cert = Cert::new();
    let _server = answering_server(&net, &cert);
    attach(&net);
    // A long timeout: what frees the places here is the server's answer, not expiry.
    policy(&net, "tls-new", 10, "60s");
    let _silent = clients(&net, 443, 10, b"");
    wait_until("ten hellos answered", Duration::from_secs(5), || {
        counter(&net, "tls-new", "admitted") == 10 && counter(&net, "tls-new", "backlog") == 0
    });
    assert_eq!(counter(&net, "tls-new", "expired"), 0);
    // The ten sockets stay open and silent; a real client is served at once.
    assert!(served(&net, &cert), "a real client after ten silent ones");
    assert_eq!(counter(&net, "tls-new", "admitted"), 11);
}

#[test]
fn unanswered_clients_expire_and_a_real_client_is_served_within_the_timeout_plus_a_second() {
    if !have_root("unanswered_clients_expire") {
        return;
    }
    let net = TestNet::new();
    let cert = Cert::new();
    let _server = answering_server(&net, &cert);
    let _mute = mute_server(&net, 444);
    attach(&net);
    let timeout = Duration::from_secs(1);
    policy(&net, "tls-new", 10, "1s");
    // Ten hellos to a server that never answers: the class is full.
    let _stuck = clients(&net, 444, 10, b"");
    let filled = Instant::now();
    wait_until("ten admitted", Duration::from_secs(5), || {
        counter(&net, "tls-new", "backlog") == 10
    });
    // Full: another hello is refused.
    let dropped = counter(&net, "tls-new", "dropped_backlog");
    let _refused = clients(&net, 444, 1, b"");
    wait_until("the eleventh refused", Duration::from_secs(5), || {
        counter(&net, "tls-new", "dropped_backlog") > dropped
    });
    // After the timeout, with no daemon, a real client's hello finds the ten expired.
    std::thread::sleep((timeout + Duration::from_millis(100)).saturating_sub(filled.elapsed()));
    assert!(served(&net, &cert), "a real client after the timeout");
    let took = filled.elapsed();
    assert!(
        took < timeout + Duration::from_secs(1),
        "served {took:?} after the class filled"
    );
    assert_eq!(counter(&net, "tls-new", "expired"), 10);
    assert_eq!(counter(&net, "tls-new", "backlog"), 0);
}

#[test]
fn clients_cannot_release_their_own_slots_with_an_early_change_cipher_spec() {
    if !have_root("clients_cannot_release_their_own_slots") {
        return;
    }
    let net = TestNet::new();
    let _mute = mute_server(&net, 444);
    attach(&net);
    policy(&net, "tls-new", 5, "30s");
    // A ChangeCipherSpec right behind the hello, as if the handshake were over, then a FIN.
    let ccs = [20u8, 3, 3, 0, 1, 1];
    for s in clients(&net, 444, 40, &ccs) {
        let _ = s.shutdown(std::net::Shutdown::Write);
        std::mem::forget(s);
    }
    wait_until("forty hellos judged", Duration::from_secs(5), || {
        counter(&net, "tls-new", "admitted") + counter(&net, "tls-new", "dropped_backlog") >= 40
    });
    assert_eq!(counter(&net, "tls-new", "admitted"), 5);
    assert_eq!(counter(&net, "tls-new", "backlog"), 5);
}

#[test]
fn spoofed_segments_create_no_state_and_evict_no_admitted_work() {
    if !have_root("spoofed_segments_create_no_state") {
        return;
    }
    const SPOOFED: usize = 20_000;
    let net = TestNet::new();
    let cert = Cert::new();
    let _server = answering_server(&net, &cert);
    let _mute = mute_server(&net, 444);
    attach(&net);
    policy(&net, "tls-new", 10, "30s");
    // Five admitted connections the server has not answered.
    let _held = clients(&net, 444, 5, b"");
    wait_until("five admitted", Duration::from_secs(5), || {
        counter(&net, "tls-new", "backlog") == 5
    });
    // Segments from 4-tuples no connection exists for: hellos, garbage, data records.
    let hello = HelloBuilder::default().build();
    let frames: Vec<Vec<u8>> = (0..SPOOFED)
        .map(|i| {
            let payload: &[u8] = match i % 3 {
                0 => &hello,
                1 => &[0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3],
                _ => &[23, 3, 3, 0, 2, 0, 0],
            };
            // Source ports below the ephemeral range: no real connection shares a 4-tuple.
            Frame::tcp(443 + (i % 2) as u16, payload)
                .from_port(1024 + (i % 28_000) as u16)
                .seq(i as u32)
                .flags(0x18)
                .build()
        })
        .collect();
    let flow_packets = counter(&net, "tls-flow", "packets");
    let peer_if = net.peer_if.clone();
    net.in_peer(|| {
        // Paced, so the veth's ring is not what drops them.
        for chunk in frames.chunks(250) {
            send_raw_frames(&peer_if, chunk);
            std::thread::sleep(Duration::from_millis(2));
        }
    });
    let stats = net.stats();
    let no_connection = stats["tls"]["no_connection"].as_u64().unwrap();
    // Every spoofed segment that arrived cost a lookup and was dropped, and most arrived.
    assert_eq!(
        no_connection,
        counter(&net, "tls-flow", "packets") - flow_packets,
        "{stats}"
    );
    assert!(no_connection >= SPOOFED as u64 * 9 / 10, "{no_connection}");
    assert_eq!(counter(&net, "tls-flow", "dropped_backlog"), 0);
    // Nothing was admitted, nothing evicted: the five still hold their places.
    assert_eq!(counter(&net, "tls-new", "admitted"), 5);
    assert_eq!(counter(&net, "tls-new", "backlog"), 5);
    // Real clients are judged as ever.
    assert!(served(&net, &cert), "a real client after the flood");
    assert_eq!(counter(&net, "tls-new", "admitted"), 6);
    assert_eq!(counter(&net, "tls-new", "backlog"), 5);
}

#[test]
fn after_a_sip_outage_calls_succeed_within_the_timeout_plus_a_second() {
    if !have_root("after_a_sip_outage") {
        return;
    }
    let net = TestNet::new();
    attach(&net);
    let timeout = Duration::from_secs(2);
    policy(&net, "sip-original", 20, "2s");
    net.gateway_ok(&["policy", "set", "sip-retransmission", "--backlog", "10"]);
    let invite = |n: usize| {
        format!(
            "INVITE sip:service@{GW_V4}:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-outage-{n}\r\n\
From: <sip:caller@10.99.0.2>;tag={n}\r\nTo: <sip:service@{GW_V4}>\r\n\
Call-ID: outage-{n}@10.99.0.2\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
        )
    };
    let client = net.in_peer(|| UdpSocket::bind("10.99.0.2:5061").expect("bind"));
    client
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // The server is down: fifty INVITEs, twenty admitted, none answered.
    for n in 0..50 {
        client
            .send_to(invite(n).as_bytes(), (GW_V4, 5060))
            .expect("send");
    }
    let down = Instant::now();
    wait_until("fifty judged", Duration::from_secs(5), || {
        counter(&net, "sip-original", "packets") == 50
    });
    assert_eq!(counter(&net, "sip-original", "backlog"), 20);
    // The server comes back.
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).expect("bind"));
    let _server = SlowSipServer::start(socket, 1 << 20, Duration::ZERO, Duration::ZERO);
    // Calls are answered within the timeout plus a second of the outage's last admission.
    let mut buf = [0u8; 2048];
    let mut n = 100;
    let answered = loop {
        client
            .send_to(invite(n).as_bytes(), (GW_V4, 5060))
            .expect("send");
        if let Ok((len, _)) = client.recv_from(&mut buf) {
            break String::from_utf8_lossy(&buf[..len]).into_owned();
        }
        assert!(
            down.elapsed() < timeout + Duration::from_secs(1),
            "no call answered within the timeout plus a second"
        );
        n += 1;
    };
    assert!(answered.starts_with("SIP/2.0 200 OK"), "{answered}");
    assert!(answered.contains(&format!("outage-{n}@")), "{answered}");
    // Ten real calls in a row now succeed; the twenty expired, and answered calls leave nothing.
    for k in 0..10 {
        client
            .send_to(invite(1000 + k).as_bytes(), (GW_V4, 5060))
            .expect("send");
        let (len, _) = client.recv_from(&mut buf).expect("an answer");
        assert!(buf[..len].starts_with(b"SIP/2.0 200 OK"));
    }
    assert_eq!(counter(&net, "sip-original", "expired"), 20);
    wait_until("answered calls complete", Duration::from_secs(2), || {
        counter(&net, "sip-original", "backlog") == 0
    });
}

/// An INVITE of transaction `n` (`branch`: whether the top Via carries one).
fn sip_invite(n: usize, branch: bool) -> String {
    let branch = if branch {
        format!(";branch=z9hG4bK-{n}")
    } else {
        String::new()
    };
    format!(
        "INVITE sip:service@{GW_V4}:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.99.0.2:5061{branch}\r\n\
From: <sip:caller@10.99.0.2>;tag={n}\r\nTo: <sip:service@{GW_V4}>\r\n\
Call-ID: call-{n}@10.99.0.2\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
    )
}

#[test]
fn answered_requests_without_a_branch_leave_nothing_in_the_backlog() {
    if !have_root("answered_requests_without_a_branch") {
        return;
    }
    let net = TestNet::new();
    attach(&net);
    policy(&net, "sip-original", 20, "30s");
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).expect("bind"));
    let _server = SlowSipServer::start(socket, 1 << 20, Duration::ZERO, Duration::ZERO);
    let client = net.in_peer(|| UdpSocket::bind("10.99.0.2:5061").expect("bind"));
    client
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    // Forty branch-less requests through a class of twenty, each answered before the next.
    let mut buf = [0u8; 2048];
    for n in 0..40 {
        client
            .send_to(sip_invite(n, false).as_bytes(), (GW_V4, 5060))
            .expect("send");
        let (len, _) = client.recv_from(&mut buf).expect("an answer");
        assert!(buf[..len].starts_with(b"SIP/2.0 200 OK"));
    }
    wait_until("answers complete", Duration::from_secs(2), || {
        counter(&net, "sip-original", "backlog") == 0
    });
    assert_eq!(counter(&net, "sip-original", "admitted"), 40);
    assert_eq!(counter(&net, "sip-original", "expired"), 0);
}

#[test]
fn a_flood_of_transactions_cannot_evict_admitted_work() {
    if !have_root("a_flood_of_transactions_cannot_evict") {
        return;
    }
    // More distinct transactions than SIP_TXNS (an LRU) holds, each sent twice.
    const FLOOD: usize = 70_000;
    let net = TestNet::new();
    attach(&net);
    policy(&net, "sip-original", 20, "60s");
    net.gateway_ok(&["policy", "set", "sip-retransmission", "--backlog", "10"]);
    // A slow server: it holds twenty admitted INVITEs while the flood passes.
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).expect("bind"));
    let server_socket = socket.try_clone().unwrap();
    let client = net.in_peer(|| UdpSocket::bind("10.99.0.2:5061").expect("bind"));
    for n in 0..20 {
        client
            .send_to(sip_invite(n, true).as_bytes(), (GW_V4, 5060))
            .expect("send");
    }
    wait_until("twenty admitted", Duration::from_secs(5), || {
        counter(&net, "sip-original", "backlog") == 20
    });
    let flooder = net.in_peer(|| UdpSocket::bind("10.99.0.2:0").expect("bind"));
    for n in 0..FLOOD {
        let msg = sip_invite(1_000_000 + n, true);
        for _ in 0..2 {
            let _ = flooder.send_to(msg.as_bytes(), (GW_V4, 5060));
        }
    }
    assert_eq!(
        counter(&net, "sip-original", "backlog"),
        20,
        "the flood admitted nothing"
    );
    // The server now answers what it holds (its queue: the twenty, then whatever of the flood
    // the NIC let through, which is nothing).
    let _server = SlowSipServer::start(server_socket, 1 << 20, Duration::ZERO, Duration::ZERO);
    drop(socket);
    wait_until("the twenty complete", Duration::from_secs(5), || {
        counter(&net, "sip-original", "backlog") == 0
    });
    assert_eq!(counter(&net, "sip-original", "expired"), 0);
    // Fresh calls get through.
    client
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut buf = [0u8; 2048];
    for n in 0..10 {
        let msg = sip_invite(2_000_000 + n, true);
        let mut answered = false;
        // The server first drains the twenty's answers to this socket.
        while !answered {
            client.send_to(msg.as_bytes(), (GW_V4, 5060)).expect("send");
            let (len, _) = client.recv_from(&mut buf).expect("an answer");
            answered =
                String::from_utf8_lossy(&buf[..len]).contains(&format!("call-{}@", 2_000_000 + n));
        }
    }
}
