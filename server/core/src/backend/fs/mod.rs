//! The local-directory backend: each sub-folder of the root is a bucket, each key a file
//! (see `keypath` for the few keys that cannot be plain paths).
//!
//! Writes go to `<root>/.granary/tmp/`, are fsynced, get their metadata (ETag, stored
//! headers) as the extended attribute `user.granary.meta`, and are renamed into place, so
//! a reader sees the old object or the new one, never a mix. Multipart uploads live under
//! `<root>/.granary/uploads/<id>/` until completed. Files dropped into the tree by hand
//! have no stored metadata: their ETag is derived from size and mtime.
//!
//! `meta` keeps an object's metadata with its file, `list` pages through a bucket in
//! key order, `multipart` keeps uploads in progress and completes them.

mod list;
mod meta;
mod multipart;
#[cfg(test)]
mod tests;

use granary_proto::Header;
use list::{list_sync, Listings};

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use md5::{Digest, Md5};
use tokio::sync::mpsc;

use super::keypath;
use super::{
    bucket_name_rule, check_key, known_bucket, valid_bucket_name, Backend, BackendError,
    BucketInfo, ByteRange, ByteStream, GetObject, ListPage, ListQuery, ObjectMeta, ObjectParts,
    PartInfo, PutOptions, RangeFn, Result, Source, UploadInfo,
};
use crate::sync::Locked;

/// Bytes gathered from the request body before one write to disk.
const WRITE_CHUNK: usize = 1 << 20;
/// Bytes per read when streaming a file out.
const READ_CHUNK: usize = 256 << 10;
/// Striped locks serialise writers of one key (commit and delete).
const LOCK_STRIPES: usize = 64;

pub struct FsBackend {
    inner: Arc<Inner>,
}

struct Inner {
    root: PathBuf,
    tmp: PathBuf,
    uploads: PathBuf,
    xattr_ok: AtomicBool,
    locks: Vec<std::sync::Mutex<()>>,
    /// Folders' entries in key order, kept between the pages of a listing.
    listings: Listings,
}

/// The backend's own folder under the root (temp files, multipart uploads).
const RESERVED: &str = ".granary";

/// Logs each folder of `root` that is not served as a bucket, with the S3 rule its name
/// breaks: a folder that silently vanished from ListBuckets would look like lost data.
fn say_unserved_folders(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name();
        let rule = match name.to_str() {
            Some(RESERVED) => continue,
            Some(name) => match bucket_name_rule(name) {
                Some(rule) => rule,
                None => continue,
            },
            None => "a bucket name is UTF-8",
        };
        tracing::warn!(
            folder = %entry.path().display(),
            "not served as a bucket: {rule}"
        );
    }
}

impl FsBackend {
    /// Opens (creating if needed) a backend rooted at `root` and clears temp files left
    /// by an earlier run. Only old ones: the members of a cluster may share the
    /// directory (a network file system), and another member's write in progress has
    /// its temp file there.
    pub fn open(root: &Path) -> io::Result<FsBackend> {
        fs::create_dir_all(root)?;
        let root = root.canonicalize()?;
        say_unserved_folders(&root);
        let tmp = root.join(RESERVED).join("tmp");
        let uploads = root.join(RESERVED).join("uploads");
        fs::create_dir_all(&tmp)?;
        clear_stale_temps(&tmp, STALE_TEMP);
        fs::create_dir_all(&uploads)?;
        let inner = Inner {
            root,
            tmp,
            uploads,
            xattr_ok: AtomicBool::new(true),
            locks: (0..LOCK_STRIPES)
                .map(|_| std::sync::Mutex::new(()))
                .collect(),
            listings: Listings::new(),
        };
        Ok(FsBackend {
            inner: Arc::new(inner),
        })
    }

    #[cfg(test)]
    pub fn root(&self) -> &Path {
        &self.inner.root
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Inner) -> Result<T> + Send + 'static,
    {
        let inner = self.inner.clone();
        tokio::task::spawn_blocking(move || f(&inner))
            .await
            .map_err(|e| BackendError::Io(io::Error::other(e)))?
    }

