//! The control laws, pure: each takes what one interval showed and returns the limit it wants,
//! with the reason. No I/O, no clock: the daemon's loop (`super::Controller`) and the simulator
//! (`super::sim`) feed them alike.

use std::time::Duration;

/// Why a limit moved (`ClassPolicy::reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The service time went over the target: the limit is cut to the backlog that meets it.
    OverTarget = 1,
    /// Admitted units expired unanswered: the server is not keeping up.
    Expired = 2,
    /// The service time is under the target: the limit grows by a tenth (or 1).
    Headroom = 3,
    /// The CPU budget left after resumed handshakes, divided by a full handshake's cost.
    Budget = 4,
    /// The delay ratio between two classes moved away from its set point.
    Ratio = 5,
}

impl Reason {
    /// Every reason, by id order.
    pub const ALL: [Reason; 5] = [
        Reason::OverTarget,
        Reason::Expired,
        Reason::Headroom,
        Reason::Budget,
        Reason::Ratio,
    ];

    /// The reason of id `id` (`Reason as u32`).
    pub fn from_id(id: u32) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| *r as u32 == id)
    }

    /// Its name, as `policy show` and the metrics spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Reason::OverTarget => "over-target",
            Reason::Expired => "expired",
            Reason::Headroom => "headroom",
            Reason::Budget => "budget",
            Reason::Ratio => "ratio",
        }
    }
}

/// What one interval showed of one class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Observation {
    /// The interval's length.
    pub interval: Duration,
    /// Units admitted in the interval.
    pub admitted: u64,
    /// Units the server answered in the interval.
    pub completed: u64,
    /// Units that expired unanswered in the interval.
    pub expired: u64,
    /// Arrivals refused in the interval.
    pub refused: u64,
    /// Units outstanding at the interval's end.
    pub backlog: u64,
    /// The 90th percentile of the service times (admission to the server's first answer) of the
    /// units answered in the interval; `None` when none was.
    pub service_p90: Option<Duration>,
}

/// A limit the law wants, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The new limit.
    pub limit: u64,
    /// Why.
    pub reason: Reason,
}

impl Observation {
    /// The service time a unit admitted now can expect: the larger of what the interval's
    /// answers took (a lagging signal) and the backlog divided by the rate the server answered
    /// at (a leading one, by Little's law); `None` with neither.
    pub fn delay(&self) -> Option<Duration> {
        let ahead = (self.completed > 0).then(|| {
            self.interval
                .mul_f64(self.backlog as f64 / self.completed as f64)
        });
        match (self.service_p90, ahead) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Mode `sip`: holds a class's service time under a target by moving its backlog limit. Over
/// the target ([`Observation::delay`]) the limit is cut at once, by at least a quarter, to what
/// Little's law says meets the target: the backlog now times target / delay. After expiries it
/// is cut by a quarter. Under the target, it grows by a tenth (at least 1) per interval, so it
/// relaxes when the load goes and probes for capacity the server gained.
#[derive(Clone, Copy, Debug)]
pub struct ServiceTimeLaw {
    target: Duration,
    min: u64,
    max: u64,
    limit: u64,
}

impl ServiceTimeLaw {
    /// A law holding `target`, with the limit kept within `min..=max`, starting at `initial`.
    pub fn new(target: Duration, min: u64, max: u64, initial: u64) -> Self {
        ServiceTimeLaw {
            target,
            min,
            max,
            limit: initial.clamp(min, max),
        }
    }

    /// The limit now.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Starts from `limit` (for example, an operator's value just released to the controller).
    pub fn reset(&mut self, limit: u64) {
        self.limit = limit.clamp(self.min, self.max);
    }

    /// One interval: the new limit if it changed.
    pub fn step(&mut self, o: &Observation) -> Option<Decision> {
        let over = o.delay().filter(|t| *t > self.target);
        let (wanted, reason) = if let Some(measured) = over {
            // Little: the backlog that meets the target at the rate the server completes now.
            let ratio = self.target.as_secs_f64() / measured.as_secs_f64();
            let by_little = (o.backlog.max(1) as f64 * ratio).floor() as u64;
            (
                by_little.min(self.limit.saturating_mul(3) / 4),
                Reason::OverTarget,
            )
        } else if o.expired > 0 {
            (self.limit.saturating_mul(3) / 4, Reason::Expired)
        } else if o.service_p90.is_some() || o.backlog == 0 {
            let grown = self.limit.saturating_add((self.limit / 10).max(1));
            (grown, Reason::Headroom)
        } else {
            // Work outstanding and nothing answered in a whole interval, nothing expired yet:
            // no evidence either way.
            return None;
        };
        let wanted = wanted.clamp(self.min, self.max);
        if wanted == self.limit {
            return None;
        }
        self.limit = wanted;
        Some(Decision {
            limit: wanted,
            reason,
        })
    }
}

/// Mode `tls` (seed 000): resumed handshakes first; new handshakes get the CPU left. Per
/// interval, the new-handshake budget is (CPU target x cores x interval - resumed handshakes x
/// a resumed handshake's cost) / a full handshake's cost, set as tls-new's rate.
#[derive(Clone, Copy, Debug)]
pub struct HandshakeBudgetLaw {
    cpu_target: f64,
    cores: f64,
    min: u64,
    max: u64,
    rate: u64,
}

/// The costs the budget divides by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandshakeCosts {
    /// CPU time of a full handshake.
    pub full: Duration,
    /// CPU time of a resumed handshake.
    pub resumed: Duration,
}

impl HandshakeBudgetLaw {
    /// A law keeping handshakes within `cpu_target` (0 to 1) of `cores` CPUs, with tls-new's rate
    /// within `min..=max` per second.
    pub fn new(cpu_target: f64, cores: f64, min: u64, max: u64) -> Self {
        HandshakeBudgetLaw {
            cpu_target,
            cores,
            min,
            max,
            rate: max,
        }
    }

