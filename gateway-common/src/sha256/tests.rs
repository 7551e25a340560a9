use alloc::vec::Vec;

use sha2::{Digest, Sha256};

use super::*;

/// SHA-256 of `msg` by blocks and [`tail`], from the initial value.
fn hash(msg: &[u8]) -> [u8; DIGEST] {
    let mut state = IV;
    let whole = msg.len() / BLOCK;
    for b in 0..whole {
        compress(&mut state, msg[b * BLOCK..][..BLOCK].try_into().unwrap());
    }
    let mut rest = [0xeeu8; BLOCK];
    let r = msg.len() - whole * BLOCK;
    rest[..r].copy_from_slice(&msg[whole * BLOCK..]);
    let mut end = [0u8; 2 * BLOCK];
    let n = tail(&rest, r as u32, msg.len() as u64, &mut end);
    for b in 0..n {
        compress(&mut state, end[b * BLOCK..][..BLOCK].try_into().unwrap());
    }
    digest(&state)
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn the_fips_example_hashes_right() {
    let want = [
        0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea, 0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22,
        0x23, 0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c, 0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00,
        0x15, 0xad,
    ];
    assert_eq!(hash(b"abc"), want);
}

#[test]
fn every_length_around_the_block_edges_hashes_as_the_reference() {
    for n in (0..200).chain([447, 448, 1000, 1024]) {
        let m = bytes(n, 7);
        let want: [u8; DIGEST] = Sha256::digest(&m).into();
        assert_eq!(hash(&m), want, "length {n}");
    }
}

/// HMAC-SHA256 by its definition, over the reference hash.
fn reference_mac(key: &[u8], msg: &[u8]) -> [u8; DIGEST] {
    let mut k = [0u8; BLOCK];
    k[..key.len()].copy_from_slice(key);
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    inner.update(msg);
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

#[test]
fn the_mac_from_pad_states_is_hmac_sha256() {
    for key_len in [16usize, 32] {
        let key = bytes(key_len, 99);
        let (inner, outer) = pads(&key).unwrap();
        for n in (0..160).chain([200, 255, 511, 992]) {
            let m = bytes(n, 3);
            assert_eq!(
                mac(&inner, &outer, &m),
                reference_mac(&key, &m),
                "key {key_len}, message {n}"
            );
        }
    }
    // RFC 4231, test case 2: key "Jefe".
    let (inner, outer) = pads(b"Jefe").unwrap();
    let got = mac(&inner, &outer, b"what do ya want for nothing?");
    assert_eq!(got[..4], [0x5b, 0xdc, 0xc1, 0x46]);
    assert_eq!(got[28..], [0x64, 0xec, 0x38, 0x43]);
    assert!(pads(&[0u8; 65]).is_none());
}
