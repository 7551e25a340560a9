//! `cargo xtask bench` (part two): seed 001's curve. A SIP server of known capacity (one FIFO
//! thread, 8 MiB receive buffer, fixed CPU per message) is driven by SIPp at 1x, 2x and 3x its
//! capacity, without the gateway and with it, in one run. The figure is goodput, successful calls
//! per second over a steady window, as a share of capacity.

use std::{collections::HashMap, net::UdpSocket, time::Duration};

use gateway_tests::{
    daemon::Daemon,
    have_root,
    netns::{GW_V4, TestNet},
    sipp::run_uac,
    sipserver::SlowSipServer,
};

const INVITE_COST: Duration = Duration::from_millis(5);
const OTHER_COST: Duration = Duration::from_micros(200);
const RCVBUF: usize = 8 << 20;
/// Seconds of load per run; goodput is averaged over seconds WARM..SECONDS.
const SECONDS: u64 = 20;
const WARM: usize = 5;

fn capacity() -> f64 {
    1.0 / (INVITE_COST + OTHER_COST * 2).as_secs_f64()
}

/// The static policy the first waves were measured with, picked by hand.
const STATIC: &str = "services:\n  - {kind: sip, port: 5060}\npolicy:\n  sip-original: {backlog: 30}\n  sip-retransmission: {backlog: 10}\n";
/// No limit set by hand: the controller finds them (its default target, 100 ms).
const CONTROLLED: &str = "services:\n  - {kind: sip, port: 5060}\ncontroller:\n  classes:\n    sip-original: {mode: sip}\n";

/// One run (no gateway, or the gateway with `config`): successful calls per second over the
/// steady window, and SIPp's totals.
fn run(multiplier: f64, config: Option<&str>) -> (f64, HashMap<String, u64>) {
    let net = TestNet::new();
    let dir =
        std::env::temp_dir().join(format!("gwt-overload-{}-{}", std::process::id(), net.gw_if));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    let _server = SlowSipServer::start(socket, RCVBUF, INVITE_COST, OTHER_COST);
    let daemon = config.map(|body| Daemon::start_config(&net, &dir, body));
    let rate = (capacity() * multiplier).round() as u64;
    let uac = run_uac(&net, &dir, rate, SECONDS);
    if let Some(d) = daemon {
        let _ = d.terminate(Duration::from_secs(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
    (uac.goodput(WARM, SECONDS as usize), uac.totals)
}

fn main() {
    if !have_root("sip_overload") {
        std::process::exit(1);
    }
    let cap = capacity();
    println!(
        "# SIP overload: goodput as a share of capacity\n\nServer: one FIFO thread, {} MiB receive buffer, {:?} CPU per INVITE and {:?} per ACK/BYE: capacity {cap:.0} calls/s. SIPp with a transaction-matching UAC, T1 500 ms; goodput = successful calls/s averaged over seconds {WARM}..{SECONDS}. Static policy (picked by hand): sip-original backlog 30, sip-retransmission backlog 10. Controller: no limit set, mode sip, target 100 ms.\n",
        RCVBUF >> 20,
        INVITE_COST,
        OTHER_COST
    );
    println!(
        "| offered load | FIFO (no gateway) | gateway, static policy | gateway, controller | FIFO retransmissions | static retransmissions | controller retransmissions | controller failed calls |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let loads: Vec<f64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let loads = if loads.is_empty() {
        vec![1.0, 2.0, 3.0]
    } else {
        loads
    };
    for m in loads {
        let (fifo, ft) = run(m, None);
        let (gw, gt) = run(m, Some(STATIC));
        let (ctl, ct) = run(m, Some(CONTROLLED));
        let retrans = |t: &HashMap<String, u64>| t.get("Retransmissions").copied().unwrap_or(0);
        println!(
            "| {m:.1}x ({:.0} calls/s) | {:.0}% ({fifo:.0}/s) | {:.0}% ({gw:.0}/s) | {:.0}% ({ctl:.0}/s) | {} | {} | {} | {} |",
            cap * m,
            100.0 * fifo / cap,
            100.0 * gw / cap,
            100.0 * ctl / cap,
            retrans(&ft),
            retrans(&gt),
            retrans(&ct),
            ct.get("FailedCall").copied().unwrap_or(0),
        );
    }
}
