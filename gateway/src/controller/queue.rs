//! Mode `sip`'s law: it holds the queue the server builds under a target, not how long its
//! answers take. A server that always answers in 150 ms is not overloaded; one whose answers
//! take 5 ms more each interval is.
//!
//! What it reads, per method family (INVITE, and every other method: a server takes its own
//! time per method, and may answer OPTIONS on a fast path while INVITEs queue):
//!
//! - the family's **floor**, the time the server takes with nothing queued: the lowest interval
//!   median over a window ([`HeldFloor`], [`QueueLaw::FLOOR_WINDOW`]). Only intervals in which the
//!   class refused nothing feed it (a median measured while the law holds a queue is that
//!   queue, not the server), except that a lower median always lowers it; with no such
//!   interval in the window it holds its last value. A flood can slow answers, not speed them,
//!   so it cannot raise the floor, and while the class refuses nothing can;
//! - the family's **queueing delay**: the interval's median service time above the floor. A
//!   minority of slow answers does not move a median;
//! - which outstanding units are **dead** (requests the server discarded or will never answer):
//!   those outstanding for longer than twice the floor plus twice the target
//!   ([`QueueLaw::dead_age`]), which no unit the law lets queue reaches. They are not the live
//!   backlog the limit bounds: the limit is the live limit plus the places dead units hold
//!   until their timeout, so a dead flood costs its places and no more, at any rate.
//!
//! What it does, per family: over the target, the family's live limit is cut at once (by at
//! least a quarter) from the units live now by the gradient (floor + target / 2) / median;
//! between half the target and the target, it is moved by the same gradient (the set point is
//! half the target, so samples stay under the target); under half the target it grows by a
//! tenth (at least one). Each family's limit (its live limit and its dead units' places) is
//! enforced by the datapath on the family's own backlog (`SIP_FAMILIES`), so fast answers of
//! another method never lend the queueing one places, nor take its; the class's limit is their
//! sum. With nothing answered in a whole unit timeout and units expiring (the server stopped),
//! every live limit is cut by a quarter of what is outstanding.
//!
//! What can steer it: answers of the server (their times, per family). What cannot: requests
//! the server never answers (dead: their places only), answers of another method (their own
//! family), a minority of slow answers (the median), a server's fixed answer time (the floor).

use std::time::Duration;

use gateway_common::{maps::ServiceTimes, reasons::Reason};

use super::{floor, law::Decision};

/// Method families the law tells apart.
pub const FAMILIES: usize = 2;

/// A method family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Family {
    /// INVITE: the request that starts a call, usually the server's costliest.
    Invite = 0,
    /// Every other method (OPTIONS, REGISTER, MESSAGE, SUBSCRIBE, ...).
    Other = 1,
}

impl Family {
    /// Both, in index order.
    pub const ALL: [Family; FAMILIES] = [Family::Invite, Family::Other];

    /// Its name in metrics and logs.
    pub const fn name(self) -> &'static str {
        match self {
            Family::Invite => "invite",
            Family::Other => "other",
        }
    }
}

/// What one interval showed of one family.
#[derive(Clone, Debug, Default)]
pub struct FamilyObservation {
    /// The service times (admission to the server's first answer) of the units of the family
    /// answered in the interval.
    pub times: ServiceTimes,
    /// How long each unit of the family outstanding at the interval's end has been, for the
    /// units an answer can end.
    pub ages: Vec<Duration>,
    /// Units of the family outstanding that no answer can end (they end at their timeout; the
    /// server may be working on them): always live.
    pub unmatched: u64,
}

impl FamilyObservation {
    /// Units answered.
    pub fn completed(&self) -> u64 {
        self.times.count()
    }
}

/// What one interval showed of one class, per family.
#[derive(Clone, Debug, Default)]
pub struct QueueObservation {
    /// The interval's length.
    pub interval: Duration,
    /// Units that expired unanswered in the interval.
    pub expired: u64,
    /// The class's unit timeout (how long an unanswered unit holds its place).
    pub timeout: Duration,
    /// Arrivals refused in the interval.
    pub refused: u64,
    /// By [`Family`] index.
    pub families: [FamilyObservation; FAMILIES],
}

