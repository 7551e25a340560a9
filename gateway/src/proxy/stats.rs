//! The proxy's figures: handshakes and their CPU cost by kind, failures by reason, connections by
//! outcome, and the pool's members. The controller reads them in process; Prometheus scrapes them.

use std::{
    collections::VecDeque,
    sync::{Mutex, atomic::AtomicU64},
    time::Duration,
};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, gauge::Gauge},
    registry::Registry,
};

use crate::metrics::family::Sorted;

/// A handshake kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HandshakeKind {
    /// A full handshake (a new session).
    Full = 0,
    /// A resumed session.
    Resumed = 1,
}

impl HandshakeKind {
    /// The label value.
    pub const fn name(self) -> &'static str {
        match self {
            HandshakeKind::Full => "full",
            HandshakeKind::Resumed => "resumed",
        }
    }
}

/// Where a hello's first flight was computed ([`super::handshake`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlightOn {
    /// On the worker: the hello offered a key the gateway publishes.
    Worker = 0,
    /// On a flight thread, at the lower priority: every other hello.
    Thread = 1,
}

impl FlightOn {
    /// The label value.
    pub const fn name(self) -> &'static str {
        match self {
            FlightOn::Worker => "worker",
            FlightOn::Thread => "flight_thread",
        }
    }
}

/// Why a connection ended before it was proxied, or how it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Proxied to a backend (counted when the backend connection is made).
    Proxied,
    /// Refused at accept: every member was down or full.
    RefusedFull,
    /// The handshake did not finish within the handshake timeout.
    HandshakeTimeout,
    /// The handshake failed (bad or garbage hello, alert, reset).
    HandshakeError,
    /// No member could take it after the handshake (every one down, refused or did not answer).
    BackendUnavailable,
    /// Its wait for a backend slot passed `timeouts.queue` (one deadline across every member
    /// it waited at).
    QueueTimeout,
    /// The gateway's own resources ran out connecting to a backend (descriptors, memory, local
    /// ports): refused, no member blamed.
    LocalFailure,
    /// A proxied connection closed for idleness.
    IdleTimeout,
    /// Reset before the proxy read anything (a hello the datapath refused, whose server's reset
    /// came after the connection was queued for accept): closed at accept, no task.
    ResetAtAccept,
    /// Sent no byte within `timeouts.request` of its handshake (or closed first): ended holding
    /// no backend place.
    RequestTimeout,
    /// Its client address held `max_per_client` backend places already: refused.
    ClientLimit,
}

impl Outcome {
    /// Every outcome, in discriminant order.
    pub const ALL: [Outcome; 11] = [
        Outcome::Proxied,
        Outcome::RefusedFull,
        Outcome::HandshakeTimeout,
        Outcome::HandshakeError,
        Outcome::BackendUnavailable,
        Outcome::QueueTimeout,
        Outcome::LocalFailure,
        Outcome::IdleTimeout,
        Outcome::ResetAtAccept,
        Outcome::RequestTimeout,
        Outcome::ClientLimit,
    ];

    /// The label value.
    pub const fn name(self) -> &'static str {
        match self {
            Outcome::Proxied => "proxied",
            Outcome::RefusedFull => "refused_full",
            Outcome::HandshakeTimeout => "handshake_timeout",
            Outcome::HandshakeError => "handshake_error",
            Outcome::BackendUnavailable => "backend_unavailable",
            Outcome::IdleTimeout => "idle_timeout",
            Outcome::ResetAtAccept => "reset_at_accept",
            Outcome::QueueTimeout => "queue_timeout",
            Outcome::LocalFailure => "local_failure",
            Outcome::RequestTimeout => "request_timeout",
            Outcome::ClientLimit => "client_limit",
        }
    }
}

/// Labels of a listener's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct ListenerLabels {
    /// The listen address.
    pub listener: String,
}

/// Labels of handshake series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct HandshakeLabels {
    /// The listen address.
    pub listener: String,
    /// `full` or `resumed`.
    pub kind: &'static str,
}

/// Labels of first-flight series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct FlightLabels {
    /// The listen address.
    pub listener: String,
    /// A [`FlightOn`] name.
    pub on: &'static str,
}

/// Labels of outcome series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// The listen address.
    pub listener: String,
    /// An [`Outcome`] name.
    pub outcome: &'static str,
}

/// Labels of a backend member's series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct BackendLabels {
    /// The listen address.
    pub listener: String,
    /// The member's address.
    pub backend: String,
}

