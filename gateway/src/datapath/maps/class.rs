//! The classes' maps: their counters, policy and admission state (`gateway_common::maps::class`).

use aya::maps::{Array, MapData, PerCpuArray};
use gateway_common::{
    Class, NUM_CLASSES,
    maps::{ClassPolicy, ClassState, ClassStats, names},
};

use super::{Maps, MapsError, op, open_as, sum};
use crate::datapath::pins::PinDir;

/// The classes' maps: their counters, policy and admission state (`gateway_common::maps::class`).
pub struct ClassMaps {
    pub(super) stats: PerCpuArray<MapData, ClassStats>,
    pub(super) policy: Array<MapData, ClassPolicy>,
    pub(super) state: Array<MapData, ClassState>,
}

impl ClassMaps {
    /// Opens them where `pins` has them pinned.
    pub(super) fn open(pins: &PinDir) -> Result<Self, MapsError> {
        Ok(ClassMaps {
            stats: open_as(pins, names::CLASS_STATS)?,
            policy: open_as(pins, names::CLASS_POLICY)?,
            state: open_as(pins, names::CLASS_STATE)?,
        })
    }
}

impl Maps {
    /// Per-class counters summed over CPUs, in class id order.
    pub fn class_stats(&self) -> Result<[ClassStats; NUM_CLASSES], MapsError> {
        let mut out = [ClassStats::default(); NUM_CLASSES];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = sum(&self.class.stats, i as u32, names::CLASS_STATS)?;
        }
        Ok(out)
    }

    /// Admission state of every class.
    pub fn class_state(&self) -> Result<[ClassState; NUM_CLASSES], MapsError> {
        let mut out = [ClassState::default(); NUM_CLASSES];
        for (i, slot) in out.iter_mut().enumerate() {
            *slot = self
                .class
                .state
                .get(&(i as u32), 0)
                .map_err(op(names::CLASS_STATE))?;
        }
        Ok(out)
    }

    /// The policy of one class.
    pub fn policy(&self, class: Class) -> Result<ClassPolicy, MapsError> {
        self.class
            .policy
            .get(&class.id(), 0)
            .map_err(op(names::CLASS_POLICY))
    }

    /// Replaces the policy of one class.
    pub fn set_policy(&mut self, class: Class, policy: ClassPolicy) -> Result<(), MapsError> {
        self.class
            .policy
            .set(class.id(), policy, 0)
            .map_err(op(names::CLASS_POLICY))
    }
}
