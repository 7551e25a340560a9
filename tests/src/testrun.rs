//! The real eBPF object loaded into the kernel (not attached anywhere), driven with
//! `BPF_PROG_TEST_RUN`, its maps pinned in a private bpffs so the daemon's own map code reads them.

use aya::{
    Ebpf,
    maps::Array,
    programs::{ProgramError, SchedClassifier, TestRun, TestRunOptions, Xdp},
};
use gateway::{datapath::loader, datapath::maps::Maps, datapath::pins::PinDir};
use gateway_common::{
    Class, NUM_CLASSES,
    bytes::SliceBytes,
    maps::{
        BenchFresh, ClassStats, DatapathCounters, IPPROTO_TCP, IPPROTO_UDP, ServiceKey,
        ServiceKind, ServiceValue, TlsCounters,
    },
    packet::{PacketKind, parse},
    programs,
    sip::parse_sip,
    tls::{
        FIRST_CONTINUES, FIRST_HELLO, FIRST_NO_HELLO_YET, HelloState, KEY_LEN, Verdict,
        first_records,
    },
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
    /// The XDP classifier on its frame made new for each run (`programs::XDP_BENCH_FRESH`, which
    /// jumps to it; [`TestProgram::freshen`] loads it and says how).
    Fresh,
    /// The sweep program (`programs::SWEEP`: every expired unit ended now), loaded on first use
    /// by [`TestProgram::load_sweep`].
    Sweep,
    /// The TC egress program.
    TcEgress,
    /// The finishing program at TC ingress (XDP modes: sends the client's reset of a refused
    /// connection).
    TcFinish,
}