impl QueueObservation {
    /// Units answered in the interval, every family.
    pub fn completed(&self) -> u64 {
        self.families.iter().map(FamilyObservation::completed).sum()
    }
}

/// The floor of one family: the lowest interval median over a window ([`floor::Floor`]), held
/// when the window has none, and raised only by intervals that refused nothing.
#[derive(Clone, Debug)]
pub struct HeldFloor {
    window: floor::Floor,
    held: Option<Duration>,
}

impl HeldFloor {
    /// A floor over the last `window` intervals.
    pub fn new(window: usize) -> Self {
        HeldFloor {
            window: floor::Floor::new(window),
            held: None,
        }
    }

    /// One interval: its median, and whether it may raise the floor (nothing was refused).
    pub fn push(&mut self, median: Option<Duration>, unqueued: bool) {
        let lowers = median.zip(self.get()).is_some_and(|(m, f)| m < f);
        let sample = median.filter(|_| unqueued || lowers || self.held.is_none());
        self.window.push(sample);
        if let Some(f) = self.window.get() {
            self.held = Some(f);
        }
    }

    /// Starts the window again from `median`, measured with nothing queued ahead (a probe).
    pub fn reset(&mut self, median: Duration) {
        self.window.reset(Some(median));
        self.held = Some(median);
    }

    /// The floor, once a median was seen.
    pub fn get(&self) -> Option<Duration> {
        self.window.get().or(self.held)
    }
}

/// The law's state for one family.
#[derive(Clone, Debug)]
struct FamilyLaw {
    floor: HeldFloor,
    /// The live limit.
    live: u64,
    /// Its dead units, as last seen.
    dead: u64,
    /// Its queueing delay last interval.
    queue: Option<Duration>,
    /// Intervals in a row its queue was over the set point.
    pressed: usize,
    /// Intervals since its floor was last probed.
    since_probe: usize,
    /// The probe under way.
    probe: Option<Probe>,
}

/// A probe of a family's floor (as Envoy's adaptive concurrency re-measures its minimum round
/// trip): the family's limit held at a quarter of its live units until what was queued before
/// is answered or dead, and the median of the next answers taken as the floor. A queue the law
/// held (or a flood left from before the law took over) drains, so the floor is the server's
/// own time again; a server that got slower for good (a downstream's fixed time grew) shows its
/// new floor, and the law stops cutting it.
#[derive(Clone, Copy, Debug)]
struct Probe {
    /// The live limit to return to.
    restore: u64,
    /// Time left until the answers are the probe's.
    settle: Duration,
    /// Intervals it has measured without an answer.
    waited: usize,
}

/// What one family's step did.
enum Move {
    /// The live limit moves for this reason.
    To(u64, Reason),
    /// Nothing to go by.
    Hold,
}

impl FamilyLaw {
    fn new(initial: u64) -> Self {
        FamilyLaw {
            floor: HeldFloor::new(QueueLaw::FLOOR_WINDOW),
            live: initial,
            dead: 0,
            queue: None,
            pressed: 0,
            since_probe: QueueLaw::PROBE_SPACING,
            probe: None,
        }
    }

