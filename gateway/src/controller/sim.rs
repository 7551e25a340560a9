//! A fast, deterministic simulator of the loops the controller closes (no kernel, no clock):
//! a server behind the gateway's admission, stepped one millisecond at a time ([`SipSim`]), and the
//! controller's laws stepped once per interval. The unit tests drive it through load changes;
//! the controller benchmark reports its convergence times.

use std::time::Duration;

use super::law::{DelayRatioLaw, HandshakeBudgetLaw, HandshakeCosts, HandshakeObservation};

mod sip;
pub use sip::{Answer, Limits, SipSim, Step};

/// A TLS server's CPU: resumed-session clients in a closed loop and a flood of new handshakes
/// share `cores` CPUs. Each client thinks, then fetches: the fetch takes `fetch` plus the time
/// its connection waits in the server's queue, `visits` times (the hello, the request, ...). A
/// visit waits as in an M/D/1 queue at the CPUs' load (rho x mean service / (2 (1 - rho))), so
/// the clients' rate falls as full handshakes fill the CPUs. What is admitted beyond the CPUs'
/// capacity is served in proportion.
#[derive(Clone, Copy, Debug)]
pub struct TlsSim {
    /// CPUs.
    pub cores: f64,
    /// Handshake costs.
    pub costs: HandshakeCosts,
    /// Resumed-session clients.
    pub clients: f64,
    /// Each client's pause between fetches.
    pub think: Duration,
    /// A fetch's time with no queue at the server (network, the client's own work).
    pub fetch: Duration,
    /// Waits in the server's queue per fetch.
    pub visits: f64,
    /// New handshakes the flood sends per second.
    pub flood: f64,
    /// CPU each admitted new connection costs beyond its handshake (accept, relay), which the
    /// budget formula does not know of.
    pub overhead: Duration,
}

/// What one interval of a [`TlsSim`] showed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TlsStep {
    /// Resumed handshakes served per second.
    pub resumed_per_s: f64,
    /// New handshakes served per second.
    pub new_per_s: f64,
    /// How busy the CPUs were, 0 to 1.
    pub busy: f64,
    /// A resumed handshake's service time (its wait and its own cost).
    pub resumed_time: Duration,
}

impl TlsSim {
    /// One interval with tls-new limited to `new_rate` per second.
    pub fn run(&self, new_rate: u64) -> TlsStep {
        let new = self.flood.min(new_rate as f64);
        let full = (self.costs.full + self.overhead).as_secs_f64();
        let resumed_cost = self.costs.resumed.as_secs_f64();
        // The closed loop's fixed point: the clients' rate sets the load, the load their wait.
        let (mut resumed, mut wait, mut rho) = (0.0, 0.0, 0.0);
        for _ in 0..50 {
            let cycle = self.think.as_secs_f64()
                + self.fetch.as_secs_f64()
                + resumed_cost
                + self.visits * wait;
            resumed = self.clients / cycle.max(1e-9);
            let work = new * full + resumed * resumed_cost;
            rho = work / self.cores;
            let mean = work / (new + resumed).max(1e-9);
            // Past saturation the queue grows without bound: a second's wait stands for it.
            wait = if rho < 0.999 {
                (rho * mean / (2.0 * (1.0 - rho))).min(1.0)
            } else {
                1.0
            };
        }
        let served = (1.0 / rho.max(1e-12)).min(1.0);
        TlsStep {
            resumed_per_s: resumed * served,
            new_per_s: new * served,
            busy: rho.min(1.0),
            resumed_time: Duration::from_secs_f64(resumed_cost + wait),
        }
    }
}

/// Two classes sharing a server: each gets its share of the capacity, and waits as in an M/M/1
/// queue of that rate (1 / (rate - arrivals)).
#[derive(Clone, Copy, Debug)]
pub struct PddSim {
    /// Capacity, units per second.
    pub capacity: f64,
    /// High-priority arrivals per second.
    pub high: f64,
    /// Low-priority arrivals per second.
    pub low: f64,
}

impl PddSim {
    /// The two classes' delays with the high class given `share` of the capacity.
    pub fn delays(&self, share: f64) -> (Duration, Duration) {
        let wait = |rate: f64, arrivals: f64| {
            let spare = (rate - arrivals).max(self.capacity * 1e-3);
            Duration::from_secs_f64(1.0 / spare)
        };
        (
            wait(self.capacity * share, self.high),
            wait(self.capacity * (1.0 - share), self.low),
        )
    }