    /// The rate now.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Starts from `rate` (an operator's value, or a previous controller's).
    pub fn reset(&mut self, rate: u64) {
        self.rate = rate.clamp(self.min, self.max);
    }

    /// One interval of `interval` in which `resumed` resumed handshakes were admitted and the
    /// server's CPUs were `busy` (0 to 1 of all `cores`; `None` when not measured): the new rate
    /// of tls-new if it changed.
    ///
    /// The budget formula counts handshakes only. What it leaves out (accepting, relaying,
    /// refusing) shows in `busy`: over the CPU target, the rate goes to the lower of the formula
    /// and the rate scaled by target / busy; under it, it grows back toward the formula by a
    /// tenth per interval.
    pub fn step(
        &mut self,
        interval: Duration,
        resumed: u64,
        costs: HandshakeCosts,
        busy: Option<f64>,
    ) -> Option<Decision> {
        let budget = self.cpu_target * self.cores * interval.as_secs_f64()
            - resumed as f64 * costs.resumed.as_secs_f64();
        let full = costs.full.as_secs_f64().max(1e-6);
        let formula = (budget.max(0.0) / full / interval.as_secs_f64()).floor() as u64;
        let rate = self.rate.min(self.max) as f64;
        let per_second = match busy {
            Some(u) if u > self.cpu_target => {
                formula.min((rate * self.cpu_target / u).floor() as u64)
            }
            Some(_) => formula.min(((rate * 1.1).ceil() as u64).saturating_add(1)),
            None => formula,
        };
        let wanted = per_second.clamp(self.min, self.max);
        if wanted == self.rate {
            return None;
        }
        self.rate = wanted;
        Some(Decision {
            limit: wanted,
            reason: Reason::Budget,
        })
    }
}

/// Mode `pdd` (seed 002, proportional delay differentiation): a PI controller holding the ratio
/// of two classes' delays (low-priority over high-priority) at a set point, by moving the share
/// of a capacity the high-priority class gets.
#[derive(Clone, Copy, Debug)]
pub struct DelayRatioLaw {
    set_point: f64,
    kp: f64,
    ki: f64,
    previous: f64,
    share: f64,
    bounds: (f64, f64),
}

impl DelayRatioLaw {
    /// Default bounds of the high-priority share.
    const SHARE: (f64, f64) = (0.05, 0.95);

    /// A law holding delay(low) / delay(high) at `set_point` (above 1), starting from an even
    /// share.
    pub fn new(set_point: f64) -> Self {
        DelayRatioLaw {
            set_point,
            kp: 0.1,
            ki: 0.05,
            previous: 0.0,
            share: 0.5,
            bounds: Self::SHARE,
        }
    }

    /// The same law with the high-priority share kept within `lo..=hi` (0 to 1), starting
    /// halfway between them.
    pub fn within(self, lo: f64, hi: f64) -> Self {
        let (lo, hi) = (lo.clamp(0.0, 1.0), hi.clamp(0.0, 1.0));
        DelayRatioLaw {
            bounds: (lo, hi.max(lo)),
            share: f64::midpoint(lo, hi.max(lo)),
            ..self
        }
    }

    /// The high-priority class's share of the capacity now.
    pub fn share(&self) -> f64 {
        self.share
    }

    /// One interval with the two classes' delays: the new share (an incremental PI on the
    /// relative error of the ratio). A ratio under the set point (the classes too alike) gives
    /// the high class more; over it, less.
    pub fn step(&mut self, high: Duration, low: Duration) -> f64 {
        let (h, l) = (high.as_secs_f64(), low.as_secs_f64());
        if h <= 0.0 || l <= 0.0 {
            return self.share;
        }
        let error = (self.set_point - l / h) / self.set_point;
        let (lo, hi) = self.bounds;
        self.share =
            (self.share + self.kp * (error - self.previous) + self.ki * error).clamp(lo, hi);
        self.previous = error;
        self.share
    }
}
