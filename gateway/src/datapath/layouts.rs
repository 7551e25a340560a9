//! The layout record: the BTF of each build whose maps an attachment's pins hold, by the kernel
//! id of its BTF object, pinned beside the maps (`<root>/<iface>/layouts`, a one-value array)
//! by every attach and every upgrade.
//!
//! The kernel tells anyone with CAP_BPF a pinned map's sizes and which BTF object describes it
//! (`BPF_OBJ_GET_INFO_BY_FD`: its id, and its key's and value's type ids there), but gives the
//! BTF object itself only to CAP_SYS_ADMIN (`BPF_BTF_GET_FD_BY_ID`). Under the systemd unit's
//! and the DaemonSet's capabilities (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN,
//! CAP_NET_BIND_SERVICE) a daemon could not check the fields of the maps it had pinned itself
//! (`crate::datapath::pinned_layout::check`), so it could not restart, upgrade or say its `status`.
//! The record holds those bytes for it, under the same id, so the check reads exactly what it
//! read from the kernel:
//! - a build that loads records its object's `.BTF` under the id its programs were loaded with
//!   (aya loads that section once for the maps and programs of a load, and keeps its type ids:
//!   it only appends types);
//! - a BTF object an older pinned map still uses is kept from the record before, or read from
//!   the kernel where the caller may (pins of a release before the record);
//! - an id no pinned map uses any more is dropped.
//!
//! The record is written before the programs it describes are attached (a superset of what the
//! pins use is never wrong), as a new map pinned beside the old one and renamed over it.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
};

use thiserror::Error;

use crate::{
    datapath::bpfsys,
    datapath::btf::{self, BtfError},
};

/// The record's pin in an attachment's directory.
pub const PIN: &str = "layouts";

/// The record's map name (as `bpftool map` lists it).
const MAP_NAME: &str = "gw_layouts";

/// The most bytes a record may hold (a build's BTF is about 80 KB).
pub const MAX_BYTES: usize = 4 << 20;

/// Errors of the layout record.
#[derive(Debug, Error)]
pub enum LayoutsError {
    /// A `bpf(2)` or filesystem call on the record failed.
    #[error("the layout record {path}: {what}: {source}")]
    Io {
        /// The record's pin.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: io::Error,
    },
    /// The record's bytes do not parse.
    #[error("the layout record {path} is malformed at byte {offset}: {what}")]
    Malformed {
        /// The record's pin.
        path: PathBuf,
        /// Where in the value.
        offset: usize,
        /// What was wrong there.
        what: &'static str,
    },
    /// The object being loaded has no BTF to record.
    #[error("the eBPF object's BTF cannot be recorded: {0}")]
    Object(#[from] BtfError),
}

/// The BTF bytes of the builds an attachment's maps were made by, by BTF object id, and the
/// maps each program of theirs uses, by program id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    blobs: BTreeMap<u32, Vec<u8>>,
    programs: BTreeMap<u32, Vec<u32>>,
}

impl Record {
    /// The bytes of the BTF object `id`, when recorded.
    pub fn bytes(&self, id: u32) -> Option<&[u8]> {
        self.blobs.get(&id).map(Vec::as_slice)
    }

    /// The ids of the maps the program `id` uses, when recorded (the kernel gives them only
    /// to CAP_SYS_ADMIN or to the process holding the program).
    pub fn program_maps(&self, id: u32) -> Option<&[u32]> {
        self.programs.get(&id).map(Vec::as_slice)
    }

