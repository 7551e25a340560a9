//! What the daemon tells the datapath about the TLS sessions it issues: their keys, so resumption
//! offers can be verified at the NIC, and their withdrawal (lifetime over, single-use session
//! taken, an offer that did not resume). Completions need no telling: the datapath sees the
//! server's answers leave, for the daemon's own connections as for any server's.
//!
//! One [`IssuedKeys`] serves every attached interface; a daemon running without a datapath (no
//! interface attached) gets an empty one, whose calls do nothing.

use std::{
    collections::{HashMap, HashSet, VecDeque},
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use gateway_common::{
    maps::{IssuedKey, IssuedValue, TagKey},
    tls::{
        KEY_LEN, Offer, issued_key,
        tag::{TAIL_LEN, Tail},
    },
};
use tracing::warn;

use crate::{datapath::attached::Attached, datapath::maps::monotonic_ns};

/// The terms a key is published under; a reload changes them for keys issued from then on (a
/// key keeps the terms it was issued with: its lifetime is what the client was told).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Terms {
    /// How long a key stays published.
    pub lifetime: Duration,
    /// How many resumed connections may hold it at once.
    pub resume_limit: u32,
    /// How many resumptions it buys per minute beyond those (`IssuedValue::per_minute`).
    pub per_minute: u32,
}

/// Keys of one chain published at once, at most: the tickets a session begets when it is
/// resumed, and those theirs beget, share one window ([`IssuedKeys::publish_chained`]). Room for
/// a browser's parallel connections, each resuming a ticket of its own and given two more.
pub const CHAIN_KEYS: usize = 32;

/// The tag keys of a listener's ticket secret, one per rotation period, as the NIC checks a
/// ticket's tag with them: made by the listener's ticketer (`crate::tls::tickets::TagKeys`).
pub trait TagKeySource: Send + Sync {
    /// The periods whose tickets are accepted at `t`, newest first.
    fn accepted_periods(&self, t: std::time::SystemTime) -> Vec<u64>;
    /// The tag key of `period`, as SipHash's two key words.
    fn period_key(&self, period: u64) -> (u64, u64);
}

/// The issued keys a listener published to every attached interface.
///
/// A published key stays until its lifetime ends (or it is withdrawn): load never evicts one.
/// Except within a chain: the keys of the tickets issued on resumed connections belong to the
/// chain of the session resumed, and a chain holds at most [`CHAIN_KEYS`] at once, its oldest
/// withdrawn for a new one. One ticket holder resuming each new ticket once, as fast as it can,
/// so spends its own window and never the table (issue 52: it used to fill it in seconds, and
/// returning clients' new tickets could no longer be published).
/// When the table is full (`capacity` keys of this listener's, or the map itself, shared by
/// every listener, refused the key on every interface), a new key is not published and is
/// counted ([`IssuedKeys::take_unpublished`]): its resumptions are then judged as new hellos at
/// the NIC, as any unverified offer is.
pub struct IssuedKeys {
    ifaces: Vec<Arc<Attached>>,
    /// Published keys by expiry, soonest first; at most `capacity` long.
    expiry: Mutex<VecDeque<(Instant, IssuedKey)>>,
    capacity: usize,
    terms: Mutex<Terms>,
    /// Keys not published since last taken, the table being full.
    unpublished: AtomicU64,
    /// The port of the listener whose keys these are (its tickets' tag keys are the port's).
    port: u16,
    /// The tag keys of the listener's ticket secret, once its ticketer is made.
    tags: Mutex<Option<Arc<dyn TagKeySource>>>,
    /// Keys by chain.
    chains: Mutex<Chains>,
    /// Keys withdrawn before their expiry (a chain's oldest), still in `expiry`: not counted
    /// against `capacity`, and not removed again when their time comes.
    early: Mutex<HashSet<IssuedKey>>,
    /// Keys withdrawn for a newer one of their chain.
    chain_withdrawn: AtomicU64,
}

/// The published keys by chain: each key's chain (named by its first key), and each chain's
/// keys, oldest first.
#[derive(Debug, Default)]
struct Chains {
    root_of: HashMap<IssuedKey, IssuedKey>,
    keys: HashMap<IssuedKey, VecDeque<IssuedKey>>,
}

impl Chains {
    /// Adds `key` to the chain of `parent` (a chain of its own without one, or when `parent`
    /// is not known here: issued elsewhere, or gone); the key that must go to keep that chain
    /// within [`CHAIN_KEYS`], if one must.
    fn add(&mut self, key: IssuedKey, parent: Option<IssuedKey>) -> Option<IssuedKey> {
        let root = parent.map_or(key, |p| self.root_of.get(&p).copied().unwrap_or(p));
        let chain = self.keys.entry(root).or_default();
        let out = if chain.len() >= CHAIN_KEYS {
            chain.pop_front()
        } else {
            None
        };
        chain.push_back(key);
        self.root_of.insert(key, root);
        if let Some(out) = out {
            self.root_of.remove(&out);
        }
        out
    }

