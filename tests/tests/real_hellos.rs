//! The ClientHello parser on hellos captured from real clients: openssl s_client (TLS 1.2 and 1.3,
//! fresh and resuming with -sess_in) and curl.

use gateway_common::tls::{KEY_LEN, Offer, Verdict, parse_hello};
use gateway_tests::tls::{
    Cert, RustlsServer, accepts, capture_hello, free_port, non_empty, rustls_config, rustls_get,
    s_client, s_client_input, s_server, wait_listening,
};

/// Gets a session from a real s_server into `sess` (TLS `version`), then captures the resuming
/// hello s_client sends with -sess_in.
fn resuming_hello(version: &str, server_opts: &[&str]) -> (Vec<u8>, String) {
    let cert = Cert::new();
    let port = free_port();
    let _server = s_server(&[], &cert, port, server_opts);
    wait_listening(|| accepts(port));
    let sess = cert.file("sess.pem");
    let out = s_client_input(
        &[],
        &format!("127.0.0.1:{port}"),
        &[version, "-sess_out", sess.to_str().unwrap(), "-ign_eof"],
        b"GET / HTTP/1.0\r\n\r\n",
    );
    assert!(non_empty(&sess), "no session saved: {out}");
    let hello = capture_hello(|addr| {
        s_client(&[], &addr, &[version, "-sess_in", sess.to_str().unwrap()]);
    });
    let text = std::fs::read_to_string(&sess).unwrap();
    (hello, text)
}

#[test]
fn openssl_new_sessions_are_new() {
    for version in ["-tls1_2", "-tls1_3"] {
        let hello = capture_hello(|addr| {
            s_client(&[], &addr, &[version]);
        });
        let st = parse_hello(&hello);
        assert_eq!(st.verdict(), Verdict::New, "{version}: {st:?}");
        assert_eq!(st.tls13(), version == "-tls1_3");
    }
}

#[test]
fn openssl_tls12_ticket_resumption_is_a_ticket_offer() {
    let (hello, _) = resuming_hello("-tls1_2", &[]);
    let st = parse_hello(&hello);
    assert_eq!(st.verdict(), Verdict::Offer, "{st:?}");
    assert_eq!(st.offer(), Offer::Ticket);
    assert!(st.offer_key().is_some());
}

#[test]
fn openssl_tls12_session_id_resumption_is_a_session_id_offer() {
    let (hello, _) = resuming_hello("-tls1_2", &["-no_ticket"]);
    let st = parse_hello(&hello);
    assert_eq!(st.verdict(), Verdict::Offer, "{st:?}");
    assert_eq!(st.offer(), Offer::SessionId);
    assert_eq!(st.sid_len as usize, 32);
    assert!(st.offer_key().is_some());
}

#[test]
fn openssl_tls13_resumption_is_a_psk_offer() {
    let (hello, _) = resuming_hello("-tls1_3", &[]);
    let st = parse_hello(&hello);
    assert_eq!(st.verdict(), Verdict::Offer, "{st:?}");
    assert_eq!(st.offer(), Offer::Psk);
    assert!(st.tls13());
    let key = st.offer_key().expect("PSK identity key");
    assert_eq!(key.len(), KEY_LEN);
}

#[test]
fn curl_hello_is_new() {
    let hello = capture_hello(|addr| {
        let _ = std::process::Command::new("curl")
            .args(["-sk", "--max-time", "5", &format!("https://{addr}/")])
            .output();
    });
    let st = parse_hello(&hello);
    assert_eq!(st.verdict(), Verdict::New, "{st:?}");
    assert!(st.tls13());
}

/// Whether the hello offers an X25519MLKEM768 (0x11ec) key share: its group id followed by the
/// 1216-byte share length.
fn has_mlkem_share(hello: &[u8]) -> bool {
    hello.windows(4).any(|w| w == [0x11, 0xec, 0x04, 0xc0])
}

#[test]
fn rustls_post_quantum_hellos_fresh_and_resuming() {
    let cert = Cert::new();
    let config = rustls_config(&cert);
    // Fresh: X25519MLKEM768 makes it large, and it offers nothing.
    let hello = capture_hello(|addr| {
        let _ = rustls_get(&config, &addr);
    });
    assert!(has_mlkem_share(&hello), "post-quantum key share");
    assert!(hello.len() > 1200, "{} bytes", hello.len());
    let st = parse_hello(&hello);
    assert_eq!(st.verdict(), Verdict::New, "{st:?}");
    assert!(st.tls13());
    // A full handshake with a post-quantum server gives rustls tickets (and the hint that the
    // server chose X25519MLKEM768)...
    let server = RustlsServer::start(&cert, std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let addr = server.addr.to_string();
    let kind = rustls_get(&config, &addr).unwrap();
    assert_eq!(kind, rustls::HandshakeKind::Full);
    // ...and its next hello to the same name offers one as a PSK, after the big key share.
    let hello = capture_hello(|addr| {
        let _ = rustls_get(&config, &addr);
    });
    assert!(has_mlkem_share(&hello));
    let st = parse_hello(&hello);
    assert_eq!(st.verdict(), Verdict::Offer, "{st:?}");
    assert_eq!(st.offer(), Offer::Psk);
    assert!(st.offer_key().is_some());
    // Split anywhere, the verdict and key are the same.
    let whole = st;
    for cut in (1..hello.len()).step_by(7) {
        let mut s = gateway_common::tls::HelloState::new();
        for (start, part) in [(0, &hello[..cut]), (cut, &hello[cut..])] {
            s.feed(part, start as u32);
        }
        assert_eq!(s, whole, "cut at {cut}");
    }
    assert!(hello.len() > 1500, "{} bytes", hello.len());
    // The offered key is the digest of a ticket the server issued.
    let key = st.offer_key().unwrap();
    assert!(
        server.issued_digests().contains(&key),
        "{key:02x?} not issued"
    );
    // And the resumption really happens against the server.
    let kind = rustls_get(&config, &addr).unwrap();
    assert_eq!(kind, rustls::HandshakeKind::Resumed);
}
