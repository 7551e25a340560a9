use super::*;
use crate::bytes::SliceBytes;

fn parse(msg: &[u8]) -> SipInfo {
    parse_sip(&SliceBytes(msg), msg.len())
}

/// As SIPp's built-in uac scenario sends it.
const SIPP_INVITE: &[u8] = b"INVITE sip:service@10.99.0.1:5060 SIP/2.0\r\n\
Via: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-4101-1-0\r\n\
From: sipp <sip:sipp@10.99.0.2:5061>;tag=4101SIPpTag001\r\n\
To: service <sip:service@10.99.0.1:5060>\r\n\
Call-ID: 1-4101@10.99.0.2\r\n\
CSeq: 1 INVITE\r\n\
Contact: sip:sipp@10.99.0.2:5061\r\n\
Max-Forwards: 70\r\n\
Subject: Performance Test\r\n\
Content-Type: application/sdp\r\n\
Content-Length:   129\r\n\
\r\n\
v=0\r\no=user1 53655765 2353687637 IN IP4 10.99.0.2\r\ns=-\r\nc=IN IP4 10.99.0.2\r\nt=0 0\r\nm=audio 6000 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\n";

#[test]
fn a_sipp_invite() {
    let i = parse(SIPP_INVITE);
    assert_eq!(i.kind(), MessageKind::Request);
    assert_eq!(i.method(), Method::Invite);
    assert_eq!(i.cseq, 1);
    assert_eq!(
        i.have,
        HAVE_VIA | HAVE_BRANCH | HAVE_CSEQ | HAVE_CALL_ID | HAVE_FROM_TAG
    );
    assert_eq!(i.in_dialog, 0);
    assert_eq!(i.class(), Class::SipOriginal);
    assert!(i.transaction_key().is_some());
}

#[test]
fn the_key_follows_the_transaction_and_what_a_retransmission_repeats() {
    let k = |m: &[u8]| parse(m).transaction_key().unwrap();
    let base = k(SIPP_INVITE);
    let swap = |from: &str, to: &str| {
        let s = core::str::from_utf8(SIPP_INVITE)
            .unwrap()
            .replacen(from, to, 1);
        extern crate std;
        std::vec::Vec::from(s.as_bytes())
    };
    // A retransmission is byte-identical: same key. Other headers do not matter.
    assert_eq!(k(&swap("Max-Forwards: 70", "Max-Forwards: 69")), base);
    // A fresh request reusing the branch (another Call-ID or CSeq number) is not the same
    // transaction's retransmission.
    assert_ne!(k(&swap("Call-ID: 1-4101", "Call-ID: 2-4101")), base);
    assert_ne!(k(&swap("CSeq: 1 INVITE", "CSeq: 2 INVITE")), base);
    // Branch, sent-by or CSeq method change it (RFC 3261 17.2.3).
    assert_ne!(k(&swap("z9hG4bK-4101-1-0", "z9hG4bK-4101-2-0")), base);
    assert_ne!(
        k(&swap("10.99.0.2:5061;branch", "10.99.0.3:5061;branch")),
        base
    );
    assert_ne!(k(&swap("CSeq: 1 INVITE", "CSeq: 1 OPTIONS")), base);
}

#[test]
fn a_value_too_long_to_hash_whole_counts_as_absent_never_as_its_prefix() {
    extern crate std;
    use std::{format, string::String};
    let long = |tail: &str| {
        let branch = format!("z9hG4bK{}{tail}", "x".repeat(MAX_VALUE));
        let msg = String::from_utf8(SIPP_INVITE.to_vec()).unwrap().replacen(
            "z9hG4bK-4101-1-0",
            &branch,
            1,
        );
        parse(msg.as_bytes())
    };
    let a = long("a");
    // No branch: no transaction key; the unit key comes from Call-ID and CSeq.
    assert_eq!(a.have & HAVE_BRANCH, 0);
    assert_eq!(a.transaction_key(), None);
    assert!(a.unit_key().is_some());
    // A branch of exactly MAX_VALUE bytes is hashed whole.
    let exact = String::from_utf8(SIPP_INVITE.to_vec()).unwrap().replacen(
        "z9hG4bK-4101-1-0",
        &"y".repeat(MAX_VALUE),
        1,
    );
    assert!(parse(exact.as_bytes()).transaction_key().is_some());
}

