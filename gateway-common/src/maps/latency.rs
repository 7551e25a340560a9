//! Service-time histograms (`SERVICE_LATENCY`, `SERVICE_TIMES`).

use crate::class::NUM_CLASSES;

super::pinned_maps! {
    /// Per-class, per-CPU service-time histograms ([`crate::maps::LatencyHistogram`]).
    SERVICE_LATENCY: u32 => LatencyHistogram,
    /// Per-slot ([`SERVICE_SLOTS`]), per-CPU fine service-time histograms
    /// ([`crate::maps::ServiceTimes`]): what the controller reads.
    SERVICE_TIMES: u32 => ServiceTimes,
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

/// Sub-buckets of each power of two in a [`ServiceTimes`] histogram: a bucket is at most a
/// sixteenth (6.25%) of its lower bound wide, so a time read off it is within about 3% of the
/// truth (its midpoint), where [`LatencyHistogram`]'s factor-of-two buckets are not.
pub const SERVICE_SUB_BUCKETS: usize = 16;

/// Buckets of a [`ServiceTimes`] histogram: one per microsecond under 16 µs, then
/// [`SERVICE_SUB_BUCKETS`] per power of two up to 2^27 µs (134 s); the last also counts longer.
pub const SERVICE_BUCKETS: usize = SERVICE_SUB_BUCKETS * 24;

/// Slots of `SERVICE_TIMES`: one per class id, and [`SLOT_SIP_INVITE`].
pub const SERVICE_SLOTS: usize = NUM_CLASSES + 1;

/// The slot of `SERVICE_TIMES` holding the service times of `sip-original` INVITEs; the class's
/// own slot holds its other methods'. A server takes its own time per method: the controller
/// learns each family's floor and queue apart ([`crate::maps::PENDING_INVITE`]).
pub const SLOT_SIP_INVITE: u32 = NUM_CLASSES as u32;

/// A log-linear service-time histogram (as HDR histograms are): fine enough to hold a server's
/// answer time under a target of a few milliseconds' error. Bucket `i` counts times of `i` µs
/// under 16 µs; above, each power of two is cut into [`SERVICE_SUB_BUCKETS`] equal buckets.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceTimes {
    /// The counts.
    pub buckets: [u64; SERVICE_BUCKETS],
}

impl Default for ServiceTimes {
    fn default() -> Self {
        ServiceTimes {
            buckets: [0; SERVICE_BUCKETS],
        }
    }
}

impl ServiceTimes {
    /// The bucket of a time in nanoseconds (always under [`SERVICE_BUCKETS`]).
    #[inline(always)]
    pub const fn bucket(ns: u64) -> usize {
        let us = ns / 1000;
        let sub = SERVICE_SUB_BUCKETS as u64;
        if us < sub {
            return us as usize;
        }
        // The power of two (at least 4, as us >= 16) and the sub-bucket within it.
        let exp = 63 - us.leading_zeros() as u64;
        let within = (us >> (exp - 4)) & (sub - 1);
        let i = sub + (exp - 4) * sub + within;
        if i < SERVICE_BUCKETS as u64 {
            i as usize
        } else {
            SERVICE_BUCKETS - 1
        }
    }

    /// The bounds of bucket `i` in microseconds: `[lo, hi)`.
    pub const fn bounds_us(i: usize) -> (u64, u64) {
        let sub = SERVICE_SUB_BUCKETS;
        if i < sub {
            return (i as u64, i as u64 + 1);
        }
        let exp = (i - sub) / sub;
        let within = (i % sub) as u64;
        let lo = (sub as u64 + within) << exp;
        (lo, lo + (1u64 << exp))
    }

    /// Adds another CPU's counts.
    pub fn accumulate(&mut self, o: &ServiceTimes) {
        for (a, b) in self.buckets.iter_mut().zip(o.buckets.iter()) {
            *a += b;
        }
    }

    /// Samples counted.
    pub fn count(&self) -> u64 {
        self.buckets.iter().sum()
    }

    /// The counts added since `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &ServiceTimes) -> ServiceTimes {
        let mut out = ServiceTimes::default();
        for (i, b) in out.buckets.iter_mut().enumerate() {
            *b = self.buckets[i].saturating_sub(earlier.buckets[i]);
        }
        out
    }

    /// The quantile `permille`/1000 in microseconds, as the middle of its bucket (within half a
    /// bucket, 3.2%, of the truth); `None` when empty.
    pub fn quantile_us(&self, permille: u64) -> Option<u64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = (permille.min(1000) * total).div_ceil(1000).max(1);
        let mut seen = 0;
        for (i, n) in self.buckets.iter().enumerate() {
            if *n > 0 && seen + n >= rank {
                let (lo, hi) = Self::bounds_us(i);
                return Some(lo + (hi - lo) / 2);
            }
            seen += n;
        }
        None
    }

    /// The smallest time counted, at its bucket's middle, in microseconds; `None` when empty.
    pub fn min_us(&self) -> Option<u64> {
        self.quantile_us(0)
    }

    /// Adds one time of `us` microseconds (tests and simulations).
    pub fn record_us(&mut self, us: u64) {
        self.buckets[Self::bucket(us.saturating_mul(1000))] += 1;
    }
}
