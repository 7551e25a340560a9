//! Origins behind the proxy: a small HTTP/1.0 backend of the tests (answers, holds or never
//! answers; reads a PROXY v2 header when told to) and nginx.

use std::{
    io::{Read, Write},
    net::{Shutdown, SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Arc, Condvar, Mutex},
    time::Duration,
};

/// How a [`Backend`] answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `HTTP/1.0 200` with its name as the body, then close.
    Answer,
    /// Reads the request, then waits until released (or dropped) before answering.
    Hold,
    /// `HTTP/1.0 200` with a body of this many bytes, then close.
    Bulk(usize),
    /// Reads to the client's end, then answers with its name and the number of bytes it read.
    ToEnd,
    /// Speaks first (its name and a newline), ends its side, then reads to the client's end and
    /// records how many bytes it read ([`Backend::wait_for_upload`]).
    SpeakFirst,
}

#[derive(Default)]
struct Shared {
    /// Connections accepted.
    accepted: usize,
    /// Requests read in full (a connection that sends nothing is not counted).
    requests: usize,
    /// Bytes each [`Mode::SpeakFirst`] connection read to its client's end.
    uploads: Vec<usize>,
    /// Client addresses of the PROXY v2 headers received.
    proxied_from: Vec<SocketAddr>,
    released: bool,
}

/// A backend on a listener of the caller's (bound in whatever namespace it needs).
pub struct Backend {
    /// Its address.
    pub addr: SocketAddr,
    shared: Arc<(Mutex<Shared>, Condvar)>,
    listener: TcpListener,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Backend {
    /// Serves `listener` as `name` in `mode`; with `proxy_header`, each connection must start
    /// with a PROXY v2 header.
    pub fn start(listener: TcpListener, name: &str, mode: Mode, proxy_header: bool) -> Backend {
        Self::start_paced(listener, name, mode, proxy_header, None)
    }

    /// [`Backend::start`] for a server slow to accept: its listen queue holds `queue`
    /// connections and it accepts one per `pace` (a burst overflows the queue, and the kernel
    /// drops the SYNs beyond it).
    pub fn start_slow(listener: TcpListener, name: &str, queue: i32, pace: Duration) -> Backend {
        use std::os::fd::AsRawFd as _;
        // SAFETY: listen(2) again on a listening socket this function owns sets its queue.
        assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), queue) }, 0);
        Self::start_paced(listener, name, Mode::Answer, false, Some(pace))
    }

    fn start_paced(
        listener: TcpListener,
        name: &str,
        mode: Mode,
        proxy_header: bool,
        pace: Option<Duration>,
    ) -> Backend {
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new((Mutex::new(Shared::default()), Condvar::new()));
        let handle = listener.try_clone().unwrap();
        let (s, name) = (shared.clone(), name.to_string());
        let thread = std::thread::spawn(move || {
            while let Ok((sock, _)) = listener.accept() {
                s.0.lock().unwrap().accepted += 1;
                let (s, name) = (s.clone(), name.clone());
                std::thread::spawn(move || {
                    let _ = serve(sock, &name, mode, proxy_header, &s);
                });
                if let Some(pace) = pace {
                    std::thread::sleep(pace);
                }
            }
        });
        Backend {
            addr,
            shared,
            listener: handle,
            thread: Some(thread),
        }
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.shared.0.lock().unwrap().accepted
    }

    /// Requests read in full so far: unlike [`Backend::accepted`], a proxy's connection for a
    /// client that completed a handshake and left without asking anything does not count.
    pub fn requests(&self) -> usize {
        self.shared.0.lock().unwrap().requests
    }

    /// Waits until `n` requests were read in full; false when `timeout` passed first.
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> bool {
        let (lock, cv) = &*self.shared;
        let g = lock.lock().unwrap();
        let (g, _) = cv
            .wait_timeout_while(g, timeout, |s| s.requests < n)
            .unwrap();
        g.requests >= n
    }

    /// Waits until a [`Mode::SpeakFirst`] connection has read to its client's end; the bytes it
    /// read, `None` when `timeout` passed first.
    pub fn wait_for_upload(&self, timeout: Duration) -> Option<usize> {
        let (lock, cv) = &*self.shared;
        let g = lock.lock().unwrap();
        let (g, _) = cv
            .wait_timeout_while(g, timeout, |s| s.uploads.is_empty())
            .unwrap();
        g.uploads.first().copied()
    }

    /// Client addresses the PROXY headers carried.
    pub fn proxied_from(&self) -> Vec<SocketAddr> {
        self.shared.0.lock().unwrap().proxied_from.clone()
    }

    /// Lets held connections answer.
    pub fn release(&self) {
        self.shared.0.lock().unwrap().released = true;
        self.shared.1.notify_all();
    }
}

