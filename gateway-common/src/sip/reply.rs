//! A stateless `503 Service Unavailable` for a refused SIP request, built from the request as RFC
//! 3261 §8.2.6 asks: the status line, every Via header, From, To (with a To tag added when the
//! request had none), Call-ID and CSeq copied in their order, an optional `Retry-After`, and
//! `Content-Length: 0`. Nothing else of the request is answered back (no Contact, no body).
//!
//! [`ReplyState::step`] takes a few bytes of the request a step (in eBPF, one `bpf_loop`
//! callback): a name or a copied value up to eight bytes, a line left out up to its end (found a
//! word at a time), or writes up to eight queued bytes of the reply's own; it writes the reply
//! into an output buffer and sums it for the UDP checksum as it goes. Header names are case-insensitive; compact forms (`v`, `f`, `t`, `i`) and folded lines
//! are followed. The reply is refused ([`ReplyState::failed`]) when the request's headers do not
//! end within the bytes given, a header the reply needs is missing, or the reply would be longer
//! than [`MAX_REPLY`]; the caller also never sends a reply longer than the request (no
//! amplification).
//!
//! The To tag the datapath adds is derived from the Call-ID ([`reply_tag`]), so the ACK the client
//! sends for the 503 is recognised without state ([`reply_tag_hash`]) and absorbed at the NIC.

use super::{FNV_OFFSET, FNV_PRIME, byte, lower};
use crate::bytes::{PacketBytes, find_byte};

/// Longest reply built, in bytes.
pub const MAX_REPLY: usize = super::MAX_SCAN;
/// Size of the output buffer: twice [`MAX_REPLY`], so that a masked index never leaves it.
pub const REPLY_BUF: usize = 2 * MAX_REPLY;
/// Steps a reply takes at most: one per request byte the parser looks at, and one per reply
/// byte written from elsewhere (the status line, line ends, the tag, the last headers).
pub const MAX_REPLY_STEPS: usize = super::MAX_SCAN + MAX_REPLY;

const STATUS: &[u8] = b"SIP/2.0 503 Service Unavailable\r\n";
const TAG_PARAM: &[u8] = b";tag=";
const RETRY_AFTER: &[u8] = b"Retry-After: ";
const CONTENT_LENGTH: &[u8] = b"Content-Length: 0\r\n\r\n";
/// Length of a To tag the datapath makes: `gw` and 16 hex digits.
pub const TAG_LEN: usize = 18;
/// Mixed into a Call-ID's hash to make its tag (`b"503-tag!"`).
const TAG_DOMAIN: u64 = u64::from_be_bytes(*b"503-tag!");

/// Reading the request line (skipped).
const PHASE_REQUEST_LINE: u8 = 0;
/// At the start of a header line.
const PHASE_LINE_START: u8 = 1;
/// In a header's name.
const PHASE_NAME: u8 = 2;
/// In the value of a header that is copied.
const PHASE_VALUE: u8 = 3;
/// In a line that is left out.
const PHASE_SKIP: u8 = 4;
/// The reply is complete.
const PHASE_DONE: u8 = 5;
/// No reply can be made.
const PHASE_FAILED: u8 = 6;

const H_VIA: u8 = 1 << 0;
const H_FROM: u8 = 1 << 1;
const H_TO: u8 = 1 << 2;
const H_CALL_ID: u8 = 1 << 3;
const H_CSEQ: u8 = 1 << 4;
/// Every header a 503 must carry.
const H_ALL: u8 = H_VIA | H_FROM | H_TO | H_CALL_ID | H_CSEQ;

/// A header name packed as [`ReplyState`] packs it: lowercase, one byte a character.
const fn pack(name: &[u8]) -> u64 {
    let mut v = 0u64;
    let mut i = 0;
    while i < name.len() {
        v = (v << 8) | name[i] as u64;
        i += 1;
    }
    v
}

/// Which copied header a packed name is (`H_*`), or 0.
const fn header(name: u64, len: u8) -> u8 {
    if len > 8 {
        return 0;
    }
    match name {
        n if n == pack(b"via") || n == pack(b"v") => H_VIA,
        n if n == pack(b"from") || n == pack(b"f") => H_FROM,
        n if n == pack(b"to") || n == pack(b"t") => H_TO,
        n if n == pack(b"call-id") || n == pack(b"i") => H_CALL_ID,
        n if n == pack(b"cseq") => H_CSEQ,
        _ => 0,
    }
}

