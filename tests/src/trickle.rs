//! Dead work: SIP INVITEs a server discards unanswered, sent at a steady rate from the peer
//! namespace. Each claims a Content-Length past the end of its datagram, which RFC 3261 section
//! 18.3 tells a server to discard over UDP; the gateway cannot tell them from real INVITEs (it
//! admits what the server may answer), so each holds a place until its unit times out. And,
//! the same way, OPTIONS a server answers ([`Trickle::options`]).

use std::{
    net::UdpSocket,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use crate::netns::{GW_V4, PEER_V4, TestNet};

/// The port the trickle is sent from (SIPp uses 5061).
pub const TRICKLE_PORT: u16 = 5070;

/// The port [`Trickle::options`] is sent from.
pub const OPTIONS_PORT: u16 = 5071;

/// One OPTIONS request, numbered `n`: a new transaction each time, which a server answers.
pub fn options(n: u64) -> String {
    format!(
        "OPTIONS sip:service@{GW_V4}:5060 SIP/2.0\r\n\
         Via: SIP/2.0/UDP {PEER_V4}:{OPTIONS_PORT};branch=z9hG4bK-options-{n}\r\n\
         From: <sip:monitor@{PEER_V4}>;tag=o{n}\r\n\
         To: <sip:service@{GW_V4}>\r\n\
         Call-ID: options-{n}@{PEER_V4}\r\n\
         CSeq: 1 OPTIONS\r\n\
         Max-Forwards: 70\r\n\
         Content-Length: 0\r\n\r\n"
    )
}

/// A running trickle; [`Trickle::stop`] ends it and says how many were sent.
pub struct Trickle {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

/// One unanswerable INVITE, numbered `n`: a new transaction and call each time.
pub fn unanswerable_invite(n: u64) -> String {
    format!(
        "INVITE sip:service@{GW_V4}:5060 SIP/2.0\r\n\
         Via: SIP/2.0/UDP {PEER_V4}:{TRICKLE_PORT};branch=z9hG4bK-trickle-{n}\r\n\
         From: <sip:trickle@{PEER_V4}>;tag=t{n}\r\n\
         To: <sip:service@{GW_V4}>\r\n\
         Call-ID: trickle-{n}@{PEER_V4}\r\n\
         CSeq: 1 INVITE\r\n\
         Max-Forwards: 70\r\n\
         Content-Type: application/sdp\r\n\
         Content-Length: 400\r\n\r\n\
         v=0\r\n"
    )
}

impl Trickle {
    /// Sends `per_second` unanswerable INVITEs a second, evenly, for at most `seconds`.
    pub fn start(net: &TestNet, per_second: f64, seconds: u64) -> Self {
        Self::start_with(net, per_second, seconds, TRICKLE_PORT, unanswerable_invite)
    }

    /// Sends `per_second` OPTIONS a second ([`options`]), evenly, for at most `seconds`.
    pub fn options(net: &TestNet, per_second: f64, seconds: u64) -> Self {
        Self::start_with(net, per_second, seconds, OPTIONS_PORT, options)
    }

    /// Sends `per_second` of `message(n)` a second from `port`, evenly, for at most
    /// `seconds`.
    fn start_with(
        net: &TestNet,
        per_second: f64,
        seconds: u64,
        port: u16,
        message: fn(u64) -> String,
    ) -> Self {
        let socket = net.in_peer(|| UdpSocket::bind((PEER_V4, port)).unwrap());
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let thread = std::thread::spawn(move || {
            let start = Instant::now();
            let gap = Duration::from_secs_f64(1.0 / per_second.max(0.001));
            let mut sent = 0u64;
            while !stopped.load(Ordering::Relaxed) && start.elapsed() < Duration::from_secs(seconds)
            {
                let due = start + gap.mul_f64(sent as f64);
                std::thread::sleep(due.saturating_duration_since(Instant::now()));
                let _ = socket.send_to(message(sent).as_bytes(), (GW_V4, 5060));
                sent += 1;
            }
            sent
        });
        Trickle {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops it: the INVITEs sent.
    pub fn stop(mut self) -> u64 {
        self.finish()
    }

    fn finish(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

impl Drop for Trickle {
    fn drop(&mut self) {
        self.finish();
    }
}
