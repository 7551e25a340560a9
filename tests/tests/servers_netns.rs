//! TLS servers the gateway does not terminate (issue 51): real nginx and HAProxy in the
//! gateway's namespace behind `gateway run`, a tls service with a `server:` section, and real
//! clients (openssl s_client, curl) from the peer namespace. Their TLS 1.2 sessions are learnt
//! at the NIC from the servers' own packets.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use gateway_tests::{
    backend::{Haproxy, Nginx},
    daemon::Daemon,
    have_root,
    netns::{GW_V4, TestNet, class_counter},
    tls::{Cert, capture_hello, s_client_input, wait_listening},
};

const SERVICES: &str = "services:\n  - {kind: tls, port: 443, server: {session_lifetime: 5m}}\n";

/// Which server runs behind the gateway.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Nginx,
    Haproxy,
}

/// The server process, whichever it is; stopped on drop.
enum Server {
    Nginx(#[allow(dead_code)] Nginx),
    Haproxy(#[allow(dead_code)] Haproxy),
}

fn start_server(kind: Kind, net: &TestNet, cert: &Cert) -> Server {
    let prefix = ["ip", "netns", "exec", net.gw_ns.as_str()];
    let server = match kind {
        Kind::Nginx => Server::Nginx(Nginx::start(
            &prefix,
            &format!(
                "server {{ listen 443 ssl; ssl_certificate {}; ssl_certificate_key {};\n\
                 ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:gw:1m;\n\
                 ssl_session_timeout 5m;\n\
                 location / {{ return 200 \"served\\n\"; }} }}",
                cert.cert().display(),
                cert.key().display()
            ),
            1,
        )),
        Kind::Haproxy => {
            // HAProxy reads the certificate and its key from one file.
            let pem = cert.file("haproxy.pem");
            let mut both = std::fs::read(cert.cert()).unwrap();
            both.extend(std::fs::read(cert.key()).unwrap());
            std::fs::write(&pem, both).unwrap();
            Server::Haproxy(Haproxy::start(
                &prefix,
                &format!(
                    "frontend fe\n  bind :443 ssl crt {} ssl-min-ver TLSv1.2\n  \
                     http-request return status 200 content-type text/plain string \"served\\n\"\n",
                    pem.display()
                ),
            ))
        }
    };
    wait_listening(|| net.in_gw(|| TcpStream::connect(("127.0.0.1", 443)).is_ok()));
    server
}

/// A server behind `gateway run` learning its sessions.
struct Behind {
    net: TestNet,
    cert: Cert,
    kind: Kind,
    server: Option<Server>,
    _daemon: Daemon,
}

impl Behind {
    fn new(kind: Kind) -> Self {
        let net = TestNet::new();
        let cert = Cert::new();
        let server = start_server(kind, &net, &cert);
        let daemon = Daemon::start_config(&net, &cert.file(""), SERVICES);
        Behind {
            net,
            cert,
            kind,
            server: Some(server),
            _daemon: daemon,
        }
    }

    /// The server stopped and started again: its session cache and ticket keys are new.
    fn restart_server(&mut self) {
        self.server = None;
        self.server = Some(start_server(self.kind, &self.net, &self.cert));
    }

    /// s_client from the peer namespace with `args`, sending a request; its output.
    fn client(&self, args: &[&str]) -> String {
        s_client_input(
            &["ip", "netns", "exec", &self.net.peer_ns],
            &format!("{GW_V4}:443"),
            args,
            b"GET / HTTP/1.0\r\n\r\n",
        )
    }

    /// A full TLS 1.2 handshake whose session is saved to `name` (`extra`: `-no_ticket` for a
    /// session id alone); the session file.
    fn full(&self, name: &str, extra: &[&str]) -> String {
        let sess = self.cert.file(name).display().to_string();
        let mut args = vec!["-tls1_2", "-sess_out", &sess, "-ign_eof"];
        args.extend_from_slice(extra);
        let out = self.client(&args);
        assert!(
            out.contains("New,"),
            "{:?}: a full handshake: {out}",
            self.kind
        );
        sess
    }

    fn resume(&self, sess: &str) -> String {
        self.client(&["-tls1_2", "-sess_in", sess, "-ign_eof"])
    }

    fn tls(&self, field: &str) -> u64 {
        self.net.stats()["tls"][field].as_u64().unwrap()
    }

    fn counter(&self, class: &str, field: &str) -> u64 {
        class_counter(&self.net.stats(), class, field)
    }

    /// Waits (at most 10 s) until `class`'s backlog is zero.
    fn backlog_drains(&self, class: &str) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.counter(class, "backlog") != 0 {
            assert!(
                Instant::now() < deadline,
                "{:?}: {class} backlog stays {}",
                self.kind,
                self.counter(class, "backlog")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// TLS 1.2 session ids and tickets learnt from the server's packets resume in tls-resumed with
/// tls-new closed; new clients are refused at the NIC; the backlog of the full handshakes is
/// back to zero with none expired.
fn learnt_sessions_resume_with_tls_new_closed(kind: Kind) {
    let s = Behind::new(kind);
    let sid = s.full("sid.pem", &["-no_ticket"]);
    let after_sid = s.tls("keys_learnt");
    assert_eq!(
        after_sid, 1,
        "{kind:?}: the session id its ServerHello gave"
    );
    let ticket = s.full("ticket.pem", &[]);
    let after_ticket = s.tls("keys_learnt");
    // With a ticket, the server gives no session id (an empty one): the ticket alone.
    assert_eq!(
        after_ticket,
        after_sid + 1,
        "{kind:?}: the ticket of its second flight"
    );
    eprintln!(
        "{kind:?}: keys learnt: {after_sid} after the session id, {after_ticket} after the ticket"
    );
    // Every full handshake's unit ended with the server's ChangeCipherSpec, none at a timeout.
    s.backlog_drains("tls-new");
    assert_eq!(s.counter("tls-new", "expired"), 0, "{kind:?}");
    assert_eq!(s.counter("tls-new", "completed"), 2, "{kind:?}");
    s.net
        .gateway_ok(&["policy", "set", "tls-new", "--backlog", "0", "--pin"]);
    let out = s.client(&["-tls1_2"]);
    assert!(
        out.contains("handshake has read 0 bytes"),
        "{kind:?}: a new client is refused: {out}"
    );
    let resumed = s.counter("tls-resumed", "packets");
    for sess in [&sid, &ticket] {
        let out = s.resume(sess);
        assert!(out.contains("Reused,"), "{kind:?}: {sess}: {out}");
        assert!(out.contains("served"), "{kind:?}: {out}");
    }
    assert_eq!(s.counter("tls-resumed", "packets"), resumed + 2, "{kind:?}");
    assert_eq!(s.counter("tls-new", "rejected"), 1, "{kind:?}");
    s.backlog_drains("tls-resumed");
    // curl: a full handshake, then a resumption of it on a second connection.
    s.net.gateway_ok(&["policy", "clear", "tls-new"]);
    let resumed = s.counter("tls-resumed", "packets");
    let url = format!("https://{GW_V4}/");
    let out = s.net.exec(
        &s.net.peer_ns,
        "curl",
        &[
            "-sSk",
            "--tlsv1.2",
            "--tls-max",
            "1.2",
            "-H",
            "Connection: close",
            &url,
            &url,
        ],
    );
    let body = String::from_utf8_lossy(&out.stdout);
    assert_eq!(body, "served\nserved\n", "{kind:?}: {out:?}");
    assert_eq!(
        s.counter("tls-resumed", "packets"),
        resumed + 1,
        "{kind:?}: curl's second connection resumed its first"
    );
}

#[test]
fn nginx_tls12_sessions_are_learnt_at_the_nic_and_resume_with_tls_new_closed() {
    if !have_root("nginx_tls12_sessions_are_learnt") {
        return;
    }
    learnt_sessions_resume_with_tls_new_closed(Kind::Nginx);
}

#[test]
fn haproxy_tls12_sessions_are_learnt_at_the_nic_and_resume_with_tls_new_closed() {
    if !have_root("haproxy_tls12_sessions_are_learnt") {
        return;
    }
    learnt_sessions_resume_with_tls_new_closed(Kind::Haproxy);
}

/// Only what the server really issued to a client that completed a handshake is learnt: a
/// client that leaves after the server's first flight (its ServerHello gave a session id)
/// earns nothing, and its unit still ends (the server closes); a session the server no longer
/// resumes (restarted: a new cache and new ticket keys) is declined by its full handshake and
/// withdrawn, so that its next offer is tls-new.
#[test]
fn only_completed_handshakes_are_learnt_and_declined_offers_are_withdrawn() {
    if !have_root("only_completed_handshakes_are_learnt") {
        return;
    }
    let mut s = Behind::new(Kind::Nginx);
    // A TLS 1.2 hello, sent raw: the client reads the server's first flight and leaves.
    let hello = capture_hello(|addr| {
        let _ = std::process::Command::new("openssl")
            .args(["s_client", "-connect", &addr, "-tls1_2", "-no_ticket"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    });
    let first_flight = s.net.in_peer(|| {
        let mut c = TcpStream::connect((GW_V4, 443)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(&hello).unwrap();
        let mut got = vec![0u8; 4096];
        let n = c.read(&mut got).unwrap();
        got.truncate(n);
        got
    });
    assert_eq!(first_flight.get(5), Some(&2), "a ServerHello came back");
    assert_eq!(s.tls("keys_learnt"), 0, "nothing is learnt before the CCS");
    s.backlog_drains("tls-new");
    assert_eq!(s.counter("tls-new", "expired"), 0);
    // A session learnt, then the server restarted.
    let sid = s.full("sid.pem", &["-no_ticket"]);
    assert_eq!(s.tls("keys_learnt"), 1);
    s.restart_server();
    let resumed = s.counter("tls-resumed", "packets");
    let out = s.resume(&sid);
    assert!(
        out.contains("New,"),
        "the restarted server does not resume: {out}"
    );
    assert_eq!(s.counter("tls-resumed", "packets"), resumed + 1);
    assert_eq!(
        s.tls("offers_declined"),
        1,
        "its ServerHello declined the offer"
    );
    // Withdrawn: the same offer is tls-new now.
    let new = s.counter("tls-new", "packets");
    let out = s.resume(&sid);
    assert!(out.contains("New,"), "{out}");
    assert_eq!(s.counter("tls-new", "packets"), new + 1);
    assert_eq!(s.counter("tls-resumed", "packets"), resumed + 1);
    s.backlog_drains("tls-new");
    s.backlog_drains("tls-resumed");
}
