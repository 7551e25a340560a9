//! TLS through the attached datapath with real clients and a real server: openssl s_client from a
//! peer namespace to openssl s_server behind `gateway run`.

use std::{
    net::TcpStream,
    time::{Duration, Instant},
};

use gateway_tests::{
    behind::BehindGateway,
    daemon::Daemon,
    have_root, have_xdp,
    netns::{GW_V4, TestNet, class_counter, must},
    tls::{Cert, RustlsServer, rustls_config, rustls_get, session_key},
};

/// `gateway run` protecting tcp/`port` (tls) on the gateway's veth, detaching on exit.
fn gateway_for(net: &TestNet, cert: &Cert, port: u16) -> Daemon {
    let dir = cert.file("");
    Daemon::start_config(
        net,
        &dir,
        &format!("services:\n  - {{kind: tls, port: {port}}}\n"),
    )
}

/// An s_server on 443 (`server_opts`) behind `gateway run` protecting it.
fn setup(server_opts: &[&str]) -> BehindGateway {
    BehindGateway::new(server_opts, "services:\n  - {kind: tls, port: 443}\n")
}

fn resumption(version: &str, server_opts: &[&str], kind: &str) {
    let s = setup(server_opts);
    let sess = s.cert.file("sess.pem");
    let sess = sess.to_str().unwrap();
    // A full handshake: tls-new.
    let out = s.client(&[version, "-sess_out", sess, "-ign_eof"]);
    assert!(out.contains("New,"), "{out}");
    assert_eq!(s.counter("tls-new", "packets"), 1);
    // Resumption offered, but the key was never published: tls-new, unverified.
    let out = s.client(&[version, "-sess_in", sess, "-ign_eof"]);
    assert!(out.contains("Reused,"), "the server did resume: {out}");
    assert_eq!(s.counter("tls-new", "packets"), 2);
    assert_eq!(s.counter("tls-resumed", "packets"), 0);
    assert_eq!(s.tls("unverified_offers"), 1);
    // Published: the same resumption is tls-resumed.
    let key = session_key(std::path::Path::new(sess));
    s.net
        .gateway_ok(&["tls", "issued", "add", &key, "--kind", kind]);
    let out = s.client(&[version, "-sess_in", sess, "-ign_eof"]);
    assert!(out.contains("Reused,"), "{out}");
    assert_eq!(s.counter("tls-resumed", "packets"), 1);
    assert_eq!(s.tls("unverified_offers"), 1);
    // Every admitted connection completed: the backlogs are back to zero.
    assert_eq!(s.counter("tls-new", "backlog"), 0);
    assert_eq!(s.counter("tls-resumed", "backlog"), 0);
}

#[test]
fn tls13_psk_resumption_is_verified_against_published_keys() {
    if !have_root("tls13_psk_resumption_is_verified") {
        return;
    }
    resumption("-tls1_3", &[], "psk");
}

#[test]
fn tls12_session_id_resumption_is_verified_against_published_keys() {
    if !have_root("tls12_session_id_resumption_is_verified") {
        return;
    }
    resumption("-tls1_2", &["-no_ticket"], "session-id");
}

#[test]
fn a_resuming_hello_split_by_a_small_mtu_is_still_verified() {
    if !have_root("a_resuming_hello_split_by_a_small_mtu")
        || !have_xdp("a_resuming_hello_split_by_a_small_mtu")
    {
        return;
    }
    let s = setup(&[]);
    for (ns, ifname) in [
        (&s.net.gw_ns, &s.net.gw_if),
        (&s.net.peer_ns, &s.net.peer_if),
    ] {
        must(
            "ip",
            &["-n", ns, "link", "set", "dev", ifname, "mtu", "300"],
        );
    }
    let (sess, _) = s.published_session("-tls1_3", "psk");
    let sess = sess.to_str().unwrap();
    let before = s.tls("multi_segment");
    let out = s.client(&["-tls1_3", "-sess_in", sess, "-ign_eof"]);
    assert!(out.contains("Reused,"), "{out}");
    assert!(
        s.tls("multi_segment") > before,
        "the hello took several segments"
    );
    assert_eq!(s.counter("tls-resumed", "packets"), 1);
}

