//! The server-side session cache, publishing each session it stores to the datapath.

use std::sync::Arc;

use rustls::server::{ServerSessionMemoryCache, StoresServerSessions};

use gateway_common::tls::Offer;

use crate::issued::IssuedKeys;

/// rustls's bounded in-memory cache, with every stored key published (and a taken one withdrawn).
/// An entry the cache evicts early stays published until its lifetime ends: an offer of it is then
/// classed resumed at the NIC and completes as a full handshake here.
#[derive(Debug)]
pub struct PublishingCache {
    inner: Arc<ServerSessionMemoryCache>,
    issued: Arc<IssuedKeys>,
}

impl PublishingCache {
    /// A cache of `size` entries.
    pub fn new(size: usize, issued: Arc<IssuedKeys>) -> Self {
        PublishingCache {
            inner: ServerSessionMemoryCache::new(size.max(1)),
            issued,
        }
    }
}

impl StoresServerSessions for PublishingCache {
    fn put(&self, key: Vec<u8>, value: Vec<u8>) -> bool {
        let published = key.clone();
        let stored = self.inner.put(key, value);
        if stored {
            self.issued.publish(&published, Offer::SessionId);
        }
        stored
    }

    fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        self.inner.get(key)
    }

    fn take(&self, key: &[u8]) -> Option<Vec<u8>> {
        let v = self.inner.take(key);
        if v.is_some() {
            self.issued.withdraw(key);
        }
        v
    }

    fn can_cache(&self) -> bool {
        true
    }
}