    /// The BTF object ids recorded.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.blobs.keys().copied()
    }

    /// The value as pinned: a count, then per BTF object its id, its length and its bytes
    /// (bytes padded to 4); then a count, and per program its id, its count of maps and their
    /// ids. Every number a little-endian u32.
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let word = |out: &mut Vec<u8>, w: usize| out.extend_from_slice(&(w as u32).to_le_bytes());
        word(&mut out, self.blobs.len());
        for (id, bytes) in &self.blobs {
            word(&mut out, *id as usize);
            word(&mut out, bytes.len());
            out.extend_from_slice(bytes);
            out.resize(out.len().next_multiple_of(4), 0);
        }
        word(&mut out, self.programs.len());
        for (id, maps) in &self.programs {
            word(&mut out, *id as usize);
            word(&mut out, maps.len());
            for map in maps {
                word(&mut out, *map as usize);
            }
        }
        out
    }

    /// Parses what [`Record::encode`] wrote (`path` names the record in errors).
    fn decode(value: &[u8], path: &std::path::Path) -> Result<Record, LayoutsError> {
        let bad = |offset, what| LayoutsError::Malformed {
            path: path.to_path_buf(),
            offset,
            what,
        };
        let word = |at: usize| {
            value
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .ok_or_else(|| bad(at, "cut short"))
        };
        let count = word(0)? as usize;
        let mut at = 4;
        let mut blobs = BTreeMap::new();
        for _ in 0..count.min(value.len() / 8) {
            let (id, len) = (word(at)?, word(at + 4)? as usize);
            let start = at + 8;
            let bytes = value
                .get(start..start.saturating_add(len))
                .ok_or_else(|| bad(at + 4, "a length past the end"))?;
            if blobs.insert(id, bytes.to_vec()).is_some() {
                return Err(bad(at, "an id recorded twice"));
            }
            at = (start + len).next_multiple_of(4);
        }
        if blobs.len() != count {
            return Err(bad(0, "more entries than the value holds"));
        }
        let count_at = at;
        let count = word(at)? as usize;
        at += 4;
        let mut programs = BTreeMap::new();
        for _ in 0..count.min(value.len() / 8) {
            let (id, n) = (word(at)?, word(at + 4)? as usize);
            at += 8;
            let maps = (0..n.min(value.len() / 4))
                .map(|i| word(at + 4 * i))
                .collect::<Result<Vec<_>, _>>()?;
            at += 4 * maps.len();
            if programs.insert(id, maps).is_some() {
                return Err(bad(at, "a program recorded twice"));
            }
        }
        if programs.len() != count {
            return Err(bad(count_at, "more programs than the value holds"));
        }
        Ok(Record { blobs, programs })
    }
}

/// Reads the record pinned in the pin directory `dir` (empty when there is none: pins of a
/// release before it).
pub fn read(dir: &Path) -> Result<Record, LayoutsError> {
    let path = dir.join(PIN);
    if !path.exists() {
        return Ok(Record::default());
    }
    let io = |what| {
        let path = path.clone();
        move |source| LayoutsError::Io { path, what, source }
    };
    let shape = bpfsys::map_shape(&path).map_err(io("reading its shape"))?;
    let fd = bpfsys::obj_get(&path).map_err(io("opening it"))?;
    let mut value = vec![0u8; shape.value_size as usize];
    bpfsys::map_lookup(&fd, &0u32.to_ne_bytes(), &mut value).map_err(io("reading it"))?;
    Record::decode(&value, &path)
}

/// What one load adds to the record.
#[derive(Clone, Debug)]
pub struct Loaded<'a> {
    /// The eBPF object loaded.
    pub object: &'a [u8],
    /// The id of the BTF object the load made (its programs', and its new maps').
    pub btf_id: u32,
    /// Each program it loaded: its id and the ids of the maps it uses.
    pub programs: Vec<(u32, Vec<u32>)>,
}

