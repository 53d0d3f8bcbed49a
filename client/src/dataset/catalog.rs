//! What a sharded dataset holds, sample by sample: every shard under a prefix (the keys
//! ending in `.tar`, `.tar.gz` or `.tgz`, in key order), its version, and where each of
//! its samples lies in it, so that an epoch can be planned
//! without reading a byte of data, and a run of samples fetched with one range read.
//!
//! A `.tar` shard's members come from the node (`GET …?archlist`: names, data offsets,
//! sizes; the node indexes its cached copy once). A compressed shard, or a node that does
//! not answer that, is read once here and its headers noted. Shards are listed by a few
//! threads at once, each over its own connection.

use std::io::{self, Read};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

use super::route::{on_best, Clients, Router};
use super::samples::split_name;
use crate::tarstream::TarReader;
use crate::{Client, Error, Result};

/// Shards listed at once while a catalog is built.
const LIST_THREADS: usize = 8;

/// The extensions that mark a shard.
const SHARD_SUFFIXES: [&str; 3] = [".tar", ".tar.gz", ".tgz"];

/// Whether a key names a shard (`.tar`, `.tar.gz`, `.tgz`).
pub fn is_shard(key: &str) -> bool {
    SHARD_SUFFIXES.iter().any(|s| key.ends_with(s))
}

/// Whether a shard is compressed (`.tar.gz`, `.tgz`): read whole, never by range.
pub fn is_compressed(key: &str) -> bool {
    key.ends_with(".tar.gz") || key.ends_with(".tgz")
}

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
        return Err(Error::Invalid(format!(
            "no .tar, .tar.gz or .tgz objects under {bucket}/{prefix}"
        )));
    }
    Ok(keys)
}

/// A sample's bytes in its shard: from the first header of its first member to the end
/// of its last member's padding (an uncompressed tar's offsets; for a compressed shard,
/// offsets in the decompressed stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleSpan {
    pub start: u64,
    pub end: u64,
}

/// One shard: its key, the version listed, and its samples in archive order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardInfo {
    pub key: String,
    /// The ETag listed; reads ask for this version (`If-Match`).
    pub etag: String,
    pub samples: Vec<SampleSpan>,
}

impl ShardInfo {
    /// `.tar.gz`/`.tgz`: read whole, never by range.
    pub fn compressed(&self) -> bool {
        is_compressed(&self.key)
    }
}

/// The shards of a dataset, in key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub bucket: String,
    pub shards: Vec<ShardInfo>,
}

impl Catalog {
    /// Lists the shards under `prefix` and where their samples lie, asking each shard's
    /// owner as `router` says.
    pub fn build(client: &Client, router: &Router, bucket: &str, prefix: &str) -> Result<Catalog> {
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
            shards,
        })
    }

    /// Samples per shard, in key order.
    pub fn counts(&self) -> Vec<u32> {
        self.shards.iter().map(|s| s.samples.len() as u32).collect()
    }

    /// Samples in all.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.samples.len()).sum()
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
                return Ok(ShardInfo {
                    key: key.to_owned(),
                    etag: list.etag,
                    samples: group(list.members.into_iter()),
                });
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
    Ok(ShardInfo {
        key: key.to_owned(),
        etag,
        samples: group(members.into_iter()),
    })
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

/// Where a member's data ends, with its padding to a whole block.
fn padded_end(offset: u64, size: u64) -> u64 {
    (offset + size).div_ceil(512) * 512
}

/// Samples out of members in archive order (name, data offset, size): consecutive
/// members sharing a key, as [`super::samples`] groups them when it reads. Each sample's
/// span starts where the one before ends, so it takes in any headers and skipped entries
/// between them.
fn group(members: impl Iterator<Item = (String, u64, u64)>) -> Vec<SampleSpan> {
    let mut out: Vec<SampleSpan> = Vec::new();
    let mut current: Option<String> = None;
    for (name, offset, size) in members {
        let Some((key, _)) = split_name(&name) else {
            continue;
        };
        let end = padded_end(offset, size);
        match (&current, out.last_mut()) {
            (Some(k), Some(last)) if k == key => last.end = end,
            _ => {
                let start = out.last().map_or(0, |s| s.end);
                out.push(SampleSpan { start, end });
                current = Some(key.to_owned());
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_keys_are_recognised() {
        assert!(is_shard("a/b-0001.tar"));
        assert!(is_shard("x.tar.gz"));
        assert!(is_shard("x.tgz"));
        assert!(!is_shard("x.tar.zst"));
        assert!(!is_shard("x.json"));
        assert!(is_compressed("x.tgz") && is_compressed("a/x.tar.gz"));
        assert!(!is_compressed("x.tar"));
    }

    #[test]
    fn members_group_into_spans_that_tile_the_shard() {
        let m = |n: &str, off: u64, size: u64| (n.to_owned(), off, size);
        let spans = group(
            vec![
                m("a/001.jpg", 512, 100),
                m("a/001.cls", 1536, 1),
                m("README", 2560, 3),
                m("a/002.jpg", 3584, 600),
                m("a/003.cls", 5120, 1),
            ]
            .into_iter(),
        );
        assert_eq!(
            spans,
            vec![
                SampleSpan {
                    start: 0,
                    end: 2048
                },
                SampleSpan {
                    start: 2048,
                    end: 4608
                },
                SampleSpan {
                    start: 4608,
                    end: 5632
                },
            ]
        );
    }
}
