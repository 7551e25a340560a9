//! Scraping the daemon's Prometheus endpoint from inside the gateway namespace.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

use crate::netns::TestNet;

/// `GET /metrics` from 127.0.0.1:`port` in the gateway namespace; the body.
pub fn scrape(net: &TestNet, port: u16) -> String {
    let text = get(net, "127.0.0.1", port, "/metrics").expect("metrics endpoint");
    let (head, body) = text.split_once("\r\n\r\n").expect("HTTP response");
    assert!(head.starts_with("HTTP/1.0 200"), "{head}");
    body.to_string()
}

/// An HTTP/1.0 `GET path` of `host:port` from the gateway namespace: the whole answer (status
/// line, head and body), `None` when nothing answered.
pub fn get(net: &TestNet, host: &str, port: u16, path: &str) -> Option<String> {
    net.in_gw(|| {
        let mut s = TcpStream::connect((host, port)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\n\r\n").as_bytes())
            .ok()?;
        let mut text = String::new();
        s.read_to_string(&mut text).ok()?;
        Some(text)
    })
}

/// The value of the series `name` whose labels contain every `key="value"` in `labels`; 0 when
/// there is none (a counter not yet incremented).
pub fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.rsplit_once(' '))
        .filter(|(series, _)| {
            series.split('{').next() == Some(name)
                && labels
                    .iter()
                    .all(|(k, v)| series.contains(&format!("{k}=\"{v}\"")))
        })
        .map(|(_, v)| v.parse::<f64>().expect("a number"))
        .sum()
}

/// Scrapes until `cond` holds for the value of `name` with `labels` (at most `timeout`); returns
/// the last scrape. Panics with it on timeout.
pub fn wait_for(
    net: &TestNet,
    port: u16,
    name: &str,
    labels: &[(&str, &str)],
    cond: impl Fn(f64) -> bool,
    timeout: Duration,
) -> String {
    let deadline = Instant::now() + timeout;
    loop {
        let text = scrape(net, port);
        if cond(value(&text, name, labels)) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{name}{labels:?} never met the condition; last scrape:\n{text}"
        );
        std::thread::yield_now();
    }
}
