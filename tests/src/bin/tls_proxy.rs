//! `cargo xtask bench`, TLS proxy part: the gateway's proxy against nginx and HAProxy terminating
//! the same certificate and protocol in the same run, each pinned to one core and proxying to
//! the same backend.
//!
//! - Handshakes per CPU-second of the server (full and resumed, TLS 1.3 and 1.2): `openssl
//!   s_time` on the other core drives each server in turn; the server's own CPU time
//!   (utime + stime of its processes) divides the connections made. This is the rate one core
//!   sustains, independent of how fast the client is.
//! - Requests per CPU-second of the server, HTTP/1.1 and HTTP/2: `h2load` on the other core
//!   over a few keep-alive connections to an nginx origin (the gateway relays h2 end to end to
//!   the origin's h2 port and HTTP/1.1 to its HTTP/1.1 port; nginx and HAProxy terminate both
//!   and speak HTTP/1.1 with keep-alive to the origin).
//! - Proxy throughput: one 256 MiB download with curl through each.
//! - Memory per idle connection: resident memory before and after 1000 connections that finished
//!   their handshake and then sit idle.

use std::{
    net::{TcpListener, TcpStream},
    process::Command,
    time::{Duration, Instant},
};

use gateway_tests::{
    backend::{Backend, Mode, Nginx},
    daemon::Daemon,
    have_root,
    metrics::{scrape, value},
    netns::{GW_V4, TestNet},
    procfs::{median, tree_cpu_seconds, tree_rss_bytes},
    tls::{Cert, Proc, rustls_config, wait_listening},
};

const ROUNDS: usize = 3;
const SECONDS: u32 = 4;
const BULK: usize = 256 << 20;
const IDLE: usize = 1000;
const METRICS: u16 = 9477;
/// Requests per `h2load` run, over `H2LOAD_CLIENTS` connections.
const REQUESTS: u32 = 100_000;
const H2LOAD_CLIENTS: u32 = 8;
/// The origin's HTTP/1.1 and h2 (prior knowledge) ports, in the gateway namespace.
const ORIGIN_H1: u16 = 18090;
const ORIGIN_H2: u16 = 18091;

