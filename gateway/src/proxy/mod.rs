//! The TLS proxy: listeners that terminate admitted connections with rustls and relay them to a
//! backend pool, counting each connection's completion into the datapath's backlog.
//!
//! A connection's life:
//! 1. Accepted. When every pool member is down or full, the connection is refused at once with a
//!    reset, before any handshake work.
//! 2. The TLS handshake, bounded by the handshake timeout and CPU-timed by kind (full, resumed).
//!    Resumed sessions first: a full handshake's first flight is computed off the worker, at a
//!    lower priority ([`handshake`]). A hello that offered an issued key and did not resume (a
//!    full handshake, a failure, a timeout) withdraws that key from the datapath ([`tap`]): a
//!    replayed or stale key keeps no resumed places.
//! 3. The backend connection: a place with the next member by weight is reserved only now, so a
//!    slow or stalled handshake (slowloris) holds no backend capacity. After a wait in the
//!    member's backlog if it had no free slot, a bounded connect; a member that refuses or times
//!    out is marked down and the next is tried. With `proxy_protocol`, a PROXY v2 header goes
//!    first.
//! 4. Bytes relayed both ways until both sides have ended (each side's end half-closes the
//!    other), either side fails, or neither sends for the idle timeout.

pub mod config;
pub mod cputime;
pub mod descriptors;
pub mod gate;
pub mod handshake;
pub mod header;
pub mod pool;
pub mod relay;
pub mod stats;
pub mod tap;

use std::{net::SocketAddr, sync::Arc, time::Duration};

use tokio::{
    io::AsyncWriteExt as _,
    net::{TcpListener, TcpStream},
};
use tokio_rustls::TlsAcceptor;
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use tracing::{debug, warn};

use crate::issued::IssuedKeys;
use config::ProxyConfig;
use cputime::CpuTimed;
use descriptors::{Descriptors, Place};
use pool::{Pool, Slot};
use stats::{BackendLabels, HandshakeKind, ListenerLabels, ListenerStats, Outcome, ProxyStats};

/// One listener and everything its connections share.
pub struct Proxy {
    cfg: ProxyConfig,
    label: String,
    /// Swapped whole on a reload (certificate rotation): connections that started keep the
    /// configuration they started with.
    acceptor: std::sync::RwLock<TlsAcceptor>,
    pool: Pool,
    issued: Arc<IssuedKeys>,
    stats: Arc<ProxyStats>,
    /// This listener's series of `stats`.
    own: ListenerStats,
    /// Places for connections within the open-files limit, shared by every listener.
    descriptors: Descriptors,
    /// When a pause of accepting was last logged (one line per [`PAUSE_LOG_EVERY`]).
    pause_logged: std::sync::Mutex<Option<std::time::Instant>>,
}

/// At most one log line per this while accepting keeps pausing at the open-files limit.
const PAUSE_LOG_EVERY: Duration = Duration::from_secs(10);

impl Proxy {
    /// A proxy for `cfg` with the TLS server configuration `tls`, its connections taking places
    /// from `descriptors`.
    pub fn new(
        cfg: ProxyConfig,
        tls: rustls::ServerConfig,
        issued: Arc<IssuedKeys>,
        stats: Arc<ProxyStats>,
        descriptors: Descriptors,
    ) -> Self {
        let pool = Pool::new(&cfg.backends, cfg.retry_interval.0, cfg.max_fails);
        let label = cfg.listen.to_string();
        Proxy {
            own: stats.listener(&label),
            label,
            acceptor: std::sync::RwLock::new(TlsAcceptor::from(Arc::new(tls))),
            pool,
            cfg,
            issued,
            stats,
            descriptors,
            pause_logged: std::sync::Mutex::new(None),
        }
    }

    /// Serves new connections with `tls` (a reload's new certificates); open connections carry
    /// on with the configuration they started with.
    pub fn set_tls(&self, tls: rustls::ServerConfig) {
        *self.acceptor.write().unwrap_or_else(|p| p.into_inner()) =
            TlsAcceptor::from(Arc::new(tls));
    }

    /// The issued keys this listener publishes.
    pub fn issued(&self) -> &Arc<IssuedKeys> {
        &self.issued
    }

    /// The listen address.
    pub fn listen(&self) -> SocketAddr {
        self.cfg.listen
    }

