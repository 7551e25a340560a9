//! The `controller` section: which classes the daemon's controller moves, by which law, toward
//! which target and within which bounds.
//!
//! Adaptive by default: every class a configured service has a law for is moved by the
//! controller with the defaults below ([`ControllerConfig::adopt`]), unless the operator owns it
//! (limits written under `policy:`, or `mode: static` here) or turns the controller off
//! (`enabled: false`).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use gateway_common::{
    Class,
    policy::{MAX_BACKLOG, MAX_RATE},
};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _};

use super::policy::{LimitableClass, unknown_class};
use crate::proxy::config::Span;

/// The default wait a resumed handshake is allowed beyond its floor (`resumed_wait`), in full
/// handshakes' times: half of one (the residual of the one a single worker may be busy with).
pub const DEFAULT_RESUMED_WAIT: f64 = 0.5;

/// How one class is controlled.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// Hold the class's service time (admission to the server's first answer, measured in the
    /// kernel) under `target` by moving its backlog limit; SIP retransmissions get half of it.
    Sip {
        /// The service time to stay under.
        target: Duration,
    },
    /// Budget new handshakes by the CPU left after resumed ones (seed 000), as tls-new's rate,
    /// and cut them while resumed handshakes wait over their allowance.
    Tls {
        /// Share of the CPUs handshakes may use, 0 to 1.
        cpu_target: f64,
        /// How long resumed handshakes may wait beyond their unqueued time before new ones are
        /// cut, in full handshakes' time.
        wait: f64,
    },
    /// Hold the ratio of new sessions' to resumed sessions' wait for a backend slot at `ratio`
    /// (seed 002, proportional delay differentiation) by moving the resumed sessions' share of
    /// the slots that free while both wait; `min` and `max` bound that share, in percent.
    Pdd {
        /// The set point: new sessions' mean wait over resumed sessions'.
        ratio: f64,
    },
}

/// One controlled class.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassControl {
    /// Its law.
    pub mode: Mode,
    /// The lowest limit the controller may set (`pdd`: the lowest share, percent).
    pub min: u64,
    /// The highest limit the controller may set, and where it starts (`pdd`: the highest
    /// share, percent).
    pub max: u64,
}

/// The controller's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct ControllerConfig {
    /// How often it reads the datapath and moves limits.
    pub interval: Duration,
    /// Whether the controller runs at all; off, every class keeps its configured policy.
    pub enabled: bool,
    /// The classes it moves: those listed, and (after [`ControllerConfig::adopt`]) those it
    /// moves by default.
    pub classes: BTreeMap<Class, ClassControl>,
    /// Classes listed as `mode: static`: the operator's, whatever the services.
    pub fixed: BTreeSet<Class>,
    /// Which of `classes` are there by default, not listed.
    pub defaulted: BTreeSet<Class>,
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            interval: Duration::from_millis(100),
            enabled: true,
            classes: BTreeMap::new(),
            fixed: BTreeSet::new(),
            defaulted: BTreeSet::new(),
        }
    }
}

impl ControllerConfig {
    /// The control a class gets when nothing is written for it: SIP originals by their service
    /// time (target 100 ms), new TLS sessions by the CPU left after resumed ones (80% of the
    /// CPUs, resumed handshakes waiting at most half a full one). `None`: no default law.
    pub fn default_for(class: Class) -> Option<ClassControl> {
        let raw = RawClass {
            mode: match class {
                Class::SipOriginal => "sip",
                Class::TlsNew => "tls",
                _ => return None,
            }
            .into(),
            ..RawClass::default()
        };
        raw.read(class).ok()
    }

