//! `gateway run`: attaches (or adopts) the datapath per the config, applies the config's services,
//! policies and datapath settings, forwards the eBPF programs' aya-log records into tracing, and
//! on SIGTERM or SIGINT exits, detaching or leaving the datapath per `on_exit`.
//!
//! Later issues add the TLS proxy, the controller and metrics as further tasks of this loop.

use std::collections::BTreeSet;

use aya_log::EbpfLogger;
use gateway_common::{
    Class,
    maps::{ServiceKey, ServiceValue},
};
use thiserror::Error;
use tokio::{
    io::unix::AsyncFd,
    signal::unix::{SignalKind, signal},
};
use tracing::{debug, info, warn};

use crate::{
    config::{Config, OnExit},
    loader::{self, AttachOptions, Attachment, LoaderError},
    maps::{Maps, MapsError},
    pins::PinDir,
    sockdiag::{SockDiag, flow_addrs},
};

/// Errors of the daemon.
#[derive(Debug, Error)]
pub enum DaemonError {
    /// The config lists no interface.
    #[error("the config lists no interfaces: add one under `interfaces` or pass --iface")]
    NoInterfaces,
    /// Attaching failed.
    #[error(transparent)]
    Loader(#[from] LoaderError),
    /// Applying the config to the maps failed.
    #[error("applying the config: {0}")]
    Maps(#[from] MapsError),
    /// The runtime or a signal handler could not be set up.
    #[error("runtime: {0}")]
    Runtime(#[from] std::io::Error),
}

impl DaemonError {
    /// Whether the error is the caller's input.
    pub fn is_input_error(&self) -> bool {
        match self {
            DaemonError::NoInterfaces => true,
            DaemonError::Loader(e) => e.is_input_error(),
            _ => false,
        }
    }
}

/// Writes the config's services, policies and datapath settings into one attachment's maps.
/// Services not in the config are removed; classes without a policy become unlimited.
pub fn apply(pins: &PinDir, cfg: &Config) -> Result<(), MapsError> {
    let mut maps = Maps::open(pins)?;
    let wanted: BTreeSet<ServiceKey> = cfg.services.0.iter().map(|s| s.key()).collect();
    for (key, _) in maps.services()? {
        if !wanted.contains(&key) {
            maps.remove_service(key)?;
        }
    }
    for s in &cfg.services.0 {
        maps.add_service(
            s.key(),
            ServiceValue {
                kind: s.kind.service_kind() as u32,
                flags: 0,
            },
        )?;
    }
    for class in Class::ALL.into_iter().filter(|c| c.is_limitable()) {
        let p = cfg
            .policy
            .iter()
            .find(|(c, _)| *c == class)
            .map(|(_, p)| p)
            .unwrap_or_default();
        maps.set_policy(class, p.to_map())?;
    }
    let dp = maps.config()?;
    maps.set_config(gateway_common::maps::DatapathConfig {
        flags: cfg.datapath.flags(),
        ..dp
    })?;
    Ok(())
}

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(cfg: Config) -> Result<(), DaemonError> {
    if cfg.interfaces.0.is_empty() {
        return Err(DaemonError::NoInterfaces);
    }
    let mut attachments: Vec<Attachment> = Vec::new();
    for iface in &cfg.interfaces.0 {
        let opts = AttachOptions {
            iface: iface.name.clone(),
            mode: iface.mode,
            root: cfg.bpffs.clone(),
            ebpf_log_level: cfg.datapath.ebpf_log_level.value(),
        };
        let result = loader::attach(&opts).and_then(|a| {
            apply(&PinDir::new(&cfg.bpffs, &a.iface), &cfg)?;
            Ok(a)
        });
        match result {
            Ok(a) => {
                if let Some(reason) = &a.fallback_reason {
                    warn!(iface = %a.iface, %reason, "native XDP refused; using generic XDP");
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
                    let _ = loader::detach(&cfg.bpffs, &a.iface);
                }
                return Err(e.into());
            }
        }
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let result = runtime.block_on(serve(&cfg, &mut attachments));
    match cfg.on_exit {
        OnExit::Detach => {
            for a in &attachments {
                match loader::detach(&cfg.bpffs, &a.iface) {
                    Ok(()) => info!(iface = %a.iface, "detached"),
                    Err(e) => warn!(iface = %a.iface, error = %e, "detach failed"),
                }
            }
        }
        OnExit::Keep => {
            for a in &attachments {
                info!(iface = %a.iface, "leaving the datapath attached (on_exit: keep)");
            }
        }
    }
    result
}

async fn serve(cfg: &Config, attachments: &mut [Attachment]) -> Result<(), DaemonError> {
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let mut log_tasks = Vec::new();
    for a in attachments.iter_mut() {
        match EbpfLogger::init(&mut a.ebpf) {
            Ok(logger) => {
                let iface = a.iface.clone();
                log_tasks.push(tokio::spawn(forward_logs(iface, logger)));
            }
            Err(e) => warn!(iface = %a.iface, error = %e, "eBPF logs unavailable"),
        }
    }
    let mut reject_tasks = Vec::new();
    for a in attachments.iter() {
        let pins = PinDir::new(&cfg.bpffs, &a.iface);
        reject_tasks.push(tokio::spawn(destroy_rejected(a.iface.clone(), pins)));
    }
    info!(config = %cfg, "gateway ready");
    tokio::select! {
        _ = term.recv() => info!("SIGTERM: shutting down"),
        _ = int.recv() => info!("SIGINT: shutting down"),
    }
    for t in log_tasks.into_iter().chain(reject_tasks) {
        t.abort();
    }
    Ok(())
}

/// Destroys the server-side socket of every connection the datapath rejects (see `sockdiag`):
/// the client gets a reset at once and the server does not wait on a hello that will not come.
async fn destroy_rejected(iface: String, pins: PinDir) {
    let (ring, mut diag) = match (crate::maps::open_rejects(&pins), SockDiag::new()) {
        (Ok(r), Ok(d)) => (r, d),
        (Err(e), _) => return warn!(%iface, error = %e, "reject events unavailable"),
        (_, Err(e)) => return warn!(%iface, error = %e, "cannot destroy rejected sockets"),
    };
    // SAFETY: the ring buffer owns its map fd, open and unchanged until the AsyncFd is dropped.
    let registered =
        unsafe { AsyncFd::register_with_interest(ring, tokio::io::Interest::READABLE) };
    let mut fd = match registered {
        Ok(fd) => fd,
        Err(e) => return warn!(%iface, error = %e, "cannot poll the reject ring buffer"),
    };
    loop {
        let mut guard = match fd.readable_mut().await {
            Ok(g) => g,
            Err(e) => return warn!(%iface, error = %e, "reject ring buffer"),
        };
        let ring = guard.get_inner_mut();
        while let Some(event) = ring
            .next()
            .and_then(|item| crate::maps::decode_reject(&item))
        {
            let (server, client) = flow_addrs(&event.key);
            match diag.destroy_tcp(server, client) {
                Ok(()) => {
                    debug!(%iface, %client, %server, reason = event.reason, "rejected connection reset")
                }
                Err(e) if e.is_not_found() => {
                    debug!(%iface, %client, "rejected connection already gone")
                }
                Err(e) => warn!(%iface, error = %e, "cannot reset a rejected connection"),
            }
        }
        guard.clear_ready();
    }
}

/// Reads aya-log records as they arrive and hands them to the `log` facade, which
/// tracing-subscriber forwards into tracing.
async fn forward_logs<T: log::Log>(iface: String, logger: EbpfLogger<T>) {
    // SAFETY: the logger owns its ring buffer map fd, which stays open and unchanged until the
    // AsyncFd (which owns the logger) is dropped.
    let registered =
        unsafe { AsyncFd::register_with_interest(logger, tokio::io::Interest::READABLE) };
    let mut fd = match registered {
        Ok(fd) => fd,
        Err(e) => {
            warn!(%iface, error = %e, "cannot poll the eBPF log ring buffer");
            return;
        }
    };
    loop {
        match fd.readable_mut().await {
            Ok(mut guard) => {
                guard.get_inner_mut().flush();
                guard.clear_ready();
            }
            Err(e) => {
                warn!(%iface, error = %e, "eBPF log ring buffer");
                return;
            }
        }
    }
}
