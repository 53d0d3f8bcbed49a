//! `granary-bench local`: what reading a cached object on the node's own machine costs,
//! by way of delivery, side by side in one run:
//! - HTTP over TCP loopback (`--endpoint`);
//! - HTTP over the node's Unix socket (`--socket`, the node's `--listen-unix`);
//! - a local read: a descriptor of the cache file received over the Unix socket and
//!   mapped (no copy of the bytes);
//! - with `--direct FILE`, the ceiling: `read(2)` of the same bytes from the page cache
//!   (e.g. the backend's file), no node involved.
//!
//! Every way hands the consumer every byte once and the consumer reads them all (their
//! sum, the same work for each), so the figures compare delivery, not parsing.
//! Each way runs once untimed (the object is then cached and in the page cache), then
//! `rounds` timed reads: MB/s per read (median, min, max), and CPU seconds per GiB of
//! this process (user + system) and of the node (`process_cpu_seconds` from its stats).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{ensure, Context};
use granary_client::Client;
use serde::Serialize;

/// Where the bench reads from.
#[derive(Debug, Clone)]
pub struct LocalTarget {
    /// `http://host:port` of the node.
    pub endpoint: String,
    /// The node's Unix socket.
    pub socket: PathBuf,
    pub bucket: String,
    pub key: String,
    /// The same bytes as a plain file, for the ceiling.
    pub direct: Option<PathBuf>,
    /// SigV4 credentials, where the node needs them.
    pub credentials: Option<(String, String, String)>,
}

/// One way of delivery, measured.
#[derive(Debug, Serialize)]
pub struct Way {
    pub name: &'static str,
    pub mb_per_s_median: f64,
    pub mb_per_s_min: f64,
    pub mb_per_s_max: f64,
    /// This process's user + system CPU seconds per GiB delivered.
    pub client_cpu_s_per_gib: f64,
    /// The node's CPU seconds per GiB delivered (0 for the direct read).
    pub node_cpu_s_per_gib: f64,
    pub total_cpu_s_per_gib: f64,
}

#[derive(Debug, Serialize)]
pub struct LocalReport {
    pub object_bytes: u64,
    pub rounds: usize,
    pub ways: Vec<Way>,
    /// Median MB/s of the local read over TCP's, and over the Unix socket's.
    pub local_over_tcp: f64,
    pub local_over_unix: f64,
    pub unix_over_tcp: f64,
    /// Total CPU per GiB of TCP over the local read's.
    pub tcp_cpu_over_local: f64,
}

/// The consumer's work: the sum of the bytes (the same however they are cut).
fn fold(sum: u64, bytes: &[u8]) -> u64 {
    sum.wrapping_add(bytes.iter().map(|&b| b as u64).sum::<u64>())
}

/// A sink that folds what is written to it.
struct Folder {
    sum: u64,
    bytes: u64,
}

