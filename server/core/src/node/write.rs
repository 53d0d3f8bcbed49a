//! Writes through the node: objects (put, copy, multipart), deletes. Every change is
//! cached or invalidated here and told to the other members, so that no node serves an
//! older version after it. Each write's keys are journaled before the backend sees it;
//! a key whose outcome the node does not learn is watched until the backend's version
//! holds still ([`super::journal`], [`Node::settle`]).

use granary_proto::Header;
use std::sync::Arc;

use md5::{Digest, Md5};

use super::journal::{Pending, Unsettled};
use super::{etag_matches, Node, NodeError};
use crate::backend::{
    check_key, BackendError, ByteRange, ByteStream, ObjectMeta, PartInfo, PutOptions, RangeFn,
    Refusal,
};
use crate::cluster::calls::ObjectKey;
use crate::stats::Metric;

/// A write's preconditions (`If-Match`, `If-None-Match` on PutObject and
/// CompleteMultipartUpload), checked against the backend's current version.
#[derive(Debug, Default, Clone)]
pub struct WriteConditions {
    pub if_match: Option<String>,
    pub if_none_match: Option<String>,
}

impl WriteConditions {
    fn is_empty(&self) -> bool {
        self.if_match.is_none() && self.if_none_match.is_none()
    }

    /// Whether a write may replace `current` (`None`: no object): `If-Match` on a
    /// missing object is `NoSuchKey`, as S3 answers.
    fn check(&self, key: &str, current: Option<&ObjectMeta>) -> Result<(), NodeError> {
        if let Some(v) = &self.if_match {
            match current {
                None => return Err(BackendError::NoSuchKey(key.to_owned()).into()),
                Some(m) if !etag_matches(v, &m.etag) => {
                    return Err(Refusal::PreconditionFailed.into())
                }
                Some(_) => {}
            }
        }
        if let (Some(v), Some(m)) = (&self.if_none_match, current) {
            if etag_matches(v, &m.etag) {
                return Err(Refusal::PreconditionFailed.into());
            }
        }
        Ok(())
    }
}

/// Whether the backend cannot have taken a write that failed so: it refused it, or it
/// was never sent. Otherwise (the backend unreachable or failing mid-request, the body
/// cut, the disk) it may commit it still.
fn outcome_known(e: &NodeError) -> bool {
    match e {
        NodeError::Backend(b) => !matches!(
            b,
            BackendError::Unavailable(_) | BackendError::Io(_) | BackendError::Body(_)
        ),
        NodeError::Cache(crate::cache::CacheError::Refused(_)) => true,
        _ => false,
    }
}

/// `e`, the write's keys settled when its outcome is known (else left to be watched).
fn failed(pending: Pending<'_>, e: impl Into<NodeError>) -> NodeError {
    let e = e.into();
    if outcome_known(&e) {
        pending.settle();
    }
    e
}

/// A journal that cannot be written: the write is not sent.
fn unjournaled(e: std::io::Error) -> NodeError {
    tracing::error!(error = %e, "the write journal cannot be written; refusing writes");
    NodeError::Backend(BackendError::Io(e))
}

/// How often the versions of unsettled keys are asked at once, at most.
const SETTLING_PARALLEL: usize = 16;

/// The ETag S3 gives an object completed from parts with these ETags.
fn multipart_etag(parts: &[(u32, String)]) -> Option<String> {
    let mut md5s = Md5::new();
    for (_, etag) in parts {
        md5s.update(hex::decode(etag.trim_matches('"')).ok()?);
    }
    Some(format!("{}-{}", hex::encode(md5s.finalize()), parts.len()))
}

impl Node {
    /// PutObject: written through to the backend, cached on the way.
    pub async fn put(
        &self,
        bucket: &str,
        key: &str,
        body: ByteStream,
        opts: PutOptions,
        cond: &WriteConditions,
    ) -> Result<ObjectMeta, NodeError> {
        check_key(key)?;
        let _held = self.hold_if_conditional(bucket, key, cond).await;
        self.check_write(bucket, key, cond).await?;
        let meta = self.put_journaled(bucket, key, body, opts).await?;
        self.stats.add(Metric::BytesReceived, meta.size);
        Ok(meta)
    }

