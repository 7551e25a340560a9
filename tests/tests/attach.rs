//! The datapath attached to a veth in a namespace, with real UDP and TCP traffic from a peer
//! namespace: per-class counters, bpftool's view of the maps, replacement through the pinned link,
//! detach, the TC hook and mode fallback.

use std::{
    io::{Read, Write},
    net::{TcpListener, TcpStream, UdpSocket},
    time::{Duration, Instant},
};

use gateway_tests::{
    auto_mode,
    frames::client_hello,
    have_root, have_xdp,
    netns::{GW_V4, GW_V6, TestNet, class_counter, sh},
};

/// An INVITE whose `#` the sender replaces with a fresh transaction's number (see [`send_udp`]).
const INVITE: &[u8] =
    b"INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2;branch=z9hG4bK#\r\n\
Call-ID: #@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";

/// Sends `payload` `n` times; every `#` in it becomes a number unique to the datagram, so that
/// each INVITE is a transaction of its own (an original), not a retransmission of the first.
fn send_udp(net: &TestNet, dst: &str, port: u16, payload: &[u8], n: usize) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static SENT: AtomicUsize = AtomicUsize::new(0);
    let dst = format!("{dst}:{port}");
    net.in_peer(|| {
        let s = UdpSocket::bind("[::]:0").expect("bind");
        for _ in 0..n {
            let id = SENT.fetch_add(1, Ordering::Relaxed).to_string();
            let msg = String::from_utf8_lossy(payload).replace('#', &id);
            s.send_to(msg.as_bytes(), &dst).expect("send");
        }
    });
}

/// One TCP connection to the gateway namespace on `port`: the client sends a ClientHello-looking
/// record, waits for the server's one-byte answer, then sends application data and closes.
fn tls_like_connection(net: &TestNet, port: u16) {
    let listener = net.in_gw(|| TcpListener::bind(("0.0.0.0", port)).expect("listen"));
    let server = std::thread::spawn(move || {
        let (mut c, _) = listener.accept().expect("accept");
        let mut hello = vec![0u8; client_hello().len()];
        c.read_exact(&mut hello).expect("hello");
        c.write_all(b"k").expect("answer");
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).expect("rest");
        rest.len()
    });
    net.in_peer(|| {
        let mut s = TcpStream::connect((GW_V4, port)).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&client_hello()).expect("write hello");
        let mut k = [0u8; 1];
        s.read_exact(&mut k).expect("server answer");
        s.write_all(&[23, 3, 3, 0, 3, 1, 2, 3]).expect("write data");
    });
    assert_eq!(server.join().expect("server"), 8, "server read the data");
}

fn status_json(net: &TestNet) -> serde_json::Value {
    serde_json::from_str(&net.gateway_ok(&["status", "--json"])).expect("status JSON")
}

/// The default attachment of a veth (native XDP, or tc where the kernel refuses XDP frame
/// metadata) counts each class.
#[test]
fn the_default_attachment_counts_real_udp_and_tcp_per_class() {
    if !have_root("the_default_attachment_counts_real_udp_and_tcp_per_class") {
        return;
    }
    let net = TestNet::new();
    let out = net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    assert!(out.contains(&format!("{} mode", auto_mode())), "{out}");
    net.gateway_ok(&["service", "add", "sip", "5060"]);
    net.gateway_ok(&["service", "add", "tls", "443"]);

    send_udp(&net, GW_V4, 5060, INVITE, 5);
    send_udp(&net, &format!("[{GW_V6}]"), 5060, INVITE, 2);
    send_udp(&net, GW_V4, 5060, b"SIP/2.0 200 OK\r\n\r\n", 3);
    send_udp(
        &net,
        GW_V4,
        5060,
        b"BYE sip:bob@example.com SIP/2.0\r\n\r\n",
        1,
    );
    send_udp(&net, GW_V4, 9999, INVITE, 4);
    tls_like_connection(&net, 443);

    let s = net.stats();
    assert_eq!(s["mode"], auto_mode());
    // The BYE belongs to no dialog the server made: judged as an original, and (no Via, no
    // Call-ID: no key a response could complete) refused.
    assert_eq!(class_counter(&s, "sip-original", "packets"), 8);
    assert_eq!(class_counter(&s, "sip-original", "admitted"), 7);
    assert_eq!(class_counter(&s, "sip-exempt", "packets"), 3);
    assert_eq!(
        class_counter(&s, "tls-new", "packets"),
        1,
        "exactly one ClientHello"
    );
    // SYN, the ACKs and the data segment, the FIN.
    assert!(class_counter(&s, "tls-flow", "packets") >= 4, "{s}");
    assert!(class_counter(&s, "other", "packets") >= 4, "{s}");
    assert_eq!(class_counter(&s, "sip-retransmission", "packets"), 0);
    assert!(s["datapath"]["ipv6"].as_u64().unwrap() >= 2);
}

