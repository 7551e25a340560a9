//! The SIP parser and the egress completion on messages as a real Kamailio sends them: Kamailio
//! (started by the test with a minimal config that answers every request with 200 OK) on
//! loopback; its responses must name the requests' transactions.

use std::{net::UdpSocket, time::Duration};

use gateway_common::{
    Class,
    bytes::SliceBytes,
    sip::{MessageKind, parse_sip},
};
use gateway_tests::{
    frames::Frame,
    have_root,
    kamailio::{Kamailio, processes_naming},
    testrun::{Hook, TestProgram},
};

fn request(method: &str, port: u16, local: u16, branch: &str) -> String {
    format!(
        "{method} sip:k@127.0.0.1:{port} SIP/2.0\r\n\
Via: SIP/2.0/UDP 127.0.0.1:{local};branch={branch};rport\r\n\
From: <sip:t@127.0.0.1>;tag=1\r\n\
To: <sip:k@127.0.0.1>\r\n\
Call-ID: {branch}@127.0.0.1\r\n\
CSeq: 7 {method}\r\n\
Max-Forwards: 70\r\n\
Content-Length: 0\r\n\r\n"
    )
}

#[test]
fn kamailio_responses_name_the_requests_transactions() {
    let port = UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let k = Kamailio::start(&[], ([127, 0, 0, 1], port).into());
    let sock = UdpSocket::bind("127.0.0.1:0").unwrap();
    let local = sock.local_addr().unwrap().port();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut answered = Vec::new();
    for (i, method) in ["INVITE", "OPTIONS", "REGISTER"].into_iter().enumerate() {
        let req = request(method, port, local, &format!("z9hG4bK-kam-{i}"));
        // Kamailio takes a moment to start: resend (bounded) until it answers.
        let mut buf = [0u8; 2048];
        let n = (0..50)
            .find_map(|_| {
                sock.send_to(req.as_bytes(), ("127.0.0.1", port)).unwrap();
                sock.recv(&mut buf).ok()
            })
            .expect("kamailio answers");
        let resp = buf[..n].to_vec();
        let r = parse_sip(&SliceBytes(&resp), resp.len());
        let q = parse_sip(&SliceBytes(req.as_bytes()), req.len());
        assert_eq!(
            r.kind(),
            MessageKind::Response,
            "{}",
            String::from_utf8_lossy(&resp)
        );
        assert_eq!(r.class(), Class::SipExempt);
        assert_eq!(q.class(), Class::SipOriginal);
        // Kamailio appended rport= and received= to the Via, and a To tag: same transaction.
        assert!(String::from_utf8_lossy(&resp).contains("received=127.0.0.1"));
        assert_eq!(r.transaction_key(), q.transaction_key(), "{method}");
        assert_eq!(r.cseq, 7);
        answered.push((req, resp));
    }
    // Dropped, it leaves no process behind: its forked workers end with it.
    let dir = k.dir().to_owned();
    assert!(
        processes_naming(&dir).len() > 1,
        "Kamailio forks its worker: {:?}",
        processes_naming(&dir)
    );
    drop(k);
    assert_eq!(processes_naming(&dir), Vec::<u32>::new(), "left running");

    // Through the real programs: Kamailio's answer to the INVITE, leaving, completes it.
    if !have_root("kamailio_response_completes") {
        return;
    }
    let prog = TestProgram::new();
    let (invite, ok) = &answered[0];
    prog.run(Hook::Xdp, &Frame::udp(5060, invite.as_bytes()).build(), 1);
    let state = |p: &TestProgram| p.maps.class_state().unwrap()[Class::SipOriginal.id() as usize];
    assert_eq!(state(&prog).backlog(), 1);
    let out = Frame::udp(local, ok).from_port(5060).build();
    prog.run(Hook::TcEgress, &out, 1);
    assert_eq!(state(&prog).backlog(), 0);
    assert_eq!(prog.maps.latency(Class::SipOriginal).unwrap().count(), 1);
}
