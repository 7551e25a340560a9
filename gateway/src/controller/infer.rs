//! Handshake costs of a TLS server the gateway does not terminate, inferred from what the
//! datapath measures of it: each admitted connection's completion time, from its hello's
//! admission to the server's first handshake flight leaving the host (`SERVICE_TIMES`; an
//! alert or a close answered at once is no handshake and is not timed).
//!
//! A server sends its first flight once it has done a handshake's expensive part (the key
//! exchange and, for a full handshake, the signature), so a completion time is that work plus
//! any wait in the server's queue. An interval's median completion time estimates the cost
//! when the server was not queueing; the estimate is the lowest interval median of the last
//! [`WINDOW`] intervals, so an overloaded interval inflates only its own sample, and the budget
//! the estimate leads to keeps the queue short enough for the window to see unqueued
//! handshakes again. Times come from log-linear buckets: within 3.2% of the truth.
//!
//! A quiet server completes few handshakes an interval: intervals are pooled until they hold
//! [`POOL`] completions (at most [`MAX_POOL`] intervals), and the pool's median is one sample
//! of the window. The estimate is the lowest of those medians: a median of few completions
//! varies so much that the lowest of fifty falls well under a handshake's typical cost (with
//! pools of 5 it read a third under the proxy's own measure, of 20 still 28% under beside a
//! stream of refused hellos); of 100, it holds within a quarter. At 20 handshakes a second a
//! cost is inferred within 5 s, before any flood, and the window then spans more time.
//!
//! Pure: the controller feeds it each interval's histogram deltas.

use std::time::Duration;

use gateway_common::maps::ServiceTimes;

use super::{floor::Floor, law::HandshakeCosts};

/// Completions a sample of the window is the median of.
pub const POOL: u64 = 100;

/// Intervals pooled at most into one sample: past them, a pool too small is dropped.
pub const MAX_POOL: usize = 600;

/// Completion times pooled over intervals until they are enough for a median.
#[derive(Clone, Debug, Default)]
struct Pool {
    times: ServiceTimes,
    intervals: usize,
}

impl Pool {
    /// One interval's times: the sample to push when the pool is full, `Some(None)` for an
    /// interval with nothing pooled (which ages the window), `None` while it fills.
    fn add(&mut self, interval: &ServiceTimes) -> Option<Option<Duration>> {
        self.times.accumulate(interval);
        self.intervals += 1;
        let n = self.times.count();
        if n == 0 {
            self.intervals = 0;
            return Some(None);
        }
        if n >= POOL {
            let median = self.times.quantile_us(500).map(Duration::from_micros);
            *self = Pool::default();
            return Some(median);
        }
        if self.intervals >= MAX_POOL {
            *self = Pool::default();
            return Some(None);
        }
        None
    }
}

/// Intervals an estimate looks back over (5 s at the default interval of 100 ms).
pub const WINDOW: usize = 50;

/// The inferred costs of one server's full and resumed handshakes.
#[derive(Clone, Debug)]
pub struct CostInference {
    full: Floor,
    resumed: Floor,
    pools: [Pool; 2],
}

impl Default for CostInference {
    fn default() -> Self {
        CostInference {
            full: Floor::new(WINDOW),
            resumed: Floor::new(WINDOW),
            pools: Default::default(),
        }
    }
}

impl CostInference {
    /// One interval's completion times of new (`tls-new`) and resumed (`tls-resumed`)
    /// connections.
    pub fn observe(&mut self, new: &ServiceTimes, resumed: &ServiceTimes) {
        if let Some(sample) = self.pools[0].add(new) {
            self.full.push(sample);
        }
        if let Some(sample) = self.pools[1].add(resumed) {
            self.resumed.push(sample);
        }
    }

    /// The costs, once a full handshake's was seen within the window. With no resumed
    /// completions seen, a resumed handshake is taken to cost as much as a full one (the
    /// cautious side: resumed work then leaves less for new handshakes).
    pub fn costs(&self) -> Option<HandshakeCosts> {
        let full = self.full.get()?;
        Some(HandshakeCosts {
            full,
            resumed: self.resumed.get().map_or(full, |r| r.min(full)),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A histogram of `n` completions of `us` microseconds each.
    fn times(n: u64, us: u64) -> ServiceTimes {
        let mut h = ServiceTimes::default();
        h.buckets[ServiceTimes::bucket(us * 1000)] += n;
        h
    }

    fn empty() -> ServiceTimes {
        ServiceTimes::default()
    }

    #[test]
    fn nothing_is_inferred_before_enough_full_handshakes_completed() {
        let mut c = CostInference::default();
        assert_eq!(c.costs(), None);
        c.observe(&times(POOL - 1, 400), &empty());
        assert_eq!(c.costs(), None, "too few full handshakes yet");
        c.observe(&times(POOL, 400), &empty());
        let costs = c.costs().unwrap();
        // Within the histogram's few percent of 400 µs.
        assert!((388..=412).contains(&costs.full.as_micros()), "{costs:?}");
        assert_eq!(
            costs.resumed, costs.full,
            "no resumed completions: as dear as a full one"
        );
    }

    #[test]
    fn queueing_intervals_do_not_raise_the_estimate_and_it_ages_out() {
        let mut c = CostInference::default();
        c.observe(&times(POOL, 400), &times(POOL, 90));
        let calm = c.costs().unwrap();
        assert!(calm.resumed < calm.full, "{calm:?}");
        // An overload: every completion waited tens of milliseconds in the server's queue.
        for _ in 0..WINDOW - 1 {
            c.observe(&times(POOL, 40_000), &times(POOL, 40_000));
        }
        assert_eq!(
            c.costs().unwrap(),
            calm,
            "the calm interval is still in the window"
        );
        // A window later with no calm interval, the estimate follows what the server does now.
        c.observe(&times(POOL, 40_000), &times(POOL, 40_000));
        let now = c.costs().unwrap();
        assert!(now.full > Duration::from_millis(16), "{now:?}");
    }

    /// A quiet server (2 handshakes an interval, 20 a second): its intervals pool into one
    /// sample within fifty of them (5 s), so the cost is known before a flood comes.
    #[test]
    fn a_quiet_server_has_its_cost_inferred_from_pooled_intervals() {
        let mut c = CostInference::default();
        for _ in 0..49 {
            c.observe(&times(2, 1_000), &empty());
        }
        assert_eq!(c.costs(), None, "98 completions so far");
        c.observe(&times(2, 1_000), &empty());
        let full = c.costs().unwrap().full.as_micros();
        assert!((970..=1_030).contains(&full), "{full}");
        // A pool that never fills in MAX_POOL intervals is dropped, not kept for ever.
        let mut c = CostInference::default();
        c.observe(&times(1, 1_000), &empty());
        for _ in 0..MAX_POOL {
            c.observe(&empty(), &empty());
        }
        c.observe(&times(POOL - 1, 1_000), &empty());
        assert_eq!(c.costs(), None, "the lone early completion was dropped");
    }

    #[test]
    fn a_resumed_handshake_is_never_taken_as_dearer_than_a_full_one() {
        let mut c = CostInference::default();
        c.observe(&times(POOL, 300), &times(POOL, 3_000));
        let costs = c.costs().unwrap();
        assert_eq!(costs.resumed, costs.full, "{costs:?}");
    }
}
