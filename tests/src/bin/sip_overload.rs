//! `cargo xtask bench` (part two): seed 001's curve. A SIP server (one FIFO thread with an
//! 8 MiB or a 256 KiB receive buffer, or a real Kamailio with its own buffer or one probed up to
//! 8 MiB; fixed CPU per message) has its capacity measured alone, then is driven by SIPp at 0.5x
//! to 3x that capacity, without the gateway and with it, in one run. The figure is goodput,
//! successful calls per second over a steady window, as a share of the measured capacity.

use std::{collections::HashMap, net::UdpSocket, time::Duration};

use gateway::plot::Series;
use gateway_tests::{
    daemon::Daemon,
    have_root,
    kamailio::{self, Kamailio},
    netns::{GW_V4, TestNet},
    report::Report,
    sipp::{IN_FLIGHT, measure_capacity, run_uac},
    sipserver::SlowSipServer,
    trickle::Trickle,
};

const INVITE_COST: Duration = Duration::from_millis(5);
const OTHER_COST: Duration = Duration::from_micros(200);
/// The FIFO server's receive buffer: large (8 MiB, the default) or small (`small`: 256 KiB).
const RCVBUF: usize = 8 << 20;
const RCVBUF_SMALL: usize = 256 << 10;
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

/// Nothing configured but the service (issue 27): the controller moves sip-original by default.
const SERVICE_ONLY: &str = "services:\n  - {kind: sip, port: 5060}\nmetrics: 127.0.0.1:9478\n";
/// The controller, with refused requests answered by a 503 from the NIC (issue 13).
const CONTROLLED_503: &str = "services:\n  - {kind: sip, port: 5060}\ncontroller:\n  classes:\n    sip-original: {mode: sip}\npolicy:\n  sip-original: {refuse: reject}\n  sip-retransmission: {refuse: reject}\n";

