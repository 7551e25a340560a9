//! Human and JSON renderings of what the commands show.

use gateway_common::counters::Counters;
use gateway_common::{
    Class,
    maps::{
        ClassPolicy, ClassState, ClassStats, DatapathCounters, LatencyHistogram, ServiceKey,
        ServiceValue, TlsCounters,
    },
};
use serde_json::{Value, json};

use crate::{config::Proto, datapath::loader::AttachmentStatus};

/// Everything `gateway stats` shows for one interface.
pub struct StatsView<'a> {
    /// The attachment.
    pub info: &'a AttachmentStatus,
    /// Per-class counters, by class id.
    pub classes: &'a [ClassStats],
    /// Per-class admission state, by class id.
    pub state: &'a [ClassState],
    /// Parser counters.
    pub counters: &'a DatapathCounters,
    /// TLS counters.
    pub tls: &'a TlsCounters,
    /// Service times (admission to the server's first answer), by class id.
    pub latency: &'a [LatencyHistogram],
    /// The limits in force, by class (so `--watch` shows a controller moving them).
    pub policies: &'a [(Class, ClassPolicy)],
    /// When the counters were read.
    pub time: std::time::SystemTime,
    /// Per-class rates since the previous read (`--watch` after its first print).
    pub rates: Option<&'a [Rates]>,
}

/// One class's rates over an interval, per second.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rates {
    /// Packets.
    pub packets: f64,
    /// Admissions.
    pub admitted: f64,
    /// Refusals (by backlog or rate).
    pub refused: f64,
}

impl Rates {
    /// Each class's rates from `before` to `now`, `secs` apart.
    pub fn between(before: &[ClassStats], now: &[ClassStats], secs: f64) -> Vec<Rates> {
        let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / secs.max(1e-9);
        now.iter()
            .zip(before)
            .map(|(n, b)| Rates {
                packets: per(n.packets, b.packets),
                admitted: per(n.admitted, b.admitted),
                refused: per(
                    n.dropped_backlog + n.dropped_rate,
                    b.dropped_backlog + b.dropped_rate,
                ),
            })
            .collect()
    }
}

/// The limits of `m` in the words `policy show` uses.
fn limits_json(m: &ClassPolicy) -> Value {
    let p = gateway_common::policy::Policy::from_map(m);
    json!({"backlog_limit": p.backlog, "rate": p.rate, "burst": p.burst,
           "owner": m.owner_name(), "reason": m.reason_name()})
}

