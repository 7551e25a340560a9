//! `cargo xtask bench`: per-packet cost of the datapath against a bare XDP_PASS program, measured
//! with BPF_PROG_TEST_RUN repeat in the same run, and the daemon's resident memory at idle.
//!
//! Every figure is a ratio against a baseline measured in the same run, interleaved in rounds so
//! that drift in machine load affects both sides alike; the median round is reported.

use std::time::Duration;

use gateway_common::testing::HelloBuilder;
use gateway_tests::{
    daemon::Daemon,
    floors::{Floor, Floors},
    frames::{Frame, client_hello_head},
    have_root,
    netns::TestNet,
    parsers,
    procfs::{median, rss_bytes},
    report::Report,
    testrun::{Hook, TestProgram},
};

const REPEAT: u32 = 5_000_000;
const ROUNDS: usize = 9;

/// Prints a line of the summary and keeps it in the report.
macro_rules! say {
    ($r:expr, $($t:tt)*) => {
        $r.say(format!($($t)*))
    };
}

fn main() {
    if !have_root("bench") {
        std::process::exit(1);
    }
    // `bench memory`: the issued-keys table's memory alone (a section of the full run).
    if std::env::args().nth(1).as_deref() == Some("memory") {
        let mut report = Report::new("datapath-memory");
        issued_table_memory(&mut report);
        return;
    }
    // `bench compare BASELINE.o NAME [OTHER.o OTHER_NAME]`: this build's object (or another)
    // against another build's, side by side.
    if std::env::args().nth(1).as_deref() == Some("compare") {
        let args: Vec<String> = std::env::args().skip(2).collect();
        let (baseline, this) = match args.as_slice() {
            [path, name] => ((path.as_str(), name.as_str()), None),
            [path, name, other, other_name] => (
                (path.as_str(), name.as_str()),
                Some((other.as_str(), other_name.as_str())),
            ),
            _ => panic!("usage: bench compare BASELINE_OBJECT NAME [OTHER_OBJECT OTHER_NAME]"),
        };
        let mut report = Report::new("datapath-compare");
        compare(&mut report, baseline, this);
        return;
    }
    // `bench programs [OBJECT]`: the programs' verifier figures alone (a section of the full
    // run), of this build or of another build's object.
    if std::env::args().nth(1).as_deref() == Some("programs") {
        let mut report = Report::new("datapath-programs");
        let prog = match std::env::args().nth(2) {
            Some(path) => load_object(&path),
            None => TestProgram::new(),
        };
        program_stats(&mut report, &prog);
        return;
    }
    // `bench tls`: the TLS path's rows alone (a section of the full run).
    if std::env::args().nth(1).as_deref() == Some("tls") {
        let mut report = Report::new("datapath-tls");
        tls_costs(&mut report, &mut TestProgram::new());
        return;
    }
    // `bench fresh`: new connections and transactions by repeat alone (a section of the full
    // run).
    if std::env::args().nth(1).as_deref() == Some("fresh") {
        let mut report = Report::new("datapath-fresh");
        fresh_costs(&mut report, &mut TestProgram::new());
        return;
    }
    // `bench profile FILTER SECONDS`: the fresh row whose name contains FILTER (or, for
    // `repeat:FILTER`, the per-packet row), batch after batch for SECONDS, for a profiler to
    // sample (prints nothing to docs/benchmarks.md).
    if std::env::args().nth(1).as_deref() == Some("profile") {
        let filter = std::env::args()
            .nth(2)
            .expect("usage: bench profile FILTER SECONDS");
        let seconds: u64 = std::env::args()
            .nth(3)
            .and_then(|s| s.parse().ok())
            .expect("usage: bench profile FILTER SECONDS");
        let until = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
        let mut prog = TestProgram::new();
        let mut batches = 0u64;
        // A packet of the per-packet section first (`repeat:` before its name), by repeat.
        if let Some(name) = filter.strip_prefix("repeat:") {
            let cases = repeat_cases();
            let (name, frame) = cases
                .iter()
                .find(|(n, _)| n.contains(name))
                .unwrap_or_else(|| panic!("no per-packet row's name contains {name:?}"));
            eprintln!("profiling {name}");
            while std::time::Instant::now() < until {
                timed(&prog, Hook::Xdp, frame);
                batches += 1;
            }
        } else {
            let rows = fresh_rows();
            let row = rows
                .iter()
                .find(|r| r.name.contains(filter.as_str()))
                .unwrap_or_else(|| panic!("no fresh row's name contains {filter:?}"));
            eprintln!("profiling {}", row.name);
            while std::time::Instant::now() < until {
                fresh_batch(&mut prog, row, "this build");
                batches += 1;
            }
        }
        eprintln!("{batches} batches");
        return;
    }
    // `bench floors`: each class against its floor and the bare program (a section of the full
    // run).
    if std::env::args().nth(1).as_deref() == Some("floors") {
        let mut report = Report::new("datapath-floors");
        floor_costs(&mut report, &mut TestProgram::new());
        return;
    }
    // `bench throughput`: through a veth pair alone (a section of the full run).
    if std::env::args().nth(1).as_deref() == Some("throughput") {
        let mut report = Report::new("datapath-throughput");
        veth_throughput(&mut report);
        return;
    }
    // `bench parsers`: the shared parsers timed in userspace (not a section of the full run).
    if std::env::args().nth(1).as_deref() == Some("parsers") {
        parser_costs();
        return;
    }
    // `bench sip-lines`: what one header line of each kind costs (a section of the full run).
    if std::env::args().nth(1).as_deref() == Some("sip-lines") {
        let mut report = Report::new("datapath-sip-lines");
        sip_line_costs(&mut report, &TestProgram::new());
        return;
    }
    // `bench tls`: the TLS hello rows alone (a section of the full run).
    if std::env::args().nth(1).as_deref() == Some("tls") {
        let mut report = Report::new("datapath-tls");
        tls_costs(&mut report, &mut TestProgram::new());
        return;
    }
    let mut report = Report::new("datapath");
    let r = &mut report;
    let prog = TestProgram::new();
    let cases = repeat_cases();
    say!(
        r,
        "# Datapath cost per packet\n\nBPF_PROG_TEST_RUN with repeat {REPEAT}, wall time of the \
         syscall / repeat; {ROUNDS} rounds, each running the gateway and the bare program back to \
         back; medians, and the ratio is the median of the per-round ratios.\n"
    );
    say!(
        r,
        "| packet | gateway_xdp ns | bare XDP_PASS ns | ratio (min..max) |"
    );
    say!(r, "|---|---:|---:|---:|");
    for (name, frame) in &cases {
        let (mut ours, mut bare, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            let o = timed(&prog, Hook::Xdp, frame);
            let b = timed(&prog, Hook::BarePass, frame);
            ours.push(o);
            bare.push(b);
            ratios.push(o / b);
        }
        let (lo, hi) = range(&ratios);
        say!(
            r,
            "| {name} | {:.1} | {:.1} | {:.2}x ({lo:.2}..{hi:.2}) |",
            median(ours),
            median(bare),
            median(ratios)
        );
    }

    floor_costs(r, &mut TestProgram::new());
    fresh_costs(r, &mut TestProgram::new());
    tls_costs(r, &mut TestProgram::new());
    sip_costs(r, &mut TestProgram::new());
    sip_line_costs(r, &TestProgram::new());
    reply_costs(r, &mut TestProgram::new());
    egress_costs(r, &TestProgram::new());
    program_stats(r, &TestProgram::new());
    spoofed_costs(r);
    veth_throughput(r);
    issued_table_memory(r);

    let net = TestNet::new();
    let daemon = Daemon::start(&net, &["--iface", &net.gw_if], Duration::from_secs(30));
    let rss = rss_bytes(daemon.pid());
    assert!(rss > 0, "VmRSS of the daemon");
    say!(
        r,
        "\n# Daemon at idle\n\n| figure | value | target |\n|---|---:|---:|"
    );
    say!(
        r,
        "| resident memory (VmRSS) | {:.1} MB | < 20 MB |",
        rss as f64 / (1 << 20) as f64
    );
    let (exit, _) = daemon.terminate(Duration::from_secs(10));
    assert!(exit.success());
}

/// Publishes `value`'s key as builds before ticket tails computed it (the digest of all of it)
/// with `room`, in their 56-byte layout of the issued-keys table (no `expires`).
fn publish_before_tails(
    p: &mut TestProgram,
    value: &[u8],
    room: &gateway_common::maps::IssuedValue,
) {
    let mut map: aya::maps::HashMap<aya::maps::MapData, [u8; 16], [u8; 56]> =
        gateway::datapath::maps::open_as(&p.pins, gateway_common::maps::names::TLS_ISSUED).unwrap();
    let mut v = [0u8; 56];
    v[4..8].copy_from_slice(&room.limit.to_le_bytes());
    v[32..36].copy_from_slice(&room.per_minute.to_le_bytes());
    map.insert(gateway_common::tls::offer_digest(value), v, 0)
        .unwrap();
}

/// A TLS 1.3 post-quantum hello (as the resuming row's) offering `identity` as its PSK.
fn psk_hello(identity: &[u8]) -> Vec<u8> {
    HelloBuilder {
        psk_identity: Some(identity.to_vec()),
        ..HelloBuilder::tls13()
    }
    .build()
}

/// Hellos offering a ticket another node issued, as the resuming row's (a 32-byte PSK
/// identity): one whose tail carries a good tag under a tag key written for port 443, and one
/// whose tag is forged; and the key the good one's tag publishes.
fn tagged_hellos(prog: &mut TestProgram) -> (Vec<u8>, Vec<u8>, gateway_common::maps::IssuedKey) {
    use gateway_common::tls::tag::{TAIL_LEN, Tail, tag, ticket_key};
    let (k0, k1, period) = (0x1234, 0x5678, 7);
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let key = gateway_common::maps::TagKey {
        k0,
        k1,
        limit: gateway_common::maps::MAX_RESUME_LIMIT,
        per_minute: u32::MAX,
        clock_ns: gateway::datapath::maps::wall_clock_offset_ns(),
    };
    prog.maps.set_tag_keys(443, &[(period, key)]).unwrap();
    let mut ticket = vec![11u8; 32];
    let digest = ticket_key(&ticket).unwrap();
    let expires = (unix + 3600) as u32;
    let tail = Tail {
        period,
        expires,
        tag: tag(k0, k1, &digest, period, expires),
    };
    ticket[32 - TAIL_LEN..].copy_from_slice(&tail.to_bytes());
    let mut forged = ticket.clone();
    forged[31] ^= 1;
    (
        psk_hello(&ticket),
        psk_hello(&forged),
        gateway_common::maps::IssuedKey { key: digest },
    )
}

