//! The accept loop the proxy listeners and the metrics endpoint share.

use std::{net::SocketAddr, time::Duration};

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tracing::warn;

/// How long an accept error (out of descriptors or memory) pauses the loop, rather than letting it
/// spin on the error.
const BACKOFF: Duration = Duration::from_millis(50);

/// Accepts on `listener` until `stop` is cancelled, handing each connection to `handle` with the
/// place `room` gave it: `room` is awaited before each accept, so a listener whose connections
/// need a resource (descriptors) leaves clients in the listen queue while it has none. `what`
/// names the listener in error logs. The listening socket closes when this returns.
pub async fn accept_until<P, F: Future<Output = P>>(
    listener: TcpListener,
    stop: &CancellationToken,
    what: &str,
    mut room: impl FnMut() -> F,
    mut handle: impl FnMut(TcpStream, SocketAddr, P),
) {
    loop {
        let place = tokio::select! {
            _ = stop.cancelled() => return,
            p = room() => p,
        };
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((sock, peer)) => handle(sock, peer, place),
            Err(e) => {
                warn!(listener = what, error = %e, "accept failed");
                tokio::time::sleep(BACKOFF).await;
            }
        }
    }
}
