//! The ClientHello parser on arbitrary bytes: never panics, and feeding the bytes in two segments
//! (split where the first input byte says) gives exactly the one-shot result.
#![no_main]

use gateway_common::{
    bytes::SliceBytes,
    tls::{HelloState, Offer, Segment, Verdict, parse_hello},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    let Some((&split, data)) = input.split_first() else {
        return;
    };
    let whole = parse_hello(data);
    let cut = if data.is_empty() { 0 } else { split as usize * data.len() / 256 };
    let mut st = HelloState::new();
    for (start, part) in [(0, &data[..cut]), (cut, &data[cut..])] {
        st.feed(
            &SliceBytes(part),
            &Segment {
                offset: 0,
                len: part.len() as u32,
                stream_offset: start as u32,
            },
        );
    }
    assert_eq!(st, whole, "split at {cut}");
    // An offer always says which, and only an offer has a key.
    match whole.verdict() {
        Verdict::Offer => assert_ne!(whole.offer(), Offer::None),
        _ => assert!(whole.offer_key().is_none()),
    }
});
