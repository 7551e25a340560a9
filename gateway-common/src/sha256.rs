//! SHA-256 (FIPS 180-4) by blocks, and HMAC-SHA256 (RFC 2104) from precomputed pad states: what
//! the NIC needs to check a server's session ticket against its ticket key
//! (`crate::maps::TicketMacKey`).
//!
//! HMAC(K, m) = H((K ^ opad) || H((K ^ ipad) || m)). Both keyed blocks are hashed once by the
//! daemon ([`pads`]); the NIC starts from those two states and hashes only the ticket and one
//! block of the outer hash. Written for the verifier: the compression has no data-dependent
//! branch, and [`tail`] pads the message's last bytes without one.

/// Bytes of a SHA-256 block.
pub const BLOCK: usize = 64;
/// Bytes of a SHA-256 digest.
pub const DIGEST: usize = 32;

/// The initial hash value (FIPS 180-4, 5.3.3).
pub const IV: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// The round constants (FIPS 180-4, 4.2.2).
const K: [u32; 64] = [
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
];

/// Hashes one block into `state`.
#[inline(always)]
pub fn compress(state: &mut [u32; 8], block: &[u8; BLOCK]) {
    compress_in(state, block, &mut [0u32; 16], &mut [0u32; 8]);
}

/// [`compress`] with its message schedule in `w` and its working variables in `v`, both the
/// caller's memory, read and written through volatile accesses: in eBPF, where the
/// stack of every frame of a call chain shares 512 bytes, the rounds then spill nothing.
#[inline(always)]
pub fn compress_in(state: &mut [u32; 8], block: &[u8; BLOCK], w: &mut [u32; 16], v: &mut [u32; 8]) {
    for (i, word) in w.iter_mut().enumerate() {
        *word = u32::from_be_bytes([
            block[4 * i],
            block[4 * i + 1],
            block[4 * i + 2],
            block[4 * i + 3],
        ]);
    }
    let wp = w.as_mut_ptr();
    // SAFETY: every index is under 16, in `w`.
    let wget = |i: usize| unsafe { wp.add(i & 15).read_volatile() };
    // SAFETY: as above.
    let wset = |i: usize, x: u32| unsafe { wp.add(i & 15).write_volatile(x) };
    let vp = v.as_mut_ptr();
    // SAFETY: every index is under 8, in `v`.
    let get = |i: usize| unsafe { vp.add(i & 7).read_volatile() };
    // SAFETY: as above.
    let set = |i: usize, x: u32| unsafe { vp.add(i & 7).write_volatile(x) };
    for (i, s) in state.iter().enumerate() {
        set(i, *s);
    }
    for (i, k) in K.iter().enumerate() {
        // The message schedule, sixteen words rolling.
        let wi = if i < 16 {
            wget(i)
        } else {
            let (w2, w7, w15, w16) = (
                wget((i - 2) & 15),
                wget((i - 7) & 15),
                wget((i - 15) & 15),
                wget((i - 16) & 15),
            );
            let s0 = w15.rotate_right(7) ^ w15.rotate_right(18) ^ (w15 >> 3);
            let s1 = w2.rotate_right(17) ^ w2.rotate_right(19) ^ (w2 >> 10);
            let x = w16.wrapping_add(s0).wrapping_add(w7).wrapping_add(s1);
            wset(i & 15, x);
            x
        };
        let e = get(4);
        let s1 = e.rotate_right(6) ^ e.rotate_right(11) ^ e.rotate_right(25);
        let ch = (e & get(5)) ^ (!e & get(6));
        let t1 = get(7)
            .wrapping_add(s1)
            .wrapping_add(ch)
            .wrapping_add(*k)
            .wrapping_add(wi);
        let a = get(0);
        let s0 = a.rotate_right(2) ^ a.rotate_right(13) ^ a.rotate_right(22);
        let maj = (a & get(1)) ^ (a & get(2)) ^ (get(1) & get(2));
        let t2 = s0.wrapping_add(maj);
        set(7, get(6));
        set(6, get(5));
        set(5, get(4));
        set(4, get(3).wrapping_add(t1));
        set(3, get(2));
        set(2, get(1));
        set(1, get(0));
        set(0, t1.wrapping_add(t2));
    }
    for (i, s) in state.iter_mut().enumerate() {
        *s = s.wrapping_add(get(i));
    }
}

