//! What kind of device an interface is, from the kernel's ethtool interface
//! (`ETHTOOL_GDRVINFO`): the loader asks so it knows whether a reply sent with XDP_TX leaves.

use std::{ffi::c_void, io};

use thiserror::Error;

/// Why a device's driver could not be read.
#[derive(Debug, Error)]
pub enum EthtoolError {
    /// The interface name does not fit an `ifreq`.
    #[error("interface name {0:?} is longer than 15 bytes")]
    Name(String),
    /// The socket or the ioctl failed.
    #[error("reading the driver of {iface}: {source}")]
    Io {
        /// The interface.
        iface: String,
        /// The error.
        source: io::Error,
    },
}

/// `struct ethtool_drvinfo` of `<linux/ethtool.h>`.
#[repr(C)]
struct DrvInfo {
    cmd: u32,
    driver: [u8; 32],
    version: [u8; 32],
    fw_version: [u8; 32],
    bus_info: [u8; 32],
    erom_version: [u8; 32],
    reserved2: [u8; 12],
    n_priv_flags: u32,
    n_stats: u32,
    testinfo_len: u32,
    eedump_len: u32,
    regdump_len: u32,
}

/// `struct ifreq` with its `ifr_data` member, padded to the kernel's 40 bytes.
#[repr(C)]
struct IfReq {
    name: [u8; 16],
    data: *mut c_void,
    pad: [u8; 16],
}

const ETHTOOL_GDRVINFO: u32 = 0x0000_0003;

/// The name of the driver behind `iface` in the calling thread's namespace (`veth`, `mlx5_core`,
/// `virtio_net`, ...).
pub fn driver(iface: &str) -> Result<String, EthtoolError> {
    let bytes = iface.as_bytes();
    if bytes.len() > 15 {
        return Err(EthtoolError::Name(iface.into()));
    }
    let io_err = |source| EthtoolError::Io {
        iface: iface.into(),
        source,
    };
    // SAFETY: zeroed plain-data structs, then an ioctl that fills `info` through `req.data`,
    // which points at it for the call's duration; the socket is closed before returning.
    unsafe {
        let mut info: DrvInfo = std::mem::zeroed();
        info.cmd = ETHTOOL_GDRVINFO;
        let mut req = IfReq {
            name: [0; 16],
            data: (&raw mut info).cast(),
            pad: [0; 16],
        };
        req.name[..bytes.len()].copy_from_slice(bytes);
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return Err(io_err(io::Error::last_os_error()));
        }
        let r = libc::ioctl(fd, libc::SIOCETHTOOL, &raw mut req);
        let err = io::Error::last_os_error();
        libc::close(fd);
        if r < 0 {
            return Err(io_err(err));
        }
        let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
        Ok(String::from_utf8_lossy(&info.driver[..end]).into_owned())
    }
}

/// Whether a frame sent back out of `iface` with XDP_TX may never leave: a veth delivers it
/// only to a peer that runs NAPI (an XDP program of its own), which the gateway cannot know
/// or count on. An unreadable driver is taken as a veth (the safe answer: the reply then goes
/// out through TC, which always leaves).
pub fn xdp_tx_may_vanish(iface: &str) -> bool {
    driver(iface).map_or(true, |d| d == "veth")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_layouts_match_the_kernel() {
        assert_eq!(size_of::<DrvInfo>(), 196);
        assert_eq!(size_of::<IfReq>(), 40);
    }

    #[test]
    fn loopback_has_no_ethtool_driver_and_long_names_are_refused() {
        assert!(matches!(
            driver("a-name-far-too-long"),
            Err(EthtoolError::Name(_))
        ));
        // `lo` answers GDRVINFO with an error or an empty driver, never a veth's.
        assert_ne!(driver("lo").ok().as_deref(), Some("veth"));
    }
}
