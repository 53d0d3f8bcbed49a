//! A training loop's data side: read a sharded dataset through a Granary node as one rank
//! of a data-parallel job, and report samples/s and MB/s per epoch.
//!
//! ```text
//! cargo run --release -p granary-client --example dataset -- \
//!     http://127.0.0.1:7070 BUCKET PREFIX RANK WORLD_SIZE EPOCHS
//! ```
//!
//! `GRANARY_SHUFFLE_BUFFER` (default 1000) and `GRANARY_READ_AHEAD` (default 2) tune the
//! reader; `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` sign requests when set.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use granary_client::Dataset;

fn env_usize(name: &str, default: usize) -> Result<usize> {
    match std::env::var(name) {
        Ok(v) => v.parse().with_context(|| format!("{name}={v}")),
        Err(_) => Ok(default),
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() != 6 {
        bail!("usage: dataset ENDPOINT BUCKET PREFIX RANK WORLD_SIZE EPOCHS");
    }
    let rank: usize = args[3].parse().context("RANK")?;
    let world_size: usize = args[4].parse().context("WORLD_SIZE")?;
    let epochs: u64 = args[5].parse().context("EPOCHS")?;

    let mut builder = Dataset::builder()
        .endpoint(&args[0])
        .bucket(&args[1])
        .prefix(&args[2])
        .seed(0x5eed)
        .rank(rank)
        .world_size(world_size)
        .shuffle_buffer(env_usize("GRANARY_SHUFFLE_BUFFER", 1000)?)
        .read_ahead(env_usize("GRANARY_READ_AHEAD", 2)?);
    if let (Ok(a), Ok(s)) = (
        std::env::var("AWS_ACCESS_KEY_ID"),
        std::env::var("AWS_SECRET_ACCESS_KEY"),
    ) {
        builder = builder.credentials(&a, &s, "us-east-1");
    }
    let dataset = builder.build()?;
    println!(
        "rank {rank}/{world_size}: {} shards in the dataset",
        dataset.shards().len()
    );

    for epoch in 0..epochs {
        let started = Instant::now();
        let (mut samples, mut bytes, mut errors) = (0u64, 0u64, 0u64);
        for sample in dataset.epoch(epoch) {
            match sample {
                Ok(s) => {
                    // The training step would decode `s.fields` and run the model here.
                    samples += 1;
                    bytes += s.len_bytes();
                }
                Err(e) => {
                    errors += 1;
                    eprintln!("epoch {epoch}: {e}");
                }
            }
        }
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        println!(
            "epoch {epoch}: {samples} samples, {:.1} MB in {secs:.2} s: {:.0} samples/s, {:.1} MB/s, {errors} errors",
            bytes as f64 / 1e6,
            samples as f64 / secs,
            bytes as f64 / 1e6 / secs,
        );
    }
    Ok(())
}
