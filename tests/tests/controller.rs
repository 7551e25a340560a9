//! The adaptive controller in the daemon, against a SIP server whose capacity nobody tells the
//! gateway (one FIFO thread, a fixed CPU cost per INVITE), driven by SIPp at three times that
//! capacity; and who owns a limit when an operator steps in.

use std::{
    net::UdpSocket,
    time::{Duration, Instant},
};

use gateway_tests::{
    daemon::Daemon,
    fresh_temp_dir, have_root,
    netns::{GW_V4, TestNet},
    sipp::run_uac,
    sipserver::SlowSipServer,
};
use serde_json::Value;

const INVITE_COST: Duration = Duration::from_millis(5);
const OTHER_COST: Duration = Duration::from_micros(200);
/// Seconds of load; goodput is averaged from second WARM on.
const SECONDS: u64 = 8;
const WARM: usize = 3;

/// The `policy show --json` row of `class`.
fn policy(net: &TestNet, class: &str) -> Value {
    let rows: Value =
        serde_json::from_str(&net.gateway_ok(&["policy", "show", "--json"])).expect("json");
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["class"] == class)
        .cloned()
        .expect("the class's row")
}

/// Polls `policy show` (bounded) until `done` holds for the class's row; returns that row.
fn wait_policy(net: &TestNet, class: &str, what: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let row = policy(net, class);
        if done(&row) {
            return row;
        }
        assert!(Instant::now() < deadline, "{what}: {row}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn with_no_limit_set_the_controller_keeps_a_server_at_capacity_and_yields_to_an_operator() {
    if !have_root("with_no_limit_set_the_controller_keeps_a_server_at_capacity") {
        return;
    }
    let net = TestNet::new();
    let dir = fresh_temp_dir("gwt-controller");
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    let _server = SlowSipServer::start(socket, 8 << 20, INVITE_COST, OTHER_COST);
    let capacity = 1.0 / (INVITE_COST + OTHER_COST * 2).as_secs_f64();
    let daemon = Daemon::start_config(
        &net,
        &dir,
        "services:\n  - {kind: sip, port: 5060}\ncontroller:\n  classes:\n    sip-original: {mode: sip, target: 100ms, max: 10000}\n",
    );
    // The controller takes the class over at its upper bound: no limit picked by hand.
    let start = wait_policy(&net, "sip-original", "taken over", |r| {
        r["owner"] == "controller"
    });
    assert_eq!(start["backlog_limit"], 10000, "{start}");
    assert_eq!(start["bound_max"], 10000, "{start}");

    // Three times the server's capacity; the limits sampled while the load lasts (read after
    // it, they may already have relaxed).
    let running = std::sync::atomic::AtomicBool::new(true);
    let (uac, limit, held) = std::thread::scope(|scope| {
        let uac = scope.spawn(|| {
            let uac = run_uac(&net, &dir, (3.0 * capacity) as u64, SECONDS);
            running.store(false, std::sync::atomic::Ordering::Relaxed);
            uac
        });
        let mut lowest: Option<(u64, Value)> = None;
        while running.load(std::sync::atomic::Ordering::Relaxed) {
            let held = policy(&net, "sip-original");
            let l = held["backlog_limit"].as_u64().unwrap();
            if lowest.as_ref().is_none_or(|(low, _)| l < *low) {
                lowest = Some((l, held));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let (limit, held) = lowest.expect("sampled during the load");
        (uac.join().unwrap(), limit, held)
    });
    let goodput = uac.goodput(WARM, SECONDS as usize);
    assert!(
        goodput >= 0.85 * capacity,
        "goodput {goodput:.0}/s of {capacity:.0}: {uac:?} {held}"
    );
    // It cut the limit itself, and says why.
    assert!(limit < 1000, "{held}");
    assert_eq!(held["owner"], "controller");
    // Retransmissions strictly below originals (the controller writes both in one step).
    let now = policy(&net, "sip-original")["backlog_limit"]
        .as_u64()
        .unwrap();
    let retrans = policy(&net, "sip-retransmission");
    assert!(
        retrans["backlog_limit"].as_u64().unwrap() < now.max(1),
        "retransmissions strictly below originals: {retrans}"
    );
    // With the load gone, it relaxes.
    wait_policy(&net, "sip-original", "relaxed", |r| {
        r["backlog_limit"].as_u64().unwrap() >= 4 * limit.max(1) && r["reason"] == "headroom"
    });

    // An operator's value is never silently undone: without --pin, refused; pinned, kept.
    let refused = net.gateway(&["policy", "set", "sip-original", "--backlog", "7"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--pin"),
        "{refused:?}"
    );
    net.gateway_ok(&["policy", "set", "sip-original", "--backlog", "7", "--pin"]);
    let pinned = wait_policy(&net, "sip-original", "five intervals pass", |r| {
        r["changed_ms_ago"].as_u64().unwrap_or(0) >= 500
    });
    assert_eq!(pinned["backlog_limit"], 7, "{pinned}");
    assert_eq!(
        (pinned["owner"].as_str(), pinned["pinned"].as_bool()),
        (Some("operator"), Some(true))
    );
    // Unpinned, the controller takes it from the operator's value.
    net.gateway_ok(&["policy", "unpin", "sip-original"]);
    let back = wait_policy(&net, "sip-original", "taken back", |r| {
        r["owner"] == "controller"
    });
    assert!(back["backlog_limit"].as_u64().unwrap() >= 7, "{back}");
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
