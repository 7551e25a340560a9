//! A bounded SIP message parser: what the datapath needs to know of a datagram to a SIP port.
//!
//! A [`SipState::step`] runs at most two bounded scans of 64 bytes (finding a line's end, the
//! next one's when the first is skipped or longer), one of 64 bytes searching a parameter, or
//! hashes up to two words of a token, or looks at a line through fixed-size reads; the state machine
//! carries positions between steps. A message gets at most [`MAX_STEPS`] steps, lines of at most
//! [`MAX_LINE`] bytes, at most [`MAX_LINES`] lines, and only its first [`MAX_SCAN`] bytes are
//! looked at. In eBPF the steps run under `bpf_loop`, about a line's worth to a call. Everything the parser learns is in a
//! `Copy` struct ([`SipInfo`]).
//!
//! What it extracts: request or response; the method; the request-line retransmission marker; the
//! top Via's sent-by and branch; the Call-ID; the CSeq number and method; whether the To header
//! carries a tag (an in-dialog request). Header names are case-insensitive and the compact forms
//! `v` (Via), `i` (Call-ID) and `t` (To) are understood.
//!
//! The retransmission marker (seed 001: "a marker on the request line") is a Request-URI
//! parameter named `x-retransmit`, for example `INVITE sip:bob@example.com;x-retransmit SIP/2.0`.
//! As an `other-param` of the SIP URI grammar (RFC 3261 §25.1), it keeps the request valid SIP for
//! servers that do not know it. It can only demote: a marked request that would be exempt is a
//! retransmission, and a marked request of no known transaction is an original like any other
//! (a marker costs a client nothing, so it buys nothing).
//!
//! A transaction is identified (RFC 3261 §17.2.3) by the top Via's branch and sent-by and the
//! CSeq method. The key also covers the Call-ID and the CSeq number, which a retransmission
//! repeats byte for byte: a fresh request that reuses a known branch is not a retransmission.
//! The key is a 64-bit FNV-1a hash over those fields. A value is hashed whole or not at all: one
//! longer than [`MAX_VALUE`] bytes counts as absent, never as its prefix.

use crate::{
    Class,
    bytes::{PacketBytes, bytes_at, find_byte, first_flagged, splat, zero_bytes},
};

pub mod reply;

/// Bytes of a message the parser looks at.
pub const MAX_SCAN: usize = 1024;
/// Longest line the parser follows; a longer one makes the message malformed.
pub const MAX_LINE: usize = 256;
/// Lines (steps) a message gets.
pub const MAX_LINES: usize = 48;
/// Bytes of a header name compared (longer names are other headers).
const MAX_NAME: usize = 16;
/// Longest value (branch, sent-by, Call-ID, CSeq method) hashed; a longer one counts as absent.
pub const MAX_VALUE: usize = 96;
/// [`SipState::token_len`] of a value longer than [`MAX_VALUE`].
const TOO_LONG: u8 = u8::MAX;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// What the message is.
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum MessageKind {
    /// Not finished (more lines to read).
    #[default]
    Pending = 0,
    /// A request.
    Request = 1,
    /// A response (`SIP/2.0 ...`).
    Response = 2,
    /// Not a SIP message the parser can follow (never exempt).
    Malformed = 3,
}

/// Request methods the classifier distinguishes.
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Method {
    /// Not a request, or not read yet.
    #[default]
    None = 0,
    /// INVITE.
    Invite = 1,
    /// ACK.
    Ack = 2,
    /// BYE.
    Bye = 3,
    /// CANCEL.
    Cancel = 4,
    /// REGISTER.
    Register = 5,
    /// OPTIONS.
    Options = 6,
    /// Any other token.
    Other = 7,
}

/// [`SipInfo::have`]: a Via header was seen.
pub const HAVE_VIA: u8 = 1 << 0;
/// [`SipInfo::have`]: the top Via has a branch.
pub const HAVE_BRANCH: u8 = 1 << 1;
/// [`SipInfo::have`]: a CSeq header was seen.
pub const HAVE_CSEQ: u8 = 1 << 2;
/// [`SipInfo::have`]: a Call-ID header was seen.
pub const HAVE_CALL_ID: u8 = 1 << 3;
/// [`SipInfo::have`]: the To header's tag was hashed.
pub const HAVE_TO_TAG: u8 = 1 << 4;
/// [`SipInfo::have`]: the From header's tag was hashed.
pub const HAVE_FROM_TAG: u8 = 1 << 5;

/// What the parser learnt of a message. `#[repr(C)]`, no implicit padding.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SipInfo {
    /// FNV-1a of the top Via's branch.
    pub branch_hash: u64,
    /// FNV-1a of the top Via's sent-by (host and port).
    pub sent_by_hash: u64,
    /// FNV-1a of the Call-ID.
    pub call_id_hash: u64,
    /// FNV-1a of the CSeq method.
    pub cseq_method_hash: u64,
    /// FNV-1a of the To header's tag.
    pub to_tag_hash: u64,
    /// FNV-1a of the From header's tag.
    pub from_tag_hash: u64,
    /// The CSeq number.
    pub cseq: u32,
    /// A response's status code (0 for a request).
    pub status: u16,
    /// A [`MessageKind`].
    pub kind: u8,
    /// A [`Method`].
    pub method: u8,
    /// `HAVE_*` bits.
    pub have: u8,
    /// The request line carries the retransmission marker.
    pub marker: u8,
    /// The To header has a tag: an in-dialog request.
    pub in_dialog: u8,
    /// Padding, zero.
    pub pad: [u8; 5],
}

