//! `cargo xtask bench probe`: the mini-flash-crowd probe (seed 003) against a SIP server of known
//! capacity (one FIFO worker, 5 ms per INVITE): the curve it measures, the tipping point it
//! reports against the queueing model's, and the policy it suggests.

use std::{net::UdpSocket, time::Duration};

use gateway_tests::{
    have_root,
    netns::{GW_V4, TestNet},
    probe::run_probe,
    report::Report,
    sipserver::SlowSipServer,
};

const SERVICE_MS: f64 = 5.0;
const START: u32 = 2;
const STEP: u32 = 4;
const THRESHOLD_MS: f64 = 100.0;

fn main() {
    if !have_root("probe_bench") {
        std::process::exit(1);
    }
    let mut report = Report::new("probe");
    let net = TestNet::new();
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    let _server = SlowSipServer::start(
        socket,
        4 << 20,
        Duration::from_secs_f64(SERVICE_MS / 1000.0),
        Duration::from_micros(100),
    );
    let plot = report.path("curve.png");
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
            "3",
            "--threshold",
            &format!("{THRESHOLD_MS}ms"),
            "--suggest-policy",
            "--plot",
            plot.to_str().unwrap(),
        ],
    );
    // The model: n synchronized INVITEs on one worker are answered at s, 2s, ..., ns; the median
    // is about (n + 1) / 2 * s.
    let median = |n: u32| f64::from(n + 1) / 2.0 * SERVICE_MS;
    let model = (0..)
        .map(|i| START + i * STEP)
        .find(|n| median(*n) - median(START) >= THRESHOLD_MS)
        .unwrap();
    report.say(format!(
        "# Probe (seed 003)\n\n`gateway probe --kind sip-invite` against a SIP server of one worker taking {SERVICE_MS} ms an INVITE (capacity {:.0}/s): crowds from {START} by {STEP}, 3 rounds a stage, threshold {THRESHOLD_MS} ms over the base stage's median.\n",
        1000.0 / SERVICE_MS
    ));
    report.say(
        "| crowd | median ms | p90 ms | model median ms | failed |\n|---:|---:|---:|---:|---:|",
    );
    let mut rows = Vec::new();
    for s in v["stages"].as_array().unwrap() {
        let crowd = s["crowd"].as_u64().unwrap() as u32;
        let (m, p) = (
            s["median_ms"].as_f64().unwrap(),
            s["p90_ms"].as_f64().unwrap(),
        );
        report.say(format!(
            "| {crowd} | {m:.1} | {p:.1} | {:.1} | {} |",
            median(crowd),
            s["failed"]
        ));
        rows.push(vec![
            crowd.to_string(),
            format!("{m:.2}"),
            format!("{p:.2}"),
            format!("{:.2}", median(crowd)),
        ]);
    }
    report.say(format!(
        "\nTipping point: a crowd of {} (the model: {model}). Suggested:\n\n```yaml\n{}```",
        v["tipping_crowd"],
        v["suggested_policy"].as_str().unwrap_or("(none)\n")
    ));
    report.csv(
        "curve.csv",
        &["crowd", "median_ms", "p90_ms", "model_median_ms"],
        &rows,
    );
    report.say(format!("\nChart: `{}`", report.shown("curve.png")));
}
