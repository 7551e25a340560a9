//! Typed access to the pinned maps of one interface, split by feature as `gateway_common::maps`
//! declares them: one module and one handle per feature (`class`, `service`, `datapath`, `tls`,
//! `sip`, `pending`, `latency`), each opening its own maps and holding the operations on them.
//! [`Maps`] holds one handle of each, and is what the daemon's parts and the CLI are given.

use aya::maps::{HashMap, Map, MapData, MapError, PerCpuArray};
use gateway_common::maps::{
    ClassStats, DatapathCounters, LatencyHistogram, ServiceTimes, TlsCounters,
};
use thiserror::Error;

mod class;
mod datapath;
mod latency;
mod pending;
mod service;
mod sip;
mod tls;

use class::ClassMaps;
use datapath::DatapathMaps;
pub use datapath::{
    change_config, draw_handover_key, ensure_handover_key, handover_key, monotonic_ns, read_config,
    set_handover_key, wall_clock_offset_ns,
};
use latency::LatencyMaps;
use pending::PendingMaps;
use service::ServiceMaps;
use sip::SipMaps;
use tls::TlsMaps;
pub use tls::{decode_reject, open_rejects};

use crate::datapath::pins::PinDir;

/// `BPF_MAP_UPDATE_ELEM`'s flag: only an entry that exists is changed.
const BPF_EXIST: u64 = 2;

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

/// Handles to every gateway map of one interface, by feature (each the typed handle of its
/// module, as `gateway_common::maps` declares them).
pub struct Maps {
    /// The classes'.
    class: ClassMaps,
    /// The services'.
    service: ServiceMaps,
    /// The datapath-wide ones.
    datapath: DatapathMaps,
    /// TLS's.
    tls: TlsMaps,
    /// SIP's.
    sip: SipMaps,
    /// The pending units'.
    pending: PendingMaps,
    /// The completion times'.
    latency: LatencyMaps,
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

impl Maps {
    /// Opens the maps pinned in `pins`.
    pub fn open(pins: &PinDir) -> Result<Self, MapsError> {
        Ok(Maps {
            class: ClassMaps::open(pins)?,
            service: ServiceMaps::open(pins)?,
            datapath: DatapathMaps::open(pins)?,
            tls: TlsMaps::open(pins)?,
            sip: SipMaps::open(pins)?,
            pending: PendingMaps::open(pins)?,
            latency: LatencyMaps::open(pins)?,
            pins: pins.clone(),
        })
    }
}
