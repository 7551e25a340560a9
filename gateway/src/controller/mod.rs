//! The adaptive controller: the daemon closes the loop. Every interval it reads each
//! controlled class's deltas from the datapath of every attached interface, runs the class's law
//! ([`law`]) and writes the limit the law wants into the class's policy, saying who set it, when
//! and why (`ClassPolicy::owner`, `reason`, `changed_ns`, `bound_min`, `bound_max`).
//!
//! Who owns a limit: operators set bounds and targets in the config; the controller moves the
//! effective limit inside them. A class an operator pinned (`policy set --pin`) is left alone
//! until it is unpinned, and the controller then starts from the operator's value.

pub mod law;
pub mod sim;

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use gateway_common::{
    Class, NUM_CLASSES,
    maps::{
        ClassPolicy, ClassState, ClassStats, LatencyHistogram, OWNER_CONTROLLER,
        POLICY_LIMIT_BACKLOG, POLICY_LIMIT_RATE, POLICY_PINNED,
    },
};
use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    attached::Attached,
    config::{ControllerConfig, Mode},
    maps::{Maps, MapsError, monotonic_ns},
};
use law::{Decision, HandshakeBudgetLaw, HandshakeCosts, Observation, Reason, ServiceTimeLaw};

/// Where the TLS law gets the costs of a full and a resumed handshake (the daemon's proxies
/// measure them); `None` until both were measured.
pub type CostSource = Arc<dyn Fn() -> Option<HandshakeCosts> + Send + Sync>;

/// [`ClassPolicy::reason`] of a limit the controller set when it took a class over.
pub const REASON_START: u32 = 6;

/// The name of a [`ClassPolicy::reason`].
pub fn reason_name(reason: u32) -> &'static str {
    match reason {
        0 => "set",
        REASON_START => "start",
        r => Reason::from_id(r).map_or("unknown", Reason::name),
    }
}

/// One class's law.
#[derive(Clone, Copy, Debug)]
enum Law {
    Sip(ServiceTimeLaw),
    Tls(HandshakeBudgetLaw),
}

/// What the controller read last from one interface.
#[derive(Clone, Copy)]
struct Snapshot {
    state: [ClassState; NUM_CLASSES],
    stats: [ClassStats; NUM_CLASSES],
    latency: LatencyHistogram,
}

impl Snapshot {
    fn read(maps: &Maps) -> Result<Self, MapsError> {
        Ok(Snapshot {
            state: maps.class_state()?,
            stats: maps.class_stats()?,
            latency: maps.latency(Class::SipOriginal)?,
        })
    }
}

/// One interface under control.
struct Plant {
    attached: Arc<Attached>,
    laws: BTreeMap<Class, Law>,
    last: Option<Snapshot>,
}

/// Labels of the controller's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Labels {
    iface: String,
    class: &'static str,
}

/// The controller's inputs and outputs, for Prometheus.
#[derive(Default, Clone)]
pub struct ControllerStats {
    limit: Family<Labels, Gauge>,
    delay_us: Family<Labels, Gauge>,
    target_us: Family<Labels, Gauge>,
}

impl ControllerStats {
    /// Registers the series (prefix `gateway_controller_`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("gateway_controller");
        r.register(
            "limit",
            "The limit the controller set (backlog for sip, new handshakes per second for tls)",
            self.limit.clone(),
        );
        r.register(
            "delay_microseconds",
            "The service time the controller saw in its last interval (its input, sip mode)",
            self.delay_us.clone(),
        );
        r.register(
            "target_microseconds",
            "The service time the controller holds the class under (its set point, sip mode)",
            self.target_us.clone(),
        );
    }
}

/// The controller of every attached interface.
pub struct Controller {
    cfg: ControllerConfig,
    plants: Vec<Plant>,
    costs: CostSource,
    stats: ControllerStats,
    cores: f64,
    /// The daemon's CPU time at the last interval.
    cpu: Option<Duration>,
}

/// The CPU time this process has used (all threads, user and system).
fn process_cpu() -> Option<Duration> {
    use nix::sys::resource::{UsageWho, getrusage};
    let u = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    Some(tv(u.user_time()) + tv(u.system_time()))
}

