//! The deployment files, verified (issue 27): the systemd unit passes `systemd-analyze verify`
//! (a broken copy does not), and the daemon run with exactly the unit's capabilities attaches,
//! proxies on a privileged port and reloads.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use gateway::{datapath::bpfsys, datapath::btf::Btf, datapath::pins::PinDir};
use gateway_tests::{
    backend::{Backend, Mode},
    daemon::Daemon,
    have_root, have_xdp,
    netns::{GW_V4, TestNet},
    tls::{Cert, rustls_config, rustls_fetch},
};

fn unit() -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/gateway.service");
    std::fs::read_to_string(path).expect("deploy/gateway.service")
}

/// `systemd-analyze verify` of `text` (the unit, its binary path pointed at this build): what it
/// said (nothing when clean) and whether it succeeded.
fn verify(text: &str) -> (bool, String) {
    let dir = gateway_tests::fresh_temp_dir("gwt-unit");
    let path: PathBuf = dir.join("gateway.service");
    std::fs::write(
        &path,
        text.replace(
            "/usr/local/bin/gateway",
            &gateway_tests::gateway_bin().display().to_string(),
        ),
    )
    .unwrap();
    gateway_tests::run_tool(Command::new("systemd-analyze").arg("verify").arg(&path))
}

#[test]
fn the_unit_passes_systemd_analyze_verify_and_a_broken_copy_does_not() {
    let (ok, said) = verify(&unit());
    assert!(ok && said.trim().is_empty(), "{said}");
    // systemd ignores a bad value with a warning: the check is that nothing is said.
    let (_, said) = verify(&unit().replace("Type=notify", "Type=notifx"));
    assert!(said.contains("notifx"), "{said}");
}

/// The unit's `CapabilityBoundingSet=`.
fn unit_caps() -> Vec<String> {
    unit_value("CapabilityBoundingSet")
        .split_whitespace()
        .map(String::from)
        .collect()
}

#[test]
fn with_exactly_the_units_capabilities_the_daemon_attaches_proxies_on_443_and_reloads() {
    if !have_root("with_exactly_the_units_capabilities") {
        return;
    }
    let caps = unit_caps();
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    let net = TestNet::new();
    let cert = Cert::new();
    let backend = Backend::start(
        net.in_gw(|| TcpListener::bind("127.0.0.1:0").unwrap()),
        "b",
        Mode::Answer,
        false,
    );
    let body = |backlog: u32| {
        format!(
            "services: [{{kind: sip, port: 5060}}]\npolicy:\n  sip-original: {{backlog: {backlog}}}\n\
             proxies:\n  - listen: {GW_V4}:443\n    tls: {{cert: {}, key: {}}}\n    backends: [{{address: {}}}]\n",
            cert.cert().display(),
            cert.key().display(),
            backend.addr
        )
    };
    let dir = cert.file("");
    let daemon = Daemon::start_config_capped(&net, &dir, &body(30), &caps);
    // Its effective set is exactly the unit's.
    let status = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid())).unwrap();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .map(|v| u64::from_str_radix(v.trim(), 16).unwrap())
        .unwrap();
    let bit = |name: &str| match name {
        "CAP_NET_BIND_SERVICE" => 10,
        "CAP_NET_ADMIN" => 12,
        "CAP_PERFMON" => 38,
        "CAP_BPF" => 39,
        other => panic!("a capability this test does not know: {other}"),
    };
    let want = caps.iter().fold(0u64, |m, c| m | 1 << bit(c));
    assert_eq!(eff, want, "CapEff {eff:#x}, the unit's {want:#x}");
    // It proxies on a privileged port with the datapath attached.
    let (_, answer) = net
        .in_peer(|| rustls_fetch(&rustls_config(&cert), &format!("{GW_V4}:443")))
        .expect("served on 443");
    assert!(answer.ends_with("b\n"), "{answer}");
    let stats = net.stats();
    assert!(
        gateway_tests::netns::class_counter(&stats, "tls-new", "packets") > 0,
        "{stats}"
    );
    // And reloads.
    Daemon::write_config(&net, &dir, &body(40));
    let said = net.gateway_ok(&["reload"]);
    assert!(said.contains("policy"), "{said}");
    let row = net.policy("sip-original");
    assert_eq!(row["backlog_limit"], 40, "{row}");
    let (status, _) = daemon.terminate(Duration::from_secs(30));
    assert!(status.success());
}

