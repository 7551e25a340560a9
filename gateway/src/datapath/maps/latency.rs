//! The completion times: per class, and the SIP service times by method family (`gateway_common::maps::latency`).

use aya::maps::{MapData, PerCpuArray};
use gateway_common::{
    Class,
    maps::{LatencyHistogram, ServiceTimes, names},
};

use super::{Maps, MapsError, open_as, sum};
use crate::datapath::pins::PinDir;

/// The completion times: per class, and the SIP service times by method family (`gateway_common::maps::latency`).
pub struct LatencyMaps {
    pub(super) service_latency: PerCpuArray<MapData, LatencyHistogram>,
    /// Opened when first used: an older build's object has no such map.
    pub(super) service_times: std::sync::OnceLock<PerCpuArray<MapData, ServiceTimes>>,
}

impl LatencyMaps {
    /// Opens them where `pins` has them pinned.
    pub(super) fn open(pins: &PinDir) -> Result<Self, MapsError> {
        Ok(LatencyMaps {
            service_latency: open_as(pins, names::SERVICE_LATENCY)?,
            service_times: std::sync::OnceLock::new(),
        })
    }
}

impl Maps {
    /// The service-time histogram of one class, summed over CPUs.
    pub fn latency(&self, class: Class) -> Result<LatencyHistogram, MapsError> {
        sum(
            &self.latency.service_latency,
            class.id(),
            names::SERVICE_LATENCY,
        )
    }

    /// The fine service times of `slot` (a class id, or
    /// [`gateway_common::maps::SLOT_SIP_INVITE`]) summed over CPUs.
    pub fn service_times(&self, slot: u32) -> Result<ServiceTimes, MapsError> {
        let map = match self.latency.service_times.get() {
            Some(m) => m,
            None => {
                let m = open_as(&self.pins, names::SERVICE_TIMES)?;
                self.latency.service_times.get_or_init(|| m)
            }
        };
        sum(map, slot, names::SERVICE_TIMES)
    }
}