impl SipInfo {
    /// What the message is.
    pub const fn kind(&self) -> MessageKind {
        match self.kind {
            1 => MessageKind::Request,
            2 => MessageKind::Response,
            3 => MessageKind::Malformed,
            _ => MessageKind::Pending,
        }
    }

    /// The request method.
    pub const fn method(&self) -> Method {
        match self.method {
            1 => Method::Invite,
            2 => Method::Ack,
            3 => Method::Bye,
            4 => Method::Cancel,
            5 => Method::Register,
            6 => Method::Options,
            7 => Method::Other,
            _ => Method::None,
        }
    }

    /// The transaction key: branch, sent-by and CSeq method, with the Call-ID (when present)
    /// and the CSeq number. `None` without a top-Via branch or a CSeq (such a request cannot be
    /// matched to its retransmissions).
    pub const fn transaction_key(&self) -> Option<u64> {
        if self.have & (HAVE_BRANCH | HAVE_CSEQ) != HAVE_BRANCH | HAVE_CSEQ {
            return None;
        }
        let call_id = if self.have & HAVE_CALL_ID != 0 {
            self.call_id_hash
        } else {
            0
        };
        let mut h = FNV_OFFSET;
        h = mix(h, self.branch_hash);
        h = mix(h, self.sent_by_hash);
        h = mix(h, self.cseq_method_hash);
        h = mix(h, call_id);
        h = mix(
            h,
            self.cseq as u64 | ((self.have & HAVE_CALL_ID) as u64) << 32,
        );
        Some(h)
    }

    /// The key of the INVITE transaction an ACK (to a non-2xx response) or a CANCEL belongs to:
    /// the transaction key with the CSeq method INVITE (RFC 3261 §9.1, §17.1.1.3: they reuse the
    /// INVITE's branch, Call-ID and CSeq number).
    pub const fn invite_key(&self) -> Option<u64> {
        let mut invite = *self;
        invite.cseq_method_hash = INVITE_HASH;
        invite.transaction_key()
    }

    /// The key of the dialog the message belongs to: the Call-ID and both tags, in either order
    /// (a dialog's requests flow both ways). `None` without all three.
    pub const fn dialog_key(&self) -> Option<u64> {
        let all = HAVE_CALL_ID | HAVE_TO_TAG | HAVE_FROM_TAG;
        if self.have & all != all {
            return None;
        }
        let mut h = mix(FNV_OFFSET, DIALOG_KEY_DOMAIN);
        h = mix(h, self.call_id_hash);
        h = mix(h, self.to_tag_hash ^ self.from_tag_hash);
        Some(h)
    }

    /// Whether this is a server's 2xx response to an INVITE: the response that establishes a
    /// dialog.
    pub const fn establishes_dialog(&self) -> bool {
        matches!(self.kind(), MessageKind::Response)
            && self.status >= 200
            && self.status < 300
            && self.have & HAVE_CSEQ != 0
            && self.cseq_method_hash == INVITE_HASH
    }

    /// Whether this is a server's final response to a BYE: the dialog it belongs to has ended
    /// (RFC 3261 §15.1.2: a BYE's final response, whatever its status, ends the dialog).
    pub const fn ends_dialog(&self) -> bool {
        matches!(self.kind(), MessageKind::Response)
            && self.status >= 200
            && self.have & HAVE_CSEQ != 0
            && self.cseq_method_hash == BYE_HASH
    }

    /// The key of the unit of work an admitted request is, the one its response completes: the
    /// transaction key when there is one, else a key over the Call-ID, the CSeq number and the
    /// CSeq method, which a response carries unchanged (RFC 3261 §8.2.6.2) even when the top Via
    /// has no branch or a line beyond the parser's bounds. `None` when neither can be built: such
    /// a request is refused, since nothing could ever complete it.
    pub const fn unit_key(&self) -> Option<u64> {
        if let Some(k) = self.transaction_key() {
            return Some(k);
        }
        if self.have & (HAVE_CALL_ID | HAVE_CSEQ) != HAVE_CALL_ID | HAVE_CSEQ {
            return None;
        }
        // A different starting point than the transaction key's, so the two never meet.
        let mut h = mix(FNV_OFFSET, UNIT_KEY_DOMAIN);
        h = mix(h, self.call_id_hash);
        h = mix(h, self.cseq as u64);
        h = mix(h, self.cseq_method_hash);
        Some(h)
    }

    /// The class by the message alone: responses, ACK, CANCEL, BYE and in-dialog requests are
    /// exempt, unless marked as retransmissions (the marker only demotes); any other request,
    /// marked or not, and anything malformed or unfinished, is an original. (The datapath turns
    /// originals whose transaction it has seen into retransmissions.)
    pub const fn class(&self) -> Class {
        match self.kind() {
            MessageKind::Response => Class::SipExempt,
            MessageKind::Request => {
                let exempt = matches!(self.method(), Method::Ack | Method::Cancel | Method::Bye)
                    || self.in_dialog != 0;
                match (exempt, self.marker != 0) {
                    (true, true) => Class::SipRetransmission,
                    (true, false) => Class::SipExempt,
                    _ => Class::SipOriginal,
                }
            }
            _ => Class::SipOriginal,
        }
    }
}

