//! SIPp as the test client: the transaction-matching UAC scenario (`tests/sip_uac.xml`, T1
//! 500 ms) run from the peer namespace at a fixed call rate, bounded in calls and time.

use std::{collections::HashMap, path::Path, process::Command};

use crate::netns::{GW_V4, PEER_V4, TestNet};

/// The UAC scenario.
pub const UAC: &str = include_str!("../sip_uac.xml");

/// What one SIPp run reported.
#[derive(Debug, Default)]
pub struct UacRun {
    /// Successful calls in each second (SIPp's periodic `SuccessfulCall(P)`).
    pub successful_per_second: Vec<f64>,
    /// The cumulative counters at the end (`...(C)` columns, without the suffix, and the
    /// histograms).
    pub totals: HashMap<String, u64>,
}

impl UacRun {
    /// Successful calls per second averaged over seconds `from..to`.
    pub fn goodput(&self, from: usize, to: usize) -> f64 {
        let window: Vec<f64> = self
            .successful_per_second
            .iter()
            .skip(from)
            .take(to.saturating_sub(from))
            .copied()
            .collect();
        window.iter().sum::<f64>() / window.len().max(1) as f64
    }

    /// A cumulative counter (`FailedCall`, `Retransmissions`, ...), 0 when absent.
    pub fn total(&self, name: &str) -> u64 {
        self.totals.get(name).copied().unwrap_or(0)
    }
}

/// Runs the UAC against GW_V4:5060 at `rate` calls per second for `seconds` seconds (and at
/// most five more for the last calls), working in `dir`.
pub fn run_uac(net: &TestNet, dir: &Path, rate: u64, seconds: u64) -> UacRun {
    let scenario = dir.join("uac.xml");
    std::fs::write(&scenario, UAC).unwrap();
    let stats = dir.join("uac.csv");
    let _ = Command::new("ip")
        .args(["netns", "exec", &net.peer_ns, "sipp", "-sf"])
        .arg(&scenario)
        .arg(format!("{GW_V4}:5060"))
        .args(["-i", PEER_V4, "-p", "5061"])
        .args([
            "-r",
            &rate.to_string(),
            "-m",
            &(rate * seconds).to_string(),
            "-l",
            "1000000",
        ])
        .args([
            "-nostdin",
            "-timeout",
            &format!("{}s", seconds + 5),
            "-timeout_error",
        ])
        .args(["-trace_stat", "-fd", "1", "-stf"])
        .arg(&stats)
        .current_dir(dir)
        .output()
        .expect("sipp (cargo xtask setup installs sip-tester)");
    let text = std::fs::read_to_string(&stats).unwrap_or_default();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split(';').collect()).collect();
    let Some(header) = rows.first() else {
        return UacRun::default();
    };
    let ok = header
        .iter()
        .position(|h| *h == "SuccessfulCall(P)")
        .expect("SuccessfulCall(P) column");
    let successful_per_second = rows[1..]
        .iter()
        .filter_map(|r| r.get(ok).and_then(|v| v.parse().ok()))
        .collect();
    let last = rows.last().unwrap();
    let totals = header
        .iter()
        .zip(last.iter())
        .filter_map(|(k, v)| {
            // Cumulative columns; the histograms (`CallLengthRepartition_<10`, ...) have no
            // suffix and are cumulative too.
            let name = k
                .strip_suffix("(C)")
                .or_else(|| (!k.ends_with("(P)")).then_some(*k))?;
            v.parse().ok().map(|v| (name.to_string(), v))
        })
        .collect();
    UacRun {
        successful_per_second,
        totals,
    }
}
