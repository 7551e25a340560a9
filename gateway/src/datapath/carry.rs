//! Carrying the state of a pinned map over to a build whose value layout grew.
//!
//! A release may add fields to a map's value (a counter, a field of a unit's entry). Its maps
//! then differ from the ones an older build pinned, and adopting those as they are would let the
//! new programs misread every value. So the new build's map is made beside the pinned one (at a
//! staging pin), every entry copied in and converted (each field the two layouts share moved to
//! where this build keeps it, the added ones zero), and the programs replaced through their links
//! so that they run on the new map. The older programs go on writing the older map until then;
//! once the kernel says no run of them is left (an RCU grace period, `membarrier`), a second pass
//! brings in what they changed meanwhile, and the new map takes the pin's name. Nothing of the
//! older map is read after that: it goes when its last program does.
//!
//! What the second pass does with an entry both programs wrote in the few milliseconds of the
//! switch: a per-CPU map holds counters, which add up (this build's count plus what the older
//! programs counted since the first pass; an increment landing between the read and the write
//! of one CPU's entry there is lost); any other entry keeps what the newer program wrote, and
//! is counted as a conflict.
//!
//! What is not carried over is refused before anything changes, naming the map and the field:
//! a key whose layout changed, a value field this build drops or retypes, a map of another type.

use std::{
    collections::{HashMap, HashSet},
    io,
    os::fd::OwnedFd,
    path::PathBuf,
};

use thiserror::Error;

use crate::{datapath::bpfsys, datapath::btf::Field, datapath::pins::PinDir};

/// Where a map's new copy is pinned until it takes the map's name: `carry-<NAME>` (bpffs
/// refuses names with a dot).
const STAGING_PREFIX: &str = "carry-";

/// Errors of carrying a map over.
#[derive(Debug, Error)]
pub enum CarryError {
    /// A map operation failed.
    #[error("carrying {map} over: {what}: {source}")]
    Io {
        /// Map name.
        map: &'static str,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// This build's map is of another kind than the pinned one.
    #[error(
        "pinned map {map} is a map of type {found}, this build's of type {expected}: detach the \
         interface first (its counters and policy go with it) to move to this version's maps"
    )]
    MapType {
        /// Map name.
        map: &'static str,
        /// The pinned map's `BPF_MAP_TYPE_*`.
        found: u32,
        /// This build's.
        expected: u32,
    },
}

/// How a value of the pinned layout becomes one of this build's: the bytes of every field the
/// two share, moved to where this build has it; the fields only this build has start at zero.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Conversion {
    moves: Vec<Move>,
    added: Vec<String>,
    old_size: usize,
    new_size: usize,
}

/// One field's bytes: `len` of them from `from` in the pinned value to `to` in this build's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Move {
    from: usize,
    to: usize,
    len: usize,
}

impl Conversion {
    /// The conversion of values laid out as `found` (`old_size` bytes, the pinned map's) into
    /// values laid out as `expected` (`new_size` bytes, this build's), or why there is none: a
    /// field this build does not have, or has as another type, would lose or misread state.
    pub fn plan(
        found: &[Field],
        expected: &[Field],
        old_size: usize,
        new_size: usize,
    ) -> Result<Conversion, String> {
        let mut moves = Vec::with_capacity(found.len());
        for have in found {
            let Some(want) = expected.iter().find(|w| w.path == have.path) else {
                return Err(format!("it has {have}, which this build does not have"));
            };
            if want.kind != have.kind {
                return Err(format!("it has {have} where this build has {want}"));
            }
            let (Some(from), Some(to)) = (have.byte, want.byte) else {
                return Err(format!(
                    "it has {have}, a bitfield, which is not carried over"
                ));
            };
            let (from, to, len) = (from as usize, to as usize, have.size as usize);
            if from + len > old_size || to + len > new_size {
                return Err(format!("it has {have}, which lies past its value"));
            }
            moves.push(Move { from, to, len });
        }
        let added = expected
            .iter()
            .filter(|w| !found.iter().any(|h| h.path == w.path))
            .map(|w| w.path.clone())
            .collect();
        Ok(Conversion {
            moves,
            added,
            old_size,
            new_size,
        })
    }