/// A loaded datapath with pinned maps.
pub struct TestProgram {
    ebpf: Ebpf,
    /// Where the maps are pinned.
    pub pins: PinDir,
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
    /// TLS counters.
    pub tls: TlsCounters,
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

/// What the verifier and the kernel say of one loaded program.
#[derive(Clone, Debug)]
pub struct ProgramStats {
    /// The program's name in the object.
    pub name: String,
    /// Instructions the verifier processed to accept it (its limit is 1,000,000).
    pub verified: u32,
    /// Instructions of the program after the verifier's rewrites (its callbacks and
    /// subprograms included).
    pub translated: u32,
    /// Stack bytes of its main function's frame, and of the largest frame among its callbacks
    /// and subprograms (`frames`); the verifier's bound is 512 along any chain of calls.
    pub stack: (u32, u32),
}

/// The stack frame of each function of a program as `bpftool prog dump xlated` prints it: the
/// deepest offset below the frame pointer (`r10`) any of its instructions reaches, rounded up
/// to 8 bytes, by function, in order (the main function first).
pub fn frames(xlated: &str) -> Vec<(String, u32)> {
    let mut out: Vec<(String, u32)> = Vec::new();
    for line in xlated.lines() {
        if !line.starts_with(' ') && line.trim_end().ends_with(':') {
            let name = line.split('(').next().unwrap_or(line);
            let name = name.rsplit(' ').next().unwrap_or(name).to_owned();
            // A function's two headers (its BTF and its C prototype) name it once.
            if out.last().is_none_or(|(n, _)| *n != name) {
                out.push((name, 0));
            }
            continue;
        }
        let Some((_, depth)) = out.last_mut() else {
            continue;
        };
        for (i, _) in line.match_indices("(r10 -") {
            let digits: String = line[i + 6..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect();
            if let Ok(d) = digits.parse::<u32>() {
                *depth = (*depth).max(d.next_multiple_of(8));
            }
        }
    }
    out
}

/// [`frames`] of the loaded program `id` (`bpftool`, which `cargo xtask setup` installs).
fn program_frames(id: u32) -> Vec<(String, u32)> {
    let out = std::process::Command::new("bpftool")
        .args(["prog", "dump", "xlated", "id", &id.to_string()])
        .output()
        .expect("bpftool (cargo xtask setup installs it)");
    frames(&String::from_utf8_lossy(&out.stdout))
}

impl TestProgram {
    /// The metadata word the XDP program hands a frame over with for `tag` (`b"GWRS"`, ...):
    /// the tag mixed with this attachment's key, as the frame's first four bytes come out of
    /// a test run.
    pub fn meta_tag(&self, tag: &[u8; 4]) -> [u8; 4] {
        let key = gateway::datapath::maps::handover_key(&self.pins).unwrap();
        (u32::from_be_bytes(*tag) ^ key).to_ne_bytes()
    }

    /// Every loaded program of the object, by name.
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        let mut all: Vec<ProgramStats> = self
            .ebpf
            .programs()
            .filter_map(|(name, p)| {
                let info = p.info().ok()?;
                let frames = program_frames(info.id());
                let main = frames.first().map_or(0, |f| f.1);
                let other = frames.iter().skip(1).map(|f| f.1).max().unwrap_or(0);
                Some(ProgramStats {
                    name: name.to_owned(),
                    verified: info.verified_instruction_count().unwrap_or(0),
                    translated: info.size_translated().unwrap_or(0) / 8,
                    stack: (main, other),
                })
            })
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        all
    }

    /// Loads the object and its programs; protects tcp/443 (tls) and udp/5060 (sip). TLS
    /// hellos are judged without the socket lookup (`CONFIG_TRUST_UNCONNECTED`).
    pub fn new() -> Self {
        Self::with_issued_keys(gateway_common::maps::DEFAULT_TLS_ISSUED)
    }

    /// As [`TestProgram::new`], with an issued-keys table of `issued_keys` entries.
    pub fn with_issued_keys(issued_keys: u32) -> Self {
        Self::load(issued_keys, gateway::EBPF_OBJECT)
    }

    /// As [`TestProgram::new`], from the bytes of another build of the object (with the same map
    /// layout): a benchmark's baseline.
    pub fn with_object(object: &[u8]) -> Self {
        Self::load(gateway_common::maps::DEFAULT_TLS_ISSUED, object)
    }

    fn load(issued_keys: u32, object: &[u8]) -> Self {
        let bpffs = Bpffs::new();
        let pd = PinDir::new(&bpffs.root(), "testrun");
        pd.create().expect("pin dir");
        let mut ebpf =
            loader::load_pinned_object(&pd, 0, issued_keys, object).expect("load object");
        for name in [programs::XDP, programs::XDP_BARE_PASS] {
            let p: &mut Xdp = ebpf.program_mut(name).unwrap().try_into().unwrap();
            p.load()
                .unwrap_or_else(|e| panic!("verifier refused {name}: {e:?}"));
        }
        for name in [
            programs::TC_INGRESS,
            programs::TC_EGRESS,
            programs::TC_FINISH,
        ] {
            let tc: &mut SchedClassifier = ebpf.program_mut(name).unwrap().try_into().unwrap();
            tc.load()
                .unwrap_or_else(|e| panic!("verifier refused {name}: {e:?}"));
        }
        loader::wire_tail_calls(&mut ebpf).expect("tail calls");
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
        // Synthetic frames have no socket behind them: judge them as if they had (the namespace
        // tests run the real check with real connections).
        maps.set_config(gateway_common::maps::DatapathConfig {
            flags: gateway_common::maps::CONFIG_TRUST_UNCONNECTED,
            ..Default::default()
        })
        .unwrap();
        // The key of the frames' metadata tags, as the loader draws it.
        gateway::datapath::maps::ensure_handover_key(&pd).unwrap();
        TestProgram {
            ebpf,
            pins: pd,
            maps,
            _bpffs: bpffs,
        }
    }

    /// Entries in the program's hash map `name` now, pinned or not (by `bpftool map dump` of its
    /// id, as an operator would read it).
    pub fn hash_entries(&self, name: &str) -> usize {
        let data = match self.ebpf.map(name) {
            Some(aya::maps::Map::HashMap(d) | aya::maps::Map::LruHashMap(d)) => d,
            _ => panic!("{name}: not a hash map of the object"),
        };
        let id = data.info().expect("map info").id();
        let out = std::process::Command::new("bpftool")
            .args(["-j", "map", "dump", "id", &id.to_string()])
            .output()
            .expect("bpftool (cargo xtask setup installs it)");
        let v: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).expect("bpftool json");
        v.len()
    }

    /// The kernel memory the pinned map `name` takes now, in bytes (`bpftool`'s
    /// `bytes_memlock`, which the kernel computes from what the map allocated).
    pub fn map_bytes(&self, name: &str) -> u64 {
        let out = std::process::Command::new("bpftool")
            .args(["-j", "map", "show", "pinned"])
            .arg(self.pins.map(name))
            .output()
            .expect("bpftool (cargo xtask setup installs it)");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool json");
        v["bytes_memlock"].as_u64().expect("bytes_memlock")
    }

    /// Runs one frame `repeat` times through `hook`; returns the action and the mean duration in
    /// nanoseconds per run as the kernel measured it. Panics if the kernel refuses the frame.
    pub fn run(&self, hook: Hook, frame: &[u8], repeat: u32) -> (u32, f64) {
        self.try_run(hook, frame, repeat)
            .unwrap_or_else(|e| panic!("test_run of {} bytes: {e:?}", frame.len()))
    }

