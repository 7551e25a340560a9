//! A resumable TLS ClientHello parser: new session, or which resumption it offers.
//!
//! The hello is parsed field by field by a small state machine whose whole state is a `Copy`
//! struct ([`HelloState`]). It reads only through [`PacketBytes`], consumes one segment at a time,
//! and can stop at any byte and resume with the next in-order TCP segment. Post-quantum key shares
//! make hellos of 1.5 to 1.8 KB, so the pre_shared_key extension usually sits in the second
//! segment. Each [`HelloState::step`] either completes a field (and skips the run of bytes it
//! announces, an extension's data after its header) or uses up the segment, and a
//! hello may complete at most [`MAX_FIELDS`] fields, whatever the segments it comes in: the
//! budget belongs to the hello, so where the stream is cut never changes the verdict. A window
//! therefore needs at most [`MAX_STEPS`] steps.
//!
//! A reader looks at most [`WINDOW`] bytes into what it is given (the eBPF program copies that
//! much into scratch memory at a time), so a longer segment is read as consecutive windows (see
//! [`Segment::window`]): a hello in one segment of 4 KB and the same hello in two segments of 2
//! KB get the same verdict. A hello longer than [`MAX_HELLO`] bytes is malformed, however it is
//! cut, which bounds the windows one segment can need ([`MAX_WINDOWS`]).
//!
//! What counts as an offer:
//! - TLS 1.3 (supported_versions lists 0x0304): only the pre_shared_key extension (41), which must
//!   be the last extension. The legacy session id is random padding in middlebox-compatibility
//!   mode and is ignored.
//! - TLS 1.2 and earlier: a non-empty session_ticket extension (35), else a non-empty session id.
//!
//! The key of an offer is a 128-bit digest of the whole offered value ([`offer_digest`]): a
//! session id, ticket or PSK identity must match all of what the server issued, not a prefix of
//! it (a TLS 1.2 session id travels in clear, so a prefix is public). A ticket's or PSK
//! identity's last 16 bytes are its clear tail ([`tag`]), kept apart and left out of its key:
//! they hold the tag any node sharing the ticket secret checks. Values longer than
//! [`MAX_OFFER`] bytes make the hello malformed. Anything that is not a well-formed
//! ClientHello, including an SSLv2 hello, a hello split over several TLS records, a length that
//! lies, an extension walk past the end or a pre_shared_key that is not last, is
//! [`Verdict::Malformed`]. That is never a resumption.

use crate::bytes::{MAX_READ_OFFSET, PacketBytes, SliceBytes};

pub mod server;
pub mod tag;

use tag::TAIL_LEN;

/// Bytes of an offer's key (the digest of the whole offered value).
pub const KEY_LEN: usize = 16;
/// Longest session id, ticket or PSK identity digested; a longer one makes the hello malformed.
pub const MAX_OFFER: u32 = 1024;
/// Bytes of a segment a reader is given at once: one window.
pub const WINDOW: u32 = MAX_READ_OFFSET as u32;
/// Longest ClientHello followed (stream bytes, record header included); a longer one is
/// malformed. A post-quantum hello with a PSK is about 1.8 KB.
pub const MAX_HELLO: u32 = 8192;
/// Windows one segment can need before the hello is decided or over [`MAX_HELLO`]: a segment
/// starting anywhere in the hello covers at most this many windows of it.
pub const MAX_WINDOWS: u32 = MAX_HELLO / WINDOW + 1;
/// Fields one hello may complete; a hello that needs more is malformed.
pub const MAX_FIELDS: u8 = 160;
/// Steps that one window can take: every field of the budget, the digest steps of an offered value
/// (16 bytes each), the step that uses the window up (part of a field), and the one that finds
/// it used up.
pub const MAX_STEPS: usize = MAX_FIELDS as usize + (MAX_OFFER as usize).div_ceil(DIGEST_STEP) + 4;
/// Bytes one digest step takes at most.
const DIGEST_STEP: usize = 16;
/// supported_versions entries followed; a longer list makes the hello malformed (real clients
/// send a handful), so TLS 1.3 can never hide past the entries examined.
pub const MAX_VERSIONS: u8 = 16;

const TLS13: u16 = 0x0304;
const EXT_SESSION_TICKET: u16 = 35;
const EXT_PRE_SHARED_KEY: u16 = 41;
const EXT_SUPPORTED_VERSIONS: u16 = 43;

