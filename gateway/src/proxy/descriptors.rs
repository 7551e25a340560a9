//! The proxies' share of the daemon's open-files limit.
//!
//! A proxied connection holds two descriptors (the client's and the backend's). The proxies
//! accept a connection only while it can have both and a reserve stays free for the daemon's own
//! work (the metrics endpoint, reloads, reading config and certificate files). At the limit they
//! stop accepting, as HAProxy does at its `maxconn`: clients wait in the listen queue and are
//! served as connections end, rather than being accepted and failed; no backend member is blamed
//! for the gateway's own limit, and the metrics endpoint keeps answering.

use std::sync::Arc;

use thiserror::Error;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// Descriptors each proxied connection holds: the client's and the backend's.
pub const PER_CONNECTION: u64 = 2;

/// Descriptors kept free for the daemon's own work, beyond what it held when the proxies started.
pub const RESERVE: u64 = 32;

/// The fewest connections the limit must leave room for; below that the daemon refuses to start.
pub const MIN_CONNECTIONS: u64 = 8;

/// Why the proxies' share could not be set.
#[derive(Debug, Error)]
pub enum DescriptorError {
    /// The limit or the open descriptors could not be read.
    #[error("reading the open-files limit or /proc/self/fd: {0}")]
    Io(#[from] std::io::Error),
    /// The limit leaves too little room.
    #[error(
        "the open-files limit ({limit}) leaves room for {connections} proxied connections: the daemon holds {open} descriptors, keeps {RESERVE} in reserve and needs {PER_CONNECTION} per connection (at least {MIN_CONNECTIONS} connections); raise LimitNOFILE (ulimit -n)"
    )]
    TooLow {
        /// The soft limit.
        limit: u64,
        /// Descriptors open when measured.
        open: u64,
        /// Connections that would fit.
        connections: u64,
    },
}

/// Places for proxied connections, shared by every listener.
#[derive(Debug, Clone)]
pub struct Descriptors {
    places: Arc<Semaphore>,
    connections: usize,
}

/// One connection's place; given back when dropped.
#[derive(Debug)]
pub struct Place {
    _held: OwnedSemaphorePermit,
}

impl Descriptors {
    /// The share left by the process's soft open-files limit and the descriptors it holds now.
    pub fn measure() -> Result<Self, DescriptorError> {
        let (soft, _) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_err(std::io::Error::from)?;
        // The directory's own descriptor is counted by the listing.
        let open = std::fs::read_dir("/proc/self/fd")?
            .count()
            .saturating_sub(1) as u64;
        Self::of(soft, open)
    }

    /// The share a soft limit of `limit` leaves when `open` descriptors are held.
    pub fn of(limit: u64, open: u64) -> Result<Self, DescriptorError> {
        let connections = limit.saturating_sub(open).saturating_sub(RESERVE) / PER_CONNECTION;
        if connections < MIN_CONNECTIONS {
            return Err(DescriptorError::TooLow {
                limit,
                open,
                connections,
            });
        }
        let connections = usize::try_from(connections)
            .unwrap_or(usize::MAX)
            .min(Semaphore::MAX_PERMITS);
        Ok(Descriptors {
            places: Arc::new(Semaphore::new(connections)),
            connections,
        })
    }

    /// How many proxied connections fit.
    pub fn connections(&self) -> usize {
        self.connections
    }

    /// How many places are held now.
    pub fn held(&self) -> usize {
        self.connections - self.places.available_permits()
    }

    /// A place for one connection, waiting while every place is held; `paused` is called first
    /// when it must wait.
    pub async fn take(&self, paused: impl FnOnce()) -> Place {
        match self.places.clone().try_acquire_owned() {
            Ok(p) => Place { _held: p },
            Err(TryAcquireError::NoPermits) | Err(TryAcquireError::Closed) => {
                paused();
                // Never closed: the semaphore lives as long as this value.
                let p = self
                    .places
                    .clone()
                    .acquire_owned()
                    .await
                    .expect("the places are never closed");
                Place { _held: p }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_is_what_the_limit_leaves_after_the_open_and_the_reserve() {
        let d = Descriptors::of(1024, 40).unwrap();
        assert_eq!(d.connections(), (1024 - 40 - RESERVE as usize) / 2);
        // An unlimited limit is capped, not overflowed.
        assert_eq!(
            Descriptors::of(u64::MAX, 40).unwrap().connections(),
            Semaphore::MAX_PERMITS
        );
    }

    #[test]
    fn a_limit_that_leaves_too_little_room_is_refused_with_the_numbers() {
        let e = Descriptors::of(64, 40).unwrap_err().to_string();
        assert!(e.contains("(64)") && e.contains("holds 40"), "{e}");
        assert!(Descriptors::of(40 + RESERVE + 2 * MIN_CONNECTIONS, 40).is_ok());
        assert!(Descriptors::of(40 + RESERVE + 2 * MIN_CONNECTIONS - 1, 40).is_err());
    }

    #[tokio::test]
    async fn a_full_share_pauses_until_a_place_is_given_back() {
        let d = Descriptors::of(40 + RESERVE + 2 * MIN_CONNECTIONS, 40).unwrap();
        let paused = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = || {
            let paused = paused.clone();
            move || {
                paused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        };
        let mut held = Vec::new();
        for _ in 0..MIN_CONNECTIONS {
            held.push(d.take(count()).await);
        }
        assert_eq!(d.held(), MIN_CONNECTIONS as usize);
        assert_eq!(paused.load(std::sync::atomic::Ordering::Relaxed), 0);
        let waiting = tokio::spawn({
            let (d, paused) = (d.clone(), count());
            async move { d.take(paused).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        assert_eq!(paused.load(std::sync::atomic::Ordering::Relaxed), 1);
        held.pop();
        let _place = waiting.await.unwrap();
        assert_eq!(d.held(), MIN_CONNECTIONS as usize);
    }
}
