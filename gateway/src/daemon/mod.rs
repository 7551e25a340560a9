//! `gateway run`: attaches (or adopts) the datapath per the config, applies the config's services,
//! policies and datapath settings, forwards the eBPF programs' aya-log records into tracing, and
//! on SIGTERM or SIGINT exits, detaching or leaving the datapath per `on_exit`.
//!
//! It also runs the TLS proxy listeners of the config (see `proxy`) and the metrics endpoint, and on
//! SIGTERM drains: it stops accepting and lets connections finish within the drain deadline.

use std::{future::Future, net::SocketAddr, sync::Arc, time::Duration};

use aya_log::EbpfLogger;
use gateway_common::maps::{AttachMode, DatapathConfig};
use prometheus_client::{encoding::EncodeLabelSet, metrics::counter::Counter, registry::Registry};
use tokio::{
    net::TcpListener,
    signal::unix::{SignalKind, signal},
};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{info, warn};

mod error;
mod proxies;
mod services;
mod watch;

pub use error::DaemonError;

use proxies::{raise_fd_limit, start_proxies};
use services::{Services, Stage};
use watch::{
    destroy_rejected, forward_logs, keep_attached, keep_learnt, keep_ticket_keys, reap_gone_units,
};

use crate::{
    apply::apply,
    config::{Config, ConfigSource, OnExit},
    controller::{Controller, ControllerStats, CostSource, law::HandshakeCosts},
    datapath::maps::Maps,
    datapath::{self, AttachOptions, AttachOutcome, Attached, loader, pins::PinDir},
    metrics::family::Sorted,
    proxy::{Proxy, stats::HandshakeKind},
};

