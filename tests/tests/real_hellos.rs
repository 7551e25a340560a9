//! The ClientHello parser on hellos captured from real clients: openssl s_client (TLS 1.2 and 1.3,
//! fresh and resuming with -sess_in) and curl.

use gateway_common::tls::{KEY_LEN, Offer, Verdict, parse_hello};
use gateway_tests::tls::{
    Cert, accepts, capture_hello, free_port, non_empty, s_client, s_client_input, s_server,
    wait_listening,
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