/// Every proxy figure.
#[derive(Default)]
pub struct ProxyStats {
    /// Finished handshakes by kind.
    pub handshakes: Sorted<HandshakeLabels, Counter>,
    /// CPU seconds those handshakes took, by kind.
    pub handshake_cpu: Sorted<HandshakeLabels, Counter<f64, AtomicU64>>,
    /// First flights computed, by where.
    pub first_flights: Sorted<FlightLabels, Counter>,
    /// First flights dropped uncomputed: their connection ended while they waited.
    pub flights_abandoned: Sorted<ListenerLabels, Counter>,
    /// Connections by outcome.
    pub outcomes: Sorted<OutcomeLabels, Counter>,
    /// Connections open now (from accept to close).
    pub open: Sorted<ListenerLabels, Gauge>,
    /// Backend connections served now, per member.
    pub backend_active: Sorted<BackendLabels, Gauge>,
    /// Connections waiting in a member's backlog.
    pub backend_waiting: Sorted<BackendLabels, Gauge>,
    /// 1 when a member is up, 0 while marked down.
    pub backend_up: Sorted<BackendLabels, Gauge>,
    /// Connects a member refused or did not answer in time.
    pub backend_failures: Sorted<BackendLabels, Counter>,
    /// Issued keys withdrawn because a hello offered them and did not resume.
    pub offers_withdrawn: Sorted<ListenerLabels, Counter>,
    /// Backend connects that failed for the gateway's own lack of resources (descriptors,
    /// memory, local ports): the client was refused, no member blamed.
    pub local_failures: Sorted<ListenerLabels, Counter>,
    /// Issued keys published in the datapath now.
    pub keys_published: Sorted<ListenerLabels, Gauge>,
    /// Issued keys not published because the issued-keys table was full.
    pub keys_unpublished: Sorted<ListenerLabels, Counter>,
    /// Issued keys withdrawn for a newer one of their chain (`crate::issued::CHAIN_KEYS`).
    pub keys_chain_withdrawn: Sorted<ListenerLabels, Counter>,
    /// Times accepting paused because every connection the open-files limit allows was open.
    pub accept_paused: Sorted<ListenerLabels, Counter>,
    /// Connections the open-files limit allows all listeners together.
    pub connection_limit: Gauge,
    /// When each listener's certificate (the chain's first) expires, Unix seconds.
    pub certificate_expiry: Sorted<ListenerLabels, Gauge>,
}

impl ProxyStats {
    /// Registers every series in `registry` (prefix `gateway_proxy_`).
    pub fn register(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("gateway_proxy");
        r.register(
            "certificate_expiry_timestamp_seconds",
            "When the listener's certificate (its chain's first) expires, Unix seconds (as served now: set at start and at each reload)",
            self.certificate_expiry.clone(),
        );
        r.register(
            "handshakes",
            "TLS handshakes finished, by kind",
            self.handshakes.clone(),
        );
        r.register(
            "handshake_cpu_seconds",
            "CPU time the finished TLS handshakes took, by kind",
            self.handshake_cpu.clone(),
        );
        r.register(
            "first_flights",
            "TLS first flights computed, by where: on the worker (the hello offered a key the gateway publishes) or on a lower-priority flight thread",
            self.first_flights.clone(),
        );
        r.register(
            "first_flights_abandoned",
            "TLS first flights dropped uncomputed: their connection ended (the handshake timeout) while they waited for a flight thread",
            self.flights_abandoned.clone(),
        );
        r.register(
            "connections",
            "Connections by outcome",
            self.outcomes.clone(),
        );
        r.register(
            "open_connections",
            "Connections open now",
            self.open.clone(),
        );
        r.register(
            "backend_active",
            "Connections a backend member serves now",
            self.backend_active.clone(),
        );
        r.register(
            "backend_waiting",
            "Connections waiting in a backend member's backlog",
            self.backend_waiting.clone(),
        );
        r.register(
            "backend_up",
            "1 while a backend member is up, 0 while marked down",
            self.backend_up.clone(),
        );
        r.register(
            "backend_failures",
            "Connects a backend member refused or did not answer in time",
            self.backend_failures.clone(),
        );
        r.register(
            "offers_withdrawn",
            "Issued keys withdrawn from the datapath because a hello offered them and did not resume",
            self.offers_withdrawn.clone(),
        );
        r.register(
            "local_failures",
            "Backend connects that failed for the gateway's own lack of resources (descriptors, memory, local ports): the client refused, no member marked down",
            self.local_failures.clone(),
        );
        r.register(
            "issued_keys",
            "Session keys this listener has published in the datapath now (each until its lifetime ends)",
            self.keys_published.clone(),
        );
        r.register(
            "issued_keys_unpublished",
            "Session keys not published because the issued-keys table (datapath.issued_keys) was full: \
             their resumptions are judged as new hellos at the NIC",
            self.keys_unpublished.clone(),
        );
        r.register(
            "issued_keys_chain_withdrawn",
            "Session keys withdrawn for a newer one of their chain: the tickets issued on resumed connections share \
             their first session's window of keys",
            self.keys_chain_withdrawn.clone(),
        );
        r.register(
            "accept_paused",
            "Times a listener paused accepting because every connection the open-files limit allows was open (clients wait in the listen queue)",
            self.accept_paused.clone(),
        );
        r.register(
            "connection_limit",
            "Connections the open-files limit allows all listeners together (two descriptors each, after the daemon's own and a reserve)",
            self.connection_limit.clone(),
        );
    }

