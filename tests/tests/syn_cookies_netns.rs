//! SYN-cookie mode (issue 31) through the attached datapath, with real clients and a real
//! server: the NIC answers SYNs with cookies, judges each new connection's hello on its first
//! data segment, and hands only admitted connections to the kernel's listener.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use gateway_tests::{
    behind::{BehindGateway, GET},
    daemon::Daemon,
    have_root, have_xdp,
    netns::{GW_V4, GW_V6, TestNet, class_counter},
    tls::{Cert, RustlsServer, rustls_config, rustls_get, session_key},
};

/// The services a test's daemon protects: tcp/`port` as TLS, in SYN-cookie mode.
fn cookie_service(port: u16) -> String {
    format!("services:\n  - {{kind: tls, port: {port}, syn_cookies: true}}\n")
}

/// A rustls server on GW_V4:`port` behind `gateway run` with the port in SYN-cookie mode
/// (the daemon first among the fields: it stops before the namespaces go). Taken apart, bind
/// `net` first and `daemon` last, so that they drop the same way round.
struct CookieServer {
    daemon: Daemon,
    server: RustlsServer,
    cert: Cert,
    net: TestNet,
}

fn rustls_behind_cookies(port: u16) -> CookieServer {
    let net = TestNet::new();
    let cert = Cert::new();
    let listener = net.in_gw(|| std::net::TcpListener::bind((GW_V4, port)).expect("bind"));
    let server = RustlsServer::start(&cert, listener);
    let daemon = Daemon::start_config(&net, &cert.file(""), &cookie_service(port));
    CookieServer {
        daemon,
        server,
        cert,
        net,
    }
}

/// An s_server on 443 behind `gateway run` with 443 in SYN-cookie mode.
fn setup() -> BehindGateway {
    BehindGateway::new(&[], &cookie_service(443))
}

/// A TCP connection to `to` from local port `port` (SO_REUSEADDR, bound before connecting).
fn connect_from(port: u16, to: (&str, u16)) -> TcpStream {
    use std::os::fd::FromRawFd as _;
    let ip: std::net::Ipv4Addr = to.0.parse().unwrap();
    // SAFETY: plain socket calls on a descriptor made here and handed to TcpStream once connected.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        let one: libc::c_int = 1;
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_REUSEADDR,
            (&raw const one).cast(),
            size_of::<libc::c_int>() as u32,
        );
        let mut local: libc::sockaddr_in = std::mem::zeroed();
        local.sin_family = libc::AF_INET as u16;
        local.sin_port = port.to_be();
        assert_eq!(
            libc::bind(
                fd,
                (&raw const local).cast(),
                size_of::<libc::sockaddr_in>() as u32
            ),
            0,
            "bind to port {port}"
        );
        let mut remote: libc::sockaddr_in = std::mem::zeroed();
        remote.sin_family = libc::AF_INET as u16;
        remote.sin_port = to.1.to_be();
        remote.sin_addr.s_addr = u32::from(ip).to_be();
        assert_eq!(
            libc::connect(
                fd,
                (&raw const remote).cast(),
                size_of::<libc::sockaddr_in>() as u32
            ),
            0,
            "connect from port {port}: {}",
            std::io::Error::last_os_error()
        );
        let sock = TcpStream::from_raw_fd(fd);
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        sock
    }
}

/// Connections the calling thread's namespace made from a SYN or a cookie (`PassiveOpens` of
/// `/proc/thread-self/net/snmp`).
fn passive_opens() -> u64 {
    let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp").expect("/proc net/snmp");
    let mut tcp = snmp.lines().filter(|l| l.starts_with("Tcp:"));
    let (names, values) = (
        tcp.next().expect("Tcp names"),
        tcp.next().expect("Tcp values"),
    );
    let at = names
        .split_whitespace()
        .position(|n| n == "PassiveOpens")
        .expect("PassiveOpens");
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}

/// The TCP sockets of the calling thread's namespace on local port 443, listeners aside: each
/// as its peer's address and port and its state (`/proc/thread-self/net/tcp`, read in well
/// under a millisecond, so that a flood is sampled often).
fn sockets_on_443() -> Vec<String> {
    sockets_on(443)
}

