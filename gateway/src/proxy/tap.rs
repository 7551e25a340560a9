//! The client's first bytes, as the TLS handshake read them: after the handshake (finished,
//! failed or timed out) the proxy knows which issued key the hello offered and whether it really
//! resumed. An offer that did not resume withdraws its key from the datapath: whoever holds it
//! (a replayer, a client of a stale session) gets no more resumed places with it.
//!
//! The tap sits between the socket and rustls and copies what rustls reads, up to a hello's
//! largest size, then stops; the relay afterwards reads through it at the cost of one branch.

use std::{
    io,
    pin::Pin,
    sync::{Arc, Mutex, OnceLock},
    task::{Context, Poll},
};

use gateway_common::tls::{KEY_LEN, MAX_HELLO, Verdict, parse_hello};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Bytes recorded at most: a hello of the largest size the datapath parses, plus its record
/// headers and anything in front of it (a ChangeCipherSpec, an alert).
const MAX_RECORDED: usize = MAX_HELLO as usize + 512;

/// What a [`Tap`] recorded; shared with the proxy, which reads it whether or not the handshake
/// future still exists (a timed-out handshake is dropped with its stream).
#[derive(Debug, Default)]
pub struct Recorded {
    bytes: Mutex<Vec<u8>>,
    /// The offer, once the recorded hello was whole (or malformed): more bytes after it change
    /// nothing, so the handshake's check and the proxy's withdraw parse it once.
    offer: OnceLock<Option<[u8; KEY_LEN]>>,
}

impl Recorded {
    /// The key of the issued value the recorded hello offered (`offer_digest` of its whole
    /// session id, ticket or PSK identity), if it is a complete, well-formed hello with an offer.
    pub fn offer_key(&self) -> Option<[u8; KEY_LEN]> {
        if let Some(offer) = self.offer.get() {
            return *offer;
        }
        let bytes = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        let state = parse_hello(&bytes);
        let offer = (state.verdict() == Verdict::Offer)
            .then(|| state.offer_key())
            .flatten();
        if state.verdict() != Verdict::Pending {
            let _ = self.offer.set(offer);
        }
        offer
    }

    fn push(&self, data: &[u8]) -> bool {
        let mut bytes = self.bytes.lock().unwrap_or_else(|p| p.into_inner());
        let room = MAX_RECORDED.saturating_sub(bytes.len());
        bytes.extend_from_slice(&data[..data.len().min(room)]);
        bytes.len() < MAX_RECORDED
    }
}

/// A stream that records the first bytes read from it into a shared [`Recorded`].
#[derive(Debug)]
pub struct Tap<S> {
    inner: S,
    /// Where to record; `None` once recording stopped.
    recorded: Option<Arc<Recorded>>,
}

impl<S> Tap<S> {
    /// Taps `inner`; returns the stream and what it will record.
    pub fn new(inner: S) -> (Self, Arc<Recorded>) {
        let recorded = Arc::new(Recorded::default());
        let tap = Tap {
            inner,
            recorded: Some(recorded.clone()),
        };
        (tap, recorded)
    }

    /// Stops recording (the handshake is over).
    pub fn stop(&mut self) {
        self.recorded = None;
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tap<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let Some(r) = &self.recorded
            && !r.push(&buf.filled()[before..])
        {
            self.recorded = None;
        }
        poll
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tap<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, data)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_common::{testing::HelloBuilder, tls::offer_digest};
    use tokio::io::AsyncReadExt as _;

    #[tokio::test]
    async fn the_tap_records_the_hello_and_stops_at_its_bound() {
        let id: Vec<u8> = (0..32).collect();
        let hello = HelloBuilder {
            session_id: id.clone(),
            ..Default::default()
        }
        .build();
        let mut stream = [&hello[..], &vec![23u8; 3 * MAX_RECORDED]].concat();
        let (mut tap, recorded) = Tap::new(&stream[..]);
        let mut out = Vec::new();
        tap.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, stream);
        assert_eq!(recorded.offer_key(), Some(offer_digest(&id)));
        assert_eq!(recorded.bytes.lock().unwrap().len(), MAX_RECORDED);
        // A hello cut short, or none at all, offers nothing.
        stream.truncate(hello.len() - 1);
        let (mut tap, recorded) = Tap::new(&stream[..]);
        tap.read_to_end(&mut Vec::new()).await.unwrap();
        assert_eq!(recorded.offer_key(), None);
        let (mut tap, recorded) = Tap::new(&b"GET / HTTP/1.1\r\n\r\n"[..]);
        tap.read_to_end(&mut Vec::new()).await.unwrap();
        assert_eq!(recorded.offer_key(), None);
    }
}
