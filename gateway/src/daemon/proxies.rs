//! The daemon's TLS proxies: their listeners (a listen queue of the configured length, and
//! `TCP_DEFER_ACCEPT`), the open-files limit they share, and their start, all or none.

use std::{net::SocketAddr, sync::Arc};

use tokio::net::TcpListener;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{info, warn};

use super::error::DaemonError;
use crate::{
    config::Config,
    datapath::attached::Attached,
    issued::IssuedKeys,
    proxy::{Proxy, descriptors::Descriptors, stats::ProxyStats},
};

/// The running proxies.
pub(super) struct Proxies {
    pub(super) proxies: Vec<Arc<Proxy>>,
    /// The accept loops.
    pub(super) accepting: Vec<tokio::task::JoinHandle<()>>,
    pub(super) stats: Arc<ProxyStats>,
}

/// A proxy's listener, with a listen queue of `backlog`.
fn bind_proxy(addr: SocketAddr, backlog: u32) -> Result<TcpListener, DaemonError> {
    let err = |source| DaemonError::Bind { addr, source };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    defer_accept(&socket).map_err(err)?;
    socket.bind(addr).map_err(err)?;
    socket.listen(backlog).map_err(err)
}

/// Seconds a proxy listener's connection may wait for its client's first bytes before the
/// kernel hands it to accept() anyway.
const DEFER_ACCEPT_SECS: libc::c_int = 10;

/// `TCP_DEFER_ACCEPT`: a connection reaches accept() only once its ClientHello has arrived. A
/// refused hello never arrives (the datapath turns it into the server's reset, which ends the
/// connection while it is still a request socket), so the daemon never pays for a refused
/// connection: no accept, no task, no failed read.
fn defer_accept(socket: &tokio::net::TcpSocket) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let secs = DEFER_ACCEPT_SECS;
    // SAFETY: a valid socket fd and a c_int option value of the size passed.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&raw const secs).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Sets up and starts every proxy listener of the config on `runtime` (its listeners, accept
/// loops and so every connection); all or none.
pub(super) fn start_proxies(
    cfg: &Config,
    attached: &[Arc<Attached>],
    stop: &CancellationToken,
    tracker: &TaskTracker,
    runtime: &tokio::runtime::Handle,
) -> Result<Proxies, DaemonError> {
    // The listeners register with that runtime's I/O driver.
    let _entered = runtime.enter();
    let stats = Arc::new(ProxyStats::default());
    if cfg.proxies.is_empty() {
        return Ok(Proxies {
            proxies: Vec::new(),
            accepting: Vec::new(),
            stats,
        });
    }
    // Measured once the maps are open and before any listener: what the daemon holds to run.
    let descriptors = Descriptors::measure()?;
    stats.connection_limit.set(descriptors.connections() as i64);
    info!(
        connections = descriptors.connections(),
        "the open-files limit allows this many proxied connections at once"
    );
    let mut ready = Vec::new();
    for (index, p) in cfg.proxies.iter().enumerate() {
        let issued = Arc::new(IssuedKeys::new(
            attached,
            p.listen.port(),
            p.tls.terms(),
            cfg.datapath.issued_keys,
        ));
        let tls = crate::tls::server_config(&p.tls, issued.clone()).map_err(|source| {
            DaemonError::Tls {
                index,
                listen: p.listen,
                source,
            }
        })?;
        let listener = bind_proxy(p.listen, p.listen_backlog)?;
        let proxy = Arc::new(Proxy::new(
            p.clone(),
            tls,
            issued,
            stats.clone(),
            descriptors.clone(),
        ));
        ready.push((proxy, listener));
    }
    let mut proxies = Vec::new();
    let mut accepting = Vec::new();
    for (proxy, listener) in ready {
        let p = &cfg.proxies[proxies.len()];
        info!(
            listen = %proxy.listen(), backends = p.backends.len(),
            proxy_protocol = p.proxy_protocol, "TLS proxy listening"
        );
        accepting.push(runtime.spawn(proxy.clone().serve(listener, stop.clone(), tracker.clone())));
        runtime.spawn(proxy.clone().housekeeping(stop.clone()));
        runtime.spawn(proxy.clone().check_backends(stop.clone()));
        proxies.push(proxy);
    }
    Ok(Proxies {
        proxies,
        accepting,
        stats,
    })
}

/// Raises the soft limit of open files to the hard limit: a proxy holds two descriptors per
/// connection, and the usual soft limit of 1024 would cap it near 500 connections.
pub(super) fn raise_fd_limit() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => {
            if let Err(e) = setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
                warn!(error = %e, "cannot raise the open-files limit");
            }
        }
        _ => {}
    }
}
