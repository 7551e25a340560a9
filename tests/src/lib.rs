//! Test harness: network namespaces joined by a veth pair with a dedicated bpffs, the `gateway`
//! binary run inside them, crafted frames, and `BPF_PROG_TEST_RUN` access to the real program.
//!
//! Every address used lives inside namespaces the harness created; nothing leaves the machine.

pub mod backend;

pub mod behind;
pub mod cgroup;
pub mod daemon;
pub mod fleet;
pub mod floors;
pub mod frames;
pub mod inject;
pub mod kamailio;
pub mod metrics;
pub mod netns;
pub mod overload;
pub mod parsers;
pub mod probe;
pub mod procfs;
pub mod report;
pub mod shapes;
pub mod sipp;
pub mod sipserver;
pub mod testrun;
pub mod throughput;
pub mod tls;
pub mod trickle;

use std::path::PathBuf;

/// Whether the tests that need root can run. Prints the reason when they cannot; under CI
/// (`CI` set) a missing root is a failure, not a skip.
pub fn have_root(test: &str) -> bool {
    if nix::unistd::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("CI").is_none(),
        "{test}: CI must run as root (these tests attach eBPF programs)"
    );
    eprintln!("SKIP {test}: needs root (CAP_BPF, CAP_NET_ADMIN, namespaces): not running as uid 0");
    false
}

/// Whether this kernel runs the gateway's XDP datapath: it lets XDP programs call
/// `bpf_xdp_adjust_meta`, by which XDP hands frames to its TC finishing program (some kernel
/// builds refuse it; the gateway then attaches at tc ingress). Where it does not, says why
/// `test`, which is about the XDP hook itself, is skipped. Call after [`have_root`].
pub fn have_xdp(test: &str) -> bool {
    if gateway::datapath::loader::xdp_metadata() {
        return true;
    }
    eprintln!(
        "SKIP {test}: this kernel refuses XDP programs bpf_xdp_adjust_meta, so the gateway attaches at tc ingress and its XDP hook cannot be tried here"
    );
    false
}

/// The mode `gateway attach` without `--mode` (auto) takes on a veth here: native XDP, or tc
/// where the kernel refuses XDP frame metadata.
pub fn auto_mode() -> &'static str {
    if gateway::datapath::loader::xdp_metadata() {
        "native"
    } else {
        "tc"
    }
}

/// Runs `command` to its end: whether it succeeded, and everything it printed (stdout, then
/// stderr). Panics, naming the program, when it cannot be started.
pub fn run_tool(command: &mut std::process::Command) -> (bool, String) {
    let out = command.output().unwrap_or_else(|e| {
        panic!(
            "{:?} ({e}; cargo xtask setup installs it)",
            command.get_program()
        )
    });
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// The `gateway` binary built next to this test binary (`cargo xtask test` builds it).
pub fn gateway_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("GATEWAY_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> or target/<profile>/<bin>
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let bin = dir.join("gateway");
    assert!(
        bin.exists(),
        "{} not built: run `cargo build -p gateway` (cargo xtask test does)",
        bin.display()
    );
    bin
}

/// A new, empty directory under the system's temporary directory, named `prefix-PID-NANOS`.
pub fn fresh_temp_dir(prefix: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "{prefix}-{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
