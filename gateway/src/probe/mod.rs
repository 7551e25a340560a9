//! `gateway probe`: a mini flash crowd (seed 003). Synchronized crowds of clients send one
//! request each to a target the operator names, the crowd growing from a start size by a step;
//! the probe stops when the median response time has risen by a threshold over the first (base)
//! stage, or at the largest crowd. The curve, and the crowd where it tipped, say how much
//! concurrent work the server takes before its clients notice; `--suggest-policy` turns that
//! into class limits (and controller bounds) for the gateway's config.
//!
//! Bounded: crowds of at most [`MAX_CROWD`], at most [`MAX_ROUNDS`] rounds a stage, a timeout per
//! request and a deadline for the whole probe. It sends only to the address given.

mod request;

use std::{
    net::SocketAddr,
    sync::Arc,
    time::{Duration, Instant},
};

pub use request::{Client, ProbeKind, RequestError, TlsSettings};
use serde::Serialize;

/// Largest crowd a probe may grow to.
pub const MAX_CROWD: u32 = 1000;
/// Most rounds (synchronized crowds) a stage may run.
pub const MAX_ROUNDS: u32 = 20;

/// How a probe runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// What to send.
    pub kind: ProbeKind,
    /// Where.
    pub target: SocketAddr,
    /// First crowd size (the base stage).
    pub start: u32,
    /// Growth per stage.
    pub step: u32,
    /// Largest crowd.
    pub max: u32,
    /// Rounds per stage: each a synchronized crowd.
    pub rounds: u32,
    /// Rise of the median over the base stage's that stops the probe.
    pub threshold: Duration,
    /// Per request.
    pub timeout: Duration,
    /// For the whole probe.
    pub deadline: Duration,
}

impl Plan {
    /// The plan's crowd sizes, in order.
    pub fn crowds(&self) -> impl Iterator<Item = u32> + '_ {
        (0..)
            .map(|i| self.start + i * self.step)
            .take_while(|c| *c <= self.max)
    }

    /// Checks the bounds; the error names the argument.
    pub fn check(&self) -> Result<(), String> {
        if self.start == 0 {
            return Err("--start must be at least 1".into());
        }
        if self.step == 0 {
            return Err("--step must be at least 1".into());
        }
        if self.max < self.start || self.max > MAX_CROWD {
            return Err(format!(
                "--max {} out of range {}..={MAX_CROWD}",
                self.max, self.start
            ));
        }
        if self.rounds == 0 || self.rounds > MAX_ROUNDS {
            return Err(format!(
                "--rounds {} out of range 1..={MAX_ROUNDS}",
                self.rounds
            ));
        }
        Ok(())
    }
}

/// One stage: a crowd size and what its requests took.
#[derive(Clone, Debug, Serialize)]
pub struct Stage {
    /// Clients sending at once.
    pub crowd: u32,
    /// Requests answered.
    pub answered: u32,
    /// Requests that failed or timed out.
    pub failed: u32,
    /// Median response time of the answered ones, in milliseconds.
    pub median_ms: f64,
    /// 90th percentile, in milliseconds.
    pub p90_ms: f64,
    /// For `tls-resumed`: handshakes that resumed.
    pub resumed: u32,
}

/// Why the probe stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stop {
    /// The median rose by the threshold over the base stage's.
    Threshold,
    /// Half of a stage's requests failed.
    Failures,
    /// The largest crowd was reached without either.
    MaxCrowd,
    /// The deadline passed.
    Deadline,
}

/// A probe's result.
#[derive(Clone, Debug, Serialize)]
pub struct Curve {
    /// What was sent.
    pub kind: ProbeKind,
    /// Where.
    pub target: SocketAddr,
    /// The threshold, in milliseconds.
    pub threshold_ms: f64,
    /// The stages run, in order.
    pub stages: Vec<Stage>,
    /// Why it stopped.
    pub stop: Stop,
    /// The crowd at which it tipped (the first stage over the threshold, or failing), if any.
    pub tipping_crowd: Option<u32>,
}

impl Curve {
    /// The last stage before the tipping point (or the last stage when none): the most
    /// concurrent work the server took with its clients' times within the threshold.
    pub fn stable(&self) -> Option<&Stage> {
        let n = self.stages.len();
        if self.tipping_crowd.is_some() {
            n.checked_sub(2).map(|i| &self.stages[i])
        } else {
            self.stages.last()
        }
    }
}

/// Whether `stage` tips the probe against the base stage `base`.
pub fn tipped(base: &Stage, stage: &Stage, threshold: Duration) -> Option<Stop> {
    if stage.failed * 2 >= stage.answered + stage.failed && stage.failed > 0 {
        return Some(Stop::Failures);
    }
    (stage.median_ms - base.median_ms >= threshold.as_secs_f64() * 1000.0)
        .then_some(Stop::Threshold)
}

