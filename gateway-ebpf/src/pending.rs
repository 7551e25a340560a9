//! Admitted units of work that have not ended: one entry per TLS connection (`TLS_PENDING`) or
//! SIP request (`SIP_PENDING`), in hash maps that are not LRU, so no other traffic can evict
//! them. A unit ends exactly once, by whoever deletes its entry:
//!
//! - it completes when the server's answer leaves the host ([`complete`], from the egress
//!   program): only the server's work releases a slot, never a packet from the client side;
//! - or it expires when its class's timeout passes first ([`sweep_if_due`], from the admission
//!   path, with no daemon involved): a table's pass is due when the earliest unit it may find
//!   expired is, and at most every `SWEEP_INTERVAL_NS`. A pass over a table costs its buckets
//!   whatever it holds (about 0.8 ms for 65,536 here), so a table whose units the server answers
//!   is walked once per timeout, not ten times a second per class.
//!
//! The deleter counts the end (`completed` or `expired` in `CLASS_STATE`), so the backlog,
//! `admitted - completed - expired`, stays exact under any interleaving of CPUs. A full table
//! refuses new work and keeps the work it holds.
// Map keys and values go by reference, as in the TLS module (the BPF stack is 512 bytes).
#![allow(clippy::needless_borrows_for_generic_args)]

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    btf_maps::{Array, HashMap, PerCpuArray},
    helpers::generated::{bpf_for_each_map_elem, bpf_map_delete_elem},
    macros::btf_map,
};
use gateway_common::{
    Class, NUM_CLASSES,
    maps::{
        FlowKey, LATENCY_BUCKETS, LatencyHistogram, MAX_HOLD_NS, MAX_PENDING, PENDING_ANSWERED,
        PENDING_INVITE, PENDING_KEY_EXCHANGE, Pending, SERVICE_BUCKETS, SERVICE_SLOTS,
        SIP_FAMILIES_LEN, SLOT_SIP_INVITE, SWEEP_INTERVAL_NS, ServiceTimes, SipFamily,
        pending_counted, sip_family,
    },
    reasons::Refusal,
    tls::KEY_LEN,
};

use crate::{
    admission::{self, admission},
    bytes::{opaque, zero},
    resume,
    sync::{atomic_add, now_ns},
};

/// A pending table: admitted units that have not ended.
pub type Table<K> = HashMap<K, Pending, { MAX_PENDING as usize }>;

/// Admitted TLS connections the server has not answered yet.
#[btf_map]
pub static TLS_PENDING: Table<FlowKey> = Table::new();

/// Admitted SIP requests the server has not answered yet, by unit key.
#[btf_map]
pub static SIP_PENDING: Table<u64> = Table::new();

/// Per-class service-time histograms (admission to first response), per CPU.
#[btf_map]
pub static SERVICE_LATENCY: PerCpuArray<LatencyHistogram, NUM_CLASSES> = PerCpuArray::new();

/// Per-slot fine service-time histograms (admission to first response), per CPU: a slot per
/// class, and `sip-original`'s INVITEs in a slot of their own (`SLOT_SIP_INVITE`).
#[btf_map]
pub static SERVICE_TIMES: PerCpuArray<ServiceTimes, SERVICE_SLOTS> = PerCpuArray::new();

/// `sip-original`'s units by method family: their backlogs.
#[btf_map]
pub static SIP_FAMILIES: Array<SipFamily, { SIP_FAMILIES_LEN as usize }> = Array::new();

/// The backlog limit of each of `sip-original`'s method families (0: none), set by the
/// controller.
#[btf_map]
pub static SIP_FAMILY_LIMITS: Array<u64, { SIP_FAMILIES_LEN as usize }> = Array::new();

/// Admits the unit `key` of `class` against the class's own limits (and, for `sip-original`,
/// its method family's: `SIP_FAMILIES`) and holds it, or says why not ([`Refusal::Full`] when
/// the table is full). `offer` is the issued key whose
/// place a `tls-resumed` unit holds (`crate::resume`), given back when the unit ends; `None`
/// for any other unit. `flags`: `PENDING_*`. A refused unit holds nothing: the caller gives
/// the place back.
#[inline(always)]
pub fn admit<K>(
    table: &Table<K>,
    key: &K,
    class: Class,
    offer: Option<&[u8; KEY_LEN]>,
    flags: u32,
) -> Result<(), Refusal> {
    let now = sweep_if_due(class);
    admission(class, class, now)?;
    if class == Class::SipOriginal {
        let family = sip_family(flags);
        if let (Some(f), Some(limit)) =
            (SIP_FAMILIES.get_ptr(family), SIP_FAMILY_LIMITS.get(family))
        {
            // SAFETY: counters only ever changed by atomic adds; plain loads.
            let counts = unsafe { core::ptr::read_volatile(f) };
            if !counts.has_room(*limit) {
                return Err(Refusal::Backlog);
            }
        }
    }
    if hold(table, key, class, offer, flags, now) {
        Ok(())
    } else {
        Err(Refusal::Full)
    }
}

