//! A SIP server of known capacity for overload experiments: one thread answers datagrams in
//! arrival order (a plain FIFO socket with a large receive buffer), spending a fixed amount of CPU
//! on each. Retransmissions it dequeues cost work like originals: the feedback that makes an
//! overloaded FIFO server collapse (RFC 6357, seed 001). A request whose Content-Length runs past
//! its datagram is discarded unanswered, as RFC 3261 section 18.3 tells a server to (the work an
//! attacker can make a server drop); and the server can be told to stop answering altogether.

use std::{
    net::UdpSocket,
    os::fd::AsRawFd as _,
    time::{Duration, Instant},
};

/// A running server; stops on drop.
pub struct SlowSipServer {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    answering: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How the server spends a request's service time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Service {
    /// Busy on the CPU for it: the server competes for the CPU like a real one.
    Spinning,
    /// Asleep until the request's completion on the FIFO's own schedule (the previous
    /// completion, or the arrival if later, plus the service time), at nice -10: a server of
    /// exactly known capacity whatever else runs on the machine. A late wake-up delays that one
    /// reply; it moves no later completion, so scheduling delays never add up along the queue.
    Paced,
}

impl SlowSipServer {
    /// Serves on `socket` (bound by the caller, in its namespace) with a receive buffer of
    /// `rcvbuf` bytes: an INVITE costs `invite_cost` of CPU, anything else `other_cost`.
    pub fn start(
        socket: UdpSocket,
        rcvbuf: usize,
        invite_cost: Duration,
        other_cost: Duration,
    ) -> Self {
        Self::serve(socket, rcvbuf, invite_cost, other_cost, Service::Spinning)
    }

    /// As [`SlowSipServer::start`], but each request's service time is paced on the FIFO's
    /// schedule rather than spent on the CPU (see `Service::Paced`): for measurements of a
    /// server's capacity that must hold on a busy machine.
    pub fn start_paced(
        socket: UdpSocket,
        rcvbuf: usize,
        invite_cost: Duration,
        other_cost: Duration,
    ) -> Self {
        Self::serve(socket, rcvbuf, invite_cost, other_cost, Service::Paced)
    }

    fn serve(
        socket: UdpSocket,
        rcvbuf: usize,
        invite_cost: Duration,
        other_cost: Duration,
        service: Service,
    ) -> Self {
        let size = rcvbuf as libc::c_int;
        // SAFETY: setsockopt on an owned socket with an int option (FORCE: root may exceed
        // net.core.rmem_max).
        unsafe {
            libc::setsockopt(
                socket.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&raw const size).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            );
        }
        let worker = socket.try_clone().unwrap();
        // Waking a blocked recv_from with shutdown(2) raced inside std once; a short read
        // timeout and a stop flag end the loop instead.
        worker
            .set_read_timeout(Some(Duration::from_millis(100)))
            .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_worker = stop.clone();
        let answering = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let answering_worker = answering.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            let mut free_at = Instant::now();
            if service == Service::Paced {
                // Ahead of other load on the machine too (nice -10): a paced server's replies
                // leave on its schedule. Best effort.
                // SAFETY: a plain syscall on the calling thread.
                unsafe {
                    let tid = libc::gettid();
                    libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, -10);
                }
            }
            while !stop_worker.load(std::sync::atomic::Ordering::Relaxed) {
                // Paced: a request already queued when the server turns to it arrived before
                // the previous completion, so its service starts there, not when a late
                // wake-up got to it.
                let queued = service == Service::Paced && worker.set_nonblocking(true).is_ok() && {
                    let peeked = worker.peek_from(&mut buf).is_ok();
                    let _ = worker.set_nonblocking(false);
                    peeked
                };
                let Ok((n, peer)) = worker.recv_from(&mut buf) else {
                    continue;
                };
                let req = String::from_utf8_lossy(&buf[..n]);
                if truncated(&req) || !answering_worker.load(std::sync::atomic::Ordering::Relaxed) {
                    continue;
                }
                let cost = if req.starts_with("INVITE ") {
                    invite_cost
                } else {
                    other_cost
                };
                let start = Instant::now();
                match service {
                    Service::Spinning => {
                        while start.elapsed() < cost {
                            std::hint::spin_loop();
                        }
                    }
                    Service::Paced => {
                        free_at = if queued {
                            free_at + cost
                        } else {
                            free_at.max(start) + cost
                        };
                        std::thread::sleep(free_at.saturating_duration_since(Instant::now()));
                    }
                }
                let reply = if req.starts_with("INVITE ") {
                    Some(respond(&req, "200 OK", true))
                } else if req.starts_with("BYE ") {
                    Some(respond(&req, "200 OK", false))
                } else {
                    None
                };
                if let Some(r) = reply {
                    let _ = worker.send_to(r.as_bytes(), peer);
                }
            }
        });
        SlowSipServer {
            stop,
            answering,
            thread: Some(thread),
        }
    }
}

