//! The control laws, pure (mode `sip`'s is [`super::queue`]): each takes what one interval showed and returns the limit it wants,
//! with the reason. No I/O, no clock: the daemon's loop (`super::Controller`) and the simulator
//! (`super::sim`) feed them alike.

use std::time::Duration;

use gateway_common::reasons::Reason;

use super::floor::Floor;

/// A limit the law wants, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Decision {
    /// The new limit.
    pub limit: u64,
    /// Why.
    pub reason: Reason,
}

/// Mode `tls` (seed 000): resumed handshakes first; new handshakes get the CPU left. Per
/// interval, the new-handshake budget is (CPU target x cores x interval - resumed handshakes x
/// a resumed handshake's cost) / a full handshake's cost, set as tls-new's rate.
///
/// "Resumed first" is also held where it shows: the resumed handshakes' service time (a
/// hello's admission to the server's first flight). The law keeps its floor, the time they take
/// unqueued (the lowest interval median over a window, [`Floor`]), and allows them to wait
/// `wait` full handshakes' time beyond it. When two intervals in a row have their median over
/// that allowance, resumed clients are queueing behind full handshakes, and tls-new's rate is
/// cut by the ratio of the allowance to the measured time (at most by half an interval); one
/// interval over is taken for noise.
///
/// The floor is re-measured where it can be stale, as Envoy's adaptive concurrency re-measures
/// its minimum RTT at a small limit: while tls-new is being refused, the law closes it for one
/// interval every [`Self::PROBE_EVERY`] intervals (and at the first refusals), and what resumed
/// handshakes took then becomes the floor; so does an interval over the allowance in which new
/// handshakes took under [`Self::MIN_NEW_SHARE`] of the CPUs (they cannot have caused it). A
/// flood's own cost that no rate removes (refused hellos still reach the server's kernel and
/// its accept queue) then raises the floor, and the guard does not cut new handshakes for it. Without
/// refusals the law never probes: nothing arriving is turned away for it.
#[derive(Clone, Debug)]
pub struct HandshakeBudgetLaw {
    cpu_target: f64,
    cores: f64,
    min: u64,
    max: u64,
    rate: u64,
    /// Full handshakes' time a resumed handshake may wait beyond its floor.
    wait: f64,
    floor: Floor,
    /// The allowance of the last interval.
    allowance: Option<Duration>,
    /// Whether the last interval was over the allowance (with new handshakes to blame).
    was_over: bool,
    /// Intervals since the floor was last probed.
    since_probe: usize,
    /// The rate to return to after the probing interval now running.
    probing: Option<u64>,
}

/// The costs the budget divides by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandshakeCosts {
    /// CPU time of a full handshake.
    pub full: Duration,
    /// CPU time of a resumed handshake.
    pub resumed: Duration,
}

/// What one interval showed the `tls` law.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct HandshakeObservation {
    /// The interval's length.
    pub interval: Duration,
    /// Resumed handshakes admitted in the interval.
    pub resumed: u64,
    /// New handshakes admitted in the interval.
    pub new: u64,
    /// New hellos refused in the interval.
    pub refused: u64,
    /// How busy the server's CPUs were (0 to 1 of all cores); `None` when not measured.
    pub busy: Option<f64>,
    /// The median service time of the resumed handshakes answered in the interval; `None` with
    /// too few of them.
    pub resumed_time: Option<Duration>,
}

impl HandshakeBudgetLaw {
    /// The default wait a resumed handshake is allowed beyond its floor, as the configuration
    /// has it ([`crate::config::DEFAULT_RESUMED_WAIT`]).
    pub const WAIT: f64 = crate::config::DEFAULT_RESUMED_WAIT;

    /// Intervals the resumed handshakes' floor looks back over (60 s at the default interval
    /// of 100 ms).
    pub const FLOOR_WINDOW: usize = 600;

    /// Intervals between two probes of the floor while tls-new is being refused (30 s at the
    /// default interval): one interval in 300 with new hellos refused.
    pub const PROBE_EVERY: usize = 300;

    /// The share of the CPUs under which new handshakes are not blamed for resumed ones'
    /// wait: a wait over the allowance then is the floor now (a flood's cost that no rate
    /// removes), not a reason to cut.
    pub const MIN_NEW_SHARE: f64 = 0.05;

    /// A law keeping handshakes within `cpu_target` (0 to 1) of `cores` CPUs, with tls-new's rate
    /// within `min..=max` per second and the default [`Self::WAIT`].
    pub fn new(cpu_target: f64, cores: f64, min: u64, max: u64) -> Self {
        HandshakeBudgetLaw {
            cpu_target,
            cores,
            min,
            max,
            rate: max,
            wait: Self::WAIT,
            floor: Floor::new(Self::FLOOR_WINDOW),
            allowance: None,
            was_over: false,
            since_probe: Self::PROBE_EVERY,
            probing: None,
        }
    }