/// Whether one arrival may be admitted under `policy_of`'s limits against `backlog_of`'s backlog
/// (`crate::admission::admission`), once the expired units of `backlog_of` are released (when
/// its sweep is due). For arrivals that hold no unit of their own (SIP retransmissions and
/// exempt requests); [`admit`] holds one.
#[inline(always)]
pub fn admit_against(policy_of: Class, backlog_of: Class) -> Result<(), Refusal> {
    let now = sweep_if_due(backlog_of);
    admission(policy_of, backlog_of, now)
}

/// Holds the unit `key` of `class`, admitted now, and counts its admission. `false` when the
/// table is full (the unit is not admitted). A stale unit under the same key (a client that
/// reused its port before the server answered the old connection) ends as expired first.
#[inline(always)]
fn hold<K>(
    table: &Table<K>,
    key: &K,
    class: Class,
    offer: Option<&[u8; KEY_LEN]>,
    flags: u32,
    now: u64,
) -> bool {
    let timeout = admission::timeout(class);
    // Built field by field on zero words: a struct literal with a zero offer compiled to a
    // call of a byte-at-a-time memset.
    let mut unit = core::mem::MaybeUninit::<Pending>::uninit();
    // SAFETY: zeroed whole first, which is a valid Pending.
    let unit = unsafe {
        zero(unit.as_mut_ptr());
        unit.assume_init_mut()
    };
    unit.admitted_ns = now;
    unit.deadline_ns = now.saturating_add(timeout);
    unit.class = class.id();
    unit.flags = flags;
    if let Some(offer) = offer {
        unit.offer = *offer;
    }
    let unit = &*unit;
    if table.insert(key, unit, u64::from(BPF_NOEXIST)).is_err()
        && (end(table, key, Field::Expired).is_none()
            || table.insert(key, unit, u64::from(BPF_NOEXIST)).is_err())
    {
        return false;
    }
    sweep_by(class, now, timeout);
    // A key exchange's unit continues one admitted before.
    let field = if flags & PENDING_KEY_EXCHANGE != 0 {
        Field::Continued
    } else {
        Field::Admitted
    };
    count(class.id(), field);
    count_family(unit, field);
    true
}

/// Counts a `sip-original` unit's admission or end in its method family (`SIP_FAMILIES`).
#[inline(always)]
fn count_family(unit: &Pending, field: Field) {
    if unit.class != Class::SipOriginal.id() {
        return;
    }
    if let Some(f) = SIP_FAMILIES.get_ptr_mut(sip_family(unit.flags)) {
        // SAFETY: shared counters, only ever changed by atomic adds.
        unsafe {
            match field {
                Field::Admitted | Field::Continued => atomic_add(&raw mut (*f).admitted, 1),
                Field::Completed | Field::Expired => atomic_add(&raw mut (*f).ended, 1),
            }
        }
    }
}

/// The unit `key` was answered by the server: it completes (counted in its class), and, when
/// `timed`, its service time, admission to the server's answer, goes into its class's
/// histograms (`SERVICE_LATENCY`, and `SERVICE_TIMES` by its slot): an answer that is no
/// measure of the work (a TLS server's alert, or its close) ends the unit untimed. Returns it, or `None` when there was no such unit (never admitted, or
/// already ended). What else it held is the caller's to give back or keep (a resumed
/// connection's place of its issued key).
#[inline(always)]
pub fn complete<K>(table: &Table<K>, key: &K, timed: bool) -> Option<Pending> {
    let unit = end(table, key, Field::Completed)?;
    if timed {
        record_time(&unit);
    }
    Some(unit)
}

/// The server answered the `tls-new` unit `unit` with the first flight of a TLS 1.2 full
/// handshake, on a port whose sessions the NIC learns: the unit completes for its class now
/// (counted and timed: the server's answer is what frees a place, however long the client
/// takes), and its entry stays, flagged [`PENDING_ANSWERED`], only to carry what the server's
/// second flight will confirm (`crate::tls::answer`); its end there, at the close or at its
/// timeout is uncounted ([`pending_counted`]).
///
/// # Safety
/// `unit` points at a live entry of `TLS_PENDING`, touched only by its connection's packets.
#[inline(always)]
pub unsafe fn answer_and_keep(unit: *mut Pending) {
    // SAFETY: upheld by the caller.
    let (class, flags) = unsafe { ((*unit).class, (*unit).flags) };
    if flags & PENDING_ANSWERED != 0 {
        return;
    }
    // SAFETY: as above.
    unsafe { (*unit).flags = flags | PENDING_ANSWERED };
    count(class, Field::Completed);
    // SAFETY: as above; read only.
    record_time(unsafe { &*unit });
}

