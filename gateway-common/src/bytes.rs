//! A small byte-cursor abstraction over packet memory.
//!
//! The parsers in this crate read packets only through [`PacketBytes`], so the very same parsing
//! code runs over an XDP or TC context in the kernel (where every read must be bounds-checked
//! against `data_end` in a way the verifier accepts) and over a plain slice in userspace tests and
//! fuzzers.

/// The largest offset at which any parser in this crate reads.
///
/// Implementations refuse reads that start beyond it. In eBPF this constant bound is what lets the
/// verifier prove that a variable offset added to the packet pointer stays in range.
pub const MAX_READ_OFFSET: usize = 2048;

/// Bounded read access to the bytes of one packet.
pub trait PacketBytes {
    /// Copies the `N` bytes that start at `offset` into `out`.
    ///
    /// Returns `false`, leaving `out` untouched, when `offset > MAX_READ_OFFSET` or when the packet
    /// ends before `offset + N`.
    ///
    /// This trait deliberately has no `Option`-returning reads: when a read returned
    /// `Option<[u8; N]>` in registers, LLVM filled the undefined `None` payload with whatever
    /// register was at hand, the packet pointer included, and the verifier refused the pointer
    /// arithmetic. Callers read into zeroed locals instead, so every path carries defined bytes.
    fn read<const N: usize>(&self, offset: usize, out: &mut [u8; N]) -> bool;

    /// The eight bytes of the aligned word that holds offset `at` (the word at `at & !7`), as a
    /// little-endian `u64`. Bytes past the packet's end are unspecified (this default reads them
    /// as zero; the datapath's scratch buffers leave what an earlier packet left there, and read
    /// the word in one load): a caller takes no byte at or past the end for one of the packet's.
    /// Word-wide scans ([`find_byte`]) look at a packet through it.
    #[inline(always)]
    fn word(&self, at: usize) -> u64 {
        let base = at & !7;
        let mut w = [0u8; 8];
        if !self.read(base, &mut w) {
            for (i, byte) in w.iter_mut().enumerate() {
                let mut one = [0u8; 1];
                if self.read(base + i, &mut one) {
                    *byte = one[0];
                }
            }
        }
        u64::from_le_bytes(w)
    }
}

/// Aligned words one [`find_byte`] call looks at, at most (64 bytes).
pub const SCAN_WORDS: usize = 8;

/// Every byte of a word set to `b`.
#[inline(always)]
pub const fn splat(b: u8) -> u64 {
    0x0101_0101_0101_0101 * b as u64
}

/// Bit 7 of each byte of the result is set exactly where that byte of `x` is zero (no carry
/// crosses a byte, so unlike the shorter `(x - 0x01..) & !x` form it has no false positives above
/// a zero byte, which matters once bytes below the start are masked off).
#[inline(always)]
pub const fn zero_bytes(x: u64) -> u64 {
    let low7 = splat(0x7f);
    !(((x & low7).wrapping_add(low7)) | x | low7)
}

/// The index (0-7, lowest address first) of the lowest byte flagged in a non-zero
/// [`zero_bytes`] mask: one multiply, no table and no loop.
#[inline(always)]
pub const fn first_flagged(mask: u64) -> usize {
    let lowest = (mask & mask.wrapping_neg()) >> 7;
    (lowest.wrapping_mul(0x0001_0203_0405_0607) >> 56) as usize
}

/// The offset of the first byte equal to `needle` in `[from, end)`, looking at the aligned
/// words from the one that holds `from`, at most [`SCAN_WORDS`] of them, eight bytes at a time:
/// `Ok(offset)`, or `Err(next)`, where a further search would start (`next >= end`: not there).
/// Bytes from `end` on are not masked off word by word: the first match at or past `from` is
/// found, and if it is not before `end`, none is (so a byte past the packet's end, whatever
/// [`PacketBytes::word`] read there, is never taken for a match).
#[inline(always)]
pub fn find_byte<B: PacketBytes>(
    b: &B,
    from: usize,
    end: usize,
    needle: u8,
) -> Result<usize, usize> {
    let mut base = from & !7;
    // Bytes before `from` are not looked at.
    let mut from_here = !0u64 << (8 * (from - base));
    for _ in 0..SCAN_WORDS {
        if base >= end {
            return Err(end);
        }
        let mask = zero_bytes(b.word(base) ^ splat(needle)) & from_here;
        if mask != 0 {
            let at = base + first_flagged(mask);
            return if at < end { Ok(at) } else { Err(end) };
        }
        base += 8;
        from_here = !0;
    }
    Err(base)
}