    /// Runs `law` for `intervals` intervals; returns the delay ratio (low / high) of each.
    pub fn run(&self, law: &mut DelayRatioLaw, intervals: usize) -> Vec<f64> {
        (0..intervals)
            .map(|_| {
                let (h, l) = self.delays(law.share());
                law.step(h, l);
                let (h, l) = self.delays(law.share());
                l.as_secs_f64() / h.as_secs_f64()
            })
            .collect()
    }
}

/// Runs a budget law against a [`TlsSim`] for `intervals`; returns each interval's figures.
pub fn run_tls(
    sim: &TlsSim,
    law: &mut HandshakeBudgetLaw,
    interval: Duration,
    intervals: usize,
) -> Vec<TlsStep> {
    (0..intervals)
        .map(|_| {
            let step = sim.run(law.rate());
            let o = HandshakeObservation {
                interval,
                resumed: (step.resumed_per_s * interval.as_secs_f64()) as u64,
                new: (step.new_per_s * interval.as_secs_f64()) as u64,
                refused: ((sim.flood - step.new_per_s).max(0.0) * interval.as_secs_f64()) as u64,
                busy: Some(step.busy),
                resumed_time: Some(step.resumed_time),
            };
            law.step(&o, sim.costs);
            step
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTERVAL: Duration = Duration::from_millis(100);
    /// The tls-overload benchmark's rig: one core, a full handshake 222 µs and a resumed one
    /// 120 µs, 16 sessions thinking 20 ms, a fetch of 4.5 ms unqueued and 4 waits in the
    /// server's queue per fetch; each admitted new connection costs half a handshake more than
    /// the formula counts (accept, relay): the CPU feedback finds it.
    fn rig(flood: f64) -> TlsSim {
        let costs = HandshakeCosts {
            full: Duration::from_micros(222),
            resumed: Duration::from_micros(120),
        };
        TlsSim {
            cores: 1.0,
            costs,
            clients: 16.0,
            think: Duration::from_millis(20),
            fetch: Duration::from_micros(4500),
            visits: 4.0,
            flood,
            overhead: costs.full / 2,
        }
    }

    /// The rig's full-handshake capacity.
    fn capacity() -> f64 {
        1.0 / rig(0.0).costs.full.as_secs_f64()
    }

    #[test]
    fn resumed_sessions_keep_their_throughput_while_new_handshakes_flood() {
        let unloaded = rig(0.0).run(u64::MAX);
        let mut law = HandshakeBudgetLaw::new(0.8, 1.0, 0, 1_000_000);
        let steps = run_tls(&rig(5.0 * capacity()), &mut law, INTERVAL, 50);
        // The first interval runs with the law's start (no limit); within five the budget holds.
        for (i, s) in steps.iter().enumerate().skip(5) {
            assert!(
                s.resumed_per_s >= 0.97 * unloaded.resumed_per_s,
                "interval {i}: {s:?} of {unloaded:?}"
            );
            // Resumed handshakes are held near their allowance (half a full handshake's wait
            // beyond their unqueued time).
            let allowed = unloaded.resumed_time + rig(0.0).costs.full / 2;
            assert!(
                s.resumed_time <= allowed.mul_f64(1.3),
                "interval {i}: {s:?} of {unloaded:?}"
            );
            // And the capacity left still serves new handshakes.
            assert!(s.new_per_s >= 0.2 * capacity(), "interval {i}: {s:?}");
        }
        let mut open = HandshakeBudgetLaw::new(1.0, 1.0, u64::MAX, u64::MAX);
        let flooded = run_tls(&rig(5.0 * capacity()), &mut open, INTERVAL, 5);
        assert!(
            flooded[4].resumed_per_s < 0.5 * unloaded.resumed_per_s,
            "no limit: {:?}",
            flooded[4]
        );
    }

    #[test]
    fn the_resumed_wait_guard_gives_resumed_sessions_what_the_cpu_budget_alone_does_not() {
        let unloaded = rig(0.0).run(u64::MAX);
        let share = |wait: f64| {
            let mut law = HandshakeBudgetLaw::new(0.8, 1.0, 0, 1_000_000).with_wait(wait);
            let steps = run_tls(&rig(5.0 * capacity()), &mut law, INTERVAL, 100);
            let n = steps[20..].len() as f64;
            let mean = |f: fn(&TlsStep) -> f64| steps[20..].iter().map(f).sum::<f64>() / n;
            (
                mean(|s| s.resumed_per_s) / unloaded.resumed_per_s,
                mean(|s| s.new_per_s),
                mean(|s| s.busy),
            )
        };
        // The CPU budget alone (an allowed wait no queue reaches) fills the CPU to its target,
        // and the resumed sessions' fetches wait behind full handshakes.
        let (budget_only, new_budget, busy_budget) = share(100.0);
        let (guarded, new_guarded, busy_guarded) = share(HandshakeBudgetLaw::WAIT);
        eprintln!(
            "budget only: {budget_only:.3} of unloaded, {new_budget:.0} new/s, busy {busy_budget:.2}; \
             guarded: {guarded:.3}, {new_guarded:.0} new/s, busy {busy_guarded:.2}"
        );
        assert!(
            (0.75..=0.85).contains(&busy_budget),
            "budget only: busy {busy_budget}"
        );
        assert!(
            guarded > budget_only + 0.02,
            "{guarded} against {budget_only}"
        );
        assert!(guarded >= 0.97, "guarded: {guarded}");
        assert!(
            busy_guarded < busy_budget,
            "{busy_guarded} against {busy_budget}"
        );
        // The guard trades new handshakes for the resumed sessions' wait, not all of them.
        assert!(
            new_guarded >= 0.4 * new_budget,
            "{new_guarded} against {new_budget}"
        );
    }

    #[test]
    fn a_wait_no_rate_removes_does_not_hold_new_handshakes_closed() {
        let costs = rig(0.0).costs;
        let mut law = HandshakeBudgetLaw::new(0.8, 1.0, 1, 1_000_000);
        // Every interval the flood exceeds the rate: `rate` admitted, the rest refused.
        let step = |law: &mut HandshakeBudgetLaw, us: u64| {
            let o = HandshakeObservation {
                interval: INTERVAL,
                resumed: 60,
                new: law.rate().min(100_000) / 10,
                refused: 100,
                busy: Some(0.3),
                resumed_time: Some(Duration::from_micros(us)),
            };
            law.step(&o, costs);
            law.rate()
        };
        // Calm: resumed handshakes take 150 µs; the first refusals probe the floor.
        for _ in 0..30 {
            step(&mut law, 150);
        }
        let open = law.rate();
        assert!(open > 1000, "{open}");
        // One interval over the allowance is noise: no cut.
        step(&mut law, 600);
        assert!(law.rate() >= open, "{} after {open}", law.rate());
        step(&mut law, 150);
        // Now they take 600 µs whatever the rate (a cost of the flood no rate removes): the
        // guard cuts while new handshakes could be the cause, then takes what it sees as the
        // floor and opens again.
        let small = (HandshakeBudgetLaw::MIN_NEW_SHARE / costs.full.as_secs_f64()) as u64;
        let rates: Vec<u64> = (0..80).map(|_| step(&mut law, 600)).collect();
        let lowest = *rates.iter().min().unwrap();
        assert!(lowest < open / 2, "cut: {rates:?}");
        assert!(
            lowest >= small / 2,
            "cut below the blameless share: {rates:?}"
        );
        assert!(*rates.last().unwrap() >= open / 2, "{rates:?}");
        let allowed = law.resumed_allowance().unwrap();
        assert_eq!(allowed, Duration::from_micros(600) + costs.full / 2);
    }

    #[test]
    fn when_the_flood_goes_the_new_handshake_rate_grows_back() {
        let mut law = HandshakeBudgetLaw::new(0.8, 1.0, 0, 1_000_000);
        run_tls(&rig(5.0 * capacity()), &mut law, INTERVAL, 50);
        let held = law.rate();
        assert!((held as f64) < capacity(), "held at {held}");
        // New handshakes at a fifth of capacity: all of them are served again.
        let steps = run_tls(&rig(0.2 * capacity()), &mut law, INTERVAL, 50);
        let last = steps.last().unwrap();
        assert!(
            last.new_per_s >= 0.99 * 0.2 * capacity(),
            "{last:?}, rate {}",
            law.rate()
        );
    }

    #[test]
    fn the_delay_ratio_stays_within_a_tenth_of_its_set_point_through_a_load_change() {
        let mut law = DelayRatioLaw::new(2.0);
        let before = PddSim {
            capacity: 1000.0,
            high: 300.0,
            low: 400.0,
        };
        let settle = before.run(&mut law, 60);
        assert!(
            (settle[59] - 2.0).abs() <= 0.2,
            "settled at {:?}",
            &settle[50..]
        );
        let after = PddSim {
            high: 400.0,
            low: 450.0,
            ..before
        };
        let ratios = after.run(&mut law, 60);
        // Averaged over a second (10 intervals), the ratio stays within 10% of the set point.
        for (i, w) in ratios.windows(10).enumerate() {
            let mean = w.iter().sum::<f64>() / 10.0;
            assert!((mean - 2.0).abs() <= 0.2, "window {i}: {w:?}");
        }
    }
}
