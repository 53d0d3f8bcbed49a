//! `granary-bench batch` and `granary-bench prefetch`: what the training-data features buy.
//!
//! - batch: N random samples (members of the tar shards under a prefix) fetched as one
//!   GetBatch (`POST /_granary/batch`) against the same N fetched one `?archpath=` GET
//!   at a time, and with `workers` GETs in flight; every answer is checked (sizes, and
//!   the batch's member order).
//! - prefetch: a first epoch over a cold prefix against a first epoch over a copy of it
//!   warmed by `POST /_granary/prefetch` beforehand (the prefetch timed separately).

use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use bytes::Bytes;
use futures::StreamExt;
use http::Method;
use http_body_util::{BodyExt, Full};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::http::Target;
use crate::listing::Object;
use granary_proto::encode;

/// One member of a shard: where it is and how long.
#[derive(Clone, Debug)]
pub struct Member {
    pub shard: String,
    pub name: String,
    pub size: u64,
}

/// GETs `path` (already encoded, with its query): the answer's body, refused unless
/// `2xx`.
async fn get_ok(target: &Target, path: &str) -> anyhow::Result<hyper::body::Incoming> {
    let uri = format!("{}{path}", target.endpoint);
    let req = http::Request::get(&uri).body(Full::new(Bytes::new()))?;
    let resp = target
        .client
        .request(req)
        .await
        .with_context(|| uri.clone())?;
    ensure!(resp.status().is_success(), "GET {uri}: {}", resp.status());
    Ok(resp.into_body())
}

/// GETs `path` and counts its body's bytes as they arrive (nothing kept).
async fn get_len(target: &Target, path: &str) -> anyhow::Result<u64> {
    let mut body = get_ok(target, path).await?;
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(d) = frame?.into_data() {
            n += d.len() as u64;
        }
    }
    Ok(n)
}

/// GETs `path` into memory.
async fn get_bytes(target: &Target, path: &str) -> anyhow::Result<Bytes> {
    Ok(get_ok(target, path).await?.collect().await?.to_bytes())
}

/// Every regular member of every `.tar` shard under `prefix` (each shard read once,
/// which also brings it into the cache).
pub async fn members(target: &Target, bucket: &str, prefix: &str) -> anyhow::Result<Vec<Member>> {
    let shards: Vec<Object> = target
        .list_objects(bucket, prefix)
        .await?
        .into_iter()
        .filter(|o| o.key.ends_with(".tar"))
        .collect();
    ensure!(!shards.is_empty(), "no .tar shards under {bucket}/{prefix}");
    let mut out = Vec::new();
    for s in shards {
        let bytes = get_bytes(target, &Target::object_path(bucket, &s.key)).await?;
        let mut ar = tar::Archive::new(&bytes[..]);
        for e in ar.entries()? {
            let e = e?;
            if e.header().entry_type().is_file() {
                out.push(Member {
                    shard: s.key.clone(),
                    name: String::from_utf8_lossy(&e.path_bytes()).into_owned(),
                    size: e.size(),
                });
            }
        }
    }
    Ok(out)
}

fn member_path(bucket: &str, m: &Member) -> String {
    format!(
        "{}?archpath={}",
        Target::object_path(bucket, &m.shard),
        encode::query_value(&m.name)
    )
}

/// One round of the batch comparison.
#[derive(Debug, Serialize)]
pub struct BatchRound {
    pub samples: usize,
    pub bytes: u64,
    pub batch_s: f64,
    pub sequential_s: f64,
    pub parallel_s: f64,
}

/// The batch comparison's figures.
#[derive(Debug, Serialize)]
pub struct BatchReport {
    pub endpoint: String,
    pub samples: usize,
    pub workers: usize,
    pub rounds: Vec<BatchRound>,
    /// Median of sequential GETs' time over the batch's time.
    pub sequential_over_batch: f64,
    /// Median of `workers` parallel GETs' time over the batch's time.
    pub parallel_over_batch: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    v[v.len() / 2]
}

