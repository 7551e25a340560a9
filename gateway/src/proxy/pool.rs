//! The backend pool (seed 004): each member serves at most `max_active` connections at once (its
//! worker threads) and lets at most `backlog` more wait for one. A member with neither free is
//! full, and new connections go to another member or are refused, never queued beyond. A member
//! that refuses a connection or does not answer in time is tried no more for that connection
//! (the next member is); after `max_fails` such failures in a row it is marked down for the retry
//! interval, except that the last member up is never marked down for connects that timed out (it
//! is busy, not dead: nginx never marks its only upstream down). A success clears the count. Among members with room, smooth weighted round robin spreads new
//! connections in proportion to the weights. Resumed and new sessions wait in a member's backlog
//! apart ([`gate`](super::gate)).

use std::{
    net::SocketAddr,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use super::{
    config::BackendConfig,
    gate::{Differentiation, Entry, Gate, Place, Priority, SlotGuard},
};

/// One member. A reload that keeps its address keeps the member (its slots, waiters and
/// failure record).
pub struct Member {
    /// Its address.
    pub address: SocketAddr,
    gate: Arc<Gate>,
    down_until: Mutex<Option<Instant>>,
    /// Failures in a row, and when the last was.
    fails: Mutex<(u32, Option<Instant>)>,
    /// What the active checks say of it.
    checked: Mutex<Checked>,
}

/// A member's record of active checks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Checked {
    /// Probed at least once.
    probed: bool,
    /// Down by the checks.
    down: bool,
    /// Probes in a row with the same outcome as the last.
    streak: u32,
    /// The last probe's outcome.
    last_ok: bool,
}

impl Member {
    /// Connections it serves now.
    pub fn active(&self) -> u32 {
        self.gate.active()
    }

    /// Connections waiting for a slot.
    pub fn waiting(&self) -> u32 {
        self.gate.waiting()
    }

    /// Whether it is up at `now`: not marked down by its failed connects (or their retry
    /// interval has passed), nor by the active checks.
    pub fn is_up(&self, now: Instant) -> bool {
        let passive = self
            .down_until
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_none_or(|t| t <= now);
        passive && !self.checked.lock().unwrap_or_else(|p| p.into_inner()).down
    }

    /// Records an active probe's outcome under `fall` and `rise`; `Some(up)` when it changed
    /// what the checks say (the first probe decides alone).
    pub fn probed(&self, ok: bool, fall: u32, rise: u32) -> Option<bool> {
        let mut c = self.checked.lock().unwrap_or_else(|p| p.into_inner());
        c.streak = if c.probed && c.last_ok == ok {
            c.streak.saturating_add(1)
        } else {
            1
        };
        let first = !c.probed;
        (c.probed, c.last_ok) = (true, ok);
        let down = if first {
            !ok
        } else if ok {
            c.down && c.streak < rise
        } else {
            c.down || c.streak >= fall
        };
        let changed = first && down || !first && down != c.down;
        c.down = down;
        changed.then_some(!down)
    }

    fn has_room(&self) -> bool {
        self.gate.has_room()
    }

    /// Whether an active check has probed it (a member that joined by a reload has not, until
    /// the round the reload asks for).
    fn vouched(&self) -> bool {
        self.checked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .probed
    }
}

/// A place with a member: a slot to serve in now, or a place in its backlog.
pub struct Reservation {
    /// Index of the member.
    pub member: usize,
    kind: SlotState,
}

enum SlotState {
    Active(SlotGuard),
    Queued(Place),
}

/// A slot a connection holds while it is served; dropping it frees the slot.
pub struct Slot {
    /// Index of the member.
    pub member: usize,
    _held: SlotGuard,
}

impl Reservation {
    /// Whether it waits in a backlog.
    pub fn is_queued(&self) -> bool {
        matches!(self.kind, SlotState::Queued(_))
    }

    /// The slot: at once, or when one frees within `wait`; `None` if none did.
    pub async fn slot(self, wait: Duration) -> Option<Slot> {
        let member = self.member;
        let held = match self.kind {
            SlotState::Active(held) => held,
            SlotState::Queued(place) => place.slot(wait).await?,
        };
        Some(Slot {
            member,
            _held: held,
        })
    }
}

/// The pool.
pub struct Pool {
    members: Vec<Arc<Member>>,
    /// Each member's weight, in `members` order.
    weights: Vec<i64>,
    diff: Arc<Differentiation>,
    retry: Duration,
    max_fails: u32,
    /// Smooth weighted round robin: each member's current weight.
    current: Mutex<Vec<i64>>,
    /// Active checks run ([`Pool::checked`]): a member they have not probed yet serves only
    /// when no probed one can.
    checks: bool,
}

