//! The memory a preparation takes, measured against [`Pipeline::cost`]: each image of a
//! folder through each of a few definitions, with a counting allocator; prints the peak
//! above what was held before, the cost, and their ratio (a ratio over 1 is a bound that
//! does not hold).
//!
//!     cargo run --release -p granary-prep --example peak -- DIR

use granary_prep::measure::{peak_of, Counting};
use granary_prep::{pixels, Pipeline, PipelineSpec};

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
            let peak = peak_of(|| drop(p.prepare(&input, 1, 2, "k"))) + input.len() as u64;
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
