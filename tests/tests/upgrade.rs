//! Issue 26, upgrades: this build's daemon takes over a datapath the previous release pinned,
//! whose map layout differs (its `TlsCounters` has no `holds_full`, its `IssuedValue` no
//! `expires`), while TLS connections and
//! SIP calls it admitted are in flight: the programs are replaced through the same link, the
//! changed map is carried over with what it held, and every other map is adopted as it is.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream, UdpSocket},
    sync::{
        Arc,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use aya::maps::{Array, HashMap, MapData};
use gateway::{
    datapath::ModeRequest,
    datapath::loader::{self, AttachOptions},
    datapath::maps::open_as,
    datapath::pins::PinDir,
};
use gateway_common::maps::{
    DEFAULT_TLS_ISSUED, FlowKey, FlowKey4, IPPROTO_TCP, IPPROTO_UDP, ServiceKey, ServiceKind,
    ServiceValue, TlsFlow, names, service_port_index,
};
use gateway_tests::{
    daemon::{Daemon, STARTUP},
    frames::client_hello,
    have_root, have_xdp,
    netns::{GW_V4, TestNet, class_counter, sh},
    sipserver::respond,
};

/// The eBPF object of the release before this one (main at ec0acef, rebuilt with the verifier
/// change in `tests/fixtures/ec0acef-verifier.patch`, which today's kernels need: see
/// `tests/fixtures/README.md`).
const PREVIOUS: &[u8] = include_bytes!("../fixtures/gateway-ec0acef.bpf.o");

const TLS_PORT: u16 = 8443;
const SIP_PORT: u16 = 5062;
/// TLS connections held open across the upgrade.
const CONNECTIONS: usize = 4;
/// SIP INVITEs the server holds unanswered across the upgrade.
const CALLS: usize = 5;
/// The longest any one exchange may take: a bound on waiting, never a margin relied on.
const WAIT: Duration = Duration::from_secs(10);

/// What the previous release's daemon did at its start: the previous object attached afresh,
/// the services written into its maps (this build's CLI opens every map, and one of them has
/// the older layout until the upgrade).
fn attach_previous(net: &TestNet) {
    let opts = AttachOptions {
        iface: net.gw_if.clone(),
        mode: ModeRequest::Native,
        root: net.root(),
        ebpf_log_level: 0,
        issued_keys: DEFAULT_TLS_ISSUED,
    };
    net.in_gw(|| drop(loader::attach_object(&opts, PREVIOUS).expect("attach the previous build")));
    let pd = PinDir::new(&net.root(), &net.gw_if);
    let mut services: HashMap<MapData, ServiceKey, ServiceValue> =
        open_as(&pd, names::SERVICES).unwrap();
    let mut ports: Array<MapData, u8> = open_as(&pd, names::SERVICE_PORTS).unwrap();
    for (proto, port, kind) in [
        (IPPROTO_TCP, TLS_PORT, ServiceKind::Tls),
        (IPPROTO_UDP, SIP_PORT, ServiceKind::Sip),
    ] {
        let value = ServiceValue {
            kind: kind as u32,
            flags: 0,
        };
        services
            .insert(ServiceKey::new(proto, port), value, 0)
            .unwrap();
        let index = service_port_index(proto, port).unwrap();
        ports.set(index, value.port_byte(), 0).unwrap();
    }
}

/// The server's first flight, as the egress program recognises one: a handshake record.
const FLIGHT: [u8; 6] = [22, 3, 3, 0, 1, 2];

/// A server behind the gateway that answers each connection's hello with [`FLIGHT`], then
/// echoes whatever comes, until the client closes.
fn echo_server(listener: TcpListener) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut served = Vec::new();
        for _ in 0..CONNECTIONS {
            let (mut c, _) = listener.accept().expect("accept");
            served.push(std::thread::spawn(move || {
                let mut hello = vec![0u8; client_hello().len()];
                c.read_exact(&mut hello).expect("hello");
                c.write_all(&FLIGHT).expect("answer");
                let mut buf = [0u8; 64];
                loop {
                    match c.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => c.write_all(&buf[..n]).expect("echo"),
                    }
                }
            }));
        }
        for t in served {
            t.join().unwrap();
        }
    })
}

/// One exchange on an admitted connection: a record out, the same record back.
fn exchange(s: &mut TcpStream, round: usize) -> std::io::Result<()> {
    let record = [23, 3, 3, 0, 2, (round >> 8) as u8, round as u8];
    s.write_all(&record)?;
    let mut back = [0u8; 7];
    s.read_exact(&mut back)?;
    if back != record {
        return Err(std::io::Error::other("echo differs"));
    }
    Ok(())
}