/// Every TCP socket of this network namespace on local port `port` but listeners: the remote
/// end and the state (hex, as /proc shows it: `06` is TIME_WAIT).
fn sockets_on(port: u16) -> Vec<String> {
    let table = std::fs::read_to_string("/proc/thread-self/net/tcp").expect("/proc net/tcp");
    let local_port = format!(":{port:04X}");
    table
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let (local, remote, state) = (f.get(1)?, f.get(2)?, f.get(3)?);
            (local.ends_with(&local_port) && *state != "0A").then(|| format!("{remote} {state}"))
        })
        .collect()
}

#[test]
fn with_syn_cookies_openssl_clients_of_both_versions_connect_transfer_and_resume() {
    if !have_root("with_syn_cookies_openssl_clients") {
        return;
    }
    let s = setup();
    let sess = s.cert.file("sess.pem");
    let sess = sess.to_str().unwrap();
    for version in ["-tls1_2", "-tls1_3"] {
        let out = s.client(&[version, "-sess_out", sess, "-ign_eof"]);
        assert!(out.contains("New,"), "{version}: {out}");
        // s_server -www answered the GET: the page came through the handed-over connection.
        assert!(out.contains("HTTP/1.0 200 ok"), "{version}: {out}");
    }
    // Every SYN was answered from the NIC, every connection handed over from its hello.
    assert_eq!(s.tls("cookies_sent"), 2);
    assert_eq!(s.tls("cookie_hellos"), 2);
    assert_eq!(s.tls("handoffs"), 2);
    assert_eq!(s.tls("handoffs_failed"), 0);
    assert_eq!(s.counter("tls-new", "admitted"), 2);
    // A resumption, its key published: tls-resumed, judged on the cookie's first segment.
    let key = session_key(std::path::Path::new(sess));
    s.net
        .gateway_ok(&["tls", "issued", "add", &key, "--kind", "psk"]);
    let out = s.client(&["-tls1_3", "-sess_in", sess, "-ign_eof"]);
    assert!(out.contains("Reused,"), "{out}");
    assert!(out.contains("HTTP/1.0 200 ok"), "{out}");
    assert_eq!(s.counter("tls-resumed", "admitted"), 1);
    assert_eq!(s.tls("handoffs"), 3);
    // The services list says who answers SYNs.
    let list = s.net.gateway_ok(&["service", "list", "--json"]);
    assert!(list.contains("\"syn_cookies\":true"), "{list}");
}

#[test]
fn with_syn_cookies_and_tls_new_closed_refused_clients_leave_no_socket_and_resumed_ones_connect() {
    if !have_root("with_syn_cookies_and_tls_new_closed") {
        return;
    }
    let s = setup();
    let (sess, out) = s.published_session("-tls1_3", "psk");
    assert!(out.contains("New,"), "{out}");
    let sess = sess.to_str().unwrap();
    s.net
        .gateway_ok(&["policy", "set", "tls-new", "--backlog", "0", "--pin"]);
    let handed_before = s.tls("handoffs");
    // A flood of new connections, each sending a new hello, while the server's namespace is
    // sampled: none of them may ever hold a socket there.
    const FLOOD: usize = 300;
    let hello = gateway_common::testing::HelloBuilder::default().build();
    let done = AtomicBool::new(false);
    let opens_before = s.net.in_gw(passive_opens);
    // What the server held before (the first client's connection, in TIME_WAIT).
    let before: Vec<String> = s.net.in_gw(sockets_on_443);
    let (reset, new_sockets) = std::thread::scope(|scope| {
        let flood = scope.spawn(|| {
            let mut reset = 0;
            s.net.in_peer(|| {
                for _ in 0..FLOOD {
                    let mut c = TcpStream::connect((GW_V4, 443)).expect("connect (cookie)");
                    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                    c.write_all(&hello).expect("hello");
                    let mut b = [0u8; 1];
                    match c.read(&mut b) {
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => reset += 1,
                        other => panic!("a refused client got {other:?}"),
                    }
                }
            });
            done.store(true, Ordering::SeqCst);
            reset
        });
        let (samples, seen) = s.net.in_gw(|| {
            let mut seen: Vec<String> = Vec::new();
            let mut samples = 0;
            while !done.load(Ordering::SeqCst) {
                for sock in sockets_on_443() {
                    if !before.contains(&sock) && !seen.contains(&sock) {
                        seen.push(sock);
                    }
                }
                samples += 1;
            }
            (samples, seen)
        });
        eprintln!("{samples} samples of the server's sockets during the flood");
        (flood.join().unwrap(), seen)
    });
    assert_eq!(reset, FLOOD, "every refused client got its reset at once");
    assert!(
        new_sockets.is_empty(),
        "refused connections held sockets: {new_sockets:?}"
    );
    assert_eq!(
        s.tls("handoffs"),
        handed_before,
        "no refused connection handed over"
    );
    assert_eq!(s.counter("tls-new", "dropped_backlog"), FLOOD as u64);
    // The kernel made no connection for any of them: not one passive open in the flood.
    assert_eq!(s.net.in_gw(passive_opens), opens_before);
    // Resumed clients are served.
    for _ in 0..3 {
        let out = s.client(&["-tls1_3", "-sess_in", sess, "-ign_eof"]);
        assert!(out.contains("Reused,"), "{out}");
    }
    assert_eq!(s.counter("tls-resumed", "admitted"), 3);
    assert_eq!(s.tls("handoffs"), handed_before + 3);
    assert_eq!(s.net.in_gw(passive_opens), opens_before + 3);
}

