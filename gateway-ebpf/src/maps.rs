//! The gateway's maps. All are BTF-defined so `bpftool map dump` prints field names. Userspace
//! pins them per interface under the names in `gateway_common::maps::names`.

use aya_ebpf::{
    btf_maps::{Array, HashMap, PerCpuArray},
    macros::btf_map,
};
use gateway_common::{
    NUM_CLASSES,
    maps::{
        ClassPolicy, ClassState, ClassStats, DatapathConfig, DatapathCounters, MAX_SERVICES,
        SERVICE_PORT_ENTRIES, ServiceKey, ServiceValue,
    },
};

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
