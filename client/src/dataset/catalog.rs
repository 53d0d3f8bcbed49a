//! What a sharded dataset holds, sample by sample: every shard under a prefix (the keys
//! ending in `.tar`, `.tar.gz` or `.tgz`, in key order), its version, how many samples
//! it holds and, where known, where each lies in it, so that an epoch can be planned
//! without reading a byte of data, and a run of samples fetched with one range read.
//!
//! The cluster builds a dataset's catalog once per version and keeps it: one request
//! (`GET /_granary/catalog`) brings it whole. A shard catalogued from the dataset's index
//! has its sample count only, and is read from its start. A node that does not serve
//! catalogs is asked shard by shard instead: a `.tar` shard's members from the node
//! (`GET …?archlist`), a compressed shard read once here and its headers noted, a few
//! shards at once, each over its own connection.

use std::io::{self, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

pub use granary_proto::shards::{is_compressed, is_shard, SampleSpan};
use granary_proto::shards::{sample_spans, CatalogShard};
use serde::{Deserialize, Serialize};

use super::route::{on_best, Clients, Router};
use crate::tarstream::TarReader;
use crate::{Client, Error, Result};

/// Shards listed at once while a catalog is built shard by shard.
const LIST_THREADS: usize = 8;

/// The shards under `prefix`, in key order; an error when there are none.
fn shard_keys(client: &mut Client, bucket: &str, prefix: &str) -> Result<Vec<String>> {
    let mut keys: Vec<String> = client
        .list(bucket, prefix)?
        .into_iter()
        .map(|o| o.key)
        .filter(|k| is_shard(k))
        .collect();
    keys.sort();
    if keys.is_empty() {
        return Err(no_shards(bucket, prefix));
    }
    Ok(keys)
}

fn no_shards(bucket: &str, prefix: &str) -> Error {
    Error::Invalid(format!(
        "no .tar, .tar.gz or .tgz objects under {bucket}/{prefix}"
    ))
}

/// One shard: its key, the version catalogued, its samples (in archive order) and,
/// where known, where each lies.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub key: String,
    /// The ETag catalogued; reads ask for this version (`If-Match`).
    pub etag: String,
    /// Samples in the shard.
    pub count: u32,
    /// Each sample's span, when known: a shard without them is read from its start.
    pub spans: Option<Vec<SampleSpan>>,
    /// Bytes, when known (0: not).
    #[serde(default)]
    pub size: u64,
}

impl ShardInfo {
    /// `.tar.gz`/`.tgz`: read whole, never by range.
    pub fn compressed(&self) -> bool {
        is_compressed(&self.key)
    }

    /// Whether its samples are read by range: an uncompressed shard whose spans are
    /// known.
    pub fn ranged(&self) -> bool {
        !self.compressed() && self.spans.is_some()
    }

    /// Where its samples end, for a shard read by range: the bytes an epoch's reads of
    /// all of them cover from its start.
    pub(crate) fn samples_end(&self) -> Option<u64> {
        self.spans
            .as_ref()
            .filter(|_| self.ranged())?
            .last()
            .map(|s| s.end)
    }

    /// Sample `i`'s span (of a shard whose spans are known).
    pub(crate) fn span(&self, i: u32) -> SampleSpan {
        self.spans.as_ref().expect("a ranged shard")[i as usize]
    }

    fn of_spans(key: &str, etag: String, spans: Vec<SampleSpan>) -> ShardInfo {
        ShardInfo {
            key: key.to_owned(),
            etag,
            count: spans.len() as u32,
            spans: Some(spans),
            size: 0,
        }
    }
}

impl From<CatalogShard> for ShardInfo {
    fn from(s: CatalogShard) -> ShardInfo {
        ShardInfo {
            spans: s.spans(),
            key: s.key,
            etag: s.etag,
            count: s.samples,
            size: s.size,
        }
    }
}

/// The shards of a dataset, in key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub bucket: String,
    /// The prefix the shards were listed under.
    #[serde(default)]
    pub prefix: String,
    pub shards: Vec<ShardInfo>,
}

