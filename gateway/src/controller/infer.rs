//! Handshake costs of a TLS server the gateway does not terminate, inferred from what the
//! datapath measures of it: each admitted connection's completion time, from its hello's
//! admission to the server's first flight leaving the host (`SERVICE_LATENCY`).
//!
//! A server sends its first flight once it has done a handshake's expensive part (the key
//! exchange and, for a full handshake, the signature), so a completion time is that work plus
//! any wait in the server's queue. An interval's median completion time estimates the cost
//! when the server was not queueing; the estimate is the lowest interval median of the last
//! [`WINDOW`] intervals, so an overloaded interval inflates only its own sample, and the budget
//! the estimate leads to keeps the queue short enough for the window to see unqueued
//! handshakes again. Times come from log2 buckets placed linearly within their bucket, so an
//! estimate is within a factor of two of the truth, typically much closer.
//!
//! Pure: the controller feeds it each interval's histogram deltas.

use gateway_common::maps::LatencyHistogram;

use super::{
    floor::{Floor, median},
    law::HandshakeCosts,
};

/// Intervals an estimate looks back over (5 s at the default interval of 100 ms).
pub const WINDOW: usize = 50;

/// The inferred costs of one server's full and resumed handshakes.
#[derive(Clone, Debug)]
pub struct CostInference {
    full: Floor,
    resumed: Floor,
}

impl Default for CostInference {
    fn default() -> Self {
        CostInference {
            full: Floor::new(WINDOW),
            resumed: Floor::new(WINDOW),
        }
    }
}

impl CostInference {
    /// One interval's completion times of new (`tls-new`) and resumed (`tls-resumed`)
    /// connections.
    pub fn observe(&mut self, new: &LatencyHistogram, resumed: &LatencyHistogram) {
        self.full.push(median(new));
        self.resumed.push(median(resumed));
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

    use super::{super::floor::MIN_SAMPLES, *};

    /// A histogram of `n` completions of `us` microseconds each.
    fn times(n: u64, us: u64) -> LatencyHistogram {
        let mut h = LatencyHistogram::default();
        h.buckets[LatencyHistogram::bucket(us * 1000)] += n;
        h
    }

    fn empty() -> LatencyHistogram {
        LatencyHistogram::default()
    }

    #[test]
    fn nothing_is_inferred_before_enough_full_handshakes_completed() {
        let mut c = CostInference::default();
        assert_eq!(c.costs(), None);
        c.observe(&times(MIN_SAMPLES - 1, 400), &empty());
        assert_eq!(c.costs(), None, "too few full handshakes in the interval");
        c.observe(&times(MIN_SAMPLES, 400), &empty());
        let costs = c.costs().unwrap();
        // 400 µs lies in [256, 512): the median is placed within that bucket.
        assert!((256..512).contains(&costs.full.as_micros()), "{costs:?}");
        assert_eq!(
            costs.resumed, costs.full,
            "no resumed completions: as dear as a full one"
        );
    }

    #[test]
    fn queueing_intervals_do_not_raise_the_estimate_and_it_ages_out() {
        let mut c = CostInference::default();
        c.observe(&times(20, 400), &times(20, 90));
        let calm = c.costs().unwrap();
        assert!(calm.resumed < calm.full, "{calm:?}");
        // An overload: every completion waited tens of milliseconds in the server's queue.
        for _ in 0..WINDOW - 1 {
            c.observe(&times(200, 40_000), &times(200, 40_000));
        }
        assert_eq!(
            c.costs().unwrap(),
            calm,
            "the calm interval is still in the window"
        );
        // A window later with no calm interval, the estimate follows what the server does now.
        c.observe(&times(200, 40_000), &times(200, 40_000));
        let now = c.costs().unwrap();
        assert!(now.full > Duration::from_millis(16), "{now:?}");
    }

    #[test]
    fn a_resumed_handshake_is_never_taken_as_dearer_than_a_full_one() {
        let mut c = CostInference::default();
        c.observe(&times(20, 300), &times(20, 3_000));
        let costs = c.costs().unwrap();
        assert_eq!(costs.resumed, costs.full, "{costs:?}");
    }
}
