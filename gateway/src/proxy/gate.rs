//! A backend member's slots and the queue in front of them, in two classes (seed 002): resumed
//! sessions and new ones wait apart, and when a slot frees the gate chooses whose turn it is. By
//! default the connection that has waited longest goes first (FIFO across both); once the
//! controller's `pdd` law sets a share, the high class gets that share of the slots that free
//! while both wait, so that the classes' queueing delays keep the ratio the law holds.
//!
//! Every place ends on its own: a waiter that gives up (its wait timed out, its task ended)
//! leaves the queue as it is dropped, and a slot handed to it in the same instant is passed on.

use std::{
    collections::VecDeque,
    sync::{
        Arc, Mutex, MutexGuard,
        atomic::{AtomicU64, Ordering},
    },
    time::Duration,
};

// Tokio's clock, so that a test with paused time measures waits in it.
use tokio::{sync::oneshot, time::Instant};

/// The two classes a connection waits in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// Resumed sessions.
    High = 0,
    /// New sessions (full handshakes).
    Low = 1,
}

/// How slots are shared between the classes, and what their waits were: one per listener,
/// shared by its members' gates, read and set by the controller.
#[derive(Debug, Default)]
pub struct Differentiation {
    /// The high class's share of contended slots, f64 bits; `u64::MAX` while FIFO.
    share: AtomicU64,
    /// Per class: microseconds waited and waits ended, since start.
    waited_us: [AtomicU64; 2],
    waits: [AtomicU64; 2],
}

/// What the waits of both classes added up to, since start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Waits {
    /// Per class (`Priority as usize`): microseconds waited.
    pub waited_us: [u64; 2],
    /// Per class: waits ended (with a slot or without).
    pub waits: [u64; 2],
}

impl Waits {
    /// The mean wait of `class` from `before` to `self`; `None` when none ended.
    pub fn mean_since(&self, before: &Waits, class: Priority) -> Option<Duration> {
        let i = class as usize;
        let n = self.waits[i].saturating_sub(before.waits[i]);
        (n > 0).then(|| {
            Duration::from_micros(self.waited_us[i].saturating_sub(before.waited_us[i]) / n)
        })
    }
}

impl Differentiation {
    /// FIFO across the classes, no waits yet.
    pub fn new() -> Self {
        Differentiation {
            share: AtomicU64::new(u64::MAX),
            ..Default::default()
        }
    }

    /// The high class's share of contended slots (0 to 1); `None` while FIFO.
    pub fn share(&self) -> Option<f64> {
        let bits = self.share.load(Ordering::Relaxed);
        (bits != u64::MAX).then(|| f64::from_bits(bits))
    }

    /// Gives the high class `share` (clamped to 0..=1) of the slots that free while both classes
    /// wait; `None` goes back to FIFO.
    pub fn set_share(&self, share: Option<f64>) {
        let bits = share.map_or(u64::MAX, |s| s.clamp(0.0, 1.0).to_bits());
        self.share.store(bits, Ordering::Relaxed);
    }

    /// The waits so far.
    pub fn waits(&self) -> Waits {
        let load = |a: &[AtomicU64; 2]| [0, 1].map(|i| a[i].load(Ordering::Relaxed));
        Waits {
            waited_us: load(&self.waited_us),
            waits: load(&self.waits),
        }
    }

    fn record(&self, class: Priority, waited: Duration) {
        let i = class as usize;
        let us = u64::try_from(waited.as_micros()).unwrap_or(u64::MAX);
        self.waited_us[i].fetch_add(us, Ordering::Relaxed);
        self.waits[i].fetch_add(1, Ordering::Relaxed);
    }
}

struct Waiter {
    id: u64,
    since: Instant,
    tx: oneshot::Sender<()>,
}

struct State {
    /// Slots held now (above `capacity` for a while after a reload shrank it).
    active: u32,
    /// Slots at most.
    capacity: u32,
    /// Waiters at most.
    backlog: u32,
    queues: [VecDeque<Waiter>; 2],
    next_id: u64,
    /// The high class's accumulated entitlement (weighted round robin on `share`).
    credit: f64,
}

/// One member's slots and queues.
pub struct Gate {
    state: Mutex<State>,
    diff: Arc<Differentiation>,
}

/// A slot held; dropping it frees it (to the next waiter, if any).
pub struct SlotGuard {
    gate: Arc<Gate>,
}

/// A place in a gate's queue; dropping it leaves the queue.
pub struct Place {
    gate: Arc<Gate>,
    id: u64,
    class: Priority,
    since: Instant,
    rx: Option<oneshot::Receiver<()>>,
}

