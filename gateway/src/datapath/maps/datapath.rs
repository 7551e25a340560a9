//! The datapath-wide maps: its settings, its parser counters and the key of its metadata tags; the clocks the datapath's times are read against (`gateway_common::maps::datapath`).

use aya::maps::{Array, MapData, PerCpuArray};
use gateway_common::maps::{DatapathConfig, DatapathCounters, names};

use super::{Maps, MapsError, op, open_as, sum};
use crate::datapath::pins::PinDir;

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

/// The datapath-wide maps: its settings, its parser counters and the key of its metadata tags; the clocks the datapath's times are read against (`gateway_common::maps::datapath`).
pub struct DatapathMaps {
    /// Opened when first read: an older build's object (the benchmark's comparison) has fewer
    /// counters.
    pub(super) counters: std::sync::OnceLock<PerCpuArray<MapData, DatapathCounters>>,
    pub(super) config: Array<MapData, DatapathConfig>,
}

impl DatapathMaps {
    /// Opens them where `pins` has them pinned.
    pub(super) fn open(pins: &PinDir) -> Result<Self, MapsError> {
        Ok(DatapathMaps {
            counters: std::sync::OnceLock::new(),
            config: open_as(pins, names::DP_CONFIG)?,
        })
    }
}

impl Maps {
    /// Parser counters summed over CPUs.
    pub fn counters(&self) -> Result<DatapathCounters, MapsError> {
        let map = match self.datapath.counters.get() {
            Some(m) => m,
            None => {
                let m = open_as(&self.pins, names::DP_COUNTERS)?;
                self.datapath.counters.get_or_init(|| m)
            }
        };
        sum(map, 0, names::DP_COUNTERS)
    }

    /// Datapath-wide settings.
    pub fn config(&self) -> Result<DatapathConfig, MapsError> {
        self.datapath
            .config
            .get(&0, 0)
            .map_err(op(names::DP_CONFIG))
    }

    /// Replaces the datapath-wide settings.
    pub fn set_config(&mut self, config: DatapathConfig) -> Result<(), MapsError> {
        self.datapath
            .config
            .set(0, config, 0)
            .map_err(op(names::DP_CONFIG))
    }
}
