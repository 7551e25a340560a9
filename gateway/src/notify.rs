//! systemd's service notifications (`sd_notify(3)`): one datagram of `KEY=VALUE` lines to the
//! socket `$NOTIFY_SOCKET` names, so a `Type=notify` unit is started when the daemon is ready
//! (not when its process exists) and knows when it stops or reloads. Nothing without the
//! variable (run by hand, in a container).

use std::{io, os::unix::net::UnixDatagram};

/// The daemon serves: its datapath attached, its maps written, its listeners open.
pub const READY: &str = "READY=1";
/// The daemon stops: draining its connections.
pub const STOPPING: &str = "STOPPING=1";

/// Sends `state` to `$NOTIFY_SOCKET`; `Ok(false)` when there is none.
pub fn notify(state: &str) -> io::Result<bool> {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return Ok(false);
    };
    let socket = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        // An abstract socket: '@' stands for the leading NUL.
        use std::os::linux::net::SocketAddrExt as _;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        socket.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        socket.send_to(state.as_bytes(), &path)?;
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reaches_the_named_socket() {
        let path = std::env::temp_dir().join(format!("gw-notify-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let manager = UnixDatagram::bind(&path).unwrap();
        // SAFETY: this test alone in its process reads or writes NOTIFY_SOCKET.
        unsafe { std::env::set_var("NOTIFY_SOCKET", &path) };
        assert!(notify(READY).unwrap());
        let mut buf = [0u8; 64];
        let n = manager.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], READY.as_bytes());
        // SAFETY: as above.
        unsafe { std::env::remove_var("NOTIFY_SOCKET") };
        assert!(!notify(STOPPING).unwrap());
        std::fs::remove_file(path).unwrap();
    }
}
