//! Service-level classification of a parsed packet into a traffic [`Class`].
//!
//! Stateless classification by the first bytes of the transport payload. SIP responses and the
//! ACK, BYE and CANCEL methods are `sip-exempt`; every other datagram to a SIP port is
//! `sip-original`. TLS is stateful (flows, multi-segment hellos, issued sessions) and is
//! classified by the datapath with [`crate::tls`]; here a TLS port only yields `tls-flow` for TCP.
//! Traffic that does not fit the service's transport (SIP over TCP, TLS over UDP) is `other`,
//! passed and counted.

use crate::{
    bytes::PacketBytes,
    class::Class,
    maps::{IPPROTO_TCP, IPPROTO_UDP, ServiceKind},
    packet::Transport,
};

/// Classifies a packet of a protected service (statelessly; see the module docs for TLS).
#[inline(always)]
pub fn classify<B: PacketBytes>(b: &B, t: &Transport, kind: ServiceKind) -> Class {
    match kind {
        ServiceKind::Tls if t.proto == IPPROTO_TCP => Class::TlsFlow,
        ServiceKind::Sip if t.proto == IPPROTO_UDP => classify_sip(b, t.payload_offset as usize),
        _ => Class::Other,
    }
}

/// A UDP datagram to a SIP port, by its first token.
#[inline(always)]
fn classify_sip<B: PacketBytes>(b: &B, off: usize) -> Class {
    let mut head = [0u8; 8];
    if !b.read(off, &mut head) {
        // Shorter than any SIP start line: not exempt.
        return Class::SipOriginal;
    }
    if &head == b"SIP/2.0 " || starts_with(&head, b"ACK ") || starts_with(&head, b"BYE ") {
        return Class::SipExempt;
    }
    if &head[..7] == b"CANCEL " {
        return Class::SipExempt;
    }
    Class::SipOriginal
}

#[inline(always)]
fn starts_with(head: &[u8; 8], token: &[u8; 4]) -> bool {
    head[0] == token[0] && head[1] == token[1] && head[2] == token[2] && head[3] == token[3]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bytes::SliceBytes;

    fn t(proto: u8) -> Transport {
        Transport {
            proto,
            src_port: 40000,
            dst_port: 443,
            payload_offset: 0,
            tcp_flags: 0x18,
            seq: 0,
            ack: 0,
        }
    }

    #[test]
    fn tls_ports_are_stateful_and_only_tcp() {
        let hello = [22u8, 3, 1, 0, 200, 1, 0, 0, 196];
        assert_eq!(
            classify(&SliceBytes(&hello), &t(IPPROTO_TCP), ServiceKind::Tls),
            Class::TlsFlow
        );
        assert_eq!(
            classify(&SliceBytes(&hello), &t(IPPROTO_UDP), ServiceKind::Tls),
            Class::Other
        );
    }

    #[test]
    fn sip_methods() {
        let udp = t(IPPROTO_UDP);
        for (msg, class) in [
            (
                &b"INVITE sip:bob@example.com SIP/2.0\r\n"[..],
                Class::SipOriginal,
            ),
            (b"OPTIONS sip:a SIP/2.0\r\n", Class::SipOriginal),
            (b"SIP/2.0 200 OK\r\n", Class::SipExempt),
            (b"ACK sip:bob@example.com SIP/2.0\r\n", Class::SipExempt),
            (b"BYE sip:bob@example.com SIP/2.0\r\n", Class::SipExempt),
            (b"CANCEL sip:bob@example.com SIP/2.0\r\n", Class::SipExempt),
            // Lowercase methods are not SIP's: never exempt.
            (b"bye sip:bob@example.com SIP/2.0\r\n", Class::SipOriginal),
            (b"BYE", Class::SipOriginal),
            (b"\x00\xff\x10garbage", Class::SipOriginal),
        ] {
            assert_eq!(
                classify(&SliceBytes(msg), &udp, ServiceKind::Sip),
                class,
                "{:?}",
                core::str::from_utf8(msg)
            );
        }
        assert_eq!(
            classify(
                &SliceBytes(b"SIP/2.0 200 OK"),
                &t(IPPROTO_TCP),
                ServiceKind::Sip
            ),
            Class::Other
        );
    }
}
