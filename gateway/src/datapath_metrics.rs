//! The datapath's counters for Prometheus, read from the pinned maps at each scrape: per class
//! (packets, bytes, admitted, completed, expired, dropped by reason, rejected, replies limited,
//! backlog, and the limits in force with who set them), the TLS counters and the parser
//! counters, and whether the program is attached, per interface. Series are listed in label
//! order, the same at every scrape.

use std::{fmt, sync::Arc};

use gateway_common::{Class, counters::Counters, maps::AttachMode};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{MetricType, counter::Counter, gauge::Gauge},
};
use tracing::warn;

use crate::{
    datapath::attached::Attached,
    datapath::maps::{Maps, MapsError},
    metrics::family::Sorted,
};

/// Labels of a per-interface series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct IfaceLabels {
    iface: String,
}

/// Labels of a per-class series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ClassLabels {
    iface: String,
    class: &'static str,
}

/// Labels of a per-class refusal series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct DropLabels {
    iface: String,
    class: &'static str,
    reason: &'static str,
}

/// Labels of a limit in force.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct LimitLabels {
    iface: String,
    class: &'static str,
    /// Who set it: `config`, `operator` or `controller`.
    owner: &'static str,
}

/// The limits a class may have, each a family of its own unit.
#[derive(Clone, Copy)]
enum Limit {
    /// Admitted units at once.
    Backlog = 0,
    /// Admissions per second.
    Rate = 1,
    /// Admissions above the rate at once.
    Burst = 2,
}

/// Labels of the attachment gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct AttachLabels {
    iface: String,
    /// `native`, `generic` or `tc`.
    mode: &'static str,
}

/// Reads every attached interface's maps when scraped.
pub struct DatapathCollector {
    ifaces: Vec<Arc<Attached>>,
}

impl fmt::Debug for DatapathCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.ifaces.iter().map(|a| a.iface()).collect();
        f.debug_struct("DatapathCollector")
            .field("ifaces", &names)
            .finish()
    }
}

impl DatapathCollector {
    /// A collector over the attached interfaces `ifaces`.
    pub fn new(ifaces: &[Arc<Attached>]) -> Self {
        DatapathCollector {
            ifaces: ifaces.to_vec(),
        }
    }
}

/// One scrape's values, built into families and encoded.
#[derive(Default)]
struct Scrape {
    packets: Sorted<ClassLabels, Counter>,
    bytes: Sorted<ClassLabels, Counter>,
    admitted: Sorted<ClassLabels, Counter>,
    dropped: Sorted<DropLabels, Counter>,
    rejected: Sorted<ClassLabels, Counter>,
    replies_limited: Sorted<ClassLabels, Counter>,
    completed: Sorted<ClassLabels, Counter>,
    expired: Sorted<ClassLabels, Counter>,
    backlog: Sorted<ClassLabels, Gauge>,
    limits: [Sorted<LimitLabels, Gauge>; 3],
    attached: Sorted<AttachLabels, Gauge>,
    tls: Vec<(&'static str, &'static str, Sorted<IfaceLabels, Counter>)>,
    parser: Vec<(&'static str, &'static str, Sorted<IfaceLabels, Counter>)>,
}

fn add(
    list: &mut Vec<(&'static str, &'static str, Sorted<IfaceLabels, Counter>)>,
    name: &'static str,
    help: &'static str,
    iface: &str,
    v: u64,
) {
    let pos = match list.iter().position(|(n, _, _)| *n == name) {
        Some(p) => p,
        None => {
            list.push((name, help, Sorted::default()));
            list.len() - 1
        }
    };
    list[pos]
        .2
        .get_or_create(&IfaceLabels {
            iface: iface.to_string(),
        })
        .inc_by(v);
}

/// Adds every field of the counter struct `c` to `list`, one series per field.
fn add_all<T: Counters>(
    list: &mut Vec<(&'static str, &'static str, Sorted<IfaceLabels, Counter>)>,
    c: &T,
    iface: &str,
) {
    for f in T::FIELDS {
        add(list, f.name, f.help(), iface, (f.get)(c));
    }
}

