//! The adaptive controller: the daemon closes the loop. Every interval it reads each
//! controlled class's deltas from the datapath of every attached interface, runs the class's law
//! ([`law`]) and writes the limit the law wants into the class's policy, saying who set it, when
//! and why (`ClassPolicy::owner`, `reason`, `changed_ns`, `bound_min`, `bound_max`).
//!
//! Who owns a limit: operators set bounds and targets in the config; the controller moves the
//! effective limit inside them. A class an operator pinned (`policy set --pin`) is left alone
//! until it is unpinned, and the controller then starts from the operator's value.
//!
//! Mode `pdd` acts in the daemon rather than the datapath: it sets how the proxies' backend
//! pools share freed slots between resumed and new sessions ([`crate::proxy::gate`]), from the
//! waits the pools measured.

pub mod floor;
pub mod infer;
pub mod law;
pub mod queue;
/// The simulator the laws are tuned and benchmarked on: test support, not in the shipped daemon
/// (the `sim` feature, which the tests and benchmarks turn on).
#[cfg(any(test, feature = "sim"))]
pub mod sim;

use std::{
    collections::BTreeMap,
    sync::{Arc, atomic::AtomicU64},
    time::{Duration, Instant},
};

use gateway_common::{
    Class, NUM_CLASSES,
    maps::{
        ClassPolicy, ClassState, ClassStats, LatencyHistogram, PENDING_INVITE, PENDING_UNMATCHED,
        Pending, SIP_FAMILY_INVITE, SIP_FAMILY_OTHER, SLOT_SIP_INVITE, ServiceTimes, timeout_ns,
    },
    reasons::{Owner, Reason},
};
use prometheus_client::{encoding::EncodeLabelSet, metrics::gauge::Gauge, registry::Registry};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::{
    config::{ControllerConfig, Mode},
    datapath::attached::Attached,
    datapath::maps::{Maps, MapsError, monotonic_ns},
    metrics::family::Sorted,
    proxy::gate::{Differentiation, Priority, Waits},
};
use infer::CostInference;
use law::{Decision, DelayRatioLaw, HandshakeBudgetLaw, HandshakeCosts, HandshakeObservation};
use queue::{FAMILIES, Family, FamilyObservation, QueueLaw, QueueObservation};

/// Where the TLS law gets the costs of a full and a resumed handshake (the daemon's proxies
/// measure them); `None` until both were measured.
pub type CostSource = Arc<dyn Fn() -> Option<HandshakeCosts> + Send + Sync>;

/// One class's law.
#[derive(Clone, Debug)]
enum Law {
    /// Boxed: its per-family state outweighs the other laws'.
    Sip(Box<QueueLaw>),
    Tls(HandshakeBudgetLaw),
}

impl Law {
    /// The limit the law holds now: a backlog (SIP) or a rate (TLS).
    fn limit(&self) -> u64 {
        match self {
            Law::Sip(l) => l.limit(),
            Law::Tls(l) => l.rate(),
        }
    }

    /// Takes the limit of its kind that `p` has in force as its own (a controller's limit left
    /// by an earlier run, or an operator's it takes over).
    fn adopt(&mut self, p: &ClassPolicy) {
        match self {
            Law::Sip(l) => {
                if let Some(backlog) = p.backlog_in_force() {
                    l.reset(backlog);
                }
            }
            Law::Tls(l) => {
                if let Some(rate) = p.rate_in_force() {
                    l.reset(rate);
                }
            }
        }
    }
}

/// What the controller read last from one interface.
#[derive(Clone, Copy)]
struct Snapshot {
    state: [ClassState; NUM_CLASSES],
    stats: [ClassStats; NUM_CLASSES],
    /// Service times by class id.
    latency: [LatencyHistogram; NUM_CLASSES],
    /// `sip-original`'s fine service times by [`Family`] (read only with a law in mode sip).
    sip_times: [ServiceTimes; FAMILIES],
    /// The fine completion times of tls-new and tls-resumed (read only with a law in mode tls).
    tls_times: [ServiceTimes; 2],
}

impl Snapshot {
    fn read(maps: &Maps, sip: bool, tls: bool) -> Result<Self, MapsError> {
        let mut sip_times = [ServiceTimes::default(); FAMILIES];
        if sip {
            sip_times[Family::Invite as usize] = maps.service_times(SLOT_SIP_INVITE)?;
            sip_times[Family::Other as usize] = maps.service_times(Class::SipOriginal.id())?;
        }
        let mut tls_times = [ServiceTimes::default(); 2];
        if tls {
            tls_times[0] = maps.service_times(Class::TlsNew.id())?;
            tls_times[1] = maps.service_times(Class::TlsResumed.id())?;
        }
        Ok(Snapshot {
            sip_times,
            tls_times,
            state: maps.class_state()?,
            stats: maps.class_stats()?,
            latency: {
                let mut l = [LatencyHistogram::default(); NUM_CLASSES];
                for c in Class::ALL {
                    l[c.id() as usize] = maps.latency(c)?;
                }
                l
            },
        })
    }
}

