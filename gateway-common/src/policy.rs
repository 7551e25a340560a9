//! A class's admission limits as operators, the CLI, the config and the controller speak of them,
//! and their one translation into the datapath's [`ClassPolicy`].

use core::time::Duration;

use crate::maps::{ClassPolicy, POLICY_LIMIT_BACKLOG, POLICY_LIMIT_RATE};

/// Largest accepted backlog limit.
pub const MAX_BACKLOG: u64 = 10_000_000;
/// Largest accepted rate limit, per second.
pub const MAX_RATE: u64 = 100_000_000;
/// Largest accepted burst.
pub const MAX_BURST: u64 = crate::maps::MAX_BURST;

/// The limits of one class. `None` is unlimited (or, for the timeout, the class's default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Admitted units that may be outstanding at once.
    pub backlog: Option<u64>,
    /// Sustained admissions per second.
    pub rate: Option<u64>,
    /// Admissions above the rate that may come at once.
    pub burst: Option<u64>,
    /// How long an admitted unit may go unanswered before it expires and frees its place.
    pub timeout: Option<Duration>,
}

impl Policy {
    /// No limit at all.
    pub const UNLIMITED: Policy = Policy {
        backlog: None,
        rate: None,
        burst: None,
        timeout: None,
    };

    /// The datapath's value of this policy, owned by the configuration (see
    /// [`ClassPolicy::owner`] for the provenance fields, which callers then set).
    pub fn to_map(self) -> ClassPolicy {
        let mut flags = 0;
        if self.backlog.is_some() {
            flags |= POLICY_LIMIT_BACKLOG;
        }
        if self.rate.is_some() {
            flags |= POLICY_LIMIT_RATE;
        }
        ClassPolicy {
            backlog_limit: self.backlog.unwrap_or(0),
            rate_per_sec: self.rate.unwrap_or(0),
            burst: self.burst.unwrap_or(0),
            flags,
            timeout_ns: self
                .timeout
                .map_or(0, |t| t.as_nanos().min(u128::from(u64::MAX)) as u64),
            ..ClassPolicy::default()
        }
    }

    /// The policy a datapath value holds.
    pub fn from_map(p: &ClassPolicy) -> Self {
        Policy {
            backlog: (p.flags & POLICY_LIMIT_BACKLOG != 0).then_some(p.backlog_limit),
            rate: (p.flags & POLICY_LIMIT_RATE != 0).then_some(p.rate_per_sec),
            burst: (p.flags & POLICY_LIMIT_RATE != 0).then_some(p.burst),
            timeout: (p.timeout_ns != 0).then(|| Duration::from_nanos(p.timeout_ns)),
        }
    }

    /// `self` with every limit `other` sets replacing this one's.
    pub fn overlay(self, other: Policy) -> Policy {
        Policy {
            backlog: other.backlog.or(self.backlog),
            rate: other.rate.or(self.rate),
            burst: other.burst.or(self.burst),
            timeout: other.timeout.or(self.timeout),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_survives_the_datapath_value() {
        let p = Policy {
            backlog: Some(30),
            rate: Some(0),
            burst: Some(5),
            timeout: Some(Duration::from_millis(300)),
        };
        assert_eq!(Policy::from_map(&p.to_map()), p);
        assert_eq!(
            Policy::from_map(&Policy::UNLIMITED.to_map()),
            Policy::UNLIMITED
        );
        // A rate of zero is a limit (nothing admitted), not its absence.
        assert_ne!(
            Policy::from_map(
                &Policy {
                    rate: Some(0),
                    ..Policy::UNLIMITED
                }
                .to_map()
            ),
            Policy::UNLIMITED
        );
        let set = Policy::UNLIMITED.overlay(Policy {
            backlog: Some(1),
            ..Policy::UNLIMITED
        });
        assert_eq!(
            set.overlay(Policy {
                rate: Some(2),
                ..Policy::UNLIMITED
            })
            .backlog,
            Some(1)
        );
    }
}