/// Hellos offering a ticket of a server the gateway does not terminate, in OpenSSL's callback
/// format (name, IV, 96 bytes of ciphertext, HMAC-SHA256: 160 bytes, as nginx's TLS 1.3
/// tickets), sealed with a ticket key written for port 443: one with its right MAC, one with a
/// forged MAC under the same key name; and the key the good one publishes.
fn mac_hellos(prog: &mut TestProgram) -> (Vec<u8>, Vec<u8>, gateway_common::maps::IssuedKey) {
    use gateway_common::{maps::LearnTerms, sha256};
    let name = [0x42u8; 16];
    let hmac_key = [0x24u8; 16];
    let (inner, outer) = sha256::pads(&hmac_key).unwrap();
    prog.maps
        .set_ticket_keys(
            443,
            &[(
                gateway_common::maps::TicketKeyId {
                    port: 443,
                    pad: 0,
                    name,
                },
                gateway_common::maps::TicketMacKey { inner, outer },
            )],
        )
        .unwrap();
    prog.maps
        .set_learn_terms(
            443,
            LearnTerms {
                lifetime_s: 3600,
                limit: gateway_common::maps::MAX_RESUME_LIMIT,
                per_minute: u32::MAX,
                pad: 0,
                clock_ns: gateway::datapath::maps::wall_clock_offset_ns(),
            },
        )
        .unwrap();
    let mut ticket = name.to_vec();
    ticket.extend((0..112u8).map(|i| i.wrapping_mul(7)));
    let mac = sha256::mac(&inner, &outer, &ticket);
    ticket.extend_from_slice(&mac);
    let mut forged = ticket.clone();
    *forged.last_mut().unwrap() ^= 1;
    let key = gateway_common::tls::tag::ticket_key(&ticket).unwrap();
    (
        psk_hello(&ticket),
        psk_hello(&forged),
        gateway_common::maps::IssuedKey { key },
    )
}

/// The TLS path: a ClientHello (on a connection the program has not seen), a packet of an
/// admitted connection, and one of a rejected connection.
fn tls_costs(r: &mut Report, prog: &mut TestProgram) {
    const SINGLE: usize = 2000;
    let plain = HelloBuilder::default().build();
    let pq = HelloBuilder {
        psk_identity: Some(vec![7; 32]),
        ..HelloBuilder::tls13()
    }
    .build();
    say!(
        r,
        "\n# TLS datapath latency (single runs)\n\nA latency figure, not a measure of cost: a \
         single test run carries the test run's own few hundred nanoseconds (the costs by \
         repeat are the floor table above and the new connections below). Hellos: single test \
         runs with the flow table cleared before each, the kernel's own duration per run, \
         median of {SINGLE}, against single runs of the bare program (so both include the same \
         clock overhead). Flow packets: as above, repeat {REPEAT}.\n"
    );
    say!(
        r,
        "| packet | gateway_xdp ns | bare XDP_PASS ns | ratio | target |"
    );
    say!(r, "|---|---:|---:|---:|---:|");
    // A resuming hello whose key was published: verified, and a place of the key taken.
    let resuming = HelloBuilder {
        psk_identity: Some(vec![9; 32]),
        ..HelloBuilder::tls13()
    }
    .build();
    let issued = gateway_common::maps::IssuedKey {
        key: gateway_common::tls::parse_hello(&resuming)
            .offer_key()
            .expect("an offer"),
    };
    let room = gateway_common::maps::IssuedValue {
        limit: gateway_common::maps::MAX_RESUME_LIMIT,
        // No rate binds: these keys stand for many clients.
        per_minute: u32::MAX,
        ..Default::default()
    };
    prog.maps.add_issued(issued, room).unwrap();
    // Another node's ticket of the same length, its key not published here: its tag is checked
    // and the key published by the NIC (removed again before each run), or its tag is forged.
    let (tagged, forged, vouched) = tagged_hellos(prog);
    // A server's ticket, checked by its ticket key's MAC (published by the NIC, removed again
    // before each run), or its MAC forged under the key's name.
    let (maced, mac_forged, mac_key) = mac_hellos(prog);
    let mac_key = Some(mac_key);
    for (name, hello, unpublish) in [
        ("ClientHello, TLS 1.2, 153 B", &plain, None),
        (
            "ClientHello, TLS 1.3 + ML-KEM share, 1.4 KB (scratch copy 1.4 KB)",
            &pq,
            None,
        ),
        (
            "ClientHello, TLS 1.3 + ML-KEM share, resumed (key verified, place taken)",
            &resuming,
            None,
        ),
        (
            "the same, another node's ticket: its tag checked, its key published by the NIC, place taken",
            &tagged,
            Some(vouched),
        ),
        (
            "the same, a forged tag: checked and refused (tls-new)",
            &forged,
            None,
        ),
        (
            "the same, a server's 160 B ticket: its MAC checked by the server's ticket key, its key published by the NIC, place taken",
            &maced,
            mac_key,
        ),
        (
            "the same, a forged MAC under the key's name: computed and refused (tls-new)",
            &mac_forged,
            // Its key is the real ticket's (all of it but its last 16 bytes): unpublished
            // before each run, or the real one's last run would have it resumed.
            mac_key,
        ),
    ] {
        let frame = Frame::tcp(443, hello).build();
        let (mut ours, mut bare) = (Vec::new(), Vec::new());
        for _ in 0..SINGLE {
            prog.forget();
            if let Some(key) = &unpublish {
                prog.maps.remove_issued(key).unwrap();
            }
            ours.push(prog.run(Hook::Xdp, &frame, 1).1);
            bare.push(prog.run(Hook::BarePass, &frame, 1).1);
        }
        let (o, b) = (median(ours), median(bare));
        say!(r, "| {name} | {o:.0} | {b:.0} | {:.1}x | < 400 ns |", o / b);
    }
    let tls = prog.counters().tls;
    say!(
        r,
        "\nTickets vouched for by their tag over the runs: {}; tags refused: {} (each run of \
         the forged-tag row and of both MAC rows: a server's ticket carries no tag of ours, so \
         its tail is checked first). Tickets whose MAC checked out: {}; MACs refused: {} (each \
         run of the forged-MAC row).\n",
        tls.tags_verified,
        tls.tags_refused,
        tls.macs_verified,
        tls.macs_refused
    );
    // Packets of an admitted and of a rejected connection.
    let hello_frame = Frame::tcp(443, &plain).from_port(1).seq(1).build();
    prog.maps.clear_tls_flows().unwrap();
    prog.run(Hook::Xdp, &hello_frame, 1);
    let data = Frame::tcp(443, &[23, 3, 3, 0, 32])
        .from_port(1)
        .seq(1 + plain.len() as u32)
        .build();
    prog.maps
        .set_policy(
            gateway_common::Class::TlsNew,
            gateway_common::policy::Policy {
                backlog: Some(0),
                ..Default::default()
            }
            .to_map(),
        )
        .unwrap();
    prog.run(
        Hook::Xdp,
        &Frame::tcp(443, &plain).from_port(2).seq(1).build(),
        1,
    );
    let rejected = Frame::tcp(443, &plain).from_port(2).seq(1).build();
    // Its later packets dropped, not answered: a repeated run must see the same frame (a reset
    // would rewrite it in place; replies cost their own row, `reply_costs`).
    prog.maps
        .set_policy(
            gateway_common::Class::TlsFlow,
            gateway_common::policy::Policy {
                refuse: Some(gateway_common::policy::Refuse::Drop),
                ..Default::default()
            }
            .to_map(),
        )
        .unwrap();
    for (name, frame, target) in [
        ("admitted connection (tls-flow)", &data, "< 1.5x"),
        ("rejected connection (dropped)", &rejected, "-"),
    ] {
        let (mut ours, mut ratios) = (Vec::new(), Vec::new());
        let mut bare = Vec::new();
        for _ in 0..ROUNDS {
            let o = timed(prog, Hook::Xdp, frame);
            let b = timed(prog, Hook::BarePass, frame);
            ours.push(o);
            bare.push(b);
            ratios.push(o / b);
        }
        say!(
            r,
            "| {name} | {:.1} | {:.1} | {:.2}x | {target} |",
            median(ours),
            median(bare),
            median(ratios)
        );
    }
}

/// The shared parsers in userspace ([`gateway_tests::parsers`]): each message parsed step by step
/// as the datapath runs it, over a buffer read as its scratch copy is; the fastest of 7 rounds.
/// Printed only: what a row's parse costs apart from eBPF, to read beside the datapath's rows.
fn parser_costs() {
    const ROUNDS: usize = 7;
    const RUNS: usize = 500_000;
    println!("| message | steps | ns per parse, userspace |");
    println!("|---|---:|---:|");
    let small_invite =
        b"INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2;branch=z9hG4bK1\r\n\
Call-ID: b1@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";
    for (name, message) in [
        ("SIP INVITE, 4 headers", small_invite.to_vec()),
        ("SIP INVITE, 1 KB", invite_1k()),
    ] {
        let t = parsers::time_sip(&message, ROUNDS, RUNS);
        println!("| {name} | {} | {:.1} |", t.steps, t.ns);
    }
    let pq = HelloBuilder {
        psk_identity: Some(vec![7; 32]),
        ..HelloBuilder::tls13()
    };
    for (name, hello) in [
        (
            "ClientHello, TLS 1.2, 153 B",
            HelloBuilder::default().build(),
        ),
        ("ClientHello, TLS 1.3 + ML-KEM share, 1.4 KB", pq.build()),
    ] {
        let t = parsers::time_hello(&hello, ROUNDS, RUNS);
        println!("| {name} | {} | {:.1} |", t.steps, t.ns);
    }
    // The 1 KB INVITE's parse against the least it must do: its line ends and its key.
    let invite = invite_1k();
    let text = std::str::from_utf8(&invite[..400]).expect("ASCII headers");
    let span = |before: &str, value: &str| {
        let at = text.find(before).expect("the field") + before.len();
        assert!(text[at..].starts_with(value), "{before}{value}");
        (at, value.len())
    };
    let spans = [
        span(";branch=", "z9hG4bK-4101-1-0"),
        span("UDP ", "10.99.0.2:5061"),
        span(">;tag=", "4101SIPpTag001"),
        span("Call-ID: ", "1-4101@10.99.0.2"),
        span("CSeq: 1 ", "INVITE"),
    ];
    let parse = parsers::time_sip(&invite, ROUNDS, RUNS);
    let floor = parsers::time_sip_floor(&invite, spans, ROUNDS, RUNS);
    println!(
        "\nThe 1 KB INVITE's parse against the least it must do, natively: its {} lines' ends \
         found a word at a time, and FNV-1a over its key's {} bytes with the 40-byte mix.\n",
        floor.scan.steps, floor.key.steps
    );
    println!(
        "| parse ns | line ends ns | key ns | line ends + key ns | parse / (line ends + key) |"
    );
    println!("|---:|---:|---:|---:|---:|");
    let least = floor.scan.ns + floor.key.ns;
    println!(
        "| {:.1} | {:.1} | {:.1} | {:.1} | {:.2}x |",
        parse.ns,
        floor.scan.ns,
        floor.key.ns,
        least,
        parse.ns / least
    );
}

