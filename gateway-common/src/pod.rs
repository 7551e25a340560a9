//! `aya::Pod` for the map types, so the daemon can read and write them through aya's typed maps.

use crate::maps::{
    BenchFresh, ClassPolicy, ClassState, ClassStats, DatapathConfig, DatapathCounters, FlowKey,
    FlowKey4, IssuedKey, IssuedValue, LatencyHistogram, LearnTerms, Pending, RejectEvent,
    ServiceKey, ServiceTimes, ServiceValue, SipDialog, SipTxn, TagKey, TagKeyId, TicketKeyId,
    TicketMacKey, TlsCounters, TlsFlow, TlsHold,
};

// SAFETY: every type is #[repr(C)], Copy, made only of integers, and has no implicit padding
// (see the `no_implicit_padding` test in `maps`), so any bit pattern is a valid value.
unsafe impl aya::Pod for BenchFresh {}
unsafe impl aya::Pod for ClassStats {}
unsafe impl aya::Pod for ClassPolicy {}
unsafe impl aya::Pod for ClassState {}
unsafe impl aya::Pod for ServiceKey {}
unsafe impl aya::Pod for ServiceValue {}
unsafe impl aya::Pod for DatapathConfig {}
unsafe impl aya::Pod for DatapathCounters {}
unsafe impl aya::Pod for FlowKey {}
unsafe impl aya::Pod for FlowKey4 {}
unsafe impl aya::Pod for LearnTerms {}
unsafe impl aya::Pod for TicketKeyId {}
unsafe impl aya::Pod for TicketMacKey {}
unsafe impl aya::Pod for TlsFlow {}
unsafe impl aya::Pod for IssuedKey {}
unsafe impl aya::Pod for IssuedValue {}
unsafe impl aya::Pod for TagKeyId {}
unsafe impl aya::Pod for TagKey {}
unsafe impl aya::Pod for TlsCounters {}
unsafe impl aya::Pod for RejectEvent {}
unsafe impl aya::Pod for SipTxn {}
unsafe impl aya::Pod for LatencyHistogram {}
// SAFETY: repr(C) of u64s, no padding.
unsafe impl aya::Pod for ServiceTimes {}
unsafe impl aya::Pod for crate::maps::SipFamily {}
unsafe impl aya::Pod for Pending {}
unsafe impl aya::Pod for TlsHold {}
unsafe impl aya::Pod for SipDialog {}
unsafe impl aya::Pod for crate::maps::CookieKey {}