#[test]
fn compact_forms_and_case_insensitive_names() {
    let msg = b"INVITE sip:a@b SIP/2.0\r\n\
v: SIP/2.0/UDP 10.99.0.2:5061;rport;BRANCH=z9hG4bK-1\r\n\
i: abc@host\r\n\
cseq: 7 INVITE\r\n\
t: <sip:a@b>\r\n\
\r\n";
    let i = parse(msg);
    assert_eq!(i.have, HAVE_VIA | HAVE_BRANCH | HAVE_CSEQ | HAVE_CALL_ID);
    assert_eq!(i.cseq, 7);
    // Same transaction as the long form.
    let long = b"INVITE sip:a@b SIP/2.0\r\n\
VIA : SIP/2.0/UDP 10.99.0.2:5061;rport;branch=z9hG4bK-1\r\n\
Call-ID: abc@host\r\n\
CSeq: 7 INVITE\r\n\
To: <sip:a@b>\r\n\
\r\n";
    assert_eq!(i.transaction_key(), parse(long).transaction_key());
}

#[test]
fn exempt_messages() {
    for (msg, class) in [
        (&b"SIP/2.0 100 Trying\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\n\r\n"[..], Class::SipExempt),
        (b"ACK sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nCSeq: 1 ACK\r\n\r\n", Class::SipExempt),
        (b"BYE sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK2\r\nCSeq: 2 BYE\r\n\r\n", Class::SipExempt),
        (b"CANCEL sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nCSeq: 1 CANCEL\r\n\r\n", Class::SipExempt),
        // In dialog (To has a tag): a re-INVITE is exempt.
        (b"INVITE sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK3\r\nTo: <sip:a@b>;tag=77\r\nCSeq: 3 INVITE\r\n\r\n", Class::SipExempt),
        (b"OPTIONS sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK4\r\nCSeq: 1 OPTIONS\r\n\r\n", Class::SipOriginal),
        (b"REGISTER sip:b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK5\r\nCSeq: 1 REGISTER\r\n\r\n", Class::SipOriginal),
        // The marker only demotes: a marked INVITE is an original (unless its transaction is
        // known, which the datapath decides); a marked BYE is a retransmission, not exempt.
        (b"INVITE sip:a@b;x-retransmit SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK6\r\nCSeq: 1 INVITE\r\n\r\n", Class::SipOriginal),
        (b"BYE sip:a@b;x-retransmit SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK7\r\nCSeq: 2 BYE\r\n\r\n", Class::SipRetransmission),
    ] {
        assert_eq!(parse(msg).class(), class, "{:?}", core::str::from_utf8(msg));
    }
}

#[test]
fn an_invite_dressed_up_is_not_exempt() {
    for msg in [
        // Lowercase method token: not a SIP method.
        &b"bye sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nCSeq: 1 BYE\r\n\r\n"[..],
        // "tag=" elsewhere than the To header.
        b"INVITE sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1;tag=1\r\nFrom: <sip:x>;tag=9\r\nTo: <sip:a@b>\r\nCSeq: 1 INVITE\r\n\r\n",
        // A To tag after the blank line (in the body).
        b"INVITE sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\nCSeq: 1 INVITE\r\n\r\nTo: <sip:a@b>;tag=1\r\n",
        // A response-looking body.
        b"INVITE sip:a@b SIP/2.0\r\nVia: SIP/2.0/UDP h;branch=z9hG4bK1\r\n\r\nSIP/2.0 200 OK\r\n",
    ] {
        assert_ne!(parse(msg).class(), Class::SipExempt, "{:?}", core::str::from_utf8(msg));
    }
}

