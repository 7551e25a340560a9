//! `gateway run`: attaches per the config, applies it, serves, and on SIGTERM detaches or leaves
//! the datapath per `on_exit`; a restart adopts the pinned attachment through its link.

use std::{net::UdpSocket, time::Duration};

use gateway_tests::{
    daemon::{Daemon, STARTUP},
    frames::Frame,
    have_root,
    netns::{GW_V4, TestNet, class_counter, send_raw_frames},
};

const SHUTDOWN: Duration = Duration::from_secs(10);

fn config(net: &TestNet, on_exit: &str) -> std::path::PathBuf {
    let yaml = format!(
        "interfaces:\n  - name: {}\nservices:\n  - {{kind: tls, port: 8443}}\n  - {{kind: sip, port: 5062}}\npolicy:\n  tls-new: {{backlog: 10, rate: 50, burst: 5}}\ndatapath:\n  fragments: drop\non_exit: {on_exit}\n",
        net.gw_if
    );
    let p = std::env::temp_dir().join(format!(
        "gwt-daemon-{}-{}.yaml",
        std::process::id(),
        net.gw_if
    ));
    std::fs::write(&p, yaml).unwrap();
    p
}

#[test]
fn run_applies_the_config_and_detaches_on_sigterm() {
    if !have_root("run_applies_the_config_and_detaches_on_sigterm") {
        return;
    }
    let net = TestNet::new();
    // A stale service added by hand is replaced by the config's.
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "sip", "7777"]);
    let cfg = config(&net, "detach");
    let daemon = Daemon::start(&net, &["--config", cfg.to_str().unwrap()], STARTUP);
    assert!(
        daemon.log.iter().any(|l| l.contains("adopted attachment")),
        "{:?}",
        daemon.log
    );

    let services: serde_json::Value =
        serde_json::from_str(&net.gateway_ok(&["service", "list", "--json"])).unwrap();
    assert_eq!(
        services,
        serde_json::json!([
            {"kind": "sip", "proto": "udp", "port": 5062, "syn_cookies": false},
            {"kind": "tls", "proto": "tcp", "port": 8443, "syn_cookies": true},
        ]),
        "exactly the config's services, sorted by port (SYN cookies for TLS by default)"
    );
    assert!(
        daemon.log.iter().any(|l| l.contains(
            "tls tcp/8443: SYNs answered from the NIC with SYN cookies (the default; \
             syn_cookies: false leaves them to the kernel)"
        )),
        "{:?}",
        daemon.log
    );
    let policy: serde_json::Value =
        serde_json::from_str(&net.gateway_ok(&["policy", "show", "--json"])).unwrap();
    assert_eq!(policy[0]["class"], "tls-new");
    assert_eq!(policy[0]["backlog_limit"], 10);
    assert_eq!(policy[0]["rate"], 50);
    assert_eq!(policy[1]["backlog_limit"], serde_json::Value::Null);

    net.in_peer(|| {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..3 {
            s.send_to(b"OPTIONS sip:x SIP/2.0\r\n\r\n", (GW_V4, 5062))
                .unwrap();
        }
    });
    assert_eq!(class_counter(&net.stats(), "sip-original", "packets"), 3);

    let (status, log) = daemon.terminate(SHUTDOWN);
    assert!(status.success(), "{status}: {log:?}");
    assert!(log.iter().any(|l| l.contains("SIGTERM")), "{log:?}");
    assert_eq!(net.ingress_prog_id(), None, "detached on exit");
    assert!(!net.pin_dir().exists());
    std::fs::remove_file(cfg).unwrap();
}

