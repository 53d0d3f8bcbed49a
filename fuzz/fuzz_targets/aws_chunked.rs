#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| granary_server::fuzzing::aws_chunked(data));