    /// How its backend pool shares slots between resumed and new sessions (the controller's
    /// `pdd` mode sets it), and their waits.
    pub fn differentiation(&self) -> &Arc<gate::Differentiation> {
        self.pool.differentiation()
    }

    /// This listener's figures (handshake counts and CPU cost, outcomes).
    pub fn stats(&self) -> &ListenerStats {
        &self.own
    }

    /// Accepts until `stop` is cancelled; each connection runs as a task of `tracker`.
    pub async fn serve(
        self: Arc<Self>,
        listener: TcpListener,
        stop: CancellationToken,
        tracker: TaskTracker,
    ) {
        crate::accept::accept_until(
            listener,
            &stop,
            &self.label,
            || self.descriptors.take(|| self.paused()),
            |sock, peer, place| {
                // A connection already reset (SO_ERROR) costs no task and no read: the datapath
                // refused its hello after the hello's first segment had queued it.
                if matches!(sock.take_error(), Ok(Some(_))) {
                    self.own.outcome(Outcome::ResetAtAccept);
                    return;
                }
                tracker.spawn(self.clone().connection(sock, peer, place));
            },
        )
        .await;
        debug!(listener = %self.label, "stopped accepting");
    }

    /// Expires published session keys as their lifetime ends, and counts them.
    pub async fn housekeeping(self: Arc<Self>, stop: CancellationToken) {
        let labels = crate::proxy::stats::ListenerLabels {
            listener: self.label.clone(),
        };
        let published = self.stats.keys_published.get_or_create(&labels).clone();
        let unpublished = self.stats.keys_unpublished.get_or_create(&labels).clone();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            self.issued.expire(std::time::Instant::now());
            published.set(self.issued.published() as i64);
            let refused = self.issued.take_unpublished();
            if refused > 0 {
                unpublished.inc_by(refused);
                warn!(
                    listener = %self.label, refused,
                    "the issued-keys table is full: new session keys were not published (raise datapath.issued_keys)"
                );
            }
        }
    }

    /// Sets the pool gauges from the pool's state (before each scrape).
    pub fn refresh_gauges(&self) {
        let now = std::time::Instant::now();
        for m in self.pool.members() {
            let l = self.backend_labels(m.address);
            self.stats
                .backend_active
                .get_or_create(&l)
                .set(i64::from(m.active()));
            self.stats
                .backend_waiting
                .get_or_create(&l)
                .set(i64::from(m.waiting()));
            self.stats
                .backend_up
                .get_or_create(&l)
                .set(i64::from(m.is_up(now)));
        }
    }

    fn backend_labels(&self, backend: SocketAddr) -> BackendLabels {
        BackendLabels {
            listener: self.label.clone(),
            backend: backend.to_string(),
        }
    }

    /// Accepting pauses: every place within the open-files limit is held.
    fn paused(&self) {
        self.own.accept_paused.inc();
        let now = std::time::Instant::now();
        let mut logged = self.pause_logged.lock().unwrap_or_else(|p| p.into_inner());
        if logged.is_none_or(|at| now.duration_since(at) >= PAUSE_LOG_EVERY) {
            *logged = Some(now);
            warn!(
                listener = %self.label,
                connections = self.descriptors.connections(),
                "accepting paused: every connection the open-files limit allows is open (clients wait in the listen queue; raise LimitNOFILE)"
            );
        }
    }

    /// Serves one connection; its `place` is given back when it ends.
    async fn connection(self: Arc<Self>, sock: TcpStream, peer: SocketAddr, place: Place) {
        let _place = place;
        self.own.open.inc();
        let outcome = self.run(sock, peer).await;
        self.own.open.dec();
        self.own.outcome(outcome);
        debug!(listener = %self.label, %peer, outcome = outcome.name(), "connection ended");
    }

    async fn run(&self, sock: TcpStream, peer: SocketAddr) -> Outcome {
        let local = sock.local_addr().unwrap_or(self.cfg.listen);
        let _ = sock.set_nodelay(true);
        if !self.pool.has_room() {
            // A reset: the refusal is immediate and unambiguous, and leaves no TIME_WAIT here.
            let reset = libc::linger {
                l_onoff: 1,
                l_linger: 0,
            };
            let _ = nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::Linger, &reset);
            return Outcome::RefusedFull;
        }
        let (sock, hello) = tap::Tap::new(sock);
        let config = self
            .acceptor
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .config()
            .clone();
        let handshake = CpuTimed::new(handshake::accept(
            sock,
            &hello,
            config,
            &self.issued,
            &self.own,
        ));
        let done = tokio::time::timeout(self.cfg.timeouts.handshake.0, handshake).await;
        let (outcome, kind) = match done {
            Err(_) => (Err(Outcome::HandshakeTimeout), None),
            Ok(((Err(e), _), _)) => {
                debug!(listener = %self.label, %peer, error = %e, "handshake failed");
                (Err(Outcome::HandshakeError), None)
            }
            Ok(((Ok(tls), offloaded), polled)) => {
                let kind = match tls.get_ref().1.handshake_kind() {
                    Some(rustls::HandshakeKind::Resumed) => HandshakeKind::Resumed,
                    _ => HandshakeKind::Full,
                };
                self.own.handshake(kind, polled + offloaded);
                (Ok(tls), Some(kind))
            }
        };
        if kind != Some(HandshakeKind::Resumed)
            && let Some(key) = hello.offer_key()
            && self.issued.withdraw_key(&key)
        {
            self.own.offer_withdrawn();
            debug!(listener = %self.label, %peer, "an offer did not resume: its key is withdrawn");
        }
        let mut tls = match outcome {
            Ok(mut tls) => {
                tls.get_mut().0.stop();
                tls
            }
            Err(outcome) => return outcome,
        };
        // Resumed sessions and new ones wait for a backend slot apart (seed 002).
        let class = match kind {
            Some(HandshakeKind::Resumed) => gate::Priority::High,
            _ => gate::Priority::Low,
        };
        let Some((mut backend, _slot)) = self.connect_backend(class).await else {
            let _ = tls.shutdown().await;
            return Outcome::BackendUnavailable;
        };
        if self.cfg.proxy_protocol {
            let sent = match header::proxy_v2(peer, local) {
                Ok(h) => backend.write_all(&h).await,
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                debug!(listener = %self.label, error = %e, "PROXY header not sent");
                return Outcome::BackendUnavailable;
            }
        }
        match relay::relay(&mut tls, &mut backend, self.cfg.timeouts.idle.0).await {
            Ok(true) => Outcome::IdleTimeout,
            // How the relay ended (either side's close or error) is the connection's own business.
            _ => Outcome::Proxied,
        }
    }

    /// A connected backend: a place with the next member by weight, then a slot there, then the
    /// connect; moves to the next member when one stays full past the queue timeout, refuses or
    /// does not answer. `None` when no member is left to try.
    async fn connect_backend(&self, class: gate::Priority) -> Option<(TcpStream, Slot)> {
        let mut tried = Vec::new();
        loop {
            let r = self.pool.reserve(&tried, class)?;
            let member = r.member;
            tried.push(member);
            let Some(slot) = r.slot(self.cfg.timeouts.queue.0).await else {
                continue;
            };
            let address = self.pool.members()[member].address;
            let connect =
                tokio::time::timeout(self.cfg.timeouts.connect.0, TcpStream::connect(address));
            match connect.await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    self.pool.succeeded(member);
                    return Some((s, slot));
                }
                // The gateway's own resources ran out (descriptors, memory, local ports): not
                // the member's failure. This client is refused; the member stays up.
                Ok(Err(e)) if is_local_failure(&e) => {
                    warn!(listener = %self.label, backend = %address, error = %e,
                        "out of the gateway's own resources connecting to a backend: client refused, member not blamed");
                    self.stats
                        .local_failures
                        .get_or_create(&ListenerLabels {
                            listener: self.label.clone(),
                        })
                        .inc();
                    return None;
                }
                failed => {
                    let timed_out = failed.is_err();
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "connect timed out".into(),
                    };
                    self.stats
                        .backend_failures
                        .get_or_create(&self.backend_labels(address))
                        .inc();
                    if self.pool.failed(member, timed_out) {
                        warn!(listener = %self.label, backend = %address, error = %why,
                            retry_in = ?self.cfg.retry_interval.0, max_fails = self.cfg.max_fails,
                            "backend member marked down");
                    } else {
                        debug!(listener = %self.label, backend = %address, error = %why,
                            "backend connect failed; trying the next member");
                    }
                }
            }
        }
    }
}

/// Whether a failed connect is the gateway's own (out of descriptors, memory, buffers or local
/// ports) rather than the backend's.
fn is_local_failure(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL)
    )
}
