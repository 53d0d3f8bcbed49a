//! P7: delivery into GPU memory. Against a live node, measures
//!
//! - (a) `read_object`: objects read from the node straight into device memory, the
//!   network receive overlapped with double-buffered pinned copies;
//! - (b) `copy_from_host`: the same bytes, already in host memory, copied to the device
//!   through the same pinned buffers (the ceiling (a) can reach);
//!
//! each as MB/s (1 MB = 10^6 bytes) over all the objects, median of `--rounds`, and prints
//! the ratio (a)/(b). The plain network read into host memory is shown for context. Every
//! object is checked byte for byte on the device once, before timing.
//!
//! ```text
//! cargo run --release -p granary-client --features cuda --example p7 -- \
//!     --endpoint http://127.0.0.1:7070 --bucket BUCKET --key KEY --rounds 5
//! ```
//!
//! `--prefix P` instead of `--key` reads every object under `P` (all of them are held in
//! host memory for (b)). Exits with status 2 and a message when no CUDA device is usable.

use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use granary_client::cuda::{self, DeviceReader};
use granary_client::{Client, GetOptions};

#[derive(Parser)]
#[command(about = "P7: objects into GPU memory vs. a plain pinned-memory copy")]
struct Args {
    /// The node.
    #[arg(long, default_value = "http://127.0.0.1:7070")]
    endpoint: String,
    /// The bucket the objects are in.
    #[arg(long)]
    bucket: String,
    /// One object to read.
    #[arg(long, required_unless_present = "prefix", conflicts_with = "prefix")]
    key: Option<String>,
    /// Read every object under this prefix instead.
    #[arg(long)]
    prefix: Option<String>,
    /// Timed rounds (each reads every object once per path).
    #[arg(long, default_value_t = 5)]
    rounds: usize,
    /// CUDA device ordinal.
    #[arg(long, default_value_t = 0)]
    device: usize,
    /// Size of each of the two pinned staging buffers, in MiB.
    #[arg(long, default_value_t = 4)]
    chunk_mib: usize,
    /// Signs requests (with --secret-key).
    #[arg(long, env = "AWS_ACCESS_KEY_ID", hide_env_values = true)]
    access_key: Option<String>,
    /// The secret key that goes with --access-key.
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY", hide_env_values = true)]
    secret_key: Option<String>,
    /// The region requests are signed for.
    #[arg(long, default_value = "us-east-1")]
    region: String,
}

/// One measured path: MB/s of each round.
struct Path {
    name: &'static str,
    rates: Vec<f64>,
}

impl Path {
    fn new(name: &'static str) -> Path {
        Path {
            name,
            rates: Vec::new(),
        }
    }

    /// Runs `f` (which moves `bytes` bytes) once and records its rate.
    fn time(&mut self, bytes: u64, f: impl FnOnce() -> Result<()>) -> Result<()> {
        let started = Instant::now();
        f()?;
        let secs = started.elapsed().as_secs_f64().max(1e-9);
        self.rates.push(bytes as f64 / 1e6 / secs);
        Ok(())
    }

    fn sorted(&self) -> Vec<f64> {
        let mut r = self.rates.clone();
        r.sort_by(f64::total_cmp);
        r
    }

    fn median(&self) -> f64 {
        let r = self.sorted();
        match r.len() {
            0 => 0.0,
            n if n % 2 == 1 => r[n / 2],
            n => (r[n / 2 - 1] + r[n / 2]) / 2.0,
        }
    }
}

fn client(args: &Args) -> Result<Client> {
    let mut c = Client::new(&args.endpoint)?;
    if let (Some(a), Some(s)) = (&args.access_key, &args.secret_key) {
        c = c.with_credentials(a, s, &args.region);
    }
    Ok(c)
}

fn keys(args: &Args, c: &mut Client) -> Result<Vec<String>> {
    if let Some(k) = &args.key {
        return Ok(vec![k.clone()]);
    }
    let prefix = args.prefix.as_deref().unwrap_or_default();
    let keys: Vec<String> = c
        .list(&args.bucket, prefix)
        .with_context(|| format!("listing {}/{prefix}", args.bucket))?
        .into_iter()
        .map(|o| o.key)
        .collect();
    ensure!(
        !keys.is_empty(),
        "no objects under {}/{prefix}",
        args.bucket
    );
    Ok(keys)
}

/// Reads each object once into the device and checks it against its host copy.
fn check(
    gpu: &mut DeviceReader,
    c: &mut Client,
    bucket: &str,
    keys: &[String],
    host: &[Vec<u8>],
) -> Result<()> {
    for (key, want) in keys.iter().zip(host) {
        let buf = gpu.read_object(c, bucket, key, &GetOptions::default())?;
        let got = buf.to_host()?;
        ensure!(
            got == *want,
            "{bucket}/{key}: device bytes differ from the object"
        );
        let copied = gpu.copy_from_host(want)?.to_host()?;
        ensure!(
            copied == *want,
            "{bucket}/{key}: host copy differs on the device"
        );
    }
    Ok(())
}

fn print_table(paths: &[&Path], bytes: u64, objects: usize) {
    println!(
        "P7: {objects} object(s), {:.1} MB per round",
        bytes as f64 / 1e6
    );
    println!(
        "{:<40} {:>12} {:>12} {:>12}",
        "path", "median MB/s", "min MB/s", "max MB/s"
    );
    for p in paths {
        let r = p.sorted();
        let (min, max) = (r.first().copied(), r.last().copied());
        println!(
            "{:<40} {:>12.1} {:>12.1} {:>12.1}",
            p.name,
            p.median(),
            min.unwrap_or(0.0),
            max.unwrap_or(0.0)
        );
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    ensure!(args.chunk_mib > 0, "--chunk-mib must be at least 1");
    if !cuda::available() {
        eprintln!(
            "P7 needs a CUDA device: no NVIDIA driver (libcuda) could be loaded, or it reports no GPU"
        );
        std::process::exit(2);
    }
    let mut gpu = DeviceReader::new(args.device)?.with_chunk(args.chunk_mib << 20)?;
    let mut c = client(&args)?;
    let bucket = args.bucket.clone();
    let keys = keys(&args, &mut c)?;

    // The host copies for (b); this also warms the node's cache for every path.
    let mut host = Vec::with_capacity(keys.len());
    for k in &keys {
        host.push(c.get(&bucket, k).with_context(|| format!("{bucket}/{k}"))?);
    }
    let bytes: u64 = host.iter().map(|h| h.len() as u64).sum();
    if bytes == 0 {
        bail!("the objects are empty: nothing to measure");
    }
    check(&mut gpu, &mut c, &bucket, &keys, &host)?;

    let mut device = Path::new("(a) node -> device (read_object)");
    let mut pinned = Path::new("(b) host -> device (copy_from_host)");
    let mut network = Path::new("    node -> host memory (get)");
    let opts = GetOptions::default();
    for _ in 0..args.rounds {
        device.time(bytes, || {
            for k in &keys {
                gpu.read_object(&mut c, &bucket, k, &opts)?;
            }
            Ok(())
        })?;
        pinned.time(bytes, || {
            for h in &host {
                gpu.copy_from_host(h)?;
            }
            Ok(())
        })?;
        network.time(bytes, || {
            for k in &keys {
                c.get(&bucket, k)?;
            }
            Ok(())
        })?;
    }

    print_table(&[&device, &pinned, &network], bytes, keys.len());
    let ratio = device.median() / pinned.median().max(1e-9);
    println!("ratio (a)/(b): {ratio:.3}");
    Ok(())
}
