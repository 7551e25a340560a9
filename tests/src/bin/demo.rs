//! `cargo xtask demo`: the gateway's main job on namespaces of its own. `gateway run` with the
//! embedded default config protects a veth; an `openssl s_server` sits behind it; from a peer
//! namespace `openssl s_client` makes real TLS handshakes and a SIP client sends requests and
//! responses; the default config's TLS proxy terminates two openssl visits (the second resumed)
//! and proxies them to an origin; the per-class counters are shown before and after. Then the
//! main job under load: a SIP server offered three times its capacity, alone and behind the
//! gateway, side by side.

use std::{
    net::{TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use gateway_tests::{
    backend::{Backend, Mode},
    daemon::Daemon,
    have_root,
    netns::{GW_V4, TestNet},
    sipserver::SlowSipServer,
    tls::{Cert, s_client_input, s_server},
};

fn main() {
    if !have_root("demo") {
        std::process::exit(1);
    }
    let net = TestNet::new();
    println!(
        "== namespaces {} (gateway, {}) <-> {} (clients, {})",
        net.gw_ns, net.gw_if, net.peer_ns, net.peer_if
    );

    // A SIP server behind the gateway (1 ms of work per INVITE): its answers, leaving, complete
    // the transactions and give their service times.
    let sip_socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    let _sip_server = SlowSipServer::start(
        sip_socket,
        1 << 20,
        Duration::from_millis(1),
        Duration::from_micros(100),
    );
    // The origin behind the default config's TLS proxy (127.0.0.1:8443 -> 127.0.0.1:8080).
    let origin = net.in_gw(|| std::net::TcpListener::bind("127.0.0.1:8080").unwrap());
    let _origin = Backend::start(origin, "hello from the origin", Mode::Answer, false);
    let cert = Cert::new();
    let _server = s_server(&["ip", "netns", "exec", &net.gw_ns], &cert, 443, &[]);
    // Wait (bounded) until the server listens.
    let deadline = Instant::now() + Duration::from_secs(10);
    while net.in_gw(|| TcpStream::connect(("127.0.0.1", 443)).is_err()) {
        assert!(Instant::now() < deadline, "openssl s_server did not start");
        std::thread::yield_now();
    }

    println!(
        "== gateway run --iface {} (embedded default config)",
        net.gw_if
    );
    let daemon = Daemon::start(&net, &["--iface", &net.gw_if], Duration::from_secs(30));
    for line in &daemon.log {
        println!("   {line}");
    }
    println!(
        "\n== gateway service list\n{}",
        net.gateway_ok(&["service", "list"])
    );
    println!(
        "== gateway stats (before traffic)\n{}",
        net.gateway_ok(&["stats"])
    );

    println!("== 3 TLS handshakes: openssl s_client -> {GW_V4}:443");
    for _ in 0..3 {
        let out = net.exec(
            &net.peer_ns,
            "sh",
            &[
                "-c",
                &format!("openssl s_client -connect {GW_V4}:443 -brief </dev/null 2>&1"),
            ],
        );
        let text = String::from_utf8_lossy(&out.stdout);
        let proto = text
            .lines()
            .find(|l| l.contains("Protocol version"))
            .unwrap_or("no handshake");
        println!("   {}", proto.trim());
    }
    println!(
        "== SIP over UDP -> {GW_V4}:5060: 10 INVITEs (new transactions), 2 retransmissions of the \
         first, 3 responses, 2 BYEs"
    );
    net.in_peer(|| {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        let invite = |n: u32| {
            format!(
                "INVITE sip:bob@demo SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2;branch=z9hG4bKdemo{n}\r\n\
                 CSeq: 1 INVITE\r\nCall-ID: {n}@demo\r\n\r\n"
            )
        };
        let send = |msg: &str| drop(s.send_to(msg.as_bytes(), (GW_V4, 5060)));
        (0..10).for_each(|n| send(&invite(n)));
        (0..2).for_each(|_| send(&invite(0)));
        (0..3).for_each(|_| send("SIP/2.0 200 OK\r\nCSeq: 1 INVITE\r\n\r\n"));
        (0..2).for_each(|_| send("BYE sip:bob@demo SIP/2.0\r\nCSeq: 2 BYE\r\n\r\n"));
    });

    // Let the SIP server answer what it has queued (bounded) before showing the counters.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline
        && gateway_tests::netns::class_counter(&net.stats(), "sip-original", "backlog") > 0
    {
        std::thread::yield_now();
    }
    println!(
        "== the default config's TLS proxy, from inside the gateway namespace: \
         openssl s_client -> 127.0.0.1:8443 (self-signed certificate made at start) -> 127.0.0.1:8080"
    );
    let sess = cert.file("demo-sess.pem");
    for (what, flag) in [("first visit", "-sess_out"), ("return visit", "-sess_in")] {
        let out = s_client_input(
            &["ip", "netns", "exec", &net.gw_ns],
            "127.0.0.1:8443",
            &[flag, sess.to_str().unwrap(), "-ign_eof"],
            b"GET / HTTP/1.0\r\n\r\n",
        );
        let session = out
            .lines()
            .find(|l| l.starts_with("New,") || l.starts_with("Reused,"))
            .unwrap_or("no handshake");
        let body = out.lines().find(|l| l.contains("hello from")).unwrap_or("");
        println!("   {what}: {session} | origin answered: {body}");
    }
    let metrics = gateway_tests::metrics::scrape(&net, 9477);
    println!("== its figures at http://127.0.0.1:9477/metrics:");
    for line in metrics.lines().filter(|l| {
        l.starts_with("gateway_proxy_handshake") || l.starts_with("gateway_proxy_connections")
    }) {
        println!("   {line}");
    }
    println!(
        "\n== gateway stats (after traffic)\n{}",
        net.gateway_ok(&["stats"])
    );
    let pin = net.pin_dir().join("CLASS_STATS");
    println!(
        "== the same counters through bpftool (class 4, sip-original, per CPU):\n   bpftool map lookup pinned {} key 4 0 0 0",
        pin.display()
    );
    let out = gateway_tests::netns::sh(
        "bpftool",
        &[
            "map",
            "lookup",
            "pinned",
            pin.to_str().unwrap(),
            "key",
            "4",
            "0",
            "0",
            "0",
        ],
    );
    println!("{}", String::from_utf8_lossy(&out.stdout));
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    for line in log
        .iter()
        .filter(|l| l.contains("SIGTERM") || l.contains("detached"))
    {
        println!("   {line}");
    }
    println!("== gateway exited ({status}); namespaces removed");
    drop(net);
    overload();
}

/// The main job, shown: a SIP server of known capacity (one FIFO thread, 5 ms an INVITE: 185
/// calls/s) offered three times that by SIPp, once alone and once behind `gateway run` with no
/// limit and no controller written (the controller moves sip-original by default and finds the
/// limits) and refusals answered with a 503 from the NIC.
/// One screen: what the callers got, what the NIC refused, what the controller chose, and a
/// chart of calls answered per second.
fn overload() {
    const SECONDS: u64 = 10;
    let (invite, other) = (Duration::from_millis(5), Duration::from_micros(200));
    let capacity = 1.0 / (invite + other * 2).as_secs_f64();
    let rate = (3.0 * capacity).round() as u64;
    println!(
        "\n== overload: a SIP server of {capacity:.0} calls/s offered {rate} calls/s (3x) by SIPp \
         for {SECONDS} s, alone and behind the gateway"
    );
    let run = |config: Option<&str>| {
        let net = TestNet::new();
        let dir = gateway_tests::fresh_temp_dir("gwt-demo-overload");
        let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
        let _server = SlowSipServer::start(socket, 8 << 20, invite, other);
        let daemon = config.map(|body| Daemon::start_config(&net, &dir, body));
        let uac = gateway_tests::sipp::run_uac(&net, &dir, rate, SECONDS);
        let seen = daemon.as_ref().map(|_| {
            let policy: serde_json::Value =
                serde_json::from_str(&net.gateway_ok(&["policy", "show", "--json"])).unwrap();
            (net.stats(), policy)
        });
        if let Some(d) = daemon {
            let _ = d.terminate(Duration::from_secs(10));
        }
        let _ = std::fs::remove_dir_all(&dir);
        (uac, seen)
    };
    let (alone, _) = run(None);
    let (behind, seen) = run(Some(
        // No limit and no controller section: the controller moves sip-original by default.
        "services:\n  - {kind: sip, port: 5060}\npolicy:\n  sip-original: {refuse: reject}\n  sip-retransmission: {refuse: reject}\n",
    ));
    let goodput = |u: &gateway_tests::sipp::UacRun| u.goodput(3, SECONDS as usize);
    println!("   {:<34}{:>16}{:>16}", "", "alone", "behind gateway");
    let row = |what: &str, a: String, b: String| println!("   {what:<34}{a:>16}{b:>16}");
    row(
        "calls answered per second",
        format!("{:.0}", goodput(&alone)),
        format!("{:.0}", goodput(&behind)),
    );
    row(
        "share of the server's capacity",
        format!("{:.0}%", 100.0 * goodput(&alone) / capacity),
        format!("{:.0}%", 100.0 * goodput(&behind) / capacity),
    );
    for (what, key) in [
        ("INVITE retransmissions", "Retransmissions"),
        ("calls failed (at once, on a 503)", "FailedCall"),
    ] {
        row(
            what,
            alone.total(key).to_string(),
            behind.total(key).to_string(),
        );
    }
    if let Some((stats, policy)) = &seen {
        let class =
            |name: &str, field: &str| gateway_tests::netns::class_counter(stats, name, field);
        println!(
            "   the NIC: {} originals admitted, {} refused ({} answered with a 503 there and then), \
             {} retransmissions refused, {} ACKs of its 503s absorbed",
            class("sip-original", "admitted"),
            class("sip-original", "dropped_backlog") + class("sip-original", "dropped_rate"),
            stats["datapath"]["sip_replies_sent"],
            class("sip-retransmission", "dropped_backlog"),
            stats["datapath"]["sip_acks_absorbed"],
        );
        let limit = |name: &str| {
            policy
                .as_array()
                .and_then(|rows| rows.iter().find(|r| r["class"] == name))
                .map_or("-".to_owned(), |r| {
                    format!(
                        "backlog {} ({}, {})",
                        r["backlog_limit"],
                        r["owner"].as_str().unwrap_or("-"),
                        r["reason"].as_str().unwrap_or("-")
                    )
                })
        };
        println!(
            "   the controller, told nothing of the server: sip-original {}, sip-retransmission {}",
            limit("sip-original"),
            limit("sip-retransmission")
        );
    }
    let series = |name: &str, u: &gateway_tests::sipp::UacRun| gateway::plot::Series {
        name: name.to_owned(),
        points: u
            .successful_per_second
            .iter()
            .enumerate()
            .map(|(i, v)| (i as f64, *v))
            .collect(),
    };
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/demo");
    let _ = std::fs::create_dir_all(&path);
    let file = path.join("overload.png");
    let chart = gateway::plot::Chart {
        title: "SIP server at 3x its capacity: calls answered per second",
        x_label: "seconds",
        y_label: "calls answered per second",
        series: &[
            series("alone", &alone),
            series("behind the gateway", &behind),
            gateway::plot::Series {
                name: "capacity".into(),
                points: vec![(0.0, capacity), (SECONDS as f64, capacity)],
            },
        ],
        marker: None,
    };
    match gateway::plot::write_png(&file, &chart) {
        Ok(()) => println!("   chart: target/demo/overload.png"),
        Err(e) => println!("   (no chart: {e})"),
    }
}
