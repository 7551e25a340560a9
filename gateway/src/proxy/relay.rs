//! Relaying bytes between the client's TLS stream and the backend's TCP stream without a buffer per
//! connection: reads go into one scratch buffer per runtime thread, and only bytes a writer could
//! not take at once are copied into a buffer of the connection's own, freed as soon as they are
//! written. An idle connection so holds no relay buffer at all.

use std::{
    cell::RefCell,
    future::poll_fn,
    io,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    time::{Instant, sleep},
};

/// Bytes of each runtime thread's scratch buffer (one TLS record's worth).
pub const SCRATCH: usize = 16 * 1024;

thread_local! {
    static SCRATCH_BUF: RefCell<Vec<u8>> = RefCell::new(vec![0; SCRATCH]);
}

/// The next bytes `r` gives (at most [`SCRATCH`]), read through this thread's scratch buffer so
/// that a connection waiting for them holds no buffer of its own; empty at its end.
pub async fn read_some<R: AsyncRead + Unpin + ?Sized>(r: &mut R) -> io::Result<Vec<u8>> {
    poll_fn(|cx| {
        SCRATCH_BUF.with(|s| {
            let mut scratch = s.borrow_mut();
            let mut buf = ReadBuf::new(&mut scratch);
            ready!(Pin::new(&mut *r).poll_read(cx, &mut buf))?;
            Poll::Ready(Ok(buf.filled().to_vec()))
        })
    })
    .await
}

/// One direction of the relay.
#[derive(Default)]
struct Direction {
    /// Bytes read and not yet written (empty, with no capacity, when caught up).
    pending: Vec<u8>,
    written: usize,
    /// The writer has data to flush.
    flush: bool,
    /// The reader reached its end.
    eof: bool,
    /// The writer was shut down after the end: this direction is over.
    done: bool,
    /// Bytes read so far.
    read: u64,
}

/// Application bytes a relay moved each way.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bytes {
    /// From the client to the backend.
    pub from_client: u64,
    /// From the backend to the client.
    pub to_client: u64,
}