/// Every key name in a JSON document.
fn keys(v: &serde_json::Value, out: &mut Vec<String>) {
    match v {
        serde_json::Value::Object(m) => {
            for (k, v) in m {
                out.push(k.clone());
                keys(v, out);
            }
        }
        serde_json::Value::Array(a) => a.iter().for_each(|v| keys(v, out)),
        _ => {}
    }
}

#[test]
fn bpftool_map_dump_shows_field_names() {
    if !have_root("bpftool_map_dump_shows_field_names") {
        return;
    }
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "tls", "8443"]);
    net.gateway_ok(&["policy", "set", "tls-new", "--backlog", "7"]);
    send_udp(&net, GW_V4, 9999, b"x", 1);
    for (map, fields) in [
        (
            "CLASS_STATS",
            &[
                "packets",
                "bytes",
                "admitted",
                "dropped_backlog",
                "dropped_rate",
                "rejected",
            ][..],
        ),
        (
            "CLASS_POLICY",
            &["backlog_limit", "rate_per_sec", "burst", "flags"],
        ),
        ("CLASS_STATE", &["admitted", "completed", "gcra_tat_ns"]),
        ("SERVICES", &["port", "proto", "kind"]),
        ("SERVICE_PORTS", &["key", "value"]),
        ("DP_COUNTERS", &["truncated", "fragments", "unparseable"]),
        ("DP_CONFIG", &["flags", "attach_mode", "ifindex"]),
        ("TLS_REFUSED", &["saddr", "daddr", "sport", "dport"]),
    ] {
        let pin = net.pin_dir().join(map);
        let out = sh(
            "bpftool",
            &["-j", "map", "dump", "pinned", pin.to_str().unwrap()],
        );
        assert!(
            out.status.success(),
            "bpftool {map}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
        let mut names = Vec::new();
        keys(&v, &mut names);
        for f in fields {
            assert!(names.iter().any(|n| n == f), "{map}: no field {f} in {v}");
        }
        if map == "CLASS_POLICY" {
            let tls_new = &v[1]["formatted"]["value"];
            assert_eq!(tls_new["backlog_limit"], 7, "{v}");
        }
    }
}

#[test]
fn reattach_replaces_the_program_through_the_same_link_and_keeps_the_maps() {
    if !have_root("reattach_replaces_the_program") {
        return;
    }
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "sip", "5060"]);
    send_udp(&net, GW_V4, 5060, INVITE, 3);
    let first = status_json(&net)[0].clone();
    assert_eq!(
        Some(first["program_id"].as_u64().unwrap()),
        net.ingress_prog_id()
    );

    let out = net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    assert!(out.starts_with("replaced program"), "{out}");
    let second = status_json(&net)[0].clone();
    assert_eq!(second["link_id"], first["link_id"], "same link");
    assert_ne!(second["program_id"], first["program_id"], "new program");
    assert_eq!(
        Some(second["program_id"].as_u64().unwrap()),
        net.ingress_prog_id()
    );
    // The new program adopted the pinned maps: services and counters survived.
    let s = net.stats();
    assert_eq!(class_counter(&s, "sip-original", "packets"), 3);
    send_udp(&net, GW_V4, 5060, INVITE, 2);
    assert_eq!(class_counter(&net.stats(), "sip-original", "packets"), 5);
    // The old program is gone from the kernel once nothing references it.
    let old = first["program_id"].to_string();
    wait_until("old program freed", || {
        !sh("bpftool", &["prog", "show", "id", &old])
            .status
            .success()
    });
}