    /// The fields this build adds (they start at zero).
    pub fn added(&self) -> &[String] {
        &self.added
    }

    /// Whether every field moves as whole 64-bit words, as the counters of a per-CPU map do.
    fn in_words(&self) -> bool {
        self.moves
            .iter()
            .all(|m| m.from % 8 == 0 && m.to % 8 == 0 && m.len % 8 == 0)
    }

    /// `old` (a pinned value) as this build's value, into `new` (zeroed first).
    fn convert(&self, old: &[u8], new: &mut [u8]) {
        new.fill(0);
        for m in &self.moves {
            new[m.to..m.to + m.len].copy_from_slice(&old[m.from..m.from + m.len]);
        }
    }

    /// Adds to `new` (this build's value) what the pinned value's counters grew by from
    /// `before` to `after`, word by word ([`Conversion::in_words`]).
    fn add_growth(&self, before: &[u8], after: &[u8], new: &mut [u8]) {
        let word = |b: &[u8], at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
        for m in &self.moves {
            for i in (0..m.len).step_by(8) {
                let grown = word(after, m.from + i).wrapping_sub(word(before, m.from + i));
                let sum = word(new, m.to + i).wrapping_add(grown);
                new[m.to + i..m.to + i + 8].copy_from_slice(&sum.to_ne_bytes());
            }
        }
    }
}

/// A pinned map whose value this build lays out otherwise, and how its values convert.
#[derive(Clone, Debug)]
pub struct Grown {
    /// Map name.
    pub map: &'static str,
    /// Bytes of its key (the same in both builds).
    pub key_size: usize,
    /// How its values convert.
    pub conversion: Conversion,
}

/// What carrying one map over did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Carried {
    /// Map name.
    pub map: &'static str,
    /// Entries copied by the first pass.
    pub entries: usize,
    /// Entries the older programs changed during the switch, brought in by the second pass.
    pub changed_meanwhile: usize,
    /// Entries both builds' programs wrote during the switch, where the newer one's value was
    /// kept.
    pub conflicts: usize,
    /// The fields this build added, zero in every entry carried.
    pub added: Vec<String>,
}

impl std::fmt::Display for Carried {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "carried {} over to this build's layout: {} entries",
            self.map, self.entries
        )?;
        if !self.added.is_empty() {
            write!(f, ", with {} added at zero", self.added.join(", "))?;
        }
        write!(
            f,
            "; {} changed during the switch, {} kept as the new program wrote them",
            self.changed_meanwhile, self.conflicts
        )
    }
}

/// One map on its way over: the pinned map and this build's copy at its staging pin.
struct InFlight {
    grown: Grown,
    target: PathBuf,
    staging: PathBuf,
    old: OwnedFd,
    old_type: u32,
    max_entries: u32,
    /// The older map's raw values as the first pass read them.
    first: HashMap<Vec<u8>, Vec<u8>>,
    /// The values the first pass wrote into the new map, by key.
    entries: usize,
}

/// The maps of one upgrade being carried over ([`Carry::begin`], [`Carry::copy`], then, once
/// the programs were replaced, [`Carry::finish`]). Dropped before `finish`, it removes the
/// staging pins: the pinned maps were not touched.
pub struct Carry {
    maps: Vec<InFlight>,
    cpus: usize,
    finished: bool,
}

fn io_err(map: &'static str, what: &'static str) -> impl FnOnce(io::Error) -> CarryError {
    move |source| CarryError::Io { map, what, source }
}

/// Bytes of one value as the `bpf(2)` element commands pass it: per-CPU maps one per possible
/// CPU, each rounded up to 8 bytes.
fn value_bytes(size: usize, per_cpu: bool, cpus: usize) -> usize {
    if per_cpu {
        size.next_multiple_of(8) * cpus
    } else {
        size
    }
}

