//! Where objects live: the `Backend` trait (the seam between the node and its object
//! store) and the types that cross it. `fs` keeps objects as files in a local directory;
//! an S3 backend sits behind the same trait.

pub mod fs;
pub mod keypath;
pub mod limit;
#[cfg(test)]
pub mod mem;
pub mod ranged;
pub mod s3;

use granary_proto::Header;
use std::io;
use std::pin::Pin;
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::Stream;

/// A stream of body bytes; errors end it.
pub type ByteStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

/// Why a backend call failed. Variants name the side at fault: the client's request
/// (`NoSuch*`, `Invalid*`, `Refused`, `Body`, `StoreRefused`), this node's setup
/// (`Denied`), its load (`Busy`) or its storage (`Io`), or the store behind it
/// (`Unavailable`); [`BackendError::is_retryable`] says whether a retry can help.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("the bucket `{0}` does not exist")]
    NoSuchBucket(String),
    #[error("the key `{0}` does not exist")]
    NoSuchKey(String),
    #[error("the upload `{0}` does not exist or was completed or aborted")]
    NoSuchUpload(String),
    #[error("the bucket `{0}` exists and is yours")]
    BucketExists(String),
    #[error("the bucket `{0}` is not empty")]
    BucketNotEmpty(String),
    #[error("`{bucket}` is not a valid bucket name: {rule}")]
    InvalidBucketName { bucket: String, rule: String },
    #[error("invalid key: {0}")]
    InvalidKey(&'static str),
    #[error("the key is longer than 1024 bytes")]
    KeyTooLong,
    #[error("part {0} was not uploaded or its ETag does not match")]
    InvalidPart(u32),
    #[error("the parts are not in ascending order")]
    InvalidPartOrder,
    #[error("CompleteMultipartUpload names no parts")]
    NoParts,
    #[error("a part other than the last is smaller than 5 MiB")]
    EntityTooSmall,
    #[error("{0}")]
    BadDigest(String),
    /// The body was shorter or longer than its declared length.
    #[error("{0}")]
    IncompleteBody(String),
    /// The store needs the body's length up front and the request did not give it.
    #[error("{0}")]
    LengthRequired(&'static str),
    /// The caller's range function refused the object it was shown.
    #[error("{0}")]
    Refused(Refusal),
    /// The request body the caller handed over failed (its own verdict, or the client
    /// went away): the client's side.
    #[error("the request body failed: {0}")]
    Body(io::Error),
    /// The store refused the request with an S3 error code of its own: the request's
    /// fault as the store sees it.
    #[error("{message}")]
    StoreRefused { code: String, message: String },
    /// The store refuses this node's credentials or policy: the node's configuration;
    /// a retry will not help.
    #[error("{0}")]
    Denied(String),
    /// This node has as many backend reads in flight as it allows: retry.
    #[error("{0}")]
    Busy(String),
    /// Local storage failed.
    #[error("storage error: {0}")]
    Io(#[from] io::Error),
    /// The object store behind the node could not be reached, timed out or failed (5xx)
    /// after the client library's retries: the store's side; a later retry may help.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
}

impl BackendError {
    /// Whether the same call may succeed later.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            BackendError::Busy(_) | BackendError::Unavailable(_) | BackendError::Io(_)
        ) || matches!(self, BackendError::Refused(Refusal::Changed(_)))
    }
}

/// Why a range function refused an object once it saw its metadata.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// `If-Match` or `If-Unmodified-Since` (or a copy source condition) does not hold.
    #[error("At least one of the pre-conditions you specified did not hold")]
    PreconditionFailed,
    /// `If-None-Match` or `If-Modified-Since`: the client's copy is current.
    #[error("Not Modified")]
    NotModified {
        etag: String,
        last_modified: SystemTime,
    },
    /// The range names no byte of the object.
    #[error("The requested range is not satisfiable")]
    Unsatisfiable { size: u64 },
    /// The object is not the version the read was planned for (it changed meanwhile).
    #[error("{0}")]
    Changed(&'static str),
    /// The caller decided not to read the object here (it leaves it to another node).
    #[error("the object was left to another node")]
    Declined,
}

