//! The protected services: the services map's key and value, the service kinds, and the
//! `SERVICE_PORTS` index the datapath reads.

super::pinned_maps! {
    /// Protected services, keyed by [`crate::maps::ServiceKey`]: the operator-facing source of truth.
    SERVICES: ServiceKey => ServiceValue,
    /// The datapath's index of [`SERVICES`]: one byte of service kind per (protocol, port), see
    /// [`crate::maps::service_port_index`].
    SERVICE_PORTS: u32 => u8,
}

/// Maximum number of protected services (entries of the services map).
pub const MAX_SERVICES: u32 = 256;

/// Entries of the `SERVICE_PORTS` array: every port of TCP, then every port of UDP.
pub const SERVICE_PORT_ENTRIES: u32 = 2 * 65536;

/// Index of (`proto`, `port`) in the `SERVICE_PORTS` array, whose byte holds the
/// [`ServiceKind`] id (0: not protected). The datapath reads this array rather than the hash map:
/// an array lookup is inlined by the verifier, so traffic to unprotected ports costs no hash
/// lookup. `None` for protocols other than TCP and UDP.
#[inline(always)]
pub const fn service_port_index(proto: u8, port: u16) -> Option<u32> {
    match proto {
        IPPROTO_TCP => Some(port as u32),
        IPPROTO_UDP => Some(65536 + port as u32),
        _ => None,
    }
}

/// IP protocol number of TCP.
pub const IPPROTO_TCP: u8 = 6;
/// IP protocol number of UDP.
pub const IPPROTO_UDP: u8 = 17;

/// Key of the services map: the L4 protocol and destination port of a protected service.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    /// Destination port, host byte order.
    pub port: u16,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub proto: u8,
    /// Padding, zero.
    pub pad: u8,
}

impl ServiceKey {
    /// A key for `proto`/`port`.
    pub const fn new(proto: u8, port: u16) -> Self {
        ServiceKey {
            port,
            proto,
            pad: 0,
        }
    }
}

/// What kind of protected service a port carries.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ServiceKind {
    /// TLS over TCP.
    Tls = 1,
    /// SIP (over UDP; SIP over TCP is counted but not classified).
    Sip = 2,
}

impl ServiceKind {
    /// Every kind.
    pub const ALL: [ServiceKind; 2] = [ServiceKind::Tls, ServiceKind::Sip];

    /// The kind of this name ([`ServiceKind::name`]).
    pub fn from_name(name: &str) -> Option<ServiceKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }

    /// The kind with this numeric id.
    pub const fn from_id(id: u32) -> Option<ServiceKind> {
        match id {
            1 => Some(ServiceKind::Tls),
            2 => Some(ServiceKind::Sip),
            _ => None,
        }
    }

    /// Name used by the CLI and the config file.
    pub const fn name(self) -> &'static str {
        match self {
            ServiceKind::Tls => "tls",
            ServiceKind::Sip => "sip",
        }
    }
}

/// Value of the services map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServiceValue {
    /// A [`ServiceKind`] id.
    pub kind: u32,
    /// `SERVICE_*` bits.
    pub flags: u32,
}

/// [`ServiceValue::flags`]: the gateway daemon terminates this (TLS) service itself (its own
/// proxy listener). Informational: completions are counted the same way for every service.
pub const SERVICE_TERMINATED: u32 = 1 << 0;

/// [`ServiceValue::flags`]: the NIC answers this (TLS) service's SYNs with SYN cookies and
/// judges each new connection's hello before the kernel holds anything for it
/// (`crate::syncookie`).
pub const SERVICE_SYN_COOKIES: u32 = 1 << 1;

/// The bit of a `SERVICE_PORTS` byte that says [`SERVICE_SYN_COOKIES`].
pub const PORT_SYN_COOKIES: u8 = 0x80;

impl ServiceValue {
    /// The service's byte in the `SERVICE_PORTS` array: its [`ServiceKind`] id, with
    /// [`PORT_SYN_COOKIES`] when in SYN-cookie mode.
    pub const fn port_byte(&self) -> u8 {
        if self.flags & SERVICE_SYN_COOKIES != 0 {
            self.kind as u8 | PORT_SYN_COOKIES
        } else {
            self.kind as u8
        }
    }
}

/// The service kind a `SERVICE_PORTS` byte carries (`None`: not protected).
#[inline(always)]
pub const fn port_kind(byte: u8) -> Option<ServiceKind> {
    ServiceKind::from_id((byte & !PORT_SYN_COOKIES) as u32)
}

/// Whether a `SERVICE_PORTS` byte says SYN-cookie mode ([`SERVICE_SYN_COOKIES`]).
#[inline(always)]
pub const fn port_syn_cookies(byte: u8) -> bool {
    byte & PORT_SYN_COOKIES != 0
}