/// Seconds since the Unix epoch.
fn unix_seconds(t: std::time::SystemTime) -> f64 {
    t.duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

impl StatsView<'_> {
    /// Every packet the program saw: the sum of the per-class counts.
    pub fn total_packets(&self) -> u64 {
        self.classes.iter().map(|c| c.packets).sum()
    }

    /// JSON rendering.
    pub fn json(&self) -> Value {
        let classes: Vec<Value> = Class::ALL
            .iter()
            .map(|c| {
                let s = &self.classes[c.id() as usize];
                let st = &self.state[c.id() as usize];
                let h = &self.latency[c.id() as usize];
                let limits = self
                    .policies
                    .iter()
                    .find(|(p, _)| p == c)
                    .map_or(Value::Null, |(_, m)| limits_json(m));
                let rates = self.rates.map_or(Value::Null, |r| {
                    let r = r[c.id() as usize];
                    json!({"packets": r.packets, "admitted": r.admitted, "refused": r.refused})
                });
                json!({
                    "id": c.id(), "name": c.name(), "packets": s.packets, "bytes": s.bytes,
                    "admitted": s.admitted, "completed": st.completed,
                    "dropped_backlog": s.dropped_backlog,
                    "dropped_rate": s.dropped_rate, "rejected": s.rejected,
                    "replies_limited": s.replies_limited,
                    "backlog": st.backlog(), "expired": st.expired, "continued": st.continued,
                    "limits": limits,
                    "per_second": rates,
                    "service_time_samples": h.count(),
                    "service_time_us_p50": h.quantile_us(500),
                    "service_time_us_p90": h.quantile_us(900),
                    "service_time_us_p99": h.quantile_us(990),
                })
            })
            .collect();
        let mut datapath = serde_json::Map::new();
        datapath.insert("packets".into(), self.total_packets().into());
        datapath.extend(counter_map(self.counters));
        let sip = &self.latency[Class::SipOriginal.id() as usize];
        json!({
            "time": unix_seconds(self.time),
            "iface": self.info.iface, "mode": self.info.mode,
            "link_id": self.info.link_id, "program_id": self.info.program_id,
            "classes": classes,
            "datapath": datapath,
            "tls": counter_map(self.tls),
            "sip": {
                "service_time_samples": sip.count(),
                "service_time_us_p50": sip.quantile_us(500),
                "service_time_us_p90": sip.quantile_us(900),
                "service_time_us_p99": sip.quantile_us(990),
                "service_time_buckets": sip.buckets.to_vec(),
            },
        })
    }

    /// Table rendering.
    pub fn table(&self) -> String {
        let i = self.info;
        let at = humantime::format_rfc3339_seconds(self.time);
        let mut out = format!(
            "{} ({} mode, link {}, program {}) at {at}\n{:<20}{:>12}{:>14}{:>12}{:>14}{:>12}{:>10}{:>9}{:>9}",
            i.iface,
            i.mode,
            i.link_id,
            i.program_id,
            "class",
            "packets",
            "bytes",
            "admitted",
            "drop-backlog",
            "drop-rate",
            "rejected",
            "backlog",
            "expired"
        );
        if self.rates.is_some() {
            out += &format!("{:>11}{:>12}{:>12}", "packets/s", "admitted/s", "refused/s");
        }
        out.push('\n');
        for c in Class::ALL {
            let s = &self.classes[c.id() as usize];
            out += &format!(
                "{:<20}{:>12}{:>14}{:>12}{:>14}{:>12}{:>10}{:>9}{:>9}",
                c.name(),
                s.packets,
                s.bytes,
                s.admitted,
                s.dropped_backlog,
                s.dropped_rate,
                s.rejected,
                self.state[c.id() as usize].backlog(),
                self.state[c.id() as usize].expired
            );
            if let Some(r) = self.rates {
                let r = r[c.id() as usize];
                out += &format!("{:>11.1}{:>12.1}{:>12.1}", r.packets, r.admitted, r.refused);
            }
            out.push('\n');
        }
        out += &format!(
            "datapath: packets {}{}\n",
            self.total_packets(),
            counter_line(self.counters)
        );
        out += &format!("tls:{}\n", counter_line(self.tls));
        let limits: Vec<String> = self
            .policies
            .iter()
            .filter(|(_, m)| m.limits())
            .map(|(c, m)| {
                let p = gateway_common::policy::Policy::from_map(m);
                let mut parts = Vec::new();
                if let Some(b) = p.backlog {
                    parts.push(format!("backlog {b}"));
                }
                if let Some(r) = p.rate {
                    parts.push(format!("rate {r}/s"));
                }
                format!(
                    "{} {} ({}, {})",
                    c.name(),
                    parts.join(" "),
                    m.owner_name(),
                    m.reason_name()
                )
            })
            .collect();
        out += &format!(
            "limits: {}\n",
            if limits.is_empty() {
                "none".to_string()
            } else {
                limits.join(", ")
            }
        );
        for class in [Class::SipOriginal, Class::TlsNew, Class::TlsResumed] {
            let h = &self.latency[class.id() as usize];
            if h.count() == 0 && class != Class::SipOriginal {
                continue;
            }
            let q = |p| {
                h.quantile_us(p)
                    .map_or("-".to_owned(), |us| format!("<{us}us"))
            };
            out += &format!(
                "{} service time (admission to the server's first answer): samples {} p50 {} p90 {} p99 {}\n",
                class.name(),
                h.count(),
                q(500),
                q(900),
                q(990)
            );
        }
        out
    }
}