#[test]
fn with_tls_new_closed_new_clients_are_reset_at_once_and_resumed_ones_connect() {
    if !have_root("with_tls_new_closed") {
        return;
    }
    let s = setup(&[]);
    let (sess, _) = s.published_session("-tls1_3", "psk");
    let sess = sess.to_str().unwrap();
    // Close tls-new from the CLI while the daemon runs.
    s.net
        .gateway_ok(&["policy", "set", "tls-new", "--backlog", "0", "--pin"]);
    for _ in 0..3 {
        let start = Instant::now();
        let out = s.client(&["-tls1_3"]);
        let took = start.elapsed();
        assert!(out.contains("errno=104") || out.contains("reset"), "{out}");
        assert!(
            out.contains("handshake has read 0 bytes"),
            "no handshake: {out}"
        );
        assert!(took < Duration::from_secs(1), "reset after {took:?}");
        eprintln!("new client reset after {took:?}");
    }
    assert_eq!(s.counter("tls-new", "rejected"), 3);
    assert_eq!(s.counter("tls-new", "dropped_backlog"), 3);
    // The single-threaded s_server is not stuck on the rejected connections: resumed clients
    // connect, one after another.
    for _ in 0..2 {
        let out = s.client(&["-tls1_3", "-sess_in", sess, "-ign_eof"]);
        assert!(out.contains("Reused,"), "{out}");
    }
    assert_eq!(s.counter("tls-resumed", "packets"), 2);
    // Reopen: new clients get through again.
    s.net.gateway_ok(&["policy", "clear", "tls-new"]);
    assert!(s.client(&["-tls1_3"]).contains("New,"));
}

#[test]
fn a_post_quantum_rustls_resumption_spans_two_segments_and_is_verified() {
    if !have_root("a_post_quantum_rustls_resumption")
        || !have_xdp("a_post_quantum_rustls_resumption")
    {
        return;
    }
    let net = TestNet::new();
    let cert = Cert::new();
    let listener = net.in_gw(|| std::net::TcpListener::bind("0.0.0.0:8443").unwrap());
    let server = RustlsServer::start(&cert, listener);
    let daemon = gateway_for(&net, &cert, 8443);
    let config = rustls_config(&cert);
    let addr = format!("{GW_V4}:8443");
    let stat = |class: &str| class_counter(&net.stats(), class, "packets");
    let tls = |field: &str| net.stats()["tls"][field].as_u64().unwrap();
    // A full handshake; the server issues tickets, which we publish (the TLS proxy's job later).
    assert_eq!(
        net.in_peer(|| rustls_get(&config, &addr)).unwrap(),
        rustls::HandshakeKind::Full
    );
    assert_eq!(stat("tls-new"), 1);
    let keys = server.issued_keys();
    assert!(!keys.is_empty());
    for key in &keys {
        net.gateway_ok(&["tls", "issued", "add", key, "--kind", "psk"]);
    }
    // The resuming hello (X25519MLKEM768 share, then the PSK; ~1.7 KB) takes two segments at
    // MTU 1500 and is verified against the published keys when the second arrives.
    let before = tls("multi_segment");
    assert_eq!(
        net.in_peer(|| rustls_get(&config, &addr)).unwrap(),
        rustls::HandshakeKind::Resumed
    );
    assert!(tls("multi_segment") > before, "two segments");
    assert_eq!(stat("tls-resumed"), 1);
    assert_eq!(tls("unverified_offers"), 0);
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
}

#[test]
fn a_public_session_id_prefix_buys_nothing_while_the_real_session_resumes() {
    if !have_root("a_public_session_id_prefix_buys_nothing") {
        return;
    }
    let s = setup(&["-no_ticket"]);
    // The daemon (here, by hand) publishes the session id it issued, which the ServerHello
    // carried in clear.
    let (sess, out) = s.published_session("-tls1_2", "session-id");
    assert!(out.contains("New,"), "{out}");
    let key = session_key(&sess);
    let sess = sess.to_str().unwrap();
    s.net
        .gateway_ok(&["policy", "set", "tls-new", "--backlog", "0", "--pin"]);
    // Twenty clients offer the id's first 16 bytes and 16 random ones: tls-new, refused.
    let prefix: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&key[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let before = s.tls("unverified_offers");
    for n in 0..20u8 {
        let mut id = prefix.clone();
        id.extend((0..16).map(|i| n.wrapping_mul(31).wrapping_add(i)));
        let hello = gateway_common::testing::HelloBuilder {
            session_id: id,
            ..Default::default()
        }
        .build();
        let answered = s.net.in_peer(|| {
            use std::io::{Read as _, Write as _};
            let mut c = TcpStream::connect((GW_V4, 443)).expect("connect");
            c.set_read_timeout(Some(Duration::from_millis(300)))
                .unwrap();
            c.write_all(&hello).expect("hello");
            let mut b = [0u8; 1];
            matches!(c.read(&mut b), Ok(1))
        });
        assert!(!answered, "a forged offer was served");
    }
    assert_eq!(s.tls("unverified_offers") - before, 20);
    assert_eq!(s.counter("tls-resumed", "packets"), 0);
    // The real session still resumes, as tls-resumed.
    let out = s.client(&["-tls1_2", "-sess_in", sess, "-ign_eof"]);
    assert!(out.contains("Reused,"), "{out}");
    assert_eq!(s.counter("tls-resumed", "packets"), 1);
}