    /// One interval of `interval` in which the family showed `fo`, `live` of its units live,
    /// under `target` (and `refused`: whether the class refused anything).
    fn step(
        &mut self,
        fo: &FamilyObservation,
        live: u64,
        interval: Duration,
        target: Duration,
        refused: bool,
    ) -> Move {
        let set_point = target / 2;
        let median = (fo.completed() > 0)
            .then(|| fo.times.quantile_us(500))
            .flatten()
            .map(Duration::from_micros);
        self.since_probe = self.since_probe.saturating_add(1);
        if let Some(mut probe) = self.probe.take() {
            if probe.settle > Duration::ZERO {
                probe.settle = probe.settle.saturating_sub(interval);
                self.probe = Some(probe);
                return Move::Hold;
            }
            match median {
                Some(m) => {
                    self.floor.reset(m);
                    self.queue = Some(Duration::ZERO);
                    self.pressed = 0;
                    return Move::To(probe.restore, Reason::Probe);
                }
                // Nothing answered yet: wait a little longer, then give up.
                None if probe.waited < QueueLaw::PROBE_WAIT => {
                    probe.waited += 1;
                    self.probe = Some(probe);
                    return Move::Hold;
                }
                None => return Move::To(probe.restore, Reason::Probe),
            }
        }
        self.floor.push(median, !refused);
        let floor = self.floor.get();
        self.queue = median.zip(floor).map(|(m, fl)| m.saturating_sub(fl));
        match (median, floor) {
            (Some(m), Some(fl)) if m.saturating_sub(fl) > set_point => {
                self.pressed += 1;
                if self.pressed >= QueueLaw::PROBE_AFTER
                    && self.since_probe >= QueueLaw::PROBE_SPACING
                {
                    self.since_probe = 0;
                    self.probe = Some(Probe {
                        restore: self.live,
                        settle: (fl + target) * 2,
                        waited: 0,
                    });
                    return Move::To((live / 4).max(1), Reason::Probe);
                }
                let gradient = (fl + set_point).as_secs_f64() / m.as_secs_f64();
                // Cut from what is live now, never from a limit nobody uses.
                let mut to = (self.live.min(live.max(1)) as f64 * gradient).floor() as u64;
                if m.saturating_sub(fl) > target {
                    to = to.min(self.live.saturating_mul(3) / 4);
                }
                Move::To(to, Reason::OverTarget)
            }
            _ if fo.completed() > 0 || live == 0 => {
                self.pressed = 0;
                Move::To(
                    self.live.saturating_add((self.live / 10).max(1)),
                    Reason::Headroom,
                )
            }
            // Live work outstanding and nothing answered: no evidence either way.
            _ => Move::Hold,
        }
    }
}

/// Mode `sip`'s law (see the module's documentation).
#[derive(Clone, Debug)]
pub struct QueueLaw {
    target: Duration,
    min: u64,
    max: u64,
    families: [FamilyLaw; FAMILIES],
    /// How long the server has answered nothing.
    quiet: Duration,
    /// The limit last returned.
    limit: u64,
    /// The class's unit timeout, as last seen.
    timeout: Duration,
}

impl QueueLaw {
    /// Intervals a family's floor looks back over (30 s at the default interval of 100 ms).
    pub const FLOOR_WINDOW: usize = 300;

    /// Intervals in a row over the set point before a family's floor is probed (1 s).
    pub const PROBE_AFTER: usize = 10;

    /// Intervals at least between two probes of a family's floor (30 s).
    pub const PROBE_SPACING: usize = 300;

    /// Intervals a probe waits for an answer once the queue before it is gone.
    pub const PROBE_WAIT: usize = 5;

    /// A law holding each family's queueing delay under `target`, with the class's limit kept
    /// within `min..=max`, starting at `initial`.
    pub fn new(target: Duration, min: u64, max: u64, initial: u64) -> Self {
        let initial = initial.clamp(min, max);
        QueueLaw {
            target,
            min,
            max,
            families: [FamilyLaw::new(initial), FamilyLaw::new(initial)],
            quiet: Duration::ZERO,
            limit: initial,
            timeout: Duration::MAX,
        }
    }

    /// The class's limit now.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Starts from `limit` (an operator's value just released to the controller, or an earlier
    /// controller's): every family's live limit is set to it; floors are kept.
    pub fn reset(&mut self, limit: u64) {
        let limit = limit.clamp(self.min, self.max);
        for f in &mut self.families {
            f.live = limit;
            f.dead = 0;
        }
        self.limit = limit;
    }

    /// The floor of `family`, once learnt.
    pub fn floor(&self, family: Family) -> Option<Duration> {
        self.families[family as usize].floor.get()
    }

    /// The queueing delay of `family` in the last interval that answered it.
    pub fn queue(&self, family: Family) -> Option<Duration> {
        self.families[family as usize].queue
    }

