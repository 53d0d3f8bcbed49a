//! The local-directory backend: each sub-folder of the root is a bucket, each key a file
//! (see `keypath` for the few keys that cannot be plain paths).
//!
//! Writes go to `<root>/.granary/tmp/`, are fsynced, get their metadata (ETag, stored
//! headers) as the extended attribute `user.granary.meta`, and are renamed into place, so
//! a reader sees the old object or the new one, never a mix. Multipart uploads live under
//! `<root>/.granary/uploads/<id>/` until completed. Files dropped into the tree by hand
//! have no stored metadata: their ETag is derived from size and mtime.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use bytes::{Bytes, BytesMut};
use futures::StreamExt;
use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

use super::keypath::{self, ESCAPE_DIR};
use super::{
    check_key, known_bucket, valid_bucket_name, Backend, BackendError, BucketInfo, ByteRange,
    ByteStream, GetObject, ListPage, ListQuery, ObjectEntry, ObjectMeta, ObjectParts, PartInfo,
    PutOptions, RangeFn, Result, Source, UploadInfo,
};

const META_XATTR: &str = "user.granary.meta";
/// A part's checksum as it was uploaded: `x-amz-checksum-sha256:VALUE`.
const PART_CHECKSUM_XATTR: &str = "user.granary.checksum";
/// Bytes gathered from the request body before one write to disk.
const WRITE_CHUNK: usize = 1 << 20;
/// Bytes per read when streaming a file out.
const READ_CHUNK: usize = 256 << 10;
/// S3's smallest part other than the last.
const MIN_PART_SIZE: u64 = 5 << 20;
/// Striped locks serialise writers of one key (commit and delete).
const LOCK_STRIPES: usize = 64;

/// Metadata stored with an object written through Granary.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredMeta {
    etag: String,
    size: u64,
    /// The file's mtime when the metadata was written; a file rewritten by hand since
    /// no longer matches and is treated as foreign.
    mtime_ns: u128,
    #[serde(default)]
    headers: Vec<(String, String)>,
    /// An object completed from parts: their sizes, in order (for `?partNumber=`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    parts: Vec<u64>,
    /// And the checksums they were uploaded with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    part_checksums: Vec<Option<(String, String)>>,
}

/// What a multipart upload records at creation.
#[derive(Debug, Serialize, Deserialize)]
struct UploadRecord {
    bucket: String,
    key: String,
    headers: Vec<(String, String)>,
    initiated_ns: u128,
}

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

