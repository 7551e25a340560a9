//! Typed access to the pinned maps of one interface.

use aya::maps::{Array, HashMap, Map, MapData, MapError, PerCpuArray};
use gateway_common::{
    Class, NUM_CLASSES,
    maps::{
        ClassPolicy, ClassState, ClassStats, DatapathConfig, DatapathCounters, FlowKey, FlowKey4,
        IPPROTO_TCP, ISSUED_BY_KEY, ISSUED_WITHDRAWN, IssuedKey, IssuedValue, LatencyHistogram,
        LearnTerms, Pending, SERVICE_SYN_COOKIES, ServiceKey, ServiceTimes, ServiceValue,
        SipFamily, SipTxn, TLS_REFUSED_SLOTS, TagKey, TagKeyId, TicketKeyId, TicketMacKey,
        TlsCounters, TlsFlow, TlsHold, names,
    },
    syncookie::CookieKey,
};
use thiserror::Error;

use crate::datapath::pins::PinDir;

/// `BPF_MAP_UPDATE_ELEM`'s flag: only an entry that exists is changed.
const BPF_EXIST: u64 = 2;

/// The `SERVICE_PORTS` index function for one protocol.
fn service_port_index(proto: u8) -> Option<impl Fn(u16) -> u32> {
    gateway_common::maps::service_port_index(proto, 0)
        .map(|_| move |port| gateway_common::maps::service_port_index(proto, port).unwrap_or(0))
}

/// Errors of map access.
#[derive(Debug, Error)]
pub enum MapsError {
    /// A pinned map could not be opened.
    #[error("cannot open pinned map {path}: {source}")]
    Open {
        /// Pin path.
        path: String,
        /// The error.
        source: MapError,
    },
    /// A map operation failed.
    #[error("map {map}: {source}")]
    Op {
        /// Map name.
        map: &'static str,
        /// The error.
        source: MapError,
    },
    /// A service on a protocol other than TCP or UDP.
    #[error("IP protocol {0} cannot carry a service (tcp or udp only)")]
    Protocol(u8),
    /// The services map is full.
    #[error("the services map is full ({0} entries)")]
    ServicesFull(u32),
    /// A map could not be mapped into this process.
    #[error("map {map}: cannot map it into memory: {source}")]
    Mmap {
        /// Map name.
        map: &'static str,
        /// The error.
        source: nix::Error,
    },
    /// SYN-cookie mode asked of a service that cannot have it.
    #[error("service {proto}/{port}: syn_cookies: {why}")]
    SynCookies {
        /// IP protocol number.
        proto: u8,
        /// Port.
        port: u16,
        /// Why not.
        why: &'static str,
    },
    /// The cookies' secret could not be drawn.
    #[error("drawing the SYN cookies' secret: no randomness")]
    Random,
}

impl MapsError {
    /// Whether a map refused an insert because it is full (`E2BIG`).
    pub fn is_full(&self) -> bool {
        matches!(
            self,
            MapsError::Op {
                source: MapError::SyscallError(e),
                ..
            } if e.io_error.raw_os_error() == Some(libc::E2BIG)
        )
    }
}

/// The error of an operation on the map `map`.
pub(crate) fn op(map: &'static str) -> impl FnOnce(MapError) -> MapsError {
    move |source| MapsError::Op { map, source }
}

/// The reject-event ring buffer of one interface (a single consumer should read it: the daemon).
pub fn open_rejects(pins: &PinDir) -> Result<aya::maps::RingBuf<MapData>, MapsError> {
    open_as(pins, names::TLS_REJECTS)
}

/// Decodes a reject event read from the ring buffer.
pub fn decode_reject(bytes: &[u8]) -> Option<gateway_common::maps::RejectEvent> {
    if bytes.len() < core::mem::size_of::<gateway_common::maps::RejectEvent>() {
        return None;
    }
    // SAFETY: RejectEvent is Pod (any bytes are a value) and the length was checked.
    Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast()) })
}

/// A per-CPU value that adds up across CPUs.
trait PerCpuSum: aya::Pod + Default {
    fn add(&mut self, other: &Self);
}

macro_rules! per_cpu_sum {
    ($($t:ty),*) => {$(
        impl PerCpuSum for $t {
            fn add(&mut self, other: &Self) {
                self.accumulate(other);
            }
        }
    )*};
}
per_cpu_sum!(
    ClassStats,
    DatapathCounters,
    TlsCounters,
    LatencyHistogram,
    ServiceTimes
);

