//! Seed 000's closed loop for the overload benchmarks: resumed-session clients fetching while a
//! flood of new hellos arrives at a set rate, and what the clients got (`tls_overload`,
//! `fleet_overload`).

use std::{
    io::Write as _,
    net::TcpStream,
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

use crate::{
    netns::in_netns,
    tls::{Cert, rustls_config, rustls_fetch},
};

/// How long a phase measures (after half a second of the flood).
pub const PHASE: Duration = Duration::from_secs(4);
/// Threads sending the flood.
pub const FLOOD_THREADS: usize = 8;

/// The resumed-session clients.
#[derive(Clone, Copy)]
pub struct Sessions {
    /// How many.
    pub clients: usize,
    /// Each one's pause between fetches.
    pub think: Duration,
}

/// Seed 000's workload: sessions whose users think between requests.
pub const THINKING: Sessions = Sessions {
    clients: 16,
    think: Duration::from_millis(20),
};

/// Clients that fetch back to back: throughput is latency's inverse.
pub const BACK_TO_BACK: Sessions = Sessions {
    clients: 2,
    think: Duration::ZERO,
};

/// What the resumed clients got in one phase.
#[derive(Clone, Copy)]
pub struct Got {
    /// Resumed fetches per second.
    pub resumed: f64,
    /// Flood hellos sent per second.
    pub sent: f64,
    /// The 99th percentile of a resumed fetch (connect, handshake, GET, answer), ms.
    pub p99_ms: f64,
    /// The slowest resumed fetch that ended while measuring, ms.
    pub max_ms: f64,
    /// New hellos the datapath admitted per second, each a full handshake the proxy does its
    /// part of (the flood never finishes one); `None` for nginx, with no gateway in front.
    pub served: Option<f64>,
    /// The clients' fetches while measuring that did not resume (a full handshake, or refused
    /// or failed).
    pub lost: u64,
    /// Both cores' busy time while measuring per resumed fetch, µs: unloaded, what an admitted
    /// connection costs the host (its TCP handshake, hello, resumption, request and close, on
    /// the client's side too).
    pub busy_per_fetch_us: f64,
}

impl Got {
    /// The CSV columns of what the clients got: flood sent/s, new hellos admitted/s, resumed/s,
    /// `share` (% of the unloaded rate), p99 ms, fetches not resumed.
    pub fn csv(&self, share: f64) -> Vec<String> {
        vec![
            format!("{:.0}", self.sent),
            self.served.map_or(String::new(), |f| format!("{f:.0}")),
            format!("{:.0}", self.resumed),
            format!("{share:.1}"),
            format!("{:.2}", self.p99_ms),
            self.lost.to_string(),
        ]
    }
}

/// What `sessions` (rustls clients in the namespace `ns`, fetching from `addr`) got for [`PHASE`]
/// while `flood` new hellos per second (`hello` replayed, from the same namespace) arrive; `full`
/// reads the count of new hellos admitted, when a gateway is in front.
pub fn phase(
    ns: &str,
    addr: &str,
    cert: &Cert,
    hello: &[u8],
    flood: f64,
    sessions: Sessions,
    full: &dyn Fn() -> Option<f64>,
) -> Got {
    let measuring = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let slots = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // The sessions exist before the flood starts (seed 000: established sessions resuming while
    // new ones flood in).
    let started = Arc::new(std::sync::Barrier::new(sessions.clients + 1));
    std::thread::scope(|s| {
        let mut clients = Vec::new();
        for _ in 0..sessions.clients {
            let (measuring, stop, addr, ns, started) = (
                measuring.clone(),
                stop.clone(),
                addr.to_owned(),
                ns.to_owned(),
                started.clone(),
            );
            let config = rustls_config(cert);
            clients.push(s.spawn(move || {
                in_netns(&ns, || {
                    // One full handshake for the session, then resumptions only; the resumed
                    // fetches' times while measuring.
                    let deadline = Instant::now() + Duration::from_secs(5);
                    while rustls_fetch(&config, &addr).is_err() && Instant::now() < deadline {}
                    started.wait();
                    let (mut times, mut lost) = (Vec::new(), 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        std::thread::sleep(sessions.think);
                        let t = Instant::now();
                        let kind = rustls_fetch(&config, &addr).map(|(k, _)| k);
                        if !measuring.load(Ordering::Relaxed) {
                            continue;
                        }
                        if matches!(kind, Ok(rustls::HandshakeKind::Resumed)) {
                            times.push(t.elapsed());
                        } else {
                            lost += 1;
                        }
                    }
                    (times, lost)
                })
            }));
        }
        started.wait();
        let start = Instant::now();
        let threads = if flood > 0.0 { FLOOD_THREADS } else { 0 };
        for _ in 0..threads {
            let (sent, slots, stop, ns) =
                (sent.clone(), slots.clone(), stop.clone(), ns.to_owned());
            let target: std::net::SocketAddr = addr.parse().unwrap();
            s.spawn(move || {
                // The generator takes only the CPU the clients on its core leave, as a flood
                // from other machines would.
                crate::procfs::idle_current_thread();
                in_netns(&ns, || {
                    while !stop.load(Ordering::Relaxed) {
                        // Paced: the n-th slot is at n / flood seconds (sleeping, so the
                        // clients on the same core keep their share). A slot missed by more
                        // than a millisecond is skipped, not caught up on in a burst.
                        let n = slots.fetch_add(1, Ordering::Relaxed);
                        let due = Duration::from_secs_f64(n as f64 / flood);
                        match due.checked_sub(start.elapsed()) {
                            Some(wait) => std::thread::sleep(wait),
                            None if start.elapsed() - due > Duration::from_millis(1) => continue,
                            None => {}
                        }
                        sent.fetch_add(1, Ordering::Relaxed);
                        // A full listen queue drops SYNs: give up on that one quickly.
                        let c = TcpStream::connect_timeout(&target, Duration::from_millis(50));
                        if let Ok(mut c) = c {
                            let _ = c.set_nodelay(true);
                            let _ = c.write_all(hello);
                        }
                    }
                })
            });
        }
        std::thread::sleep(Duration::from_millis(500));
        measuring.store(true, Ordering::Relaxed);
        let busy = || crate::procfs::cpu_busy_seconds(0) + crate::procfs::cpu_busy_seconds(1);
        let (s0, f0, b0, t0) = (sent.load(Ordering::Relaxed), full(), busy(), Instant::now());
        std::thread::sleep(PHASE);
        measuring.store(false, Ordering::Relaxed);
        let (s1, f1, b1, secs) = (
            sent.load(Ordering::Relaxed),
            full(),
            busy(),
            t0.elapsed().as_secs_f64(),
        );
        stop.store(true, Ordering::Relaxed);
        let (mut times, mut lost) = (Vec::new(), 0);
        for c in clients {
            let (t, l) = c.join().expect("client");
            times.extend(t.into_iter().map(|t| t.as_secs_f64() * 1e3));
            lost += l;
        }
        times.sort_by(f64::total_cmp);
        Got {
            resumed: times.len() as f64 / secs,
            sent: (s1 - s0) as f64 / secs,
            max_ms: times.last().copied().unwrap_or(0.0),
            p99_ms: times
                .get((times.len() * 99 / 100).min(times.len().saturating_sub(1)))
                .copied()
                .unwrap_or(0.0),
            served: f0.zip(f1).map(|(a, b)| (b - a) / secs),
            lost,
            busy_per_fetch_us: (b1 - b0) * 1e6 / (times.len() as f64).max(1.0),
        }
    })
}