/// A SIPp-style INVITE padded to 1 KB with an SDP-sized body.
fn invite_1k() -> Vec<u8> {
    let mut invite = b"INVITE sip:service@10.99.0.1:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-4101-1-0\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=4101SIPpTag001\r\n\
To: service <sip:service@10.99.0.1:5060>\r\n\
Call-ID: 1-4101@10.99.0.2\r\n\
CSeq: 1 INVITE\r\n\
Contact: sip:sipp@10.99.0.2:5061\r\n\
Max-Forwards: 70\r\n\
Subject: Performance Test\r\n\
Content-Type: application/sdp\r\n\
Content-Length: 600\r\n\r\n"
        .to_vec();
    invite.resize(1024, b'v');
    invite
}

/// What one header line of each kind costs the SIP classifier: a retransmitted INVITE with 16
/// more such lines against the same INVITE without them, over 16, by repeat (in each of 40
/// rounds the two back to back, then the bare program; a run's time is the kernel's mean over
/// the round's runs; medians of the rounds, and of the per-round ratios). The kinds: lines the parser skips by their first bytes, a longer one, and a
/// From line, which it reads (its tag searched for and hashed).
fn sip_line_costs(r: &mut Report, prog: &TestProgram) {
    const LINE_ROUNDS: usize = 40;
    const LINE_REPEAT: u32 = 20_000;
    const EXTRA: usize = 16;
    let message = |line: &str, n: usize| {
        let mut m = String::from(
            "INVITE sip:service@10.99.0.1:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-4101-1-0\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=4101SIPpTag001\r\n\
To: service <sip:service@10.99.0.1:5060>\r\n\
Call-ID: 1-4101@10.99.0.2\r\n\
CSeq: 1 INVITE\r\n",
        );
        for _ in 0..n {
            m.push_str(line);
        }
        m.push_str("\r\n");
        Frame::udp(5060, m.as_bytes()).build()
    };
    say!(
        r,
        "\n# SIP header lines\n\nWhat one more header line costs the SIP classifier: a \
         retransmitted INVITE with {EXTRA} more lines of a kind against the same INVITE without \
         them, over {EXTRA}; {LINE_ROUNDS} rounds of {LINE_REPEAT} runs of each, the two and \
         the bare XDP_PASS program back to back (the kernel's time); medians, and the ratio is \
         the median (min..max) of the per-round ratios.\n"
    );
    say!(
        r,
        "| line | ns a line | bare XDP_PASS ns | a line / bare (min..max) |"
    );
    say!(r, "|---|---:|---:|---:|");
    for line in [
        "Max-Forwards: 70\r\n",
        "Contact: sip:sipp@10.99.0.2:5061\r\n",
        "X-A-Much-Longer-Header: 0123456789012345678901234567890123456789\r\n",
        "From: <sip:a@b>;tag=0123456789\r\n",
    ] {
        let (without, with) = (message(line, 0), message(line, EXTRA));
        // The first run makes the transaction known: the rest are its retransmissions.
        prog.run(Hook::Xdp, &without, 1);
        let (mut per_line, mut bare, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..LINE_ROUNDS {
            let fewer = prog.run(Hook::Xdp, &without, LINE_REPEAT).1;
            let more = prog.run(Hook::Xdp, &with, LINE_REPEAT).1;
            let b = prog.run(Hook::BarePass, &without, LINE_REPEAT).1;
            let line = (more - fewer) / EXTRA as f64;
            per_line.push(line);
            bare.push(b);
            ratios.push(line / b);
        }
        let (lo, hi) = range(&ratios);
        say!(
            r,
            "| `{}` | {:.1} | {:.1} | {:.1}x ({lo:.1}..{hi:.1}) |",
            line.trim_end(),
            median(per_line),
            median(bare),
            median(ratios)
        );
    }
}

/// The SIP path: a 1 KB INVITE of a new transaction, and its retransmission.
fn sip_costs(r: &mut Report, prog: &mut TestProgram) {
    const SINGLE: usize = 2000;
    let invite = invite_1k();
    let frame = Frame::udp(5060, &invite).build();
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    for _ in 0..SINGLE {
        prog.forget();
        ours.push(prog.run(Hook::Xdp, &frame, 1).1);
        bare.push(prog.run(Hook::BarePass, &frame, 1).1);
    }
    let (o, b) = (median(ours), median(bare));
    say!(
        r,
        "\n# SIP datapath latency (single runs)\n\nSame method as the hellos (single runs, transactions cleared): a latency figure, not a measure of cost.\n"
    );
    say!(
        r,
        "| packet | gateway_xdp ns | bare XDP_PASS ns | ratio | target |"
    );
    say!(r, "|---|---:|---:|---:|---:|");
    say!(
        r,
        "| INVITE, 1 KB, new transaction | {o:.0} | {b:.0} | {:.1}x | < 500 ns |",
        o / b
    );
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    for _ in 0..SINGLE {
        ours.push(prog.run(Hook::Xdp, &frame, 1).1);
        bare.push(prog.run(Hook::BarePass, &frame, 1).1);
    }
    let (o, b) = (median(ours), median(bare));
    say!(
        r,
        "| the same INVITE again (retransmission) | {o:.0} | {b:.0} | {:.1}x | - |",
        o / b
    );
    // An exempt request: a BYE of the dialog the server established (its 200 OK left first).
    let ok = b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-4101-1-0\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=4101SIPpTag001\r\n\
To: service <sip:service@10.99.0.1:5060>;tag=srv\r\n\
Call-ID: 1-4101@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";
    let established = Frame::udp(5061, ok).from_port(5060).build();
    // The server's answer to the BYE, which ends the dialog: run before each re-establishment,
    // so that every measured BYE meets a fresh dialog (one dialog buys 256 exempt requests).
    let ended = Frame::udp(
        5061,
        b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-b\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=4101SIPpTag001\r\n\
To: service <sip:service@10.99.0.1:5060>;tag=srv\r\n\
Call-ID: 1-4101@10.99.0.2\r\nCSeq: 2 BYE\r\n\r\n",
    )
    .from_port(5060)
    .build();
    let bye = Frame::udp(
        5060,
        b"BYE sip:service@10.99.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-b\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=4101SIPpTag001\r\n\
To: service <sip:service@10.99.0.1:5060>;tag=srv\r\n\
Call-ID: 1-4101@10.99.0.2\r\nCSeq: 2 BYE\r\n\r\n",
    )
    .build();
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    for _ in 0..SINGLE {
        prog.forget();
        prog.run(Hook::TcEgress, &ended, 1);
        prog.run(Hook::TcEgress, &established, 1);
        ours.push(prog.run(Hook::Xdp, &bye, 1).1);
        bare.push(prog.run(Hook::BarePass, &bye, 1).1);
    }
    let (o, b) = (median(ours), median(bare));
    say!(
        r,
        "| BYE of an established dialog (exempt) | {o:.0} | {b:.0} | {:.1}x | - |",
        o / b
    );
}

/// What answering a refusal costs against dropping it: a refused hello reset, a refused 1 KB
/// INVITE answered with a 503 (both XDP_TX from the reply program), against the same refusals
/// with `refuse: drop`.
fn reply_costs(r: &mut Report, prog: &mut TestProgram) {
    use gateway_common::{
        Class,
        policy::{Policy, Refuse},
    };
    const SINGLE: usize = 2000;
    let hello = Frame::tcp(443, &HelloBuilder::default().build())
        .from_port(7)
        .seq(1)
        .build();
    let invite = invite_1k();
    let invite = Frame::udp(5060, &invite).build();
    say!(
        r,
        "\n# Refusal latency: answered against dropped (single runs)\n\nA latency figure, not a measure of cost. Single runs, flows and transactions \
         cleared before each, median of {SINGLE}; the class closed (rate 0), the reply rate at \
         its maximum so that every run answers.\n"
    );
    say!(
        r,
        "| refusal | answered ns | dropped ns | answered / dropped | action |"
    );
    say!(r, "|---|---:|---:|---:|---|");
    for (name, class, frame) in [
        ("TLS hello, 153 B: reset", Class::TlsNew, &hello),
        ("SIP INVITE, 1 KB: 503", Class::SipOriginal, &invite),
    ] {
        let mut cost = |refuse| {
            let p = Policy {
                rate: Some(0),
                refuse: Some(refuse),
                reply_rate: Some(gateway_common::policy::MAX_REPLY_RATE),
                ..Default::default()
            };
            prog.maps.set_policy(class, p.to_map()).unwrap();
            let mut runs = Vec::new();
            let mut action = 0;
            for _ in 0..SINGLE {
                prog.forget();
                let (a, ns) = prog.run(Hook::Xdp, frame, 1);
                action = a;
                runs.push(ns);
            }
            (median(runs), action)
        };
        let (answered, tx) = cost(Refuse::Reject);
        let (dropped, _) = cost(Refuse::Drop);
        assert_eq!(tx, 3, "{name}: answered with XDP_TX");
        say!(
            r,
            "| {name} | {answered:.0} | {dropped:.0} | {:.2}x | XDP_TX |",
            answered / dropped
        );
    }
}

/// Rounds of the throughput benchmark (each: every kind of packet, every receiving end).
const VETH_ROUNDS: usize = 3;
/// Sending before a throughput window opens.
const VETH_WARMUP: Duration = Duration::from_millis(300);
/// A throughput window.
const VETH_WINDOW: Duration = Duration::from_secs(1);

/// What one core takes in through a veth pair (`gateway_tests::throughput`): for each kind of
/// packet (other traffic, an admitted connection's segments, spoofed hellos, forged INVITEs),
/// the receiving core's time per packet with no program, the bare XDP_PASS and XDP_DROP
/// programs and the gateway's, rounds alternating so that all of them see the same machine.
fn veth_throughput(r: &mut Report) {
    use gateway_common::programs;
    use gateway_tests::{
        inject::{PSH_ACK, ipv4_packet, tcp_next_seqs, tcp_segment, udp_datagram},
        netns::{GW_V4, PEER_V4, class_counter},
        sipp::{forged_invite, forged_port},
        throughput::{Sample, frame, mac, measure, prepare_receiver},
    };
    use std::{
        io::{Read, Write},
        net::{IpAddr, Ipv4Addr},
    };
    let net = TestNet::new();
    prepare_receiver(&net);
    let (to, from) = (
        mac(&net, &net.gw_ns, &net.gw_if),
        mac(&net, &net.peer_ns, &net.peer_if),
    );
    let (gw, peer): (Ipv4Addr, Ipv4Addr) = (GW_V4.parse().unwrap(), PEER_V4.parse().unwrap());
    let (gw_ip, peer_ip) = (IpAddr::V4(gw), IpAddr::V4(peer));
    let udp = |sport: u16, dport: u16, payload: &[u8]| {
        frame(
            to,
            from,
            &ipv4_packet(
                peer,
                gw,
                17,
                &udp_datagram(peer_ip, gw_ip, sport, dport, payload),
            ),
        )
    };
    let hello = HelloBuilder::default().build();
    // Behind every port a socket that never reads: the stack's whole way to a server, then
    // the drop of a full queue.
    let sockets = net.in_gw(|| {
        (
            std::net::UdpSocket::bind((gw, 9999)).unwrap(),
            std::net::UdpSocket::bind((gw, 5060)).unwrap(),
            std::net::TcpListener::bind((gw, 443)).unwrap(),
        )
    });
    // One real connection whose hello the server got: copies of that segment are packets of a
    // connection the kernel has (to it, duplicates it acknowledges again), and, once the
    // gateway has admitted the first of them as a hello, packets of an admitted connection.
    let client = net.in_peer(|| std::net::TcpStream::connect((gw, 443)).unwrap());
    (&client).write_all(&hello).unwrap();
    let (mut server, _) = sockets.2.accept().unwrap();
    server
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut got = vec![0u8; hello.len()];
    server
        .read_exact(&mut got)
        .expect("the hello at the server");
    let (snd, rcv) = tcp_next_seqs(&client);
    let flow_segment = tcp_segment(
        peer_ip,
        gw_ip,
        client.local_addr().unwrap().port(),
        443,
        snd.wrapping_sub(hello.len() as u32),
        rcv,
        PSH_ACK,
        &hello,
    );
    let kinds: [(&str, Vec<Vec<u8>>); 4] = [
        (
            "non-service UDP, 64 B frames",
            vec![udp(40000, 9999, &[7u8; 22])],
        ),
        (
            "segment of an admitted connection (tls-flow), 153 B, one connection",
            vec![frame(to, from, &ipv4_packet(peer, gw, 6, &flow_segment))],
        ),
        (
            "ClientHello, 153 B, of no connection (spoofed: socket lookup, drop), 4,096 ports",
            (0..4096u16)
                .map(|i| {
                    let seg = tcp_segment(peer_ip, gw_ip, 20000 + i, 443, 1, 1, PSH_ACK, &hello);
                    frame(to, from, &ipv4_packet(peer, gw, 6, &seg))
                })
                .collect(),
        ),
        (
            "SIP INVITE, 1 KB, new transactions, sip-original closed (dropped), 4,096 branches",
            (0..4096u32)
                .map(|i| udp(forged_port(i), 5060, &forged_invite(i)))
                .collect(),
        ),
    ];
    const ENDS: [&str; 4] = [
        "no program",
        "bare XDP_PASS",
        "bare XDP_DROP",
        "gateway_xdp",
    ];
    const GATEWAY: usize = 3;
    // samples[kind][end][round]
    let mut samples = vec![vec![Vec::<Sample>::new(); ENDS.len()]; kinds.len()];
    for _ in 0..VETH_ROUNDS {
        for (end, name) in ENDS.iter().enumerate() {
            let bare = match end {
                1 => Some(programs::XDP_BARE_PASS),
                2 => Some(programs::XDP_BARE_DROP),
                _ => None,
            }
            .map(|name| gateway_tests::netns::bare_program(&net.gw_ns, &net.gw_if, name));
            if end == GATEWAY {
                net.gateway_ok(&["attach", "--iface", &net.gw_if]);
                net.gateway_ok(&["service", "add", "tls", "443"]);
                net.gateway_ok(&["service", "add", "sip", "5060"]);
                net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0", "--pin"]);
            }
            for (k, (kind, frames)) in kinds.iter().enumerate() {
                let before = (end == GATEWAY).then(|| net.stats());
                let s = measure(&net, frames, VETH_WARMUP, VETH_WINDOW);
                assert!(s.received > 0, "{kind}, {name}: nothing received");
                if let Some(before) = before {
                    // The gateway's rows are what they claim to be.
                    let after = net.stats();
                    let grew = |class: &str, field: &str| {
                        class_counter(&after, class, field) - class_counter(&before, class, field)
                    };
                    let tls = |f: &str| {
                        after["tls"][f].as_u64().unwrap() - before["tls"][f].as_u64().unwrap()
                    };
                    match k {
                        0 => assert!(grew("other", "packets") >= s.received, "{kind}"),
                        1 => assert!(grew("tls-flow", "packets") >= s.received, "{kind}"),
                        2 => assert!(tls("no_connection") >= s.received, "{kind}"),
                        _ => {
                            assert!(grew("sip-original", "packets") >= s.received, "{kind}");
                            assert_eq!(grew("sip-original", "admitted"), 0, "{kind}");
                        }
                    }
                }
                samples[k][end].push(s);
            }
            drop(bare);
            if end == GATEWAY {
                net.gateway_ok(&["detach", "--iface", &net.gw_if]);
            }
        }
    }
    say!(
        r,
        "\n# Through a veth pair, one core each way\n\nFrames sent from the peer's namespace by one \
         thread on CPU 0 (AF_PACKET, sendmmsg batches of 64, no qdisc), taken in by the gateway's \
         veth on CPU 1 (GRO on, so the veth runs NAPI with or without a program; threaded NAPI, \
         its thread pinned). Per packet: the CPU time of the receiving NAPI thread (the XDP \
         program and, for what passes, the stack and any reply it sends) over the packets it \
         took in, in a {:.1} s window after {:.1} s of sending; {VETH_ROUNDS} rounds, each \
         receiving end in turn; medians, ratios the median (min..max) of the per-round ratios. \
         Per core: the packets one receiving core takes in a second at that cost. Busy: the \
         receiving core's share of the window (below 100%, the sender set the pace).\n",
        VETH_WINDOW.as_secs_f64(),
        VETH_WARMUP.as_secs_f64()
    );
    say!(
        r,
        "| packet | receiving end | ns per packet | per core | busy | sent/s | against no program | against bare XDP_PASS | against bare XDP_DROP |\n|---|---|---:|---:|---:|---:|---:|---:|---:|"
    );
    let ratio = |a: &[Sample], b: &[Sample]| {
        let v: Vec<f64> = a
            .iter()
            .zip(b)
            .map(|(a, b)| a.ns_per_packet() / b.ns_per_packet())
            .collect();
        let (lo, hi) = range(&v);
        format!("{:.2}x ({lo:.2}..{hi:.2})", median(v))
    };
    for (k, (kind, _)) in kinds.iter().enumerate() {
        for (end, name) in ENDS.iter().enumerate() {
            let v = &samples[k][end];
            let ns = median(v.iter().map(Sample::ns_per_packet).collect());
            let busy = median(v.iter().map(Sample::busy).collect());
            let sent = median(v.iter().map(|s| s.sent_per_s).collect());
            let against = |other: usize| {
                if other == end {
                    "-".to_string()
                } else {
                    ratio(v, &samples[k][other])
                }
            };
            let gateway_against = |other: usize| {
                if end == GATEWAY {
                    against(other)
                } else {
                    "-".to_string()
                }
            };
            say!(
                r,
                "| {kind} | {name} | {ns:.0} | {:.2} Mpps | {:.0}% | {:.2} M | {} | {} | {} |",
                1e3 / ns,
                busy * 100.0,
                sent / 1e6,
                against(0),
                gateway_against(1),
                gateway_against(2)
            );
        }
    }
}

/// What a spoofed segment costs (the socket lookup that finds no connection, then the drop),
/// and the kernel memory the pending tables take at their limit.
fn spoofed_costs(r: &mut Report) {
    let mut prog = TestProgram::new();
    // The real check, as attached: no CONFIG_TRUST_UNCONNECTED.
    prog.maps
        .set_config(gateway_common::maps::DatapathConfig::default())
        .unwrap();
    let garbage = Frame::tcp(443, &[0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3])
        .from_port(7)
        .build();
    let (mut ours, mut bare) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        ours.push(timed(&prog, Hook::Xdp, &garbage));
        bare.push(timed(&prog, Hook::BarePass, &garbage));
    }
    let (o, b) = (median(ours), median(bare));
    assert!(
        prog.counters().tls.no_connection >= u64::from(REPEAT),
        "the segments went through the socket lookup"
    );
    say!(
        r,
        "\n# Spoofed segments\n\nA TLS-port segment from a 4-tuple with no connection: one socket lookup, \
         dropped, no state. Repeat {REPEAT}, median of {ROUNDS} rounds.\n"
    );
    say!(
        r,
        "| packet | gateway_xdp ns | bare XDP_PASS ns | per core |"
    );
    say!(r, "|---|---:|---:|---:|");
    say!(
        r,
        "| spoofed segment (no connection) | {o:.1} | {b:.1} | {:.1} Mpps |",
        1e3 / o
    );
    say!(
        r,
        "\n| table (65,536 entries, preallocated) | kernel memory (bpftool memlock) |"
    );
    say!(r, "|---|---:|");
    for name in [
        gateway_common::maps::names::TLS_PENDING,
        gateway_common::maps::names::SIP_PENDING,
        gateway_common::maps::names::TLS_FLOWS4,
        gateway_common::maps::names::TLS_FLOWS,
    ] {
        let out = std::process::Command::new("bpftool")
            .args(["-j", "map", "show", "pinned"])
            .arg(prog.pins.map(name))
            .output()
            .expect("bpftool");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("bpftool JSON");
        let bytes = v["bytes_memlock"].as_u64().expect("bytes_memlock");
        say!(r, "| {name} | {:.1} MiB |", bytes as f64 / (1 << 20) as f64);
    }
}

