//! Active checks of a listener's members (`health_check`): one probe, a TCP connect or an
//! HTTP/1.1 `GET` answered 2xx or 3xx, within a timeout. The pool keeps what they say
//! (`super::pool::Member::probed`); the listener runs a round before its first accept and one
//! every interval after.

use std::{net::SocketAddr, time::Duration};

use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::TcpStream,
};

/// Bytes of an answer read for its status line (`HTTP/1.1 200`).
const STATUS_LINE: usize = 12;

/// One probe of `addr`: a connect and, with `http_path`, a `GET` of it answered 2xx or 3xx, all
/// within `timeout`. Why it failed.
pub async fn probe(
    addr: SocketAddr,
    timeout: Duration,
    http_path: Option<&str>,
) -> Result<(), String> {
    let attempt = async {
        let mut s = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let Some(path) = http_path else {
            return Ok(());
        };
        let request = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: gateway-health-check\r\nConnection: close\r\n\r\n"
        );
        s.write_all(request.as_bytes())
            .await
            .map_err(|e| format!("sending the request: {e}"))?;
        let mut head = [0u8; STATUS_LINE];
        let mut got = 0;
        while got < STATUS_LINE {
            match s.read(&mut head[got..]).await {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) => return Err(format!("reading the answer: {e}")),
            }
        }
        status_passes(&head[..got])
    };
    tokio::time::timeout(timeout, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {timeout:?}")))
}

/// Whether the start of an HTTP answer says 2xx or 3xx; why not.
fn status_passes(head: &[u8]) -> Result<(), String> {
    let text = String::from_utf8_lossy(head);
    let status = text
        .strip_prefix("HTTP/1.")
        .and_then(|rest| rest.get(2..5))
        .and_then(|code| code.parse::<u16>().ok())
        .ok_or_else(|| format!("not an HTTP answer: {text:?}"))?;
    if (200..400).contains(&status) {
        Ok(())
    } else {
        Err(format!("status {status}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_2xx_or_3xx_passes_and_anything_else_is_named() {
        assert!(status_passes(b"HTTP/1.1 200").is_ok());
        assert!(status_passes(b"HTTP/1.0 302").is_ok());
        assert_eq!(status_passes(b"HTTP/1.1 503").unwrap_err(), "status 503");
        assert!(
            status_passes(b"SSH-2.0-Open")
                .unwrap_err()
                .contains("not an HTTP answer")
        );
        assert!(status_passes(b"").is_err());
    }

    #[test]
    fn a_probe_connects_asks_and_times_out() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let ok = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = ok.local_addr().unwrap();
            let server = tokio::spawn(async move {
                for status in ["200 OK", "500 Internal Server Error"] {
                    let (mut s, _) = ok.accept().await.unwrap();
                    let mut buf = [0u8; 512];
                    let _ = s.read(&mut buf).await.unwrap();
                    let answer = format!("HTTP/1.1 {status}\r\nContent-Length: 0\r\n\r\n");
                    s.write_all(answer.as_bytes()).await.unwrap();
                }
            });
            let t = Duration::from_secs(5);
            assert_eq!(probe(addr, t, Some("/healthz")).await, Ok(()));
            assert_eq!(
                probe(addr, t, Some("/healthz")).await,
                Err("status 500".into())
            );
            server.await.unwrap();
            // Nothing listens there any more: refused.
            assert!(
                probe(addr, t, None)
                    .await
                    .unwrap_err()
                    .starts_with("connect")
            );
            // Accepted by the kernel and never answered: the timeout.
            let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let e = probe(
                silent.local_addr().unwrap(),
                Duration::from_millis(100),
                Some("/"),
            )
            .await
            .unwrap_err();
            assert!(e.starts_with("no answer within"), "{e}");
        });
    }
}
