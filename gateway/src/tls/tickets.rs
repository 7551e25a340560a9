//! A ticketer with rotating keys, shareable between gateway nodes, that publishes every ticket it
//! issues to the datapath.
//!
//! Keys are derived, not stored: the key of rotation period `p` (wall-clock seconds divided by the
//! rotation interval) is HKDF-SHA256 of the secret with `p` as info, an AES-256-GCM key. Nodes that
//! share the secret file (and roughly agree on the time) derive the same keys, so each resumes the
//! others' tickets, and a key retires by itself when its period falls out of the lifetime window.
//!
//! A ticket is `nonce (12) | period (4, big endian) | AES-256-GCM(issued at, ms (8) | state) | tag
//! (16) | tail (16)`, the first 16 bytes authenticated as associated data. The tail
//! ([`gateway_common::tls::tag::Tail`]) is in clear for the NIC of any node sharing the secret:
//! the period, the ticket's expiry and a SipHash tag, under the period's tag key ([`TagKeys`],
//! derived from the same secret), of the ticket's key (the digest of all before the tail, unique
//! per ticket because the nonce is random), period and expiry. Opening checks the tail as the
//! NIC does, so a ticket whose tail was changed resumes nowhere. A ticket older than the
//! lifetime is refused (TLS 1.2 included, which rustls does not age-check itself), so it stops
//! resuming when the datapath withdraws its key.

use std::{
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use aws_lc_rs::{
    aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey},
    hkdf::{HKDF_SHA256, Prk, Salt},
    rand::{SecureRandom as _, SystemRandom},
};
use rustls::server::ProducesTickets;
use thiserror::Error;

use gateway_common::{
    maps::MAX_TAG_PERIODS,
    tls::{
        Offer, issued_key,
        tag::{TAIL_LEN, Tail, tag, ticket_key},
    },
};

use crate::{issued::IssuedKeys, tls::lineage};

/// Smallest accepted secret, bytes.
pub const MIN_SECRET: usize = 32;
/// Largest accepted secret file, bytes.
pub const MAX_SECRET: usize = 4096;
/// Bytes before the ciphertext: nonce and period.
const HEADER: usize = NONCE_LEN + 4;
/// The AEAD tag.
const TAG: usize = 16;

/// Errors of the ticket secret.
#[derive(Debug, Error)]
pub enum TicketError {
    /// The file could not be read.
    #[error("ticket key file {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The error.
        source: std::io::Error,
    },
    /// The file is too short or too long.
    #[error(
        "ticket key file {path}: {len} bytes, need {MIN_SECRET} to {MAX_SECRET} (e.g. `openssl rand 80 > FILE`)"
    )]
    Size {
        /// The file.
        path: String,
        /// Its length.
        len: usize,
    },
    /// The system random generator failed.
    #[error("random secret: {0}")]
    Random(String),
}

/// The secret ticket keys derive from.
pub struct Secret(Vec<u8>);

impl Secret {
    /// Reads a shared secret file.
    pub fn from_file(path: &Path) -> Result<Self, TicketError> {
        let bytes = std::fs::read(path).map_err(|source| TicketError::Read {
            path: path.display().to_string(),
            source,
        })?;
        if !(MIN_SECRET..=MAX_SECRET).contains(&bytes.len()) {
            return Err(TicketError::Size {
                path: path.display().to_string(),
                len: bytes.len(),
            });
        }
        Ok(Secret(bytes))
    }

    /// A random secret, private to this process.
    pub fn random() -> Result<Self, TicketError> {
        let mut bytes = vec![0u8; MIN_SECRET];
        SystemRandom::new()
            .fill(&mut bytes)
            .map_err(|e| TicketError::Random(e.to_string()))?;
        Ok(Secret(bytes))
    }
}

/// The tag keys of a ticket secret, one per rotation period: HKDF-SHA256 of the secret with
/// "tag" and the period as info, 16 bytes (a SipHash key). Every node sharing the secret derives
/// the same, writes those of the periods whose tickets may still be alive to its datapath
/// (`crate::issued::IssuedKeys::refresh_tags`), and its NIC checks any node's tickets with them.
pub struct TagKeys {
    prk: Prk,
    rotation_secs: u64,
    lifetime: Duration,
}

impl TagKeys {
    /// The tag key of `period`, as SipHash's two key words.
    pub fn key(&self, period: u64) -> (u64, u64) {
        let info = period.to_be_bytes();
        let info = [b"tag".as_slice(), info.as_slice()];
        let mut k = [0u8; 16];
        self.prk
            .expand(&info, TagKeyLen)
            .and_then(|okm| okm.fill(&mut k))
            .expect("HKDF-SHA256 gives 16 bytes");
        (
            u64::from_le_bytes(k[..8].try_into().expect("8 bytes")),
            u64::from_le_bytes(k[8..].try_into().expect("8 bytes")),
        )
    }

