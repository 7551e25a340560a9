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
//! 3. The client's first bytes, within `timeouts.request` (unless its servers speak first): a
//!    connection that finished its handshake and sends nothing ends holding nothing. At most
//!    `max_per_client` connections of one address go on from here at once.
//! 4. The backend connection: a place with the next member by weight is reserved only now, so a
//!    slow or stalled handshake (slowloris) or a silent client holds no backend capacity. After a wait in the
//!    member's backlog if it had no free slot, a bounded connect; a member that refuses or times
//!    out is marked down and the next is tried. With `proxy_protocol`, a PROXY v2 header goes
//!    first.
//! 5. The first bytes, then bytes relayed both ways until both sides have ended (each side's end half-closes the
//!    other), either side fails, or neither sends for the idle timeout.

pub mod access;
pub mod check;
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
use tracing::{debug, info, warn};

use crate::{client_places::ClientPlaces, issued::IssuedKeys, tls::lineage::Lineage};
use config::{AppProtocol, ProxyConfig};
use cputime::CpuTimed;
use descriptors::{Descriptors, Place};
use pool::{Pool, Slot};
use stats::{BackendLabels, HandshakeKind, ListenerLabels, ListenerStats, Outcome, ProxyStats};

/// One listener and everything its connections share.
pub struct Proxy {
    listen: SocketAddr,
    label: String,
    /// Swapped whole on a reload (certificate rotation): connections that started keep the
    /// configuration they started with.
    acceptor: std::sync::RwLock<TlsAcceptor>,
    /// The settings and pool new connections use; swapped whole on a reload, while each
    /// connection keeps the one it started with.
    live: std::sync::RwLock<Arc<Live>>,
    /// The share of backlog slots between resumed and new sessions, kept across reloads.
    diff: Arc<gate::Differentiation>,
    /// Members whose gauges the last scrape showed (those a reload removed are withdrawn).
    shown: std::sync::Mutex<Vec<SocketAddr>>,
    issued: Arc<IssuedKeys>,
    stats: Arc<ProxyStats>,
    /// This listener's series of `stats`.
    own: ListenerStats,
    /// Places for connections within the open-files limit, shared by every listener.
    descriptors: Descriptors,
    /// When a pause of accepting was last logged (one line per [`PAUSE_LOG_EVERY`]).
    pause_logged: std::sync::Mutex<Option<std::time::Instant>>,
    /// Whether its accept loop runs (readiness).
    accepting: tokio::sync::watch::Sender<bool>,
    /// Asks for a round of probes now ([`Proxy::check_backends`]): a reload may bring members
    /// no probe has looked at.
    recheck: tokio::sync::Notify,
    /// Backend places by client address (`max_per_client`), kept across reloads.
    clients: Arc<ClientPlaces>,
}

/// A listener's reloadable settings and the pool made from them.
struct Live {
    cfg: ProxyConfig,
    pool: Pool,
}

/// When the first of `cfg`'s certificate files expires: its own `cert` and each of `tls.sni`
/// (none for a self-signed one made at start, and no file).
fn certificate_expiry(cfg: &ProxyConfig) -> Option<i64> {
    cfg.tls
        .cert_key
        .iter()
        .map(|(cert, _)| cert)
        .chain(cfg.tls.sni.iter().map(|e| &e.cert))
        .filter_map(|cert| crate::tls::certs::expiry(cert))
        .min()
}

/// How long a refusal's last words (a 503, close_notify) may take to write.
const REFUSAL_WRITE: Duration = Duration::from_secs(1);