/// A start of this build that switched the programs and stopped before removing the IPv4
/// flows it moved leaves them in `TLS_FLOWS` as well as in `TLS_FLOWS4`, where the attached
/// program keeps them: the next attach removes what is left in `TLS_FLOWS` and keeps what the
/// program wrote in `TLS_FLOWS4` (the older copy never comes back over it).
#[test]
fn reattach_removes_ipv4_flows_a_stopped_start_left_behind_and_keeps_the_programs() {
    if !have_root("reattach_removes_ipv4_flows_a_stopped_start_left_behind") {
        return;
    }
    use aya::maps::{HashMap, MapData};
    use gateway::{datapath::maps::open_as, datapath::pins::PinDir};
    use gateway_common::maps::{FLOW_ADMITTED, FLOW_PENDING, FlowKey, FlowKey4, TlsFlow, names};
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    let pd = PinDir::new(&net.root(), &net.gw_if);
    let mut v4: HashMap<MapData, FlowKey4, TlsFlow> = open_as(&pd, names::TLS_FLOWS4).unwrap();
    let mut v6: HashMap<MapData, FlowKey, TlsFlow> = open_as(&pd, names::TLS_FLOWS).unwrap();
    let key = FlowKey4 {
        saddr: [10, 99, 0, 2],
        daddr: [10, 99, 0, 1],
        sport: 40000,
        dport: 443,
    };
    let kept = TlsFlow {
        state: FLOW_ADMITTED,
        ..Default::default()
    };
    let left = TlsFlow {
        state: FLOW_PENDING,
        ..Default::default()
    };
    v4.insert(key, kept, 0).unwrap();
    v6.insert(key.mapped(), left, 0).unwrap();

    let out = net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    assert!(out.starts_with("replaced program"), "{out}");
    assert!(!out.contains("moved"), "nothing to move: {out}");
    assert_eq!(v6.keys().count(), 0, "the leftover is removed");
    assert_eq!(
        v4.get(&key, 0).unwrap(),
        kept,
        "the program's entry is kept"
    );
}

/// Polls `cond` until it holds, for at most five seconds (kernel objects are freed after an RCU
/// grace period, not synchronously).
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        std::thread::yield_now();
    }
}

#[test]
fn detach_leaves_no_program_and_no_pins() {
    if !have_root("detach_leaves_no_program_and_no_pins") {
        return;
    }
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    let info = status_json(&net)[0].clone();
    assert!(net.ingress_prog_id().is_some());
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
    assert_eq!(net.ingress_prog_id(), None, "no program on the interface");
    assert!(!net.pin_dir().exists(), "pin directory removed");
    let (prog, link) = (info["program_id"].to_string(), info["link_id"].to_string());
    wait_until("program and link freed", || {
        !sh("bpftool", &["prog", "show", "id", &prog])
            .status
            .success()
            && !sh("bpftool", &["link", "show", "id", &link])
                .status
                .success()
    });
    let out = net.gateway(&["detach", "--iface", &net.gw_if]);
    assert_eq!(
        out.status.code(),
        Some(2),
        "detaching twice is an input error"
    );
}

