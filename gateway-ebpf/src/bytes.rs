//! [`PacketBytes`] over the XDP and TC contexts.
//!
//! XDP reads packet memory directly. `data` and `data_end` are read once with `read_volatile` so
//! the compiler cannot re-derive them, every offset is first capped by a constant
//! ([`MAX_READ_OFFSET`]) and then the whole read is checked against `data_end`: the two checks the
//! verifier needs to accept a variable offset into the packet.
//!
//! TC copies bytes out with `bpf_skb_load_bytes`, which also works on non-linear skbs.

use aya_ebpf::programs::{TcContext, XdpContext};
use gateway_common::bytes::{MAX_READ_OFFSET, PacketBytes};

/// Packet bytes of an XDP frame.
pub struct XdpBytes {
    start: usize,
    end: usize,
}

impl XdpBytes {
    /// Captures the frame bounds of `ctx`.
    #[inline(always)]
    pub fn new(ctx: &XdpContext) -> Self {
        // SAFETY: ctx.ctx points at the kernel's xdp_md for the whole program run.
        let (start, end) = unsafe {
            (
                core::ptr::read_volatile(&(*ctx.ctx).data) as usize,
                core::ptr::read_volatile(&(*ctx.ctx).data_end) as usize,
            )
        };
        XdpBytes { start, end }
    }

    /// Length of the frame in bytes.
    #[inline(always)]
    pub fn len(&self) -> u64 {
        (self.end - self.start) as u64
    }

    /// A pointer to `N` writable bytes of the frame at `offset`, if they lie inside it (the
    /// same two checks as a read).
    #[inline(always)]
    pub fn writable_at<const N: usize>(&self, offset: usize) -> Option<*mut u8> {
        if offset > MAX_READ_OFFSET {
            return None;
        }
        let p = self.start + offset;
        if opaque((p + N) as u64) as usize > self.end {
            return None;
        }
        Some(p as *mut u8)
    }
}

impl PacketBytes for XdpBytes {
    #[inline(always)]
    fn read<const N: usize>(&self, offset: usize, out: &mut [u8; N]) -> bool {
        if offset > MAX_READ_OFFSET {
            return false;
        }
        let p = self.start + offset;
        // Through the barrier, `p + N > end` stays that comparison: for N = 1 LLVM turned it into
        // `p >= end`, from which the verifier proves no readable byte.
        if opaque((p + N) as u64) as usize > self.end {
            return false;
        }
        if N <= 8 {
            // SAFETY: [p, p + N) was checked to lie inside the frame.
            *out = unsafe { core::ptr::read_unaligned(p as *const [u8; N]) };
        } else {
            // Copied straight to `out`: through `read_unaligned`'s temporary, a longer copy
            // compiled to a call of `memmove` (the frame's address is an integer to LLVM, so the
            // two may overlap), a byte loop the verifier walked again for every state a read is
            // reached in (the XDP classifier's four such calls were some 139,000 of its
            // processed instructions). A `memcpy` of a constant size the BPF backend writes out
            // as loads and stores.
            // SAFETY: [p, p + N) was checked to lie inside the frame, and `out` is N bytes of
            // the program's own memory, which the frame is not.
            unsafe { core::ptr::copy_nonoverlapping(p as *const u8, out.as_mut_ptr(), N) };
        }
        true
    }
}

/// Packet bytes of a TC skb.
pub struct SkbBytes<'a> {
    ctx: &'a TcContext,
}

impl<'a> SkbBytes<'a> {
    /// Wraps `ctx`.
    #[inline(always)]
    pub fn new(ctx: &'a TcContext) -> Self {
        SkbBytes { ctx }
    }
}

impl PacketBytes for SkbBytes<'_> {
    #[inline(always)]
    fn read<const N: usize>(&self, offset: usize, out: &mut [u8; N]) -> bool {
        if offset > MAX_READ_OFFSET {
            return false;
        }
        match self.ctx.load::<[u8; N]>(offset) {
            Ok(bytes) => {
                *out = bytes;
                true
            }
            Err(_) => false,
        }
    }
}

/// Returns `v` unchanged, hiding it from LLVM's optimizer but not from the verifier, which sees a
/// register move that keeps its type and bounds. Used where LLVM would otherwise rewrite a check
/// into a form the verifier cannot use: checks written after it stay on this register. (An empty
/// asm block would do for LLVM, but it left two line_info records on one instruction, which the
/// kernel refuses.)
#[inline(always)]
pub fn opaque(mut v: u64) -> u64 {
    // SAFETY: a register-to-itself move.
    unsafe {
        core::arch::asm!("{0} = {0}", inout(reg) v, options(nomem, nostack, preserves_flags))
    };
    v
}

/// Sets `*dst` to all-zero bytes a word at a time: 8-byte stores for an 8-aligned `T`, 4-byte
/// stores for a 4-aligned one. They are volatile so that LLVM cannot turn them back into a call
/// to `memset`, which it compiles to a byte-at-a-time loop (about six instructions a byte: 650
/// for a SIP parser state).
///
/// # Safety
///
/// `dst` is valid for writes and aligned, and all-zero bytes are a valid `T`.
#[inline(always)]
pub unsafe fn zero<T>(dst: *mut T) {
    if const { wide::<T>() } {
        let words = dst.cast::<u64>();
        for i in 0..size_of::<T>() / 8 {
            // SAFETY: within *dst, aligned (the caller's promise).
            unsafe { words.add(i).write_volatile(0) };
        }
    } else {
        let words = dst.cast::<u32>();
        for i in 0..size_of::<T>() / 4 {
            // SAFETY: as above.
            unsafe { words.add(i).write_volatile(0) };
        }
    }
}