impl Controller {
    /// A controller for `ifaces` per `cfg`, with handshake costs from `costs`, for a server of
    /// `cores` CPUs (the daemon's worker threads, or the CPUs it may run on).
    pub fn new(
        cfg: &ControllerConfig,
        ifaces: &[Arc<Attached>],
        costs: CostSource,
        stats: ControllerStats,
        cores: usize,
    ) -> Self {
        let cores = cores.max(1) as f64;
        let plants = ifaces
            .iter()
            .map(|a| Plant {
                attached: a.clone(),
                laws: cfg
                    .classes
                    .iter()
                    .map(|(class, c)| {
                        let law = match c.mode {
                            Mode::Sip { target } => {
                                Law::Sip(ServiceTimeLaw::new(target, c.min, c.max, c.max))
                            }
                            Mode::Tls { cpu_target } => {
                                Law::Tls(HandshakeBudgetLaw::new(cpu_target, cores, c.min, c.max))
                            }
                        };
                        (*class, law)
                    })
                    .collect(),
                last: None,
            })
            .collect();
        Controller {
            cfg: cfg.clone(),
            plants,
            costs,
            stats,
            cores,
            cpu: None,
        }
    }

    /// Whether there is anything to control.
    pub fn is_idle(&self) -> bool {
        self.cfg.classes.is_empty() || self.plants.is_empty()
    }

    /// Runs one interval every `interval` until `stop`.
    pub async fn run(mut self, stop: CancellationToken) {
        if self.is_idle() {
            return;
        }
        info!(
            interval = ?self.cfg.interval, classes = self.cfg.classes.len(), cores = self.cores,
            "controller running"
        );
        let mut tick = tokio::time::interval(self.cfg.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last = Instant::now();
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            let now = Instant::now();
            let elapsed = now.duration_since(last).max(Duration::from_millis(1));
            last = now;
            self.tick(elapsed);
        }
    }

    /// One interval of `elapsed` on every interface.
    pub fn tick(&mut self, elapsed: Duration) {
        let costs = (self.costs)();
        // How busy the daemon's CPUs were (its proxies' handshakes, relays and refusals).
        let now = process_cpu();
        let busy = match (self.cpu, now) {
            (Some(before), Some(now)) => Some(
                now.saturating_sub(before).as_secs_f64() / (self.cores * elapsed.as_secs_f64()),
            ),
            _ => None,
        };
        self.cpu = now;
        for plant in &mut self.plants {
            if let Err(e) = step(plant, &self.cfg, elapsed, costs, busy, &self.stats) {
                warn!(iface = %plant.attached.iface(), error = %e, "controller: cannot read or write the maps");
            }
        }
    }
}

