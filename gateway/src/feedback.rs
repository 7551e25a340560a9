//! What the daemon tells the datapath about the TLS connections it terminates: the session keys it
//! issued (so resumption offers can be verified at the NIC) and each connection's completion (so the
//! datapath's backlog is exact).
//!
//! One [`Feedback`] serves every attached interface; a daemon running without a datapath (no
//! interface attached) gets an empty one, whose calls do nothing.

use std::{
    collections::VecDeque,
    net::{IpAddr, SocketAddr},
    sync::Mutex,
    time::{Duration, Instant},
};

use aya::maps::{Array, HashMap, MapData};
use gateway_common::{
    Class, NUM_CLASSES,
    maps::{
        COMPLETION_BY_DAEMON, COMPLETION_COUNTED, DaemonCompletions, FLOW_ADMITTED, FlowKey,
        IssuedKey, IssuedValue, MAX_TLS_ISSUED, TlsFlow, names,
    },
    tls::KEY_LEN,
};
use tracing::warn;

use crate::{
    maps::{MapsError, monotonic_ns, op, open_as},
    pins::PinDir,
};

/// What kind of key was issued ([`IssuedValue::kind`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IssuedKind {
    /// A session id (TLS 1.2) or a stateful TLS 1.3 PSK identity, from the session cache.
    SessionId = 1,
    /// A ticket (TLS 1.2 ticket or TLS 1.3 PSK identity).
    Ticket = 2,
}

/// One interface's maps.
struct Iface {
    name: String,
    flows: HashMap<MapData, FlowKey, TlsFlow>,
    issued: HashMap<MapData, IssuedKey, IssuedValue>,
    completions: Array<MapData, DaemonCompletions>,
    /// This daemon's view of `completions` (it is the only writer).
    done: [u64; NUM_CLASSES],
}

struct Inner {
    ifaces: Vec<Iface>,
    /// Published keys by expiry, oldest first (one lifetime per [`Feedback`], so issue order is
    /// expiry order); at most `MAX_TLS_ISSUED` long, as the map itself.
    expiry: VecDeque<(Instant, IssuedKey)>,
}

/// The daemon's feedback to the datapath of every attached interface.
pub struct Feedback {
    inner: Mutex<Inner>,
    lifetime: Duration,
}