/// Mixed first into a fallback unit key (`b"unit-key"`).
const UNIT_KEY_DOMAIN: u64 = u64::from_be_bytes(*b"unit-key");
/// Mixed first into a dialog key (`b"dialog!!"`).
const DIALOG_KEY_DOMAIN: u64 = u64::from_be_bytes(*b"dialog!!");

/// Mixed first into a fragment's unit key (`b"fragment"`).
const FRAGMENT_KEY_DOMAIN: u64 = u64::from_be_bytes(*b"fragment");

/// The unit key of a first fragment that carries no readable message (its ports only: the
/// message is in fragments that carry none): its source address (IPv4 mapped into IPv6) and
/// port. No response can match it, so its unit ends at its timeout; a later such fragment from
/// the same source takes the place over (the earlier unit ending as expired).
pub fn fragment_unit_key(source: &[u8; 16], port: u16) -> u64 {
    let mut h = FRAGMENT_KEY_DOMAIN ^ FNV_OFFSET;
    let mut i = 0;
    while i < 16 {
        h ^= source[i] as u64;
        h = h.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    for byte in port.to_be_bytes() {
        h ^= byte as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// FNV-1a of a byte string, as [`SipState`] hashes a value.
const fn fnv(bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET;
    let mut i = 0;
    while i < bytes.len() {
        h ^= bytes[i] as u64;
        h = h.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

/// `prefix` (at most 8 bytes) as a little-endian word and the mask of its bytes: a word read at
/// the same place starts with `prefix` when `word & mask == value`.
#[inline(always)]
const fn word_prefix(prefix: &[u8]) -> (u64, u64) {
    let (mut value, mut i) = (0u64, 0);
    while i < prefix.len() && i < 8 {
        value |= (prefix[i] as u64) << (8 * i);
        i += 1;
    }
    let mask = if i >= 8 {
        u64::MAX
    } else {
        (1u64 << (8 * i)) - 1
    };
    (value, mask)
}

/// The hash of the CSeq method `INVITE`.
const INVITE_HASH: u64 = fnv(b"INVITE");
/// The hash of the CSeq method `BYE`.
const BYE_HASH: u64 = fnv(b"BYE");

const fn mix(h: u64, v: u64) -> u64 {
    let mut h = h;
    let mut i = 0;
    while i < 8 {
        h ^= (v >> (i * 8)) & 0xff;
        h = h.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

/// What a step of the parser does next ([`SipState::phase`]).
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Phase {
    /// Look for the end of the line starting at `line_start`, from `pos`.
    #[default]
    FindEol = 0,
    /// Look at the line: the start line, the blank line, or a header (which one, and where its
    /// value starts).
    Dispatch,
    /// Look for the next `;` from `pos` before `scan_end` (every needle starts with one), and
    /// whether the needle `want` starts there.
    Semi,
    /// Top Via: skip the protocol (`SIP/2.0/UDP`) up to the space.
    ViaProtocol,
    /// Hash a value from `pos` (which one: `target`, a `TARGET_*`).
    Hash,
    /// Top Via: find where its value ends (the first comma).
    ViaComma,
    /// CSeq: the number.
    CSeqNumber,
    /// Parsing is over.
    Done,
}

impl Phase {
    const fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::FindEol,
            1 => Phase::Dispatch,
            2 => Phase::Semi,
            3 => Phase::ViaProtocol,
            4 => Phase::Hash,
            5 => Phase::ViaComma,
            6 => Phase::CSeqNumber,
            _ => Phase::Done,
        }
    }
}

/// Bytes one byte-wise step scans at most (the Via's protocol and comma, a CSeq number). Lines
/// and parameters are searched a word at a time, up to 64 bytes a step
/// (`crate::bytes::find_byte`).
const CHUNK: usize = 8;
/// Bytes of a value one step hashes at most.
const HASH_CHUNK: usize = 8;
/// Steps a message gets.
pub const MAX_STEPS: usize = 1024;

/// The parser's state between steps. In eBPF it lives in map memory, and each step (one
/// `bpf_loop` callback) runs at most one or two bounded scans (of [`CHUNK`] bytes, twice
/// [`HASH_CHUNK`] bytes, or eight words, twice when looking for line ends) and leaves its results
/// here. Positions read back from map memory are unknown to the verifier, so the positions one
/// scan could end at do not multiply into the next scan's states, as they did when a whole line
/// was handled in one step.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SipState {
    /// What was learnt so far.
    pub info: SipInfo,
    /// A hash being accumulated across steps.
    hash: u64,
    /// Current scan position (message offset).
    pos: u32,
    /// Start of the current line.
    line_start: u32,
    /// End of the current line's content (before CR LF).
    line_end: u32,
    /// Start of the next line.
    line_next: u32,
    /// End of the current Via value (its first comma, or the line end).
    via_end: u32,
    /// Lines read.
    lines: u16,
    /// A [`Phase`].
    phase: u8,
    /// Bytes of the current token hashed so far.
    token_len: u8,
    /// Padding, zero.
    pad: [u8; 2],
    /// The needle being searched (`WANT_*`).
    want: u8,
    /// The value being hashed (`TARGET_*`).
    target: u8,
    /// Where the current search ends.
    scan_end: u32,
}

/// Searching for the retransmission marker on the request line.
const WANT_MARKER: u8 = 1;
/// Searching for the top Via's branch parameter.
const WANT_BRANCH: u8 = 2;
/// Searching for the To header's tag.
const WANT_TAG: u8 = 3;
/// Searching for the From header's tag.
const WANT_FROM_TAG: u8 = 4;

/// Hashing the top Via's sent-by.
const TARGET_SENT_BY: u8 = 0;
/// Hashing the top Via's branch.
const TARGET_BRANCH: u8 = 1;
/// Hashing the CSeq method.
const TARGET_CSEQ_METHOD: u8 = 2;
/// Hashing the Call-ID.
const TARGET_CALL_ID: u8 = 3;
/// Hashing the To tag.
const TARGET_TO_TAG: u8 = 4;
/// Hashing the From tag.
const TARGET_FROM_TAG: u8 = 5;

/// Reads one byte (0 past the end).
#[inline(always)]
fn byte<B: PacketBytes>(b: &B, at: usize) -> u8 {
    let mut one = [0u8; 1];
    if b.read(at, &mut one) { one[0] } else { 0 }
}

/// ASCII lowercase.
#[inline(always)]
const fn lower(c: u8) -> u8 {
    if c.is_ascii_uppercase() { c | 0x20 } else { c }
}

/// A string the parser looks for where a message has it, its letters in either case (`SIP/2.0`,
/// parameter names): at most 16 bytes, compared as two words (its first eight bytes and its last
/// eight, which overlap when it is shorter than 16), each ORed with 0x20 where the string has a
/// letter (a letter ORed with 0x20 is its lowercase form, and no other byte becomes one) and
/// compared whole. The same as comparing byte by byte, lowercased, at some 6 instructions a
/// word instead of 6 a byte.
struct Literal<const N: usize> {
    head: u64,
    head_fold: u64,
    tail: u64,
    tail_fold: u64,
}

/// `text[from..from + n]` as a little-endian word, and the OR that lowercases its letters.
const fn folded(text: &[u8], from: usize, n: usize) -> (u64, u64) {
    let (mut value, mut fold, mut i) = (0u64, 0u64, 0);
    while i < n {
        let c = text[from + i];
        value |= (c as u64) << (8 * i);
        if c.is_ascii_lowercase() {
            fold |= 0x20 << (8 * i);
        }
        i += 1;
    }
    (value, fold)
}

impl<const N: usize> Literal<N> {
    /// `text`, its letters lowercase.
    const fn new(text: &[u8; N]) -> Self {
        assert!(N >= 1 && N <= 16, "a literal of one to sixteen bytes");
        let (head, head_fold) = folded(text, 0, if N < 8 { N } else { 8 });
        let (tail, tail_fold) = if N > 8 {
            folded(text, N - 8, 8)
        } else {
            (0, 0)
        };
        Literal {
            head,
            head_fold,
            tail,
            tail_fold,
        }
    }

    /// Whether the bytes at `at` (before `end`) are this string, letters in either case.
    #[inline(always)]
    fn at<B: PacketBytes>(&self, b: &B, at: usize, end: usize) -> bool {
        if at + N > end {
            return false;
        }
        if N <= 8 {
            let mut w = [0u8; 8];
            // SAFETY: N <= 8: the first N bytes of `w`, as an array of N bytes (alignment 1).
            let head = unsafe { &mut *w.as_mut_ptr().cast::<[u8; N]>() };
            b.read(at, head) && u64::from_le_bytes(w) | self.head_fold == self.head
        } else {
            let (mut head, mut tail) = ([0u8; 8], [0u8; 8]);
            b.read(at, &mut head)
                && b.read(at + N - 8, &mut tail)
                && u64::from_le_bytes(head) | self.head_fold == self.head
                && u64::from_le_bytes(tail) | self.tail_fold == self.tail
        }
    }
}

/// The start of a response.
const RESPONSE: Literal<8> = Literal::new(b"sip/2.0 ");
/// The end of a request line.
const VERSION: Literal<8> = Literal::new(b" sip/2.0");
/// The retransmission marker.
const MARKER: Literal<13> = Literal::new(b";x-retransmit");
/// The top Via's branch parameter.
const BRANCH: Literal<8> = Literal::new(b";branch=");
/// A tag parameter.
const TAG: Literal<5> = Literal::new(b";tag=");

/// Bit 7 of each byte of the result is set where that byte of `w` is a space or a tab.
#[inline(always)]
const fn blanks(w: u64) -> u64 {
    zero_bytes(w ^ splat(b' ')) | zero_bytes(w ^ splat(b'\t'))
}

/// The index of the first byte flagged in `mask` (a [`zero_bytes`]-style mask), or 8 when none
/// is.
#[inline(always)]
const fn first_or_8(mask: u64) -> usize {
    if mask == 0 { 8 } else { first_flagged(mask) }
}

/// Past the spaces and tabs at `at`, at most four and not past `end`: where a value starts.
#[inline(always)]
fn skip_blanks<B: PacketBytes>(b: &B, at: usize, end: usize) -> usize {
    if at >= end {
        return at;
    }
    let mut n = first_or_8(!blanks(bytes_at(b, at)) & splat(0x80));
    if n > 4 {
        n = 4;
    }
    if n > end - at {
        n = end - at;
    }
    at + n
}

/// A header the parser reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Header {
    /// Via (`v`).
    Via,
    /// CSeq.
    CSeq,
    /// Call-ID (`i`).
    CallId,
    /// To (`t`).
    To,
    /// From (`f`).
    From,
}

/// A header name followed at once by its colon, as the first bytes of a line: a word read
/// there starts with it when `(word | fold) & mask == value` (`fold` lowercases its letters,
/// and only them: a letter ORed with 0x20 is its lowercase form, and no other byte becomes one).
#[derive(Clone, Copy)]
struct NamePattern {
    value: u64,
    mask: u64,
    fold: u64,
    /// Offset of the colon.
    colon: u8,
    header: Header,
}

/// `text` (a lowercase name and its colon, at most 8 bytes) as a [`NamePattern`].
const fn name_pattern(text: &[u8], header: Header) -> NamePattern {
    let (value, mask) = word_prefix(text);
    let (_, fold) = folded(text, 0, text.len());
    NamePattern {
        value,
        mask,
        fold,
        colon: (text.len() - 1) as u8,
        header,
    }
}

/// The names the parser reads, each followed at once by its colon, the most frequent first.
const NAMES: [NamePattern; 9] = [
    name_pattern(b"via:", Header::Via),
    name_pattern(b"from:", Header::From),
    name_pattern(b"to:", Header::To),
    name_pattern(b"call-id:", Header::CallId),
    name_pattern(b"cseq:", Header::CSeq),
    name_pattern(b"v:", Header::Via),
    name_pattern(b"f:", Header::From),
    name_pattern(b"t:", Header::To),
    name_pattern(b"i:", Header::CallId),
];

/// Whether a line starting with `first` and `second` may be a header the parser reads: one of
/// its names, then (after spaces) a colon. Any other line is skipped at once.
#[inline(always)]
const fn may_name(first: u8, second: u8) -> bool {
    let compact = matches!(second, b' ' | b'\t' | b':');
    match first | 0x20 {
        b'v' => compact || second | 0x20 == b'i',
        b'c' => matches!(second | 0x20, b'a' | b's'),
        b'i' => compact,
        b't' => compact || second | 0x20 == b'o',
        b'f' => compact || second | 0x20 == b'r',
        _ => false,
    }
}

impl SipState {
    /// One step over the message held in `b` at `[0, len)`. Returns `true` when parsing is over.
    #[inline(always)]
    pub fn step<B: PacketBytes>(&mut self, b: &B, len: usize) -> bool {
        self.step_in(self.phase(), b, len)
    }

    /// What the next step does.
    #[inline(always)]
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase)
    }

    /// One step, which must be of `phase` (`self.phase()`, read before): the datapath runs each
    /// phase's step in a function of its own, so that the verifier checks each once.
    #[inline(always)]
    pub fn step_in<B: PacketBytes>(&mut self, phase: Phase, b: &B, len: usize) -> bool {
        let end = if len < MAX_SCAN { len } else { MAX_SCAN };
        match phase {
            Phase::Done => return true,
            Phase::FindEol => {
                // Lines the parser skips, and lines longer than one scan, take one step each;
                // two such steps run here back to back.
                self.find_eol(b, end);
                if self.phase == Phase::FindEol as u8 {
                    // Through the barrier the second scan reads its position from memory: in
                    // eBPF, where the first could stop does not multiply the second's paths.
                    core::hint::black_box(&mut *self).find_eol(b, end);
                }
            }
            Phase::Dispatch => self.dispatch(b),
            Phase::Semi => self.semi(b),
            Phase::ViaProtocol => self.via_protocol(b),
            Phase::Hash => {
                // Up to two words of the value.
                let end = self.scan_end as usize;
                if self.hash_token(b, end) || self.hash_token(b, end) {
                    self.hashed();
                }
            }
            Phase::ViaComma => self.via_comma(b),
            Phase::CSeqNumber => self.cseq_number(b),
        }
        self.phase == Phase::Done as u8
    }

    /// Starts hashing the value at `pos`, up to `end`, into `target`.
    #[inline(always)]
    fn hash_value(&mut self, target: u8, end: usize) {
        self.hash = FNV_OFFSET;
        self.token_len = 0;
        self.target = target;
        self.scan_end = end as u32;
        self.phase = Phase::Hash as u8;
    }

    /// A value is hashed: record it where it belongs (unless too long to hash whole: absent).
    #[inline(always)]
    fn hashed(&mut self) {
        let ok = self.token_len > 0 && self.token_len != TOO_LONG;
        let h = self.hash;
        match self.target {
            TARGET_SENT_BY => {
                if self.token_len == TOO_LONG {
                    // No sent-by to key on: no branch either.
                    return self.next_line();
                }
                self.info.sent_by_hash = h;
                self.phase = Phase::ViaComma as u8;
                return;
            }
            TARGET_BRANCH if ok => {
                self.info.branch_hash = h;
                self.info.have |= HAVE_BRANCH;
            }
            TARGET_CSEQ_METHOD if ok => {
                self.info.cseq_method_hash = h;
                self.info.have |= HAVE_CSEQ;
            }
            TARGET_CALL_ID if ok => {
                self.info.call_id_hash = h;
                self.info.have |= HAVE_CALL_ID;
            }
            TARGET_TO_TAG if ok => {
                self.info.to_tag_hash = h;
                self.info.have |= HAVE_TO_TAG;
            }
            TARGET_FROM_TAG if ok => {
                self.info.from_tag_hash = h;
                self.info.have |= HAVE_FROM_TAG;
            }
            _ => {}
        }
        self.next_line();
    }

    #[inline(always)]
    fn stop(&mut self, kind: MessageKind) {
        self.info.kind = kind as u8;
        self.phase = Phase::Done as u8;
    }

    #[inline(always)]
    fn next_line(&mut self) {
        self.pos = self.line_next;
        self.line_start = self.line_next;
        self.phase = Phase::FindEol as u8;
    }

    /// Scans up to 64 bytes, a word at a time, for the line's LF.
    #[inline(always)]
    fn find_eol<B: PacketBytes>(&mut self, b: &B, end: usize) {
        let start = self.line_start as usize;
        if start >= end || self.lines as usize >= MAX_LINES {
            // Out of bytes or lines before the blank line: what was read stands.
            if self.info.kind() == MessageKind::Pending {
                return self.stop(MessageKind::Malformed);
            }
            self.phase = Phase::Done as u8;
            return;
        }
        // A line is at most MAX_LINE bytes before its LF: the search ends one byte past that.
        let limit = if end < start + MAX_LINE + 1 {
            end
        } else {
            start + MAX_LINE + 1
        };
        let eol = match find_byte(b, self.pos as usize, limit, b'\n') {
            Ok(at) => at,
            Err(next) if next < limit => {
                self.pos = next as u32;
                return;
            }
            // No LF within the longest line: malformed.
            Err(_) if limit < end => return self.stop(MessageKind::Malformed),
            // The last line, without LF.
            Err(_) => end,
        };
        if eol - start > MAX_LINE {
            return self.stop(MessageKind::Malformed);
        }
        let content_end = if eol > start && byte(b, eol - 1) == b'\r' {
            eol - 1
        } else {
            eol
        };
        self.line_end = content_end as u32;
        self.line_next = (eol + 1) as u32;
        self.lines += 1;
        // A header line that cannot be one the parser reads is skipped here, by its first two
        // bytes, without a step of its own.
        let mut first = [0u8; 2];
        let _ = b.read(start, &mut first);
        if self.lines > 1 && content_end > start && !may_name(first[0], first[1]) {
            return self.next_line();
        }
        self.phase = Phase::Dispatch as u8;
    }

    /// Looks at a whole line: the start line, the blank line, or a header that may be one the
    /// parser reads ([`Self::find_eol`] skips the others). A header name written as nearly all
    /// are, followed at once by its colon, is recognised by one word read ([`NAMES`]); only what
    /// is left (a name with spaces before its colon, or one that merely starts like a known
    /// name, or a line too near the end for the word) has its colon searched and its name
    /// compared.
    #[inline(always)]
    fn dispatch<B: PacketBytes>(&mut self, b: &B) {
        let (start, end) = (self.line_start as usize, self.line_end as usize);
        if self.lines == 1 {
            return self.start_line(b, start, end);
        }
        if end == start {
            // The blank line: headers are over.
            self.phase = Phase::Done as u8;
            return;
        }
        // The line's first eight bytes (all zero unless the message has eight from here: then
        // no name is recognised, on either path).
        let mut head = [0u8; 8];
        let _ = b.read(start, &mut head);
        let w = u64::from_le_bytes(head);
        for name in NAMES {
            if (w | name.fold) & name.mask == name.value && start + (name.colon as usize) < end {
                return self.header(b, name.header, name.colon as usize);
            }
        }
        // The colon within the name's first 16 bytes.
        let name_end = if end < start + MAX_NAME {
            end
        } else {
            start + MAX_NAME
        };
        let colon = match find_byte(b, start, name_end, b':') {
            Ok(at) => at - start,
            Err(_) => MAX_NAME,
        };
        if colon == MAX_NAME || head[0] == b' ' || head[0] == b'\t' {
            // No name (a folded continuation, or a name too long for us): skip the line.
            return self.next_line();
        }
        // The name without trailing spaces.
        let mut name_len = colon;
        for _ in 0..4 {
            if name_len > 0 && matches!(byte(b, start + name_len - 1), b' ' | b'\t') {
                name_len -= 1;
            }
        }
        let name_is = |word: &[u8]| {
            name_len == word.len() && {
                let mut same = true;
                for (i, w) in word.iter().enumerate() {
                    same &= lower(head[i]) == *w;
                }
                same
            }
        };
        let header = if name_is(b"via") || name_is(b"v") {
            Header::Via
        } else if name_is(b"cseq") {
            Header::CSeq
        } else if name_is(b"call-id") || name_is(b"i") {
            Header::CallId
        } else if name_is(b"to") || name_is(b"t") {
            Header::To
        } else if name_is(b"from") || name_is(b"f") {
            Header::From
        } else {
            return self.next_line();
        };
        self.header(b, header, colon);
    }

    /// Starts on the value of a header the parser reads, whose colon is `colon` bytes into the
    /// line (a Via only when it is the top one).
    #[inline(always)]
    fn header<B: PacketBytes>(&mut self, b: &B, header: Header, colon: usize) {
        let start = self.line_start as usize;
        let end = self.line_end as usize;
        let phase = match header {
            Header::Via if self.info.have & HAVE_VIA == 0 => {
                self.info.have |= HAVE_VIA;
                self.via_end = end as u32;
                Phase::ViaProtocol
            }
            Header::Via => return self.next_line(),
            Header::CSeq => Phase::CSeqNumber,
            Header::CallId => {
                self.target = TARGET_CALL_ID;
                self.scan_end = end as u32;
                Phase::Hash
            }
            Header::To => {
                self.want = WANT_TAG;
                self.scan_end = end as u32;
                Phase::Semi
            }
            Header::From => {
                self.want = WANT_FROM_TAG;
                self.scan_end = end as u32;
                Phase::Semi
            }
        };
        // The value: after the colon and its spaces (a few; more are caught by the scans).
        self.pos = skip_blanks(b, start + colon + 1, end) as u32;
        self.hash = FNV_OFFSET;
        self.token_len = 0;
        self.phase = phase as u8;
    }

    #[inline(always)]
    fn start_line<B: PacketBytes>(&mut self, b: &B, start: usize, end: usize) {
        if RESPONSE.at(b, start, end) {
            // A response: its Via and CSeq (copied from the request) name the transaction it
            // answers, so the headers are read too; its status says whether it makes a dialog.
            self.info.kind = MessageKind::Response as u8;
            let mut code = [0u8; 3];
            if start + 11 <= end
                && b.read(start + 8, &mut code)
                && code.iter().all(u8::is_ascii_digit)
            {
                self.info.status = code.iter().fold(0u16, |n, d| n * 10 + u16::from(d - b'0'));
            }
            return self.next_line();
        }
        // METHOD SP Request-URI SP SIP/2.0; methods are case-sensitive (RFC 3261 §7.1). The
        // first nine bytes (all zero unless the message has nine from here), compared as a
        // word and a byte: byte strings compiled to calls of a byte-at-a-time memcmp.
        let (mut head, mut ninth) = ([0u8; 8], [0u8; 1]);
        if !(b.read(start, &mut head) && b.read(start + 8, &mut ninth)) {
            (head, ninth) = ([0; 8], [0]);
        }
        let (w, ninth) = (u64::from_le_bytes(head), ninth[0]);
        let is = |name: &[u8]| {
            let (value, mask) = word_prefix(name);
            w & mask == value
        };
        let method = if is(b"INVITE ") {
            Method::Invite
        } else if is(b"ACK ") {
            Method::Ack
        } else if is(b"BYE ") {
            Method::Bye
        } else if is(b"CANCEL ") {
            Method::Cancel
        } else if is(b"REGISTER") && ninth == b' ' {
            Method::Register
        } else if is(b"OPTIONS ") {
            Method::Options
        } else {
            Method::Other
        };
        // The line must end in " SIP/2.0".
        if end < start + 8 + 2 || !VERSION.at(b, end - 8, end) {
            return self.stop(MessageKind::Malformed);
        }
        self.info.kind = MessageKind::Request as u8;
        self.info.method = method as u8;
        // The marker is searched before " SIP/2.0".
        self.pos = start as u32;
        self.want = WANT_MARKER;
        self.scan_end = (end - 8) as u32;
        self.phase = Phase::Semi as u8;
    }

    /// Scans up to 64 bytes, a word at a time, for the next `;` before `scan_end`, and looks at
    /// what follows it.
    #[inline(always)]
    fn semi<B: PacketBytes>(&mut self, b: &B) {
        let end = self.scan_end as usize;
        match find_byte(b, self.pos as usize, end, b';') {
            Ok(at) => {
                self.pos = at as u32;
                self.confirm(b);
            }
            Err(next) if next < end => self.pos = next as u32,
            // Not there.
            Err(_) => self.next_line(),
        }
    }

    /// Whether the `;` at `pos` starts the needle: one fixed-size read. If not, the search goes
    /// on from the next byte in the next step.
    #[inline(always)]
    fn confirm<B: PacketBytes>(&mut self, b: &B) {
        let at = self.pos as usize;
        let end = self.scan_end as usize;
        let found = match self.want {
            WANT_MARKER => MARKER.at(b, at, end),
            WANT_BRANCH => BRANCH.at(b, at, end),
            _ => TAG.at(b, at, end),
        };
        if !found {
            self.pos += 1;
            self.phase = Phase::Semi as u8;
            return;
        }
        match self.want {
            WANT_MARKER => {
                self.info.marker = 1;
                self.next_line();
            }
            WANT_BRANCH => {
                self.pos += 8;
                self.hash_value(TARGET_BRANCH, self.via_end as usize);
            }
            WANT_TAG => {
                self.info.in_dialog = 1;
                self.pos += 5;
                self.hash_value(TARGET_TO_TAG, end);
            }
            _ => {
                self.pos += 5;
                self.hash_value(TARGET_FROM_TAG, end);
            }
        }
    }

    /// Skips the Via's protocol up to its space; notes where the top Via value ends (its first
    /// comma) as it goes.
    #[inline(always)]
    fn via_protocol<B: PacketBytes>(&mut self, b: &B) {
        let from = self.pos as usize;
        let end = self.via_end as usize;
        let left = end.saturating_sub(from);
        let blank = first_or_8(blanks(bytes_at(b, from)));
        if blank < CHUNK && blank < left {
            // Past the spaces, the sent-by.
            self.pos = skip_blanks(b, from + blank + 1, end) as u32;
            return self.hash_value(TARGET_SENT_BY, end);
        }
        if left < CHUNK {
            // No sent-by.
            return self.next_line();
        }
        self.pos = (from + CHUNK) as u32;
    }

    /// Finds where the top Via value ends: its first comma within [`CHUNK`] bytes, or the line's
    /// end.
    #[inline(always)]
    fn via_comma<B: PacketBytes>(&mut self, b: &B) {
        let from = self.pos as usize;
        let end = self.via_end as usize;
        let left = end.saturating_sub(from);
        let comma = first_or_8(zero_bytes(bytes_at(b, from) ^ splat(b',')));
        if comma < CHUNK && comma < left {
            self.via_end = (from + comma) as u32;
        }
        // (No comma within a chunk of the sent-by: the value is taken to run to the line's end.)
        self.want = WANT_BRANCH;
        self.scan_end = self.via_end;
        self.phase = Phase::Semi as u8;
    }

    /// Hashes a token from `pos` up to its end (or `end`), up to [`HASH_CHUNK`] bytes a step,
    /// looked at as one word: where the token ends in it is found for all eight bytes at once.
    /// Returns `true` when the token is complete, or longer than [`MAX_VALUE`] (`token_len` is
    /// then [`TOO_LONG`]).
    #[inline(always)]
    fn hash_token<B: PacketBytes>(&mut self, b: &B, end: usize) -> bool {
        let from = self.pos as usize;
        let w = bytes_at(b, from);
        // The first byte that ends the token (a Via parameter, a sent-by, a CSeq method, a
        // Call-ID, a tag): `;`, `,`, a space, a tab or CR, or `end` (bytes from there on, which
        // may lie past the packet, are never hashed).
        let enders = blanks(w)
            | zero_bytes(w ^ splat(b';'))
            | zero_bytes(w ^ splat(b','))
            | zero_bytes(w ^ splat(b'\r'));
        let mut stop = if enders == 0 {
            HASH_CHUNK
        } else {
            first_flagged(enders)
        };
        if from >= end {
            stop = 0;
        } else if end - from < stop {
            stop = end - from;
        }
        // Bytes the token may still take before it is too long (more than zero while hashing).
        let room = MAX_VALUE - self.token_len as usize;
        if room < stop && room < HASH_CHUNK {
            // Too long to hash whole: the value counts as absent.
            self.token_len = TOO_LONG;
            self.pos = (from + room) as u32;
            return true;
        }
        let mut h = self.hash;
        for i in 0..HASH_CHUNK {
            if i < stop {
                h ^= (w >> (8 * i)) & 0xff;
                h = h.wrapping_mul(FNV_PRIME);
            }
        }
        self.hash = h;
        if stop < HASH_CHUNK {
            self.token_len += stop as u8;
            self.pos = (from + stop) as u32;
            return true;
        }
        self.token_len += HASH_CHUNK as u8;
        self.pos = (from + HASH_CHUNK) as u32;
        false
    }

    /// `CSeq: 314159 INVITE`: the number, then on to the method.
    #[inline(always)]
    fn cseq_number<B: PacketBytes>(&mut self, b: &B) {
        let from = self.pos as usize;
        let end = self.line_end as usize;
        let mut n: u32 = 0;
        let mut at = from;
        for _ in 0..10 {
            let c = byte(b, at);
            if at >= end || !c.is_ascii_digit() {
                break;
            }
            n = n.wrapping_mul(10).wrapping_add(u32::from(c - b'0'));
            at += 1;
        }
        if at == from {
            return self.next_line();
        }
        self.info.cseq = n;
        self.pos = skip_blanks(b, at, end) as u32;
        self.hash_value(TARGET_CSEQ_METHOD, end);
    }
}

/// Parses a whole message held in `b` at `[0, len)` (userspace convenience; the datapath drives
/// [`SipState::step`] itself).
pub fn parse_sip<B: PacketBytes>(b: &B, len: usize) -> SipInfo {
    let mut st = SipState::default();
    for _ in 0..MAX_STEPS {
        if st.step(b, len) {
            break;
        }
    }
    st.finish()
}

impl SipState {
    /// The result once the steps are done: a message whose start line was never read (empty, or
    /// out of steps) is malformed.
    pub fn finish(&self) -> SipInfo {
        let mut info = self.info;
        if info.kind() == MessageKind::Pending {
            info.kind = MessageKind::Malformed as u8;
        }
        info
    }
}

#[cfg(test)]
mod tests;