/// The entry at `index` of a per-CPU array, summed over CPUs.
fn sum<T: PerCpuSum>(
    map: &PerCpuArray<MapData, T>,
    index: u32,
    name: &'static str,
) -> Result<T, MapsError> {
    let mut out = T::default();
    for v in map.get(&index, 0).map_err(op(name))?.iter() {
        out.add(v);
    }
    Ok(out)
}

/// Removes every entry of a hash map (entries that vanish meanwhile are no error).
fn clear<K: aya::Pod, V: aya::Pod>(
    map: &mut HashMap<MapData, K, V>,
    name: &'static str,
) -> Result<(), MapsError> {
    let keys = map
        .keys()
        .collect::<Result<Vec<_>, _>>()
        .map_err(op(name))?;
    for k in keys {
        let _ = map.remove(&k);
    }
    Ok(())
}

/// Runs `f` on the slots of the `TLS_REFUSED` pinned in `pins`, mapped into this process (the
/// array is `BPF_F_MMAPABLE`: reading or clearing its 4,096 slots takes no syscall per slot,
/// which tests that forget every connection between two frames would otherwise pay). `None`
/// when it is not pinned (a datapath pinned by a build before the table).
fn refused_slots<T>(
    pins: &PinDir,
    f: impl FnOnce(*mut FlowKey, usize) -> T,
) -> Result<Option<T>, MapsError> {
    use std::{num::NonZeroUsize, os::fd::AsFd};

    use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

    let path = pins.map(names::TLS_REFUSED);
    if !path.exists() {
        return Ok(None);
    }
    let data = MapData::from_pin(&path).map_err(|source| MapsError::Open {
        path: path.display().to_string(),
        source,
    })?;
    let n = TLS_REFUSED_SLOTS as usize;
    let len = NonZeroUsize::new(n * size_of::<FlowKey>()).expect("a table of slots");
    let err = |source| MapsError::Mmap {
        map: names::TLS_REFUSED,
        source,
    };
    // SAFETY: a shared mapping of the array's values, which the kernel sizes to its elements
    // (40-byte keys, a multiple of 8, so no gaps); unmapped below before `data` closes.
    let base = unsafe {
        mmap(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            data.fd().as_fd(),
            0,
        )
    }
    .map_err(err)?;
    let out = f(base.as_ptr().cast::<FlowKey>(), n);
    // SAFETY: the mapping made above, of `len` bytes, no longer used.
    unsafe { munmap(base, len.get()) }.map_err(err)?;
    Ok(Some(out))
}

/// Whether the service `key` can be in SYN-cookie mode here: TLS over TCP, on a kernel that hands
/// connections to listeners from BPF (`bpf_sk_assign_tcp_reqsk`, 6.9 and later).
fn syn_cookies_possible(key: ServiceKey, value: ServiceValue) -> Result<(), MapsError> {
    let refuse = |why| MapsError::SynCookies {
        proto: key.proto,
        port: key.port,
        why,
    };
    if value.kind != gateway_common::maps::ServiceKind::Tls as u32 || key.proto != IPPROTO_TCP {
        return Err(refuse(
            "only a TLS service over TCP can answer SYNs with cookies",
        ));
    }
    if !crate::datapath::kfunc::handoff_available() {
        return Err(refuse(
            "this kernel has no bpf_sk_assign_tcp_reqsk (Linux 6.9 and later, CONFIG_SYN_COOKIES) to hand connections to the listener",
        ));
    }
    Ok(())
}

/// Handles to every gateway map of one interface.
pub struct Maps {
    stats: PerCpuArray<MapData, ClassStats>,
    policy: Array<MapData, ClassPolicy>,
    state: Array<MapData, ClassState>,
    services: HashMap<MapData, ServiceKey, ServiceValue>,
    service_ports: Array<MapData, u8>,
    /// Opened when first read: an older build's object (the benchmark's comparison) has fewer
    /// counters.
    counters: std::sync::OnceLock<PerCpuArray<MapData, DatapathCounters>>,
    config: Array<MapData, DatapathConfig>,
    tls_flows: HashMap<MapData, FlowKey, TlsFlow>,
    /// Opened when first used: an older build's object (the benchmark's comparison) lays its
    /// value out otherwise.
    tls_issued: std::sync::OnceLock<HashMap<MapData, IssuedKey, IssuedValue>>,
    sip_txns: HashMap<MapData, u64, SipTxn>,
    service_latency: PerCpuArray<MapData, LatencyHistogram>,
    /// Opened when first used: an older build's object has no such map.
    service_times: std::sync::OnceLock<PerCpuArray<MapData, ServiceTimes>>,
    /// Opened when first used, as `service_times` (the controller writes it every interval).
    sip_family_limits: std::sync::OnceLock<Array<MapData, u64>>,
    tls_pending: HashMap<MapData, FlowKey, Pending>,
    sip_pending: HashMap<MapData, u64, Pending>,
    tls_holds: HashMap<MapData, FlowKey, TlsHold>,
    /// Where they are pinned (for the maps opened when asked).
    pins: PinDir,
}