pub type Result<T> = std::result::Result<T, BackendError>;

/// How an object was assembled from parts: its ETag, and each part's size and the
/// checksum it was uploaded with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectParts {
    pub etag: String,
    pub parts: Vec<(u64, Option<(String, String)>)>,
    /// `COMPOSITE` or `FULL_OBJECT`, for an object completed with a checksum.
    pub checksum_type: Option<String>,
}

/// Where one part of an object lies (`GET ?partNumber=N`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartOf {
    /// The object's ETag.
    pub etag: String,
    /// How many parts the object has (1 for an object written whole).
    pub count: usize,
    /// The part; `None` when the object has no such part.
    pub part: Option<PartRange>,
    /// `COMPOSITE` or `FULL_OBJECT`, for an object completed with a checksum.
    pub checksum_type: Option<String>,
}

/// One part's place in its object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartRange {
    /// Its first byte.
    pub start: u64,
    pub len: u64,
    /// The checksum it was uploaded with (header name, value).
    pub checksum: Option<(String, String)>,
}

impl ObjectParts {
    /// An object as one part.
    pub fn whole(meta: ObjectMeta) -> ObjectParts {
        ObjectParts {
            etag: meta.etag,
            parts: vec![(meta.size, None)],
            checksum_type: None,
        }
    }

    /// Where part `n` (from 1) lies.
    pub fn part(&self, n: usize) -> PartOf {
        let part = self
            .parts
            .get(n.wrapping_sub(1))
            .map(|(len, checksum)| PartRange {
                start: self.parts[..n - 1].iter().map(|(s, _)| s).sum(),
                len: *len,
                checksum: checksum.clone(),
            });
        PartOf {
            etag: self.etag.clone(),
            count: self.parts.len(),
            part,
            checksum_type: self.checksum_type.clone(),
        }
    }
}

/// What is known of a stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    pub size: u64,
    /// Without quotes: the hex MD5 of the bytes, or `md5-of-md5s-N` for multipart.
    pub etag: String,
    pub last_modified: SystemTime,
    /// Headers stored with the object: `content-type`, `cache-control`,
    /// `x-amz-meta-*` and the like, in lower case.
    pub headers: Vec<Header>,
}

impl ObjectMeta {
    pub fn content_type(&self) -> Option<&str> {
        Header::find(&self.headers, "content-type")
    }
}

/// A listing entry.
#[derive(Debug, Clone)]
pub struct ObjectEntry {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub last_modified: SystemTime,
}

/// A bucket as listed.
#[derive(Debug, Clone)]
pub struct BucketInfo {
    pub name: String,
    pub created: SystemTime,
}

/// What to list: every key after `after` (exclusive) that starts with `prefix`, in
/// lexicographic byte order, rolled up at `delimiter`.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub prefix: String,
    pub delimiter: Option<String>,
    /// Keys at or before this one are skipped; if it is a rolled-up common prefix, every
    /// key under it is skipped too.
    pub after: Option<String>,
    pub max_keys: usize,
}

/// One page of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    pub objects: Vec<ObjectEntry>,
    pub common_prefixes: Vec<String>,
    pub is_truncated: bool,
    /// The last key or common prefix returned, to resume from.
    pub last: Option<String>,
}

/// Decides, from an object's metadata, which bytes of it to send (`None`: all of it), or
/// refuses (failed precondition, unsatisfiable range).
pub type RangeFn<'a> =
    dyn for<'m> Fn(&'m ObjectMeta) -> std::result::Result<Option<ByteRange>, Refusal> + Sync + 'a;

/// A byte range `[start, end)` of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteRange {
    pub start: u64,
    pub end: u64,
}

impl From<std::ops::Range<u64>> for ByteRange {
    fn from(r: std::ops::Range<u64>) -> ByteRange {
        ByteRange {
            start: r.start,
            end: r.end,
        }
    }
}

impl ByteRange {
    pub fn len(&self) -> u64 {
        self.end - self.start
    }

    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }
}

/// An open object: its metadata and a lazy body for the requested range.
pub struct GetObject {
    pub meta: ObjectMeta,
    pub body: ByteStream,
}

