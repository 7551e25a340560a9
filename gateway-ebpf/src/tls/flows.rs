//! The flow tables: IPv4 connections by a 12-byte key (`TLS_FLOWS4`), IPv6 ones by the whole
//! 40-byte [`FlowKey`] (`TLS_FLOWS`).
//!
//! Every packet of an admitted connection costs one lookup here, and the kernel hashes a key
//! of ten words in four rounds of jhash where three words take one: about half of what such a
//! packet cost was that hash (docs/benchmark-notes.md, "Where a packet's time goes"). The rest
//! of the datapath (the pending units, the holds, the refusals) keeps the one [`FlowKey`]:
//! they are touched once or twice a connection.

use aya_ebpf::{btf_maps::LruHashMap, macros::btf_map};
use gateway_common::maps::{
    FLOW_ADMITTED, FLOW_KEY_EXCHANGE, FlowKey, FlowKey4, MAX_TLS_FLOWS, TlsFlow,
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
