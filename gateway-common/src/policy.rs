//! A class's admission limits as operators, the CLI, the config and the controller speak of them,
//! and their one translation into the datapath's [`ClassPolicy`].

use core::time::Duration;

use crate::maps::{
    ClassPolicy, POLICY_LIMIT_BACKLOG, POLICY_LIMIT_RATE, POLICY_REFUSE_DROP, POLICY_REFUSE_REJECT,
};

/// Largest accepted backlog limit.
pub const MAX_BACKLOG: u64 = 10_000_000;
/// Largest accepted rate limit, per second.
pub const MAX_RATE: u64 = 100_000_000;
/// Largest accepted burst.
pub const MAX_BURST: u64 = crate::maps::MAX_BURST;
/// Largest accepted reply rate, per second.
pub const MAX_REPLY_RATE: u64 = 1_000_000;
/// Largest accepted `Retry-After`, in seconds (a day).
pub const MAX_RETRY_AFTER: u32 = 86_400;

/// What a class does with a request it refuses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refuse {
    /// Drop it silently: the client learns by its own timeout.
    Drop,
    /// Answer it from the NIC in the protocol's words (a TCP reset, a SIP 503), within the
    /// class's reply rate.
    Reject,
}

impl Refuse {
    /// The name used by the CLI and the config.
    pub const fn name(self) -> &'static str {
        match self {
            Refuse::Drop => "drop",
            Refuse::Reject => "reject",
        }
    }

    /// By name.
    pub fn from_name(name: &str) -> Option<Refuse> {
        match name {
            "drop" => Some(Refuse::Drop),
            "reject" => Some(Refuse::Reject),
            _ => None,
        }
    }
}

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
    /// What a refusal gets; `None`: the class's default (see
    /// [`crate::maps::replies_to_refusals`]).
    pub refuse: Option<Refuse>,
    /// Replies per second for refusals, all CPUs together; `None`:
    /// [`crate::maps::DEFAULT_REPLY_RATE`].
    pub reply_rate: Option<u64>,
    /// Seconds a SIP 503 asks the client to wait (`Retry-After`); `None`: no such header (RFC
    /// 7339 discusses when a server should leave it out).
    pub retry_after: Option<u32>,
}

impl Policy {
    /// No limit at all.
    pub const UNLIMITED: Policy = Policy {
        backlog: None,
        rate: None,
        burst: None,
        timeout: None,
        refuse: None,
        reply_rate: None,
        retry_after: None,
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
        match self.refuse {
            Some(Refuse::Drop) => flags |= POLICY_REFUSE_DROP,
            Some(Refuse::Reject) => flags |= POLICY_REFUSE_REJECT,
            None => {}
        }
        ClassPolicy {
            backlog_limit: self.backlog.unwrap_or(0),
            rate_per_sec: self.rate.unwrap_or(0),
            burst: self.burst.unwrap_or(0),
            flags,
            timeout_ns: self
                .timeout
                .map_or(0, |t| t.as_nanos().min(u128::from(u64::MAX)) as u64),
            reply_rate: self.reply_rate.unwrap_or(0),
            retry_after_s: self.retry_after.unwrap_or(0),
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
            refuse: if p.flags & POLICY_REFUSE_REJECT != 0 {
                Some(Refuse::Reject)
            } else if p.flags & POLICY_REFUSE_DROP != 0 {
                Some(Refuse::Drop)
            } else {
                None
            },
            reply_rate: (p.reply_rate != 0).then_some(p.reply_rate),
            retry_after: (p.retry_after_s != 0).then_some(p.retry_after_s),
        }
    }

    /// `self` with every limit `other` sets replacing this one's.
    pub fn overlay(self, other: Policy) -> Policy {
        Policy {
            backlog: other.backlog.or(self.backlog),
            rate: other.rate.or(self.rate),
            burst: other.burst.or(self.burst),
            timeout: other.timeout.or(self.timeout),
            refuse: other.refuse.or(self.refuse),
            reply_rate: other.reply_rate.or(self.reply_rate),
            retry_after: other.retry_after.or(self.retry_after),
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
            refuse: Some(Refuse::Reject),
            reply_rate: Some(100),
            retry_after: Some(30),
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