    /// A body written through to the backend and cached on the way, its key journaled
    /// until the members have dropped their copies.
    async fn put_journaled(
        &self,
        bucket: &str,
        key: &str,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<ObjectMeta, NodeError> {
        // The cache takes the new body in place of any copy as it goes through.
        self.journaled((bucket, key), false, || async {
            Ok(self
                .cache
                .put_through(&*self.backend, bucket, key, body, opts)
                .await?)
        })
        .await
    }

    /// A write of one key, journaled: the key's journal line synced before `op` sends
    /// it, and once `op` has succeeded the copy here dropped (`invalidate`), the other
    /// members told, and the line settled. A failed write's line is settled where its
    /// outcome is known, else left for the watch of unsettled keys.
    async fn journaled<T, Fut>(
        &self,
        (bucket, key): (&str, &str),
        invalidate: bool,
        op: impl FnOnce() -> Fut,
    ) -> Result<T, NodeError>
    where
        Fut: std::future::Future<Output = Result<T, NodeError>>,
    {
        let pending = self
            .journal
            .begin(&[(bucket, key)])
            .await
            .map_err(unjournaled)?;
        let done = match op().await {
            Ok(done) => done,
            Err(e) => return Err(failed(pending, e)),
        };
        if invalidate {
            self.cache.invalidate(bucket, key);
        }
        self.changed(&[ObjectKey::new(bucket, key)]).await;
        pending.settle();
        Ok(done)
    }

    /// CopyObject: the source (if `cond` takes it) streamed into a new write of the
    /// destination, with the source's headers unless `headers` replaces them.
    pub async fn copy(
        &self,
        (src_bucket, src_key): (&str, &str),
        cond: &RangeFn<'_>,
        (bucket, key): (&str, &str),
        headers: Option<Vec<Header>>,
    ) -> Result<ObjectMeta, NodeError> {
        check_key(key)?;
        let (src, _) = self.backend.get_object(src_bucket, src_key, cond).await?;
        let opts = PutOptions {
            headers: headers.unwrap_or_else(|| src.meta.headers.clone()),
            expected_md5: None,
            size: Some(src.meta.size),
        };
        self.put_journaled(bucket, key, src.body, opts).await
    }

    /// DeleteObject (a missing key is not an error).
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<(), NodeError> {
        self.journaled((bucket, key), true, || async {
            Ok(self.backend.delete_object(bucket, key).await?)
        })
        .await
    }

    /// DeleteObjects: each key's outcome, in order. One journal entry for them all,
    /// settled for each key whose outcome is known.
    pub async fn delete_many(&self, bucket: &str, keys: &[String]) -> Vec<Result<(), NodeError>> {
        let objects: Vec<(&str, &str)> = keys.iter().map(|k| (bucket, k.as_str())).collect();
        let pending = match self.journal.begin(&objects).await {
            Ok(p) => p,
            Err(e) => {
                let e = unjournaled(e);
                return keys
                    .iter()
                    .map(|_| {
                        let io = std::io::Error::other(e.to_string());
                        Err(NodeError::Backend(BackendError::Io(io)))
                    })
                    .collect();
            }
        };
        let mut outcomes = Vec::with_capacity(keys.len());
        let mut changed = Vec::new();
        let mut unknown = std::collections::HashSet::new();
        for key in keys {
            let done = self.backend.delete_object(bucket, key).await;
            if done.is_ok() {
                self.cache.invalidate(bucket, key);
                changed.push(ObjectKey::new(bucket, key));
            }
            let done = done.map_err(NodeError::from);
            if done.as_ref().is_err_and(|e| !outcome_known(e)) {
                unknown.insert(key.as_str());
            }
            outcomes.push(done);
        }
        self.changed(&changed).await;
        pending.settle_where(|_, k| !unknown.contains(k));
        outcomes
    }

    /// UploadPart.
    pub async fn upload_part(
        &self,
        (bucket, key, upload_id): (&str, &str, &str),
        part: u32,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<PartInfo, NodeError> {
        let info = self
            .backend
            .upload_part(bucket, key, upload_id, part, body, opts)
            .await?;
        self.stats.add(Metric::BytesReceived, info.size);
        Ok(info)
    }

    /// UploadPartCopy: a range of an object (as `range` resolves it) as a part.
    pub async fn upload_part_copy(
        &self,
        (bucket, key, upload_id): (&str, &str, &str),
        part: u32,
        (src_bucket, src_key): (&str, &str),
        range: &RangeFn<'_>,
    ) -> Result<PartInfo, NodeError> {
        let (src, resolved) = self.backend.get_object(src_bucket, src_key, range).await?;
        let size = resolved.map_or(src.meta.size, |r: ByteRange| r.len());
        let opts = PutOptions {
            size: Some(size),
            ..PutOptions::default()
        };
        Ok(self
            .backend
            .upload_part(bucket, key, upload_id, part, src.body, opts)
            .await?)
    }

    /// CompleteMultipartUpload: the new object replaces any cached copy, here and on
    /// the other members.
    ///
    /// Completing an upload completed already succeeds again, as on S3, while the object
    /// is still the one those parts made. `headers` are kept with the object besides the
    /// upload's (its checksum). The new object is then read into the cluster's cache in
    /// the background, as a PUT's is on its way in.
    pub async fn complete(
        self: &Arc<Self>,
        (bucket, key, upload_id): (&str, &str, &str),
        parts: &[(u32, String)],
        headers: &[Header],
        cond: &WriteConditions,
    ) -> Result<ObjectMeta, NodeError> {
        let _held = self.hold_if_conditional(bucket, key, cond).await;
        self.check_write(bucket, key, cond).await?;
        let done = self
            .journaled((bucket, key), true, || async {
                Ok(self
                    .backend
                    .complete_multipart(bucket, key, upload_id, parts, headers)
                    .await?)
            })
            .await;
        let meta = match done {
            Ok(meta) => meta,
            // No such upload (its outcome known: settled): completed already, perhaps.
            Err(NodeError::Backend(BackendError::NoSuchUpload(id))) => {
                let current = self.backend.head_object(bucket, key).await.ok();
                return match (current, multipart_etag(parts)) {
                    (Some(m), Some(etag)) if m.etag == etag => Ok(m),
                    _ => Err(BackendError::NoSuchUpload(id).into()),
                };
            }
            Err(e) => return Err(e),
        };
        let node = self.clone();
        let (b, k) = (bucket.to_owned(), key.to_owned());
        tokio::spawn(async move {
            if let Err(e) = node.warm(&b, &k).await {
                tracing::debug!(bucket = %b, key = %k, error = %e, "a completed upload was not cached");
            }
        });
        Ok(meta)
    }

    /// Starts the watcher of unsettled keys (writes whose outcome the node did not
    /// learn): each is watched by [`Node::settle`], [`SETTLING_PARALLEL`] at once.
    pub(super) fn start_settling(self: &Arc<Self>) {
        let Some(mut unsettled) = self.journal.take_unsettled() else {
            return;
        };
        let node = Arc::downgrade(self);
        tokio::spawn(async move {
            let room = Arc::new(tokio::sync::Semaphore::new(SETTLING_PARALLEL));
            while let Some(Unsettled { id, object }) = unsettled.recv().await {
                let Some(node) = node.upgrade() else {
                    return;
                };
                let Ok(place) = room.clone().acquire_owned().await else {
                    return;
                };
                tokio::spawn(async move {
                    node.settle(&object.bucket, &object.key).await;
                    node.journal.end(&[id]);
                    drop(place);
                });
            }
        });
    }

    /// Watches a key whose write's outcome was not learned until the backend's version
    /// of it has held for [`super::journal::SETTLED_AFTER`]: its copies are dropped on every
    /// member at the first look and at each change, so no version older than the
    /// backend's is served more than about [`super::journal::POLL`] after the backend commits.
    pub(super) async fn settle(&self, bucket: &str, key: &str) {
        use super::journal::{POLL, SETTLED_AFTER};
        let mut seen: Option<Option<(String, u64)>> = None;
        let mut since = std::time::Instant::now();
        loop {
            let now = match self.backend.head_object(bucket, key).await {
                Ok(m) => Some((m.etag, m.size)),
                Err(BackendError::NoSuchKey(_) | BackendError::NoSuchBucket(_)) => None,
                Err(e) => {
                    tracing::debug!(bucket, key, error = %e, "an unsettled key's version not known yet");
                    tokio::time::sleep(POLL).await;
                    continue;
                }
            };
            if seen.as_ref() != Some(&now) {
                if seen.is_some() {
                    tracing::info!(
                        bucket,
                        key,
                        "the backend committed a write whose outcome was not known: copies dropped"
                    );
                }
                self.cache.invalidate(bucket, key);
                self.changed(&[ObjectKey::new(bucket, key)]).await;
                seen = Some(now);
                since = std::time::Instant::now();
            } else if since.elapsed() >= SETTLED_AFTER {
                return;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// The key's lock for a conditional write; an unconditional one takes none (no lock
    /// table work on the plain write path).
    async fn hold_if_conditional(
        &self,
        bucket: &str,
        key: &str,
        cond: &WriteConditions,
    ) -> Option<tokio::sync::OwnedMutexGuard<()>> {
        if cond.is_empty() {
            return None;
        }
        let lock = self.write_locks.of(ObjectKey::new(bucket, key));
        Some(lock.lock_owned().await)
    }

    /// Checks `cond` against the backend's current version of `bucket/key`.
    async fn check_write(
        &self,
        bucket: &str,
        key: &str,
        cond: &WriteConditions,
    ) -> Result<(), NodeError> {
        if cond.is_empty() {
            return Ok(());
        }
        let current = match self.backend.head_object(bucket, key).await {
            Ok(m) => Some(m),
            Err(BackendError::NoSuchKey(_)) => None,
            Err(e) => return Err(e.into()),
        };
        cond.check(key, current.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use std::time::UNIX_EPOCH;

    use super::*;

    fn meta(etag: &str) -> ObjectMeta {
        ObjectMeta {
            size: 1,
            etag: etag.to_owned(),
            last_modified: UNIX_EPOCH,
            headers: Vec::new(),
        }
    }

    fn code(r: Result<(), NodeError>) -> &'static str {
        match r {
            Ok(()) => "ok",
            Err(NodeError::Backend(BackendError::NoSuchKey(_))) => "NoSuchKey",
            Err(NodeError::Cache(crate::cache::CacheError::Refused(
                Refusal::PreconditionFailed,
            ))) => "PreconditionFailed",
            Err(e) => panic!("unexpected {e}"),
        }
    }

    #[test]
    fn write_conditions_as_s3_checks_them() {
        let create = WriteConditions {
            if_none_match: Some("*".into()),
            ..Default::default()
        };
        assert_eq!(code(create.check("k", None)), "ok");
        assert_eq!(
            code(create.check("k", Some(&meta("a")))),
            "PreconditionFailed"
        );
        let replace = WriteConditions {
            if_match: Some("\"a\"".into()),
            ..Default::default()
        };
        assert_eq!(code(replace.check("k", Some(&meta("a")))), "ok");
        assert_eq!(
            code(replace.check("k", Some(&meta("b")))),
            "PreconditionFailed"
        );
        assert_eq!(code(replace.check("k", None)), "NoSuchKey");
        assert_eq!(code(WriteConditions::default().check("k", None)), "ok");
    }

    #[test]
    fn a_completed_uploads_etag_from_its_parts() {
        // MD5("a") and MD5("b"), as S3 combines them.
        let parts = [
            (1, "\"0cc175b9c0f1b6a831c399e269772661\"".to_owned()),
            (2, "92eb5ffee6ae2fec3ad71c777531578f".to_owned()),
        ];
        assert_eq!(
            multipart_etag(&parts).as_deref(),
            Some("96e024ba2074fe77e8e965ba43a704be-2")
        );
        assert_eq!(multipart_etag(&[(1, "zz".into())]), None);
    }
}
