//! Protected services: what each speaks, on which transport and port.

use gateway_common::maps::{self, IPPROTO_TCP, IPPROTO_UDP, ServiceKey};
use serde::{Deserialize, Deserializer, Serialize};

/// Transport protocol of a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
}

impl Proto {
    /// IP protocol number.
    pub const fn number(self) -> u8 {
        match self {
            Proto::Tcp => IPPROTO_TCP,
            Proto::Udp => IPPROTO_UDP,
        }
    }

    /// From an IP protocol number.
    pub const fn from_number(n: u8) -> Option<Proto> {
        match n {
            IPPROTO_TCP => Some(Proto::Tcp),
            IPPROTO_UDP => Some(Proto::Udp),
            _ => None,
        }
    }

    /// Name.
    pub const fn name(self) -> &'static str {
        match self {
            Proto::Tcp => "tcp",
            Proto::Udp => "udp",
        }
    }
}

/// The kind of a service: the datapath's own (`gateway_common::maps::ServiceKind`), written by
/// its name in the config ([`kind_name`]) and on the command line ([`parse_kind`]).
pub use maps::ServiceKind;

/// The names of the service kinds, in the order of `ServiceKind::ALL`.
const KIND_NAMES: [&str; 2] = [ServiceKind::ALL[0].name(), ServiceKind::ALL[1].name()];
const _: () = assert!(KIND_NAMES.len() == ServiceKind::ALL.len());

/// The CLI's parser of a service kind, by name, listing the names in `--help`.
pub fn parse_kind() -> impl clap::builder::TypedValueParser<Value = ServiceKind> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(KIND_NAMES)
        .map(|s: String| ServiceKind::from_name(&s).expect("one of the possible values"))
}

/// A service kind in the config, by its name.
pub mod kind_name {
    use serde::{Deserialize, Deserializer, Serializer, de::Error as _};

    use super::{KIND_NAMES, ServiceKind};

    /// Writes the kind's name.
    pub fn serialize<S: Serializer>(kind: &ServiceKind, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(kind.name())
    }

    /// Reads a kind's name; any other string is an unknown variant, named with the ones known.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<ServiceKind, D::Error> {
        let name = String::deserialize(d)?;
        ServiceKind::from_name(&name).ok_or_else(|| D::Error::unknown_variant(&name, &KIND_NAMES))
    }
}

/// Whether the NIC classifies `kind` over `proto`; why not. TLS runs over TCP; SIP is
/// classified over UDP only (over TCP its packets would count as `other`, protected by
/// nothing, while the service list said otherwise).
pub fn check_proto(kind: ServiceKind, proto: Proto) -> Result<(), String> {
    match (kind, proto) {
        (ServiceKind::Tls, Proto::Tcp) | (ServiceKind::Sip, Proto::Udp) => Ok(()),
        (ServiceKind::Tls, Proto::Udp) => Err("tls runs over tcp (DTLS is not classified)".into()),
        (ServiceKind::Sip, Proto::Tcp) => Err(
            "sip is classified over udp only: over tcp its packets would be `other`, \
             protected by nothing"
                .into(),
        ),
    }
}

/// The transport `kind` uses unless told otherwise.
pub const fn default_proto(kind: ServiceKind) -> Proto {
    match kind {
        ServiceKind::Tls => Proto::Tcp,
        ServiceKind::Sip => Proto::Udp,
    }
}

/// A port number, 1 to 65535.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Port(pub u16);

impl<'de> Deserialize<'de> for Port {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = crate::count::Count {
            what: "port",
            min: 1,
            max: 65535,
        }
        .read(d)?;
        Ok(Port(v as u16))
    }
}

/// One protected service.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Service {
    /// What it speaks.
    #[serde(with = "kind_name")]
    pub kind: ServiceKind,
    /// Destination port.
    pub port: Port,
    /// Transport; defaults per kind.
    #[serde(default)]
    pub proto: Option<Proto>,
    /// TLS over TCP only: the NIC answers SYNs with SYN cookies and judges each new
    /// connection's hello before the kernel holds anything for it (a socket, a place in its
    /// queues); only admitted connections are handed to the listener. Unset, on wherever the
    /// kernel can hand connections to listeners from BPF (Linux 6.9 and later); `true` refuses
    /// the service on a kernel that cannot; `false` leaves SYNs to the kernel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syn_cookies: Option<bool>,
    /// TLS only: a server the gateway does not terminate (nginx, HAProxy, Envoy), whose
    /// sessions the NIC learns from its packets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server: Option<super::server::TlsServer>,
}

impl Service {
    /// The transport in effect.
    pub fn proto(&self) -> Proto {
        self.proto.unwrap_or(default_proto(self.kind))
    }

    /// Whether the NIC answers this service's SYNs with cookies: as set, else on for TLS over
    /// TCP where the kernel can hand connections over (`kernel_can`).
    pub fn syn_cookies(&self, kernel_can: bool) -> bool {
        self.syn_cookies
            .unwrap_or(kernel_can && cookies_by_default(self.kind, self.proto()))
    }

    /// The services-map key.
    pub fn key(&self) -> ServiceKey {
        ServiceKey::new(self.proto().number(), self.port.0)
    }
}

/// The service list; (proto, port) pairs are unique.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Services(pub Vec<Service>);

/// Whether a service of `kind` over `proto` has SYN cookies unless its config says otherwise
/// (where the kernel can hand connections over): TLS over TCP, whose new connections a flood
/// of hellos would otherwise hold in the kernel's queues before they are judged.
pub const fn cookies_by_default(kind: ServiceKind, proto: Proto) -> bool {
    matches!((kind, proto), (ServiceKind::Tls, Proto::Tcp))
}