#[test]
fn with_syn_cookies_a_post_quantum_rustls_resumption_spans_two_segments_and_is_verified() {
    if !have_root("with_syn_cookies_a_post_quantum_rustls_resumption")
        || !have_xdp("with_syn_cookies_a_post_quantum_rustls_resumption")
    {
        return;
    }
    let CookieServer {
        net,
        cert,
        server,
        daemon,
    } = rustls_behind_cookies(8443);
    let config = rustls_config(&cert);
    let addr = format!("{GW_V4}:8443");
    let tls = |field: &str| net.stats()["tls"][field].as_u64().unwrap();
    assert_eq!(
        net.in_peer(|| rustls_get(&config, &addr)).unwrap(),
        rustls::HandshakeKind::Full
    );
    for key in &server.issued_keys() {
        net.gateway_ok(&["tls", "issued", "add", key, "--kind", "psk"]);
    }
    let before = tls("multi_segment");
    assert_eq!(
        net.in_peer(|| rustls_get(&config, &addr)).unwrap(),
        rustls::HandshakeKind::Resumed
    );
    assert!(tls("multi_segment") > before, "two segments");
    assert_eq!(class_counter(&net.stats(), "tls-resumed", "admitted"), 1);
    assert_eq!(tls("handoffs"), 2);
    assert_eq!(tls("handoffs_failed"), 0);
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
}