impl Catalog {
    /// The catalog of the shards under `prefix`: the cluster's (one request), else
    /// built here by asking each shard's owner as `router` says.
    pub fn build(client: &Client, router: &Router, bucket: &str, prefix: &str) -> Result<Catalog> {
        // Its connection is let go before any other opens.
        let asked = client.fresh().catalog(bucket, prefix);
        match asked {
            Ok(c) if c.shards.is_empty() => Err(no_shards(bucket, prefix)),
            Ok(c) => Ok(Catalog {
                bucket: bucket.to_owned(),
                prefix: prefix.to_owned(),
                shards: c.shards.into_iter().map(ShardInfo::from).collect(),
            }),
            // A node from before catalogs: each shard asked.
            Err(e) if e.status() == Some(404) && e.code() == Some("NotFound") => {
                Catalog::build_by_shard(client, router, bucket, prefix)
            }
            Err(e) => Err(e),
        }
    }

    /// The catalog, each shard asked of its owner (or read here).
    pub fn build_by_shard(
        client: &Client,
        router: &Router,
        bucket: &str,
        prefix: &str,
    ) -> Result<Catalog> {
        let keys = shard_keys(&mut client.fresh(), bucket, prefix)?;
        let next = AtomicUsize::new(0);
        let found: Mutex<Vec<Option<Result<ShardInfo>>>> =
            Mutex::new((0..keys.len()).map(|_| None).collect());
        std::thread::scope(|s| {
            for _ in 0..LIST_THREADS.min(keys.len()) {
                s.spawn(|| {
                    let mut clients = Clients::new(
                        router.clone(),
                        client.credentials().cloned(),
                        client.timeout(),
                    );
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(key) = keys.get(i) else { return };
                        let info =
                            on_best(&mut clients, bucket, key, |c| shard_info(c, bucket, key));
                        let failed = info.is_err();
                        found.lock().unwrap_or_else(|p| p.into_inner())[i] = Some(info);
                        if failed {
                            // The others stop at their next shard.
                            next.store(keys.len(), Ordering::Relaxed);
                            return;
                        }
                    }
                });
            }
        });
        let shards = found
            .into_inner()
            .unwrap_or_else(|p| p.into_inner())
            .into_iter()
            .flatten()
            .collect::<Result<Vec<_>>>()?;
        Ok(Catalog {
            bucket: bucket.to_owned(),
            prefix: prefix.to_owned(),
            shards,
        })
    }

    /// Samples per shard, in key order.
    pub fn counts(&self) -> Vec<u32> {
        self.shards.iter().map(|s| s.count).collect()
    }

    /// Samples in all.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.count as usize).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One shard's samples: from the node's member list, else from reading it once.
fn shard_info(c: &mut Client, bucket: &str, key: &str) -> Result<ShardInfo> {
    let compressed = is_compressed(key);
    if !compressed {
        match c.list_archive(bucket, key) {
            Ok(list) => {
                return Ok(ShardInfo::of_spans(
                    key,
                    list.etag,
                    sample_spans(list.members),
                ))
            }
            // Refusals and absences are the answer; anything else (a node that does not
            // list members, a shard it cannot hold) is read here instead.
            Err(e) if matches!(e.status(), Some(401 | 403 | 404)) => return Err(e),
            Err(_) => {}
        }
    }
    let reader = c.open(bucket, key)?;
    let etag = reader.meta().etag.clone().unwrap_or_default();
    let counted = Counted {
        inner: reader,
        read: 0,
    };
    let mut members = Vec::new();
    let shard_err = |source: io::Error| Error::Shard {
        shard: key.to_owned(),
        source,
    };
    if compressed {
        let mut tar = TarReader::new(Counted {
            inner: flate2::read::MultiGzDecoder::new(counted),
            read: 0,
        });
        while let Some((name, size)) = tar.next_header().map_err(shard_err)? {
            members.push((name, tar.get_mut().read, size));
        }
    } else {
        let mut tar = TarReader::new(counted);
        while let Some((name, size)) = tar.next_header().map_err(shard_err)? {
            members.push((name, tar.get_mut().read, size));
        }
    }
    Ok(ShardInfo::of_spans(key, etag, sample_spans(members)))
}

/// Counts the bytes read through it.
struct Counted<R> {
    inner: R,
    read: u64,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}