/// Runs the daemon until SIGTERM or SIGINT; SIGHUP reloads the config from `source`.
pub fn run(cfg: Config, source: ConfigSource) -> Result<(), DaemonError> {
    if cfg.interfaces.0.is_empty() {
        return Err(DaemonError::NoInterfaces);
    }
    raise_fd_limit();
    // One daemon per datapath: each interface's pin directory is locked for this process's
    // lifetime before anything is attached, adopted or replaced.
    let _held = cfg
        .interfaces
        .0
        .iter()
        .map(|i| crate::datapath::attached::hold(&PinDir::new(&cfg.bpffs, &i.name)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut attachments: Vec<AttachOutcome> = Vec::new();
    for iface in &cfg.interfaces.0 {
        let opts = attach_options(&cfg, iface);
        let result = datapath::attach(&opts).and_then(|a| {
            apply(&mut Maps::open(&PinDir::new(&cfg.bpffs, &a.iface))?, &cfg)?;
            Ok(a)
        });
        match result {
            Ok(a) => {
                if let Some(reason) = &a.fallback_reason {
                    warn!(iface = %a.iface, %reason, mode = a.mode.name(), "native XDP refused; attached in a fallback mode");
                }
                for map in &a.finished {
                    warn!(iface = %a.iface, map, "finished carrying a map over that an earlier start left unfinished");
                }
                for c in &a.carried {
                    info!(iface = %a.iface, "{c}");
                }
                for m in &a.moved {
                    info!(iface = %a.iface, "{m}");
                }
                let kernel_can = crate::datapath::kfunc::handoff_available();
                for line in cfg.syn_answers(kernel_can) {
                    info!(iface = %a.iface, "{line}");
                }
                info!(
                    iface = %a.iface, mode = a.mode.name(), link_id = a.link_id,
                    program_id = a.program_id, replaced = a.replaced,
                    "{}", if a.replaced { "adopted attachment" } else { "attached" }
                );
                attachments.push(a);
            }
            Err(e) => {
                // Nothing half-attached: undo what this run attached fresh.
                for a in attachments.iter().filter(|a| !a.replaced) {
                    let _ = datapath::detach(&cfg.bpffs, &a.iface);
                }
                return Err(e.into());
            }
        }
    }
    // Two runtimes: the proxies' connections on `workers` threads, and the daemon's own work
    // (the controller, the metrics endpoint, signals and reloads, the datapath's events) on a
    // thread of its own, so that a backlog of full handshakes, each a few milliseconds of one
    // worker's CPU, never delays a control interval or a scrape.
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if cfg.workers > 0 {
        builder.worker_threads(cfg.workers);
    }
    let proxying = builder.thread_name("gateway-proxy").enable_all().build()?;
    let control = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let mut ready = false;
    let result = control.block_on(serve(
        &cfg,
        &source,
        &mut attachments,
        proxying.handle(),
        &mut ready,
    ));
    // The connections have drained (or their deadline passed) in `serve`: what is left ends now.
    proxying.shutdown_background();
    let failed = result.is_err();
    for a in &attachments {
        // A start that failed never tears down what it did not create (an attachment it
        // adopted, left by an earlier daemon with `on_exit: keep`, stays as it was found), and
        // never leaves what it did create: nobody asked to keep a datapath no daemon served.
        let remove = match cfg.on_exit {
            OnExit::Detach => !(failed && a.replaced),
            OnExit::Keep => failed && !ready && !a.replaced,
        };
        if !remove {
            info!(iface = %a.iface, "leaving the datapath attached (on_exit: keep)");
            continue;
        }
        match datapath::detach(&cfg.bpffs, &a.iface) {
            Ok(()) if ready => info!(iface = %a.iface, "detached"),
            Ok(()) => info!(iface = %a.iface, "detached what this failed start attached"),
            Err(e) => warn!(iface = %a.iface, error = %e, "detach failed"),
        }
    }
    result
}

/// Labels of the reload counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ReloadLabels {
    /// `applied` or `refused`.
    outcome: &'static str,
}

/// The daemon's own work, on the control runtime; the proxies run on `proxying`.
async fn serve(
    cfg: &Config,
    source: &ConfigSource,
    attachments: &mut [AttachOutcome],
    proxying: &tokio::runtime::Handle,
    ready: &mut bool,
) -> Result<(), DaemonError> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut hup = signal(SignalKind::hangup())?;
    // Each attachment's maps, opened once and shared by every part of the daemon.
    let attached = attachments
        .iter()
        .map(|a| Attached::open(&a.iface, PinDir::new(&cfg.bpffs, &a.iface)))
        .collect::<Result<Vec<_>, _>>()?;
    let mut services = Services::default();
    watch_datapath(&mut services, cfg, attachments, &attached);
    // The config in force, for the tasks that follow it through reloads.
    let (in_force, in_force_rx) = tokio::sync::watch::channel(cfg.clone());
    services.watch(
        "ticket keys",
        Stage::AfterDrain,
        keep_ticket_keys(attached.clone(), in_force_rx),
    );
    let stop = CancellationToken::new();
    // The proxies' stop, which begins the drain: `draining` to the readiness checks. The
    // metrics endpoint has a stop of its own, at the drain's end (`Stage::AfterDrain`).
    let draining = stop.clone();
    let tracker = TaskTracker::new();
    let proxies = start_proxies(cfg, &attached, &stop, &tracker, proxying)?;
    let controller_stats = ControllerStats::default();
    let measured = proxies.proxies.clone();
    let costs: CostSource = Arc::new(move || {
        measured.iter().find_map(|p| {
            Some(HandshakeCosts {
                full: p.stats().handshake_cost(HandshakeKind::Full)?,
                resumed: p.stats().handshake_cost(HandshakeKind::Resumed)?,
            })
        })
    });
    let pools: Vec<_> = proxies
        .proxies
        .iter()
        .map(|p| p.differentiation().clone())
        .collect();
    let controller =
        |cfg: &Config| start_controller(cfg, &attached, &pools, &costs, &controller_stats);
    services.start(CONTROLLER, Stage::BeforeDrain, controller(cfg));
    for a in &attached {
        mark(a, |c| c.daemon_pid = std::process::id());
    }
    let reloads = ReloadFigures::new();
    if let Some(addr) = cfg.metrics {
        let endpoint = metrics_endpoint(
            cfg,
            &attached,
            &proxies,
            &controller_stats,
            &reloads,
            draining.clone(),
        );
        let listener = bind(addr).await?;
        // Served until the drain ends, not until it begins: /healthz, /readyz (503, draining)
        // and the drain's own figures stay readable while connections finish.
        services.start("metrics", Stage::AfterDrain, |stop| {
            crate::metrics::serve(listener, Arc::new(endpoint), stop)
        });
        info!(%addr, "metrics at /metrics, health at /healthz and /readyz");
    }
    // Loading parsed the kernel's BTF and the object (tens of megabytes, freed since): give
    // the freed pages back rather than hold them for the daemon's life.
    crate::memory::release_freed();
    tracing::debug!(services = ?services.names(), "services running");
    // Ready means serving: every proxy listener accepts, after its members' first round of
    // probes (bounded by their check's timeout). Until then `/readyz` says `not accepting`,
    // and READY=1 must not say otherwise.
    for p in &proxies.proxies {
        p.accepts().await;
    }
    info!(config = %cfg, "gateway ready");
    *ready = true;
    if let Err(e) = crate::notify::notify(crate::notify::READY) {
        warn!(error = %e, "cannot tell the service manager the daemon is ready");
    }
    let mut running = cfg.clone();
    crate::reload::record_running(&running);
    let mut certificates = crate::reload::Certificates::of(cfg);
    // `--reload-on-change`: the file's content looked at every CONFIG_LOOK; a change asks for
    // a reload as SIGHUP does.
    let (changed_tx, mut changed) = tokio::sync::mpsc::channel::<()>(1);
    if let (Some(path), true) = (&source.path, source.reload_on_change) {
        services.watch(
            "config file",
            Stage::BeforeDrain,
            watch_config(path.clone(), changed_tx),
        );
    }
    loop {
        let why = tokio::select! {
            _ = term.recv() => {
                info!("SIGTERM: shutting down");
                break;
            }
            _ = int.recv() => {
                info!("SIGINT: shutting down");
                break;
            }
            _ = hup.recv() => "SIGHUP",
            Some(()) = changed.recv() => "the config file changed",
        };
        {
            let applied = crate::reload::prepare(&running, source, &proxies.proxies)
                .and_then(|plan| plan.apply(&attached, &proxies.proxies, &running, &certificates));
            // A reload loads and parses as a start does.
            crate::memory::release_freed();
            match applied {
                Ok(applied) => {
                    let new = applied.cfg;
                    certificates = applied.certificates;
                    services.stop_named(CONTROLLER).await;
                    services.start(CONTROLLER, Stage::BeforeDrain, controller(&new));
                    let mut changed = crate::reload::changes(&running, &new);
                    changed.extend(applied.changed);
                    let changed = if changed.is_empty() {
                        "nothing".to_string()
                    } else {
                        changed.join(", ")
                    };
                    info!(%changed, config = %new, "{why}: reloaded");
                    crate::reload::record_outcome(&format!("applied\nchanged: {changed}\n"));
                    running = new;
                    in_force.send_replace(running.clone());
                    crate::reload::record_running(&running);
                    for a in &attached {
                        mark(a, |c| c.reloads += 1);
                    }
                    reloads.count(true);
                }
                Err(reason) => {
                    warn!(%reason, "{why}: reload refused; nothing changed");
                    crate::reload::record_outcome(&format!("refused\n{reason}\n"));
                    for a in &attached {
                        mark(a, |c| c.reloads_refused += 1);
                    }
                    reloads.count(false);
                }
            }
        }
    }
    let _ = crate::notify::notify(crate::notify::STOPPING);
    for a in &attached {
        mark(a, |c| c.daemon_pid = 0);
    }
    crate::reload::forget_outcome();
    drain(&stop, &mut services, proxies, &tracker, &running).await;
    services.stop_stage(Stage::AfterDrain).await;
    Ok(())
}