    /// The rotation period at `t`.
    pub fn period_at(&self, t: SystemTime) -> u64 {
        unix_secs(t) / self.rotation_secs
    }

    /// Periods whose tickets are accepted at period `now`: those a ticket issued within the
    /// lifetime may carry, and one ahead for a node whose clock runs early.
    fn accepted(&self, period: u64, now: u64) -> bool {
        let window = self.lifetime.as_secs().div_ceil(self.rotation_secs);
        period <= now + 1 && now.saturating_sub(period) <= window
    }

    /// The periods accepted at `t`, newest first, at most [`MAX_TAG_PERIODS`] of them (with a
    /// lifetime of more rotations, the oldest tickets are verified by their own node only).
    pub fn periods(&self, t: SystemTime) -> impl Iterator<Item = u64> + '_ {
        let now = self.period_at(t);
        (0..MAX_TAG_PERIODS)
            .map_while(move |back| (now + 1).checked_sub(back))
            .filter(move |p| self.accepted(*p, now))
    }

    /// The tail of a ticket whose bytes before it are `body`, sealed in `period` and expiring at
    /// `expires` (unix seconds).
    fn tail(&self, body: &[u8], period: u64, expires: u32) -> [u8; TAIL_LEN] {
        let (k0, k1) = self.key(period);
        // The key covers the body and the ticket's whole length.
        let mut whole = body.to_vec();
        whole.extend_from_slice(&[0; TAIL_LEN]);
        let key = ticket_key(&whole).unwrap_or_default();
        Tail {
            period: period as u32,
            expires,
            tag: tag(k0, k1, &key, period as u32, expires),
        }
        .to_bytes()
    }
}

impl crate::issued::TagKeySource for TagKeys {
    fn accepted_periods(&self, t: SystemTime) -> Vec<u64> {
        self.periods(t).collect()
    }

    fn period_key(&self, period: u64) -> (u64, u64) {
        self.key(period)
    }
}

/// HKDF output length of a tag key.
struct TagKeyLen;

impl aws_lc_rs::hkdf::KeyType for TagKeyLen {
    fn len(&self) -> usize {
        16
    }
}

/// The rotating, publishing ticketer (see the module docs).
pub struct RotatingTicketer {
    prk: Prk,
    /// The periods, the lifetime and the tag keys (shared with the issued keys).
    tags: Arc<TagKeys>,
    /// Derived keys of recent periods, newest last.
    keys: Mutex<Vec<(u64, Arc<LessSafeKey>)>>,
    rng: SystemRandom,
    issued: Arc<IssuedKeys>,
}

impl std::fmt::Debug for RotatingTicketer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RotatingTicketer")
            .field("rotation_secs", &self.tags.rotation_secs)
            .field("lifetime", &self.tags.lifetime)
            .finish_non_exhaustive()
    }
}

impl RotatingTicketer {
    /// A ticketer over `secret` whose keys rotate every `rotation` and whose tickets live for
    /// `lifetime`.
    pub fn new(
        secret: Secret,
        rotation: Duration,
        lifetime: Duration,
        issued: Arc<IssuedKeys>,
    ) -> Self {
        let prk = Salt::new(HKDF_SHA256, b"gateway ticket keys v1").extract(&secret.0);
        let tags = Arc::new(TagKeys {
            prk: prk.clone(),
            rotation_secs: rotation.as_secs().max(1),
            lifetime,
        });
        issued.set_tag_keys(tags.clone());
        RotatingTicketer {
            prk,
            tags,
            keys: Mutex::new(Vec::new()),
            rng: SystemRandom::new(),
            issued,
        }
    }

