//! The memory a preparation takes, measured against [`Pipeline::cost`]: each image of a
//! folder through each of a few definitions, with a counting allocator; prints the peak
//! above what was held before, the cost, and their ratio (a ratio over 1 is a bound that
//! does not hold).
//!
//!     cargo run --release -p granary-prep --example peak -- DIR

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use granary_prep::{pixels, Pipeline, PipelineSpec};

struct Counting;

static NOW: AtomicU64 = AtomicU64::new(0);
static PEAK: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed to the system allocator unchanged; the counts are atomics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let now = NOW.fetch_add(layout.size() as u64, Ordering::Relaxed) + layout.size() as u64;
        PEAK.fetch_max(now, Ordering::Relaxed);
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        NOW.fetch_sub(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn main() {
    let dir = std::env::args().nth(1).expect("a folder of images");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let defs = [
        r#"{"steps": [{"op": "random_resized_crop", "size": [224, 224]}, {"op": "random_flip"}]}"#,
        r#"{"steps": [{"op": "resize", "shorter": 256}, {"op": "center_crop", "size": [224, 224]}], "output": "jpeg"}"#,
        r#"{"steps": [{"op": "resize", "shorter": 600}], "output": "png", "filter": "lanczos3"}"#,
    ];
    let mut worst: f64 = 0.0;
    for f in files {
        let input = std::fs::read(&f).unwrap();
        for (d, def) in defs.iter().enumerate() {
            let spec: PipelineSpec = serde_json::from_str(def).unwrap();
            let p = Pipeline::new(spec).unwrap();
            let header = pixels::probe(&input, input.len() as u64);
            let cost = match header {
                Ok(Some(h)) => p.cost(&h, input.len() as u64),
                Ok(None) => Err(granary_prep::PrepError::Decode("no header".into())),
                Err(e) => Err(e),
            };
            let base = NOW.load(Ordering::Relaxed);
            PEAK.store(base, Ordering::Relaxed);
            let out = p.prepare(&input, 1, 2, "k");
            let peak = PEAK.load(Ordering::Relaxed) - base + input.len() as u64;
            drop(out);
            match cost {
                Ok(c) => {
                    let r = peak as f64 / c as f64;
                    worst = worst.max(r);
                    println!(
                        "{:28} def{d} peak {:>12} cost {:>12} ratio {r:.3}",
                        f.file_name().unwrap().to_string_lossy(),
                        peak,
                        c
                    );
                }
                Err(e) => println!(
                    "{:28} def{d} refused: {e} (peak {peak})",
                    f.file_name().unwrap().to_string_lossy()
                ),
            }
        }
    }
    println!("worst ratio {worst:.3}");
}
