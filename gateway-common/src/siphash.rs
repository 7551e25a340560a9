//! SipHash-2-4 (Aumasson and Bernstein) over whole 64-bit words: the keyed hash of SYN cookies
//! (`crate::syncookie`) and of ticket tags (`crate::tls::tag`), cheap in eBPF (no loads, a fixed
//! number of rounds) and unforgeable without its 128-bit key.

/// SipHash-2-4 of `N` little-endian 64-bit words (the message of `8 * N` bytes they are) under
/// the key `(k0, k1)` (its first and last 8 bytes, little endian): the same value as SipHash-2-4
/// of those bytes.
#[inline(always)]
pub fn siphash24<const N: usize>(k0: u64, k1: u64, words: &[u64; N]) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    for &m in words {
        v[3] ^= m;
        sip_round(&mut v);
        sip_round(&mut v);
        v[0] ^= m;
    }
    // The last block: the message length in its top byte, no bytes left over.
    let b = ((8 * N) as u64 & 0xff) << 56;
    v[3] ^= b;
    sip_round(&mut v);
    sip_round(&mut v);
    v[0] ^= b;
    v[2] ^= 0xff;
    sip_round(&mut v);
    sip_round(&mut v);
    sip_round(&mut v);
    sip_round(&mut v);
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// One SipHash round.
#[inline(always)]
fn sip_round(v: &mut [u64; 4]) {
    v[0] = v[0].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(13);
    v[1] ^= v[0];
    v[0] = v[0].rotate_left(32);
    v[2] = v[2].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(16);
    v[3] ^= v[2];
    v[0] = v[0].wrapping_add(v[3]);
    v[3] = v[3].rotate_left(21);
    v[3] ^= v[0];
    v[2] = v[2].wrapping_add(v[1]);
    v[1] = v[1].rotate_left(17);
    v[1] ^= v[2];
    v[2] = v[2].rotate_left(32);
}

#[cfg(test)]
mod tests {
    use super::*;

    const K0: u64 = 0x0706_0504_0302_0100;
    const K1: u64 = 0x0f0e_0d0c_0b0a_0908;

    #[allow(deprecated)]
    fn reference(words: &[u64]) -> u64 {
        use core::hash::Hasher;
        let mut h = core::hash::SipHasher::new_with_keys(K0, K1);
        for w in words {
            h.write(&w.to_le_bytes());
        }
        h.finish()
    }

    #[test]
    fn siphash_is_the_reference_siphash_2_4_of_the_words_bytes() {
        let words = [
            0x0706_0504_0302_0100u64,
            0x0f0e_0d0c_0b0a_0908,
            0xdead_beef_0000_0001,
            u64::MAX,
            0,
            0x8000_0000_0000_0000,
        ];
        assert_eq!(siphash24(K0, K1, &[words[0]]), reference(&words[..1]));
        assert_eq!(
            siphash24(K0, K1, &[words[0], words[1]]),
            reference(&words[..2])
        );
        assert_eq!(siphash24(K0, K1, &words), reference(&words));
    }

    /// The reference implementation's vectors (key 00..0f, message 00..len-1) for the lengths a
    /// whole number of words long: `vectors_sip64[0]`, `[8]`, `[16]`, `[24]`.
    #[test]
    fn siphash_matches_the_papers_vectors() {
        let word = |i: u8| u64::from_le_bytes(core::array::from_fn(|j| i * 8 + j as u8));
        assert_eq!(siphash24::<0>(K0, K1, &[]), 0x726f_db47_dd0e_0e31);
        assert_eq!(siphash24(K0, K1, &[word(0)]), 0x93f5_f579_9a93_2462);
        assert_eq!(
            siphash24(K0, K1, &[word(0), word(1)]),
            0x3f2a_cc7f_57c2_9bdb
        );
        assert_eq!(
            siphash24(K0, K1, &[word(0), word(1), word(2)]),
            0xb8ad_50c6_f649_af94
        );
    }
}
