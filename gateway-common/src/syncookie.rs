//! SYN cookies answered from the NIC, so that a new client's hello is judged before the kernel
//! holds anything for its connection (a socket, a place in the SYN or accept queue).
//!
//! For a protected TLS port in this mode, the NIC answers a SYN itself with a SYN-ACK whose
//! sequence number is a cookie: a keyed hash (SipHash-2-4, key in the `SYN_COOKIE_KEY` map) of
//! the 4-tuple, the client's initial sequence number and the time period, with the SYN's options
//! in its low byte. The handshake's last ACK is dropped (nothing is kept); the first data
//! segment acknowledges `cookie + 1` and starts at `isn + 1`, so it carries everything needed to
//! check the cookie and to recover the options. Its hello is judged there, and only an admitted
//! (or still pending) connection is handed to the kernel, which makes its socket from that
//! segment (`bpf_sk_assign_tcp_reqsk`, with the options decoded here).
//!
//! The cookie's low byte: bits 0-3 the client's window scale ([`WSCALE_NONE`] when it sent
//! none), bit 4 SACK permitted, bits 5-6 the MSS index ([`MSS_V4`], [`MSS_V6`]), bit 7 the
//! period's parity (a cookie is good in the period it was made in and the next one, 64 to 128
//! seconds). The upper 24 bits are the hash's. Timestamps are not in the cookie: a client that
//! negotiated them sends them on every segment (RFC 7323), so the data segment's own option says
//! whether they are on. ECN is not negotiated by cookies.

pub use crate::maps::CookieKey;
use crate::maps::FlowKey;

/// Length of a cookie's period: a cookie is accepted in its own period and the next.
pub const COOKIE_PERIOD_NS: u64 = 64 * 1_000_000_000;

/// The window-scale nibble of a client that sent no window scale option.
pub const WSCALE_NONE: u8 = 0xf;

/// The window scale the NIC's SYN-ACK announces (and the kernel's socket then uses): Linux's
/// choice for its default receive buffer (`tcp_rmem` max 6 MiB).
pub const OUR_WSCALE: u8 = 7;

/// The receive window of the SYN-ACK (unscaled, as in every SYN segment).
pub const SYNACK_WINDOW: u16 = 64240;

/// MSS values an IPv4 cookie can carry: the largest not above the client's is announced.
pub const MSS_V4: [u16; 4] = [536, 1300, 1440, 1460];
/// MSS values an IPv6 cookie can carry.
pub const MSS_V6: [u16; 4] = [1220, 1360, 1420, 1440];

/// The TCP options of a segment that matter to a cookie.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpOptions {
    /// MSS option's value (0: none).
    pub mss: u16,
    /// Window scale (`WSCALE_NONE`: none).
    pub wscale: u8,
    /// SACK permitted.
    pub sack: bool,
    /// A timestamps option was there.
    pub ts: bool,
    /// Its TSval.
    pub tsval: u32,
    /// Its TSecr.
    pub tsecr: u32,
}

/// Bytes of TCP options a header can carry.
pub const MAX_OPTION_BYTES: usize = 40;

/// Steps of an options walk at most: each takes at least one byte.
pub const MAX_OPTION_STEPS: u32 = MAX_OPTION_BYTES as u32;

/// An options walk: where it is, and what it found.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct OptionWalk {
    /// Offset of the next option.
    pub at: u32,
    /// Bytes of options (at most [`MAX_OPTION_BYTES`]).
    pub len: u32,
    /// What was found so far.
    pub found: TcpOptions,
}

impl OptionWalk {
    /// A walk over `len` bytes of options.
    #[inline(always)]
    pub fn new(len: usize) -> Self {
        OptionWalk {
            at: 0,
            len: if len > MAX_OPTION_BYTES {
                MAX_OPTION_BYTES as u32
            } else {
                len as u32
            },
            found: TcpOptions {
                wscale: WSCALE_NONE,
                ..TcpOptions::default()
            },
        }
    }