    /// Runs one frame once through the XDP program; returns the action and the frame as the
    /// program left it (rewritten for `XDP_TX`).
    pub fn run_out(&self, frame: &[u8]) -> (u32, Vec<u8>) {
        self.run_out_on(Hook::Xdp, frame)
    }

    /// [`TestProgram::run_out`] on either ingress hook (`Hook::Xdp`, `Hook::Tc`).
    pub fn run_out_on(&self, hook: Hook, frame: &[u8]) -> (u32, Vec<u8>) {
        let mut out = vec![0u8; frame.len() + 4096];
        let opts = TestRunOptions {
            data_in: Some(frame),
            data_out: Some(&mut out),
            repeat: 1,
            ..Default::default()
        };
        let r = if hook == Hook::Tc {
            self.tc(programs::TC_INGRESS).test_run(opts)
        } else {
            self.xdp(programs::XDP).test_run(opts)
        }
        .expect("test_run");
        out.truncate(r.data_size_out as usize);
        (r.return_value, out)
    }

    /// [`TestProgram::run`], returning the kernel's refusal instead of panicking. (The kernel
    /// builds a test skb for TC only when the IP header is complete.)
    pub fn try_run(
        &self,
        hook: Hook,
        frame: &[u8],
        repeat: u32,
    ) -> Result<(u32, f64), ProgramError> {
        let opts = TestRunOptions {
            data_in: Some(frame),
            repeat,
            ..Default::default()
        };
        let r = match hook {
            Hook::Xdp | Hook::BarePass | Hook::Fresh | Hook::Sweep => {
                let name = match hook {
                    Hook::Xdp => programs::XDP,
                    Hook::BarePass => programs::XDP_BARE_PASS,
                    Hook::Sweep => programs::SWEEP,
                    _ => programs::XDP_BENCH_FRESH,
                };
                self.xdp(name).test_run(opts)
            }
            Hook::Tc | Hook::TcEgress | Hook::TcFinish => {
                let name = match hook {
                    Hook::Tc => programs::TC_INGRESS,
                    Hook::TcEgress => programs::TC_EGRESS,
                    _ => programs::TC_FINISH,
                };
                self.tc(name).test_run(opts)
            }
        }?;
        Ok((r.return_value, r.duration.as_nanos() as f64))
    }

    /// [`TestProgram::run`] on a connection the program has never seen: forgets every TLS flow,
    /// SIP transaction and pending unit first, so frames that share a 4-tuple or a transaction do
    /// not continue each other's.
    pub fn run_fresh(&mut self, hook: Hook, frame: &[u8]) -> Result<(u32, f64), ProgramError> {
        self.forget();
        let left = self.maps.tls_flows().expect("flows");
        assert!(left.is_empty(), "flows left after clearing: {left:?}");
        self.try_run(hook, frame, 1)
    }

    /// The object's XDP program `name`.
    fn xdp(&self, name: &str) -> &Xdp {
        self.ebpf.program(name).unwrap().try_into().unwrap()
    }

    /// The object's TC program `name`.
    fn tc(&self, name: &str) -> &SchedClassifier {
        self.ebpf.program(name).unwrap().try_into().unwrap()
    }

    /// Whether the object has the benchmark's fresh-packet program (builds before it do not).
    pub fn has_fresh(&self) -> bool {
        self.ebpf.program(programs::XDP_BENCH_FRESH).is_some()
    }

    /// Loads the sweep program for [`Hook::Sweep`] (once).
    pub fn load_sweep(&mut self) {
        let _ = self.load_xdp_once(programs::SWEEP);
    }

    /// Loads the XDP program `name` of the object unless it is loaded already; `true` when it
    /// was loaded now.
    fn load_xdp_once(&mut self, name: &str) -> bool {
        let p: &mut Xdp = self.ebpf.program_mut(name).unwrap().try_into().unwrap();
        if p.fd().is_ok() {
            return false;
        }
        p.load()
            .unwrap_or_else(|e| panic!("verifier refused {name}: {e:?}"));
        true
    }

    /// Makes [`Hook::Fresh`] write the run's number into its frame per `mode` (`FRESH_*`) at
    /// `offset`, numbering runs from one again; loads the program on first use (the verifier's
    /// work is spent only by the benchmark that needs it).
    pub fn freshen(&mut self, offset: u16, mode: u8) {
        if self.load_xdp_once(programs::XDP_BENCH_FRESH) {
            self.wire_fresh_jump();
        }
        let mut map: Array<_, BenchFresh> = Array::try_from(
            self.ebpf
                .map_mut(gateway_common::maps::BENCH_FRESH_MAP)
                .expect("the benchmark's map"),
        )
        .unwrap();
        let fresh = BenchFresh {
            offset,
            mode,
            ..Default::default()
        };
        map.set(0, fresh, 0).expect("set BENCH_FRESH");
    }

