//! The TLS maps: the flow tables, the issued keys and what verifies them (tag keys, learn terms, ticket keys), the refused connections' table and the reject events (`gateway_common::maps::tls`).

use aya::maps::{HashMap, MapData, MapError, PerCpuArray};
use gateway_common::maps::{
    FlowKey, FlowKey4, ISSUED_BY_KEY, ISSUED_WITHDRAWN, IssuedKey, IssuedValue, LearnTerms,
    TLS_REFUSED_SLOTS, TagKey, TagKeyId, TicketKeyId, TicketMacKey, TlsCounters, TlsFlow, names,
};

use super::{BPF_EXIST, Maps, MapsError, clear, op, open_as, sum};
use crate::datapath::pins::PinDir;

/// The reject-event ring buffer of one interface (a single consumer should read it: the daemon).
pub fn open_rejects(pins: &PinDir) -> Result<aya::maps::RingBuf<MapData>, MapsError> {
    open_as(pins, names::TLS_REJECTS)
}

/// Decodes a reject event read from the ring buffer.
pub fn decode_reject(bytes: &[u8]) -> Option<gateway_common::maps::RejectEvent> {
    if bytes.len() < core::mem::size_of::<gateway_common::maps::RejectEvent>() {
        return None;
    }
    // SAFETY: RejectEvent is Pod (any bytes are a value) and the length was checked.
    Some(unsafe { core::ptr::read_unaligned(bytes.as_ptr().cast()) })
}

/// Runs `f` on the slots of the `TLS_REFUSED` pinned in `pins`, mapped into this process (the
/// array is `BPF_F_MMAPABLE`: reading or clearing its 4,096 slots takes no syscall per slot,
/// which tests that forget every connection between two frames would otherwise pay). `None`
/// when it is not pinned (a datapath pinned by a build before the table).
fn refused_slots<T>(
    pins: &PinDir,
    f: impl FnOnce(*mut FlowKey, usize) -> T,
) -> Result<Option<T>, MapsError> {
    use std::{num::NonZeroUsize, os::fd::AsFd};

    use nix::sys::mman::{MapFlags, ProtFlags, mmap, munmap};

    let path = pins.map(names::TLS_REFUSED);
    if !path.exists() {
        return Ok(None);
    }
    let data = MapData::from_pin(&path).map_err(|source| MapsError::Open {
        path: path.display().to_string(),
        source,
    })?;
    let n = TLS_REFUSED_SLOTS as usize;
    let len = NonZeroUsize::new(n * size_of::<FlowKey>()).expect("a table of slots");
    let err = |source| MapsError::Mmap {
        map: names::TLS_REFUSED,
        source,
    };
    // SAFETY: a shared mapping of the array's values, which the kernel sizes to its elements
    // (40-byte keys, a multiple of 8, so no gaps); unmapped below before `data` closes.
    let base = unsafe {
        mmap(
            None,
            len,
            ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
            MapFlags::MAP_SHARED,
            data.fd().as_fd(),
            0,
        )
    }
    .map_err(err)?;
    let out = f(base.as_ptr().cast::<FlowKey>(), n);
    // SAFETY: the mapping made above, of `len` bytes, no longer used.
    unsafe { munmap(base, len.get()) }.map_err(err)?;
    Ok(Some(out))
}

/// The TLS maps: the flow tables, the issued keys and what verifies them (tag keys, learn terms, ticket keys), the refused connections' table and the reject events (`gateway_common::maps::tls`).
pub struct TlsMaps {
    pub(super) tls_flows: HashMap<MapData, FlowKey, TlsFlow>,
    /// Opened when first used: an older build's object (the benchmark's comparison) lays its
    /// value out otherwise.
    pub(super) tls_issued: std::sync::OnceLock<HashMap<MapData, IssuedKey, IssuedValue>>,
}

impl TlsMaps {
    /// Opens them where `pins` has them pinned.
    pub(super) fn open(pins: &PinDir) -> Result<Self, MapsError> {
        Ok(TlsMaps {
            tls_flows: open_as(pins, names::TLS_FLOWS)?,
            tls_issued: std::sync::OnceLock::new(),
        })
    }
}