/// The egress program on what servers send: it looks for answers that complete pending units.
fn egress_costs(r: &mut Report, prog: &TestProgram) {
    say!(
        r,
        "\n# Egress cost\n\nThe TC egress program (BPF_PROG_TEST_RUN on an skb), repeat {REPEAT}, median \
         of {ROUNDS} rounds; no pending unit matches, the common case (a unit completes once).\n"
    );
    say!(r, "| packet leaving | tc egress ns |");
    say!(r, "|---|---:|");
    let trying = b"SIP/2.0 100 Trying\r\nVia: SIP/2.0/UDP 10.99.0.2;branch=z9hG4bK1\r\n\
Call-ID: b1@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";
    for (name, frame) in [
        (
            "TLS server data (application record)",
            Frame::tcp(40000, &[23u8; 64]).from_port(443).build(),
        ),
        (
            "TLS server flight (handshake record)",
            Frame::tcp(40000, &[22, 3, 3, 0, 4, 2, 0, 0, 0])
                .from_port(443)
                .build(),
        ),
        (
            "SIP response",
            Frame::udp(40000, trying).from_port(5060).build(),
        ),
        (
            "non-service UDP",
            Frame::udp(9999, trying).from_port(9998).build(),
        ),
    ] {
        let mut ours = Vec::new();
        for _ in 0..ROUNDS {
            ours.push(timed(prog, Hook::TcEgress, &frame));
        }
        say!(r, "| {name} | {:.1} |", median(ours));
    }
    // On an XDP interface every packet the stack receives also passes the finishing program
    // (tcx ingress): a check for the metadata a refusal leaves, absent on all but those.
    let plain = Frame::tcp(443, &[23u8; 64]).build();
    let mut finisher = Vec::new();
    for _ in 0..ROUNDS {
        finisher.push(timed(prog, Hook::TcFinish, &plain));
    }
    say!(
        r,
        "\nThe finishing program at TC ingress (XDP modes), on a packet with no refusal metadata (every packet the stack receives on an XDP interface): {:.1} ns.",
        median(finisher)
    );
}