/// The DaemonSet's `capabilities.add`, as systemd names them (`CAP_BPF`).
fn daemonset_caps() -> Vec<String> {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml"),
    )
    .unwrap();
    let line = manifest
        .lines()
        .find_map(|l| l.trim().strip_prefix("add: ["))
        .expect("the DaemonSet adds capabilities");
    let list = &line[..line.find(']').expect("a closed list")];
    list.split(',')
        .map(|c| format!("CAP_{}", c.trim().trim_matches('"')))
        .collect()
}

/// Issue 54: under exactly the unit's capabilities (the DaemonSet's are the same set), a start
/// loads the sweep program, a restart adopts what the first start left attached (`on_exit:
/// keep`, as `systemctl restart` does), `status` reads the attachment while the daemon runs,
/// and `attach` over the attachment replaces its programs. None of them may read a pinned map's
/// BTF by id (`BPF_BTF_GET_FD_BY_ID` needs CAP_SYS_ADMIN): each refused before, the sweep
/// program with a warning and the restart, `status` and `attach` with "fields that cannot be
/// read (Operation not permitted)".
#[test]
fn with_exactly_the_units_capabilities_a_restart_adopts_and_the_cli_reads_the_attachment() {
    if !have_root("with_exactly_the_units_capabilities_a_restart_adopts") {
        return;
    }
    let caps = unit_caps();
    let mut pod = daemonset_caps();
    let mut unit = caps.clone();
    pod.sort();
    unit.sort();
    assert_eq!(pod, unit, "the DaemonSet and the unit grant the same set");
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    let net = TestNet::new();
    let dir = gateway_tests::fresh_temp_dir("gwt-unit-restart");
    let body = "services: [{kind: sip, port: 5060}]\non_exit: keep\n";
    let capped =
        |args: &[&str]| gateway_tests::run_tool(&mut net.gateway_command_capped(args, &caps));
    for start in ["first start", "restart"] {
        let daemon = Daemon::start_config_capped(&net, &dir, body, &caps);
        let (ok, said) = capped(&["status"]);
        assert!(ok, "{start}: status under the unit's capabilities: {said}");
        assert!(
            said.contains(&format!("daemon pid {}", daemon.pid())),
            "{start}: {said}"
        );
        let (status, log) = daemon.terminate(Duration::from_secs(30));
        assert!(status.success(), "{start}: {log:?}");
        let warned = warnings_of_its_own(&log);
        assert!(warned.is_empty(), "{start}: {warned:?}");
        assert!(
            net.root().join(&net.gw_if).join("link").exists(),
            "{start}: on_exit keep leaves the datapath attached"
        );
    }
    let (ok, said) = capped(&["attach", "--iface", &net.gw_if]);
    assert!(ok, "attach over the attachment: {said}");
    assert!(said.contains("replaced"), "{said}");
    // What the record holds is what the kernel holds: every pinned map's fields, read through
    // its BTF object id from either, are the same.
    let pd = PinDir::new(&net.root(), &net.gw_if);
    let record = gateway::datapath::layouts::read(&pd.dir).expect("the record reads");
    let mut checked = 0;
    for m in gateway_common::maps::all() {
        let Ok(shape) = bpfsys::map_shape(&pd.map(m.name)) else {
            continue;
        };
        if shape.btf.btf_id == 0 {
            continue;
        }
        let recorded = Btf::parse(record.bytes(shape.btf.btf_id).expect("recorded")).unwrap();
        let kernel = Btf::parse(&bpfsys::btf_bytes(shape.btf.btf_id).unwrap()).unwrap();
        for id in [shape.btf.key_type, shape.btf.value_type] {
            assert_eq!(
                recorded.fields(id).unwrap(),
                kernel.fields(id).unwrap(),
                "{}",
                m.name
            );
        }
        checked += 1;
    }
    assert!(checked > 20, "{checked} maps checked");
    // Pins of a release before the record: under the unit's capabilities their fields cannot
    // be read, and `status` says how to record them; `attach` as root records them.
    std::fs::remove_file(pd.dir.join(gateway::datapath::layouts::PIN)).unwrap();
    let (ok, said) = capped(&["status"]);
    assert!(!ok, "{said}");
    assert!(
        said.contains("CAP_SYS_ADMIN") && said.contains("`gateway attach`"),
        "{said}"
    );
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    let (ok, said) = capped(&["status"]);
    assert!(ok, "{said}");
    let (ok, said) = capped(&["detach", "--iface", &net.gw_if]);
    assert!(ok, "{said}");
}