/// `openssl s_time` from the peer namespace on core 1; the connections it made.
fn s_time(net: &TestNet, addr: &str, args: &[&str]) -> u64 {
    let time = SECONDS.to_string();
    let mut all = vec![
        "netns",
        "exec",
        &net.peer_ns,
        "taskset",
        "-c",
        "1",
        "openssl",
        "s_time",
        "-connect",
        addr,
        "-www",
        "/",
        "-time",
        &time,
    ];
    all.extend_from_slice(args);
    let out = Command::new("ip").args(&all).output().expect("s_time");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.contains("connections in") && l.contains("real seconds"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| {
            panic!(
                "s_time output: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        })
}

/// Handshakes per CPU-second of `pid` under one s_time run.
fn rate(net: &TestNet, pid: u32, addr: &str, args: &[&str]) -> f64 {
    rate_and_load(net, pid, addr, args).0
}

/// Handshakes per CPU-second of `pid` under one s_time run, and the connections it made a
/// second.
fn rate_and_load(net: &TestNet, pid: u32, addr: &str, args: &[&str]) -> (f64, f64) {
    let before = tree_cpu_seconds(pid);
    let n = s_time(net, addr, args);
    let spent = tree_cpu_seconds(pid) - before;
    (n as f64 / spent.max(0.01), n as f64 / f64::from(SECONDS))
}

/// `h2load` from the peer namespace on core 1 (`--h1` when `h1`); the requests that succeeded.
fn h2load(net: &TestNet, port: u16, h1: bool) -> u64 {
    let (n, c) = (REQUESTS.to_string(), H2LOAD_CLIENTS.to_string());
    let url = format!("https://{GW_V4}:{port}/");
    let mut all = vec![
        "netns",
        "exec",
        &net.peer_ns,
        "taskset",
        "-c",
        "1",
        "h2load",
        "-n",
        &n,
        "-c",
        &c,
    ];
    if h1 {
        all.push("--h1");
    } else {
        // Ten streams at once per connection, as browsers keep several.
        all.extend(["-m", "10"]);
    }
    all.push(&url);
    let out = Command::new("ip").args(&all).output().expect("h2load");
    let text = String::from_utf8_lossy(&out.stdout);
    let succeeded = text
        .lines()
        .find(|l| l.starts_with("requests:"))
        .and_then(|l| {
            l.split(',')
                .find(|f| f.trim().ends_with("succeeded"))
                .and_then(|f| f.split_whitespace().next())
                .and_then(|n| n.parse().ok())
        })
        .unwrap_or_else(|| {
            panic!(
                "h2load output: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    assert!(
        text.contains(if h1 {
            "Application protocol: http/1.1"
        } else {
            "Application protocol: h2"
        }),
        "h2load on {port} did not negotiate what it asked: {text}"
    );
    succeeded
}

/// Requests per CPU-second of `pid` under one h2load run.
fn request_rate(net: &TestNet, pid: u32, port: u16, h1: bool) -> f64 {
    let before = tree_cpu_seconds(pid);
    let n = h2load(net, port, h1);
    assert!(
        n >= u64::from(REQUESTS) * 99 / 100,
        "only {n} of {REQUESTS} requests succeeded on {port}"
    );
    let spent = tree_cpu_seconds(pid) - before;
    n as f64 / spent.max(0.01)
}

/// HAProxy in the foreground on core 0 (one thread), the same certificate, its config in `dir`.
fn haproxy(net: &TestNet, dir: &std::path::Path, cert: &Cert, small: std::net::SocketAddr) -> Proc {
    let bundle = dir.join("haproxy.pem");
    let pem = [
        std::fs::read(cert.cert()).unwrap(),
        std::fs::read(cert.key()).unwrap(),
    ]
    .concat();
    std::fs::write(&bundle, pem).unwrap();
    let b = bundle.display();
    let cfg = dir.join("haproxy.cfg");
    std::fs::write(
        &cfg,
        format!(
            "global\n  nbthread 1\n  maxconn 5000\n  tune.ssl.cachesize 20000\n\
             defaults\n  mode http\n  timeout connect 3s\n  timeout client 60s\n  timeout server 60s\n\
             frontend handshakes\n  bind {GW_V4}:7443 ssl crt {b}\n  default_backend small\n\
             frontend requests\n  bind {GW_V4}:7445 ssl crt {b} alpn h2,http/1.1\n  default_backend origin\n\
             backend small\n  server s {small}\n\
             backend origin\n  http-reuse always\n  server o 127.0.0.1:{ORIGIN_H1}\n"
        ),
    )
    .unwrap();
    let child = Command::new("ip")
        .args([
            "netns", "exec", &net.gw_ns, "taskset", "-c", "0", "haproxy", "-db", "-f",
        ])
        .arg(&cfg)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("haproxy");
    let p = Proc(child);
    wait_listening(|| net.in_peer(|| TcpStream::connect((GW_V4, 7445)).is_ok()));
    p
}

fn curl_speed(net: &TestNet, cert: &Cert, port: u16) -> f64 {
    let out = net.exec(
        &net.peer_ns,
        "curl",
        &[
            "-sS",
            "-o",
            "/dev/null",
            "-w",
            "%{speed_download}",
            "--cacert",
            cert.cert().to_str().unwrap(),
            "--resolve",
            &format!("gateway-test:{port}:{GW_V4}"),
            &format!("https://gateway-test:{port}/"),
        ],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.trim().parse::<f64>().expect("curl speed") / (1 << 20) as f64
}

/// Opens `n` TLS connections from the peer namespace that finish their handshake and stay idle
/// while `measure` runs.
fn idle_connections<R: Send>(
    net: &TestNet,
    cert: &Cert,
    port: u16,
    n: usize,
    measure: impl FnOnce() -> R + Send,
) -> R {
    let config = rustls_config(cert);
    let addr = format!("{GW_V4}:{port}");
    let held = net.in_peer(|| {
        (0..n)
            .map(|_| {
                let name = rustls::pki_types::ServerName::try_from("gateway-test").unwrap();
                let mut conn = rustls::ClientConnection::new(config.clone(), name).unwrap();
                let mut sock = TcpStream::connect(&addr).unwrap();
                while conn.is_handshaking() {
                    conn.complete_io(&mut sock).unwrap();
                }
                (conn, sock)
            })
            .collect::<Vec<_>>()
    });
    let r = measure();
    drop(held);
    r
}

fn raise_fd_limit() {
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .expect("getrlimit");
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard)
        .expect("setrlimit");
}

/// Access lines a child logs for [`access_child_cpu`] (fewer than the logger's buffer holds,
/// so that none is dropped and each is written).
const ACCESS_LINES: u32 = 50_000;
/// The environment variable that makes this program such a child: the lines to log.
const ACCESS_CHILD: &str = "TLS_PROXY_ACCESS_LINES";
/// With it set, the child logs JSON lines.
const ACCESS_JSON: &str = "TLS_PROXY_ACCESS_JSON";

/// The child's part: `lines` access lines of a proxied connection through the daemon's logger,
/// every one written; then its CPU time (all threads, seconds) on standard output.
fn access_child(lines: u32) {
    use gateway::proxy::{access, relay::Bytes, stats};
    let format = if std::env::var_os(ACCESS_JSON).is_some() {
        gateway::logging::LogFormat::Json
    } else {
        gateway::logging::LogFormat::Text
    };
    let logs = gateway::logging::init(format);
    let entry = access::Entry {
        sni: Some("shop.example".into()),
        version: Some(rustls::ProtocolVersion::TLSv1_3),
        kind: Some(stats::HandshakeKind::Resumed),
        backend: Some("127.0.0.1:8080".parse().unwrap()),
        bytes: Bytes {
            from_client: 412,
            to_client: 18_734,
        },
    };
    for i in 0..lines {
        let client = std::net::SocketAddr::from(([10, 99, 0, 2], 20_000 + (i % 40_000) as u16));
        let took = Duration::from_micros(1_500 + u64::from(i % 997));
        access::log(
            "10.99.0.1:8443",
            client,
            &entry,
            stats::Outcome::Proxied,
            took,
        );
    }
    // Every line written before the time is read.
    drop(logs);
    assert_eq!(gateway::logging::dropped_lines(), 0, "lines dropped");
    let usage = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .expect("getrusage");
    let secs = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
    println!("{}", secs(usage.user_time()) + secs(usage.system_time()));
}

/// The CPU time (seconds) of a child that logs `lines` access lines (JSON when `json`), its
/// standard error read line by line as a journal would; checks every line arrived.
fn access_child_cpu(lines: u32, json: bool) -> f64 {
    use std::io::BufRead as _;
    let mut child = Command::new(std::env::current_exe().expect("this program"));
    child
        .env(ACCESS_CHILD, lines.to_string())
        .env_remove("RUST_LOG")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    if json {
        child.env(ACCESS_JSON, "1");
    } else {
        child.env_remove(ACCESS_JSON);
    }
    let mut child = child.spawn().expect("the access-log child");
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
            .filter(|l| l.contains("gateway::access"))
            .count()
    });
    let out = child.wait_with_output().expect("the access-log child");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(reader.join().unwrap(), lines as usize, "every line written");
    String::from_utf8_lossy(&out.stdout)
        .trim()
        .parse()
        .expect("its CPU time")
}

/// Prints a line of the summary and keeps it in the report.
macro_rules! say {
    ($r:expr, $($t:tt)*) => {
        $r.say(format!($($t)*))
    };
}

fn main() {
    if let Ok(lines) = std::env::var(ACCESS_CHILD) {
        access_child(lines.parse().expect("a count of lines"));
        return;
    }
    let mut report = gateway_tests::report::Report::new("tls-proxy");
    let r = &mut report;
    if !have_root("tls_proxy bench") {
        std::process::exit(1);
    }
    // Sections to run (all by default): handshakes, access-log, requests, throughput, memory.
    let only: Vec<String> = std::env::args().skip(1).collect();
    let run = |section: &str| only.is_empty() || only.iter().any(|s| s == section);
    raise_fd_limit();
    let net = TestNet::new();
    let cert = Cert::new();
    let bind = || net.in_gw(|| TcpListener::bind("127.0.0.1:0").unwrap());
    let small = Backend::start(bind(), "b", Mode::Answer, false);
    let bulk = Backend::start(bind(), "bulk", Mode::Bulk(BULK), false);
    let (c, k) = (cert.cert(), cert.key());
    let (c, k) = (c.display(), k.display());
    let dir = cert.file("");
    let log = dir.join("ssl.log");

    // nginx: one worker on core 0, the same certificate, session cache and tickets.
    let nginx = Nginx::start(
        &["ip", "netns", "exec", &net.gw_ns, "taskset", "-c", "0"],
        &format!(
            "  log_format reuse \"$ssl_session_reused\";\n\
             keepalive_requests 1000000;\n\
             ssl_certificate {c}; ssl_certificate_key {k};\n\
             ssl_protocols TLSv1.2 TLSv1.3; ssl_session_cache shared:S:10m; ssl_session_tickets on;\n\
             server {{ listen {GW_V4}:9443 ssl; access_log {} reuse; location / {{ proxy_pass http://{}; }} }}\n\
             server {{ listen {GW_V4}:9444 ssl; location / {{ proxy_pass http://{}; proxy_buffering off; }} }}\n\
             upstream origin {{ server 127.0.0.1:{ORIGIN_H1}; keepalive 32; }}\n\
             server {{ listen {GW_V4}:9445 ssl http2; location / {{ proxy_pass http://origin; proxy_http_version 1.1; proxy_set_header Connection \"\"; }} }}",
            log.display(),
            small.addr,
            bulk.addr
        ),
        1,
    );
    wait_listening(|| net.in_peer(|| TcpStream::connect((GW_V4, 9443)).is_ok()));
    // The origin of the request rates: nginx on core 1, HTTP/1.1 and h2 (prior knowledge).
    let _origin = Nginx::start(
        &["ip", "netns", "exec", &net.gw_ns, "taskset", "-c", "1"],
        &format!(
            "  keepalive_requests 1000000;\n\
             server {{ listen 127.0.0.1:{ORIGIN_H1}; location / {{ return 200 \"ok\\n\"; }} }}\n\
             server {{ listen 127.0.0.1:{ORIGIN_H2} http2; location / {{ return 200 \"ok\\n\"; }} }}"
        ),
        1,
    );
    for port in [ORIGIN_H1, ORIGIN_H2] {
        wait_listening(|| net.in_gw(|| TcpStream::connect(("127.0.0.1", port)).is_ok()));
    }
    let haproxy = haproxy(&net, &dir, &cert, small.addr);
    let haproxy_pid = haproxy.0.id();

    // The gateway: one worker thread, on core 0, with the datapath attached (its access log
    // on, the default).
    let body = format!(
        "workers: 1\nmetrics: 127.0.0.1:{METRICS}\nproxies:\n\
         \x20 - listen: {GW_V4}:8443\n    tls: {{cert: {c}, key: {k}}}\n    backends: [{{address: {}, max_active: 5000}}]\n\
         \x20 - listen: {GW_V4}:8444\n    tls: {{cert: {c}, key: {k}}}\n    backends: [{{address: {}}}]\n\
         \x20 - listen: {GW_V4}:8445\n    tls: {{cert: {c}, key: {k}}}\n    alpn: [h2, http/1.1]\n\
         \x20   backends: [{{address: 127.0.0.1:{ORIGIN_H2}, alpn: [h2]}}, {{address: 127.0.0.1:{ORIGIN_H1}}}]\n",
        small.addr, bulk.addr
    );
    let daemon = Daemon::start_config(&net, &dir, &body);
    let gw = daemon.pid();
    daemon.pin_to_core(0);
    let nginx_pid = nginx.pid();

    if run("handshakes") {
        say!(
            r,
            "\n# TLS proxy against nginx and HAProxy\n\nAll three terminate TLS with the same P-256 certificate on core 0 \
         (nginx: 1 worker; HAProxy: 1 thread; gateway: 1 runtime thread, datapath attached) and proxy to the same \
         backend; `openssl s_time -www /` runs on core 1. Handshakes per CPU-second = connections \
         / the server's own CPU time; {ROUNDS} interleaved rounds of {SECONDS} s, medians.\n"
        );
        say!(
            r,
            "| handshake | gateway /CPU-s | nginx /CPU-s | HAProxy /CPU-s | vs nginx | vs HAProxy |"
        );
        say!(r, "|---|---:|---:|---:|---:|---:|");
        for (name, args) in [
            ("TLS 1.3 full", &["-tls1_3", "-new"][..]),
            ("TLS 1.3 resumed", &["-tls1_3", "-reuse"]),
            ("TLS 1.2 full", &["-tls1_2", "-new"]),
            ("TLS 1.2 resumed", &["-tls1_2", "-reuse"]),
        ] {
            let (mut g, mut n, mut h) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                g.push(rate(&net, gw, &format!("{GW_V4}:8443"), args));
                n.push(rate(&net, nginx_pid, &format!("{GW_V4}:9443"), args));
                h.push(rate(&net, haproxy_pid, &format!("{GW_V4}:7443"), args));
            }
            let (g, n, h) = (median(g), median(n), median(h));
            say!(
                r,
                "| {name} | {g:.0} | {n:.0} | {h:.0} | {:.2}x | {:.2}x |",
                g / n,
                g / h
            );
        }
        // Evidence that resumption happened on both sides.
        let text = scrape(&net, METRICS);
        let resumed = value(
            &text,
            "gateway_proxy_handshakes_total",
            &[("kind", "resumed")],
        );
        let full = value(&text, "gateway_proxy_handshakes_total", &[("kind", "full")]);
        let reused = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.trim() == "r")
            .count();
        let cpu = |k| {
            value(
                &text,
                "gateway_proxy_handshake_cpu_seconds_total",
                &[("kind", k)],
            ) / value(&text, "gateway_proxy_handshakes_total", &[("kind", k)])
                * 1e6
        };
        say!(
            r,
            "\nGateway handshakes: {full:.0} full, {resumed:.0} resumed; nginx logged {reused} reused \
         sessions. CPU per handshake as the gateway measures it: full {:.0} µs, resumed {:.0} µs.",
            cpu("full"),
            cpu("resumed")
        );
    }
    if run("access-log") {
        say!(
            r,
            "\n# What the access log costs\n\nOne access line's CPU (formatted where it is logged, \
             written by the log's own thread to a pipe a reader drains, as the daemon's standard \
             error to a journal): {ACCESS_LINES} lines logged by a child process through the \
             daemon's own logger, its CPU time (every thread) less an idle child's, medians of \
             {ROUNDS}. Against the CPU the gateway spends per connection (s_time on the listener \
             of the first table, its access log on: the whole daemon's CPU time per connection, \
             {ROUNDS} rounds, medians). Target: under 5%.\n"
        );
        let line = |json: bool| {
            let runs = (0..ROUNDS)
                .map(|_| access_child_cpu(ACCESS_LINES, json) - access_child_cpu(0, json))
                .collect();
            median(runs) / f64::from(ACCESS_LINES)
        };
        let (text, json) = (line(false), line(true));
        say!(
            r,
            "| handshake | connections/s | CPU per connection | text line | share | JSON line | share | target |"
        );
        say!(r, "|---|---:|---:|---:|---:|---:|---:|---:|");
        for (name, args) in [
            ("TLS 1.3 full", &["-tls1_3", "-new"][..]),
            ("TLS 1.3 resumed", &["-tls1_3", "-reuse"]),
        ] {
            let (mut rates, mut load) = (Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                let (rate, per_second) = rate_and_load(&net, gw, &format!("{GW_V4}:8443"), args);
                rates.push(rate);
                load.push(per_second);
            }
            let per_connection = 1.0 / median(rates);
            say!(
                r,
                "| {name} | {:.0} | {:.0} µs | {:.1} µs | {:.2}% | {:.1} µs | {:.2}% | < 5% |",
                median(load),
                per_connection * 1e6,
                text * 1e6,
                100.0 * text / per_connection,
                json * 1e6,
                100.0 * json / per_connection
            );
        }
    }
    if run("requests") {
        say!(
            r,
            "\n# Requests per CPU-second\n\n`h2load -n {REQUESTS} -c {H2LOAD_CLIENTS}` on core 1 (h2: 10 streams \
         per connection), keep-alive, to an nginx origin answering `ok` on core 1. The gateway relays \
         each protocol end to end (h2 to the origin's h2 port by ALPN, HTTP/1.1 to its HTTP/1.1 \
         port); nginx and HAProxy terminate HTTP and speak HTTP/1.1 with keep-alive to the origin. \
         Requests / the proxy's own CPU time; {ROUNDS} interleaved rounds, medians.\n"
        );
        say!(
            r,
            "| protocol | gateway /CPU-s | nginx /CPU-s | HAProxy /CPU-s | vs nginx | vs HAProxy |"
        );
        say!(r, "|---|---:|---:|---:|---:|---:|");
        for (name, h1) in [("HTTP/1.1", true), ("HTTP/2", false)] {
            let (mut g, mut n, mut h) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..ROUNDS {
                g.push(request_rate(&net, gw, 8445, h1));
                n.push(request_rate(&net, nginx_pid, 9445, h1));
                h.push(request_rate(&net, haproxy_pid, 7445, h1));
            }
            let (g, n, h) = (median(g), median(n), median(h));
            say!(
                r,
                "| {name} | {g:.0} | {n:.0} | {h:.0} | {:.2}x | {:.2}x |",
                g / n,
                g / h
            );
        }
    }
    if run("throughput") {
        say!(
            r,
            "\n# Proxy throughput\n\nOne {} MiB download with curl, {ROUNDS} rounds, median.\n",
            BULK >> 20
        );
        say!(r, "| path | MiB/s |\n|---|---:|");
        let (mut g, mut n) = (Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            g.push(curl_speed(&net, &cert, 8444));
            n.push(curl_speed(&net, &cert, 9444));
        }
        let (g, n) = (median(g), median(n));
        say!(
            r,
            "| gateway | {g:.0} |\n| nginx | {n:.0} |\n| ratio | {:.2}x |",
            g / n
        );
    }
    if run("memory") {
        say!(
            r,
            "\n# Memory per idle connection\n\nResident memory (all processes of the server) before and \
         after {IDLE} connections that finished their handshake and send nothing. None of the three \
         connects upstream before a client's first byte (the gateway since `timeouts.request`).\n"
        );
        say!(
            r,
            "| server | bytes per idle connection | target |\n|---|---:|---:|"
        );
        let handshakes = || {
            value(
                &scrape(&net, METRICS),
                "gateway_proxy_handshakes_total",
                &[],
            )
        };
        for (name, pid, port) in [
            ("gateway", gw, 8443),
            ("nginx", nginx_pid, 9443),
            ("HAProxy", haproxy_pid, 7443),
        ] {
            let before = tree_rss_bytes(pid);
            let done_before = handshakes();
            let after = idle_connections(&net, &cert, port, IDLE, || {
                if name == "gateway" {
                    // Every handshake done on the gateway's side too.
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while handshakes() < done_before + IDLE as f64 {
                        assert!(Instant::now() < deadline, "connections did not settle");
                    }
                }
                tree_rss_bytes(pid)
            });
            let per = after.saturating_sub(before) as f64 / IDLE as f64;
            say!(r, "| {name} | {per:.0} | < 16384 |");
        }
    }
    let (exit, _) = daemon.terminate(Duration::from_secs(60));
    assert!(exit.success());
}
