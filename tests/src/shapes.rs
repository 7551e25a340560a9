//! Traffic shapes the controller must be safe for, run on the real datapath (issue 50): the
//! test asserts on them, the controller benchmark reports them.

use std::{
    net::UdpSocket,
    time::{Duration, Instant},
};

use gateway::{datapath::maps::Maps, datapath::pins::PinDir};
use gateway_common::maps::SLOT_SIP_INVITE;

use crate::{
    daemon::Daemon,
    fresh_temp_dir,
    netns::{GW_V4, TestNet},
    sipp::run_uac,
    sipserver::{Answer, SlowSipServer},
    trickle::Trickle,
};

/// What the INVITEs of [`fast_options`] got.
#[derive(Clone, Copy, Debug)]
pub struct InviteTimes {
    /// Their 90th percentile service time (admission to the server's answer), the NIC's own
    /// (`SERVICE_TIMES`), over seconds 3..7 of the load.
    pub p90: Duration,
    /// Answers counted there.
    pub answers: u64,
    /// Their goodput over the same seconds, calls/s.
    pub goodput: f64,
}

/// Seconds of load.
const LOADED: u64 = 8;

/// INVITEs at 1.3x a FIFO server of `invite_cost` each, with nothing configured but the
/// service, alone or (`options`) beside OPTIONS at ten times their rate that the server
/// answers on a fast path (200 µs, costing the INVITEs nothing).
pub fn fast_options(invite_cost: Duration, options: bool) -> InviteTimes {
    let net = TestNet::new();
    let dir = fresh_temp_dir("gwt-fast-options");
    let socket = net.in_gw(|| UdpSocket::bind((GW_V4, 5060)).unwrap());
    let _server = SlowSipServer::start_shaped(
        socket,
        Answer::Queued(invite_cost),
        Answer::After(Duration::from_micros(200)),
    );
    let daemon = Daemon::start_config(&net, &dir, "services:\n  - {kind: sip, port: 5060}\n");
    // The controller takes the class over (bounded).
    let deadline = Instant::now() + Duration::from_secs(15);
    while net.policy("sip-original")["owner"] != "controller" {
        assert!(
            Instant::now() < deadline,
            "the controller never took sip-original over"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let rate = (1.3 / invite_cost.as_secs_f64()) as u64;
    let maps = Maps::open(&PinDir::new(&net.root(), &net.gw_if)).expect("the daemon's maps");
    let (uac, window) = std::thread::scope(|s| {
        let load = s.spawn(|| run_uac(&net, &dir, rate, LOADED));
        let trickle = options.then(|| Trickle::options(&net, 10.0 * rate as f64, LOADED));
        // The window: seconds 3..7 of the load (a span of the run, not a wait for an event).
        std::thread::sleep(Duration::from_secs(3));
        let before = maps.service_times(SLOT_SIP_INVITE).expect("SERVICE_TIMES");
        std::thread::sleep(Duration::from_secs(4));
        let after = maps.service_times(SLOT_SIP_INVITE).expect("SERVICE_TIMES");
        drop(trickle);
        (load.join().unwrap(), after.since(&before))
    });
    let (status, log) = daemon.terminate(Duration::from_secs(10));
    assert!(status.success(), "{log:?}");
    let _ = std::fs::remove_dir_all(&dir);
    InviteTimes {
        p90: Duration::from_micros(window.quantile_us(900).unwrap_or(0)),
        answers: window.count(),
        goodput: uac.goodput(3, 7),
    }
}