    /// Streams `body` into a new temp file, returning it with the MD5 and length of what
    /// was written. The file is removed if anything fails or the future is dropped.
    async fn receive(
        &self,
        mut body: ByteStream,
        dir: PathBuf,
    ) -> Result<(TempFile, [u8; 16], u64)> {
        let path = dir.join(format!("tmp-{}", uuid::Uuid::new_v4().simple()));
        let temp = TempFile::create(path).map_err(BackendError::Io)?;
        let file = temp.file.try_clone().map_err(BackendError::Io)?;
        let (tx, mut rx) = mpsc::channel::<Bytes>(4);
        let writer = tokio::task::spawn_blocking(move || -> io::Result<([u8; 16], u64)> {
            let mut file = file;
            let mut md5 = Md5::new();
            let mut n = 0u64;
            while let Some(chunk) = rx.blocking_recv() {
                md5.update(&chunk);
                file.write_all(&chunk)?;
                n += chunk.len() as u64;
            }
            file.sync_data()?;
            Ok((md5.finalize().into(), n))
        });
        let mut buf = BytesMut::with_capacity(WRITE_CHUNK);
        let mut failed = None;
        while let Some(item) = body.next().await {
            match item {
                Ok(chunk) => {
                    buf.extend_from_slice(&chunk);
                    if buf.len() >= WRITE_CHUNK {
                        let full = buf.split().freeze();
                        if tx.send(full).await.is_err() {
                            break;
                        }
                        buf.reserve(WRITE_CHUNK);
                    }
                }
                Err(e) => {
                    failed = Some(BackendError::Body(e));
                    break;
                }
            }
        }
        if failed.is_none() && !buf.is_empty() {
            let _ = tx.send(buf.freeze()).await;
        }
        drop(tx);
        let written = writer
            .await
            .map_err(|e| BackendError::Io(io::Error::other(e)))?;
        if let Some(e) = failed {
            return Err(e);
        }
        let (md5, n) = written?;
        Ok((temp, md5, n))
    }
}

/// How old a temp file must be for a starting node to take it for a crashed write's.
const STALE_TEMP: std::time::Duration = std::time::Duration::from_secs(3600);

/// Removes the files in `dir` not modified for `age`.
fn clear_stale_temps(dir: &Path, age: std::time::Duration) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let old = e
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|a| a >= age);
        if old {
            let _ = fs::remove_file(e.path());
        }
    }
}

/// A temp file removed on drop unless it was renamed into place.
struct TempFile {
    path: PathBuf,
    file: File,
    kept: bool,
}

impl TempFile {
    fn create(path: PathBuf) -> io::Result<TempFile> {
        let file = fs::OpenOptions::new()
            .write(true)
            .read(true)
            .create_new(true)
            .open(&path)?;
        Ok(TempFile {
            path,
            file,
            kept: false,
        })
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.kept {
            let _ = fs::remove_file(&self.path);
        }
    }
}

fn key_stripe(key: &str) -> usize {
    // FNV-1a: only needs to spread keys over the stripes within one process.
    let mut h: u64 = 0xcbf29ce484222325;
    for b in key.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    (h % LOCK_STRIPES as u64) as usize
}

