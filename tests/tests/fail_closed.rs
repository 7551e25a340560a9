//! Fail closed (issue 23): what the kernel would deliver to a protected service never walks
//! past its limits, with the real program, the real kernel of a namespace reassembling and
//! delivering what it sends, and no daemon. Each hostile shape is sent to a closed class (it
//! must reach no server) and to an open one (it must be served, so the test shows it really
//! reaches the server when allowed).

use std::{
    io::{Read as _, Write as _},
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, UdpSocket},
    os::fd::AsRawFd as _,
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use gateway_common::testing::HelloBuilder;
use gateway_tests::{
    have_root,
    inject::{
        PSH_ACK, SYN, TCP, UDP, established_by_repair, handshake_by_hand, ipv4_fragments,
        ipv4_packet, ipv6_with_dest_opts, send_ip, tcp_next_seqs, tcp_segment, udp_datagram,
    },
    netns::{GW_V4, GW_V6, PEER_V4, PEER_V6, TestNet, class_counter},
    sipserver::SlowSipServer,
};

/// A TCP server in the gateway's namespace that reads whatever its clients send and keeps, per
/// connection, the bytes it received: what the kernel really delivered to a server.
struct RecordingServer {
    received: Arc<Mutex<Vec<Vec<u8>>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl RecordingServer {
    fn start(listener: TcpListener) -> Self {
        listener.set_nonblocking(true).unwrap();
        let received = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (rec, halt) = (received.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut readers = Vec::new();
            while !halt.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((mut s, _)) => {
                        let rec = rec.clone();
                        let halt = halt.clone();
                        readers.push(std::thread::spawn(move || {
                            let slot = {
                                let mut r = rec.lock().unwrap();
                                r.push(Vec::new());
                                r.len() - 1
                            };
                            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
                            let mut buf = [0u8; 4096];
                            while !halt.load(Ordering::Relaxed) {
                                match s.read(&mut buf) {
                                    Ok(0) => break,
                                    Ok(n) => rec.lock().unwrap()[slot].extend_from_slice(&buf[..n]),
                                    Err(e)
                                        if matches!(
                                            e.kind(),
                                            std::io::ErrorKind::WouldBlock
                                                | std::io::ErrorKind::TimedOut
                                        ) => {}
                                    Err(_) => break,
                                }
                            }
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
            for r in readers {
                let _ = r.join();
            }
        });
        RecordingServer {
            received,
            stop,
            thread: Some(thread),
        }
    }

    /// Whether some connection received `bytes` (as a contiguous run) within `wait`.
    fn got(&self, bytes: &[u8], wait: Duration) -> bool {
        let start = Instant::now();
        loop {
            let found = self
                .received
                .lock()
                .unwrap()
                .iter()
                .any(|r| r.windows(bytes.len()).any(|w| w == bytes));
            if found || start.elapsed() >= wait {
                return found;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RecordingServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Namespaces with the datapath attached (no daemon) protecting tls/443, and a recording server
/// on 443 (IPv4 and IPv6).
fn tls_behind_the_gateway() -> (TestNet, RecordingServer) {
    tls_behind_the_gateway_with(&[])
}

/// As [`tls_behind_the_gateway`], `service add` given `args` too (`--no-syn-cookies`: the
/// kernel answers SYNs).
fn tls_behind_the_gateway_with(args: &[&str]) -> (TestNet, RecordingServer) {
    let net = TestNet::new();
    let listener = net.in_gw(|| TcpListener::bind("[::]:443").expect("bind"));
    let server = RecordingServer::start(listener);
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    let mut add = vec!["service", "add", "tls", "443"];
    add.extend_from_slice(args);
    net.gateway_ok(&add);
    (net, server)
}

fn close_tls_new(net: &TestNet) {
    net.gateway_ok(&["policy", "set", "tls-new", "--backlog", "0"]);
}

fn open_tls_new(net: &TestNet) {
    net.gateway_ok(&["policy", "clear", "tls-new"]);
}

/// A hello unlike any other one of this test run (its random differs), so a server that got it
/// got this one.
fn hello(n: u8) -> Vec<u8> {
    HelloBuilder {
        session_id: vec![n; 32],
        key_share_len: 32,
        ..HelloBuilder::tls13()
    }
    .build()
}

/// A client connection made by the peer's kernel: the stream and its addresses.
fn connect(net: &TestNet, v6: bool) -> (TcpStream, SocketAddr, SocketAddr) {
    let to: SocketAddr = if v6 {
        format!("[{GW_V6}]:443").parse().unwrap()
    } else {
        format!("{GW_V4}:443").parse().unwrap()
    };
    let s =
        net.in_peer(|| TcpStream::connect_timeout(&to, Duration::from_secs(2)).expect("connect"));
    let local = s.local_addr().unwrap();
    (s, local, to)
}

/// Sends `payload` as the next segment of the client connection `stream`, from a raw socket,
/// shaped by `shape` (the segment's transport bytes to the IP packets that carry them).
fn inject_segment(
    net: &TestNet,
    stream: &TcpStream,
    from: SocketAddr,
    to: SocketAddr,
    payload: &[u8],
    shape: impl Fn(&[u8]) -> Vec<Vec<u8>> + Send,
) {
    let (seq, ack) = tcp_next_seqs(stream);
    let segment = tcp_segment(
        from.ip(),
        to.ip(),
        from.port(),
        to.port(),
        seq,
        ack,
        PSH_ACK,
        payload,
    );
    let packets = shape(&segment);
    net.in_peer(|| send_ip(to.ip(), &packets));
}

fn v4(a: &str) -> Ipv4Addr {
    a.parse().unwrap()
}

fn v6(a: &str) -> Ipv6Addr {
    a.parse().unwrap()
}

/// IPv4 fragments whose first carries only 8 bytes of the transport header.
fn tiny_fragments(proto: u8, id: u16) -> impl Fn(&[u8]) -> Vec<Vec<u8>> + Send {
    move |l4: &[u8]| ipv4_fragments(v4(PEER_V4), v4(GW_V4), proto, id, l4, 8)
}

/// An IPv6 packet behind destination-options headers of the lengths given.
fn behind_dest_opts(proto: u8, headers: &'static [usize]) -> impl Fn(&[u8]) -> Vec<Vec<u8>> + Send {
    move |l4: &[u8]| {
        vec![ipv6_with_dest_opts(
            v6(PEER_V6),
            v6(GW_V6),
            proto,
            l4,
            headers,
        )]
    }
}

/// Sends one hello shaped by `shape` on a fresh connection: whether the server received it.
fn hello_served(
    net: &TestNet,
    server: &RecordingServer,
    v6: bool,
    n: u8,
    shape: impl Fn(&[u8]) -> Vec<Vec<u8>> + Send,
    wait: Duration,
) -> bool {
    let (stream, from, to) = connect(net, v6);
    let h = hello(n);
    inject_segment(net, &stream, from, to, &h, shape);
    server.got(&h, wait)
}

/// Each shape to tls-new closed (never served, judged tls-new) and then open (served).
fn tls_shape_obeys_tls_new(
    v6: bool,
    service_args: &[&str],
    shape: impl Fn(u16) -> Box<dyn Fn(&[u8]) -> Vec<Vec<u8>> + Send>,
) {
    let (net, server) = tls_behind_the_gateway_with(service_args);
    close_tls_new(&net);
    for n in 0..5u8 {
        assert!(
            !hello_served(
                &net,
                &server,
                v6,
                n,
                shape(n.into()),
                Duration::from_millis(300)
            ),
            "hello {n} reached the server with tls-new closed"
        );
    }
    let stats = net.stats();
    assert_eq!(
        class_counter(&stats, "tls-new", "dropped_backlog"),
        5,
        "{stats}"
    );
    assert_eq!(class_counter(&stats, "tls-new", "admitted"), 0);
    open_tls_new(&net);
    for n in 10..15u8 {
        assert!(
            hello_served(
                &net,
                &server,
                v6,
                n,
                shape(n.into()),
                Duration::from_secs(2)
            ),
            "hello {n} was not served with tls-new open"
        );
    }
    assert_eq!(class_counter(&net.stats(), "tls-new", "admitted"), 5);
}

#[test]
fn tiny_first_fragments_of_a_hello_obey_tls_new() {
    if !have_root("tiny_first_fragments_of_a_hello_obey_tls_new") {
        return;
    }
    // The kernel answering SYNs: it has the connection, and reassembles what the NIC judged.
    tls_shape_obeys_tls_new(false, &["--no-syn-cookies"], |id| {
        Box::new(tiny_fragments(TCP, 0x100 + id))
    });
}

/// With SYN cookies (the default for TLS), a connection exists nowhere until the segment that
/// carries its cookie is judged, and a fragment's cookie cannot be checked (its TCP header is in
/// one fragment, its hello in others): a first segment in fragments never connects, whatever
/// tls-new allows, and nothing of it reaches the server. A real TCP sets Don't Fragment and
/// sizes its segments by the path's MTU, so this costs honest clients nothing.
#[test]
fn with_syn_cookies_tiny_first_fragments_of_a_hello_never_connect() {
    if !have_root("with_syn_cookies_tiny_first_fragments_of_a_hello_never_connect") {
        return;
    }
    let (net, server) = tls_behind_the_gateway();
    for n in 0..3u8 {
        let shape = tiny_fragments(TCP, 0x200 + u16::from(n));
        assert!(
            !hello_served(&net, &server, false, n, shape, Duration::from_millis(300)),
            "hello {n} in fragments reached the server"
        );
    }
    let stats = net.stats();
    assert_eq!(class_counter(&stats, "tls-new", "admitted"), 0, "{stats}");
    assert!(
        stats["tls"]["no_connection"].as_u64().unwrap() >= 3,
        "{stats}"
    );
    assert!(
        stats["tls"]["cookies_sent"].as_u64().unwrap() >= 3,
        "{stats}"
    );
}

#[test]
fn a_hello_behind_seven_destination_options_headers_obeys_tls_new() {
    if !have_root("a_hello_behind_seven_destination_options_headers") {
        return;
    }
    tls_shape_obeys_tls_new(true, &[], |_| Box::new(behind_dest_opts(TCP, &[8; 7])));
}

#[test]
fn a_hello_behind_a_520_byte_destination_options_header_obeys_tls_new() {
    if !have_root("a_hello_behind_a_520_byte_destination_options_header") {
        return;
    }
    tls_shape_obeys_tls_new(true, &[], |_| Box::new(behind_dest_opts(TCP, &[520])));
}

#[test]
fn a_header_chain_longer_than_the_parser_follows_is_refused_whatever_the_policy() {
    if !have_root("a_header_chain_longer_than_the_parser_follows") {
        return;
    }
    let (net, server) = tls_behind_the_gateway();
    // Nine headers: past the parser's bounds, though the kernel would walk them.
    for n in 0..3u8 {
        assert!(!hello_served(
            &net,
            &server,
            true,
            n,
            behind_dest_opts(TCP, &[8; 9]),
            Duration::from_millis(300)
        ));
    }
    let stats = net.stats();
    assert_eq!(stats["datapath"]["unjudgeable"], 3, "{stats}");
    // The same connection's next hello, in an ordinary packet, is served.
    assert!(hello_served(
        &net,
        &server,
        true,
        9,
        behind_dest_opts(TCP, &[]),
        Duration::from_secs(2)
    ));
}

/// Namespaces with the datapath attached protecting sip/5060, a SIP server answering INVITEs,
/// and a client socket bound to the peer's address (IPv4 or IPv6) on 5061.
fn sip_behind_the_gateway(v6: bool) -> (TestNet, SlowSipServer, UdpSocket) {
    let net = TestNet::new();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "sip", "5060"]);
    let socket = net.in_gw(|| UdpSocket::bind("[::]:5060").expect("bind"));
    let server = SlowSipServer::start(socket, 1 << 20, Duration::ZERO, Duration::ZERO);
    let local = if v6 {
        format!("[{PEER_V6}]:5061")
    } else {
        format!("{PEER_V4}:5061")
    };
    let client = net.in_peer(|| UdpSocket::bind(&local).expect("bind"));
    client
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    (net, server, client)
}

fn invite(n: u32) -> String {
    format!(
        "INVITE sip:service@{GW_V4}:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP {PEER_V4}:5061;branch=z9hG4bK-fc-{n}\r\n\
From: <sip:c@{PEER_V4}>;tag={n}\r\nTo: <sip:service@{GW_V4}>\r\n\
Call-ID: fc-{n}@{PEER_V4}\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n"
    )
}

/// Each shaped INVITE to sip-original closed (no answer) and then open (answered).
fn sip_shape_obeys_sip_original(v6: bool, shape: impl Fn(u32) -> Vec<Vec<u8>>) {
    let (net, _server, client) = sip_behind_the_gateway(v6);
    let dst: IpAddr = if v6 {
        GW_V6.parse().unwrap()
    } else {
        GW_V4.parse().unwrap()
    };
    let answered = |n: u32| {
        let packets = shape(n);
        net.in_peer(|| send_ip(dst, &packets));
        let mut buf = [0u8; 2048];
        client
            .recv_from(&mut buf)
            .is_ok_and(|(len, _)| buf[..len].starts_with(b"SIP/2.0 200 OK"))
    };
    net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0"]);
    for n in 0..5 {
        assert!(!answered(n), "INVITE {n} answered with sip-original closed");
    }
    let stats = net.stats();
    assert_eq!(
        class_counter(&stats, "sip-original", "admitted"),
        0,
        "{stats}"
    );
    net.gateway_ok(&["policy", "clear", "sip-original"]);
    for n in 10..15 {
        assert!(
            answered(n),
            "INVITE {n} not answered with sip-original open"
        );
    }
    assert_eq!(class_counter(&net.stats(), "sip-original", "admitted"), 5);
}

#[test]
fn tiny_first_fragments_of_an_invite_obey_sip_original() {
    if !have_root("tiny_first_fragments_of_an_invite") {
        return;
    }
    // The first fragment holds the UDP header alone: the message, which the kernel would
    // reassemble, is in fragments that carry no ports. Judged as an original under the class's
    // limits, holding a unit keyed by its source (no response can be matched to it, so the unit
    // ends at its timeout). A real sender's first fragment carries a full MTU of the message,
    // and is judged by it (`fragmented_invites_obey_the_original_limits` in
    // earned_privileges.rs).
    let (net, _server, client) = sip_behind_the_gateway(false);
    let answered = |n: u32| {
        let l4 = udp_datagram(
            IpAddr::V4(v4(PEER_V4)),
            IpAddr::V4(v4(GW_V4)),
            5061,
            5060,
            invite(n).as_bytes(),
        );
        let packets = ipv4_fragments(v4(PEER_V4), v4(GW_V4), UDP, 0x200 + n as u16, &l4, 8);
        net.in_peer(|| send_ip(IpAddr::V4(v4(GW_V4)), &packets));
        let mut buf = [0u8; 2048];
        client.recv_from(&mut buf).is_ok()
    };
    for n in 0..5 {
        assert!(
            answered(n),
            "tiny INVITE {n} not answered with sip-original open"
        );
    }
    // One source: each takes the place of the one before (which ends as expired).
    let stats = net.stats();
    assert_eq!(
        class_counter(&stats, "sip-original", "admitted"),
        5,
        "{stats}"
    );
    assert_eq!(
        class_counter(&stats, "sip-original", "backlog"),
        1,
        "{stats}"
    );
    assert_eq!(
        class_counter(&stats, "sip-original", "expired"),
        4,
        "{stats}"
    );
    // Its unit is marked as one no answer can match: live work to the controller, never
    // passed over.
    let pd = gateway::datapath::pins::select(&net.root(), Some(&net.gw_if)).expect("pins");
    let units = gateway::datapath::maps::Maps::open(&pd)
        .expect("maps")
        .sip_pending(16)
        .unwrap();
    assert_eq!(units.len(), 1, "{units:?}");
    assert_ne!(units[0].flags & gateway_common::maps::PENDING_UNMATCHED, 0);
    net.gateway_ok(&["policy", "set", "sip-original", "--rate", "0"]);
    for n in 5..10 {
        assert!(
            !answered(n),
            "tiny INVITE {n} answered with sip-original closed"
        );
    }
    let stats = net.stats();
    assert_eq!(
        class_counter(&stats, "sip-original", "admitted"),
        5,
        "{stats}"
    );
    assert_eq!(class_counter(&stats, "sip-original", "dropped_rate"), 5);
    assert_eq!(stats["datapath"]["unjudgeable"], 10);
    // The same INVITEs whole are judged by their content: answered once the class is open.
    net.gateway_ok(&["policy", "clear", "sip-original"]);
    let whole = udp_datagram(
        IpAddr::V4(v4(PEER_V4)),
        IpAddr::V4(v4(GW_V4)),
        5061,
        5060,
        invite(3).as_bytes(),
    );
    net.in_peer(|| {
        send_ip(
            IpAddr::V4(v4(GW_V4)),
            &[ipv4_packet(v4(PEER_V4), v4(GW_V4), UDP, &whole)],
        )
    });
    let mut buf = [0u8; 2048];
    assert!(
        client.recv_from(&mut buf).is_ok(),
        "the whole INVITE answered"
    );
}

#[test]
fn invites_behind_long_ipv6_header_chains_obey_sip_original() {
    if !have_root("invites_behind_long_ipv6_header_chains") {
        return;
    }
    for headers in [&[8usize; 7][..], &[520][..]] {
        sip_shape_obeys_sip_original(true, |n| {
            let l4 = udp_datagram(
                IpAddr::V6(v6(PEER_V6)),
                IpAddr::V6(v6(GW_V6)),
                5061,
                5060,
                invite(n).as_bytes(),
            );
            vec![ipv6_with_dest_opts(
                v6(PEER_V6),
                v6(GW_V6),
                UDP,
                &l4,
                headers,
            )]
        });
    }
}

/// Sets `net.ipv4.tcp_fastopen` in a namespace.
fn fastopen(net: &TestNet, ns: &str, value: &str) {
    let out = net.exec(
        ns,
        "sysctl",
        &["-qw", &format!("net.ipv4.tcp_fastopen={value}")],
    );
    assert!(out.status.success(), "{out:?}");
}

/// Connects with TCP Fast Open, `data` in the SYN (once the client holds the server's cookie),
/// and closes after a moment. The send's error, if any (a refused client is reset).
fn fastopen_send(net: &TestNet, data: &[u8]) -> std::io::Result<()> {
    net.in_peer(|| {
        let sock = socket2_tcp();
        let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        sa.sin_family = libc::AF_INET as u16;
        sa.sin_port = 443u16.to_be();
        sa.sin_addr.s_addr = u32::from_ne_bytes(v4(GW_V4).octets());
        // SAFETY: a sendto on a socket this function owns, with a sockaddr_in of the right size.
        let n = unsafe {
            libc::sendto(
                sock.as_raw_fd(),
                data.as_ptr().cast(),
                data.len(),
                libc::MSG_FASTOPEN,
                (&raw const sa).cast(),
                size_of::<libc::sockaddr_in>() as u32,
            )
        };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        std::thread::sleep(Duration::from_millis(100));
        Ok(())
    })
}

/// A fresh TCP socket (IPv4), closed on drop.
fn socket2_tcp() -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd as _;
    // SAFETY: a new descriptor, owned by the returned value.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
        assert!(fd >= 0);
        std::os::fd::OwnedFd::from_raw_fd(fd)
    }
}

#[test]
fn a_hello_in_a_fast_open_syn_is_judged_like_any_other() {
    if !have_root("a_hello_in_a_fast_open_syn") {
        return;
    }
    let net = TestNet::new();
    fastopen(&net, &net.gw_ns, "3");
    fastopen(&net, &net.peer_ns, "3");
    let listener = net.in_gw(|| TcpListener::bind((GW_V4, 443)).expect("bind"));
    let qlen: i32 = 16;
    // SAFETY: an int option on the listener this test owns.
    let r = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::SOL_TCP,
            libc::TCP_FASTOPEN,
            (&raw const qlen).cast(),
            size_of::<i32>() as u32,
        )
    };
    assert_eq!(r, 0);
    let server = RecordingServer::start(listener);
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    // The kernel answering SYNs: with SYN cookies at the NIC, a Fast Open SYN's data is not
    // taken (the client sends it again once connected; `syn_cookies_netns`).
    net.gateway_ok(&["service", "add", "tls", "443", "--no-syn-cookies"]);
    // The first connection fetches the cookie (its data goes after the handshake) and is
    // served; the second carries its hello in the SYN and is served too.
    for n in 0..2 {
        let h = hello(50 + n);
        fastopen_send(&net, &h).expect("sendto MSG_FASTOPEN");
        assert!(
            server.got(&h, Duration::from_secs(2)),
            "hello {n} with tls-new open"
        );
    }
    assert!(net.stats()["tls"]["syn_payloads"].as_u64().unwrap() >= 1);
    let admitted = class_counter(&net.stats(), "tls-new", "admitted");
    assert_eq!(admitted, 2);
    // Closed: the hello in the SYN is refused, and so is the hello a client sends again after
    // a plain handshake once its SYN's data went unanswered.
    close_tls_new(&net);
    for n in 0..3 {
        let h = hello(60 + n);
        // Refused, the SYN's data is dropped; the client may then be reset.
        let _ = fastopen_send(&net, &h);
        assert!(
            !server.got(&h, Duration::from_millis(1500)),
            "a fast-open hello reached the server with tls-new closed"
        );
    }
    let stats = net.stats();
    assert_eq!(
        class_counter(&stats, "tls-new", "admitted"),
        admitted,
        "{stats}"
    );
    assert!(
        class_counter(&stats, "tls-new", "dropped_backlog") >= 3,
        "{stats}"
    );
}

/// Three client connections whose hellos (numbered from `first`) the server got; the third
/// over IPv6 when `v6_last`.
fn admitted_clients(
    net: &TestNet,
    server: &RecordingServer,
    first: u8,
    v6_last: bool,
) -> Vec<(TcpStream, SocketAddr, SocketAddr)> {
    (0..3u8)
        .map(|n| {
            let (mut stream, from, to) = connect(net, v6_last && n == 2);
            let h = hello(first + n);
            stream.write_all(&h).unwrap();
            assert!(server.got(&h, Duration::from_secs(2)), "hello {n} admitted");
            (stream, from, to)
        })
        .collect()
}

/// Client `n`'s next flight, a handshake record that is no hello (a TLS 1.2 ClientKeyExchange,
/// tagged `tag`): it must reach the server, or `lost` says why not.
fn next_flight_reaches_the_server(
    server: &RecordingServer,
    stream: &mut TcpStream,
    tag: u8,
    n: usize,
    lost: &str,
) {
    let flight = [22u8, 3, 3, 0, 6, 16, 0, 0, 2, tag, n as u8];
    stream.write_all(&flight).unwrap();
    assert!(
        server.got(&flight, Duration::from_secs(2)),
        "client {n} {lost}"
    );
}

/// Nothing refused as tls-new so far.
fn no_hello_refused(net: &TestNet) {
    let stats = net.stats();
    assert_eq!(
        class_counter(&stats, "tls-new", "dropped_backlog"),
        0,
        "{stats}"
    );
}

#[test]
fn a_spoofed_syn_changes_nothing_for_an_admitted_connection() {
    if !have_root("a_spoofed_syn_changes_nothing") {
        return;
    }
    let (net, server) = tls_behind_the_gateway();
    let mut clients = admitted_clients(&net, &server, 70, false);
    assert_eq!(class_counter(&net.stats(), "tls-new", "admitted"), 3);
    close_tls_new(&net);
    for (n, (stream, from, to)) in clients.iter_mut().enumerate() {
        // A SYN on the connection's 4-tuple with a sequence number far from its window.
        let syn = tcp_segment(
            from.ip(),
            to.ip(),
            from.port(),
            to.port(),
            0x1234_5678 + n as u32,
            0,
            SYN,
            &[],
        );
        let packet = ipv4_packet(v4(PEER_V4), v4(GW_V4), TCP, &syn);
        net.in_peer(|| send_ip(to.ip(), &[packet]));
        // The client's next flight still reaches the server: the connection was admitted and
        // stays so.
        next_flight_reaches_the_server(
            &server,
            stream,
            0xab,
            n,
            "lost its admitted connection to a spoofed SYN",
        );
    }
    no_hello_refused(&net);
}

/// Issue 23, case 6, its second half: an admitted connection whose flow entry is gone (the LRU
/// evicted it under a table full of connections) keeps going. Its client's next flight, a TLS 1.2
/// ClientKeyExchange, is no hello: it reaches the server with tls-new closed, where it was judged
/// a malformed hello and reset. A connection that sends such a message first (no hello ever)
/// only meets the server's own refusal; and a hello after it is still judged.
#[test]
fn an_admitted_connection_whose_flow_entry_is_evicted_keeps_going() {
    if !have_root("an_admitted_connection_whose_flow_entry_is_evicted") {
        return;
    }
    let (net, server) = tls_behind_the_gateway();
    let mut clients = admitted_clients(&net, &server, 80, true);
    close_tls_new(&net);
    // What an LRU eviction leaves: no entry for these connections.
    let pd = gateway::datapath::pins::select(&net.root(), Some(&net.gw_if)).expect("pins");
    let mut maps = gateway::datapath::maps::Maps::open(&pd).expect("maps");
    assert!(maps.tls_flows().unwrap().len() >= 3);
    maps.clear_tls_flows().unwrap();
    for (n, (stream, _, _)) in clients.iter_mut().enumerate() {
        next_flight_reaches_the_server(
            &server,
            stream,
            0xcd,
            n,
            "judged as a hello after its flow entry went",
        );
    }
    no_hello_refused(&net);
    // A hello on a new connection is still judged (and refused: tls-new is closed).
    let (mut stream, _, _) = connect(&net, false);
    let h = hello(90);
    stream.write_all(&h).unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while class_counter(&net.stats(), "tls-new", "dropped_backlog") < 1 {
        assert!(Instant::now() < deadline, "the new hello was not refused");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !server.got(&h, Duration::from_millis(200)),
        "a hello passed"
    );
}

#[test]
fn a_refused_caller_on_a_veth_without_a_peer_program_gets_its_503_at_once() {
    if !have_root("a_refused_caller_on_a_veth_without_a_peer_program") {
        return;
    }
    // Nothing on the peer's veth: a 503 sent with XDP_TX would vanish there.
    let net = TestNet::without_peer_program();
    net.gateway_ok(&["attach", "--iface", &net.gw_if]);
    net.gateway_ok(&["service", "add", "sip", "5060"]);
    net.gateway_ok(&[
        "policy",
        "set",
        "sip-original",
        "--rate",
        "0",
        "--refuse",
        "reject",
    ]);
    let client = net.in_peer(|| UdpSocket::bind((PEER_V4, 5061)).expect("bind"));
    client
        .set_read_timeout(Some(Duration::from_secs(1)))
        .unwrap();
    let mut waits: Vec<Duration> = (0..20)
        .map(|n| {
            let start = Instant::now();
            // With a body, as real INVITEs have: a 503 is never longer than its request.
            let body = "v=0\r\n".repeat(40);
            let request = invite(100 + n).replace(
                "Content-Length: 0\r\n\r\n",
                &format!("Content-Length: {}\r\n\r\n{body}", body.len()),
            );
            client
                .send_to(request.as_bytes(), (GW_V4, 5060))
                .expect("send");
            let mut buf = [0u8; 2048];
            let (len, _) = client.recv_from(&mut buf).unwrap_or_else(|e| {
                panic!("INVITE {n}: no 503 within a second: {e}: {}", net.stats())
            });
            assert!(
                buf[..len].starts_with(b"SIP/2.0 503"),
                "{}",
                String::from_utf8_lossy(&buf[..len])
            );
            start.elapsed()
        })
        .collect();
    waits.sort();
    // The median, so one scheduling hiccup of a busy machine does not decide it.
    assert!(waits[10] < Duration::from_millis(10), "{waits:?}");
    let stats = net.stats();
    assert_eq!(stats["datapath"]["sip_replies_sent"], 20, "{stats}");
    assert_eq!(class_counter(&stats, "sip-original", "rejected"), 20);
}

#[test]
fn with_syn_cookies_a_client_whose_ack_rides_on_its_hello_is_judged_and_served() {
    if !have_root("with_syn_cookies_a_client_whose_ack_rides_on_its_hello") {
        return;
    }
    let (net, server) = tls_behind_the_gateway();
    // Cookies for every SYN, as a SYN flood switches them on: the server holds nothing until
    // the acknowledgement that carries its cookie.
    let out = net.exec(&net.gw_ns, "sysctl", &["-qw", "net.ipv4.tcp_syncookies=2"]);
    assert!(out.status.success(), "{out:?}");
    let to = std::net::SocketAddrV4::new(v4(GW_V4), 443);
    let served = |port: u16, n: u8| {
        let from = std::net::SocketAddrV4::new(v4(PEER_V4), port);
        let peer_if = net.peer_if.clone();
        let h = hello(n);
        net.in_peer(|| {
            let (snd, rcv) = handshake_by_hand(&peer_if, from, to, 0x1000_0000 + u32::from(port));
            // Its pure ACK lost: the hello is the first thing the server gets after its SYN-ACK.
            let mut s = established_by_repair(from, to, snd, rcv);
            s.write_all(&h).unwrap();
            s
        });
        server.got(&h, Duration::from_millis(1500))
    };
    for n in 0..3u8 {
        assert!(served(41000 + u16::from(n), 80 + n), "client {n}");
    }
    let stats = net.stats();
    assert_eq!(class_counter(&stats, "tls-new", "admitted"), 3, "{stats}");
    assert_eq!(stats["tls"]["no_connection"], 0, "{stats}");
    // Judged, not waved through: with tls-new closed the same clients are refused.
    close_tls_new(&net);
    for n in 0..3u8 {
        assert!(
            !served(42000 + u16::from(n), 90 + n),
            "client {n} with tls-new closed"
        );
    }
    let stats = net.stats();
    assert_eq!(
        class_counter(&stats, "tls-new", "dropped_backlog"),
        3,
        "{stats}"
    );
}

#[test]
fn units_whose_connection_is_gone_leave_the_backlog_within_a_second() {
    if !have_root("units_whose_connection_is_gone_leave_the_backlog") {
        return;
    }
    // A server that reads hellos and never answers them: every admitted connection stays a
    // unit of the backlog until it ends.
    let net = TestNet::new();
    let listener = net.in_gw(|| TcpListener::bind("[::]:443").expect("bind"));
    let server = RecordingServer::start(listener);
    let dir = gateway_tests::fresh_temp_dir("gwt-gone");
    let _daemon = gateway_tests::daemon::Daemon::start_config(
        &net,
        &dir,
        "services:\n  - kind: tls\n    port: 443\npolicy:\n  tls-new:\n    backlog: 5\n    timeout: 60s\n",
    );
    let backlog = || class_counter(&net.stats(), "tls-new", "backlog");
    // Two clients that stay, three whose connections the kernel then drops (a reset before the
    // server answered: the socket is gone, as after a listen overflow or a request socket's
    // timeout), filling the backlog of 5.
    let mut live = Vec::new();
    for n in 0..5u8 {
        let (mut stream, _, _) = connect(&net, false);
        let h = hello(110 + n);
        stream.write_all(&h).unwrap();
        assert!(
            server.got(&h, Duration::from_secs(2)),
            "client {n} admitted"
        );
        live.push(stream);
    }
    assert_eq!(backlog(), 5);
    for stream in live.drain(2..) {
        reset_on_drop(&stream);
        drop(stream);
    }
    // With no other traffic, the backlog comes back to the two live connections within a
    // second (a 60 s timeout would otherwise hold the three places).
    backlog_back_within_a_second(&backlog, 2);
    let stats = net.stats();
    assert_eq!(class_counter(&stats, "tls-new", "expired"), 3, "{stats}");
    // New clients are served in the places freed; the live ones still hold theirs.
    for n in 0..3u8 {
        let (mut stream, _, _) = connect(&net, false);
        let h = hello(120 + n);
        stream.write_all(&h).unwrap();
        assert!(server.got(&h, Duration::from_secs(2)), "new client {n}");
        live.push(stream);
    }
    assert_eq!(backlog(), 5);
}

/// Polls `backlog` until it is `live` again, which it must be within a second.
fn backlog_back_within_a_second(backlog: &dyn Fn() -> u64, live: u64) {
    let start = Instant::now();
    while backlog() != live {
        assert!(
            start.elapsed() < Duration::from_secs(1),
            "backlog {} after {:?}",
            backlog(),
            start.elapsed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "backlog back to the {live} live connections in {:?}",
        start.elapsed()
    );
}

/// Sends a reset when dropped (SO_LINGER 0).
fn reset_on_drop(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a plain option on a socket the caller owns.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            size_of::<libc::linger>() as u32,
        );
    }
}

/// `TcpExt: ListenOverflows` of the gateway's namespace.
fn listen_overflows(net: &TestNet) -> u64 {
    let text =
        net.in_gw(|| std::fs::read_to_string("/proc/thread-self/net/netstat").expect("netstat"));
    let mut lines = text.lines().filter(|l| l.starts_with("TcpExt:"));
    let (names, values) = (lines.next().unwrap(), lines.next().unwrap());
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "ListenOverflows")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// Issue 23, case 9 as the issue tells it: connections that overflow the server's listen queue.
/// The server has stopped accepting and its queue (1 long: two connections) is full; SYN
/// cookies are on, as a flood switches them on. Three clients whose cookie acknowledgement
/// rides on their hello are judged at the NIC (a unit each) and then dropped by the kernel for
/// the full queue: it holds nothing for them. Their units end within a second, the backlog back
/// to the two live connections; once the server accepts again, the three clients' own
/// retransmissions are served and so are new clients.
#[test]
fn after_hellos_that_overflow_the_listen_queue_the_backlog_heals_within_a_second() {
    if !have_root("after_hellos_that_overflow_the_listen_queue") {
        return;
    }
    let net = TestNet::new();
    let listener = net.in_gw(|| TcpListener::bind("[::]:443").expect("bind"));
    // SAFETY: listen again on a listening socket this test owns: its queue becomes 1 long.
    assert_eq!(unsafe { libc::listen(listener.as_raw_fd(), 1) }, 0);
    let out = net.exec(&net.gw_ns, "sysctl", &["-qw", "net.ipv4.tcp_syncookies=2"]);
    assert!(out.status.success(), "{out:?}");
    let dir = gateway_tests::fresh_temp_dir("gwt-overflow");
    let _daemon = gateway_tests::daemon::Daemon::start_config(
        &net,
        &dir,
        // The kernel answering SYNs (its own cookies, as a flood switches them on).
        "services:\n  - kind: tls\n    port: 443\n    syn_cookies: false\npolicy:\n  tls-new:\n    backlog: 50\n    timeout: 60s\n",
    );
    let stats = || net.stats();
    let backlog = || class_counter(&stats(), "tls-new", "backlog");
    let admitted = || class_counter(&stats(), "tls-new", "admitted");
    let to = std::net::SocketAddrV4::new(v4(GW_V4), 443);
    // Three handshakes by hand while the queue has room: cookies, nothing held.
    let peer_if = net.peer_if.clone();
    let made: Vec<_> = (0..3u16)
        .map(|n| {
            let from = std::net::SocketAddrV4::new(v4(PEER_V4), 43000 + n);
            let (snd, rcv) =
                net.in_peer(|| handshake_by_hand(&peer_if, from, to, 0x2000_0000 + u32::from(n)));
            (from, snd, rcv)
        })
        .collect();
    // Two live connections fill the queue, their hellos admitted.
    let mut live = Vec::new();
    for n in 0..2u8 {
        let (mut stream, _, _) = connect(&net, false);
        stream.write_all(&hello(130 + n)).unwrap();
        live.push(stream);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while admitted() < 2 {
        assert!(Instant::now() < deadline, "{}", stats());
        std::thread::sleep(Duration::from_millis(20));
    }
    let overflows = listen_overflows(&net);
    // The three hellos, each the acknowledgement of its cookie: judged, then overflowed.
    let hellos: Vec<Vec<u8>> = (0..3u8).map(|n| hello(140 + n)).collect();
    let _late: Vec<TcpStream> = made
        .iter()
        .zip(&hellos)
        .map(|((from, snd, rcv), h)| {
            net.in_peer(|| {
                let mut s = established_by_repair(*from, to, *snd, *rcv);
                s.write_all(h).unwrap();
                s
            })
        })
        .collect();
    while admitted() < 5 || listen_overflows(&net) < overflows + 3 {
        assert!(
            Instant::now() < deadline + Duration::from_secs(5),
            "admitted {}, overflows {}: {}",
            admitted(),
            listen_overflows(&net) - overflows,
            stats()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    backlog_back_within_a_second(&backlog, 2);
    assert_eq!(class_counter(&stats(), "tls-new", "expired"), 3);
    // The server accepts again: the live ones, the three clients' retransmitted hellos (their
    // connections admitted at the NIC), and new clients are served.
    let server = RecordingServer::start(listener);
    for (n, h) in hellos.iter().enumerate() {
        assert!(
            server.got(h, Duration::from_secs(10)),
            "overflowed client {n}"
        );
    }
    for n in 0..3u8 {
        let (mut stream, _, _) = connect(&net, false);
        let h = hello(150 + n);
        stream.write_all(&h).unwrap();
        assert!(server.got(&h, Duration::from_secs(2)), "new client {n}");
    }
    assert!(
        server.got(&hello(130), Duration::from_secs(2)),
        "live client"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