/// The server under test, in the gateway's namespace until dropped.
enum Server {
    Fifo(#[allow(dead_code)] SlowSipServer),
    Kamailio(#[allow(dead_code)] Kamailio),
}

/// Starts one of the two servers, of the same nominal capacity. `rcvbuf` is the FIFO server's
/// buffer, or the most Kamailio's probing may reach (`None`: its default).
fn serve(net: &TestNet, kamailio: bool, rcvbuf: Option<usize>) -> Server {
    if kamailio {
        let k = Kamailio::start_with_cost(
            &["ip", "netns", "exec", &net.gw_ns],
            format!("{GW_V4}:5060").parse().unwrap(),
            INVITE_COST + OTHER_COST * 2,
            rcvbuf,
        );
        kamailio::wait_answering(net);
        Server::Kamailio(k)
    } else {
        let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
        Server::Fifo(SlowSipServer::start(
            socket,
            rcvbuf.unwrap_or(RCVBUF),
            INVITE_COST,
            OTHER_COST,
        ))
    }
}

fn scratch(net: &TestNet) -> std::path::PathBuf {
    let dir =
        std::env::temp_dir().join(format!("gwt-overload-{}-{}", std::process::id(), net.gw_if));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Seconds of the capacity measurement.
const CAPACITY_SECONDS: u64 = 12;

/// The server's real capacity, measured alone in this run ([`measure_capacity`]), and the
/// retransmissions while measuring. The nominal figure counts only the CPU the server is told
/// to spend; Kamailio's own work per message, and the sleep's overshoot, come on top.
fn measured_capacity(kamailio: bool, rcvbuf: Option<usize>) -> (f64, u64) {
    let net = TestNet::new();
    let dir = scratch(&net);
    let _server = serve(&net, kamailio, rcvbuf);
    let measured = measure_capacity(&net, &dir, capacity(), CAPACITY_SECONDS);
    let _ = std::fs::remove_dir_all(&dir);
    measured
}

/// One run at `rate` calls/s (no gateway, or the gateway with `config`): successful calls per
/// second over the steady window, and SIPp's totals.
fn run(
    rate: u64,
    config: Option<&str>,
    kamailio: bool,
    rcvbuf: Option<usize>,
) -> (f64, HashMap<String, u64>) {
    let (goodput, totals, _) = run_measured(rate, config, kamailio, rcvbuf);
    (goodput, totals)
}

/// What the daemon used: idle for [`IDLE`] after its start, then under the load.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    /// CPU, in cores, while idle.
    idle_cpu: f64,
    /// Resident memory at the end of the idle window, bytes.
    idle_rss: u64,
    /// CPU, in cores, over the load.
    load_cpu: f64,
    /// Resident memory at the end of the load, bytes.
    load_rss: u64,
}

/// The idle window [`Usage`] is measured over.
const IDLE: Duration = Duration::from_secs(3);

/// [`run`], and what the daemon used (with a gateway).
fn run_measured(
    rate: u64,
    config: Option<&str>,
    kamailio: bool,
    rcvbuf: Option<usize>,
) -> (f64, HashMap<String, u64>, Option<Usage>) {
    use gateway_tests::procfs::{cpu_seconds, rss_bytes};
    let net = TestNet::new();
    let dir = scratch(&net);
    let _server = serve(&net, kamailio, rcvbuf);
    let daemon = config.map(|body| Daemon::start_config(&net, &dir, body));
    let mut usage = None;
    if let Some(d) = &daemon {
        let (t0, c0) = (std::time::Instant::now(), cpu_seconds(d.pid()));
        std::thread::sleep(IDLE);
        usage = Some(Usage {
            idle_cpu: (cpu_seconds(d.pid()) - c0) / t0.elapsed().as_secs_f64(),
            idle_rss: rss_bytes(d.pid()),
            ..Usage::default()
        });
    }
    let (t0, c0) = (
        std::time::Instant::now(),
        daemon.as_ref().map_or(0.0, |d| cpu_seconds(d.pid())),
    );
    let uac = run_uac(&net, &dir, rate, SECONDS);
    if let (Some(d), Some(u)) = (&daemon, &mut usage) {
        u.load_cpu = (cpu_seconds(d.pid()) - c0) / t0.elapsed().as_secs_f64();
        u.load_rss = rss_bytes(d.pid());
    }
    if let Some(d) = daemon {
        let _ = d.terminate(Duration::from_secs(10));
    }
    let _ = std::fs::remove_dir_all(&dir);
    (uac.goodput(WARM, SECONDS as usize), uac.totals, usage)
}

fn main() {
    if !have_root("sip_overload") {
        std::process::exit(1);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let kamailio = args.iter().any(|a| a == "kamailio");
    let loads: Vec<f64> = args.iter().filter_map(|a| a.parse().ok()).collect();
    if args.iter().any(|a| a == "trickle") {
        return trickle(if loads.is_empty() {
            vec![2.0, 10.0, 40.0]
        } else {
            loads
        });
    }
    if args.iter().any(|a| a == "refuse") {
        return refusals(if loads.is_empty() { vec![3.0] } else { loads }, kamailio);
    }
    let small = args.iter().any(|a| a == "small");
    let large = args.iter().any(|a| a == "large");
    let (server, rcvbuf) = match (kamailio, small, large) {
        (true, _, false) => ("kamailio", None),
        (true, _, true) => ("kamailio-large", Some(RCVBUF)),
        (false, true, _) => ("fifo-small", Some(RCVBUF_SMALL)),
        (false, false, _) => ("fifo", Some(RCVBUF)),
    };
    let mut report = Report::new(&format!("sip-overload-{server}"));
    let nominal = capacity();
    let (cap, capacity_retransmissions) = measured_capacity(kamailio, rcvbuf);
    report.say(format!(
        "# SIP overload: goodput as a share of capacity\n\nServer: {}, {}, {:?} CPU per INVITE and {:?} per ACK/BYE: a nominal capacity of {nominal:.0} calls/s. Its real capacity, measured alone in this run (SIPp in a closed loop of {IN_FLIGHT} calls, each new call as one ends, so that the server is never idle and no request is resent; {capacity_retransmissions} retransmissions), is **{cap:.0} calls/s** ({:.0}% of nominal): the offered loads and the shares below are of that. SIPp with a transaction-matching UAC, T1 500 ms; goodput = successful calls/s averaged over seconds {WARM}..{SECONDS}. Static policy (picked by hand): sip-original backlog 30, sip-retransmission backlog 10. Controller: no limit set, mode sip, target 100 ms, written in a controller section. Default: nothing configured but the service (no policy, no controller section; the controller moves sip-original by default).\n",
        if kamailio {
            "a real Kamailio (one worker, stateless, cfgutils usleep: its one worker busy for the same time per call)"
        } else {
            "one FIFO thread"
        },
        match (kamailio, rcvbuf) {
            (true, None) => "its own receive buffer (Kamailio's default probing, up to 256 KiB)".to_string(),
            (true, Some(b)) => format!(
                "its receive buffer probed up to {} KiB (`kamailio -b`; the kernel caps a request at net.core.rmem_max, {} KiB here)",
                b >> 10,
                std::fs::read_to_string("/proc/sys/net/core/rmem_max")
                    .ok()
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0)
                    >> 10
            ),
            (false, b) => format!("{} KiB receive buffer", b.unwrap_or(RCVBUF) >> 10),
        },
        INVITE_COST,
        OTHER_COST,
        100.0 * cap / nominal
    ));
    report.say(
        "| offered load | no gateway | gateway, static policy | gateway, controller | gateway, default | no-gateway retransmissions | static retransmissions | controller retransmissions | controller failed calls |",
    );
    report.say("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let loads = if loads.is_empty() {
        vec![0.5, 1.0, 2.0, 3.0, 10.0]
    } else {
        loads
    };
    let (mut rows, mut usages) = (Vec::new(), Vec::new());
    let mut lines: [Series; 4] = [
        "no gateway",
        "gateway, static",
        "gateway, controller",
        "gateway, default",
    ]
    .map(|name| Series {
        name: name.to_owned(),
        points: Vec::new(),
    });
    for m in loads {
        let rate = (cap * m).round() as u64;
        let (fifo, ft) = run(rate, None, kamailio, rcvbuf);
        let (gw, gt) = run(rate, Some(STATIC), kamailio, rcvbuf);
        let (ctl, ct) = run(rate, Some(CONTROLLED), kamailio, rcvbuf);
        let (def, _, used) = run_measured(rate, Some(SERVICE_ONLY), kamailio, rcvbuf);
        usages.push((m, used.unwrap_or_default()));
        let retrans = |t: &HashMap<String, u64>| t.get("Retransmissions").copied().unwrap_or(0);
        let failed = ct.get("FailedCall").copied().unwrap_or(0);
        report.say(format!(
            "| {m:.1}x ({:.0} calls/s) | {:.0}% ({fifo:.0}/s) | {:.0}% ({gw:.0}/s) | {:.0}% ({ctl:.0}/s) | {:.0}% ({def:.0}/s) | {} | {} | {} | {failed} |",
            cap * m,
            100.0 * fifo / cap,
            100.0 * gw / cap,
            100.0 * ctl / cap,
            100.0 * def / cap,
            retrans(&ft),
            retrans(&gt),
            retrans(&ct),
        ));
        for (line, goodput) in lines.iter_mut().zip([fifo, gw, ctl, def]) {
            line.points.push((m, 100.0 * goodput / cap));
        }
        rows.push(vec![
            format!("{m}"),
            format!("{:.1}", 100.0 * fifo / cap),
            format!("{:.1}", 100.0 * gw / cap),
            format!("{:.1}", 100.0 * ctl / cap),
            format!("{:.1}", 100.0 * def / cap),
            retrans(&ft).to_string(),
            retrans(&gt).to_string(),
            retrans(&ct).to_string(),
            failed.to_string(),
        ]);
    }
    report.say(format!(
        "\nThe daemon with the default column's config (its metrics endpoint on, hyper serving \
         it; the controller's intervals every 100 ms), idle for {IDLE:?} after its start and then \
         under the load:\n\n| offered load | idle CPU | idle RSS | CPU under load | RSS under load |\n|---|---:|---:|---:|---:|"
    ));
    for (m, u) in &usages {
        report.say(format!(
            "| {m:.1}x | {:.2}% of a core | {:.1} MiB | {:.2}% of a core | {:.1} MiB |",
            100.0 * u.idle_cpu,
            u.idle_rss as f64 / (1 << 20) as f64,
            100.0 * u.load_cpu,
            u.load_rss as f64 / (1 << 20) as f64,
        ));
    }
    report.csv(
        "goodput.csv",
        &[
            "load",
            "no_gateway_pct",
            "static_pct",
            "controller_pct",
            "default_pct",
            "no_gateway_retransmissions",
            "static_retransmissions",
            "controller_retransmissions",
            "controller_failed_calls",
        ],
        &rows,
    );
    report.chart(
        "goodput.png",
        &format!("SIP overload (seed 001), {server} server: goodput (% of capacity)"),
        ("offered load (x capacity)", "goodput (% of capacity)"),
        &lines,
    );
}

/// Refused callers, dropped against answered with a 503 from the NIC, behind the controller:
/// goodput, the INVITE retransmissions the refusals cause, and failed calls. (A dropped caller
/// learns nothing until its own Timer B, 32 s; an answered one at once: `sip_netns` measures
/// it, every call over within 10 ms.)
fn refusals(loads: Vec<f64>, kamailio: bool) {
    let (cap, _) = measured_capacity(kamailio, None);
    let server = if kamailio { "kamailio" } else { "fifo" };
    let mut report = Report::new(&format!("sip-refusals-{server}"));
    report.say(format!(
        "# SIP overload: refused callers dropped or answered (503 from the NIC)\n\nServer: {}, capacity {cap:.0} calls/s measured alone in this run; the controller sets the limits (mode sip); {SECONDS} s of load.\n",
        if kamailio {
            "a real Kamailio (one worker)"
        } else {
            "one FIFO thread, 8 MiB buffer"
        }
    ));
    report.say(
        "| offered load | goodput, drop | goodput, 503 | retransmissions, drop | retransmissions, 503 | failed calls, drop | failed calls, 503 |",
    );
    report.say("|---|---:|---:|---:|---:|---:|---:|");
    let get = |t: &HashMap<String, u64>, k: &str| t.get(k).copied().unwrap_or(0);
    let mut rows = Vec::new();
    for m in loads {
        let rate = (cap * m).round() as u64;
        let (drop, dt) = run(rate, Some(CONTROLLED), kamailio, None);
        let (answered, at) = run(rate, Some(CONTROLLED_503), kamailio, None);
        report.say(format!(
            "| {m:.1}x ({:.0} calls/s) | {:.0}% | {:.0}% | {} | {} | {} | {} |",
            cap * m,
            100.0 * drop / cap,
            100.0 * answered / cap,
            get(&dt, "Retransmissions"),
            get(&at, "Retransmissions"),
            get(&dt, "FailedCall"),
            get(&at, "FailedCall"),
        ));
        rows.push(vec![
            format!("{m}"),
            format!("{:.1}", 100.0 * drop / cap),
            format!("{:.1}", 100.0 * answered / cap),
            get(&dt, "Retransmissions").to_string(),
            get(&at, "Retransmissions").to_string(),
            get(&dt, "FailedCall").to_string(),
            get(&at, "FailedCall").to_string(),
        ]);
    }
    report.csv(
        "refusals.csv",
        &[
            "load",
            "drop_goodput_pct",
            "reject_goodput_pct",
            "drop_retransmissions",
            "reject_retransmissions",
            "drop_failed_calls",
            "reject_failed_calls",
        ],
        &rows,
    );
}

/// Legitimate callers' rate in the trickle benchmark (calls/s), well under the FIFO server's
/// capacity: what they lose is the trickle's doing, not overload's.
const CALLERS: u64 = 80;

/// Dead work steering the controller (issue 28): callers at [`CALLERS`] calls/s for
/// [`SECONDS`] behind the controller (mode sip, target 100 ms, default bounds), while an
/// attacker sends INVITEs the server discards unanswered (Content-Length past the datagram) for
/// the first half. Each trickle rate of `rates` (INVITEs/s) is one run; a run without one is the
/// baseline. Reported: the callers' calls answered during the trickle and after it, and the
/// lowest limit the controller set while it lasted.
fn trickle(rates: Vec<f64>) {
    let mut report = Report::new("sip-trickle");
    report.say(format!(
        "# SIP: a trickle of unanswerable INVITEs against the controller\n\nServer: one FIFO thread, {INVITE_COST:?} CPU per INVITE. Callers: SIPp at {CALLERS} calls/s for {SECONDS} s. Controller: mode sip, target 100 ms, no limit set. The trickle (INVITEs whose Content-Length runs past the datagram, which the server discards as RFC 3261 18.3 says) is sent for the first {} s; each holds a place for its unit timeout (2 s). Answered: the callers' successful calls per second over seconds 2..{} (during) and {}..{SECONDS} (after), as a share of {CALLERS}/s.\n",
        SECONDS / 2,
        SECONDS / 2,
        SECONDS / 2 + 1,
    ));
    report
        .say("| trickle | answered during | answered after | failed calls | lowest INVITE limit during |");
    report.say("|---|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for per_s in std::iter::once(0.0).chain(rates) {
        let net = TestNet::new();
        let dir = scratch(&net);
        let _server = serve(&net, false, None);
        let daemon = Daemon::start_config(&net, &dir, CONTROLLED);
        let running = std::sync::atomic::AtomicBool::new(true);
        let (uac, lowest) = std::thread::scope(|scope| {
            let uac = scope.spawn(|| {
                let uac = run_uac(&net, &dir, CALLERS, SECONDS);
                running.store(false, std::sync::atomic::Ordering::Relaxed);
                uac
            });
            let trickle = (per_s > 0.0).then(|| Trickle::start(&net, per_s, SECONDS / 2));
            let started = std::time::Instant::now();
            let mut lowest = u64::MAX;
            while running.load(std::sync::atomic::Ordering::Relaxed)
                && started.elapsed() < Duration::from_secs(SECONDS / 2)
            {
                lowest = lowest.min(backlog_limit(&net));
                std::thread::sleep(Duration::from_millis(100));
            }
            drop(trickle);
            (uac.join().unwrap(), lowest)
        });
        let _ = daemon.terminate(Duration::from_secs(10));
        let _ = std::fs::remove_dir_all(&dir);
        let half = SECONDS as usize / 2;
        let during = 100.0 * uac.goodput(2, half + 1) / CALLERS as f64;
        let after = 100.0 * uac.goodput(half + 1, SECONDS as usize + 1) / CALLERS as f64;
        let failed = uac.total("FailedCall");
        report.say(format!(
            "| {} | {during:.0}% | {after:.0}% | {failed} | {lowest} |",
            if per_s > 0.0 {
                format!("{per_s:.0}/s")
            } else {
                "none".to_string()
            }
        ));
        rows.push(vec![
            format!("{per_s}"),
            format!("{during:.1}"),
            format!("{after:.1}"),
            failed.to_string(),
            lowest.to_string(),
        ]);
    }
    report.csv(
        "trickle.csv",
        &[
            "trickle_per_s",
            "answered_during_pct",
            "answered_after_pct",
            "failed_calls",
            "lowest_limit",
        ],
        &rows,
    );
}

/// sip-original's INVITE limit now (`policy show --json`: the limit mode sip moves for
/// INVITEs); none set yet (before the controller took the class over) reads as no limit.
fn backlog_limit(net: &TestNet) -> u64 {
    let rows: serde_json::Value =
        serde_json::from_str(&net.gateway_ok(&["policy", "show", "--json"])).expect("json");
    rows.as_array()
        .and_then(|r| r.iter().find(|r| r["class"] == "sip-original"))
        .and_then(|r| r["families"].as_array())
        .and_then(|f| f.iter().find(|f| f["method"] == "invite"))
        .and_then(|f| f["backlog_limit"].as_u64())
        .unwrap_or(u64::MAX)
}
