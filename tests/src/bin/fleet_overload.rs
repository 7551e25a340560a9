//! `cargo xtask bench fleet` (issue 26): seed 000's resumed-session clients under a flood of new
//! hellos at 5x a proxy's full-handshake capacity, with the clients spread over two gateway
//! nodes behind an ECMP route (one ticket secret: a client's next connection lands on either
//! node, with a ticket either may have issued), against one node alone (the other out of the
//! group), in one run.
//!
//! Both nodes' proxies run one thread each on core 0, so the two nodes share the CPU one node has
//! alone: the comparison is of what the fleet does with the clients, not of more CPU. Each node's
//! tls-new is hand-set to a quarter of the core's capacity divided by the nodes serving. The
//! clients (in the router namespace), the flood and the backends are on core 1, as in
//! `tls_overload`.

use std::{net::TcpListener, time::Duration};

use gateway_tests::{
    backend::{Backend, Mode},
    daemon::Daemon,
    fleet::{Fleet, VIP},
    have_root,
    metrics::{scrape, value},
    netns::{TestNet, class_counter},
    overload::{Got, PHASE, THINKING, phase},
    report::Report,
    tls::{Cert, capture_hello, rustls_config, rustls_fetch},
};

const PORT: u16 = 8443;
const METRICS: u16 = 9481;

/// The daemon of node `name` on `net`: one proxy thread on core 0, the controller off (the
/// policy is set per curve), the fleet's ticket secret.
fn start(net: &TestNet, cert: &Cert, backend: &Backend, name: &str) -> Daemon {
    let dir = cert.file(name);
    std::fs::create_dir_all(&dir).unwrap();
    let secret = cert.file("tickets.key");
    if !secret.exists() {
        std::fs::write(&secret, [9u8; 64]).unwrap();
    }
    let body = format!(
        "node: {name}\nworkers: 1\nmetrics: 127.0.0.1:{METRICS}\ncontroller:\n  enabled: false\nproxies:\n  - listen: {VIP}:{PORT}\n    tls: {{cert: {}, key: {}, ticket_key_file: {}}}\n    backends: [{{address: {}, max_active: 5000}}]\n",
        cert.cert().display(),
        cert.key().display(),
        secret.display(),
        backend.addr
    );
    let daemon = Daemon::start_config(net, &dir, &body);
    daemon.pin_to_core(0);
    daemon
}

/// A TLS counter of `net`'s datapath.
fn tls(net: &TestNet, field: &str) -> u64 {
    net.stats()["tls"][field].as_u64().unwrap()
}

/// SYNs the kernel of `net`'s gateway namespace dropped because a listen queue was full
/// (`TcpExt: ListenDrops`).
fn listen_drops(net: &TestNet) -> u64 {
    let text = net.in_gw(|| std::fs::read_to_string("/proc/net/netstat").unwrap());
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "ListenDrops")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