#[test]
fn bad_input_is_an_original_never_exempt() {
    let long_line = {
        extern crate std;
        let mut v = std::vec::Vec::from(&b"INVITE sip:a@b SIP/2.0\r\nSubject: "[..]);
        v.extend(core::iter::repeat_n(b'x', 400));
        v.extend_from_slice(b"\r\n\r\n");
        v
    };
    for (name, msg) in [
        ("empty", &b""[..]),
        ("binary", &b"\x00\xff\x13\x37garbage\x00"[..]),
        ("no version", &b"INVITE sip:a@b\r\n\r\n"[..]),
        ("truncated line", &b"INVITE sip:a@b SIP/2"[..]),
        ("huge header", &long_line[..]),
        (
            "no via",
            &b"INVITE sip:a@b SIP/2.0\r\nCSeq: 1 INVITE\r\n\r\n"[..],
        ),
    ] {
        let i = parse(msg);
        assert_eq!(i.class(), Class::SipOriginal, "{name}");
    }
    // No Via: no key, so never matched as a retransmission either.
    assert_eq!(
        parse(b"INVITE sip:a@b SIP/2.0\r\nCSeq: 1 INVITE\r\n\r\n").transaction_key(),
        None
    );
}

#[test]
fn a_request_without_a_branch_still_has_a_unit_key_its_response_matches() {
    extern crate std;
    use std::string::String;
    let no_branch = String::from_utf8(SIPP_INVITE.to_vec()).unwrap().replacen(
        ";branch=z9hG4bK-4101-1-0",
        "",
        1,
    );
    let req = parse(no_branch.as_bytes());
    assert_eq!(req.transaction_key(), None);
    let key = req.unit_key().expect("a Call-ID and CSeq key");
    // The server's response copies Via, Call-ID and CSeq.
    let resp = String::from(
        "SIP/2.0 100 Trying\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;received=10.99.0.2\r\n\
         Call-ID: 1-4101@10.99.0.2\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n",
    );
    assert_eq!(parse(resp.as_bytes()).unit_key(), Some(key));
    // Another CSeq number is another unit; a branch key never equals a fallback key.
    let next = no_branch.replacen("CSeq: 1 INVITE", "CSeq: 2 INVITE", 1);
    assert_ne!(parse(next.as_bytes()).unit_key(), Some(key));
    assert_eq!(
        parse(SIPP_INVITE).unit_key(),
        parse(SIPP_INVITE).transaction_key()
    );
    // No Call-ID and no branch: no key at all.
    let bare = no_branch.replacen("Call-ID: 1-4101@10.99.0.2\r\n", "", 1);
    assert_eq!(parse(bare.as_bytes()).unit_key(), None);
}

#[test]
fn dialogs_and_invite_transactions_are_keyed_as_the_server_made_them() {
    extern crate std;
    use std::string::String;
    let invite = String::from_utf8(SIPP_INVITE.to_vec()).unwrap();
    // The server's 200 OK: Via, From, Call-ID and CSeq copied, its own tag on To.
    let ok = "SIP/2.0 200 OK\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-4101-1-0\r\n\
              From: sipp <sip:sipp@10.99.0.2:5061>;tag=4101SIPpTag001\r\n\
              To: service <sip:service@10.99.0.1:5060>;tag=srv77\r\n\
              Call-ID: 1-4101@10.99.0.2\r\nCSeq: 1 INVITE\r\nContent-Length: 0\r\n\r\n";
    let ok = parse(ok.as_bytes());
    assert_eq!(ok.status, 200);
    assert!(ok.establishes_dialog());
    let dialog = ok.dialog_key().expect("a dialog key");
    // The caller's BYE in that dialog: same Call-ID and tags, a new branch.
    let bye = "BYE sip:service@10.99.0.1:5060 SIP/2.0\r\nVia: SIP/2.0/UDP 10.99.0.2:5061;branch=z9hG4bK-bye\r\n\
               From: sipp <sip:sipp@10.99.0.2:5061>;tag=4101SIPpTag001\r\n\
               To: service <sip:service@10.99.0.1:5060>;tag=srv77\r\n\
               Call-ID: 1-4101@10.99.0.2\r\nCSeq: 2 BYE\r\n\r\n";
    assert_eq!(parse(bye.as_bytes()).dialog_key(), Some(dialog));
    // The callee's BYE (tags the other way round) is in the same dialog.
    let reverse = bye
        .replace("tag=4101SIPpTag001", "tag=TMP")
        .replace("tag=srv77", "tag=4101SIPpTag001")
        .replace("tag=TMP", "tag=srv77");
    assert_eq!(parse(reverse.as_bytes()).dialog_key(), Some(dialog));
    // A forged tag is another dialog; a request without a To tag has none.
    assert_ne!(
        parse(bye.replace("srv77", "x").as_bytes()).dialog_key(),
        Some(dialog)
    );
    assert_eq!(parse(SIPP_INVITE).dialog_key(), None);
    // Provisional and non-INVITE 2xx responses make no dialog.
    assert!(!parse(b"SIP/2.0 180 Ringing\r\nCSeq: 1 INVITE\r\n\r\n").establishes_dialog());
    assert!(!parse(b"SIP/2.0 200 OK\r\nCSeq: 2 BYE\r\n\r\n").establishes_dialog());
    // A BYE's final response ends the dialog, whatever its status; nothing else does.
    assert!(parse(b"SIP/2.0 200 OK\r\nCSeq: 2 BYE\r\n\r\n").ends_dialog());
    assert!(parse(b"SIP/2.0 481 Gone\r\nCSeq: 2 BYE\r\n\r\n").ends_dialog());
    assert!(!parse(b"SIP/2.0 100 Trying\r\nCSeq: 2 BYE\r\n\r\n").ends_dialog());
    assert!(!ok.ends_dialog());
    assert!(!parse(bye.as_bytes()).ends_dialog());
    // CANCEL and ACK to a non-2xx reuse the INVITE's branch, Call-ID and CSeq number.
    let inv = parse(SIPP_INVITE).transaction_key();
    let cancel = invite.replacen("INVITE sip", "CANCEL sip", 1).replacen(
        "CSeq: 1 INVITE",
        "CSeq: 1 CANCEL",
        1,
    );
    assert_eq!(parse(cancel.as_bytes()).invite_key(), inv);
    assert_ne!(parse(cancel.as_bytes()).transaction_key(), inv);
    let other = cancel.replacen("branch=z9hG4bK-4101-1-0", "branch=z9hG4bK-x", 1);
    assert_ne!(parse(other.as_bytes()).invite_key(), inv);
}