    fn key(&self, period: u64) -> Option<Arc<LessSafeKey>> {
        let mut keys = self.keys.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, k)) = keys.iter().find(|(p, _)| *p == period) {
            return Some(k.clone());
        }
        let info = period.to_be_bytes();
        let info = [b"period".as_slice(), info.as_slice()];
        let okm = self.prk.expand(&info, &AES_256_GCM).ok()?;
        let key = Arc::new(LessSafeKey::new(UnboundKey::from(okm)));
        keys.push((period, key.clone()));
        if keys.len() > 4 {
            keys.remove(0);
        }
        Some(key)
    }

    /// Seals `plain` under the key of the period of `now`.
    #[cfg(test)]
    fn seal(&self, plain: &[u8], now: SystemTime) -> Option<Vec<u8>> {
        self.seal_in_chain(plain, now, unix_ms(now))
    }

    /// Seals `plain` at `now` as a ticket of a chain that began at `start_ms` (unix ms; `now`
    /// for a chain of its own): it carries that start as its issue time, and resumes until one
    /// lifetime past it (`crate::tls::lineage`).
    fn seal_in_chain(&self, plain: &[u8], now: SystemTime, start_ms: u64) -> Option<Vec<u8>> {
        let period = self.tags.period_at(now);
        let key = self.key(period)?;
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut ticket = Vec::with_capacity(HEADER + plain.len() + TAG);
        ticket.extend_from_slice(&nonce);
        ticket.extend_from_slice(&(period as u32).to_be_bytes());
        let mut body = Vec::with_capacity(8 + plain.len() + TAG);
        body.extend_from_slice(&start_ms.to_be_bytes());
        body.extend_from_slice(plain);
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(&ticket[..HEADER]),
            &mut body,
        )
        .ok()?;
        ticket.extend_from_slice(&body);
        // The first whole second past the lifetime: it resumes until then.
        let end_ms = start_ms + self.tags.lifetime.as_millis() as u64;
        let expires = u32::try_from(end_ms / 1000 + 1).ok()?;
        let tail = self.tags.tail(&ticket, period, expires);
        ticket.extend_from_slice(&tail);
        Some(ticket)
    }

    /// Opens a ticket if its period is still accepted at `now` and it authenticates.
    #[cfg(test)]
    fn open(&self, ticket: &[u8], now: SystemTime) -> Option<Vec<u8>> {
        self.open_in_chain(ticket, now).map(|(_, state)| state)
    }

    /// [`RotatingTicketer::open`], with when the ticket's chain began (unix ms).
    fn open_in_chain(&self, ticket: &[u8], now: SystemTime) -> Option<(u64, Vec<u8>)> {
        if ticket.len() < HEADER + TAG + TAIL_LEN {
            return None;
        }
        let (ticket, tail) = ticket.split_at(ticket.len() - TAIL_LEN);
        let nonce: [u8; NONCE_LEN] = ticket[..NONCE_LEN].try_into().ok()?;
        let low = u32::from_be_bytes(ticket[NONCE_LEN..HEADER].try_into().ok()?);
        // The period travels as its low 32 bits; the full value is the one nearest to now.
        let current = self.tags.period_at(now);
        let period = (current & !0xffff_ffff) | u64::from(low);
        if !self.tags.accepted(period, current) {
            return None;
        }
        // The tail as the NIC checks it: a ticket whose tail was changed resumes nowhere.
        let t = Tail::parse(tail.try_into().ok()?);
        if t.period != low || tail != self.tags.tail(ticket, period, t.expires) {
            return None;
        }
        let key = self.key(period)?;
        let mut body = ticket[HEADER..].to_vec();
        let plain = key
            .open_in_place(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(&ticket[..HEADER]),
                &mut body,
            )
            .ok()?;
        let (issued, state) = plain.split_at_checked(8)?;
        let issued = u64::from_be_bytes(issued.try_into().ok()?);
        let now = unix_ms(now);
        // Issued in the future only within a minute of clock skew between nodes.
        let lifetime = self.tags.lifetime.as_millis() as u64;
        if issued > now + 60_000
            || now.saturating_sub(issued) > lifetime
            || now / 1000 >= u64::from(t.expires)
        {
            return None;
        }
        Some((issued, state.to_vec()))
    }
}

fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_secs()
}

fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).unwrap_or_default().as_millis() as u64
}

impl ProducesTickets for RotatingTicketer {
    fn enabled(&self) -> bool {
        true
    }

