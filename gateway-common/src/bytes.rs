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
}
