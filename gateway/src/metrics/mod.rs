//! The Prometheus endpoint: `GET /metrics` (and `HEAD`, and with a query string, which is
//! ignored) over a minimal HTTP/1.x responder (one request per connection, bounded in size and
//! time). What it serves follows the request's `Accept`, as Prometheus's own client libraries
//! do: the OpenMetrics text `prometheus-client` encodes when asked for (Prometheus asks by
//! default), else the same series in the 0.0.4 text format ([`text`]).

pub mod family;
pub mod text;

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
    crate::accept::accept_until(
        listener,
        &stop,
        "metrics",
        || async {},
        |sock, _, ()| {
            let (registry, refresh) = (registry.clone(), refresh.clone());
            tokio::spawn(async move {
                if let Err(e) = answer(sock, &registry, &refresh).await {
                    debug!(error = %e, "metrics request");
                }
            });
        },
    )
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
    let route = route(line);
    let openmetrics = text::wants_openmetrics(&head);
    let (status, body) = match route {
        Route::Metrics { .. } => {
            for r in refresh {
                r();
            }
            let mut open = String::new();
            prometheus_client::encoding::text::encode(&mut open, registry)
                .map_err(std::io::Error::other)?;
            let body = if openmetrics {
                open
            } else {
                text::from_openmetrics(&open)
            };
            ("200 OK", body)
        }
        Route::WrongMethod => (
            "405 Method Not Allowed",
            "only GET and HEAD /metrics are served\n".to_string(),
        ),
        Route::NotFound => ("404 Not Found", "only GET /metrics is served\n".to_string()),
    };
    let content_type = match route {
        Route::Metrics { .. } if openmetrics => OPENMETRICS,
        Route::Metrics { .. } => text::CONTENT_TYPE,
        _ => "text/plain; charset=utf-8",
    };
    let allow = if route == Route::WrongMethod {
        "Allow: GET, HEAD\r\n"
    } else {
        ""
    };
    let mut response = format!(
        "HTTP/1.0 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n",
        body.len()
    );
    if route != (Route::Metrics { head: true }) {
        response += &body;
    }
    sock.write_all(response.as_bytes()).await?;
    sock.shutdown().await
}

/// The content type of what `prometheus_client`'s text encoder writes (OpenMetrics 1.0: `_total`
/// counters, `# EOF`).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// What a request line asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// The metrics; `head`: without the body.
    Metrics { head: bool },
    /// `/metrics` by another method.
    WrongMethod,
    /// Anything else.
    NotFound,
}

/// Routes a request line (`METHOD TARGET [VERSION]`): `/metrics`, with any query string.
fn route(line: &[u8]) -> Route {
    let mut parts = line.split(|&b| b == b' ');
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Route::NotFound;
    };
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    if path != b"/metrics" {
        return Route::NotFound;
    }
    match method {
        b"GET" => Route::Metrics { head: false },
        b"HEAD" => Route::Metrics { head: true },
        _ => Route::WrongMethod,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_route_as_scrapers_send_them() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1"),
            Route::Metrics { head: false }
        );
        assert_eq!(route(b"GET /metrics"), Route::Metrics { head: false });
        assert_eq!(
            route(b"GET /metrics?x=1&name[]=a HTTP/1.1"),
            Route::Metrics { head: false }
        );
        assert_eq!(
            route(b"HEAD /metrics HTTP/1.1"),
            Route::Metrics { head: true }
        );
        assert_eq!(route(b"POST /metrics HTTP/1.1"), Route::WrongMethod);
        assert_eq!(route(b"GET /metricsx HTTP/1.1"), Route::NotFound);
        assert_eq!(route(b"GET / HTTP/1.1"), Route::NotFound);
        assert_eq!(route(b""), Route::NotFound);
        assert_eq!(route(b"GET"), Route::NotFound);
    }
}
