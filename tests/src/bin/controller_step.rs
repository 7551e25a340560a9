//! `cargo xtask bench` (controller): the step response. A 1.4x overload step against a server
//! whose capacity the gateway is not told, on the simulator (no kernel) and on the real datapath
//! (the daemon's controller, a FIFO SIP server in a namespace, SIPp). The figure is the time from
//! the controller's first queueing delay over the target until it is back under it; then how
//! the delay moves around the target (the share of samples over it).

use std::{
    net::UdpSocket,
    time::{Duration, Instant},
};

use gateway::{
    controller::{
        queue::{Family, QueueLaw},
        sim::SipSim,
    },
    plot::Series,
};
use gateway_tests::{
    daemon::Daemon,
    fresh_temp_dir, have_root,
    metrics::{scrape, value},
    netns::{GW_V4, TestNet},
    report::Report,
    shapes::fast_options,
    sipp::run_uac,
    sipserver::SlowSipServer,
};

const INTERVAL: Duration = Duration::from_millis(100);
const TARGET: Duration = Duration::from_millis(100);
const INVITE_COST: Duration = Duration::from_millis(5);
const OTHER_COST: Duration = Duration::from_micros(200);
const METRICS: u16 = 9478;
const SECONDS: u64 = 6;

/// The simulator: the settling time, and the delays after the step (one per interval).
fn simulated(capacity: f64) -> (Duration, Vec<Duration>) {
    let mut sim = SipSim::fifo(capacity);
    let mut law = QueueLaw::new(TARGET, 1, 10_000, 10_000);
    sim.offer(Family::Invite, 0.5 * capacity);
    for _ in 0..20 {
        let s = sim.run(INTERVAL, &law, Duration::from_millis(500));
        law.step(&s.observation);
    }
    sim.offer(Family::Invite, 1.4 * capacity);
    let p90s: Vec<Duration> = (0..100)
        .map(|_| {
            let s = sim.run(INTERVAL, &law, Duration::from_millis(500));
            law.step(&s.observation);
            law.queue(Family::Invite).unwrap_or_default()
        })
        .collect();
    let times: Vec<Duration> = (0..p90s.len()).map(|i| INTERVAL * (i as u32 + 1)).collect();
    (settling(&times, &p90s), p90s)
}

/// From the first delay over the target to the first later one at or under it (zero if never
/// over; the whole run if never back).
fn settling(times: &[Duration], delays: &[Duration]) -> Duration {
    let Some(over) = delays.iter().position(|d| *d > TARGET) else {
        return Duration::ZERO;
    };
    match delays[over..].iter().position(|d| *d <= TARGET) {
        Some(back) => times[over + back].saturating_sub(times[over]),
        None => times[times.len() - 1].saturating_sub(times[over]),
    }
}

/// After settling: the largest delay, and the share of samples over the target.
fn band(delays: &[Duration]) -> (Duration, f64) {
    let Some(over) = delays.iter().position(|d| *d > TARGET) else {
        return (delays.iter().copied().max().unwrap_or_default(), 0.0);
    };
    let Some(back) = delays[over..].iter().position(|d| *d <= TARGET) else {
        return (Duration::MAX, 1.0);
    };
    let after = &delays[over + back..];
    let above = after.iter().filter(|d| **d > TARGET).count();
    (
        after.iter().copied().max().unwrap_or_default(),
        above as f64 / after.len().max(1) as f64,
    )
}