/// One interval on one interface.
fn step(
    plant: &mut Plant,
    cfg: &ControllerConfig,
    elapsed: Duration,
    costs: Option<HandshakeCosts>,
    busy: Option<f64>,
    stats: &ControllerStats,
) -> Result<(), MapsError> {
    let iface = plant.attached.iface().to_string();
    let mut maps = plant.attached.maps();
    let now = Snapshot::read(&maps)?;
    let Some(before) = plant.last.replace(now) else {
        // The first interval only takes the classes over: from the limits a controller left
        // (a reload, a restart that kept the datapath), else from the upper bound.
        for (class, law) in plant.laws.iter_mut() {
            let p = maps.policy(*class)?;
            if p.flags & POLICY_PINNED != 0 {
                continue;
            }
            if p.owner == OWNER_CONTROLLER {
                match law {
                    Law::Sip(l) if p.flags & POLICY_LIMIT_BACKLOG != 0 => l.reset(p.backlog_limit),
                    Law::Tls(l) if p.flags & POLICY_LIMIT_RATE != 0 => l.reset(p.rate_per_sec),
                    _ => {}
                }
            }
            let (limit, bounds) = current(law, &cfg.classes[class]);
            write(&mut maps, *class, law, limit, REASON_START, bounds)?;
        }
        return Ok(());
    };
    for (class, law) in plant.laws.iter_mut() {
        let policy = maps.policy(*class)?;
        let labels = Labels {
            iface: iface.clone(),
            class: class.name(),
        };
        if policy.flags & POLICY_PINNED != 0 {
            continue;
        }
        let bounds = (cfg.classes[class].min, cfg.classes[class].max);
        if policy.owner != OWNER_CONTROLLER {
            // Unpinned by an operator: start from the operator's value.
            let from = match law {
                Law::Sip(l) => {
                    if policy.flags & POLICY_LIMIT_BACKLOG != 0 {
                        l.reset(policy.backlog_limit);
                    }
                    l.limit()
                }
                Law::Tls(l) => {
                    if policy.flags & POLICY_LIMIT_RATE != 0 {
                        l.reset(policy.rate_per_sec);
                    }
                    l.rate()
                }
            };
            write(&mut maps, *class, law, from, REASON_START, bounds)?;
            continue;
        }
        let decision: Option<Decision> = match law {
            Law::Sip(l) => {
                let i = class.id() as usize;
                let (s, b) = (&now.state[i], &before.state[i]);
                let dropped = |x: &ClassStats| x.dropped_backlog + x.dropped_rate;
                let o = Observation {
                    interval: elapsed,
                    admitted: s.admitted.saturating_sub(b.admitted),
                    completed: s.completed.saturating_sub(b.completed),
                    expired: s.expired.saturating_sub(b.expired),
                    refused: dropped(&now.stats[i]).saturating_sub(dropped(&before.stats[i])),
                    backlog: s.backlog(),
                    service_p90: now
                        .latency
                        .since(&before.latency)
                        .quantile_within_us(900)
                        .map(Duration::from_micros),
                };
                if let Some(d) = o.delay() {
                    stats
                        .delay_us
                        .get_or_create(&labels)
                        .set(d.as_micros().min(i64::MAX as u128) as i64);
                }
                if let Mode::Sip { target } = cfg.classes[class].mode {
                    stats
                        .target_us
                        .get_or_create(&labels)
                        .set(target.as_micros() as i64);
                }
                l.step(&o)
            }
            Law::Tls(l) => {
                let Some(costs) = costs else { continue };
                let i = Class::TlsResumed.id() as usize;
                let resumed = now.state[i]
                    .admitted
                    .saturating_sub(before.state[i].admitted);
                l.step(elapsed, resumed, costs, busy)
            }
        };
        if let Some(d) = decision {
            debug!(%iface, class = class.name(), limit = d.limit, reason = d.reason.name(), "controller");
            write(&mut maps, *class, law, d.limit, d.reason as u32, bounds)?;
            stats
                .limit
                .get_or_create(&labels)
                .set(d.limit.min(i64::MAX as u64) as i64);
        }
    }
    Ok(())
}

/// The limit a law holds now and its bounds.
fn current(law: &Law, c: &crate::config::ClassControl) -> (u64, (u64, u64)) {
    let limit = match law {
        Law::Sip(l) => l.limit(),
        Law::Tls(l) => l.rate(),
    };
    (limit, (c.min, c.max))
}

/// Writes `limit` into `class`'s policy (and, for SIP, half of it into the retransmissions'),
/// as the controller's, keeping every other field.
fn write(
    maps: &mut Maps,
    class: Class,
    law: &Law,
    limit: u64,
    reason: u32,
    (min, max): (u64, u64),
) -> Result<(), MapsError> {
    let stamp = |p: ClassPolicy| ClassPolicy {
        owner: OWNER_CONTROLLER,
        reason,
        changed_ns: monotonic_ns(),
        bound_min: min,
        bound_max: max,
        ..p
    };
    let p = maps.policy(class)?;
    match law {
        Law::Sip(_) => {
            maps.set_policy(
                class,
                stamp(ClassPolicy {
                    backlog_limit: limit,
                    flags: p.flags | POLICY_LIMIT_BACKLOG,
                    ..p
                }),
            )?;
            // Retransmissions strictly below originals (RFC 7415's TAU1 < TAU2), unless pinned.
            let r = maps.policy(Class::SipRetransmission)?;
            if r.flags & POLICY_PINNED == 0 {
                maps.set_policy(
                    Class::SipRetransmission,
                    stamp(ClassPolicy {
                        backlog_limit: limit / 2,
                        flags: r.flags | POLICY_LIMIT_BACKLOG,
                        bound_min: min / 2,
                        bound_max: max / 2,
                        ..r
                    }),
                )?;
            }
        }
        Law::Tls(_) => {
            maps.set_policy(
                class,
                stamp(ClassPolicy {
                    rate_per_sec: limit,
                    burst: (limit / 10).max(1),
                    flags: p.flags | POLICY_LIMIT_RATE,
                    ..p
                }),
            )?;
        }
    }
    Ok(())
}
