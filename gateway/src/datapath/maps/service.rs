//! The services' maps: the operator-facing list and the datapath's port index, and the SYN cookies' secret a service in that mode needs (`gateway_common::maps::service`).

use aya::maps::{Array, HashMap, MapData, MapError};
use gateway_common::{
    maps::{IPPROTO_TCP, SERVICE_SYN_COOKIES, ServiceKey, ServiceValue, names},
    syncookie::CookieKey,
};

use super::{Maps, MapsError, op, open_as};
use crate::datapath::pins::PinDir;

/// The `SERVICE_PORTS` index function for one protocol.
fn service_port_index(proto: u8) -> Option<impl Fn(u16) -> u32> {
    gateway_common::maps::service_port_index(proto, 0)
        .map(|_| move |port| gateway_common::maps::service_port_index(proto, port).unwrap_or(0))
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

/// The services' maps: the operator-facing list and the datapath's port index, and the SYN cookies' secret a service in that mode needs (`gateway_common::maps::service`).
pub struct ServiceMaps {
    pub(super) services: HashMap<MapData, ServiceKey, ServiceValue>,
    pub(super) service_ports: Array<MapData, u8>,
}

impl ServiceMaps {
    /// Opens them where `pins` has them pinned.
    pub(super) fn open(pins: &PinDir) -> Result<Self, MapsError> {
        Ok(ServiceMaps {
            services: open_as(pins, names::SERVICES)?,
            service_ports: open_as(pins, names::SERVICE_PORTS)?,
        })
    }
}

impl Maps {
    /// Every protected service, sorted.
    pub fn services(&self) -> Result<Vec<(ServiceKey, ServiceValue)>, MapsError> {
        let mut out = self
            .service
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
        self.service
            .services
            .insert(key, value, 0)
            .map_err(|e| match e {
                MapError::SyscallError(ref s) if s.io_error.raw_os_error() == Some(libc::E2BIG) => {
                    MapsError::ServicesFull(gateway_common::maps::MAX_SERVICES)
                }
                e => op(names::SERVICES)(e),
            })?;
        self.service
            .service_ports
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
        self.service
            .service_ports
            .set(index(key.port), 0, 0)
            .map_err(op(names::SERVICE_PORTS))?;
        match self.service.services.remove(&key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::SERVICES)(e)),
        }
    }
}