impl Scrape {
    fn read(&mut self, attached: &Attached, maps: &Maps) -> Result<(), MapsError> {
        let iface = attached.iface();
        let config = maps.config()?;
        self.attached
            .get_or_create(&AttachLabels {
                iface: iface.to_string(),
                mode: AttachMode::from_id(config.attach_mode).name(),
            })
            .set(i64::from(attached.pins().is_attached()));
        let stats = maps.class_stats()?;
        let state = maps.class_state()?;
        for c in Class::ALL {
            let i = c.id() as usize;
            let l = ClassLabels {
                iface: iface.to_string(),
                class: c.name(),
            };
            let s = &stats[i];
            self.packets.get_or_create(&l).inc_by(s.packets);
            self.bytes.get_or_create(&l).inc_by(s.bytes);
            self.admitted.get_or_create(&l).inc_by(s.admitted);
            self.rejected.get_or_create(&l).inc_by(s.rejected);
            self.replies_limited
                .get_or_create(&l)
                .inc_by(s.replies_limited);
            self.completed.get_or_create(&l).inc_by(state[i].completed);
            self.expired.get_or_create(&l).inc_by(state[i].expired);
            let policy = maps.policy(c)?;
            let owner = policy.owner_name();
            let limit = |limit: Limit, v: u64| {
                self.limits[limit as usize]
                    .get_or_create(&LimitLabels {
                        iface: iface.to_string(),
                        class: c.name(),
                        owner,
                    })
                    .set(v.min(i64::MAX as u64) as i64);
            };
            if let Some(backlog) = policy.backlog_in_force() {
                limit(Limit::Backlog, backlog);
            }
            if let Some(rate) = policy.rate_in_force() {
                limit(Limit::Rate, rate);
                limit(Limit::Burst, policy.burst);
            }
            for (reason, v) in [("backlog", s.dropped_backlog), ("rate", s.dropped_rate)] {
                let d = DropLabels {
                    iface: iface.to_string(),
                    class: c.name(),
                    reason,
                };
                self.dropped.get_or_create(&d).inc_by(v);
            }
            self.backlog
                .get_or_create(&l)
                .set(state[i].backlog().min(i64::MAX as u64) as i64);
        }
        add_all(&mut self.tls, &maps.tls_counters()?, iface);
        add_all(&mut self.parser, &maps.counters()?, iface);
        Ok(())
    }

    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        let classes = [
            ("gateway_class_packets", "Packets per class", &self.packets),
            ("gateway_class_bytes", "Bytes per class", &self.bytes),
            (
                "gateway_class_admitted",
                "Admissions per class",
                &self.admitted,
            ),
            (
                "gateway_class_rejected",
                "Refusals answered (a TCP reset, a SIP 503), within the class's reply rate",
                &self.rejected,
            ),
            (
                "gateway_class_replies_limited",
                "Refusals left unanswered because the class's reply rate was spent",
                &self.replies_limited,
            ),
            (
                "gateway_class_completed",
                "Admitted units the server answered (a TLS server flight, a SIP final response)",
                &self.completed,
            ),
            (
                "gateway_class_expired",
                "Admitted units the server left unanswered past their timeout, released",
                &self.expired,
            ),
        ];
        for (name, help, fam) in classes {
            fam.encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)?;
        }
        self.dropped.encode(e.encode_descriptor(
            "gateway_class_dropped",
            "Refusals per class, by reason",
            None,
            MetricType::Counter,
        )?)?;
        self.backlog.encode(e.encode_descriptor(
            "gateway_class_backlog",
            "Admitted units not yet ended (admitted - completed - expired)",
            None,
            MetricType::Gauge,
        )?)?;
        // One family per limit, each of one unit; a class with no series in a family has no
        // such limit.
        let limits = [
            (
                "gateway_class_backlog_limit",
                "The backlog limit in force (admitted units at once), with who set it",
            ),
            (
                "gateway_class_rate_limit_per_second",
                "The rate limit in force (admissions per second), with who set it",
            ),
            (
                "gateway_class_burst_limit",
                "The burst in force above the rate (admissions at once), with who set it",
            ),
        ];
        for ((name, help), fam) in limits.into_iter().zip(&self.limits) {
            fam.encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        self.attached.encode(e.encode_descriptor(
            "gateway_datapath_attached",
            "1 while the interface's program is attached (its link pinned), 0 once it is gone",
            None,
            MetricType::Gauge,
        )?)?;
        for (prefix, list) in [
            ("gateway_tls_", &self.tls),
            ("gateway_parser_", &self.parser),
        ] {
            for (name, help, fam) in list {
                let full = format!("{prefix}{name}");
                fam.encode(e.encode_descriptor(&full, help, None, MetricType::Counter)?)?;
            }
        }
        Ok(())
    }
}

impl Collector for DatapathCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let mut scrape = Scrape::default();
        for a in &self.ifaces {
            if let Err(e) = scrape.read(a, &a.maps()) {
                warn!(iface = %a.iface(), error = %e, "metrics: cannot read the datapath maps");
            }
        }
        scrape.encode(encoder)
    }
}