impl Inner {
    fn bucket_dir(&self, bucket: &str) -> Result<PathBuf> {
        if let Err(none) = known_bucket(bucket) {
            // A folder that is there but breaks the rules is said to be so, not missing.
            return Err(match self.unserved_folder(bucket) {
                Some(rule) => BackendError::InvalidBucketName {
                    bucket: bucket.to_owned(),
                    rule: rule.to_owned(),
                },
                None => none,
            });
        }
        let dir = self.root.join(bucket);
        match fs::metadata(&dir) {
            Ok(md) if md.is_dir() => Ok(dir),
            Ok(_) => Err(BackendError::NoSuchBucket(bucket.to_owned())),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(BackendError::NoSuchBucket(bucket.to_owned()))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The S3 rule a folder of the root named `name` breaks, where there is one: a
    /// folder that is not served as a bucket. Names that are no single folder of the
    /// root (`.`, `..`, anything with a `/`), and the backend's own folder, name none.
    fn unserved_folder(&self, name: &str) -> Option<&'static str> {
        if matches!(name, "" | "." | ".." | RESERVED) || name.contains(['/', '\0']) {
            return None;
        }
        let rule = bucket_name_rule(name)?;
        let md = fs::symlink_metadata(self.root.join(name)).ok()?;
        md.is_dir().then_some(rule)
    }

    /// The file of `bucket/key`, open, and its metadata.
    fn open_object(&self, bucket: &str, key: &str) -> Result<(File, fs::Metadata)> {
        check_key(key)?;
        let dir = self.bucket_dir(bucket)?;
        let path = self
            .locate(&dir, key)
            .ok_or_else(|| BackendError::NoSuchKey(key.to_owned()))?;
        let file = File::open(&path).map_err(|_| BackendError::NoSuchKey(key.to_owned()))?;
        let md = file.metadata()?;
        Ok((file, md))
    }

    /// The file holding `key`, if any.
    fn locate(&self, bucket_dir: &Path, key: &str) -> Option<PathBuf> {
        if let Some(rel) = keypath::plain_path(key) {
            let p = bucket_dir.join(rel);
            if fs::metadata(&p).is_ok_and(|m| m.is_file()) {
                return Some(p);
            }
        }
        let p = bucket_dir.join(keypath::escaped_path(key));
        fs::metadata(&p).is_ok_and(|m| m.is_file()).then_some(p)
    }

    /// Moves a finished temp file to `key`'s place: the plain path when it is free of
    /// conflicts, else the escaped one. Removes the key's copy at the other place.
    fn commit(&self, bucket_dir: &Path, key: &str, mut temp: TempFile) -> io::Result<()> {
        let _guard = self.locks[key_stripe(key)].locked();
        let escaped = bucket_dir.join(keypath::escaped_path(key));
        if let Some(rel) = keypath::plain_path(key) {
            let dst = bucket_dir.join(rel);
            match rename_into(&temp.path, &dst) {
                Ok(()) => {
                    temp.kept = true;
                    remove_and_prune(&escaped, bucket_dir);
                    self.listings.changed();
                    sync_parent(&dst);
                    return Ok(());
                }
                Err(e) if blocked(&e) => {}
                Err(e) => return Err(e),
            }
        }
        rename_into(&temp.path, &escaped)?;
        temp.kept = true;
        self.listings.changed();
        sync_parent(&escaped);
        Ok(())
    }
}

fn blocked(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTDIR | libc::EISDIR | libc::EEXIST | libc::ENOTEMPTY)
    )
}

/// Renames `src` to `dst`, creating `dst`'s folders; retries once if a concurrent delete
/// pruned a folder in between.
fn rename_into(src: &Path, dst: &Path) -> io::Result<()> {
    for attempt in 0..3 {
        if let Some(parent) = dst.parent() {
            fs::create_dir_all(parent)?;
        }
        match fs::rename(src, dst) {
            Err(e) if e.kind() == io::ErrorKind::NotFound && attempt < 2 => continue,
            other => return other,
        }
    }
    unreachable!("the loop returns on its last attempt")
}

fn sync_parent(path: &Path) {
    if let Some(parent) = path.parent() {
        if let Ok(dir) = File::open(parent) {
            let _ = dir.sync_all();
        }
    }
}

/// Removes a file and then its folders up to (not including) `stop` while they are empty.
fn remove_and_prune(path: &Path, stop: &Path) {
    if fs::remove_file(path).is_err() {
        return;
    }
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d == stop || !d.starts_with(stop) || fs::remove_dir(d).is_err() {
            break;
        }
        dir = d.parent();
    }
}

