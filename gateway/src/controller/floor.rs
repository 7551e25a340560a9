//! The floor of a service time: the lowest interval median of a class over a sliding window of
//! intervals. An overloaded interval inflates only its own sample, so the floor is what the
//! server takes when it is not queueing: the cost inference ([`super::infer`]) reads a
//! handshake's cost from it, and the `tls` law ([`super::law::HandshakeBudgetLaw`]) the
//! resumed handshakes' unqueued time it holds them near.

use std::{collections::VecDeque, time::Duration};

use gateway_common::maps::LatencyHistogram;

/// Completions an interval needs before its median counts.
pub const MIN_SAMPLES: u64 = 5;

/// The median of one interval's completions, placed linearly within its log2 bucket; `None`
/// with fewer than [`MIN_SAMPLES`].
pub fn median(interval: &LatencyHistogram) -> Option<Duration> {
    (interval.count() >= MIN_SAMPLES)
        .then(|| interval.quantile_within_us(500))
        .flatten()
        .map(Duration::from_micros)
}

/// The lowest of the last `window` interval medians of one class.
#[derive(Clone, Debug)]
pub struct Floor {
    window: usize,
    medians: VecDeque<Option<Duration>>,
}

impl Floor {
    /// A floor over the last `window` intervals (at least 1).
    pub fn new(window: usize) -> Self {
        Floor {
            window: window.max(1),
            medians: VecDeque::new(),
        }
    }

    /// One interval's median (`None`: too few completions, which still ages the window).
    pub fn push(&mut self, median: Option<Duration>) {
        self.medians.push_back(median);
        if self.medians.len() > self.window {
            self.medians.pop_front();
        }
    }

    /// Starts the window again from `median`: what the class takes now, measured with nothing
    /// ahead of it, replaces what older intervals showed.
    pub fn reset(&mut self, median: Option<Duration>) {
        self.medians.clear();
        self.push(median);
    }

    /// The floor, once an interval in the window had a median.
    pub fn get(&self) -> Option<Duration> {
        self.medians.iter().flatten().min().copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_floor_is_the_lowest_median_of_the_window_and_ages_out() {
        let mut f = Floor::new(3);
        assert_eq!(f.get(), None);
        f.push(None);
        assert_eq!(f.get(), None, "no median yet");
        f.push(Some(2 * MS));
        f.push(Some(9 * MS));
        assert_eq!(f.get(), Some(2 * MS));
        f.push(Some(5 * MS));
        assert_eq!(f.get(), Some(2 * MS), "still in the window of three");
        f.push(None);
        assert_eq!(f.get(), Some(5 * MS), "2 ms aged out");
        f.reset(Some(7 * MS));
        assert_eq!(f.get(), Some(7 * MS), "a reset forgets lower medians");
    }

    #[test]
    fn a_median_needs_enough_completions() {
        let mut h = LatencyHistogram::default();
        h.buckets[8] = MIN_SAMPLES - 1;
        assert_eq!(median(&h), None);
        h.buckets[8] += 1;
        let m = median(&h).unwrap();
        assert!((256..512).contains(&m.as_micros()), "{m:?}");
    }
}