#[test]
fn tc_hook_counts_traffic_and_refuses_a_silent_mode_change() {
    if !have_root("tc_hook_counts_traffic") {
        return;
    }
    let net = TestNet::new();
    let out = net.gateway_ok(&["attach", "--iface", &net.gw_if, "--mode", "tc"]);
    assert!(out.contains("tc mode"), "{out}");
    assert_eq!(net.xdp_prog_id(), None, "tc mode attaches no XDP program");
    net.gateway_ok(&["service", "add", "sip", "5060"]);
    send_udp(&net, GW_V4, 5060, INVITE, 4);
    send_udp(
        &net,
        GW_V4,
        5060,
        b"ACK sip:bob@example.com SIP/2.0\r\n\r\n",
        2,
    );
    let s = net.stats();
    assert_eq!(s["mode"], "tc");
    // ACKs of no transaction the server saw are judged as originals (and, key-less, refused).
    assert_eq!(class_counter(&s, "sip-original", "packets"), 6);
    assert_eq!(class_counter(&s, "sip-original", "admitted"), 4);
    assert_eq!(class_counter(&s, "sip-exempt", "packets"), 0);

    let link = status_json(&net)[0]["link_id"].clone();
    let out = net.gateway_ok(&["attach", "--iface", &net.gw_if, "--mode", "tc"]);
    assert!(out.starts_with("replaced program"), "{out}");
    assert_eq!(status_json(&net)[0]["link_id"], link);

    let out = net.gateway(&["attach", "--iface", &net.gw_if, "--mode", "native"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("attached in tc mode"), "{err}");
    assert_eq!(net.xdp_prog_id(), None);

    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
    let link = link.to_string();
    wait_until("tcx link freed", || {
        !sh("bpftool", &["link", "show", "id", &link])
            .status
            .success()
    });
}

#[test]
fn native_failure_leaves_nothing_and_auto_falls_back_with_a_report() {
    if !have_root("native_failure_leaves_nothing") || !have_xdp("native_failure_leaves_nothing") {
        return;
    }
    let net = TestNet::new();
    // Loopback has no native XDP.
    let out = net.gateway(&["attach", "--iface", "lo", "--mode", "native"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "a refusal of the system, not of the input"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--mode auto"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(!net.root().join("lo").exists(), "nothing half-attached");

    let out = net.gateway(&["attach", "--iface", "lo", "--mode", "auto"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("generic mode"));
    assert!(String::from_utf8_lossy(&out.stderr).contains("native XDP refused"));
    let s: serde_json::Value =
        serde_json::from_str(&net.gateway_ok(&["stats", "--iface", "lo", "--json"])).unwrap();
    assert_eq!(s["mode"], "generic");
    net.gateway_ok(&["detach", "--iface", "lo"]);
}

/// On a kernel that refuses XDP programs frame metadata (`bpf_xdp_adjust_meta`), by which the
/// XDP datapath hands frames to its TC finishing program, auto attaches at tc ingress and says
/// why, and an explicit XDP mode is refused whole, naming the helper; where the kernel allows it,
/// auto takes native XDP on a veth without a word of fallback.
#[test]
fn auto_takes_tc_where_the_kernel_refuses_xdp_metadata_and_xdp_modes_are_refused_there() {
    if !have_root("auto_takes_tc_where_the_kernel_refuses_xdp_metadata") {
        return;
    }
    let net = TestNet::new();
    let allowed = gateway::datapath::loader::xdp_metadata();
    let out = net.gateway(&["attach", "--iface", &net.gw_if]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    if allowed {
        assert!(stdout.contains("native mode"), "{stdout}");
        assert!(!stderr.contains("refused"), "{stderr}");
        return;
    }
    assert!(stdout.contains("tc mode"), "{stdout}");
    assert!(
        stderr.contains("native XDP refused") && stderr.contains("bpf_xdp_adjust_meta"),
        "{stderr}"
    );
    assert_eq!(net.stats()["mode"], "tc");
    assert_eq!(net.xdp_prog_id(), None);
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
    for mode in ["native", "generic"] {
        let out = net.gateway(&["attach", "--iface", &net.gw_if, "--mode", mode]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{mode}: {err}");
        assert!(
            err.contains(&format!("{mode} XDP needs `bpf_xdp_adjust_meta`")),
            "{mode}: {err}"
        );
        assert!(!net.pin_dir().exists(), "{mode}: nothing half-attached");
        assert_eq!(net.ingress_prog_id(), None, "{mode}");
    }
}

/// Issue 29, case 7: one vocabulary. `stats --json` and `policy show --json` name a class's
/// counters the same way (`admitted`, `completed`, `expired`), `stats --json` carries the limits
/// `policy show` shows (with who set them) and the p99, `stats --watch` prints a timestamp and
/// per-second rates after its first print, and `status` names every link and the daemon.
#[test]
fn stats_policy_and_status_speak_one_vocabulary() {
    if !have_root("stats_policy_and_status_speak_one_vocabulary") {
        return;
    }
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "sip", "5060"]);
    net.gateway_ok(&["policy", "set", "sip-original", "--backlog", "7"]);
    let stats: serde_json::Value =
        serde_json::from_str(&net.gateway_ok(&["stats", "--json"])).unwrap();
    let class = stats["classes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sip-original")
        .unwrap()
        .clone();
    let row = net.policy("sip-original");
    for word in ["admitted", "completed", "expired", "backlog"] {
        assert!(class.get(word).is_some(), "stats lacks {word}: {class}");
        assert!(row.get(word).is_some(), "policy show lacks {word}: {row}");
    }
    assert_eq!(class["limits"]["backlog_limit"], 7, "{class}");
    assert_eq!(class["limits"]["owner"], row["owner"], "{class} {row}");
    assert!(class.get("service_time_us_p99").is_some(), "{class}");
    assert!(stats["time"].as_f64().unwrap() > 1.7e9, "{stats}");
    // Two prints a second apart: the second has rates, the first none.
    send_udp(&net, GW_V4, 5060, INVITE, 3);
    let watch = net.gateway_ok(&["stats", "--json", "--watch", "1", "--count", "2"]);
    let prints: Vec<serde_json::Value> = watch
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(prints.len(), 2, "{watch}");
    assert!(prints[0]["classes"][4]["per_second"].is_null());
    assert!(
        prints[1]["classes"][4]["per_second"]["packets"].is_number(),
        "{}",
        prints[1]
    );
    let table = net.gateway_ok(&["stats", "--watch", "1", "--count", "2"]);
    assert_eq!(table.matches("packets/s").count(), 1, "{table}");
    assert!(table.lines().next().unwrap().contains(" at 20"), "{table}");
    let status = net.gateway_ok(&["status"]);
    assert!(
        status.contains("egress link")
            && status.contains("finish link")
            && status.contains("daemon none"),
        "{status}"
    );
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
}