/// At most one log line per this while accepting keeps pausing at the open-files limit.
const PAUSE_LOG_EVERY: Duration = Duration::from_secs(10);
/// Seconds between sweeps of issued keys past their expiry: a key the NIC published for a
/// ticket its tag vouched for buys nothing new once the ticket expired (the server refuses it,
/// which withdraws the key), so the sweep only gives the table's room back.
const SWEEP_TICKS: u64 = 10;

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
        let pool = Pool::new(&cfg.backends, cfg.retry_interval.0, cfg.max_fails)
            .checked(cfg.health_check.is_some());
        let label = cfg.listen.to_string();
        let own = stats.listener(&label);
        own.certificate_expires(certificate_expiry(&cfg));
        let clients = ClientPlaces::new(cfg.max_per_client as usize);
        Proxy {
            clients,
            own,
            label,
            listen: cfg.listen,
            acceptor: std::sync::RwLock::new(acceptor(tls, &cfg)),
            diff: pool.differentiation().clone(),
            live: std::sync::RwLock::new(Arc::new(Live { cfg, pool })),
            shown: std::sync::Mutex::new(Vec::new()),
            issued,
            stats,
            descriptors,
            pause_logged: std::sync::Mutex::new(None),
            accepting: tokio::sync::watch::Sender::new(false),
            recheck: tokio::sync::Notify::new(),
        }
    }

    /// Serves new connections with `tls` (a reload's new certificates); open connections carry
    /// on with the configuration they started with.
    pub fn set_tls(&self, tls: rustls::ServerConfig) {
        let live = self.live();
        let acceptor = acceptor(tls, &live.cfg);
        *self.acceptor.write().unwrap_or_else(|p| p.into_inner()) = acceptor;
        self.own.certificate_expires(certificate_expiry(&live.cfg));
    }

    /// Serves new connections with `cfg` (a reload; [`Proxy::set_tls`] after it, for its ALPN
    /// list): its backends (members kept by address carry
    /// their connections over; removed ones drain), weights, limits, timeouts and the rest.
    /// Open connections carry on with the settings they started with. The listen address and
    /// queue stay as they were (the caller refuses a change to them).
    pub fn reconfigure(&self, cfg: ProxyConfig) {
        let mut live = self.live.write().unwrap_or_else(|p| p.into_inner());
        let pool = live
            .pool
            .reconfigured(&cfg.backends, cfg.retry_interval.0, cfg.max_fails)
            .checked(cfg.health_check.is_some());
        self.clients.set_per_client(cfg.max_per_client as usize);
        *live = Arc::new(Live { cfg, pool });
        // Members it added serve only when no probed one can, until their first probe: now.
        self.recheck.notify_one();
    }

    fn live(&self) -> Arc<Live> {
        self.live.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The issued keys this listener publishes.
    pub fn issued(&self) -> &Arc<IssuedKeys> {
        &self.issued
    }

    /// Whether it accepts connections now.
    pub fn is_accepting(&self) -> bool {
        *self.accepting.borrow()
    }

    /// Returns once it accepts connections: after its members' first round of probes (at most
    /// their check's timeout), as [`Proxy::serve`] starts.
    pub async fn accepts(&self) {
        let mut accepting = self.accepting.subscribe();
        // The sender is this listener's own: it outlives the wait.
        let _ = accepting.wait_for(|a| *a).await;
    }

    /// The listen address.
    pub fn listen(&self) -> SocketAddr {
        self.listen
    }

    /// How its backend pool shares slots between resumed and new sessions (the controller's
    /// `pdd` mode sets it), and their waits.
    pub fn differentiation(&self) -> &Arc<gate::Differentiation> {
        &self.diff
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
        // The members' first probe before the first accept: a member dead at start is down
        // before any client meets it (the kernel queues connections meanwhile).
        self.check_round().await;
        self.accepting.send_replace(true);
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
        self.accepting.send_replace(false);
        debug!(listener = %self.label, "stopped accepting");
    }

    /// Probes every member once, when the listener has active checks, and records what they
    /// say; a member they mark down or up again is logged (warn, info).
    pub async fn check_round(&self) {
        let live = self.live();
        let Some(hc) = live.cfg.health_check.clone() else {
            return;
        };
        let mut probes = tokio::task::JoinSet::new();
        for (i, m) in live.pool.members().iter().enumerate() {
            let (addr, timeout, path) = (m.address, hc.timeout.0, hc.http_path.clone());
            probes.spawn(async move { (i, check::probe(addr, timeout, path.as_deref()).await) });
        }
        while let Some(done) = probes.join_next().await {
            let Ok((i, outcome)) = done else { continue };
            let m = &live.pool.members()[i];
            match (m.probed(outcome.is_ok(), hc.fall, hc.rise), outcome) {
                (Some(false), Err(reason)) => warn!(
                    listener = %self.label, backend = %m.address, %reason,
                    "backend marked down by its health check"
                ),
                (Some(true), _) => info!(
                    listener = %self.label, backend = %m.address,
                    "backend up again by its health check"
                ),
                _ => {}
            }
        }
    }

    /// Runs [`Proxy::check_round`] every interval until `stop` (read again each round: a reload
    /// may change the checks, or add or remove them), and at once after a reload.
    pub async fn check_backends(self: Arc<Self>, stop: CancellationToken) {
        loop {
            let wait = self
                .live()
                .cfg
                .health_check
                .as_ref()
                .map_or(Duration::from_secs(1), |h| h.interval.0);
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(wait) => {}
                _ = self.recheck.notified() => {}
            }
            self.check_round().await;
        }
    }

    /// Whether some member is up now (`/readyz`: a listener whose every member is down serves
    /// nobody).
    pub fn has_member_up(&self) -> bool {
        let now = std::time::Instant::now();
        self.live().pool.members().iter().any(|m| m.is_up(now))
    }

    /// Expires published session keys as their lifetime ends, and counts them; keeps the
    /// ticket tag keys written (each second) and sweeps keys past their expiry (every
    /// [`SWEEP_TICKS`] seconds).
    pub async fn housekeeping(self: Arc<Self>, stop: CancellationToken) {
        let labels = crate::proxy::stats::ListenerLabels {
            listener: self.label.clone(),
        };
        let published = self.stats.keys_published.get_or_create(&labels).clone();
        let unpublished = self.stats.keys_unpublished.get_or_create(&labels).clone();
        let chain_withdrawn = self
            .stats
            .keys_chain_withdrawn
            .get_or_create(&labels)
            .clone();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        for n in 0u64.. {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tick.tick() => {}
            }
            self.issued.expire(std::time::Instant::now());
            let now = std::time::SystemTime::now();
            self.issued.refresh_tags(now);
            if n % SWEEP_TICKS == 0 {
                let unix = now
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs();
                self.issued.sweep(unix);
            }
            published.set(self.issued.published() as i64);
            let withdrawn = self.issued.chain_withdrawn();
            chain_withdrawn.inc_by(withdrawn.saturating_sub(chain_withdrawn.get()));
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
        let live = self.live();
        let members = live.pool.members();
        let mut shown = self.shown.lock().unwrap_or_else(|p| p.into_inner());
        for gone in shown
            .iter()
            .filter(|a| !members.iter().any(|m| m.address == **a))
        {
            let l = self.backend_labels(*gone);
            self.stats.backend_active.remove(&l);
            self.stats.backend_waiting.remove(&l);
            self.stats.backend_up.remove(&l);
        }
        *shown = members.iter().map(|m| m.address).collect();
        for m in members {
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
        let began = tokio::time::Instant::now();
        let mut entry = access::Entry::default();
        // The session it resumes, for the tickets it is issued (`crate::tls::lineage`).
        let outcome = Lineage::new().scope(self.run(sock, peer, &mut entry)).await;
        self.own.open.dec();
        self.own.outcome(outcome);
        if self.live().cfg.access_log {
            access::log(&self.label, peer, &entry, outcome, began.elapsed());
        }
    }

    async fn run(&self, sock: TcpStream, peer: SocketAddr, entry: &mut access::Entry) -> Outcome {
        let live = self.live();
        let (cfg, pool) = (&live.cfg, &live.pool);
        let local = sock.local_addr().unwrap_or(self.listen);
        let _ = sock.set_nodelay(true);
        if !pool.has_room() {
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
        let done = tokio::time::timeout(cfg.timeouts.handshake.0, handshake).await;
        let (outcome, kind) = match done {
            Err(_) => (Err(Outcome::HandshakeTimeout), None),
            Ok(((Err(e), _), _)) => {
                debug!(listener = %self.label, %peer, error = %e, "handshake failed");
                (Err(Outcome::HandshakeError), None)
            }
            Ok(((Ok(tls), offloaded), polled)) => {
                let session = tls.get_ref().1;
                let kind = match session.handshake_kind() {
                    Some(rustls::HandshakeKind::Resumed) => HandshakeKind::Resumed,
                    _ => HandshakeKind::Full,
                };
                entry.sni = session.server_name().map(str::to_owned);
                entry.version = session.protocol_version();
                entry.kind = Some(kind);
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
        // The recorded hello has no more use: not held for the connection's life.
        drop(hello);
        let mut tls = match outcome {
            Ok(mut tls) => {
                tls.get_mut().0.stop();
                tls
            }
            Err(outcome) => return outcome,
        };
        // The client's first bytes before any backend place: a connection that finished its
        // handshake and sends nothing holds none (unless its servers speak first).
        let first = if cfg.server_speaks_first {
            Vec::new()
        } else {
            match self.first_bytes(cfg, &mut tls).await {
                Some(first) => first,
                None => return Outcome::RequestTimeout,
            }
        };
        entry.bytes.from_client = first.len() as u64;
        // At most `max_per_client` places for one address: refused past them, as when no
        // member has room.
        let Some(_client) = self.clients.take(peer.ip()) else {
            debug!(listener = %self.label, %peer, "its address holds its share of places: refused");
            self.refuse(cfg, &mut tls, Outcome::ClientLimit).await;
            return Outcome::ClientLimit;
        };
        // Resumed sessions and new ones wait for a backend slot apart (seed 002).
        let class = match kind {
            Some(HandshakeKind::Resumed) => gate::Priority::High,
            _ => gate::Priority::Low,
        };
        // A negotiated protocol goes only to the members that take it.
        let speaks = tls.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
        let (mut backend, _slot) = match self
            .connect_backend(&live, class, speaks.as_deref(), entry)
            .await
        {
            Ok(connected) => connected,
            Err(refused) => {
                self.refuse(cfg, &mut tls, refused).await;
                return refused;
            }
        };
        if cfg.proxy_protocol {
            let sent = match header::proxy_v2(peer, local) {
                Ok(h) => backend.write_all(&h).await,
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                debug!(listener = %self.label, error = %e, "PROXY header not sent");
                return Outcome::BackendUnavailable;
            }
        }
        if !first.is_empty()
            && let Err(e) = backend.write_all(&first).await
        {
            debug!(listener = %self.label, error = %e, "the client's first bytes not sent");
            return Outcome::BackendUnavailable;
        }
        match relay::relay(
            &mut tls,
            &mut backend,
            cfg.timeouts.idle.0,
            &mut entry.bytes,
        )
        .await
        {
            Ok(true) => Outcome::IdleTimeout,
            // How the relay ended (either side's close or error) is the connection's own business.
            _ => Outcome::Proxied,
        }
    }

    /// The first bytes a client sends after its handshake (at most [`relay::SCRATCH`]), within
    /// `timeouts.request`; `None` when none came in time (or it closed first).
    async fn first_bytes<S: tokio::io::AsyncRead + Unpin>(
        &self,
        cfg: &ProxyConfig,
        tls: &mut S,
    ) -> Option<Vec<u8>> {
        // Read through the worker's scratch buffer: a connection waiting for its client holds
        // no buffer (a 16 KiB one each made an idle connection cost twice nginx's memory).
        match tokio::time::timeout(cfg.timeouts.request.0, relay::read_some(tls)).await {
            Ok(Ok(first)) if !first.is_empty() => Some(first),
            _ => None,
        }
    }

    /// Tells a client refused after its handshake: an HTTP 503 with Retry-After on an `http`
    /// listener, then close_notify either way.
    async fn refuse<S: tokio::io::AsyncWrite + Unpin>(
        &self,
        cfg: &ProxyConfig,
        tls: &mut S,
        why: Outcome,
    ) {
        if cfg.protocol == AppProtocol::Http {
            // Busy members free slots soon; down ones come back after the retry interval.
            let retry = match why {
                Outcome::QueueTimeout => 1,
                _ => cfg.retry_interval.0.as_secs().max(1),
            };
            let answer = format!(
                "HTTP/1.1 503 Service Unavailable\r\nRetry-After: {retry}\r\nContent-Type: text/plain\r\nContent-Length: 20\r\nConnection: close\r\n\r\nno backend available"
            );
            let _ = tokio::time::timeout(REFUSAL_WRITE, tls.write_all(answer.as_bytes())).await;
        }
        let _ = tokio::time::timeout(REFUSAL_WRITE, tls.shutdown()).await;
    }

    /// A connected backend: a place with the next member by weight (among those that take the
    /// negotiated protocol `speaks`), then a slot there, then the connect; moves to the next member when one refuses or does not answer, or when its slot
    /// does not free in time. One queue deadline (`timeouts.queue`) bounds the client's whole
    /// wait for slots, across every member it waits at. The refusal's reason when no member is
    /// left to try or the deadline passed.
    async fn connect_backend(
        &self,
        live: &Live,
        class: gate::Priority,
        speaks: Option<&[u8]>,
        entry: &mut access::Entry,
    ) -> Result<(TcpStream, Slot), Outcome> {
        let (cfg, pool) = (&live.cfg, &live.pool);
        let deadline = tokio::time::Instant::now() + cfg.timeouts.queue.0;
        // Members that do not take the negotiated protocol count as tried.
        let mut tried: Vec<usize> = match speaks {
            Some(p) => (0..cfg.backends.len())
                .filter(|&i| !cfg.backends[i].alpn.iter().any(|a| a.as_bytes() == p))
                .collect(),
            None => Vec::new(),
        };
        let mut waited_out = false;
        // Members whose connect timed out for this client: busy (their listen queue overflowed,
        // the SYN dropped), perhaps not dead. Once no other member is left they are tried again
        // while the queue deadline lasts (HAProxy's retries), so a burst against a slow member
        // is served as it catches up.
        let mut timed_out_at: Vec<usize> = Vec::new();
        loop {
            let busy_left = !timed_out_at.is_empty();
            let Some(r) = pool.reserve(&tried, class).or_else(|| {
                if !busy_left || tokio::time::Instant::now() >= deadline {
                    return None;
                }
                tried.retain(|i| !timed_out_at.contains(i));
                timed_out_at.clear();
                pool.reserve(&tried, class)
            }) else {
                return Err(if waited_out || busy_left {
                    Outcome::QueueTimeout
                } else {
                    Outcome::BackendUnavailable
                });
            };
            let member = r.member;
            tried.push(member);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if r.is_queued() && left.is_zero() {
                return Err(Outcome::QueueTimeout);
            }
            let Some(slot) = r.slot(left).await else {
                waited_out = true;
                continue;
            };
            let address = pool.members()[member].address;
            entry.backend = Some(address);
            let connect = tokio::time::timeout(cfg.timeouts.connect.0, TcpStream::connect(address));
            match connect.await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    pool.succeeded(member);
                    return Ok((s, slot));
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
                    return Err(Outcome::LocalFailure);
                }
                failed => {
                    let timed_out = failed.is_err();
                    if timed_out {
                        timed_out_at.push(member);
                    }
                    let why = match failed {
                        Ok(Err(e)) => e.to_string(),
                        _ => "connect timed out".into(),
                    };
                    self.stats
                        .backend_failures
                        .get_or_create(&self.backend_labels(address))
                        .inc();
                    if pool.failed(member, timed_out) {
                        warn!(listener = %self.label, backend = %address, error = %why,
                            retry_in = ?cfg.retry_interval.0, max_fails = cfg.max_fails,
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

/// An acceptor of `tls` offering the ALPN protocols of `cfg`.
fn acceptor(mut tls: rustls::ServerConfig, cfg: &ProxyConfig) -> TlsAcceptor {
    tls.alpn_protocols = cfg.alpn.iter().map(|p| p.as_bytes().to_vec()).collect();
    TlsAcceptor::from(Arc::new(tls))
}

/// Whether a failed connect is the gateway's own (out of descriptors, memory, buffers or local
/// ports) rather than the backend's.
fn is_local_failure(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::EADDRNOTAVAIL)
    )
}
