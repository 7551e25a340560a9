//! The real eBPF object loaded into the kernel (not attached anywhere), driven with
//! `BPF_PROG_TEST_RUN`, its maps pinned in a private bpffs so the daemon's own map code reads them.

use aya::{
    Ebpf,
    programs::{SchedClassifier, TestRun, TestRunOptions, Xdp},
};
use gateway::{loader, maps::Maps, pins::PinDir};
use gateway_common::{
    Class, NUM_CLASSES,
    maps::{ClassStats, DatapathCounters, ServiceKey, ServiceKind, ServiceValue, programs},
};

use crate::netns::Bpffs;

/// Which program to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// The XDP program.
    Xdp,
    /// The TC ingress program.
    Tc,
    /// The bare XDP_PASS baseline.
    BarePass,
}

/// A loaded datapath with pinned maps.
pub struct TestProgram {
    ebpf: Ebpf,
    /// Typed access to its maps.
    pub maps: Maps,
    _bpffs: Bpffs,
}

/// Snapshot of every counter, to diff around a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Counters {
    /// Per-class counters.
    pub classes: [ClassStats; NUM_CLASSES],
    /// Parser counters.
    pub datapath: DatapathCounters,
}

impl Counters {
    /// The one class whose packet count grew between `before` and `self`.
    pub fn class_since(&self, before: &Counters) -> Option<Class> {
        let grown: Vec<Class> = Class::ALL
            .into_iter()
            .filter(|c| {
                self.classes[c.id() as usize].packets > before.classes[c.id() as usize].packets
            })
            .collect();
        match grown.as_slice() {
            [c] => Some(*c),
            _ => None,
        }
    }
}

impl TestProgram {
    /// Loads the object and its three programs; protects tcp/443 (tls) and udp/5060 (sip).
    pub fn new() -> Self {
        let bpffs = Bpffs::new();
        let pd = PinDir::new(&bpffs.root(), "testrun");
        pd.create().expect("pin dir");
        let mut ebpf = loader::load_pinned(&pd, 0).expect("load object");
        for name in [programs::XDP, programs::XDP_BARE_PASS] {
            let p: &mut Xdp = ebpf.program_mut(name).unwrap().try_into().unwrap();
            p.load()
                .unwrap_or_else(|e| panic!("verifier refused {name}: {e:?}"));
        }
        let tc: &mut SchedClassifier = ebpf
            .program_mut(programs::TC_INGRESS)
            .unwrap()
            .try_into()
            .unwrap();
        tc.load()
            .unwrap_or_else(|e| panic!("verifier refused tc: {e:?}"));
        let mut maps = Maps::open(&pd).expect("maps");
        for (proto, port, kind) in [(6, 443, ServiceKind::Tls), (17, 5060, ServiceKind::Sip)] {
            maps.add_service(
                ServiceKey::new(proto, port),
                ServiceValue {
                    kind: kind as u32,
                    flags: 0,
                },
            )
            .unwrap();
        }
        TestProgram {
            ebpf,
            maps,
            _bpffs: bpffs,
        }
    }

    /// Runs one frame `repeat` times through `hook`; returns the action and the mean duration in
    /// nanoseconds per run as the kernel measured it. Panics if the kernel refuses the frame.
    pub fn run(&self, hook: Hook, frame: &[u8], repeat: u32) -> (u32, f64) {
        self.try_run(hook, frame, repeat)
            .unwrap_or_else(|e| panic!("test_run of {} bytes: {e:?}", frame.len()))
    }

    /// [`TestProgram::run`], returning the kernel's refusal instead of panicking. (The kernel
    /// builds a test skb for TC only when the IP header is complete.)
    pub fn try_run(
        &self,
        hook: Hook,
        frame: &[u8],
        repeat: u32,
    ) -> Result<(u32, f64), aya::programs::ProgramError> {
        let opts = TestRunOptions {
            data_in: Some(frame),
            repeat,
            ..Default::default()
        };
        let r = match hook {
            Hook::Xdp | Hook::BarePass => {
                let name = if hook == Hook::Xdp {
                    programs::XDP
                } else {
                    programs::XDP_BARE_PASS
                };
                let p: &Xdp = self.ebpf.program(name).unwrap().try_into().unwrap();
                p.test_run(opts)
            }
            Hook::Tc => {
                let p: &SchedClassifier = self
                    .ebpf
                    .program(programs::TC_INGRESS)
                    .unwrap()
                    .try_into()
                    .unwrap();
                p.test_run(opts)
            }
        }?;
        Ok((r.return_value, r.duration.as_nanos() as f64))
    }

    /// Every counter now.
    pub fn counters(&self) -> Counters {
        Counters {
            classes: self.maps.class_stats().unwrap(),
            datapath: self.maps.counters().unwrap(),
        }
    }
}

impl Default for TestProgram {
    fn default() -> Self {
        Self::new()
    }
}
