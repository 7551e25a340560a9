//! One attached interface, as the daemon's parts share it: its name, its pin directory and one
//! set of map handles. The daemon opens each attachment once and hands the same
//! [`Attached`] to the proxies (issued keys), the metrics collector and the controller; and the
//! lock that makes one process the holder of an interface's datapath.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::{
    datapath::maps::{Maps, MapsError},
    datapath::pins::{DirLock, PinDir, PinsError},
};

/// Holds the datapath of `pd`'s interface for this process ([`PinDir::lock`]), or says who
/// holds it: the daemon for its life, `gateway attach` and `detach` for the time of their change.
pub fn hold(pd: &PinDir) -> Result<DirLock, PinsError> {
    if let Some(lock) = pd.lock()? {
        return Ok(lock);
    }
    let pid = Maps::open(pd)
        .and_then(|m| m.config())
        .map_or(0, |c| c.daemon_pid);
    Err(PinsError::Owned {
        iface: pd.iface.clone(),
        owner: if pid != 0 {
            format!("`gateway run` (pid {pid})")
        } else {
            "another gateway process (starting, or attaching)".to_string()
        },
    })
}

/// An attached interface and its maps.
pub struct Attached {
    iface: String,
    pins: PinDir,
    maps: Mutex<Maps>,
}

impl Attached {
    /// Opens the maps pinned for `iface` in `pins`.
    ///
    /// # Errors
    /// [`MapsError`] when a pinned map is missing or not of its type.
    pub fn open(iface: &str, pins: PinDir) -> Result<Arc<Self>, MapsError> {
        let maps = Mutex::new(Maps::open(&pins)?);
        Ok(Arc::new(Attached {
            iface: iface.to_string(),
            pins,
            maps,
        }))
    }

    /// The interface's name.
    pub fn iface(&self) -> &str {
        &self.iface
    }

    /// Its pin directory.
    pub fn pins(&self) -> &PinDir {
        &self.pins
    }

    /// Its maps, for one operation or a few (held briefly: other parts wait meanwhile). A panic
    /// elsewhere while holding them leaves every map consistent (each call is one map
    /// operation), so a poisoned lock is still usable.
    pub fn maps(&self) -> MutexGuard<'_, Maps> {
        self.maps.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("iface", &self.iface)
            .finish()
    }
}