/// The INVITE of call `n`.
fn invite(n: usize) -> String {
    format!(
        "INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2;branch=z9hG4bKup{n}\r\n\
         From: <sip:alice@example.com>;tag=a{n}\r\nTo: <sip:bob@example.com>\r\n\
         Call-ID: up{n}@10.99.0.2\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
    )
}

fn stats(net: &TestNet) -> serde_json::Value {
    net.stats()
}

#[test]
fn a_build_whose_map_layout_differs_takes_over_under_traffic_and_loses_nothing() {
    // The previous release's XDP programs call bpf_xdp_adjust_meta unconditionally: a kernel
    // that refuses it loads none of them.
    if !have_root("a_build_whose_map_layout_differs_takes_over_under_traffic")
        || !have_xdp("a_build_whose_map_layout_differs_takes_over_under_traffic")
    {
        return;
    }
    let net = TestNet::new();
    attach_previous(&net);
    let listener = net.in_gw(|| TcpListener::bind(("0.0.0.0", TLS_PORT)).expect("listen"));
    let server = echo_server(listener);
    let uas = net.in_gw(|| UdpSocket::bind(("0.0.0.0", SIP_PORT)).expect("bind SIP"));
    uas.set_read_timeout(Some(WAIT)).unwrap();

    // Under the previous build: connections admitted and answered, calls admitted and held.
    let mut clients: Vec<TcpStream> = net.in_peer(|| {
        (0..CONNECTIONS)
            .map(|_| {
                let mut s = TcpStream::connect((GW_V4, TLS_PORT)).expect("connect");
                s.set_read_timeout(Some(WAIT)).unwrap();
                s.write_all(&client_hello()).expect("hello");
                let mut flight = [0u8; FLIGHT.len()];
                s.read_exact(&mut flight).expect("the server's answer");
                exchange(&mut s, 0).expect("an exchange under the previous build");
                s
            })
            .collect()
    });
    let caller = net.in_peer(|| UdpSocket::bind("0.0.0.0:0").expect("bind caller"));
    caller.set_read_timeout(Some(WAIT)).unwrap();
    for n in 0..CALLS {
        caller
            .send_to(invite(n).as_bytes(), (GW_V4, SIP_PORT))
            .unwrap();
    }
    let mut held: Vec<(String, SocketAddr)> = Vec::new();
    let mut buf = [0u8; 2048];
    while held.len() < CALLS {
        let (len, from) = uas
            .recv_from(&mut buf)
            .expect("the INVITEs reach the server");
        held.push((String::from_utf8_lossy(&buf[..len]).into_owned(), from));
    }
    let link_id = |net: &TestNet| -> u64 {
        let pd = PinDir::new(&net.root(), &net.gw_if);
        net.in_gw(|| loader::info(&pd).expect("status").link_id) as u64
    };
    let link = link_id(&net);
    // This build's status names the map its start will carry over.
    let status = net.gateway(&["status"]);
    assert!(!status.status.success(), "not this build's datapath yet");
    let said = String::from_utf8_lossy(&status.stderr).into_owned()
        + &String::from_utf8_lossy(&status.stdout);
    assert!(
        said.contains("TLS_ISSUED, TLS_COUNTERS laid out by another build")
            && said.contains("carries them over"),
        "{said}"
    );

    // The connections keep exchanging records while this build's daemon takes over; once
    // told the start is done, each makes exactly AFTER more rounds, then the traffic stops.
    const AFTER: usize = 3;
    let switched = Arc::new(AtomicBool::new(false));
    let rounds = Arc::new(AtomicUsize::new(0));
    let traffic = {
        let (switched, rounds) = (switched.clone(), rounds.clone());
        std::thread::spawn(move || {
            let started = Instant::now();
            let mut round = 1;
            let mut left_after = AFTER;
            // Bounded by time (the start's own bound and then some) and by a count no
            // start reaches within that time.
            while left_after > 0 && round < 50_000_000 && started.elapsed() < STARTUP + WAIT {
                let after = switched.load(Ordering::Acquire);
                for s in clients.iter_mut() {
                    exchange(s, round).unwrap_or_else(|e| panic!("round {round}: {e}"));
                }
                rounds.fetch_add(1, Ordering::Relaxed);
                round += 1;
                if after {
                    left_after -= 1;
                }
            }
            (clients, left_after)
        })
    };
    let dir = tempdir();
    let cfg = dir.join("gateway.yaml");
    std::fs::write(
        &cfg,
        format!(
            "interfaces:\n  - name: {}\n    mode: native\nservices:\n  - {{kind: tls, port: {TLS_PORT}}}\n  \
             - {{kind: sip, port: {SIP_PORT}}}\non_exit: keep\n",
            net.gw_if
        ),
    )
    .unwrap();
    // A session key the previous build's daemon published, in its layout (no `expires`): kind,
    // limit, issued_ns, in_use, granted_ns, per_minute, pad, tat_ns, open (56 bytes).
    let issued_key = [0x5au8; 16];
    {
        let pd = PinDir::new(&net.root(), &net.gw_if);
        let mut old: HashMap<MapData, [u8; 16], [u8; 56]> =
            open_as(&pd, names::TLS_ISSUED).unwrap();
        let mut v = [0u8; 56];
        v[0] = 2; // a ticket
        v[4] = 3; // limit
        v[16] = 1; // in_use
        v[32] = 60; // per_minute
        old.insert(issued_key, v, 0).unwrap();
    }
    let before_start = rounds.load(Ordering::Relaxed);
    let daemon = Daemon::start(&net, &["--config", cfg.to_str().unwrap()], STARTUP);
    let carried = daemon
        .log
        .iter()
        .find(|l| l.contains("carried TLS_COUNTERS over"))
        .unwrap_or_else(|| panic!("the changed map is carried over: {:?}", daemon.log));
    // The fields this build added since the previous release, each at zero.
    assert!(
        carried.contains("with holds_full, cookies_sent, cookie_acks, cookie_hellos, handoffs, handoffs_failed, cookies_declined, hellos_held, held_handoffs, held_carried, held_unmatched, tags_verified, tags_refused, keys_learnt, keys_unlearnt, offers_declined, macs_verified, macs_refused, macs_unchecked, held_sacked, held_resent, cookies_no_listener, holds_over_budget added at zero"),
        "{carried}"
    );
    // The issued keys too: the ticket expiry this build added starts at zero (the daemon
    // withdraws such a key itself, as the previous one would have).
    let carried = daemon
        .log
        .iter()
        .find(|l| l.contains("carried TLS_ISSUED over"))
        .unwrap_or_else(|| panic!("the issued keys are carried over: {:?}", daemon.log));
    assert!(carried.contains("with expires added at zero"), "{carried}");
    // The previous build kept IPv4 connections in TLS_FLOWS; this one keeps them in TLS_FLOWS4.
    let moved = daemon
        .log
        .iter()
        .find(|l| l.contains("of TLS_FLOWS to TLS_FLOWS4"))
        .unwrap_or_else(|| panic!("the IPv4 connections are moved: {:?}", daemon.log));
    assert!(
        moved.contains(&format!("moved {CONNECTIONS} entries")),
        "{moved}"
    );
    assert!(
        daemon.log.iter().any(|l| l.contains("adopted attachment")),
        "{:?}",
        daemon.log
    );
    // Some rounds after the switch too, then the traffic stops.
    let after_start = rounds.load(Ordering::Relaxed);
    switched.store(true, Ordering::Release);
    let (mut clients, left_after) = traffic.join().expect("no connection lost a record");
    let total = rounds.load(Ordering::Relaxed);
    assert_eq!(
        left_after, 0,
        "the connections went on after the switch ({before_start} rounds before the start, \
         {after_start} by its end, {total} in all)"
    );
    eprintln!(
        "{CONNECTIONS} connections: {before_start} rounds before the daemon's start, \
         {after_start} by its end, {total} in all"
    );
    assert_eq!(
        link_id(&net),
        link,
        "the same link: replaced, never detached"
    );

    // The counters the previous build kept are this build's now, with the added field.
    let s = stats(&net);
    assert_eq!(
        s["tls"]["hellos"], CONNECTIONS,
        "the previous build's hellos carried over: {}",
        s["tls"]
    );
    assert_eq!(s["tls"]["completions"], CONNECTIONS, "{}", s["tls"]);
    assert_eq!(s["tls"]["holds_full"], 0, "{}", s["tls"]);
    // No admitted connection was lost: each goes on, and is still the class's.
    for s in clients.iter_mut() {
        exchange(s, 0xffff).expect("an exchange after the upgrade");
    }
    let pd = PinDir::new(&net.root(), &net.gw_if);
    let maps = gateway::datapath::maps::Maps::open(&pd).expect("every map in this build's layout");
    let (_, v) = maps
        .issued()
        .unwrap()
        .into_iter()
        .find(|(k, _)| k.key == issued_key)
        .expect("the published key kept");
    assert_eq!(
        (v.kind, v.limit, v.in_use, v.per_minute, v.expires),
        (2, 3, 1, 60, 0),
        "{v:?}"
    );
    assert_eq!(maps.tls_flows().unwrap().len(), CONNECTIONS);
    let v4: HashMap<MapData, FlowKey4, TlsFlow> = open_as(&pd, names::TLS_FLOWS4).unwrap();
    assert_eq!(v4.keys().count(), CONNECTIONS, "in this build's IPv4 table");
    let older: HashMap<MapData, FlowKey, TlsFlow> = open_as(&pd, names::TLS_FLOWS).unwrap();
    assert_eq!(
        older.keys().count(),
        0,
        "none left where the previous build kept them"
    );
    assert_eq!(class_counter(&s, "tls-new", "admitted"), CONNECTIONS as u64);
    assert_eq!(class_counter(&s, "tls-new", "backlog"), 0, "all answered");

    // The calls admitted by the previous build are still pending, then answered: the backlog
    // ends exactly at zero and nothing is left in the pending table.
    assert_eq!(class_counter(&s, "sip-original", "admitted"), CALLS as u64);
    assert_eq!(class_counter(&s, "sip-original", "backlog"), CALLS as u64);
    assert_eq!(maps.sip_pending(2 * CALLS).unwrap().len(), CALLS);
    for (req, from) in &held {
        uas.send_to(respond(req, "200 OK", true).as_bytes(), from)
            .unwrap();
    }
    for _ in 0..CALLS {
        let (len, _) = caller
            .recv_from(&mut buf)
            .expect("the answer reaches the caller");
        assert!(buf[..len].starts_with(b"SIP/2.0 200 OK"));
    }
    let s = stats(&net);
    assert_eq!(class_counter(&s, "sip-original", "completed"), CALLS as u64);
    assert_eq!(class_counter(&s, "sip-original", "backlog"), 0);
    assert_eq!(class_counter(&s, "sip-original", "expired"), 0);
    assert!(maps.sip_pending(2 * CALLS).unwrap().is_empty());

    // bpftool reads the carried map with this build's field names.
    let dump = sh(
        "bpftool",
        &[
            "map",
            "dump",
            "pinned",
            pd.map(names::TLS_COUNTERS).to_str().unwrap(),
        ],
    );
    assert!(
        String::from_utf8_lossy(&dump.stdout).contains("holds_full"),
        "{}",
        String::from_utf8_lossy(&dump.stderr)
    );
    assert!(
        !pd.map("carry-TLS_COUNTERS").exists(),
        "no staging pin left"
    );

    drop(clients);
    server.join().unwrap();
    let (exit, log) = daemon.terminate(Duration::from_secs(10));
    assert!(exit.success(), "{log:?}");
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
    std::fs::remove_dir_all(dir).unwrap();
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("gwt-upgrade-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A start stopped between the switch and the rename leaves the datapath running on the map at
/// its staging pin, with the older map still under the pin's name. The next start finishes the
/// carry-over: the map the programs use takes its name (what they counted is kept), and a
/// staging pin no program uses (from an attempt that never switched) goes.
#[test]
fn a_carry_over_a_stopped_start_left_unfinished_is_finished_by_the_next() {
    if !have_root("a_carry_over_a_stopped_start_left_unfinished_is_finished") {
        return;
    }
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "sip", &SIP_PORT.to_string()]);
    net.in_peer(|| {
        let s = UdpSocket::bind("0.0.0.0:0").unwrap();
        for _ in 0..3 {
            s.send_to(b"OPTIONS sip:x SIP/2.0\r\n\r\n", (GW_V4, SIP_PORT))
                .unwrap();
        }
    });
    assert_eq!(class_counter(&net.stats(), "sip-original", "packets"), 3);
    let pd = PinDir::new(&net.root(), &net.gw_if);
    let (running, stale) = (pd.map(names::CLASS_STATS), pd.map("carry-DP_COUNTERS"));
    let staging = pd.map("carry-CLASS_STATS");
    let shape = gateway::datapath::bpfsys::map_shape(&running).unwrap();
    std::fs::rename(&running, &staging).unwrap();
    // The older map under the pin's name, and a copy an attempt made but never switched to.
    for (pin, entries) in [(&running, shape.max_entries), (&stale, 1)] {
        let out = sh(
            "bpftool",
            &[
                "map",
                "create",
                pin.to_str().unwrap(),
                "type",
                "percpu_array",
                "key",
                "4",
                "value",
                &shape.value_size.to_string(),
                "entries",
                &entries.to_string(),
                "name",
                "older",
            ],
        );
        assert!(out.status.success(), "{out:?}");
    }
    let said = net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    assert!(
        said.contains("finished carrying CLASS_STATS over"),
        "{said}"
    );
    assert!(!staging.exists() && !stale.exists(), "no staging pin left");
    assert_eq!(
        gateway::datapath::bpfsys::map_shape(&running).unwrap().id,
        shape.id,
        "the map the datapath ran on has its name back"
    );
    assert_eq!(
        class_counter(&net.stats(), "sip-original", "packets"),
        3,
        "what it counted is kept"
    );
    net.gateway_ok(&["detach", "--iface", &net.gw_if]);
}
