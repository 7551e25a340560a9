//! A pair of network namespaces joined by a veth pair, with a private bpffs mount, removed again
//! by `Drop` even when the test panics.

use std::{
    fs::File,
    path::{Path, PathBuf},
    process::{Command, Output},
    sync::atomic::{AtomicU32, Ordering},
};

use nix::{
    mount::{MntFlags, MsFlags, mount, umount2},
    sched::{CloneFlags, setns},
};

/// Address of the gateway side (inside the test's own namespace).
pub const GW_V4: &str = "10.99.0.1";
/// Address of the peer side (inside the test's own namespace).
pub const PEER_V4: &str = "10.99.0.2";
/// IPv6 address of the gateway side.
pub const GW_V6: &str = "fd00:99::1";
/// IPv6 address of the peer side.
pub const PEER_V6: &str = "fd00:99::2";

static SEQ: AtomicU32 = AtomicU32::new(0);

pub(crate) fn unique() -> String {
    format!(
        "{}x{}",
        std::process::id() % 100_000,
        SEQ.fetch_add(1, Ordering::Relaxed)
    )
}

/// Runs a command and returns its output; panics if it cannot be spawned.
pub fn sh(program: &str, args: &[&str]) -> Output {
    Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"))
}

/// Runs a command that must succeed.
pub fn must(program: &str, args: &[&str]) {
    let out = sh(program, args);
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `caps` (`CAP_BPF`, as systemd writes them) as `setpriv` takes a set: `+bpf,+perfmon`.
fn cap_set(caps: &[&str]) -> String {
    caps.iter()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect::<Vec<_>>()
        .join(",")
}

/// A private bpffs mount in a temporary directory, unmounted on drop.
pub struct Bpffs {
    mount: PathBuf,
}

impl Bpffs {
    /// Mounts a fresh bpffs.
    pub fn new() -> Self {
        let mount_dir = std::env::temp_dir().join(format!("gwt-bpffs-{}", unique()));
        std::fs::create_dir_all(&mount_dir).expect("mkdir bpffs");
        mount(
            Some("bpf"),
            &mount_dir,
            Some("bpf"),
            MsFlags::empty(),
            None::<&str>,
        )
        .expect("mount bpffs");
        Bpffs { mount: mount_dir }
    }

    /// Mounts a fresh bpffs owned by `uid` (and the group of that user) as the systemd unit
    /// mounts the one its own user pins in: by `gateway mount-bpffs --owner UID DIR`.
    pub fn owned_by(uid: u32) -> Self {
        let mount_dir = std::env::temp_dir().join(format!("gwt-bpffs-{}", unique()));
        let out = Command::new(crate::gateway_bin())
            .args(["mount-bpffs", "--owner", &uid.to_string()])
            .arg(&mount_dir)
            .output()
            .expect("run gateway mount-bpffs");
        assert!(
            out.status.success(),
            "gateway mount-bpffs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Bpffs { mount: mount_dir }
    }

    /// Where it is mounted.
    pub fn mount_dir(&self) -> &Path {
        &self.mount
    }

    /// The gateway's pin root inside this mount.
    pub fn root(&self) -> PathBuf {
        self.mount.join("gateway")
    }
}

impl Default for Bpffs {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Bpffs {
    fn drop(&mut self) {
        let _ = umount2(&self.mount, MntFlags::MNT_DETACH);
        let _ = std::fs::remove_dir(&self.mount);
    }
}

/// Two namespaces, `gw` (where the gateway attaches) and `peer` (where clients run), joined by a
/// veth pair with IPv4 and IPv6 addresses, plus a private bpffs.
pub struct TestNet {
    /// Gateway namespace name.
    pub gw_ns: String,
    /// Peer namespace name.
    pub peer_ns: String,
    /// The gateway's veth end (in `gw_ns`).
    pub gw_if: String,
    /// The peer's veth end (in `peer_ns`).
    pub peer_if: String,
    /// Pin storage.
    pub bpffs: Bpffs,
    /// An `XDP_PASS` program on the peer's veth (see [`bare_xdp`]).
    _peer_xdp: Option<aya::Ebpf>,
}

/// Puts the bare `XDP_PASS` program on `ifname` in `ns` (native mode) until the returned object
/// is dropped. On the peer's veth: a veth delivers what the gateway's XDP program sends back
/// (XDP_TX, the resets from the NIC) only to a peer that runs NAPI, which an XDP program of its
/// own turns on (on a NIC the frame simply goes out on the wire). On the gateway's end: the
/// baseline of the throughput benchmark.
pub fn bare_xdp(ns: &str, ifname: &str) -> aya::Ebpf {
    bare_program(ns, ifname, gateway_common::programs::XDP_BARE_PASS)
}

/// Puts the bare program `name` (`XDP_BARE_PASS` or `XDP_BARE_DROP` of
/// `gateway_common::programs`) on `ifname` in `ns` (native mode) until the returned object
/// is dropped.
pub fn bare_program(ns: &str, ifname: &str, name: &str) -> aya::Ebpf {
    in_netns(ns, || {
        let object =
            gateway::datapath::kfunc::resolve(gateway::EBPF_OBJECT).expect("the eBPF object");
        let mut ebpf = aya::Ebpf::load(&object).expect("the eBPF object");
        let p: &mut aya::programs::Xdp = ebpf
            .program_mut(name)
            .expect("the bare program")
            .try_into()
            .expect("an XDP program");
        p.load().expect("load the bare program");
        p.attach(ifname, aya::programs::XdpMode::Driver)
            .expect("attach the bare program to the peer");
        ebpf
    })
}

impl TestNet {
    /// Creates the namespaces, the veth pair and the bpffs, with the bare program on the
    /// peer's veth (see [`bare_xdp`]).
    pub fn new() -> Self {
        let mut net = Self::without_peer_program();
        net._peer_xdp = Some(bare_xdp(&net.peer_ns, &net.peer_if));
        net
    }

    /// Creates the namespaces, the veth pair and the bpffs, and nothing on the peer's veth: as
    /// a container host's side of a pod is, a veth whose XDP_TX delivers nothing.
    pub fn without_peer_program() -> Self {
        Self::on_bpffs(Bpffs::new())
    }

    /// [`TestNet::new`] on a bpffs owned by `uid` ([`Bpffs::owned_by`]).
    pub fn with_bpffs_owned_by(uid: u32) -> Self {
        let mut net = Self::on_bpffs(Bpffs::owned_by(uid));
        net._peer_xdp = Some(bare_xdp(&net.peer_ns, &net.peer_if));
        net
    }

    fn on_bpffs(bpffs: Bpffs) -> Self {
        let id = unique();
        let net = TestNet {
            gw_ns: format!("gwt{id}g"),
            peer_ns: format!("gwt{id}p"),
            gw_if: format!("gv{id}a"),
            peer_if: format!("gv{id}b"),
            bpffs,
            _peer_xdp: None,
        };
        // From here on Drop cleans up whatever was made.
        must("ip", &["netns", "add", &net.gw_ns]);
        must("ip", &["netns", "add", &net.peer_ns]);
        must(
            "ip",
            &[
                "link",
                "add",
                &net.gw_if,
                "netns",
                &net.gw_ns,
                "type",
                "veth",
                "peer",
                "name",
                &net.peer_if,
                "netns",
                &net.peer_ns,
            ],
        );
        for (ns, ifname, v4, v6) in [
            (&net.gw_ns, &net.gw_if, GW_V4, GW_V6),
            (&net.peer_ns, &net.peer_if, PEER_V4, PEER_V6),
        ] {
            must(
                "ip",
                &["-n", ns, "addr", "add", &format!("{v4}/24"), "dev", ifname],
            );
            must(
                "ip",
                &[
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{v6}/64"),
                    "dev",
                    ifname,
                    "nodad",
                ],
            );
            must("ip", &["-n", ns, "link", "set", ifname, "up"]);
            must("ip", &["-n", ns, "link", "set", "lo", "up"]);
        }
        net
    }

    /// The pin root.
    pub fn root(&self) -> PathBuf {
        self.bpffs.root()
    }

    /// The bpffs the pin root is in.
    pub fn bpffs(&self) -> &Bpffs {
        &self.bpffs
    }

    /// The pin directory of the gateway's veth.
    pub fn pin_dir(&self) -> PathBuf {
        self.root().join(&self.gw_if)
    }

    /// Runs `gateway --bpffs <root> ARGS` in the gateway namespace.
    pub fn gateway(&self, args: &[&str]) -> Output {
        self.gateway_command(args).output().expect("run gateway")
    }

    /// The command `gateway --bpffs <root> ARGS` in the gateway namespace, to spawn.
    pub fn gateway_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.gw_ns])
            .arg(crate::gateway_bin())
            .arg("--bpffs")
            .arg(self.root())
            .args(args);
        c
    }

    /// [`TestNet::gateway_command`] with no capability beyond `caps` (names as systemd writes
    /// them, `CAP_BPF`): its bounding set is cut to them by `setpriv` inside the namespace, as
    /// a systemd unit's `CapabilityBoundingSet=` or a pod's `capabilities.add` does.
    pub fn gateway_command_capped(&self, args: &[&str], caps: &[&str]) -> Command {
        self.setpriv(&[format!("--bounding-set=-all,{}", cap_set(caps))], args)
    }

    /// [`TestNet::gateway_command_capped`] as the user and group `uid`, holding `caps` as
    /// ambient capabilities across the change of user: as a systemd unit with `User=` and
    /// `AmbientCapabilities=` runs it.
    pub fn gateway_command_as(&self, args: &[&str], caps: &[&str], uid: u32) -> Command {
        let set = cap_set(caps);
        self.setpriv(
            &[
                format!("--reuid={uid}"),
                format!("--regid={uid}"),
                "--clear-groups".to_owned(),
                format!("--inh-caps=-all,{set}"),
                format!("--ambient-caps=-all,{set}"),
                format!("--bounding-set=-all,{set}"),
            ],
            args,
        )
    }

    /// `gateway --bpffs <root> ARGS` in the gateway namespace under `setpriv OPTIONS`.
    fn setpriv(&self, options: &[String], args: &[&str]) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.gw_ns, "setpriv"])
            .args(options)
            .arg("--")
            .arg(crate::gateway_bin())
            .arg("--bpffs")
            .arg(self.root())
            .args(args);
        c
    }

    /// Runs `gateway ARGS` that must succeed; returns stdout.
    pub fn gateway_ok(&self, args: &[&str]) -> String {
        let out = self.gateway(args);
        assert!(
            out.status.success(),
            "gateway {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs a command in a namespace.
    pub fn exec(&self, ns: &str, program: &str, args: &[&str]) -> Output {
        let mut all = vec!["netns", "exec", ns, program];
        all.extend_from_slice(args);
        sh("ip", &all)
    }

    /// Runs `f` on a thread inside the gateway namespace (sockets it creates live there).
    pub fn in_gw<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        in_netns(&self.gw_ns, f)
    }

    /// Runs `f` on a thread inside the peer namespace.
    pub fn in_peer<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
        in_netns(&self.peer_ns, f)
    }

    /// The `policy show --json` row of `class`.
    pub fn policy(&self, class: &str) -> serde_json::Value {
        let rows: serde_json::Value =
            serde_json::from_str(&self.gateway_ok(&["policy", "show", "--json"])).expect("json");
        rows.as_array()
            .expect("rows")
            .iter()
            .find(|r| r["class"] == class)
            .cloned()
            .expect("the class's row")
    }

    /// `gateway stats --json` of the gateway's veth.
    pub fn stats(&self) -> serde_json::Value {
        let out = self.gateway_ok(&["stats", "--iface", &self.gw_if, "--json"]);
        serde_json::from_str(&out).expect("stats JSON")
    }

    /// The XDP program id on the gateway's veth according to iproute2, if any.
    pub fn xdp_prog_id(&self) -> Option<u64> {
        let out = self.exec(
            &self.gw_ns,
            "ip",
            &["-j", "-d", "link", "show", &self.gw_if],
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("ip -j JSON");
        v[0]["xdp"]["prog"]["id"].as_u64()
    }

    /// The id of the program at the gateway interface's first hook: its XDP program, or where
    /// none is attached the program of the tc ingress link pinned for it, while that link is
    /// attached to an interface (this bpftool lists tcx links without their interface).
    pub fn ingress_prog_id(&self) -> Option<u64> {
        if let Some(id) = self.xdp_prog_id() {
            return Some(id);
        }
        let pin = self.pin_dir().join("link");
        match gateway::datapath::bpfsys::link_ifindex(&pin) {
            Ok(ifindex) if ifindex != 0 => gateway::datapath::bpfsys::link_program(&pin)
                .ok()
                .map(u64::from),
            _ => None,
        }
    }
}