    /// Forgets `key` (expired or withdrawn).
    fn remove(&mut self, key: &IssuedKey) {
        let Some(root) = self.root_of.remove(key) else {
            return;
        };
        if let Some(chain) = self.keys.get_mut(&root) {
            chain.retain(|k| k != key);
            if chain.is_empty() {
                self.keys.remove(&root);
            }
        }
    }
}

impl IssuedKeys {
    /// Keys of the listener on `port` for the interfaces `ifaces`, published under `terms`, at
    /// most `capacity` at once (the entries of their issued-keys table).
    pub fn new(ifaces: &[Arc<Attached>], port: u16, terms: Terms, capacity: u32) -> Self {
        IssuedKeys {
            ifaces: ifaces.to_vec(),
            expiry: Mutex::new(VecDeque::new()),
            capacity: capacity as usize,
            terms: Mutex::new(terms),
            unpublished: AtomicU64::new(0),
            port,
            tags: Mutex::new(None),
            chains: Mutex::new(Chains::default()),
            early: Mutex::new(HashSet::new()),
            chain_withdrawn: AtomicU64::new(0),
        }
    }

    /// The tag keys of the listener's ticket secret (its ticketer's), written to every
    /// interface by [`IssuedKeys::refresh_tags`].
    pub fn set_tag_keys(&self, tags: Arc<dyn TagKeySource>) {
        *lock(&self.tags) = Some(tags);
    }

    /// Writes the tag keys of the periods whose tickets may be alive at `now` to every
    /// interface, under the terms keys are published under now, and removes the listener's
    /// retired ones: with them each NIC verifies tickets any node sharing the secret issued.
    /// Run every second or so: it also keeps the NIC's wall clock (`TagKey::clock_ns`) right.
    pub fn refresh_tags(&self, now: std::time::SystemTime) {
        let Some(tags) = lock(&self.tags).clone() else {
            return;
        };
        let terms = self.terms();
        let clock_ns = crate::datapath::maps::wall_clock_offset_ns();
        let keys: Vec<(u32, TagKey)> = tags
            .accepted_periods(now)
            .into_iter()
            .map(|p| {
                let (k0, k1) = tags.period_key(p);
                let key = TagKey {
                    k0,
                    k1,
                    limit: terms.resume_limit,
                    per_minute: terms.per_minute,
                    clock_ns,
                };
                (p as u32, key)
            })
            .collect();
        for a in &self.ifaces {
            if let Err(e) = a.maps().set_tag_keys(self.port, &keys) {
                warn!(iface = %a.iface(), error = %e, "cannot write the ticket tag keys");
            }
        }
    }

    /// Removes the keys whose expiry passed by `now_unix` (seconds) from every interface: those
    /// the NIC published for tickets their tag vouched for, and withdrawn ones. Returns how many.
    pub fn sweep(&self, now_unix: u64) -> usize {
        self.ifaces
            .iter()
            .map(|a| a.maps().sweep_issued(now_unix).unwrap_or(0))
            .sum()
    }

    /// Keys not published since the last call (the table was full), and zero from now on.
    pub fn take_unpublished(&self) -> u64 {
        self.unpublished.swap(0, Ordering::Relaxed)
    }

    /// The terms keys are published under now.
    pub fn terms(&self) -> Terms {
        *lock(&self.terms)
    }

    /// Publishes keys from now on under `terms` (a reload); keys already published keep theirs.
    pub fn set_terms(&self, terms: Terms) {
        *lock(&self.terms) = terms;
    }

    /// Keys for no datapath at all.
    pub fn none(lifetime: Duration) -> Self {
        Self::new(
            &[],
            0,
            Terms {
                lifetime,
                resume_limit: 1,
                per_minute: 0,
            },
            gateway_common::maps::DEFAULT_TLS_ISSUED,
        )
    }