/// Opens the map `name` pinned in `pins` as the typed map `T`.
pub fn open_as<T: TryFrom<Map, Error = MapError>>(
    pins: &PinDir,
    name: &'static str,
) -> Result<T, MapsError> {
    let path = pins.map(name);
    let err = |source| MapsError::Open {
        path: path.display().to_string(),
        source,
    };
    let data = MapData::from_pin(&path).map_err(err)?;
    Map::from_map_data(data)
        .map_err(err)?
        .try_into()
        .map_err(op(name))
}

/// The datapath-wide settings of the maps pinned in `pins`, read from `DP_CONFIG` alone:
/// attaching reads and writes them whatever layout the other maps have (an older build's being
/// carried over, `crate::datapath::carry`).
pub fn read_config(pins: &PinDir) -> Result<DatapathConfig, MapsError> {
    let config: Array<MapData, DatapathConfig> = open_as(pins, names::DP_CONFIG)?;
    config.get(&0, 0).map_err(op(names::DP_CONFIG))
}

/// Changes the datapath-wide settings pinned in `pins` by `change` ([`read_config`]'s map).
pub fn change_config(
    pins: &PinDir,
    change: impl FnOnce(&mut DatapathConfig),
) -> Result<(), MapsError> {
    let mut config: Array<MapData, DatapathConfig> = open_as(pins, names::DP_CONFIG)?;
    let mut value = config.get(&0, 0).map_err(op(names::DP_CONFIG))?;
    change(&mut value);
    config.set(0, value, 0).map_err(op(names::DP_CONFIG))
}

/// A key for the metadata tags of an attachment (`HANDOVER_KEY`): random, never 0 (which hands
/// nothing over).
pub fn draw_handover_key() -> Result<u32, MapsError> {
    loop {
        let mut bytes = [0u8; 4];
        aws_lc_rs::rand::fill(&mut bytes).map_err(|_| MapsError::Random)?;
        let key = u32::from_ne_bytes(bytes);
        if key != 0 {
            return Ok(key);
        }
    }
}

/// Draws the key of the attachment's metadata tags (`HANDOVER_KEY`) unless it has one; a pin
/// set of a build without the map has nothing to draw.
pub fn ensure_handover_key(pins: &PinDir) -> Result<(), MapsError> {
    if !pins.map(names::HANDOVER_KEY).exists() {
        return Ok(());
    }
    let mut map: Array<MapData, u32> = open_as(pins, names::HANDOVER_KEY)?;
    if map.get(&0, 0).map_err(op(names::HANDOVER_KEY))? != 0 {
        return Ok(());
    }
    map.set(0, draw_handover_key()?, 0)
        .map_err(op(names::HANDOVER_KEY))
}

/// Sets the key of the attachment's metadata tags (`HANDOVER_KEY`), as the test programs do.
pub fn set_handover_key(pins: &PinDir, key: u32) -> Result<(), MapsError> {
    let mut map: Array<MapData, u32> = open_as(pins, names::HANDOVER_KEY)?;
    map.set(0, key, 0).map_err(op(names::HANDOVER_KEY))
}

/// The key of the attachment's metadata tags (`HANDOVER_KEY`); 0 when none is drawn.
pub fn handover_key(pins: &PinDir) -> Result<u32, MapsError> {
    let map: Array<MapData, u32> = open_as(pins, names::HANDOVER_KEY)?;
    map.get(&0, 0).map_err(op(names::HANDOVER_KEY))
}

/// Unix time in nanoseconds when `CLOCK_MONOTONIC` read zero: what the datapath adds to
/// `bpf_ktime_get_ns` for the wall clock (`TagKey::clock_ns`).
pub fn wall_clock_offset_ns() -> u64 {
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos() as u64;
    unix.saturating_sub(monotonic_ns())
}

/// `CLOCK_MONOTONIC` in nanoseconds, the clock of `bpf_ktime_get_ns` (for
/// [`IssuedValue::issued_ns`]).
pub fn monotonic_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