/// The datapath's key of a connection accepted from `peer` on `local`.
pub fn flow_key(peer: SocketAddr, local: SocketAddr) -> FlowKey {
    let v6 = |ip: IpAddr| match ip {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    FlowKey {
        saddr: v6(peer.ip()),
        daddr: v6(local.ip()),
        sport: peer.port(),
        dport: local.port(),
        pad: 0,
    }
}

impl Feedback {
    /// Feedback to the interfaces pinned under `pins` (`(name, pin dir)`), publishing keys that
    /// expire after `lifetime`.
    pub fn open(pins: &[(String, PinDir)], lifetime: Duration) -> Result<Self, MapsError> {
        let mut ifaces = Vec::new();
        for (name, pd) in pins {
            let completions: Array<MapData, DaemonCompletions> =
                open_as(pd, names::DAEMON_COMPLETIONS)?;
            let mut done = [0u64; NUM_CLASSES];
            for (i, d) in done.iter_mut().enumerate() {
                *d = completions
                    .get(&(i as u32), 0)
                    .map_err(op(names::DAEMON_COMPLETIONS))?
                    .completed;
            }
            ifaces.push(Iface {
                name: name.clone(),
                flows: open_as(pd, names::TLS_FLOWS)?,
                issued: open_as(pd, names::TLS_ISSUED)?,
                completions,
                done,
            });
        }
        Ok(Self::with(ifaces, lifetime))
    }

    /// Feedback to no datapath at all.
    pub fn none(lifetime: Duration) -> Self {
        Self::with(Vec::new(), lifetime)
    }

    fn with(ifaces: Vec<Iface>, lifetime: Duration) -> Self {
        Feedback {
            inner: Mutex::new(Inner {
                ifaces,
                expiry: VecDeque::new(),
            }),
            lifetime,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere while holding the lock leaves the maps consistent (each call is one
        // map operation per interface), so a poisoned lock is still usable.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes an issued session id, ticket or PSK identity (its first `KEY_LEN` bytes; shorter
    /// ones are never verified by the datapath and are not published).
    pub fn publish(&self, issued: &[u8], kind: IssuedKind) {
        let Some(key) = issued_key(issued) else {
            return;
        };
        let value = IssuedValue {
            kind: kind as u32,
            flags: 0,
            issued_ns: monotonic_ns(),
        };
        let mut inner = self.lock();
        for i in &mut inner.ifaces {
            if let Err(e) = i.issued.insert(key, value, 0) {
                warn!(iface = %i.name, error = %e, "cannot publish an issued session key");
            }
        }
        if inner.expiry.len() >= MAX_TLS_ISSUED as usize {
            // The map (an LRU of the same size) has evicted this one already.
            inner.expiry.pop_front();
        }
        inner
            .expiry
            .push_back((Instant::now() + self.lifetime, key));
    }

    /// Withdraws a key (a single-use session was taken).
    pub fn withdraw(&self, issued: &[u8]) {
        if let Some(key) = issued_key(issued) {
            let mut inner = self.lock();
            for i in &mut inner.ifaces {
                let _ = i.issued.remove(&key);
            }
        }
    }

    /// Withdraws every key whose lifetime ended by `now`; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let mut inner = self.lock();
        let mut n = 0;
        while inner.expiry.front().is_some_and(|(t, _)| *t <= now) {
            let (_, key) = inner.expiry.pop_front().expect("non-empty");
            for i in &mut inner.ifaces {
                let _ = i.issued.remove(&key);
            }
            n += 1;
        }
        n
    }

    /// Keys published and not yet expired.
    pub fn published(&self) -> usize {
        self.lock().expiry.len()
    }

    /// Completes every connection the datapath admitted and left to a daemon to complete: called
    /// at start, before anything is accepted, when every such connection belonged to a previous
    /// daemon process and is gone (a crash, or a restart with `on_exit: keep`, would otherwise leave
    /// them in the backlog for good). Returns how many.
    pub fn complete_orphans(&self) -> usize {
        let keys: Vec<FlowKey> = {
            let inner = self.lock();
            inner
                .ifaces
                .iter()
                .flat_map(|i| {
                    i.flows
                        .iter()
                        .filter_map(Result::ok)
                        .filter(|(_, f)| {
                            f.state == FLOW_ADMITTED && f.completed == COMPLETION_BY_DAEMON
                        })
                        .map(|(k, _)| k)
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        keys.iter().filter(|k| self.complete(k).is_some()).count()
    }

    /// Counts the completion of the connection `key` (its handshake finished, failed or was cut
    /// short) if the datapath admitted it and left its completion to the daemon. Returns its
    /// class; `None` when the datapath did not see it (or counted it itself): nothing to do.
    pub fn complete(&self, key: &FlowKey) -> Option<Class> {
        let mut inner = self.lock();
        for i in &mut inner.ifaces {
            let Ok(mut flow) = i.flows.get(key, 0) else {
                continue;
            };
            if flow.state != FLOW_ADMITTED || flow.completed != COMPLETION_BY_DAEMON {
                return None;
            }
            let class = Class::from_id(u32::from(flow.class))?;
            flow.completed = COMPLETION_COUNTED;
            // The flow says counted even if a later packet raced this update: only the daemon
            // counts completions of these flows, and it reaches here once per connection.
            let _ = i.flows.insert(key, flow, 0);
            let slot = &mut i.done[class.id() as usize];
            *slot += 1;
            let value = DaemonCompletions { completed: *slot };
            if let Err(e) = i.completions.set(class.id(), value, 0) {
                warn!(iface = %i.name, error = %e, "cannot count a completion");
            }
            return Some(class);
        }
        None
    }
}

fn issued_key(issued: &[u8]) -> Option<IssuedKey> {
    let key: [u8; KEY_LEN] = issued.get(..KEY_LEN)?.try_into().ok()?;
    Some(IssuedKey { key })
}

impl std::fmt::Debug for Feedback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feedback")
            .field("published", &self.published())
            .finish()
    }
}