    /// Points the fresh-packet program's jump table at the classifier (once, when it loads).
    fn wire_fresh_jump(&mut self) {
        let fd = self
            .xdp(programs::XDP)
            .fd()
            .expect("the classifier is loaded")
            .try_clone()
            .unwrap();
        let mut jump: aya::maps::ProgramArray<_> = self
            .ebpf
            .map_mut(gateway_common::maps::BENCH_JUMP_MAP)
            .expect("the benchmark's jump table")
            .try_into()
            .unwrap();
        jump.set(0, &fd, 0).expect("the jump to the classifier");
    }

    /// Puts every class's next sweep of expired units `ns` from now (`ClassState::sweep_ns`):
    /// a benchmark's batch then measures the packets' own work, and the sweep, due every
    /// `SWEEP_INTERVAL_NS` whatever the rate of packets, is measured on its own
    /// ([`Hook::Sweep`]).
    pub fn defer_sweeps(&mut self, ns: u64) {
        let mut map: Array<_, gateway_common::maps::ClassState> = Array::try_from(
            self.ebpf
                .map_mut(gateway_common::maps::names::CLASS_STATE)
                .expect("the class state map"),
        )
        .unwrap();
        let at = gateway::datapath::maps::monotonic_ns() + ns;
        for class in 0..NUM_CLASSES as u32 {
            let mut st = map.get(&class, 0).expect("class state");
            st.sweep_ns = at;
            map.set(class, st, 0).expect("class state");
        }
    }

    /// Forgets every TLS flow, SIP transaction and pending unit, so the next frame is new.
    pub fn forget(&mut self) {
        self.maps.clear_tls_flows().expect("clear flows");
        self.maps.clear_sip_txns().expect("clear transactions");
        self.maps.forget_pending().expect("clear pending units");
    }

    /// Every counter now.
    pub fn counters(&self) -> Counters {
        Counters {
            classes: self.maps.class_stats().unwrap(),
            datapath: self.maps.counters().unwrap(),
            tls: self.maps.tls_counters().unwrap(),
        }
    }
}

