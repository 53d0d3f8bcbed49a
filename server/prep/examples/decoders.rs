//! The decoder, chosen by measurement: each candidate decodes the same JPEGs (a folder
//! that `bench/photos.py N DIR` writes) on this thread, and the pipeline's other phases
//! are timed beside them.
//!
//!     python3 bench/photos.py 300 /tmp/photos
//!     taskset -c 0 cargo run --release -p granary-prep --example decoders -- /tmp/photos
//!
//! Candidates: zune-jpeg (what the pipeline uses), the `image` crate's JPEG decoder,
//! jpeg-decoder at full size, and jpeg-decoder's DCT-domain scaling (1/2, 1/4, 1/8) to
//! the smallest size that keeps a 224-pixel crop of half the image whole (what Pillow's
//! `draft()` does). Prints images/s and megapixels/s per candidate, the median of 5
//! passes.

use std::time::Instant;

use granary_prep::{pixels, Pipeline, PipelineSpec};

/// One way to take image `i` through a phase.
type Way<'a> = Box<dyn Fn(usize) + 'a>;

fn main() {
    let dir = std::env::args().nth(1).expect("a folder of JPEGs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("the folder")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jpg"))
        .collect();
    files.sort();
    let jpegs: Vec<Vec<u8>> = files.iter().map(|p| std::fs::read(p).unwrap()).collect();
    let pixels_total: u64 = jpegs
        .iter()
        .map(|j| {
            let img = pixels::decode(j).unwrap();
            u64::from(img.width) * u64::from(img.height)
        })
        .sum();
    let spec: PipelineSpec = serde_json::from_str(
        r#"{"steps": [{"op": "random_resized_crop", "size": [224, 224]},
                      {"op": "random_flip"}], "output": "raw"}"#,
    )
    .unwrap();
    let pipeline = Pipeline::new(spec).unwrap();
    let decoded: Vec<_> = jpegs.iter().map(|j| pixels::decode(j).unwrap()).collect();
    let ways: Vec<(&str, Way<'_>)> = vec![
        (
            "zune-jpeg",
            Box::new(|i| drop(pixels::decode(&jpegs[i]).unwrap())),
        ),
        (
            "image crate",
            Box::new(|i| drop(image::load_from_memory(&jpegs[i]).unwrap().to_rgb8())),
        ),
        (
            "jpeg-decoder",
            Box::new(|i| {
                let mut d = jpeg_decoder::Decoder::new(&jpegs[i][..]);
                drop(d.decode().unwrap());
            }),
        ),
        (
            "jpeg-decoder scaled",
            Box::new(|i| {
                let mut d = jpeg_decoder::Decoder::new(&jpegs[i][..]);
                d.read_info().unwrap();
                let info = d.info().unwrap();
                // A crop of half the area is about 0.7 of each side: keep it >= 224.
                let need = |side: u16| ((224.0 / 0.7) as u16).min(side);
                d.scale(need(info.width), need(info.height)).unwrap();
                drop(d.decode().unwrap());
            }),
        ),
        (
            "resize only (decoded)",
            Box::new(|i| {
                let img = &decoded[i];
                let whole = granary_prep::crop::Rect {
                    left: 0,
                    top: 0,
                    width: img.width * 3 / 4,
                    height: img.height * 3 / 4,
                };
                drop(pixels::resize(img, whole, 224, 224, granary_prep::Filter::Bilinear).unwrap());
            }),
        ),
        (
            "whole pipeline",
            Box::new(|i| drop(pipeline.prepare(&jpegs[i], 1, 0, &i.to_string()).unwrap())),
        ),
    ];
    println!(
        "{} JPEGs, {:.2} megapixels each on average",
        jpegs.len(),
        pixels_total as f64 / jpegs.len() as f64 / 1e6
    );
    for (name, way) in &ways {
        let mut rates: Vec<f64> = (0..5)
            .map(|_| {
                let t = Instant::now();
                for i in 0..jpegs.len() {
                    way(i);
                }
                jpegs.len() as f64 / t.elapsed().as_secs_f64()
            })
            .collect();
        rates.sort_by(f64::total_cmp);
        let m = rates[2];
        println!(
            "{name:24} {m:8.1} images/s {:7.1} MP/s",
            m * pixels_total as f64 / jpegs.len() as f64 / 1e6
        );
    }
}