/// Options of a write.
#[derive(Debug, Clone, Default)]
pub struct PutOptions {
    /// Headers to store with the object (see `ObjectMeta::headers`).
    pub headers: Vec<Header>,
    /// `Content-MD5` of the request: the write fails with `BadDigest` before it commits
    /// if the bytes differ.
    pub expected_md5: Option<[u8; 16]>,
    /// The exact body length when known; a shorter or longer body fails the write.
    pub size: Option<u64>,
}

/// A part of a multipart upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartInfo {
    pub number: u32,
    pub etag: String,
    pub size: u64,
    pub last_modified: SystemTime,
    /// The checksum the part was uploaded with (`x-amz-checksum-sha256` and its
    /// value), where the backend keeps it.
    pub checksum: Option<(String, String)>,
}

/// An upload in progress.
#[derive(Debug, Clone)]
pub struct UploadInfo {
    pub key: String,
    pub upload_id: String,
    pub initiated: SystemTime,
}

/// Where object bytes are read from: the object store, and anything that wraps it. The
/// cache fills from a `Source` and checks its copies against one. Every method is
/// cancel-safe.
#[async_trait]
pub trait Source: Send + Sync + 'static {
    /// A short name for logs: `fs:/path`, `s3:endpoint`.
    fn describe(&self) -> String;

    async fn head_object(&self, bucket: &str, key: &str) -> Result<ObjectMeta>;
    /// Opens an object; `range` is resolved against its size by the caller's closure so
    /// that metadata and bytes come from one version of the object.
    async fn get_object(
        &self,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<(GetObject, Option<ByteRange>)>;
    /// [`Source::get_object`] for a caller that expects to read the whole object (a
    /// cache fill): a source may open the object in one request and consult `range` on
    /// the metadata that request answers with, instead of asking for the metadata first.
    async fn get_object_whole_likely(
        &self,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<(GetObject, Option<ByteRange>)> {
        self.get_object(bucket, key, range).await
    }

    /// Bytes `range` of the version `etag` of an object, which must be that version (a
    /// `Refusal::Changed` otherwise): one request where the store takes a range and a
    /// version together.
    async fn get_range(
        &self,
        bucket: &str,
        key: &str,
        etag: &str,
        range: ByteRange,
    ) -> Result<ByteStream> {
        let want = |meta: &ObjectMeta| -> std::result::Result<Option<ByteRange>, Refusal> {
            if meta.etag != etag {
                return Err(Refusal::Changed("the object changed"));
            }
            Ok(Some(range))
        };
        Ok(self.get_object(bucket, key, &want).await?.0.body)
    }

    /// The parts the object was completed from, in order (one part, the whole object,
    /// for an object written whole); `None` where the source does not know them.
    async fn parts_of(&self, _bucket: &str, _key: &str) -> Result<Option<ObjectParts>> {
        Ok(None)
    }

    /// Where part `n` (from 1) of the object lies. An object whose parts the source does
    /// not know is one part, as an object written whole is: part 1 is every byte.
    async fn part_of(&self, bucket: &str, key: &str, n: usize) -> Result<PartOf> {
        let parts = match self.parts_of(bucket, key).await? {
            Some(parts) => parts,
            None => ObjectParts::whole(self.head_object(bucket, key).await?),
        };
        Ok(parts.part(n))
    }
}

/// The object store behind the node: a [`Source`] that also keeps buckets, takes writes
/// and lists. Every method is cancel-safe: a dropped future leaves no partial object
/// visible.
#[async_trait]
pub trait Backend: Source {
    async fn list_buckets(&self) -> Result<Vec<BucketInfo>>;
    async fn create_bucket(&self, bucket: &str) -> Result<()>;
    async fn head_bucket(&self, bucket: &str) -> Result<()>;
    async fn delete_bucket(&self, bucket: &str) -> Result<()>;

    async fn put_object(
        &self,
        bucket: &str,
        key: &str,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<ObjectMeta>;
    /// Deletes a key; a missing key is not an error (S3 answers 204 either way).
    async fn delete_object(&self, bucket: &str, key: &str) -> Result<()>;
    async fn list_objects(&self, bucket: &str, query: &ListQuery) -> Result<ListPage>;

    async fn create_multipart(&self, bucket: &str, key: &str, opts: PutOptions) -> Result<String>;
    async fn upload_part(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        part: u32,
        body: ByteStream,
        opts: PutOptions,
    ) -> Result<PartInfo>;
    async fn list_parts(&self, bucket: &str, key: &str, upload_id: &str) -> Result<Vec<PartInfo>>;
    async fn complete_multipart(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        headers: &[Header],
    ) -> Result<ObjectMeta>;
    async fn abort_multipart(&self, bucket: &str, key: &str, upload_id: &str) -> Result<()>;
    async fn list_uploads(&self, bucket: &str, prefix: &str) -> Result<Vec<UploadInfo>>;
}

/// S3's bucket naming rules: whether `name` follows them all.
pub fn valid_bucket_name(name: &str) -> bool {
    bucket_name_rule(name).is_none()
}

/// The S3 bucket naming rule `name` breaks, in words, or `None` where it breaks none
/// (said where a folder is not served and where a request names one).
pub fn bucket_name_rule(name: &str) -> Option<&'static str> {
    let b = name.as_bytes();
    if !(3..=63).contains(&b.len()) {
        return Some("a bucket name is 3 to 63 characters long");
    }
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if !b.iter().all(|&c| alnum(c) || c == b'.' || c == b'-') {
        return Some(
            "a bucket name has only lowercase letters, digits, dots and hyphens \
             (no capitals or underscores)",
        );
    }
    if !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return Some("a bucket name starts and ends with a lowercase letter or a digit");
    }
    if name.contains("..") || name.contains(".-") || name.contains("-.") {
        return Some("a bucket name has no two dots, or a dot and a hyphen, side by side");
    }
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return Some("a bucket name is not formatted as an IP address");
    }
    None
}

