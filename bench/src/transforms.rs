//! `granary-bench transform`: what on-node transforms with shared results buy.
//!
//! Over the images under a prefix, on a node that has read none of them yet:
//! 1. `jobs` jobs at once read every image with `?transform=SHARED`: the node's
//!    transforms, transform CPU seconds and backend bytes for all of them;
//! 2. one job reads every image with `?transform=NAME` (another name for the same steps:
//!    results computed, sources now cached), then again (results cached): images/s and
//!    MB/s of each pass;
//! 3. the same `jobs` jobs each doing the work themselves: every job reads the source
//!    images (`--source-endpoint`, e.g. the S3 server itself) and runs the same image
//!    steps in this process (the node's own code): backend bytes and CPU seconds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{ensure, Context};
use bytes::Bytes;
use futures::StreamExt;
use http_body_util::{BodyExt, Full};
use serde::Serialize;

use crate::http::Target;
use crate::listing::Object;
use granary_core::{apply_image as apply, ImageSpec};
use granary_proto::encode;

/// One timed pass.
#[derive(Debug, Serialize)]
pub struct Pass {
    pub seconds: f64,
    pub images_per_s: f64,
    pub out_mb_per_s: f64,
    pub out_bytes: u64,
}

/// The work of `jobs` jobs: node-side (shared) or job-side (each transforming).
#[derive(Debug, Serialize)]
pub struct Work {
    pub seconds: f64,
    pub transforms: u64,
    pub cpu_seconds: f64,
    pub backend_bytes: u64,
}

#[derive(Debug, Serialize)]
pub struct TransformReport {
    pub endpoint: String,
    pub images: usize,
    pub source_bytes: u64,
    pub first: Pass,
    pub repeated: Pass,
    pub repeated_over_first: f64,
    pub jobs: usize,
    pub shared: Work,
    pub each: Work,
}

async fn fetch(target: &Target, url: String) -> anyhow::Result<Bytes> {
    let req = http::Request::get(&url).body(Full::new(Bytes::new()))?;
    let resp = target
        .client
        .request(req)
        .await
        .with_context(|| url.clone())?;
    let status = resp.status();
    let body = resp.into_body().collect().await?.to_bytes();
    ensure!(
        status.is_success(),
        "GET {url}: {status}: {}",
        String::from_utf8_lossy(&body)
    );
    Ok(body)
}

fn transformed_url(target: &Target, bucket: &str, key: &str, t: &str) -> String {
    format!(
        "{}{}?transform={}",
        target.endpoint,
        Target::object_path(bucket, key),
        encode::query_value(t)
    )
}

/// Every image through `?transform=t`, `workers` at a time.
async fn pass(
    target: &Target,
    bucket: &str,
    objs: &[Object],
    t: &str,
    workers: usize,
) -> anyhow::Result<Pass> {
    let out = AtomicU64::new(0);
    let started = Instant::now();
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(objs)
        .map(|o| {
            let out = &out;
            async move {
                let b = fetch(target, transformed_url(target, bucket, &o.key, t)).await?;
                out.fetch_add(b.len() as u64, Ordering::Relaxed);
                Ok(())
            }
        })
        .buffer_unordered(workers.max(1))
        .collect()
        .await;
    results.into_iter().collect::<anyhow::Result<()>>()?;
    let seconds = started.elapsed().as_secs_f64();
    let out_bytes = out.load(Ordering::Relaxed);
    Ok(Pass {
        seconds,
        images_per_s: objs.len() as f64 / seconds,
        out_mb_per_s: out_bytes as f64 / 1e6 / seconds,
        out_bytes,
    })
}

async fn node_stats(target: &Target) -> anyhow::Result<serde_json::Value> {
    target.json_at(&target.endpoint, "/_granary/stats").await
}

