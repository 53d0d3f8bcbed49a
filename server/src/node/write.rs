//! Writes through the node: objects (put, copy, multipart), deletes. Every change is
//! cached or invalidated here and told to the other members, so that no node serves an
//! older version after it.

use std::sync::atomic::Ordering;

use super::{Node, NodeError};
use crate::backend::{check_key, ByteRange, ByteStream, ObjectMeta, PartInfo, PutOptions, RangeFn};

impl Node {
    /// PutObject: written through to the backend, cached on the way.
    pub async fn put(
        &self,
        bucket: &str,
        key: &str,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<ObjectMeta, NodeError> {
        check_key(key)?;
        let meta = self
            .cache
            .put_through(&*self.backend, bucket, key, body, opts)
            .await?;
        self.stats
            .bytes_received
            .fetch_add(meta.size, Ordering::Relaxed);
        self.changed(&[(bucket.to_owned(), key.to_owned())]).await;
        Ok(meta)
    }

    /// CopyObject: the source (if `cond` takes it) streamed into a new write of the
    /// destination, with the source's headers unless `headers` replaces them.
    pub async fn copy(
        &self,
        (src_bucket, src_key): (&str, &str),
        cond: &RangeFn<'_>,
        (bucket, key): (&str, &str),
        headers: Option<Vec<(String, String)>>,
    ) -> Result<ObjectMeta, NodeError> {
        check_key(key)?;
        let (src, _) = self.backend.get_object(src_bucket, src_key, cond).await?;
        let opts = PutOptions {
            headers: headers.unwrap_or_else(|| src.meta.headers.clone()),
            expected_md5: None,
            size: Some(src.meta.size),
        };
        let meta = self
            .cache
            .put_through(&*self.backend, bucket, key, src.body, opts)
            .await?;
        self.changed(&[(bucket.to_owned(), key.to_owned())]).await;
        Ok(meta)
    }

    /// DeleteObject (a missing key is not an error).
    pub async fn delete(&self, bucket: &str, key: &str) -> Result<(), NodeError> {
        self.backend.delete_object(bucket, key).await?;
        self.cache.invalidate(bucket, key);
        self.changed(&[(bucket.to_owned(), key.to_owned())]).await;
        Ok(())
    }

    /// DeleteObjects: each key's outcome, in order.
    pub async fn delete_many(&self, bucket: &str, keys: &[String]) -> Vec<Result<(), NodeError>> {
        let mut outcomes = Vec::with_capacity(keys.len());
        let mut changed = Vec::new();
        for key in keys {
            let done = self.backend.delete_object(bucket, key).await;
            if done.is_ok() {
                self.cache.invalidate(bucket, key);
                changed.push((bucket.to_owned(), key.clone()));
            }
            outcomes.push(done.map_err(NodeError::from));
        }
        self.changed(&changed).await;
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
        self.stats
            .bytes_received
            .fetch_add(info.size, Ordering::Relaxed);
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
    pub async fn complete(
        &self,
        (bucket, key, upload_id): (&str, &str, &str),
        parts: &[(u32, String)],
    ) -> Result<ObjectMeta, NodeError> {
        let meta = self
            .backend
            .complete_multipart(bucket, key, upload_id, parts)
            .await?;
        self.cache.invalidate(bucket, key);
        self.changed(&[(bucket.to_owned(), key.to_owned())]).await;
        Ok(meta)
    }
}