#[async_trait]
impl Source for FsBackend {
    fn describe(&self) -> String {
        format!("fs:{}", self.inner.root.display())
    }

    async fn head_object(&self, bucket: &str, key: &str) -> Result<ObjectMeta> {
        let (bucket, key) = (bucket.to_owned(), key.to_owned());
        self.blocking(move |inner| {
            let (file, md) = inner.open_object(&bucket, &key)?;
            Ok(inner.read_meta(&file, &md))
        })
        .await
    }

    async fn parts_of(&self, bucket: &str, key: &str) -> Result<Option<ObjectParts>> {
        let (bucket, key) = (bucket.to_owned(), key.to_owned());
        self.blocking(move |inner| {
            let (file, md) = inner.open_object(&bucket, &key)?;
            let meta = inner.read_meta(&file, &md);
            let parts = match inner.stored_meta(&file, &md) {
                Some(s) if !s.parts.is_empty() => {
                    let mut checksums = s.part_checksums.into_iter();
                    s.parts
                        .into_iter()
                        .map(|size| (size, checksums.next().flatten()))
                        .collect()
                }
                // Not from parts: one part, the whole object.
                _ if !meta.etag.contains('-') => vec![(meta.size, None)],
                _ => return Ok(None),
            };
            let checksum_type = meta
                .headers
                .iter()
                .find(|h| h.name == "x-amz-checksum-type")
                .map(|h| h.value.clone());
            Ok(Some(ObjectParts {
                etag: meta.etag,
                parts,
                checksum_type,
            }))
        })
        .await
    }

    async fn get_object(
        &self,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<(GetObject, Option<ByteRange>)> {
        let (bucket, k) = (bucket.to_owned(), key.to_owned());
        let (file, meta) = self
            .blocking(move |inner| {
                let (file, md) = inner.open_object(&bucket, &k)?;
                let meta = inner.read_meta(&file, &md);
                Ok((file, meta))
            })
            .await?;
        let resolved = range(&meta).map_err(BackendError::Refused)?;
        let (start, len) = match resolved {
            Some(r) => (r.start, r.len()),
            None => (0, meta.size),
        };
        let body = read_stream(file, start, len);
        Ok((GetObject { meta, body }, resolved))
    }
}

#[async_trait]
impl Backend for FsBackend {
    async fn list_buckets(&self) -> Result<Vec<BucketInfo>> {
        self.blocking(|inner| {
            let mut out = Vec::new();
            for entry in fs::read_dir(&inner.root)? {
                let entry = entry?;
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                if !valid_bucket_name(&name) || !entry.file_type()?.is_dir() {
                    continue;
                }
                let md = entry.metadata()?;
                let created = md
                    .created()
                    .or_else(|_| md.modified())
                    .unwrap_or(UNIX_EPOCH);
                out.push(BucketInfo { name, created });
            }
            out.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(out)
        })
        .await
    }

    async fn create_bucket(&self, bucket: &str) -> Result<()> {
        let bucket = bucket.to_owned();
        self.blocking(move |inner| {
            if !valid_bucket_name(&bucket) {
                return Err(BackendError::invalid_bucket(&bucket, ""));
            }
            match fs::create_dir(inner.root.join(&bucket)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    Err(BackendError::BucketExists(bucket))
                }
                Err(e) => Err(e.into()),
            }
        })
        .await
    }

    async fn head_bucket(&self, bucket: &str) -> Result<()> {
        let bucket = bucket.to_owned();
        self.blocking(move |inner| inner.bucket_dir(&bucket).map(|_| ()))
            .await
    }