/// Records, in the pin directory `dir`, the BTF of the object `load` loaded under its id,
/// beside that of every older BTF object a map pinned in `dir` still uses (kept from the record
/// before, else read from the kernel where this process may); and the maps of every program
/// `load` loaded, beside those of the programs `attached` now (kept from the record before, else
/// read from the kernel where this process may). What neither uses is dropped. Returns the
/// record written.
pub fn write(dir: &Path, load: &Loaded, attached: &[u32]) -> Result<Record, LayoutsError> {
    let before = read(dir)?;
    let loaded = load.btf_id;
    let object = load.object;
    let mut used: Vec<u32> = gateway_common::maps::all()
        .filter_map(|m| bpfsys::map_shape(&dir.join(m.name)).ok())
        .map(|shape| shape.btf.btf_id)
        .filter(|&id| id != 0)
        .collect();
    used.push(loaded);
    used.sort_unstable();
    used.dedup();
    let ours = btf::object_btf_bytes(object)?;
    let mut record = Record::default();
    for id in used {
        let bytes = if id == loaded {
            Some(ours.to_vec())
        } else if let Some(kept) = before.bytes(id) {
            Some(kept.to_vec())
        } else {
            // Without CAP_SYS_ADMIN this fails: those maps stay unrecorded, and their check
            // says how to record them.
            bpfsys::btf_bytes(id).ok()
        };
        if let Some(bytes) = bytes {
            record.blobs.insert(id, bytes);
        }
    }
    record.programs.extend(load.programs.iter().cloned());
    for &id in attached {
        if record.programs.contains_key(&id) {
            continue;
        }
        let maps = match before.program_maps(id) {
            Some(kept) => Some(kept.to_vec()),
            None => bpfsys::program_maps(id).ok(),
        };
        if let Some(maps) = maps {
            record.programs.insert(id, maps);
        }
    }
    pin(dir, &record)?;
    Ok(record)
}

/// Pins `record` in `dir`: a new map pinned beside the old one, then renamed over it.
fn pin(dir: &Path, record: &Record) -> Result<(), LayoutsError> {
    let path = dir.join(PIN);
    // bpffs refuses a name with a dot in it (reserved for its own files).
    let staging = dir.join(format!("{PIN}-staging"));
    let io = |what| {
        let path = path.clone();
        move |source| LayoutsError::Io { path, what, source }
    };
    let value = record.encode();
    if value.len() > MAX_BYTES {
        return Err(io("recording it")(io::Error::other(format!(
            "{} bytes, over the {MAX_BYTES} a record may hold",
            value.len()
        ))));
    }
    let fd = bpfsys::array_create(MAP_NAME, value.len() as u32).map_err(io("creating it"))?;
    bpfsys::map_update(&fd, &0u32.to_ne_bytes(), &value, 0).map_err(io("writing it"))?;
    let _ = std::fs::remove_file(&staging);
    bpfsys::obj_pin(&fd, &staging).map_err(io("pinning it"))?;
    std::fs::rename(&staging, &path).map_err(|e| {
        let _ = std::fs::remove_file(&staging);
        io("renaming it into place")(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_reads_back_as_written() {
        let mut record = Record::default();
        record.blobs.insert(7, vec![1, 2, 3]);
        record.blobs.insert(42, (0..=255).collect());
        record.blobs.insert(9, Vec::new());
        record.programs.insert(300, vec![1, 2, 3]);
        record.programs.insert(301, Vec::new());
        let value = record.encode();
        assert_eq!(value.len() % 4, 0);
        let path = std::path::Path::new("layouts");
        assert_eq!(Record::decode(&value, path).unwrap(), record);
    }

    #[test]
    fn a_cut_or_hostile_record_is_refused_with_its_offset() {
        let mut record = Record::default();
        record.blobs.insert(7, vec![1, 2, 3, 4, 5]);
        let value = record.encode();
        let path = std::path::Path::new("layouts");
        let e = Record::decode(&value[..14], path).unwrap_err().to_string();
        assert!(e.contains("at byte 8: a length past the end"), "{e}");
        let mut more = value.clone();
        more[0] = 200;
        let e = Record::decode(&more, path).unwrap_err().to_string();
        assert!(e.contains("malformed"), "{e}");
        let mut twice = record.clone();
        twice.blobs.insert(8, vec![0]);
        let mut value = twice.encode();
        value[20..24].copy_from_slice(&7u32.to_le_bytes());
        let e = Record::decode(&value, path).unwrap_err().to_string();
        assert!(e.contains("an id recorded twice"), "{e}");
        assert!(Record::decode(&[], path).is_err());
    }
}