    fn lifetime(&self) -> u32 {
        self.tags.lifetime.as_secs().min(u64::from(u32::MAX)) as u32
    }

    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        // On a resumed connection, a ticket of the resumed session's chain.
        let now = SystemTime::now();
        let parent = lineage::parent();
        let start = parent.map_or(unix_ms(now), |p| p.start_ms);
        let ticket = self.seal_in_chain(plain, now, start)?;
        self.issued
            .publish_chained(&ticket, Offer::Ticket, parent.map(|p| p.key));
        Some(ticket)
    }

    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        let (start_ms, state) = self.open_in_chain(cipher, SystemTime::now())?;
        if let Some(key) = issued_key(Offer::Ticket, cipher) {
            lineage::resumed(lineage::Parent { key, start_ms });
        }
        Some(state)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticketer(secret: &[u8]) -> RotatingTicketer {
        RotatingTicketer::new(
            Secret(secret.to_vec()),
            Duration::from_secs(3600),
            Duration::from_secs(7200),
            Arc::new(IssuedKeys::none(Duration::from_secs(7200))),
        )
    }

    fn at(secs: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(secs)
    }

    #[test]
    fn nodes_sharing_a_secret_open_each_others_tickets() {
        let a = ticketer(&[7; 48]);
        let b = ticketer(&[7; 48]);
        let other = ticketer(&[8; 48]);
        let t = a.seal(b"state", at(1_000_000)).unwrap();
        assert_eq!(b.open(&t, at(1_000_010)).as_deref(), Some(&b"state"[..]));
        assert_eq!(other.open(&t, at(1_000_010)), None);
        // Unique prefixes: the datapath's keys never collide.
        let t2 = a.seal(b"state", at(1_000_000)).unwrap();
        assert_ne!(t[..16], t2[..16]);
    }

    #[test]
    fn keys_rotate_and_old_tickets_expire() {
        let a = ticketer(&[1; 32]);
        let t0 = a.seal(b"s", at(3600 * 100)).unwrap();
        let t1 = a.seal(b"s", at(3600 * 101)).unwrap();
        // Different periods, different keys: the same nonce would not open under the other.
        assert_ne!(t0[12..16], t1[12..16]);
        // Two hours of lifetime: accepted until then, to the second.
        assert!(a.open(&t0, at(3600 * 102)).is_some());
        assert!(a.open(&t0, at(3600 * 102 + 1)).is_none());
        assert!(a.open(&t1, at(3600 * 102 + 5)).is_some());
        // Issued "later" than now beyond the skew allowance: refused.
        assert!(a.open(&t1, at(3600 * 100)).is_none());
    }

    #[test]
    fn tampered_or_short_tickets_are_refused() {
        let a = ticketer(&[2; 32]);
        let mut t = a.seal(b"state", at(5000)).unwrap();
        assert!(a.open(&t[..10], at(5000)).is_none());
        t[3] ^= 1;
        assert!(a.open(&t, at(5000)).is_none());
    }

    #[test]
    fn a_tickets_tail_carries_a_tag_every_node_sharing_the_secret_checks() {
        let a = ticketer(&[3; 40]);
        let b = ticketer(&[3; 40]);
        let other = ticketer(&[4; 40]);
        let now = at(3600 * 200 + 17);
        let t = a.seal(b"state", now).unwrap();
        let tail = Tail::parse(t.last_chunk::<TAIL_LEN>().unwrap());
        assert_eq!(u64::from(tail.period), 200);
        // The first second past the two hours of lifetime.
        assert_eq!(u64::from(tail.expires), 3600 * 202 + 17 + 1);
        let key = ticket_key(&t).unwrap();
        let check = |tags: &TagKeys| {
            let (k0, k1) = tags.key(u64::from(tail.period));
            tag(k0, k1, &key, tail.period, tail.expires) == tail.tag
        };
        assert!(check(&b.tags), "a node sharing the secret vouches for it");
        assert!(!check(&other.tags), "another secret's keys do not");
        // The NIC's key is the parser's: the digest of all before the tail.
        let hello = gateway_common::testing::HelloBuilder {
            psk_identity: Some(t.clone()),
            ..gateway_common::testing::HelloBuilder::tls13()
        }
        .build();
        let st = gateway_common::tls::parse_hello(&hello);
        assert_eq!(st.offer_key(), Some(key));
        assert_eq!(st.ticket_tail(), t.last_chunk::<TAIL_LEN>());
        // Any byte of the tail changed: the ticket resumes nowhere.
        for i in 0..TAIL_LEN {
            let mut bad = t.clone();
            let n = bad.len();
            bad[n - TAIL_LEN + i] ^= 1;
            assert!(b.open(&bad, now).is_none(), "tail byte {i}");
        }
        assert!(b.open(&t, now).is_some());
    }

    #[test]
    fn the_periods_written_are_those_whose_tickets_may_live() {
        let a = ticketer(&[5; 32]);
        let periods: Vec<u64> = a.tags.periods(at(3600 * 300 + 5)).collect();
        // One ahead, the current one, and two hours of lifetime back.
        assert_eq!(periods, [301, 300, 299, 298]);
        let short = RotatingTicketer::new(
            Secret(vec![5; 32]),
            Duration::from_secs(60),
            Duration::from_secs(86400),
            Arc::new(IssuedKeys::none(Duration::from_secs(86400))),
        );
        let periods: Vec<u64> = short.tags.periods(at(60 * 100_000)).collect();
        assert_eq!(
            periods.len(),
            MAX_TAG_PERIODS as usize,
            "bounded by the map's share"
        );
        assert_eq!(periods[0], 100_001);
        assert_ne!(a.tags.key(300), a.tags.key(301));
    }

    #[test]
    fn secret_file_sizes_are_checked() {
        let p = std::env::temp_dir().join(format!("gw-ticket-{}", std::process::id()));
        std::fs::write(&p, [0u8; 8]).unwrap();
        let e = Secret::from_file(&p).err().unwrap().to_string();
        assert!(e.contains("8 bytes, need 32"), "{e}");
        std::fs::write(&p, [0u8; 80]).unwrap();
        assert!(Secret::from_file(&p).is_ok());
        let _ = std::fs::remove_file(p);
    }
}