/// One interface under control.
struct Plant {
    attached: Arc<Attached>,
    laws: BTreeMap<Class, Law>,
    last: Option<Snapshot>,
    /// Handshake costs inferred from completion times, for a TLS server the daemon does not
    /// terminate (mode `tls` without a proxy that measured its own).
    inferred: CostInference,
    /// Per class, when a change of reason was last logged and the changes since unsaid.
    said: BTreeMap<Class, (Option<std::time::Instant>, u32)>,
}

/// At most one line per class this often for the controller's changes of reason at the default
/// level: a law at its set point can alternate reasons every interval (on a busy host it did,
/// five lines a second); the line after a quiet spell says how many changes it stands for.
const REASON_LOG_EVERY: Duration = Duration::from_secs(2);

/// Mode `pdd`: the law and the backend pools it moves.
struct Pdd {
    law: DelayRatioLaw,
    ratio: f64,
    pools: Vec<Arc<Differentiation>>,
    /// The pools' waits (summed) at the last intervals, oldest first, at most
    /// [`PDD_WINDOW`] + 1.
    history: std::collections::VecDeque<Waits>,
}

/// Intervals the `pdd` law averages the waits over: one interval's few waits make a noisy
/// ratio, and the ratio of means is what it holds.
const PDD_WINDOW: usize = 10;

impl Pdd {
    fn new(law: DelayRatioLaw, ratio: f64, pools: Vec<Arc<Differentiation>>) -> Self {
        Pdd {
            law,
            ratio,
            pools,
            history: std::collections::VecDeque::new(),
        }
    }

    /// One interval: the mean waits of both classes over every pool in the last
    /// [`PDD_WINDOW`] intervals, and the new share if both waited.
    fn step(&mut self, stats: &ControllerStats) {
        let now = self.pools.iter().fold(Waits::default(), |mut t, p| {
            let w = p.waits();
            for i in 0..2 {
                t.waited_us[i] += w.waited_us[i];
                t.waits[i] += w.waits[i];
            }
            t
        });
        self.history.push_back(now);
        if self.history.len() > PDD_WINDOW + 1 {
            self.history.pop_front();
        }
        let before = self.history[0];
        if self.history.len() == 1 {
            let share = self.law.share();
            for p in &self.pools {
                p.set_share(Some(share));
            }
            return;
        }
        let high = now.mean_since(&before, Priority::High);
        let low = now.mean_since(&before, Priority::Low);
        let labels = |class: Class| Labels {
            iface: PROXIES.into(),
            class: class.name(),
        };
        for (class, d) in [(Class::TlsResumed, high), (Class::TlsNew, low)] {
            if let Some(d) = d {
                stats
                    .delay
                    .get_or_create(&labels(class))
                    .set(d.as_secs_f64());
            }
        }
        stats
            .ratio_target
            .get_or_create(&labels(Class::TlsResumed))
            .set(self.ratio);
        let (Some(high), Some(low)) = (high, low) else {
            return;
        };
        if !high.is_zero() {
            stats
                .ratio
                .get_or_create(&labels(Class::TlsResumed))
                .set(low.as_secs_f64() / high.as_secs_f64());
        }
        let share = self.law.step(high, low);
        for p in &self.pools {
            p.set_share(Some(share));
        }
        stats
            .resumed_share
            .get_or_create(&labels(Class::TlsResumed))
            .set(share);
        debug!(share, ?high, ?low, "controller: pdd");
    }
}

/// The `iface` label of the series about the proxies' pools (mode `pdd`).
const PROXIES: &str = "proxies";

/// Labels of the controller's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct Labels {
    iface: String,
    class: &'static str,
}

/// Labels of a bound's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct BoundLabels {
    iface: String,
    class: &'static str,
    bound: &'static str,
}

/// Labels of a method family's series (mode sip).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct FamilyLabels {
    iface: String,
    class: &'static str,
    method: &'static str,
}