impl Default for TestNet {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for TestNet {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth end in it, and with it the pair.
        let _ = sh("ip", &["netns", "del", &self.gw_ns]);
        let _ = sh("ip", &["netns", "del", &self.peer_ns]);
    }
}

/// Runs `f` on a new thread that has joined network namespace `ns`.
pub fn in_netns<R: Send>(ns: &str, f: impl FnOnce() -> R + Send) -> R {
    let path = Path::new("/var/run/netns").join(ns);
    std::thread::scope(|s| {
        s.spawn(move || {
            let file = File::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            setns(file, CloneFlags::CLONE_NEWNET).expect("setns");
            f()
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Sends raw Ethernet frames out of `ifname` with an AF_PACKET socket. Call it inside the
/// namespace that holds the interface (see [`TestNet::in_peer`]).
pub fn send_raw_frames(ifname: &str, frames: &[Vec<u8>]) {
    let name = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: plain socket syscalls on a descriptor this function owns and closes.
    unsafe {
        let ifindex = libc::if_nametoindex(name.as_ptr());
        assert!(ifindex != 0, "no interface {ifname}");
        let fd = libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0);
        assert!(
            fd >= 0,
            "AF_PACKET socket: {}",
            std::io::Error::last_os_error()
        );
        let mut addr: libc::sockaddr_ll = std::mem::zeroed();
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_ifindex = ifindex as i32;
        addr.sll_halen = 6;
        for f in frames {
            let n = libc::sendto(
                fd,
                f.as_ptr().cast(),
                f.len(),
                0,
                (&raw const addr).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as u32,
            );
            assert_eq!(
                n,
                f.len() as isize,
                "sendto: {}",
                std::io::Error::last_os_error()
            );
        }
        libc::close(fd);
    }
}

/// Per-class counter `field` of `class` in a `gateway stats --json` document.
pub fn class_counter(stats: &serde_json::Value, class: &str, field: &str) -> u64 {
    stats["classes"]
        .as_array()
        .expect("classes")
        .iter()
        .find(|c| c["name"] == class)
        .unwrap_or_else(|| panic!("class {class} missing"))[field]
        .as_u64()
        .expect("number")
}
