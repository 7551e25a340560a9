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
            ready!(r.as_mut().poll_read(cx, &mut buf))?;
            let n = buf.filled().len();
            if n == 0 {
                self.eof = true;
                continue;
            }
            *moved = true;
            self.flush = true;
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

/// Relays bytes both ways until the backend's end has been passed on to the client, either side
/// fails, or nothing moves for `idle`; returns whether it ended for idleness. The client's end is
/// passed on to the backend, whose answer is still relayed.
pub async fn relay<C, B>(client: &mut C, backend: &mut B, idle: Duration) -> io::Result<bool>
where
    C: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let (mut up, mut down) = (Direction::default(), Direction::default());
    let timer = sleep(idle);
    tokio::pin!(timer);
    poll_fn(|cx| {
        let mut moved = false;
        let result = SCRATCH_BUF.with(|s| {
            let mut scratch = s.borrow_mut();
            if let Poll::Ready(Err(e)) = up.poll(
                cx,
                Pin::new(&mut *client),
                Pin::new(&mut *backend),
                &mut scratch,
                &mut moved,
            ) {
                return Poll::Ready(Err(e));
            }
            match down.poll(
                cx,
                Pin::new(&mut *backend),
                Pin::new(&mut *client),
                &mut scratch,
                &mut moved,
            ) {
                Poll::Ready(Ok(())) => Poll::Ready(Ok(false)),
                Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
                Poll::Pending => Poll::Pending,
            }
        });
        if result.is_ready() {
            return result;
        }
        if moved {
            timer.as_mut().reset(Instant::now() + idle);
        }
        match timer.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Ok(true)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
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

    #[tokio::test]
    async fn moves_everything_both_ways_through_small_pipes_and_passes_ends_on() {
        // Pipes of 1 KiB force partial writes, so the pending path runs.
        let (client, mut client_side) = duplex(1024);
        let (mut backend_side, mut backend) = duplex(1024);
        let relay = tokio::spawn(async move {
            relay(&mut client_side, &mut backend_side, Duration::from_secs(10)).await
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
        assert!(!relay.await.unwrap().unwrap());
    }

    #[tokio::test]
    async fn ends_for_idleness_and_activity_postpones_it() {
        let (mut client, mut client_side) = duplex(1024);
        let (mut backend_side, mut backend) = duplex(1024);
        let started = Instant::now();
        let relay = tokio::spawn(async move {
            relay(
                &mut client_side,
                &mut backend_side,
                Duration::from_millis(300),
            )
            .await
        });
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
}
