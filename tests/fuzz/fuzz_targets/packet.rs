//! The L2-L4 parser and the stateless classifier on arbitrary frames: never panic, and every
//! offset they report lies inside the bounds they promise.
#![no_main]

use gateway_common::{
    bytes::SliceBytes,
    classify::classify,
    maps::ServiceKind,
    packet::{Kind, MAX_L4_OFFSET, parse},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|frame: &[u8]| {
    let b = SliceBytes(frame);
    let pkt = parse(&b);
    if pkt.kind == Kind::Transport {
        let t = pkt.transport;
        assert!(t.payload_offset as usize <= MAX_L4_OFFSET + 60);
        assert!(t.payload_offset as usize <= frame.len());
        for kind in [ServiceKind::Tls, ServiceKind::Sip] {
            let _ = classify(&b, &t, kind);
        }
    }
});