/// The unit's `KEY=` value.
/// Issue 54, item 9: the unit runs the daemon as its own user (`User=gateway`, the unit's
/// capabilities ambient), pinning in a bpf filesystem of that user's, which the unit's
/// privileged step mounts (`gateway mount-bpffs`) at the example config's `bpffs:`. As that
/// user, with exactly those capabilities: a start (the sweep program loaded, no warning), a
/// restart that adopts the attachment, `status`, `stats` and `attach` over the attachment. The
/// test host has no user `gateway`: `nobody` (65534) stands in for it.
#[test]
fn as_the_units_own_user_a_start_a_restart_and_the_cli_work_in_the_bpffs_the_unit_mounts() {
    if !have_root("as_the_units_own_user") {
        return;
    }
    const UID: u32 = 65534;
    assert_eq!(unit_value("User"), "gateway");
    let text = unit();
    let mount = text
        .lines()
        .find_map(|l| l.strip_prefix("ExecStartPre=+"))
        .expect("a privileged step before the daemon");
    assert_eq!(
        mount,
        "/usr/local/bin/gateway mount-bpffs --owner gateway /run/gateway-bpf"
    );
    assert_eq!(unit_value("ReadWritePaths"), "/run/gateway-bpf");
    let example = include_str!("../../deploy/gateway.example.yaml");
    assert!(
        example
            .lines()
            .any(|l| l.starts_with("bpffs: /run/gateway-bpf ")),
        "the example config pins where the unit mounts"
    );
    let caps = unit_caps();
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    // Mounted by `gateway mount-bpffs --owner 65534`; a second run (a restart) leaves it.
    let net = TestNet::with_bpffs_owned_by(UID);
    let again = Command::new(gateway_tests::gateway_bin())
        .args(["mount-bpffs", "--owner", &UID.to_string()])
        .arg(net.bpffs().mount_dir())
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&again.stdout).starts_with("already"),
        "{again:?}"
    );
    let dir = gateway_tests::fresh_temp_dir("gwt-unit-user");
    let body = "services: [{kind: sip, port: 5060}, {kind: tls, port: 443}]
on_exit: keep
";
    let as_user =
        |args: &[&str]| gateway_tests::run_tool(&mut net.gateway_command_as(args, &caps, UID));
    for start in ["first start", "restart"] {
        let daemon = Daemon::start_config_as(&net, &dir, body, &caps, UID);
        if start == "restart" {
            assert!(
                daemon.log.iter().any(|l| l.contains("adopted attachment")),
                "{start}: {:?}",
                daemon.log
            );
        }
        let (ok, said) = as_user(&["status"]);
        assert!(ok, "{start}: status as the unit's user: {said}");
        assert!(
            said.contains(&format!("daemon pid {}", daemon.pid())),
            "{start}: {said}"
        );
        let (ok, said) = as_user(&["stats"]);
        assert!(ok && said.contains("tls-new"), "{start}: {said}");
        let (status, log) = daemon.terminate(Duration::from_secs(30));
        assert!(status.success(), "{start}: {log:?}");
        let warned = warnings_of_its_own(&log);
        assert!(warned.is_empty(), "{start}: {warned:?}");
    }
    let (ok, said) = as_user(&["attach", "--iface", &net.gw_if]);
    assert!(
        ok && said.contains("replaced"),
        "attach over the attachment: {said}"
    );
    // Every pin is the user's own.
    use std::os::unix::fs::MetadataExt as _;
    let pins = std::fs::read_dir(net.pin_dir()).unwrap();
    let mut n = 0;
    for pin in pins {
        let pin = pin.unwrap();
        assert_eq!(pin.metadata().unwrap().uid(), UID, "{:?}", pin.file_name());
        n += 1;
    }
    assert!(n > 10, "{n} pins");
    let (ok, said) = as_user(&["detach", "--iface", &net.gw_if]);
    assert!(ok, "detach as the unit's user: {said}");
}

