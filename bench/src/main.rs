//! `granary-bench`: a load generator for Granary and any HTTP object server.
//!
//! `get` reads one URL path over and over from several keep-alive connections and
//! reports throughput and request latency percentiles.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use granary_client::Client;

#[derive(Parser)]
#[command(
    name = "granary-bench",
    version,
    about = "Load generator and data-stall analyser for Granary"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// GET one object repeatedly and report MB/s, req/s and latency.
    Get {
        /// Endpoint, `http://host:port`.
        #[arg(long, default_value = "http://127.0.0.1:7070")]
        endpoint: String,
        /// Path of the object, `/bucket/key`.
        #[arg(long)]
        path: String,
        /// Concurrent connections, one thread each.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Seconds to run.
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
    },
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Get {
            endpoint,
            path,
            workers,
            duration,
        } => get(
            &endpoint,
            &path,
            workers.max(1),
            Duration::from_secs_f64(duration),
        ),
    }
}

fn get(endpoint: &str, path: &str, workers: usize, duration: Duration) -> anyhow::Result<()> {
    let stop = Arc::new(AtomicBool::new(false));
    let bytes = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut handles = Vec::new();
    for _ in 0..workers {
        let (stop, bytes) = (stop.clone(), bytes.clone());
        let mut client = Client::new(endpoint)?;
        let path = path.to_owned();
        handles.push(std::thread::spawn(
            move || -> anyhow::Result<Vec<Duration>> {
                let mut lat = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let (resp, n) = client.get_into(&path, &mut std::io::sink())?;
                    if resp.status != 200 && resp.status != 206 {
                        anyhow::bail!("GET {path} answered {}", resp.status);
                    }
                    lat.push(t.elapsed());
                    bytes.fetch_add(n, Ordering::Relaxed);
                }
                Ok(lat)
            },
        ));
    }
    std::thread::sleep(duration);
    stop.store(true, Ordering::Relaxed);
    let mut lat = Vec::new();
    for h in handles {
        lat.extend(
            h.join()
                .map_err(|_| anyhow::anyhow!("a worker panicked"))??,
        );
    }
    let secs = started.elapsed().as_secs_f64();
    lat.sort();
    let pct = |p: f64| -> f64 {
        lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1)))
            .map_or(0.0, |d| d.as_secs_f64() * 1e3)
    };
    let total = bytes.load(Ordering::Relaxed);
    println!(
        "requests {}  throughput {:.1} MB/s  {:.0} req/s  latency ms p50 {:.2} p90 {:.2} p99 {:.2} max {:.2}",
        lat.len(),
        total as f64 / secs / 1e6,
        lat.len() as f64 / secs,
        pct(0.5),
        pct(0.9),
        pct(0.99),
        lat.last().map_or(0.0, |d| d.as_secs_f64() * 1e3)
    );
    Ok(())
}