    fn expiry(&self) -> MutexGuard<'_, VecDeque<(Instant, IssuedKey)>> {
        lock(&self.expiry)
    }

    /// Publishes an issued session id, ticket or PSK identity (its key,
    /// `gateway_common::tls::issued_key`; values the datapath never verifies are not
    /// published). A ticket's key expires with the ticket (its tail says when).
    pub fn publish(&self, issued: &[u8], kind: Offer) {
        self.publish_chained(issued, kind, None);
    }

    /// [`IssuedKeys::publish`], for a session issued on a connection that resumed the session
    /// whose key is `parent`: in that session's chain, which keeps at most [`CHAIN_KEYS`]
    /// published (its oldest withdrawn for this one).
    pub fn publish_chained(&self, issued: &[u8], kind: Offer, parent: Option<[u8; KEY_LEN]>) {
        let Some(key) = issued_key(kind, issued).map(|key| IssuedKey { key }) else {
            return;
        };
        let expires = match kind {
            Offer::Ticket | Offer::Psk => issued
                .last_chunk::<TAIL_LEN>()
                .map_or(0, |t| u64::from(Tail::parse(t).expires)),
            _ => 0,
        };
        let terms = self.terms();
        let value = IssuedValue {
            kind: kind as u32,
            limit: terms.resume_limit,
            per_minute: terms.per_minute,
            issued_ns: monotonic_ns(),
            expires,
            ..Default::default()
        };
        let mut expiry = self.expiry();
        if expiry.len() - lock(&self.early).len() >= self.capacity {
            // Full: no key that a session still needs is pushed out for it.
            self.unpublished.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut refused = 0;
        for a in &self.ifaces {
            if let Err(e) = a.maps().add_issued(key, value) {
                // A full map (shared by every listener) refuses with E2BIG: counted, not logged
                // per key.
                if !e.is_full() {
                    warn!(iface = %a.iface(), error = %e, "cannot publish an issued session key");
                }
                refused += 1;
            }
        }
        if refused > 0 && refused == self.ifaces.len() {
            self.unpublished.fetch_add(1, Ordering::Relaxed);
            return;
        }
        // In expiry order: after a reload shortened the lifetime, a new key may end before
        // older ones. A ticket's key ends with the ticket (its tail's expiry, the first whole
        // second past its lifetime): withdrawn earlier, its tag would publish it again at the
        // NIC until then.
        let at = Instant::now() + key_lifetime(expires, terms.lifetime, SystemTime::now());
        let place = expiry.partition_point(|(t, _)| *t <= at);
        expiry.insert(place, (at, key));
        drop(expiry);
        let parent = parent.map(|key| IssuedKey { key });
        let out = lock(&self.chains).add(key, parent);
        if let Some(out) = out {
            self.remove(&out);
            lock(&self.early).insert(out);
            self.chain_withdrawn.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Keys withdrawn so far for a newer one of their chain ([`CHAIN_KEYS`]).
    pub fn chain_withdrawn(&self) -> u64 {
        self.chain_withdrawn.load(Ordering::Relaxed)
    }

    /// Withdraws the key of an issued session id (a single-use session was taken).
    pub fn withdraw(&self, issued: &[u8]) {
        if let Some(key) = issued_key(Offer::SessionId, issued) {
            self.remove(&IssuedKey { key });
        }
    }

    /// Whether `key` is published on any interface: an offer of it is one the datapath
    /// verifies (with no interface attached, none is).
    pub fn is_published(&self, key: &[u8; KEY_LEN]) -> bool {
        let key = IssuedKey { key: *key };
        self.ifaces
            .iter()
            .any(|a| a.maps().is_issued(&key).unwrap_or(false))
    }

    /// Withdraws the key `key` (an offer of it did not resume); whether any interface had it.
    /// A ticket's key stays withdrawn until the ticket expires (`Maps::withdraw_issued`), so
    /// that its tag cannot publish it again.
    pub fn withdraw_key(&self, key: &[u8; KEY_LEN]) -> bool {
        let key = IssuedKey { key: *key };
        let mut had = false;
        for a in &self.ifaces {
            had |= a.maps().withdraw_issued(&key).unwrap_or(false);
        }
        had
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
            if lock(&self.early).remove(&key) {
                continue;
            }
            self.remove(&key);
            lock(&self.chains).remove(&key);
            n += 1;
        }
        n
    }

    /// Keys published and not yet expired (nor withdrawn for a newer one of their chain).
    pub fn published(&self) -> usize {
        let expiry = self.expiry();
        expiry.len() - lock(&self.early).len()
    }
}

/// How long a key published now stays: `lifetime`, or for a ticket expiring at `expires` (unix
/// seconds, 0: none) until then, at most a second past `lifetime` (never past what the ticket
/// was told).
fn key_lifetime(expires: u64, lifetime: Duration, now: SystemTime) -> Duration {
    if expires == 0 {
        return lifetime;
    }
    let now = now.duration_since(UNIX_EPOCH).unwrap_or_default();
    Duration::from_secs(expires)
        .saturating_sub(now)
        .min(lifetime + Duration::from_secs(1))
}

/// Locks `m`; a panic elsewhere while holding it leaves the data consistent (every change under
/// these locks is a single step).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl std::fmt::Debug for IssuedKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IssuedKeys")
            .field("published", &self.published())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reload_changes_the_terms_of_keys_issued_after_it_only() {
        let keys = IssuedKeys::none(Duration::from_secs(60));
        let t0 = Instant::now();
        keys.publish(&[1; 32], Offer::SessionId);
        keys.set_terms(Terms {
            lifetime: Duration::from_secs(1),
            resume_limit: 3,
            per_minute: 0,
        });
        assert_eq!(keys.terms().resume_limit, 3);
        keys.publish(&[2; 32], Offer::SessionId);
        // The new key ends first although issued last; the old one keeps its 60 s.
        assert_eq!(keys.expire(t0 + Duration::from_secs(2)), 1);
        assert_eq!(keys.published(), 1);
        assert_eq!(keys.expire(t0 + Duration::from_secs(30)), 0);
        assert_eq!(keys.expire(t0 + Duration::from_secs(61)), 1);
        assert_eq!(keys.published(), 0);
    }

    #[test]
    fn a_tickets_key_ends_with_the_ticket() {
        let lifetime = Duration::from_secs(7200);
        let now = UNIX_EPOCH + Duration::from_millis(1_000_000_400);
        // The tail says the first whole second past the lifetime.
        assert_eq!(
            key_lifetime(1_000_000 + 7200 + 1, lifetime, now),
            Duration::from_millis(7200 * 1000 + 600)
        );
        // Session ids: the lifetime.
        assert_eq!(key_lifetime(0, lifetime, now), lifetime);
        // A tail promising more than the lifetime (a clock far behind) buys a second at most;
        // one already past ends at once.
        assert_eq!(
            key_lifetime(2_000_000, lifetime, now),
            lifetime + Duration::from_secs(1)
        );
        assert_eq!(key_lifetime(999_999, lifetime, now), Duration::ZERO);
    }

    #[test]
    fn a_full_table_keeps_every_key_and_counts_the_ones_it_refuses() {
        let keys = IssuedKeys::new(
            &[],
            0,
            Terms {
                lifetime: Duration::from_secs(60),
                resume_limit: 1,
                per_minute: 0,
            },
            100,
        );
        for i in 0..150u32 {
            keys.publish(&i.to_le_bytes().repeat(8), Offer::SessionId);
        }
        assert_eq!(keys.published(), 100);
        assert_eq!(keys.take_unpublished(), 50);
        assert_eq!(keys.take_unpublished(), 0);
        // The first keys are still there: none ends before its lifetime.
        assert_eq!(keys.expire(Instant::now() + Duration::from_secs(30)), 0);
        assert_eq!(keys.expire(Instant::now() + Duration::from_secs(61)), 100);
    }

    #[test]
    fn a_chain_keeps_its_window_and_leaves_the_table_to_everyone_else() {
        let keys = IssuedKeys::new(
            &[],
            0,
            Terms {
                lifetime: Duration::from_secs(60),
                resume_limit: 1,
                per_minute: 0,
            },
            600,
        );
        let id = |i: u32| i.to_le_bytes().repeat(8);
        let key = |i: u32| issued_key(Offer::SessionId, &id(i)).unwrap();
        // A returning client's session, and one holder's chain: each resumption of the newest
        // key begets two more, 2,000 times (a table of 600 would have filled at the 300th).
        keys.publish(&id(1), Offer::SessionId);
        keys.publish(&id(2), Offer::SessionId);
        let mut newest = 2;
        for i in 0..2000u32 {
            let a = 10 + 2 * i;
            keys.publish_chained(&id(a), Offer::SessionId, Some(key(newest)));
            keys.publish_chained(&id(a + 1), Offer::SessionId, Some(key(newest)));
            newest = a + 1;
        }
        assert_eq!(
            keys.published(),
            1 + CHAIN_KEYS,
            "the client's key and the chain's window"
        );
        assert_eq!(keys.chain_withdrawn(), 4001 - CHAIN_KEYS as u64);
        assert_eq!(keys.take_unpublished(), 0);
        // The returning client's new keys are published: it resumes, and its chain begins.
        for i in 0..10u32 {
            keys.publish_chained(&id(100_000 + i), Offer::SessionId, Some(key(1)));
        }
        assert_eq!(keys.published(), 1 + 10 + CHAIN_KEYS);
        assert_eq!(keys.take_unpublished(), 0);
        // Everything ends at its time, withdrawn keys counted once.
        assert_eq!(
            keys.expire(Instant::now() + Duration::from_secs(61)),
            1 + 10 + CHAIN_KEYS
        );
        assert_eq!(keys.published(), 0);
        assert!(lock(&keys.chains).keys.is_empty());
        assert!(lock(&keys.early).is_empty());
    }
}