/// Starts the services that keep each attachment whole and report from it: its eBPF logs, the
/// rejected connections it reports, the keys it learnt, the attachment itself, its gone units.
fn watch_datapath(
    services: &mut Services,
    cfg: &Config,
    attachments: &mut [AttachOutcome],
    attached: &[Arc<Attached>],
) {
    for a in attachments.iter_mut() {
        match EbpfLogger::init(&mut a.ebpf) {
            Ok(logger) => services.watch(
                format!("{}: eBPF logs", a.iface),
                Stage::AfterDrain,
                forward_logs(a.iface.clone(), logger),
            ),
            Err(e) => warn!(iface = %a.iface, error = %e, "eBPF logs unavailable"),
        }
    }
    for a in attached {
        let iface = a.iface();
        let watch = |what: &str| format!("{iface}: {what}");
        services.watch(
            watch("rejected connections"),
            Stage::AfterDrain,
            destroy_rejected(a.clone()),
        );
        services.watch(
            watch("learnt keys"),
            Stage::AfterDrain,
            keep_learnt(a.clone()),
        );
        if let Some(i) = cfg.interfaces.0.iter().find(|i| i.name == iface) {
            services.watch(
                watch("attachment"),
                Stage::AfterDrain,
                keep_attached(attach_options(cfg, i), a.pins().clone()),
            );
        }
        // Loaded (and verified) here, before the daemon says it is ready: not on the control
        // thread while it serves.
        match loader::Sweeper::load(a.pins()) {
            Ok(sweeper) => services.watch(
                watch("gone units"),
                Stage::AfterDrain,
                reap_gone_units(a.clone(), sweeper),
            ),
            Err(e) => warn!(iface = %iface, error = %e, "cannot load the sweep program"),
        }
    }
}

