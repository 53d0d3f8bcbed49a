//! The prep fuzz target's corpus (`fuzz/corpus/fuzz_prep`), and inputs made from it
//! (cut at every 37th byte, each of the first 160 bytes set to 0x00, 0x80 and 0xFF):
//! each whose preparation costs up to 64 MiB is held to its cost by a counting
//! allocator. One test in this binary: the counts are the process's.

use granary_prep::fuzz::prep_measured;
use granary_prep::measure::{peak_of, Counting};

#[global_allocator]
static ALLOC: Counting = Counting;

#[test]
fn every_input_is_prepared_or_refused_within_its_cost() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/fuzz_prep");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| std::fs::read(e.unwrap().path()).unwrap())
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 20, "{} seeds", seeds.len());
    let mut runs = 0;
    let mut run = |data: &[u8]| {
        prep_measured(data, 64 << 20, &|f| Some(peak_of(f)));
        runs += 1;
    };
    for s in &seeds {
        run(s);
        for cut in (10..s.len()).step_by(37) {
            run(&s[..cut]);
        }
        // The step bytes and the image's header: sizes, sampling, lengths.
        for at in 0..s.len().min(160) {
            for value in [0x00, 0xff, 0x80] {
                let mut m = s.clone();
                m[at] = value;
                run(&m);
            }
        }
    }
    assert!(runs > 10_000, "{runs} runs");
}
