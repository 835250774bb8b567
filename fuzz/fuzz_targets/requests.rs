#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tinybroker_fuzz::requests(data));
