//! The `policy` section: per-class limits as YAML, read into the domain type
//! ([`gateway_common::policy::Policy`]).

use std::collections::BTreeMap;

use gateway_common::{
    Class,
    policy::{MAX_BACKLOG, MAX_BURST, MAX_RATE, MAX_REPLY_RATE, MAX_RETRY_AFTER, Policy, Refuse},
};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _};

/// A count from 0 to `max`, or absent.
fn bounded<'de, D: Deserializer<'de>>(
    d: D,
    what: &'static str,
    max: u64,
) -> Result<Option<u64>, D::Error> {
    crate::count::Count { what, min: 0, max }.read_optional(d)
}

/// A class that takes limits, as a map key: read by a visitor so that an unknown or unlimitable
/// name is reported at its own line and column.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LimitableClass(pub Class);

impl<'de> Deserialize<'de> for LimitableClass {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl serde::de::Visitor<'_> for Name {
            type Value = LimitableClass;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a class name")
            }
            fn visit_str<E: serde::de::Error>(self, name: &str) -> Result<LimitableClass, E> {
                match Class::from_name(name) {
                    None => Err(E::custom(unknown_class(name))),
                    Some(c) if !c.is_limitable() => Err(E::custom(unlimitable_class(c))),
                    Some(c) => Ok(LimitableClass(c)),
                }
            }
        }
        d.deserialize_str(Name)
    }
}

/// Limits of one class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// Maximum backlog; absent means unlimited.
    #[serde(default, deserialize_with = "de_backlog")]
    pub backlog: Option<u64>,
    /// Sustained rate per second; absent means unlimited.
    #[serde(default, deserialize_with = "de_rate")]
    pub rate: Option<u64>,
    /// Burst above the rate.
    #[serde(default, deserialize_with = "de_burst")]
    pub burst: Option<u64>,
    /// How long an admitted unit (a TLS connection, a SIP request) may go unanswered before it
    /// expires and frees its place, at most [`MAX_UNIT_TIMEOUT`]; absent means the class's
    /// default (TLS 10 s, SIP 2 s).
    #[serde(default, deserialize_with = "de_timeout")]
    pub timeout: Option<crate::proxy::config::Span>,
    /// What a refusal gets: `drop` (silence) or `reject` (a TCP reset, a SIP 503 from the NIC);
    /// absent means the class's default (TLS classes reject, SIP classes drop).
    #[serde(default, deserialize_with = "de_refuse", serialize_with = "ser_refuse")]
    pub refuse: Option<Refuse>,
    /// Replies per second for refusals, all CPUs together; absent means 20000.
    #[serde(default, deserialize_with = "de_reply_rate")]
    pub reply_rate: Option<u64>,
    /// Seconds a SIP 503 asks the client to wait before trying again (`Retry-After`, 1..=86400);
    /// absent means no such header.
    #[serde(default, deserialize_with = "de_retry_after")]
    pub retry_after: Option<u32>,
}

/// The longest an admitted unit may go unanswered before it expires: an hour. A handshake or
/// a SIP transaction unanswered that long is lost, and its place was taken all along.
pub const MAX_UNIT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3600);

/// Parses a class's unit timeout (`policy ... timeout`, `gateway policy set --timeout`): a
/// duration above zero and at most [`MAX_UNIT_TIMEOUT`].
pub fn parse_unit_timeout(text: &str) -> Result<crate::proxy::config::Span, String> {
    let span: crate::proxy::config::Span = text.parse()?;
    if span.0 > MAX_UNIT_TIMEOUT {
        return Err(format!(
            "timeout '{text}' out of range: a unit waits above zero and at most 1h"
        ));
    }
    Ok(span)
}

fn de_timeout<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<Option<crate::proxy::config::Span>, D::Error> {
    Option::<String>::deserialize(d)?
        .map(|t| parse_unit_timeout(&t).map_err(D::Error::custom))
        .transpose()
}