    async fn delete_bucket(&self, bucket: &str) -> Result<()> {
        let bucket = bucket.to_owned();
        self.blocking(move |inner| {
            let dir = inner.bucket_dir(&bucket)?;
            let any = ListQuery {
                max_keys: 1,
                ..ListQuery::default()
            };
            if !list_sync(&inner.listings, &dir, &any).0.objects.is_empty() {
                return Err(BackendError::BucketNotEmpty(bucket));
            }
            fs::remove_dir_all(&dir)?;
            inner.listings.changed();
            Ok(())
        })
        .await
    }

    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<ObjectMeta> {
        check_key(key)?;
        let bucket_dir = {
            let b = bucket.to_owned();
            self.blocking(move |inner| inner.bucket_dir(&b)).await?
        };
        let (temp, md5, size) = self.receive(body, self.inner.tmp.clone()).await?;
        check_written(&opts, &md5, size)?;
        let key = key.to_owned();
        self.blocking(move |inner| {
            let etag = hex::encode(md5);
            let last_modified =
                inner.write_meta(&temp, etag.clone(), opts.headers.clone(), Vec::new())?;
            inner.commit(&bucket_dir, &key, temp)?;
            Ok(ObjectMeta {
                size,
                etag,
                last_modified,
                headers: opts.headers,
            })
        })
        .await
    }

    async fn delete_object(&self, bucket: &str, key: &str) -> Result<()> {
        let (bucket, key) = (bucket.to_owned(), key.to_owned());
        self.blocking(move |inner| {
            check_key(&key)?;
            let dir = inner.bucket_dir(&bucket)?;
            let _guard = inner.locks[key_stripe(&key)].locked();
            if let Some(path) = inner.locate(&dir, &key) {
                remove_and_prune(&path, &dir);
                inner.listings.changed();
            }
            Ok(())
        })
        .await
    }

    async fn list_objects(&self, bucket: &str, query: &ListQuery) -> Result<ListPage> {
        self.list_page(bucket, query).await
    }

    async fn create_multipart(&self, bucket: &str, key: &str, opts: PutOptions) -> Result<String> {
        self.start_upload(bucket, key, opts).await
    }

    async fn upload_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<PartInfo> {
        self.put_part(bucket, key, upload_id, part, body, opts)
            .await
    }

    async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> Result<Vec<PartInfo>> {
        self.upload_parts(bucket, key, upload_id).await
    }

    async fn complete_multipart(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        headers: &[Header],
    ) -> Result<ObjectMeta> {
        self.complete_upload(bucket, key, upload_id, parts, headers)
            .await
    }

    async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        self.abort_upload(bucket, key, upload_id).await
    }

    async fn list_uploads(&self, bucket: &str, prefix: &str) -> Result<Vec<UploadInfo>> {
        self.uploads_in(bucket, prefix).await
    }
}

/// Checks a finished write against the request's Content-MD5 and length.
fn check_written(opts: &PutOptions, md5: &[u8; 16], size: u64) -> Result<()> {
    if let Some(want) = opts.expected_md5 {
        if &want != md5 {
            return Err(BackendError::BadDigest(
                "the Content-MD5 you specified did not match what we received".into(),
            ));
        }
    }
    if let Some(want) = opts.size {
        if want != size {
            return Err(BackendError::IncompleteBody(format!(
                "expected {want} bytes, received {size}"
            )));
        }
    }
    Ok(())
}

/// Streams `len` bytes of `file` from `start`, reading on the blocking pool.
fn read_stream(file: File, start: u64, len: u64) -> ByteStream {
    let stream = async_stream::try_stream! {
        let mut file = Some(file);
        let mut pos = start;
        let end = start + len;
        while pos < end {
            let want = (end - pos).min(READ_CHUNK as u64) as usize;
            let f = file.take().expect("file is returned after each read");
            let (f, chunk) = tokio::task::spawn_blocking(move || -> io::Result<(File, Bytes)> {
                let buf = crate::io::read_up_to(&f, pos, want)?;
                Ok((f, buf))
            })
            .await
            .map_err(io::Error::other)??;
            if chunk.is_empty() {
                // The file shrank under us: end with an error, never a short success.
                Err(io::Error::new(io::ErrorKind::UnexpectedEof, "object truncated while reading"))?;
            }
            pos += chunk.len() as u64;
            file = Some(f);
            yield chunk;
        }
    };
    Box::pin(stream)
}