impl Carry {
    /// Starts carrying `grown` over from the pins of `pd`: opens each pinned map and clears
    /// its staging pin of anything an interrupted earlier attempt left.
    pub fn begin(pd: &PinDir, grown: Vec<Grown>) -> Result<Carry, CarryError> {
        let cpus = aya::util::nr_cpus().map_err(|(_, e)| CarryError::Io {
            map: "every map",
            what: "counting the possible CPUs",
            source: e,
        })?;
        let mut maps = Vec::with_capacity(grown.len());
        for g in grown {
            let map = g.map;
            let target = pd.map(map);
            let staging = pd.map(&format!("{STAGING_PREFIX}{map}"));
            let _ = std::fs::remove_file(&staging);
            let old = bpfsys::obj_get(&target).map_err(io_err(map, "opening its pin"))?;
            let shape = bpfsys::map_shape(&target).map_err(io_err(map, "reading its shape"))?;
            maps.push(InFlight {
                grown: g,
                target,
                staging,
                old,
                old_type: shape.map_type,
                max_entries: shape.max_entries,
                first: HashMap::new(),
                entries: 0,
            });
        }
        Ok(Carry {
            maps,
            cpus,
            finished: false,
        })
    }

    /// Whether there is anything to carry over.
    pub fn is_empty(&self) -> bool {
        self.maps.is_empty()
    }

    /// Where the loader pins this build's copy of each map carried over, by map name.
    pub fn staging_pins(&self) -> impl Iterator<Item = (&'static str, &std::path::Path)> {
        self.maps.iter().map(|m| (m.grown.map, m.staging.as_path()))
    }

    /// The first pass, once the loader made this build's maps at their staging pins: every
    /// entry of each pinned map, converted, into this build's map.
    pub fn copy(&mut self) -> Result<(), CarryError> {
        let cpus = self.cpus;
        for m in &mut self.maps {
            let map = m.grown.map;
            let new = bpfsys::obj_get(&m.staging).map_err(io_err(map, "opening its new copy"))?;
            let shape =
                bpfsys::map_shape(&m.staging).map_err(io_err(map, "reading its new shape"))?;
            if shape.map_type != m.old_type {
                return Err(CarryError::MapType {
                    map,
                    found: m.old_type,
                    expected: shape.map_type,
                });
            }
            let per_cpu = bpfsys::PER_CPU_MAP_TYPES.contains(&m.old_type);
            let conv = &m.grown.conversion;
            let mut out = vec![0u8; value_bytes(conv.new_size, per_cpu, cpus)];
            for (key, old) in entries(m, cpus)? {
                convert(conv, per_cpu, cpus, &old, &mut out);
                bpfsys::map_update(&new, &key, &out, 0)
                    .map_err(io_err(map, "writing an entry into its new copy"))?;
                m.first.insert(key, old);
            }
            m.entries = m.first.len();
        }
        Ok(())
    }

    /// After the programs were replaced: waits until no run of the older programs is left,
    /// brings in what they changed since [`Carry::copy`], and gives each new map its pin's name.
    pub fn finish(mut self) -> Result<Vec<Carried>, CarryError> {
        self.finished = true;
        if self.maps.is_empty() {
            return Ok(Vec::new());
        }
        synchronize().map_err(io_err("every map", "waiting for the older programs' runs"))?;
        let cpus = self.cpus;
        let mut report = Vec::with_capacity(self.maps.len());
        for m in &self.maps {
            let map = m.grown.map;
            let new = bpfsys::obj_get(&m.staging).map_err(io_err(map, "opening its new copy"))?;
            let (changed_meanwhile, conflicts) = second_pass(m, &new, cpus)?;
            std::fs::rename(&m.staging, &m.target).map_err(io_err(map, "pinning its new copy"))?;
            report.push(Carried {
                map,
                entries: m.entries,
                changed_meanwhile,
                conflicts,
                added: m.grown.conversion.added().to_vec(),
            });
        }
        Ok(report)
    }
}

impl Drop for Carry {
    fn drop(&mut self) {
        if !self.finished {
            for m in &self.maps {
                let _ = std::fs::remove_file(&m.staging);
            }
        }
    }
}