/// The client's key exchange of the TLS 1.2 full handshake `key` arrived: the server's second
/// piece of work is a `tls-new` unit ([`PENDING_KEY_EXCHANGE`]), admitted without a limit and
/// counted. The entry the first flight kept (on a learning port) becomes it; otherwise one is
/// made (nothing when the table is full).
#[inline(always)]
pub fn key_exchange(key: &FlowKey) {
    let now = now_ns();
    if let Some(unit) = TLS_PENDING.get_ptr_mut(key) {
        // SAFETY: a live entry of this connection, touched only by its packets.
        unsafe {
            let flags = (*unit).flags;
            if flags & PENDING_ANSWERED != 0 && flags & PENDING_KEY_EXCHANGE == 0 {
                (*unit).flags = flags | PENDING_KEY_EXCHANGE;
                (*unit).admitted_ns = now;
                let timeout = admission::timeout(Class::TlsNew);
                (*unit).deadline_ns = now.saturating_add(timeout);
                count((*unit).class, Field::Continued);
                sweep_by(Class::TlsNew, now, timeout);
            }
        }
        return;
    }
    hold(
        &TLS_PENDING,
        key,
        Class::TlsNew,
        None,
        PENDING_KEY_EXCHANGE,
        now,
    );
}

/// Records how long the server took to answer `unit` (now, since it was admitted) in its
/// class's latency histogram and its service-time slot.
#[inline(always)]
pub fn record_time(unit: &Pending) {
    let took = now_ns().saturating_sub(unit.admitted_ns);
    if let Some(h) = SERVICE_LATENCY.get_ptr_mut(unit.class) {
        let bucket = LatencyHistogram::bucket(took);
        // SAFETY: per-CPU slot.
        unsafe { (*h).buckets[bucket & (LATENCY_BUCKETS - 1)] += 1 };
    }
    let slot = if unit.flags & PENDING_INVITE != 0 {
        SLOT_SIP_INVITE
    } else {
        unit.class
    };
    // The bound checked on the register the index is read with (LLVM folds the bucket's own
    // bound into its arithmetic, where the verifier cannot follow it).
    let bucket = opaque(ServiceTimes::bucket(took) as u64);
    if bucket < SERVICE_BUCKETS as u64
        && let Some(h) = SERVICE_TIMES.get_ptr_mut(slot)
    {
        // SAFETY: per-CPU slot; `bucket` is under the array's length.
        unsafe { (*h).buckets[bucket as usize] += 1 };
    }
}

/// Which counter of `ClassState` an event adds to.
#[derive(Clone, Copy)]
enum Field {
    Admitted,
    /// Held as what an admitted unit went on to ([`PENDING_KEY_EXCHANGE`]).
    Continued,
    Completed,
    Expired,
}

/// Ends the unit `key`, counting it in `field` of its class, if this call is the one that
/// deletes it.
#[inline(always)]
fn end<K>(table: &Table<K>, key: &K, field: Field) -> Option<Pending> {
    // SAFETY: a copy of the value is taken before the entry goes.
    let unit = unsafe { *table.get_ptr(key)? };
    table.remove(key).ok()?;
    if !pending_counted(&unit) {
        return Some(unit);
    }
    count(unit.class, field);
    count_family(&unit, field);
    // A completed unit's caller decides what its place becomes (a resumed connection the
    // server answered holds it until it ends: `resume::hold_open`).
    if !matches!(field, Field::Completed) {
        release(&unit);
    }
    Some(unit)
}

/// Gives back what an ended unit held besides its class's place: a resumed connection's place
/// of its issued key.
#[inline(always)]
fn release(unit: &Pending) {
    if unit.class == Class::TlsResumed.id() {
        resume::give_back(&unit.offer);
    }
}

#[inline(always)]
fn count(class: u32, field: Field) {
    if let Some(st) = admission::state(class) {
        // SAFETY: shared counters, only ever changed by atomic adds.
        unsafe {
            match field {
                Field::Admitted => atomic_add(&raw mut (*st).admitted, 1),
                Field::Continued => atomic_add(&raw mut (*st).continued, 1),
                Field::Completed => atomic_add(&raw mut (*st).completed, 1),
                Field::Expired => atomic_add(&raw mut (*st).expired, 1),
            }
        }
    }
}

