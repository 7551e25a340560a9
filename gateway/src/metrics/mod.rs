//! The daemon's HTTP endpoint, served with hyper: `/metrics` for Prometheus, `/healthz` and
//! `/readyz` for supervisors and load balancers ([`crate::health`]). `GET` and `HEAD`, any query
//! string ignored; one connection's requests are bounded in time, at most [`MAX_CONNECTIONS`]
//! are served at once, and at most [`PER_CLIENT`] of them for one client address, so that a
//! scrape and a probe are answered whatever other clients hold (the endpoint may listen on the
//! node's network, as the DaemonSet's does for its probes).
//!
//! What `/metrics` serves follows the request's `Accept`, as Prometheus's own client libraries
//! do: the OpenMetrics text `prometheus-client` encodes when asked for (Prometheus asks by
//! default), else the same series in the 0.0.4 text format ([`text`]).

pub mod family;
pub mod process;
pub mod text;

use std::{convert::Infallible, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{
    Method, Request, Response, StatusCode,
    body::Bytes,
    header::{ACCEPT, ALLOW, CONTENT_TYPE, HeaderValue},
    server::conn::http1,
    service::service_fn,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::{
    client_places::ClientPlaces,
    health::{Checks, Readiness},
};

/// Time a client has to send a request's head.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest a connection may stay open (a keep-alive scraper reconnects).
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(60);
/// Connections served at once. Past them, accepting pauses and clients wait in the listen
/// queue, as a proxy's listener does at its descriptor budget: the endpoint's connections come
/// out of the daemon's descriptor reserve ([`crate::proxy::descriptors::RESERVE`]), which a peer
/// holding connections open must not spend (a scraper and a few probes need one or two each).
pub const MAX_CONNECTIONS: usize = 16;
/// Connections one client address (an IPv6 /64) is served at once: a scraper and a kubelet's
/// probes need one or two. Past them its connection is closed at once, without taking a place.
pub const PER_CLIENT: usize = 4;

/// Called before each scrape, to bring gauges up to date.
pub type Refresh = Box<dyn Fn() + Send + Sync>;

/// What the endpoint serves from.
pub struct Endpoint {
    /// The series.
    pub registry: Registry,
    /// Run before each scrape.
    pub refresh: Vec<Refresh>,
    /// Readiness checks.
    pub checks: Checks,
}

/// Serves `endpoint` on `listener` until `stop` is cancelled.
pub async fn serve(listener: TcpListener, endpoint: Arc<Endpoint>, stop: CancellationToken) {
    let places = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let clients = ClientPlaces::new(PER_CLIENT);
    crate::accept::accept_until(
        listener,
        &stop,
        "metrics",
        || places.clone().acquire_owned(),
        |sock, peer, place| {
            let Some(client) = clients.take(peer.ip()) else {
                debug!(%peer, "metrics connection over its address's bound: closed");
                return;
            };
            let endpoint = endpoint.clone();
            tokio::spawn(async move {
                // Held while the connection lasts; the semaphore is never closed.
                let _place = (place, client);
                let service = service_fn(move |req: Request<hyper::body::Incoming>| {
                    let endpoint = endpoint.clone();
                    async move { Ok::<_, Infallible>(endpoint.answer(&req)) }
                });
                let conn = http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(REQUEST_TIMEOUT)
                    .serve_connection(TokioIo::new(sock), service);
                match tokio::time::timeout(CONNECTION_TIMEOUT, conn).await {
                    Ok(Err(e)) => debug!(error = %e, "metrics connection"),
                    Err(_) => debug!("metrics connection open too long: closed"),
                    Ok(Ok(())) => {}
                }
            });
        },
    )
    .await
}

impl Endpoint {
    fn answer<B>(&self, req: &Request<B>) -> Response<Full<Bytes>> {
        let path = req.uri().path();
        let route = route(req.method(), path);
        let (status, content_type, body) = match route {
            Route::Metrics => {
                for r in &self.refresh {
                    r();
                }
                let mut open = String::new();
                match prometheus_client::encoding::text::encode(&mut open, &self.registry) {
                    Ok(()) => {
                        let openmetrics = req
                            .headers()
                            .get_all(ACCEPT)
                            .iter()
                            .any(|v| text::accepts_openmetrics(v.as_bytes()));
                        if openmetrics {
                            (StatusCode::OK, OPENMETRICS, open)
                        } else {
                            (
                                StatusCode::OK,
                                text::CONTENT_TYPE,
                                text::from_openmetrics(&open),
                            )
                        }
                    }
                    Err(e) => (
                        StatusCode::INTERNAL_SERVER_ERROR,
                        PLAIN,
                        format!("encoding the metrics: {e}\n"),
                    ),
                }
            }
            Route::Healthz => (StatusCode::OK, PLAIN, "ok\n".to_string()),
            Route::Readyz => {
                let r = Readiness::of(&self.checks);
                let status = if r.ready {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                (status, PLAIN, r.body())
            }
            Route::WrongMethod => (
                StatusCode::METHOD_NOT_ALLOWED,
                PLAIN,
                "only GET and HEAD are served\n".to_string(),
            ),
            Route::NotFound => (
                StatusCode::NOT_FOUND,
                PLAIN,
                "served: /metrics, /healthz, /readyz\n".to_string(),
            ),
        };
        let mut response = Response::new(Full::new(Bytes::from(body)));
        *response.status_mut() = status;
        *response.version_mut() = req.version();
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
        if route == Route::WrongMethod {
            response
                .headers_mut()
                .insert(ALLOW, HeaderValue::from_static("GET, HEAD"));
        }
        response
    }
}

/// The content type of what `prometheus_client`'s text encoder writes (OpenMetrics 1.0: `_total`
/// counters, `# EOF`).
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const PLAIN: &str = "text/plain; charset=utf-8";

/// What a request asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// The metrics.
    Metrics,
    /// Liveness.
    Healthz,
    /// Readiness.
    Readyz,
    /// A known path by another method than GET or HEAD.
    WrongMethod,
    /// Anything else.
    NotFound,
}

/// Routes a request by method and path (the query string is not part of the path).
fn route(method: &Method, path: &str) -> Route {
    let known = match path {
        "/metrics" => Route::Metrics,
        "/healthz" => Route::Healthz,
        "/readyz" => Route::Readyz,
        _ => return Route::NotFound,
    };
    if method == Method::GET || method == Method::HEAD {
        known
    } else {
        Route::WrongMethod
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_route_by_method_and_path() {
        assert_eq!(route(&Method::GET, "/metrics"), Route::Metrics);
        assert_eq!(route(&Method::HEAD, "/metrics"), Route::Metrics);
        assert_eq!(route(&Method::GET, "/healthz"), Route::Healthz);
        assert_eq!(route(&Method::GET, "/readyz"), Route::Readyz);
        assert_eq!(route(&Method::POST, "/metrics"), Route::WrongMethod);
        assert_eq!(route(&Method::GET, "/metricsx"), Route::NotFound);
        assert_eq!(route(&Method::GET, "/"), Route::NotFound);
    }

    #[test]
    fn metrics_follow_the_accept_header_and_readyz_says_why() {
        let mut registry = Registry::default();
        let c: prometheus_client::metrics::counter::Counter = Default::default();
        registry.register("x", "X", c);
        let down: crate::health::Check = Box::new(|| Err("eth0: the program is detached".into()));
        let e = Endpoint {
            registry,
            refresh: Vec::new(),
            checks: Arc::new(vec![down]),
        };
        let get = |path: &str, accept: Option<&str>| {
            let mut b = Request::builder().uri(path);
            if let Some(a) = accept {
                b = b.header(ACCEPT, a);
            }
            e.answer(&b.body(()).unwrap())
        };
        let open = get(
            "/metrics?x=1",
            Some("application/openmetrics-text;version=1.0.0"),
        );
        assert_eq!(open.headers()[CONTENT_TYPE], OPENMETRICS);
        let plain = get("/metrics", None);
        assert_eq!(plain.headers()[CONTENT_TYPE], text::CONTENT_TYPE);
        assert_eq!(get("/healthz", None).status(), StatusCode::OK);
        assert_eq!(
            get("/readyz", None).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
    }
}