/// The To tag the datapath gives a 503 for the request with this Call-ID hash
/// (`SipInfo::call_id_hash`), as its bytes: `gw` and 16 hex digits.
pub const fn reply_tag(call_id_hash: u64) -> [u8; TAG_LEN] {
    let v = call_id_hash ^ TAG_DOMAIN;
    let mut out = [0u8; TAG_LEN];
    out[0] = b'g';
    out[1] = b'w';
    let mut i = 0;
    while i < 16 {
        let nibble = ((v >> (60 - 4 * i)) & 0xf) as u8;
        out[2 + i] = if nibble < 10 {
            b'0' + nibble
        } else {
            b'a' + nibble - 10
        };
        i += 1;
    }
    out
}

/// The hash the parser gives the To tag of [`reply_tag`] (`SipInfo::to_tag_hash`): an ACK whose
/// To tag hashes so, for its own Call-ID, acknowledges a 503 of the datapath's.
pub const fn reply_tag_hash(call_id_hash: u64) -> u64 {
    let tag = reply_tag(call_id_hash);
    let mut h = FNV_OFFSET;
    let mut i = 0;
    while i < TAG_LEN {
        h ^= tag[i] as u64;
        h = h.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

/// `s` in a 64-byte array, so that a byte of it is read with a masked index (a modulo by its
/// length becomes arithmetic the verifier cannot bound).
const fn padded(s: &[u8]) -> [u8; 64] {
    let mut out = [0u8; 64];
    let mut i = 0;
    while i < s.len() {
        out[i] = s[i];
        i += 1;
    }
    out
}
const STATUS_BYTES: [u8; 64] = padded(STATUS);
const TAG_PARAM_BYTES: [u8; 64] = padded(b";tag=gw");
const RETRY_AFTER_BYTES: [u8; 64] = padded(RETRY_AFTER);
const CONTENT_LENGTH_BYTES: [u8; 64] = padded(CONTENT_LENGTH);

/// Bytes inside a copied line a step takes beyond its first (a skipped line is searched for its
/// end a word at a time, up to 64 bytes a step).
const RUN: usize = 7;
/// Queued bytes a step writes at most.
const QUEUED_RUN: usize = 8;

/// Nothing queued to write.
const SRC_NONE: u8 = 0;
/// The status line.
const SRC_STATUS: u8 = 1;
/// `;tag=` and the datapath's tag.
const SRC_TAG: u8 = 2;
/// A line's CRLF.
const SRC_CRLF: u8 = 3;
/// `Retry-After: N` and its CRLF.
const SRC_RETRY: u8 = 4;
/// `Content-Length: 0` and the blank line; then the reply is done.
const SRC_LENGTH: u8 = 5;

/// The state of a reply being built. `#[repr(C)]`, no implicit padding.
///
/// Each step either writes queued bytes (the status line, a CRLF, the tag, the last headers:
/// `src`), up to [`QUEUED_RUN`] of one source, or reads request bytes (see `run_on`), so that a
/// step is small for the verifier.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplyState {
    /// One's-complement sum of the reply so far, as big-endian 16-bit words (unfolded).
    pub sum: u64,
    /// `sum` where the current header line began.
    line_sum: u64,
    /// The current header's name so far, packed.
    name: u64,
    /// The To tag's value ([`reply_tag`] before hex).
    tag: u64,
    /// `Retry-After`'s digits, most significant first.
    retry_digits: [u8; 8],
    /// Next request byte.
    pub pos: u32,
    /// Reply bytes written.
    pub len: u32,
    /// `len` where the current header line began.
    line_len: u32,
    /// `PHASE_*`.
    phase: u8,
    /// Characters of the name so far.
    name_len: u8,
    /// The header of the current line (`H_*`; 0 when left out).
    header: u8,
    /// Headers copied so far (`H_*`).
    seen: u8,
    /// Whether the request's To header has a tag (then none is added).
    to_tagged: u8,
    /// Whether the tag has been added.
    tag_added: u8,
    /// Digits of `Retry-After` (0: no such header).
    retry_len: u8,
    /// What is queued to write (`SRC_*`).
    src: u8,
    /// Bytes of `src` written.
    src_pos: u8,
    /// Padding.
    pad: [u8; 7],
}

impl ReplyState {
    /// A reply to a request whose To header has a tag or not (`SipInfo::have & HAVE_TO_TAG`),
    /// with this Call-ID hash and `Retry-After` (0: none).
    pub const fn new(to_tagged: bool, call_id_hash: u64, retry_after: u32) -> Self {
        let mut retry_digits = [0u8; 8];
        let mut retry_len = 0u8;
        if retry_after != 0 {
            let mut n = retry_after;
            let mut rev = [0u8; 10];
            while n != 0 && (retry_len as usize) < 8 {
                rev[retry_len as usize] = b'0' + (n % 10) as u8;
                n /= 10;
                retry_len += 1;
            }
            let mut i = 0;
            while i < retry_len as usize {
                retry_digits[i] = rev[retry_len as usize - 1 - i];
                i += 1;
            }
        }
        ReplyState {
            sum: 0,
            line_sum: 0,
            name: 0,
            tag: call_id_hash ^ TAG_DOMAIN,
            retry_digits,
            pos: 0,
            len: 0,
            line_len: 0,
            phase: PHASE_REQUEST_LINE,
            name_len: 0,
            header: 0,
            seen: 0,
            to_tagged: to_tagged as u8,
            tag_added: 0,
            retry_len,
            src: SRC_STATUS,
            src_pos: 0,
            pad: [0; 7],
        }
    }

    /// Whether the reply is complete (its bytes are `out[..len]`).
    pub const fn done(&self) -> bool {
        self.phase == PHASE_DONE
    }

    /// Whether no reply can be made.
    pub const fn failed(&self) -> bool {
        self.phase == PHASE_FAILED
    }

    /// Appends one byte.
    #[inline(always)]
    fn put(&mut self, out: &mut [u8; REPLY_BUF], c: u8) {
        if self.len as usize >= MAX_REPLY {
            self.phase = PHASE_FAILED;
            return;
        }
        // The index goes through a barrier before its mask: otherwise LLVM drops the mask (the
        // length test above implies it) and the verifier sees an unbounded index.
        out[core::hint::black_box(self.len as usize) & (REPLY_BUF - 1)] = c;
        // Even offsets are the high byte of a 16-bit word.
        self.sum += (c as u64) << (((self.len & 1) ^ 1) * 8);
        self.len += 1;
    }

    /// Byte `i` of the queued source `src`, and whether it is its last.
    #[inline(always)]
    fn src_byte(&self, i: usize) -> (u8, bool) {
        let i = i & 63;
        match self.src {
            SRC_STATUS => (STATUS_BYTES[i], i + 1 >= STATUS.len()),
            SRC_TAG => {
                // `;tag=gw`, then 16 hex digits.
                let c = if i < TAG_PARAM.len() + 2 {
                    TAG_PARAM_BYTES[i]
                } else {
                    let k = (i - TAG_PARAM.len() - 2) & 15;
                    let nibble = ((self.tag >> (60 - 4 * k)) & 0xf) as u8;
                    if nibble < 10 {
                        b'0' + nibble
                    } else {
                        b'a' + nibble - 10
                    }
                };
                (c, i + 1 >= TAG_PARAM.len() + TAG_LEN)
            }
            SRC_CRLF => (if i & 1 == 0 { b'\r' } else { b'\n' }, i >= 1),
            SRC_RETRY => {
                let digits = self.retry_len as usize;
                let c = if i < RETRY_AFTER.len() {
                    RETRY_AFTER_BYTES[i]
                } else if i < RETRY_AFTER.len() + digits {
                    self.retry_digits[(i - RETRY_AFTER.len()) & 7]
                } else if (i - RETRY_AFTER.len() - digits) & 1 == 0 {
                    b'\r'
                } else {
                    b'\n'
                };
                (c, i + 1 >= RETRY_AFTER.len() + digits + 2)
            }
            _ => (CONTENT_LENGTH_BYTES[i], i + 1 >= CONTENT_LENGTH.len()),
        }
    }

    /// Writes up to [`QUEUED_RUN`] bytes of the queued source, and moves on to what follows it
    /// when its last is written (the next source waits for the next step).
    #[inline(always)]
    fn write_queued(&mut self, out: &mut [u8; REPLY_BUF]) {
        let mut last = false;
        for _ in 0..QUEUED_RUN {
            let c;
            (c, last) = self.src_byte(self.src_pos as usize);
            self.put(out, c);
            self.src_pos += 1;
            if last {
                break;
            }
        }
        if !last {
            return;
        }
        self.src_pos = 0;
        self.src = match self.src {
            SRC_TAG => SRC_CRLF,
            SRC_RETRY => SRC_LENGTH,
            SRC_LENGTH => {
                if self.phase != PHASE_FAILED {
                    self.phase = PHASE_DONE;
                }
                SRC_NONE
            }
            _ => SRC_NONE,
        };
    }

    /// One step over the request `b` of `len` bytes, writing into `out`: queued bytes written,
    /// or request bytes read (one, and more in the same line: see `run_on`). Returns `true` when
    /// the reply is complete or cannot be made.
    pub fn step<B: PacketBytes>(&mut self, b: &B, len: usize, out: &mut [u8; REPLY_BUF]) -> bool {
        if self.phase == PHASE_DONE || self.phase == PHASE_FAILED {
            return true;
        }
        if self.src != SRC_NONE {
            self.write_queued(out);
            return self.phase == PHASE_DONE || self.phase == PHASE_FAILED;
        }
        let pos = self.pos as usize;
        if pos >= len || pos >= super::MAX_SCAN {
            // The headers did not end within what was given.
            self.phase = PHASE_FAILED;
            return true;
        }
        let c = byte(b, pos);
        self.pos += 1;
        match self.phase {
            PHASE_REQUEST_LINE => {
                if c == b'\n' {
                    self.phase = PHASE_LINE_START;
                }
            }
            PHASE_LINE_START => match c {
                b'\r' => {}
                b'\n' => {
                    // The blank line: the reply's own last headers, if it has what it needs.
                    if self.seen & H_ALL != H_ALL {
                        self.phase = PHASE_FAILED;
                    } else {
                        self.src = if self.retry_len != 0 {
                            SRC_RETRY
                        } else {
                            SRC_LENGTH
                        };
                    }
                }
                b' ' | b'\t' => {
                    // A folded line continues the header before it, and stays folded.
                    if self.header != 0 {
                        self.phase = PHASE_VALUE;
                        self.put(out, c);
                    } else {
                        self.phase = PHASE_SKIP;
                    }
                }
                _ => {
                    self.line_len = self.len;
                    self.line_sum = self.sum;
                    self.name = lower(c) as u64;
                    self.name_len = 1;
                    self.header = 0;
                    self.phase = PHASE_NAME;
                    self.put(out, c);
                }
            },
            PHASE_NAME => match c {
                b':' | b' ' | b'\t' => {
                    self.header = header(self.name, self.name_len);
                    if self.header == 0 {
                        self.len = self.line_len;
                        self.sum = self.line_sum;
                        self.phase = PHASE_SKIP;
                    } else {
                        self.seen |= self.header;
                        self.phase = PHASE_VALUE;
                        self.put(out, c);
                    }
                }
                b'\r' | b'\n' => self.phase = PHASE_FAILED,
                _ => {
                    self.name = (self.name << 8) | lower(c) as u64;
                    self.name_len = self.name_len.saturating_add(1);
                    self.put(out, c);
                }
            },
            PHASE_VALUE => match c {
                b'\r' => {}
                b'\n' => {
                    // The line ends: the To tag when one is due, then the CRLF.
                    if self.header == H_TO && self.to_tagged == 0 && self.tag_added == 0 {
                        self.tag_added = 1;
                        self.src = SRC_TAG;
                    } else {
                        self.src = SRC_CRLF;
                    }
                    self.phase = PHASE_LINE_START;
                }
                _ => self.put(out, c),
            },
            _ => {
                if c == b'\n' {
                    self.header = 0;
                    self.phase = PHASE_LINE_START;
                }
            }
        }
        self.run_on(b, len, out);
        self.phase == PHASE_DONE || self.phase == PHASE_FAILED
    }

    /// Inside a line (a name, copied or skipped), more bytes short of its end in the same step:
    /// most of a request is such bytes, and a step costs a callback. A name goes on for up to
    /// [`RUN`] bytes short of what ends it; a copied line, up to [`RUN`] bytes short of its CR
    /// or LF; a skipped line (or the request line), in which only the LF matters, up to its LF,
    /// found a word at a time.
    #[inline(always)]
    fn run_on<B: PacketBytes>(&mut self, b: &B, len: usize, out: &mut [u8; REPLY_BUF]) {
        let end = if len < super::MAX_SCAN {
            len
        } else {
            super::MAX_SCAN
        };
        if self.phase == PHASE_NAME {
            // A header's name goes on up to what ends it (a colon or white space, which the
            // next step judges).
            for _ in 0..RUN {
                let pos = self.pos as usize;
                if pos >= end {
                    return;
                }
                let c = byte(b, pos);
                if matches!(c, b':' | b' ' | b'\t' | b'\r' | b'\n') {
                    return;
                }
                self.name = (self.name << 8) | lower(c) as u64;
                self.name_len = self.name_len.saturating_add(1);
                self.put(out, c);
                self.pos += 1;
            }
            return;
        }
        let copy = self.phase == PHASE_VALUE;
        if !copy && self.phase != PHASE_SKIP && self.phase != PHASE_REQUEST_LINE {
            return;
        }
        if !copy {
            self.pos = match find_byte(b, self.pos as usize, end, b'\n') {
                Ok(at) => at,
                Err(next) => next,
            } as u32;
            return;
        }
        for _ in 0..RUN {
            let pos = self.pos as usize;
            if pos >= end {
                return;
            }
            let c = byte(b, pos);
            if c == b'\r' || c == b'\n' {
                return;
            }
            if copy {
                self.put(out, c);
            }
            self.pos += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use alloc::{string::String, vec::Vec};

    use super::*;
    use crate::{
        bytes::SliceBytes,
        sip::{HAVE_TO_TAG, parse_sip},
    };

    /// The reply to `req`, as the datapath would build it.
    fn reply(req: &[u8], retry_after: u32) -> Option<String> {
        let info = parse_sip(&SliceBytes(req), req.len());
        let mut st = ReplyState::new(info.have & HAVE_TO_TAG != 0, info.call_id_hash, retry_after);
        let mut out = [0u8; REPLY_BUF];
        for _ in 0..MAX_REPLY_STEPS {
            if st.step(&SliceBytes(req), req.len(), &mut out) {
                break;
            }
        }
        if !st.done() {
            return None;
        }
        let bytes = &out[..st.len as usize];
        // The running sum is the sum of the bytes as big-endian words.
        let mut sum = 0u64;
        for (i, &b) in bytes.iter().enumerate() {
            sum += if i % 2 == 0 {
                u64::from(b) << 8
            } else {
                u64::from(b)
            };
        }
        assert_eq!(st.sum, sum);
        Some(String::from_utf8(bytes.to_vec()).unwrap())
    }

    const INVITE: &[u8] = b"INVITE sip:bob@example.com SIP/2.0\r\n\
        Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK776asdhds\r\n\
        v: SIP/2.0/UDP proxy.example.com;branch=z9hG4bK1\r\n\
        Max-Forwards: 70\r\n\
        To: Bob <sip:bob@example.com>\r\n\
        From: Alice <sip:alice@example.com>;tag=1928301774\r\n\
        Call-ID: a84b4c76e66710@pc33.example.com\r\n\
        CSeq: 314159 INVITE\r\n\
        Contact: <sip:alice@pc33.example.com>\r\n\
        Content-Type: application/sdp\r\n\
        Content-Length: 4\r\n\
        \r\n\
        v=0\n";

    #[test]
    fn a_503_copies_what_rfc_3261_asks_and_nothing_else() {
        let r = reply(INVITE, 0).unwrap();
        let info = parse_sip(&SliceBytes(INVITE), INVITE.len());
        let tag = String::from_utf8(reply_tag(info.call_id_hash).to_vec()).unwrap();
        let want = alloc::format!(
            "SIP/2.0 503 Service Unavailable\r\n\
             Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK776asdhds\r\n\
             v: SIP/2.0/UDP proxy.example.com;branch=z9hG4bK1\r\n\
             To: Bob <sip:bob@example.com>;tag={tag}\r\n\
             From: Alice <sip:alice@example.com>;tag=1928301774\r\n\
             Call-ID: a84b4c76e66710@pc33.example.com\r\n\
             CSeq: 314159 INVITE\r\n\
             Content-Length: 0\r\n\r\n"
        );
        assert_eq!(r, want);
        assert!(r.len() < INVITE.len());
        // The response parses as one, of the request's transaction.
        let resp = parse_sip(&SliceBytes(r.as_bytes()), r.len());
        assert_eq!(resp.status, 503);
        assert_eq!(resp.unit_key(), info.unit_key());
        assert_eq!(resp.call_id_hash, info.call_id_hash);
    }

    #[test]
    fn the_ack_of_a_503_carries_a_tag_the_datapath_recognises() {
        let r = reply(INVITE, 0).unwrap();
        let to = r.lines().find(|l| l.starts_with("To:")).unwrap();
        let ack = alloc::format!(
            "ACK sip:bob@example.com SIP/2.0\r\n\
             Via: SIP/2.0/UDP 10.0.0.1:5060;branch=z9hG4bK776asdhds\r\n\
             {to}\r\n\
             From: Alice <sip:alice@example.com>;tag=1928301774\r\n\
             Call-ID: a84b4c76e66710@pc33.example.com\r\n\
             CSeq: 314159 ACK\r\n\r\n"
        );
        let info = parse_sip(&SliceBytes(ack.as_bytes()), ack.len());
        assert_ne!(info.have & HAVE_TO_TAG, 0);
        assert_eq!(info.to_tag_hash, reply_tag_hash(info.call_id_hash));
        // Another call's tag is not ours.
        assert_ne!(info.to_tag_hash, reply_tag_hash(info.call_id_hash ^ 1));
    }

    #[test]
    fn compact_folded_and_tagged_requests() {
        let req = b"OPTIONS sip:x@y SIP/2.0\r\n\
            v: SIP/2.0/UDP h;branch=z9hG4bKa\r\n\
            t: <sip:x@y>;tag=abc\r\n\
            f: <sip:z@y>\r\n  ;tag=9\r\n\
            i: id1\r\n\
            CSEQ : 1 OPTIONS\r\n\
            Max-Forwards: 70\r\n\
            Accept: application/sdp\r\n\
            Content-Length: 0\r\n\r\n";
        let r = reply(req, 120).unwrap();
        assert_eq!(
            r,
            "SIP/2.0 503 Service Unavailable\r\n\
             v: SIP/2.0/UDP h;branch=z9hG4bKa\r\n\
             t: <sip:x@y>;tag=abc\r\n\
             f: <sip:z@y>\r\n  ;tag=9\r\n\
             i: id1\r\n\
             CSEQ : 1 OPTIONS\r\n\
             Retry-After: 120\r\n\
             Content-Length: 0\r\n\r\n"
        );
    }

    #[test]
    fn no_reply_without_the_headers_it_needs_or_their_end() {
        // No CSeq.
        assert_eq!(
            reply(
                b"BYE sip:x SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bKb\r\nTo: <sip:x>\r\n\
                  From: <sip:y>;tag=1\r\nCall-ID: c\r\n\r\n",
                0
            ),
            None
        );
        // Headers cut off before the blank line.
        let cut = &INVITE[..INVITE.len() - 40];
        assert_eq!(reply(cut, 0), None);
        // A line with no colon.
        assert_eq!(reply(b"INVITE sip:x SIP/2.0\r\nVia\r\n\r\n", 0), None);
        assert_eq!(reply(b"", 0), None);
    }

    #[test]
    fn a_long_header_section_is_refused_not_cut() {
        let mut req: Vec<u8> = b"INVITE sip:x SIP/2.0\r\n".to_vec();
        for i in 0..40 {
            req.extend_from_slice(
                alloc::format!("Via: SIP/2.0/UDP host{i}.example.com;branch=z9hG4bK{i}\r\n")
                    .as_bytes(),
            );
        }
        req.extend_from_slice(
            b"To: <sip:x>\r\nFrom: <sip:y>;tag=1\r\nCall-ID: c\r\nCSeq: 1 INVITE\r\n\r\n",
        );
        assert_eq!(reply(&req, 0), None);
    }

    #[test]
    fn arbitrary_bytes_never_overrun_or_panic() {
        let mut seed = 0x1234_5678_u64;
        let mut buf = [0u8; 1200];
        for round in 0..2000 {
            for b in buf.iter_mut() {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                // Mostly header-like bytes, so that some get far.
                *b = b"Via:To: From;\r\n iCSeq-d"[(seed % 23) as usize];
            }
            let len = (seed as usize >> 8) % buf.len();
            let _ = reply(&buf[..len], round % 3);
        }
    }
}