const FLAG_TICKET: u8 = 1 << 0;
const FLAG_PSK: u8 = 1 << 1;
const FLAG_TLS13: u8 = 1 << 2;

/// The parser's verdict.
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Verdict {
    /// More bytes are needed.
    #[default]
    Pending = 0,
    /// A complete ClientHello without a resumption offer.
    New = 1,
    /// A complete ClientHello offering resumption: see [`HelloState::offer`].
    Offer = 2,
    /// Not a well-formed ClientHello.
    Malformed = 3,
}

/// The resumption a hello offers, and what a server issued for it (the `kind` of an
/// `IssuedValue`): the one vocabulary of issued kinds for the datapath, the daemon and the CLI.
#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Offer {
    /// None.
    #[default]
    None = 0,
    /// TLS 1.2 session id resumption (or a stateful TLS 1.3 PSK identity from a session cache).
    SessionId = 1,
    /// TLS 1.2 session ticket (RFC 5077), or a ticket sent as a TLS 1.3 PSK identity.
    Ticket = 2,
    /// TLS 1.3 pre-shared key.
    Psk = 3,
}

impl Offer {
    /// Every kind a server can issue.
    pub const ISSUED: [Offer; 3] = [Offer::SessionId, Offer::Ticket, Offer::Psk];

    /// The offer of id `id` (`Offer as u32`); `None` for an unknown id.
    pub const fn from_id(id: u32) -> Offer {
        match id {
            1 => Offer::SessionId,
            2 => Offer::Ticket,
            3 => Offer::Psk,
            _ => Offer::None,
        }
    }

    /// Its name, as the CLI and JSON spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Offer::None => "none",
            Offer::SessionId => "session-id",
            Offer::Ticket => "ticket",
            Offer::Psk => "psk",
        }
    }
}

#[repr(u8)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Step {
    #[default]
    Record = 0,
    Handshake,
    Version,
    Random,
    SidLen,
    Sid,
    CipherSuitesLen,
    CipherSuites,
    CompressionLen,
    Compression,
    ExtensionsLen,
    ExtHeader,
    ExtSkip,
    Ticket,
    VersionsLen,
    VersionEntry,
    PskHead,
    PskIdentity,
    PskRest,
}

impl Step {
    const fn from_u8(v: u8) -> Step {
        match v {
            0 => Step::Record,
            1 => Step::Handshake,
            2 => Step::Version,
            3 => Step::Random,
            4 => Step::SidLen,
            5 => Step::Sid,
            6 => Step::CipherSuitesLen,
            7 => Step::CipherSuites,
            8 => Step::CompressionLen,
            9 => Step::Compression,
            10 => Step::ExtensionsLen,
            11 => Step::ExtHeader,
            12 => Step::ExtSkip,
            13 => Step::Ticket,
            14 => Step::VersionsLen,
            15 => Step::VersionEntry,
            16 => Step::PskHead,
            17 => Step::PskIdentity,
            _ => Step::PskRest,
        }
    }

    /// Whether the step skips `need` bytes (rather than reading them).
    const fn skips(self) -> bool {
        matches!(
            self,
            Step::Random | Step::CipherSuites | Step::Compression | Step::ExtSkip | Step::PskRest
        )
    }

    /// Whether the step digests `need` bytes: the whole of an offered value.
    const fn digests(self) -> bool {
        matches!(self, Step::Sid | Step::Ticket | Step::PskIdentity)
    }
}

/// Where a TCP segment's payload (or one window of it) is, in the reader and in the TLS stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Offset of the payload in the reader.
    pub offset: usize,
    /// Payload length.
    pub len: u32,
    /// Offset of the payload's first byte in the stream (0 for the segment that starts the hello).
    pub stream_offset: u32,
}

impl Segment {
    /// Window `w` of this segment as a segment of its own, its bytes at offset 0 of a reader
    /// holding just them (`None` past the end or past [`MAX_WINDOWS`]).
    #[inline(always)]
    pub const fn window(&self, w: u32) -> Option<Segment> {
        let start = w * WINDOW;
        if w >= MAX_WINDOWS || start >= self.len {
            return None;
        }
        let left = self.len - start;
        Some(Segment {
            offset: 0,
            len: if left < WINDOW { left } else { WINDOW },
            stream_offset: self.stream_offset.wrapping_add(start),
        })
    }
}