    /// The series of the listener `listener`, looked up once: a connection then touches its
    /// counters directly, with no label lookup or allocation.
    pub fn listener(&self, listener: &str) -> ListenerStats {
        let listener = listener.to_string();
        let handshake = |kind: HandshakeKind| {
            let labels = HandshakeLabels {
                listener: listener.clone(),
                kind: kind.name(),
            };
            (
                self.handshakes.get_or_create(&labels).clone(),
                self.handshake_cpu.get_or_create(&labels).clone(),
            )
        };
        let outcome = |o: Outcome| {
            self.outcomes
                .get_or_create(&OutcomeLabels {
                    listener: listener.clone(),
                    outcome: o.name(),
                })
                .clone()
        };
        let flight = |on: FlightOn| {
            self.first_flights
                .get_or_create(&FlightLabels {
                    listener: listener.clone(),
                    on: on.name(),
                })
                .clone()
        };
        let labels = ListenerLabels {
            listener: listener.clone(),
        };
        ListenerStats {
            open: self.open.get_or_create(&labels).clone(),
            accept_paused: self.accept_paused.get_or_create(&labels).clone(),
            withdrawn: self.offers_withdrawn.get_or_create(&labels).clone(),
            abandoned: self.flights_abandoned.get_or_create(&labels).clone(),
            handshakes: [
                handshake(HandshakeKind::Full),
                handshake(HandshakeKind::Resumed),
            ],
            recent: Default::default(),
            first_flights: [flight(FlightOn::Worker), flight(FlightOn::Thread)],
            outcomes: Outcome::ALL.map(outcome),
            certificate_expiry: (self.certificate_expiry.clone(), labels.clone()),
        }
    }
}

/// Handshakes of a kind measured before their mean is the controller's cost figure
/// ([`ListenerStats::handshake_cost`]).
pub const MIN_COST_SAMPLES: usize = 16;

/// The most recent handshakes of a kind whose mean is the controller's cost figure.
pub const COST_WINDOW: usize = 100;

/// The CPU times of a kind's last [`COST_WINDOW`] handshakes, and their sum.
#[derive(Default)]
struct Recent {
    times: VecDeque<Duration>,
    sum: Duration,
}

impl Recent {
    fn push(&mut self, cpu: Duration) {
        if self.times.len() == COST_WINDOW
            && let Some(oldest) = self.times.pop_front()
        {
            self.sum = self.sum.saturating_sub(oldest);
        }
        self.times.push_back(cpu);
        self.sum += cpu;
    }

    fn mean(&self) -> Option<Duration> {
        let n = self.times.len();
        (n >= MIN_COST_SAMPLES).then(|| self.sum / n as u32)
    }
}

/// One listener's series (handles onto the families of [`ProxyStats`]).
pub struct ListenerStats {
    /// Connections open now.
    pub open: Gauge,
    /// Times accepting paused at the open-files limit.
    pub accept_paused: Counter,
    withdrawn: Counter,
    abandoned: Counter,
    handshakes: [(Counter, Counter<f64, AtomicU64>); 2],
    recent: [Mutex<Recent>; 2],
    first_flights: [Counter; 2],
    outcomes: [Counter; Outcome::ALL.len()],
    certificate_expiry: (Sorted<ListenerLabels, Gauge>, ListenerLabels),
}

