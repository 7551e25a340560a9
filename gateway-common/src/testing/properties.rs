//! The properties the fuzz targets check, one function per target. The fuzzers (`cargo xtask
//! fuzz`) search for inputs that break them; the test suite replays the committed corpus and every
//! past crash through the same functions, so a found bug stays found and CI never depends on luck.
//! Each function panics when its property does not hold.

use crate::{
    Class,
    bytes::SliceBytes,
    packet::{MAX_L4_OFFSET, PacketKind, parse},
    sip::{HAVE_BRANCH, HAVE_CSEQ, MessageKind, Method, parse_sip},
    tls::{HelloState, Offer, Verdict, parse_hello},
};

/// The ClientHello parser on arbitrary bytes: never panics, and feeding the bytes in two segments
/// (split where the first input byte says) gives exactly the one-shot result. An offer always
/// says which, and only an offer has a key.
pub fn client_hello(input: &[u8]) {
    let Some((&split, data)) = input.split_first() else {
        return;
    };
    let whole = parse_hello(data);
    let cut = split as usize * data.len() / 256;
    let mut st = HelloState::new();
    for (start, part) in [(0, &data[..cut]), (cut, &data[cut..])] {
        st.feed(part, start as u32);
    }
    assert_eq!(st, whole, "split at {cut}");
    match whole.verdict() {
        Verdict::Offer => assert_ne!(whole.offer(), Offer::None),
        _ => assert!(whole.offer_key().is_none()),
    }
}

/// The L2-L4 parser and the SIP parser on arbitrary frames: never panic, and every offset the
/// packet parser reports lies inside the bounds it promises.
pub fn packet(frame: &[u8]) {
    let pkt = parse(&SliceBytes(frame));
    if pkt.kind == PacketKind::Transport {
        let t = pkt.transport;
        assert!(t.payload_offset as usize <= MAX_L4_OFFSET + 60);
        assert!(t.payload_offset as usize <= frame.len());
        let payload = &frame[t.payload_offset as usize..];
        let _ = parse_sip(&SliceBytes(payload), payload.len()).class();
    }
}

/// The SIP parser on arbitrary datagrams: never panics; only responses, ACK, CANCEL, BYE and
/// requests whose To header has a tag are exempt; a key needs both a branch and a CSeq.
pub fn sip(msg: &[u8]) {
    let info = parse_sip(&SliceBytes(msg), msg.len());
    if info.class() == Class::SipExempt {
        let exempt_method = matches!(info.method(), Method::Ack | Method::Bye | Method::Cancel);
        assert!(
            info.kind() == MessageKind::Response
                || (info.kind() == MessageKind::Request && (exempt_method || info.in_dialog != 0)),
            "{info:?}"
        );
        if info.kind() == MessageKind::Response {
            assert!(msg.len() >= 8 && msg[..8].eq_ignore_ascii_case(b"SIP/2.0 "));
        }
    }
    assert_eq!(
        info.transaction_key().is_some(),
        info.have & (HAVE_BRANCH | HAVE_CSEQ) == HAVE_BRANCH | HAVE_CSEQ
    );
}

/// A property: panics when it does not hold for the input.
pub type Property = fn(&[u8]);

/// Every target by name, as the fuzz crate and the replay test know them.
pub const TARGETS: [(&str, Property); 3] = [
    ("client_hello", client_hello),
    ("packet", packet),
    ("sip", sip),
];
