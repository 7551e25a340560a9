//! The benchmark's floor programs (`gateway-ebpf/src/bin/floors.rs`, committed beside the
//! classifier's object): for each class of packet, the least work it needs, loaded into the
//! kernel and driven with `BPF_PROG_TEST_RUN`, so a row can read "gateway / floor" measured in
//! the same run as the classifier.

use aya::{
    Ebpf,
    maps::{Array, HashMap, MapData},
    programs::{TestRun, TestRunOptions, Xdp},
};
use gateway_common::maps::{IPPROTO_TCP, IPPROTO_UDP, ServiceKind, service_port_index};

/// The committed object of the floors (its sources are the classifier's: `cargo xtask
/// build-ebpf` writes both, and CI fails when they are stale).
static OBJECT: &[u8] = include_bytes!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../gateway-ebpf/prebuilt/floors.bpf.o"
));

/// One floor program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Floor {
    /// Counter, parse, service-port ARRAY lookup.
    NonService,
    /// And a flow HASH lookup that hits.
    Flow,
    /// And, the flow unknown, the hello's extensions walked, the clock, a bucket, one LRU insert.
    NewHello,
    /// A new hello's, and the PSK identity looked up among issued keys.
    ResumedHello,
    /// The SIP headers' end found eight bytes at a time, the transaction looked up (a hit).
    SipRetransmission,
    /// The same, the transaction unknown: the clock, a bucket, one LRU insert.
    NewInvite,
    /// [`Floor::SipRetransmission`] with the transaction key the classifier's tables are keyed
    /// by (FNV-1a over the INVITE's keyed values, mixed into one key).
    SipRetransmissionKeyed,
    /// [`Floor::NewInvite`] with that key and the pending unit (one HASH insert more).
    NewInviteKeyed,
    /// [`Floor::NewHello`] with the pending unit.
    NewHelloUnit,
    /// [`Floor::ResumedHello`] with the pending unit.
    ResumedHelloUnit,
}

impl Floor {
    /// Every floor.
    pub const ALL: [Floor; 10] = [
        Floor::NonService,
        Floor::Flow,
        Floor::NewHello,
        Floor::ResumedHello,
        Floor::SipRetransmission,
        Floor::NewInvite,
        Floor::SipRetransmissionKeyed,
        Floor::NewInviteKeyed,
        Floor::NewHelloUnit,
        Floor::ResumedHelloUnit,
    ];

    /// The program's name in the object.
    pub fn program(self) -> &'static str {
        match self {
            Floor::NonService => "floor_non_service",
            Floor::Flow => "floor_flow",
            Floor::NewHello => "floor_new_hello",
            Floor::ResumedHello => "floor_resumed_hello",
            Floor::SipRetransmission => "floor_sip_retransmission",
            Floor::NewInvite => "floor_new_invite",
            Floor::SipRetransmissionKeyed => "floor_sip_retransmission_keyed",
            Floor::NewInviteKeyed => "floor_new_invite_keyed",
            Floor::NewHelloUnit => "floor_new_hello_unit",
            Floor::ResumedHelloUnit => "floor_resumed_hello_unit",
        }
    }
}

/// The floors, loaded, with TCP 443 a TLS service and UDP 5060 a SIP one (the ports of the
/// benchmark's frames).
pub struct Floors {
    ebpf: Ebpf,
}

impl Floors {
    /// Loads every floor program and marks the benchmark's service ports.
    pub fn load() -> Self {
        let mut ebpf = Ebpf::load(OBJECT).expect("load the floors' object");
        {
            let mut ports: Array<&mut MapData, u8> =
                Array::try_from(ebpf.map_mut("FLOOR_PORTS").expect("FLOOR_PORTS"))
                    .expect("FLOOR_PORTS is an array of bytes");
            for (proto, port, kind) in [
                (IPPROTO_TCP, 443, ServiceKind::Tls),
                (IPPROTO_UDP, 5060, ServiceKind::Sip),
            ] {
                let i = service_port_index(proto, port).expect("TCP or UDP");
                ports.set(i, kind as u8, 0).expect("mark a service port");
            }
        }
        for floor in Floor::ALL {
            let prog: &mut Xdp = ebpf
                .program_mut(floor.program())
                .unwrap_or_else(|| panic!("{} in the floors' object", floor.program()))
                .try_into()
                .expect("an XDP program");
            prog.load()
                .unwrap_or_else(|e| panic!("load {}: {e}", floor.program()));
        }
        Floors { ebpf }
    }

    /// Runs `frame` through `floor` `repeat` times: its last action and the kernel's time per
    /// run, in ns.
    pub fn run(&self, floor: Floor, frame: &[u8], repeat: u32) -> (u32, f64) {
        let prog: &Xdp = self
            .ebpf
            .program(floor.program())
            .expect("loaded")
            .try_into()
            .expect("an XDP program");
        let r = prog
            .test_run(TestRunOptions {
                data_in: Some(frame),
                repeat,
                ..Default::default()
            })
            .unwrap_or_else(|e| panic!("test_run of {}: {e:?}", floor.program()));
        (r.return_value, r.duration.as_nanos() as f64)
    }

    /// Entries of the unit table and of the pending table (the keyed floors' units).
    pub fn held(&self) -> (usize, usize) {
        let count = |name: &str| {
            let map: HashMap<&MapData, [u8; 16], [u64; 8]> =
                HashMap::try_from(self.ebpf.map(name).expect(name))
                    .unwrap_or_else(|e| panic!("{name} is a hash of 16-byte keys: {e}"));
            map.keys().filter_map(Result::ok).count()
        };
        (count("FLOOR_UNITS"), count("FLOOR_PENDING"))
    }

    /// Empties the unit and pending tables, so a batch of new connections or transactions
    /// starts from none (as the classifier's batches do).
    pub fn forget(&mut self) {
        for name in ["FLOOR_UNITS", "FLOOR_PENDING"] {
            let mut units: HashMap<&mut MapData, [u8; 16], [u64; 8]> =
                HashMap::try_from(self.ebpf.map_mut(name).expect(name))
                    .unwrap_or_else(|e| panic!("{name} is a hash of 16-byte keys: {e}"));
            let keys: Vec<[u8; 16]> = units.keys().filter_map(Result::ok).collect();
            for k in keys {
                units.remove(&k).expect("remove a unit");
            }
        }
    }
}
