//! A dataset's catalog (`GET /_granary/catalog`): its shards in key order, each with its
//! version, size, sample count and, where known, where each sample lies, built once per
//! version of the dataset and kept, on disk too, so that every rank of every job gets it
//! with one request and no shard is read to start a second job.
//!
//! - The version is a hash of the shards' keys, ETags and sizes (and the index's ETag):
//!   a changed shard is a new version, catalogued anew.
//! - A shard unchanged since the dataset's last catalog keeps its entry.
//! - Where the dataset keeps an index beside its shards (`{prefix}wids.json`, a `wids`
//!   shard list), the counts come from it and no shard is read; shards it does not name
//!   are indexed.
//! - Otherwise each shard is indexed by its owner (`IndexShards`; `index` says how), the
//!   members in parallel, and a member that does not answer has its shards indexed here.
//! - One build at a time per dataset on a node; the API sends every request for one
//!   dataset to one member (its catalog's owner), so a cluster builds it once.
//! - Ranks that start together ask within moments: a catalog checked against a listing
//!   in the last [`FRESH_FOR`] is served without listing again, unless an object under
//!   its prefix was written or deleted through the cluster since.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use granary_proto::shards::{is_shard, Catalog, CatalogShard, Index, INDEX_NAME};

use super::{Node, NodeError, ReadRequest};
use crate::backend::ListQuery;
use crate::cluster::calls::{IndexShards, ShardRef};
use crate::cluster::{ClusterError, Member};
use crate::stats::Metric;
use crate::sync::Locked;

/// How long a catalog checked against a listing is served without listing again.
pub const FRESH_FOR: Duration = Duration::from_secs(2);
/// Shards a member is asked to index at once.
const CALL_SHARDS: usize = 64;
/// The largest index read.
const MAX_INDEX: usize = 64 << 20;

/// Which catalog: bucket, prefix, and whether the dataset's index may be used.
type CatalogId = (String, String, bool);

/// The catalogs a node keeps.
#[derive(Default)]
pub(super) struct Catalogs {
    /// Where they are kept across restarts (none: in memory only).
    dir: OnceLock<PathBuf>,
    /// Each, with when it was last checked against a listing.
    kept: Mutex<HashMap<CatalogId, (Arc<Catalog>, Instant)>>,
    builds: crate::keylock::KeyLocks<CatalogId>,
}

impl Catalogs {
    /// Keeps catalogs in `dir` from now on.
    pub(super) fn keep_in(&self, dir: PathBuf) -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let _ = self.dir.set(dir);
        Ok(())
    }

    fn file(&self, id: &CatalogId) -> Option<PathBuf> {
        let name = format!("{}\0{}\0{}", id.0, id.1, id.2);
        let hash = xxhash_rust::xxh3::xxh3_64(name.as_bytes());
        Some(self.dir.get()?.join(format!("{hash:016x}.json")))
    }

    /// The kept catalog of this version, if any (from memory, else from disk).
    fn of_version(&self, id: &CatalogId, version: &str) -> Option<Arc<Catalog>> {
        let mut kept = self.kept.locked();
        if let Some((c, at)) = kept.get_mut(id) {
            if c.version == version {
                *at = Instant::now();
                return Some(c.clone());
            }
        }
        let text = std::fs::read(self.file(id)?).ok()?;
        let c: Catalog = serde_json::from_slice(&text).ok()?;
        let same = c.version == version && c.bucket == id.0 && c.prefix == id.1;
        let c = Arc::new(c);
        same.then(|| {
            kept.insert(id.clone(), (c.clone(), Instant::now()));
            c
        })
    }

    /// The last catalog kept of this dataset, whatever its version.
    fn last(&self, id: &CatalogId) -> Option<Arc<Catalog>> {
        let kept = self.kept.locked();
        if let Some((c, _)) = kept.get(id) {
            return Some(c.clone());
        }
        let text = std::fs::read(self.file(id)?).ok()?;
        serde_json::from_slice(&text).ok().map(Arc::new)
    }

    /// An object was written or deleted: catalogs of datasets it may belong to are
    /// listed again at their next request.
    pub(super) fn touched(&self, bucket: &str, key: &str) {
        let mut kept = self.kept.locked();
        for ((b, prefix, _), (_, at)) in kept.iter_mut() {
            if b == bucket && key.starts_with(prefix.as_str()) {
                *at = Instant::now()
                    .checked_sub(FRESH_FOR)
                    .unwrap_or_else(Instant::now);
            }
        }
    }

    fn fresh(&self, id: &CatalogId) -> Option<Arc<Catalog>> {
        let kept = self.kept.locked();
        kept.get(id)
            .filter(|(_, at)| at.elapsed() < FRESH_FOR)
            .map(|(c, _)| c.clone())
    }

    /// Keeps `c` in memory, and on disk (written whole, then renamed into place).
    fn keep(&self, id: &CatalogId, c: &Arc<Catalog>) {
        if let Some(path) = self.file(id) {
            let tmp = path.with_extension("tmp");
            let written = serde_json::to_vec(&**c)
                .map_err(std::io::Error::other)
                .and_then(|bytes| std::fs::write(&tmp, bytes))
                .and_then(|()| std::fs::rename(&tmp, &path));
            if let Err(e) = written {
                tracing::warn!(path = %path.display(), error = %e, "a catalog was not kept on disk");
            }
        }
        let mut kept = self.kept.locked();
        kept.insert(id.clone(), (c.clone(), Instant::now()));
    }
}

