//! Moving what an older build kept in one pinned map to the map this build keeps it in, under
//! another key: the IPv4 TLS connections of `TLS_FLOWS` (40-byte, IPv4-mapped keys) to
//! `TLS_FLOWS4` (12-byte keys), where this build's programs look for them.
//!
//! Two passes around the programs' switch, as for a map carried over to a grown layout
//! (`crate::datapath::carry`): [`Moving::begin`], once this build's maps are pinned and before the
//! switch, copies every entry to move into this build's map; the older programs go on changing
//! the older map until the switch. [`Moving::finish`], once no run of them is left (an RCU
//! grace period), brings in what they changed since (an entry this build's programs changed
//! meanwhile keeps what they wrote, counted as a conflict), and removes every moved entry from
//! the older map, where no program of this build looks for it.
//!
//! Which map holds the truth is told by the programs attached: while none of them uses this
//! build's map, the older map does, and a copy an earlier, failed attempt left in this build's
//! map is overwritten; once one does (a start switched and stopped before removing what it
//! moved), this build's map does, and what is left in the older map is only removed.

use std::{
    collections::{HashMap, HashSet},
    fmt, io,
    os::fd::OwnedFd,
};

use gateway_common::maps::{FlowKey, FlowKey4, TlsFlow, names};
use thiserror::Error;

use crate::{
    datapath::bpfsys,
    datapath::carry::{self, Entry},
    datapath::pins::PinDir,
};

/// Errors of moving entries.
#[derive(Debug, Error)]
#[error("moving {from}'s entries to {to}: {what}: {source}")]
pub struct RekeyError {
    /// The map they leave.
    pub from: &'static str,
    /// The map they go to.
    pub to: &'static str,
    /// What was being done.
    pub what: &'static str,
    /// The error.
    pub source: io::Error,
}

/// Entries one map keeps that another of this build keeps under another key.
struct Rekey {
    from: &'static str,
    to: &'static str,
    key_size: usize,
    value_size: usize,
    /// The key in `to` of the entry of `from` with key bytes `key`; `None` for an entry that
    /// stays.
    key: fn(&[u8]) -> Option<Vec<u8>>,
}

/// The entries this build keeps elsewhere than earlier builds did.
const REKEYS: [Rekey; 1] = [Rekey {
    from: names::TLS_FLOWS,
    to: names::TLS_FLOWS4,
    key_size: size_of::<FlowKey>(),
    value_size: size_of::<TlsFlow>(),
    key: v4_flow_key,
}];

/// The `TLS_FLOWS4` key of a `TLS_FLOWS` key, when it is an IPv4 connection's.
fn v4_flow_key(bytes: &[u8]) -> Option<Vec<u8>> {
    let key: [u8; size_of::<FlowKey>()] = bytes.try_into().ok()?;
    // SAFETY: FlowKey is plain integers with no padding (any bit pattern is one); the read is
    // unaligned.
    let key: FlowKey = unsafe { std::ptr::read_unaligned(key.as_ptr().cast()) };
    let short = key.v4()?;
    // SAFETY: FlowKey4 is plain integers with no padding, read as its bytes.
    let bytes = unsafe {
        std::slice::from_raw_parts((&raw const short).cast::<u8>(), size_of::<FlowKey4>())
    };
    Some(bytes.to_vec())
}

/// What moving one map's entries did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Moved {
    /// The map they left.
    pub from: &'static str,
    /// The map they went to.
    pub to: &'static str,
    /// Entries copied by the first pass.
    pub entries: usize,
    /// Entries the older programs changed during the switch, brought in by the second pass.
    pub changed_meanwhile: usize,
    /// Entries both builds' programs wrote during the switch, where the newer one's value was
    /// kept.
    pub conflicts: usize,
}

impl fmt::Display for Moved {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "moved {} entries of {} to {}, where this build keeps them; {} changed during the \
             switch, {} kept as the new program wrote them",
            self.entries, self.from, self.to, self.changed_meanwhile, self.conflicts
        )
    }
}

/// One map's entries on their way.
struct InMove {
    rekey: &'static Rekey,
    old: OwnedFd,
    new: OwnedFd,
    max_entries: u32,
    /// An attached program uses this build's map already: what the older map holds is stale.
    switched: bool,
    /// The entries the first pass copied: the older map's key, its new key, and its value.
    first: HashMap<Vec<u8>, (Vec<u8>, Vec<u8>)>,
}

/// The entries of an upgrade being moved ([`Moving::begin`], then, once the programs were
/// replaced, [`Moving::finish`]).
pub struct Moving {
    maps: Vec<InMove>,
}

impl InMove {
    fn err(&self, what: &'static str) -> impl FnOnce(io::Error) -> RekeyError + use<> {
        let (from, to) = (self.rekey.from, self.rekey.to);
        move |source| RekeyError {
            from,
            to,
            what,
            source,
        }
    }

    /// Every entry of the older map to move, with its new key.
    fn to_move(&self) -> Result<Vec<(Entry, Vec<u8>)>, RekeyError> {
        let all = carry::walk(
            &self.old,
            self.rekey.key_size,
            self.rekey.value_size,
            self.max_entries,
        )
        .map_err(self.err("walking its entries"))?;
        Ok(all
            .into_iter()
            .filter_map(|entry| (self.rekey.key)(&entry.0).map(|k| (entry, k)))
            .collect())
    }
}