impl Maps {
    /// Opens the maps pinned in `pins`.
    pub fn open(pins: &PinDir) -> Result<Self, MapsError> {
        Ok(Maps {
            stats: open_as(pins, names::CLASS_STATS)?,
            policy: open_as(pins, names::CLASS_POLICY)?,
            state: open_as(pins, names::CLASS_STATE)?,
            services: open_as(pins, names::SERVICES)?,
            service_ports: open_as(pins, names::SERVICE_PORTS)?,
            counters: std::sync::OnceLock::new(),
            config: open_as(pins, names::DP_CONFIG)?,
            tls_flows: open_as(pins, names::TLS_FLOWS)?,
            tls_issued: std::sync::OnceLock::new(),
            sip_txns: open_as(pins, names::SIP_TXNS)?,
            service_latency: open_as(pins, names::SERVICE_LATENCY)?,
            service_times: std::sync::OnceLock::new(),
            sip_family_limits: std::sync::OnceLock::new(),
            tls_pending: open_as(pins, names::TLS_PENDING)?,
            sip_pending: open_as(pins, names::SIP_PENDING)?,
            tls_holds: open_as(pins, names::TLS_HOLDS)?,
            pins: pins.clone(),
        })
    }

    /// Per-class counters summed over CPUs, in class id order.
    pub fn class_stats(&self) -> Result<[ClassStats; NUM_CLASSES], MapsError> {
        let mut out = [ClassStats::default(); NUM_CLASSES];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = sum(&self.stats, i as u32, names::CLASS_STATS)?;
        }
        Ok(out)
    }

    /// Parser counters summed over CPUs.
    pub fn counters(&self) -> Result<DatapathCounters, MapsError> {
        let map = match self.counters.get() {
            Some(m) => m,
            None => {
                let m = open_as(&self.pins, names::DP_COUNTERS)?;
                self.counters.get_or_init(|| m)
            }
        };
        sum(map, 0, names::DP_COUNTERS)
    }

    /// Admission state of every class.
    pub fn class_state(&self) -> Result<[ClassState; NUM_CLASSES], MapsError> {
        let mut out = [ClassState::default(); NUM_CLASSES];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = self
                .state
                .get(&(i as u32), 0)
                .map_err(op(names::CLASS_STATE))?;
        }
        Ok(out)
    }

    /// The policy of one class.
    pub fn policy(&self, class: Class) -> Result<ClassPolicy, MapsError> {
        self.policy
            .get(&class.id(), 0)
            .map_err(op(names::CLASS_POLICY))
    }

    /// Replaces the policy of one class.
    pub fn set_policy(&mut self, class: Class, policy: ClassPolicy) -> Result<(), MapsError> {
        self.policy
            .set(class.id(), policy, 0)
            .map_err(op(names::CLASS_POLICY))
    }

    /// Every protected service, sorted.
    pub fn services(&self) -> Result<Vec<(ServiceKey, ServiceValue)>, MapsError> {
        let mut out = self
            .services
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::SERVICES))?;
        out.sort_by_key(|(k, _)| *k);
        Ok(out)
    }

    /// Adds or replaces a service: first in the services map (the list operators see; this is
    /// where a full map is refused), then in the datapath's port index.
    pub fn add_service(&mut self, key: ServiceKey, value: ServiceValue) -> Result<(), MapsError> {
        let index = service_port_index(key.proto).ok_or(MapsError::Protocol(key.proto))?;
        if value.flags & SERVICE_SYN_COOKIES != 0 {
            syn_cookies_possible(key, value)?;
            self.ensure_cookie_key()?;
        }
        self.services.insert(key, value, 0).map_err(|e| match e {
            MapError::SyscallError(ref s) if s.io_error.raw_os_error() == Some(libc::E2BIG) => {
                MapsError::ServicesFull(gateway_common::maps::MAX_SERVICES)
            }
            e => op(names::SERVICES)(e),
        })?;
        self.service_ports
            .set(index(key.port), value.port_byte(), 0)
            .map_err(op(names::SERVICE_PORTS))
    }

    /// Sets the SYN cookies' secret (`SYN_COOKIE_KEY`) to a random key unless it is set: once per
    /// attachment, kept across restarts and upgrades so that cookies in flight stay good.
    pub fn ensure_cookie_key(&mut self) -> Result<(), MapsError> {
        let mut map: Array<MapData, CookieKey> = open_as(&self.pins, names::SYN_COOKIE_KEY)?;
        if map.get(&0, 0).map_err(op(names::SYN_COOKIE_KEY))?.is_set() {
            return Ok(());
        }
        let mut bytes = [0u8; 16];
        aws_lc_rs::rand::fill(&mut bytes).map_err(|_| MapsError::Random)?;
        let key = CookieKey {
            k0: u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
            k1: u64::from_le_bytes(bytes[8..].try_into().expect("8 bytes")),
        };
        map.set(0, key, 0).map_err(op(names::SYN_COOKIE_KEY))
    }

    /// Removes a service (from the datapath's port index first); returns whether it was there.
    pub fn remove_service(&mut self, key: ServiceKey) -> Result<bool, MapsError> {
        let index = service_port_index(key.proto).ok_or(MapsError::Protocol(key.proto))?;
        self.service_ports
            .set(index(key.port), 0, 0)
            .map_err(op(names::SERVICE_PORTS))?;
        match self.services.remove(&key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::SERVICES)(e)),
        }
    }

    /// Datapath-wide settings.
    pub fn config(&self) -> Result<DatapathConfig, MapsError> {
        self.config.get(&0, 0).map_err(op(names::DP_CONFIG))
    }

    /// Replaces the datapath-wide settings.
    pub fn set_config(&mut self, config: DatapathConfig) -> Result<(), MapsError> {
        self.config.set(0, config, 0).map_err(op(names::DP_CONFIG))
    }

    /// TLS counters summed over CPUs.
    ///
    /// Opened at each call rather than with the rest: the counters grow with every release
    /// that counts something new, and a benchmark's baseline object of an older release is
    /// driven through these maps (`bench compare`) without its counters being read.
    pub fn tls_counters(&self) -> Result<TlsCounters, MapsError> {
        let map: PerCpuArray<MapData, TlsCounters> = open_as(&self.pins, names::TLS_COUNTERS)?;
        sum(&map, 0, names::TLS_COUNTERS)
    }

    /// Publishes an issued session key.
    pub fn add_issued(&mut self, key: IssuedKey, value: IssuedValue) -> Result<(), MapsError> {
        self.issued_map_mut()?
            .insert(key, value, 0)
            .map_err(op(names::TLS_ISSUED))
    }

    /// Withdraws an issued session key; returns whether it was there.
    pub fn remove_issued(&mut self, key: &IssuedKey) -> Result<bool, MapsError> {
        match self.issued_map_mut()?.remove(key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::TLS_ISSUED)(e)),
        }
    }

    /// Withdraws an issued key (an offer of it did not resume); returns whether it was there. A
    /// key with an expiry (a ticket's) stays as withdrawn ([`ISSUED_WITHDRAWN`]) until then, so
    /// that its ticket's tag does not publish it again at the NIC; any other is removed.
    pub fn withdraw_issued(&mut self, key: &IssuedKey) -> Result<bool, MapsError> {
        let mut value = match self.issued_map()?.get(key, 0) {
            Ok(v) => v,
            Err(MapError::KeyNotFound) => return Ok(false),
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                return Ok(false);
            }
            Err(e) => return Err(op(names::TLS_ISSUED)(e)),
        };
        if value.expires == 0 {
            return self.remove_issued(key);
        }
        value.kind |= ISSUED_WITHDRAWN;
        match self.issued_map_mut()?.insert(key, value, BPF_EXIST) {
            Ok(()) => Ok(true),
            // Removed meanwhile (its expiry swept).
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::TLS_ISSUED)(e)),
        }
    }

    /// Removes every issued key whose expiry ([`IssuedValue::expires`]) is `now_unix` (seconds)
    /// or earlier: keys the NIC published for tickets whose tag vouched for them, withdrawn
    /// keys, and keys a daemon published before it stopped. Returns how many.
    pub fn sweep_issued(&mut self, now_unix: u64) -> Result<usize, MapsError> {
        self.remove_issued_where(|v| v.expires != 0 && v.expires <= now_unix)
    }

    /// Removes every issued key whose value `ended` picks; returns how many.
    fn remove_issued_where(
        &mut self,
        ended: impl Fn(&IssuedValue) -> bool,
    ) -> Result<usize, MapsError> {
        let keys: Vec<IssuedKey> = self
            .issued_map()?
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, v)| ended(v))
            .map(|(k, _)| k)
            .collect();
        let mut n = 0;
        for k in &keys {
            n += usize::from(self.remove_issued(k)?);
        }
        Ok(n)
    }

    /// Writes the ticket tag keys of the listener on `port`, one per rotation period (the low
    /// 32 bits), and removes the port's keys of any other period (retired).
    pub fn set_tag_keys(&mut self, port: u16, keys: &[(u32, TagKey)]) -> Result<(), MapsError> {
        let mut map: HashMap<MapData, TagKeyId, TagKey> = open_as(&self.pins, names::TLS_TAG_KEYS)?;
        let id = |period| TagKeyId {
            port,
            pad: 0,
            period,
        };
        for (period, key) in keys {
            map.insert(id(*period), key, 0)
                .map_err(op(names::TLS_TAG_KEYS))?;
        }
        let retired: Vec<TagKeyId> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.port == port && !keys.iter().any(|(p, _)| *p == k.period))
            .collect();
        for k in retired {
            let _ = map.remove(&k);
        }
        Ok(())
    }

    /// Sets the terms under which the NIC learns the sessions of the server on `port`
    /// (`TLS_LEARN`).
    pub fn set_learn_terms(&mut self, port: u16, terms: LearnTerms) -> Result<(), MapsError> {
        let mut map: HashMap<MapData, u32, LearnTerms> = open_as(&self.pins, names::TLS_LEARN)?;
        map.insert(u32::from(port), terms, 0)
            .map_err(op(names::TLS_LEARN))
    }

    /// Stops learning the sessions of the server on `port`; whether it was learning.
    pub fn remove_learn_terms(&mut self, port: u16) -> Result<bool, MapsError> {
        let mut map: HashMap<MapData, u32, LearnTerms> = open_as(&self.pins, names::TLS_LEARN)?;
        match map.remove(&u32::from(port)) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(op(names::TLS_LEARN)(e)),
        }
    }

    /// The ports whose sessions the NIC learns, with their terms, sorted by port.
    pub fn learn_terms(&self) -> Result<Vec<(u16, LearnTerms)>, MapsError> {
        let map: HashMap<MapData, u32, LearnTerms> = open_as(&self.pins, names::TLS_LEARN)?;
        let mut out = map
            .iter()
            .map(|r| r.map(|(k, v)| (k as u16, v)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_LEARN))?;
        out.sort_by_key(|(p, _)| *p);
        Ok(out)
    }

    /// Makes `keys` the ticket keys of the server on `port` (`TLS_TICKET_KEYS`): writes those
    /// that differ and removes the port's others. Returns (written, removed).
    pub fn set_ticket_keys(
        &mut self,
        port: u16,
        keys: &[(TicketKeyId, TicketMacKey)],
    ) -> Result<(usize, usize), MapsError> {
        let mut map: HashMap<MapData, TicketKeyId, TicketMacKey> =
            open_as(&self.pins, names::TLS_TICKET_KEYS)?;
        let held: Vec<(TicketKeyId, TicketMacKey)> = map.iter().filter_map(Result::ok).collect();
        let mut written = 0;
        for (id, key) in keys {
            if !held.iter().any(|(i, k)| i == id && k == key) {
                map.insert(id, key, 0).map_err(op(names::TLS_TICKET_KEYS))?;
                written += 1;
            }
        }
        let mut removed = 0;
        for (id, _) in held {
            if id.port == port && !keys.iter().any(|(i, _)| *i == id) {
                let _ = map.remove(&id);
                removed += 1;
            }
        }
        Ok((written, removed))
    }

    /// The ticket keys held, sorted by port and name.
    pub fn ticket_keys(&self) -> Result<Vec<(TicketKeyId, TicketMacKey)>, MapsError> {
        let map: HashMap<MapData, TicketKeyId, TicketMacKey> =
            open_as(&self.pins, names::TLS_TICKET_KEYS)?;
        let mut out = map
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_TICKET_KEYS))?;
        out.sort_by_key(|(k, _)| (k.port, k.name));
        Ok(out)
    }

    /// Removes every issued key the NIC published for a ticket whose MAC it checked
    /// ([`ISSUED_BY_KEY`]): after a ticket key was removed, no key it vouched for stays (the
    /// others' next offers are checked again). Returns how many.
    pub fn remove_issued_by_key(&mut self) -> Result<usize, MapsError> {
        self.remove_issued_where(|v| v.kind & ISSUED_BY_KEY != 0)
    }

    /// Every ticket tag key written, sorted by port and period.
    pub fn tag_keys(&self) -> Result<Vec<(TagKeyId, TagKey)>, MapsError> {
        let map: HashMap<MapData, TagKeyId, TagKey> = open_as(&self.pins, names::TLS_TAG_KEYS)?;
        let mut out = map
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_TAG_KEYS))?;
        out.sort_by_key(|(k, _)| (k.port, k.period));
        Ok(out)
    }

    /// The issued-keys table, opened on first use.
    fn issued_map(&self) -> Result<&HashMap<MapData, IssuedKey, IssuedValue>, MapsError> {
        if let Some(m) = self.tls_issued.get() {
            return Ok(m);
        }
        let m = open_as(&self.pins, names::TLS_ISSUED)?;
        Ok(self.tls_issued.get_or_init(|| m))
    }

    /// [`Maps::issued_map`], to change it.
    fn issued_map_mut(
        &mut self,
    ) -> Result<&mut HashMap<MapData, IssuedKey, IssuedValue>, MapsError> {
        self.issued_map()?;
        Ok(self.tls_issued.get_mut().expect("opened just now"))
    }

    /// Whether an issued session key is published (and not withdrawn).
    pub fn is_issued(&self, key: &IssuedKey) -> Result<bool, MapsError> {
        match self.issued_map()?.get(key, 0) {
            Ok(v) => Ok(v.kind & ISSUED_WITHDRAWN == 0),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::TLS_ISSUED)(e)),
        }
    }

    /// Every published key, sorted.
    pub fn issued(&self) -> Result<Vec<(IssuedKey, IssuedValue)>, MapsError> {
        let mut out = self
            .issued_map()?
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_ISSUED))?;
        out.sort_by_key(|(k, _)| *k);
        Ok(out)
    }

    /// Forgets every pending unit without counting its end: for test fixtures that replay frames
    /// as if never seen (the backlog counters still hold the forgotten units). The places the
    /// forgotten resumed units held of their issued keys are forgotten with them.
    pub fn forget_pending(&mut self) -> Result<(), MapsError> {
        clear(&mut self.tls_pending, names::TLS_PENDING)?;
        clear(&mut self.sip_pending, names::SIP_PENDING)?;
        clear(&mut self.tls_holds, names::TLS_HOLDS)?;
        // An older build's table (another layout: the benchmark's comparison) cannot be read
        // here; its keys' places are left as they are.
        let issued = match self.issued() {
            Ok(issued) => issued,
            Err(MapsError::Op {
                source: MapError::InvalidValueSize { .. },
                ..
            }) => return Ok(()),
            Err(e) => return Err(e),
        };
        for (key, value) in issued {
            if value.in_use != 0 || value.open != 0 {
                self.add_issued(
                    key,
                    IssuedValue {
                        in_use: 0,
                        open: 0,
                        ..value
                    },
                )?;
            }
        }
        Ok(())
    }

    /// Every resumed connection that holds a place of its issued key past its first flight.
    pub fn tls_holds(&self) -> Result<Vec<(FlowKey, TlsHold)>, MapsError> {
        self.tls_holds
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_HOLDS))
    }

    /// Marks the hold `key` (as read: `hold`) as one whose connection is gone: the datapath's
    /// next TLS sweep gives its place back (the datapath alone changes the counts). `false` when
    /// the hold had ended in the meantime.
    pub fn mark_tls_hold_gone(&mut self, key: &FlowKey, hold: TlsHold) -> Result<bool, MapsError> {
        match self
            .tls_holds
            .insert(key, TlsHold { gone: 1, ..hold }, BPF_EXIST)
        {
            Ok(()) => Ok(true),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::TLS_HOLDS)(e)),
        }
    }

    /// Every admitted TLS connection the server has not answered yet.
    pub fn tls_pending(&self) -> Result<Vec<(FlowKey, Pending)>, MapsError> {
        self.tls_pending
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_PENDING))
    }

    /// At most `at_most` of the pending SIP requests (every SIP class's), as read now. The table
    /// changes while it is read, so a unit may be missed or read twice; the cap bounds the work.
    pub fn sip_pending(&self, at_most: usize) -> Result<Vec<Pending>, MapsError> {
        self.sip_pending
            .iter()
            .take(at_most)
            .map(|r| r.map(|(_, unit)| unit))
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::SIP_PENDING))
    }

    /// Marks the pending unit `key` (as read: `unit`) as one whose connection is gone: its
    /// deadline set to 0, so the datapath's next sweep of its class ends it as expired and
    /// counts it there (the datapath alone counts ends, so the backlog stays exact). `false`
    /// when the unit had ended in the meantime.
    pub fn mark_tls_unit_gone(&mut self, key: &FlowKey, unit: Pending) -> Result<bool, MapsError> {
        const BPF_EXIST: u64 = 2;
        let gone = Pending {
            deadline_ns: 0,
            ..unit
        };
        match self.tls_pending.insert(key, gone, BPF_EXIST) {
            Ok(()) => Ok(true),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::TLS_PENDING)(e)),
        }
    }

    /// Every tracked TLS connection, IPv4 ones (`TLS_FLOWS4`) by their IPv4-mapped key.
    pub fn tls_flows(&self) -> Result<Vec<(FlowKey, TlsFlow)>, MapsError> {
        let mut flows = self
            .tls_flows
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_FLOWS))?;
        if let Some(v4) = self.tls_flows4()? {
            for entry in v4.iter() {
                let (key, flow) = entry.map_err(op(names::TLS_FLOWS4))?;
                flows.push((key.mapped(), flow));
            }
        }
        Ok(flows)
    }

    /// The IPv4 flow table; `None` when it is not pinned (a datapath pinned by a build before
    /// it, whose IPv4 connections are in `TLS_FLOWS` until the next attach moves them).
    fn tls_flows4(&self) -> Result<Option<HashMap<MapData, FlowKey4, TlsFlow>>, MapsError> {
        if !self.pins.map(names::TLS_FLOWS4).exists() {
            return Ok(None);
        }
        open_as(&self.pins, names::TLS_FLOWS4).map(Some)
    }

    /// Forgets every tracked TLS connection, the refused ones in `TLS_REFUSED` too.
    pub fn clear_tls_flows(&mut self) -> Result<(), MapsError> {
        clear(&mut self.tls_flows, names::TLS_FLOWS)?;
        if let Some(mut v4) = self.tls_flows4()? {
            clear(&mut v4, names::TLS_FLOWS4)?;
        }
        refused_slots(&self.pins, |slots, n| {
            // SAFETY: `n` slots of the mapped array; all-zero is an empty slot.
            unsafe { std::ptr::write_bytes(slots, 0, n) }
        })?;
        Ok(())
    }

    /// The connections `TLS_REFUSED` remembers as refused on their first segment (none, for a
    /// datapath pinned by a build before the table).
    pub fn tls_refused(&self) -> Result<Vec<FlowKey>, MapsError> {
        let keys = refused_slots(&self.pins, |slots, n| {
            (0..n)
                // SAFETY: slot `i < n` of the mapped array, aligned (8-byte elements).
                .map(|i| unsafe { slots.add(i).read_volatile() })
                .filter(|k| *k != FlowKey::default())
                .collect()
        })?;
        Ok(keys.unwrap_or_default())
    }

    /// Every SIP transaction seen (key, state).
    pub fn sip_txns(&self) -> Result<Vec<(u64, SipTxn)>, MapsError> {
        self.sip_txns
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::SIP_TXNS))
    }

    /// Forgets every SIP transaction.
    pub fn clear_sip_txns(&mut self) -> Result<(), MapsError> {
        clear(&mut self.sip_txns, names::SIP_TXNS)
    }

    /// The service-time histogram of one class, summed over CPUs.
    pub fn latency(&self, class: Class) -> Result<LatencyHistogram, MapsError> {
        sum(&self.service_latency, class.id(), names::SERVICE_LATENCY)
    }

    /// `sip-original`'s method family `index` (`SIP_FAMILY_*`): its backlog counters and its
    /// limit (0: none).
    pub fn sip_family(&self, index: u32) -> Result<(SipFamily, u64), MapsError> {
        let map: Array<MapData, SipFamily> = open_as(&self.pins, names::SIP_FAMILIES)?;
        let limits: Array<MapData, u64> = open_as(&self.pins, names::SIP_FAMILY_LIMITS)?;
        Ok((
            map.get(&index, 0).map_err(op(names::SIP_FAMILIES))?,
            limits
                .get(&index, 0)
                .map_err(op(names::SIP_FAMILY_LIMITS))?,
        ))
    }

    /// Sets the backlog limit of `sip-original`'s method family `index` (0: none).
    pub fn set_sip_family_limit(&mut self, index: u32, limit: u64) -> Result<(), MapsError> {
        if self.sip_family_limits.get().is_none() {
            let m = open_as(&self.pins, names::SIP_FAMILY_LIMITS)?;
            let _ = self.sip_family_limits.set(m);
        }
        let Some(map) = self.sip_family_limits.get_mut() else {
            unreachable!("opened above");
        };
        if map.get(&index, 0).map_err(op(names::SIP_FAMILY_LIMITS))? == limit {
            return Ok(());
        }
        map.set(index, limit, 0)
            .map_err(op(names::SIP_FAMILY_LIMITS))
    }

    /// The fine service times of `slot` (a class id, or
    /// [`gateway_common::maps::SLOT_SIP_INVITE`]) summed over CPUs.
    pub fn service_times(&self, slot: u32) -> Result<ServiceTimes, MapsError> {
        let map = match self.service_times.get() {
            Some(m) => m,
            None => {
                let m = open_as(&self.pins, names::SERVICE_TIMES)?;
                self.service_times.get_or_init(|| m)
            }
        };
        sum(map, slot, names::SERVICE_TIMES)
    }
}