impl ListenerStats {
    /// Counts a finished handshake and its CPU time.
    pub fn handshake(&self, kind: HandshakeKind, cpu: Duration) {
        let (n, secs) = &self.handshakes[kind as usize];
        n.inc();
        secs.inc_by(cpu.as_secs_f64());
        self.recent[kind as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(cpu);
    }

    /// The controller's cost figure for `kind`: the mean CPU time of its last [`COST_WINDOW`]
    /// handshakes, once [`MIN_COST_SAMPLES`] of them were measured (`None` before).
    ///
    /// Recent ones only: what a handshake costs moves with the certificate (a reload from
    /// P-256 to RSA-4096 multiplies it) and with the host (on a CPU kept busy the same
    /// handshakes took a fifth less CPU time than on an idle one, measured beside a stream of
    /// refused hellos). A node's first handshakes can cost many times the later ones (a first
    /// interval's once gave a full handshake about 39 ms, later ones under 1 ms): waiting for
    /// [`MIN_COST_SAMPLES`] keeps one of them from shutting tls-new on a quiet node, and the
    /// window lets them go.
    pub fn handshake_cost(&self, kind: HandshakeKind) -> Option<Duration> {
        self.recent[kind as usize]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .mean()
    }

    /// Records when the certificate served now expires (Unix seconds); `None` (a self-signed
    /// certificate made at start, one that does not parse) leaves no series, which no alert
    /// would read as expired.
    pub fn certificate_expires(&self, at: Option<i64>) {
        let (family, labels) = &self.certificate_expiry;
        match at {
            Some(at) => {
                family.get_or_create(labels).set(at);
            }
            None => {
                family.remove(labels);
            }
        }
    }

    /// Counts a first flight computed `on` the worker or a flight thread.
    pub fn first_flight(&self, on: FlightOn) {
        self.first_flights[on as usize].inc();
    }

    /// The counter of first flights dropped uncomputed, for the flight thread that drops one.
    pub fn flights_abandoned(&self) -> Counter {
        self.abandoned.clone()
    }

    /// Counts an issued key withdrawn because its offer did not resume.
    pub fn offer_withdrawn(&self) {
        self.withdrawn.inc();
    }

    /// Counts an outcome.
    pub fn outcome(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cost_figure_waits_for_enough_handshakes() {
        let stats = ProxyStats::default();
        let l = stats.listener("127.0.0.1:8443");
        // A first, costly handshake alone is not the cost.
        l.handshake(HandshakeKind::Full, Duration::from_millis(40));
        for _ in 1..MIN_COST_SAMPLES - 1 {
            l.handshake(HandshakeKind::Full, Duration::from_millis(1));
        }
        assert_eq!(l.handshake_cost(HandshakeKind::Full), None);
        l.handshake(HandshakeKind::Full, Duration::from_millis(1));
        let cost = l.handshake_cost(HandshakeKind::Full).unwrap();
        assert!(
            (3.4..3.5).contains(&(cost.as_secs_f64() * 1e3)),
            "{cost:?}: the mean of 40 ms and fifteen of 1 ms"
        );
        assert_eq!(l.handshake_cost(HandshakeKind::Resumed), None);
    }

    #[test]
    fn the_cost_figure_follows_the_last_handshakes() {
        let stats = ProxyStats::default();
        let l = stats.listener("127.0.0.1:8443");
        for _ in 0..COST_WINDOW * 3 {
            l.handshake(HandshakeKind::Full, Duration::from_micros(300));
        }
        // A reload to a costlier certificate: within one window the figure is the new cost,
        // where a mean since the start would still read under half of it.
        for n in 1..=COST_WINDOW {
            l.handshake(HandshakeKind::Full, Duration::from_micros(3_000));
            let cost = l.handshake_cost(HandshakeKind::Full).unwrap().as_micros();
            assert_eq!(cost, (300 * (COST_WINDOW - n) + 3_000 * n) as u128 / 100);
        }
        assert_eq!(
            l.handshake_cost(HandshakeKind::Full),
            Some(Duration::from_millis(3))
        );
        // The Prometheus counters keep every handshake.
        let mut registry = Registry::default();
        stats.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains(
            "gateway_proxy_handshakes_total{listener=\"127.0.0.1:8443\",kind=\"full\"} 400"
        ));
    }

    #[test]
    fn a_listener_counts_into_the_shared_families() {
        let stats = ProxyStats::default();
        let l = stats.listener("127.0.0.1:8443");
        l.handshake(HandshakeKind::Full, Duration::from_millis(2));
        l.handshake(HandshakeKind::Full, Duration::from_millis(4));
        l.outcome(Outcome::IdleTimeout);
        l.first_flight(FlightOn::Thread);
        let mut registry = Registry::default();
        stats.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains(
            "gateway_proxy_handshakes_total{listener=\"127.0.0.1:8443\",kind=\"full\"} 2"
        ));
        assert!(text.contains(
            "gateway_proxy_connections_total{listener=\"127.0.0.1:8443\",outcome=\"idle_timeout\"} 1"
        ));
        assert!(text.contains(
            "gateway_proxy_first_flights_total{listener=\"127.0.0.1:8443\",on=\"flight_thread\"} 1"
        ));
        assert!(text.contains(
            "gateway_proxy_first_flights_total{listener=\"127.0.0.1:8443\",on=\"worker\"} 0"
        ));
    }

    #[test]
    fn every_outcome_sits_at_its_discriminant() {
        for (i, o) in Outcome::ALL.iter().enumerate() {
            assert_eq!(*o as usize, i, "{}", o.name());
        }
    }
}