/// The warnings a daemon's log holds, but the one that is the kernel's: where it refuses XDP
/// frame metadata, a first start says it attached at tc ingress instead.
fn warnings_of_its_own(log: &[String]) -> Vec<&String> {
    log.iter()
        .filter(|l| l.contains("WARN") && !l.contains("bpf_xdp_adjust_meta"))
        .collect()
}

fn unit_value(key: &str) -> String {
    unit()
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("the unit sets {key}"))
        .to_string()
}

/// An HTTP/1.0 GET of `path` from the metrics endpoint at 127.0.0.1:`port` in the gateway's
/// namespace: its status code, 0 when nothing answered.
fn http_status(net: &TestNet, port: u16, path: &str) -> u16 {
    gateway_tests::metrics::get(net, "127.0.0.1", port, path)
        .and_then(|t| t.split_whitespace().nth(1).and_then(|c| c.parse().ok()))
        .unwrap_or(0)
}

/// Issue 54: the unit's start and stop, played as systemd plays them (no systemd runs as PID 1
/// on the test machines): `gateway run` as ExecStart says, under the unit's capabilities and
/// environment, with `NOTIFY_SOCKET` (Type=notify); a client holding a proxied connection;
/// SIGTERM (KillSignal). The daemon says READY=1 once it serves and STOPPING=1 at the signal;
/// while it drains, /healthz answers 200 and /readyz 503 (they went silent at the signal
/// before); it ends the held connection at its drain deadline and exits by itself, well inside
/// TimeoutStopSec, which is longer than the default drain and its exit (it equalled the drain:
/// a keep-alive client had systemd kill the daemon at 31.4 s).
#[test]
fn the_units_stop_with_a_held_connection_ends_by_itself_and_keeps_health_answering() {
    if !have_root("the_units_stop_with_a_held_connection") {
        return;
    }
    let default_drain = gateway::proxy::config::Timeouts::default().drain.0;
    let timeout_stop = Duration::from_secs(unit_value("TimeoutStopSec").parse().unwrap());
    assert!(
        timeout_stop >= default_drain + Duration::from_secs(10),
        "TimeoutStopSec {timeout_stop:?} against a default drain of {default_drain:?}"
    );
    assert_eq!(unit_value("Type"), "notify");
    let caps = unit_caps();
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    let net = TestNet::new();
    let cert = Cert::new();
    let backend = Backend::start(
        net.in_gw(|| TcpListener::bind("127.0.0.1:0").unwrap()),
        "b",
        Mode::Answer,
        false,
    );
    const METRICS: u16 = 9491;
    // A short drain, so that the test waits seconds: what is checked is that the daemon ends
    // the drain itself at its deadline, with health answering meanwhile.
    let drain = Duration::from_secs(3);
    let dir = cert.file("");
    let cfg = Daemon::write_config(
        &net,
        &dir,
        &format!(
            "metrics: 127.0.0.1:{METRICS}\nproxies:\n  - listen: {GW_V4}:443\n    tls: {{cert: {}, key: {}}}\n    \
             backends: [{{address: {}}}]\n    timeouts: {{drain: 3s}}\n",
            cert.cert().display(),
            cert.key().display(),
            backend.addr
        ),
    );
    let notify = dir.join("notify.sock");
    let _ = std::fs::remove_file(&notify);
    let manager = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    manager
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut command =
        net.gateway_command_capped(&["run", "--config", cfg.to_str().unwrap()], &caps);
    command.env("NOTIFY_SOCKET", &notify);
    let daemon = Daemon::spawn_command(command, "info", gateway_tests::daemon::STARTUP);
    let said = |manager: &std::os::unix::net::UnixDatagram| {
        let mut buf = [0u8; 256];
        let n = manager.recv(&mut buf).expect("a notification");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(said(&manager), "READY=1");
    assert_eq!(http_status(&net, METRICS, "/readyz"), 200);
    // A client holding a proxied connection open (its stdin open: it neither sends nor closes).
    let (held, kind) = gateway_tests::tls::HeldClient::connect(
        &["ip", "netns", "exec", &net.peer_ns],
        &format!("{GW_V4}:443"),
        &[],
        Duration::from_secs(10),
    );
    assert_eq!(kind, Some("New"), "the held client's handshake");
    let stopped = std::time::Instant::now();
    daemon.signal_term();
    assert_eq!(said(&manager), "STOPPING=1");
    // Draining: alive, not ready.
    assert_eq!(http_status(&net, METRICS, "/healthz"), 200);
    assert_eq!(http_status(&net, METRICS, "/readyz"), 503);
    let (status, log) = daemon.wait_exit(timeout_stop);
    let took = stopped.elapsed();
    assert!(status.success(), "{log:?}");
    assert!(
        log.iter().any(|l| l.contains("drain deadline passed")),
        "the daemon ended the held connection itself: {log:?}"
    );
    assert!(took >= drain && took < timeout_stop, "stopped in {took:?}");
    drop(held);
}

/// The eBPF object of an older release, whose `TlsCounters` and `IssuedValue` are laid out
/// otherwise (tests/fixtures/README.md).
const PREVIOUS: &[u8] = include_bytes!("../fixtures/gateway-ec0acef.bpf.o");

/// Issue 54: under exactly the unit's capabilities, a daemon upgrades a datapath an older
/// build attached (attached here as a release that records its layouts does), carrying its
/// changed maps over to this build's layout, and the CLI then finds this build's layout.
#[test]
fn with_exactly_the_units_capabilities_a_daemon_upgrades_across_a_map_layout_change() {
    // The previous release's XDP programs call bpf_xdp_adjust_meta unconditionally: a kernel
    // that refuses it loads none of them.
    if !have_root("with_exactly_the_units_capabilities_a_daemon_upgrades")
        || !have_xdp("with_exactly_the_units_capabilities_a_daemon_upgrades")
    {
        return;
    }
    let caps = unit_caps();
    let caps: Vec<&str> = caps.iter().map(String::as_str).collect();
    let net = TestNet::new();
    let opts = gateway::datapath::loader::AttachOptions {
        iface: net.gw_if.clone(),
        mode: gateway::datapath::ModeRequest::Native,
        root: net.root(),
        ebpf_log_level: 0,
        issued_keys: gateway_common::maps::DEFAULT_TLS_ISSUED,
    };
    net.in_gw(|| {
        drop(
            gateway::datapath::loader::attach_object(&opts, PREVIOUS)
                .expect("attach the older build"),
        )
    });
    let status = net.gateway(&["status"]);
    let said = String::from_utf8_lossy(&status.stdout).into_owned()
        + &String::from_utf8_lossy(&status.stderr);
    assert!(
        !status.status.success() && said.contains("laid out by another build"),
        "{said}"
    );
    let dir = gateway_tests::fresh_temp_dir("gwt-unit-upgrade");
    let daemon = Daemon::start_config_capped(
        &net,
        &dir,
        "services: [{kind: tls, port: 8443}]\non_exit: keep\n",
        &caps,
    );
    let out = net
        .gateway_command_capped(&["status"], &caps)
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "after the upgrade: {said}");
    let (status, log) = daemon.terminate(Duration::from_secs(30));
    assert!(status.success(), "{log:?}");
    assert!(
        log.iter().any(|l| l.contains("carried")),
        "the start says what it carried over: {log:?}"
    );
    let warned: Vec<_> = log.iter().filter(|l| l.contains("WARN")).collect();
    assert!(warned.is_empty(), "{warned:?}");
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
}