/// What a listing of the dataset found: its shards in key order, and its index.
struct Listed {
    shards: Vec<ShardRef>,
    index: Option<ShardRef>,
}

impl Node {
    /// The catalog of the shards under `bucket/prefix` (`use_index`: counts from the
    /// dataset's index where it has one), built once per version.
    pub async fn catalog(
        self: &Arc<Self>,
        bucket: &str,
        prefix: &str,
        use_index: bool,
    ) -> Result<Arc<Catalog>, NodeError> {
        let id: CatalogId = (bucket.to_owned(), prefix.to_owned(), use_index);
        let lock = self.catalogs.builds.of(id.clone());
        let _one = lock.lock().await;
        if let Some(c) = self.catalogs.fresh(&id) {
            return Ok(c);
        }
        let listed = self.list_dataset(bucket, prefix).await?;
        let index = listed.index.filter(|_| use_index);
        let version = version_of(&id, &listed.shards, index.as_ref());
        if let Some(c) = self.catalogs.of_version(&id, &version) {
            return Ok(c);
        }
        let started = Instant::now();
        // Shards unchanged since the last version keep their entries.
        let known: HashMap<(String, String), CatalogShard> = self
            .catalogs
            .last(&id)
            .map(|c| {
                c.shards
                    .iter()
                    .filter(|s| s.ends.is_some())
                    .map(|s| ((s.key.clone(), s.etag.clone()), s.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let catalog = Arc::new(
            self.build_catalog(&id, listed.shards, index, known, version)
                .await?,
        );
        self.stats.add(Metric::CatalogsBuilt, 1);
        tracing::info!(
            bucket,
            prefix,
            shards = catalog.shards.len(),
            from_index = catalog.from_index,
            ms = started.elapsed().as_millis() as u64,
            "catalog built"
        );
        self.catalogs.keep(&id, &catalog);
        Ok(catalog)
    }

    /// Every shard under the prefix, and the index beside them.
    async fn list_dataset(&self, bucket: &str, prefix: &str) -> Result<Listed, NodeError> {
        let index_key = format!("{prefix}{INDEX_NAME}");
        let mut listed = Listed {
            shards: Vec::new(),
            index: None,
        };
        let mut after = None;
        loop {
            let q = ListQuery {
                prefix: prefix.to_owned(),
                delimiter: None,
                after: after.clone(),
                max_keys: 1000,
            };
            let page = self.backend.list_objects(bucket, &q).await?;
            for o in page.objects {
                let r = ShardRef {
                    key: o.key,
                    etag: o.etag,
                    size: o.size,
                };
                if r.key == index_key {
                    listed.index = Some(r);
                } else if is_shard(&r.key) {
                    listed.shards.push(r);
                }
            }
            if !page.is_truncated || page.last.is_none() {
                break;
            }
            after = page.last;
        }
        listed.shards.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(listed)
    }

    async fn build_catalog(
        self: &Arc<Self>,
        (bucket, prefix, _): &CatalogId,
        shards: Vec<ShardRef>,
        index: Option<ShardRef>,
        known: HashMap<(String, String), CatalogShard>,
        version: String,
    ) -> Result<Catalog, NodeError> {
        let mut entries: Vec<Option<CatalogShard>> = shards
            .iter()
            .map(|s| {
                known
                    .get(&(s.key.clone(), s.etag.clone()))
                    .filter(|e| e.size == s.size)
                    .cloned()
            })
            .collect();
        let mut from_index = false;
        if let Some(ix) = &index {
            let counts = self.read_index(bucket, prefix, ix).await?;
            for (s, e) in shards.iter().zip(entries.iter_mut()) {
                if e.is_some() {
                    continue;
                }
                if let Some(&n) = counts.get(&s.key) {
                    *e = Some(CatalogShard {
                        key: s.key.clone(),
                        etag: s.etag.clone(),
                        size: s.size,
                        samples: u32::try_from(n).unwrap_or(u32::MAX),
                        ends: None,
                    });
                    from_index = true;
                }
            }
        }
        // The rest, each on its owner.
        let mut by_owner: Vec<(Arc<Member>, Vec<usize>)> = Vec::new();
        for (i, s) in shards.iter().enumerate() {
            if entries[i].is_some() {
                continue;
            }
            let owner = self.cluster.owner(bucket, &s.key);
            match by_owner.iter_mut().find(|(m, _)| m.id == owner.id) {
                Some((_, list)) => list.push(i),
                None => by_owner.push((owner, vec![i])),
            }
        }
        // Every member at once (each indexes a few of its shards at a time).
        let asks: Vec<_> = by_owner
            .into_iter()
            .map(|(m, list)| {
                let refs: Vec<ShardRef> = list.iter().map(|&i| shards[i].clone()).collect();
                async move {
                    let indexed = self.indexed_on(&m, bucket, refs).await?;
                    Ok::<_, NodeError>(list.into_iter().zip(indexed).collect::<Vec<_>>())
                }
            })
            .collect();
        let done = futures::future::join_all(asks).await;
        for part in done {
            for (i, e) in part? {
                entries[i] = Some(e);
            }
        }
        Ok(Catalog {
            bucket: bucket.clone(),
            prefix: prefix.clone(),
            version,
            from_index,
            shards: entries.into_iter().flatten().collect(),
        })
    }

    /// `refs` indexed by member `m` (this node, or a member that owns them; one that does
    /// not answer has them indexed here).
    async fn indexed_on(
        self: &Arc<Self>,
        m: &Member,
        bucket: &str,
        refs: Vec<ShardRef>,
    ) -> Result<Vec<CatalogShard>, NodeError> {
        if self.cluster.is_me(m) {
            return self.index_shards(bucket, &refs).await;
        }
        let mut out = Vec::with_capacity(refs.len());
        for chunk in refs.chunks(CALL_SHARDS) {
            let call = IndexShards {
                bucket: bucket.to_owned(),
                shards: chunk.to_vec(),
            };
            match self.cluster.call(m, &call).await {
                Ok(indexed) => {
                    let matches = indexed.shards.len() == chunk.len()
                        && indexed
                            .shards
                            .iter()
                            .zip(chunk)
                            .all(|(e, r)| e.key == r.key && e.etag == r.etag);
                    if !matches {
                        return Err(ClusterError::Garbled {
                            node: m.id.clone(),
                            what: "a shard index",
                            why: "not the shards asked".to_owned(),
                        }
                        .into());
                    }
                    out.extend(indexed.shards);
                }
                Err(e @ (ClusterError::Unreachable { .. } | ClusterError::Timeout { .. })) => {
                    self.cluster.mark_down(m, &e);
                    out.extend(self.index_shards(bucket, chunk).await?);
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(out)
    }

    /// The dataset's index: shard key → samples.
    async fn read_index(
        self: &Arc<Self>,
        bucket: &str,
        prefix: &str,
        ix: &ShardRef,
    ) -> Result<HashMap<String, u64>, NodeError> {
        if ix.size > MAX_INDEX as u64 {
            return Err(NodeError::Invalid(format!(
                "{} is larger than {MAX_INDEX} bytes",
                ix.key
            )));
        }
        let mut req = ReadRequest::object(bucket, &ix.key);
        req.conditions.if_match = Some(format!("\"{}\"", ix.etag));
        let mut body = self.read(&req).await?.body.into_stream();
        let mut text = Vec::with_capacity(ix.size as usize);
        while let Some(chunk) = body.next().await {
            text.extend_from_slice(&chunk.map_err(|e| NodeError::Cut(e.to_string()))?);
        }
        let doc: Index = serde_json::from_slice(&text)
            .map_err(|e| NodeError::Invalid(format!("{} is not a wids shard list: {e}", ix.key)))?;
        Ok(doc
            .shardlist
            .into_iter()
            .map(|s| (format!("{prefix}{}", s.url), s.nsamples))
            .collect())
    }
}

/// The version of a dataset: its shards' keys, ETags and sizes, and its index's ETag.
fn version_of(id: &CatalogId, shards: &[ShardRef], index: Option<&ShardRef>) -> String {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    h.update(format!("{}\0{}\0", id.0, id.1).as_bytes());
    for s in shards {
        h.update(format!("{}\0{}\0{}\n", s.key, s.etag, s.size).as_bytes());
    }
    if let Some(ix) = index {
        h.update(format!("index\0{}\0{}", ix.key, ix.etag).as_bytes());
    }
    format!("{:016x}", h.digest())
}
