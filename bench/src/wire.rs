//! `granary-bench wire`: a warm object read into this process's memory by the client,
//! against the wire, side by side in one run, the ways taking turns every round:
//! - the ceiling: a plain socket's `read(2)` into one preallocated buffer
//!   ([`granary_client::wire::PlainGet`], what Python's `recv_into` does);
//! - `Client::get`, a new buffer per read, sized from the answer (a large hit in parts
//!   over several connections, `Client::streams`);
//! - `Client::get_to_slice`, into a preallocated buffer (the same);
//! - `Client::get` over one connection;
//! - `curl -o /dev/null` (where curl is installed): another client, writing nowhere.
//!
//! Each way is read once untimed and checked byte for byte against the first read, then
//! `rounds` timed reads: MB/s per read (median, min, max), the reader's CPU seconds per
//! GiB (this process, or curl's) and the node's (`process_cpu_seconds` from its stats).

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use granary_client::wire::PlainGet;
use granary_client::{Client, GetOptions};
use serde::Serialize;

use crate::local::Way;

#[derive(Debug, Serialize)]
pub struct WireReport {
    pub object_bytes: u64,
    pub rounds: usize,
    pub ways: Vec<Way>,
    /// Median MB/s of `Client::get` over the wire's, and of `get_to_slice`.
    pub get_over_wire: f64,
    pub slice_over_wire: f64,
    /// Median MB/s of `Client::get` over one connection over the wire's.
    pub one_over_wire: f64,
    /// Median MB/s of `Client::get` and of `get_to_slice` over curl's, where curl ran.
    pub get_over_curl: Option<f64>,
    pub slice_over_curl: Option<f64>,
    /// The connections `Client::get` and `get_to_slice` read a large hit over.
    pub streams: usize,
}

/// User + system CPU seconds of this process, or of its waited-for children.
fn cpu(who: libc::c_int) -> f64 {
    granary_core::rusage_us(who) as f64 / 1e6
}

fn node_cpu(stats: &mut Client) -> anyhow::Result<f64> {
    stats.stats()?["process_cpu_seconds"]
        .as_f64()
        .context("the node's stats have no process_cpu_seconds (is it Granary?)")
}

/// One way's timed reads.
struct Tally {
    name: &'static str,
    rates: Vec<f64>,
    reader_cpu: f64,
    node_cpu: f64,
    bytes: u64,
}

impl Tally {
    fn way(mut self) -> Way {
        self.rates.sort_by(f64::total_cmp);
        let gib = self.bytes as f64 / (1u64 << 30) as f64;
        let n = self.rates.len();
        Way {
            name: self.name,
            mb_per_s_median: self.rates[n / 2],
            mb_per_s_min: self.rates[0],
            mb_per_s_max: self.rates[n - 1],
            client_cpu_s_per_gib: self.reader_cpu / gib,
            node_cpu_s_per_gib: self.node_cpu / gib,
            total_cpu_s_per_gib: (self.reader_cpu + self.node_cpu) / gib,
        }
    }
}

/// How one way reads the object: the bytes read, and the bytes themselves where it
/// keeps them (for the untimed check; `get` always hands its buffer back, to be freed
/// after the clock stops).
type Reader<'a> = Box<dyn FnMut(bool) -> anyhow::Result<(u64, Option<Vec<u8>>)> + 'a>;

