//! SIP through the attached datapath with real peers: a SIPp UAS behind `gateway run` that answers
//! INVITEs after 1.2 s (so the SIPp UAC in the peer namespace retransmits them on T1), and the
//! counters held to what SIPp reports having sent.

use std::{
    path::PathBuf,
    process::{Command, Stdio},
    sync::{RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::Duration,
};

use gateway_tests::{
    daemon::Daemon,
    have_root,
    netns::{GW_V4, PEER_V4, TestNet, class_counter},
    sipp::{forged_invite, forged_port},
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
    /// Held to the end, after everything above is gone.
    _turn: Turn,
}

/// The tests of this binary run two at a time, but the flood test runs alone: its sending thread
/// is a core's worth of work for seconds, which would slow the SIPp calls another test times.
static TURNS: RwLock<()> = RwLock::new(());

/// A test's turn: shared with another test, or alone (one of the two guards).
struct Turn {
    _shared: Option<RwLockReadGuard<'static, ()>>,
    _alone: Option<RwLockWriteGuard<'static, ()>>,
}

impl Sip {
    /// A UAS behind the gateway, for a test that may run beside another.
    fn new() -> Self {
        // A test that failed while holding its turn still gave it up.
        Self::with_turn(Turn {
            _shared: Some(TURNS.read().unwrap_or_else(|e| e.into_inner())),
            _alone: None,
        })
    }

    /// [`Sip::new`] for a test that runs alone.
    fn alone() -> Self {
        Self::with_turn(Turn {
            _shared: None,
            _alone: Some(TURNS.write().unwrap_or_else(|e| e.into_inner())),
        })
    }

    fn with_turn(turn: Turn) -> Self {
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
            _turn: turn,
        }
    }

    /// Runs SIPp's uac scenario for `CALLS` calls; returns its final statistics.
    fn uac(&self) -> std::collections::HashMap<String, u64> {
        self.uac_with(&[])
    }

    /// [`Sip::uac`] with more of SIPp's options.
    fn uac_with(&self, extra: &[&str]) -> std::collections::HashMap<String, u64> {
        uac_in(&self.net, &self.dir, extra)
    }

    fn counter(&self, class: &str, field: &str) -> u64 {
        class_counter(&self.net.stats(), class, field)
    }
}

/// Runs SIPp's uac scenario for `CALLS` calls from the peer namespace of `net`, its files in
/// `dir`, with `extra` options; returns its final statistics.
fn uac_in(
    net: &TestNet,
    dir: &std::path::Path,
    extra: &[&str],
) -> std::collections::HashMap<String, u64> {
    let stats = dir.join("uac.csv");
    let out = Command::new("ip")
        .args(["netns", "exec", &net.peer_ns, "sipp", "-sn", "uac"])
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
        .args(extra)
        .current_dir(dir)
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

/// Issue 25: a flood of forged 1 KB INVITEs (each a new transaction, from forged source ports),
/// sent from one thread through a raw socket as fast as it goes, with sip-original closed while
/// real calls are up. Every flood INVITE that reaches the NIC is refused there, so the server
/// receives none of them (its UDP socket counts no more datagrams than the calls' own), and
/// the established calls end: their ACKs and BYEs, exempt, are answered.
#[test]
fn a_forged_invite_flood_reaches_no_server_and_established_calls_end() {
    use std::{
        net::{IpAddr, Ipv4Addr},
        sync::atomic::{AtomicBool, Ordering},
    };
    if !have_root("sipp_forged_invite_flood") {
        return;
    }
    /// At most this long a flood: it stops when the calls end.
    const FLOOD_FOR: Duration = Duration::from_secs(20);
    let s = Sip::alone();
    let (gw, peer): (Ipv4Addr, Ipv4Addr) = (GW_V4.parse().unwrap(), PEER_V4.parse().unwrap());
    let invite = |i: u32| {
        let udp = gateway_tests::inject::udp_datagram(
            IpAddr::V4(peer),
            IpAddr::V4(gw),
            forged_port(i),
            5060,
            &forged_invite(i),
        );
        gateway_tests::inject::ipv4_packet(peer, gw, 17, &udp)
    };
    let flood: Vec<Vec<u8>> = (0..4096).map(invite).collect();
    let received = || udp_in_datagrams(&s.net);
    let done = AtomicBool::new(false);
    let (uac, sent, server_got) = std::thread::scope(|scope| {
        // Calls that last 4 s between their ACK and their BYE.
        let (net, dir) = (&s.net, &s.dir);
        let done = &done;
        let calls = scope.spawn(move || {
            let uac = uac_in(net, dir, &["-d", "4000"]);
            done.store(true, Ordering::Relaxed);
            uac
        });
        // Every call up (its INVITE admitted and answered), then the class closes.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while s.counter("sip-original", "admitted") < CALLS
            || s.counter("sip-original", "backlog") != 0
        {
            assert!(
                std::time::Instant::now() < deadline,
                "the calls did not come up"
            );
            std::thread::yield_now();
        }
        s.net
            .gateway_ok(&["policy", "set", "sip-original", "--rate", "0", "--pin"]);
        let before = received();
        let started = std::time::Instant::now();
        // At least one round of the flood, then on until the calls end (or FLOOD_FOR): a
        // machine slow to see the calls up still floods before it looks at them again.
        let sent = s.net.in_peer(|| {
            let mut sent = 0u64;
            loop {
                gateway_tests::inject::send_ip(IpAddr::V4(gw), &flood);
                sent += flood.len() as u64;
                if done.load(Ordering::Relaxed) || started.elapsed() >= FLOOD_FOR {
                    break sent;
                }
            }
        });
        let took = started.elapsed();
        let uac = calls.join().unwrap();
        let server_got = received() - before;
        eprintln!(
            "flood: {sent} INVITEs in {took:?} ({:.0}/s)",
            sent as f64 / took.as_secs_f64()
        );
        (uac, sent, server_got)
    });
    // The calls ended: every BYE answered, through the flood.
    assert_eq!(uac["SuccessfulCall(C)"], CALLS, "{uac:?}");
    assert!(sent >= flood.len() as u64, "the flood was sent");
    // Only the calls' INVITEs were ever admitted; every other original was refused at the NIC.
    let (packets, admitted) = (
        s.counter("sip-original", "packets"),
        s.counter("sip-original", "admitted"),
    );
    assert_eq!(admitted, CALLS);
    assert_eq!(
        s.counter("sip-original", "dropped_rate"),
        packets - admitted
    );
    assert!(packets - admitted > 0, "flood INVITEs reached the NIC");
    // The server's socket got the calls' own requests (their ACKs, BYEs and any retransmission
    // of them), and none of the flood's thousands.
    assert!(
        server_got <= 4 * CALLS,
        "{server_got} datagrams reached the server during a flood of {sent}"
    );
    eprintln!(
        "refused at the NIC: {}, the server's socket got {server_got} datagrams meanwhile",
        packets - admitted
    );
}

/// Datagrams UDP delivered to sockets in the gateway's namespace so far (`Udp: InDatagrams`).
fn udp_in_datagrams(net: &TestNet) -> u64 {
    let snmp = String::from_utf8(net.exec(&net.gw_ns, "cat", &["/proc/net/snmp"]).stdout).unwrap();
    let mut udp = snmp.lines().filter(|l| l.starts_with("Udp:"));
    let (names, values) = (udp.next().unwrap(), udp.next().unwrap());
    let at = names
        .split_whitespace()
        .position(|n| n == "InDatagrams")
        .unwrap();
    values.split_whitespace().nth(at).unwrap().parse().unwrap()
}