/// The controller's inputs and outputs, for Prometheus.
#[derive(Default, Clone)]
pub struct ControllerStats {
    /// The limit a sip law set (a backlog), a tls law's (a rate), pdd's share: one unit each.
    backlog_limit: Sorted<Labels, Gauge>,
    rate_limit: Sorted<Labels, Gauge>,
    resumed_share: Sorted<Labels, Gauge<f64, AtomicU64>>,
    /// The bounds of each law's limit, in its unit.
    backlog_bound: Sorted<BoundLabels, Gauge>,
    rate_bound: Sorted<BoundLabels, Gauge>,
    at_minimum: Sorted<Labels, Gauge>,
    floor: Sorted<FamilyLabels, Gauge<f64, AtomicU64>>,
    family_limit: Sorted<FamilyLabels, Gauge>,
    dead: Sorted<Labels, Gauge>,
    delay: Sorted<Labels, Gauge<f64, AtomicU64>>,
    target: Sorted<Labels, Gauge<f64, AtomicU64>>,
    ratio: Sorted<Labels, Gauge<f64, AtomicU64>>,
    ratio_target: Sorted<Labels, Gauge<f64, AtomicU64>>,
    cost: Sorted<Labels, Gauge<f64, AtomicU64>>,
    server_busy: Gauge<f64, AtomicU64>,
    /// When the last interval ran, `CLOCK_MONOTONIC` nanoseconds; 0 before the first.
    last_interval_ns: Arc<AtomicU64>,
}

impl ControllerStats {
    /// How long ago the last interval ran; `None` before the first.
    pub fn since_last_interval(&self) -> Option<Duration> {
        let at = self
            .last_interval_ns
            .load(std::sync::atomic::Ordering::Relaxed);
        (at != 0).then(|| Duration::from_nanos(monotonic_ns().saturating_sub(at)))
    }
}

impl ControllerStats {
    /// Shows the limit `law` set for the class of `labels`, in the family of its unit, with its
    /// bounds and whether it is at the lower one.
    fn set_limit(&self, law: &Law, labels: &Labels, limit: u64, (min, max): (u64, u64)) {
        let (limits, bounds) = match law {
            Law::Sip(_) => (&self.backlog_limit, &self.backlog_bound),
            Law::Tls(_) => (&self.rate_limit, &self.rate_bound),
        };
        let gauge = |v: u64| v.min(i64::MAX as u64) as i64;
        limits.get_or_create(labels).set(gauge(limit));
        for (bound, v) in [("min", min), ("max", max)] {
            let l = BoundLabels {
                iface: labels.iface.clone(),
                class: labels.class,
                bound,
            };
            bounds.get_or_create(&l).set(gauge(v));
        }
        self.at_minimum
            .get_or_create(labels)
            .set(i64::from(limit <= min));
    }

    /// Registers the series (prefix `gateway_controller_`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("gateway_controller");
        r.register(
            "server_cpu_busy_ratio",
            "The share of the budgeted cores the servers the gateway does not terminate used in \
             the controller's last interval, read from the cgroups their config names \
             (services[].server.cgroup, cgroup v2 cpu.stat): what the tls law weighs when the \
             handshake costs are inferred at the NIC",
            self.server_busy.clone(),
        );
        r.register(
            "backlog_limit",
            "The backlog limit the controller set (sip mode: units at once)",
            self.backlog_limit.clone(),
        );
        r.register(
            "rate_limit_per_second",
            "The rate limit the controller set (tls mode: new handshakes per second)",
            self.rate_limit.clone(),
        );
        r.register(
            "resumed_share_ratio",
            "Resumed sessions' share of contended backend slots as the pdd mode set it (iface \
             \"proxies\")",
            self.resumed_share.clone(),
        );
        r.register(
            "backlog_bound",
            "The bounds (min, max) within which the sip mode moves a class's backlog limit",
            self.backlog_bound.clone(),
        );
        r.register(
            "rate_bound_per_second",
            "The bounds (min, max) within which the tls mode moves a class's rate limit",
            self.rate_bound.clone(),
        );
        r.register(
            "at_minimum",
            "1 while the limit the controller set for a class is at its lower bound (it cannot \
             cut further), else 0",
            self.at_minimum.clone(),
        );
        r.register(
            "delay_seconds",
            "The delay the controller saw in its last interval (its input: sip mode, the queueing \
             delay, a method family's median service time above its floor, the larger of the \
             families'; tls mode: the resumed handshakes' median, class tls-resumed; pdd: the mean \
             wait for a backend slot, per class)",
            self.delay.clone(),
        );
        r.register(
            "target_seconds",
            "The delay the controller holds the class under (sip mode: the queueing delay; tls \
             mode: the resumed handshakes' allowance, their floor plus the allowed wait, class \
             tls-resumed)",
            self.target.clone(),
        );
        r.register(
            "floor_seconds",
            "The time the server takes to answer a method family with nothing queued, as the sip \
             mode learnt it (method: invite or other); the queueing delay is measured above it",
            self.floor.clone(),
        );
        r.register(
            "family_limit",
            "The backlog limit of one method family of the class (method: invite or other), as \
             the sip mode set it; the class's limit is their sum",
            self.family_limit.clone(),
        );
        r.register(
            "dead_units",
            "Outstanding units the sip mode counts as dead (older than twice their family's floor \
             and the target): they hold their places until their timeout, on top of the limit \
             for live work",
            self.dead.clone(),
        );
        r.register(
            "delay_ratio",
            "New sessions' mean wait for a backend slot over resumed sessions' (pdd mode's input)",
            self.ratio.clone(),
        );
        r.register(
            "delay_ratio_target",
            "The wait ratio the pdd mode holds (its set point)",
            self.ratio_target.clone(),
        );
        r.register(
            "handshake_cost_seconds",
            "The cost of a handshake (class tls-new: full, tls-resumed: resumed) as the proxies \
             measure it (iface \"proxies\": what the tls mode divides its budget by when there is \
             one) and as the NIC infers it from completion times (iface: where; what it divides \
             by for a server the daemon does not terminate)",
            self.cost.clone(),
        );
    }
}