/// The parser's whole state: kept per flow between segments. `#[repr(C)]`, no implicit padding.
/// Start from [`HelloState::new`] (or `default()`), which expects the record header.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HelloState {
    /// Stream bytes consumed so far. For a malformed hello, where parsing stopped.
    pub consumed: u32,
    /// Stream offset where the handshake message ends.
    pub hs_end: u32,
    /// Bytes left in the current field (read) or run of bytes (skip).
    pub need: u32,
    /// Bytes of the extension block after the current extension.
    pub ext_left: u32,
    /// Data length of the current extension.
    pub ext_len: u16,
    /// Current step.
    step: u8,
    /// Bytes of the current field read so far.
    acc_len: u8,
    /// A [`Verdict`].
    pub verdict: u8,
    /// An [`Offer`], once the verdict is `Offer`.
    pub offer: u8,
    /// `FLAG_*` bits.
    flags: u8,
    /// Length of the legacy session id.
    pub sid_len: u8,
    /// Length of the ticket or PSK identity seen.
    ext_key_len: u16,
    /// supported_versions entries left / examined.
    versions_left: u8,
    versions_seen: u8,
    /// Fields completed so far (at most [`MAX_FIELDS`]).
    fields: u8,
    /// Padding.
    pad: [u8; 3],
    /// The current field's bytes.
    acc: [u8; KEY_LEN],
    /// The session id's digest; once a ticket or a PSK identity is read, its [`tag::Tail`]
    /// instead (the session id is then no offer: a ticket comes first in TLS 1.2, and TLS 1.3
    /// ignores the session id).
    sid_key: [u8; KEY_LEN],
    /// The ticket's or the PSK identity's key ([`tag::ticket_key`]: the digest of all of it but
    /// its tail).
    ext_key: [u8; KEY_LEN],
    /// The digest of the value being read ([`offer_digest`]).
    digest: [u64; 2],
}

/// TLS record header length.
const RECORD_HEADER: u32 = 5;

impl Default for HelloState {
    fn default() -> Self {
        Self::new()
    }
}

impl HelloState {
    /// The state before the first byte: expecting the record header.
    pub const fn new() -> Self {
        HelloState {
            consumed: 0,
            hs_end: 0,
            need: RECORD_HEADER,
            ext_left: 0,
            ext_len: 0,
            step: Step::Record as u8,
            acc_len: 0,
            verdict: Verdict::Pending as u8,
            offer: Offer::None as u8,
            flags: 0,
            sid_len: 0,
            ext_key_len: 0,
            versions_left: 0,
            versions_seen: 0,
            fields: 0,
            pad: [0; 3],
            acc: [0; KEY_LEN],
            sid_key: [0; KEY_LEN],
            ext_key: [0; KEY_LEN],
            digest: [0; 2],
        }
    }

    /// Makes an all-zero state the one [`HelloState::new`] returns: for a driver that clears
    /// the state with word stores (the eBPF program, where a struct assignment costs a
    /// byte-at-a-time copy).
    #[inline(always)]
    pub fn start_zeroed(&mut self) {
        self.need = RECORD_HEADER;
    }

    /// The verdict so far.
    pub const fn verdict(&self) -> Verdict {
        match self.verdict {
            1 => Verdict::New,
            2 => Verdict::Offer,
            3 => Verdict::Malformed,
            _ => Verdict::Pending,
        }
    }

    /// The resumption offered, for [`Verdict::Offer`].
    pub const fn offer(&self) -> Offer {
        Offer::from_id(self.offer as u32)
    }

    /// Whether the hello announced TLS 1.3.
    pub const fn tls13(&self) -> bool {
        self.flags & FLAG_TLS13 != 0
    }

    /// The key of the offer: the digest of the whole offered value. `None` when there is no offer
    /// or the offered value is shorter than [`KEY_LEN`] (too short to be one a server issued).
    pub fn offer_key(&self) -> Option<[u8; KEY_LEN]> {
        self.offer_key_ref().copied()
    }

    /// [`HelloState::offer_key`] where the state holds it (no copy: the datapath's copies of 16
    /// bytes cost a byte-at-a-time loop).
    #[inline(always)]
    pub fn offer_key_ref(&self) -> Option<&[u8; KEY_LEN]> {
        match self.offer() {
            Offer::SessionId if self.sid_len as usize >= KEY_LEN => Some(&self.sid_key),
            Offer::Ticket | Offer::Psk if self.ext_key_len as usize >= tag::MIN_TICKET => {
                Some(&self.ext_key)
            }
            _ => None,
        }
    }