/// Issue 54, on any kernel this build loads on: as root with exactly the DaemonSet's
/// capabilities (its pod) and as the unit's own user with exactly the unit's, a daemon upgrades a datapath attached
/// by a build whose map layout differs from this one's. That build stands in for an older
/// release: this build's object with two fields of `ClassPolicy` the other way round in its BTF
/// (`gateway::datapath::btf::swap_fields`), so its CLASS_POLICY map is pinned with a layout this build
/// must carry over field by field. Before the daemon, `status` refuses the foreign layout; the
/// daemon's start says what it carried, warns of nothing of its own, and afterwards the CLI
/// finds this build's layout.
#[test]
fn as_the_pods_root_and_the_units_user_with_their_capabilities_a_daemon_upgrades_a_datapath_whose_layout_moved()
 {
    if !have_root("as_the_pods_root_and_the_units_user_a_daemon_upgrades") {
        return;
    }
    const UID: u32 = 65534;
    // The pod's own list (as root), and the unit's (as its user).
    let (pod, unit) = (daemonset_caps(), unit_caps());
    let pod: Vec<&str> = pod.iter().map(String::as_str).collect();
    let unit: Vec<&str> = unit.iter().map(String::as_str).collect();
    let older = gateway::datapath::btf::swap_fields(
        gateway::EBPF_OBJECT,
        "ClassPolicy",
        "backlog_limit",
        "rate_per_sec",
    )
    .expect("the build with ClassPolicy's fields swapped");
    for user in [None, Some(UID)] {
        let (who, caps) = match user {
            None => ("root with the DaemonSet's capabilities", &pod),
            Some(_) => ("the unit's user with its capabilities", &unit),
        };
        let net = match user {
            None => TestNet::new(),
            Some(uid) => TestNet::with_bpffs_owned_by(uid),
        };
        let opts = gateway::datapath::loader::AttachOptions {
            iface: net.gw_if.clone(),
            mode: gateway::datapath::ModeRequest::Auto,
            root: net.root(),
            ebpf_log_level: 0,
            issued_keys: gateway_common::maps::DEFAULT_TLS_ISSUED,
        };
        net.in_gw(|| {
            drop(
                gateway::datapath::loader::attach_object(&opts, &older)
                    .expect("attach the older layout"),
            )
        });
        if let Some(uid) = user {
            // As the unit's user would have left them: its own pins.
            chown_tree(&net.root(), uid);
        }
        let cli = |args: &[&str]| {
            gateway_tests::run_tool(&mut match user {
                None => net.gateway_command_capped(args, caps),
                Some(uid) => net.gateway_command_as(args, caps, uid),
            })
        };
        let (ok, said) = cli(&["status"]);
        assert!(
            !ok && said.contains("laid out by another build"),
            "{who}: status before the upgrade: {said}"
        );
        let dir = gateway_tests::fresh_temp_dir("gwt-unit-layout");
        let body = "services: [{kind: tls, port: 8443}]\non_exit: keep\n";
        let start = || match user {
            None => Daemon::start_config_capped(&net, &dir, body, caps),
            Some(uid) => Daemon::start_config_as(&net, &dir, body, caps, uid),
        };
        let daemon = start();
        let (ok, said) = cli(&["status"]);
        assert!(ok, "{who}: status after the upgrade: {said}");
        assert!(
            said.contains(&format!("daemon pid {}", daemon.pid())),
            "{who}: {said}"
        );
        let (status, log) = daemon.terminate(Duration::from_secs(30));
        assert!(status.success(), "{who}: {log:?}");
        assert!(
            log.iter()
                .any(|l| l.contains("carried") && l.contains("CLASS_POLICY")),
            "{who}: the start says what it carried over: {log:?}"
        );
        let warned = warnings_of_its_own(&log);
        assert!(warned.is_empty(), "{who}: {warned:?}");
        // A restart finds this build's own layout: nothing more to carry.
        let daemon = start();
        let (status, log) = daemon.terminate(Duration::from_secs(30));
        assert!(status.success(), "{who}: restart: {log:?}");
        assert!(
            log.iter().any(|l| l.contains("adopted attachment"))
                && !log.iter().any(|l| l.contains("carried")),
            "{who}: restart: {log:?}"
        );
        let (ok, said) = cli(&["detach", "--iface", &net.gw_if]);
        assert!(ok, "{who}: detach: {said}");
    }
}

