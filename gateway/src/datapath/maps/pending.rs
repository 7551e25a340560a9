//! The pending units: admitted TLS connections and SIP requests not yet answered, and the places of issued keys they hold (`gateway_common::maps::pending`).

use aya::maps::{HashMap, MapData, MapError};
use gateway_common::maps::{FlowKey, IssuedValue, Pending, TlsHold, names};

use super::{BPF_EXIST, Maps, MapsError, clear, op, open_as};
use crate::datapath::pins::PinDir;

/// The pending units: admitted TLS connections and SIP requests not yet answered, and the places of issued keys they hold (`gateway_common::maps::pending`).
pub struct PendingMaps {
    pub(super) tls_pending: HashMap<MapData, FlowKey, Pending>,
    pub(super) sip_pending: HashMap<MapData, u64, Pending>,
    pub(super) tls_holds: HashMap<MapData, FlowKey, TlsHold>,
}

impl PendingMaps {
    /// Opens them where `pins` has them pinned.
    pub(super) fn open(pins: &PinDir) -> Result<Self, MapsError> {
        Ok(PendingMaps {
            tls_pending: open_as(pins, names::TLS_PENDING)?,
            sip_pending: open_as(pins, names::SIP_PENDING)?,
            tls_holds: open_as(pins, names::TLS_HOLDS)?,
        })
    }
}

impl Maps {
    /// Forgets every pending unit without counting its end: for test fixtures that replay frames
    /// as if never seen (the backlog counters still hold the forgotten units). The places the
    /// forgotten resumed units held of their issued keys are forgotten with them.
    pub fn forget_pending(&mut self) -> Result<(), MapsError> {
        clear(&mut self.pending.tls_pending, names::TLS_PENDING)?;
        clear(&mut self.pending.sip_pending, names::SIP_PENDING)?;
        clear(&mut self.pending.tls_holds, names::TLS_HOLDS)?;
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
        self.pending
            .tls_holds
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_HOLDS))
    }

    /// Marks the hold `key` (as read: `hold`) as one whose connection is gone: the datapath's
    /// next TLS sweep gives its place back (the datapath alone changes the counts). `false` when
    /// the hold had ended in the meantime.
    pub fn mark_tls_hold_gone(&mut self, key: &FlowKey, hold: TlsHold) -> Result<bool, MapsError> {
        match self
            .pending
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
        self.pending
            .tls_pending
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_PENDING))
    }

    /// At most `at_most` of the pending SIP requests (every SIP class's), as read now. The table
    /// changes while it is read, so a unit may be missed or read twice; the cap bounds the work.
    pub fn sip_pending(&self, at_most: usize) -> Result<Vec<Pending>, MapsError> {
        self.pending
            .sip_pending
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
        match self.pending.tls_pending.insert(key, gone, BPF_EXIST) {
            Ok(()) => Ok(true),
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::TLS_PENDING)(e)),
        }
    }
}