    /// The same law allowing resumed handshakes `wait` full handshakes' time (above 0) beyond
    /// their floor.
    pub fn with_wait(self, wait: f64) -> Self {
        HandshakeBudgetLaw { wait, ..self }
    }

    /// The rate now.
    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Starts from `rate` (an operator's value, or a previous controller's).
    pub fn reset(&mut self, rate: u64) {
        self.rate = rate.clamp(self.min, self.max);
    }

    /// The service time resumed handshakes were held under in the last interval (their floor
    /// plus the allowed wait); `None` before any was measured.
    pub fn resumed_allowance(&self) -> Option<Duration> {
        self.allowance
    }

    /// One interval: the new rate of tls-new if it changed.
    ///
    /// The budget formula counts handshakes only. What it leaves out (accepting, relaying,
    /// refusing) shows in `busy`: over the CPU target, the rate goes to the lower of the formula
    /// and the rate scaled by target / busy; under it, it grows back toward the formula by a
    /// tenth per interval. Resumed handshakes over their allowance cut the rate first.
    pub fn step(&mut self, o: &HandshakeObservation, costs: HandshakeCosts) -> Option<Decision> {
        self.since_probe = self.since_probe.saturating_add(1);
        let over = self
            .allowance
            .zip(o.resumed_time)
            .filter(|(allowed, took)| took > allowed);
        // The share of the CPUs new handshakes took in the interval: under
        // [`Self::MIN_NEW_SHARE`] they cannot be what resumed ones waited for.
        let new_share = o.new as f64 * costs.full.as_secs_f64()
            / (self.cores * o.interval.as_secs_f64()).max(1e-9);
        let probed = self.probing.is_some();
        let not_theirs = over.is_some() && new_share < Self::MIN_NEW_SHARE;
        if (probed || not_theirs) && o.resumed_time.is_some() {
            // Measured with (almost) no new handshake ahead: the floor now.
            self.floor.reset(o.resumed_time);
        } else {
            self.floor.push(o.resumed_time);
        }
        self.allowance = self.floor.get().map(|f| f + costs.full.mul_f64(self.wait));
        // Cut for a wait that lasts: two intervals over in a row, and new handshakes there to
        // have caused it (an interval that ends a probe returns below, before any cut).
        let cut = over.filter(|_| self.was_over && !not_theirs);
        self.was_over = over.is_some() && !not_theirs;
        if let Some(rate) = self.probing.take() {
            return self.set(rate, Reason::Probe);
        }
        if o.refused > 0 && self.since_probe >= Self::PROBE_EVERY && self.rate > self.min {
            self.since_probe = 0;
            self.probing = Some(self.rate);
            return self.set(self.min, Reason::Probe);
        }
        let secs = o.interval.as_secs_f64();
        let budget =
            self.cpu_target * self.cores * secs - o.resumed as f64 * costs.resumed.as_secs_f64();
        let full = costs.full.as_secs_f64().max(1e-6);
        let formula = (budget.max(0.0) / full / secs).floor() as u64;
        let rate = self.rate.min(self.max) as f64;
        let (per_second, reason) = if let Some((allowed, took)) = cut {
            let gradient = (allowed.as_secs_f64() / took.as_secs_f64()).max(0.5);
            (
                formula.min((rate * gradient).floor() as u64),
                Reason::ResumedWait,
            )
        } else {
            let grown = match o.busy {
                Some(u) if u > self.cpu_target => {
                    formula.min((rate * self.cpu_target / u).floor() as u64)
                }
                Some(_) => formula.min(((rate * 1.1).ceil() as u64).saturating_add(1)),
                None => formula,
            };
            (grown, Reason::Budget)
        };
        self.set(per_second, reason)
    }

    /// One interval with no handshake cost measured yet: the rate grows by a tenth and one, as
    /// under the CPU target, so a class handed to the controller closed (0) reopens and admits
    /// the full handshakes whose costs the budget needs.
    pub fn grow_unmeasured(&mut self) -> Option<Decision> {
        let grown = ((self.rate as f64 * 1.1).ceil() as u64).saturating_add(1);
        self.set(grown, Reason::Headroom)
    }

    /// Sets the rate (within the bounds): the decision if it changed.
    fn set(&mut self, rate: u64, reason: Reason) -> Option<Decision> {
        let wanted = rate.clamp(self.min, self.max);
        if wanted == self.rate {
            return None;
        }
        self.rate = wanted;
        Some(Decision {
            limit: wanted,
            reason,
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
