#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| granary_server::fuzzing::sigv4(data));
