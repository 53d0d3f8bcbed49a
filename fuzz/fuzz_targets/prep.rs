#![no_main]
//! Images through step lists, each preparation held to its cost: the allocator counts
//! every byte allocated (libFuzzer runs one input at a time).

use granary_prep::measure::{peak_of, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    granary_prep::fuzz::prep_measured(data, granary_prep::MAX_WORK, &|run| Some(peak_of(run)))
});