/// The digest a state stands for, big-endian words.
#[inline(always)]
pub fn digest(state: &[u32; 8]) -> [u8; DIGEST] {
    let mut out = [0u8; DIGEST];
    for (i, s) in state.iter().enumerate() {
        let b = s.to_be_bytes();
        out[4 * i] = b[0];
        out[4 * i + 1] = b[1];
        out[4 * i + 2] = b[2];
        out[4 * i + 3] = b[3];
    }
    out
}

/// The padded end of a message: `rest` holds its last `r` bytes (0 to 63, what follows its whole
/// blocks; bytes past `r` are ignored), and `total` is the length of everything hashed, in
/// bytes. Writes the one or two blocks that end the hash to `out`; returns how many. Without a
/// branch on `r` but the block count's.
#[inline(always)]
pub fn tail(rest: &[u8; BLOCK], r: u32, total: u64, out: &mut [u8; 2 * BLOCK]) -> usize {
    let r = u64::from(r & (BLOCK as u32 - 1));
    for (i, o) in out.iter_mut().enumerate().take(BLOCK) {
        let i = i as u64;
        // All ones below `r`, else zero.
        let keep = (i.wrapping_sub(r) >> 63).wrapping_neg() as u8;
        // All ones at `r`, else zero.
        let x = i ^ r;
        let at = ((((x | x.wrapping_neg()) >> 63) ^ 1).wrapping_neg()) as u8;
        *o = (rest[i as usize] & keep) | (0x80 & at);
    }
    for o in out.iter_mut().skip(BLOCK) {
        *o = 0;
    }
    let bits = (total * 8).to_be_bytes();
    let blocks = if r < 56 { 1 } else { 2 };
    let at = blocks * BLOCK - 8;
    for (i, b) in bits.iter().enumerate() {
        out[(at + i) & (2 * BLOCK - 1)] = *b;
    }
    blocks
}

/// The inner and outer states of HMAC-SHA256 under `key` (at most a block: the ticket keys of
/// nginx, HAProxy and Envoy are 16 or 32 bytes): the keyed blocks hashed once. `None` for a
/// longer key.
pub fn pads(key: &[u8]) -> Option<([u32; 8], [u32; 8])> {
    if key.len() > BLOCK {
        return None;
    }
    let pad = |byte: u8| {
        let mut block = [byte; BLOCK];
        for (b, k) in block.iter_mut().zip(key) {
            *b ^= k;
        }
        let mut state = IV;
        compress(&mut state, &block);
        state
    };
    Some((pad(0x36), pad(0x5c)))
}

/// HMAC-SHA256 of `msg` from the pad states `(inner, outer)` ([`pads`]), block by block as the
/// NIC computes it.
pub fn mac(inner: &[u32; 8], outer: &[u32; 8], msg: &[u8]) -> [u8; DIGEST] {
    let mut state = *inner;
    let whole = msg.len() / BLOCK;
    for b in 0..whole {
        let block: &[u8; BLOCK] = msg[b * BLOCK..][..BLOCK].try_into().expect("a block");
        compress(&mut state, block);
    }
    let mut rest = [0u8; BLOCK];
    let r = msg.len() - whole * BLOCK;
    rest[..r].copy_from_slice(&msg[whole * BLOCK..]);
    let mut end = [0u8; 2 * BLOCK];
    let n = tail(&rest, r as u32, (BLOCK + msg.len()) as u64, &mut end);
    for b in 0..n {
        compress(
            &mut state,
            end[b * BLOCK..][..BLOCK].try_into().expect("a block"),
        );
    }
    outer_hash(outer, &digest(&state))
}

/// The outer hash of HMAC: `outer` (the state after its keyed block) over the inner digest.
#[inline(always)]
pub fn outer_hash(outer: &[u32; 8], inner: &[u8; DIGEST]) -> [u8; DIGEST] {
    let mut block = [0u8; BLOCK];
    block[..DIGEST].copy_from_slice(inner);
    block[DIGEST] = 0x80;
    let bits = (((BLOCK + DIGEST) * 8) as u64).to_be_bytes();
    block[BLOCK - 8..].copy_from_slice(&bits);
    let mut state = *outer;
    compress(&mut state, &block);
    digest(&state)
}

#[cfg(test)]
mod tests;