    /// The clear tail of the offered ticket or PSK identity, for a `Verdict::Offer` of one whose
    /// key is [`HelloState::offer_key_ref`]'s: where its tag ([`tag`]) is.
    #[inline(always)]
    pub fn ticket_tail(&self) -> Option<&[u8; tag::TAIL_LEN]> {
        match self.offer() {
            Offer::Ticket | Offer::Psk if self.ext_key_len as usize >= tag::MIN_TICKET => {
                Some(&self.sid_key)
            }
            _ => None,
        }
    }

    /// Where the offered TLS 1.3 PSK identity is in the stream, for a complete hello whose offer
    /// is one (a key [`HelloState::offer_key_ref`] gives): its first byte's stream offset and its
    /// length. The pre_shared_key extension ends the hello, and its identity is its first
    /// field's first entry: `hs_end - ext_len + 4`. `None` for any other offer (a TLS 1.2
    /// ticket's place is not kept).
    #[inline(always)]
    pub fn ticket_span(&self) -> Option<(u32, u32)> {
        if self.verdict != Verdict::Offer as u8
            || self.flags & FLAG_PSK == 0
            || (self.ext_key_len as usize) < tag::MIN_TICKET
        {
            return None;
        }
        let ext_start = self.hs_end.checked_sub(u32::from(self.ext_len))?;
        Some((ext_start + 4, u32::from(self.ext_key_len)))
    }

    /// Feeds one segment's payload, whose first byte is at `stream_offset` in the stream, window
    /// by window (userspace; the eBPF program drives the same steps itself). Returns the verdict
    /// so far. A segment that does not start exactly where the previous one ended makes the hello
    /// malformed.
    pub fn feed(&mut self, payload: &[u8], stream_offset: u32) -> Verdict {
        let seg = Segment {
            offset: 0,
            len: payload.len() as u32,
            stream_offset,
        };
        self.begin_segment(&seg);
        for w in 0..MAX_WINDOWS {
            let Some(win) = seg.window(w) else {
                break;
            };
            let start = (w * WINDOW) as usize;
            let bytes = SliceBytes(&payload[start..start + win.len as usize]);
            for _ in 0..MAX_STEPS {
                if self.step(&bytes, &win) {
                    break;
                }
            }
        }
        self.end_segment(&seg)
    }

    /// Before the steps of a segment: a segment that does not start where the previous one ended
    /// makes the hello malformed. (Drivers that run the steps themselves, like the eBPF program
    /// with `bpf_loop`, call this, the steps, then [`HelloState::end_segment`].)
    #[inline(always)]
    pub fn begin_segment(&mut self, seg: &Segment) {
        if self.verdict() == Verdict::Pending && seg.stream_offset != self.consumed {
            self.malformed();
        }
    }

    /// After the steps of a segment: a hello still pending with bytes of the segment left ran out
    /// of steps (too many fields to follow) and is malformed. Returns the verdict.
    #[inline(always)]
    pub fn end_segment(&mut self, seg: &Segment) -> Verdict {
        if self.verdict() == Verdict::Pending
            && self.consumed < seg.stream_offset.saturating_add(seg.len)
        {
            self.malformed();
        }
        self.verdict()
    }

