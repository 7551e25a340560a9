//! SIP through the attached datapath with real peers: a SIPp UAS behind `gateway run` that answers
//! INVITEs after 1.2 s (so the SIPp UAC in the peer namespace retransmits them on T1), and the
//! counters held to what SIPp reports having sent.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    time::Duration,
};

use gateway_tests::{
    daemon::Daemon,
    have_root,
    netns::{GW_V4, PEER_V4, TestNet, class_counter},
    tls::Proc,
};

/// The UAS scenario: receive INVITE, pause 1.2 s, 200 OK; ACK; BYE, 200 OK.
const SLOW_UAS: &str = include_str!("../slow_uas.xml");
const CALLS: u64 = 6;

struct Sip {
    net: TestNet,
    dir: PathBuf,
    _uas: Proc,
    daemon: Option<Daemon>,
}

impl Sip {
    fn new() -> Self {
        let net = TestNet::new();
        let dir =
            std::env::temp_dir().join(format!("gwt-sip-{}-{}", std::process::id(), net.gw_if));
        std::fs::create_dir_all(&dir).unwrap();
        let scenario = dir.join("slow_uas.xml");
        std::fs::write(&scenario, SLOW_UAS).unwrap();
        let daemon = Daemon::start_config(&net, &dir, "services:\n  - {kind: sip, port: 5060}\n");
        let uas = Command::new("ip")
            .args(["netns", "exec", &net.gw_ns, "sipp", "-sf"])
            .arg(&scenario)
            .args([
                "-i",
                GW_V4,
                "-p",
                "5060",
                "-nostdin",
                "-timeout",
                "60s",
                "-trace_err",
            ])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sipp uas");
        let uas = Proc(uas);
        // The UAC must not start before the UAS listens (bounded wait on its socket).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while net
            .exec(&net.gw_ns, "ss", &["-Huln", "sport = :5060"])
            .stdout
            .is_empty()
        {
            assert!(
                std::time::Instant::now() < deadline,
                "sipp uas did not start"
            );
            std::thread::yield_now();
        }
        Sip {
            net,
            dir,
            _uas: uas,
            daemon: Some(daemon),
        }
    }

    /// Runs SIPp's uac scenario for `CALLS` calls; returns its final statistics.
    fn uac(&self) -> std::collections::HashMap<String, u64> {
        let stats = self.dir.join("uac.csv");
        let out = Command::new("ip")
            .args(["netns", "exec", &self.net.peer_ns, "sipp", "-sn", "uac"])
            .arg(format!("{GW_V4}:5060"))
            .args([
                "-i",
                PEER_V4,
                "-p",
                "5061",
                "-m",
                &CALLS.to_string(),
                "-r",
                "20",
                "-l",
                "1000",
            ])
            .args([
                "-nostdin",
                "-timeout",
                "60s",
                "-trace_stat",
                "-fd",
                "1",
                "-stf",
            ])
            .arg(&stats)
            .current_dir(&self.dir)
            .output()
            .expect("sipp uac");
        // SIPp exits 1 when a call failed (the callers' statistics say which); anything else
        // is SIPp's own failure.
        assert!(
            matches!(out.status.code(), Some(0 | 1)),
            "sipp uac: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let text = std::fs::read_to_string(&stats).unwrap();
        let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(';').collect()).collect();
        let (head, last) = (&rows[0], rows.last().unwrap());
        head.iter()
            .zip(last.iter())
            .filter_map(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v)))
            .collect()
    }

    fn counter(&self, class: &str, field: &str) -> u64 {
        class_counter(&self.net.stats(), class, field)
    }
}

