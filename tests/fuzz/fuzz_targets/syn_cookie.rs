//! Fuzz target: see `gateway_common::testing::properties::syn_cookie`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| gateway_common::testing::properties::syn_cookie(input));