fn limit_text(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

/// `policy show` rows: (class, policy, state). Besides the limits and the backlog, each row says
/// who set the limits (config, operator, controller; `pinned` when fixed by hand), why, how long
/// ago, and within which bounds a controller moves them.
/// One method family of `sip-original` as `policy show` lists it: its name, its backlog and
/// its limit (0: none, the class's alone).
pub struct FamilyRow {
    /// `invite` or `other`.
    pub method: &'static str,
    /// Units outstanding.
    pub backlog: u64,
    /// The family's backlog limit; 0 for none.
    pub limit: u64,
}

/// `policy show` rows: each limitable class, and under `sip-original` its method families.
pub fn policies(
    rows: &[(Class, ClassPolicy, ClassState)],
    families: &[FamilyRow],
    as_json: bool,
) -> String {
    let now = crate::datapath::maps::monotonic_ns();
    let ago_ms =
        |m: &ClassPolicy| (m.changed_ns != 0).then(|| now.saturating_sub(m.changed_ns) / 1_000_000);
    let owner = |m: &ClassPolicy| {
        if m.pinned() {
            format!("{} (pinned)", m.owner_name())
        } else {
            m.owner_name().to_string()
        }
    };
    let bounds =
        |m: &ClassPolicy| (m.bound_max != 0).then(|| format!("{}..{}", m.bound_min, m.bound_max));
    // What a refusal gets, with the class's defaults filled in.
    let refuse = |c: Class, m: &ClassPolicy| {
        if gateway_common::maps::replies_to_refusals(c, m) {
            format!("reject@{}/s", gateway_common::maps::reply_rate(m))
        } else {
            "drop".to_owned()
        }
    };
    if as_json {
        let v: Vec<Value> = rows
            .iter()
            .map(|(c, m, s)| {
                // The limits and who set them in the words `stats --json` uses, and the rest.
                let mut row = limits_json(m);
                let rest = json!({"class": c.name(), "backlog": s.backlog(),
                       "timeout_ms": gateway_common::maps::timeout_ns(*c, m) / 1_000_000,
                       "admitted": s.admitted, "completed": s.completed,
                       "expired": s.expired,
                       "pinned": m.pinned(),
                       "changed_ms_ago": ago_ms(m),
                       "bound_min": (m.bound_max != 0).then_some(m.bound_min),
                       "bound_max": (m.bound_max != 0).then_some(m.bound_max),
                       "refuse": if gateway_common::maps::replies_to_refusals(*c, m) {
                           "reject" } else { "drop" },
                       "reply_rate": gateway_common::maps::reply_rate(m),
                       "retry_after_s": (m.retry_after_s != 0).then_some(m.retry_after_s)});
                if let (Some(row), Value::Object(rest)) = (row.as_object_mut(), rest) {
                    row.extend(rest);
                    if *c == Class::SipOriginal && !families.is_empty() {
                        let f: Vec<Value> = families
                            .iter()
                            .map(|f| {
                                json!({"method": f.method, "backlog": f.backlog,
                                       "backlog_limit": (f.limit != 0).then_some(f.limit)})
                            })
                            .collect();
                        row.insert("families".into(), Value::Array(f));
                    }
                }
                row
            })
            .collect();
        return Value::Array(v).to_string();
    }
    let mut out = format!(
        "{:<20}{:>14}{:>12}{:>10}{:>10}{:>10}{:>10}  {:<20}{:<13}{:>10}  {:<10}{:<18}\n",
        "class",
        "backlog-limit",
        "rate/s",
        "burst",
        "timeout",
        "backlog",
        "expired",
        "owner",
        "why",
        "changed",
        "bounds",
        "refuse"
    );
    for (c, m, s) in rows {
        let p = gateway_common::policy::Policy::from_map(m);
        out += &format!(
            "{:<20}{:>14}{:>12}{:>10}{:>10}{:>10}{:>10}  {:<20}{:<13}{:>10}  {:<10}{:<18}\n",
            c.name(),
            limit_text(p.backlog),
            limit_text(p.rate),
            limit_text(p.burst),
            format!("{}ms", gateway_common::maps::timeout_ns(*c, m) / 1_000_000),
            s.backlog(),
            s.expired,
            owner(m),
            m.reason_name(),
            ago_ms(m).map_or("-".to_owned(), |ms| format!(
                "{:.1}s ago",
                ms as f64 / 1000.0
            )),
            bounds(m).unwrap_or_else(|| "-".to_owned()),
            refuse(*c, m)
        );
        if *c == Class::SipOriginal {
            for f in families {
                let limit = (f.limit != 0).then_some(f.limit);
                out += &format!(
                    "{:<20}{:>14}{:>12}{:>10}{:>10}{:>10}\n",
                    format!("  method {}", f.method),
                    limit_text(limit),
                    "",
                    "",
                    "",
                    f.backlog
                );
            }
        }
    }
    out
}

/// `service list` rows.
pub fn services(rows: &[(ServiceKey, ServiceValue)], as_json: bool) -> String {
    let kind = |v: &ServiceValue| {
        gateway_common::maps::ServiceKind::from_id(v.kind).map_or("unknown", |k| k.name())
    };
    let proto = |k: &ServiceKey| Proto::from_number(k.proto).map_or("?", Proto::name);
    // Who answers the service's SYNs: the NIC with cookies, or the kernel.
    let cookies = |v: &ServiceValue| v.flags & gateway_common::maps::SERVICE_SYN_COOKIES != 0;
    if as_json {
        let v: Vec<Value> = rows
            .iter()
            .map(|(k, v)| {
                json!({
                    "kind": kind(v),
                    "proto": proto(k),
                    "port": k.port,
                    "syn_cookies": cookies(v),
                })
            })
            .collect();
        return Value::Array(v).to_string();
    }
    let mut out = format!("{:<6}{:<6}{:>6}  {}\n", "kind", "proto", "port", "syn");
    for (k, v) in rows {
        let syn = if cookies(v) { "cookies" } else { "kernel" };
        out += &format!("{:<6}{:<6}{:>6}  {syn}\n", kind(v), proto(k), k.port);
    }
    out
}

/// A counter struct's fields as a JSON object, by field name.
fn counter_map<T: Counters>(c: &T) -> serde_json::Map<String, Value> {
    T::FIELDS
        .iter()
        .map(|f| (f.name.to_string(), Value::from((f.get)(c))))
        .collect()
}

/// A counter struct's fields as ` name value` pairs, names with dashes.
fn counter_line<T: Counters>(c: &T) -> String {
    T::FIELDS
        .iter()
        .map(|f| format!(" {} {}", f.label(), (f.get)(c)))
        .collect()
}

/// One class's limits in a line, as `policy set` and a reload's report say them.
pub fn describe_policy(p: &gateway_common::policy::Policy) -> String {
    let show = |v: Option<u64>| v.map_or("unlimited".to_owned(), |v| v.to_string());
    let timeout = p.timeout.map_or("default".to_owned(), |t| {
        humantime::format_duration(t).to_string()
    });
    format!(
        "backlog {}, rate {}/s, burst {}, timeout {timeout}, refuse {}, reply rate {}/s{}",
        show(p.backlog),
        show(p.rate),
        p.burst.unwrap_or(0),
        p.refuse.map_or("default", |r| r.name()),
        p.reply_rate
            .unwrap_or(gateway_common::maps::DEFAULT_REPLY_RATE),
        p.retry_after
            .map_or(String::new(), |s| format!(", retry-after {s}s"))
    )
}