    /// Reads the option at `self.at` of `opts`; whether there may be more. What is malformed
    /// ends the walk: the options before it count, the rest are as if absent. One step of a
    /// loop the verifier checks once (a `bpf_loop` callback), whatever the options are.
    #[inline(always)]
    pub fn step(&mut self, opts: &[u8; 64]) -> bool {
        let at = (self.at & 63) as usize;
        let len = (self.len & 63) as usize;
        if at >= len {
            return false;
        }
        let kind = opts[at];
        if kind == 0 {
            return false;
        }
        if kind == 1 {
            self.at = at as u32 + 1;
            return true;
        }
        let size = opts[(at + 1) & 63] as usize;
        if size < 2 || at + size > len {
            return false;
        }
        let byte = |i: usize| opts[(at + i) & 63];
        let o = &mut self.found;
        match (kind, size) {
            (2, 4) => o.mss = u16::from_be_bytes([byte(2), byte(3)]),
            (3, 3) => o.wscale = if byte(2) > 14 { 14 } else { byte(2) },
            (4, 2) => o.sack = true,
            (8, 10) => {
                o.ts = true;
                o.tsval = u32::from_be_bytes([byte(2), byte(3), byte(4), byte(5)]);
                o.tsecr = u32::from_be_bytes([byte(6), byte(7), byte(8), byte(9)]);
            }
            _ => {}
        }
        self.at = (at + size) as u32;
        true
    }
}

/// Parses the first `len` bytes of `opts` (a TCP header's options, copied) as TCP options
/// ([`OptionWalk`] to its end).
pub fn parse_options(opts: &[u8; 64], len: usize) -> TcpOptions {
    let mut walk = OptionWalk::new(len);
    for _ in 0..MAX_OPTION_STEPS {
        if !walk.step(opts) {
            break;
        }
    }
    walk.found
}

/// What a cookie keeps of a SYN, decoded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CookieOptions {
    /// The MSS the SYN-ACK announced.
    pub mss: u16,
    /// The client's window scale (`WSCALE_NONE`: none, and the SYN-ACK announced none).
    pub wscale: u8,
    /// SACK permitted.
    pub sack: bool,
}

/// The index in `table` of the largest MSS not above `mss` (0 when `mss` is below them all, or
/// absent: the protocol's default is the smallest).
#[inline(always)]
pub fn mss_index(table: &[u16; 4], mss: u16) -> u8 {
    let mut i = 3u8;
    while i > 0 && mss < table[i as usize] {
        i -= 1;
    }
    i
}

/// The cookie's low byte for options `o` and period `period`, and the MSS it announces.
#[inline(always)]
pub fn options_byte(o: &TcpOptions, v4: bool, period: u64) -> (u8, u16) {
    let table = if v4 { &MSS_V4 } else { &MSS_V6 };
    let idx = mss_index(table, o.mss);
    let mut byte = (o.wscale & 0xf) | (idx << 5) | (((period & 1) as u8) << 7);
    if o.sack {
        byte |= 1 << 4;
    }
    (byte, table[(idx & 3) as usize])
}

/// Decodes a cookie's low byte.
#[inline(always)]
pub fn decode_options(byte: u8, v4: bool) -> CookieOptions {
    let table = if v4 { &MSS_V4 } else { &MSS_V6 };
    CookieOptions {
        mss: table[((byte >> 5) & 3) as usize],
        wscale: byte & 0xf,
        sack: byte & (1 << 4) != 0,
    }
}

/// The hash behind a cookie: the connection (`flow`, client first), the client's initial
/// sequence number, the period and the options byte.
#[inline(always)]
pub fn cookie_hash(key: &CookieKey, flow: &FlowKey, isn: u32, period: u64, byte: u8) -> u64 {
    let word = |a: &[u8; 16], half: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&a[half * 8..half * 8 + 8]);
        u64::from_le_bytes(w)
    };
    crate::siphash::siphash24(
        key.k0,
        key.k1,
        &[
            word(&flow.saddr, 0),
            word(&flow.saddr, 1),
            word(&flow.daddr, 0),
            word(&flow.daddr, 1),
            (u64::from(flow.sport) << 48) | (u64::from(flow.dport) << 32) | u64::from(isn),
            (period << 8) | u64::from(byte),
        ],
    )
}

/// The cookie for a SYN of `flow` with initial sequence number `isn` and options byte `byte`
/// (from [`options_byte`]) in `period`: the SYN-ACK's sequence number.
#[inline(always)]
pub fn make_cookie(key: &CookieKey, flow: &FlowKey, isn: u32, period: u64, byte: u8) -> u32 {
    ((cookie_hash(key, flow, isn, period, byte) as u32) & 0xffff_ff00) | u32::from(byte)
}