    /// Puts each of `wanted` (the classes the configured services have a law for) under control
    /// with [`ControllerConfig::default_for`], unless the controller is off, the class is listed
    /// (controlled or static), or `owned` says the operator wrote its limits.
    pub fn adopt(
        &mut self,
        wanted: impl IntoIterator<Item = Class>,
        owned: impl Fn(Class) -> bool,
    ) {
        if !self.enabled {
            return;
        }
        for class in wanted {
            if self.classes.contains_key(&class) || self.fixed.contains(&class) || owned(class) {
                continue;
            }
            if let Some(c) = Self::default_for(class) {
                self.classes.insert(class, c);
                self.defaulted.insert(class);
            }
        }
    }
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawController {
    #[serde(default = "default_interval")]
    interval: Span,
    #[serde(default = "enabled", skip_serializing_if = "is_enabled")]
    enabled: bool,
    #[serde(default, deserialize_with = "checked_classes")]
    classes: BTreeMap<String, RawClass>,
}

fn enabled() -> bool {
    true
}

fn is_enabled(b: &bool) -> bool {
    *b
}

/// The classes, each checked as it is read, so that an error carries its line.
fn checked_classes<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, RawClass>, D::Error> {
    struct Classes;
    impl<'de> serde::de::Visitor<'de> for Classes {
        type Value = BTreeMap<String, RawClass>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a mapping of class names to their control")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(LimitableClass(class)) = map.next_key::<LimitableClass>()? {
                let name = class.name().to_string();
                let raw: RawClass = map.next_value()?;
                raw.check(class).map_err(A::Error::custom)?;
                out.insert(name, raw);
            }
            Ok(out)
        }
    }
    d.deserialize_map(Classes)
}

fn default_interval() -> Span {
    Span(Duration::from_millis(100))
}

#[derive(Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawClass {
    mode: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    target: Option<Span>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cpu_target: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    resumed_wait: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    ratio: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    min: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    max: Option<u64>,
}

impl RawClass {
    /// `mode: static` with nothing else: the class is the operator's.
    fn is_static(&self) -> bool {
        self.mode == "static"
    }

    /// Checks a class's entry: `Ok(None)` for a static one.
    fn check(&self, class: Class) -> Result<Option<ClassControl>, String> {
        if !self.is_static() {
            return self.read(class).map(Some);
        }
        let name = class.name();
        let extra = [
            ("target", self.target.is_some()),
            ("cpu_target", self.cpu_target.is_some()),
            ("resumed_wait", self.resumed_wait.is_some()),
            ("ratio", self.ratio.is_some()),
            ("min", self.min.is_some()),
            ("max", self.max.is_some()),
        ];
        match extra.iter().find(|(_, set)| *set) {
            Some((field, _)) => Err(format!(
                "{name}.{field}: a static class has no {field} (its limits are under policy:)"
            )),
            None => Ok(None),
        }
    }

