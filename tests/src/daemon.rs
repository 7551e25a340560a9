//! A `gateway run` daemon spawned in the gateway namespace, with its log lines collected so tests
//! can wait for what it says instead of sleeping.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, ExitStatus, Stdio},
    sync::mpsc::{Receiver, RecvTimeoutError, channel},
    time::{Duration, Instant},
};

use nix::{
    sys::signal::{Signal, kill},
    unistd::Pid,
};

use crate::netns::TestNet;

/// The longest a daemon may take to load and attach its programs and say so: the verifier's
/// work on every program, which on a busy two-core machine running other tests beside it takes
/// several times what it takes on a quiet one. A bound on waiting, never a margin a test relies
/// on: a daemon that is ready sooner is seen at once.
pub const STARTUP: Duration = Duration::from_secs(60);

/// A running daemon; killed on drop if still running.
pub struct Daemon {
    child: Child,
    lines: Receiver<String>,
    /// Every line logged so far.
    pub log: Vec<String>,
}

impl Daemon {
    /// Spawns `gateway run ARGS` in the gateway namespace and waits (at most `timeout`) for it to
    /// log "gateway ready". Panics with its log if it exits or times out first. It logs at
    /// `info`, or with the filter in `GW_LOG` when set (for example
    /// `GW_LOG=info,gateway::controller=debug` to follow the controller's inputs in a benchmark).
    pub fn start(net: &TestNet, args: &[&str], timeout: Duration) -> Daemon {
        let filter = std::env::var("GW_LOG").unwrap_or_else(|_| "info".into());
        Self::start_logging(net, args, &filter, timeout)
    }

    /// `gateway run` on the gateway's veth with a config of `body` (services, policy, datapath
    /// settings: YAML at top level) written into `dir`, detaching on exit.
    pub fn start_config(net: &TestNet, dir: &std::path::Path, body: &str) -> Daemon {
        Self::start_config_nofile(net, dir, body, None)
    }

    /// Writes the config [`Daemon::start_config`] runs with (`body` on the gateway's veth,
    /// detaching on exit unless `body` has an `on_exit:` line of its own) into `dir`; its path.
    /// Written again, it is what a reload reads.
    pub fn write_config(net: &TestNet, dir: &std::path::Path, body: &str) -> std::path::PathBuf {
        let cfg = dir.join("gateway.yaml");
        let on_exit = if body.lines().any(|l| l.starts_with("on_exit:")) {
            ""
        } else {
            "on_exit: detach\n"
        };
        std::fs::write(
            &cfg,
            format!("interfaces:\n  - name: {}\n{body}{on_exit}", net.gw_if),
        )
        .expect("write config");
        cfg
    }

    /// [`Daemon::start_config`], its open-files limit (soft and hard) set to `nofile` when given.
    pub fn start_config_nofile(
        net: &TestNet,
        dir: &std::path::Path,
        body: &str,
        nofile: Option<u64>,
    ) -> Daemon {
        let cfg = Self::write_config(net, dir, body);
        let filter = std::env::var("GW_LOG").unwrap_or_else(|_| "info".into());
        Self::spawn(
            net,
            &["--config", cfg.to_str().unwrap()],
            &filter,
            STARTUP,
            nofile,
        )
    }

    /// [`Daemon::start_config`] with no capability beyond `caps` (names as systemd writes them,
    /// `CAP_BPF`): its bounding set is cut to them by `setpriv` inside the namespace, as a
    /// systemd unit's `CapabilityBoundingSet=` does.
    pub fn start_config_capped(
        net: &TestNet,
        dir: &std::path::Path,
        body: &str,
        caps: &[&str],
    ) -> Daemon {
        let cfg = Self::write_config(net, dir, body);
        let command = net.gateway_command_capped(&["run", "--config", cfg.to_str().unwrap()], caps);
        Self::spawn_command(command, "info", STARTUP)
    }

    /// [`Daemon::start_config_capped`] as the user and group `uid`
    /// ([`TestNet::gateway_command_as`]).
    pub fn start_config_as(
        net: &TestNet,
        dir: &std::path::Path,
        body: &str,
        caps: &[&str],
        uid: u32,
    ) -> Daemon {
        let cfg = Self::write_config(net, dir, body);
        let command =
            net.gateway_command_as(&["run", "--config", cfg.to_str().unwrap()], caps, uid);
        Self::spawn_command(command, "info", STARTUP)
    }