/// The reloads' figures: how many were applied and refused, and whether the last one was.
struct ReloadFigures {
    reloads: Sorted<ReloadLabels, Counter>,
    last_ok: prometheus_client::metrics::gauge::Gauge<i64>,
}

impl ReloadFigures {
    /// None yet: both outcomes at zero, the last "successful" (the start's).
    fn new() -> Self {
        let figures = ReloadFigures {
            reloads: Sorted::default(),
            last_ok: Default::default(),
        };
        figures.last_ok.set(1);
        for outcome in ["applied", "refused"] {
            figures.reloads.get_or_create(&ReloadLabels { outcome });
        }
        figures
    }

    /// Counts a reload, `applied` or refused.
    fn count(&self, applied: bool) {
        let outcome = if applied { "applied" } else { "refused" };
        self.reloads.get_or_create(&ReloadLabels { outcome }).inc();
        self.last_ok.set(i64::from(applied));
    }
}

/// The metrics endpoint of the daemon: every family it serves, and the readiness checks, the
/// first of them that a daemon stopping (`draining`) is not ready.
fn metrics_endpoint(
    cfg: &Config,
    attached: &[Arc<Attached>],
    proxies: &proxies::Proxies,
    controller_stats: &ControllerStats,
    reloads: &ReloadFigures,
    draining: CancellationToken,
) -> crate::metrics::Endpoint {
    let mut registry = Registry::default();
    registry.register(
        "gateway_build",
        "The running build: its version and the hash of the eBPF sources its program was built from, on this node (`node`, to tell one node's figures from another's)",
        prometheus_client::metrics::info::Info::new(vec![
            ("version", env!("CARGO_PKG_VERSION").to_owned()),
            ("ebpf_sources", env!("GATEWAY_EBPF_SOURCES")[..12].to_owned()),
            ("node", cfg.node().to_string()),
        ]),
    );
    registry.register(
        "gateway_reloads",
        "Config reloads (SIGHUP, gateway reload) by outcome: applied, or refused with nothing changed",
        reloads.reloads.clone(),
    );
    registry.register(
        "gateway_config_last_reload_successful",
        "1 when the last config reload was applied (or none was asked since the start), 0 when it was refused and the daemon runs the config before it",
        reloads.last_ok.clone(),
    );
    proxies.stats.register(&mut registry);
    controller_stats.register(&mut registry);
    registry.register_collector(Box::new(crate::datapath_metrics::DatapathCollector::new(
        attached,
    )));
    registry.register_collector(Box::new(crate::metrics::process::ProcessCollector));
    registry.register_collector(Box::new(crate::logging::LogCollector));
    let refresh: Vec<crate::metrics::Refresh> = proxies
        .proxies
        .iter()
        .map(|p| {
            let p = p.clone();
            Box::new(move || p.refresh_gauges()) as crate::metrics::Refresh
        })
        .collect();
    crate::metrics::Endpoint {
        registry,
        refresh,
        checks: Arc::new({
            let mut checks = readiness_checks(cfg, attached, &proxies.proxies, controller_stats);
            // First: a stopping daemon is not ready, whatever else holds.
            checks.insert(
                0,
                Box::new(move || {
                    if draining.is_cancelled() {
                        Err("stopping: draining its connections".into())
                    } else {
                        Ok(())
                    }
                }),
            );
            checks
        }),
    }
}

