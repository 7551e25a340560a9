//! The SIP maps: the transactions and the method families' limits (`gateway_common::maps::sip`).

use aya::maps::{Array, HashMap, MapData};
use gateway_common::maps::{SipFamily, SipTxn, names};

use super::{Maps, MapsError, clear, op, open_as};
use crate::datapath::pins::PinDir;

/// The SIP maps: the transactions and the method families' limits (`gateway_common::maps::sip`).
pub struct SipMaps {
    pub(super) sip_txns: HashMap<MapData, u64, SipTxn>,
    /// Opened when first used, as `service_times` (the controller writes it every interval).
    pub(super) sip_family_limits: std::sync::OnceLock<Array<MapData, u64>>,
}

impl SipMaps {
    /// Opens them where `pins` has them pinned.
    pub(super) fn open(pins: &PinDir) -> Result<Self, MapsError> {
        Ok(SipMaps {
            sip_txns: open_as(pins, names::SIP_TXNS)?,
            sip_family_limits: std::sync::OnceLock::new(),
        })
    }
}

impl Maps {
    /// Every SIP transaction seen (key, state).
    pub fn sip_txns(&self) -> Result<Vec<(u64, SipTxn)>, MapsError> {
        self.sip
            .sip_txns
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::SIP_TXNS))
    }

    /// Forgets every SIP transaction.
    pub fn clear_sip_txns(&mut self) -> Result<(), MapsError> {
        clear(&mut self.sip.sip_txns, names::SIP_TXNS)
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
        if self.sip.sip_family_limits.get().is_none() {
            let m = open_as(&self.pins, names::SIP_FAMILY_LIMITS)?;
            let _ = self.sip.sip_family_limits.set(m);
        }
        let Some(map) = self.sip.sip_family_limits.get_mut() else {
            unreachable!("opened above");
        };
        if map.get(&index, 0).map_err(op(names::SIP_FAMILY_LIMITS))? == limit {
            return Ok(());
        }
        map.set(index, limit, 0)
            .map_err(op(names::SIP_FAMILY_LIMITS))
    }
}