/// The controller of every attached interface.
pub struct Controller {
    cfg: ControllerConfig,
    plants: Vec<Plant>,
    pdd: Option<Pdd>,
    costs: CostSource,
    stats: ControllerStats,
    cores: f64,
    /// The daemon's CPU time at the last interval.
    cpu: Option<Duration>,
    /// The cgroups of the servers the gateway does not terminate (`services[].server.cgroup`),
    /// and their CPU time at the last interval.
    server_cpu: crate::cgroup::ServerCpu,
    server_last: Option<Duration>,
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
    /// A controller for `ifaces` and the proxies' backend `pools` per `cfg`, with handshake
    /// costs from `costs`, for a server of `cores` CPUs (the daemon's worker threads, or the
    /// CPUs it may run on). Pools go back to FIFO unless `cfg` has a `pdd` class.
    pub fn new(
        cfg: &ControllerConfig,
        ifaces: &[Arc<Attached>],
        pools: &[Arc<Differentiation>],
        costs: CostSource,
        stats: ControllerStats,
        cores: usize,
    ) -> Self {
        for p in pools {
            p.set_share(None);
        }
        let pdd = cfg.classes.values().find_map(|c| match c.mode {
            Mode::Pdd { ratio } => Some(Pdd::new(
                DelayRatioLaw::new(ratio).within(c.min as f64 / 100.0, c.max as f64 / 100.0),
                ratio,
                pools.to_vec(),
            )),
            _ => None,
        });
        let cores = cores.max(1) as f64;
        let plants = ifaces
            .iter()
            .map(|a| Plant {
                attached: a.clone(),
                said: BTreeMap::new(),
                laws: cfg
                    .classes
                    .iter()
                    .filter_map(|(class, c)| {
                        let law = match c.mode {
                            Mode::Sip { target } => {
                                Law::Sip(Box::new(QueueLaw::new(target, c.min, c.max, c.max)))
                            }
                            Mode::Tls { cpu_target, wait } => Law::Tls(
                                HandshakeBudgetLaw::new(cpu_target, cores, c.min, c.max)
                                    .with_wait(wait),
                            ),
                            // Not the datapath's: see `Pdd`.
                            Mode::Pdd { .. } => return None,
                        };
                        Some((*class, law))
                    })
                    .collect(),
                last: None,
                inferred: CostInference::default(),
            })
            .collect();
        Controller {
            cfg: cfg.clone(),
            plants,
            pdd,
            costs,
            stats,
            cores,
            cpu: None,
            server_cpu: crate::cgroup::ServerCpu::default(),
            server_last: None,
        }
    }

    /// Budgets the CPU of the servers in the cgroups `cpu` when the handshake costs are
    /// inferred at the NIC (no proxy of the gateway's measures them): their use, not the
    /// daemon's, is what the tls law weighs against its target.
    pub fn with_server_cpu(mut self, cpu: crate::cgroup::ServerCpu) -> Self {
        self.server_cpu = cpu;
        self
    }

    /// Whether there is anything to control.
    pub fn is_idle(&self) -> bool {
        self.pdd.is_none() && self.plants.iter().all(|p| p.laws.is_empty())
    }

    /// Runs the first interval, which takes the classes over (from the limits a controller left,
    /// else from their upper bounds), and marks it for `/readyz`. The daemon calls it before it
    /// says it is ready, so that a ready daemon's classes are already the controller's; a no-op
    /// when there is nothing to control.
    pub fn begin(&mut self) {
        if self.is_idle() {
            return;
        }
        let names = |pick: &dyn Fn(&Class) -> bool| {
            let names: Vec<&str> = self
                .cfg
                .classes
                .keys()
                .filter(|c| pick(c))
                .map(|c| c.name())
                .collect();
            names.join(",")
        };
        info!(
            interval = ?self.cfg.interval,
            classes = %names(&|_| true),
            by_default = %names(&|c| self.cfg.defaulted.contains(c)),
            cores = self.cores,
            "controller running"
        );
        self.interval(Duration::from_millis(1));
    }

