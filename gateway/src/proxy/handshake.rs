//! One connection's TLS handshake, resumed sessions first (seed 000).
//!
//! A hello that offers a session key the gateway issued (published in the datapath's map, so
//! the NIC verified it too) is answered on the worker: a resumption is cheap. Any other hello's
//! first flight carries a full handshake's signature, milliseconds of CPU with RSA, computed in
//! one go that nothing on the worker could interrupt. It is computed on the runtime's blocking
//! pool instead, one per CPU at a time, where the kernel's scheduler time-slices it with the
//! worker: every resumed session's steps (its hello, its request, its backend's answer) run
//! within a slice instead of after whole signatures. The pool keeps the system's priority: at
//! nice 19 the signatures starved behind any other busy process on the host (a test in
//! parallel, a backend on the same machine) until their handshake timeout.

use std::{
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
    // At most one first flight per CPU at a time: the worker shares a CPU with one signature,
    // not with a hundred (which would leave it a hundredth of the CPU).
    let Ok(_permit) = FIRST_FLIGHTS.acquire().await else {
        return (
            Err(io::Error::other("first flights closed")),
            Duration::ZERO,
        );
    };
    let flight = tokio::task::spawn_blocking(move || {
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