/// Copies `*src` to `*dst` a word at a time, as [`zero`] stores: a struct assignment compiles to
/// a call of a byte-at-a-time `memmove` (eight instructions a byte: 770 for a hello's parser
/// state).
///
/// # Safety
///
/// `src` is valid for reads, `dst` for writes, both aligned, and they do not overlap.
#[inline(always)]
pub unsafe fn copy<T: Copy>(dst: *mut T, src: *const T) {
    if const { wide::<T>() } {
        let (to, from) = (dst.cast::<u64>(), src.cast::<u64>());
        for i in 0..size_of::<T>() / 8 {
            // SAFETY: within *src and *dst, aligned (the caller's promise).
            unsafe { to.add(i).write_volatile(from.add(i).read_volatile()) };
        }
    } else {
        let (to, from) = (dst.cast::<u32>(), src.cast::<u32>());
        for i in 0..size_of::<T>() / 4 {
            // SAFETY: as above.
            unsafe { to.add(i).write_volatile(from.add(i).read_volatile()) };
        }
    }
}

/// Whether `*a` and `*b` have the same bytes, compared a word at a time (a derived `==` on byte
/// arrays compiles to a call of `memcmp`). The reads are plain, not volatile as [`copy`]'s: so
/// LLVM compares each pair as it loads it, rather than loading all of them first in order and
/// spilling them to the stack.
///
/// # Safety
///
/// `a` and `b` are valid for reads and aligned, and `T` has no padding bytes.
#[inline(always)]
pub unsafe fn equal<T: Copy>(a: *const T, b: *const T) -> bool {
    let mut differ = 0u64;
    if const { wide::<T>() } {
        let (a, b) = (a.cast::<u64>(), b.cast::<u64>());
        for i in 0..size_of::<T>() / 8 {
            // SAFETY: within *a and *b, aligned (the caller's promise).
            differ |= unsafe { a.add(i).read() ^ b.add(i).read() };
        }
    } else {
        let (a, b) = (a.cast::<u32>(), b.cast::<u32>());
        for i in 0..size_of::<T>() / 4 {
            // SAFETY: as above.
            differ |= u64::from(unsafe { a.add(i).read() ^ b.add(i).read() });
        }
    }
    differ == 0
}

/// Whether `T` goes in 8-byte words (else in 4-byte words; a `T` that fits neither is refused
/// at compile time).
const fn wide<T>() -> bool {
    let (size, align) = (size_of::<T>(), align_of::<T>());
    assert!(
        size.is_multiple_of(4) && align >= 4,
        "a type of whole, aligned words"
    );
    size.is_multiple_of(8) && align >= 8
}

/// [`PacketBytes`] over a copy of payload bytes in map memory: `len` bytes at the start of a
/// `SIZE`-byte buffer (`SIZE = 2 * CAP`, `len <= CAP`). Every start index is masked into the first
/// half, which changes nothing for in-range reads and shows the verifier that the access, which
/// may run into the second half, stays in the buffer. The buffer must start 8-byte aligned (it is
/// the first field of an 8-aligned scratch struct): [`PacketBytes::word`] reads aligned words.
pub struct ScratchBytes<'a, const CAP: usize, const SIZE: usize> {
    /// The buffer.
    pub buf: &'a [u8; SIZE],
    /// Bytes copied into it.
    pub len: u32,
}

impl<const CAP: usize, const SIZE: usize> PacketBytes for ScratchBytes<'_, CAP, SIZE> {
    #[inline(always)]
    fn read<const N: usize>(&self, offset: usize, out: &mut [u8; N]) -> bool {
        const { assert!(N <= CAP && SIZE == 2 * CAP && CAP.is_power_of_two()) };
        if offset > MAX_READ_OFFSET || offset + N > self.len as usize {
            return false;
        }
        // The mask is applied behind the barrier, where LLVM cannot prove it redundant and drop
        // it (it knows `offset < len <= CAP`; the verifier, which saw that test on another copy
        // of the register, does not), and the address is formed here: otherwise LLVM hoisted
        // `buf + offset` out of the caller's scan loop, and the verifier saw an access through a
        // pointer with an unbounded offset.
        let base = opaque(offset as u64) as usize & (CAP - 1);
        // SAFETY: base < CAP and N <= CAP, so [base, base + N) lies in the SIZE = 2 * CAP bytes.
        *out = unsafe { core::ptr::read_unaligned(self.buf.as_ptr().add(base).cast::<[u8; N]>()) };
        true
    }

    #[inline(always)]
    fn word(&self, at: usize) -> u64 {
        // No length check: bytes past `len` are whatever an earlier packet left (the trait
        // allows it; `find_byte` never takes them for the packet's). Past the buffer's first
        // half, where the mask would wrap, nothing.
        if at >= CAP {
            return 0;
        }
        // Masked behind the barrier, as in `read`; the mask also keeps the word aligned.
        let masked = opaque(at as u64) as usize & ((CAP - 1) & !7);
        // SAFETY: masked < CAP and is a multiple of 8 in a buffer that starts 8-byte aligned, so
        // the word is aligned and lies in the SIZE = 2 * CAP bytes.
        u64::from_le(unsafe { *self.buf.as_ptr().add(masked).cast::<u64>() })
    }
}
