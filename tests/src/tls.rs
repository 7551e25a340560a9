//! Real TLS clients and servers for tests: openssl's s_server and s_client, curl, and a loopback
//! listener that captures the first TLS record a client sends (its ClientHello).

use std::{
    io::Read,
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

/// A self-signed certificate (CN and SAN `gateway-test`, IP SANs 10.99.0.1 and 127.0.0.1) and key
/// in a temporary directory, removed on drop.
pub struct Cert {
    dir: PathBuf,
}

impl Cert {
    /// Generates a P-256 certificate for CN=gateway-test, valid for a day.
    pub fn new() -> Self {
        Self::valid_for(1)
    }

    /// [`Cert::new`], valid for `days`.
    pub fn valid_for(days: u32) -> Self {
        Self::with_key_days(
            &["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"],
            days,
        )
    }

    /// Generates an RSA certificate of `bits` for CN=gateway-test (2048, the web's most common
    /// key; 4096, the largest in common use), whose signature makes a full handshake several
    /// times dearer than with P-256.
    pub fn rsa(bits: u32) -> Self {
        Self::with_key(&["-newkey", &format!("rsa:{bits}")])
    }

    /// Generates a certificate with the key `openssl req` makes from `key_args`, valid a day.
    fn with_key(key_args: &[&str]) -> Self {
        Self::with_key_days(key_args, 1)
    }

    /// Generates a certificate with the key `openssl req` makes from `key_args`, valid `days`.
    fn with_key_days(key_args: &[&str], days: u32) -> Self {
        let dir = crate::fresh_temp_dir("gwt-cert");
        let c = Cert { dir };
        let out = Command::new("openssl")
            .args(["req", "-x509"])
            .args(key_args)
            .args([
                "-nodes",
                "-subj",
                "/CN=gateway-test",
                "-days",
                &days.to_string(),
            ])
            .args([
                "-addext",
                "subjectAltName=DNS:gateway-test,IP:10.99.0.1,IP:127.0.0.1",
            ])
            // A leaf, not a CA: webpki refuses a CA certificate as the end entity.
            .args(["-addext", "basicConstraints=critical,CA:FALSE"])
            .args(["-addext", "extendedKeyUsage=serverAuth"])
            .arg("-keyout")
            .arg(c.key())
            .arg("-out")
            .arg(c.cert())
            .output()
            .expect("openssl req");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        c
    }

    /// Certificate path.
    pub fn cert(&self) -> PathBuf {
        self.dir.join("cert.pem")
    }

    /// Key path.
    pub fn key(&self) -> PathBuf {
        self.dir.join("key.pem")
    }

    /// A path in the same temporary directory.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Default for Cert {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for Cert {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A child process killed on drop.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (at most ten seconds) until `connect` succeeds.
pub fn wait_listening(mut connect: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !connect() {
        assert!(Instant::now() < deadline, "server did not start listening");
        std::thread::yield_now();
    }
}

/// `openssl s_server` on 127.0.0.1:`port` with `extra` options, started by `prefix` (for example
/// `ip netns exec NS`), once it accepts connections.
pub fn s_server(prefix: &[&str], cert: &Cert, port: u16, extra: &[&str]) -> Proc {
    let mut cmd = if let [first, rest @ ..] = prefix {
        let mut c = Command::new(first);
        c.args(rest).arg("openssl");
        c
    } else {
        Command::new("openssl")
    };
    cmd.args(["s_server", "-quiet", "-www", "-accept", &port.to_string()])
        .arg("-cert")
        .arg(cert.cert())
        .arg("-key")
        .arg(cert.key())
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    Proc(cmd.spawn().expect("openssl s_server"))
}

/// Runs `openssl s_client -connect ADDR ARGS </dev/null` (with `prefix`); returns its output.
pub fn s_client(prefix: &[&str], addr: &str, args: &[&str]) -> String {
    s_client_input(prefix, addr, args, b"")
}

/// [`s_client`] writing `input` to its stdin (then EOF). Sending `GET / HTTP/1.0` to an
/// `s_server -www` makes the server answer and close, so the client has read everything the
/// server sent, TLS 1.3 session tickets included, by the time it exits.
pub fn s_client_input(prefix: &[&str], addr: &str, args: &[&str], input: &[u8]) -> String {
    use std::io::Write as _;
    let mut child = spawn_s_client(prefix, addr, args, Stdio::piped());
    let mut stdin = child.stdin.take().expect("stdin");
    let _ = stdin.write_all(input);
    drop(stdin);
    let out = child.wait_with_output().expect("openssl s_client");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Starts `openssl s_client -connect addr ARGS` under `prefix` (`ip netns exec NS`), its
/// standard input and output piped, its standard error to `stderr`.
fn spawn_s_client(
    prefix: &[&str],
    addr: &str,
    args: &[&str],
    stderr: Stdio,
) -> std::process::Child {
    let mut all: Vec<&str> = prefix.to_vec();
    all.extend_from_slice(&["openssl", "s_client", "-connect", addr]);
    all.extend_from_slice(args);
    Command::new(all[0])
        .args(&all[1..])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .expect("openssl s_client")
}

/// An `openssl s_client` kept connected: its standard input stays open, so it neither sends
/// nor closes until dropped (killed, which closes its connection).
pub struct HeldClient {
    child: std::process::Child,
    _stdin: std::process::ChildStdin,
}

impl HeldClient {
    /// Connects `openssl s_client -connect addr ARGS` (run under `prefix`) and waits, at most
    /// `wait`, for its handshake: `Some("Reused")` or `Some("New")` as s_client reports it, or
    /// `None` when it failed (a refused connection: s_client read nothing from the server),
    /// ended, or said nothing in time.
    pub fn connect(
        prefix: &[&str],
        addr: &str,
        args: &[&str],
        wait: Duration,
    ) -> (Self, Option<&'static str>) {
        use std::io::BufRead as _;
        let mut child = spawn_s_client(prefix, addr, args, Stdio::null());
        let stdin = child.stdin.take().expect("stdin");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A refused connection: s_client still prints a summary ("New", with the
                // cipher of the session it offered), after saying it read nothing.
                if line.starts_with("New, (NONE)") || line.contains("handshake has read 0 bytes") {
                    return;
                }
                for kind in ["Reused", "New"] {
                    if line.starts_with(&format!("{kind},")) {
                        let _ = tx.send(kind);
                        return;
                    }
                }
            }
        });
        let kind = rx.recv_timeout(wait).ok();
        (
            HeldClient {
                child,
                _stdin: stdin,
            },
            kind,
        )
    }
}

impl Drop for HeldClient {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Accepts one connection on a loopback listener and returns the first TLS record the client
/// sends, while `client` runs (on another thread) against `addr`.
pub fn capture_hello(client: impl FnOnce(String) + Send) -> Vec<u8> {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::scope(|s| {
        s.spawn(move || client(addr));
        let (mut c, _) = listener.accept().unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut head = [0u8; 5];
        c.read_exact(&mut head).unwrap();
        let len = u16::from_be_bytes([head[3], head[4]]) as usize;
        let mut rec = head.to_vec();
        rec.resize(5 + len, 0);
        c.read_exact(&mut rec[5..]).unwrap();
        rec
    })
}

/// A free loopback TCP port (bound and released) below the kernel's ephemeral range, for a
/// server started after this returns. A port the kernel picked for a bind to port 0 (as this did
/// before) may be handed out again to the next such bind, a test's own listener or a client's
/// connection, before the server takes it: two tests running at once met on one port and waited
/// on each other for good.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    // Ports 20000..32000, from a place of this process's own, each offered once per process.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 20000 + (std::process::id() % 1000) as u16 * 12;
    for _ in 0..12000 {
        let port = 20000 + (base - 20000 + NEXT.fetch_add(1, Ordering::Relaxed)) % 12000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port in 20000..32000");
}

/// Whether something accepts on 127.0.0.1:`port`.
pub fn accepts(port: u16) -> bool {
    TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// Whether `path` exists and is not empty.
pub fn non_empty(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.len() > 0)
}

/// What a client resuming from session file `sess` offers, whole, as hex: its ticket (TLS 1.3
/// PSK identity or TLS 1.2 ticket), else its session id (`gateway tls issued add` takes it).
pub fn session_key(sess: &Path) -> String {
    let out = Command::new("openssl")
        .args(["sess_id", "-noout", "-text", "-in"])
        .arg(sess)
        .output()
        .expect("openssl sess_id");
    let text = String::from_utf8_lossy(&out.stdout);
    // "0000 - 8b 5a 1a c3 99 e1 7e 2b-b0 f6 79 50 71 f7 e5 00   .Z....", one line per 16 bytes.
    let ticket: String = text
        .lines()
        .map(str::trim)
        .skip_while(|l| !l.starts_with("TLS session ticket:"))
        .skip(1)
        .take_while(|l| l.len() > 7 && l.as_bytes()[4..7] == *b" - ")
        .flat_map(|l| {
            l[7..]
                .split("   ")
                .next()
                .unwrap()
                .chars()
                .filter(char::is_ascii_hexdigit)
                .collect::<Vec<_>>()
        })
        .collect();
    if !ticket.is_empty() {
        assert!(ticket.len() >= 32, "ticket: {ticket}");
        return ticket.to_lowercase();
    }
    let sid = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Session-ID: "))
        .expect("Session-ID");
    assert!(sid.len() >= 32, "session id: {sid}");
    sid.to_lowercase()
}

/// A rustls client configuration (aws-lc-rs, post-quantum key exchange preferred, TLS 1.2 and
/// 1.3, in-memory session resumption) trusting `cert` as its only root.
pub fn rustls_config(cert: &Cert) -> std::sync::Arc<rustls::ClientConfig> {
    std::sync::Arc::new(
        rustls::ClientConfig::builder()
            .with_root_certificates(roots(cert))
            .with_no_client_auth(),
    )
}

/// [`rustls_config`] with X25519 its only key exchange: no post-quantum hybrid key share, so
/// its ClientHello (about 250 B) fits one segment, like an older client's or the cheapest hello
/// a flood can send that still costs the server a full handshake.
pub fn rustls_config_classic(cert: &Cert) -> std::sync::Arc<rustls::ClientConfig> {
    let provider = rustls::crypto::CryptoProvider {
        kx_groups: vec![rustls::crypto::aws_lc_rs::kx_group::X25519],
        ..rustls::crypto::aws_lc_rs::default_provider()
    };
    std::sync::Arc::new(
        rustls::ClientConfig::builder_with_provider(provider.into())
            .with_safe_default_protocol_versions()
            .expect("X25519 suits every default version")
            .with_root_certificates(roots(cert))
            .with_no_client_auth(),
    )
}

/// `cert` as the one trusted root.
fn roots(cert: &Cert) -> rustls::RootCertStore {
    use rustls::pki_types::{CertificateDer, pem::PemObject as _};
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_file(cert.cert()).expect("certificate PEM"))
        .expect("root");
    roots
}

/// Connects with rustls to `addr` as `gateway-test`, sends `GET / HTTP/1.0`, reads the answer to
/// the end; returns the handshake kind rustls reports (Full or Resumed).
pub fn rustls_get(
    config: &std::sync::Arc<rustls::ClientConfig>,
    addr: &str,
) -> std::io::Result<rustls::HandshakeKind> {
    rustls_fetch(config, addr).map(|(kind, _)| kind)
}

/// [`rustls_get`], returning the answer too.
pub fn rustls_fetch(
    config: &std::sync::Arc<rustls::ClientConfig>,
    addr: &str,
) -> std::io::Result<(rustls::HandshakeKind, String)> {
    rustls_fetch_within(config, addr, Duration::from_secs(10))
}

/// [`rustls_fetch`], waiting at most `wait` for each read (an answer a backend holds).
pub fn rustls_fetch_within(
    config: &std::sync::Arc<rustls::ClientConfig>,
    addr: &str,
    wait: Duration,
) -> std::io::Result<(rustls::HandshakeKind, String)> {
    use std::io::Write as _;
    let name = rustls::pki_types::ServerName::try_from("gateway-test").unwrap();
    let conn =
        rustls::ClientConnection::new(config.clone(), name).map_err(std::io::Error::other)?;
    let sock = TcpStream::connect(addr)?;
    sock.set_read_timeout(Some(wait))?;
    // As browsers do: the client's Finished and its request are separate writes, which Nagle
    // would hold behind the server's delayed acknowledgement (40 ms).
    sock.set_nodelay(true)?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    tls.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
    let mut body = Vec::new();
    match tls.read_to_end(&mut body) {
        Ok(_) => {}
        // s_server -www closes without close_notify.
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {}
        Err(e) => return Err(e),
    }
    let kind = tls
        .conn
        .handshake_kind()
        .ok_or_else(|| std::io::Error::other("no handshake"))?;
    Ok((kind, String::from_utf8_lossy(&body).into_owned()))
}

/// A ticketer that records every ticket it issues (the PSK identities clients will offer).
#[derive(Debug)]
struct RecordingTicketer {
    inner: std::sync::Arc<dyn rustls::server::ProducesTickets>,
    issued: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl rustls::server::ProducesTickets for RecordingTicketer {
    fn enabled(&self) -> bool {
        self.inner.enabled()
    }
    fn lifetime(&self) -> u32 {
        self.inner.lifetime()
    }
    fn encrypt(&self, plain: &[u8]) -> Option<Vec<u8>> {
        let ticket = self.inner.encrypt(plain)?;
        self.issued.lock().unwrap().push(ticket.clone());
        Some(ticket)
    }
    fn decrypt(&self, cipher: &[u8]) -> Option<Vec<u8>> {
        self.inner.decrypt(cipher)
    }
}

/// A small HTTPS server on rustls (aws-lc-rs: X25519MLKEM768 first, TLS 1.3 tickets) for tests:
/// answers `HTTP/1.0 200` to each connection, each on a thread of its own (a silent client stalls
/// only itself, for at most 10 s), and records the tickets it issues.
pub struct RustlsServer {
    /// The address it listens on.
    pub addr: std::net::SocketAddr,
    issued: std::sync::Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
    listener: TcpListener,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RustlsServer {
    /// Starts serving `cert` on `listener`.
    pub fn start(cert: &Cert, listener: TcpListener) -> Self {
        use rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject as _};
        let issued = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![CertificateDer::from_pem_file(cert.cert()).unwrap()],
                PrivateKeyDer::from_pem_file(cert.key()).unwrap(),
            )
            .expect("server config");
        config.ticketer = std::sync::Arc::new(RecordingTicketer {
            inner: rustls::crypto::aws_lc_rs::Ticketer::new().unwrap(),
            issued: issued.clone(),
        });
        let config = std::sync::Arc::new(config);
        let addr = listener.local_addr().unwrap();
        let handle = listener.try_clone().unwrap();
        let thread = std::thread::spawn(move || {
            // accept fails once Drop shuts the listening socket down.
            while let Ok((sock, _)) = listener.accept() {
                let config = config.clone();
                std::thread::spawn(move || serve_one(&config, sock));
            }
        });
        RustlsServer {
            addr,
            issued,
            listener: handle,
            thread: Some(thread),
        }
    }

    /// Every ticket issued so far, whole, as hex (`gateway tls issued add` takes it).
    pub fn issued_keys(&self) -> Vec<String> {
        self.issued
            .lock()
            .unwrap()
            .iter()
            .map(|t| t.iter().map(|b| format!("{b:02x}")).collect())
            .collect()
    }

    /// The datapath's key of every ticket issued so far (`gateway_common::tls::issued_key`).
    pub fn issued_digests(&self) -> Vec<[u8; gateway_common::tls::KEY_LEN]> {
        self.issued
            .lock()
            .unwrap()
            .iter()
            .filter_map(|t| gateway_common::tls::issued_key(gateway_common::tls::Offer::Ticket, t))
            .collect()
    }
}

fn serve_one(
    config: &std::sync::Arc<rustls::ServerConfig>,
    sock: TcpStream,
) -> std::io::Result<()> {
    use std::io::Write as _;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    let conn = rustls::ServerConnection::new(config.clone()).map_err(std::io::Error::other)?;
    let mut tls = rustls::StreamOwned::new(conn, sock);
    let mut req = Vec::new();
    let mut byte = [0u8; 1];
    while !req.ends_with(b"\r\n\r\n") {
        if tls.read(&mut byte)? == 0 {
            return Ok(());
        }
        req.push(byte[0]);
    }
    tls.write_all(b"HTTP/1.0 200 OK\r\n\r\nhello\n")?;
    tls.conn.send_close_notify();
    tls.flush()
}

impl Drop for RustlsServer {
    fn drop(&mut self) {
        use std::os::fd::AsRawFd as _;
        // Shutting a listening socket down wakes a blocked accept with an error, from any
        // network namespace (connecting to it would need the listener's namespace).
        // SAFETY: shutdown(2) on a descriptor this struct owns.
        unsafe { libc::shutdown(self.listener.as_raw_fd(), libc::SHUT_RDWR) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A TCP connection to `to` from the local address `from` (any port): the holders of the
/// per-address tests come from an address of their own.
pub fn connect_from_address(
    from: std::net::IpAddr,
    to: std::net::SocketAddr,
) -> std::io::Result<TcpStream> {
    let domain = if to.is_ipv4() {
        socket2::Domain::IPV4
    } else {
        socket2::Domain::IPV6
    };
    let sock = socket2::Socket::new(domain, socket2::Type::STREAM, None)?;
    sock.bind(&std::net::SocketAddr::new(from, 0).into())?;
    sock.connect_timeout(&to.into(), Duration::from_secs(5))?;
    Ok(sock.into())
}

/// A TLS connection to `to` from the local address `from` whose handshake finished, then `send`
/// written (nothing when empty), kept open and silent while held.
pub fn hold_tls(
    config: &std::sync::Arc<rustls::ClientConfig>,
    from: std::net::IpAddr,
    to: std::net::SocketAddr,
    send: &[u8],
) -> std::io::Result<(rustls::ClientConnection, TcpStream)> {
    use std::io::Write as _;
    let name = rustls::pki_types::ServerName::try_from("gateway-test").unwrap();
    let mut conn =
        rustls::ClientConnection::new(config.clone(), name).map_err(std::io::Error::other)?;
    let mut sock = connect_from_address(from, to)?;
    sock.set_read_timeout(Some(Duration::from_secs(10)))?;
    while conn.is_handshaking() {
        conn.complete_io(&mut sock)?;
    }
    if !send.is_empty() {
        conn.writer().write_all(send)?;
        while conn.wants_write() {
            conn.write_tls(&mut sock)?;
        }
    }
    Ok((conn, sock))
}