    /// One step: consumes bytes of `seg` for the current field. Returns `true` when nothing more
    /// can be done with this segment (a verdict was reached, or the segment is used up).
    #[inline(always)]
    pub fn step<B: PacketBytes>(&mut self, b: &B, seg: &Segment) -> bool {
        if self.verdict != Verdict::Pending as u8 {
            return true;
        }
        if self.fields >= MAX_FIELDS {
            self.malformed();
            return true;
        }
        let seg_end = seg.stream_offset.saturating_add(seg.len);
        if self.consumed < seg.stream_offset || self.consumed >= seg_end {
            return true;
        }
        let avail = seg_end - self.consumed;
        let step = Step::from_u8(self.step);
        if step.skips() {
            self.skip(step, avail);
            return false;
        }
        let at = seg.offset + (self.consumed - seg.stream_offset) as usize;
        if step.digests() {
            // Up to DIGEST_STEP bytes of the offered value into its digest; a ticket's or PSK
            // identity's last TAIL_LEN bytes into its tail instead (`tag`).
            let n = if self.need < avail { self.need } else { avail };
            let tail_from = if matches!(step, Step::Sid) {
                0
            } else {
                TAIL_LEN as u32
            };
            let need = self.need;
            let (digest, tail) = (&mut self.digest, &mut self.sid_key);
            if !each_byte::<B, DIGEST_STEP>(b, at, n, |i, byte| {
                // Bytes of the value left, this one included.
                let left = need - i as u32;
                if left <= tail_from {
                    tail[(TAIL_LEN as u32 - left) as usize & (TAIL_LEN - 1)] = byte;
                } else {
                    digest_byte(digest, byte);
                }
            }) {
                self.malformed();
                return true;
            }
            let n = if n < DIGEST_STEP as u32 {
                n
            } else {
                DIGEST_STEP as u32
            };
            self.consumed += n;
            self.need -= n;
            if self.need == 0 {
                self.fields += 1;
                self.digested(step);
            }
            return false;
        }
        // Read up to KEY_LEN bytes of the current field into `acc`.
        let want = self.need - self.acc_len as u32;
        let n = if want < avail { want } else { avail };
        let (acc, acc_len) = (&mut self.acc, self.acc_len as usize);
        if !each_byte::<B, KEY_LEN>(b, at, n, |i, byte| {
            acc[(acc_len + i) & (KEY_LEN - 1)] = byte;
        }) {
            self.malformed();
            return true;
        }
        self.acc_len += n as u8;
        self.consumed += n;
        if self.acc_len as u32 == self.need {
            self.acc_len = 0;
            self.need = 0;
            self.fields += 1;
            self.on_field(step);
            // A run of bytes to skip after the field (an extension's data after its header, the
            // cipher suites after their length) is skipped in this step, exactly as the next step
            // would skip it: a field and what it says to skip cost one step.
            let next = Step::from_u8(self.step);
            if self.verdict == Verdict::Pending as u8
                && next.skips()
                && self.fields < MAX_FIELDS
                && self.consumed < seg_end
            {
                self.skip(next, seg_end - self.consumed);
            }
        }
        false
    }

    /// Skips up to `avail` bytes of the run `step` skips; the field is complete when the run is.
    #[inline(always)]
    fn skip(&mut self, step: Step, avail: u32) {
        let n = if self.need < avail { self.need } else { avail };
        self.consumed += n;
        self.need -= n;
        if self.need == 0 {
            self.fields += 1;
            self.after_skip(step);
        }
    }

    #[inline(always)]
    fn malformed(&mut self) {
        self.verdict = Verdict::Malformed as u8;
    }

    /// Continues with `step` over `n` bytes, if they fit in the handshake message.
    #[inline(always)]
    fn expect(&mut self, step: Step, n: u32) {
        if (self.hs_end != 0 && self.consumed + n > self.hs_end) || self.consumed + n > MAX_HELLO {
            return self.malformed();
        }
        self.step = step as u8;
        self.need = n;
        if step.digests() {
            self.digest = digest_start(n);
        }
        if n == 0 {
            if step.digests() {
                self.digested(step);
            } else if step.skips() {
                self.after_skip(step);
            } else {
                self.malformed();
            }
        }
    }

    #[inline(always)]
    fn be16(&self) -> u16 {
        u16::from_be_bytes([self.acc[0], self.acc[1]])
    }

