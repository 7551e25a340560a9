//! The benchmark's own map (`BENCH_FRESH`, not pinned, read by no program the daemon attaches):
//! what makes each repeated run of a test packet a packet of a new connection or transaction.

/// The map's name in the object.
pub const BENCH_FRESH_MAP: &str = "BENCH_FRESH";
/// The fresh-packet program's jump table (slot 0: the XDP classifier; not pinned).
pub const BENCH_JUMP_MAP: &str = "BENCH_JUMP";

/// Leave the packet as it is.
pub const FRESH_NONE: u8 = 0;
/// Write the run's number as a big-endian 16-bit value (a TCP or UDP source port).
pub const FRESH_PORT: u8 = 1;
/// Write the run's number as four letters `a`..`p`, one per nibble (a SIP branch or Call-ID:
/// token characters, so the message parses as before).
pub const FRESH_LETTERS: u8 = 2;
/// Bytes of the packet [`FRESH_LETTERS`] writes (and [`FRESH_PORT`] checks are present).
pub const FRESH_BYTES: usize = 4;
/// Highest offset the program writes at: offsets are capped by a constant for the verifier.
pub const MAX_FRESH_OFFSET: u16 = 2047;

/// How the benchmark's fresh-packet program (`programs::XDP_BENCH_FRESH`) changes its packet
/// before the classifier, which it jumps to, classifies it: at `offset`, per `mode` (`FRESH_*`), the number of the run. Test runs
/// repeated on one frame keep the program's writes, so run `n` is a new connection (another
/// source port) or a new transaction (another branch), classified as a real one would be.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BenchFresh {
    /// Offset in the frame of the bytes written (at most [`MAX_FRESH_OFFSET`]).
    pub offset: u16,
    /// A `FRESH_*` mode.
    pub mode: u8,
    /// Padding.
    pub pad: u8,
    /// Runs so far (the number written is this, after one is added).
    pub runs: u32,
}

impl BenchFresh {
    /// The four letters [`FRESH_LETTERS`] writes for run `n`: its low nibble last.
    pub const fn letters(n: u32) -> [u8; FRESH_BYTES] {
        let mut out = [0u8; FRESH_BYTES];
        let mut i = 0;
        while i < FRESH_BYTES {
            out[i] = b'a' + ((n >> (4 * (FRESH_BYTES - 1 - i))) & 0xf) as u8;
            i += 1;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn letters_are_tokens_and_differ_for_every_run_of_a_batch() {
        assert_eq!(&BenchFresh::letters(0), b"aaaa");
        assert_eq!(&BenchFresh::letters(0x1f), b"aabp");
        let all: alloc::collections::BTreeSet<_> = (0..0x10000).map(BenchFresh::letters).collect();
        assert_eq!(all.len(), 0x10000);
        assert!(all.iter().flatten().all(|c| (b'a'..=b'p').contains(c)));
    }
}