impl Pool {
    /// A pool of `backends`, marking members that failed `max_fails` times in a row down for
    /// `retry`.
    pub fn new(backends: &[BackendConfig], retry: Duration, max_fails: u32) -> Self {
        Self::build(
            backends,
            retry,
            max_fails,
            Arc::new(Differentiation::new()),
            &[],
        )
    }

    /// The pool a reload makes of this one: members at an address of `backends` are kept (their
    /// slots resized, their held connections and waiters carried over, their down mark and
    /// failures kept), new addresses join, and members left out drain: their connections go on
    /// to their end, no new one goes there.
    pub fn reconfigured(
        &self,
        backends: &[BackendConfig],
        retry: Duration,
        max_fails: u32,
    ) -> Self {
        Self::build(backends, retry, max_fails, self.diff.clone(), &self.members)
    }

    fn build(
        backends: &[BackendConfig],
        retry: Duration,
        max_fails: u32,
        diff: Arc<Differentiation>,
        previous: &[Arc<Member>],
    ) -> Self {
        let members = backends
            .iter()
            .map(|b| match previous.iter().find(|m| m.address == b.address) {
                Some(m) => {
                    m.gate.resize(b.max_active, b.backlog);
                    m.clone()
                }
                None => Arc::new(Member {
                    address: b.address,
                    gate: Gate::new(b.max_active, b.backlog, diff.clone()),
                    down_until: Mutex::new(None),
                    fails: Mutex::new((0, None)),
                    checked: Mutex::new(Checked::default()),
                }),
            })
            .collect();
        Pool {
            members,
            weights: backends.iter().map(|b| i64::from(b.weight)).collect(),
            diff,
            retry,
            max_fails: max_fails.max(1),
            current: Mutex::new(vec![0; backends.len()]),
            checks: false,
        }
    }

    /// This pool with active checks running (`on`) or not: where they run, a member they have
    /// not probed yet serves only when no probed one can ([`Pool::reserve`]).
    pub fn checked(mut self, on: bool) -> Self {
        self.checks = on;
        self
    }

    /// The members.
    pub fn members(&self) -> &[Arc<Member>] {
        &self.members
    }

    /// How the members' backlogs share slots between resumed and new sessions, and their waits.
    pub fn differentiation(&self) -> &Arc<Differentiation> {
        &self.diff
    }

    /// Whether some member is up and has a free slot or backlog place now.
    pub fn has_room(&self) -> bool {
        let now = Instant::now();
        self.members.iter().any(|m| m.is_up(now) && m.has_room())
    }

    /// Reserves a place for a connection of `class` with the next member by weight that is up,
    /// has room and is not in `exclude`; `None` when there is none (every member is down, full
    /// or excluded). Where active checks run, a member they have not probed yet (one a reload
    /// added) takes connections only when no probed member can: a dead one is found by its
    /// first probe, not by clients.
    pub fn reserve(&self, exclude: &[usize], class: Priority) -> Option<Reservation> {
        let now = Instant::now();
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        let mut skip: Vec<usize> = exclude.to_vec();
        loop {
            let mut eligible: Vec<usize> = (0..self.members.len())
                .filter(|i| !skip.contains(i))
                .filter(|&i| self.members[i].is_up(now) && self.members[i].has_room())
                .collect();
            if self.checks && eligible.iter().any(|&i| self.members[i].vouched()) {
                eligible.retain(|&i| self.members[i].vouched());
            }
            let total: i64 = eligible.iter().map(|&i| self.weights[i]).sum();
            for &i in &eligible {
                current[i] += self.weights[i];
            }
            let &pick = eligible
                .iter()
                .max_by_key(|&&i| (current[i], -(i as i64)))?;
            current[pick] -= total;
            match self.members[pick].gate.enter(class) {
                Some(Entry::Slot(held)) => {
                    return Some(Reservation {
                        member: pick,
                        kind: SlotState::Active(held),
                    });
                }
                Some(Entry::Queued(place)) => {
                    return Some(Reservation {
                        member: pick,
                        kind: SlotState::Queued(place),
                    });
                }
                None => {}
            }
            // Filled up since the check: try the others.
            skip.push(pick);
        }
    }

    /// Member `i` failed a connect (`timed_out`: it did not answer in time, rather than
    /// refusing). Whether it is marked down now: after `max_fails` failures in a row (a failure
    /// more than a retry interval after the last starts the count again), unless it timed out
    /// and no other member is up.
    pub fn failed(&self, i: usize, timed_out: bool) -> bool {
        let now = Instant::now();
        let count = {
            let mut f = self.members[i]
                .fails
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let recent = f.1.is_some_and(|t| now.duration_since(t) <= self.retry);
            f.0 = if recent { f.0 + 1 } else { 1 };
            f.1 = Some(now);
            f.0
        };
        if count < self.max_fails {
            return false;
        }
        let others_up = self
            .members
            .iter()
            .enumerate()
            .any(|(j, m)| j != i && m.is_up(now));
        if timed_out && !others_up {
            return false;
        }
        self.mark_down(i);
        true
    }

