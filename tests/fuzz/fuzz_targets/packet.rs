//! The L2-L4 parser and the SIP parser on arbitrary frames: never panic, and every offset the
//! packet parser reports lies inside the bounds it promises.
#![no_main]

use gateway_common::{
    bytes::SliceBytes,
    packet::{Kind, MAX_L4_OFFSET, parse},
    sip::parse_sip,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|frame: &[u8]| {
    let b = SliceBytes(frame);
    let pkt = parse(&b);
    if pkt.kind == Kind::Transport {
        let t = pkt.transport;
        assert!(t.payload_offset as usize <= MAX_L4_OFFSET + 60);
        assert!(t.payload_offset as usize <= frame.len());
        let payload = &frame[t.payload_offset as usize..];
        let _ = parse_sip(&SliceBytes(payload), payload.len()).class();
    }
});