/// Finishes or clears what an interrupted carry-over left in `pd` (a start stopped between the
/// programs' switch and the rename): a staging pin whose map an attached program uses is the
/// map the datapath runs on, so it takes its pin's name now (the older map there is read by no
/// program any more); any other staging pin is from an attempt that never switched, and goes.
/// The names of the maps whose carry-over this finished.
pub fn recover(pd: &PinDir) -> Result<Vec<&'static str>, CarryError> {
    let staged: Vec<_> = gateway_common::maps::all()
        .map(|m| (m.name, pd.map(&format!("{STAGING_PREFIX}{}", m.name))))
        .filter(|(_, staging)| staging.exists())
        .collect();
    if staged.is_empty() {
        return Ok(Vec::new());
    }
    let in_use = maps_in_use(pd).map_err(io_err("every map", "reading the attached programs"))?;
    let mut finished = Vec::new();
    for (map, staging) in staged {
        let shape = bpfsys::map_shape(&staging).map_err(io_err(map, "reading its new copy"))?;
        if in_use.contains(&shape.id) {
            std::fs::rename(&staging, pd.map(map)).map_err(io_err(map, "pinning its new copy"))?;
            finished.push(map);
        } else {
            std::fs::remove_file(&staging).map_err(io_err(map, "removing a stale copy"))?;
        }
    }
    Ok(finished)
}

/// The ids of the maps the programs attached in `pd` use: those of its links, and those in its
/// jump tables. Each program's maps as the layout record has them (`crate::datapath::layouts`), else as
/// the kernel tells (which needs CAP_SYS_ADMIN).
pub(crate) fn maps_in_use(pd: &PinDir) -> io::Result<HashSet<u32>> {
    let record = crate::datapath::layouts::read(&pd.dir).map_err(io::Error::other)?;
    let mut maps = HashSet::new();
    for id in attached_programs(pd)? {
        match record.program_maps(id) {
            Some(ids) => maps.extend(ids),
            None => maps.extend(bpfsys::program_maps(id).map_err(|e| {
                if e.raw_os_error() == Some(libc::EPERM) {
                    io::Error::other(format!(
                        "{e}: program {id} is not in the attachment's layout record (`{}`, which \
                         releases before it did not write), and the kernel tells the maps of a \
                         program only to CAP_SYS_ADMIN; record it once by running this \
                         version's `gateway attach` over the attachment as root",
                        crate::datapath::layouts::PIN
                    ))
                } else {
                    e
                }
            })?),
        }
    }
    Ok(maps)
}

/// The ids of the programs attached in `pd`: those of its links, and those in its jump tables.
pub(crate) fn attached_programs(pd: &PinDir) -> io::Result<Vec<u32>> {
    use gateway_common::maps::names;
    let mut programs = Vec::new();
    for link in [pd.link(), pd.egress_link(), pd.finish_link()] {
        if link.exists() {
            programs.push(bpfsys::link_program(&link)?);
        }
    }
    for table in [names::XDP_JUMP, names::TC_JUMP] {
        let pin = pd.map(table);
        if !pin.exists() {
            continue;
        }
        let fd = bpfsys::obj_get(&pin)?;
        let slots = bpfsys::map_shape(&pin)?.max_entries;
        for slot in 0..slots {
            let mut id = [0u8; 4];
            if bpfsys::map_lookup(&fd, &slot.to_ne_bytes(), &mut id)? {
                programs.push(u32::from_ne_bytes(id));
            }
        }
    }
    Ok(programs)
}

/// Converts one raw value (per CPU for a per-CPU map) into `out`.
fn convert(conv: &Conversion, per_cpu: bool, cpus: usize, old: &[u8], out: &mut [u8]) {
    if !per_cpu {
        conv.convert(old, out);
        return;
    }
    let (a, b) = (
        conv.old_size.next_multiple_of(8),
        conv.new_size.next_multiple_of(8),
    );
    for cpu in 0..cpus {
        conv.convert(&old[cpu * a..][..a], &mut out[cpu * b..][..b]);
    }
}