fn de_refuse<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Refuse>, D::Error> {
    let v = Option::<String>::deserialize(d)?;
    v.map(|name| {
        Refuse::from_name(&name)
            .ok_or_else(|| D::Error::custom(format!("refuse '{name}' is not one of: drop, reject")))
    })
    .transpose()
}
fn ser_refuse<S: Serializer>(v: &Option<Refuse>, s: S) -> Result<S::Ok, S::Error> {
    v.map(Refuse::name).serialize(s)
}
fn de_reply_rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "reply_rate", MAX_REPLY_RATE)
}
fn de_retry_after<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u32>, D::Error> {
    match bounded(d, "retry_after", u64::from(MAX_RETRY_AFTER))? {
        Some(0) => Err(D::Error::custom(format!(
            "retry_after 0 out of range 1..={MAX_RETRY_AFTER} (leave it out for no Retry-After)"
        ))),
        v => Ok(v.map(|v| v as u32)),
    }
}

fn de_backlog<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "backlog", MAX_BACKLOG)
}
fn de_rate<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "rate", MAX_RATE)
}
fn de_burst<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    bounded(d, "burst", MAX_BURST)
}

impl PolicyConfig {
    /// The policy this section describes.
    pub fn policy(self) -> Policy {
        Policy {
            backlog: self.backlog,
            rate: self.rate,
            burst: self.burst,
            timeout: self.timeout.map(|t| t.0),
            refuse: self.refuse,
            reply_rate: self.reply_rate,
            retry_after: self.retry_after,
        }
    }

    /// How `p` is written in a config.
    pub fn of(p: Policy) -> Self {
        PolicyConfig {
            backlog: p.backlog,
            rate: p.rate,
            burst: p.burst,
            timeout: p.timeout.map(crate::proxy::config::Span),
            refuse: p.refuse,
            reply_rate: p.reply_rate,
            retry_after: p.retry_after,
        }
    }
}

/// Error text for a class name that is not one.
pub fn unknown_class(name: &str) -> String {
    format!(
        "unknown class '{name}' (valid: {})",
        Class::ALL.map(Class::name).join(", ")
    )
}

/// Error text for a class that cannot be limited.
pub fn unlimitable_class(class: Class) -> String {
    format!(
        "class '{}' is never limited (limitable: {})",
        class.name(),
        Class::ALL
            .into_iter()
            .filter(|c| c.is_limitable())
            .map(Class::name)
            .collect::<Vec<_>>()
            .join(", ")
    )
}

/// Per-class limits; a class not listed is unlimited, or moved by the controller by default
/// (see [`super::ControllerConfig::adopt`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policies(BTreeMap<Class, Policy>);

impl Policies {
    /// Limits by class, in class order.
    pub fn iter(&self) -> impl Iterator<Item = (Class, Policy)> + '_ {
        self.0.iter().map(|(c, p)| (*c, *p))
    }

    /// The limits of `class` (unlimited when not listed).
    pub fn of(&self, class: Class) -> Policy {
        self.0.get(&class).copied().unwrap_or(Policy::UNLIMITED)
    }

    /// Whether the operator wrote limits (a backlog or a rate) for `class`, or for the class
    /// whose limits follow from it (sip-original's law also sets sip-retransmission's): then the
    /// limits are the operator's, not the controller's by default.
    pub fn owns(&self, class: Class) -> bool {
        let limited = |c: Class| {
            let p = self.of(c);
            p.backlog.is_some() || p.rate.is_some()
        };
        limited(class) || class.leads().any(limited)
    }

    /// Classes listed.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether no class is listed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl<'de> Deserialize<'de> for Policies {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<LimitableClass, PolicyConfig>::deserialize(d)?;
        Ok(Policies(
            map.into_iter().map(|(c, p)| (c.0, p.policy())).collect(),
        ))
    }
}

impl Serialize for Policies {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let map: BTreeMap<&str, PolicyConfig> = self
            .0
            .iter()
            .map(|(c, p)| (c.name(), PolicyConfig::of(*p)))
            .collect();
        map.serialize(s)
    }
}
