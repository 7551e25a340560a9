//! `gateway probe` against a SIP server of known capacity (one FIFO worker, a fixed service time
//! per INVITE, paced so that it holds on a busy machine): the tipping point it reports is where
//! the model puts it, within one step.

use std::{net::UdpSocket, time::Duration};

use gateway_tests::{
    gateway_bin, have_root,
    netns::{GW_V4, TestNet},
    probe::run_probe,
    sipserver::SlowSipServer,
};

const START: u32 = 2;
const STEP: u32 = 4;
const THRESHOLD_MS: f64 = 90.0;

/// Where the model puts the tipping point: with one worker of service time `s`, a crowd of `n`
/// synchronized INVITEs is answered at s, 2s, ..., ns, so its median is about (n + 1) / 2 * s;
/// the first stage whose median exceeds the base stage's by the threshold.
fn expected_tipping(service_ms: f64) -> u32 {
    let median = |n: u32| f64::from(n + 1) / 2.0 * service_ms;
    (0..)
        .map(|i| START + i * STEP)
        .find(|n| median(*n) - median(START) >= THRESHOLD_MS)
        .unwrap()
}

fn probe(service: Duration, plot: &std::path::Path) -> (u32, serde_json::Value) {
    let net = TestNet::new();
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    // Paced, not spinning: a server of exactly this capacity however busy the machine is (a
    // compile beside a spinning one made it tip at 14 where the model says 22).
    let _server = SlowSipServer::start_paced(socket, 4 << 20, service, Duration::from_micros(100));
    let v = run_probe(
        &net,
        &[
            "--target",
            &format!("{GW_V4}:5060"),
            "--kind",
            "sip-invite",
            "--start",
            &START.to_string(),
            "--step",
            &STEP.to_string(),
            "--max",
            "98",
            "--rounds",
            "2",
            "--threshold",
            &format!("{THRESHOLD_MS}ms"),
            "--timeout",
            "10s",
            "--deadline",
            "120s",
            "--suggest-policy",
            "--plot",
            plot.to_str().unwrap(),
        ],
    );
    let tip = v["tipping_crowd"].as_u64().expect("a tipping point") as u32;
    (tip, v)
}

#[test]
fn the_probe_finds_the_tipping_point_of_a_server_of_known_capacity_within_one_step() {
    if !have_root("the_probe_finds_the_tipping_point") {
        return;
    }
    let dir = gateway_tests::fresh_temp_dir("gwt-probe");
    for service_ms in [10.0, 5.0] {
        let plot = dir.join(format!("probe-{service_ms}ms.png"));
        let (tip, v) = probe(Duration::from_secs_f64(service_ms / 1000.0), &plot);
        let png = std::fs::read(&plot).expect("the plot written");
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        let want = expected_tipping(service_ms);
        eprintln!("service {service_ms} ms: tipped at {tip}, model {want}: {v}");
        assert!(
            tip.abs_diff(want) <= STEP,
            "service {service_ms} ms: tipped at {tip}, the model says {want}: {v}"
        );
        assert_eq!(v["stop"], "threshold", "{v}");
        // No request failed on the way, and the suggestion holds the stable crowd.
        for s in v["stages"].as_array().unwrap() {
            assert_eq!(s["failed"], 0, "{v}");
        }
        let stable = tip - STEP;
        assert!(
            v["suggested_policy"]
                .as_str()
                .unwrap()
                .contains(&format!("sip-original: {{backlog: {stable}}}")),
            "{v}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tls_kinds_measure_real_handshakes_and_resumptions() {
    if !have_root("tls_kinds_measure_real_handshakes") {
        return;
    }
    use gateway_tests::tls::{Cert, RustlsServer};
    let net = TestNet::new();
    let cert = Cert::new();
    let listener = net.in_gw(|| std::net::TcpListener::bind((GW_V4, 443)).expect("bind"));
    let _server = RustlsServer::start(&cert, listener);
    for (kind, trust) in [
        ("tls-new", vec!["--insecure".to_string()]),
        (
            "tls-resumed",
            vec![
                "--ca".to_string(),
                cert.cert().display().to_string(),
                "--server-name".to_string(),
                "gateway-test".to_string(),
            ],
        ),
    ] {
        let target = format!("{GW_V4}:443");
        let mut args = vec!["--target", &target, "--kind", kind];
        args.extend(["--start", "1", "--step", "1", "--max", "3", "--rounds", "1"]);
        args.extend(["--threshold", "10s"]);
        args.extend(trust.iter().map(String::as_str));
        let v = run_probe(&net, &args);
        assert_eq!(v["stop"], "max_crowd", "{v}");
        let stages = v["stages"].as_array().unwrap();
        assert_eq!(stages.len(), 3, "{v}");
        for s in stages {
            assert_eq!(s["failed"], 0, "{kind}: {v}");
            assert_eq!(s["answered"], s["crowd"], "{kind}: {v}");
            if kind == "tls-resumed" {
                assert!(s["resumed"].as_u64().unwrap() >= 1, "{v}");
            } else {
                assert_eq!(s["resumed"], 0, "{v}");
            }
        }
    }
    // Without a way to trust the server, a TLS probe is refused before it sends anything.
    let out = std::process::Command::new(gateway_bin())
        .args(["probe", "--target", "127.0.0.1:9", "--kind", "tls-new"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ca FILE"));
}

#[test]
fn http_get_and_sip_options_measure_real_servers() {
    if !have_root("http_get_and_sip_options_measure_real_servers") {
        return;
    }
    use gateway_tests::{
        backend::Nginx,
        kamailio::Kamailio,
        tls::{Cert, wait_listening},
    };
    let net = TestNet::new();
    let cert = Cert::new();
    // nginx terminating TLS and answering every GET itself; Kamailio answering every OPTIONS.
    let _nginx = Nginx::start(
        &["ip", "netns", "exec", &net.gw_ns],
        &format!(
            "  server {{ listen {GW_V4}:443 ssl; ssl_certificate {}; ssl_certificate_key {};\n\
             location / {{ return 200 \"probed\\n\"; }} }}",
            cert.cert().display(),
            cert.key().display()
        ),
        1,
    );
    wait_listening(|| net.in_peer(|| std::net::TcpStream::connect((GW_V4, 443)).is_ok()));
    let _kamailio = Kamailio::start(
        &["ip", "netns", "exec", &net.gw_ns],
        format!("{GW_V4}:5060").parse().unwrap(),
    );
    let ca = cert.cert().display().to_string();
    for (kind, port) in [("http-get", 443), ("sip-options", 5060)] {
        let target = format!("{GW_V4}:{port}");
        let mut args = vec!["--target", &target, "--kind", kind];
        args.extend(["--start", "1", "--step", "2", "--max", "5", "--rounds", "2"]);
        // Kamailio may take a moment to answer its first request: Timer A resends meanwhile.
        args.extend(["--threshold", "10s", "--timeout", "10s"]);
        if kind == "http-get" {
            args.extend(["--ca", &ca, "--server-name", "gateway-test"]);
        }
        let v = run_probe(&net, &args);
        assert_eq!(v["stop"], "max_crowd", "{kind}: {v}");
        let stages = v["stages"].as_array().unwrap();
        assert_eq!(stages.len(), 3, "{kind}: {v}");
        for s in stages {
            assert_eq!(s["failed"], 0, "{kind}: {v}");
            assert_eq!(
                s["answered"].as_u64().unwrap(),
                2 * s["crowd"].as_u64().unwrap(),
                "{kind}: every request of both rounds answered: {v}"
            );
        }
    }
}