/// A map entry as the element commands pass it: its key's bytes and its value's.
pub(crate) type Entry = (Vec<u8>, Vec<u8>);

/// Every entry of `m`'s older map, raw.
fn entries(m: &InFlight, cpus: usize) -> Result<Vec<Entry>, CarryError> {
    let per_cpu = bpfsys::PER_CPU_MAP_TYPES.contains(&m.old_type);
    walk(
        &m.old,
        m.grown.key_size,
        value_bytes(m.grown.conversion.old_size, per_cpu, cpus),
        m.max_entries,
    )
    .map_err(io_err(m.grown.map, "walking its entries"))
}

/// Every entry of the map `fd` (keys of `key_size` bytes, values as the element commands pass
/// them, `value_size` bytes), raw. Bounded: a hash map changing under the walk may send it
/// back to its start, so it stops after twice its `max_entries`.
pub(crate) fn walk(
    fd: &OwnedFd,
    key_size: usize,
    value_size: usize,
    max_entries: u32,
) -> io::Result<Vec<Entry>> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut key: Option<Vec<u8>> = None;
    let mut next = vec![0u8; key_size];
    for _ in 0..2 * (max_entries as usize) + 1 {
        if !bpfsys::map_next_key(fd, key.as_deref(), &mut next)? {
            break;
        }
        let mut value = vec![0u8; value_size];
        if seen.insert(next.clone()) && bpfsys::map_lookup(fd, &next, &mut value)? {
            out.push((next.clone(), value));
        }
        key = Some(next.clone());
    }
    Ok(out)
}

/// Brings into the new map `new` what the older programs changed in `m`'s older map since the
/// first pass (its programs have all ended): the changed entries and the counts entries
/// changed meanwhile and conflicts.
fn second_pass(m: &InFlight, new: &OwnedFd, cpus: usize) -> Result<(usize, usize), CarryError> {
    let map = m.grown.map;
    let conv = &m.grown.conversion;
    let per_cpu = bpfsys::PER_CPU_MAP_TYPES.contains(&m.old_type);
    let array = bpfsys::ARRAY_MAP_TYPES.contains(&m.old_type);
    let new_size = value_bytes(conv.new_size, per_cpu, cpus);
    let (mut changed, mut conflicts) = (0, 0);
    let mut current = vec![0u8; new_size];
    let mut expected = vec![0u8; new_size];
    let mut converted = vec![0u8; new_size];
    let now = entries(m, cpus)?;
    let mut still = HashSet::with_capacity(now.len());
    for (key, old) in &now {
        still.insert(key.as_slice());
        let before = m.first.get(key);
        if before == Some(old) {
            continue;
        }
        changed += 1;
        let present = bpfsys::map_lookup(new, key, &mut current)
            .map_err(io_err(map, "reading an entry of its new copy"))?;
        if per_cpu {
            // Counters: this build's count plus what the older programs counted meanwhile.
            if !present {
                current.fill(0);
            }
            let zero = vec![0u8; old.len()];
            let before = before.map_or(zero.as_slice(), Vec::as_slice);
            let (a, b) = (
                conv.old_size.next_multiple_of(8),
                conv.new_size.next_multiple_of(8),
            );
            for cpu in 0..cpus {
                conv.add_growth(
                    &before[cpu * a..][..a],
                    &old[cpu * a..][..a],
                    &mut current[cpu * b..][..b],
                );
            }
            bpfsys::map_update(new, key, &current, 0)
                .map_err(io_err(map, "writing an entry into its new copy"))?;
            continue;
        }
        // Anything else: taken only where the newer program left the first pass's value.
        let untouched = match before {
            Some(before) => {
                convert(conv, false, cpus, before, &mut expected);
                present && current == expected
            }
            None => !present,
        };
        if untouched {
            convert(conv, false, cpus, old, &mut converted);
            bpfsys::map_update(new, key, &converted, 0)
                .map_err(io_err(map, "writing an entry into its new copy"))?;
        } else {
            conflicts += 1;
        }
    }
    if !array {
        // Entries the older programs removed meanwhile go too, unless the newer one wrote them.
        for (key, before) in &m.first {
            if still.contains(key.as_slice()) {
                continue;
            }
            changed += 1;
            convert(conv, per_cpu, cpus, before, &mut expected);
            let present = bpfsys::map_lookup(new, key, &mut current)
                .map_err(io_err(map, "reading an entry of its new copy"))?;
            if present && current == expected {
                bpfsys::map_delete(new, key)
                    .map_err(io_err(map, "removing an entry of its new copy"))?;
            } else if present {
                conflicts += 1;
            }
        }
    }
    Ok((changed, conflicts))
}