/// CPU time of the calling thread, in seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes only into the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[allow(clippy::too_many_arguments)]
pub async fn run(
    target: &Target,
    bucket: &str,
    prefix: &str,
    name: &str,
    shared: &str,
    source_endpoint: &str,
    source_signer: Option<granary_proto::sigv4::Signer>,
    spec: &ImageSpec,
    jobs: usize,
    workers: usize,
) -> anyhow::Result<TransformReport> {
    let objs = target.list_objects(bucket, prefix).await?;
    ensure!(!objs.is_empty(), "no objects under {bucket}/{prefix}");
    let source_bytes: u64 = objs.iter().map(|o| o.size).sum();

    // Shared: the jobs at once, results computed by the node once.
    let before = node_stats(target).await?;
    let started = Instant::now();
    let runs: Vec<anyhow::Result<Pass>> =
        futures::future::join_all((0..jobs).map(|_| pass(target, bucket, &objs, shared, workers)))
            .await;
    for r in runs {
        r?;
    }
    let seconds = started.elapsed().as_secs_f64();
    let after = node_stats(target).await?;
    let d = |f: &str| after[f].as_f64().unwrap_or(0.0) - before[f].as_f64().unwrap_or(0.0);
    let shared_work = Work {
        seconds,
        transforms: d("transforms_run") as u64,
        cpu_seconds: d("transform_cpu_seconds"),
        backend_bytes: d("bytes_from_backend") as u64,
    };

    let first = pass(target, bucket, &objs, name, workers).await?;
    let repeated = pass(target, bucket, &objs, name, workers).await?;
    eprintln!(
        "first pass {:.2} s ({:.0} images/s), repeated {:.2} s ({:.0} images/s)",
        first.seconds, first.images_per_s, repeated.seconds, repeated.images_per_s
    );

    // Each job on its own: read the sources, transform here.
    let source = Target::new(source_endpoint, workers.max(1) * jobs, source_signer)?;
    let cpu_us = AtomicU64::new(0);
    let fetched = AtomicU64::new(0);
    let started = Instant::now();
    let one_job = || async {
        let results: Vec<anyhow::Result<()>> = futures::stream::iter(&objs)
            .map(|o| {
                let (source, cpu_us, fetched) = (&source, &cpu_us, &fetched);
                async move {
                    let path = Target::object_path(bucket, &o.key);
                    let req = source
                        .builder(http::Method::GET, &path, &[])
                        .body(Full::new(Bytes::new()))?;
                    let resp = source.client.request(req).await?;
                    ensure!(
                        resp.status().is_success(),
                        "source GET {path}: {}",
                        resp.status()
                    );
                    let input = resp.into_body().collect().await?.to_bytes();
                    fetched.fetch_add(input.len() as u64, Ordering::Relaxed);
                    let spec = spec.clone();
                    let (out, cpu) = tokio::task::spawn_blocking(move || {
                        let t = thread_cpu();
                        let out = apply(&spec, &input);
                        (out, thread_cpu() - t)
                    })
                    .await?;
                    out.map_err(anyhow::Error::msg)?;
                    cpu_us.fetch_add((cpu * 1e6) as u64, Ordering::Relaxed);
                    Ok(())
                }
            })
            .buffer_unordered(workers.max(1))
            .collect()
            .await;
        results.into_iter().collect::<anyhow::Result<()>>()
    };
    for r in futures::future::join_all((0..jobs).map(|_| one_job())).await {
        r?;
    }
    let each = Work {
        seconds: started.elapsed().as_secs_f64(),
        transforms: (jobs * objs.len()) as u64,
        cpu_seconds: cpu_us.load(Ordering::Relaxed) as f64 / 1e6,
        backend_bytes: fetched.load(Ordering::Relaxed),
    };
    Ok(TransformReport {
        endpoint: target.endpoint.clone(),
        images: objs.len(),
        source_bytes,
        repeated_over_first: first.seconds / repeated.seconds,
        first,
        repeated,
        jobs,
        shared: shared_work,
        each,
    })
}
