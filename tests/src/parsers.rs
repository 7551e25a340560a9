//! The shared parsers (`gateway_common::sip`, `gateway_common::tls`) timed in userspace, over a
//! buffer read as the datapath reads its per-CPU scratch copy: aligned word loads and masked
//! offsets. What a parse costs apart from eBPF (no calls under `bpf_loop`, no map memory): the
//! part of a row's time that is the algorithm's own, whatever runs it.

use std::time::Instant;

use gateway_common::{
    bytes::{MAX_READ_OFFSET, PacketBytes},
    sip::{MAX_STEPS as SIP_MAX_STEPS, SipState},
    tls::{HelloState, MAX_STEPS as HELLO_MAX_STEPS, Segment, WINDOW},
};

/// Bytes a scratch copy holds (the datapath's hello window; a SIP copy is half of it).
const CAP: usize = WINDOW as usize;

/// A copy of a message in a buffer twice its capacity, 8-byte aligned, as the datapath's.
#[repr(C, align(8))]
struct Buffer([u8; 2 * CAP]);

/// [`PacketBytes`] over a [`Buffer`], with the datapath's reads: an offset masked into the first
/// half, a word read in one aligned load (`gateway-ebpf`'s `ScratchBytes`).
struct ScratchReader<'a> {
    buf: &'a Buffer,
    len: u32,
}

impl PacketBytes for ScratchReader<'_> {
    #[inline(always)]
    fn read<const N: usize>(&self, offset: usize, out: &mut [u8; N]) -> bool {
        if offset > MAX_READ_OFFSET || offset + N > self.len as usize {
            return false;
        }
        // As in the datapath, the mask is kept (behind the barrier) though it changes nothing.
        let base = std::hint::black_box(offset) & (CAP - 1);
        out.copy_from_slice(&self.buf.0[base..base + N]);
        true
    }

    #[inline(always)]
    fn word(&self, at: usize) -> u64 {
        if at >= CAP {
            return 0;
        }
        let masked = std::hint::black_box(at) & ((CAP - 1) & !7);
        let mut w = [0u8; 8];
        w.copy_from_slice(&self.buf.0[masked..masked + 8]);
        u64::from_le_bytes(w)
    }
}

/// A parser's time on one message: the fastest of `rounds` rounds of `runs` parses, in ns per
/// parse, and the steps a parse took.
#[derive(Clone, Copy, Debug)]
pub struct ParseTime {
    /// Nanoseconds per parse, the fastest round's.
    pub ns: f64,
    /// Steps of one parse.
    pub steps: usize,
}

/// Runs `parse` (which returns its steps) `runs` times a round, `rounds` rounds.
fn time(rounds: usize, runs: usize, mut parse: impl FnMut() -> usize) -> ParseTime {
    let mut steps = 0;
    let mut best = f64::MAX;
    for _ in 0..rounds {
        let start = Instant::now();
        for _ in 0..runs {
            steps = std::hint::black_box(parse());
        }
        best = best.min(start.elapsed().as_nanos() as f64 / runs as f64);
    }
    ParseTime { ns: best, steps }
}

/// Copies `message` (at most [`CAP`] bytes) into a fresh buffer.
fn buffer(message: &[u8]) -> Box<Buffer> {
    assert!(message.len() <= CAP, "a message of one window");
    let mut b = Box::new(Buffer([0; 2 * CAP]));
    b.0[..message.len()].copy_from_slice(message);
    b
}

/// The SIP parser on `message` (its first `gateway_common::sip::MAX_SCAN` bytes, as the
/// datapath copies), step by step as the datapath runs it; `runs` parses a round.
pub fn time_sip(message: &[u8], rounds: usize, runs: usize) -> ParseTime {
    let len = message.len().min(gateway_common::sip::MAX_SCAN);
    let buf = buffer(&message[..len]);
    time(rounds, runs, || {
        let b = ScratchReader {
            buf: std::hint::black_box(&buf),
            len: len as u32,
        };
        let mut st = SipState::default();
        let mut steps = 0;
        while steps < SIP_MAX_STEPS {
            steps += 1;
            if st.step(&b, len) {
                break;
            }
        }
        std::hint::black_box(st.finish().transaction_key());
        steps
    })
}

/// The hello parser on `hello` (one segment, one window), step by step as the datapath runs it;
/// `runs` parses a round.
pub fn time_hello(hello: &[u8], rounds: usize, runs: usize) -> ParseTime {
    let buf = buffer(hello);
    let seg = Segment {
        offset: 0,
        len: hello.len() as u32,
        stream_offset: 0,
    };
    time(rounds, runs, || {
        let b = ScratchReader {
            buf: std::hint::black_box(&buf),
            len: seg.len,
        };
        let mut st = HelloState::default();
        st.begin_segment(&seg);
        let mut steps = 0;
        while steps < HELLO_MAX_STEPS {
            steps += 1;
            if st.step(&b, &seg) {
                break;
            }
        }
        std::hint::black_box(st.end_segment(&seg));
        steps
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_common::{bytes::SliceBytes, sip::parse_sip, testing::HelloBuilder, tls};

    /// The timed SIP parse learns what `parse_sip` does over a plain slice: the reader is the
    /// datapath's, the result the same.
    #[test]
    fn the_scratch_reader_parses_as_a_slice_does() {
        let message =
            b"INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 10.0.0.2;branch=z9hG4bK7\r\n\
Call-ID: c@10.0.0.2\r\nCSeq: 3 INVITE\r\n\r\n";
        let buf = buffer(message);
        let b = ScratchReader {
            buf: &buf,
            len: message.len() as u32,
        };
        let mut st = SipState::default();
        while !st.step(&b, message.len()) {}
        let by_slice = parse_sip(&SliceBytes(message), message.len());
        assert_eq!(st.finish(), by_slice);
        assert!(by_slice.transaction_key().is_some());

        let hello = HelloBuilder::tls13().build();
        let buf = buffer(&hello);
        let seg = Segment {
            offset: 0,
            len: hello.len() as u32,
            stream_offset: 0,
        };
        let b = ScratchReader {
            buf: &buf,
            len: seg.len,
        };
        let mut st = HelloState::default();
        st.begin_segment(&seg);
        while !st.step(&b, &seg) {}
        let verdict = st.end_segment(&seg);
        assert_eq!(verdict, tls::parse_hello(&hello).verdict());
        assert_ne!(verdict, tls::Verdict::Malformed);
    }
}