fn serve(
    mut sock: TcpStream,
    name: &str,
    mode: Mode,
    proxy_header: bool,
    shared: &(Mutex<Shared>, Condvar),
) -> std::io::Result<()> {
    sock.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 1024];
    if proxy_header {
        // Signature (12), version/command, family, length (2), then the addresses.
        let mut head = [0u8; 16];
        sock.read_exact(&mut head)?;
        let len = u16::from_be_bytes([head[14], head[15]]) as usize;
        let mut rest = vec![0u8; len];
        sock.read_exact(&mut rest)?;
        let mut all = head.to_vec();
        all.extend_from_slice(&rest);
        let header = ppp::v2::Header::try_from(all.as_slice()).map_err(std::io::Error::other)?;
        let from = match header.addresses {
            ppp::v2::Addresses::IPv4(a) => SocketAddr::from((a.source_address, a.source_port)),
            ppp::v2::Addresses::IPv6(a) => SocketAddr::from((a.source_address, a.source_port)),
            _ => return Err(std::io::Error::other("no addresses")),
        };
        shared.0.lock().unwrap().proxied_from.push(from);
    }
    match mode {
        Mode::ToEnd => {
            let read = std::io::copy(&mut sock, &mut std::io::sink())?;
            sock.write_all(format!("HTTP/1.0 200 OK\r\n\r\n{name} {read}\n").as_bytes())?;
            return sock.shutdown(Shutdown::Write);
        }
        Mode::SpeakFirst => {
            sock.write_all(format!("{name}\n").as_bytes())?;
            sock.shutdown(Shutdown::Write)?;
            let read = std::io::copy(&mut sock, &mut std::io::sink())?;
            shared.0.lock().unwrap().uploads.push(read as usize);
            shared.1.notify_all();
            return Ok(());
        }
        _ => {}
    }
    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut chunk)?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    shared.0.lock().unwrap().requests += 1;
    shared.1.notify_all();
    if mode == Mode::Hold {
        let mut g = shared.0.lock().unwrap();
        while !g.released {
            g = shared.1.wait(g).unwrap();
        }
    }
    if let Mode::Bulk(len) = mode {
        sock.write_all(format!("HTTP/1.0 200 OK\r\nContent-Length: {len}\r\n\r\n").as_bytes())?;
        let chunk = vec![b'x'; 64 * 1024];
        let mut left = len;
        while left > 0 {
            let n = left.min(chunk.len());
            sock.write_all(&chunk[..n])?;
            left -= n;
        }
        return sock.shutdown(Shutdown::Write);
    }
    sock.write_all(format!("HTTP/1.0 200 OK\r\n\r\n{name}\n").as_bytes())?;
    sock.shutdown(Shutdown::Write)
}

impl Drop for Backend {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd as _;
        self.release();
        // SAFETY: shutdown(2) on a descriptor this struct owns; it wakes the blocked accept.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// nginx with a config of `http_body` (the inside of its `http {}` block), run in the foreground
/// by `prefix` (e.g. `ip netns exec NS`), with its files in a temporary directory.
pub struct Nginx {
    child: std::process::Child,
    dir: PathBuf,
}

impl Nginx {
    /// Starts nginx; the caller waits for its port.
    pub fn start(prefix: &[&str], http_body: &str, workers: u32) -> Nginx {
        let dir = crate::fresh_temp_dir("gwt-nginx");
        let d = dir.display();
        let conf = format!(
            "worker_processes {workers};\npid {d}/nginx.pid;\nerror_log {d}/error.log;\n\
             events {{ worker_connections 4096; }}\n\
             http {{\n  access_log off;\n  client_body_temp_path {d};\n  proxy_temp_path {d};\n\
             fastcgi_temp_path {d};\n  uwsgi_temp_path {d};\n  scgi_temp_path {d};\n{http_body}\n}}\n"
        );
        std::fs::write(dir.join("nginx.conf"), conf).unwrap();
        let d = dir.display().to_string();
        let child = spawn_quiet(
            prefix,
            &["nginx", "-p", &d, "-c", "nginx.conf", "-g", "daemon off;"],
        );
        Nginx { child, dir }
    }

    /// The pid of its master process (`ip netns exec` execs nginx).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        stop(&mut self.child, &self.dir);
    }
}

/// HAProxy with the config `body` (everything after its `global` section), run in the
/// foreground (`-db`) by `prefix` (e.g. `ip netns exec NS`), with its files in a temporary
/// directory.
pub struct Haproxy {
    child: std::process::Child,
    dir: PathBuf,
}

impl Haproxy {
    /// Starts HAProxy; the caller waits for its port.
    pub fn start(prefix: &[&str], body: &str) -> Haproxy {
        let dir = crate::fresh_temp_dir("gwt-haproxy");
        let conf = format!(
            "global\n  maxconn 4096\n\ndefaults\n  mode http\n  timeout connect 5s\n  \
             timeout client 30s\n  timeout server 30s\n\n{body}\n"
        );
        let path = dir.join("haproxy.cfg");
        std::fs::write(&path, conf).unwrap();
        let child = spawn_quiet(
            prefix,
            &["haproxy", "-db", "-f", &path.display().to_string()],
        );
        Haproxy { child, dir }
    }
}

/// Starts `command` under `prefix` (`ip netns exec NS`), its standard streams closed: a server
/// in the foreground.
fn spawn_quiet(prefix: &[&str], command: &[&str]) -> std::process::Child {
    let all: Vec<&str> = prefix.iter().chain(command).copied().collect();
    Command::new(all[0])
        .args(&all[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", command[0]))
}

/// Stops a server started by [`spawn_quiet`] (SIGTERM: a master stops its workers and exits;
/// SIGKILL would orphan them), waits for it, and removes its directory.
fn stop(child: &mut std::process::Child, dir: &std::path::Path) {
    // SAFETY: signalling a process the caller started and has not reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(dir);
}

impl Drop for Haproxy {
    fn drop(&mut self) {
        stop(&mut self.child, &self.dir);
    }
}