/// The real datapath: samples the controller's delay input every 50 ms while SIPp steps the
/// load from nothing to 1.4x; returns the settling time and the samples.
fn real() -> (Duration, Vec<(Duration, Duration)>) {
    let net = TestNet::new();
    let dir = fresh_temp_dir("gwt-step");
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    let _server = SlowSipServer::start(socket, 8 << 20, INVITE_COST, OTHER_COST);
    let capacity = 1.0 / (INVITE_COST + OTHER_COST * 2).as_secs_f64();
    let daemon = Daemon::start_config(
        &net,
        &dir,
        &format!(
            "metrics: 127.0.0.1:{METRICS}\nservices:\n  - {{kind: sip, port: 5060}}\ncontroller:\n  classes:\n    sip-original: {{mode: sip, target: 100ms, max: 10000}}\n"
        ),
    );
    let start = Instant::now();
    let samples = std::thread::scope(|s| {
        let load = s.spawn(|| run_uac(&net, &dir, (1.4 * capacity) as u64, SECONDS));
        let mut samples = Vec::new();
        while !load.is_finished() && start.elapsed() < Duration::from_secs(SECONDS + 10) {
            let text = scrape(&net, METRICS);
            let secs = value(
                &text,
                "gateway_controller_delay_seconds",
                &[("class", "sip-original")],
            );
            samples.push((start.elapsed(), Duration::from_secs_f64(secs.max(0.0))));
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = load.join();
        samples
    });
    let _ = daemon.terminate(Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
    // Only the loaded part: until SIPp's last second.
    let loaded: Vec<(Duration, Duration)> = samples
        .into_iter()
        .filter(|(t, _)| *t <= Duration::from_secs(SECONDS))
        .collect();
    let times: Vec<Duration> = loaded.iter().map(|(t, _)| *t).collect();
    let delays: Vec<Duration> = loaded.iter().map(|(_, d)| *d).collect();
    (settling(&times, &delays), loaded)
}

/// The fast-path section of the report.
fn fast_path(report: &mut Report) {
    let alone = fast_options(INVITE_COST, false);
    let beside = fast_options(INVITE_COST, true);
    let (alone, alone_good, beside, beside_good) =
        (alone.p90, alone.goodput, beside.p90, beside.goodput);
    let capacity = 1.0 / INVITE_COST.as_secs_f64();
    report.say(format!(
        "\n# Fast answers of another method (real datapath)\n\nINVITEs at 1.3x a FIFO server of {capacity:.0}/s (5 ms each), nothing configured but the service, alone and beside OPTIONS at ten times their rate answered on a fast path (200 µs). The INVITEs' 90th percentile service time is the NIC's own (`SERVICE_TIMES`, seconds 3..7 of the load); the law of the last stop let their limit climb to 100,000 and held them 1.4 s at the 90th percentile.\n\n| INVITEs | p90 service time | goodput |\n|---|---:|---:|\n| alone | {} ms | {alone_good:.0}/s |\n| beside {} OPTIONS/s | {} ms ({:+.0}%) | {beside_good:.0}/s |",
        alone.as_millis(),
        (13.0 * capacity) as u64,
        beside.as_millis(),
        100.0 * (beside.as_secs_f64() / alone.as_secs_f64().max(1e-6) - 1.0),
    ));
}

/// One interval of the dead-work trace: seconds, the limit the law set, the callers' goodput.
struct TracePoint {
    t: f64,
    limit: u64,
    good: f64,
}

/// The simulator under dead work (issue 28): callers at 80 calls/s to a FIFO server of 185/s;
/// `dead` unanswerable requests a second from 5 s to 20 s; the server stops answering at 22 s
/// and answers again at 26 s; 35 s in all.
fn dead_work_trace(dead: f64) -> Vec<TracePoint> {
    let mut sim = SipSim::fifo(185.0);
    let mut law = QueueLaw::new(TARGET, 1, 10_000, 10_000);
    sim.offer(Family::Invite, 80.0);
    (0..350)
        .map(|i| {
            let t = i as f64 / 10.0;
            sim.offer_dead(if (5.0..20.0).contains(&t) { dead } else { 0.0 });
            sim.set_answering(!(22.0..26.0).contains(&t));
            let s = sim.run(INTERVAL, &law, Duration::from_millis(500));
            law.step(&s.observation);
            TracePoint {
                t: t + 0.1,
                limit: law.family_limit(Family::Invite),
                good: s.good_per_s[Family::Invite as usize],
            }
        })
        .collect()
}

/// The dead-work section of the report: per trickle rate, the callers' goodput and the lowest
/// limit while it lasted, and when the stopped server's class was cut and reopened.
fn dead_work(report: &mut Report) {
    report.say(
        "\n# Dead work on the simulator\n\nCallers at 80 calls/s to a FIFO server of 185/s (5 ms per INVITE), the controller in mode sip (target 100 ms). Unanswerable requests (each holds a place for the 2 s unit timeout, then expires) from 5 s to 20 s; the server stops answering at 22 s and answers again at 26 s.\n",
    );
    report.say("| dead work | callers' goodput, 7-20 s | lowest INVITE limit, 7-20 s | lowest INVITE limit, 22-26 s (server silent) | goodput, 30-35 s |\n|---|---:|---:|---:|---:|");
    let mut lines = Vec::new();
    for dead in [2.0, 10.0, 40.0] {
        let trace = dead_work_trace(dead);
        let within = |a: f64, b: f64| trace.iter().filter(move |p| p.t > a && p.t <= b);
        let mean = |a: f64, b: f64| {
            let v: Vec<f64> = within(a, b).map(|p| p.good).collect();
            v.iter().sum::<f64>() / v.len().max(1) as f64
        };
        let lowest = within(7.0, 20.0).map(|p| p.limit).min().unwrap_or(0);
        let silent = within(22.0, 26.0).map(|p| p.limit).min().unwrap_or(0);
        report.say(format!(
            "| {dead:.0}/s | {:.1}/s | {lowest} | {silent} | {:.1}/s |",
            mean(7.0, 20.0),
            mean(30.0, 35.0)
        ));
        lines.push(Series {
            name: format!("goodput, dead work {dead:.0}/s"),
            points: trace.iter().map(|p| (p.t, p.good)).collect(),
        });
    }
    report.chart(
        "dead_work.png",
        "Dead work on the simulator: callers' goodput (dead work 5-20 s, server silent 22-26 s)",
        ("seconds", "callers' goodput (calls/s)"),
        &lines,
    );
}

fn main() {
    if !have_root("controller_step") {
        std::process::exit(1);
    }
    if std::env::args().nth(1).as_deref() == Some("dead-work") {
        let mut report = Report::new("controller-dead-work");
        dead_work(&mut report);
        return;
    }
    let capacity = 1.0 / (INVITE_COST + OTHER_COST * 2).as_secs_f64();
    let (sim, sim_delays) = simulated(capacity);
    let (real, samples) = real();
    let real_delays: Vec<Duration> = samples.iter().map(|(_, d)| *d).collect();
    let (sim_max, sim_above) = band(&sim_delays);
    let (real_max, real_above) = band(&real_delays);
    let mut report = Report::new("controller");
    report.say(format!(
        "# Controller step response\n\nA 1.4x overload step against a server of {capacity:.0} calls/s the gateway is not told; mode sip, target {TARGET:?}, interval {INTERVAL:?}. The law holds the queueing delay (a method family's median service time above its floor) under the target. Settling time: from the controller's first queueing delay over the target until it is back under it (simulator: per 100 ms interval; real datapath: the `gateway_controller_delay_seconds` gauge sampled every 50 ms). Then: the largest delay and the share of samples over the target for the rest of the run.\n"
    ));
    report.say(
        "| plant | settling time | target | then: largest delay | then: samples over target |\n|---|---:|---:|---:|---:|",
    );
    report.say(format!(
        "| simulator | {} ms | < 200 ms | {} ms | {:.0}% |",
        sim.as_millis(),
        sim_max.as_millis(),
        100.0 * sim_above
    ));
    report.say(format!(
        "| real datapath (FIFO server, SIPp) | {} ms | < 200 ms | {} ms | {:.0}% |",
        real.as_millis(),
        real_max.as_millis(),
        100.0 * real_above
    ));
    let ms = |d: &Duration| d.as_secs_f64() * 1000.0;
    report.csv(
        "delay.csv",
        &["seconds", "delay_ms"],
        &samples
            .iter()
            .map(|(t, d)| vec![format!("{:.3}", t.as_secs_f64()), format!("{:.1}", ms(d))])
            .collect::<Vec<_>>(),
    );
    let end = samples.last().map_or(1.0, |(t, _)| t.as_secs_f64());
    report.chart(
        "delay.png",
        "Controller step response: a 1.4x step against the FIFO server",
        ("seconds", "controller's delay input (ms)"),
        &[
            Series {
                name: "delay (real datapath)".into(),
                points: samples
                    .iter()
                    .map(|(t, d)| (t.as_secs_f64(), ms(d)))
                    .collect(),
            },
            Series {
                name: "target".into(),
                points: vec![(0.0, ms(&TARGET)), (end, ms(&TARGET))],
            },
        ],
    );
    dead_work(&mut report);
    fast_path(&mut report);
}