#[test]
fn a_fresh_parser_state_is_all_zero() {
    // The datapath resets the state with zero words instead of `SipState::default()` (which
    // LLVM compiles to a byte-at-a-time memset): that must be the same state.
    // SAFETY: every field of SipState is an integer or an array of them.
    let zeroed: SipState = unsafe { core::mem::zeroed() };
    assert_eq!(SipState::default(), zeroed);
    assert_eq!(core::mem::size_of::<SipState>() % 8, 0);
    assert!(core::mem::align_of::<SipState>() >= 8);
}

/// Bytes of a message, read through `word` as the datapath's scratch buffer reads them: past the
/// message, whatever an earlier packet left there (here, `fill`), not zeros.
struct Stale<'a> {
    msg: &'a [u8],
    fill: u8,
}

impl PacketBytes for Stale<'_> {
    fn read<const N: usize>(&self, offset: usize, out: &mut [u8; N]) -> bool {
        SliceBytes(self.msg).read(offset, out)
    }

    fn word(&self, at: usize) -> u64 {
        let base = at & !7;
        let bytes: [u8; 8] =
            core::array::from_fn(|i| self.msg.get(base + i).copied().unwrap_or(self.fill));
        u64::from_le_bytes(bytes)
    }
}

#[test]
fn bytes_past_the_message_change_nothing() {
    // Every prefix of messages whose lines and values end at every place, followed by bytes
    // that would end a line, a value, or start a parameter if the parser took them.
    let spaced =
        b"BYE sip:a@b;x-retransmit SIP/2.0\r\nv :  SIP/2.0/UDP h:5060 ;branch=z9hG4bKx, k\r\n\
f\t: <sip:x@y>;TAG=abc\r\nto: <sip:a@b>;tag=def\r\ni: c@h\r\nCSEQ : 8 BYE\r\n\r\n";
    for msg in [SIPP_INVITE, &spaced[..]] {
        for n in 0..=msg.len() {
            let m = &msg[..n];
            let clean = parse(m);
            for fill in [b'\n', b'\r', b';', b',', b' ', b'\t', b':', b'=', 0] {
                let stale = parse_sip(&Stale { msg: m, fill }, m.len());
                assert_eq!(stale, clean, "{n} bytes, then {fill:#x}");
            }
        }
    }
}