impl Drop for Sip {
    fn drop(&mut self) {
        if let Some(d) = self.daemon.take() {
            let _ = d.terminate(Duration::from_secs(10));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn originals_and_retransmissions_match_what_sipp_sent_and_completions_are_counted() {
    if !have_root("sipp_originals_and_retransmissions") {
        return;
    }
    let s = Sip::new();
    let uac = s.uac();
    assert_eq!(uac["SuccessfulCall(C)"], CALLS, "{uac:?}");
    let retrans = uac["Retransmissions(C)"];
    assert!(
        retrans >= CALLS,
        "the 1.2 s answer makes every INVITE retransmit: {uac:?}"
    );
    assert_eq!(s.counter("sip-original", "packets"), uac["OutgoingCall(C)"]);
    assert_eq!(s.counter("sip-retransmission", "packets"), retrans);
    // ACK and BYE of every call.
    assert_eq!(s.counter("sip-exempt", "packets"), 2 * CALLS);
    // Every admitted original completed when its 200 OK left the host.
    assert_eq!(s.counter("sip-original", "backlog"), 0);
    let stats = s.net.stats();
    assert_eq!(stats["sip"]["service_time_samples"], CALLS);
    // The server's 1.2 s delay: the median falls in [2^20, 2^21) us.
    assert_eq!(
        stats["sip"]["service_time_us_p50"],
        1 << 21,
        "{}",
        stats["sip"]
    );
}

#[test]
fn with_retransmissions_closed_they_are_dropped_at_the_nic_and_every_call_still_completes() {
    if !have_root("sipp_retransmissions_dropped") {
        return;
    }
    let s = Sip::new();
    s.net.gateway_ok(&[
        "policy",
        "set",
        "sip-retransmission",
        "--backlog",
        "0",
        "--pin",
    ]);
    let uac = s.uac();
    // Originals, ACK, BYE and the responses were never touched: every call succeeded.
    assert_eq!(uac["SuccessfulCall(C)"], CALLS, "{uac:?}");
    let retrans = uac["Retransmissions(C)"];
    assert!(retrans >= CALLS);
    assert_eq!(s.counter("sip-retransmission", "dropped_backlog"), retrans);
    assert_eq!(s.counter("sip-retransmission", "admitted"), 0);
    assert_eq!(s.counter("sip-original", "admitted"), CALLS);
    assert_eq!(s.counter("sip-exempt", "admitted"), 2 * CALLS);
}

#[test]
fn with_originals_closed_and_answered_every_call_fails_at_once_on_a_503() {
    if !have_root("sipp_originals_answered_with_503") {
        return;
    }
    let s = Sip::new();
    s.net
        .gateway_ok(&["policy", "set", "sip-original", "--rate", "0", "--pin"]);
    s.net.gateway_ok(&[
        "policy",
        "set",
        "sip-original",
        "--refuse",
        "reject",
        "--retry-after",
        "5",
    ]);
    let started = std::time::Instant::now();
    let uac = s.uac();
    let took = started.elapsed();
    // Every call failed on the NIC's 503, before SIPp retransmitted a single INVITE (T1 is
    // 500 ms): with drop, each would have retransmitted for 32 s.
    assert_eq!(uac["SuccessfulCall(C)"], 0, "{uac:?}");
    assert_eq!(uac["FailedCall(C)"], CALLS, "{uac:?}");
    assert_eq!(uac["Retransmissions(C)"], 0, "{uac:?}");
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(s.counter("sip-original", "rejected"), CALLS);
    assert_eq!(s.counter("sip-original", "admitted"), 0);
    let stats = s.net.stats();
    assert_eq!(stats["datapath"]["sip_replies_sent"], CALLS, "{stats}");
    // SIPp's ACK for each 503 (RFC 3261 §17.1.1.3) never reached the server.
    assert_eq!(stats["datapath"]["sip_acks_absorbed"], CALLS, "{stats}");
    // Each failed call lasted under 10 ms (SIPp's call-length histogram).
    assert_eq!(uac["CallLengthRepartition_<10"], CALLS, "{uac:?}");
    eprintln!("503 run: {took:?}, {uac:?}, datapath {}", stats["datapath"]);
}