/// Runs in one batch of a fresh row: enough that what a batch costs once (the first runs' cold
/// caches, the clock) is a few nanoseconds a run, and well within the tables.
const FRESH_BATCH: u32 = 2000;
/// Runs in one batch of resumed hellos: within the places of one issued key
/// (`MAX_RESUME_LIMIT`).
const FRESH_BATCH_RESUMED: u32 = 1000;
/// Runs in one batch of BYEs: within the requests one dialog buys (`MAX_DIALOG_REQUESTS`), so
/// that every BYE is exempt.
const FRESH_BATCH_BYE: u32 = 200;
/// How far a fresh batch puts the classes' sweeps off: past its end (the sweep is measured on
/// its own, `fresh_costs`).
const SWEEPS_DEFERRED_NS: u64 = 1_000_000_000;
/// The XDP action a refusing fresh row's runs end with.
const XDP_DROP: u32 = 1;
/// The XDP action every other fresh run must end with.
const XDP_PASS: u32 = 2;
/// Batches of each fresh row.
const FRESH_ROUNDS: usize = 31;

/// One row of [`fresh_costs`]: a frame, where and how each run changes it, the class every run
/// must get, and what to set up before each batch.
struct FreshRow {
    name: &'static str,
    frame: Vec<u8>,
    offset: u16,
    mode: u8,
    class: gateway_common::Class,
    target: &'static str,
    before: Box<dyn Fn(&mut TestProgram)>,
    /// Runs in one batch.
    batch: u32,
    /// Every run is refused (dropped, no reply) rather than admitted.
    refused: bool,
}

/// Runs of one repeated measurement in [`floor_costs`] (the kernel's time per run).
const FLOOR_REPEAT: u32 = 1_000_000;
/// Rounds of [`floor_costs`], each measuring the classifier, the floor and the bare program.
const FLOOR_ROUNDS: usize = 9;