/// Gives `dir` and everything under it to user and group `uid`.
fn chown_tree(dir: &Path, uid: u32) {
    std::os::unix::fs::chown(dir, Some(uid), Some(uid)).unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            chown_tree(&path, uid);
        } else {
            std::os::unix::fs::chown(&path, Some(uid), Some(uid)).unwrap();
        }
    }
}

/// Every key of `original` is in `typed` (its round trip through the Kubernetes API types): a key
/// the types do not know (a typo, a field of another kind) is dropped by the round trip and named
/// here, with its path.
fn unknown_keys(
    original: &serde_json::Value,
    typed: &serde_json::Value,
    path: &str,
    out: &mut Vec<String>,
) {
    match (original, typed) {
        (serde_json::Value::Object(a), serde_json::Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => unknown_keys(v, w, &format!("{path}.{k}"), out),
                    None => out.push(format!("{path}.{k}")),
                }
            }
        }
        (serde_json::Value::Array(a), serde_json::Value::Array(b)) => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                unknown_keys(v, w, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

/// Validates each document of a manifest against the Kubernetes API types (k8s-openapi, the
/// types generated from the API's OpenAPI schema): every document parses as its kind, with no
/// field the kind does not have. The problems, by document.
fn validate(manifest: &str) -> Vec<String> {
    use serde::Deserialize as _;
    fn check<T: serde::de::DeserializeOwned + serde::Serialize>(
        doc: &serde_json::Value,
        what: &str,
        problems: &mut Vec<String>,
    ) {
        match serde_json::from_value::<T>(doc.clone()) {
            Err(e) => problems.push(format!("{what}: {e}")),
            Ok(t) => {
                let typed = serde_json::to_value(&t).unwrap();
                let mut unknown = Vec::new();
                unknown_keys(doc, &typed, what, &mut unknown);
                problems.extend(unknown.into_iter().map(|k| format!("unknown field {k}")));
            }
        }
    }
    let mut problems = Vec::new();
    for (i, de) in serde_norway::Deserializer::from_str(manifest).enumerate() {
        let doc = match serde_json::Value::deserialize(de) {
            Ok(d) => d,
            Err(e) => {
                problems.push(format!("document {i}: {e}"));
                continue;
            }
        };
        let kind = doc["kind"].as_str().unwrap_or("").to_string();
        let what = format!("document {i} ({kind})");
        match kind.as_str() {
            "ConfigMap" => {
                check::<k8s_openapi::api::core::v1::ConfigMap>(&doc, &what, &mut problems)
            }
            "DaemonSet" => {
                check::<k8s_openapi::api::apps::v1::DaemonSet>(&doc, &what, &mut problems)
            }
            "Secret" => check::<k8s_openapi::api::core::v1::Secret>(&doc, &what, &mut problems),
            other => problems.push(format!("{what}: a kind this check does not know: {other}")),
        }
    }
    problems
}

#[test]
fn the_daemonset_is_valid_kubernetes_and_its_config_is_valid_gateway() {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml"),
    )
    .unwrap();
    let problems = validate(&manifest);
    assert!(problems.is_empty(), "{problems:#?}");
    // A typo and a wrong type are caught.
    let typo = validate(&manifest.replace("readinessProbe:", "readynessProbe:"));
    assert!(
        typo.iter().any(|p| p.contains("readynessProbe")),
        "{typo:?}"
    );
    let wrong = validate(&manifest.replace("periodSeconds: 5", "periodSeconds: often"));
    assert!(wrong.iter().any(|p| p.contains("DaemonSet")), "{wrong:?}");
    // The probes ask the daemon's endpoints; the config it mounts parses.
    assert!(manifest.contains("path: /healthz") && manifest.contains("path: /readyz"));
    let docs: Vec<serde_json::Value> = serde_norway::Deserializer::from_str(&manifest)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    let yaml = docs[0]["data"]["gateway.yaml"].as_str().unwrap();
    let cfg = gateway::config::Config::parse(yaml, "daemonset.yaml ConfigMap").unwrap();
    assert_eq!(
        cfg.on_exit,
        gateway::config::OnExit::Keep,
        "the datapath kept across restarts"
    );
    // Adaptive with nothing written (issue 27): both services' classes under the controller.
    let moved: Vec<&str> = cfg.controller.defaulted.iter().map(|c| c.name()).collect();
    assert_eq!(moved, ["tls-new", "sip-original"], "{cfg}");
    // Its container's args are a command line this build takes.
    let args = daemonset_args("192.0.2.7");
    let cli = <gateway::cmd::Cli as clap::Parser>::try_parse_from(
        std::iter::once("gateway".to_string()).chain(args),
    );
    assert!(cli.is_ok(), "{:?}", cli.err());
}

