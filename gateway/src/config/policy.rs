//! The `policy` section: per-class limits as YAML, read into the domain type
//! ([`gateway_common::policy::Policy`]).

use std::collections::BTreeMap;

use gateway_common::{
    Class,
    policy::{MAX_BACKLOG, MAX_BURST, MAX_RATE, Policy},
};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _};

/// A bounded count.
fn bounded<'de, D: Deserializer<'de>>(d: D, what: &str, max: u64) -> Result<Option<u64>, D::Error> {
    let v = Option::<i64>::deserialize(d)?;
    match v {
        None => Ok(None),
        Some(v) if v >= 0 && (v as u64) <= max => Ok(Some(v as u64)),
        Some(v) => Err(D::Error::custom(format!(
            "{what} {v} out of range 0..={max}"
        ))),
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
    /// expires and frees its place; absent means the class's default (TLS 10 s, SIP 2 s).
    #[serde(default)]
    pub timeout: Option<crate::proxy::config::Span>,
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
        }
    }

    /// How `p` is written in a config.
    pub fn of(p: Policy) -> Self {
        PolicyConfig {
            backlog: p.backlog,
            rate: p.rate,
            burst: p.burst,
            timeout: p.timeout.map(crate::proxy::config::Span),
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

/// Per-class limits; classes not listed are unlimited.
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
        let map = BTreeMap::<String, PolicyConfig>::deserialize(d)?;
        let mut out = BTreeMap::new();
        for (name, p) in map {
            match Class::from_name(&name) {
                None => return Err(D::Error::custom(unknown_class(&name))),
                Some(c) if !c.is_limitable() => return Err(D::Error::custom(unlimitable_class(c))),
                Some(c) => {
                    out.insert(c, p.policy());
                }
            }
        }
        Ok(Policies(out))
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