    /// Runs one interval every `interval` until `stop`, the first one an interval after
    /// [`Controller::begin`].
    pub async fn run(mut self, stop: CancellationToken) {
        if self.is_idle() {
            return;
        }
        let mut tick = tokio::time::interval_at(
            tokio::time::Instant::now() + self.cfg.interval,
            self.cfg.interval,
        );
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
            self.interval(elapsed);
        }
    }

    /// One interval of `elapsed`, marked as the last for `/readyz`.
    fn interval(&mut self, elapsed: Duration) {
        self.tick(elapsed);
        self.stats
            .last_interval_ns
            .store(monotonic_ns(), std::sync::atomic::Ordering::Relaxed);
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
        // How busy the servers' CPUs were, from their cgroups.
        let server_now = (!self.server_cpu.is_empty())
            .then(|| self.server_cpu.usage())
            .flatten();
        let server_busy = match (self.server_last, server_now) {
            (Some(before), Some(now)) => Some(
                now.saturating_sub(before).as_secs_f64() / (self.cores * elapsed.as_secs_f64()),
            ),
            _ => None,
        };
        self.server_last = server_now;
        if let Some(b) = server_busy {
            self.stats.server_busy.set(b);
        }
        if let Some(pdd) = &mut self.pdd {
            pdd.step(&self.stats);
        }
        for plant in &mut self.plants {
            let busy = Busy {
                daemon: busy,
                server: server_busy,
            };
            if let Err(e) = step(plant, &self.cfg, elapsed, costs, busy, &self.stats) {
                warn!(iface = %plant.attached.iface(), error = %e, "controller: cannot read or write the maps");
            }
        }
    }
}

/// How busy the CPUs were over an interval: the daemon's (its proxies' handshakes), and the
/// servers' it does not terminate (their cgroups), as shares of the cores budgeted.
#[derive(Clone, Copy, Debug)]
struct Busy {
    daemon: Option<f64>,
    server: Option<f64>,
}

/// One interval on one interface.
fn step(
    plant: &mut Plant,
    cfg: &ControllerConfig,
    elapsed: Duration,
    costs: Option<HandshakeCosts>,
    busy: Busy,
    stats: &ControllerStats,
) -> Result<(), MapsError> {
    let iface = plant.attached.iface().to_string();
    let mut maps = plant.attached.maps();
    let sip = plant.laws.values().any(|l| matches!(l, Law::Sip(_)));
    let tls = plant.laws.values().any(|l| matches!(l, Law::Tls(_)));
    let now = Snapshot::read(&maps, sip, tls)?;
    let Some(before) = plant.last.replace(now) else {
        // The first interval only takes the classes over: from the limits a controller left
        // (a reload, a restart that kept the datapath), else from the upper bound.
        for (class, law) in plant.laws.iter_mut() {
            let p = maps.policy(*class)?;
            if p.pinned() {
                continue;
            }
            if p.owned_by(Owner::Controller) {
                law.adopt(&p);
            }
            let (limit, bounds) = current(law, &cfg.classes[class]);
            write(&mut maps, *class, law, limit, Reason::Start, bounds)?;
        }
        return Ok(());
    };
    let mut interval = Interval {
        now: &now,
        before: &before,
        elapsed,
        costs,
        busy: busy.daemon,
        sip_units: Vec::new(),
        now_ns: 0,
    };
    plant.inferred.observe(
        &now.tls_times[0].since(&before.tls_times[0]),
        &now.tls_times[1].since(&before.tls_times[1]),
    );
    // The proxies' own measure when they have one; else what completion times say, and then the
    // daemon's CPU use says nothing of the server's. Both are shown where known (the NIC's
    // inference under the interface's name, the proxies' under "proxies"), so that an operator
    // can hold one against the other.
    let inferred = plant.inferred.costs();
    if costs.is_none() {
        interval.costs = inferred;
        // The servers' own CPU when their cgroups are named; the daemon's says nothing of it.
        interval.busy = busy.server;
    }
    if plant.laws.values().any(|l| matches!(l, Law::Tls(_))) {
        for (from, c) in [(PROXIES, costs), (iface.as_str(), inferred)] {
            let Some(c) = c else { continue };
            for (class, cost) in [(Class::TlsNew, c.full), (Class::TlsResumed, c.resumed)] {
                let labels = Labels {
                    iface: from.to_string(),
                    class: class.name(),
                };
                stats.cost.get_or_create(&labels).set(cost.as_secs_f64());
            }
        }
    }
    // The SIP units outstanding, read once for every class in mode sip: which of them the
    // server passed over.
    if sip {
        interval.sip_units = maps.sip_pending(MAX_UNITS_READ)?;
    }
    interval.now_ns = monotonic_ns();
    for (class, law) in plant.laws.iter_mut() {
        let policy = maps.policy(*class)?;
        let labels = Labels {
            iface: iface.clone(),
            class: class.name(),
        };
        if policy.pinned() {
            // An operator's limit alone: the families' limits are the controller's.
            if matches!(law, Law::Sip(_)) {
                set_family_limits(&mut maps, None)?;
            }
            continue;
        }
        let bounds = (cfg.classes[class].min, cfg.classes[class].max);
        if !policy.owned_by(Owner::Controller) {
            // Unpinned by an operator: start from the operator's value.
            law.adopt(&policy);
            let from = law.limit();
            write(&mut maps, *class, law, from, Reason::Start, bounds)?;
            stats.set_limit(law, &labels, from, bounds);
            continue;
        }
        let mode = &cfg.classes[class].mode;
        let decision = law.decide(*class, &policy, mode, &interval, stats, &labels);
        if let Law::Sip(l) = law {
            set_family_limits(&mut maps, Some(l))?;
            for family in Family::ALL {
                let labels = FamilyLabels {
                    iface: iface.clone(),
                    class: class.name(),
                    method: family.name(),
                };
                let limit = l.family_limit(family).min(i64::MAX as u64) as i64;
                stats.family_limit.get_or_create(&labels).set(limit);
            }
        }
        let Some(d) = decision else {
            continue;
        };
        // Once per change of reason at the default level (not every interval's step), and at
        // most once per REASON_LOG_EVERY per class.
        if policy.reason != d.reason.id() {
            let now = std::time::Instant::now();
            let (last, unsaid) = plant.said.entry(*class).or_insert((None, 0));
            if last.is_none_or(|at| now.duration_since(at) >= REASON_LOG_EVERY) {
                info!(
                    %iface, class = class.name(), limit = d.limit, reason = d.reason.name(),
                    was = policy.reason_name(), changes_unsaid = *unsaid,
                    "controller: the limit moves for a new reason"
                );
                (*last, *unsaid) = (Some(now), 0);
            } else {
                *unsaid += 1;
                debug!(%iface, class = class.name(), limit = d.limit, reason = d.reason.name(), "controller: a new reason");
            }
        } else {
            debug!(%iface, class = class.name(), limit = d.limit, reason = d.reason.name(), "controller");
        }
        write(&mut maps, *class, law, d.limit, d.reason, bounds)?;
        stats.set_limit(law, &labels, d.limit, bounds);
    }
    Ok(())
}

