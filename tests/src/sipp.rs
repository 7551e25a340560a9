//! SIPp as the test client: the transaction-matching UAC scenario (`tests/sip_uac.xml`, T1
//! 500 ms) run from the peer namespace at a fixed call rate, bounded in calls and time.

use std::{collections::HashMap, path::Path, process::Command};

use crate::netns::{GW_V4, PEER_V4, TestNet};

/// The UAC scenario.
pub const UAC: &str = include_str!("../sip_uac.xml");

/// The source port of forged INVITE `i` ([`forged_invite`]).
pub fn forged_port(i: u32) -> u16 {
    (20_000 + i % 20_000) as u16
}

/// A forged 1 KB INVITE of transaction `i` from the peer to the gateway's SIP port, as a flood
/// sends it: a branch, tag and Call-ID of its own, sent from [`forged_port`].
pub fn forged_invite(i: u32) -> Vec<u8> {
    let mut m = format!(
        "INVITE sip:service@{GW_V4}:5060 SIP/2.0\r\nVia: SIP/2.0/UDP {PEER_V4}:{port};branch=z9hG4bK-flood-{i}\r\n\
From: <sip:flood@{PEER_V4}>;tag=f{i}\r\nTo: <sip:service@{GW_V4}:5060>\r\nCall-ID: flood-{i}@{PEER_V4}\r\n\
CSeq: 1 INVITE\r\nContact: <sip:flood@{PEER_V4}:{port}>\r\nMax-Forwards: 70\r\n\
Content-Type: application/sdp\r\nContent-Length: 600\r\n\r\n",
        port = forged_port(i)
    )
    .into_bytes();
    m.resize(1024, b'v');
    m
}

/// What one SIPp run reported.
#[derive(Debug, Default)]
pub struct UacRun {
    /// Successful calls in each period of about a second (SIPp's periodic `SuccessfulCall(P)`);
    /// the first row is the start and counts none.
    pub successful_per_second: Vec<f64>,
    /// When each of those rows was written (SIPp's `CurrentTime`, seconds since the epoch): a
    /// busy SIPp writes them late, so a row may cover more than a second.
    pub at: Vec<f64>,
    /// The cumulative counters at the end (`...(C)` columns, without the suffix, and the
    /// histograms).
    pub totals: HashMap<String, u64>,
}

impl UacRun {
    /// Successful calls per second over rows `from..to` (about seconds `from..to`): their
    /// calls over the time they cover, from the row before `from` to the last one.
    pub fn goodput(&self, from: usize, to: usize) -> f64 {
        let to = to.min(self.successful_per_second.len()).min(self.at.len());
        let from = from.max(1);
        if from >= to {
            return 0.0;
        }
        let calls: f64 = self.successful_per_second[from..to].iter().sum();
        let span = self.at[to - 1] - self.at[from - 1];
        if span > 0.0 { calls / span } else { 0.0 }
    }

    /// A cumulative counter (`FailedCall`, `Retransmissions`, ...), 0 when absent.
    pub fn total(&self, name: &str) -> u64 {
        self.totals.get(name).copied().unwrap_or(0)
    }
}

/// Runs the UAC against GW_V4:5060 at `rate` calls per second for `seconds` seconds (and at
/// most five more for the last calls), working in `dir`.
pub fn run_uac(net: &TestNet, dir: &Path, rate: u64, seconds: u64) -> UacRun {
    uac(net, dir, rate, rate * seconds, 1_000_000, seconds)
}

/// Runs the UAC in a closed loop: `in_flight` calls at a time, each new one started as one
/// ends (never faster than `rate` calls/s), `calls` calls in all, bounded by `seconds` (and
/// five more). Against a server slower than `rate` this keeps it busy without a queue longer
/// than `in_flight` calls: its throughput is its capacity.
fn run_uac_closed(
    net: &TestNet,
    dir: &Path,
    in_flight: u64,
    rate: u64,
    calls: u64,
    seconds: u64,
) -> UacRun {
    uac(net, dir, rate, calls, in_flight, seconds)
}

/// Calls in flight while a capacity is measured: enough that the server never waits for the
/// next, few enough that none waits near T1 (16 calls of a few ms each).
pub const IN_FLIGHT: u64 = 16;

/// The capacity of the SIP server at GW_V4:5060, measured: SIPp in a closed loop of
/// [`IN_FLIGHT`] calls (a new one as each ends), so that the server is never idle and nothing
/// is resent, for about `seconds` (the calls of `seconds` at `nominal` calls/s, so longer
/// against a server slower than that). Successful calls per second from the third second, and
/// the retransmissions (0 when the measure is clean).
pub fn measure_capacity(net: &TestNet, dir: &Path, nominal: f64, seconds: u64) -> (f64, u64) {
    let run = run_uac_closed(
        net,
        dir,
        IN_FLIGHT,
        (3.0 * nominal) as u64,
        (nominal * seconds as f64) as u64,
        seconds,
    );
    // Without the first two seconds (starting) and the last row (the last calls ending).
    let rows = run.successful_per_second.len().saturating_sub(1);
    (run.goodput(2, rows), run.total("Retransmissions"))
}

fn uac(net: &TestNet, dir: &Path, rate: u64, calls: u64, limit: u64, seconds: u64) -> UacRun {
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
            &calls.to_string(),
            "-l",
            &limit.to_string(),
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
    let now = header
        .iter()
        .position(|h| *h == "CurrentTime")
        .expect("CurrentTime column");
    // Rows with both figures: `CurrentTime` is "date\ttime\tepoch".
    let (successful_per_second, at) = rows[1..]
        .iter()
        .filter_map(|r| {
            let calls: f64 = r.get(ok)?.parse().ok()?;
            let epoch: f64 = r.get(now)?.rsplit('\t').next()?.parse().ok()?;
            Some((calls, epoch))
        })
        .unzip();
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
        at,
        totals,
    }
}