    fn read(&self, class: Class) -> Result<ClassControl, String> {
        let name = class.name();
        let misplaced =
            |field: &str, modes: &str| Err(format!("{name}.{field}: only for mode {modes}"));
        if self.target.is_some() && self.mode != "sip" {
            return misplaced("target", "sip");
        }
        if self.cpu_target.is_some() && self.mode != "tls" {
            return misplaced("cpu_target", "tls");
        }
        if self.resumed_wait.is_some() && self.mode != "tls" {
            return misplaced("resumed_wait", "tls");
        }
        if self.ratio.is_some() && self.mode != "pdd" {
            return misplaced("ratio", "pdd");
        }
        let (mode, ceiling) = match self.mode.as_str() {
            "sip" => {
                if !matches!(class, Class::SipOriginal) {
                    return Err(format!("{name}: mode sip controls sip-original only"));
                }
                let target = self.target.map_or(Duration::from_millis(100), |t| t.0);
                if target >= Duration::from_millis(500) {
                    return Err(format!(
                        "{name}.target: {} must stay well under T1 = 500ms",
                        humantime::format_duration(target)
                    ));
                }
                (Mode::Sip { target }, MAX_BACKLOG)
            }
            "tls" => {
                if !matches!(class, Class::TlsNew) {
                    return Err(format!("{name}: mode tls controls tls-new only"));
                }
                let cpu_target = self.cpu_target.unwrap_or(0.8);
                if !(cpu_target > 0.0 && cpu_target <= 1.0) {
                    return Err(format!("{name}.cpu_target: {cpu_target} is not in (0, 1]"));
                }
                let wait = self.resumed_wait.unwrap_or(DEFAULT_RESUMED_WAIT);
                if !(wait > 0.0 && wait <= 100.0) {
                    return Err(format!("{name}.resumed_wait: {wait} is not in (0, 100]"));
                }
                (Mode::Tls { cpu_target, wait }, MAX_RATE)
            }
            "pdd" => {
                if !matches!(class, Class::TlsResumed) {
                    return Err(format!(
                        "{name}: mode pdd controls tls-resumed only (its share of backend slots against tls-new)"
                    ));
                }
                let ratio = self.ratio.unwrap_or(2.0);
                if !(ratio > 1.0 && ratio <= 100.0) {
                    return Err(format!("{name}.ratio: {ratio} is not in (1, 100]"));
                }
                let (min, max) = (self.min.unwrap_or(5), self.max.unwrap_or(95));
                if min > max || max > 100 {
                    return Err(format!(
                        "{name}: share bounds {min}..={max} (percent) are not within 0..=100 with min <= max"
                    ));
                }
                return Ok(ClassControl {
                    mode: Mode::Pdd { ratio },
                    min,
                    max,
                });
            }
            other => {
                return Err(format!(
                    "{name}.mode: unknown mode '{other}' (valid: sip, tls, pdd, static)"
                ));
            }
        };
        let min = self.min.unwrap_or(1);
        let max = self.max.unwrap_or(ceiling.min(100_000));
        if min > max || max > ceiling {
            return Err(format!(
                "{name}: bounds {min}..={max} are not within 0..={ceiling} with min <= max"
            ));
        }
        Ok(ClassControl { mode, min, max })
    }
}

impl<'de> Deserialize<'de> for ControllerConfig {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = RawController::deserialize(d)?;
        let (mut classes, mut fixed) = (BTreeMap::new(), BTreeSet::new());
        for (name, c) in &raw.classes {
            // Checked as read (see `checked_classes`); this cannot fail.
            let class =
                Class::from_name(name).ok_or_else(|| D::Error::custom(unknown_class(name)))?;
            match c.check(class).map_err(D::Error::custom)? {
                Some(control) => {
                    if !raw.enabled {
                        return Err(D::Error::custom(format!(
                            "controller.classes.{name}: the controller is off (enabled: false); \
                             list a class here only to control it, or as mode: static"
                        )));
                    }
                    classes.insert(class, control);
                }
                None => {
                    fixed.insert(class);
                }
            }
        }
        Ok(ControllerConfig {
            interval: raw.interval.0,
            enabled: raw.enabled,
            classes,
            fixed,
            defaulted: BTreeSet::new(),
        })
    }
}

impl Serialize for ControllerConfig {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let statics = self.fixed.iter().map(|class| {
            let raw = RawClass {
                mode: "static".into(),
                ..RawClass::default()
            };
            (class.name().to_string(), raw)
        });
        let classes = self
            .classes
            .iter()
            .map(|(class, c)| {
                let (mode, target, tls, ratio) = match c.mode {
                    Mode::Sip { target } => ("sip", Some(Span(target)), None, None),
                    Mode::Tls { cpu_target, wait } => ("tls", None, Some((cpu_target, wait)), None),
                    Mode::Pdd { ratio } => ("pdd", None, None, Some(ratio)),
                };
                let raw = RawClass {
                    mode: mode.into(),
                    target,
                    cpu_target: tls.map(|t| t.0),
                    resumed_wait: tls.map(|t| t.1),
                    ratio,
                    min: Some(c.min),
                    max: Some(c.max),
                };
                (class.name().to_string(), raw)
            })
            .chain(statics)
            .collect();
        RawController {
            interval: Span(self.interval),
            enabled: self.enabled,
            classes,
        }
        .serialize(s)
    }
}