/// The period of time `now_ns`.
#[inline(always)]
pub const fn period_of(now_ns: u64) -> u64 {
    now_ns / COOKIE_PERIOD_NS
}

/// Checks the cookie a segment of `flow` acknowledges: `seq` and `ack` are the segment's, which
/// must be the first after the handshake (`seq == isn + 1`, `ack == cookie + 1`). The options the
/// cookie keeps, when it is one of ours from this period or the last.
#[inline(always)]
pub fn check_cookie(
    key: &CookieKey,
    flow: &FlowKey,
    seq: u32,
    ack: u32,
    now_ns: u64,
    v4: bool,
) -> Option<CookieOptions> {
    if !key.is_set() {
        return None;
    }
    let cookie = ack.wrapping_sub(1);
    let isn = seq.wrapping_sub(1);
    let byte = cookie as u8;
    let now = period_of(now_ns);
    let period = if (now & 1) as u8 == byte >> 7 {
        now
    } else {
        now.checked_sub(1)?
    };
    if make_cookie(key, flow, isn, period, byte) != cookie {
        return None;
    }
    Some(decode_options(byte, v4))
}

/// The options of the NIC's SYN-ACK to a SYN with options `o`, announcing `mss`, with `tsval` as
/// its timestamp: the bytes (a multiple of four) and how many. MSS always; window scale and
/// SACK permitted when the client sent them; timestamps when it sent them (echoing its TSval).
#[inline(always)]
pub fn synack_options(o: &TcpOptions, mss: u16, tsval: u32) -> ([u8; 20], usize) {
    let mut out = [0u8; 20];
    let m = mss.to_be_bytes();
    out[0] = 2;
    out[1] = 4;
    out[2] = m[0];
    out[3] = m[1];
    let mut n = 4;
    if o.ts {
        // SACK permitted takes the two bytes a NOP pair would.
        if o.sack {
            out[4] = 4;
            out[5] = 2;
        } else {
            out[4] = 1;
            out[5] = 1;
        }
        out[6] = 8;
        out[7] = 10;
        out[8..12].copy_from_slice(&tsval.to_be_bytes());
        out[12..16].copy_from_slice(&o.tsval.to_be_bytes());
        n = 16;
    } else if o.sack {
        out[4] = 1;
        out[5] = 1;
        out[6] = 4;
        out[7] = 2;
        n = 8;
    }
    if o.wscale != WSCALE_NONE {
        out[n] = 1;
        out[n + 1] = 3;
        out[n + 2] = 3;
        out[n + 3] = OUR_WSCALE;
        n += 4;
    }
    (out, n)
}

/// The options of the NIC's acknowledgement to a later segment of a held hello (its sequence
/// number `seq`, `len` bytes, options `o`): timestamps when the connection has them (TSval
/// `tsval`, echoing the segment's), then, when `sack`, a SACK block of that segment, so that the
/// client sends its first segment again at once (RACK: a later segment was acknowledged) rather
/// than at its retransmission timer. The bytes (a multiple of four) and how many.
#[inline(always)]
pub fn held_ack_options(
    o: &TcpOptions,
    sack: bool,
    seq: u32,
    len: u32,
    tsval: u32,
) -> ([u8; 24], usize) {
    let mut out = [0u8; 24];
    let mut n = 0;
    if o.ts {
        out[0] = 1;
        out[1] = 1;
        out[2] = 8;
        out[3] = 10;
        out[4..8].copy_from_slice(&tsval.to_be_bytes());
        out[8..12].copy_from_slice(&o.tsval.to_be_bytes());
        n = 12;
    }
    if sack {
        out[n] = 1;
        out[n + 1] = 1;
        out[n + 2] = 5;
        out[n + 3] = 10;
        out[n + 4..n + 8].copy_from_slice(&seq.to_be_bytes());
        out[n + 8..n + 12].copy_from_slice(&seq.wrapping_add(len).to_be_bytes());
        n += 12;
    }
    (out, n)
}

/// The TSval of the NIC's SYN-ACK at time `now_ns`: milliseconds, offset per connection by the
/// cookie's hash (as the kernel offsets each connection's clock), which the kernel's socket
/// then goes on from.
#[inline(always)]
pub fn synack_tsval(hash: u64, now_ns: u64) -> u32 {
    ((now_ns / 1_000_000) as u32).wrapping_add((hash >> 32) as u32)
}

#[cfg(test)]
mod tests;