/// What one pass of a sweep walks, and where its schedule is kept: a class's `sweep_ns` in
/// `CLASS_STATE` (a field every class has; these three are the only ones read).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
enum Swept {
    /// `TLS_PENDING`, both TLS classes' units: the schedule is `tls-new`'s.
    TlsUnits = 0,
    /// `TLS_HOLDS`: the schedule is `tls-flow`'s (a class that holds no units; a build before
    /// these schedules never reads it, so a downgrade finds nothing odd there).
    Holds = 1,
    /// `SIP_PENDING`, `sip-original`'s units: the schedule is `sip-original`'s.
    SipUnits = 2,
}

impl Swept {
    #[inline(always)]
    fn from_id(id: u32) -> Option<Self> {
        match id {
            0 => Some(Self::TlsUnits),
            1 => Some(Self::Holds),
            2 => Some(Self::SipUnits),
            _ => None,
        }
    }

    /// The table of `class`'s units, whose pass its arrivals run (`None`: a class that holds
    /// none and sweeps none).
    #[inline(always)]
    fn of(class: Class) -> Option<Self> {
        match class {
            Class::TlsNew | Class::TlsResumed => Some(Self::TlsUnits),
            Class::SipOriginal | Class::SipRetransmission => Some(Self::SipUnits),
            _ => None,
        }
    }

    /// The schedule: the `sweep_ns` of the class that keeps it.
    #[inline(always)]
    fn schedule(self) -> Option<*mut u64> {
        let class = match self {
            Self::TlsUnits => Class::TlsNew,
            Self::Holds => Class::TlsFlow,
            Self::SipUnits => Class::SipOriginal,
        };
        // SAFETY: a field of a live map value.
        admission::state(class.id()).map(|st| unsafe { &raw mut (*st).sweep_ns })
    }

    /// How long after a pass's start an entry held during the pass lives at least: the next
    /// pass is never due later (such an entry did not bring it forward, [`sweep_by`]).
    #[inline(always)]
    fn bound(self) -> u64 {
        let at_least = |class| admission::timeout(class).max(SWEEP_INTERVAL_NS);
        match self {
            Self::TlsUnits => at_least(Class::TlsNew).min(at_least(Class::TlsResumed)),
            Self::Holds => MAX_HOLD_NS,
            Self::SipUnits => at_least(Class::SipOriginal),
        }
    }
}

/// Releases the expired units an arrival of `class` may meet when their table's pass is due:
/// both TLS classes' arrivals the TLS units, SIP arrivals the SIP units (an offer's place is
/// taken after [`sweep_holds_if_due`] too). Two CPUs may sweep at once; each unit is still
/// counted once, by the CPU whose delete succeeds. Returns the time now: the one clock read
/// the arrival's admission goes by (read again after a pass, which takes a while).
///
/// A table's next pass is due at the earliest deadline its last pass left there, but never
/// later than the table's [`Swept::bound`] from that pass's start, and never sooner than
/// `SWEEP_INTERVAL_NS`. A unit held later brings it forward to its own deadline
/// ([`sweep_by`]).
#[inline(always)]
pub fn sweep_if_due(class: Class) -> u64 {
    match Swept::of(class) {
        Some(table) => sweep_table_if_due(table),
        None => now_ns(),
    }
}

/// Releases the holds past [`MAX_HOLD_NS`] when their pass is due (hourly), before an offer
/// counts the places of its key that holds take.
#[inline(always)]
pub fn sweep_holds_if_due() {
    sweep_table_if_due(Swept::Holds);
}

/// [`sweep_if_due`] for one table.
#[inline(always)]
fn sweep_table_if_due(table: Swept) -> u64 {
    let now = now_ns();
    let Some(due) = table.schedule() else {
        return now;
    };
    // SAFETY: a plain schedule; a racing CPU at worst sweeps once more.
    unsafe {
        if core::ptr::read_volatile(due) > now {
            return now;
        }
        core::ptr::write_volatile(due, now + SWEEP_INTERVAL_NS);
    }
    gateway_sweep_pass(table as u32, now)
}