/// Runs `rounds` rounds; each picks `n` random members (seeded) and times the three ways.
pub async fn batch(
    target: &Target,
    bucket: &str,
    prefix: &str,
    n: usize,
    rounds: usize,
    workers: usize,
    seed: u64,
) -> anyhow::Result<BatchReport> {
    let all = members(target, bucket, prefix).await?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    for round in 0..rounds.max(1) {
        let picked: Vec<Member> = (0..n)
            .map(|_| all[rng.gen_range(0..all.len())].clone())
            .collect();
        let bytes: u64 = picked.iter().map(|m| m.size).sum();
        // Warm: every picked member read once, so all three ways read from the cache.
        if round == 0 {
            for m in &all {
                get_len(target, &member_path(bucket, m)).await?;
            }
        }
        let t = Instant::now();
        one_batch(target, bucket, &picked).await?;
        let batch_s = t.elapsed().as_secs_f64();

        let t = Instant::now();
        for m in &picked {
            let got = get_len(target, &member_path(bucket, m)).await?;
            ensure!(
                got == m.size,
                "{}/{}: {got} of {} bytes",
                m.shard,
                m.name,
                m.size
            );
        }
        let sequential_s = t.elapsed().as_secs_f64();

        let t = Instant::now();
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(picked.iter())
            .map(|m| async move {
                let got = get_len(target, &member_path(bucket, m)).await?;
                ensure!(
                    got == m.size,
                    "{}/{}: {got} of {} bytes",
                    m.shard,
                    m.name,
                    m.size
                );
                Ok(())
            })
            .buffer_unordered(workers.max(1))
            .collect()
            .await;
        results.into_iter().collect::<anyhow::Result<()>>()?;
        let parallel_s = t.elapsed().as_secs_f64();
        eprintln!(
            "round {}: {n} samples ({bytes} B): batch {:.1} ms, sequential GETs {:.1} ms, {workers} parallel GETs {:.1} ms",
            round + 1,
            batch_s * 1e3,
            sequential_s * 1e3,
            parallel_s * 1e3
        );
        out.push(BatchRound {
            samples: n,
            bytes,
            batch_s,
            sequential_s,
            parallel_s,
        });
    }
    Ok(BatchReport {
        endpoint: target.endpoint.clone(),
        samples: n,
        workers,
        sequential_over_batch: median(out.iter().map(|r| r.sequential_s / r.batch_s).collect()),
        parallel_over_batch: median(out.iter().map(|r| r.parallel_s / r.batch_s).collect()),
        rounds: out,
    })
}

/// One GetBatch of `picked`, its answer checked member by member (names and sizes).
async fn one_batch(target: &Target, bucket: &str, picked: &[Member]) -> anyhow::Result<()> {
    let items: Vec<_> = picked
        .iter()
        .map(|m| serde_json::json!({"bucket": bucket, "key": m.shard, "archpath": m.name}))
        .collect();
    let body = serde_json::Value::Array(items).to_string();
    let req = target
        .builder(Method::POST, "/_granary/batch", &[])
        .body(Full::new(Bytes::from(body)))?;
    let resp = target.client.request(req).await?;
    ensure!(resp.status().is_success(), "batch: {}", resp.status());
    let bytes = resp.into_body().collect().await?.to_bytes();
    let mut ar = tar::Archive::new(&bytes[..]);
    let mut i = 0;
    for e in ar.entries()? {
        let e = e?;
        let m = picked.get(i).context("more members than asked")?;
        let want = format!("{}/{}", m.shard, m.name);
        ensure!(
            e.path_bytes().as_ref() == want.as_bytes() && e.size() == m.size,
            "batch member {i}: not {want} of {} bytes",
            m.size
        );
        i += 1;
    }
    ensure!(i == picked.len(), "batch: {i} of {} members", picked.len());
    Ok(())
}