/// Drains the proxies: stops their accepting (the listening sockets are closed once the accept
/// loops return) and what would change the datapath meanwhile (`Stage::BeforeDrain`), and lets
/// in-flight connections finish within the longest drain deadline of `running`'s listeners.
async fn drain(
    stop: &CancellationToken,
    services: &mut Services,
    proxies: proxies::Proxies,
    tracker: &TaskTracker,
    running: &Config,
) {
    stop.cancel();
    services.stop_stage(Stage::BeforeDrain).await;
    for accept in proxies.accepting {
        let _ = accept.await;
    }
    tracker.close();
    // The longest drain deadline of the listeners, as last reloaded.
    let drain = running
        .proxies
        .iter()
        .map(|p| p.timeouts.drain.0)
        .max()
        .unwrap_or_default();
    if !tracker.is_empty() {
        info!(connections = tracker.len(), deadline = ?drain, "draining");
        if tokio::time::timeout(drain, tracker.wait()).await.is_err() {
            warn!(
                connections = tracker.len(),
                "drain deadline passed; closing the remaining connections"
            );
        }
    }
}

/// How often `--reload-on-change` looks at the config file.
const CONFIG_LOOK: Duration = Duration::from_secs(2);

/// Sends on `changed` each time the content of `path` differs from the last it read (a
/// Kubernetes ConfigMap volume swaps the file whole; an editor's half-written file is refused
/// by the reload and the next change is tried).
async fn watch_config(path: std::path::PathBuf, changed: tokio::sync::mpsc::Sender<()>) {
    // A few kilobytes from a local file: read in place (the control runtime has no blocking
    // pool to spare, and tokio here has no fs).
    let mut last = std::fs::read(&path).ok();
    let mut tick = tokio::time::interval(CONFIG_LOOK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = std::fs::read(&path).ok();
        if now.is_some() && now != last {
            last = now;
            info!(path = %path.display(), "the config file changed: reloading");
            if changed.send(()).await.is_err() {
                return;
            }
        }
    }
}

/// How `cfg` attaches `iface`: at start, and again when the program is found detached.
fn attach_options(cfg: &Config, iface: &crate::config::Interface) -> AttachOptions {
    AttachOptions {
        iface: iface.name.clone(),
        mode: iface.mode,
        root: cfg.bpffs.clone(),
        ebpf_log_level: cfg.datapath.ebpf_log_level.value(),
        issued_keys: cfg.datapath.issued_keys,
    }
}

