//! The adaptive controller in the daemon, against a SIP server whose capacity nobody tells the
//! gateway (one FIFO thread, a fixed CPU cost per INVITE, and a real Kamailio), driven by SIPp
//! at three times that capacity; and who owns a limit when an operator steps in. Mode `tls` in front of a TLS
//! server the daemon does not terminate (nginx), its handshake cost inferred from completion
//! times.

use std::{
    net::UdpSocket,
    path::Path,
    sync::{RwLock, RwLockReadGuard, RwLockWriteGuard},
    time::{Duration, Instant},
};

use gateway_tests::{
    daemon::Daemon,
    fresh_temp_dir, have_root,
    kamailio::{self, Kamailio},
    netns::{GW_V4, TestNet},
    sipp::{UacRun, measure_capacity, run_uac},
    sipserver::{Answer, SlowSipServer},
    trickle::Trickle,
};
use serde_json::Value;

const INVITE_COST: Duration = Duration::from_millis(5);
const OTHER_COST: Duration = Duration::from_micros(200);
/// Seconds of load; goodput is averaged from second WARM on.
const SECONDS: u64 = 8;
const WARM: usize = 3;

/// Held by each test for its whole run. Every test here measures what a server answers against
/// the capacity it has on this machine, and the harness runs two at once. A server that is not
/// paced (a spinning FIFO, Kamailio, nginx, the proxy) loses capacity to another test's load
/// generator, not to the law under test: its tests take the machine alone. Paced servers hold
/// their capacity on a busy machine: their tests share it with each other.
static MACHINE: RwLock<()> = RwLock::new(());

/// The machine to this test alone (a test that failed while holding it leaves it usable).
fn machine_to_myself() -> RwLockWriteGuard<'static, ()> {
    MACHINE
        .write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The machine shared with other tests of paced servers only.
fn machine_shared() -> RwLockReadGuard<'static, ()> {
    MACHINE
        .read()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The `policy show --json` row of `class`.
