//! CPU time of one future: the thread CPU time its polls took, summed. A poll runs on one thread
//! without interruption by other tasks, so the sum is the future's own cost, whatever else shares
//! the runtime.

use std::{
    future::Future,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

/// Wraps a future; resolves to its output and the CPU time its polls took.
pub struct CpuTimed<F> {
    inner: Pin<Box<F>>,
    spent: Duration,
}

impl<F: Future> CpuTimed<F> {
    /// Wraps `inner`.
    pub fn new(inner: F) -> Self {
        CpuTimed {
            inner: Box::pin(inner),
            spent: Duration::ZERO,
        }
    }
}

/// This thread's CPU time so far.
pub fn thread_cpu_time() -> Duration {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map(Duration::from)
        .unwrap_or_default()
}

impl<F: Future> Future for CpuTimed<F> {
    type Output = (F::Output, Duration);

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let start = thread_cpu_time();
        let poll = self.inner.as_mut().poll(cx);
        let spent = thread_cpu_time().saturating_sub(start);
        self.spent += spent;
        match poll {
            Poll::Ready(out) => Poll::Ready((out, self.spent)),
            Poll::Pending => Poll::Pending,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_the_work_done_in_polls() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let (sum, spent) = rt.block_on(CpuTimed::new(async {
            // Enough work to take measurable CPU time, then a yield, then more.
            let mut x = 0u64;
            for i in 0..3_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
            }
            tokio::task::yield_now().await;
            for i in 0..3_000_000u64 {
                x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
            }
            x
        }));
        std::hint::black_box(sum);
        assert!(spent > Duration::from_micros(100), "{spent:?}");
        // An idle wait costs (almost) nothing.
        let (_, idle) = rt.block_on(CpuTimed::new(async {
            tokio::time::sleep(Duration::from_millis(50)).await
        }));
        assert!(idle < Duration::from_millis(10), "{idle:?}");
    }
}
