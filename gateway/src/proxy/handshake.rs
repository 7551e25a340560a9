//! One connection's TLS handshake, resumed sessions first (seed 000).
//!
//! A hello that offers a session key the gateway issued (published in the datapath's map, so
//! the NIC verified it too) is answered on the worker: a resumption is cheap. Any other hello's
//! first flight carries a full handshake's signature, milliseconds of CPU with RSA, computed in
//! one go that nothing on the worker could interrupt. It is computed on the runtime's blocking
//! pool instead, at the lowest CPU priority, so that the worker, and with it every resumed
//! session's steps (its hello, its request, its backend's answer), never waits behind one.

use std::{
    cell::Cell,
    io,
    sync::{Arc, LazyLock},
    time::Duration,
};

use rustls::{ServerConfig, server::Acceptor};
use tokio::{net::TcpStream, sync::Semaphore};
use tokio_rustls::{LazyConfigAcceptor, server::TlsStream};

use super::{
    cputime::thread_cpu_time,
    tap::{Recorded, Tap},
};
use crate::issued::IssuedKeys;

/// Completes the handshake of `stream`, whose first bytes `recorded` holds, with `config`: the
/// stream, and the CPU time its first flight took on the blocking pool (zero when it was
/// answered on the worker, whose polls the caller times).
pub async fn accept(
    stream: Tap<TcpStream>,
    recorded: &Recorded,
    config: Arc<ServerConfig>,
    issued: &IssuedKeys,
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
        return (start.into_stream(config).await, Duration::ZERO);
    }
    // At most one first flight per CPU at a time: low-priority threads are light one by one but
    // not by the hundred (150 at nice 19 outweigh one worker at nice 0 two to one).
    let Ok(_permit) = FIRST_FLIGHTS.acquire().await else {
        return (
            Err(io::Error::other("first flights closed")),
            Duration::ZERO,
        );
    };
    let flight = tokio::task::spawn_blocking(move || {
        lowest_priority();
        let before = thread_cpu_time();
        // Processes the hello: key exchange, certificate, signature, the whole first flight.
        let accept = start.into_stream(config);
        (accept, thread_cpu_time().saturating_sub(before))
    })
    .await;
    match flight {
        Ok((accept, cpu)) => (accept.await, cpu),
        Err(e) => (Err(io::Error::other(e)), Duration::ZERO),
    }
}

/// Full handshakes' first flights in progress on the blocking pool: one per CPU.
static FIRST_FLIGHTS: LazyLock<Semaphore> =
    LazyLock::new(|| Semaphore::new(std::thread::available_parallelism().map_or(1, |n| n.get())));

/// Puts the calling thread at the lowest CPU priority (nice 19), once. Only full handshakes run
/// on the proxies' blocking pool, so its threads stay there.
fn lowest_priority() {
    thread_local!(static LOWERED: Cell<bool> = const { Cell::new(false) });
    LOWERED.with(|lowered| {
        if !lowered.replace(true) {
            // SAFETY: setpriority on the calling thread's own id (Linux gives threads their
            // own nice value); no memory is passed.
            let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as u32, 19) };
            if rc != 0 {
                tracing::debug!(error = %io::Error::last_os_error(), "full handshakes keep their priority");
            }
        }
    });
}