#[test]
fn keep_on_exit_leaves_protection_and_a_restart_adopts_the_same_link() {
    if !have_root("keep_on_exit_leaves_protection") {
        return;
    }
    let net = TestNet::new();
    let cfg = config(&net, "keep");
    let daemon = Daemon::start(&net, &["--config", cfg.to_str().unwrap()], STARTUP);
    assert!(
        daemon.log.iter().any(|l| l.contains(" attached")),
        "{:?}",
        daemon.log
    );
    let status: serde_json::Value =
        serde_json::from_str(&net.gateway_ok(&["status", "--json"])).unwrap();
    let (link, prog) = (
        status[0]["link_id"].clone(),
        status[0]["program_id"].clone(),
    );
    let (exit, log) = daemon.terminate(SHUTDOWN);
    assert!(exit.success(), "{log:?}");
    assert_eq!(
        net.ingress_prog_id(),
        prog.as_u64(),
        "still protecting after exit"
    );

    let daemon = Daemon::start(&net, &["--config", cfg.to_str().unwrap()], STARTUP);
    assert!(
        daemon.log.iter().any(|l| l.contains("adopted attachment")),
        "{:?}",
        daemon.log
    );
    let status: serde_json::Value =
        serde_json::from_str(&net.gateway_ok(&["status", "--json"])).unwrap();
    assert_eq!(
        status[0]["link_id"], link,
        "same link: replaced, never detached"
    );
    assert_ne!(status[0]["program_id"], prog);
    let (exit, _) = daemon.terminate(SHUTDOWN);
    assert!(exit.success());
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
    std::fs::remove_file(cfg).unwrap();
}