/// Reads `bucket/key` from the node at `endpoint` every way, `rounds` times each.
pub fn run(endpoint: &str, bucket: &str, key: &str, rounds: usize) -> anyhow::Result<WireReport> {
    ensure!(rounds > 0, "--rounds must be at least 1");
    let mut stats = Client::new(endpoint)?;
    let mut client = Client::new(endpoint)?;
    let want = client.get(bucket, key).context("the first read")?;
    let size = want.len();
    ensure!(size > 0, "{bucket}/{key} is empty: nothing to measure");
    let target = format!("/{bucket}/{}", granary_proto::encode::path(key));
    let url = format!("{}{target}", endpoint.trim_end_matches('/'));
    let mut plain = PlainGet::connect(endpoint)?;
    let mut wire_buf = vec![0u8; size];
    let mut slice_buf = vec![0u8; size];
    let mut slice_client = Client::new(endpoint)?;
    let mut one_client = Client::new(endpoint)?.with_streams(1);
    let streams = client.streams();
    let opts = GetOptions::default();
    let curl = Command::new("curl").arg("--version").output().is_ok();

    let mut ways: Vec<(&'static str, libc::c_int, Reader<'_>)> = vec![
        (
            "wire: socket read(2) into a preallocated buffer",
            libc::RUSAGE_SELF,
            Box::new(|keep| {
                let n = plain.get_into(&target, &mut wire_buf)?;
                Ok((n as u64, keep.then(|| wire_buf[..n].to_vec())))
            }),
        ),
        (
            "Client::get (a new buffer per read)",
            libc::RUSAGE_SELF,
            // The buffer is handed back and dropped after the clock stops: freeing it
            // is the caller's business, whenever it likes (its CPU is counted).
            Box::new(|_| {
                let got = client.get(bucket, key)?;
                Ok((got.len() as u64, Some(got)))
            }),
        ),
        (
            "Client::get_to_slice (a preallocated buffer)",
            libc::RUSAGE_SELF,
            Box::new(|keep| {
                let n = slice_client.get_to_slice(bucket, key, &opts, &mut slice_buf)?;
                Ok((n as u64, keep.then(|| slice_buf[..n].to_vec())))
            }),
        ),
        (
            "Client::get over one connection",
            libc::RUSAGE_SELF,
            Box::new(|_| {
                let got = one_client.get(bucket, key)?;
                Ok((got.len() as u64, Some(got)))
            }),
        ),
    ];
    if curl {
        ways.push((
            "curl -o /dev/null",
            libc::RUSAGE_CHILDREN,
            Box::new(|_| {
                let out = Command::new("curl")
                    .args(["-sS", "-f", "-o", "/dev/null", "-w", "%{size_download}"])
                    .arg(&url)
                    .stderr(Stdio::inherit())
                    .output()?;
                if !out.status.success() {
                    bail!("curl {url}: {}", out.status);
                }
                let n: u64 = String::from_utf8_lossy(&out.stdout).trim().parse()?;
                Ok((n, None))
            }),
        ));
    }
    let mut tallies: Vec<Tally> = ways
        .iter()
        .map(|(name, _, _)| Tally {
            name,
            rates: Vec::with_capacity(rounds),
            reader_cpu: 0.0,
            node_cpu: 0.0,
            bytes: 0,
        })
        .collect();
    for (name, _, read) in &mut ways {
        let (n, got) = read(true).with_context(|| format!("{name}: first read"))?;
        ensure!(n == size as u64, "{name}: {n} bytes, expected {size}");
        if let Some(got) = got {
            ensure!(got == want, "{name}: the bytes differ from the object's");
        }
    }
    for _ in 0..rounds {
        for ((name, who, read), t) in ways.iter_mut().zip(&mut tallies) {
            let (node0, cpu0) = (node_cpu(&mut stats)?, cpu(*who));
            let started = Instant::now();
            let (n, held) = read(false).with_context(|| format!("{name}: timed read"))?;
            let secs = started.elapsed().as_secs_f64().max(1e-9);
            drop(held);
            t.reader_cpu += cpu(*who) - cpu0;
            t.node_cpu += node_cpu(&mut stats)? - node0;
            ensure!(n == size as u64, "{name}: {n} bytes, expected {size}");
            t.rates.push(n as f64 / 1e6 / secs);
            t.bytes += n;
        }
    }
    let ways: Vec<Way> = tallies.into_iter().map(Tally::way).collect();
    let rate = |i: usize| ways[i].mb_per_s_median;
    Ok(WireReport {
        object_bytes: size as u64,
        rounds,
        get_over_wire: rate(1) / rate(0),
        slice_over_wire: rate(2) / rate(0),
        one_over_wire: rate(3) / rate(0),
        get_over_curl: (ways.len() > 4).then(|| rate(1) / rate(4)),
        slice_over_curl: (ways.len() > 4).then(|| rate(2) / rate(4)),
        streams,
        ways,
    })
}