/// The pass over a table that is due (`Swept` id `table`, claimed at `now`), and the schedule
/// of the next ([`sweep_if_due`]); returns the time after it. A global function, which the
/// verifier checks once, on its own, rather than at every admission it is inlined in.
#[unsafe(no_mangle)]
#[inline(never)]
pub extern "C" fn gateway_sweep_pass(table: u32, now: u64) -> u64 {
    let Some(table) = Swept::from_id(table) else {
        return now_ns();
    };
    let earliest = sweep(table, now);
    // Read after the pass: a timeout the daemon shortened meanwhile is the one new units get.
    let latest = now.saturating_add(table.bound());
    let next = earliest.min(latest).max(now + SWEEP_INTERVAL_NS);
    // SAFETY: a plain schedule; left as it is when a unit brought it forward meanwhile.
    if let Some(due) = table.schedule() {
        unsafe {
            if core::ptr::read_volatile(due) == now + SWEEP_INTERVAL_NS {
                core::ptr::write_volatile(due, next);
            }
        }
    }
    now_ns()
}

/// A unit of `class` was held `now` with a deadline `timeout` away: brings its table's next
/// pass forward to that deadline (but no sooner than `SWEEP_INTERVAL_NS` from now), so that it
/// ends at most that interval late, at the next arrival of a class that sweeps the table.
/// Units of one class share a timeout, so after the first this is a read. (A hold needs none:
/// it lives [`MAX_HOLD_NS`], the holds' [`Swept::bound`].)
#[inline(always)]
fn sweep_by(class: Class, now: u64, timeout: u64) {
    let Some(schedule) = Swept::of(class).and_then(Swept::schedule) else {
        return;
    };
    let due = now.saturating_add(timeout.max(SWEEP_INTERVAL_NS));
    // SAFETY: a plain schedule; a racing write of another unit is as early, within the clocks'
    // skew, or of a unit of the other TLS class's timeout (the schedule's lag is then bounded
    // by the table's bound from its last pass).
    unsafe {
        if core::ptr::read_volatile(schedule) > due {
            core::ptr::write_volatile(schedule, due);
        }
    }
}

/// Releases every expired unit and hold now, whatever the schedules (the daemon's sweep
/// program, after it marked the units and holds whose connection is gone).
#[inline(always)]
pub fn sweep_now() {
    let now = now_ns();
    sweep(Swept::Holds, now);
    sweep(Swept::TlsUnits, now);
    sweep(Swept::SipUnits, now);
}

/// What a sweep's callbacks share: the time of the pass, and the earliest deadline of the
/// entries it leaves.
#[repr(C)]
pub struct Pass {
    /// `bpf_ktime_get_ns` at the pass's start.
    pub now: u64,
    /// The earliest deadline of an entry left (`u64::MAX`: none).
    pub earliest: u64,
}

/// One pass over `table`; returns the earliest deadline it left (`u64::MAX` if none).
#[inline(always)]
fn sweep(table: Swept, now: u64) -> u64 {
    let mut pass = Pass {
        now,
        earliest: u64::MAX,
    };
    let (map, callback) = match table {
        Swept::Holds => {
            resume::sweep_holds(&mut pass);
            return pass.earliest;
        }
        Swept::TlsUnits => (
            (&raw const TLS_PENDING).cast_mut().cast::<c_void>(),
            expire::<FlowKey> as *mut c_void,
        ),
        Swept::SipUnits => (
            (&raw const SIP_PENDING).cast_mut().cast::<c_void>(),
            expire::<u64> as *mut c_void,
        ),
    };
    // SAFETY: `expire` has the callback signature the helper expects; `pass` outlives the call.
    unsafe {
        bpf_for_each_map_elem(map, callback, (&raw mut pass).cast(), 0);
    }
    pass.earliest
}

/// One entry of a sweep (a `bpf_for_each_map_elem` callback): past its deadline, the unit ends
/// as expired. Returns 0 to go on.
#[inline(never)]
extern "C" fn expire<K>(
    map: *mut c_void,
    key: *mut K,
    unit: *mut Pending,
    pass: *mut c_void,
) -> i64 {
    let pass = pass.cast::<Pass>();
    // SAFETY: the helper passes a live entry and the caller's pass.
    let (deadline, now) = unsafe { ((*unit).deadline_ns, (*pass).now) };
    if deadline >= now {
        // SAFETY: as above.
        unsafe {
            if deadline < (*pass).earliest {
                (*pass).earliest = deadline;
            }
        }
    } else {
        // SAFETY: a copy is taken before the entry goes; deleting the entry being visited is
        // allowed for hash maps.
        let ended = unsafe { *unit };
        if unsafe { bpf_map_delete_elem(map, key.cast()) } == 0 {
            // An answered unit kept for what the server's second flight confirms was counted
            // when answered; it ends uncounted.
            if pending_counted(&ended) {
                count(ended.class, Field::Expired);
                count_family(&ended, Field::Expired);
                release(&ended);
            }
        }
    }
    0
}
