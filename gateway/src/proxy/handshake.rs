//! One connection's TLS handshake, resumed sessions first (seed 000).
//!
//! A hello that offers a session key the gateway issued (published in the datapath's map, so
//! the NIC verified it too) is answered on the worker: a resumption is cheap. Any other hello's
//! first flight carries a full handshake's signature, milliseconds of CPU with RSA, computed in
//! one go that nothing on the worker could interrupt. It is computed on threads of its own
//! instead, one per CPU at a lower priority ([`FLIGHT_NICE`]): whenever the worker has work
//! (a resumed session's hello, its request, its backend's answer), the kernel gives it the
//! CPU, and the signatures take what it leaves.

use std::{
    io,
    sync::{
        Arc, LazyLock,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use rustls::{ServerConfig, server::Acceptor};
use tokio::{net::TcpStream, runtime::Runtime};
use tokio_rustls::{LazyConfigAcceptor, server::TlsStream};

use super::{
    cputime::thread_cpu_time,
    stats::{FlightOn, ListenerStats},
    tap::{Recorded, Tap},
};
use crate::{issued::IssuedKeys, tls::lineage::Lineage};

/// Completes the handshake of `stream`, whose first bytes `recorded` holds, with `config`: the
/// stream, and the CPU time its first flight took on a flight thread (zero when it was
/// answered on the worker, whose polls the caller times). Counts where the flight went into
/// `stats`.
pub async fn accept(
    stream: Tap<TcpStream>,
    recorded: &Recorded,
    config: Arc<ServerConfig>,
    issued: &IssuedKeys,
    stats: &ListenerStats,
) -> (io::Result<TlsStream<Tap<TcpStream>>>, Duration) {
    // Reads the ClientHello (no crypto yet).
    let start = match LazyConfigAcceptor::new(Acceptor::default(), stream).await {
        Ok(start) => start,
        Err(e) => return (Err(e), Duration::ZERO),
    };
    let earned = recorded
        .offer_key()
        .is_some_and(|key| issued.is_published(&key));
    if earned {
        stats.first_flight(FlightOn::Worker);
        return (start.into_stream(config).await, Duration::ZERO);
    }
    stats.first_flight(FlightOn::Thread);
    // Queued when every flight thread is busy: the worker shares a CPU with one signature at
    // a time per CPU, not with a hundred. A thread is taken for the computation only, never
    // for the wait for the client's answer: a client that never sends its second flight holds
    // back nobody else's first. A flight whose connection ended while it waited (the handshake
    // timeout) is dropped uncomputed, its socket with it: under a flood beyond what the
    // threads compute, the queue ends on its own instead of spending signatures on the dead.
    let abandoned = Abandoned::default();
    let (gone, expired) = (abandoned.0.clone(), stats.flights_abandoned());
    // The connection's lineage goes with its hello: a ticket opened there is the session it
    // resumes.
    let lineage = Lineage::of_task();
    let flight = FIRST_FLIGHTS.spawn_blocking(move || {
        if gone.load(Ordering::Relaxed) {
            expired.inc();
            return None;
        }
        let before = thread_cpu_time();
        // Processes the hello: key exchange, certificate, signature, the whole first flight.
        let accept = match lineage {
            Some(l) => l.on_thread(|| start.into_stream(config)),
            None => start.into_stream(config),
        };
        Some((accept, thread_cpu_time().saturating_sub(before)))
    });
    let done = flight.await;
    drop(abandoned);
    match done {
        Ok(Some((accept, cpu))) => (accept.await, cpu),
        Ok(None) => (Err(io::ErrorKind::TimedOut.into()), Duration::ZERO),
        Err(e) => (Err(io::Error::other(e)), Duration::ZERO),
    }
}

/// Set when the handshake waiting for its flight is dropped (timed out, or the daemon stops).
#[derive(Default)]
struct Abandoned(Arc<AtomicBool>);

impl Drop for Abandoned {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The nice value of the threads computing first flights. Against a proxy worker (nice 0) a
/// signature gets a tenth of a contended CPU (weight 110 against 1024), so resumed sessions
/// come first; against another busy process on the host it gets as little, so a new session
/// is slowed tenfold by a CPU hog, never starved (nice 19, a 68th, held signatures past their
/// handshake timeout).
pub const FLIGHT_NICE: i32 = 10;

/// The threads that compute full handshakes' first flights: one per CPU, at [`FLIGHT_NICE`];
/// more flights wait in the pool's queue. A runtime of their own, never driven: only its
/// blocking pool is used.
static FIRST_FLIGHTS: LazyLock<Runtime> = LazyLock::new(|| {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    tokio::runtime::Builder::new_current_thread()
        .max_blocking_threads(cpus)
        .thread_name("gateway-flight")
        .on_thread_start(lower_priority)
        .build()
        .expect("a runtime without drivers builds")
});

/// Puts the calling thread at [`FLIGHT_NICE`].
fn lower_priority() {
    // SAFETY: setpriority on the calling thread's own id (Linux gives threads their own nice
    // value); no memory is passed.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as u32, FLIGHT_NICE) };
    if rc != 0 {
        tracing::debug!(error = %io::Error::last_os_error(), "first flights keep the daemon's priority");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_flights_run_at_the_flight_priority_and_the_caller_keeps_its_own() {
        let own = || {
            // SAFETY: getpriority on the calling thread's own id; no memory is passed.
            unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as u32) }
        };
        let caller = own();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let flight = rt.block_on(FIRST_FLIGHTS.spawn_blocking(own)).unwrap();
        assert_eq!(flight, FLIGHT_NICE);
        assert_eq!(own(), caller);
    }
}