/// The prefetch comparison's figures.
#[derive(Debug, Serialize)]
pub struct PrefetchReport {
    pub endpoint: String,
    pub objects: usize,
    pub bytes: u64,
    pub workers: usize,
    /// A first epoch over the cold prefix.
    pub cold_epoch_s: f64,
    /// The prefetch of the other prefix, from `POST` to `done`.
    pub prefetch_s: f64,
    /// A first epoch over the prefetched prefix.
    pub warm_epoch_s: f64,
    pub cold_over_warm: f64,
    /// Prefetch and epoch together against the cold epoch (1.0: prefetching costs
    /// nothing beyond the reads it saves).
    pub prefetch_plus_epoch_over_cold: f64,
}

/// One epoch: every object GET once, shuffled (seeded), `workers` at a time.
async fn epoch(
    target: &Target,
    bucket: &str,
    objects: &[Object],
    workers: usize,
    seed: u64,
) -> anyhow::Result<f64> {
    let mut order: Vec<&Object> = objects.iter().collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let t = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(order)
        .map(|o| async move {
            let got = get_len(target, &Target::object_path(bucket, &o.key)).await?;
            ensure!(got == o.size, "{}: {got} of {} bytes", o.key, o.size);
            Ok(())
        })
        .buffer_unordered(workers.max(1))
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<()>>()?;
    Ok(t.elapsed().as_secs_f64())
}

/// Cold epoch over `cold_prefix`; prefetch of `warm_prefix` (followed to its end); epoch
/// over `warm_prefix`. The two prefixes should hold the same objects.
pub async fn prefetch(
    target: &Target,
    bucket: &str,
    cold_prefix: &str,
    warm_prefix: &str,
    workers: usize,
    seed: u64,
) -> anyhow::Result<PrefetchReport> {
    let cold = target.list_objects(bucket, cold_prefix).await?;
    let warm = target.list_objects(bucket, warm_prefix).await?;
    ensure!(
        !cold.is_empty() && !warm.is_empty(),
        "both prefixes need objects"
    );
    let cold_epoch_s = epoch(target, bucket, &cold, workers, seed).await?;
    eprintln!("cold first epoch: {:.2} s", cold_epoch_s);

    let t = Instant::now();
    let body = serde_json::json!({"bucket": bucket, "prefix": warm_prefix}).to_string();
    let req = target
        .builder(Method::POST, "/_granary/prefetch", &[])
        .body(Full::new(Bytes::from(body)))?;
    let resp = target.client.request(req).await?;
    let status = resp.status();
    let answer = resp.into_body().collect().await?.to_bytes();
    ensure!(
        status.as_u16() == 202,
        "prefetch: {status}: {}",
        String::from_utf8_lossy(&answer)
    );
    let id = serde_json::from_slice::<serde_json::Value>(&answer)?["id"]
        .as_str()
        .context("a job id")?
        .to_owned();
    loop {
        let (status, text) = target
            .text(Method::GET, &format!("/_granary/jobs/{id}"), &[])
            .await?;
        ensure!(status.is_success(), "job {id}: {status}");
        let v: serde_json::Value = serde_json::from_str(&text)?;
        match v["state"].as_str() {
            Some("running") => tokio::time::sleep(Duration::from_millis(20)).await,
            Some("done") => break,
            other => bail!("prefetch ended {other:?}: {v}"),
        }
    }
    let prefetch_s = t.elapsed().as_secs_f64();
    eprintln!("prefetch: {:.2} s", prefetch_s);
    let warm_epoch_s = epoch(target, bucket, &warm, workers, seed).await?;
    eprintln!("first epoch after prefetch: {:.2} s", warm_epoch_s);
    Ok(PrefetchReport {
        endpoint: target.endpoint.clone(),
        objects: warm.len(),
        bytes: warm.iter().map(|o| o.size).sum(),
        workers,
        cold_epoch_s,
        prefetch_s,
        warm_epoch_s,
        cold_over_warm: cold_epoch_s / warm_epoch_s,
        prefetch_plus_epoch_over_cold: (prefetch_s + warm_epoch_s) / cold_epoch_s,
    })
}
