#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tinybroker_fuzz::group_state_machine(data));