fn policy(net: &TestNet, class: &str) -> Value {
    net.policy(class)
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

/// The backlog limit of sip-original's INVITEs in its `policy show --json` row (what mode sip
/// moves for INVITEs; the class's limit is the sum of its method families'), `u64::MAX` for
/// none.
fn invite_limit(row: &Value) -> u64 {
    row["families"]
        .as_array()
        .and_then(|f| f.iter().find(|f| f["method"] == "invite"))
        .and_then(|f| f["backlog_limit"].as_u64())
        .unwrap_or(u64::MAX)
}

/// SIPp at `rate` calls/s for [`SECONDS`], the sip-original row sampled while the load lasts
/// (read after it, the limits may already have relaxed): the run, the lowest INVITE limit and
/// its row.
fn overload(net: &TestNet, dir: &Path, rate: u64) -> (UacRun, u64, Value) {
    let (uac, samples) = sampled(net, dir, rate);
    let (_, limit, held) = samples
        .into_iter()
        .min_by_key(|(_, l, _)| *l)
        .expect("sampled during the load");
    (uac, limit, held)
}

/// SIPp at `rate` calls/s for [`SECONDS`], and the sip-original row every 100 ms while it
/// lasts: when (since the start), its INVITE limit, the row.
fn sampled(net: &TestNet, dir: &Path, rate: u64) -> (UacRun, Vec<(Duration, u64, Value)>) {
    let running = std::sync::atomic::AtomicBool::new(true);
    let start = Instant::now();
    std::thread::scope(|scope| {
        let uac = scope.spawn(|| {
            let uac = run_uac(net, dir, rate, SECONDS);
            running.store(false, std::sync::atomic::Ordering::Relaxed);
            uac
        });
        let mut samples = Vec::new();
        while running.load(std::sync::atomic::Ordering::Relaxed) {
            let held = policy(net, "sip-original");
            let l = invite_limit(&held);
            samples.push((start.elapsed(), l, held));
            std::thread::sleep(Duration::from_millis(100));
        }
        (uac.join().unwrap(), samples)
    })
}

/// Nothing but the service (issue 27): no limit and no controller section written. The
/// controller moves sip-original by default (mode sip, target 100 ms).
const CONTROLLED: &str = "services:\n  - {kind: sip, port: 5060}\n";

/// Three times `capacity` against a daemon started with [`CONTROLLED`]: goodput at least
/// `share` of `capacity`, the INVITEs' limit cut by the controller itself (retransmissions of
/// admitted work never refused while the server answers), and relaxed again once the load is
/// gone.
fn holds_three_times_capacity_and_relaxes_after(
    net: &TestNet,
    dir: &Path,
    capacity: f64,
    share: f64,
) {
    let (uac, limit, held) = overload(net, dir, (3.0 * capacity) as u64);
    let goodput = uac.goodput(WARM, SECONDS as usize);
    assert!(
        goodput >= share * capacity,
        "goodput {goodput:.0}/s of {capacity:.0}: {uac:?} {held}"
    );
    // It cut the limit itself, and says why.
    assert!(limit < 1000, "{held}");
    assert_eq!(held["owner"], "controller");
    // Retransmissions of admitted work are never refused while the server answers: their
    // threshold is the originals' upper bound, and so are their bounds.
    let originals = policy(net, "sip-original");
    let retrans = policy(net, "sip-retransmission");
    assert_eq!(
        retrans["backlog_limit"], originals["bound_max"],
        "{retrans} against {originals}"
    );
    for bound in ["bound_min", "bound_max"] {
        assert_eq!(
            retrans[bound], originals["bound_max"],
            "{bound}: {retrans} against {originals}"
        );
    }
    // With the load gone, it relaxes.
    wait_policy(net, "sip-original", "relaxed", |r| {
        invite_limit(r) >= 4 * limit.max(1) && r["reason"] == "headroom"
    });
}

#[test]
fn with_no_limit_set_the_controller_keeps_a_server_at_capacity_and_yields_to_an_operator() {
    if !have_root("with_no_limit_set_the_controller_keeps_a_server_at_capacity") {
        return;
    }
    let _machine = machine_to_myself();
    let net = TestNet::new();
    let dir = fresh_temp_dir("gwt-controller");
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    let _server = SlowSipServer::start(socket, 8 << 20, INVITE_COST, OTHER_COST);
    // Its capacity measured alone, on the machine as it is now (a spinning server shares its
    // core with whatever else runs: with a CPU-bound loop beside it, it answered 141/s of a
    // nominal 185), as the Kamailio test and the benchmarks do.
    let nominal = 1.0 / (INVITE_COST + OTHER_COST * 2).as_secs_f64();
    let (capacity, resent) = measure_capacity(&net, &dir, nominal, 6);
    assert_eq!(resent, 0, "a clean measure resends nothing");
    assert!(
        (0.5 * nominal..1.05 * nominal).contains(&capacity),
        "{capacity:.0} calls/s of a nominal {nominal:.0}"
    );
    let started = Instant::now();
    let daemon = Daemon::start_config(&net, &dir, CONTROLLED);
    // The controller takes the class over at its upper bound: no limit picked by hand.
    let start = wait_policy(&net, "sip-original", "taken over", |r| {
        r["owner"] == "controller"
    });
    assert!(start["bound_max"].as_u64().unwrap() >= 10000, "{start}");
    assert_eq!(start["backlog_limit"], start["bound_max"], "{start}");
    assert_eq!(start["reason"], "start", "{start}");
    // Each method family starts at the upper bound too.
    let start = wait_policy(&net, "sip-original", "families set", |r| {
        invite_limit(r) != u64::MAX
    });
    assert!(invite_limit(&start) >= 10000, "{start}");

    holds_three_times_capacity_and_relaxes_after(&net, &dir, capacity, 0.85);

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
    // The operator's limit alone: no family limit of the controller's is left.
    assert_eq!(invite_limit(&pinned), u64::MAX, "{pinned}");
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
    // At the default level the controller says when its reason changes, not every step.
    let moves: Vec<&String> = log
        .iter()
        .filter(|l| l.contains("the limit moves for a new reason"))
        .collect();
    // Both reasons are named: as the one taken, or as the one left (a change within 2 s of the
    // last line said is counted in the next one's changes_unsaid, so which of two alternating
    // reasons the lines take is the timing's).
    let reasons = ["over-target", "headroom"];
    assert!(
        reasons.iter().all(|r| moves.iter().any(|l| {
            l.contains(&format!("reason=\"{r}\"")) || l.contains(&format!("was=\"{r}\""))
        })),
        "{moves:#?}"
    );
    // Intervals of 100 ms: far fewer lines than steps.
    let intervals = started.elapsed().as_millis() as usize / 100;
    assert!(
        moves.len() * 3 < intervals,
        "{} lines in {intervals} intervals: {moves:#?}",
        moves.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The same against a real Kamailio (one worker, the same CPU per call held in `usleep`),
/// whose real capacity the test measures alone first: Kamailio's own work per message comes on
/// top of the nominal figure.
#[test]
fn with_no_limit_set_the_controller_keeps_a_real_kamailio_at_capacity_and_relaxes_after() {
    if !have_root("with_no_limit_set_the_controller_keeps_a_real_kamailio_at_capacity") {
        return;
    }
    let _machine = machine_to_myself();
    let net = TestNet::new();
    let dir = fresh_temp_dir("gwt-controller-kamailio");
    let _kamailio = Kamailio::start_with_cost(
        &["ip", "netns", "exec", &net.gw_ns],
        format!("{GW_V4}:5060").parse().unwrap(),
        INVITE_COST + OTHER_COST * 2,
        None,
    );
    kamailio::wait_answering(&net);
    let nominal = 1.0 / (INVITE_COST + OTHER_COST * 2).as_secs_f64();
    let (capacity, resent) = measure_capacity(&net, &dir, nominal, 6);
    assert_eq!(resent, 0, "a clean measure resends nothing");
    assert!(
        (0.5 * nominal..1.05 * nominal).contains(&capacity),
        "{capacity:.0} calls/s of a nominal {nominal:.0}"
    );
    let daemon = Daemon::start_config(&net, &dir, CONTROLLED);
    wait_policy(&net, "sip-original", "taken over", |r| {
        r["owner"] == "controller"
    });
    // 85%, as for the FIFO server: with a CPU-bound loop beside it, Kamailio behind the
    // controller kept 90.0% of its capacity measured alone (154/s of 171), right at a 90% line,
    // since SIPp at 3x and the daemon then share the machine with it too; idle it keeps 98-100%.
    holds_three_times_capacity_and_relaxes_after(&net, &dir, capacity, 0.85);
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Callers' rate against the trickle: well under the server's capacity (about 185 calls/s).
const CALLERS: u64 = 80;

/// Issue 28, case 1: INVITEs the server discards unanswered (Content-Length past the datagram,
/// RFC 3261 18.3) at an eighth of the callers' rate each hold a place for the unit timeout and
/// end as expiries. They must not drive the controller down: callers keep at least 90% of their
/// calls and the limit stays above what they and the trickle's places need. A server that stops
/// answering altogether still has its class cut, and it reopens when the server answers again.
#[test]
fn unanswerable_invites_do_not_steer_the_controller_but_a_server_that_stops_is_cut() {
    if !have_root("unanswerable_invites_do_not_steer_the_controller") {
        return;
    }
    let _machine = machine_shared();
    let net = TestNet::new();
    let dir = fresh_temp_dir("gwt-controller-trickle");
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    // Paced: its capacity holds on a busy machine, so what callers lose is the trickle's doing.
    let server = SlowSipServer::start_paced(socket, 8 << 20, INVITE_COST, OTHER_COST);
    let daemon = Daemon::start_config(&net, &dir, CONTROLLED);
    wait_policy(&net, "sip-original", "taken over", |r| {
        r["owner"] == "controller"
    });

    let calls = CALLERS * SECONDS;
    let trickle = Trickle::start(&net, CALLERS as f64 / 8.0, SECONDS + 10);
    let (uac, samples) = sampled(&net, &dir, CALLERS);
    let sent = trickle.stop();
    assert!(sent >= SECONDS * CALLERS / 8, "trickle sent {sent}");
    let answered = uac.total("SuccessfulCall");
    assert!(
        answered * 10 >= calls * 9,
        "{answered} of {calls} calls answered with the trickle: {uac:?}"
    );
    // The limit is not steered down: once the trickle's first units have expired (a timeout
    // in), it stays above the callers' need (their rate times the target, 8) plus the places
    // the trickle holds (its rate times the 2 s timeout, 20) but for passing dips (a slow
    // answer on a busy machine cuts it, as it should, and it grows back). The old law held it
    // at 1 for the whole trickle.
    let need = 8 + 20;
    let after: Vec<&(Duration, u64, Value)> = samples
        .iter()
        .filter(|(t, _, _)| *t >= Duration::from_secs(2))
        .collect();
    let under = after.iter().filter(|(_, l, _)| *l < need).count();
    assert!(
        !after.is_empty() && under * 2 < after.len(),
        "{under} of {} samples under {need}: {:?}",
        after.len(),
        after.iter().map(|(_, l, _)| l).collect::<Vec<_>>()
    );
    // The trickle's INVITEs were admitted and expired: the attack happened.
    let expired = policy(&net, "sip-original");
    let stats = net.stats();
    let expired_units = gateway_tests::netns::class_counter(&stats, "sip-original", "expired");
    assert!(
        expired_units >= sent / 2,
        "{expired_units} expired of {sent}: {expired}"
    );

    // The server stops answering: every unit expires, and the class is cut.
    server.set_answering(false);
    let cut = std::thread::scope(|scope| {
        let uac = scope.spawn(|| run_uac(&net, &dir, 40, 8));
        let cut = wait_policy(&net, "sip-original", "cut for a silent server", |r| {
            r["backlog_limit"].as_u64().unwrap() <= 10
        });
        let _ = uac.join();
        cut
    });
    assert_eq!(cut["reason"], "expired", "{cut}");
    // Answering again, it reopens for the callers that come.
    server.set_answering(true);
    std::thread::scope(|scope| {
        let uac = scope.spawn(|| run_uac(&net, &dir, 40, 8));
        wait_policy(&net, "sip-original", "reopened", |r| {
            r["backlog_limit"].as_u64().unwrap() >= 100
        });
        let _ = uac.join();
    });
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// One hello the server refuses at once: connects from the calling namespace, sends `hello`,
/// and says whether an alert record came back.
fn refused_hello(hello: &[u8]) -> bool {
    use std::io::{Read as _, Write as _};
    let Ok(mut s) = std::net::TcpStream::connect((GW_V4, 443)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(hello).is_err() {
        return false;
    }
    let mut first = [0u8; 1];
    matches!(s.read(&mut first), Ok(1)) && first[0] == 21
}

/// Runs `during` with hellos the server refuses at once (SSL 3.0 alone) sent beside it from
/// the peer namespace, 100 a second (for at most 10 s); returns how many were answered with an alert.
fn beside_refused_hellos(net: &TestNet, during: impl FnOnce()) -> u32 {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let alerts = scope.spawn(|| {
            let hello = gateway_common::testing::HelloBuilder {
                versions: Some(vec![0x0300]),
                ..Default::default()
            }
            .build();
            let mut answered = 0u32;
            let begin = Instant::now();
            for n in 0u32..1000 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                answered += u32::from(net.in_peer(|| refused_hello(&hello)));
                let next = begin + Duration::from_millis(10) * (n + 1);
                std::thread::sleep(next.saturating_duration_since(Instant::now()));
            }
            answered
        });
        during();
        stop.store(true, Ordering::Relaxed);
        alerts.join().unwrap()
    })
}

/// Callers at [`CALLERS`] against a daemon started with [`CONTROLLED`] in front of `server`
/// (started on the gateway's SIP socket), with `beside` running while they call: the run, the
/// INVITE limit sampled every 100 ms, and the sip-original row at the end.
fn callers_against(
    name: &str,
    server: impl FnOnce(UdpSocket) -> SlowSipServer,
    beside: impl FnOnce(&TestNet) -> Option<Trickle>,
) -> (UacRun, Vec<(Duration, u64, Value)>, Value) {
    let net = TestNet::new();
    let dir = fresh_temp_dir(name);
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    let _server = server(socket);
    let daemon = Daemon::start_config(&net, &dir, CONTROLLED);
    wait_policy(&net, "sip-original", "taken over", |r| {
        r["owner"] == "controller"
    });
    let trickle = beside(&net);
    let (uac, samples) = sampled(&net, &dir, CALLERS);
    drop(trickle);
    let end = policy(&net, "sip-original");
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
    let _ = std::fs::remove_dir_all(&dir);
    (uac, samples, end)
}

/// Issue 50: a server that always answers in the same time, with no queue (a proxy whose
/// downstream takes that long), is healthy whatever that time: callers at a rate it serves are
/// answered in full with the default controller, at 40, 75, 95 and 150 ms (at 75 ms the law
/// that read answer times rather than the queue held the limit at 1 and answered 17%).
#[test]
fn a_server_with_a_fixed_answer_time_is_answered_in_full_whatever_that_time() {
    if !have_root("a_server_with_a_fixed_answer_time_is_answered_in_full") {
        return;
    }
    let _machine = machine_shared();
    for ms in [40, 75, 95, 150] {
        let after = Answer::After(Duration::from_millis(ms));
        let (uac, samples, end) = callers_against(
            "gwt-controller-fixed",
            |s| SlowSipServer::start_shaped(s, after, after),
            |_| None,
        );
        let calls = CALLERS * SECONDS;
        let answered = uac.total("SuccessfulCall");
        assert!(
            answered * 100 >= calls * 95,
            "{ms} ms: {answered} of {calls} calls answered: {uac:?} {end}"
        );
        let lowest = samples.iter().map(|(_, l, _)| *l).min().unwrap_or(0);
        let floor = &end["families"];
        eprintln!("{ms} ms: {answered} of {calls} answered, lowest INVITE limit {lowest}, {floor}");
    }
}

/// Issue 50: slow answers to a twentieth of the requests (OPTIONS the server forwards and
/// answers 300 ms later, costing it nothing) beside INVITEs it serves in a FIFO at 5 ms each:
/// the callers are answered in full (the law that read every answer's time cut them to 71%).
#[test]
fn slow_answers_to_a_minority_of_requests_do_not_cut_the_callers() {
    if !have_root("slow_answers_to_a_minority_of_requests_do_not_cut_the_callers") {
        return;
    }
    let _machine = machine_shared();
    let (uac, _, end) = callers_against(
        "gwt-controller-minority",
        |s| {
            SlowSipServer::start_shaped(
                s,
                Answer::Queued(INVITE_COST),
                Answer::After(Duration::from_millis(300)),
            )
        },
        |net| Some(Trickle::options(net, CALLERS as f64 / 20.0, SECONDS + 10)),
    );
    let calls = CALLERS * SECONDS;
    let answered = uac.total("SuccessfulCall");
    assert!(
        answered * 100 >= calls * 95,
        "{answered} of {calls} calls answered beside slow OPTIONS: {uac:?} {end}"
    );
}

/// Issue 50: dead INVITEs (discarded unanswered by the server) at the callers' own rate: each
/// costs its place until its timeout and no more. The callers keep at least 90%, and the
/// INVITEs' limit is never at its minimum for more than a second (the law that counted young
/// dead units as live work wedged at 1 and answered 1-2%).
#[test]
fn dead_invites_at_the_callers_own_rate_cost_their_places_and_no_more() {
    if !have_root("dead_invites_at_the_callers_own_rate") {
        return;
    }
    let _machine = machine_shared();
    let (uac, samples, end) = callers_against(
        "gwt-controller-dead",
        |s| SlowSipServer::start_paced(s, 8 << 20, INVITE_COST, OTHER_COST),
        |net| Some(Trickle::start(net, CALLERS as f64, SECONDS + 10)),
    );
    let calls = CALLERS * SECONDS;
    let answered = uac.total("SuccessfulCall");
    assert!(
        answered * 10 >= calls * 9,
        "{answered} of {calls} calls answered beside as many dead INVITEs: {uac:?} {end}"
    );
    // Never at the minimum (1) for more than ten samples (a second) in a row.
    let mut run = 0;
    let mut longest = 0;
    for (_, l, _) in &samples {
        run = if *l <= 1 { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    assert!(
        longest <= 10,
        "the INVITE limit sat at its minimum for {longest} samples: {:?}",
        samples.iter().map(|(_, l, _)| l).collect::<Vec<_>>()
    );
}

#[test]
fn for_a_tls_server_it_does_not_terminate_it_infers_the_handshake_cost_from_completion_times() {
    if !have_root("for_a_tls_server_it_does_not_terminate_it_infers_the_handshake_cost") {
        return;
    }
    let _machine = machine_to_myself();
    use gateway_tests::{
        backend::Nginx,
        metrics::{scrape, value},
        tls::{Cert, rustls_config, rustls_fetch, wait_listening},
    };
    const METRICS: u16 = 9482;
    let net = TestNet::new();
    let dir = fresh_temp_dir("gwt-controller-tls");
    let cert = Cert::new();
    // nginx terminates TLS itself: the daemon has no proxy to measure a handshake with. Its
    // handshakes are timed by the clock: above the priority of whatever else runs (nice).
    let _nginx = Nginx::start(
        &["nice", "-n", "-10", "ip", "netns", "exec", &net.gw_ns],
        &format!(
            "  server {{ listen {GW_V4}:443 ssl; ssl_certificate {}; ssl_certificate_key {};\n\
             location / {{ return 200 \"inferred\\n\"; }} }}",
            cert.cert().display(),
            cert.key().display()
        ),
        1,
    );
    wait_listening(|| net.in_peer(|| std::net::TcpStream::connect((GW_V4, 443)).is_ok()));
    let daemon = Daemon::start_config(
        &net,
        &dir,
        &format!(
            "workers: 1\nmetrics: 127.0.0.1:{METRICS}\nservices:\n  - {{kind: tls, port: 443}}\n\
             controller:\n  classes:\n    tls-new: {{mode: tls, cpu_target: 0.5, min: 1, max: 100000}}\n"
        ),
    );
    let start = wait_policy(&net, "tls-new", "taken over", |r| {
        r["owner"] == "controller"
    });
    assert_eq!(start["rate"], 100000, "{start}");

    // A quiet server (issue 50): full handshakes at 20 a second (a new client configuration
    // each: no session to resume). Its cost is inferred within 10 s, from intervals pooled
    // until they hold enough completions, before any flood; bounded in count and time.
    let labels = [("iface", net.gw_if.as_str()), ("class", "tls-new")];
    let cost = || {
        1e6 * value(
            &scrape(&net, METRICS),
            "gateway_controller_handshake_cost_seconds",
            &labels,
        )
    };
    let handshake = || {
        let (_, body) = net
            .in_peer(|| rustls_fetch(&rustls_config(&cert), &format!("{GW_V4}:443")))
            .expect("a full handshake and an answer from nginx");
        assert!(body.ends_with("inferred\n"), "{body:?}");
    };
    let started = Instant::now();
    let mut cost_us = 0.0;
    for n in 0u32.. {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no cost inferred after {n} handshakes at 20/s"
        );
        handshake();
        if n % 5 == 4 {
            cost_us = cost();
            if cost_us > 0.0 {
                break;
            }
        }
        let next = started + Duration::from_millis(50) * (n + 1);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    println!(
        "quiet server: a cost inferred after {:?}",
        started.elapsed()
    );
    // A full handshake's work on one core: tens of microseconds at the least, milliseconds at
    // the most, never the time a client took between handshakes.
    assert!((20.0..20_000.0).contains(&cost_us), "cost {cost_us} µs");
    // The budget the law set from it: cpu_target x cores / cost (within the estimate's own
    // movement between the two reads).
    let budget = 0.5 * 1e6 / cost_us;
    let row = wait_policy(&net, "tls-new", "a budget set", |r| r["reason"] == "budget");
    let rate = row["rate"].as_f64().unwrap();
    assert!(
        (budget / 4.0..=budget * 4.0).contains(&rate),
        "rate {rate}/s for a budget of {budget:.0}/s: {row}"
    );
    assert_eq!(row["owner"], "controller", "{row}");
    println!(
        "inferred a full handshake of {cost_us} µs: tls-new at {rate}/s (budget {budget:.0}/s)"
    );
    // Prometheus has the limit in the family of its unit (a rate, for the tls mode), its bounds
    // as configured, and whether it sits at the lower one (issue 54: one family mixed backlogs,
    // rates and percentages, and the alert compared it with a bound of another family).
    let text = scrape(&net, METRICS);
    let bound = |b: &str| {
        let with = [labels[0], labels[1], ("bound", b)];
        value(&text, "gateway_controller_rate_bound_per_second", &with)
    };
    assert_eq!((bound("min"), bound("max")), (1.0, 100_000.0), "{text}");
    let shown = value(&text, "gateway_controller_rate_limit_per_second", &labels);
    assert!((1.0..=100_000.0).contains(&shown), "{text}");
    assert_eq!(
        value(&text, "gateway_controller_at_minimum", &labels),
        f64::from(shown <= 1.0),
        "{text}"
    );
    assert!(
        !text.contains("gateway_controller_backlog_limit{"),
        "no backlog for the tls mode: {text}"
    );
    // Hellos nginx refuses at once with an alert (SSL 3.0 alone), 100 a second for 3 s beside
    // the handshakes: they end their units untimed, so the cost stays the handshakes' (when
    // they were timed, the inferred cost fell to a fraction and tls-new's rate rose 3-6x).
    let refused = beside_refused_hellos(&net, || {
        let begin = Instant::now();
        for n in 1u32..=60 {
            handshake();
            let next = begin + Duration::from_millis(50) * n;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    });
    assert!(
        refused >= 100,
        "only {refused} hellos answered with an alert"
    );
    let with_alerts = cost();
    assert!(
        (with_alerts / cost_us - 1.0).abs() <= 0.25,
        "inferred {with_alerts} µs beside {refused} refused hellos, {cost_us} µs without"
    );
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 50: the cost the NIC infers from completion times, held against the one the proxy
/// measures (the CPU time of its last handshakes) for the same certificate and the same
/// handshakes, at a quiet 20 full handshakes a second: within a quarter, alone and beside 100
/// hellos a second that the proxy refuses at once with an alert. (Measured on this machine
/// kind: 6-12% apart alone, 9-16% beside the alerts; the proxy's handshakes themselves took a
/// fifth less CPU time beside them, which its figure, a mean since the start before, missed:
/// then 29-30% apart.)
#[test]
fn the_inferred_handshake_cost_is_within_a_quarter_of_the_proxy_measured_one() {
    if !have_root("the_inferred_handshake_cost_is_within_a_quarter") {
        return;
    }
    let _machine = machine_to_myself();
    use gateway_tests::{
        backend::{Backend, Mode},
        metrics::{scrape, value},
        tls::{Cert, rustls_config, rustls_fetch, wait_listening},
    };
    const METRICS: u16 = 9483;
    let net = TestNet::new();
    let dir = fresh_temp_dir("gwt-controller-cost");
    let cert = Cert::new();
    let backend = Backend::start(
        net.in_gw(|| std::net::TcpListener::bind("127.0.0.1:0").unwrap()),
        "b",
        Mode::Answer,
        false,
    );
    let daemon = Daemon::start_config(
        &net,
        &dir,
        &format!(
            "workers: 1\nmetrics: 127.0.0.1:{METRICS}\nproxies:\n  - listen: {GW_V4}:443\n    \
             tls: {{cert: {}, key: {}}}\n    backends: [{{address: {}}}]\n",
            cert.cert().display(),
            cert.key().display(),
            backend.addr
        ),
    );
    // Both costs come from the proxy's handshakes, one timed by the clock: above the priority
    // of whatever else runs.
    daemon.above_neighbours();
    wait_listening(|| net.in_peer(|| std::net::TcpStream::connect((GW_V4, 443)).is_ok()));
    let cost = |from: &str| {
        1e6 * value(
            &scrape(&net, METRICS),
            "gateway_controller_handshake_cost_seconds",
            &[("iface", from), ("class", "tls-new")],
        )
    };
    // Each step a full handshake (a new client configuration: nothing to resume) and a resumed
    // one (one configuration kept: the proxy measures both costs before it reports either).
    let returning = rustls_config(&cert);
    let handshakes = |count: u32| {
        let begin = Instant::now();
        for n in 1..=count {
            net.in_peer(|| rustls_fetch(&rustls_config(&cert), &format!("{GW_V4}:443")))
                .expect("a full handshake through the proxy");
            net.in_peer(|| rustls_fetch(&returning, &format!("{GW_V4}:443")))
                .expect("a handshake through the proxy");
            let next = begin + Duration::from_millis(50) * n;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
    };
    // Bounded: until both are known, at most 10 s of handshakes at 20 a second (the inference
    // pools 100 completions into a sample).
    let started = Instant::now();
    let (measured, inferred) = loop {
        handshakes(10);
        let both = (cost("proxies"), cost(&net.gw_if));
        if both.0 > 0.0 && both.1 > 0.0 {
            break both;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "costs after 10 s: {both:?}"
        );
    };
    println!("proxy-measured {measured:.0} us, inferred {inferred:.0} us");
    assert!(
        (inferred / measured - 1.0).abs() <= 0.25,
        "inferred {inferred:.0} us against {measured:.0} us measured by the proxy"
    );
    // The same handshakes for 6 s beside 100 hellos a second that the proxy refuses at once
    // with an alert: they are no handshakes to either measure.
    let refused = beside_refused_hellos(&net, || handshakes(120));
    assert!(
        refused >= 100,
        "only {refused} hellos answered with an alert"
    );
    let (measured, inferred) = (cost("proxies"), cost(&net.gw_if));
    println!("beside {refused} alerts: proxy-measured {measured:.0} us, inferred {inferred:.0} us");
    assert!(
        (inferred / measured - 1.0).abs() <= 0.25,
        "inferred {inferred:.0} us against {measured:.0} us measured by the proxy, beside \
         {refused} refused hellos"
    );
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Issue 50: fast OPTIONS at ten times the INVITE rate (answered on a fast path, 200 µs)
/// beside INVITEs at 1.3x a FIFO server's capacity: the INVITEs' 90th percentile service time
/// (the NIC's own, `SERVICE_TIMES`, over seconds 3..7 of the load) within 10% of what it is
/// without the OPTIONS, and the server kept at capacity. (The law that mixed every method's
/// answers let the limit climb to 100,000 and held INVITEs 1.4 s at the 90th percentile.)
#[test]
fn fast_answers_of_another_method_leave_the_invites_queue_as_it_is() {
    if !have_root("fast_answers_of_another_method_leave_the_invites_queue") {
        return;
    }
    let _machine = machine_shared();
    use gateway_tests::shapes::fast_options;
    let alone = fast_options(INVITE_COST, false);
    let beside = fast_options(INVITE_COST, true);
    println!("INVITEs alone: {alone:?}; beside OPTIONS: {beside:?}");
    let (alone_good, beside_good) = (alone.goodput, beside.goodput);
    let (alone, beside) = (alone.p90.as_secs_f64(), beside.p90.as_secs_f64());
    // The harm the issue measured is an inflated queue: beside the OPTIONS, the INVITEs wait no
    // more than a tenth longer (a shorter wait is the same law holding the same set point).
    assert!(
        beside <= 1.1 * alone,
        "INVITEs' p90 {beside:.4} s beside the OPTIONS, {alone:.4} s alone"
    );
    let capacity = 1.0 / INVITE_COST.as_secs_f64();
    for good in [alone_good, beside_good] {
        assert!(
            good >= 0.9 * capacity,
            "goodput {good:.0}/s of {capacity:.0}"
        );
    }
}

/// Issue 50: with nothing configured but the service, a FIFO server (paced: its capacity holds
/// on a busy machine) and a real Kamailio answer at least 95% of their capacity at one, three
/// and ten times it (SIPp), their capacity measured alone first.
#[test]
fn the_default_config_keeps_a_server_at_capacity_at_one_three_and_ten_times_it() {
    if !have_root("the_default_config_keeps_a_server_at_capacity") {
        return;
    }
    let _machine = machine_to_myself();
    let nominal = 1.0 / (INVITE_COST + OTHER_COST * 2).as_secs_f64();
    for server in ["fifo", "kamailio"] {
        let net = TestNet::new();
        let dir = fresh_temp_dir("gwt-controller-multiples");
        let (_fifo, _kamailio);
        if server == "fifo" {
            let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
            _fifo = Some(SlowSipServer::start_paced(
                socket,
                8 << 20,
                INVITE_COST,
                OTHER_COST,
            ));
        } else {
            _kamailio = Some(Kamailio::start_with_cost(
                &["ip", "netns", "exec", &net.gw_ns],
                format!("{GW_V4}:5060").parse().unwrap(),
                INVITE_COST + OTHER_COST * 2,
                None,
            ));
            kamailio::wait_answering(&net);
        }
        let (capacity, resent) = measure_capacity(&net, &dir, nominal, 6);
        assert_eq!(resent, 0, "{server}: a clean measure resends nothing");
        let daemon = Daemon::start_config(&net, &dir, CONTROLLED);
        wait_policy(&net, "sip-original", "taken over", |r| {
            r["owner"] == "controller"
        });
        for multiple in [1.0, 3.0, 10.0] {
            let uac = run_uac(&net, &dir, (multiple * capacity) as u64, SECONDS);
            let goodput = uac.goodput(WARM, SECONDS as usize);
            println!("{server} at {multiple}x: {goodput:.0}/s of {capacity:.0}");
            assert!(
                goodput >= 0.95 * capacity,
                "{server} at {multiple}x: {goodput:.0}/s of {capacity:.0}: {uac:?}"
            );
        }
        let (status, log) = daemon.terminate(Duration::from_secs(10));
        assert!(status.success(), "{log:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