/// Waits until every run of a BPF program begun before now has ended: an RCU grace period
/// (`membarrier(MEMBARRIER_CMD_GLOBAL)`, which is `synchronize_rcu`), under which XDP and TC
/// programs run.
pub(crate) fn synchronize() -> io::Result<()> {
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    // SAFETY: membarrier takes no pointers.
    let r = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a per-CPU map's values can be carried over: they hold counters, which the second
/// pass adds up word by word.
pub(crate) fn per_cpu_carries(conversion: &Conversion) -> bool {
    conversion.in_words()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(path: &str, byte: u32, kind: &str, size: u32) -> Field {
        Field {
            path: path.into(),
            offset: format!("byte {byte}"),
            kind: kind.into(),
            byte: Some(byte),
            size,
        }
    }

    #[test]
    fn a_value_that_grew_keeps_every_field_and_starts_the_added_at_zero() {
        let old = [field("a", 0, "u64", 8), field("b", 8, "u32", 4)];
        let new = [
            field("b", 0, "u32", 4),
            field("c", 4, "u32", 4),
            field("a", 8, "u64", 8),
        ];
        let conv = Conversion::plan(&old, &new, 12, 16).unwrap();
        assert_eq!(conv.added(), ["c"]);
        let mut value = [0u8; 12];
        value[..8].copy_from_slice(&7u64.to_ne_bytes());
        value[8..].copy_from_slice(&9u32.to_ne_bytes());
        let mut out = [0xffu8; 16];
        conv.convert(&value, &mut out);
        assert_eq!(&out[..4], 9u32.to_ne_bytes());
        assert_eq!(&out[4..8], [0; 4]);
        assert_eq!(&out[8..], 7u64.to_ne_bytes());
        assert!(!conv.in_words(), "b is a u32");
    }

    #[test]
    fn a_field_dropped_or_retyped_is_refused_by_name() {
        let old = [field("a", 0, "u64", 8), field("b", 8, "u64", 8)];
        let dropped = Conversion::plan(&old, &old[..1], 16, 8).unwrap_err();
        assert_eq!(
            dropped,
            "it has `b` at byte 8 (u64), which this build does not have"
        );
        let retyped = [field("a", 0, "u64", 8), field("b", 8, "u32", 4)];
        let e = Conversion::plan(&old, &retyped, 16, 12).unwrap_err();
        assert_eq!(
            e,
            "it has `b` at byte 8 (u64) where this build has `b` at byte 8 (u32)"
        );
    }

    #[test]
    fn counters_add_what_the_older_build_counted_meanwhile() {
        let old = [field("x", 0, "u64", 8), field("y", 8, "u64", 8)];
        let new = [
            field("x", 0, "u64", 8),
            field("y", 8, "u64", 8),
            field("z", 16, "u64", 8),
        ];
        let conv = Conversion::plan(&old, &new, 16, 24).unwrap();
        assert!(conv.in_words());
        let words = |w: &[u64]| w.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>();
        let before = words(&[10, 20]);
        let after = words(&[13, 20]);
        let mut new_value = words(&[2, 5, 1]);
        conv.add_growth(&before, &after, &mut new_value);
        assert_eq!(new_value, words(&[5, 5, 1]));
    }

    #[test]
    fn a_field_past_the_value_is_refused() {
        let old = [field("a", 8, "u64", 8)];
        assert!(Conversion::plan(&old, &old, 8, 16).is_err());
    }
}