    #[inline(always)]
    fn on_field(&mut self, step: Step) {
        match step {
            Step::Record => {
                let record_len = u16::from_be_bytes([self.acc[3], self.acc[4]]) as u32;
                // Handshake record, SSL 3 / TLS major version.
                if self.acc[0] != 22 || self.acc[1] != 3 || record_len < 4 {
                    return self.malformed();
                }
                // Remember the record length until the handshake header.
                self.hs_end = 5 + record_len;
                self.expect(Step::Handshake, 4);
            }
            Step::Handshake => {
                let len = u32::from_be_bytes([0, self.acc[1], self.acc[2], self.acc[3]]);
                // A ClientHello, wholly inside this record.
                if self.acc[0] != 1 || 9 + len > self.hs_end {
                    return self.malformed();
                }
                self.hs_end = 9 + len;
                self.expect(Step::Version, 2);
            }
            Step::Version => {
                if self.acc[0] != 3 {
                    return self.malformed();
                }
                self.expect(Step::Random, 32);
            }
            Step::SidLen => {
                let len = self.acc[0];
                if len > 32 {
                    return self.malformed();
                }
                self.sid_len = len;
                if len == 0 {
                    self.expect(Step::CipherSuitesLen, 2);
                } else {
                    self.expect(Step::Sid, u32::from(len));
                }
            }
            Step::CipherSuitesLen => {
                let len = self.be16();
                if len < 2 || !len.is_multiple_of(2) {
                    return self.malformed();
                }
                self.expect(Step::CipherSuites, u32::from(len));
            }
            Step::CompressionLen => {
                if self.acc[0] == 0 {
                    return self.malformed();
                }
                self.expect(Step::Compression, u32::from(self.acc[0]));
            }
            Step::ExtensionsLen => {
                let len = u32::from(self.be16());
                if self.consumed + len != self.hs_end {
                    return self.malformed();
                }
                self.ext_left = len;
                self.next_extension();
            }
            Step::ExtHeader => {
                let kind = self.be16();
                let len = u16::from_be_bytes([self.acc[2], self.acc[3]]);
                // pre_shared_key must be the last extension.
                if self.flags & FLAG_PSK != 0 || u32::from(len) + 4 > self.ext_left {
                    return self.malformed();
                }
                self.ext_left -= 4 + u32::from(len);
                self.ext_len = len;
                match kind {
                    EXT_SESSION_TICKET if u32::from(len) > MAX_OFFER => self.malformed(),
                    EXT_SESSION_TICKET if len > 0 => {
                        self.flags |= FLAG_TICKET;
                        self.ext_key_len = len;
                        self.expect(Step::Ticket, u32::from(len));
                    }
                    EXT_SUPPORTED_VERSIONS => self.expect(Step::VersionsLen, 1),
                    EXT_PRE_SHARED_KEY => self.expect(Step::PskHead, 4),
                    _ => self.expect(Step::ExtSkip, u32::from(len)),
                }
            }
            Step::VersionsLen => {
                let list = u16::from(self.acc[0]);
                if list + 1 != self.ext_len
                    || list < 2
                    || !list.is_multiple_of(2)
                    || list / 2 > u16::from(MAX_VERSIONS)
                {
                    return self.malformed();
                }
                self.versions_left = (list / 2) as u8;
                self.versions_seen = 0;
                self.expect(Step::VersionEntry, 2);
            }
            Step::VersionEntry => {
                if self.be16() == TLS13 {
                    self.flags |= FLAG_TLS13;
                }
                self.versions_left -= 1;
                self.versions_seen += 1;
                if self.versions_left == 0 {
                    self.next_extension();
                } else {
                    self.expect(Step::VersionEntry, 2);
                }
            }
            Step::PskHead => {
                let identities = self.be16();
                let identity = u16::from_be_bytes([self.acc[2], self.acc[3]]);
                // identities <identity, ticket age(4)>..., then binders. In u32: the u16 sums
                // wrapped for lengths near 64 KiB (found by the fuzzer).
                let (identity32, identities32) = (u32::from(identity), u32::from(identities));
                if identity == 0
                    || identity32 + 6 > identities32
                    || identities32 + 2 > u32::from(self.ext_len)
                    || identity32 > MAX_OFFER
                {
                    return self.malformed();
                }
                self.ext_key_len = identity;
                self.expect(Step::PskIdentity, identity32);
            }
            // Skips finish in `after_skip`.
            _ => self.malformed(),
        }
    }

    #[inline(always)]
    fn after_skip(&mut self, step: Step) {
        match step {
            Step::Random => self.expect(Step::SidLen, 1),

            Step::CipherSuites => self.expect(Step::CompressionLen, 1),
            Step::Compression => {
                if self.consumed == self.hs_end {
                    self.finish();
                } else {
                    self.expect(Step::ExtensionsLen, 2);
                }
            }
            Step::PskRest => {
                // pre_shared_key must be the last extension.
                if self.ext_left != 0 {
                    return self.malformed();
                }
                self.finish();
            }
            _ => self.next_extension(),
        }
    }

    /// An offered value is digested whole: its key is kept, and the parse goes on.
    #[inline(always)]
    fn digested(&mut self, step: Step) {
        let key = digest_finish(&self.digest);
        match step {
            Step::Sid => {
                self.sid_key = key;
                self.expect(Step::CipherSuitesLen, 2);
            }
            Step::Ticket => {
                self.ext_key = key;
                self.next_extension();
            }
            _ => {
                self.ext_key = key;
                self.flags |= FLAG_PSK;
                self.expect(
                    Step::PskRest,
                    u32::from(self.ext_len - 4 - self.ext_key_len),
                );
            }
        }
    }