/// Issue 29, case 1: one daemon per datapath. A second `gateway run` for an interface a live
/// daemon serves is refused at once, naming that daemon, whatever its own `on_exit`; it neither
/// replaces the program nor detaches anything. `gateway attach` is refused too. The first daemon
/// keeps serving (a reload reaches it) on the same program.
#[test]
fn a_second_daemon_is_refused_and_the_first_keeps_its_datapath() {
    if !have_root("a_second_daemon_is_refused") {
        return;
    }
    let net = TestNet::new();
    for (first_exit, second_exit) in [("keep", "detach"), ("detach", "keep")] {
        let cfg = config(&net, first_exit);
        let first = Daemon::start(&net, &["--config", cfg.to_str().unwrap()], STARTUP);
        let prog = net.ingress_prog_id();
        assert!(prog.is_some());
        let second_cfg = cfg.with_extension("second.yaml");
        std::fs::write(
            &second_cfg,
            std::fs::read_to_string(&cfg).unwrap().replace(
                &format!("on_exit: {first_exit}"),
                &format!("on_exit: {second_exit}"),
            ),
        )
        .unwrap();
        let mut second = net
            .gateway_command(&["run", "--config", second_cfg.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + STARTUP;
        let status = loop {
            if let Some(status) = second.try_wait().unwrap() {
                break status;
            }
            if std::time::Instant::now() > deadline {
                let _ = second.kill();
                panic!("a second daemon ran beside the first (on_exit {second_exit})");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let out = second.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!("pid {}", first.pid()))
                && stderr.contains("one daemon per datapath"),
            "{stderr}"
        );
        let attach = net.gateway(&["attach", "--iface", &net.gw_if]);
        assert_eq!(attach.status.code(), Some(2), "{attach:?}");
        assert_eq!(
            net.ingress_prog_id(),
            prog,
            "the same program, not replaced"
        );
        let reloaded = net.gateway_ok(&["reload"]);
        assert!(
            reloaded.contains(&format!("daemon pid {}", first.pid())),
            "{reloaded}"
        );
        let (exit, log) = first.terminate(SHUTDOWN);
        assert!(exit.success(), "{log:?}");
        if first_exit == "keep" {
            assert_eq!(net.ingress_prog_id(), prog, "kept on exit");
            net.gateway_ok(&["detach", "--iface", &net.gw_if]);
        } else {
            assert_eq!(net.ingress_prog_id(), None, "detached by its own daemon");
        }
        std::fs::remove_file(second_cfg).unwrap();
        std::fs::remove_file(cfg).unwrap();
    }
}

#[test]
fn embedded_default_serves_on_a_given_interface() {
    if !have_root("embedded_default_serves") {
        return;
    }
    let net = TestNet::new();
    let daemon = Daemon::start(&net, &["--iface", &net.gw_if], STARTUP);
    let services = net.gateway_ok(&["service", "list"]);
    assert!(services.contains("tls   tcp      443"), "{services}");
    assert!(services.contains("sip   udp     5060"), "{services}");
    let (exit, log) = daemon.terminate(SHUTDOWN);
    assert!(exit.success(), "{log:?}");
    // The embedded default is a sandbox default: it leaves nothing behind.
    assert_eq!(net.ingress_prog_id(), None);
}

#[test]
fn ebpf_log_records_reach_the_daemon_log() {
    if !have_root("ebpf_log_records_reach_the_daemon_log") {
        return;
    }
    let net = TestNet::new();
    let cfg =
        std::env::temp_dir().join(format!("gwt-log-{}-{}.yaml", std::process::id(), net.gw_if));
    std::fs::write(
        &cfg,
        format!(
            "interfaces:\n  - name: {}\ndatapath:\n  ebpf_log_level: debug\non_exit: detach\n",
            net.gw_if
        ),
    )
    .unwrap();
    let mut daemon = Daemon::start_logging(
        &net,
        &["--config", cfg.to_str().unwrap()],
        "info,gateway_ebpf=debug,gateway=debug",
        STARTUP,
    );
    // An IPv4 header whose IHL says 4 words (< 5): malformed at offset 14.
    let mut frame = Frame::udp(5060, b"x").build();
    frame[14] = 0x44;
    let peer_if = net.peer_if.clone();
    net.in_peer(|| send_raw_frames(&peer_if, &[frame]));
    let line = daemon.wait_for("malformed header at offset 14", STARTUP);
    assert!(line.contains("DEBUG"), "{line}");
    assert_eq!(net.stats()["datapath"]["malformed"], 1);
    // Detached by hand and put back by the daemon: the new program's records arrive too.
    let status: serde_json::Value =
        serde_json::from_str(&net.gateway_ok(&["status", "--json"])).unwrap();
    let link = status[0]["link_id"].to_string();
    let out = std::process::Command::new("bpftool")
        .args(["link", "detach", "id", &link])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    daemon.wait_for("attached again", STARTUP);
    let mut frame = Frame::udp(5060, b"y").build();
    frame[14] = 0x44;
    net.in_peer(|| send_raw_frames(&peer_if, &[frame]));
    daemon.wait_for("malformed header at offset 14", STARTUP);
    assert_eq!(net.stats()["datapath"]["malformed"], 2);
    let (exit, _) = daemon.terminate(SHUTDOWN);
    assert!(exit.success());
    std::fs::remove_file(cfg).unwrap();
}

/// Issue 27: logs an operator's shipper can read. With `--log-format json` every line the daemon
/// writes is one JSON object with a timestamp, a level and the message; the line that says it is
/// ready carries the config it runs as a field.
#[test]
fn with_log_format_json_every_line_is_a_json_object() {
    if !have_root("with_log_format_json_every_line_is_a_json_object") {
        return;
    }
    let net = TestNet::new();
    let cfg = config(&net, "detach");
    let daemon = Daemon::start(
        &net,
        &["--log-format", "json", "--config", cfg.to_str().unwrap()],
        STARTUP,
    );
    let (status, log) = daemon.terminate(SHUTDOWN);
    assert!(status.success(), "{log:?}");
    assert!(log.len() >= 3, "{log:?}");
    let lines: Vec<serde_json::Value> = log
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    for l in &lines {
        assert!(
            l["timestamp"].is_string()
                && l["level"].is_string()
                && l["fields"]["message"].is_string(),
            "{l}"
        );
    }
    let ready = lines
        .iter()
        .find(|l| l["fields"]["message"] == "gateway ready")
        .expect("the ready line");
    assert!(ready["fields"]["config"].is_string(), "{ready}");
}

/// Issue 54: a start that fails after it attached (here its metrics address is taken) leaves
/// nothing attached, even with `on_exit: keep` (the default): keeping is for a datapath a
/// daemon served, and nobody asked to keep one that no daemon will. An attachment the failed
/// start adopted stays as it was found.
#[test]
fn a_failed_start_leaves_nothing_it_attached_and_keeps_what_it_adopted() {
    if !have_root("a_failed_start_leaves_nothing_it_attached") {
        return;
    }
    let net = TestNet::new();
    let taken = net.in_gw(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap());
    let port = taken.local_addr().unwrap().port();
    let dir = gateway_tests::fresh_temp_dir("gwt-daemon-failed-start");
    let cfg = dir.join("gateway.yaml");
    std::fs::write(
        &cfg,
        format!(
            "interfaces:\n  - name: {}\nservices: [{{kind: sip, port: 5062}}]\nmetrics: 127.0.0.1:{port}\non_exit: keep\n",
            net.gw_if
        ),
    )
    .unwrap();
    let run = |what: &str| {
        let out = net.gateway(&["run", "--config", cfg.to_str().unwrap()]);
        let said = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(!out.status.success(), "{what}: the start fails: {said}");
        assert!(said.contains(&port.to_string()), "{what}: {said}");
        said
    };
    let said = run("fresh");
    assert!(
        said.contains("detached what this failed start attached"),
        "{said}"
    );
    assert_eq!(net.ingress_prog_id(), None, "nothing attached: {said}");
    assert!(!net.pin_dir().exists(), "nothing pinned: {said}");
    // Adopted: an attachment there before the start stays attached, its pins in place.
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    let before = net.ingress_prog_id();
    let said = run("adopted");
    assert!(before.is_some());
    assert!(net.pin_dir().join("link").exists(), "{said}");
    assert!(net.ingress_prog_id().is_some(), "{said}");
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
    drop(taken);
}

/// Issue 54: `status` tells a daemon that was killed from one that runs: it named the dead
/// one's pid as the daemon and exited 0. The daemon is the process holding the datapath's lock;
/// a pid recorded without it is reported gone, and `status` fails.
#[test]
fn status_reports_a_killed_daemon_as_gone_and_fails() {
    if !have_root("status_reports_a_killed_daemon_as_gone") {
        return;
    }
    let net = TestNet::new();
    let dir = gateway_tests::fresh_temp_dir("gwt-daemon-killed");
    let daemon = Daemon::start_config(
        &net,
        &dir,
        "services: [{kind: sip, port: 5062}]\non_exit: keep\n",
    );
    let pid = daemon.pid();
    let said = net.gateway_ok(&["status"]);
    assert!(said.contains(&format!("daemon pid {pid}")), "{said}");
    let json: serde_json::Value =
        serde_json::from_str(&net.gateway_ok(&["status", "--json"])).unwrap();
    assert_eq!(json[0]["daemon_pid"], pid, "{json}");
    daemon.kill();
    let out = net.gateway(&["status"]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success(), "{stdout} {stderr}");
    assert!(
        stdout.contains(&format!("daemon gone (pid {pid})")),
        "{stdout}"
    );
    assert!(stderr.contains("gone without stopping"), "{stderr}");
    // A reload has nobody to ask.
    let out = net.gateway(&["reload"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not a running"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
}

/// Issue 54: the CLI finds the pins where the config puts them (`bpffs:`), from `--config` or
/// `GATEWAY_CONFIG`, or from `GATEWAY_BPFFS`, as `run` did alone: every command needed
/// `--bpffs` beside a config that said it already.
#[test]
fn the_cli_finds_the_bpffs_from_the_config_or_the_environment() {
    if !have_root("the_cli_finds_the_bpffs_from_the_config") {
        return;
    }
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    let dir = gateway_tests::fresh_temp_dir("gwt-cli-bpffs");
    let cfg = dir.join("gateway.yaml");
    std::fs::write(
        &cfg,
        format!(
            "interfaces:\n  - name: {}\nbpffs: {}\n",
            net.gw_if,
            net.root().display()
        ),
    )
    .unwrap();
    // `gateway status` in the gateway's namespace, without --bpffs.
    let status = |args: &[&str], env: &[(&str, &std::path::Path)]| {
        let mut c = std::process::Command::new("ip");
        c.args(["netns", "exec", &net.gw_ns])
            .arg(gateway_tests::gateway_bin())
            .arg("status")
            .args(args)
            .env_remove("GATEWAY_BPFFS")
            .env_remove("GATEWAY_CONFIG");
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    };
    let mine = format!("{}: ", net.gw_if);
    let config = cfg.to_str().unwrap();
    for (how, said) in [
        ("--config", status(&["--config", config], &[])),
        ("GATEWAY_CONFIG", status(&[], &[("GATEWAY_CONFIG", &cfg)])),
        (
            "GATEWAY_BPFFS",
            status(&[], &[("GATEWAY_BPFFS", &net.root())]),
        ),
    ] {
        assert!(said.starts_with(&mine), "{how}: {said}");
    }
    // --bpffs wins over the config; with neither, the default root (not ours).
    let elsewhere = dir.join("elsewhere");
    let said = status(
        &["--config", config, "--bpffs", elsewhere.to_str().unwrap()],
        &[],
    );
    assert!(!said.contains(&mine), "{said}");
    assert!(!status(&[], &[]).contains(&mine));
    // A config that does not load is named.
    let broken = dir.join("broken.yaml");
    std::fs::write(&broken, "bpffs: [\n").unwrap();
    let said = status(&["--config", broken.to_str().unwrap()], &[]);
    assert!(said.contains("broken.yaml"), "{said}");
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
}

/// Issue 54: `gateway detach` under a live daemon is refused, naming it (it was accepted, and
/// the daemon then warned every second, answered /readyz 503 for good, and `status` said "not
/// attached anywhere" with exit 0). The daemon serves on, and its own stop detaches.
#[test]
fn detach_under_a_live_daemon_is_refused_naming_it() {
    if !have_root("detach_under_a_live_daemon_is_refused") {
        return;
    }
    let net = TestNet::new();
    let dir = gateway_tests::fresh_temp_dir("gwt-daemon-detach");
    let daemon = Daemon::start_config(&net, &dir, "services: [{kind: sip, port: 5062}]\n");
    let out = net.gateway(&["detach", "--iface", &net.gw_if]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!("`gateway run` (pid {})", daemon.pid())),
        "{said}"
    );
    let status = net.gateway_ok(&["status"]);
    assert!(
        status.contains(&format!("daemon pid {}", daemon.pid())),
        "{status}"
    );
    let (status, log) = daemon.terminate(SHUTDOWN);
    assert!(status.success(), "{log:?}");
    assert!(!net.pin_dir().exists(), "the daemon's on_exit: detach ran");
}

/// Issue 54: a second gateway datapath on an interface one already serves, from another bpffs
/// root, is refused before anything is loaded, naming the first's pins (tc mode stacked a
/// second program beside the first; native failed with "`bpf_link_create` failed" and no
/// errno). Once the first is detached, the other root attaches.
#[test]
fn a_second_datapath_from_another_bpffs_is_refused_naming_the_first() {
    if !have_root("a_second_datapath_from_another_bpffs_is_refused") {
        return;
    }
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    let other = gateway_tests::netns::Bpffs::new();
    let other_root = other.root();
    let attach_other = |mode: &str| {
        let bin = gateway_tests::gateway_bin();
        net.exec(
            &net.gw_ns,
            bin.to_str().unwrap(),
            &[
                "--bpffs",
                other_root.to_str().unwrap(),
                "attach",
                "--iface",
                &net.gw_if,
                "--mode",
                mode,
            ],
        )
    };
    let first = net.root().join(&net.gw_if);
    for mode in ["tc", "native", "generic", "auto"] {
        let out = attach_other(mode);
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{mode}: {said}");
        assert!(
            said.contains(&format!(
                "carries a gateway datapath pinned under {}",
                first.display()
            )),
            "{mode}: {said}"
        );
        assert!(
            !other_root.join(&net.gw_if).exists(),
            "{mode}: nothing pinned"
        );
    }
    // The first is as it was.
    let status = net.gateway_ok(&["status"]);
    assert!(status.starts_with(&format!("{}: ", net.gw_if)), "{status}");
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
    let out = attach_other("tc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = net.exec(
        &net.gw_ns,
        gateway_tests::gateway_bin().to_str().unwrap(),
        &[
            "--bpffs",
            other_root.to_str().unwrap(),
            "detach",
            "--iface",
            &net.gw_if,
        ],
    );
    assert!(out.status.success());
}

/// Issue 54: `gateway config show` prints the config the running daemon holds (as `nginx -T`
/// does): the file's as last applied, the command line's overrides in, every default written
/// out; a config that parses as one, and follows a reload. Without a daemon, it says so.
#[test]
fn config_show_prints_what_the_daemon_runs_and_follows_a_reload() {
    if !have_root("config_show_prints_what_the_daemon_runs") {
        return;
    }
    let net = TestNet::new();
    let dir = gateway_tests::fresh_temp_dir("gwt-config-show");
    let body = |backlog: u32| {
        format!(
            "services: [{{kind: sip, port: 5062}}]\npolicy:\n  sip-original: {{backlog: {backlog}}}\n"
        )
    };
    let daemon = Daemon::start_config(&net, &dir, &body(30));
    let shown = |net: &TestNet| {
        let text = net.gateway_ok(&["config", "show"]);
        gateway::config::Config::parse(&text, "config show")
            .unwrap_or_else(|e| panic!("{e}: {text}"))
    };
    let cfg = shown(&net);
    assert_eq!(cfg.interfaces.0[0].name, net.gw_if);
    assert_eq!(cfg.bpffs, net.root(), "the command line's --bpffs is in");
    assert_eq!(
        cfg.policy.of(gateway_common::Class::SipOriginal).backlog,
        Some(30)
    );
    assert_eq!(cfg.services.0.len(), 1);
    // Sections the file does not have, written out with the values in force.
    let text = net.gateway_ok(&["config", "show"]);
    assert!(
        text.contains("\ndatapath:") && text.contains("\ncontroller:"),
        "{text}"
    );
    Daemon::write_config(&net, &dir, &body(45));
    net.gateway_ok(&["reload"]);
    assert_eq!(
        shown(&net)
            .policy
            .of(gateway_common::Class::SipOriginal)
            .backlog,
        Some(45)
    );
    let (status, log) = daemon.terminate(SHUTDOWN);
    assert!(status.success(), "{log:?}");
    // No daemon (and here no attachment either): said, exit 2.
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    let out = net.gateway(&["config", "show"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no daemon serves"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
}

/// Issue 54: a host name where an address is written (`localhost:9477` was refused): looked up
/// when the config is read, IPv4 first; `config show` says the address it became. A name that
/// does not resolve is refused naming the field.
#[test]
fn a_host_name_where_an_address_is_written_is_looked_up() {
    if !have_root("a_host_name_where_an_address_is_written") {
        return;
    }
    const METRICS: u16 = 9494;
    let net = TestNet::new();
    let dir = gateway_tests::fresh_temp_dir("gwt-daemon-hostname");
    let daemon = Daemon::start_config(
        &net,
        &dir,
        &format!("metrics: localhost:{METRICS}\nservices: [{{kind: sip, port: 5062}}]\n"),
    );
    let answer = gateway_tests::metrics::get(&net, "127.0.0.1", METRICS, "/healthz")
        .expect("the metrics endpoint at localhost's address");
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    let shown = net.gateway_ok(&["config", "show"]);
    assert!(
        shown.contains(&format!("metrics: 127.0.0.1:{METRICS}")),
        "{shown}"
    );
    let (status, log) = daemon.terminate(SHUTDOWN);
    assert!(status.success(), "{log:?}");
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        format!(
            "interfaces:\n  - name: {}\nmetrics: no-such-host.invalid:9477\n",
            net.gw_if
        ),
    )
    .unwrap();
    let out = net.gateway(&["config", "check", bad.to_str().unwrap()]);
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains("metrics") && said.contains("no-such-host.invalid does not resolve"),
        "{said}"
    );
}

/// Issue 55: the daemon at idle, with the embedded default config on a veth (the TLS proxy, a
/// TLS and a SIP service, the controller, the metrics endpoint), holds little beside its code,
/// after its start and after a reload: each parses the kernel's BTF and the eBPF object (tens of
/// megabytes, freed), which the daemon kept resident (64 MB in all with a release build, the
/// kernel's BTF held for its life) until it gave them back.
#[test]
fn the_daemon_at_idle_holds_little_beside_its_code_after_a_start_and_a_reload() {
    if !have_root("the_daemon_at_idle_holds_little_beside_its_code") {
        return;
    }
    use gateway_tests::procfs::{code_rss_bytes, rss_bytes};
    let net = TestNet::new();
    let mut daemon = Daemon::start(&net, &["--iface", &net.gw_if], STARTUP);
    let pid = daemon.pid();
    let started = (rss_bytes(pid), code_rss_bytes(pid));
    // A reload of the same config: loaded and parsed again, applied.
    let said = net.gateway_ok(&["reload"]);
    assert!(said.starts_with("reloaded"), "{said}");
    daemon.wait_for("reloaded", STARTUP);
    let reloaded = (rss_bytes(pid), code_rss_bytes(pid));
    const MB: u64 = 1 << 20;
    for (when, (rss, code)) in [("started", started), ("reloaded", reloaded)] {
        eprintln!(
            "{when}: {:.1} MB resident, {:.1} MB of it the binary's code",
            rss as f64 / MB as f64,
            code as f64 / MB as f64
        );
        assert!(
            rss > code && code > 0,
            "{when}: {rss} resident, {code} code"
        );
        // The release build's whole resident set is under 20 MB (the benchmark's row); the
        // code's share depends on the build profile, the rest does not.
        assert!(
            rss - code < 20 * MB,
            "{when}: {:.1} MB resident beside the code",
            (rss - code) as f64 / MB as f64
        );
    }
    let (exit, log) = daemon.terminate(SHUTDOWN);
    assert!(exit.success(), "{log:?}");
}