    /// Member `i` took a connection: its failures in a row start again from zero.
    pub fn succeeded(&self, i: usize) {
        *self.members[i]
            .fails
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = (0, None);
    }

    /// Marks member `i` down for the retry interval.
    pub fn mark_down(&self, i: usize) {
        let until = Instant::now() + self.retry;
        *self.members[i]
            .down_until
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some(until);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(spec: &[(u32, u32, u32)]) -> Pool {
        let backends: Vec<BackendConfig> = spec
            .iter()
            .enumerate()
            .map(|(i, &(weight, max_active, backlog))| BackendConfig {
                address: SocketAddr::from(([127, 0, 0, 1], 1000 + i as u16)),
                weight,
                max_active,
                backlog,
                alpn: Vec::new(),
            })
            .collect();
        Pool::new(&backends, Duration::from_millis(50), 3)
    }

    #[test]
    fn active_checks_mark_down_after_fall_and_up_after_rise_and_the_first_decides() {
        let p = pool(&[(1, 10, 0), (1, 10, 0)]);
        let now = Instant::now;
        let (dead, live) = (&p.members()[0], &p.members()[1]);
        // The first probe decides alone: dead at start is down at once.
        assert_eq!(dead.probed(false, 3, 2), Some(false));
        assert!(!dead.is_up(now()));
        assert_eq!(live.probed(true, 3, 2), None);
        assert!(live.is_up(now()));
        // No client is sent to the member the checks hold down.
        for _ in 0..10 {
            assert_eq!(p.reserve(&[], Priority::Low).unwrap().member, 1);
        }
        // Back after `rise` passed probes in a row; a failure between starts the count again.
        assert_eq!(dead.probed(true, 3, 2), None);
        assert_eq!(dead.probed(false, 3, 2), None);
        assert_eq!(dead.probed(true, 3, 2), None);
        assert_eq!(dead.probed(true, 3, 2), Some(true));
        assert!(dead.is_up(now()));
        // Down after `fall` failed probes in a row, not before.
        assert_eq!(live.probed(false, 3, 2), None);
        assert_eq!(live.probed(false, 3, 2), None);
        assert!(live.is_up(now()));
        assert_eq!(live.probed(false, 3, 2), Some(false));
        assert!(!live.is_up(now()));
    }

    #[test]
    fn weights_share_connections() {
        let p = pool(&[(3, 100, 0), (1, 100, 0)]);
        let mut held = Vec::new();
        let mut per = [0; 2];
        for _ in 0..40 {
            let r = p.reserve(&[], Priority::Low).unwrap();
            per[r.member] += 1;
            held.push(r);
        }
        assert_eq!(per, [30, 10]);
    }

    #[tokio::test]
    async fn a_full_member_refuses_and_the_backlog_waits_for_a_slot() {
        let p = pool(&[(1, 1, 1)]);
        let first = p.reserve(&[], Priority::Low).unwrap();
        assert!(!first.is_queued());
        let second = p.reserve(&[], Priority::Low).unwrap();
        assert!(second.is_queued());
        assert_eq!(p.members()[0].waiting(), 1);
        // Active slot and backlog both taken: full, refused.
        assert!(!p.has_room());
        assert!(p.reserve(&[], Priority::Low).is_none());
        // The queued one gets the slot once the first leaves.
        let slot = first.slot(Duration::from_secs(1)).await.unwrap();
        let waiter = tokio::spawn(second.slot(Duration::from_secs(5)));
        drop(slot);
        let s2 = waiter.await.unwrap().expect("a slot");
        assert_eq!(s2.member, 0);
        assert_eq!(p.members()[0].waiting(), 0);
        assert_eq!(p.members()[0].active(), 1);
        // A wait that ends without a slot frees its backlog place.
        let third = p.reserve(&[], Priority::Low).unwrap();
        assert!(third.is_queued());
        assert!(third.slot(Duration::from_millis(20)).await.is_none());
        assert_eq!(p.members()[0].waiting(), 0);
    }

    #[test]
    fn a_member_marked_down_is_skipped_until_its_retry_interval_passes() {
        let p = pool(&[(1, 10, 0), (1, 10, 0)]);
        p.mark_down(0);
        for _ in 0..4 {
            assert_eq!(p.reserve(&[], Priority::Low).unwrap().member, 1);
        }
        assert!(p.reserve(&[1], Priority::Low).is_none());
        let deadline = Instant::now() + Duration::from_secs(5);
        while !p.members()[0].is_up(Instant::now()) {
            assert!(Instant::now() < deadline);
            std::thread::yield_now();
        }
        let picks: Vec<usize> = (0..4)
            .map(|_| p.reserve(&[], Priority::Low).unwrap().member)
            .collect();
        assert!(picks.contains(&0), "{picks:?}");
    }

    #[test]
    fn a_member_is_marked_down_after_max_fails_in_a_row_and_a_success_clears_the_count() {
        let p = pool(&[(1, 10, 0), (1, 10, 0)]);
        assert!(!p.failed(0, false));
        assert!(!p.failed(0, false));
        p.succeeded(0);
        assert!(!p.failed(0, false));
        assert!(!p.failed(0, false));
        assert!(p.failed(0, false), "the third in a row");
        assert!(!p.members()[0].is_up(Instant::now()));
        assert!(p.members()[1].is_up(Instant::now()));
    }

    #[test]
    fn the_last_member_up_is_never_marked_down_for_being_busy() {
        let p = pool(&[(1, 1, 1)]);
        for _ in 0..10 {
            assert!(!p.failed(0, true), "timeouts of the only member");
        }
        assert!(p.members()[0].is_up(Instant::now()));
        // Refusing connections is another matter: nothing listens there.
        assert!(p.failed(0, false));
        let two = pool(&[(1, 1, 1), (1, 1, 1)]);
        two.mark_down(1);
        for _ in 0..5 {
            assert!(
                !two.failed(0, true),
                "the other member is down: 0 is the last up"
            );
        }
    }

    #[test]
    fn failures_far_apart_do_not_add_up() {
        let p = pool(&[(1, 10, 0), (1, 10, 0)]);
        assert!(!p.failed(0, false));
        assert!(!p.failed(0, false));
        // More than the retry interval (50 ms here) later: the count starts again.
        std::thread::sleep(Duration::from_millis(80));
        assert!(!p.failed(0, false));
        assert!(p.members()[0].is_up(Instant::now()));
    }

    #[test]
    fn a_member_no_check_has_probed_takes_connections_only_when_no_probed_one_can() {
        let p = pool(&[(1, 10, 0), (1, 10, 0)]).checked(true);
        // Member 0 passed its first probe; member 1 joined since (no probe yet).
        assert_eq!(p.members()[0].probed(true, 3, 2), None);
        for _ in 0..4 {
            let r = p.reserve(&[], Priority::Low).unwrap();
            assert_eq!(r.member, 0, "only the probed member, whatever the weights");
        }
        // With the probed member excluded (or down, or full), the other one serves.
        assert_eq!(p.reserve(&[0], Priority::Low).unwrap().member, 1);
        // Once probed and up, both share by weight.
        assert_eq!(p.members()[1].probed(true, 3, 2), None);
        let picks: Vec<usize> = (0..4)
            .map(|_| p.reserve(&[], Priority::Low).unwrap().member)
            .collect();
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
        // Where checks no longer run (a reload removed them), what they once said of a member
        // gives it no preference.
        let q = pool(&[(1, 10, 0), (1, 10, 0)]);
        assert_eq!(q.members()[0].probed(true, 3, 2), None);
        let picks: Vec<usize> = (0..4)
            .map(|_| q.reserve(&[], Priority::Low).unwrap().member)
            .collect();
        assert!(picks.contains(&0) && picks.contains(&1), "{picks:?}");
    }

    #[test]
    fn a_reconfigured_pool_keeps_members_by_address_and_lets_removed_ones_drain() {
        let p = pool(&[(1, 1, 0), (1, 1, 0)]);
        let backends = |spec: &[(u16, u32)]| -> Vec<BackendConfig> {
            spec.iter()
                .map(|&(port, max_active)| BackendConfig {
                    address: SocketAddr::from(([127, 0, 0, 1], port)),
                    weight: 1,
                    max_active,
                    backlog: 0,
                    alpn: Vec::new(),
                })
                .collect()
        };
        let on_first = p.reserve(&[], Priority::Low).unwrap();
        assert_eq!(on_first.member, 0);
        p.mark_down(1);
        // 1000 goes, 1001 stays (still down), 1002 joins.
        let q = p.reconfigured(
            &backends(&[(1001, 2), (1002, 1)]),
            Duration::from_secs(60),
            3,
        );
        assert_eq!(q.members()[0].address.port(), 1001);
        assert!(
            !q.members()[0].is_up(Instant::now()),
            "its down mark is kept"
        );
        // New connections go to the new member only; the removed one still holds its connection.
        let r = q.reserve(&[], Priority::Low).unwrap();
        assert_eq!(q.members()[r.member].address.port(), 1002);
        assert!(q.reserve(&[r.member], Priority::Low).is_none());
        assert_eq!(
            p.members()[0].active(),
            1,
            "the removed member's connection goes on"
        );
        drop(on_first);
        assert_eq!(p.members()[0].active(), 0);
    }
}