    #[inline(always)]
    fn next_extension(&mut self) {
        if self.ext_left == 0 {
            self.finish();
        } else {
            self.expect(Step::ExtHeader, 4);
        }
    }

    #[inline(always)]
    fn finish(&mut self) {
        let offer = if self.flags & FLAG_TLS13 != 0 {
            if self.flags & FLAG_PSK != 0 {
                Offer::Psk
            } else {
                Offer::None
            }
        } else if self.flags & FLAG_TICKET != 0 {
            Offer::Ticket
        } else if self.sid_len > 0 {
            Offer::SessionId
        } else {
            Offer::None
        };
        self.offer = offer as u8;
        self.verdict = if offer == Offer::None {
            Verdict::New
        } else {
            Verdict::Offer
        } as u8;
    }
}

/// Hands the first `n` (at most `N`) bytes at `at` to `f`, one at a time with their index, in a
/// loop the verifier sees bounded by `N`. `false` when a byte cannot be read.
#[inline(always)]
fn each_byte<B: PacketBytes, const N: usize>(
    b: &B,
    at: usize,
    n: u32,
    mut f: impl FnMut(usize, u8),
) -> bool {
    for i in 0..N {
        if i as u32 >= n {
            break;
        }
        let mut byte = [0u8; 1];
        if !b.read(at + i, &mut byte) {
            return false;
        }
        f(i, byte[0]);
    }
    true
}

const DIGEST_PRIMES: [u64; 2] = [0x0000_0100_0000_01b3, 0x9e37_79b9_7f4a_7c15 | 1];
const DIGEST_OFFSETS: [u64; 2] = [0xcbf2_9ce4_8422_2325, 0x6a09_e667_f3bc_c909];

#[inline(always)]
const fn digest_start(len: u32) -> [u64; 2] {
    [
        DIGEST_OFFSETS[0] ^ len as u64,
        DIGEST_OFFSETS[1] ^ (len as u64).rotate_left(32),
    ]
}

#[inline(always)]
fn digest_byte(d: &mut [u64; 2], byte: u8) {
    d[0] = (d[0] ^ u64::from(byte)).wrapping_mul(DIGEST_PRIMES[0]);
    d[1] = (d[1] ^ u64::from(byte)).wrapping_mul(DIGEST_PRIMES[1]);
}

