//! One home for the datapath's words that the maps store as numbers: why an arrival was refused,
//! who set a class's limits and why they last changed.
//! Everything above the maps speaks these enums; the numbers exist only where they are stored
//! (a map value's field), written and read through `id` / `from_id`.

/// Why an arrival was refused ([`crate::maps::RejectEvent::reason`]).
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The class's backlog was at its limit (also: nothing to judge, or no response could
    /// ever complete it).
    Backlog = 1,
    /// The class's rate limit had no room.
    Rate = 2,
    /// The pending table that would hold the unit is full (counted with the backlog drops, and
    /// in [`crate::maps::DatapathCounters::pending_full`]).
    Full = 3,
}

impl Refusal {
    /// Every refusal, by id order.
    pub const ALL: [Refusal; 3] = [Refusal::Backlog, Refusal::Rate, Refusal::Full];

    /// Its id, as stored.
    #[inline(always)]
    pub const fn id(self) -> u8 {
        self as u8
    }

    /// The refusal of id `id`.
    pub const fn from_id(id: u8) -> Option<Refusal> {
        match id {
            1 => Some(Refusal::Backlog),
            2 => Some(Refusal::Rate),
            3 => Some(Refusal::Full),
            _ => None,
        }
    }

    /// Its name, as logs spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Refusal::Backlog => "backlog",
            Refusal::Rate => "rate",
            Refusal::Full => "pending-table-full",
        }
    }
}

/// Who set a class's limits ([`crate::maps::ClassPolicy::owner`]).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The configuration (at start or reload).
    Config = 0,
    /// An operator, through the CLI.
    Operator = 1,
    /// The daemon's controller.
    Controller = 2,
}

impl Owner {
    /// Its id, as stored.
    #[inline(always)]
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The owner of id `id`.
    pub const fn from_id(id: u32) -> Option<Owner> {
        match id {
            0 => Some(Owner::Config),
            1 => Some(Owner::Operator),
            2 => Some(Owner::Controller),
            _ => None,
        }
    }

    /// Its name, as `policy show`, the JSON outputs and the metrics spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Owner::Config => "config",
            Owner::Operator => "operator",
            Owner::Controller => "controller",
        }
    }

    /// The name of the owner of id `id`; "unknown" for an id no build wrote.
    pub const fn name_of(id: u32) -> &'static str {
        match Owner::from_id(id) {
            Some(o) => o.name(),
            None => "unknown",
        }
    }
}

/// Why a class's limits last changed ([`crate::maps::ClassPolicy::reason`]): a setting, or a
/// move of the daemon's controller and the law behind it.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// Set by the configuration or an operator.
    Set = 0,
    /// The service time went over the target: the limit is cut to the backlog that meets it.
    OverTarget = 1,
    /// Admitted units expired unanswered: the server is not keeping up.
    Expired = 2,
    /// The service time is under the target: the limit grows by a tenth (or 1).
    Headroom = 3,
    /// The CPU budget left after resumed handshakes, divided by a full handshake's cost.
    Budget = 4,
    /// The delay ratio between two classes moved away from its set point.
    Ratio = 5,
    /// The controller took the class over, at its law's starting limit.
    Start = 6,
    /// Resumed handshakes waited longer than allowed beyond their unqueued time: new
    /// handshakes are cut to make room for them.
    ResumedWait = 7,
    /// New handshakes closed for one interval to measure resumed ones unqueued, or reopened
    /// after it.
    Probe = 8,
    /// The server passed over admitted units (dead work: requests it discarded or will never
    /// answer): the places they hold until their timeout are given on top of the limit for
    /// live work, which did not move.
    DeadWork = 9,
}

impl Reason {
    /// Every reason, by id order.
    pub const ALL: [Reason; 10] = [
        Reason::Set,
        Reason::OverTarget,
        Reason::Expired,
        Reason::Headroom,
        Reason::Budget,
        Reason::Ratio,
        Reason::Start,
        Reason::ResumedWait,
        Reason::Probe,
        Reason::DeadWork,
    ];

    /// Its id, as stored.
    #[inline(always)]
    pub const fn id(self) -> u32 {
        self as u32
    }

    /// The reason of id `id`.
    pub fn from_id(id: u32) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.id() == id)
    }

    /// Its name, as `policy show`, the logs and the metrics spell it.
    pub const fn name(self) -> &'static str {
        match self {
            Reason::Set => "set",
            Reason::OverTarget => "over-target",
            Reason::Expired => "expired",
            Reason::Headroom => "headroom",
            Reason::Budget => "budget",
            Reason::Ratio => "ratio",
            Reason::Start => "start",
            Reason::ResumedWait => "resumed-wait",
            Reason::Probe => "probe",
            Reason::DeadWork => "dead-work",
        }
    }

    /// The name of the reason of id `id`; "unknown" for an id no build wrote.
    pub fn name_of(id: u32) -> &'static str {
        Reason::from_id(id).map_or("unknown", Reason::name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_id_reads_back_as_itself_and_no_other_id_reads() {
        for r in Refusal::ALL {
            assert_eq!(Refusal::from_id(r.id()), Some(r));
        }
        assert_eq!(Refusal::from_id(0), None);
        assert_eq!(Refusal::from_id(4), None);
        for r in Reason::ALL {
            assert_eq!(Reason::from_id(r.id()), Some(r));
        }
        assert_eq!(Reason::name_of(10), "unknown");
        for o in [Owner::Config, Owner::Operator, Owner::Controller] {
            assert_eq!(Owner::from_id(o.id()), Some(o));
        }
        assert_eq!(Owner::name_of(3), "unknown");
    }

    #[test]
    fn the_stored_ids_are_the_ones_earlier_builds_wrote() {
        // Pinned maps outlive a build: a policy written by an older daemon must read the same.
        assert_eq!(
            (
                Refusal::Backlog.id(),
                Refusal::Rate.id(),
                Refusal::Full.id()
            ),
            (1, 2, 3)
        );
        assert_eq!(
            (
                Owner::Config.id(),
                Owner::Operator.id(),
                Owner::Controller.id()
            ),
            (0, 1, 2)
        );
        assert_eq!((Reason::Start.id(), Reason::DeadWork.id()), (6, 9));
    }
}