/// How a [`SlowSipServer::start_shaped`] server answers a method family.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// In its one FIFO queue, each request taking this long of its one worker (paced, as
    /// [`SlowSipServer::start_paced`]).
    Queued(Duration),
    /// This long after it arrived, whatever else is queued, costing the worker nothing (a
    /// downstream's fixed answer time, or a fast path).
    After(Duration),
}

/// A request waiting for its answer in a shaped server.
struct Waiting {
    arrived: Instant,
    reply: String,
    peer: std::net::SocketAddr,
}

impl SlowSipServer {
    /// Serves on `socket`, answering INVITEs as `invite` says and every other request but BYE
    /// (OPTIONS, REGISTER, ...) as `other` says, each with a 200 OK, and a BYE at once: the traffic shapes a controller must be
    /// safe for (a fixed answer time with no queue, slow answers to a minority of requests
    /// that cost nothing, a fast path for OPTIONS). Requests whose Content-Length runs past
    /// their datagram are discarded, as [`SlowSipServer::start`]'s are.
    pub fn start_shaped(socket: UdpSocket, invite: Answer, other: Answer) -> Self {
        let worker = socket;
        worker
            .set_read_timeout(Some(Duration::from_millis(1)))
            .unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop_worker = stop.clone();
        let answering = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let thread = std::thread::spawn(move || {
            // SAFETY: a plain syscall on the calling thread (best effort, as paced servers).
            unsafe {
                let tid = libc::gettid();
                libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, -10);
            }
            let mut buf = [0u8; 4096];
            // The worker's FIFO (with each request's cost) and the fixed-time answers of each
            // family (in arrival order, so due in order).
            let mut fifo: std::collections::VecDeque<(Waiting, Duration)> = Default::default();
            let mut free_at = Instant::now();
            let mut after: [std::collections::VecDeque<(Waiting, Duration)>; 2] =
                Default::default();
            while !stop_worker.load(std::sync::atomic::Ordering::Relaxed) {
                let now = Instant::now();
                while let Some((w, cost)) = fifo.front() {
                    let done = free_at.max(w.arrived) + *cost;
                    if done > now {
                        break;
                    }
                    let _ = worker.send_to(w.reply.as_bytes(), w.peer);
                    free_at = done;
                    fifo.pop_front();
                }
                for q in &mut after {
                    while q.front().is_some_and(|(w, d)| w.arrived + *d <= now) {
                        let (w, _) = q.pop_front().unwrap();
                        let _ = worker.send_to(w.reply.as_bytes(), w.peer);
                    }
                }
                let Ok((n, peer)) = worker.recv_from(&mut buf) else {
                    continue;
                };
                let arrived = Instant::now();
                let req = String::from_utf8_lossy(&buf[..n]);
                if truncated(&req) || req.starts_with("SIP/2.0") || req.starts_with("ACK ") {
                    continue;
                }
                let is_invite = req.starts_with("INVITE ");
                let w = Waiting {
                    arrived,
                    reply: respond(&req, "200 OK", is_invite),
                    peer,
                };
                if req.starts_with("BYE ") {
                    let _ = worker.send_to(w.reply.as_bytes(), w.peer);
                    continue;
                }
                match if is_invite { invite } else { other } {
                    Answer::Queued(cost) => fifo.push_back((w, cost)),
                    Answer::After(d) => after[usize::from(!is_invite)].push_back((w, d)),
                }
            }
        });
        SlowSipServer {
            stop,
            answering,
            thread: Some(thread),
        }
    }

    /// Whether the server answers what it receives (`false`: it reads and discards everything,
    /// as a server that hung or lost its upstream would look from outside).
    pub fn set_answering(&self, answering: bool) {
        self.answering
            .store(answering, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Whether a message's Content-Length runs past the end of its datagram (RFC 3261 section
/// 18.3: over UDP, such a message is discarded).
fn truncated(msg: &str) -> bool {
    let Some((head, body)) = msg.split_once("\r\n\r\n") else {
        return true;
    };
    head.split("\r\n")
        .filter_map(|l| l.split_once(':'))
        .find(|(name, _)| {
            let name = name.trim();
            name.eq_ignore_ascii_case("content-length") || name.eq_ignore_ascii_case("l")
        })
        .and_then(|(_, v)| v.trim().parse::<usize>().ok())
        .is_some_and(|len| len > body.len())
}

/// A response copying the request's Via, From, To (with a tag added when asked), Call-ID and
/// CSeq.
pub fn respond(req: &str, status: &str, add_tag: bool) -> String {
    let mut out = format!("SIP/2.0 {status}\r\n");
    for line in req.split("\r\n") {
        let lower = line.to_ascii_lowercase();
        if ["via:", "from:", "call-id:", "cseq:"]
            .iter()
            .any(|h| lower.starts_with(h))
        {
            out += line;
            out += "\r\n";
        } else if lower.starts_with("to:") {
            out += line;
            if add_tag && !lower.contains(";tag=") {
                out += ";tag=server1";
            }
            out += "\r\n";
        }
    }
    out += "Contact: <sip:service@10.99.0.1:5060>\r\nContent-Length: 0\r\n\r\n";
    out
}

impl Drop for SlowSipServer {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