#[inline(always)]
fn digest_finish(d: &[u64; 2]) -> [u8; KEY_LEN] {
    // Each half mixed with the other, so that neither lane's structure shows.
    let mix = |x: u64| {
        let x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        let x = (x ^ (x >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    };
    let a = mix(d[0] ^ d[1].rotate_left(17));
    let b = mix(d[1] ^ a);
    let mut out = [0u8; KEY_LEN];
    out[..8].copy_from_slice(&a.to_le_bytes());
    out[8..].copy_from_slice(&b.to_le_bytes());
    out
}

/// The running digest of an offered value ([`offer_digest`]'s, [`tag::ticket_key`]'s), for a
/// caller that feeds the bytes itself (the egress program, from a `bpf_loop`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ValueDigest {
    d: [u64; 2],
}

impl ValueDigest {
    /// The digest of a value of `len` bytes, before its first byte.
    #[inline(always)]
    pub const fn start(len: u32) -> Self {
        ValueDigest {
            d: digest_start(len),
        }
    }

    /// Feeds one byte.
    #[inline(always)]
    pub fn byte(&mut self, b: u8) {
        digest_byte(&mut self.d, b);
    }

    /// The key of the bytes fed.
    #[inline(always)]
    pub fn finish(&self) -> [u8; KEY_LEN] {
        digest_finish(&self.d)
    }
}

/// The key of an offered session id, as the datapath computes it while parsing a hello: a
/// 128-bit digest (two FNV-1a lanes, mixed) of the whole value and its length. (A ticket's or a
/// PSK identity's leaves out its tail: [`tag::ticket_key`]; [`issued_key`] picks.)
pub fn offer_digest(value: &[u8]) -> [u8; KEY_LEN] {
    let mut d = digest_start(value.len() as u32);
    value.iter().for_each(|&b| digest_byte(&mut d, b));
    digest_finish(&d)
}

/// The datapath's key of an issued value of kind `kind`, exactly as the parser computes it for
/// an offer of it: `None` for a value the datapath never verifies (shorter than [`KEY_LEN`], or
/// than [`tag::MIN_TICKET`] for a ticket or PSK identity, or longer than [`MAX_OFFER`]).
pub fn issued_key(kind: Offer, value: &[u8]) -> Option<[u8; KEY_LEN]> {
    if value.len() > MAX_OFFER as usize {
        return None;
    }
    match kind {
        Offer::SessionId if value.len() >= KEY_LEN => Some(offer_digest(value)),
        Offer::Ticket | Offer::Psk => tag::ticket_key(value),
        _ => None,
    }
}

/// What a connection's first segment with payload holds before its ClientHello: see
/// [`first_records`].
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FirstRecords {
    /// `FIRST_*`.
    pub what: u8,
    /// Padding.
    pub pad: [u8; 3],
    /// For [`FIRST_HELLO`], the payload offset of the handshake record.
    pub skip: u32,
}

/// [`FirstRecords::what`]: a handshake record (the hello) starts at `skip`.
pub const FIRST_HELLO: u8 = 0;
/// [`FirstRecords::what`]: application data, or a handshake message that is no ClientHello,
/// first: a connection whose flow entry is gone (its client's next flight: TLS 1.3's encrypted
/// records, TLS 1.2's ClientKeyExchange), or a protocol error every server rejects before any
/// work of a handshake. No hello can hide behind it: a server reads records in order and ends
/// the connection at the first message that should have been its ClientHello.
pub const FIRST_CONTINUES: u8 = 1;
/// The handshake message type of a ClientHello (RFC 8446 4).
const CLIENT_HELLO: u8 = 1;
/// [`FirstRecords::what`]: only whole ChangeCipherSpec or alert records: the hello, if any, is in
/// a later segment, which will be judged as a first one.
pub const FIRST_NO_HELLO_YET: u8 = 2;
/// [`FirstRecords::what`]: anything else (not TLS, a record cut by the segment's end, too many
/// records before a hello): a malformed hello, never a resumption.
pub const FIRST_MALFORMED: u8 = 3;
/// ChangeCipherSpec or alert records skipped before a hello.
pub const MAX_LEADING_RECORDS: usize = 4;

/// Walks the records at the start of a connection's first segment with payload (`len` bytes at
/// `offset` in `b`), so that records a client puts before its ClientHello (alerts,
/// ChangeCipherSpec, which servers ignore) never hide the hello from judgement.
#[inline(always)]
pub fn first_records<B: PacketBytes>(b: &B, offset: usize, len: u32) -> FirstRecords {
    let found = |what, skip| FirstRecords {
        what,
        pad: [0; 3],
        skip,
    };
    let mut skip: u32 = 0;
    for _ in 0..=MAX_LEADING_RECORDS {
        if skip == len {
            return found(FIRST_NO_HELLO_YET, 0);
        }
        let mut head = [0u8; 5];
        let mut first = [0u8; 1];
        if !b.read(offset + skip as usize, &mut first) {
            return found(FIRST_MALFORMED, 0);
        }
        match first[0] {
            22 => {
                // The message type, where the segment carries it (else the hello, arriving).
                let mut typed = [0u8; 6];
                let other = b.read(offset + skip as usize, &mut typed) && typed[5] != CLIENT_HELLO;
                if other && skip == 0 {
                    return found(FIRST_CONTINUES, 0);
                }
                return found(FIRST_HELLO, skip);
            }
            23 if skip == 0 => return found(FIRST_CONTINUES, 0),
            20 | 21 => {
                if !b.read(offset + skip as usize, &mut head) {
                    return found(FIRST_MALFORMED, 0);
                }
                let record = 5 + u32::from(u16::from_be_bytes([head[3], head[4]]));
                skip += record;
                if skip > len {
                    return found(FIRST_MALFORMED, 0);
                }
            }
            _ => return found(FIRST_MALFORMED, 0),
        }
    }
    found(FIRST_MALFORMED, 0)
}

/// Parses a whole ClientHello held in one buffer (userspace convenience).
pub fn parse_hello(data: &[u8]) -> HelloState {
    let mut st = HelloState::default();
    st.feed(data, 0);
    st
}

#[cfg(test)]
mod tests;
