//! An object store in memory, for unit tests of what reads and fills from one: one
//! namespace of keys (buckets are not told apart), listings in key order, and bodies in
//! 64 KiB pieces that can be held back or made to fail.

use granary_proto::Header;
use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::StreamExt;
use tokio::sync::Semaphore;

use super::{
    Backend, BackendError, BucketInfo, ByteRange, ByteStream, GetObject, ListPage, ListQuery,
    ObjectEntry, ObjectMeta, PartInfo, PutOptions, RangeFn, Result, Source, UploadInfo,
};
use crate::sync::Locked;

/// Objects in memory; bodies come in 64 KiB pieces, the first at once and the rest once
/// `gate` gives a permit (when set), and fail after the first piece while `fail` is set.
#[derive(Default)]
pub struct Mem {
    pub objects: Mutex<BTreeMap<String, Bytes>>,
    /// Bodies opened so far.
    pub gets: AtomicUsize,
    pub gate: Mutex<Option<Arc<Semaphore>>>,
    /// Bodies fail after their first piece.
    pub fail: AtomicBool,
}

const PIECE: usize = 64 << 10;

impl Mem {
    pub fn with(objects: &[(&str, Bytes)]) -> Arc<Mem> {
        let m = Mem::default();
        for (k, v) in objects {
            m.objects.locked().insert((*k).to_owned(), v.clone());
        }
        Arc::new(m)
    }

    /// Holds every body after its first piece until the semaphore gives a permit.
    pub fn hold_bodies(&self) -> Arc<Semaphore> {
        let s = Arc::new(Semaphore::new(0));
        *self.gate.locked() = Some(s.clone());
        s
    }

    pub fn meta(data: &Bytes) -> ObjectMeta {
        ObjectMeta {
            size: data.len() as u64,
            etag: format!("{:x}", xxhash_rust::xxh3::xxh3_64(data)),
            last_modified: SystemTime::UNIX_EPOCH,
            headers: Vec::new(),
        }
    }

    fn body(&self, data: Bytes) -> ByteStream {
        let gate = self.gate.locked().clone();
        let fail = self.fail.load(Ordering::SeqCst);
        Box::pin(async_stream::try_stream! {
            let mut at = 0;
            while at < data.len() {
                if at > 0 {
                    if let Some(g) = &gate {
                        g.acquire().await.expect("open").forget();
                    }
                    if fail {
                        Err(std::io::Error::other("the source broke off"))?;
                    }
                }
                let end = (at + PIECE).min(data.len());
                yield data.slice(at..end);
                at = end;
            }
        })
    }
}

#[async_trait]
impl Source for Mem {
    fn describe(&self) -> String {
        "mem".into()
    }

    async fn head_object(&self, _: &str, key: &str) -> Result<ObjectMeta> {
        let data = self.objects.locked().get(key).cloned();
        data.map(|d| Mem::meta(&d))
            .ok_or_else(|| BackendError::NoSuchKey(key.into()))
    }

    async fn get_object(
        &self,
        _: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<(GetObject, Option<ByteRange>)> {
        self.gets.fetch_add(1, Ordering::SeqCst);
        let data = self.objects.locked().get(key).cloned();
        let data = data.ok_or_else(|| BackendError::NoSuchKey(key.into()))?;
        let meta = Mem::meta(&data);
        let r = range(&meta).map_err(BackendError::Refused)?;
        let part = r.map_or(data.clone(), |r| {
            data.slice(r.start as usize..r.end as usize)
        });
        Ok((
            GetObject {
                meta,
                body: self.body(part),
            },
            r,
        ))
    }
}

#[async_trait]
impl Backend for Mem {
    async fn list_buckets(&self) -> Result<Vec<BucketInfo>> {
        Ok(Vec::new())
    }
    async fn create_bucket(&self, _: &str) -> Result<()> {
        Ok(())
    }
    async fn head_bucket(&self, _: &str) -> Result<()> {
        Ok(())
    }
    async fn delete_bucket(&self, _: &str) -> Result<()> {
        Ok(())
    }
    async fn put_object(
        &self,
        _: &str,
        key: &str,
        mut body: ByteStream,
        _: PutOptions,
    ) -> Result<ObjectMeta> {
        let mut data = Vec::new();
        while let Some(chunk) = body.next().await {
            data.extend_from_slice(&chunk.map_err(BackendError::Body)?);
        }
        let data = Bytes::from(data);
        let meta = Mem::meta(&data);
        self.objects.locked().insert(key.to_owned(), data);
        Ok(meta)
    }
    async fn delete_object(&self, _: &str, key: &str) -> Result<()> {
        self.objects.locked().remove(key);
        Ok(())
    }
    async fn list_objects(&self, _: &str, q: &ListQuery) -> Result<ListPage> {
        let objects = self.objects.locked();
        let mut page = ListPage::default();
        let after = q.after.as_deref().unwrap_or("");
        for (key, data) in objects.range::<str, _>((Bound::Excluded(after), Bound::Unbounded)) {
            if !key.starts_with(&q.prefix) {
                continue;
            }
            if page.objects.len() == q.max_keys {
                page.is_truncated = true;
                break;
            }
            let meta = Mem::meta(data);
            page.objects.push(ObjectEntry {
                key: key.clone(),
                size: meta.size,
                etag: meta.etag,
                last_modified: meta.last_modified,
            });
            page.last = Some(key.clone());
        }
        Ok(page)
    }
    async fn create_multipart(&self, _: &str, _: &str, _: PutOptions) -> Result<String> {
        Err(BackendError::Unavailable("not in this test".into()))
    }
    async fn upload_part(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: u32,
        _: ByteStream,
        _: PutOptions,
    ) -> Result<PartInfo> {
        Err(BackendError::Unavailable("not in this test".into()))
    }
    async fn list_parts(&self, _: &str, _: &str, _: &str) -> Result<Vec<PartInfo>> {
        Ok(Vec::new())
    }
    async fn complete_multipart(
        &self,
        _: &str,
        _: &str,
        _: &str,
        _: &[(u32, String)],
        _: &[Header],
    ) -> Result<ObjectMeta> {
        Err(BackendError::Unavailable("not in this test".into()))
    }
    async fn abort_multipart(&self, _: &str, _: &str, _: &str) -> Result<()> {
        Ok(())
    }
    async fn list_uploads(&self, _: &str, _: &str) -> Result<Vec<UploadInfo>> {
        Ok(Vec::new())
    }
}
