//! The flow tables: IPv4 connections by a 12-byte key (`TLS_FLOWS4`), IPv6 ones by the whole
//! 40-byte [`FlowKey`] (`TLS_FLOWS`).
//!
//! Every packet of an admitted connection costs one lookup here, and the kernel hashes a key
//! of ten words in four rounds of jhash where three words take one: about half of what such a
//! packet cost was that hash (docs/benchmark-notes.md, "Where a packet's time goes"). The rest
//! of the datapath (the pending units, the holds, the refusals) keeps the one [`FlowKey`]:
//! they are touched once or twice a connection.

use aya_ebpf::{btf_maps::LruHashMap, macros::btf_map};
use gateway_common::{
    bytes::PacketBytes,
    maps::{FLOW_ADMITTED, FLOW_KEY_EXCHANGE, FlowKey, FlowKey4, MAX_TLS_FLOWS, TlsFlow},
    packet::ETH_HLEN,
};

use super::Scratch;

/// IPv4 TLS connections by 4-tuple: hello parse state while pending, then the decision.
#[btf_map]
pub static TLS_FLOWS4: LruHashMap<FlowKey4, TlsFlow, { MAX_TLS_FLOWS as usize }> =
    LruHashMap::new();

/// IPv6 TLS connections by 4-tuple, likewise.
#[btf_map]
pub static TLS_FLOWS: LruHashMap<FlowKey, TlsFlow, { MAX_TLS_FLOWS as usize }> = LruHashMap::new();

/// The flow entry of the connection in `s.tcp.key` (IPv4 when `v4`), writing its IPv4 key into
/// `s.key4` first.
#[inline(always)]
pub fn get(s: &mut Scratch, v4: bool) -> Option<*mut TlsFlow> {
    if v4 {
        short_key(&s.tcp.key, &mut s.key4);
        TLS_FLOWS4.get_ptr_mut(&s.key4)
    } else {
        TLS_FLOWS.get_ptr_mut(&s.tcp.key)
    }
}

/// Whether the connection of the plain IPv4 frame `b` (`gateway_common::packet::plain_ipv4`),
/// from `sport` to `dport`, was admitted (and waits for nothing more): all its segments but a
/// SYN, and but one that starts where its hello did, pass as `tls-flow` on this alone
/// (`crate::datapath::pass_admitted`). The one that starts where the hello did goes the full
/// way: a copy of the hello's first segment, or the handshake's last ACK come late, which
/// `tls_packet` drops on a cookie port (`late_cookie_ack`). The key is built in the scratch,
/// not on the stack: the program that calls this keeps its own frame small, under the
/// classifier's deepest chain of calls.
#[inline(always)]
pub fn admitted4<B: PacketBytes>(b: &B, sport: u16, dport: u16) -> bool {
    let Some(s) = super::TLS_SCRATCH.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: per-CPU slot, used only by this program run; the entry is read.
    unsafe {
        (*s).absent4 = 0;
        let key = &mut (*s).key4;
        // The two addresses, network order, as the key's first eight bytes hold them.
        let addresses = &mut *core::ptr::addr_of_mut!(key.saddr).cast::<[u8; 8]>();
        // The sequence number: a plain IPv4 header is 20 bytes, and it is four bytes into TCP's.
        let mut seq = [0u8; 4];
        if !b.read(ETH_HLEN + 12, addresses) || !b.read(ETH_HLEN + 24, &mut seq) {
            return false;
        }
        key.sport = sport;
        key.dport = dport;
        match TLS_FLOWS4.get_ptr(&*key) {
            Some(f) => (*f).state == FLOW_ADMITTED && (*f).hello_seq != u32::from_be_bytes(seq),
            None => {
                // The judgment that follows (`first`) need not look again.
                (*s).absent4 = 1;
                false
            }
        }
    }
}

/// [`get`] for the classifier's first look at a segment's connection: an IPv4 connection that
/// [`admitted4`] found without an entry for this very segment (`s.absent4`, read and cleared:
/// every segment that finds none there is judged next, by `tls_packet`, which calls this) is
/// not looked up again. The key `admitted4` looked up must be this segment's, or the flag is
/// not taken for it: a flag left by a segment that never came here cannot hide another
/// connection's entry.
#[inline(always)]
pub fn first(s: &mut Scratch, v4: bool) -> Option<*mut TlsFlow> {
    if v4 && s.absent4 != 0 {
        s.absent4 = 0;
        let (k, k4) = (&s.tcp.key, &s.key4);
        if k4.sport == k.sport
            && k4.dport == k.dport
            && k4.saddr == k.saddr[12..]
            && k4.daddr == k.daddr[12..]
        {
            return None;
        }
    }
    get(s, v4)
}

/// Removes the flow entry of the connection in `s.tcp.key` (after [`get`]).
#[inline(always)]
pub fn remove(s: &Scratch, v4: bool) {
    let _ = if v4 {
        TLS_FLOWS4.remove(&s.key4)
    } else {
        TLS_FLOWS.remove(&s.tcp.key)
    };
}

/// Stores `s.flow` as the flow entry of the connection in `s.tcp.key` (after [`get`]).
#[inline(always)]
pub fn insert(s: &Scratch, v4: bool) {
    let _ = if v4 {
        TLS_FLOWS4.insert(&s.key4, &s.flow, 0)
    } else {
        TLS_FLOWS.insert(&s.tcp.key, &s.flow, 0)
    };
}

/// Marks the admitted connection `key` as awaiting the client's key exchange
/// ([`FLOW_KEY_EXCHANGE`]): its server sent a TLS 1.2 full handshake's first flight (the
/// egress program). Nothing for a connection in any other state, or none.
#[inline(always)]
pub fn await_key_exchange(key: &FlowKey, v4: bool) {
    let flow = if v4 {
        let mut k4 = FlowKey4::default();
        short_key(key, &mut k4);
        TLS_FLOWS4.get_ptr_mut(&k4)
    } else {
        TLS_FLOWS.get_ptr_mut(key)
    };
    if let Some(f) = flow {
        // SAFETY: the flow entry is only touched by packets of its own connection.
        unsafe {
            if (*f).state == FLOW_ADMITTED {
                (*f).state = FLOW_KEY_EXCHANGE;
            }
        }
    }
}

/// The IPv4 key of an IPv4 connection's [`FlowKey`] (its addresses' last four bytes).
#[inline(always)]
fn short_key(key: &FlowKey, out: &mut FlowKey4) {
    out.saddr.copy_from_slice(&key.saddr[12..]);
    out.daddr.copy_from_slice(&key.daddr[12..]);
    out.sport = key.sport;
    out.dport = key.dport;
}
