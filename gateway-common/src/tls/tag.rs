//! Stateless tags on the tickets the gateway issues, checked at every node's NIC.
//!
//! Nodes that share a ticket secret resume each other's sessions, but a node's NIC knows only
//! the keys its own daemon published. So every ticket (a TLS 1.2 ticket or a TLS 1.3 PSK
//! identity) ends with a [`Tail`] in clear: the rotation period of the key it was sealed with,
//! when it expires, and a keyed tag, SipHash-2-4 ([`crate::siphash`]) under the period's tag key of
//! the ticket's key ([`ticket_key`]: the digest of every byte before the tail), the period and
//! the expiry ([`tag`]). Tag keys are derived from the shared secret for each period by every
//! node's daemon and written to the datapath. A NIC that finds an offered ticket's key
//! unpublished checks its tail: a good tag of a period whose key it holds, not expired, earns
//! the offer what a published key would (the key is then published by the NIC, under the same
//! per-key bounds, until the ticket expires). Without the secret no tag can be made; changing a
//! byte of a ticket changes its key, whose tag is then wrong.
//!
//! The digest the tag covers is not collision resistant: whoever holds a good ticket could build
//! another value with the same key. That buys nothing: the same key has the same places and
//! rate, and the server refuses the forged value (its AEAD), which withdraws the key.

use super::{KEY_LEN, digest_byte, digest_finish, digest_start};
use crate::siphash::siphash24;

/// Bytes of a ticket's [`Tail`].
pub const TAIL_LEN: usize = 16;

/// Shortest ticket or PSK identity the datapath verifies: a key's worth of bytes before the tail.
pub const MIN_TICKET: usize = KEY_LEN + TAIL_LEN;

/// The clear tail of a ticket: `period (4, big endian) | expires (4, big endian, unix seconds) |
/// tag (8, little endian)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tail {
    /// The low 32 bits of the rotation period whose keys sealed the ticket.
    pub period: u32,
    /// When the ticket stops resuming, unix seconds.
    pub expires: u32,
    /// [`tag`] of the ticket.
    pub tag: u64,
}

impl Tail {
    /// The tail in its 16 bytes.
    #[inline(always)]
    pub fn parse(b: &[u8; TAIL_LEN]) -> Tail {
        Tail {
            period: u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            expires: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
            tag: u64::from_le_bytes([b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]]),
        }
    }

    /// The tail's 16 bytes.
    pub fn to_bytes(&self) -> [u8; TAIL_LEN] {
        let mut b = [0u8; TAIL_LEN];
        b[..4].copy_from_slice(&self.period.to_be_bytes());
        b[4..8].copy_from_slice(&self.expires.to_be_bytes());
        b[8..].copy_from_slice(&self.tag.to_le_bytes());
        b
    }
}

/// The datapath's key of a ticket or PSK identity: the digest ([`super::offer_digest`]'s) of
/// every byte before its [`Tail`], seeded with its whole length. `None` for a value shorter than
/// [`MIN_TICKET`].
pub fn ticket_key(value: &[u8]) -> Option<[u8; KEY_LEN]> {
    if value.len() < MIN_TICKET {
        return None;
    }
    let mut d = digest_start(value.len() as u32);
    value[..value.len() - TAIL_LEN]
        .iter()
        .for_each(|&b| digest_byte(&mut d, b));
    Some(digest_finish(&d))
}

/// The tag of a ticket whose key is `key`, sealed in `period` and expiring at `expires`, under
/// the period's tag key `(k0, k1)`.
#[inline(always)]
pub fn tag(k0: u64, k1: u64, key: &[u8; KEY_LEN], period: u32, expires: u32) -> u64 {
    let w0 = u64::from_le_bytes([
        key[0], key[1], key[2], key[3], key[4], key[5], key[6], key[7],
    ]);
    let w1 = u64::from_le_bytes([
        key[8], key[9], key[10], key[11], key[12], key[13], key[14], key[15],
    ]);
    let w2 = (u64::from(period) << 32) | u64::from(expires);
    siphash24(k0, k1, &[w0, w1, w2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_reads_back_what_was_written() {
        let t = Tail {
            period: 0x0102_0304,
            expires: 0xa0b0_c0d0,
            tag: 0x1122_3344_5566_7788,
        };
        let b = t.to_bytes();
        assert_eq!(&b[..8], &[1, 2, 3, 4, 0xa0, 0xb0, 0xc0, 0xd0]);
        assert_eq!(Tail::parse(&b), t);
    }

    #[test]
    fn every_input_of_the_tag_changes_it() {
        let key = [7u8; KEY_LEN];
        let t = tag(1, 2, &key, 10, 1000);
        assert_ne!(tag(1, 3, &key, 10, 1000), t);
        assert_ne!(tag(1, 2, &[8; KEY_LEN], 10, 1000), t);
        assert_ne!(tag(1, 2, &key, 11, 1000), t);
        assert_ne!(tag(1, 2, &key, 10, 1001), t);
        assert_eq!(tag(1, 2, &key, 10, 1000), t);
    }

    #[test]
    fn a_ticket_key_covers_every_byte_before_the_tail_and_none_of_it() {
        let mut v = [5u8; 64];
        let k = ticket_key(&v).unwrap();
        v[63] ^= 1;
        assert_eq!(ticket_key(&v), Some(k), "the tail is not part of the key");
        v[47] ^= 1;
        assert_ne!(ticket_key(&v), Some(k));
        assert_ne!(ticket_key(&[5u8; 65]), Some(k), "the length seeds it");
        assert_eq!(ticket_key(&[5u8; MIN_TICKET - 1]), None);
    }
}