impl Moving {
    /// The first pass, once this build's maps are pinned in `pd`: every entry to move, copied
    /// into this build's map, unless an attached program uses that map already.
    pub fn begin(pd: &PinDir) -> Result<Moving, RekeyError> {
        let mut maps = Vec::new();
        let mut in_use = None;
        for rekey in &REKEYS {
            let (from, to) = (pd.map(rekey.from), pd.map(rekey.to));
            if !from.exists() || !to.exists() {
                continue;
            }
            let err = |what| {
                move |source| RekeyError {
                    from: rekey.from,
                    to: rekey.to,
                    what,
                    source,
                }
            };
            let old = bpfsys::obj_get(&from).map_err(err("opening the map they leave"))?;
            let new = bpfsys::obj_get(&to).map_err(err("opening the map they go to"))?;
            let max_entries = bpfsys::map_shape(&from)
                .map_err(err("reading the shape of the map they leave"))?
                .max_entries;
            let to_id = bpfsys::map_shape(&to)
                .map_err(err("reading the shape of the map they go to"))?
                .id;
            let in_use = match &in_use {
                Some(ids) => ids,
                None => in_use
                    .insert(carry::maps_in_use(pd).map_err(err("reading the attached programs"))?),
            };
            let mut m = InMove {
                rekey,
                old,
                new,
                max_entries,
                switched: in_use.contains(&to_id),
                first: HashMap::new(),
            };
            if !m.switched {
                for ((key, value), new_key) in m.to_move()? {
                    bpfsys::map_update(&m.new, &new_key, &value, 0)
                        .map_err(m.err("writing an entry"))?;
                    m.first.insert(key, (new_key, value));
                }
            }
            maps.push(m);
        }
        Ok(Moving { maps })
    }

    /// After the programs were replaced: waits until no run of the older programs is left,
    /// brings in what they changed since [`Moving::begin`], and removes every moved entry from
    /// the map it left. What it did, for each map it moved anything of.
    pub fn finish(self) -> Result<Vec<Moved>, RekeyError> {
        if self.maps.is_empty() {
            return Ok(Vec::new());
        }
        carry::synchronize().map_err(|source| RekeyError {
            from: "every map",
            to: "this build's",
            what: "waiting for the older programs' runs",
            source,
        })?;
        let mut report = Vec::with_capacity(self.maps.len());
        for m in &self.maps {
            let now = m.to_move()?;
            if m.switched {
                // Stale: this build's programs keep these entries in the other map already.
                for ((key, _), _) in &now {
                    bpfsys::map_delete(&m.old, key)
                        .map_err(m.err("removing a stale entry from the map they leave"))?;
                }
                continue;
            }
            let (mut changed, mut conflicts) = (0, 0);
            let mut current = vec![0u8; m.rekey.value_size];
            let still: HashSet<&[u8]> = now.iter().map(|((k, _), _)| k.as_slice()).collect();
            for ((key, value), new_key) in &now {
                let before = m.first.get(key);
                if before.is_some_and(|(_, v)| v == value) {
                    continue;
                }
                changed += 1;
                let present = bpfsys::map_lookup(&m.new, new_key, &mut current)
                    .map_err(m.err("reading an entry"))?;
                let untouched = match before {
                    Some((_, v)) => present && current == *v,
                    None => !present,
                };
                if untouched {
                    bpfsys::map_update(&m.new, new_key, value, 0)
                        .map_err(m.err("writing an entry"))?;
                } else {
                    conflicts += 1;
                }
            }
            // Entries the older programs removed meanwhile go too, unless the newer ones wrote
            // them.
            for (key, (new_key, value)) in &m.first {
                if still.contains(key.as_slice()) {
                    continue;
                }
                changed += 1;
                let present = bpfsys::map_lookup(&m.new, new_key, &mut current)
                    .map_err(m.err("reading an entry"))?;
                if present && current == *value {
                    bpfsys::map_delete(&m.new, new_key).map_err(m.err("removing an entry"))?;
                } else if present {
                    conflicts += 1;
                }
            }
            for ((key, _), _) in &now {
                bpfsys::map_delete(&m.old, key)
                    .map_err(m.err("removing a moved entry from the map it left"))?;
            }
            // Said only where there was something to move: an upgrade from a build that kept
            // the entries where this one does moves nothing.
            if !m.first.is_empty() || changed > 0 {
                report.push(Moved {
                    from: m.rekey.from,
                    to: m.rekey.to,
                    entries: m.first.len(),
                    changed_meanwhile: changed,
                    conflicts,
                });
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<T>(v: &T) -> Vec<u8> {
        // SAFETY: map keys are plain integers with no padding.
        unsafe { std::slice::from_raw_parts((v as *const T).cast::<u8>(), size_of::<T>()) }.to_vec()
    }

    /// An IPv4 connection's key moves under its 12-byte key; an IPv6 one stays.
    #[test]
    fn ipv4_flows_move_and_ipv6_flows_stay() {
        let short = FlowKey4 {
            saddr: [10, 99, 0, 2],
            daddr: [10, 99, 0, 1],
            sport: 40000,
            dport: 443,
        };
        let key = short.mapped();
        assert_eq!(v4_flow_key(&bytes(&key)), Some(bytes(&short)));
        let mut v6 = key;
        v6.saddr = [0x20, 1, 0xd, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        assert_eq!(v4_flow_key(&bytes(&v6)), None);
        assert_eq!(v4_flow_key(&[0; 12]), None, "a key of another size");
    }
}