impl Direction {
    /// Moves bytes from `r` to `w` until one of them would block; `Ready` once the reader's end
    /// has been passed on (the writer shut down). Sets `moved` when bytes moved.
    fn poll<R, W>(
        &mut self,
        cx: &mut Context<'_>,
        mut r: Pin<&mut R>,
        mut w: Pin<&mut W>,
        scratch: &mut [u8],
        moved: &mut bool,
    ) -> Poll<io::Result<()>>
    where
        R: AsyncRead + ?Sized,
        W: AsyncWrite + ?Sized,
    {
        if self.done {
            return Poll::Ready(Ok(()));
        }
        loop {
            while self.written < self.pending.len() {
                let n = ready!(w.as_mut().poll_write(cx, &self.pending[self.written..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.written += n;
                *moved = true;
            }
            if !self.pending.is_empty() {
                self.pending = Vec::new();
                self.written = 0;
            }
            if self.flush {
                ready!(w.as_mut().poll_flush(cx))?;
                self.flush = false;
            }
            if self.eof {
                ready!(w.as_mut().poll_shutdown(cx))?;
                self.done = true;
                return Poll::Ready(Ok(()));
            }
            let mut buf = ReadBuf::new(scratch);
            match ready!(r.as_mut().poll_read(cx, &mut buf)) {
                Ok(()) => {}
                // A TLS peer's TCP end with no close_notify.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
                    self.eof = true;
                    continue;
                }
                Err(e) => return Poll::Ready(Err(e)),
            }
            let n = buf.filled().len();
            if n == 0 {
                self.eof = true;
                continue;
            }
            *moved = true;
            self.flush = true;
            self.read += n as u64;
            // Straight from the scratch buffer; what the writer cannot take now is kept.
            let mut off = 0;
            while off < n {
                match w.as_mut().poll_write(cx, &scratch[off..n]) {
                    Poll::Ready(Ok(0)) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                    Poll::Ready(Ok(k)) => off += k,
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => break,
                }
            }
            if off < n {
                self.pending = scratch[off..n].to_vec();
            }
        }
    }
}

/// Relays bytes both ways until both ends have been passed on (each side's close half-closes
/// the other: the answer still flows after the client's end, and the client's bytes after the
/// backend's), either side fails, or nothing moves for `idle`. Returns whether it ended for
/// idleness before the backend's end: a relay that waited out `idle` on a client after the
/// backend had ended is over, not idle.
///
/// A reader's end without a TLS close_notify (a TCP FIN, as `shutdown(SHUT_WR)` sends) is an
/// end like any other, as nginx and HAProxy treat it: the backend is told by a FIN either way.
///
/// The bytes read each way are added to `bytes`, however it ended.
pub async fn relay<C, B>(
    client: &mut C,
    backend: &mut B,
    idle: Duration,
    bytes: &mut Bytes,
) -> io::Result<bool>
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut up, mut down) = (Direction::default(), Direction::default());
    let timer = sleep(idle);
    tokio::pin!(timer);
    let ended = poll_fn(|cx| {
        let mut moved = false;
        let result = SCRATCH_BUF.with(|s| {
            let mut scratch = s.borrow_mut();
            let up = up.poll(
                cx,
                Pin::new(&mut *client),
                Pin::new(&mut *backend),
                &mut scratch,
                &mut moved,
            )?;
            let down = down.poll(
                cx,
                Pin::new(&mut *backend),
                Pin::new(&mut *client),
                &mut scratch,
                &mut moved,
            )?;
            Ok::<_, io::Error>(up.is_ready() && down.is_ready())
        });
        match result {
            Err(e) => return Poll::Ready(Err(e)),
            Ok(true) => return Poll::Ready(Ok(false)),
            Ok(false) => {}
        }
        if moved {
            timer.as_mut().reset(Instant::now() + idle);
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Ok(!down.done)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await;
    bytes.from_client += up.read;
    bytes.to_client += down.read;
    ended
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, duplex};

    fn data(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    /// The relay between `client` and `backend` on a task of its own, its counts not kept.
    fn spawn_relay<C, B>(
        mut client: C,
        mut backend: B,
        idle: Duration,
    ) -> tokio::task::JoinHandle<io::Result<bool>>
    where
        C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        B: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        tokio::spawn(
            async move { relay(&mut client, &mut backend, idle, &mut Bytes::default()).await },
        )
    }

    #[tokio::test]
    async fn moves_everything_both_ways_through_small_pipes_and_passes_ends_on() {
        // Pipes of 1 KiB force partial writes, so the pending path runs.
        let (client, mut client_side) = duplex(1024);
        let (mut backend_side, mut backend) = duplex(1024);
        let relay = tokio::spawn(async move {
            let mut bytes = Bytes::default();
            let ended = relay(
                &mut client_side,
                &mut backend_side,
                Duration::from_secs(10),
                &mut bytes,
            )
            .await;
            (ended, bytes)
        });
        let (up, down) = (data(300_000, 1), data(500_000, 2));
        let (u, d) = (up.clone(), down.clone());
        let client_task = tokio::spawn(async move {
            let (mut rd, mut wr) = tokio::io::split(client);
            let writer = tokio::spawn(async move {
                wr.write_all(&u).await.unwrap();
                wr.shutdown().await.unwrap();
            });
            let mut got = Vec::new();
            rd.read_to_end(&mut got).await.unwrap();
            writer.await.unwrap();
            got
        });
        // The backend reads the whole request (to the client's end), then answers and closes.
        let mut got = Vec::new();
        backend.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, up);
        backend.write_all(&d).await.unwrap();
        backend.shutdown().await.unwrap();
        assert_eq!(client_task.await.unwrap(), down);
        let (ended, bytes) = relay.await.unwrap();
        assert!(!ended.unwrap());
        assert_eq!(
            bytes,
            Bytes {
                from_client: 300_000,
                to_client: 500_000
            }
        );
    }

    #[tokio::test]
    async fn read_some_gives_what_came_and_nothing_at_the_end() {
        let (mut client, mut server) = duplex(64 * 1024);
        let sent = data(40_000, 5);
        client.write_all(&sent).await.unwrap();
        drop(client);
        let mut got = Vec::new();
        loop {
            let part = read_some(&mut server).await.unwrap();
            if part.is_empty() {
                break;
            }
            assert!(part.len() <= SCRATCH);
            assert_eq!(part.capacity(), part.len(), "no room kept beyond the bytes");
            got.extend_from_slice(&part);
        }
        assert_eq!(got, sent);
    }

    #[tokio::test]
    async fn ends_for_idleness_and_activity_postpones_it() {
        let (mut client, client_side) = duplex(1024);
        let (backend_side, mut backend) = duplex(1024);
        let started = Instant::now();
        let relay = spawn_relay(client_side, backend_side, Duration::from_millis(300));
        // Activity every 100 ms for 600 ms keeps it open.
        for _ in 0..6 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            client.write_all(b"x").await.unwrap();
            let mut b = [0u8; 1];
            backend.read_exact(&mut b).await.unwrap();
        }
        assert!(relay.await.unwrap().unwrap(), "ended for idleness");
        assert!(started.elapsed() >= Duration::from_millis(800));
    }