/// The DaemonSet container's args, `$(NODE_IP)` read as `node_ip`.
fn daemonset_args(node_ip: &str) -> Vec<String> {
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/daemonset.yaml"),
    )
    .unwrap();
    let docs: Vec<serde_json::Value> = serde_norway::Deserializer::from_str(&manifest)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .collect();
    docs[1]["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .expect("the container's args")
        .iter()
        .map(|a| a.as_str().unwrap().replace("$(NODE_IP)", node_ip))
        .collect()
}

/// Issue 54: the DaemonSet's own command line, run as a node would run it (`$(NODE_IP)` the
/// gateway's address in its namespace): it protects the interface carrying that address
/// (interface names differ from node to node; it was `eth0` for every node), serves metrics
/// and health on that address alone (it was 0.0.0.0 on the host network), and applies an
/// edit of its config file as a reload, as a ConfigMap edit reaches a pod (nothing did).
#[test]
fn the_daemonsets_command_line_finds_the_nodes_interface_and_reloads_an_edited_config() {
    if !have_root("the_daemonsets_command_line_finds_the_nodes_interface") {
        return;
    }
    let net = TestNet::new();
    let dir = gateway_tests::fresh_temp_dir("gwt-daemonset-args");
    let cfg = dir.join("gateway.yaml");
    let body = |backlog: u32| {
        format!(
            "services: [{{kind: sip, port: 5060}}]\npolicy:\n  sip-original: {{backlog: {backlog}}}\non_exit: detach\n"
        )
    };
    std::fs::write(&cfg, body(30)).unwrap();
    let mut args = daemonset_args(GW_V4);
    let at = args.iter().position(|a| a == "--config").unwrap();
    args[at + 1] = cfg.display().to_string();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let metrics: u16 = args[args.iter().position(|a| *a == "--metrics").unwrap() + 1]
        .rsplit_once(':')
        .unwrap()
        .1
        .parse()
        .unwrap();
    let daemon = Daemon::spawn_command(
        net.gateway_command(&args),
        "info",
        gateway_tests::daemon::STARTUP,
    );
    let status = net.gateway_ok(&["status"]);
    assert!(status.starts_with(&format!("{}: ", net.gw_if)), "{status}");
    // Health on the node's address, and nowhere else.
    let get = |host: &str| gateway_tests::metrics::get(&net, host, metrics, "/healthz");
    assert!(get(GW_V4).is_some_and(|t| t.starts_with("HTTP/1.0 200")));
    assert!(get("127.0.0.1").is_none(), "not on every address");
    assert_eq!(net.policy("sip-original")["backlog_limit"], 30);
    // An edit of the file, as a ConfigMap edit lands: applied within seconds, no signal sent.
    std::fs::write(&cfg, body(45)).unwrap();
    let started = std::time::Instant::now();
    while net.policy("sip-original")["backlog_limit"] != 45 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "the edit was not applied: {}",
            net.policy("sip-original")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let (status, log) = daemon.terminate(Duration::from_secs(30));
    assert!(status.success(), "{log:?}");
    assert!(
        log.iter()
            .any(|l| l.contains("the config file changed: reloaded")),
        "{log:?}"
    );
}
