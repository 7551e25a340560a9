//! TLS servers the gateway does not terminate (issue 51): real nginx and HAProxy in the
//! gateway's namespace behind `gateway run`, a tls service with a `server:` section, and real
//! clients (openssl s_client, curl) from the peer namespace. Their TLS 1.2 sessions are learnt
//! at the NIC from the servers' own packets.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use gateway_common::testing::HelloBuilder;
use gateway_tests::{
    backend::{Haproxy, Nginx},
    daemon::Daemon,
    have_root,
    netns::{GW_V4, TestNet, class_counter},
    tls::{Cert, capture_hello, s_client_input, session_key, wait_listening},
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

/// The key file of a server started with ticket keys (`Behind::with_keys`).
fn key_file(cert: &Cert) -> std::path::PathBuf {
    cert.file("ticket.key")
}

fn start_server(kind: Kind, net: &TestNet, cert: &Cert, keys: bool) -> Server {
    let prefix = ["ip", "netns", "exec", net.gw_ns.as_str()];
    let server = match kind {
        Kind::Nginx => Server::Nginx(Nginx::start(
            &prefix,
            &format!(
                "server {{ listen 443 ssl; ssl_certificate {}; ssl_certificate_key {};\n\
                 ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:gw:1m;\n\
                 ssl_session_timeout 5m; {}\n\
                 location / {{ return 200 \"served\\n\"; }} }}",
                cert.cert().display(),
                cert.key().display(),
                if keys {
                    format!("ssl_session_ticket_key {};", key_file(cert).display())
                } else {
                    String::new()
                }
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
                    "frontend fe\n  bind :443 ssl crt {} ssl-min-ver TLSv1.2{}\n  \
                     http-request return status 200 content-type text/plain string \"served\\n\"\n",
                    pem.display(),
                    if keys {
                        format!(" tls-ticket-keys {}", key_file(cert).display())
                    } else {
                        String::new()
                    }
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
    keys: bool,
    daemon: Daemon,
}

impl Behind {
    fn new(kind: Kind) -> Self {
        let net = TestNet::new();
        let cert = Cert::new();
        let server = start_server(kind, &net, &cert, false);
        let daemon = Daemon::start_config(&net, &cert.file(""), SERVICES);
        Behind {
            net,
            cert,
            kind,
            server: Some(server),
            keys: false,
            daemon,
        }
    }

    /// The server with its ticket keys in a file (`ticket.key`, in its format) holding `keys`,
    /// and the gateway reading the same file.
    fn with_keys(kind: Kind, keys: &[Vec<u8>]) -> Self {
        let net = TestNet::new();
        let cert = Cert::new();
        write_keys(kind, &cert, keys);
        let server = start_server(kind, &net, &cert, true);
        let format = match kind {
            Kind::Nginx => "nginx",
            Kind::Haproxy => "haproxy",
        };
        let services = format!(
            "services:\n  - {{kind: tls, port: 443, server: {{ticket_keys: {{format: {format}, \
             files: [{}]}}}}}}\n",
            key_file(&cert).display()
        );
        let daemon = Daemon::start_config(&net, &cert.file(""), &services);
        Behind {
            net,
            cert,
            kind,
            server: Some(server),
            keys: true,
            daemon,
        }
    }

    /// The server stopped and started again: its session cache and ticket keys are new.
    fn restart_server(&mut self) {
        self.server = None;
        self.server = Some(start_server(self.kind, &self.net, &self.cert, self.keys));
    }

    /// A TLS 1.3 hello offering `identity` as its PSK, sent raw from the peer namespace; the
    /// connection is then closed.
    fn offer_psk(&self, identity: &[u8]) {
        // An X25519 share, as openssl's: the hello fits one segment.
        let hello = HelloBuilder {
            psk_identity: Some(identity.to_vec()),
            key_share_len: 36,
            ..HelloBuilder::tls13()
        }
        .build();
        self.net.in_peer(|| {
            let mut c = TcpStream::connect((GW_V4, 443)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
            c.write_all(&hello).unwrap();
            // The server's answer (an alert: no binder checks out), or the NIC's reset.
            let mut got = [0u8; 512];
            let _ = c.read(&mut got);
        });
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
    // Each full handshake was two units of the server's work: its first flight, then the
    // client's key exchange up to the server's ChangeCipherSpec.
    assert_eq!(s.counter("tls-new", "admitted"), 2, "{kind:?}");
    assert_eq!(s.counter("tls-new", "continued"), 2, "{kind:?}");
    assert_eq!(s.counter("tls-new", "completed"), 4, "{kind:?}");
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
    curl_twice(&s, &["--tlsv1.2", "--tls-max", "1.2"]);
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

/// Writes `keys` to the server's key file in `kind`'s format: nginx reads one raw key, HAProxy
/// a base64 key per line.
fn write_keys(kind: Kind, cert: &Cert, keys: &[Vec<u8>]) {
    let path = key_file(cert);
    let tmp = cert.file("ticket.key.new");
    match kind {
        Kind::Nginx => std::fs::write(&tmp, &keys[0]).unwrap(),
        Kind::Haproxy => {
            use base64::Engine as _;
            let text: String = keys
                .iter()
                .map(|k| base64::engine::general_purpose::STANDARD.encode(k) + "\n")
                .collect();
            std::fs::write(&tmp, text).unwrap();
        }
    }
    // Swapped in whole, as a rotation script does.
    std::fs::rename(&tmp, &path).unwrap();
}

/// A 48-byte ticket key whose every byte is derived from `seed` (its name starts with it).
fn key48(seed: u8) -> Vec<u8> {
    (0..48u8)
        .map(|i| seed.wrapping_mul(151).wrapping_add(i.wrapping_mul(29)))
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// curl fetching the server's page twice in one run, each on a connection of its own: a full
/// handshake, then (the same session cached) a resumption of it. Both must be served.
fn curl_twice(s: &Behind, tls: &[&str]) {
    let url = format!("https://{GW_V4}/");
    let mut args = vec!["-sSk", "-H", "Connection: close"];
    args.extend_from_slice(tls);
    args.extend([url.as_str(), url.as_str()]);
    let out = s.net.exec(&s.net.peer_ns, "curl", &args);
    let body = String::from_utf8_lossy(&out.stdout);
    assert_eq!(body, "served\nserved\n", "{:?}: {out:?}", s.kind);
}

/// TLS 1.3 resumptions to a server whose ticket key file the gateway reads are checked at the
/// NIC by the ticket's MAC: served as tls-resumed with tls-new closed; forgeries (a wrong MAC,
/// a ticket cut or lengthened by a byte, another server's key name) stay tls-new.
fn tls13_tickets_are_checked_by_the_server_key(kind: Kind) {
    let keys = [key48(1), key48(2), key48(3)];
    let s = Behind::with_keys(kind, &keys);
    let sess = s.cert.file("s13.pem").display().to_string();
    let out = s.client(&["-tls1_3", "-sess_out", &sess, "-ign_eof"]);
    assert!(out.contains("New,"), "{kind:?}: {out}");
    let ticket = unhex(&session_key(std::path::Path::new(&sess)));
    assert!(
        keys.iter().any(|k| ticket[..16] == k[..16]),
        "{kind:?}: the ticket is sealed with a key of the file"
    );
    s.net
        .gateway_ok(&["policy", "set", "tls-new", "--backlog", "0", "--pin"]);
    // Forgeries of it, offered raw before the real one was ever checked (its key unpublished):
    // a wrong MAC under the right name, the ticket cut or lengthened by a byte.
    let mut wrong_mac = ticket.clone();
    *wrong_mac.last_mut().unwrap() ^= 1;
    let cut = ticket[..ticket.len() - 1].to_vec();
    let mut longer = ticket.clone();
    longer.push(0);
    for forged in [&wrong_mac, &cut, &longer] {
        s.offer_psk(forged);
    }
    assert_eq!(s.tls("macs_refused"), 3, "{kind:?}");
    // Another server's key name: no MAC computed.
    let mut other = ticket.clone();
    other[..16].copy_from_slice(&key48(9)[..16]);
    s.offer_psk(&other);
    assert_eq!(
        s.tls("macs_refused"),
        3,
        "{kind:?}: an unknown name pays for no MAC"
    );
    assert_eq!(s.tls("macs_verified"), 0, "{kind:?}");
    assert_eq!(
        s.counter("tls-new", "rejected"),
        4,
        "{kind:?}: the forgeries are refused"
    );
    assert_eq!(s.counter("tls-resumed", "packets"), 0, "{kind:?}");
    // The real ticket: its MAC checks out, served as tls-resumed with tls-new closed.
    let out = s.client(&["-tls1_3", "-sess_in", &sess, "-ign_eof"]);
    assert!(out.contains("Reused,"), "{kind:?}: {out}");
    assert!(out.contains("served"), "{kind:?}: {out}");
    assert_eq!(s.tls("macs_verified"), 1, "{kind:?}");
    assert_eq!(s.counter("tls-resumed", "packets"), 1, "{kind:?}");
    // Published now, its key buys what any published key does, replays included: the same
    // places and rate (`resume_limit`, 6 by default), whatever its last bytes say.
    let resumed_before = s.counter("tls-resumed", "packets");
    for _ in 0..8 {
        s.offer_psk(&wrong_mac);
    }
    let bounded = s.counter("tls-resumed", "packets") - resumed_before;
    assert!(bounded <= 6, "{kind:?}: {bounded} replays in tls-resumed");
    assert!(
        s.tls("replays_bounded") + s.tls("resumptions_too_fast") >= 2,
        "{kind:?}"
    );
    // curl: a full TLS 1.3 handshake, then a resumption of it on a second connection, its
    // ticket's MAC checked by the key file.
    s.net.gateway_ok(&["policy", "clear", "tls-new"]);
    let (resumed, verified) = (s.counter("tls-resumed", "packets"), s.tls("macs_verified"));
    curl_twice(&s, &["--tlsv1.3"]);
    assert_eq!(
        s.counter("tls-resumed", "packets"),
        resumed + 1,
        "{kind:?}: curl's second connection resumed its first"
    );
    assert_eq!(s.tls("macs_verified"), verified + 1, "{kind:?}");
}

#[test]
fn nginx_tls13_tickets_are_checked_by_its_ticket_key_file() {
    if !have_root("nginx_tls13_tickets_are_checked") {
        return;
    }
    tls13_tickets_are_checked_by_the_server_key(Kind::Nginx);
}

#[test]
fn haproxy_tls13_tickets_are_checked_by_its_ticket_key_file() {
    if !have_root("haproxy_tls13_tickets_are_checked") {
        return;
    }
    tls13_tickets_are_checked_by_the_server_key(Kind::Haproxy);
}

/// A rotated key file: the new key verifies within a second of the change; tickets of the key
/// removed from the file are tls-new again (the keys their MAC earned are withdrawn with it).
#[test]
fn a_rotated_key_file_takes_effect_within_a_second() {
    if !have_root("a_rotated_key_file_takes_effect") {
        return;
    }
    let mut s = Behind::with_keys(Kind::Nginx, &[key48(1)]);
    let old = s.cert.file("old.pem").display().to_string();
    assert!(
        s.client(&["-tls1_3", "-sess_out", &old, "-ign_eof"])
            .contains("New,")
    );
    // The old ticket verified once, its key published.
    assert!(
        s.client(&["-tls1_3", "-sess_in", &old, "-ign_eof"])
            .contains("Reused,")
    );
    assert_eq!(s.tls("macs_verified"), 1);
    // The file rotated (the old key removed), and the server restarted on it.
    write_keys(Kind::Nginx, &s.cert, &[key48(2)]);
    s.daemon
        .wait_for("ticket keys changed", Duration::from_secs(1));
    s.restart_server();
    let new = s.cert.file("new.pem").display().to_string();
    assert!(
        s.client(&["-tls1_3", "-sess_out", &new, "-ign_eof"])
            .contains("New,")
    );
    let ticket = unhex(&session_key(std::path::Path::new(&new)));
    assert_eq!(ticket[..16], key48(2)[..16], "sealed with the new key");
    s.net
        .gateway_ok(&["policy", "set", "tls-new", "--backlog", "0", "--pin"]);
    assert!(
        s.client(&["-tls1_3", "-sess_in", &new, "-ign_eof"])
            .contains("Reused,")
    );
    assert_eq!(s.tls("macs_verified"), 2);
    // The old ticket: its key removed from the file, refused at the NIC.
    let out = s.client(&["-tls1_3", "-sess_in", &old, "-ign_eof"]);
    assert!(out.contains("handshake has read 0 bytes"), "{out}");
    assert_eq!(s.counter("tls-new", "rejected"), 1);
}

/// The tls law of a server the gateway does not terminate budgets the server's CPU, read from
/// the cgroup its config names: nginx in a cgroup of the test's, full handshakes against it,
/// and the controller's reading of that cgroup (`gateway_controller_server_cpu_busy_ratio`)
/// shows the server working.
#[test]
fn the_tls_law_reads_the_servers_cpu_from_its_cgroup() {
    if !have_root("the_tls_law_reads_the_servers_cpu") {
        return;
    }
    use gateway_tests::{
        metrics::{scrape, value},
        tls::{rustls_config, rustls_fetch},
    };
    let Some(cg) = gateway_tests::cgroup::ServerCgroup::new("gwt-server") else {
        eprintln!("skipped: the kernel has no cgroup v2");
        return;
    };
    const METRICS: u16 = 9487;
    let net = TestNet::new();
    let cert = Cert::new();
    let nginx = Nginx::start(
        &["ip", "netns", "exec", &net.gw_ns],
        &format!(
            "server {{ listen 443 ssl; ssl_certificate {}; ssl_certificate_key {};\n\
             location / {{ return 200 \"served\\n\"; }} }}",
            cert.cert().display(),
            cert.key().display()
        ),
        1,
    );
    wait_listening(|| net.in_gw(|| TcpStream::connect(("127.0.0.1", 443)).is_ok()));
    // nginx and its workers moved into the cgroup (from here: `ip netns exec` mounts a /sys of
    // its own, without the cgroup hierarchy).
    let workers = nginx_workers(&nginx);
    cg.take(nginx.pid());
    let moved = std::fs::read_to_string(cg.dir().join("cgroup.procs")).unwrap();
    assert!(
        workers
            .iter()
            .all(|w| moved.lines().any(|l| l == w.to_string())),
        "the workers {workers:?} in the cgroup: {moved}"
    );
    let daemon = Daemon::start_config(
        &net,
        &cert.file(""),
        &format!(
            "workers: 1\nmetrics: 127.0.0.1:{METRICS}\nservices:\n  - {{kind: tls, port: 443, \
             server: {{cgroup: {}}}}}\ncontroller:\n  classes:\n    \
             tls-new: {{mode: tls, cpu_target: 0.5, min: 1, max: 100000}}\n",
            cg.dir().display()
        ),
    );
    let busy = || {
        value(
            &scrape(&net, METRICS),
            "gateway_controller_server_cpu_busy_ratio",
            &[],
        )
    };
    // Full handshakes (a new client configuration each) until the controller has seen the
    // server's CPU move; bounded.
    let started = Instant::now();
    let mut seen = 0.0;
    for n in 0u32.. {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the server's CPU not seen after {n} handshakes: {:?} {:?}\n{}",
            std::fs::read_to_string(cg.dir().join("cpu.stat")),
            std::fs::read_to_string(cg.dir().join("cgroup.procs")),
            scrape(&net, METRICS)
                .lines()
                .filter(|l| l.contains("controller"))
                .collect::<Vec<_>>()
                .join("\n")
        );
        let (_, body) = net
            .in_peer(|| rustls_fetch(&rustls_config(&cert), &format!("{GW_V4}:443")))
            .expect("a full handshake and an answer from nginx");
        assert!(body.ends_with("served\n"), "{body:?}");
        if n % 10 == 9 {
            seen = busy();
            if seen > 0.0 {
                break;
            }
        }
    }
    println!("the server's cgroup: {seen:.4} of the budgeted core busy");
    assert!(seen <= 1.0, "a share of one core: {seen}");
    drop(daemon);
    drop(nginx);
}

/// nginx's worker processes (under the process the test started), once there is one (bounded).
fn nginx_workers(nginx: &Nginx) -> Vec<i32> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let workers: Vec<i32> = gateway_tests::cgroup::descendants(nginx.pid())
            .into_iter()
            .filter(|p| {
                std::fs::read(format!("/proc/{p}/cmdline"))
                    .is_ok_and(|c| String::from_utf8_lossy(&c).contains("worker process"))
            })
            .collect();
        if !workers.is_empty() {
            return workers;
        }
        assert!(Instant::now() < deadline, "nginx started no worker");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TLS 1.2 full handshake is two pieces of the server's work, each in tls-new's backlog
/// exactly while the server does it: the hello until its first flight, then the client's key
/// exchange until its answer. A client that goes silent after the first flight holds nothing;
/// one whose key exchange the server has not read yet (its worker stopped) holds one unit,
/// which ends when the server answers it; none expires.
#[test]
fn a_tls12_key_exchange_is_in_the_backlog_while_the_server_works_on_it() {
    if !have_root("a_tls12_key_exchange_is_in_the_backlog") {
        return;
    }
    let s = Behind::new(Kind::Nginx);
    let hello = capture_hello(|addr| {
        let _ = std::process::Command::new("openssl")
            .args(["s_client", "-connect", &addr, "-tls1_2", "-no_ticket"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    });
    let mut c = s.net.in_peer(|| TcpStream::connect((GW_V4, 443)).unwrap());
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(&hello).unwrap();
    let mut got = vec![0u8; 8192];
    let n = c.read(&mut got).unwrap();
    assert!(n > 5 && got[5] == 2, "the server's first flight");
    // Answered: nothing held, however long the client waits.
    s.backlog_drains("tls-new");
    assert_eq!(s.counter("tls-new", "continued"), 0);
    // The server's worker stopped; the client's key exchange (a handshake record) arrives.
    let Some(Server::Nginx(nginx)) = &s.server else {
        unreachable!()
    };
    let workers = nginx_workers(nginx);
    for w in &workers {
        // SAFETY: signalling the test's own nginx workers.
        unsafe { libc::kill(*w, libc::SIGSTOP) };
    }
    c.write_all(&[22, 3, 3, 0, 6, 16, 0, 0, 2, 1, 0]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while s.counter("tls-new", "continued") == 0 {
        assert!(Instant::now() < deadline, "the key exchange is not held");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(
        s.counter("tls-new", "backlog"),
        1,
        "held while the server works on it"
    );
    for w in &workers {
        // SAFETY: as above.
        unsafe { libc::kill(*w, libc::SIGCONT) };
    }
    // The server answers it (an alert: it is no real key exchange) and the unit ends.
    s.backlog_drains("tls-new");
    assert_eq!(s.counter("tls-new", "expired"), 0);
    assert_eq!(s.counter("tls-new", "completed"), 2);
}

/// The issued-keys table bounds what is learnt: with room for 3 keys, 5 full handshakes
/// (session ids) publish 3 and count 2 unlearnt; the unlearnt sessions' resumptions are
/// tls-new (their key unverified), the learnt ones' tls-resumed; nothing is evicted for them.
#[test]
fn learnt_sessions_never_push_out_published_ones_when_the_table_is_full() {
    if !have_root("learnt_sessions_never_push_out") {
        return;
    }
    let net = TestNet::new();
    let cert = Cert::new();
    let server = start_server(Kind::Nginx, &net, &cert, false);
    let daemon = Daemon::start_config(
        &net,
        &cert.file(""),
        &format!("datapath: {{issued_keys: 3}}\n{SERVICES}"),
    );
    let s = Behind {
        net,
        cert,
        kind: Kind::Nginx,
        server: Some(server),
        keys: false,
        daemon,
    };
    let sessions: Vec<String> = (0..5)
        .map(|i| s.full(&format!("sid{i}.pem"), &["-no_ticket"]))
        .collect();
    assert_eq!(s.tls("keys_learnt"), 3);
    assert_eq!(s.tls("keys_unlearnt"), 2);
    for (i, sess) in sessions.iter().enumerate() {
        let out = s.resume(sess);
        assert!(out.contains("Reused,"), "{out}");
        let resumed = s.counter("tls-resumed", "packets");
        assert_eq!(
            resumed,
            (i as u64 + 1).min(3),
            "session {i}: the first three learnt"
        );
    }
    assert_eq!(s.tls("unverified_offers"), 2);
}