/// What `/readyz` checks: each configured interface's program attached (its link bound to the
/// interface) in the mode asked for, with maps of this build's layout; every proxy listener
/// accepting; the controller's last interval recent.
fn readiness_checks(
    cfg: &Config,
    attached: &[Arc<Attached>],
    proxies: &[Arc<Proxy>],
    controller: &ControllerStats,
) -> Vec<crate::health::Check> {
    let mut checks: Vec<crate::health::Check> = Vec::new();
    for a in attached {
        let asked = cfg
            .interfaces
            .0
            .iter()
            .find(|i| i.name == a.iface())
            .and_then(|i| i.mode.exact());
        let a = a.clone();
        checks.push(Box::new(move || {
            let iface = a.iface();
            crate::health::link_bound(a.pins())?;
            let mode = AttachMode::from_id(
                a.maps()
                    .config()
                    .map_err(|e| format!("{iface}: {e}"))?
                    .attach_mode,
            );
            if let Some(want) = asked
                && want != mode
            {
                return Err(format!(
                    "{iface}: attached in {} mode, {} asked",
                    mode.name(),
                    want.name()
                ));
            }
            crate::datapath::pinned_layout::check(a.pins(), crate::EBPF_OBJECT)
                .map_err(|e| format!("{iface}: {e}"))
        }));
    }
    for p in proxies {
        let p = p.clone();
        checks.push(Box::new(move || {
            if !p.is_accepting() {
                Err(format!("proxy {}: not accepting", p.listen()))
            } else if !p.has_member_up() {
                Err(format!("proxy {}: every backend is down", p.listen()))
            } else {
                Ok(())
            }
        }));
    }
    if !cfg.controller.classes.is_empty() {
        let (stats, interval) = (controller.clone(), cfg.controller.interval);
        // A few intervals of slack, and never less than two seconds (a busy control thread).
        let late = (interval * 5).max(Duration::from_secs(2));
        checks.push(Box::new(move || match stats.since_last_interval() {
            Some(ago) if ago <= late => Ok(()),
            Some(ago) => Err(format!(
                "controller: its last interval was {ago:?} ago (every {interval:?} expected)"
            )),
            None => Err("controller: no interval has run yet".into()),
        }));
    }
    checks
}

/// The name of the controller's service, restarted by each reload.
const CONTROLLER: &str = "controller";

/// Starts the controller of `cfg`: its first interval at once; then its loop, to be run as a
/// service until its stop.
fn start_controller(
    cfg: &Config,
    attached: &[Arc<Attached>],
    pools: &[Arc<crate::proxy::gate::Differentiation>],
    costs: &CostSource,
    stats: &ControllerStats,
) -> impl FnOnce(CancellationToken) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> + use<> {
    let cores = if cfg.workers > 0 {
        cfg.workers
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    };
    let servers = cfg
        .learnt_ports()
        .into_iter()
        .filter_map(|(_, s)| s.cgroup.clone())
        .collect();
    let mut controller = Controller::new(
        &cfg.controller,
        attached,
        pools,
        costs.clone(),
        stats.clone(),
        cores,
    )
    .with_server_cpu(crate::cgroup::ServerCpu::new(servers));
    // The first interval here, so that the daemon is ready only once its classes are taken over.
    controller.begin();
    move |stop| Box::pin(controller.run(stop))
}

/// Updates the daemon's fields of an attachment's `DP_CONFIG` (its pid, its reload counts).
fn mark(a: &Attached, f: impl FnOnce(&mut DatapathConfig)) {
    let mut maps = a.maps();
    match maps.config() {
        Ok(mut c) => {
            f(&mut c);
            if let Err(e) = maps.set_config(c) {
                warn!(iface = %a.iface(), error = %e, "cannot record the daemon's state");
            }
        }
        Err(e) => warn!(iface = %a.iface(), error = %e, "cannot record the daemon's state"),
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, DaemonError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| DaemonError::Bind { addr, source })
}