impl BackendError {
    /// `bucket` breaks S3's naming rules (which one, where we know; else the store's
    /// `message`).
    pub fn invalid_bucket(bucket: &str, message: &str) -> BackendError {
        let rule = match bucket_name_rule(bucket) {
            Some(rule) => rule.to_owned(),
            None if message.is_empty() => "the store refuses the name".to_owned(),
            None => message.to_owned(),
        };
        BackendError::InvalidBucketName {
            bucket: bucket.to_owned(),
            rule,
        }
    }
}

/// A bucket name that breaks S3's rules names no bucket: `NoSuchBucket`, before any
/// path or request is built from it.
pub fn known_bucket(bucket: &str) -> Result<()> {
    if valid_bucket_name(bucket) {
        Ok(())
    } else {
        Err(BackendError::NoSuchBucket(bucket.to_owned()))
    }
}

/// S3's key rules: 1..=1024 bytes of UTF-8, no NUL.
pub fn check_key(key: &str) -> Result<()> {
    if key.is_empty() {
        return Err(BackendError::InvalidKey("the key is empty"));
    }
    if key.len() > 1024 {
        return Err(BackendError::KeyTooLong);
    }
    if key.bytes().any(|c| c == 0) {
        return Err(BackendError::InvalidKey("the key contains a NUL byte"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_names() {
        for ok in ["abc", "my-bucket", "data.set.01", "a1b"] {
            assert!(valid_bucket_name(ok), "{ok}");
        }
        for bad in [
            "ab",
            "A_B",
            "-abc",
            "abc-",
            "a..b",
            "192.168.1.1",
            "_granary",
            ".abc",
            "ab/c",
            &"a".repeat(64),
        ] {
            assert!(!valid_bucket_name(bad), "{bad}");
            assert!(bucket_name_rule(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn keys() {
        assert!(check_key("a").is_ok());
        assert!(check_key(&"k".repeat(1024)).is_ok());
        assert!(matches!(
            check_key(&"k".repeat(1025)),
            Err(BackendError::KeyTooLong)
        ));
        assert!(check_key("a\0b").is_err());
        assert!(check_key("").is_err());
    }
}
