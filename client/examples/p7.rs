//! P7: delivery into GPU memory, measured against the wire. Against a live node, times
//!
//! - (a) `read_object`: an object read from the node straight into device memory, the
//!   network receive overlapped with double-buffered pinned copies;
//! - (b) the wire: the same bytes received from the node into one preallocated pinned
//!   host buffer by a plain socket's `read(2)` (no device; `granary_client::wire`), the
//!   most any delivery from the node can reach;
//! - a plain host-to-device copy of the object from that pinned buffer (the copy
//!   engine's own speed);
//! - `Client::get` (a new host buffer per read) and `Client::get_to_slice` (into the
//!   pinned buffer), the host reads held against (b);
//!
//! each as MB/s (1 MB = 10^6 bytes) over all the objects, median of `--rounds`, the ways
//! taking turns every round, and prints (a)/(b), (a) over the plain copy, and each host
//! read over (b). Every object is checked byte for byte on the device once, before timing.
//!
//! ```text
//! cargo run --release -p granary-client --features cuda --example p7 -- \
//!     --endpoint http://127.0.0.1:7070 --bucket BUCKET --key KEY --rounds 5
//! ```
//!
//! `--prefix P` instead of `--key` reads every object under `P`. The node must not ask
//! for signatures (the plain socket does not sign). Exits with status 2 and a message
//! when no CUDA device is usable.

use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use clap::Parser;
use granary_client::cuda::cudarc::driver::PinnedHostSlice;
use granary_client::cuda::{self, DeviceReader};
use granary_client::wire::PlainGet;
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

/// One pinned host buffer of `len` bytes (ordinary cached page-locked memory), zeroed.
fn pinned(gpu: &DeviceReader, len: usize) -> Result<PinnedHostSlice<u8>> {
    let ctx = gpu.stream().context();
    // SAFETY: uninitialised page-locked bytes, zeroed at once below before any is read.
    let mut buf = unsafe { ctx.alloc_pinned_with_flags::<u8>(len.max(1), 0) }?;
    let ptr = buf.as_mut_ptr()?;
    // SAFETY: `ptr` is the buffer's own, `len.max(1)` bytes long.
    unsafe { std::ptr::write_bytes(ptr, 0, len.max(1)) };
    Ok(buf)
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.rounds > 0, "--rounds must be at least 1");
    ensure!(args.chunk_mib > 0, "--chunk-mib must be at least 1");
    ensure!(
        args.access_key.is_none(),
        "P7 reads an unsigned node (the wire's plain socket does not sign)"
    );
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

    // The objects' bytes, for the check; this also warms the node's cache for every way.
    let mut host = Vec::with_capacity(keys.len());
    for k in &keys {
        host.push(c.get(&bucket, k).with_context(|| format!("{bucket}/{k}"))?);
    }
    let bytes: u64 = host.iter().map(|h| h.len() as u64).sum();
    if bytes == 0 {
        bail!("the objects are empty: nothing to measure");
    }
    check(&mut gpu, &mut c, &bucket, &keys, &host)?;
    let largest = host.iter().map(Vec::len).max().unwrap_or(0);
    let targets: Vec<String> = keys
        .iter()
        .map(|k| format!("/{bucket}/{}", granary_proto::encode::path(k)))
        .collect();
    let mut wire = PlainGet::connect(&args.endpoint)?;
    let mut landing = pinned(&gpu, largest)?;
    {
        let buf = landing.as_mut_slice()?;
        for (t, want) in targets.iter().zip(&host) {
            let n = wire.get_into(t, buf)?;
            ensure!(buf[..n] == want[..], "{t}: the wire's bytes differ");
        }
    }
    let sizes: Vec<usize> = host.iter().map(Vec::len).collect();
    drop(host);
    let stream = gpu.stream().clone();
    // SAFETY: uninitialised device bytes, only ever written by the timed copies.
    let mut device_copy = unsafe { stream.alloc::<u8>(largest.max(1)) }?;

    let mut device = Path::new("(a) node -> device (read_object)");
    let mut ceiling = Path::new("(b) node -> pinned host (socket read)");
    let mut htod = Path::new("    pinned host -> device (one copy)");
    let mut get = Path::new("    node -> host (Client::get)");
    let mut slice = Path::new("    node -> pinned host (get_to_slice)");
    let opts = GetOptions::default();
    for _ in 0..args.rounds {
        device.time(bytes, || {
            for k in &keys {
                gpu.read_object(&mut c, &bucket, k, &opts)?;
            }
            Ok(())
        })?;
        ceiling.time(bytes, || {
            let buf = landing.as_mut_slice()?;
            for t in &targets {
                wire.get_into(t, buf)?;
            }
            Ok(())
        })?;
        htod.time(bytes, || {
            // Each object's length from the front of the pinned buffer (the driver sees
            // page-locked memory and copies it asynchronously).
            let src = landing.as_slice()?;
            for &len in &sizes {
                let mut dst = device_copy.slice_mut(..len.max(1));
                stream.memcpy_htod(&src[..len.max(1)], &mut dst)?;
            }
            stream.synchronize()?;
            Ok(())
        })?;
        // The buffers are freed after the clock stops: that is the caller's business.
        let mut held = Vec::with_capacity(keys.len());
        get.time(bytes, || {
            for k in &keys {
                held.push(c.get(&bucket, k)?);
            }
            Ok(())
        })?;
        drop(held);
        slice.time(bytes, || {
            let buf = landing.as_mut_slice()?;
            for k in &keys {
                c.get_to_slice(&bucket, k, &opts, buf)?;
            }
            Ok(())
        })?;
    }

    print_table(&[&device, &ceiling, &htod, &get, &slice], bytes, keys.len());
    let of = |p: &Path, q: &Path| p.median() / q.median().max(1e-9);
    println!("ratio (a)/(b): {:.3}", of(&device, &ceiling));
    println!("ratio (a)/plain copy: {:.3}", of(&device, &htod));
    println!("ratio Client::get/(b): {:.3}", of(&get, &ceiling));
    println!("ratio get_to_slice/(b): {:.3}", of(&slice, &ceiling));
    Ok(())
}
