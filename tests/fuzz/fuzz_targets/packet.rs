//! Fuzz target: see `gateway_common::testing::properties::packet`.
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| gateway_common::testing::properties::packet(input));
