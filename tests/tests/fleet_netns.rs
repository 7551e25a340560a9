//! Two gateway nodes behind an ECMP route (issue 26), each with its own daemon, proxy and
//! backend, one ticket secret between them, and real rustls and openssl clients spread over them
//! by a resilient nexthop group's 5-tuple hash: a node leaving and rejoining, tickets of one node
//! resumed and vouched for at the other's NIC, and seed 000 across the fleet.

use std::{
    net::TcpListener,
    path::PathBuf,
    time::{Duration, Instant},
};

use gateway_tests::{
    backend::{Backend, Mode},
    daemon::Daemon,
    fleet::{Fleet, VIP},
    have_root,
    metrics::scrape,
    netns::{TestNet, class_counter, sh},
    tls::{Cert, rustls_config, rustls_fetch_within, s_client_input},
};

const PORT: u16 = 8443;
const METRICS: u16 = 9477;
/// Longest a held client waits for its answer.
const HELD: Duration = Duration::from_secs(60);

/// One node: its daemon and its backend (which holds every request until released).
struct Node {
    _daemon: Daemon,
    backend: Backend,
}

/// A fleet with a daemon on each node (see [`start`]). Bound as `let (cert, fleet, nodes)`,
/// the daemons are dropped first, then the namespaces.
fn setup(mode: Mode) -> (Cert, Fleet, Vec<Node>) {
    let fleet = Fleet::new();
    let cert = Cert::new();
    let dir: PathBuf = cert.file("fleet");
    std::fs::create_dir_all(&dir).unwrap();
    let nodes = start(&fleet, &cert, &dir, mode);
    (cert, fleet, nodes)
}

/// Starts a daemon on every node of `fleet`, each proxying `VIP:PORT` to a backend of its own
/// that answers with the node's name (in `mode`), with one ticket secret.
fn start(fleet: &Fleet, cert: &Cert, dir: &std::path::Path, mode: Mode) -> Vec<Node> {
    let secret = dir.join("tickets.key");
    std::fs::write(&secret, [7u8; 64]).unwrap();
    fleet
        .nodes
        .iter()
        .enumerate()
        .map(|(i, net)| {
            let name = ["node-a", "node-b"][i];
            let listener = net.in_gw(|| TcpListener::bind("127.0.0.1:0").unwrap());
            let backend = Backend::start(listener, name, mode, false);
            let node_dir = dir.join(name);
            std::fs::create_dir_all(&node_dir).unwrap();
            let body = format!(
                "node: {name}\nmetrics: 127.0.0.1:{METRICS}\npolicy:\n  tls-new: {{rate: 100000, burst: 100000}}\nproxies:\n  - listen: {VIP}:{PORT}\n    tls: {{cert: {}, key: {}, ticket_key_file: {}}}\n    backends: [{{address: {}}}]\n",
                cert.cert().display(),
                cert.key().display(),
                secret.display(),
                backend.addr
            );
            let daemon = Daemon::start_config(net, &node_dir, &body);
            Node {
                _daemon: daemon,
                backend,
            }
        })
        .collect()
}

/// The proxy's connections on `net` by outcome.
fn outcomes(net: &TestNet) -> Vec<(String, f64)> {
    let text = scrape(net, METRICS);
    text.lines()
        .filter(|l| l.starts_with("gateway_proxy_connections_total{"))
        .filter_map(|l| {
            let (series, v) = l.rsplit_once(' ')?;
            let outcome = series.split("outcome=\"").nth(1)?.split('"').next()?;
            Some((outcome.to_string(), v.parse().ok()?))
        })
        .filter(|(_, v)| *v > 0.0)
        .collect()
}

