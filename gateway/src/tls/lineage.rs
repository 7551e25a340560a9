//! Which session a connection resumed, for the tickets it is then issued: they belong to that
//! session's chain, whose bounds they share (issue 52). A ticket issued on a resumed connection
//! keeps the chain's start as its issue time, so a chain lives no longer than one session
//! lifetime from the full handshake that began it (RFC 8446, 4.6.1, recommends a limit on the
//! total lifetime of keying material passed on this way); and its key is published in the
//! chain's window (`crate::issued::CHAIN_KEYS`), so one ticket holder resuming each new ticket
//! as fast as it can never fills the issued-keys table.
//!
//! rustls asks the ticketer to open a ticket and to seal new ones with no word of the
//! connection, so the connection is named around the calls: a task-local for its task (where
//! resumed hellos and every ticket are processed), a thread-local around a first flight
//! computed on a flight thread (`crate::proxy::handshake`).

use std::{
    cell::RefCell,
    sync::{Arc, Mutex},
};

use gateway_common::tls::KEY_LEN;

/// The session a connection resumed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parent {
    /// Its key, as published.
    pub key: [u8; KEY_LEN],
    /// When its chain began (unix milliseconds): the issue time its ticket carries.
    pub start_ms: u64,
}

/// One connection's lineage: the session it resumed, once the ticketer opened it.
#[derive(Debug, Default)]
pub struct Lineage(Mutex<Option<Parent>>);

tokio::task_local! {
    static TASK: Arc<Lineage>;
}

thread_local! {
    static THREAD: RefCell<Option<Arc<Lineage>>> = const { RefCell::new(None) };
}

impl Lineage {
    /// A connection's, resuming nothing yet.
    pub fn new() -> Arc<Self> {
        Arc::new(Lineage::default())
    }

    /// Runs `f` (a connection's task) with `self` as the lineage of what it processes.
    pub async fn scope<F: Future>(self: Arc<Self>, f: F) -> F::Output {
        TASK.scope(self, f).await
    }

    /// The lineage of the task being polled, if it has one: for work it hands to a thread.
    pub fn of_task() -> Option<Arc<Self>> {
        TASK.try_with(Arc::clone).ok()
    }

    /// Runs `f` on this thread with `self` as the lineage of what it processes.
    pub fn on_thread<R>(self: Arc<Self>, f: impl FnOnce() -> R) -> R {
        THREAD.with(|t| *t.borrow_mut() = Some(self));
        let r = f();
        THREAD.with(|t| *t.borrow_mut() = None);
        r
    }
}

/// The lineage of the connection being processed, if one is named.
fn current() -> Option<Arc<Lineage>> {
    THREAD
        .with(|t| t.borrow().clone())
        .or_else(|| TASK.try_with(Arc::clone).ok())
}

/// Records that the connection being processed resumed `parent` (its ticket opened).
pub fn resumed(parent: Parent) {
    if let Some(l) = current() {
        *l.0.lock().unwrap_or_else(|p| p.into_inner()) = Some(parent);
    }
}

/// The session the connection being processed resumed, if any.
pub fn parent() -> Option<Parent> {
    let l = current()?;
    *l.0.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lineage_is_seen_inside_its_scope_only() {
        let p = Parent {
            key: [7; KEY_LEN],
            start_ms: 42,
        };
        // Outside any scope: nothing recorded, nothing seen.
        resumed(p);
        assert_eq!(parent(), None);
        let l = Lineage::new();
        l.clone().on_thread(|| {
            assert_eq!(parent(), None);
            resumed(p);
            assert_eq!(parent(), Some(p));
        });
        assert_eq!(parent(), None);
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        // The task sees what the flight thread recorded for the same connection.
        let seen = rt.block_on(l.scope(async { parent() }));
        assert_eq!(seen, Some(p));
        let other = rt.block_on(Lineage::new().scope(async { parent() }));
        assert_eq!(other, None);
    }
}