/// One row of [`floor_costs`]: a packet of a class, how it is run, its floor and the issue's
/// targets (as multiples of the bare program and of the floor).
struct FloorRow {
    name: &'static str,
    /// The packet, run by repeat (a known flow or transaction after the first run), or the name
    /// of the fresh row that runs it as a new connection or transaction every run.
    packet: FloorPacket,
    floor: Floor,
    target: (f64, f64),
    /// The floor of what this classifier must also keep for the class (its pending unit, its
    /// transaction key), and what that floor adds, for the second table.
    kept: Option<(Floor, &'static str)>,
}

enum FloorPacket {
    /// A frame by repeat, after an opener run once (a hello that admits its connection).
    Repeated {
        frame: Vec<u8>,
        opener: Option<Vec<u8>>,
    },
    Fresh(&'static str),
}

impl FloorPacket {
    fn repeated(frame: Vec<u8>) -> Self {
        FloorPacket::Repeated {
            frame,
            opener: None,
        }
    }
}

/// Every class against the least work its packets need: the classifier (`gateway_xdp`), the
/// class's floor program (`gateway-ebpf/src/bin/floors.rs`) and the bare XDP_PASS program, each
/// by repeat, interleaved round by round, timed by the kernel (BPF_PROG_TEST_RUN's own duration
/// per run, which leaves out the syscall). New connections and transactions run through the
/// fresh-packet program as in [`fresh_costs`] (tables emptied before each batch, the floor's
/// too); the others by repeat, where every run after the first is a known flow or transaction.
fn floor_costs(r: &mut Report, prog: &mut TestProgram) {
    let mut floors = Floors::load();
    let rows = [
        FloorRow {
            name: "non-service UDP, 64 B",
            packet: FloorPacket::repeated(Frame::udp(9999, &[0u8; 22]).build()),
            floor: Floor::NonService,
            target: (1.3, 1.1),
            kept: None,
        },
        FloorRow {
            name: "non-service TCP",
            packet: FloorPacket::repeated(Frame::tcp(80, &[0u8; 64]).build()),
            floor: Floor::NonService,
            target: (1.3, 1.1),
            kept: None,
        },
        FloorRow {
            name: "packet of an admitted connection (tls-flow)",
            // Application data on a connection its hello admitted (the same 4-tuple), where
            // the client's bytes go on: past the hello.
            packet: FloorPacket::Repeated {
                frame: Frame::tcp(443, &[23u8, 3, 3, 0, 64])
                    .seq(1 + HelloBuilder::default().build().len() as u32)
                    .build(),
                opener: Some(Frame::tcp(443, &HelloBuilder::default().build()).build()),
            },
            floor: Floor::Flow,
            target: (3.0, 1.25),
            kept: None,
        },
        FloorRow {
            name: "new hello, TLS 1.2, 153 B",
            packet: FloorPacket::Fresh("ClientHello, TLS 1.2, 153 B, new connection"),
            floor: Floor::NewHello,
            target: (22.0, 1.5),
            kept: Some((Floor::NewHelloUnit, "and its pending unit")),
        },
        FloorRow {
            name: "new hello, TLS 1.3 + ML-KEM, 1.4 KB",
            packet: FloorPacket::Fresh(
                "ClientHello, TLS 1.3 + ML-KEM share, 1.4 KB, new connection",
            ),
            floor: Floor::NewHello,
            target: (22.0, 1.5),
            kept: Some((Floor::NewHelloUnit, "and its pending unit")),
        },
        FloorRow {
            name: "resumed hello, 1.4 KB (key verified)",
            packet: FloorPacket::Fresh(
                "ClientHello, TLS 1.3 + ML-KEM share, resumed (key verified, place taken)",
            ),
            floor: Floor::ResumedHello,
            target: (26.0, 1.5),
            kept: Some((Floor::ResumedHelloUnit, "and its pending unit")),
        },
        FloorRow {
            name: "new 1 KB INVITE",
            packet: FloorPacket::Fresh("SIP INVITE, 1 KB, new transaction"),
            floor: Floor::NewInvite,
            target: (27.0, 1.5),
            kept: Some((
                Floor::NewInviteKeyed,
                "and its transaction key and pending unit",
            )),
        },
        FloorRow {
            name: "1 KB INVITE retransmission",
            packet: FloorPacket::repeated(Frame::udp(5060, &invite_1k()).build()),
            floor: Floor::SipRetransmission,
            target: (10.0, 1.6),
            kept: Some((Floor::SipRetransmissionKeyed, "and its transaction key")),
        },
    ];
    say!(
        r,
        "\n# Every class against its floor\n\nThe classifier (`gateway_xdp`), the class's floor \
         program (`gateway-ebpf/src/bin/floors.rs`: only the steps the class cannot do without) \
         and the bare XDP_PASS program, on the same packet, BPF_PROG_TEST_RUN's own time per \
         run; {FLOOR_ROUNDS} rounds, each running the three back to back (by repeat \
         {FLOOR_REPEAT}, or for new connections and transactions a batch as in the next \
         section, tables emptied before each, the floor's too, and the bare program by ten \
         times the batch); medians, and each ratio is the median (min..max) of the per-round \
         ratios. Targets are issue 55's.\n"
    );
    say!(
        r,
        "| packet | gateway ns | floor ns | bare ns | gateway / bare | floor / bare | gateway / floor | target / bare | target / floor |"
    );
    say!(r, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let fresh = fresh_rows();
    for row in &rows {
        let m = measure_floor_row(prog, &mut floors, &fresh, row.name, &row.packet, row.floor);
        say!(
            r,
            "| {} | {:.1} | {:.1} | {:.1} | {} | {} | {} | {:.1}x | {:.2}x |",
            row.name,
            m.ours,
            m.floor,
            m.bare,
            m.to_bare,
            m.floor_to_bare,
            m.to_floor,
            row.target.0,
            row.target.1
        );
    }
    // The floors of what this classifier must keep beyond the least work, for the rows that
    // have one (the table above keeps the issue's floors and targets).
    say!(
        r,
        "\nThe same, against floors of what this classifier must also keep (`floors.rs`'s keyed \
         floors): a new connection's or transaction's pending unit, one insert more into a \
         preallocated HASH (a unit is never evicted, or the backlog would drift); and a SIP \
         request's transaction key, FNV-1a over the values it covers (66 bytes of this INVITE, \
         in five values) mixed into one key (40 bytes more), which the pinned tables are keyed \
         by, so an upgrade keeps in-flight transactions and dialogs matched. Same method.\n"
    );
    say!(
        r,
        "| packet | gateway ns | kept floor ns | bare ns | gateway / bare | kept floor / bare | gateway / kept floor |"
    );
    say!(r, "|---|---:|---:|---:|---:|---:|---:|");
    for row in &rows {
        let Some((floor, adds)) = row.kept else {
            continue;
        };
        let name = format!("{}: {adds}", row.name);
        let m = measure_floor_row(prog, &mut floors, &fresh, &name, &row.packet, floor);
        say!(
            r,
            "| {} | {:.1} | {:.1} | {:.1} | {} | {} | {} |",
            name,
            m.ours,
            m.floor,
            m.bare,
            m.to_bare,
            m.floor_to_bare,
            m.to_floor
        );
    }
}

/// One row of [`floor_costs`]: medians of the three programs' times, and the per-round ratios'
/// medians (min..max), formatted.
struct FloorMeasure {
    ours: f64,
    floor: f64,
    bare: f64,
    to_bare: String,
    floor_to_bare: String,
    to_floor: String,
}

/// Runs `packet` (of the row `name`) through the classifier, `floor_program` and the bare
/// program, [`FLOOR_ROUNDS`] rounds, each the three back to back.
fn measure_floor_row(
    prog: &mut TestProgram,
    floors: &mut Floors,
    fresh: &[FreshRow],
    name: &str,
    packet: &FloorPacket,
    floor_program: Floor,
) -> FloorMeasure {
    let (mut ours, mut floor, mut bare) = (Vec::new(), Vec::new(), Vec::new());
    let (mut to_bare, mut to_floor, mut floor_to_bare) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..FLOOR_ROUNDS {
        let (o, f, b) = match packet {
            FloorPacket::Repeated { frame, opener } => {
                prog.forget();
                if let Some(hello) = opener {
                    assert_eq!(prog.run(Hook::Xdp, hello, 1).0, XDP_PASS, "the opener");
                    let flows = prog.maps.tls_flows().expect("flows");
                    assert!(
                        matches!(flows.as_slice(), [(_, f)] if f.state == gateway_common::maps::FLOW_ADMITTED),
                        "{}: the hello admitted its connection: {flows:?}",
                        name
                    );
                }
                let o = prog.run(Hook::Xdp, frame, FLOOR_REPEAT).1;
                let (action, f) = floors.run(floor_program, frame, FLOOR_REPEAT);
                assert_eq!(action, XDP_PASS, "{}: the floor passes it", name);
                let b = prog.run(Hook::BarePass, frame, FLOOR_REPEAT).1;
                (o, f, b)
            }
            FloorPacket::Fresh(fresh_name) => {
                let fresh_row = fresh
                    .iter()
                    .find(|f| f.name == *fresh_name)
                    .unwrap_or_else(|| panic!("no fresh row {fresh_name:?}"));
                let o = fresh_batch(prog, fresh_row, "this build");
                floors.forget();
                let (action, f) = floors.run(floor_program, &fresh_row.frame, fresh_row.batch);
                assert_eq!(action, XDP_PASS, "{}: the floor admits it", name);
                let b = prog
                    .run(Hook::BarePass, &fresh_row.frame, 10 * fresh_row.batch)
                    .1;
                (o, f, b)
            }
        };
        ours.push(o);
        floor.push(f);
        bare.push(b);
        to_bare.push(o / b);
        to_floor.push(o / f);
        floor_to_bare.push(f / b);
    }
    let ratio = |v: Vec<f64>| {
        let (lo, hi) = range(&v);
        format!("{:.2}x ({lo:.2}..{hi:.2})", median(v))
    };
    FloorMeasure {
        ours: median(ours),
        floor: median(floor),
        bare: median(bare),
        to_bare: ratio(to_bare),
        floor_to_bare: ratio(floor_to_bare),
        to_floor: ratio(to_floor),
    }
}

/// The packets of the per-packet section, each run by repeat (after its first run, the same
/// packet again: the INVITE a retransmission, the hello's segment a known flow's).
fn repeat_cases() -> Vec<(&'static str, Vec<u8>)> {
    // Keyed (branch, Call-ID, CSeq): repeated runs after the first are its retransmissions.
    let invite =
        b"INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2;branch=z9hG4bK1\r\n\
Call-ID: b1@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";
    vec![
        ("non-service UDP (other)", Frame::udp(9999, invite).build()),
        (
            "non-service TCP (other)",
            Frame::tcp(80, &[0u8; 64]).build(),
        ),
        (
            "SIP INVITE (sip-original)",
            Frame::udp(5060, invite).build(),
        ),
        // A SIPp-sized request parsed whole (its 11 header lines) on every run.
        (
            "SIP INVITE, 1 KB, retransmission (sip-retransmission)",
            Frame::udp(5060, &invite_1k()).build(),
        ),
        (
            "TLS ClientHello (tls-new)",
            Frame::tcp(443, &client_hello_head()).build(),
        ),
        (
            "TLS segment (tls-flow)",
            Frame::tcp(443, &[23u8, 3, 3, 0, 64]).build(),
        ),
        (
            "IPv6 + 2 ext headers, other",
            Frame::udp(9999, invite).ipv6(&[(0, 8), (60, 8)]).build(),
        ),
    ]
}

/// The rows of [`fresh_costs`] (and of `bench compare`, where both objects have the program).
fn fresh_rows() -> Vec<FreshRow> {
    use gateway_common::{
        Class,
        maps::{FRESH_LETTERS, FRESH_PORT, IssuedKey, IssuedValue, MAX_RESUME_LIMIT},
    };
    const SOURCE_PORT: u16 = 14 + 20;
    let at = |frame: &[u8], needle: &[u8]| {
        frame
            .windows(needle.len())
            .position(|w| w == needle)
            .expect("the marker is in the frame") as u16
    };
    let plain = HelloBuilder::default().build();
    let pq = HelloBuilder {
        psk_identity: Some(vec![7; 32]),
        ..HelloBuilder::tls13()
    }
    .build();
    let resuming = HelloBuilder {
        psk_identity: Some(vec![9; 32]),
        ..HelloBuilder::tls13()
    }
    .build();
    let issued = IssuedKey {
        key: gateway_common::tls::parse_hello(&resuming)
            .offer_key()
            .expect("an offer"),
    };
    let publish = move |p: &mut TestProgram| {
        // Every place of the key free again, no rate binding: these runs stand for many clients.
        let room = IssuedValue {
            limit: MAX_RESUME_LIMIT,
            per_minute: u32::MAX,
            ..Default::default()
        };
        match p.maps.add_issued(issued, room) {
            Ok(()) => {}
            // An older build's object (the comparison): its value layout, and its key of the
            // PSK identity (the digest of all of it, before tickets had a tail).
            Err(gateway::datapath::maps::MapsError::Op {
                source: aya::maps::MapError::InvalidValueSize { expected: 56, .. },
                ..
            }) => publish_before_tails(p, &[9; 32], &room),
            Err(e) => panic!("publish: {e}"),
        }
    };
    let invite = Frame::udp(5060, &invite_1k()).build();
    let invite_at = at(&invite, b"4101-1-0");
    // A BYE of a dialog the server established (its 200 OK left first), each run a new
    // transaction (its branch).
    let dialog = b"From: sipp <sip:sipp@10.99.0.2:5061>;tag=4101SIPpTag001\r\n\
To: service <sip:service@10.99.0.1:5060>;tag=srv\r\nCall-ID: 1-4101@10.99.0.2\r\n";
    let response = |via: &[u8], cseq: &[u8]| {
        Frame::udp(5061, &[via, dialog, cseq].concat())
            .from_port(5060)
            .build()
    };
    let established = response(
        b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-4101-1-0\r\n",
        b"CSeq: 1 INVITE\r\n\r\n",
    );
    // The server's answer to a BYE, which ends the dialog: run before each re-establishment, so
    // that every batch meets a fresh dialog (one dialog buys `MAX_DIALOG_REQUESTS`).
    let ended = response(
        b"SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-b\r\n",
        b"CSeq: 2 BYE\r\n\r\n",
    );
    let bye = Frame::udp(
        5060,
        &[
            &b"BYE sip:service@10.99.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-bye-0000\r\n"[..],
            dialog,
            b"CSeq: 2 BYE\r\n\r\n",
        ]
        .concat(),
    )
    .build();
    let bye_at = at(&bye, b"0000");
    let establish = move |p: &mut TestProgram| {
        p.run(Hook::TcEgress, &ended, 1);
        p.run(Hook::TcEgress, &established, 1);
    };
    let hello =
        |name, frame: &[u8], class, target, before: Box<dyn Fn(&mut TestProgram)>| FreshRow {
            name,
            frame: Frame::tcp(443, frame).build(),
            offset: SOURCE_PORT,
            mode: FRESH_PORT,
            class,
            target,
            before,
            batch: if class == Class::TlsResumed {
                FRESH_BATCH_RESUMED
            } else {
                FRESH_BATCH
            },
            refused: false,
        };
    vec![
        FreshRow {
            name: "non-service UDP, its port changed each run (what the change costs)",
            frame: Frame::udp(9999, b"x").build(),
            offset: SOURCE_PORT,
            mode: FRESH_PORT,
            class: Class::Other,
            target: "-",
            before: Box::new(|_| {}),
            batch: FRESH_BATCH,
            refused: false,
        },
        hello(
            "ClientHello, TLS 1.2, 153 B, new connection",
            &plain,
            Class::TlsNew,
            "20x",
            Box::new(|_| {}),
        ),
        FreshRow {
            name: "ClientHello, TLS 1.2, 153 B, new connection, refused (tls-new closed, no reply)",
            refused: true,
            target: "-",
            before: Box::new(|p: &mut TestProgram| {
                let closed = gateway_common::policy::Policy {
                    rate: Some(0),
                    burst: Some(0),
                    refuse: Some(gateway_common::policy::Refuse::Drop),
                    ..Default::default()
                };
                p.maps.set_policy(Class::TlsNew, closed.to_map()).unwrap();
            }),
            ..hello("", &plain, Class::TlsNew, "-", Box::new(|_| {}))
        },
        hello(
            "ClientHello, TLS 1.3 + ML-KEM share, 1.4 KB, new connection",
            &pq,
            Class::TlsNew,
            "25x",
            Box::new(|_| {}),
        ),
        hello(
            "ClientHello, TLS 1.3 + ML-KEM share, resumed (key verified, place taken)",
            &resuming,
            Class::TlsResumed,
            "30x",
            Box::new(publish),
        ),
        FreshRow {
            name: "SIP INVITE, 1 KB, new transaction",
            frame: invite,
            offset: invite_at,
            mode: FRESH_LETTERS,
            class: Class::SipOriginal,
            target: "40x",
            before: Box::new(|_| {}),
            batch: FRESH_BATCH,
            refused: false,
        },
        FreshRow {
            name: "BYE of an established dialog (exempt), new transaction",
            frame: bye,
            offset: bye_at,
            mode: FRESH_LETTERS,
            class: Class::SipExempt,
            target: "30x",
            before: Box::new(establish),
            batch: FRESH_BATCH_BYE,
            refused: false,
        },
        FreshRow {
            name: "SIP INVITE, 1 KB, new transaction, refused (sip-original closed, no reply)",
            frame: Frame::udp(5060, &invite_1k()).build(),
            offset: invite_at,
            mode: FRESH_LETTERS,
            class: Class::SipOriginal,
            target: "-",
            before: Box::new(|p: &mut TestProgram| {
                let closed = gateway_common::policy::Policy {
                    rate: Some(0),
                    burst: Some(0),
                    reply_rate: Some(0),
                    ..Default::default()
                };
                p.maps
                    .set_policy(Class::SipOriginal, closed.to_map())
                    .unwrap();
            }),
            batch: FRESH_BATCH,
            refused: true,
        },
    ]
}

/// One batch of `row` through [`Hook::Fresh`], from empty tables: the kernel's time per run.
/// Panics unless every run got the row's class and was admitted.
fn fresh_batch(prog: &mut TestProgram, row: &FreshRow, who: &str) -> f64 {
    prog.forget();
    // Every row starts from open classes (a row that refuses closes its class in its `before`).
    for class in [
        gateway_common::Class::SipOriginal,
        gateway_common::Class::TlsNew,
    ] {
        prog.maps
            .set_policy(class, gateway_common::policy::Policy::default().to_map())
            .unwrap();
    }
    (row.before)(prog);
    prog.freshen(row.offset, row.mode);
    prog.defer_sweeps(SWEEPS_DEFERRED_NS);
    // The class counters only: a baseline of an older release may count other TLS counters.
    let before = prog.maps.class_stats().unwrap();
    let (action, ns) = prog.run(Hook::Fresh, &row.frame, row.batch);
    let after = prog.maps.class_stats().unwrap();
    let (b, a) = (before[row.class as usize], after[row.class as usize]);
    let (want_action, admitted) = if row.refused {
        (XDP_DROP, 0)
    } else {
        (XDP_PASS, u64::from(row.batch))
    };
    assert_eq!(action, want_action, "{}: the last run's action", row.name);
    assert_eq!(
        (a.packets - b.packets, a.admitted - b.admitted),
        (u64::from(row.batch), admitted),
        "{who}, {}: every run classified {:?} and admitted (or, refusing, none); before \
         {before:?}, after {after:?}",
        row.name,
        row.class
    );
    ns
}

/// New connections' hellos and new transactions' requests measured by repeat: the benchmark's
/// fresh-packet program (`gateway_bench_fresh`, the XDP classifier's own code) writes each run's
/// number into the frame (a source port, a branch), so every run of a batch is a connection or
/// transaction the maps have not seen, classified and admitted as a flood's would be. Each
/// batch starts from empty tables; each row checks that every run got its class and was
/// admitted. What the write costs is its own row (a packet of no service, against the
/// classifier on the same packet).
fn fresh_costs(r: &mut Report, prog: &mut TestProgram) {
    say!(
        r,
        "\n# New connections and transactions by repeat\n\nThe classifier's own code on a frame \
         it changes before each run (another source port, another branch), so every run is a \
         hello of a new connection or a request of a new transaction; BPF_PROG_TEST_RUN with \
         repeat {FRESH_BATCH} ({FRESH_BATCH_RESUMED} for resumed hellos, within one key's \
         places; {FRESH_BATCH_BYE} for BYEs, within one dialog's requests; the bare program: \
         {} runs), the kernel's time per run, \
         tables emptied before each batch and every run checked to get its class and be \
         admitted; {FRESH_ROUNDS} batches, each beside the bare program's; medians, and the ratio \
         is the median (min..max) of the per-batch ratios. The sweep of expired units, which a \
         table's arrivals run when its earliest unit is due, is put off past each batch and \
         measured on its own below.\n",
        10 * FRESH_BATCH
    );
    say!(
        r,
        "| packet | fresh ns | bare XDP_PASS ns | ratio (min..max) | target |"
    );
    say!(r, "|---|---:|---:|---:|---:|");
    let rows = fresh_rows();
    for row in &rows {
        let (mut ours, mut bare, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        let mut plain = Vec::new();
        for _ in 0..FRESH_ROUNDS {
            let o = fresh_batch(prog, row, "this build");
            // The bare program by a longer repeat: its few nanoseconds a run are otherwise at
            // the mercy of one interruption.
            let b = prog.run(Hook::BarePass, &row.frame, 10 * FRESH_BATCH).1;
            if row.class == gateway_common::Class::Other {
                plain.push(prog.run(Hook::Xdp, &row.frame, row.batch).1);
            }
            ours.push(o);
            bare.push(b);
            ratios.push(o / b);
        }
        let (lo, hi) = range(&ratios);
        let o = median(ours);
        say!(
            r,
            "| {} | {o:.1} | {:.1} | {:.2}x ({lo:.2}..{hi:.2}) | {} |",
            row.name,
            median(bare),
            median(ratios),
            row.target
        );
        if !plain.is_empty() {
            let p = median(plain);
            say!(
                r,
                "| the same packet through gateway_xdp, unchanged (the change costs {:.1} ns) | {p:.1} | | | |",
                o - p
            );
        }
    }
    // The sweep: one pass over the TLS and SIP unit tables (and the holds), what the first
    // arrival of a class after its sweep is due pays; units held, none expired.
    prog.load_sweep();
    fresh_batch(prog, &rows[1], "this build");
    let units = prog.maps.tls_pending().expect("units").len();
    assert_eq!(units, FRESH_BATCH as usize, "the batch's units are held");
    let pass = median(
        (0..FRESH_ROUNDS)
            .map(|_| prog.run(Hook::Sweep, &rows[0].frame, 1).1)
            .collect(),
    );
    let at_most = pass * (1e9 / gateway_common::maps::SWEEP_INTERVAL_NS as f64);
    let timeout = |class| gateway_common::maps::default_timeout_ns(class) as f64;
    let (tls, sip) = (
        pass * (1e9 / timeout(gateway_common::Class::TlsNew)),
        pass * (1e9 / timeout(gateway_common::Class::SipOriginal)),
    );
    say!(
        r,
        "\nThe sweep of expired units, one pass over the unit tables and the holds with {units} \
         units held (single runs of the sweep program, median of {FRESH_ROUNDS}): {:.1} µs, most \
         of it the tables' buckets, whatever they hold. A table's pass is due when the earliest \
         unit it may find expired is (the holds': hourly), and at most every {} ms: under \
         units the server answers, once per timeout (by default 10 s for TLS, 2 s for SIP), so \
         at most {:.2} and {:.2} ms of CPU a second; under units that expire as often as passes \
         may come (a flood the server does not answer), at most {:.2} ms a second.",
        pass / 1000.0,
        gateway_common::maps::SWEEP_INTERVAL_NS / 1_000_000,
        tls / 1e6,
        sip / 1e6,
        at_most / 1e6
    );
}

/// Nanoseconds per run of `hook` on `frame`, from the wall time of one repeated test run.
/// The smallest and the largest of `v` (positive figures: ratios, times).
fn range(v: &[f64]) -> (f64, f64) {
    (
        v.iter().copied().fold(f64::MAX, f64::min),
        v.iter().copied().fold(0.0, f64::max),
    )
}

fn timed(prog: &TestProgram, hook: Hook, frame: &[u8]) -> f64 {
    let start = std::time::Instant::now();
    prog.run(hook, frame, REPEAT);
    start.elapsed().as_nanos() as f64 / f64::from(REPEAT)
}

/// The kernel memory of the issued-keys table (`TLS_ISSUED`, a hash map whose elements are
/// allocated as keys are published) at a few sizes, empty and full: what an operator pays for
/// `datapath.issued_keys`, handshakes per second x `session_lifetime`.
fn issued_table_memory(r: &mut Report) {
    say!(
        r,
        "\n# Issued-keys table: kernel memory\n\n`bpftool map show` `bytes_memlock` of `TLS_ISSUED` (the kernel's own count of what the map allocated), empty and with every entry published. One proxy issues one key per handshake (one TLS 1.3 ticket); a key lives for `session_lifetime`.\n"
    );
    say!(
        r,
        "| entries | for | empty | full | per key |\n|---:|---|---:|---:|---:|"
    );
    for (entries, what) in [
        (65_536u32, "the default: 9 handshakes/s for 2 h"),
        (1 << 20, "145 handshakes/s for 2 h"),
    ] {
        let mut prog = TestProgram::with_issued_keys(entries);
        let empty = prog.map_bytes(gateway_common::maps::names::TLS_ISSUED);
        for i in 0..entries {
            let mut k = [0u8; gateway_common::tls::KEY_LEN];
            k[..4].copy_from_slice(&i.to_le_bytes());
            prog.maps
                .add_issued(
                    gateway_common::maps::IssuedKey { key: k },
                    gateway_common::maps::IssuedValue::default(),
                )
                .expect("room for every entry");
        }
        let full = prog.map_bytes(gateway_common::maps::names::TLS_ISSUED);
        say!(
            r,
            "| {entries} | {what} | {:.1} MiB | {:.1} MiB | {:.0} B |",
            empty as f64 / (1 << 20) as f64,
            full as f64 / (1 << 20) as f64,
            full.saturating_sub(empty) as f64 / entries as f64
        );
    }
}

/// Every program's verifier figures: the instructions it processed and the program's size.
fn program_stats(r: &mut Report, prog: &TestProgram) {
    say!(
        r,
        "\n# Programs\n\nEvery program of the object as the kernel loaded it: instructions the \
         verifier processed to accept it (limit 1,000,000: the margin left to grow), \
         instructions after its rewrites (subprograms and callbacks included), and the stack \
         bytes of its main function's frame and of its largest callback's or subprogram's (the \
         deepest offset below the frame pointer in the translated code; the verifier's bound is \
         512 bytes along a chain of calls).\n"
    );
    say!(
        r,
        "| program | verified insns | translated insns | stack bytes (main / largest callback) |"
    );
    say!(r, "|---|---:|---:|---:|");
    for p in prog.program_stats() {
        say!(
            r,
            "| {} | {} | {} | {} / {} |",
            p.name,
            p.verified,
            p.translated,
            p.stack.0,
            p.stack.1
        );
    }
}

/// Another build's object file, loaded with its own pinned maps.
fn load_object(path: &str) -> TestProgram {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    // The object parser wants the bytes aligned as `include_bytes_aligned!` gives them.
    let mut aligned = vec![0u64; bytes.len().div_ceil(8)];
    // SAFETY: the u64 buffer holds at least bytes.len() bytes, and u8 has no alignment.
    let view =
        unsafe { std::slice::from_raw_parts_mut(aligned.as_mut_ptr().cast::<u8>(), bytes.len()) };
    view.copy_from_slice(&bytes);
    TestProgram::with_object(view)
}

/// One row of a side-by-side comparison.
struct Compared {
    /// What the row measures.
    name: String,
    /// Each build's fastest round (baseline first).
    best: [f64; 2],
    /// Per round, the second build's time over the baseline's.
    ratios: Vec<f64>,
}

impl Compared {
    fn new(name: &str) -> Self {
        Compared {
            name: name.to_owned(),
            best: [f64::MAX; 2],
            ratios: Vec::new(),
        }
    }

    /// One round's times, baseline first.
    fn add(&mut self, t: [f64; 2]) {
        self.best = [self.best[0].min(t[0]), self.best[1].min(t[1])];
        self.ratios.push(t[1] / t[0]);
    }
}

/// Rounds of a side-by-side comparison.
const COMPARE_ROUNDS: usize = 15;
/// The TCP port `bench compare` sets in SYN-cookie mode.
const COMPARE_COOKIE_PORT: u16 = 8443;
/// Runs of a repeated row in one round.
const COMPARE_REPEAT: u32 = 200_000;
/// Single runs of a stateful row in one round.
const COMPARE_SINGLE: usize = 200;
/// Batches of a fresh row (`fresh_rows`) in one round.
const COMPARE_FRESH: usize = 3;

/// This build's object against `baseline` (another build's object file, same map layout), each
/// loaded with its own pinned maps, rounds interleaved so that both see the same machine: per
/// row, the kernel's own time per run (BPF_PROG_TEST_RUN `duration`), the fastest round of each,
/// and the median and range of the per-round ratios this / baseline. Rows whose state a run
/// changes (new hellos, new transactions, refusals) are single runs with the state forgotten
/// before each, the median of a round's runs; the others are repeated.
fn compare(r: &mut Report, (baseline, name): (&str, &str), this: Option<(&str, &str)>) {
    use gateway_common::{
        Class,
        policy::{MAX_REPLY_RATE, Policy, Refuse},
    };
    let (this_prog, this_name) = match this {
        Some((path, other)) => (load_object(path), other),
        None => (TestProgram::new(), "this build"),
    };
    let mut progs = [load_object(baseline), this_prog];
    // A port in SYN-cookie mode, whose SYNs the NIC answers.
    for p in &mut progs {
        p.maps
            .add_service(
                gateway_common::maps::ServiceKey::new(6, COMPARE_COOKIE_PORT),
                gateway_common::maps::ServiceValue {
                    kind: gateway_common::maps::ServiceKind::Tls as u32,
                    flags: gateway_common::maps::SERVICE_SYN_COOKIES,
                },
            )
            .expect("a SYN-cookie port");
    }
    let small_invite =
        b"INVITE sip:bob@example.com SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2;branch=z9hG4bK1\r\n\
Call-ID: b1@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";
    let response =
        b"SIP/2.0 180 Ringing\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-4101-1-0\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=4101SIPpTag001\r\n\
To: service <sip:service@10.99.0.1:5060>;tag=srv\r\n\
Call-ID: 1-4101@10.99.0.2\r\nCSeq: 1 INVITE\r\n\r\n";
    let plain = HelloBuilder::default().build();
    let pq = HelloBuilder::tls13().build();
    let flow_hello = Frame::tcp(443, &plain).from_port(1).seq(1).build();
    let flow_data = Frame::tcp(443, &[23, 3, 3, 0, 32])
        .from_port(1)
        .seq(1 + plain.len() as u32)
        .build();
    let flow_hello6 = Frame::tcp(443, &plain)
        .ipv6(&[])
        .from_port(2)
        .seq(1)
        .build();
    let flow_data6 = Frame::tcp(443, &[23, 3, 3, 0, 32])
        .ipv6(&[])
        .from_port(2)
        .seq(1 + plain.len() as u32)
        .build();
    for p in &progs {
        p.run(Hook::Xdp, &flow_hello, 1);
        p.run(Hook::Xdp, &flow_hello6, 1);
    }
    let repeated: [(&str, Hook, Vec<u8>); 8] = [
        (
            "non-service UDP",
            Hook::Xdp,
            Frame::udp(9999, small_invite).build(),
        ),
        (
            "non-service TCP",
            Hook::Xdp,
            Frame::tcp(80, &[0u8; 64]).build(),
        ),
        (
            "IPv6 + 2 ext headers, other",
            Hook::Xdp,
            Frame::udp(9999, small_invite)
                .ipv6(&[(0, 8), (60, 8)])
                .build(),
        ),
        ("admitted connection (tls-flow)", Hook::Xdp, flow_data),
        ("admitted IPv6 connection (tls-flow)", Hook::Xdp, flow_data6),
        (
            "SIP INVITE, 4 headers, retransmission",
            Hook::Xdp,
            Frame::udp(5060, small_invite).build(),
        ),
        (
            "SIP INVITE, 1 KB, retransmission",
            Hook::Xdp,
            Frame::udp(5060, &invite_1k()).build(),
        ),
        (
            "tc egress: SIP response",
            Hook::TcEgress,
            Frame::udp(5061, response).from_port(5060).build(),
        ),
    ];
    // A Linux client's SYN: MSS, SACK permitted, time stamps, a NOP, window scale.
    let syn_options = [
        2, 4, 0x05, 0xb4, 4, 2, 8, 10, 0, 0, 0, 1, 0, 0, 0, 0, 1, 3, 3, 7,
    ];
    let single: [(&str, Vec<u8>, Option<Class>); 5] = [
        (
            "ClientHello, TLS 1.2, 153 B",
            Frame::tcp(443, &plain).build(),
            None,
        ),
        (
            "ClientHello, TLS 1.3 + ML-KEM share, 1.4 KB",
            Frame::tcp(443, &pq).build(),
            None,
        ),
        (
            "SIP INVITE, 1 KB, new transaction",
            Frame::udp(5060, &invite_1k()).build(),
            None,
        ),
        (
            "503 for a refused 1 KB INVITE",
            Frame::udp(5060, &invite_1k()).build(),
            Some(Class::SipOriginal),
        ),
        (
            "SYN-ACK with a cookie for a SYN (Linux options)",
            Frame::tcp(COMPARE_COOKIE_PORT, &[])
                .flags(0x02)
                .tcp_options(&syn_options)
                .build(),
            None,
        ),
    ];
    // New connections and transactions by repeat, when both objects have the fresh program.
    let fresh = if progs.iter().all(TestProgram::has_fresh) {
        fresh_rows()
    } else {
        Vec::new()
    };
    // A segment of no connection, judged as attached (the socket lookup, no trust).
    let spoofed = (
        "spoofed segment (no connection: socket lookup, drop)",
        Frame::tcp(443, &[0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3])
            .from_port(7)
            .build(),
    );
    let mut rows: Vec<Compared> = repeated
        .iter()
        .map(|r| r.0)
        .chain([spoofed.0])
        .chain(single.iter().map(|r| r.0))
        .chain(fresh.iter().map(|r| r.name))
        .map(Compared::new)
        .collect();
    let mut bare = Vec::new();
    for _ in 0..COMPARE_ROUNDS {
        for (i, (_, hook, frame)) in repeated.iter().enumerate() {
            let mut t = [0.0; 2];
            for (k, p) in progs.iter().enumerate() {
                t[k] = p.run(*hook, frame, COMPARE_REPEAT).1;
            }
            rows[i].add(t);
        }
        let mut t = [0.0; 2];
        for (k, p) in progs.iter_mut().enumerate() {
            let trusting = p.maps.config().unwrap();
            p.maps
                .set_config(gateway_common::maps::DatapathConfig::default())
                .unwrap();
            t[k] = p.run(Hook::Xdp, &spoofed.1, COMPARE_REPEAT).1;
            p.maps.set_config(trusting).unwrap();
        }
        rows[repeated.len()].add(t);
        bare.push(
            progs[1]
                .run(Hook::BarePass, &repeated[0].2, COMPARE_REPEAT)
                .1,
        );
        for (i, (row, frame, refused)) in single.iter().enumerate() {
            let mut t = [0.0; 2];
            for (k, p) in progs.iter_mut().enumerate() {
                if let Some(class) = refused {
                    let policy = Policy {
                        rate: Some(0),
                        refuse: Some(Refuse::Reject),
                        reply_rate: Some(MAX_REPLY_RATE),
                        ..Default::default()
                    };
                    p.maps.set_policy(*class, policy.to_map()).unwrap();
                }
                let mut runs = Vec::new();
                for _ in 0..COMPARE_SINGLE {
                    p.forget();
                    let (action, ns) = p.run(Hook::Xdp, frame, 1);
                    if refused.is_some() || frame == &single[4].1 {
                        assert_eq!(action, 3, "{row}: answered with XDP_TX");
                    }
                    runs.push(ns);
                }
                t[k] = median(runs);
                if let Some(class) = refused {
                    p.maps
                        .set_policy(*class, Policy::default().to_map())
                        .unwrap();
                }
            }
            rows[repeated.len() + 1 + i].add(t);
        }
        for (i, row) in fresh.iter().enumerate() {
            let mut t = [0.0; 2];
            for (k, p) in progs.iter_mut().enumerate() {
                t[k] = median(
                    (0..COMPARE_FRESH)
                        .map(|_| fresh_batch(p, row, [name, this_name][k]))
                        .collect(),
                );
            }
            rows[repeated.len() + 1 + single.len() + i].add(t);
        }
    }
    let bare = bare.iter().copied().fold(f64::MAX, f64::min);
    say!(
        r,
        "\n# {this_name} against {name}\n\nBoth objects loaded side by side, {COMPARE_ROUNDS} \
         interleaved rounds; the kernel's own time per run. Repeated rows: {COMPARE_REPEAT} runs \
         a round; single-run rows (state forgotten before each): the median of {COMPARE_SINGLE} \
         a round, which includes the single run's clock overhead; fresh rows (every run a new \
         connection or transaction, as `bench fresh` measures them): the median of \
         {COMPARE_FRESH} batches a round, where both objects have the program. \
         Fastest round of each build \
         (and over the bare XDP_PASS program's fastest repeated round, {bare:.1} ns), and the \
         median (range) of the per-round ratios {this_name} / {name}.\n"
    );
    say!(
        r,
        "| packet | {name} ns (/ bare) | {this_name} ns (/ bare) | {this_name} / {name}, median (range) |"
    );
    say!(r, "|---|---:|---:|---:|");
    for Compared {
        name: row,
        best,
        ratios,
    } in rows
    {
        let (lo, hi) = range(&ratios);
        say!(
            r,
            "| {row} | {:.0} ({:.1}x) | {:.0} ({:.1}x) | {:.2} ({lo:.2}..{hi:.2}) |",
            best[0],
            best[0] / bare,
            best[1],
            best[1] / bare,
            median(ratios)
        );
    }
}