/// Waits (at most 20 s) until the backends together have accepted `n` connections.
fn wait_accepted(nodes: &[Node], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while nodes.iter().map(|n| n.backend.accepted()).sum::<usize>() < n {
        assert!(
            Instant::now() < deadline,
            "the backends never saw {n} connections"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A node leaves the group while clients of both nodes wait on their answers, and comes back:
/// every client the staying node took (before the leave, and every new one while the other was
/// out, all of which reach it) gets its answer from it, its proxy counts every connection
/// proxied and none failed, and once the node is back new connections reach it again.
#[test]
fn a_node_leaves_and_rejoins_and_no_client_of_the_other_notices() {
    if !have_root("a_node_leaves_and_rejoins_and_no_client_of_the_other_notices") {
        return;
    }
    let (cert, fleet, nodes) = setup(Mode::Hold);
    let config = rustls_config(&cert);
    let addr = format!("{VIP}:{PORT}");
    let (a, b) = (&nodes[0], &nodes[1]);
    let fleet = &fleet;
    std::thread::scope(|scope| {
        let fetch = || {
            let (config, addr) = (config.clone(), addr.clone());
            scope.spawn(move || fleet_fetch(fleet, &config, &addr))
        };
        // Clients held on both nodes: connections until each node holds three (the hash spreads
        // them; bounded: 64 on one node would be a broken hash).
        let mut held = Vec::new();
        while a.backend.accepted() < 3 || b.backend.accepted() < 3 {
            assert!(
                held.len() < 64,
                "64 connections, not spread over both nodes"
            );
            held.push(fetch());
            wait_accepted(&nodes, held.len());
        }
        let (held_a, held_b) = (a.backend.accepted(), b.backend.accepted());
        // Node b leaves: its buckets go to a at once; a's stay where they are.
        fleet.set_members(&[0]);
        let during: Vec<_> = (0..8).map(|_| fetch()).collect();
        wait_accepted(&nodes, held.len() + during.len());
        assert_eq!(
            (a.backend.accepted(), b.backend.accepted()),
            (held_a + during.len(), held_b),
            "while b was out, every new connection reached a"
        );
        for n in &nodes {
            n.backend.release();
        }
        // Every client a took got its answer from a.
        let answers: Vec<_> = held
            .into_iter()
            .chain(during)
            .map(|h| h.join().unwrap())
            .collect();
        let from_a = answers
            .iter()
            .filter(|r| {
                r.as_ref()
                    .is_ok_and(|body| body.ends_with(&answer("node-a")))
            })
            .count();
        assert_eq!(from_a, held_a + 8, "{answers:?}");
    });
    // a's proxy: every connection proxied, none failed.
    let proxied = |net: &TestNet| outcomes(net);
    let deadline = Instant::now() + Duration::from_secs(10);
    while proxied(&fleet.nodes[0]) != [("proxied".to_string(), a.backend.accepted() as f64)] {
        assert!(
            Instant::now() < deadline,
            "node a's connections: {:?}",
            proxied(&fleet.nodes[0])
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Node b comes back: new connections reach it again (bounded, as above).
    fleet.set_members(&[0, 1]);
    let before = b.backend.accepted();
    for attempt in 0.. {
        assert!(
            attempt < 64,
            "64 connections after b came back, none reached it"
        );
        let body = fleet_fetch(fleet, &config, &addr).expect("an answer");
        if body.ends_with(&answer("node-b")) {
            break;
        }
        assert!(body.ends_with(&answer("node-a")), "{body}");
    }
    assert_eq!(b.backend.accepted(), before + 1);
    // Each node's admission ended every unit it held.
    for net in &fleet.nodes {
        assert_eq!(class_counter(&net.stats(), "tls-new", "backlog"), 0);
    }
}

/// What a node's NIC counted of resumptions: its tls-resumed packets and the tickets whose tag
/// vouched for them (`tags_verified`) or not (`tags_refused`).
fn resumed_at(net: &TestNet) -> (u64, u64, u64) {
    let stats = net.stats();
    let tls = |f: &str| stats["tls"][f].as_u64().unwrap();
    (
        class_counter(&stats, "tls-resumed", "packets"),
        tls("tags_verified"),
        tls("tags_refused"),
    )
}

/// The keys `net`'s NIC published itself, vouched for by their ticket's tag, as bpftool dumps
/// `TLS_ISSUED` (the `kind` field with `ISSUED_BY_TAG`, and the ticket's `expires`).
fn vouched_keys(net: &TestNet) -> Vec<serde_json::Value> {
    let pd = gateway::datapath::pins::PinDir::new(&net.root(), &net.gw_if);
    let path = pd.map(gateway_common::maps::names::TLS_ISSUED);
    let out = sh(
        "bpftool",
        &["-j", "map", "dump", "pinned", path.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let entries: Vec<serde_json::Value> = serde_json::from_slice(&out.stdout).unwrap();
    entries
        .into_iter()
        .map(|e| e["formatted"]["value"].clone())
        .filter(|v| {
            v["kind"]
                .as_u64()
                .is_some_and(|k| k & u64::from(gateway_common::maps::ISSUED_BY_TAG) != 0)
        })
        .collect()
}

/// With one `ticket_key_file`, a rustls client resumes on the node that did not issue its
/// ticket (TLS 1.3, its hello of two segments with the post-quantum share), and that node's NIC
/// classes it tls-resumed: the ticket's tag vouched for it (`tags_verified`), and bpftool shows
/// the key it published (kind with `ISSUED_BY_TAG`, the ticket's expiry).
#[test]
fn a_ticket_one_node_issued_resumes_on_the_other_and_its_nic_vouches_for_it() {
    if !have_root("a_ticket_one_node_issued_resumes_on_the_other_and_its_nic_vouches_for_it") {
        return;
    }
    let (cert, fleet, _nodes) = setup(Mode::Answer);
    let addr = format!("{VIP}:{PORT}");
    // The first connection that reaches node a: a full handshake, and a's tickets. A fresh
    // client config per try until then, so that it holds only a's tickets after.
    let mut tries = 0;
    let config = loop {
        assert!(tries < 64, "64 connections, none reached node a");
        tries += 1;
        let fresh = rustls_config(&cert);
        let (kind, body) = fleet
            .in_clients(|| rustls_fetch_within(&fresh, &addr, Duration::from_secs(10)))
            .expect("an answer");
        if body.ends_with(&answer("node-a")) {
            assert_eq!(kind, rustls::HandshakeKind::Full);
            break fresh;
        }
    };
    // Then connections until one reaches node b: it offers a ticket of a's, and resumes.
    let before = resumed_at(&fleet.nodes[1]);
    let new_before = class_counter(&fleet.nodes[1].stats(), "tls-new", "packets");
    assert!(vouched_keys(&fleet.nodes[1]).is_empty());
    for attempt in 0.. {
        assert!(attempt < 64, "64 connections, none reached node b");
        let (kind, body) = fleet
            .in_clients(|| rustls_fetch_within(&config, &addr, Duration::from_secs(10)))
            .expect("an answer");
        if body.ends_with(&answer("node-b")) {
            assert_eq!(kind, rustls::HandshakeKind::Resumed, "a's ticket at b");
            break;
        }
        assert!(body.ends_with(&answer("node-a")), "{body}");
    }
    let after = resumed_at(&fleet.nodes[1]);
    assert!(after.0 > before.0, "b's NIC classed it tls-resumed");
    assert_eq!(after.1, before.1 + 1, "the tag vouched for a's ticket once");
    assert_eq!(after.2, before.2, "no tag refused");
    assert_eq!(
        class_counter(&fleet.nodes[1].stats(), "tls-new", "packets"),
        new_before,
        "nothing of it was tls-new"
    );
    let vouched = vouched_keys(&fleet.nodes[1]);
    assert_eq!(vouched.len(), 1, "{vouched:?}");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let expires = vouched[0]["expires"].as_u64().unwrap();
    // The proxy's session lifetime is two hours by default.
    assert!(
        expires > now + 7000 && expires <= now + 7201,
        "{:?}",
        vouched[0]
    );
    let handshakes = scrape(&fleet.nodes[1], METRICS);
    assert!(
        handshakes
            .lines()
            .any(|l| l.starts_with("gateway_proxy_handshakes_total{")
                && l.contains("kind=\"resumed\"")
                && !l.ends_with(" 0")),
        "node b's proxy counts no resumed handshake:\n{handshakes}"
    );
}

/// openssl's TLS 1.3 ticket (a PSK identity) and TLS 1.2 ticket (the session_ticket extension)
/// of one node resume on the other, which classes them tls-resumed by their tag.
#[test]
fn openssl_tickets_of_one_node_resume_on_the_other_by_their_tag() {
    if !have_root("openssl_tickets_of_one_node_resume_on_the_other_by_their_tag") {
        return;
    }
    let (cert, fleet, _nodes) = setup(Mode::Answer);
    let addr = format!("{VIP}:{PORT}");
    let clients = ["ip", "netns", "exec", fleet.clients_ns.as_str()];
    let get = b"GET / HTTP/1.0\r\n\r\n";
    for version in ["-tls1_3", "-tls1_2"] {
        let sess = cert.file(&format!("sess{version}.pem"));
        let sess = sess.to_str().unwrap();
        // A full handshake that reaches node a, its session (with a's ticket) saved.
        let run = |args: &[&str]| s_client_input(&clients, &addr, args, get);
        let out = until_node(version, "node-a", || {
            run(&[version, "-sess_out", sess, "-ign_eof"])
        });
        assert!(out.contains("New,"), "{out}");
        // Then the saved session until a connection reaches node b, where it resumes.
        let before = resumed_at(&fleet.nodes[1]);
        until_node(version, "node-b", || {
            let out = run(&[version, "-sess_in", sess, "-ign_eof"]);
            assert!(out.contains("Reused,"), "{version}: {out}");
            assert!(out.contains("node-b") || out.contains("node-a"), "{out}");
            out
        });
        let after = resumed_at(&fleet.nodes[1]);
        assert!(
            after.0 > before.0,
            "{version}: b's NIC classed it tls-resumed"
        );
        assert_eq!(after.1, before.1 + 1, "{version}: the tag vouched for it");
        assert_eq!(after.2, before.2, "{version}: no tag refused");
    }
    assert_eq!(fleet.nodes[1].stats()["tls"]["unverified_offers"], 0);
}

/// Seed 000 across the fleet: with tls-new closed on both nodes, clients holding a ticket are
/// served by whichever node they land on (each resumption gives them a ticket of that node for
/// the next), and new clients are refused at both.
#[test]
fn with_tls_new_closed_on_both_nodes_resumed_clients_are_served_wherever_they_land() {
    if !have_root("with_tls_new_closed_on_both_nodes_resumed_clients_are_served_wherever_they_land")
    {
        return;
    }
    let (cert, fleet, _nodes) = setup(Mode::Answer);
    let addr = format!("{VIP}:{PORT}");
    let fetch = |config: &std::sync::Arc<rustls::ClientConfig>| {
        fleet.in_clients(|| rustls_fetch_within(config, &addr, Duration::from_secs(10)))
    };
    // Four clients, each with one full handshake (on whichever node).
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let c = rustls_config(&cert);
            let (kind, _) = fetch(&c).expect("a full handshake");
            assert_eq!(kind, rustls::HandshakeKind::Full);
            c
        })
        .collect();
    for net in &fleet.nodes {
        net.gateway_ok(&["policy", "set", "tls-new", "--backlog", "0", "--pin"]);
    }
    let admitted = |net: &TestNet| class_counter(&net.stats(), "tls-new", "admitted");
    let admitted_before = [admitted(&fleet.nodes[0]), admitted(&fleet.nodes[1])];
    // Resumptions, the clients in turn, until each node has served at least three (bounded:
    // 64 on one node would be a broken hash). Every one is served, resumed.
    let served = |name: &str, body: &str| body.ends_with(&answer(name));
    let mut by_node = [0usize; 2];
    let mut n = 0;
    while by_node.iter().any(|&k| k < 3) {
        assert!(
            n < 64,
            "64 resumptions, not spread over both nodes: {by_node:?}"
        );
        let (kind, body) = fetch(&clients[n % clients.len()])
            .unwrap_or_else(|e| panic!("resumption {n} refused: {e}"));
        assert_eq!(kind, rustls::HandshakeKind::Resumed, "resumption {n}");
        if served("node-a", &body) {
            by_node[0] += 1;
        } else {
            assert!(served("node-b", &body), "{body}");
            by_node[1] += 1;
        }
        n += 1;
    }
    // New clients: refused, at both nodes (until each refused at least two; bounded).
    let rejected = |net: &TestNet| class_counter(&net.stats(), "tls-new", "rejected");
    let start = [rejected(&fleet.nodes[0]), rejected(&fleet.nodes[1])];
    let mut tries = 0;
    while (0..2).any(|i| rejected(&fleet.nodes[i]) < start[i] + 2) {
        assert!(tries < 64, "64 new clients, not refused at both nodes");
        tries += 1;
        let fresh = rustls_config(&cert);
        assert!(fetch(&fresh).is_err(), "a new client was served");
    }
    for (net, before) in fleet.nodes.iter().zip(admitted_before) {
        let stats = net.stats();
        assert_eq!(
            class_counter(&stats, "tls-new", "admitted"),
            before,
            "none admitted after closing"
        );
        assert_eq!(stats["tls"]["tags_refused"], 0);
        assert!(class_counter(&stats, "tls-resumed", "admitted") >= 3);
    }
    eprintln!(
        "resumptions served by node a / node b: {by_node:?} in {n}; new clients refused: {tries}"
    );
}

/// Runs `client` (an s_client, whose output has the backend's answer) until its output names
/// `node` (bounded: 64 connections, none on it, would be a broken hash); that output.
fn until_node(version: &str, node: &str, mut client: impl FnMut() -> String) -> String {
    for _ in 0..64 {
        let out = client();
        if out.contains(node) {
            return out;
        }
    }
    panic!("{version}: 64 connections, none reached {node}");
}

/// The end of a backend's answer, by its name.
fn answer(name: &str) -> String {
    format!("\r\n\r\n{name}\n")
}

/// A GET from the router to `addr`; the answer's body, or the error.
fn fleet_fetch(
    fleet: &Fleet,
    config: &std::sync::Arc<rustls::ClientConfig>,
    addr: &str,
) -> Result<String, String> {
    fleet.in_clients(|| {
        rustls_fetch_within(config, addr, HELD)
            .map(|(_, body)| body)
            .map_err(|e| e.to_string())
    })
}
