//! The daemon's watch over each attachment's datapath, one task per concern: the program kept
//! attached, the sockets of rejected connections destroyed, admitted units whose connection is
//! gone ended, learnt sessions kept on time, and the programs' log records forwarded.

use std::{sync::Arc, time::Duration};

use aya_log::EbpfLogger;
use tokio::io::unix::AsyncFd;
use tracing::{debug, error, info, warn};

use crate::{
    datapath::{self, AttachOptions, Attached, loader, pins::PinDir},
    sockdiag::{SockDiag, flow_addrs},
};

/// How often the daemon looks whether its programs are still attached.
const ATTACHED_CHECK: Duration = Duration::from_secs(1);
/// Looks in a row that must find a link detached before the program is put back: `/readyz`
/// reports the detachment for at least two check intervals first.
const DETACHED_LOOKS: u32 = 3;

/// Puts the datapath back when its link is found detached from under the daemon (`bpftool link
/// detach`, a tool that cleared the interface): the defunct link's pin goes and the program is
/// attached again as at start, over the same pinned maps (policies and admitted work kept), and
/// its log records forwarded as the first program's were.
/// It acts on the [`DETACHED_LOOKS`]th look in a row that finds the link detached, so `/readyz`
/// says so for a while first; each time is logged at error level.
pub(super) async fn keep_attached(opts: AttachOptions, pins: PinDir) {
    let mut tick = tokio::time::interval(ATTACHED_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Consecutive looks that found the link detached.
    let mut looks = 0u32;
    loop {
        tick.tick().await;
        if matches!(crate::datapath::bpfsys::link_ifindex(&pins.link()), Ok(0)) {
            looks += 1;
        } else {
            looks = 0;
        }
        if looks < DETACHED_LOOKS {
            continue;
        }
        looks = 0;
        error!(iface = %opts.iface, "the program was detached from under the daemon: attaching it again");
        let (link, opts_again) = (pins.link(), opts.clone());
        let again = tokio::task::spawn_blocking(move || {
            std::fs::remove_file(&link).map_err(|e| e.to_string())?;
            datapath::attach(&opts_again).map_err(|e| e.to_string())
        })
        .await;
        match again {
            Ok(Ok(mut a)) => {
                info!(
                    iface = %a.iface, mode = a.mode.name(), link_id = a.link_id, program_id = a.program_id,
                    "attached again"
                );
                // The new program logs into a ring of its own.
                match EbpfLogger::init(&mut a.ebpf) {
                    Ok(logger) => {
                        tokio::spawn(forward_logs(a.iface.clone(), logger));
                    }
                    Err(e) => warn!(iface = %a.iface, error = %e, "eBPF logs unavailable"),
                }
            }
            Ok(Err(e)) => error!(iface = %opts.iface, error = %e, "cannot attach again; retrying"),
            Err(e) => error!(iface = %opts.iface, error = %e, "cannot attach again; retrying"),
        }
    }
}

/// Destroys the server-side socket of every connection the datapath rejects (see `sockdiag`):
/// the client gets a reset at once and the server does not wait on a hello that will not come.
pub(super) async fn destroy_rejected(attached: Arc<Attached>) {
    let iface = attached.iface();
    let (ring, mut diag) = match (
        crate::datapath::maps::open_rejects(attached.pins()),
        SockDiag::new(),
    ) {
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
            .and_then(|item| crate::datapath::maps::decode_reject(&item))
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

/// How often the daemon looks for admitted TLS connections whose socket the kernel dropped.
const REAP_INTERVAL: Duration = Duration::from_millis(200);
/// A unit younger than this is left alone: its connection may still be on its way to a socket.
const REAP_MIN_AGE_NS: u64 = 300_000_000;
/// Socket lookups in one pass at most (each is one netlink round trip on the control thread).
const REAP_MAX_LOOKUPS: usize = 1024;

/// Ends, by way of the datapath, the admitted TLS connections whose socket is gone: a unit the
/// server can never answer (the kernel dropped the connection on a listen overflow or a
/// request socket's timeout, or a reset closed it before the server read it) would otherwise
/// hold its class's place until its timeout, refusing live clients in front of an idle server.
/// Each pass looks up the sockets of units older than `REAP_MIN_AGE_NS`, marks those the kernel
/// no longer has (`Maps::mark_tls_unit_gone`) and runs the datapath's sweep program, which ends
/// them as expired (the datapath alone counts ends, so the backlog stays exact). A round that
/// finds marks an earlier one left (its sweep failed) runs the sweep again: the datapath's own
/// pass over a table is due at the earliest deadline it knows of, not at a mark.
pub(super) async fn reap_gone_units(attached: Arc<Attached>, sweeper: loader::Sweeper) {
    let iface = attached.iface().to_string();
    let mut diag = match SockDiag::new() {
        Ok(d) => d,
        Err(e) => return warn!(%iface, error = %e, "cannot look for connections that are gone"),
    };
    let mut tick = tokio::time::interval(REAP_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = crate::datapath::maps::monotonic_ns();
        let units = match attached.maps().tls_pending() {
            Ok(u) => u,
            Err(e) => {
                warn!(%iface, error = %e, "cannot read the pending connections");
                continue;
            }
        };
        // Marks an earlier round left (its sweep failed): the datapath's own pass is not due
        // before a deadline it knows of, so this round's sweep ends them.
        let mut left = units.iter().filter(|(_, u)| u.deadline_ns == 0).count();
        let mut gone = 0;
        for (key, unit) in units
            .into_iter()
            .filter(|(_, u)| u.deadline_ns != 0 && u.admitted_ns + REAP_MIN_AGE_NS < now)
            .take(REAP_MAX_LOOKUPS)
        {
            let (server, client) = flow_addrs(&key);
            match diag.tcp_exists(server, client) {
                Ok(true) => {}
                Ok(false) => match attached.maps().mark_tls_unit_gone(&key, unit) {
                    Ok(marked) => gone += usize::from(marked),
                    Err(e) => warn!(%iface, error = %e, "cannot end a connection that is gone"),
                },
                Err(e) => {
                    warn!(%iface, error = %e, "cannot look a pending connection up");
                    break;
                }
            }
        }
        // Resumed connections past their first flight hold their key's place until they end:
        // those whose socket is gone (the client's reset, which no FIN from the server follows)
        // give it back.
        let holds = match attached.maps().tls_holds() {
            Ok(h) => h,
            Err(e) => {
                warn!(%iface, error = %e, "cannot read the held connections");
                Vec::new()
            }
        };
        left += holds.iter().filter(|(_, h)| h.gone != 0).count();
        for (key, hold) in holds
            .into_iter()
            .filter(|(_, h)| h.gone == 0 && h.since_ns + REAP_MIN_AGE_NS < now)
            .take(REAP_MAX_LOOKUPS)
        {
            let (server, client) = flow_addrs(&key);
            match diag.tcp_exists(server, client) {
                Ok(true) => {}
                Ok(false) => match attached.maps().mark_tls_hold_gone(&key, hold) {
                    Ok(marked) => gone += usize::from(marked),
                    Err(e) => {
                        warn!(%iface, error = %e, "cannot end a held connection that is gone")
                    }
                },
                Err(e) => {
                    warn!(%iface, error = %e, "cannot look a held connection up");
                    break;
                }
            }
        }
        if gone + left > 0 {
            match sweeper.sweep() {
                Ok(()) => {
                    debug!(%iface, gone, left, "admitted connections whose socket is gone, ended")
                }
                Err(e) => warn!(%iface, error = %e, "cannot sweep"),
            }
        }
    }
}

/// Reads aya-log records as they arrive and hands them to the `log` facade, which
/// tracing-subscriber forwards into tracing.
pub(super) async fn forward_logs<T: log::Log>(iface: String, logger: EbpfLogger<T>) {
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

/// How often the keys the NIC learnt are looked at (their expiry) and its wall clock set.
const LEARNT_LOOK: Duration = Duration::from_secs(1);

/// Keeps the sessions the NIC learns from servers it does not terminate
/// (`gateway_common::tls::server`) on time: every [`LEARNT_LOOK`], while any port learns, the
/// NIC's wall clock in each port's terms is set again (it dates the keys it publishes), and
/// the keys whose session lifetime ended are removed.
pub(super) async fn keep_learnt(attached: Arc<Attached>) {
    let iface = attached.iface().to_string();
    let mut tick = tokio::time::interval(LEARNT_LOOK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let mut maps = attached.maps();
        let ports = match maps.learn_terms() {
            Ok(p) => p,
            Err(e) => {
                warn!(%iface, error = %e, "cannot read the ports whose sessions are learnt");
                continue;
            }
        };
        if ports.is_empty() {
            continue;
        }
        let clock_ns = crate::datapath::maps::wall_clock_offset_ns();
        for (port, terms) in ports {
            let terms = gateway_common::maps::LearnTerms { clock_ns, ..terms };
            if let Err(e) = maps.set_learn_terms(port, terms) {
                warn!(%iface, port, error = %e, "cannot set the NIC's clock for learnt sessions");
            }
        }
        let now_unix =
            clock_ns.saturating_add(crate::datapath::maps::monotonic_ns()) / 1_000_000_000;
        match maps.sweep_issued(now_unix) {
            Ok(n) if n > 0 => debug!(%iface, keys = n, "learnt session keys expired"),
            Ok(_) => {}
            Err(e) => warn!(%iface, error = %e, "cannot remove expired session keys"),
        }
    }
}

/// How often the servers' ticket key files are read (a rotated key verifies within a second).
const KEY_FILES_LOOK: Duration = Duration::from_millis(250);

/// Keeps the ticket keys the NIC holds those of the servers' key files
/// (`crate::apply::ticket_keys`), for the config in force (`running`, replaced by each
/// reload): a file rotated takes effect within [`KEY_FILES_LOOK`] and a key removed from it stops
/// verifying. A file that cannot be read (a half-written rotation) keeps the keys held, told
/// once until it changes.
pub(super) async fn keep_ticket_keys(
    attached: Vec<Arc<Attached>>,
    running: tokio::sync::watch::Receiver<crate::config::Config>,
) {
    let mut tick = tokio::time::interval(KEY_FILES_LOOK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut told: Option<String> = None;
    loop {
        tick.tick().await;
        let cfg = running.borrow().clone();
        if !cfg
            .learnt_ports()
            .iter()
            .any(|(_, s)| s.ticket_keys.is_some())
        {
            continue;
        }
        let mut unreadable = None;
        for a in &attached {
            let changed = crate::apply::ticket_keys(&mut a.maps(), &cfg, &mut |port, e| {
                unreadable = Some(format!("port {port}: {e}"));
            });
            match changed {
                Ok(true) => {
                    info!(iface = %a.iface(), "ticket keys changed: the server's key files were rotated")
                }
                Ok(false) => {}
                Err(e) => warn!(iface = %a.iface(), error = %e, "cannot write the ticket keys"),
            }
        }
        if unreadable != told {
            if let Some(why) = &unreadable {
                warn!(%why, "cannot read the server's ticket keys; keeping those held");
            }
            told = unreadable;
        }
    }
}