    /// [`Daemon::start`] with `RUST_LOG` set to `filter`.
    pub fn start_logging(net: &TestNet, args: &[&str], filter: &str, timeout: Duration) -> Daemon {
        Self::spawn(net, args, filter, timeout, None)
    }

    fn spawn(
        net: &TestNet,
        args: &[&str],
        filter: &str,
        timeout: Duration,
        nofile: Option<u64>,
    ) -> Daemon {
        use std::os::unix::process::CommandExt as _;
        let mut all = vec!["run"];
        all.extend_from_slice(args);
        let mut command = net.gateway_command(&all);
        if let Some(n) = nofile {
            // SAFETY: setrlimit only, between fork and exec; the limit passes through `ip
            // netns exec` to the daemon.
            unsafe {
                command.pre_exec(move || {
                    let limit = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        Self::spawn_command(command, filter, timeout)
    }

    /// Spawns `command` (a `gateway run` line) with `RUST_LOG` at `filter` and waits, at most
    /// `timeout`, for it to log "gateway ready".
    pub fn spawn_command(mut command: Command, filter: &str, timeout: Duration) -> Daemon {
        let mut child = command
            .env("RUST_LOG", filter)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn gateway run");
        let stderr = child.stderr.take().expect("stderr");
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut d = Daemon {
            child,
            lines,
            log: Vec::new(),
        };
        d.wait_for("gateway ready", timeout);
        d
    }

    /// Waits until a log line contains `needle`; returns that line.
    pub fn wait_for(&mut self, needle: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.log.push(line.clone());
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "no {needle:?} within {timeout:?}; log:\n{}",
                        self.log.join("\n")
                    )
                }
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "daemon exited before {needle:?} ({:?}); log:\n{}",
                    self.child.try_wait(),
                    self.log.join("\n")
                ),
            }
        }
    }

    /// The daemon's pid (`ip netns exec` execs the gateway, so the child's pid is the daemon's).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Raises every thread of the daemon above processes of the default priority (nice -10;
    /// threads it starts later inherit it): for a test that times the daemon's own work by
    /// the clock, so that a CPU-bound process beside it cannot stretch the times measured.
    pub fn above_neighbours(&self) {
        above_neighbours(self.pid());
    }

    /// Pins every thread of the daemon to CPU `core` (`taskset -a`), as the benchmarks do.
    pub fn pin_to_core(&self, core: u32) {
        let pinned = std::process::Command::new("taskset")
            .args(["-a", "-p", "-c", &core.to_string(), &self.pid().to_string()])
            .output()
            .expect("taskset");
        assert!(pinned.status.success(), "taskset: {pinned:?}");
    }

    /// Open file descriptors of the daemon now.
    pub fn fd_count(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid()))
            .expect("/proc/PID/fd")
            .count()
    }

    /// Kills the daemon (SIGKILL, as a crash would) and reaps it.
    pub fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_term(&self) {
        kill(Pid::from_raw(self.pid() as i32), Signal::SIGTERM).expect("SIGTERM");
    }

    /// Sends SIGTERM and waits (at most `timeout`) for the exit; returns the status.
    pub fn terminate(self, timeout: Duration) -> (ExitStatus, Vec<String>) {
        self.signal_term();
        self.wait_exit(timeout)
    }

    /// Waits (at most `timeout`) for the daemon to exit; returns the status and its whole log.
    pub fn wait_exit(mut self, timeout: Duration) -> (ExitStatus, Vec<String>) {
        let deadline = Instant::now() + timeout;
        loop {
            // Drain the log as it arrives; the channel closes when the daemon's stderr does.
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(line) => self.log.push(line),
                Err(RecvTimeoutError::Disconnected) => break,
                Err(RecvTimeoutError::Timeout) => {
                    panic!(
                        "daemon still running after SIGTERM; log:\n{}",
                        self.log.join("\n")
                    )
                }
            }
        }
        let status = self.child.wait().expect("wait");
        (status, std::mem::take(&mut self.log))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Nice -10 for every thread of the process `pid` (threads it starts later inherit it), so
/// that processes of the default priority beside it barely delay it.
pub fn above_neighbours(pid: u32) {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("/proc/PID/task");
    for task in tasks {
        let tid: libc::id_t = task
            .expect("a task")
            .file_name()
            .to_str()
            .and_then(|t| t.parse().ok())
            .expect("a thread id");
        // SAFETY: setpriority on a thread id; no memory passed.
        let set = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, -10) };
        assert_eq!(
            set,
            0,
            "setpriority {tid}: {}",
            std::io::Error::last_os_error()
        );
    }
}