/// What one interval on one interface showed: the datapath's figures at its start and end, and
/// what the daemon measured meanwhile.
struct Interval<'a> {
    now: &'a Snapshot,
    before: &'a Snapshot,
    elapsed: Duration,
    /// The handshake costs (the proxies' measure, else inferred from completion times).
    costs: Option<HandshakeCosts>,
    /// How busy the server's CPUs were, when the proxies measured the costs.
    busy: Option<f64>,
    /// The SIP units outstanding (read only when a class is in mode sip).
    sip_units: Vec<Pending>,
    /// When the units were read, `CLOCK_MONOTONIC` nanoseconds.
    now_ns: u64,
}

impl Interval<'_> {
    /// The service times of `class` answered in the interval.
    fn latency(&self, class: Class) -> LatencyHistogram {
        let i = class.id() as usize;
        self.now.latency[i].since(&self.before.latency[i])
    }

    /// Units of `class` admitted in the interval.
    fn admitted(&self, class: Class) -> u64 {
        let i = class.id() as usize;
        self.now.state[i]
            .admitted
            .saturating_sub(self.before.state[i].admitted)
    }

    /// Arrivals `class` refused in the interval.
    fn refused(&self, class: Class) -> u64 {
        let i = class.id() as usize;
        refused(&self.now.stats[i]).saturating_sub(refused(&self.before.stats[i]))
    }
}

