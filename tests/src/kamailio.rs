//! A real Kamailio for the tests: one worker, stateless, answering every request with `200 OK`
//! (the `sl` module adds its own To tag), started by the test and killed when dropped, with
//! every process it forked.

use std::{
    net::{SocketAddr, UdpSocket},
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::{
    fresh_temp_dir,
    netns::{GW_V4, PEER_V4, TestNet},
};

/// A running Kamailio and its directory.
pub struct Kamailio {
    child: Child,
    dir: PathBuf,
}

impl Kamailio {
    /// Starts Kamailio listening on udp `listen`, run under `prefix` (for example
    /// `["ip", "netns", "exec", NS]`; empty for this namespace). It may take a moment before it
    /// answers: callers resend (bounded) until it does.
    pub fn start(prefix: &[&str], listen: SocketAddr) -> Self {
        Self::start_with_cost(prefix, listen, std::time::Duration::ZERO, None)
    }

    /// [`Kamailio::start`], its one worker busy for `invite_cost` on each INVITE before it
    /// answers (cfgutils' `usleep`, as a database lookup would hold it): a server of known
    /// capacity for overload runs. `max_rcvbuf` raises the most its UDP receive buffer probing
    /// may reach (`-b`; the kernel also caps it at `net.core.rmem_max`); `None` keeps
    /// Kamailio's own default.
    pub fn start_with_cost(
        prefix: &[&str],
        listen: SocketAddr,
        invite_cost: std::time::Duration,
        max_rcvbuf: Option<usize>,
    ) -> Self {
        let dir = fresh_temp_dir("gwt-kamailio");
        let cfg = dir.join("kamailio.cfg");
        let cost = invite_cost.as_micros();
        let work = if cost > 0 {
            format!("    if (method == \"INVITE\") {{ usleep(\"{cost}\"); }}\n")
        } else {
            String::new()
        };
        std::fs::write(
            &cfg,
            format!(
                "#!KAMAILIO\ndebug=1\nlog_stderror=yes\nchildren=1\nlisten=udp:{listen}\n\
                 loadmodule \"sl.so\"\nloadmodule \"cfgutils.so\"\n\
                 request_route {{\n{work}    sl_send_reply(\"200\", \"OK\");\n}}\n"
            ),
        )
        .unwrap();
        let mut all: Vec<String> = prefix.iter().map(|s| s.to_string()).collect();
        all.extend(["kamailio", "-DD", "-E"].map(String::from));
        if let Some(b) = max_rcvbuf {
            all.extend(["-b".to_string(), b.to_string()]);
        }
        all.push("-f".into());
        all.push(cfg.display().to_string());
        all.push("-P".into());
        all.push(dir.join("kamailio.pid").display().to_string());
        let child = Command::new(&all[0])
            .args(&all[1..])
            // A process group of its own: Kamailio forks its workers (and timers), which a
            // kill of the main process alone would leave running.
            .process_group(0)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("kamailio (cargo xtask setup installs it)");
        Kamailio { child, dir }
    }

    /// Its directory (config and pid file): every one of its processes names it.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Waits (bounded) until the server at GW_V4:5060 in `net`'s gateway namespace answers an
/// OPTIONS sent from the peer namespace (a Kamailio takes a moment to start).
pub fn wait_answering(net: &TestNet) {
    let sock = net.in_peer(|| UdpSocket::bind((PEER_V4, 0)).unwrap());
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let port = sock.local_addr().unwrap().port();
    let options = format!(
        "OPTIONS sip:k@{GW_V4}:5060 SIP/2.0\r\nVia: SIP/2.0/UDP {PEER_V4}:{port};branch=z9hG4bK-up;rport\r\nFrom: <sip:t@{PEER_V4}>;tag=1\r\nTo: <sip:k@{GW_V4}>\r\nCall-ID: up@{PEER_V4}\r\nCSeq: 1 OPTIONS\r\nContent-Length: 0\r\n\r\n"
    );
    let mut buf = [0u8; 2048];
    let up = (0..100).any(|_| {
        sock.send_to(options.as_bytes(), (GW_V4, 5060)).unwrap();
        sock.recv(&mut buf).is_ok()
    });
    assert!(up, "kamailio never answered");
}

/// Processes whose command line names `dir` (a [`Kamailio`]'s, say).
pub fn processes_naming(dir: &Path) -> Vec<u32> {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).contains(&needle))
        })
        .collect()
}

impl Drop for Kamailio {
    fn drop(&mut self) {
        // SAFETY: signalling the process group this struct started (its leader not yet reaped,
        // so the group id is not reused).
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
        // The forked processes die as the signal lands; bounded wait until none is left.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !processes_naming(&self.dir).is_empty() && Instant::now() < deadline {
            std::thread::yield_now();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
