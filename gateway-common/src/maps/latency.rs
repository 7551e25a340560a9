//! Service-time histograms (`SERVICE_LATENCY`).

super::pinned_maps! {
    /// Per-class, per-CPU service-time histograms ([`crate::maps::LatencyHistogram`]).
    SERVICE_LATENCY: u32 => LatencyHistogram,
}

/// Buckets of a [`LatencyHistogram`].
pub const LATENCY_BUCKETS: usize = 32;

/// A service-time histogram: bucket `i` counts times in `[2^i, 2^(i+1))` microseconds (bucket 0
/// also counts times under 1 µs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LatencyHistogram {
    /// The counts.
    pub buckets: [u64; LATENCY_BUCKETS],
}

impl LatencyHistogram {
    /// The bucket of a time in nanoseconds.
    pub const fn bucket(ns: u64) -> usize {
        let us = ns / 1000;
        if us == 0 {
            return 0;
        }
        let b = 63 - us.leading_zeros() as usize;
        if b < LATENCY_BUCKETS {
            b
        } else {
            LATENCY_BUCKETS - 1
        }
    }

    /// Adds another CPU's counts.
    pub fn accumulate(&mut self, o: &LatencyHistogram) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
    }

    /// Samples counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The bucket holding the quantile `permille`/1000, the samples in buckets below it and its
    /// own count; `None` when empty.
    fn rank_bucket(&self, permille: u64) -> Option<(usize, u64, u64)> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = (permille * total).div_ceil(1000).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            if seen + n >= rank {
                return Some((i, rank - seen, *n));
            }
            seen += n;
        }
        None
    }

    /// The upper bound, in microseconds, of the bucket holding the quantile `permille`/1000;
    /// `None` when empty.
    pub fn quantile_us(&self, permille: u64) -> Option<u64> {
        self.count().checked_sub(1)?;
        Some(
            self.rank_bucket(permille)
                .map_or(1u64 << LATENCY_BUCKETS, |(i, _, _)| 1u64 << (i + 1)),
        )
    }

    /// The quantile `permille`/1000 in microseconds, placed linearly within its bucket (so it
    /// moves smoothly as samples shift, where [`Self::quantile_us`] jumps by factors of two);
    /// `None` when empty.
    pub fn quantile_within_us(&self, permille: u64) -> Option<u64> {
        self.count().checked_sub(1)?;
        Some(
            self.rank_bucket(permille)
                .map_or(1u64 << LATENCY_BUCKETS, |(i, into, n)| {
                    let lo = if i == 0 { 0 } else { 1u64 << i };
                    let hi = 1u64 << (i + 1);
                    lo + (hi - lo) * into / n
                }),
        )
    }

    /// The counts added since `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &LatencyHistogram) -> LatencyHistogram {
        let mut out = LatencyHistogram::default();
        for (i, b) in out.buckets.iter_mut().enumerate() {
            *b = self.buckets[i].saturating_sub(earlier.buckets[i]);
        }
        out
    }
}