/// The `q`-quantile (0..=1) of sorted `v`, nearest rank.
fn quantile(v: &[f64], q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Runs the probe; `progress` hears of each stage as it ends.
pub async fn run(
    plan: &Plan,
    client: Arc<Client>,
    mut progress: impl FnMut(&Stage),
) -> Result<Curve, RequestError> {
    let started = Instant::now();
    client.prime().await?;
    let mut stages: Vec<Stage> = Vec::new();
    let mut stop = Stop::MaxCrowd;
    let mut n = 0u64;
    for crowd in plan.crowds() {
        if started.elapsed() > plan.deadline {
            stop = Stop::Deadline;
            break;
        }
        let mut times = Vec::new();
        let (mut failed, mut resumed) = (0, 0);
        for _ in 0..plan.rounds {
            let barrier = Arc::new(tokio::sync::Barrier::new(crowd as usize));
            let mut tasks = Vec::new();
            for _ in 0..crowd {
                n += 1;
                let (client, barrier, id) = (client.clone(), barrier.clone(), n);
                tasks.push(tokio::spawn(async move {
                    barrier.wait().await;
                    client.request(id).await
                }));
            }
            for t in tasks {
                match t.await {
                    Ok(Ok((took, r))) => {
                        times.push(took.as_secs_f64() * 1000.0);
                        resumed += u32::from(r);
                    }
                    _ => failed += 1,
                }
            }
        }
        times.sort_by(f64::total_cmp);
        let stage = Stage {
            crowd,
            answered: times.len() as u32,
            failed,
            median_ms: quantile(&times, 0.5),
            p90_ms: quantile(&times, 0.9),
            resumed,
        };
        progress(&stage);
        let tip = stages
            .first()
            .and_then(|base| tipped(base, &stage, plan.threshold))
            .or_else(|| {
                // The base stage itself failing is a tipping point too.
                (stages.is_empty() && stage.failed * 2 >= crowd * plan.rounds)
                    .then_some(Stop::Failures)
            });
        stages.push(stage);
        if let Some(why) = tip {
            stop = why;
            break;
        }
    }
    let tipping_crowd = matches!(stop, Stop::Threshold | Stop::Failures)
        .then(|| stages.last().map(|s| s.crowd))
        .flatten();
    Ok(Curve {
        kind: plan.kind,
        target: plan.target,
        threshold_ms: plan.threshold.as_secs_f64() * 1000.0,
        stages,
        stop,
        tipping_crowd,
    })
}

/// The config section the curve implies: the class the kind belongs to held at the stable
/// crowd (its backlog), with a rate by Little's law (the stable crowd over its median time),
/// and controller bounds around it. `None` without a stable stage.
pub fn suggest_policy(curve: &Curve) -> Option<String> {
    let stable = curve.stable()?;
    let backlog = u64::from(stable.crowd);
    let rate = (f64::from(stable.crowd) / (stable.median_ms / 1000.0).max(1e-3)).floor() as u64;
    let why = format!(
        "# from a probe of {} ({}): stable at a crowd of {} (median {:.1} ms){}",
        curve.target,
        curve.kind.name(),
        stable.crowd,
        stable.median_ms,
        curve
            .tipping_crowd
            .map_or(" and never tipped: a lower bound".to_owned(), |c| format!(
                ", tipped at {c}"
            ))
    );
    Some(match curve.kind {
        ProbeKind::SipOptions | ProbeKind::SipInvite => format!(
            "{why}\npolicy:\n  sip-original: {{backlog: {backlog}}}\n  sip-retransmission: {{backlog: {}}}\ncontroller:\n  classes:\n    sip-original: {{mode: sip, min: 1, max: {}}}\n",
            (backlog / 2).max(1),
            backlog * 2
        ),
        ProbeKind::TlsResumed => {
            format!("{why}\npolicy:\n  tls-resumed: {{backlog: {backlog}}}\n")
        }
        ProbeKind::TlsNew | ProbeKind::HttpGet => format!(
            "{why}\npolicy:\n  tls-new: {{backlog: {backlog}, rate: {rate}, burst: {backlog}}}\ncontroller:\n  classes:\n    tls-new: {{mode: tls, min: 1, max: {}}}\n",
            rate * 2
        ),
    })
}

/// Draws the curve into a PNG file: median and p90 response time by crowd, and the tipping
/// point marked.
pub fn plot(curve: &Curve, path: &std::path::Path) -> Result<(), crate::plot::PlotError> {
    use crate::plot::{Chart, Series};
    let line = |name: &str, f: fn(&Stage) -> f64| Series {
        name: name.to_owned(),
        points: curve
            .stages
            .iter()
            .map(|s| (f64::from(s.crowd), f(s)))
            .collect(),
    };
    let mut series = vec![line("median", |s| s.median_ms), line("p90", |s| s.p90_ms)];
    // The stop line: the base stage's median plus the threshold.
    if let (Some(first), Some(last)) = (curve.stages.first(), curve.stages.last()) {
        let stop = first.median_ms + curve.threshold_ms;
        series.push(Series {
            name: "base median + threshold".to_owned(),
            points: vec![
                (f64::from(first.crowd), stop),
                (f64::from(last.crowd), stop),
            ],
        });
    }
    let title = format!(
        "probe of {} ({}), threshold {:.0} ms",
        curve.target,
        curve.kind.name(),
        curve.threshold_ms
    );
    let marker = curve.tipping_crowd.map(|c| (f64::from(c), "tipping point"));
    crate::plot::write_png(
        path,
        &Chart {
            title: &title,
            x_label: "crowd (clients sending at once)",
            y_label: "response time (ms)",
            series: &series,
            marker,
        },
    )
}

/// The curve as a table.
pub fn table(curve: &Curve) -> String {
    let mut out = format!(
        "probe of {} ({}), threshold {:.0} ms over the base stage\n{:>7} {:>9} {:>7} {:>11} {:>9}{}\n",
        curve.target,
        curve.kind.name(),
        curve.threshold_ms,
        "crowd",
        "answered",
        "failed",
        "median ms",
        "p90 ms",
        if curve.kind == ProbeKind::TlsResumed {
            "  resumed"
        } else {
            ""
        }
    );
    for s in &curve.stages {
        out += &format!(
            "{:>7} {:>9} {:>7} {:>11.1} {:>9.1}{}\n",
            s.crowd,
            s.answered,
            s.failed,
            s.median_ms,
            s.p90_ms,
            if curve.kind == ProbeKind::TlsResumed {
                format!("  {:>7}", s.resumed)
            } else {
                String::new()
            }
        );
    }
    out += &match (curve.stop, curve.tipping_crowd) {
        (Stop::Threshold, Some(c)) => {
            format!("tipping point: a crowd of {c} (the median rose by the threshold or more)\n")
        }
        (Stop::Failures, Some(c)) => {
            format!("tipping point: a crowd of {c} (half of its requests failed)\n")
        }
        (Stop::Deadline, _) => "stopped at the deadline, no tipping point seen\n".to_owned(),
        _ => "no tipping point up to the largest crowd\n".to_owned(),
    };
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stage(crowd: u32, median_ms: f64, failed: u32) -> Stage {
        Stage {
            crowd,
            answered: 10 - failed,
            failed,
            median_ms,
            p90_ms: median_ms,
            resumed: 0,
        }
    }

    #[test]
    fn the_stop_rule_compares_with_the_base_stage() {
        let base = stage(5, 20.0, 0);
        let t = Duration::from_millis(100);
        assert_eq!(tipped(&base, &stage(10, 119.0, 0), t), None);
        assert_eq!(
            tipped(&base, &stage(10, 120.0, 0), t),
            Some(Stop::Threshold)
        );
        assert_eq!(tipped(&base, &stage(10, 30.0, 5), t), Some(Stop::Failures));
        assert_eq!(tipped(&base, &stage(10, 30.0, 4), t), None);
    }

    #[test]
    fn plans_are_bounded_and_suggestions_follow_the_stable_stage() {
        let plan = Plan {
            kind: ProbeKind::SipOptions,
            target: "10.0.0.1:5060".parse().unwrap(),
            start: 5,
            step: 5,
            max: 22,
            rounds: 3,
            threshold: Duration::from_millis(100),
            timeout: Duration::from_secs(5),
            deadline: Duration::from_secs(60),
        };
        assert_eq!(plan.crowds().collect::<Vec<_>>(), [5, 10, 15, 20]);
        assert!(plan.check().is_ok());
        assert!(
            Plan {
                max: 2000,
                ..plan.clone()
            }
            .check()
            .unwrap_err()
            .contains("--max 2000")
        );
        assert!(
            Plan {
                rounds: 0,
                ..plan.clone()
            }
            .check()
            .is_err()
        );
        let curve = Curve {
            kind: ProbeKind::SipOptions,
            target: plan.target,
            threshold_ms: 100.0,
            stages: vec![stage(5, 20.0, 0), stage(10, 60.0, 0), stage(15, 130.0, 0)],
            stop: Stop::Threshold,
            tipping_crowd: Some(15),
        };
        assert_eq!(curve.stable().unwrap().crowd, 10);
        let yaml = suggest_policy(&curve).unwrap();
        assert!(yaml.contains("sip-original: {backlog: 10}"), "{yaml}");
        assert!(yaml.contains("sip-retransmission: {backlog: 5}"), "{yaml}");
        assert!(yaml.contains("max: 20"), "{yaml}");
        // The suggestion is a config the gateway reads.
        let body: String = yaml
            .lines()
            .filter(|l| !l.starts_with('#'))
            .collect::<Vec<_>>()
            .join("\n");
        let full = format!("services:\n  - {{kind: sip, port: 5060}}\n{body}\n");
        crate::config::Config::parse(&full, "suggested.yaml").unwrap();
        assert!(table(&curve).contains("tipping point: a crowd of 15"));
    }
}
