//! What the daemon tells the datapath about the TLS sessions it issues: their keys, so resumption
//! offers can be verified at the NIC. (Completions need no telling: the datapath sees the
//! server's answers leave, for the daemon's own connections as for any server's.)
//!
//! One [`Feedback`] serves every attached interface; a daemon running without a datapath (no
//! interface attached) gets an empty one, whose calls do nothing.

use std::{
    collections::VecDeque,
    sync::Mutex,
    time::{Duration, Instant},
};

use aya::maps::{HashMap, MapData};
use gateway_common::{
    maps::{IssuedKey, IssuedValue, MAX_TLS_ISSUED, names},
    tls::{KEY_LEN, MAX_OFFER, offer_digest},
};
use tracing::warn;

use crate::{
    maps::{MapsError, monotonic_ns, open_as},
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
    issued: HashMap<MapData, IssuedKey, IssuedValue>,
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
    resume_limit: u32,
}

impl Feedback {
    /// Feedback to the interfaces pinned under `pins` (`(name, pin dir)`), publishing keys that
    /// expire after `lifetime` and may each hold `resume_limit` resumed connections at once.
    pub fn open(
        pins: &[(String, PinDir)],
        lifetime: Duration,
        resume_limit: u32,
    ) -> Result<Self, MapsError> {
        let mut ifaces = Vec::new();
        for (name, pd) in pins {
            ifaces.push(Iface {
                name: name.clone(),
                issued: open_as(pd, names::TLS_ISSUED)?,
            });
        }
        Ok(Self::with(ifaces, lifetime, resume_limit))
    }

    /// Feedback to no datapath at all.
    pub fn none(lifetime: Duration) -> Self {
        Self::with(Vec::new(), lifetime, 1)
    }

    fn with(ifaces: Vec<Iface>, lifetime: Duration, resume_limit: u32) -> Self {
        Feedback {
            inner: Mutex::new(Inner {
                ifaces,
                expiry: VecDeque::new(),
            }),
            lifetime,
            resume_limit,
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
            limit: self.resume_limit,
            issued_ns: monotonic_ns(),
            ..Default::default()
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

    /// Withdraws the key `key` (an offer of it did not resume); whether any interface had it.
    pub fn withdraw_key(&self, key: &[u8; KEY_LEN]) -> bool {
        let key = IssuedKey { key: *key };
        let mut inner = self.lock();
        let mut had = false;
        for i in &mut inner.ifaces {
            had |= i.issued.remove(&key).is_ok();
        }
        had
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
}

/// The datapath's key of an issued value: the digest of all of it. Values shorter than
/// `KEY_LEN` or longer than `MAX_OFFER` are never verified by the datapath and not published.
fn issued_key(issued: &[u8]) -> Option<IssuedKey> {
    (KEY_LEN..=MAX_OFFER as usize)
        .contains(&issued.len())
        .then(|| IssuedKey {
            key: offer_digest(issued),
        })
}

impl std::fmt::Debug for Feedback {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feedback")
            .field("published", &self.published())
            .finish()
    }
}