impl Law {
    /// The law's step over `interval` for `class` (under `policy`, in `mode`), its inputs and
    /// set points shown in `stats`: the limit it wants, and why, if it moves.
    fn decide(
        &mut self,
        class: Class,
        policy: &ClassPolicy,
        mode: &Mode,
        interval: &Interval,
        stats: &ControllerStats,
        labels: &Labels,
    ) -> Option<Decision> {
        match self {
            Law::Sip(l) => {
                let timeout = Duration::from_nanos(timeout_ns(class, policy));
                let mut families: [FamilyObservation; FAMILIES] = Default::default();
                for family in Family::ALL {
                    let f = family as usize;
                    families[f].times =
                        interval.now.sip_times[f].since(&interval.before.sip_times[f]);
                }
                for u in interval.sip_units.iter().filter(|u| u.class == class.id()) {
                    let family = if u.flags & PENDING_INVITE != 0 {
                        Family::Invite
                    } else {
                        Family::Other
                    };
                    let f = &mut families[family as usize];
                    if u.flags & PENDING_UNMATCHED != 0 {
                        f.unmatched += 1;
                    } else {
                        f.ages.push(Duration::from_nanos(
                            interval.now_ns.saturating_sub(u.admitted_ns),
                        ));
                    }
                }
                let i = class.id() as usize;
                let (s, b) = (&interval.now.state[i], &interval.before.state[i]);
                let o = QueueObservation {
                    interval: interval.elapsed,
                    expired: s.expired.saturating_sub(b.expired),
                    timeout,
                    refused: interval.refused(class),
                    families,
                };
                let decision = l.step(&o);
                // Its input and set point: the queueing delay (the larger of the families'),
                // and the target; each family's floor.
                if let Some(q) = Family::ALL.iter().filter_map(|f| l.queue(*f)).max() {
                    stats.delay.get_or_create(labels).set(q.as_secs_f64());
                }
                if let Mode::Sip { target } = mode {
                    stats.target.get_or_create(labels).set(target.as_secs_f64());
                }
                for family in Family::ALL {
                    if let Some(floor) = l.floor(family) {
                        let labels = FamilyLabels {
                            iface: labels.iface.clone(),
                            class: labels.class,
                            method: family.name(),
                        };
                        stats.floor.get_or_create(&labels).set(floor.as_secs_f64());
                    }
                }
                stats
                    .dead
                    .get_or_create(labels)
                    .set(l.dead().min(i64::MAX as u64) as i64);
                decision
            }
            // No handshake cost measured yet (no full handshake was admitted: say, a class an
            // operator handed back closed at 0): nothing to divide a budget by, so it reopens
            // by growth until the costs are measured.
            Law::Tls(l) => {
                let Some(costs) = interval.costs else {
                    return l.grow_unmeasured();
                };
                let o = HandshakeObservation {
                    interval: interval.elapsed,
                    resumed: interval.admitted(Class::TlsResumed),
                    new: interval.admitted(Class::TlsNew),
                    refused: interval.refused(Class::TlsNew),
                    busy: interval.busy,
                    resumed_time: floor::median(&interval.latency(Class::TlsResumed)),
                };
                let decision = l.step(&o, costs);
                debug!(
                    iface = %labels.iface, resumed_time = ?o.resumed_time,
                    allowance = ?l.resumed_allowance(), refused = o.refused, busy = ?o.busy,
                    rate = l.rate(), "controller: tls"
                );
                // Its input and set point: the resumed handshakes' time and allowance.
                let resumed = Labels {
                    iface: labels.iface.clone(),
                    class: Class::TlsResumed.name(),
                };
                if let Some(t) = o.resumed_time {
                    stats.delay.get_or_create(&resumed).set(t.as_secs_f64());
                }
                if let Some(t) = l.resumed_allowance() {
                    stats.target.get_or_create(&resumed).set(t.as_secs_f64());
                }
                decision
            }
        }
    }
}

/// Pending SIP units the controller reads per interface and interval, at most: the backlog
/// limits it sets stay far under this unless an operator raised a bound past it (then the units
/// beyond it count as live, which only makes the law cut sooner).
const MAX_UNITS_READ: usize = 16_384;

/// Writes the backlog limits of `sip-original`'s method families as `law` holds them, or none
/// (0: the class's limit alone) without a law.
fn set_family_limits(maps: &mut Maps, law: Option<&QueueLaw>) -> Result<(), MapsError> {
    for family in Family::ALL {
        let limit = law.map_or(0, |l| l.family_limit(family));
        maps.set_sip_family_limit(family_index(family), limit)?;
    }
    Ok(())
}

/// The `SIP_FAMILIES` index of `family`.
fn family_index(family: Family) -> u32 {
    match family {
        Family::Invite => SIP_FAMILY_INVITE,
        Family::Other => SIP_FAMILY_OTHER,
    }
}

/// Arrivals a class refused (by its backlog or its rate), a monotonic count.
fn refused(s: &ClassStats) -> u64 {
    s.dropped_backlog + s.dropped_rate
}

/// The limit a law holds now and its bounds.
fn current(law: &Law, c: &crate::config::ClassControl) -> (u64, (u64, u64)) {
    (law.limit(), (c.min, c.max))
}

