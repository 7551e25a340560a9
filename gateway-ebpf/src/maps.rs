//! The gateway's maps. All are BTF-defined so `bpftool map dump` prints field names. Userspace
//! pins them per interface under the names in `gateway_common::maps::names`.

use aya_ebpf::{
    btf_maps::{Array, HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf},
    macros::btf_map,
};
use gateway_common::{
    NUM_CLASSES,
    maps::{
        BPF_F_NO_PREALLOC, ClassPolicy, ClassState, ClassStats, DEFAULT_TLS_ISSUED, DatapathConfig,
        DatapathCounters, FlowKey, IssuedKey, IssuedValue, LatencyHistogram, MAX_PENDING,
        MAX_SERVICES, MAX_SIP_DIALOGS, MAX_SIP_TXNS, MAX_TLS_FLOWS, Pending, RejectEvent,
        SERVICE_PORT_ENTRIES, ServiceKey, ServiceValue, SipDialog, SipTxn, TLS_REJECTS_BYTES,
        TlsCounters, TlsFlow, TlsHold,
    },
};

/// A pending table: admitted units that have not ended (`crate::pending`).
pub type PendingTable<K> = HashMap<K, Pending, { MAX_PENDING as usize }>;

/// Per-class counters, per CPU.
#[btf_map]
pub static CLASS_STATS: PerCpuArray<ClassStats, NUM_CLASSES> = PerCpuArray::new();

/// Per-class admission limits, written by userspace.
#[btf_map]
pub static CLASS_POLICY: Array<ClassPolicy, NUM_CLASSES> = Array::new();

/// Per-class admission state (monotonic admitted/completed counters, GCRA state).
#[btf_map]
pub static CLASS_STATE: Array<ClassState, NUM_CLASSES> = Array::new();

/// Protected services by (L4 protocol, destination port): the operator-facing list. The programs
/// never read it; userspace keeps [`SERVICE_PORTS`] in step with it.
#[btf_map]
pub static SERVICES: HashMap<ServiceKey, ServiceValue, { MAX_SERVICES as usize }> = HashMap::new();

/// Service kind per (protocol, port), indexed by `service_port_index`: the datapath's view of
/// [`SERVICES`], an array so the lookup is inlined.
#[btf_map]
pub static SERVICE_PORTS: Array<u8, { SERVICE_PORT_ENTRIES as usize }> = Array::new();

/// Parser counters, per CPU.
#[btf_map]
pub static DP_COUNTERS: PerCpuArray<DatapathCounters, 1> = PerCpuArray::new();

/// Datapath-wide settings.
#[btf_map]
pub static DP_CONFIG: Array<DatapathConfig, 1> = Array::new();

/// TLS connections by 4-tuple: hello parse state while pending, then the decision.
#[btf_map]
pub static TLS_FLOWS: LruHashMap<FlowKey, TlsFlow, { MAX_TLS_FLOWS as usize }> = LruHashMap::new();

/// Keys of the sessions the server issued, published by userspace. Not an LRU: a key lives for
/// its session's lifetime whatever the load (userspace sizes the table at load and withdraws
/// keys as their lifetime ends).
#[btf_map]
pub static TLS_ISSUED: HashMap<
    IssuedKey,
    IssuedValue,
    { DEFAULT_TLS_ISSUED as usize },
    BPF_F_NO_PREALLOC,
> = HashMap::new();

/// TLS counters, per CPU.
#[btf_map]
pub static TLS_COUNTERS: PerCpuArray<TlsCounters, 1> = PerCpuArray::new();

/// Per-CPU scratch space of the ClientHello parser (not pinned).
#[btf_map]
pub static TLS_SCRATCH: PerCpuArray<crate::tls::Scratch, 1> = PerCpuArray::new();

/// Rejected TLS connections, for the daemon to tear down.
#[btf_map]
pub static TLS_REJECTS: RingBuf<RejectEvent, { TLS_REJECTS_BYTES as usize }> = RingBuf::new();

/// SIP transactions seen, by transaction key.
#[btf_map]
pub static SIP_TXNS: LruHashMap<u64, SipTxn, { MAX_SIP_TXNS as usize }> = LruHashMap::new();

/// Per-CPU scratch space of the SIP parser (not pinned).
#[btf_map]
pub static SIP_SCRATCH: PerCpuArray<crate::sip::Scratch, 1> = PerCpuArray::new();

/// Per-class service-time histograms (admission to first response), per CPU.
#[btf_map]
pub static SERVICE_LATENCY: PerCpuArray<LatencyHistogram, NUM_CLASSES> = PerCpuArray::new();

/// The XDP hook's tail calls: index 0 is the SIP classifier (`gateway_xdp_sip`).
#[btf_map]
pub static XDP_JUMP: ProgramArray<2> = ProgramArray::new();

/// The TC hook's tail calls: index 0 is the SIP classifier (`gateway_tc_sip`).
#[btf_map]
pub static TC_JUMP: ProgramArray<2> = ProgramArray::new();

/// Admitted TLS connections the server has not answered yet (see `crate::pending`).
#[btf_map]
pub static TLS_PENDING: PendingTable<FlowKey> = PendingTable::new();

/// Admitted SIP requests the server has not answered yet, by unit key (see `crate::pending`).
#[btf_map]
pub static SIP_PENDING: PendingTable<u64> = PendingTable::new();

/// SIP dialogs the server established, by dialog key: learnt on egress from its 2xx responses
/// to INVITEs; only their requests are exempt.
#[btf_map]
pub static SIP_DIALOGS: LruHashMap<u64, SipDialog, { MAX_SIP_DIALOGS as usize }> =
    LruHashMap::new();

/// Resumed TLS connections the server answered that are still open, each holding a place of its
/// issued key until it ends (`crate::resume`). Not LRU: no traffic can evict a hold.
#[btf_map]
pub static TLS_HOLDS: HashMap<FlowKey, TlsHold, { MAX_PENDING as usize }> = HashMap::new();