/// What a connection got at the gate.
pub enum Entry {
    /// A slot, at once.
    Slot(SlotGuard),
    /// A place in the queue.
    Queued(Place),
}

impl Gate {
    /// `capacity` slots and at most `backlog` waiting, shared per `diff`.
    pub fn new(capacity: u32, backlog: u32, diff: Arc<Differentiation>) -> Arc<Gate> {
        Arc::new(Gate {
            state: Mutex::new(State {
                active: 0,
                capacity,
                backlog,
                queues: [VecDeque::new(), VecDeque::new()],
                next_id: 0,
                credit: 0.0,
            }),
            diff,
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every change under the lock is made whole before anything that could panic.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Slots in use.
    pub fn active(&self) -> u32 {
        self.state().active
    }

    /// Sets its slots and backlog (a reload): more slots go to waiters at once; fewer are
    /// retired as their holders leave. Waiters beyond a smaller backlog keep their places.
    pub fn resize(&self, capacity: u32, backlog: u32) {
        let mut s = self.state();
        s.capacity = capacity;
        s.backlog = backlog;
        while s.active < s.capacity && self.hand_over(&mut s) {
            s.active += 1;
        }
    }

    /// Connections waiting.
    pub fn waiting(&self) -> u32 {
        let s = self.state();
        (s.queues[0].len() + s.queues[1].len()) as u32
    }

    /// Whether a slot or a place in the queue is free.
    pub fn has_room(&self) -> bool {
        let s = self.state();
        s.active < s.capacity || ((s.queues[0].len() + s.queues[1].len()) as u32) < s.backlog
    }

    /// A slot now, else a place in `class`'s queue, else (the backlog full) nothing.
    pub fn enter(self: &Arc<Self>, class: Priority) -> Option<Entry> {
        let mut s = self.state();
        if s.active < s.capacity {
            s.active += 1;
            return Some(Entry::Slot(SlotGuard { gate: self.clone() }));
        }
        if (s.queues[0].len() + s.queues[1].len()) as u32 >= s.backlog {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        let id = s.next_id;
        s.next_id += 1;
        let since = Instant::now();
        s.queues[class as usize].push_back(Waiter { id, since, tx });
        Some(Entry::Queued(Place {
            gate: self.clone(),
            id,
            class,
            since,
            rx: Some(rx),
        }))
    }

    /// Which queue the next free slot goes to, when both have waiters.
    fn turn(&self, s: &mut State) -> usize {
        match self.diff.share() {
            // FIFO: whoever has waited longest.
            None => {
                let head = |q: &VecDeque<Waiter>| q.front().map(|w| w.since);
                usize::from(head(&s.queues[1]) < head(&s.queues[0]))
            }
            Some(share) => {
                s.credit += share;
                if s.credit >= 1.0 {
                    s.credit -= 1.0;
                    Priority::High as usize
                } else {
                    Priority::Low as usize
                }
            }
        }
    }

    /// A slot freed: hand it to the next waiter, else keep it free (or retire it, when a reload
    /// left more held than there are).
    fn release(&self) {
        let mut s = self.state();
        if s.active > s.capacity || !self.hand_over(&mut s) {
            s.active -= 1;
        }
    }

    /// Hands a held slot to the next live waiter; false when none waits.
    fn hand_over(&self, s: &mut State) -> bool {
        loop {
            let q = match (s.queues[0].is_empty(), s.queues[1].is_empty()) {
                (true, true) => return false,
                (false, true) => 0,
                (true, false) => 1,
                (false, false) => self.turn(s),
            };
            let w = s.queues[q].pop_front().expect("non-empty");
            if w.tx.send(()).is_ok() {
                return true;
            }
            // Its receiver is gone (the place is being dropped): the next one.
        }
    }
}

impl Drop for SlotGuard {
    fn drop(&mut self) {
        self.gate.release();
    }
}

impl Place {
    /// The slot when one frees within `wait`; `None` if none did (the place is given up).
    pub async fn slot(mut self, wait: Duration) -> Option<SlotGuard> {
        let rx = self.rx.as_mut().expect("a place waits once");
        let got = tokio::time::timeout(wait, rx).await;
        self.gate.diff.record(self.class, self.since.elapsed());
        if let Ok(Ok(())) = got {
            // Handed over: the place is spent, the slot is ours.
            self.id = u64::MAX;
            return Some(SlotGuard {
                gate: self.gate.clone(),
            });
        }
        // Dropping the place leaves the queue, or passes on a slot handed over meanwhile.
        None
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        if self.id == u64::MAX {
            return;
        }
        let mut s = self.gate.state();
        let q = &mut s.queues[self.class as usize];
        if let Some(i) = q.iter().position(|w| w.id == self.id) {
            q.remove(i);
            return;
        }
        drop(s);
        // Popped already: the slot was sent under the lock while the receiver lived, so it is
        // here; pass it on.
        if let Some(rx) = self.rx.as_mut()
            && rx.try_recv().is_ok()
        {
            self.gate.release();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queued(e: Option<Entry>) -> Place {
        match e {
            Some(Entry::Queued(p)) => p,
            _ => panic!("expected a place in the queue"),
        }
    }

    /// Order in which waiters of `classes` (queued in that order) get the one slot, as it is
    /// freed and taken again one by one.
    async fn order(share: Option<f64>, classes: &[Priority]) -> Vec<Priority> {
        let diff = Arc::new(Differentiation::new());
        diff.set_share(share);
        let gate = Gate::new(1, 100, diff);
        let Some(Entry::Slot(first)) = gate.enter(Priority::Low) else {
            panic!("a free slot")
        };
        let places: Vec<(Priority, Place)> = classes
            .iter()
            .map(|&c| (c, queued(gate.enter(c))))
            .collect();
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        for (c, p) in places {
            let done = done_tx.clone();
            tokio::spawn(async move {
                let slot = p.slot(Duration::from_secs(60)).await.expect("a slot");
                // Hold it until the test takes the next turn.
                let (tx, rx) = oneshot::channel::<()>();
                done.send((c, tx)).unwrap();
                let _ = rx.await;
                drop(slot);
            });
        }
        drop(first);
        let mut got = Vec::new();
        for _ in classes {
            let (c, release) = done_rx.recv().await.unwrap();
            got.push(c);
            release.send(()).unwrap();
        }
        got
    }

    use Priority::{High as H, Low as L};

    #[tokio::test]
    async fn fifo_across_classes_until_a_share_is_set() {
        assert_eq!(order(None, &[L, H, L, H]).await, vec![L, H, L, H]);
    }

    #[tokio::test]
    async fn a_share_splits_contended_slots_between_the_classes() {
        // Three quarters to the high class while both wait; the rest in order.
        let got = order(Some(0.75), &[L, L, L, L, H, H, H, H, H, H]).await;
        assert_eq!(got[..4].iter().filter(|&&c| c == H).count(), 3, "{got:?}");
        assert_eq!(got.iter().filter(|&&c| c == H).count(), 6);
        // Strict priority at 1, none at 0 (while the other class waits).
        assert_eq!(order(Some(1.0), &[L, L, H, H]).await, vec![H, H, L, L]);
        assert_eq!(order(Some(0.0), &[H, H, L, L]).await, vec![L, L, H, H]);
    }

    #[tokio::test]
    async fn a_place_given_up_leaves_the_queue_and_passes_a_slot_on() {
        let diff = Arc::new(Differentiation::new());
        let gate = Gate::new(1, 2, diff.clone());
        let Some(Entry::Slot(held)) = gate.enter(H) else {
            panic!()
        };
        let a = queued(gate.enter(H));
        let b = queued(gate.enter(L));
        assert!(gate.enter(L).is_none(), "backlog full");
        // A timed-out wait leaves the queue, and is counted as a wait.
        assert!(a.slot(Duration::from_millis(10)).await.is_none());
        assert_eq!(gate.waiting(), 1);
        assert_eq!(diff.waits().waits, [1, 0]);
        // A place dropped after it was handed the slot passes the slot on.
        drop(held);
        drop(b);
        assert_eq!(gate.waiting(), 0);
        assert_eq!(gate.active(), 0, "the slot came back");
        assert!(matches!(gate.enter(L), Some(Entry::Slot(_))));
    }

    #[tokio::test]
    async fn a_resize_hands_new_slots_to_waiters_and_retires_slots_as_they_free() {
        let gate = Gate::new(1, 2, Arc::new(Differentiation::new()));
        let Some(Entry::Slot(first)) = gate.enter(L) else {
            panic!()
        };
        let waiting = queued(gate.enter(L));
        // One more slot: the waiter gets it at once.
        gate.resize(2, 2);
        let second = waiting.slot(Duration::ZERO).await.expect("handed over");
        assert_eq!((gate.active(), gate.waiting()), (2, 0));
        // Down to one: both holders keep theirs; the first to leave retires its slot.
        gate.resize(1, 0);
        assert!(gate.enter(L).is_none(), "no slot, no backlog");
        drop(first);
        assert_eq!(gate.active(), 1);
        assert!(gate.enter(L).is_none(), "still the one slot held");
        drop(second);
        assert_eq!(gate.active(), 0);
        assert!(matches!(gate.enter(L), Some(Entry::Slot(_))));
    }
}
