//! What the daemon tells the datapath about the TLS sessions it issues: their keys, so resumption
//! offers can be verified at the NIC, and their withdrawal (lifetime over, single-use session
//! taken, an offer that did not resume). Completions need no telling: the datapath sees the
//! server's answers leave, for the daemon's own connections as for any server's.
//!
//! One [`IssuedKeys`] serves every attached interface; a daemon running without a datapath (no
//! interface attached) gets an empty one, whose calls do nothing.

use std::{
    collections::VecDeque,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use gateway_common::{
    maps::{IssuedKey, IssuedValue, MAX_TLS_ISSUED},
    tls::{KEY_LEN, MAX_OFFER, Offer, offer_digest},
};
use tracing::warn;

use crate::{attached::Attached, maps::monotonic_ns};

/// The issued keys a listener published to every attached interface.
pub struct IssuedKeys {
    ifaces: Vec<Arc<Attached>>,
    /// Published keys by expiry, oldest first (one lifetime per [`IssuedKeys`], so issue order
    /// is expiry order); at most `MAX_TLS_ISSUED` long, as the map itself.
    expiry: Mutex<VecDeque<(Instant, IssuedKey)>>,
    lifetime: Duration,
    resume_limit: u32,
}

impl IssuedKeys {
    /// Keys for the interfaces `ifaces`, each expiring after `lifetime` and holding at most
    /// `resume_limit` resumed connections at once.
    pub fn new(ifaces: &[Arc<Attached>], lifetime: Duration, resume_limit: u32) -> Self {
        IssuedKeys {
            ifaces: ifaces.to_vec(),
            expiry: Mutex::new(VecDeque::new()),
            lifetime,
            resume_limit,
        }
    }

    /// Keys for no datapath at all.
    pub fn none(lifetime: Duration) -> Self {
        Self::new(&[], lifetime, 1)
    }

    fn expiry(&self) -> std::sync::MutexGuard<'_, VecDeque<(Instant, IssuedKey)>> {
        // A panic elsewhere while holding the lock leaves the queue consistent.
        self.expiry.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Publishes an issued session id, ticket or PSK identity (the digest of all of it; values
    /// the datapath never verifies, shorter than `KEY_LEN` or longer than `MAX_OFFER`, are not
    /// published).
    pub fn publish(&self, issued: &[u8], kind: Offer) {
        let Some(key) = issued_key(issued) else {
            return;
        };
        let value = IssuedValue {
            kind: kind as u32,
            limit: self.resume_limit,
            issued_ns: monotonic_ns(),
            ..Default::default()
        };
        let mut expiry = self.expiry();
        for a in &self.ifaces {
            if let Err(e) = a.maps().add_issued(key, value) {
                warn!(iface = %a.iface(), error = %e, "cannot publish an issued session key");
            }
        }
        if expiry.len() >= MAX_TLS_ISSUED as usize {
            // The map (an LRU of the same size) has evicted this one already.
            expiry.pop_front();
        }
        expiry.push_back((Instant::now() + self.lifetime, key));
    }

    /// Withdraws the key of an issued value (a single-use session was taken).
    pub fn withdraw(&self, issued: &[u8]) {
        if let Some(key) = issued_key(issued) {
            self.remove(&key);
        }
    }

    /// Withdraws the key `key` (an offer of it did not resume); whether any interface had it.
    pub fn withdraw_key(&self, key: &[u8; KEY_LEN]) -> bool {
        self.remove(&IssuedKey { key: *key })
    }

    fn remove(&self, key: &IssuedKey) -> bool {
        let mut had = false;
        for a in &self.ifaces {
            had |= a.maps().remove_issued(key).unwrap_or(false);
        }
        had
    }

    /// Withdraws every key whose lifetime ended by `now`; returns how many.
    pub fn expire(&self, now: Instant) -> usize {
        let mut expiry = self.expiry();
        let mut n = 0;
        while expiry.front().is_some_and(|(t, _)| *t <= now) {
            let (_, key) = expiry.pop_front().expect("non-empty");
            self.remove(&key);
            n += 1;
        }
        n
    }

    /// Keys published and not yet expired.
    pub fn published(&self) -> usize {
        self.expiry().len()
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

impl std::fmt::Debug for IssuedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedKeys")
            .field("published", &self.published())
            .finish()
    }
}
