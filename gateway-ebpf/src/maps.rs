//! What every part of the datapath shares: the protected services, the datapath-wide settings
//! and the parser counters. Each feature module declares the maps it owns beside the code that
//! uses them (`crate::admission`: the classes; `crate::pending`: the units; `crate::resume`:
//! issued keys and their holds; `crate::tls`, `crate::sip`: their flows, transactions, dialogs
//! and scratch; `crate::context`: the jump tables). All maps are BTF-defined so `bpftool map
//! dump` prints field names; userspace pins them per interface under their own names
//! (`gateway_common::maps::names`).

use aya_ebpf::{
    btf_maps::{Array, HashMap, PerCpuArray},
    macros::btf_map,
};
use gateway_common::maps::{
    DatapathConfig, DatapathCounters, MAX_SERVICES, SERVICE_PORT_ENTRIES, ServiceKey, ServiceKind,
    ServiceValue, port_kind, service_port_index,
};

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

/// The kind of service protected on (`proto`, `port`), if any: one inlined array lookup.
#[inline(always)]
pub fn service_kind(proto: u8, port: u16) -> Option<ServiceKind> {
    service_byte(proto, port).and_then(port_kind)
}

/// The `SERVICE_PORTS` byte of (`proto`, `port`): its kind and mode bits
/// (`gateway_common::maps::port_kind`, `port_syn_cookies`).
#[inline(always)]
pub fn service_byte(proto: u8, port: u16) -> Option<u8> {
    service_port_index(proto, port)
        .and_then(|i| SERVICE_PORTS.get(i))
        .copied()
}

/// Whether the settings have `flag` (`CONFIG_*`) set.
#[inline(always)]
pub fn setting(flag: u64) -> bool {
    DP_CONFIG.get(0).is_some_and(|c| c.flags & flag != 0)
}

/// Whether the settings say the finishing program has `bit` (`FINISHER_*`).
#[inline(always)]
pub fn finisher(bit: u32) -> bool {
    DP_CONFIG.get(0).is_some_and(|c| c.finisher & bit != 0)
}

/// Whether this kernel lets XDP programs grow a frame's metadata (`bpf_xdp_adjust_meta`), the
/// only way a frame carries a tag from XDP to TC ingress: set by the loader from its probe
/// (`gateway::bpfsys::xdp_metadata_allowed`). A read-only global, frozen before the programs
/// load, so with 0 the verifier never walks the helper's call (a kernel that refuses the
/// helper refuses any program that can reach it).
#[unsafe(no_mangle)]
pub static XDP_METADATA: aya_ebpf::Global<u8> = aya_ebpf::Global::new(1);

/// The key of this attachment's metadata tags (`HANDOVER_KEY`): written by the loader.
#[btf_map]
pub static HANDOVER_KEY: Array<u32, 1> = Array::new();

/// The key of this attachment's metadata tags; 0 when not drawn.
#[inline(always)]
pub fn handover_key() -> u32 {
    HANDOVER_KEY.get(0).copied().unwrap_or(0)
}

/// Counts in this CPU's parser counters.
#[inline(always)]
pub fn count(f: impl FnOnce(&mut DatapathCounters)) {
    if let Some(c) = DP_COUNTERS.get_ptr_mut(0) {
        // SAFETY: per-CPU slot, only this CPU writes it while the program runs.
        f(unsafe { &mut *c });
    }
}
