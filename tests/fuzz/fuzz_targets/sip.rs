//! The SIP parser on arbitrary datagrams: never panics; only responses, ACK, CANCEL, BYE and
//! requests whose To header has a tag are exempt; a key needs both a branch and a CSeq.
#![no_main]

use gateway_common::{
    Class,
    bytes::SliceBytes,
    sip::{HAVE_BRANCH, HAVE_CSEQ, Kind, Method, parse_sip},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|msg: &[u8]| {
    let info = parse_sip(&SliceBytes(msg), msg.len());
    if info.class() == Class::SipExempt {
        let exempt_method = matches!(info.method(), Method::Ack | Method::Bye | Method::Cancel);
        assert!(
            info.kind() == Kind::Response || (info.kind() == Kind::Request && (exempt_method || info.in_dialog != 0)),
            "{info:?}"
        );
        if info.kind() == Kind::Response {
            assert!(msg.len() >= 8 && msg[..8].eq_ignore_ascii_case(b"SIP/2.0 "));
        }
    }
    assert_eq!(
        info.transaction_key().is_some(),
        info.have & (HAVE_BRANCH | HAVE_CSEQ) == HAVE_BRANCH | HAVE_CSEQ
    );
});