/// Writes `limit` into `class`'s policy as the controller's, keeping every other field. For
/// SIP, also the retransmissions': while the server answers, their threshold is the originals'
/// upper bound (a copy of admitted work is never refused while the server answers it: its
/// client lost an answer, or waits for one); once the server answered nothing for a whole unit
/// timeout, half the originals' limit, with half the bounds (RFC 7415's TAU1 < TAU2).
fn write(
    maps: &mut Maps,
    class: Class,
    law: &Law,
    limit: u64,
    reason: Reason,
    (min, max): (u64, u64),
) -> Result<(), MapsError> {
    let stamp = |p: ClassPolicy| ClassPolicy {
        owner: Owner::Controller.id(),
        reason: reason.id(),
        changed_ns: monotonic_ns(),
        bound_min: min,
        bound_max: max,
        ..p
    };
    let mut p = maps.policy(class)?;
    match law {
        Law::Sip(l) => {
            p.limit_backlog(limit);
            maps.set_policy(class, stamp(p))?;
            for follower in class.leads() {
                let mut r = maps.policy(follower)?;
                if r.pinned() {
                    continue;
                }
                let (threshold, bounds) = if l.answering() {
                    (max, (max, max))
                } else {
                    (limit / 2, (min / 2, max / 2))
                };
                r.limit_backlog(threshold);
                let set = ClassPolicy {
                    bound_min: bounds.0,
                    bound_max: bounds.1,
                    ..stamp(r)
                };
                maps.set_policy(follower, set)?;
            }
        }
        Law::Tls(_) => {
            p.limit_rate(limit);
            p.burst = (limit / 10).max(1);
            maps.set_policy(class, stamp(p))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::{Instant, sleep};

    use super::*;
    use crate::proxy::{config::BackendConfig, pool::Pool};

    /// A deterministic stream of uniform numbers in (0, 1) (a 64-bit LCG).
    struct Lcg(u64);

    impl Lcg {
        fn next(&mut self) -> f64 {
            self.0 = self
                .0
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((self.0 >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        }

        /// An exponential draw of mean `mean`.
        fn exp(&mut self, mean: Duration) -> Duration {
            mean.mul_f64(-self.next().ln())
        }
    }

    /// Runs a backend pool of 4 slots for `secs`: resumed and new sessions arriving (Poisson) at
    /// `rates` per second, each holding its slot an exponential 6 ms; the pdd law stepping every
    /// 100 ms. Returns the ratio of the classes' mean waits over the last half.
    async fn run_pdd(
        pdd: &mut Pdd,
        pool: &Arc<Pool>,
        rates: [f64; 2],
        secs: u64,
        seed: u64,
    ) -> f64 {
        let stats = ControllerStats::default();
        let end = Instant::now() + Duration::from_secs(secs);
        let half = Instant::now() + Duration::from_secs(secs / 2);
        for (class, rate) in [(Priority::High, rates[0]), (Priority::Low, rates[1])] {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut rng = Lcg(seed ^ class as u64);
                while Instant::now() < end {
                    sleep(rng.exp(Duration::from_secs_f64(1.0 / rate))).await;
                    let hold = rng.exp(Duration::from_millis(6));
                    let Some(r) = pool.reserve(&[], class) else {
                        continue;
                    };
                    tokio::spawn(async move {
                        if let Some(slot) = r.slot(Duration::from_secs(30)).await {
                            sleep(hold).await;
                            drop(slot);
                        }
                    });
                }
            });
        }
        let mut from = None;
        while Instant::now() < end {
            sleep(Duration::from_millis(100)).await;
            pdd.step(&stats);
            if from.is_none() && Instant::now() >= half {
                from = Some(pool.differentiation().waits());
            }
        }
        let (now, from) = (pool.differentiation().waits(), from.unwrap());
        let mean = |c| now.mean_since(&from, c).unwrap().as_secs_f64();
        mean(Priority::Low) / mean(Priority::High)
    }

    #[tokio::test(start_paused = true)]
    async fn pdd_holds_the_wait_ratio_of_a_real_backend_pool_through_a_load_change() {
        let pool = Arc::new(Pool::new(
            &[BackendConfig {
                address: ([127, 0, 0, 1], 1).into(),
                weight: 1,
                max_active: 4,
                backlog: 10_000,
                alpn: Vec::new(),
            }],
            Duration::from_secs(1),
            3,
        ));
        let mut pdd = Pdd::new(
            DelayRatioLaw::new(3.0),
            3.0,
            vec![pool.differentiation().clone()],
        );
        // 90% busy, resumed sessions a third of the load; then two thirds of it.
        for (rates, seed) in [([150.0, 450.0], 1), ([400.0, 200.0], 2)] {
            let ratio = run_pdd(&mut pdd, &pool, rates, 60, seed).await;
            eprintln!(
                "rates {rates:?}: ratio {ratio:.3} share {:.3}",
                pdd.law.share()
            );
            assert!(
                (ratio - 3.0).abs() <= 0.3,
                "rates {rates:?}: wait ratio {ratio:.2}, set point 3 (share {:.2})",
                pdd.law.share()
            );
        }
        // Without the law (FIFO across the classes) both wait alike.
        pdd.pools.clear();
        pool.differentiation().set_share(None);
        let ratio = run_pdd(&mut pdd, &pool, [400.0, 200.0], 60, 3).await;
        assert!((ratio - 1.0).abs() < 0.2, "FIFO: wait ratio {ratio:.2}");
    }
}