/// The eight bytes from offset `at`, lowest address first, as a little-endian `u64`, made of
/// the two aligned words that hold them ([`PacketBytes::word`]): bytes past the packet's end are
/// unspecified, as there.
#[inline(always)]
pub fn bytes_at<B: PacketBytes>(b: &B, at: usize) -> u64 {
    let shift = 8 * (at & 7) as u32;
    let low = b.word(at) >> shift;
    // The next word's bytes above the first one's: shifted by 64 - shift in two steps, so
    // that for an aligned `at` all of them are shifted out (one shift by 64 would be none).
    let high = (b.word(at + 8) << (63 - shift)) << 1;
    low | high
}

/// [`PacketBytes`] over a byte slice, for userspace tests and fuzzers.
#[derive(Clone, Copy, Debug)]
pub struct SliceBytes<'a>(pub &'a [u8]);

impl PacketBytes for SliceBytes<'_> {
    #[inline]
    fn read<const N: usize>(&self, offset: usize, out: &mut [u8; N]) -> bool {
        if offset > MAX_READ_OFFSET {
            return false;
        }
        match offset
            .checked_add(N)
            .and_then(|end| self.0.get(offset..end))
        {
            Some(src) => {
                out.copy_from_slice(src);
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slice_reads_are_bounded() {
        let data = [1u8, 2, 3, 4];
        let b = SliceBytes(&data);
        let mut two = [0u8; 2];
        assert!(b.read(2, &mut two));
        assert_eq!(two, [3, 4]);
        let mut untouched = [9u8; 2];
        assert!(!b.read(3, &mut untouched));
        assert_eq!(untouched, [9, 9]);
        let mut one = [0u8; 1];
        assert!(!b.read(4, &mut one));
        assert!(!b.read(usize::MAX, &mut one));
    }

    #[test]
    fn reads_past_the_cap_are_refused_even_when_present() {
        let data = [0u8; MAX_READ_OFFSET + 8];
        let b = SliceBytes(&data);
        let mut two = [0u8; 2];
        assert!(b.read(MAX_READ_OFFSET, &mut two));
        assert!(!b.read(MAX_READ_OFFSET + 1, &mut two));
    }

    /// The first `needle` in `[from, end)` by a plain byte search, as `find_byte` must find it
    /// (given enough calls).
    fn by_bytes(data: &[u8], from: usize, end: usize, needle: u8) -> Option<usize> {
        (from..end.min(data.len())).find(|&i| data[i] == needle)
    }

    /// Follows `find_byte` from call to call as the parsers do.
    fn by_words(data: &[u8], from: usize, end: usize, needle: u8) -> Option<usize> {
        let mut at = from;
        loop {
            match find_byte(&SliceBytes(data), at, end, needle) {
                Ok(found) => return Some(found),
                Err(next) if next < end => {
                    assert!(next >= at + 8 * SCAN_WORDS - 7, "{at} -> {next}");
                    at = next;
                }
                Err(_) => return None,
            }
        }
    }

    #[test]
    fn word_search_finds_what_a_byte_search_finds() {
        // Every start, end and needle position over a buffer whose other bytes sit next to the
        // needle in value, with zeros and 0x80 bytes (the borrow cases of word-wide tests).
        let mut data = [0u8; 96];
        for (i, b) in data.iter_mut().enumerate() {
            *b = [b'\n' + 1, b'\n' - 1, 0, 0x80, 0x8a, b';'][i % 6];
        }
        for needle_at in [
            None,
            Some(0),
            Some(7),
            Some(8),
            Some(13),
            Some(63),
            Some(64),
            Some(95),
        ] {
            let mut d = data;
            if let Some(at) = needle_at {
                d[at] = b'\n';
            }
            for from in 0..d.len() {
                for end in from..=d.len() + 3 {
                    assert_eq!(
                        by_words(&d, from, end, b'\n'),
                        by_bytes(&d, from, end, b'\n'),
                        "needle at {needle_at:?}, from {from}, end {end}"
                    );
                }
            }
        }
        // A needle before `from` in the same word is not found, nor one at `end`.
        let d = *b"a;b;c;d;e;f;g;h;";
        assert_eq!(find_byte(&SliceBytes(&d), 2, 16, b';'), Ok(3));
        assert_eq!(find_byte(&SliceBytes(&d), 2, 3, b';'), Err(3));
    }

    #[test]
    fn eight_bytes_from_any_offset() {
        let data: [u8; 24] = core::array::from_fn(|i| 0xa0 + i as u8);
        let b = SliceBytes(&data);
        for at in 0..24 {
            let mut want = [0u8; 8];
            for (i, w) in want.iter_mut().enumerate() {
                *w = data.get(at + i).copied().unwrap_or(0);
            }
            assert_eq!(bytes_at(&b, at), u64::from_le_bytes(want), "at {at}");
        }
    }

    #[test]
    fn words_past_the_end_read_as_zero() {
        let data = [0xffu8; 12];
        let b = SliceBytes(&data);
        assert_eq!(b.word(0), u64::MAX);
        assert_eq!(b.word(9), 0x0000_0000_ffff_ffff);
        assert_eq!(b.word(16), 0);
    }
}