fn main() {
    if !have_root("fleet_overload") {
        std::process::exit(1);
    }
    gateway_tests::procfs::pin_current_thread(1);
    let fleet = Fleet::new();
    let cert = Cert::new();
    let backends: Vec<Backend> = fleet
        .nodes
        .iter()
        .zip(["node-a", "node-b"])
        .map(|(net, name)| {
            let listener = net.in_gw(|| TcpListener::bind("127.0.0.1:0").unwrap());
            Backend::start(listener, name, Mode::Answer, false)
        })
        .collect();
    let daemons: Vec<Daemon> = fleet
        .nodes
        .iter()
        .zip(&backends)
        .zip(["node-a", "node-b"])
        .map(|((net, b), name)| start(net, &cert, b, name))
        .collect();
    // The flood's hello: rustls's own (post-quantum share, two segments), replayed.
    let hello = capture_hello(|addr| {
        let _ = rustls_fetch(&rustls_config(&cert), &addr);
    });
    let addr = format!("{VIP}:{PORT}");
    // Node a's full-handshake capacity on the core, from its own CPU figures (b out).
    fleet.set_members(&[0]);
    for _ in 0..200 {
        let fresh = rustls_config(&cert);
        let _ = fleet.in_clients(|| rustls_fetch(&fresh, &addr));
    }
    let text = scrape(&fleet.nodes[0], METRICS);
    let full = |name: &str| value(&text, name, &[("kind", "full")]);
    let cost =
        full("gateway_proxy_handshake_cpu_seconds_total") / full("gateway_proxy_handshakes_total");
    let capacity = 1.0 / cost;
    let mut report = Report::new("fleet");
    report.say(format!(
        "# A fleet of two nodes under a new-hello flood (issue 26)\n\nTwo gateway nodes behind an \
         ECMP route (a resilient nexthop group, L4 hash), one ticket secret; each node's proxy \
         one thread, both on core 0 (a full handshake costs {:.0} µs of it: {capacity:.0}/s for \
         the core). Resumed-session clients ({} rustls sessions thinking {:?}), the flood (one \
         recorded rustls hello, {} B, replayed) and the backends on core 1; the clients and \
         the flood in a namespace behind the router, so that all their packets are hashed by \
         their 5-tuple. Each node's tls-new at a quarter of the core's capacity divided by the nodes serving. {PHASE:?} per phase. \
         With both nodes, a client's next connection lands on either, offering a ticket either \
         may have issued: the other node's NIC verifies it by its tag.\n",
        cost * 1e6,
        THINKING.clients,
        THINKING.think,
        hello.len()
    ));
    report.say(
        "| nodes serving | flood | flood sent/s | new hellos admitted/s | resumed/s | share of unloaded | resumed p99 / max ms | fetches not resumed | tickets vouched by tag | SYNs dropped, listen queue full |\n|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    );
    let mut rows = Vec::new();
    let mut shares = Vec::new();
    for members in [&[0usize][..], &[0, 1]] {
        fleet.set_members(members);
        let rate = (capacity / 4.0 / members.len() as f64).round();
        let burst = (capacity / 40.0 / members.len() as f64).round().max(1.0);
        for net in &fleet.nodes {
            net.gateway_ok(&[
                "policy",
                "set",
                "tls-new",
                "--rate",
                &rate.to_string(),
                "--burst",
                &burst.to_string(),
                "--pin",
            ]);
        }
        let admitted = || {
            Some(
                fleet
                    .nodes
                    .iter()
                    .map(|n| class_counter(&n.stats(), "tls-new", "admitted") as f64)
                    .sum(),
            )
        };
        let vouched = || -> u64 { fleet.nodes.iter().map(|n| tls(n, "tags_verified")).sum() };
        let who = if members.len() == 1 {
            "one node alone".to_string()
        } else {
            "two nodes, clients spread".to_string()
        };
        let mut unloaded_rate = None;
        for m in [0.0, 5.0] {
            let drops = || -> u64 { fleet.nodes.iter().map(listen_drops).sum() };
            let (v0, d0) = (vouched(), drops());
            let got: Got = phase(
                &fleet.clients_ns,
                &addr,
                &cert,
                &hello,
                m * capacity,
                THINKING,
                &admitted,
            );
            let (v, d) = (vouched() - v0, drops() - d0);
            let unloaded = *unloaded_rate.get_or_insert(got.resumed);
            let share = 100.0 * got.resumed / unloaded;
            report.say(format!(
                "| {who} | {m:.0}x | {:.0} | {} | {:.0} | {share:.0}% | {:.1} / {:.0} | {} | {v} | {d} |",
                got.sent,
                got.served.map_or("-".into(), |f| format!("{f:.0}")),
                got.resumed,
                got.p99_ms,
                got.max_ms,
                got.lost
            ));
            let mut row = vec![who.clone(), format!("{m}")];
            row.extend(got.csv(share));
            row.extend([v.to_string(), d.to_string()]);
            rows.push(row);
            if m > 0.0 {
                shares.push((who.clone(), share));
            }
        }
    }
    report.csv(
        "fleet.csv",
        &[
            "nodes",
            "flood_x",
            "flood_sent_per_s",
            "new_admitted_per_s",
            "resumed_per_s",
            "share_pct",
            "p99_ms",
            "not_resumed",
            "vouched_by_tag",
            "listen_drops",
        ],
        &rows,
    );
    let refused: u64 = fleet.nodes.iter().map(|n| tls(n, "tags_refused")).sum();
    report.say(format!(
        "\nAt 5x: {}. Tags refused over the run: {refused}.\n",
        shares
            .iter()
            .map(|(w, s)| format!("{w} {s:.0}%"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    for d in daemons {
        let _ = d.terminate(Duration::from_secs(20));
    }
}