    /// The age past which an outstanding unit of `family` is dead: twice its floor and twice
    /// the target (no unit the law lets queue is that old); the unit timeout before any floor
    /// is known (no evidence that anything is dead).
    pub fn dead_age(&self, family: Family, timeout: Duration) -> Duration {
        self.floor(family)
            .map_or(timeout, |f| (f + self.target) * 2)
            .min(timeout)
    }

    /// Whether the server answers: something of the class was answered within the last unit
    /// timeout (or it was never watched that long).
    pub fn answering(&self) -> bool {
        self.quiet < self.timeout
    }

    /// Units outstanding now that are dead, as last seen.
    pub fn dead(&self) -> u64 {
        self.families.iter().map(|f| f.dead).sum()
    }

    /// The backlog limit of `family`: its live limit and the places its dead units hold,
    /// within the class's bounds.
    pub fn family_limit(&self, family: Family) -> u64 {
        let f = &self.families[family as usize];
        f.live.saturating_add(f.dead).clamp(self.min, self.max)
    }

    /// One interval: the class's new limit if it or a family's limit changed (the decision
    /// says why, for the class's policy and its families alike).
    pub fn step(&mut self, o: &QueueObservation) -> Option<Decision> {
        let before = self.limit;
        let families_before = Family::ALL.map(|f| self.family_limit(f));
        self.timeout = o.timeout;
        if o.completed() > 0 {
            self.quiet = Duration::ZERO;
        } else {
            self.quiet += o.interval;
        }
        let mut reason = None;
        for family in Family::ALL {
            let fo = &o.families[family as usize];
            let dead_age = self.dead_age(family, o.timeout);
            let f = &mut self.families[family as usize];
            f.dead = fo.ages.iter().filter(|a| **a > dead_age).count() as u64;
            let live = fo.ages.len() as u64 - f.dead + fo.unmatched;
            let Move::To(to, why) = f.step(fo, live, o.interval, self.target, o.refused > 0) else {
                continue;
            };
            let to = to.clamp(self.min.min(1), self.max);
            if to != f.live {
                f.live = to;
                // A cut says why before a probe, a probe before a growth.
                let rank = |r: Reason| match r {
                    Reason::OverTarget => 0,
                    Reason::Probe => 1,
                    _ => 2,
                };
                if reason.is_none_or(|r| rank(why) < rank(r)) {
                    reason = Some(why);
                }
            }
        }
        if o.expired > 0 && self.quiet >= o.timeout {
            // Nothing answered for a whole timeout: the server stopped; all work is alike and
            // none of it is dead work.
            for (f, fo) in self.families.iter_mut().zip(&o.families) {
                let outstanding = fo.ages.len() as u64 + fo.unmatched;
                f.live =
                    (f.live.min(outstanding.max(1)).saturating_mul(3) / 4).max(self.min.min(1));
                f.dead = 0;
            }
            reason = Some(Reason::Expired);
        }
        self.limit = Family::ALL
            .iter()
            .map(|f| self.family_limit(*f))
            .fold(0u64, u64::saturating_add)
            .clamp(self.min, self.max);
        let moved = Family::ALL.map(|f| self.family_limit(f)) != families_before;
        (self.limit != before || moved).then(|| Decision {
            limit: self.limit,
            reason: reason.unwrap_or(Reason::DeadWork),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_floor_is_the_lowest_unqueued_median_and_holds_through_an_overload() {
        let mut f = HeldFloor::new(3);
        assert_eq!(f.get(), None);
        f.push(Some(80 * MS), true);
        f.push(Some(75 * MS), true);
        assert_eq!(f.get(), Some(75 * MS));
        // Medians measured while refusing cannot raise it, even once the window forgets.
        for _ in 0..5 {
            f.push(Some(300 * MS), false);
        }
        assert_eq!(f.get(), Some(75 * MS), "held");
        // A lower median lowers it whenever it comes.
        f.push(Some(60 * MS), false);
        assert_eq!(f.get(), Some(60 * MS));
        // Unqueued medians re-sample it once the window forgets the lower one.
        for _ in 0..3 {
            f.push(Some(90 * MS), true);
        }
        assert_eq!(f.get(), Some(90 * MS));
    }

    fn family(times_ms: &[u64], ages_ms: &[u64]) -> FamilyObservation {
        let mut times = ServiceTimes::default();
        for t in times_ms {
            times.record_us(t * 1000);
        }
        FamilyObservation {
            times,
            ages: ages_ms.iter().map(|a| Duration::from_millis(*a)).collect(),
            unmatched: 0,
        }
    }

    fn observe(invite: FamilyObservation, other: FamilyObservation) -> QueueObservation {
        QueueObservation {
            interval: 100 * MS,
            expired: 0,
            timeout: 2000 * MS,
            refused: 0,
            families: [invite, other],
        }
    }

    #[test]
    fn a_server_that_always_takes_150_ms_is_never_cut() {
        let mut law = QueueLaw::new(100 * MS, 1, 10_000, 10_000);
        for _ in 0..50 {
            let o = observe(family(&[150; 8], &[10, 40, 90, 140]), family(&[], &[]));
            assert_ne!(
                law.step(&o).map(|d| d.reason),
                Some(Reason::OverTarget),
                "{law:?}"
            );
        }
        assert_eq!(law.limit(), 10_000);
        assert_eq!(
            law.floor(Family::Invite),
            Some(law.floor(Family::Invite).unwrap())
        );
        let floor = law.floor(Family::Invite).unwrap().as_secs_f64();
        assert!((floor / 0.150 - 1.0).abs() < 0.035, "{floor}");
    }

    #[test]
    fn a_queue_over_the_target_cuts_the_family_by_its_gradient() {
        let mut law = QueueLaw::new(100 * MS, 1, 10_000, 100);
        let ages: Vec<u64> = (0..40).collect();
        law.step(&observe(family(&[5; 20], &[1, 2]), family(&[], &[])));
        let o = observe(family(&[205; 20], &ages), family(&[], &[]));
        let d = law.step(&o).unwrap();
        assert_eq!(d.reason, Reason::OverTarget);
        // 40 live units x (5 + 50) / 205 (10.7), within the histogram's few percent.
        let invite = law.family_limit(Family::Invite);
        assert!((10..=12).contains(&invite), "{invite}");
        assert_eq!(d.limit, invite + law.family_limit(Family::Other));
    }

    #[test]
    fn fast_answers_of_another_method_do_not_move_the_queueing_ones_limit() {
        let mut law = QueueLaw::new(100 * MS, 1, 100_000, 100_000);
        // Floors: INVITE 5 ms, OPTIONS answered on a fast path in under a millisecond.
        for _ in 0..3 {
            law.step(&observe(family(&[5; 20], &[1]), family(&[0; 300], &[0])));
        }
        // INVITEs queue 150 ms; 300 OPTIONS an interval still answered at once.
        let ages: Vec<u64> = (0..30).map(|i| i * 5).collect();
        law.step(&observe(family(&[155; 20], &ages), family(&[0; 300], &[0])));
        // The INVITEs' cut (30 live x 55 / 155), whatever the OPTIONS; theirs keeps growing.
        let invite = law.family_limit(Family::Invite);
        assert!((9..=11).contains(&invite), "{invite} {law:?}");
        assert_eq!(law.family_limit(Family::Other), 100_000);
    }

    #[test]
    fn dead_units_hold_their_places_on_top_of_the_live_limit() {
        let mut law = QueueLaw::new(100 * MS, 1, 10_000, 20);
        law.step(&observe(family(&[5; 20], &[1]), family(&[], &[])));
        // 150 units outstanding for 300 ms to 1.8 s: past twice (5 + 100) ms, dead.
        let mut ages: Vec<u64> = (0..150).map(|i| 300 + i * 10).collect();
        ages.push(3);
        let d = law.step(&observe(family(&[5; 20], &ages), family(&[], &[])));
        assert_eq!(law.dead(), 150);
        assert!(d.is_some());
        assert!(law.limit() >= 150 + 20, "{}", law.limit());
    }
}