impl Maps {
    /// TLS counters summed over CPUs.
    ///
    /// Opened at each call rather than with the rest: the counters grow with every release
    /// that counts something new, and a benchmark's baseline object of an older release is
    /// driven through these maps (`bench compare`) without its counters being read.
    pub fn tls_counters(&self) -> Result<TlsCounters, MapsError> {
        let map: PerCpuArray<MapData, TlsCounters> = open_as(&self.pins, names::TLS_COUNTERS)?;
        sum(&map, 0, names::TLS_COUNTERS)
    }

    /// Publishes an issued session key.
    pub fn add_issued(&mut self, key: IssuedKey, value: IssuedValue) -> Result<(), MapsError> {
        self.issued_map_mut()?
            .insert(key, value, 0)
            .map_err(op(names::TLS_ISSUED))
    }

    /// Withdraws an issued session key; returns whether it was there.
    pub fn remove_issued(&mut self, key: &IssuedKey) -> Result<bool, MapsError> {
        match self.issued_map_mut()?.remove(key) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::TLS_ISSUED)(e)),
        }
    }

    /// Withdraws an issued key (an offer of it did not resume); returns whether it was there. A
    /// key with an expiry (a ticket's) stays as withdrawn ([`ISSUED_WITHDRAWN`]) until then, so
    /// that its ticket's tag does not publish it again at the NIC; any other is removed.
    pub fn withdraw_issued(&mut self, key: &IssuedKey) -> Result<bool, MapsError> {
        let mut value = match self.issued_map()?.get(key, 0) {
            Ok(v) => v,
            Err(MapError::KeyNotFound) => return Ok(false),
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                return Ok(false);
            }
            Err(e) => return Err(op(names::TLS_ISSUED)(e)),
        };
        if value.expires == 0 {
            return self.remove_issued(key);
        }
        value.kind |= ISSUED_WITHDRAWN;
        match self.issued_map_mut()?.insert(key, value, BPF_EXIST) {
            Ok(()) => Ok(true),
            // Removed meanwhile (its expiry swept).
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::TLS_ISSUED)(e)),
        }
    }

    /// Removes every issued key whose expiry ([`IssuedValue::expires`]) is `now_unix` (seconds)
    /// or earlier: keys the NIC published for tickets whose tag vouched for them, withdrawn
    /// keys, and keys a daemon published before it stopped. Returns how many.
    pub fn sweep_issued(&mut self, now_unix: u64) -> Result<usize, MapsError> {
        self.remove_issued_where(|v| v.expires != 0 && v.expires <= now_unix)
    }

    /// Removes every issued key whose value `ended` picks; returns how many.
    fn remove_issued_where(
        &mut self,
        ended: impl Fn(&IssuedValue) -> bool,
    ) -> Result<usize, MapsError> {
        let keys: Vec<IssuedKey> = self
            .issued_map()?
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, v)| ended(v))
            .map(|(k, _)| k)
            .collect();
        let mut n = 0;
        for k in &keys {
            n += usize::from(self.remove_issued(k)?);
        }
        Ok(n)
    }

    /// Writes the ticket tag keys of the listener on `port`, one per rotation period (the low
    /// 32 bits), and removes the port's keys of any other period (retired).
    pub fn set_tag_keys(&mut self, port: u16, keys: &[(u32, TagKey)]) -> Result<(), MapsError> {
        let mut map: HashMap<MapData, TagKeyId, TagKey> = open_as(&self.pins, names::TLS_TAG_KEYS)?;
        let id = |period| TagKeyId {
            port,
            pad: 0,
            period,
        };
        for (period, key) in keys {
            map.insert(id(*period), key, 0)
                .map_err(op(names::TLS_TAG_KEYS))?;
        }
        let retired: Vec<TagKeyId> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| k.port == port && !keys.iter().any(|(p, _)| *p == k.period))
            .collect();
        for k in retired {
            let _ = map.remove(&k);
        }
        Ok(())
    }

    /// Sets the terms under which the NIC learns the sessions of the server on `port`
    /// (`TLS_LEARN`).
    pub fn set_learn_terms(&mut self, port: u16, terms: LearnTerms) -> Result<(), MapsError> {
        let mut map: HashMap<MapData, u32, LearnTerms> = open_as(&self.pins, names::TLS_LEARN)?;
        map.insert(u32::from(port), terms, 0)
            .map_err(op(names::TLS_LEARN))
    }

    /// Stops learning the sessions of the server on `port`; whether it was learning.
    pub fn remove_learn_terms(&mut self, port: u16) -> Result<bool, MapsError> {
        let mut map: HashMap<MapData, u32, LearnTerms> = open_as(&self.pins, names::TLS_LEARN)?;
        match map.remove(&u32::from(port)) {
            Ok(()) => Ok(true),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(e) => Err(op(names::TLS_LEARN)(e)),
        }
    }

    /// The ports whose sessions the NIC learns, with their terms, sorted by port.
    pub fn learn_terms(&self) -> Result<Vec<(u16, LearnTerms)>, MapsError> {
        let map: HashMap<MapData, u32, LearnTerms> = open_as(&self.pins, names::TLS_LEARN)?;
        let mut out = map
            .iter()
            .map(|r| r.map(|(k, v)| (k as u16, v)))
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_LEARN))?;
        out.sort_by_key(|(p, _)| *p);
        Ok(out)
    }

    /// Makes `keys` the ticket keys of the server on `port` (`TLS_TICKET_KEYS`): writes those
    /// that differ and removes the port's others. Returns (written, removed).
    pub fn set_ticket_keys(
        &mut self,
        port: u16,
        keys: &[(TicketKeyId, TicketMacKey)],
    ) -> Result<(usize, usize), MapsError> {
        let mut map: HashMap<MapData, TicketKeyId, TicketMacKey> =
            open_as(&self.pins, names::TLS_TICKET_KEYS)?;
        let held: Vec<(TicketKeyId, TicketMacKey)> = map.iter().filter_map(Result::ok).collect();
        let mut written = 0;
        for (id, key) in keys {
            if !held.iter().any(|(i, k)| i == id && k == key) {
                map.insert(id, key, 0).map_err(op(names::TLS_TICKET_KEYS))?;
                written += 1;
            }
        }
        let mut removed = 0;
        for (id, _) in held {
            if id.port == port && !keys.iter().any(|(i, _)| *i == id) {
                let _ = map.remove(&id);
                removed += 1;
            }
        }
        Ok((written, removed))
    }

    /// The ticket keys held, sorted by port and name.
    pub fn ticket_keys(&self) -> Result<Vec<(TicketKeyId, TicketMacKey)>, MapsError> {
        let map: HashMap<MapData, TicketKeyId, TicketMacKey> =
            open_as(&self.pins, names::TLS_TICKET_KEYS)?;
        let mut out = map
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_TICKET_KEYS))?;
        out.sort_by_key(|(k, _)| (k.port, k.name));
        Ok(out)
    }

    /// Removes every issued key the NIC published for a ticket whose MAC it checked
    /// ([`ISSUED_BY_KEY`]): after a ticket key was removed, no key it vouched for stays (the
    /// others' next offers are checked again). Returns how many.
    pub fn remove_issued_by_key(&mut self) -> Result<usize, MapsError> {
        self.remove_issued_where(|v| v.kind & ISSUED_BY_KEY != 0)
    }

    /// Every ticket tag key written, sorted by port and period.
    pub fn tag_keys(&self) -> Result<Vec<(TagKeyId, TagKey)>, MapsError> {
        let map: HashMap<MapData, TagKeyId, TagKey> = open_as(&self.pins, names::TLS_TAG_KEYS)?;
        let mut out = map
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_TAG_KEYS))?;
        out.sort_by_key(|(k, _)| (k.port, k.period));
        Ok(out)
    }

    /// The issued-keys table, opened on first use.
    fn issued_map(&self) -> Result<&HashMap<MapData, IssuedKey, IssuedValue>, MapsError> {
        if let Some(m) = self.tls.tls_issued.get() {
            return Ok(m);
        }
        let m = open_as(&self.pins, names::TLS_ISSUED)?;
        Ok(self.tls.tls_issued.get_or_init(|| m))
    }

    /// [`Maps::issued_map`], to change it.
    fn issued_map_mut(
        &mut self,
    ) -> Result<&mut HashMap<MapData, IssuedKey, IssuedValue>, MapsError> {
        self.issued_map()?;
        Ok(self.tls.tls_issued.get_mut().expect("opened just now"))
    }

    /// Whether an issued session key is published (and not withdrawn).
    pub fn is_issued(&self, key: &IssuedKey) -> Result<bool, MapsError> {
        match self.issued_map()?.get(key, 0) {
            Ok(v) => Ok(v.kind & ISSUED_WITHDRAWN == 0),
            Err(MapError::KeyNotFound) => Ok(false),
            Err(MapError::SyscallError(s)) if s.io_error.raw_os_error() == Some(libc::ENOENT) => {
                Ok(false)
            }
            Err(e) => Err(op(names::TLS_ISSUED)(e)),
        }
    }

    /// Every published key, sorted.
    pub fn issued(&self) -> Result<Vec<(IssuedKey, IssuedValue)>, MapsError> {
        let mut out = self
            .issued_map()?
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_ISSUED))?;
        out.sort_by_key(|(k, _)| *k);
        Ok(out)
    }

    /// Every tracked TLS connection, IPv4 ones (`TLS_FLOWS4`) by their IPv4-mapped key.
    pub fn tls_flows(&self) -> Result<Vec<(FlowKey, TlsFlow)>, MapsError> {
        let mut flows = self
            .tls
            .tls_flows
            .iter()
            .collect::<Result<Vec<_>, _>>()
            .map_err(op(names::TLS_FLOWS))?;
        if let Some(v4) = self.tls_flows4()? {
            for entry in v4.iter() {
                let (key, flow) = entry.map_err(op(names::TLS_FLOWS4))?;
                flows.push((key.mapped(), flow));
            }
        }
        Ok(flows)
    }

    /// The IPv4 flow table; `None` when it is not pinned (a datapath pinned by a build before
    /// it, whose IPv4 connections are in `TLS_FLOWS` until the next attach moves them).
    fn tls_flows4(&self) -> Result<Option<HashMap<MapData, FlowKey4, TlsFlow>>, MapsError> {
        if !self.pins.map(names::TLS_FLOWS4).exists() {
            return Ok(None);
        }
        open_as(&self.pins, names::TLS_FLOWS4).map(Some)
    }

    /// Forgets every tracked TLS connection, the refused ones in `TLS_REFUSED` too.
    pub fn clear_tls_flows(&mut self) -> Result<(), MapsError> {
        clear(&mut self.tls.tls_flows, names::TLS_FLOWS)?;
        if let Some(mut v4) = self.tls_flows4()? {
            clear(&mut v4, names::TLS_FLOWS4)?;
        }
        refused_slots(&self.pins, |slots, n| {
            // SAFETY: `n` slots of the mapped array; all-zero is an empty slot.
            unsafe { std::ptr::write_bytes(slots, 0, n) }
        })?;
        Ok(())
    }

    /// The connections `TLS_REFUSED` remembers as refused on their first segment (none, for a
    /// datapath pinned by a build before the table).
    pub fn tls_refused(&self) -> Result<Vec<FlowKey>, MapsError> {
        let keys = refused_slots(&self.pins, |slots, n| {
            (0..n)
                // SAFETY: slot `i < n` of the mapped array, aligned (8-byte elements).
                .map(|i| unsafe { slots.add(i).read_volatile() })
                .filter(|k| *k != FlowKey::default())
                .collect()
        })?;
        Ok(keys.unwrap_or_default())
    }
}