impl Write for Folder {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.sum = fold(self.sum, buf);
        self.bytes += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// User + system CPU seconds of this process.
fn self_cpu() -> f64 {
    granary_core::rusage_us(libc::RUSAGE_SELF) as f64 / 1e6
}

fn node_cpu(stats: &mut Client) -> anyhow::Result<f64> {
    let s = stats.stats()?;
    s["process_cpu_seconds"]
        .as_f64()
        .context("the node's stats have no process_cpu_seconds")
}

fn client(endpoint: &str, t: &LocalTarget) -> anyhow::Result<Client> {
    // Each way over the transport it names: TCP stays TCP, though the node offers its
    // socket.
    let c = Client::new(endpoint)?.with_socket_offers(false);
    Ok(match &t.credentials {
        Some((a, s, r)) => c.with_credentials(a, s, r),
        None => c,
    })
}

/// One delivery of the whole object to the consumer: (bytes, their fold).
type Deliver<'a> = Box<dyn FnMut() -> anyhow::Result<(u64, u64)> + 'a>;

fn measure(
    name: &'static str,
    rounds: usize,
    stats: &mut Client,
    with_node: bool,
    mut deliver: Deliver<'_>,
    want: &mut Option<(u64, u64)>,
) -> anyhow::Result<Way> {
    let first = deliver().with_context(|| format!("{name}: first read"))?;
    match want {
        Some(w) => ensure!(*w == first, "{name}: delivered {first:?}, others {w:?}"),
        None => *want = Some(first),
    }
    let (node0, cpu0) = (if with_node { node_cpu(stats)? } else { 0.0 }, self_cpu());
    let mut rates = Vec::with_capacity(rounds);
    let mut total = 0u64;
    for _ in 0..rounds {
        let t = Instant::now();
        let got = deliver()?;
        let secs = t.elapsed().as_secs_f64();
        ensure!(
            Some(got) == *want,
            "{name}: delivered {got:?}, expected {want:?}"
        );
        rates.push(got.0 as f64 / 1e6 / secs);
        total += got.0;
    }
    let client_cpu = self_cpu() - cpu0;
    let node = if with_node {
        node_cpu(stats)? - node0
    } else {
        0.0
    };
    rates.sort_by(f64::total_cmp);
    let gib = total as f64 / (1u64 << 30) as f64;
    Ok(Way {
        name,
        mb_per_s_median: rates[rates.len() / 2],
        mb_per_s_min: rates[0],
        mb_per_s_max: rates[rates.len() - 1],
        client_cpu_s_per_gib: client_cpu / gib,
        node_cpu_s_per_gib: node / gib,
        total_cpu_s_per_gib: (client_cpu + node) / gib,
    })
}

/// Runs every way `rounds` times over the object.
pub fn run(t: &LocalTarget, rounds: usize) -> anyhow::Result<LocalReport> {
    ensure!(rounds > 0, "--rounds must be at least 1");
    let unix_endpoint = format!("unix:{}", t.socket.display());
    let mut stats = client(&t.endpoint, t)?;
    let mut tcp = client(&t.endpoint, t)?;
    let mut unix = client(&unix_endpoint, t)?;
    let mut local = client(&unix_endpoint, t)?;
    let (bucket, key) = (t.bucket.as_str(), t.key.as_str());
    let mut want = None;
    let mut ways = Vec::new();
    let stream = |c: &mut Client| -> anyhow::Result<(u64, u64)> {
        let mut f = Folder { sum: 0, bytes: 0 };
        c.get_into(bucket, key, &mut f)?;
        Ok((f.bytes, f.sum))
    };
    ways.push(measure(
        "HTTP over TCP loopback",
        rounds,
        &mut stats,
        true,
        Box::new(|| stream(&mut tcp)),
        &mut want,
    )?);
    ways.push(measure(
        "HTTP over the Unix socket",
        rounds,
        &mut stats,
        true,
        Box::new(|| stream(&mut unix)),
        &mut want,
    )?);
    ways.push(measure(
        "local read (fd + mmap)",
        rounds,
        &mut stats,
        true,
        Box::new(|| {
            let bytes = local.get_local(bucket, key)?;
            ensure!(
                bytes.is_mapped(),
                "the node gave no descriptor for {bucket}/{key}"
            );
            Ok((bytes.len() as u64, fold(0, &bytes)))
        }),
        &mut want,
    )?);
    if let Some(path) = &t.direct {
        let mut buf = vec![0u8; 1 << 20];
        ways.push(measure(
            "ceiling: read(2) of the file from page cache",
            rounds,
            &mut stats,
            false,
            Box::new(|| {
                let mut f = File::open(path).with_context(|| format!("{}", path.display()))?;
                let mut sink = Folder { sum: 0, bytes: 0 };
                loop {
                    let n = f.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    sink.write_all(&buf[..n])?;
                }
                Ok((sink.bytes, sink.sum))
            }),
            &mut want,
        )?);
    }
    let (tcp_w, unix_w, local_w) = (&ways[0], &ways[1], &ways[2]);
    Ok(LocalReport {
        object_bytes: want.map_or(0, |w| w.0),
        rounds,
        local_over_tcp: local_w.mb_per_s_median / tcp_w.mb_per_s_median,
        local_over_unix: local_w.mb_per_s_median / unix_w.mb_per_s_median,
        unix_over_tcp: unix_w.mb_per_s_median / tcp_w.mb_per_s_median,
        tcp_cpu_over_local: tcp_w.total_cpu_s_per_gib / local_w.total_cpu_s_per_gib,
        ways,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fold_is_the_same_however_the_bytes_are_cut() {
        let data: Vec<u8> = (0..10_007u32).map(|i| (i * 31 % 251) as u8).collect();
        let whole = fold(0, &data);
        let mut f = Folder { sum: 0, bytes: 0 };
        for piece in data.chunks(4093) {
            f.write_all(piece).unwrap();
        }
        assert_eq!((f.bytes, f.sum), (data.len() as u64, whole));
        assert_ne!(whole, 0);
    }
}
