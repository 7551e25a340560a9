//! The maps shared by the eBPF programs and the daemon: their table (names, key and value types)
//! and, one module per concern, their key and value types and the rules they are read by.
//!
//! Every type is `#[repr(C)]` with explicit padding fields and no implicit padding (checked by the
//! tests below), so the kernel, the daemon and `bpftool` (through BTF) agree on every byte.

use crate::class::NUM_CLASSES;

mod bench;
mod class;
mod datapath;
mod latency;
mod pending;
mod service;
mod sip;
mod tls;

pub use bench::*;
pub use class::*;
pub use datapath::*;
pub use latency::*;
pub use pending::*;
pub use service::*;
pub use sip::*;
pub use tls::*;

/// A map the gateway pins: its name (as declared in the eBPF object, and its pin file's name)
/// and the sizes of its key and value in this build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MapSpec {
    /// The name.
    pub name: &'static str,
    /// Bytes of its key (0 for the ring buffer, which has none).
    pub key_size: usize,
    /// Bytes of its value (0 for the ring buffer).
    pub value_size: usize,
}

/// Declares the maps of one concern, in the module of that concern: each map's name with its
/// key and value types, as a constant of the concern's `names` and an entry of its `MAPS`.
/// Adding a map is one line here (beside its key and value types) and its declaration in the
/// eBPF module that owns it.
macro_rules! pinned_maps {
    ($( $(#[doc = $doc:literal])* $name:ident: $key:ty => $value:ty, )*) => {
        /// The names of this concern's maps.
        pub(super) mod names {
            $(
                $(#[doc = $doc])*
                pub const $name: &str = stringify!($name);
            )*
        }

        /// This concern's maps.
        pub(super) const MAPS: &[super::MapSpec] = &[$(
            super::MapSpec {
                name: names::$name,
                key_size: core::mem::size_of::<$key>(),
                value_size: core::mem::size_of::<$value>(),
            }
        ),*];
    };
}
use pinned_maps;

/// Map names, as declared in the eBPF object and used as pin file names.
pub mod names {
    pub use super::{
        class::names::*, datapath::names::*, latency::names::*, pending::names::*,
        service::names::*, sip::names::*, tls::names::*,
    };
}

/// Every map the gateway pins.
pub fn all() -> impl Iterator<Item = &'static MapSpec> {
    [
        class::MAPS,
        service::MAPS,
        datapath::MAPS,
        tls::MAPS,
        sip::MAPS,
        latency::MAPS,
        pending::MAPS,
    ]
    .into_iter()
    .flatten()
}

/// Compile-time check that per-class arrays cover every class.
const _: () = assert!(NUM_CLASSES == 7);

#[cfg(test)]
mod tests {
    #[test]
    fn every_pinned_map_is_declared_once_by_name() {
        let mut seen: alloc::vec::Vec<&str> = super::all().map(|m| m.name).collect();
        let n = seen.len();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen.len(), n, "a map name is declared twice");
        assert_eq!(n, 29);
        assert!(seen.contains(&super::names::HANDOVER_KEY));
        assert!(seen.contains(&super::names::TLS_TAG_KEYS));
        assert!(seen.contains(&super::names::SERVICE_TIMES));
        assert!(seen.contains(&super::names::SIP_FAMILIES));
        assert!(seen.contains(&super::names::SIP_FAMILY_LIMITS));
        assert!(seen.contains(&super::names::SYN_COOKIE_KEY));
        assert!(seen.contains(&super::names::TLS_HOLDS));
        assert!(seen.contains(&super::names::TLS_REFUSED));
        assert!(seen.contains(&super::names::TLS_FLOWS4));
        // Only the ring buffer has no key and value.
        let empty: alloc::vec::Vec<_> = super::all()
            .filter(|m| (m.key_size, m.value_size) == (0, 0))
            .map(|m| m.name)
            .collect();
        assert_eq!(empty, [super::names::TLS_REJECTS]);
    }

    use super::*;
    use core::mem::size_of;

    #[test]
    fn a_quantile_within_its_bucket_moves_smoothly() {
        let mut h = LatencyHistogram::default();
        assert_eq!(h.quantile_within_us(900), None);
        // Ten samples in [64, 128) µs: the 90th is 9/10 of the way through the bucket.
        h.buckets[6] = 10;
        assert_eq!(h.quantile_within_us(900), Some(64 + 64 * 9 / 10));
        assert_eq!(h.quantile_us(900), Some(128));
        let mut later = h;
        later.buckets[10] = 5;
        let d = later.since(&h);
        assert_eq!(d.count(), 5);
        assert_eq!(d.quantile_within_us(1000), Some(2048));
    }

    #[test]
    fn a_resume_place_is_held_until_released_or_healed_after_a_timeout() {
        let t = 10;
        let m = RESUME_HEAL_MARGIN_NS;
        assert_eq!(resume_holders(3, 100, 105, t), 3);
        assert_eq!(resume_holders(3, 100, 110, t), 3);
        // Past the timeout but within a sweep interval: the holders may not be released yet.
        assert_eq!(resume_holders(3, 100, 111, t), 3);
        assert_eq!(resume_holders(3, 100, 110 + m, t), 3);
        // Nobody was given a place for longer than a unit lives and a sweep takes: every holder
        // has ended and been released.
        assert_eq!(resume_holders(3, 100, 111 + m, t), 0);
        // A clock that reads earlier than the grant (another CPU) keeps the count.
        assert_eq!(resume_holders(3, 100, 90, t), 3);
        assert_eq!(resume_limit(0), u64::from(DEFAULT_RESUME_LIMIT));
        assert_eq!(resume_limit(1), 1);
    }

    /// Sum of field sizes equals the struct size: no implicit padding anywhere.
    #[test]
    fn no_implicit_padding() {
        assert_eq!(size_of::<ClassStats>(), 7 * 8);
        assert_eq!(size_of::<BenchFresh>(), 2 + 1 + 1 + 4);
        assert_eq!(size_of::<ClassPolicy>(), 5 * 8 + 4 + 4 + 3 * 8 + 8 + 4 + 4);
        assert_eq!(size_of::<ClassState>(), 7 * 8);
        assert_eq!(size_of::<Pending>(), 8 + 8 + 4 + 4 + 16);
        assert_eq!(size_of::<ServiceKey>(), 2 + 1 + 1);
        assert_eq!(size_of::<ServiceValue>(), 4 + 4);
        assert_eq!(size_of::<DatapathConfig>(), 8 + 4 * 6);
        assert_eq!(size_of::<DatapathCounters>(), 21 * 8);
        assert_eq!(size_of::<SipDialog>(), 8 + 8 + 4 + 4);
        assert_eq!(size_of::<FlowKey>(), 16 + 16 + 2 + 2 + 4);
        assert_eq!(size_of::<FlowKey4>(), 4 + 4 + 2 + 2);
        assert_eq!(
            size_of::<crate::tls::HelloState>(),
            4 * 4 + 2 + 6 + 2 + 2 + 4 + 3 * 16 + 2 * 8
        );
        assert_eq!(
            size_of::<TlsFlow>(),
            size_of::<crate::tls::HelloState>() + 4 + 4 + 4 + 4
        );
        assert_eq!(size_of::<IssuedKey>(), 16);
        assert_eq!(
            size_of::<IssuedValue>(),
            4 + 4 + 8 + 8 + 8 + 4 + 4 + 8 + 8 + 8
        );
        assert_eq!(size_of::<TagKeyId>(), 8);
        assert_eq!(size_of::<TagKey>(), 32);
        assert_eq!(size_of::<LearnTerms>(), 24);
        assert_eq!(size_of::<TicketKeyId>(), 20);
        assert_eq!(size_of::<TicketMacKey>(), 64);
        assert_eq!(size_of::<TlsHold>(), 16 + 8 + 4 + 4);
        assert_eq!(size_of::<TlsCounters>(), 8 * 38);
        assert_eq!(size_of::<crate::maps::CookieKey>(), 16);
        assert_eq!(size_of::<RejectEvent>(), size_of::<FlowKey>() + 8);
        assert_eq!(size_of::<SipTxn>(), 8 + 4 + 4);
        assert_eq!(size_of::<LatencyHistogram>(), LATENCY_BUCKETS * 8);
        assert_eq!(size_of::<ServiceTimes>(), SERVICE_BUCKETS * 8);
        assert_eq!(size_of::<SipFamily>(), 2 * 8);
        assert_eq!(size_of::<crate::sip::SipInfo>(), 6 * 8 + 4 + 2 + 5 + 5);
    }

    #[test]
    fn port_byte_carries_the_kind_whatever_the_flags() {
        for flags in [0, SERVICE_TERMINATED] {
            let v = ServiceValue {
                kind: ServiceKind::Tls as u32,
                flags,
            };
            assert_eq!(v.port_byte(), 1);
            assert_eq!(port_kind(v.port_byte()), Some(ServiceKind::Tls));
        }
        assert_eq!(port_kind(0), None);
    }

    #[test]
    fn backlog_is_admitted_minus_completed_minus_expired() {
        let s = ClassState {
            admitted: 10,
            completed: 7,
            ..Default::default()
        };
        assert_eq!(s.backlog(), 3);
        let s = ClassState {
            admitted: 10,
            completed: 7,
            expired: 2,
            ..Default::default()
        };
        assert_eq!(s.backlog(), 1);
        let s = ClassState {
            admitted: 1,
            completed: 2,
            ..Default::default()
        };
        assert_eq!(s.backlog(), 0);
    }

    #[test]
    fn service_port_indexes_are_distinct_and_in_range() {
        assert_eq!(service_port_index(IPPROTO_TCP, 0), Some(0));
        assert_eq!(service_port_index(IPPROTO_TCP, 443), Some(443));
        assert_eq!(service_port_index(IPPROTO_UDP, 443), Some(65536 + 443));
        assert_eq!(
            service_port_index(IPPROTO_UDP, u16::MAX),
            Some(SERVICE_PORT_ENTRIES - 1)
        );
        assert_eq!(service_port_index(1, 443), None);
    }

    #[test]
    fn latency_buckets_and_quantiles() {
        assert_eq!(LatencyHistogram::bucket(500), 0);
        assert_eq!(LatencyHistogram::bucket(1_500), 0);
        assert_eq!(LatencyHistogram::bucket(2_000), 1);
        assert_eq!(LatencyHistogram::bucket(250_000_000), 17);
        assert_eq!(LatencyHistogram::bucket(u64::MAX), LATENCY_BUCKETS - 1);
        let mut h = LatencyHistogram::default();
        assert_eq!(h.quantile_us(500), None);
        h.buckets[LatencyHistogram::bucket(300_000_000)] += 9;
        h.buckets[LatencyHistogram::bucket(5_000)] += 1;
        // 300 ms lies in [2^18, 2^19) us.
        assert_eq!(h.quantile_us(500), Some(1 << 19));
        assert_eq!(h.quantile_us(100), Some(1 << 3));
    }

    #[test]
    fn service_time_buckets_are_contiguous_and_within_a_sixteenth() {
        // Every microsecond up to 2^27 falls in the bucket whose bounds hold it, buckets in
        // order, none wider than a sixteenth of its lower bound.
        let mut last = 0;
        let mut us = 0u64;
        while us < 1 << 27 {
            let b = ServiceTimes::bucket(us * 1000);
            let (lo, hi) = ServiceTimes::bounds_us(b);
            assert!(lo <= us && us < hi, "{us} us in bucket {b} [{lo}, {hi})");
            assert!(
                b == last || b == last + 1,
                "{us} us: bucket {b} after {last}"
            );
            assert!(
                hi - lo == 1 || (hi - lo) * 16 <= lo,
                "bucket {b} [{lo}, {hi})"
            );
            last = b;
            us += 1 + us / 64;
        }
        assert_eq!(last, SERVICE_BUCKETS - 1);
        assert_eq!(ServiceTimes::bucket(u64::MAX), SERVICE_BUCKETS - 1);
        assert_eq!(ServiceTimes::bucket(999), 0);
    }

    #[test]
    fn service_time_quantiles_are_within_a_few_percent() {
        // A fixed 75 ms reads as 75 ms, not as the log2 bucket's 64-128 ms.
        let mut h = ServiceTimes::default();
        assert_eq!(h.quantile_us(500), None);
        for _ in 0..100 {
            h.record_us(75_000);
        }
        for q in [0, 500, 900, 1000] {
            let t = h.quantile_us(q).unwrap() as f64;
            assert!((t / 75_000.0 - 1.0).abs() < 0.035, "q {q}: {t}");
        }
        // Spread times: each quantile within 3.5% of the exact one.
        let mut h = ServiceTimes::default();
        let times: [u64; 1000] = core::array::from_fn(|i| 40_000 + (i as u64 + 1) * 97);
        for t in &times {
            h.record_us(*t);
        }
        for q in [10, 100, 500, 900, 990] {
            let exact = times[(q as usize * times.len()).div_ceil(1000) - 1] as f64;
            let t = h.quantile_us(q).unwrap() as f64;
            assert!(
                (t / exact - 1.0).abs() < 0.035,
                "q {q}: {t} against {exact}"
            );
        }
        assert!(h.min_us().unwrap() <= times[0] + times[0] / 16);
        let later = {
            let mut l = h;
            l.record_us(5);
            l
        };
        assert_eq!(later.since(&h).count(), 1);
        assert_eq!(later.since(&h).min_us(), Some(5));
    }

    #[test]
    fn kinds_and_modes_round_trip() {
        for k in [ServiceKind::Tls, ServiceKind::Sip] {
            assert_eq!(ServiceKind::from_id(k as u32), Some(k));
        }
        assert_eq!(ServiceKind::from_id(0), None);
        for m in [AttachMode::Native, AttachMode::Generic, AttachMode::Tc] {
            assert_eq!(AttachMode::from_id(m as u32), m);
        }
        assert_eq!(AttachMode::from_id(99), AttachMode::Unknown);
    }
}