/// Drops every hundredth packet the peer namespace sends and every hundredth it receives
/// (nftables' counter, so that the loss is the same on every run; this kernel has no netem).
fn lossy_peer(net: &TestNet) {
    let rules = "table inet loss {\n\
        chain out { type filter hook output priority 0; numgen inc mod 100 == 50 counter drop; }\n\
        chain in { type filter hook input priority 0; numgen inc mod 100 == 50 counter drop; }\n\
        }\n";
    let file = std::env::temp_dir().join(format!("gateway-loss-{}.nft", net.peer_ns));
    std::fs::write(&file, rules).expect("nft rules");
    let out = net.exec(&net.peer_ns, "nft", &["-f", file.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_file(file);
}

/// Packets the rules of [`lossy_peer`] dropped so far.
fn dropped(net: &TestNet) -> u64 {
    let out = net.exec(&net.peer_ns, "nft", &["list", "table", "inet", "loss"]);
    String::from_utf8_lossy(&out.stdout)
        .split("counter packets ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

#[test]
fn with_syn_cookies_every_kind_of_client_connects_over_a_link_that_loses_one_packet_in_a_hundred() {
    if !have_root("with_syn_cookies_every_kind_of_client_connects_over_a_lossy_link")
        || !have_xdp("with_syn_cookies_every_kind_of_client_connects_over_a_lossy_link")
    {
        return;
    }
    let s = setup();
    lossy_peer(&s.net);
    let cacert = s.cert.cert();
    let curl = |extra: &[&str]| {
        let mut args = vec![
            "-sS",
            "--max-time",
            "30",
            "--cacert",
            cacert.to_str().unwrap(),
            "--resolve",
        ];
        let resolve = format!("gateway-test:443:{GW_V4}");
        args.push(&resolve);
        args.extend_from_slice(extra);
        args.push("https://gateway-test:443/");
        let out = s.net.exec(&s.net.peer_ns, "curl", &args);
        let body = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            body.contains("s_server"),
            "curl {extra:?}: {body} {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let addr = format!("{GW_V4}:443");
    let mut connections = 0;
    for _ in 0..8 {
        curl(&["--tlsv1.3"]);
        curl(&["--tlsv1.2", "--tls-max", "1.2"]);
        for version in ["-tls1_2", "-tls1_3"] {
            let out = s.client(&[version, "-ign_eof"]);
            assert!(out.contains("HTTP/1.0 200 ok"), "{version}: {out}");
        }
        // rustls's hello: a post-quantum key share, two segments (a client of its own each
        // time: one that met the server before offers only the group it chose).
        let config = rustls_config(&s.cert);
        assert_eq!(
            s.net.in_peer(|| rustls_get(&config, &addr)).unwrap(),
            rustls::HandshakeKind::Full
        );
        connections += 5;
    }
    let lost = dropped(&s.net);
    eprintln!("{connections} connections, {lost} packets dropped on the link");
    assert!(lost >= 3, "the link lost packets ({lost})");
    assert!(s.tls("handoffs") >= connections);
    assert_eq!(s.tls("handoffs_failed"), 0);
    assert!(
        s.tls("multi_segment") >= 8,
        "rustls's hellos took two segments"
    );
}

/// With no daemon: `gateway attach` (`attach_args`: XDP, or the TC fallback) and tcp/443 in
/// SYN-cookie mode from the CLI. rustls clients over IPv4 and IPv6 are answered from the NIC and
/// handed over; with tls-new closed, new clients of both families get a reset from the NIC and
/// the kernel makes no connection for any of them, and resumed ones, their two-segment hellos
/// held, are carried to the listener.
fn cookies_attached_by_hand(attach_args: &[&str]) {
    let net = TestNet::new();
    let cert = Cert::new();
    let v4 = net.in_gw(|| std::net::TcpListener::bind((GW_V4, 443)).expect("bind"));
    let v6 = net.in_gw(|| std::net::TcpListener::bind(format!("[{GW_V6}]:443")).expect("bind"));
    let servers = [
        RustlsServer::start(&cert, v4),
        RustlsServer::start(&cert, v6),
    ];
    // One segment per packet from the peer, as a NIC's wire has them: without XDP on the veth
    // (the TC fallback), the peer's TCP would hand it a segmentation-offload packet holding a
    // whole two-segment hello, which TC sees as one.
    let one_per_packet = std::process::Command::new("ip")
        .args([
            "-n",
            &net.peer_ns,
            "link",
            "set",
            "dev",
            &net.peer_if,
            "gso_max_segs",
            "1",
        ])
        .output()
        .unwrap();
    assert!(one_per_packet.status.success(), "{one_per_packet:?}");
    let mut attach = vec!["attach", "--iface", &net.gw_if];
    attach.extend_from_slice(attach_args);
    net.gateway_ok(&attach);
    let added = net.gateway_ok(&["service", "add", "tls", "443", "--syn-cookies"]);
    assert!(added.contains("cookies"), "{added}");
    let tls = |field: &str| net.stats()["tls"][field].as_u64().unwrap();
    let addrs = [format!("{GW_V4}:443"), format!("[{GW_V6}]:443")];
    let configs: Vec<_> = addrs
        .iter()
        .map(|addr| {
            let config = rustls_config(&cert);
            assert_eq!(
                net.in_peer(|| rustls_get(&config, addr)).unwrap(),
                rustls::HandshakeKind::Full,
                "{addr}"
            );
            config
        })
        .collect();
    assert_eq!(tls("cookies_sent"), 2);
    assert_eq!(tls("handoffs"), 2);
    assert_eq!(tls("handoffs_failed"), 0);
    net.gateway_ok(&["policy", "set", "tls-new", "--backlog", "0"]);
    let opens = net.in_gw(passive_opens);
    let hello = gateway_common::testing::HelloBuilder::default().build();
    for addr in &addrs {
        for _ in 0..5 {
            let got = net.in_peer(|| {
                let mut c = TcpStream::connect(addr.as_str()).expect("connect (cookie)");
                c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
                c.write_all(&hello).expect("hello");
                let mut b = [0u8; 1];
                c.read(&mut b).map_err(|e| e.kind())
            });
            assert_eq!(got, Err(std::io::ErrorKind::ConnectionReset), "{addr}");
        }
    }
    // A client setting an IPv4 option: its SYN answered and its refusal reset all the same
    // (the options taken out of the frame by the hook's own means).
    let got = net.in_peer(|| {
        let mut c = connect_with_ip_options(&addrs[0]).expect("connect (the NIC's SYN-ACK)");
        c.write_all(&hello).expect("hello");
        let mut b = [0u8; 1];
        c.read(&mut b).map_err(|e| e.kind())
    });
    assert_eq!(got, Err(std::io::ErrorKind::ConnectionReset));
    assert_eq!(
        net.in_gw(passive_opens),
        opens,
        "no connection made for a refused client"
    );
    assert_eq!(tls("handoffs"), 2);
    // Resumed clients of both families, still with tls-new closed: their hellos take two
    // segments (rustls's post-quantum share), so each is held, and carried to the listener
    // inside the segment that admitted it (IPv6's lengths and checksum set as IPv4's).
    for server in &servers {
        for key in &server.issued_keys() {
            net.gateway_ok(&["tls", "issued", "add", key, "--kind", "psk"]);
        }
    }
    for (addr, config) in addrs.iter().zip(&configs) {
        assert_eq!(
            net.in_peer(|| rustls_get(config, addr)).unwrap(),
            rustls::HandshakeKind::Resumed,
            "{addr}"
        );
    }
    assert_eq!(tls("hellos_held"), 2, "{}", net.stats()["tls"]);
    assert_eq!(tls("held_carried"), 2);
    assert_eq!(tls("held_handoffs"), 0);
    assert_eq!(tls("handoffs"), 4);
    assert_eq!(tls("handoffs_failed"), 0);
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
}

#[test]
fn syn_cookies_at_the_xdp_hook_serve_both_address_families() {
    if !have_root("syn_cookies_at_the_xdp_hook") {
        return;
    }
    cookies_attached_by_hand(&[]);
}

#[test]
fn syn_cookies_through_the_tc_fallback_serve_both_address_families() {
    if !have_root("syn_cookies_through_the_tc_fallback") {
        return;
    }
    cookies_attached_by_hand(&["--mode", "tc"]);
}

#[test]
fn with_syn_cookies_a_client_reusing_its_port_while_the_server_holds_it_in_time_wait_connects() {
    if !have_root("with_syn_cookies_a_client_reusing_its_port") {
        return;
    }
    // The rustls server closes first: its end of each connection stays in TIME_WAIT, and the
    // client's next connection from the same port arrives on that 4-tuple.
    let CookieServer {
        net,
        cert,
        server: _server,
        daemon,
    } = rustls_behind_cookies(443);
    let config = rustls_config(&cert);
    // rustls from port 40404 each time: a GET, the answer read to its end (the server closes).
    let fetch = || {
        // The client's end of the connection before is gone first: the server closed first, so
        // the client's end waits in LAST_ACK for the server's last ACK, and until then its
        // 4-tuple is taken (connect fails with EADDRNOTAVAIL). On a busy machine, a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !net.in_peer(|| sockets_on(40404)).is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the client's connection before from port 40404 ended: {:?}",
                net.in_peer(|| sockets_on(40404))
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let answer = net.in_peer(|| {
            let sock = connect_from(40404, (GW_V4, 443));
            let name = rustls::pki_types::ServerName::try_from("gateway-test").unwrap();
            let conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
            let mut tls = rustls::StreamOwned::new(conn, sock);
            tls.write_all(GET).expect("request");
            let mut body = Vec::new();
            let _ = tls.read_to_end(&mut body);
            String::from_utf8_lossy(&body).to_string()
        });
        assert!(answer.ends_with("hello\n"), "{answer}");
    };
    fetch();
    // The client's FIN (sent as its socket closed) takes the server's end from FIN_WAIT2 to
    // TIME_WAIT when the server's side has processed it: on a busy machine, a moment later.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !net.in_gw(sockets_on_443).iter().any(|l| l.ends_with(" 06")) {
        assert!(
            std::time::Instant::now() < deadline,
            "the server holds the first connection in TIME_WAIT: {:?}",
            net.in_gw(sockets_on_443)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    for _ in 0..3 {
        fetch();
    }
    // The SYNs on the TIME_WAIT 4-tuple were the kernel's; every hello was judged all the same.
    let tls = |field: &str| net.stats()["tls"][field].as_u64().unwrap();
    assert_eq!(tls("cookies_sent"), 1);
    assert_eq!(tls("cookies_declined"), 3);
    assert_eq!(tls("handoffs"), 1);
    assert_eq!(tls("handoffs_failed"), 0);
    assert_eq!(class_counter(&net.stats(), "tls-new", "admitted"), 4);
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
}

#[test]
fn with_syn_cookies_and_tls_new_closed_two_segment_hellos_make_no_connection_and_resumed_ones_connect()
 {
    if !have_root("with_syn_cookies_and_tls_new_closed_two_segment_hellos")
        || !have_xdp("with_syn_cookies_and_tls_new_closed_two_segment_hellos")
    {
        return;
    }
    let CookieServer {
        net,
        cert,
        server,
        daemon,
    } = rustls_behind_cookies(8443);
    let addr = format!("{GW_V4}:8443");
    let tls = |field: &str| net.stats()["tls"][field].as_u64().unwrap();
    // A session for the resumed clients, its tickets published.
    let config = rustls_config(&cert);
    assert_eq!(
        net.in_peer(|| rustls_get(&config, &addr)).unwrap(),
        rustls::HandshakeKind::Full
    );
    for key in &server.issued_keys() {
        net.gateway_ok(&["tls", "issued", "add", key, "--kind", "psk"]);
    }
    net.gateway_ok(&["policy", "set", "tls-new", "--backlog", "0", "--pin"]);
    // rustls's own new hello: a post-quantum key share, two segments.
    let hello = gateway_tests::tls::capture_hello(|a| {
        let _ = rustls_get(&rustls_config(&cert), &a);
    });
    assert!(hello.len() > 1460, "two segments: {} bytes", hello.len());
    let opens = net.in_gw(passive_opens);
    const FLOOD: u64 = 50;
    net.in_peer(|| {
        for _ in 0..FLOOD {
            let mut c = TcpStream::connect(addr.as_str()).expect("connect (cookie)");
            c.set_nodelay(true).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
            c.write_all(&hello).expect("hello");
            let mut b = [0u8; 1];
            match c.read(&mut b) {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
                other => panic!("a refused client got {other:?}"),
            }
        }
    });
    assert_eq!(
        net.in_gw(passive_opens),
        opens,
        "the kernel made no connection for a refused two-segment hello"
    );
    assert_eq!(tls("hellos_held"), FLOOD);
    // Resumed clients are served: held too, admitted, and handed over at their second segment
    // with the first carried inside it (nothing for the client to send again). (Each resumption spends its ticket and gets new ones: published before the
    // next, as the TLS proxy does.)
    for _ in 0..3 {
        for key in &server.issued_keys() {
            net.gateway_ok(&["tls", "issued", "add", key, "--kind", "psk"]);
        }
        let started = std::time::Instant::now();
        let got = net.in_peer(|| rustls_get(&config, &addr));
        eprintln!("a resumed client, held: {:?}", started.elapsed());
        assert!(
            matches!(got, Ok(rustls::HandshakeKind::Resumed)),
            "{got:?} {}",
            net.stats()
        );
    }
    assert_eq!(tls("held_carried"), 3, "{}", net.stats()["tls"]);
    assert_eq!(tls("held_handoffs"), 0);
    assert_eq!(tls("handoffs_failed"), 0);
    assert_eq!(net.in_gw(passive_opens), opens + 3);
    assert_eq!(class_counter(&net.stats(), "tls-resumed", "admitted"), 3);
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
}

/// Drops, in the peer namespace, the first data segment of every connection to tcp/`port` once
/// (its third packet: SYN, ACK, data; conntrack's count, so that exactly that one is lost).
fn lose_first_data_segment(net: &TestNet, port: u16) {
    let rules = format!(
        "table inet loss {{\n\
         chain out {{ type filter hook output priority 0; tcp dport {port} ct original packets 3 counter drop; }}\n\
         }}\n"
    );
    let file = std::env::temp_dir().join(format!("gateway-first-loss-{}.nft", net.peer_ns));
    std::fs::write(&file, rules).expect("nft rules");
    let out = net.exec(&net.peer_ns, "nft", &["-f", file.to_str().unwrap()]);
    let _ = std::fs::remove_file(file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Issue 52, case 1: a resumed client whose two-segment hello is held (tls-new closed) and
/// whose first data segment is lost once. Its second segment arrives first (dropped: no
/// connection is known from it), and in loss recovery it sends only the first again until that
/// is acknowledged: the NIC's SACK of it makes the client send the second, which admits the
/// hello and carries the first.
#[test]
fn with_syn_cookies_and_tls_new_closed_a_resumed_client_whose_first_segment_is_lost_is_served() {
    if !have_root("with_syn_cookies_a_resumed_client_whose_first_segment_is_lost") {
        return;
    }
    let CookieServer {
        net,
        cert,
        server,
        daemon,
    } = rustls_behind_cookies(8443);
    let addr = format!("{GW_V4}:8443");
    let tls = |field: &str| net.stats()["tls"][field].as_u64().unwrap();
    let config = rustls_config(&cert);
    assert_eq!(
        net.in_peer(|| rustls_get(&config, &addr)).unwrap(),
        rustls::HandshakeKind::Full
    );
    net.gateway_ok(&["policy", "set", "tls-new", "--backlog", "0", "--pin"]);
    lose_first_data_segment(&net, 8443);
    const CLIENTS: u64 = 2;
    for client in 0..CLIENTS {
        for key in &server.issued_keys() {
            net.gateway_ok(&["tls", "issued", "add", key, "--kind", "psk"]);
        }
        let started = std::time::Instant::now();
        let got = net.in_peer(|| rustls_get(&config, &addr));
        eprintln!(
            "resumed client {client}, its first segment lost: served in {:?}",
            started.elapsed()
        );
        assert!(
            matches!(got, Ok(rustls::HandshakeKind::Resumed)),
            "{got:?} {}",
            net.stats()["tls"]
        );
    }
    assert_eq!(dropped(&net), CLIENTS, "each lost its first data segment");
    assert_eq!(tls("held_carried"), CLIENTS, "{}", net.stats()["tls"]);
    assert!(
        tls("held_sacked") >= CLIENTS,
        "the first segments told with a SACK"
    );
    assert_eq!(tls("handoffs_failed"), 0);
    assert_eq!(
        class_counter(&net.stats(), "tls-resumed", "admitted"),
        CLIENTS
    );
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
}

/// Frames `ifname` in `ns` has received (its line of `/proc/thread-self/net/dev`: /sys shows
/// the namespace it was mounted in).
fn rx_packets(ns: &str, ifname: &str) -> u64 {
    gateway_tests::netns::in_netns(ns, || {
        let dev = std::fs::read_to_string("/proc/thread-self/net/dev").expect("net/dev");
        let line = dev
            .lines()
            .find_map(|l| {
                l.trim()
                    .strip_prefix(&format!("{ifname}:"))
                    .map(str::to_owned)
            })
            .expect("the interface's line");
        line.split_whitespace()
            .nth(1)
            .expect("rx packets")
            .parse()
            .expect("a number")
    })
}

/// Issue 52, case 4: a veth carries a frame's metadata over to its peer. The server's end runs
/// the gateway with SYN cookies in native XDP (its replies handed to its finishing program to
/// send, as a veth's XDP_TX may not deliver), the client's end a gateway of its own with no
/// services. The client's finishing program must not take the server's tags for its own: one
/// connect used to keep about 750,000 frames a second going round both ends.
#[test]
fn gateways_at_both_ends_of_a_veth_hand_each_other_nothing() {
    if !have_root("gateways_at_both_ends_of_a_veth_hand_each_other_nothing") {
        return;
    }
    let net = TestNet::without_peer_program();
    let listener = net.in_gw(|| std::net::TcpListener::bind((GW_V4, 443)).expect("bind"));
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "tls", "443", "--syn-cookies"]);
    let peer_fs = gateway_tests::netns::Bpffs::new();
    let peer_gateway = |args: &[&str]| {
        let out = std::process::Command::new("ip")
            .args(["netns", "exec", &net.peer_ns])
            .arg(gateway_tests::gateway_bin())
            .arg("--bpffs")
            .arg(peer_fs.root())
            .args(args)
            .output()
            .expect("run gateway");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    peer_gateway(&["attach", "--iface", &net.peer_if]);
    let before = rx_packets(&net.gw_ns, &net.gw_if);
    let connected = net.in_peer(|| {
        std::net::TcpStream::connect_timeout(
            &format!("{GW_V4}:443").parse().unwrap(),
            Duration::from_secs(5),
        )
    });
    assert!(connected.is_ok(), "{connected:?}");
    // The SYN-ACK from the server's NIC arrived; a loop would now run at full speed. Frames
    // the server's end receives over the next second: the connect's own few.
    let window = Duration::from_secs(1);
    let start = rx_packets(&net.gw_ns, &net.gw_if);
    std::thread::sleep(window);
    let during = rx_packets(&net.gw_ns, &net.gw_if) - start;
    eprintln!(
        "frames at the server's end: {} for the connect, {during} in the next {window:?}",
        start - before
    );
    assert!(during < 100, "{during} frames went round in {window:?}");
    assert_eq!(net.stats()["tls"]["cookies_sent"].as_u64(), Some(1));
    drop(connected);
    drop(listener);
    peer_gateway(&["detach", "--iface", &net.peer_if]);
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
}

/// A TCP connection to `to` whose every packet carries a 4-byte IPv4 option (NOP, NOP, NOP,
/// end: `IP_OPTIONS`, which needs no privilege).
fn connect_with_ip_options(to: &str) -> std::io::Result<TcpStream> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _};
    let addr: std::net::SocketAddr = to.parse().unwrap();
    // SAFETY: plain socket calls on a descriptor owned by the socket made here.
    let sock = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        std::net::TcpStream::from_raw_fd(fd)
    };
    let options = [1u8, 1, 1, 0];
    // SAFETY: as above.
    let set = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_OPTIONS,
            options.as_ptr().cast(),
            options.len() as u32,
        )
    };
    assert_eq!(set, 0, "IP_OPTIONS: {}", std::io::Error::last_os_error());
    let std::net::SocketAddr::V4(v4) = addr else {
        panic!("IPv4 only")
    };
    let mut remote: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    remote.sin_family = libc::AF_INET as u16;
    remote.sin_port = v4.port().to_be();
    remote.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
    // SAFETY: as above; a blocking connect, bounded by the kernel's SYN retries.
    let rc = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&raw const remote).cast(),
            size_of::<libc::sockaddr_in>() as u32,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    sock.set_read_timeout(Some(Duration::from_secs(5)))?;
    Ok(sock)
}

/// Issue 52, case 3: clients setting an IPv4 option used to walk around the NIC's SYN cookies
/// (the NIC could not answer their SYNs, so the kernel did: 10 of 10 made a server socket with
/// tls-new closed, and their refused hellos got no reset). Their SYNs are now answered from the
/// NIC like any others, options taken out of the answer, and their refusals reset.
#[test]
fn with_syn_cookies_clients_setting_ip_options_are_judged_like_any_other() {
    if !have_root("with_syn_cookies_clients_setting_ip_options") {
        return;
    }
    let CookieServer {
        net,
        cert: _cert,
        server: _server,
        daemon,
    } = rustls_behind_cookies(8443);
    let addr = format!("{GW_V4}:8443");
    let dp = |field: &str| net.stats()["datapath"][field].as_u64().unwrap();
    let hello = gateway_common::testing::HelloBuilder::default().build();
    net.gateway_ok(&["policy", "set", "tls-new", "--backlog", "0", "--pin"]);
    let opens = net.in_gw(passive_opens);
    const CLIENTS: usize = 10;
    for client in 0..CLIENTS {
        let got = net.in_peer(|| {
            let mut c = connect_with_ip_options(&addr).expect("connect (the NIC's SYN-ACK)");
            c.write_all(&hello).expect("hello");
            let mut b = [0u8; 1];
            c.read(&mut b).map_err(|e| e.kind())
        });
        assert_eq!(
            got,
            Err(std::io::ErrorKind::ConnectionReset),
            "client {client}"
        );
    }
    assert_eq!(
        net.in_gw(passive_opens),
        opens,
        "no server socket for a client with IP options"
    );
    assert_eq!(
        net.stats()["tls"]["cookies_sent"].as_u64(),
        Some(CLIENTS as u64)
    );
    assert!(
        dp("ip_options_removed") >= 2 * CLIENTS as u64,
        "SYN-ACKs and resets"
    );
    // With tls-new open, such a client is served: its first segment handed to the listener,
    // which answers its hello.
    net.gateway_ok(&["policy", "set", "tls-new", "--backlog", "100", "--pin"]);
    let answered = net.in_peer(|| {
        let mut c = connect_with_ip_options(&addr).expect("connect");
        c.write_all(&hello).expect("hello");
        let mut b = [0u8; 5];
        c.read(&mut b)
    });
    assert!(matches!(answered, Ok(n) if n > 0), "{answered:?}");
    assert_eq!(net.in_gw(passive_opens), opens + 1);
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
}
