//! The Prometheus endpoint: `GET /metrics` in the text exposition format, over a minimal HTTP/1.x
//! responder (one request per connection, bounded in size and time).

use std::{sync::Arc, time::Duration};

use prometheus_client::registry::Registry;
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
};
use tokio_util::sync::CancellationToken;
use tracing::debug;

/// Largest request head read.
const MAX_REQUEST: usize = 8192;
/// Time a client has to send its request.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Called before each scrape, to bring gauges up to date.
pub type Refresh = Box<dyn Fn() + Send + Sync>;

/// Serves `registry` on `listener` until `stop` is cancelled.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Registry>,
    refresh: Arc<Vec<Refresh>>,
    stop: CancellationToken,
) {
    crate::accept::accept_until(listener, &stop, "metrics", |sock, _| {
        let (registry, refresh) = (registry.clone(), refresh.clone());
        tokio::spawn(async move {
            if let Err(e) = answer(sock, &registry, &refresh).await {
                debug!(error = %e, "metrics request");
            }
        });
    })
    .await
}

async fn answer(
    mut sock: TcpStream,
    registry: &Registry,
    refresh: &[Refresh],
) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    let read_head = async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
            let n = sock.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        Ok::<_, std::io::Error>(())
    };
    tokio::time::timeout(REQUEST_TIMEOUT, read_head)
        .await
        .map_err(|_| std::io::Error::other("request timed out"))??;
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let (status, body) = if line.starts_with(b"GET /metrics ") || line == b"GET /metrics" {
        for r in refresh {
            r();
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry)
            .map_err(std::io::Error::other)?;
        ("200 OK", text)
    } else {
        ("404 Not Found", "only GET /metrics is served\n".to_string())
    };
    let response = format!(
        "HTTP/1.0 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    sock.write_all(response.as_bytes()).await?;
    sock.shutdown().await
}
