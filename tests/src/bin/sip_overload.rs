//! `cargo xtask bench` (part two): seed 001's curve. A SIP server of known capacity (one FIFO
//! thread, 8 MiB receive buffer, fixed CPU per message) is driven by SIPp at 1x, 2x and 3x its
//! capacity, without the gateway and with it, in one run. The figure is goodput, successful calls
//! per second over a steady window, as a share of capacity.

use std::{collections::HashMap, net::UdpSocket, process::Command, time::Duration};

use gateway_tests::{
    daemon::Daemon,
    have_root,
    netns::{GW_V4, PEER_V4, TestNet},
    sipserver::SlowSipServer,
};

const INVITE_COST: Duration = Duration::from_millis(5);
const OTHER_COST: Duration = Duration::from_micros(200);
const RCVBUF: usize = 8 << 20;
/// Seconds of load per run; goodput is averaged over seconds WARM..SECONDS.
const SECONDS: u64 = 20;
const WARM: usize = 5;
const UAC: &str = include_str!("../../sip_uac.xml");

fn capacity() -> f64 {
    1.0 / (INVITE_COST + OTHER_COST * 2).as_secs_f64()
}

/// One run: successful calls per second over the steady window, and SIPp's totals.
fn run(multiplier: f64, gateway: bool) -> (f64, HashMap<String, u64>) {
    let net = TestNet::new();
    let dir =
        std::env::temp_dir().join(format!("gwt-overload-{}-{}", std::process::id(), net.gw_if));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    let _server = SlowSipServer::start(socket, RCVBUF, INVITE_COST, OTHER_COST);
    let daemon = gateway.then(|| {
        Daemon::start_config(
            &net,
            &dir,
            "services:\n  - {kind: sip, port: 5060}\npolicy:\n  sip-original: {backlog: 30}\n  sip-retransmission: {backlog: 10}\n",
        )
    });
    let scenario = dir.join("uac.xml");
    std::fs::write(&scenario, UAC).unwrap();
    let stats = dir.join("uac.csv");
    let rate = (capacity() * multiplier).round() as u64;
    let _ = Command::new("ip")
        .args(["netns", "exec", &net.peer_ns, "sipp", "-sf"])
        .arg(&scenario)
        .arg(format!("{GW_V4}:5060"))
        .args(["-i", PEER_V4, "-p", "5061"])
        .args([
            "-r",
            &rate.to_string(),
            "-m",
            &(rate * SECONDS).to_string(),
            "-l",
            "1000000",
        ])
        .args([
            "-nostdin",
            "-timeout",
            &format!("{}s", SECONDS + 5),
            "-timeout_error",
        ])
        .args(["-trace_stat", "-fd", "1", "-stf"])
        .arg(&stats)
        .current_dir(&dir)
        .output()
        .expect("sipp");
    let text = std::fs::read_to_string(&stats).unwrap_or_default();
    let rows: Vec<Vec<String>> = text
        .lines()
        .map(|l| l.split(';').map(String::from).collect())
        .collect();
    let col = |name: &str| rows[0].iter().position(|h| h == name).expect(name);
    let ok = col("SuccessfulCall(P)");
    let window: Vec<f64> = rows[1..]
        .iter()
        .skip(WARM)
        .take(SECONDS as usize - WARM)
        .filter_map(|r| r.get(ok).and_then(|v| v.parse().ok()))
        .collect();
    let goodput = window.iter().sum::<f64>() / window.len().max(1) as f64;
    let last = rows.last().unwrap();
    let totals = rows[0]
        .iter()
        .zip(last.iter())
        .filter(|(k, _)| k.ends_with("(C)"))
        .filter_map(|(k, v)| v.parse().ok().map(|v| (k.clone(), v)))
        .collect();
    if let Some(d) = daemon {
        let _ = d.terminate(Duration::from_secs(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
    (goodput, totals)
}

fn main() {
    if !have_root("sip_overload") {
        std::process::exit(1);
    }
    let cap = capacity();
    println!(
        "# SIP overload: goodput as a share of capacity\n\nServer: one FIFO thread, {} MiB receive buffer, {:?} CPU per INVITE and {:?} per ACK/BYE: capacity {cap:.0} calls/s. SIPp with a transaction-matching UAC, T1 500 ms; goodput = successful calls/s averaged over seconds {WARM}..{SECONDS}. Gateway: sip-original backlog 30, sip-retransmission backlog threshold 10 (static policy).\n",
        RCVBUF >> 20,
        INVITE_COST,
        OTHER_COST
    );
    println!(
        "| offered load | FIFO (no gateway) | with gateway | FIFO retransmissions | gateway retransmissions |"
    );
    println!("|---|---:|---:|---:|---:|");
    for m in [1.0, 2.0, 3.0] {
        let (fifo, ft) = run(m, false);
        let (gw, gt) = run(m, true);
        println!(
            "| {m:.0}x ({:.0} calls/s) | {:.0}% ({fifo:.0}/s) | {:.0}% ({gw:.0}/s) | {} | {} |",
            cap * m,
            100.0 * fifo / cap,
            100.0 * gw / cap,
            ft.get("Retransmissions(C)").copied().unwrap_or(0),
            gt.get("Retransmissions(C)").copied().unwrap_or(0),
        );
    }
}