impl FsBackend {
    /// Opens (creating if needed) a backend rooted at `root` and clears temp files left
    /// by an earlier run. Only old ones: the members of a cluster may share the
    /// directory (a network file system), and another member's write in progress has
    /// its temp file there.
    pub fn open(root: &Path) -> io::Result<FsBackend> {
        fs::create_dir_all(root)?;
        let root = root.canonicalize()?;
        let tmp = root.join(".granary").join("tmp");
        let uploads = root.join(".granary").join("uploads");
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

fn mtime_ns(md: &fs::Metadata) -> u128 {
    md.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

fn from_ns(ns: u128) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns.min(u64::MAX as u128) as u64)
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
        known_bucket(bucket)?;
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

    /// The metadata written with the file, if it still describes it.
    fn stored_meta(&self, file: &File, md: &fs::Metadata) -> Option<StoredMeta> {
        if !self.xattr_ok.load(Ordering::Relaxed) {
            return None;
        }
        use xattr::FileExt;
        file.get_xattr(META_XATTR)
            .ok()
            .flatten()
            .and_then(|v| serde_json::from_slice::<StoredMeta>(&v).ok())
            .filter(|m| m.size == md.len() && m.mtime_ns == mtime_ns(md))
    }

    fn read_meta(&self, file: &File, md: &fs::Metadata) -> ObjectMeta {
        let stored = self.stored_meta(file, md);
        let last_modified = md.modified().unwrap_or(UNIX_EPOCH);
        match stored {
            Some(m) => ObjectMeta {
                size: m.size,
                etag: m.etag,
                last_modified,
                headers: m.headers,
            },
            None => ObjectMeta {
                size: md.len(),
                etag: foreign_etag(md),
                last_modified,
                headers: Vec::new(),
            },
        }
    }

    fn write_meta(
        &self,
        temp: &TempFile,
        etag: String,
        headers: Vec<(String, String)>,
        parts: Vec<PartInfo>,
    ) -> io::Result<SystemTime> {
        let md = temp.file.metadata()?;
        if self.xattr_ok.load(Ordering::Relaxed) {
            use xattr::FileExt;
            let stored = StoredMeta {
                etag,
                size: md.len(),
                mtime_ns: mtime_ns(&md),
                headers,
                part_checksums: if parts.iter().any(|p| p.checksum.is_some()) {
                    parts.iter().map(|p| p.checksum.clone()).collect()
                } else {
                    Vec::new()
                },
                parts: parts.iter().map(|p| p.size).collect(),
            };
            let value = serde_json::to_vec(&stored).map_err(io::Error::other)?;
            if let Err(e) = temp.file.set_xattr(META_XATTR, &value) {
                if e.raw_os_error() == Some(libc::ENOTSUP) {
                    tracing::warn!(
                        root = %self.root.display(),
                        "file system refuses user xattrs: ETags and stored headers of new objects are not kept"
                    );
                    self.xattr_ok.store(false, Ordering::Relaxed);
                } else {
                    return Err(e);
                }
            }
        }
        Ok(md.modified().unwrap_or_else(|_| SystemTime::now()))
    }

    /// Moves a finished temp file to `key`'s place: the plain path when it is free of
    /// conflicts, else the escaped one. Removes the key's copy at the other place.
    fn commit(&self, bucket_dir: &Path, key: &str, mut temp: TempFile) -> io::Result<()> {
        let _guard = self.locks[key_stripe(key)]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
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

    fn upload_dir(&self, upload_id: &str) -> Result<PathBuf> {
        let ok = upload_id.len() == 32 && upload_id.bytes().all(|c| c.is_ascii_hexdigit());
        if !ok {
            return Err(BackendError::NoSuchUpload(upload_id.to_owned()));
        }
        let dir = self.uploads.join(upload_id);
        if dir.is_dir() {
            Ok(dir)
        } else {
            Err(BackendError::NoSuchUpload(upload_id.to_owned()))
        }
    }

    fn upload_record(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<(PathBuf, UploadRecord)> {
        let dir = self.upload_dir(upload_id)?;
        let rec: UploadRecord = fs::read(dir.join("upload.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .ok_or_else(|| BackendError::NoSuchUpload(upload_id.to_owned()))?;
        if rec.bucket != bucket || rec.key != key {
            return Err(BackendError::NoSuchUpload(upload_id.to_owned()));
        }
        Ok((dir, rec))
    }

    fn parts(&self, dir: &Path) -> io::Result<Vec<(PartInfo, PathBuf)>> {
        let mut parts: Vec<(PartInfo, PathBuf)> = Vec::new();
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            let Some((num, etag)) = name.split_once('.') else {
                continue;
            };
            let Ok(number) = num.parse::<u32>() else {
                continue;
            };
            let md = entry.metadata()?;
            let checksum = xattr::get(entry.path(), PART_CHECKSUM_XATTR)
                .ok()
                .flatten()
                .and_then(|v| String::from_utf8(v).ok())
                .and_then(|v| {
                    let (name, value) = v.split_once(':')?;
                    Some((name.to_owned(), value.to_owned()))
                });
            parts.push((
                PartInfo {
                    number,
                    etag: etag.to_owned(),
                    size: md.len(),
                    last_modified: md.modified().unwrap_or(UNIX_EPOCH),
                    checksum,
                },
                entry.path(),
            ));
        }
        // A part uploaded twice keeps its newest copy.
        parts.sort_by(|a, b| {
            a.0.number
                .cmp(&b.0.number)
                .then(b.0.last_modified.cmp(&a.0.last_modified))
        });
        parts.dedup_by_key(|p| p.0.number);
        Ok(parts)
    }
}

/// ETag of a file that has no stored metadata: stable while size and mtime are.
fn foreign_etag(md: &fs::Metadata) -> String {
    let mut h = Md5::new();
    h.update(md.len().to_le_bytes());
    h.update(mtime_ns(md).to_le_bytes());
    hex::encode(h.finalize())
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

/// The object key of `path`, a file under `bucket_dir`.
fn key_of(bucket_dir: &Path, path: &Path) -> Option<String> {
    let rel = path.strip_prefix(bucket_dir).ok()?;
    let comps: Option<Vec<&str>> = rel
        .components()
        .map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect();
    let comps = comps?;
    if comps.first() == Some(&ESCAPE_DIR) {
        keypath::decode_escaped(comps[1..].iter().copied())
    } else {
        keypath::plain_key(comps.iter().copied())
    }
}

/// Every file under `dir`, reserved names included.
fn walk_all(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let Ok(ft) = entry.file_type() else { continue };
        if ft.is_dir() {
            walk_all(&entry.path(), out);
        } else {
            out.push(entry.path());
        }
    }
}

/// Folders' entries in key order, kept between the pages of a listing so that a page
/// costs its own keys and a binary search, not the whole folder: a 100,000-key folder is
/// read and sorted once, not once per page. An entry is used while the folder's mtime is
/// the same and no write through this backend happened since (`changed`); a folder
/// changed in the last second is not kept (mtimes are coarser than writes).
struct Listings {
    folders: moka::sync::Cache<PathBuf, (SystemTime, u64, Sorted)>,
    generation: std::sync::atomic::AtomicU64,
}

/// A folder's entries in key order: each name, with `/` after a folder's (so that `a/…`
/// sorts after `a-b`, as the keys do), and whether it is a folder.
type Sorted = Arc<Vec<(String, bool)>>;

/// Memory for kept folder listings.
const LISTINGS_CAPACITY: u64 = 64 << 20;

impl Listings {
    fn new() -> Listings {
        Listings {
            folders: moka::sync::Cache::builder()
                .max_capacity(LISTINGS_CAPACITY)
                .weigher(|_, (_, _, v): &(SystemTime, u64, Sorted)| {
                    let bytes: usize = v.iter().map(|(n, _)| n.len() + 32).sum();
                    bytes.try_into().unwrap_or(u32::MAX)
                })
                .build(),
            generation: Default::default(),
        }
    }

    /// A key was written or removed through this backend (after the rename or unlink).
    fn changed(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
    }

    /// `dir`'s entries in key order (reserved names left out); `None` when it cannot
    /// be read.
    fn sorted(&self, dir: &Path) -> Option<Sorted> {
        let generation = self.generation.load(Ordering::Acquire);
        let mtime = fs::metadata(dir).and_then(|m| m.modified()).ok()?;
        if let Some((m, g, v)) = self.folders.get(dir) {
            if m == mtime && g == generation {
                return Some(v);
            }
        }
        let mut v = Vec::new();
        for entry in fs::read_dir(dir).ok()?.flatten() {
            let Ok(ft) = entry.file_type() else { continue };
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.starts_with(keypath::RESERVED) {
                continue;
            }
            if ft.is_dir() {
                v.push((format!("{name}/"), true));
            } else if ft.is_file() || (ft.is_symlink() && entry.path().is_file()) {
                v.push((name.to_owned(), false));
            }
        }
        v.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let v = Arc::new(v);
        let settled = SystemTime::now()
            .duration_since(mtime)
            .is_ok_and(|age| age > Duration::from_secs(1));
        if settled {
            self.folders
                .insert(dir.to_path_buf(), (mtime, generation, v.clone()));
        }
        Some(v)
    }
}

/// What the page wants next.
#[derive(PartialEq, Eq)]
enum Flow {
    More,
    Full,
}

/// One page being built from keys handed over in order.
struct PageBuilder<'q> {
    q: &'q ListQuery,
    delim: Option<&'q str>,
    /// Keys at or before this one are not wanted.
    after: Option<&'q str>,
    /// Keys under this common prefix are rolled up already.
    rolled: Option<String>,
    page: ListPage,
    paths: Vec<PathBuf>,
    count: usize,
}

impl<'q> PageBuilder<'q> {
    fn new(q: &'q ListQuery) -> PageBuilder<'q> {
        let delim = q.delimiter.as_deref().filter(|d| !d.is_empty());
        let after = q.after.as_deref();
        // Resuming after a rolled-up common prefix: every key under it is skipped.
        let rolled = after
            .filter(|a| a.len() > q.prefix.len() && delim.is_some_and(|d| a.ends_with(d)))
            .map(str::to_owned);
        PageBuilder {
            q,
            delim,
            after,
            rolled,
            page: ListPage::default(),
            paths: Vec::new(),
            count: 0,
        }
    }

    /// Whether no key starting with `s` is wanted (the whole folder can be passed by).
    fn passes(&self, s: &str) -> bool {
        self.rolled.as_deref().is_some_and(|cp| s.starts_with(cp))
            || self.after.is_some_and(|a| s < a && !a.starts_with(s))
    }

    fn push(&mut self, key: String, path: PathBuf) -> Flow {
        if !key.starts_with(&self.q.prefix)
            || self.after.is_some_and(|a| key.as_str() <= a)
            || self.rolled.as_deref().is_some_and(|cp| key.starts_with(cp))
        {
            return Flow::More;
        }
        if self.count == self.q.max_keys {
            self.page.is_truncated = true;
            return Flow::Full;
        }
        if let Some(d) = self.delim {
            if let Some(i) = key[self.q.prefix.len()..].find(d) {
                let cp = key[..self.q.prefix.len() + i + d.len()].to_owned();
                self.page.common_prefixes.push(cp.clone());
                self.page.last = Some(cp.clone());
                self.rolled = Some(cp);
                self.count += 1;
                return Flow::More;
            }
        }
        self.page.objects.push(ObjectEntry {
            key: key.clone(),
            size: 0,
            etag: String::new(),
            last_modified: UNIX_EPOCH,
        });
        self.paths.push(path);
        self.page.last = Some(key);
        self.count += 1;
        Flow::More
    }
}

/// The page, fed plain keys in order and merging the escaped ones in (few; a key at both
/// places briefly counts once, the plain copy, as in `locate`).
struct Merge<'q> {
    b: PageBuilder<'q>,
    escaped: std::iter::Peekable<std::vec::IntoIter<(String, PathBuf)>>,
}

impl Merge<'_> {
    fn visit(&mut self, key: String, path: PathBuf) -> Flow {
        while let Some((k, _)) = self.escaped.peek() {
            if *k > key {
                break;
            }
            let (k, p) = self.escaped.next().expect("peeked");
            if k != key && self.b.push(k, p) == Flow::Full {
                return Flow::Full;
            }
        }
        self.b.push(key, path)
    }
}

/// Hands the plain keys under `dir` (whose key prefix is `rel`) that the page may want to
/// `m`, in key order, until it is full. Entries wholly before the prefix or the page's
/// start are passed by with a binary search, folders rolled up into a common prefix
/// without being read.
fn walk_ordered(listings: &Listings, dir: &Path, rel: &str, m: &mut Merge<'_>) -> Flow {
    let Some(entries) = listings.sorted(dir) else {
        return Flow::More;
    };
    let q = m.b.q;
    let prefix = q.prefix.as_str();
    // Entries whose keys all come before `bound` (and do not lead to it).
    let before = |bound: &str| {
        entries.partition_point(|(n, is_dir)| {
            let s = format!("{rel}{n}");
            if *is_dir {
                s.as_str() < bound && !bound.starts_with(&s)
            } else {
                s.as_str() < bound
            }
        })
    };
    let mut start = before(prefix);
    if let Some(a) = m.b.after {
        start = start.max(before(a));
    }
    for (name, is_dir) in &entries[start..] {
        let s = format!("{rel}{name}");
        if !s.starts_with(prefix) && !prefix.starts_with(&s) {
            // Past the prefix: so is every later entry.
            break;
        }
        if *is_dir {
            if m.b.passes(&s) {
                continue;
            }
            let path = dir.join(&name[..name.len() - 1]);
            if walk_ordered(listings, &path, &s, m) == Flow::Full {
                return Flow::Full;
            }
        } else if m.visit(s, dir.join(name)) == Flow::Full {
            return Flow::Full;
        }
    }
    Flow::More
}

/// One page of keys, with the file of each object on it: the plain keys in key order from
/// the page's start, merged with the escaped ones.
fn list_sync(listings: &Listings, bucket_dir: &Path, q: &ListQuery) -> (ListPage, Vec<PathBuf>) {
    let mut escaped = Vec::new();
    walk_all(&bucket_dir.join(ESCAPE_DIR), &mut escaped);
    let mut escaped: Vec<(String, PathBuf)> = escaped
        .into_iter()
        .filter_map(|p| key_of(bucket_dir, &p).map(|k| (k, p)))
        .filter(|(k, _)| k.starts_with(&q.prefix))
        .collect();
    escaped.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    let mut m = Merge {
        b: PageBuilder::new(q),
        escaped: escaped.into_iter().peekable(),
    };
    // Plain keys start at the deepest folder the prefix names.
    let (start, rel) = match q.prefix.rfind('/') {
        Some(i) => match keypath::plain_path(&q.prefix[..i]) {
            Some(p) => (bucket_dir.join(p), q.prefix[..=i].to_owned()),
            None => (bucket_dir.to_path_buf(), String::new()),
        },
        None => (bucket_dir.to_path_buf(), String::new()),
    };
    if walk_ordered(listings, &start, &rel, &mut m) == Flow::More {
        for (k, p) in m.escaped.by_ref() {
            if m.b.push(k, p) == Flow::Full {
                break;
            }
        }
    }
    (m.b.page, m.b.paths)
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
                .find(|(k, _)| k == "x-amz-checksum-type")
                .map(|(_, v)| v.clone());
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
                return Err(BackendError::InvalidBucketName(bucket));
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
            let _guard = inner.locks[key_stripe(&key)]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            if let Some(path) = inner.locate(&dir, &key) {
                remove_and_prune(&path, &dir);
                inner.listings.changed();
            }
            Ok(())
        })
        .await
    }

    async fn list_objects(&self, bucket: &str, query: &ListQuery) -> Result<ListPage> {
        let (bucket, query) = (bucket.to_owned(), query.clone());
        self.blocking(move |inner| {
            let dir = inner.bucket_dir(&bucket)?;
            let (mut page, paths) = list_sync(&inner.listings, &dir, &query);
            for (obj, path) in page.objects.iter_mut().zip(paths) {
                // A file deleted since the walk keeps its entry with size 0, as a
                // listing racing a delete may show on S3 too.
                if let Ok(file) = File::open(&path) {
                    if let Ok(md) = file.metadata() {
                        let meta = inner.read_meta(&file, &md);
                        obj.etag = meta.etag;
                        obj.size = meta.size;
                        obj.last_modified = meta.last_modified;
                    }
                }
            }
            Ok(page)
        })
        .await
    }

    async fn create_multipart(&self, bucket: &str, key: &str, opts: PutOptions) -> Result<String> {
        let (bucket, key) = (bucket.to_owned(), key.to_owned());
        self.blocking(move |inner| {
            check_key(&key)?;
            inner.bucket_dir(&bucket)?;
            let id = uuid::Uuid::new_v4().simple().to_string();
            let dir = inner.uploads.join(&id);
            fs::create_dir(&dir)?;
            let rec = UploadRecord {
                bucket,
                key,
                headers: opts.headers,
                initiated_ns: now_ns(),
            };
            fs::write(
                dir.join("upload.json"),
                serde_json::to_vec(&rec).map_err(io::Error::other)?,
            )?;
            Ok(id)
        })
        .await
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
        let (b, k, id) = (bucket.to_owned(), key.to_owned(), upload_id.to_owned());
        let dir = self
            .blocking(move |inner| inner.upload_record(&b, &k, &id).map(|(d, _)| d))
            .await?;
        let (temp, md5, size) = self.receive(body, dir.clone()).await?;
        check_written(&opts, &md5, size)?;
        let upload_id = upload_id.to_owned();
        let checksum = opts
            .headers
            .iter()
            .find(|(k, _)| k.starts_with("x-amz-checksum-"))
            .cloned();
        self.blocking(move |inner| {
            let mut temp = temp;
            let etag = hex::encode(md5);
            if let Some((name, value)) = &checksum {
                if inner.xattr_ok.load(Ordering::Relaxed) {
                    use xattr::FileExt;
                    // Best effort: a part without it has no checksum to combine.
                    let _ = temp
                        .file
                        .set_xattr(PART_CHECKSUM_XATTR, format!("{name}:{value}").as_bytes());
                }
            }
            let dst = dir.join(format!("{part}.{etag}"));
            fs::rename(&temp.path, &dst).map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    BackendError::NoSuchUpload(upload_id.clone())
                } else {
                    e.into()
                }
            })?;
            temp.kept = true;
            // Drop older copies of this part number.
            if let Ok(entries) = fs::read_dir(&dir) {
                for e in entries.flatten() {
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    if name
                        .split_once('.')
                        .is_some_and(|(n, t)| n == part.to_string() && t != etag)
                    {
                        let _ = fs::remove_file(e.path());
                    }
                }
            }
            Ok(PartInfo {
                number: part,
                etag,
                size,
                last_modified: SystemTime::now(),
                checksum,
            })
        })
        .await
    }

    async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> Result<Vec<PartInfo>> {
        let (b, k, id) = (bucket.to_owned(), key.to_owned(), upload_id.to_owned());
        self.blocking(move |inner| {
            let (dir, _) = inner.upload_record(&b, &k, &id)?;
            Ok(inner.parts(&dir)?.into_iter().map(|(p, _)| p).collect())
        })
        .await
    }

    async fn complete_multipart(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        headers: &[(String, String)],
    ) -> Result<ObjectMeta> {
        let (b, k, id) = (bucket.to_owned(), key.to_owned(), upload_id.to_owned());
        let wanted = parts.to_vec();
        let extra = headers.to_vec();
        self.blocking(move |inner| {
            let bucket_dir = inner.bucket_dir(&b)?;
            let (dir, rec) = inner.upload_record(&b, &k, &id)?;
            if wanted.is_empty() {
                return Err(BackendError::NoParts);
            }
            if wanted.windows(2).any(|w| w[0].0 >= w[1].0) {
                return Err(BackendError::InvalidPartOrder);
            }
            let have = inner.parts(&dir)?;
            let mut chosen = Vec::with_capacity(wanted.len());
            for (number, etag) in &wanted {
                let etag = etag.trim_matches('"');
                let found = have
                    .iter()
                    .find(|(p, _)| p.number == *number && p.etag == etag)
                    .ok_or(BackendError::InvalidPart(*number))?;
                chosen.push(found.clone());
            }
            let last = chosen.len() - 1;
            if chosen[..last].iter().any(|(p, _)| p.size < MIN_PART_SIZE) {
                return Err(BackendError::EntityTooSmall);
            }
            let temp = TempFile::create(
                inner
                    .tmp
                    .join(format!("tmp-{}", uuid::Uuid::new_v4().simple())),
            )?;
            let mut out = &temp.file;
            let mut md5s = Md5::new();
            let mut size = 0;
            for (p, path) in &chosen {
                let mut f = File::open(path)?;
                size += io::copy(&mut f, &mut out)?;
                md5s.update(hex::decode(&p.etag).map_err(io::Error::other)?);
            }
            temp.file.sync_data()?;
            let etag = format!("{}-{}", hex::encode(md5s.finalize()), chosen.len());
            let sizes = chosen.iter().map(|(p, _)| p.clone()).collect();
            let mut headers = rec.headers;
            headers.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
            headers.extend(extra);
            headers.sort();
            let last_modified = inner.write_meta(&temp, etag.clone(), headers.clone(), sizes)?;
            inner.commit(&bucket_dir, &k, temp)?;
            let _ = fs::remove_dir_all(&dir);
            Ok(ObjectMeta {
                size,
                etag,
                last_modified,
                headers,
            })
        })
        .await
    }

    async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()> {
        let (b, k, id) = (bucket.to_owned(), key.to_owned(), upload_id.to_owned());
        self.blocking(move |inner| {
            let (dir, _) = inner.upload_record(&b, &k, &id)?;
            fs::remove_dir_all(dir)?;
            Ok(())
        })
        .await
    }

    async fn list_uploads(&self, bucket: &str, prefix: &str) -> Result<Vec<UploadInfo>> {
        let (b, prefix) = (bucket.to_owned(), prefix.to_owned());
        self.blocking(move |inner| {
            inner.bucket_dir(&b)?;
            let mut out = Vec::new();
            for entry in fs::read_dir(&inner.uploads)?.flatten() {
                let Some(rec) = fs::read(entry.path().join("upload.json"))
                    .ok()
                    .and_then(|v| serde_json::from_slice::<UploadRecord>(&v).ok())
                else {
                    continue;
                };
                if rec.bucket == b && rec.key.starts_with(&prefix) {
                    out.push(UploadInfo {
                        key: rec.key,
                        upload_id: entry.file_name().to_string_lossy().into_owned(),
                        initiated: from_ns(rec.initiated_ns),
                    });
                }
            }
            out.sort_by(|a, b| a.key.cmp(&b.key).then(a.initiated.cmp(&b.initiated)));
            Ok(out)
        })
        .await
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

#[cfg(test)]
mod tests {
    use super::*;

    fn body(data: &'static [u8]) -> ByteStream {
        Box::pin(futures::stream::iter(vec![Ok(Bytes::from_static(data))]))
    }

    async fn read(b: &FsBackend, bucket: &str, key: &str) -> Vec<u8> {
        let (obj, _) = b.get_object(bucket, key, &|_| Ok(None)).await.unwrap();
        let mut out = Vec::new();
        let mut s = obj.body;
        while let Some(c) = s.next().await {
            out.extend_from_slice(&c.unwrap());
        }
        out
    }

    async fn keys(b: &FsBackend, bucket: &str, prefix: &str) -> Vec<String> {
        let q = ListQuery {
            prefix: prefix.into(),
            max_keys: 1000,
            ..ListQuery::default()
        };
        let page = b.list_objects(bucket, &q).await.unwrap();
        page.objects.into_iter().map(|o| o.key).collect()
    }

    /// What a listing must answer, from the keys alone (S3's rules).
    fn model(keys: &[String], q: &ListQuery) -> (Vec<String>, Vec<String>, bool) {
        let (mut objects, mut prefixes, mut n) = (Vec::new(), Vec::<String>::new(), 0);
        let delim = q.delimiter.as_deref().filter(|d| !d.is_empty());
        let after = q.after.as_deref();
        let rolled_after =
            after.filter(|a| a.len() > q.prefix.len() && delim.is_some_and(|d| a.ends_with(d)));
        for k in keys {
            if !k.starts_with(&q.prefix) || after.is_some_and(|a| k.as_str() <= a) {
                continue;
            }
            if rolled_after.is_some_and(|cp| k.starts_with(cp)) {
                continue;
            }
            let cp = delim.and_then(|d| {
                k[q.prefix.len()..]
                    .find(d)
                    .map(|i| k[..q.prefix.len() + i + d.len()].to_owned())
            });
            if let Some(cp) = &cp {
                if prefixes.last() == Some(cp) {
                    continue;
                }
            }
            if n == q.max_keys {
                return (objects, prefixes, true);
            }
            n += 1;
            match cp {
                Some(cp) => prefixes.push(cp),
                None => objects.push(k.clone()),
            }
        }
        (objects, prefixes, false)
    }

    #[tokio::test]
    async fn listings_page_in_key_order_across_folders_and_escaped_keys() {
        let dir = tempfile::tempdir().unwrap();
        let b = FsBackend::open(&dir.path().join("origin")).unwrap();
        b.create_bucket("bkt").await.unwrap();
        let mut keys: Vec<String> = [
            "a", "a-b", "a/b", "a/b/c", "a/b-c", "a/c", "a0", "a.", "b/x", "b/y/z", "b/y-", "c",
            "c//d", "c/", "dir/", "d/e/f/g", "d/e/f/h", "e\u{e9}", "f/../g", "z",
        ]
        .iter()
        .map(|k| k.to_string())
        .collect();
        keys.extend((0..40).map(|i| format!("big/{i:03}")));
        for k in &keys {
            b.put_object("bkt", k, body(b"x"), PutOptions::default())
                .await
                .unwrap();
        }
        keys.sort();
        for prefix in ["", "a", "a/", "b/y", "big/0", "c", "d/e/", "nothing"] {
            for delimiter in [None, Some("/"), Some("-")] {
                for max_keys in [1, 3, 1000] {
                    let mut q = ListQuery {
                        prefix: prefix.into(),
                        delimiter: delimiter.map(str::to_owned),
                        after: None,
                        max_keys,
                    };
                    // Page through, each page checked against the model from its start.
                    for _ in 0..200 {
                        let want = model(&keys, &q);
                        let page = b.list_objects("bkt", &q).await.unwrap();
                        let got: Vec<String> = page.objects.iter().map(|o| o.key.clone()).collect();
                        assert_eq!(
                            (got, page.common_prefixes.clone(), page.is_truncated),
                            want,
                            "{q:?}"
                        );
                        if !page.is_truncated {
                            break;
                        }
                        q.after = page.last.clone();
                    }
                }
            }
        }
        // Written since a folder's listing was kept: the next page sees it.
        let q = ListQuery {
            prefix: "big/".into(),
            max_keys: 1000,
            ..ListQuery::default()
        };
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(b.list_objects("bkt", &q).await.unwrap().objects.len(), 40);
        assert!(
            b.inner
                .listings
                .folders
                .contains_key(&b.inner.root.join("bkt").join("big")),
            "a settled folder's listing is kept"
        );
        b.put_object("bkt", "big/040", body(b"x"), PutOptions::default())
            .await
            .unwrap();
        b.delete_object("bkt", "big/000").await.unwrap();
        let page = b.list_objects("bkt", &q).await.unwrap();
        assert_eq!(page.objects.len(), 40);
        assert_eq!(page.objects.first().unwrap().key, "big/001");
        assert_eq!(page.objects.last().unwrap().key, "big/040");
    }

    #[tokio::test]
    async fn conflicting_and_odd_keys_round_trip_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let b = FsBackend::open(&dir.path().join("origin")).unwrap();
        b.create_bucket("bkt").await.unwrap();
        let cases: &[(&str, &[u8])] = &[
            ("a", b"file a"),
            ("a/b", b"file a/b"),
            ("x/y/z", b"deep"),
            ("x", b"x beside x/"),
            ("../../escape", b"climb"),
            ("dir/", b"trailing"),
            ("a//b", b"double"),
            (".granary-keys/61.k", b"reserved"),
        ];
        for (k, v) in cases {
            b.put_object("bkt", k, body(v), PutOptions::default())
                .await
                .unwrap();
        }
        for (k, v) in cases {
            assert_eq!(read(&b, "bkt", k).await, *v, "{k}");
        }
        let mut want: Vec<String> = cases.iter().map(|(k, _)| k.to_string()).collect();
        want.sort();
        assert_eq!(keys(&b, "bkt", "").await, want);
        assert_eq!(keys(&b, "bkt", "a/").await, vec!["a//b", "a/b"]);
        assert_eq!(keys(&b, "bkt", "..").await, vec!["../../escape"]);
        // Ordinary keys are ordinary files.
        assert_eq!(fs::read(b.root().join("bkt/x/y/z")).unwrap(), b"deep");
        // Nothing was written outside the root.
        assert_eq!(
            fs::read_dir(dir.path()).unwrap().count(),
            1,
            "only origin/ under the temp dir"
        );
        // Deleting a/b frees the folder: a rewrite of `a` goes back to the plain file.
        b.delete_object("bkt", "a/b").await.unwrap();
        b.put_object("bkt", "a", body(b"again"), PutOptions::default())
            .await
            .unwrap();
        assert!(b.root().join("bkt/a").is_file());
        assert_eq!(read(&b, "bkt", "a").await, b"again");
        assert!(keys(&b, "bkt", "a").await.contains(&"a".to_string()));
    }

    /// A starting node removes a crashed write's temp file, not the one of a write in
    /// progress on another member sharing the directory.
    #[test]
    fn only_old_temp_files_are_cleared_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join(".granary").join("tmp");
        fs::create_dir_all(&tmp).unwrap();
        let old = tmp.join("tmp-old");
        let new = tmp.join("tmp-new");
        fs::write(&old, b"crashed").unwrap();
        fs::write(&new, b"in progress").unwrap();
        let long_ago = std::time::SystemTime::now() - STALE_TEMP - Duration::from_secs(60);
        File::options()
            .write(true)
            .open(&old)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        FsBackend::open(dir.path()).unwrap();
        assert!(!old.exists(), "the crashed write's temp file is gone");
        assert_eq!(fs::read(&new).unwrap(), b"in progress");
    }

    #[tokio::test]
    async fn an_object_whose_parts_are_not_known_is_one_part() {
        let dir = tempfile::tempdir().unwrap();
        let b = FsBackend::open(dir.path()).unwrap();
        b.create_bucket("bkt").await.unwrap();
        b.put_object("bkt", "k", body(b"0123456789"), PutOptions::default())
            .await
            .unwrap();
        // Metadata naming a multipart ETag without the parts' sizes (as written before
        // they were kept).
        use xattr::FileExt;
        let file = File::open(b.root().join("bkt/k")).unwrap();
        let mut stored: StoredMeta =
            serde_json::from_slice(&file.get_xattr(META_XATTR).unwrap().unwrap()).unwrap();
        stored.etag = "\"0123456789abcdef0123456789abcdef-3\"".into();
        stored.parts.clear();
        file.set_xattr(META_XATTR, &serde_json::to_vec(&stored).unwrap())
            .unwrap();
        assert_eq!(b.parts_of("bkt", "k").await.unwrap(), None);
        let first = b.part_of("bkt", "k", 1).await.unwrap();
        assert_eq!(
            (first.etag.as_str(), first.count),
            (stored.etag.as_str(), 1)
        );
        assert_eq!(
            first.part,
            Some(crate::backend::PartRange {
                start: 0,
                len: 10,
                checksum: None
            }),
            "part 1 is every byte"
        );
        assert_eq!(b.part_of("bkt", "k", 2).await.unwrap().part, None);
    }

    #[tokio::test]
    async fn failed_writes_leave_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let b = FsBackend::open(dir.path()).unwrap();
        b.create_bucket("bkt").await.unwrap();
        let bad: ByteStream = Box::pin(futures::stream::iter(vec![
            Ok(Bytes::from_static(b"partial")),
            Err(io::Error::other("client went away")),
        ]));
        assert!(b
            .put_object("bkt", "k", bad, PutOptions::default())
            .await
            .is_err());
        let opts = PutOptions {
            expected_md5: Some([0; 16]),
            ..PutOptions::default()
        };
        let e = b
            .put_object("bkt", "k", body(b"data"), opts)
            .await
            .unwrap_err();
        assert!(matches!(e, BackendError::BadDigest(_)));
        assert!(matches!(
            b.head_object("bkt", "k").await,
            Err(BackendError::NoSuchKey(_))
        ));
        assert_eq!(
            fs::read_dir(b.root().join(".granary/tmp")).unwrap().count(),
            0
        );
    }

    #[tokio::test]
    async fn etag_is_md5_and_foreign_files_are_served() {
        let dir = tempfile::tempdir().unwrap();
        let b = FsBackend::open(dir.path()).unwrap();
        b.create_bucket("bkt").await.unwrap();
        let m = b
            .put_object("bkt", "k", body(b"hello\n"), PutOptions::default())
            .await
            .unwrap();
        assert_eq!(m.etag, "b1946ac92492d2347c6235b4d2611184");
        assert_eq!(b.head_object("bkt", "k").await.unwrap().etag, m.etag);
        fs::write(b.root().join("bkt/dropped.bin"), b"by hand").unwrap();
        let meta = b.head_object("bkt", "dropped.bin").await.unwrap();
        assert_eq!(meta.size, 7);
        assert_eq!(meta.etag.len(), 32);
        assert_eq!(read(&b, "bkt", "dropped.bin").await, b"by hand");
    }
}