    /// A stream whose end reads as `UnexpectedEof`, as a TLS stream's does when the peer sent a
    /// TCP FIN with no close_notify.
    struct NoCloseNotify(tokio::io::DuplexStream);

    impl AsyncRead for NoCloseNotify {
        fn poll_read(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            let before = buf.filled().len();
            ready!(Pin::new(&mut self.0).poll_read(cx, buf))?;
            if buf.filled().len() == before && buf.remaining() > 0 {
                return Poll::Ready(Err(io::ErrorKind::UnexpectedEof.into()));
            }
            Poll::Ready(Ok(()))
        }
    }

    impl AsyncWrite for NoCloseNotify {
        fn poll_write(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            Pin::new(&mut self.0).poll_write(cx, buf)
        }
        fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_flush(cx)
        }
        fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Pin::new(&mut self.0).poll_shutdown(cx)
        }
    }

    #[tokio::test]
    async fn a_client_end_without_close_notify_half_closes_and_the_answer_still_flows() {
        let (mut client, client_side) = duplex(1024);
        let (backend_side, mut backend) = duplex(1024);
        let relay = spawn_relay(
            NoCloseNotify(client_side),
            backend_side,
            Duration::from_secs(10),
        );
        client.write_all(b"request").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        backend.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"request");
        let answer = data(100_000, 3);
        let a = answer.clone();
        tokio::spawn(async move {
            backend.write_all(&a).await.unwrap();
            backend.shutdown().await.unwrap();
        });
        let mut back = Vec::new();
        client.read_to_end(&mut back).await.unwrap();
        assert_eq!(back, answer);
        assert!(!relay.await.unwrap().unwrap());
    }

    #[tokio::test]
    async fn a_backend_end_half_closes_and_the_clients_upload_still_reaches_it() {
        let (mut client, client_side) = duplex(1024);
        let (backend_side, mut backend) = duplex(1024);
        let relay = spawn_relay(client_side, backend_side, Duration::from_secs(10));
        // The backend speaks first and ends its side.
        backend.write_all(b"banner\n").await.unwrap();
        backend.shutdown().await.unwrap();
        let mut banner = Vec::new();
        client.read_to_end(&mut banner).await.unwrap();
        assert_eq!(banner, b"banner\n");
        // The client's upload after that end is relayed whole.
        let upload = data(1 << 20, 4);
        let u = upload.clone();
        let writer = tokio::spawn(async move {
            client.write_all(&u).await.unwrap();
            client.shutdown().await.unwrap();
        });
        let mut got = Vec::new();
        backend.read_to_end(&mut got).await.unwrap();
        writer.await.unwrap();
        assert_eq!(got.len(), upload.len());
        assert!(got == upload);
        assert!(!relay.await.unwrap().unwrap());
    }

    #[tokio::test]
    async fn waiting_out_a_client_after_the_backends_end_is_not_idleness() {
        let (_client, client_side) = duplex(1024);
        let (backend_side, mut backend) = duplex(1024);
        let relay = spawn_relay(client_side, backend_side, Duration::from_millis(100));
        backend.shutdown().await.unwrap();
        assert!(!relay.await.unwrap().unwrap());
    }
}
