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

/// FNV-1a's offset basis and prime, as `gateway_common::sip` hashes a value.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// The two parts of the least a SIP parse must do natively, timed as [`time_sip`] times the
/// parse, over the same reader: what the parser's own time is to be read against.
#[derive(Clone, Copy, Debug)]
pub struct SipFloor {
    /// The message's line ends up to the blank line, found a word at a time as the parser
    /// finds them (`find_byte`, call after call); `steps` is the lines found.
    pub scan: ParseTime,
    /// FNV-1a over the bytes of the values a transaction key covers (`spans`, read through the
    /// reader a byte at a time), and the five values mixed into one key, 40 bytes more, as
    /// `SipInfo::transaction_key` does; `steps` is the bytes hashed.
    pub key: ParseTime,
}

/// [`SipFloor`] of `message`, whose key values are at `spans` (offset, length).
pub fn time_sip_floor(
    message: &[u8],
    spans: [(usize, usize); 5],
    rounds: usize,
    runs: usize,
) -> SipFloor {
    let len = message.len().min(gateway_common::sip::MAX_SCAN);
    let buf = buffer(&message[..len]);
    let scan = time(rounds, runs, || {
        let b = ScratchReader {
            buf: std::hint::black_box(&buf),
            len: len as u32,
        };
        let (mut pos, mut line_start, mut lines) = (0, 0, 0);
        while pos < len {
            match gateway_common::bytes::find_byte(&b, pos, len, b'\n') {
                Ok(at) => {
                    lines += 1;
                    // The blank line ends the headers.
                    if at - line_start <= 1 {
                        break;
                    }
                    line_start = at + 1;
                    pos = at + 1;
                }
                Err(next) => pos = next,
            }
        }
        lines
    });
    let key = time(rounds, runs, || {
        let b = ScratchReader {
            buf: std::hint::black_box(&buf),
            len: len as u32,
        };
        let mut values = [0u64; 5];
        let mut hashed = 0;
        for (value, &(at, n)) in values.iter_mut().zip(&spans) {
            let mut h = FNV_OFFSET;
            for i in 0..n {
                let mut one = [0u8; 1];
                b.read(at + i, &mut one);
                h = (h ^ u64::from(one[0])).wrapping_mul(FNV_PRIME);
            }
            *value = h;
            hashed += n;
        }
        let mut h = FNV_OFFSET;
        for v in values {
            for i in 0..8 {
                h = (h ^ ((v >> (8 * i)) & 0xff)).wrapping_mul(FNV_PRIME);
            }
        }
        std::hint::black_box(h);
        hashed
    });
    SipFloor { scan, key }
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

    /// The floor's scan finds the lines a parse reads, up to the blank line and no further, and
    /// its key hashes the bytes of the spans it is given.
    #[test]
    fn the_sip_floor_scans_to_the_blank_line_and_hashes_the_spans() {
        let message = b"INVITE sip:b@h SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bKx\r\n\
Call-ID: c@h\r\nCSeq: 3 INVITE\r\n\r\nv=0\r\no=- 1 1 IN IP4 h\r\n";
        let spans = [(0, 6), (10, 4), (30, 3), (40, 5), (50, 1)];
        let floor = time_sip_floor(message, spans, 1, 1);
        // Four lines and the blank one; the body's two lines are not scanned.
        assert_eq!(floor.scan.steps, 5);
        assert_eq!(floor.key.steps, 19);
    }
}