impl Default for TestProgram {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether the program must drop `frame` with no limits set: a SIP original (to udp/5060) that
/// has no unit key, which no response could ever complete (see `SipInfo::unit_key`), or an
/// empty datagram; or a frame that may reach a protected service and cannot be
/// judged (a first fragment that ends before its ports, an IPv6 header chain past the parser's
/// bounds).
pub fn expected_refused(frame: &[u8]) -> bool {
    let pkt = parse(&SliceBytes(frame));
    let t = pkt.transport;
    match pkt.kind {
        PacketKind::Truncated => return pkt.fragmented,
        PacketKind::Unparseable => return pkt.ip_version == 6 && pkt.proto != 50,
        _ => {}
    }
    if pkt.kind != PacketKind::Transport || (t.proto, t.dst_port) != (IPPROTO_UDP, 5060) {
        return false;
    }
    let start = t.payload_offset as usize;
    let copied = (pkt.payload_len() as usize).min(gateway_common::sip::MAX_SCAN);
    match frame.get(start..start + copied) {
        Some(bytes) if copied > 0 => {
            let info = parse_sip(&SliceBytes(bytes), copied);
            info.class() == Class::SipOriginal && info.unit_key().is_none()
        }
        // No message to read: an empty datagram is refused; a first fragment (its message in
        // fragments that carry no ports) is an original under the class's limits, none here.
        _ => !pkt.fragmented,
    }
}

/// The class the program must give `frame` on a connection it has never seen, with tcp/443 (tls)
/// and udp/5060 (sip) protected and `issued` the published session keys: a model of the datapath
/// written with the same gateway-common code, for holding the kernel to it.
pub fn expected_class(frame: &[u8], issued: &[[u8; KEY_LEN]]) -> Class {
    let b = SliceBytes(frame);
    let pkt = parse(&b);
    if pkt.kind != PacketKind::Transport {
        return Class::Other;
    }
    let t = pkt.transport;
    let kind = match (t.proto, t.dst_port) {
        (6, 443) => ServiceKind::Tls,
        (17, 5060) => ServiceKind::Sip,
        _ => return Class::Other,
    };
    let start = t.payload_offset as usize;
    let payload_len = pkt.payload_len() as usize;
    match (kind, t.proto) {
        // A first fragment of a connection not yet decided, whatever it carries (its ports
        // alone included): a malformed hello.
        (ServiceKind::Tls, IPPROTO_TCP) if pkt.fragmented => return Class::TlsNew,
        (ServiceKind::Tls, IPPROTO_TCP) => {}
        (ServiceKind::Sip, IPPROTO_UDP) => {
            // A fresh transaction: the message's own class. The program copies the first
            // MAX_SCAN bytes; a copy past the frame fails and leaves an original.
            let copied = payload_len.min(gateway_common::sip::MAX_SCAN);
            return match frame.get(start..start + copied) {
                Some(bytes) if copied > 0 => parse_sip(&SliceBytes(bytes), copied).class(),
                _ => Class::SipOriginal,
            };
        }
        _ => return Class::Other,
    }
    // A new TLS connection: the hello (after any ChangeCipherSpec or alert records) opens a
    // flow; application data or a handshake message that is no hello (a connection whose flow
    // entry is gone), or only such records, pass; anything else is a malformed hello. A SYN's
    // data (TCP Fast Open) is judged the same way, but never continues a connection.
    if payload_len == 0 {
        return Class::TlsFlow;
    }
    let syn = t.tcp_flags & 0x12 == 0x02;
    let first = first_records(&b, start, payload_len as u32);
    match first.what {
        FIRST_HELLO => {}
        FIRST_CONTINUES if !syn => return Class::TlsFlow,
        FIRST_NO_HELLO_YET => return Class::TlsFlow,
        _ => return Class::TlsNew,
    }
    let (start, payload_len) = (
        start + first.skip as usize,
        payload_len - first.skip as usize,
    );
    // The program copies the payload window by window; a copy past the frame fails.
    let Some(bytes) = frame.get(start..start + payload_len) else {
        return Class::TlsFlow;
    };
    let mut st = HelloState::new();
    st.feed(bytes, 0);
    match st.verdict() {
        Verdict::Pending => Class::TlsFlow,
        Verdict::Offer if st.offer_key().is_some_and(|k| issued.contains(&k)) => Class::TlsResumed,
        _ => Class::TlsNew,
    }
}

/// Runs `f` on a new thread in a network namespace of its own, made for it (empty: only a
/// loopback device, down). A program's test runs there look sockets up in that namespace, so a
/// test can give them the listener a server would have ([`listener_at`]) and nothing else.
pub fn in_own_netns<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    std::thread::scope(|s| {
        s.spawn(move || {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
                .expect("unshare(CLONE_NEWNET)");
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// A TCP listener on `addr`, which need not be an address of the namespace (`IP_FREEBIND`): the
/// socket lookup of a test run on a synthetic frame to `addr` finds it, as a server's would be
/// found. Call it inside [`in_own_netns`].
pub fn listener_at(addr: std::net::SocketAddr) -> std::net::TcpListener {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )
    .expect("socket");
    let on: libc::c_int = 1;
    // SAFETY: an int option of the socket just made, its size given.
    let set = unsafe {
        libc::setsockopt(
            std::os::fd::AsRawFd::as_raw_fd(&socket),
            libc::IPPROTO_IP,
            libc::IP_FREEBIND,
            (&raw const on).cast(),
            std::mem::size_of_val(&on) as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "IP_FREEBIND: {}", std::io::Error::last_os_error());
    socket
        .bind(&addr.into())
        .unwrap_or_else(|e| panic!("bind {addr}: {e}"));
    socket.listen(16).expect("listen");
    socket.into()
}

#[cfg(test)]
mod tests {
    use super::frames;

    #[test]
    fn frames_are_the_deepest_offset_below_r10_per_function() {
        let xlated = "u32 prog(struct xdp_md * ctx):\n\
u32 prog(struct XdpContext ctx):\n   0: (b7) r1 = 0\n   1: (63) *(u32 *)(r10 -4) = r1\n\
   2: (79) r2 = *(u64 *)(r10 -216)\n   3: (95) exit\n\
i64 step(u64 _index, enum c_void * _ctx):\n   4: (7b) *(u64 *)(r10 -13) = r1\n   5: (95) exit\n\
void memset(u8 * s, i32 c, usize n):\n   6: (95) exit\n";
        assert_eq!(
            frames(xlated),
            [
                ("prog".to_owned(), 216),
                ("step".to_owned(), 16),
                ("memset".to_owned(), 0)
            ]
        );
    }
}
