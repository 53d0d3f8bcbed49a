//! An object's metadata, kept with its file: the ETag, the stored headers and the parts'
//! sizes and checksums as the extended attribute `user.granary.meta`, good while the
//! file's size and mtime are the ones it was written with. A file without it (dropped in
//! by hand, or rewritten since) gets an ETag of its size and mtime.

use granary_proto::Header;
use std::fs::{self, File};
use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};

use super::{Inner, TempFile};
use crate::backend::{ObjectMeta, PartInfo};

pub(super) const META_XATTR: &str = "user.granary.meta";
/// A part's checksum as it was uploaded: `x-amz-checksum-sha256:VALUE`.
pub(super) const PART_CHECKSUM_XATTR: &str = "user.granary.checksum";
/// Metadata stored with an object written through Granary.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct StoredMeta {
    pub(super) etag: String,
    size: u64,
    /// The file's mtime when the metadata was written; a file rewritten by hand since
    /// no longer matches and is treated as foreign.
    mtime_ns: u128,
    #[serde(default)]
    headers: Vec<Header>,
    /// An object completed from parts: their sizes, in order (for `?partNumber=`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) parts: Vec<u64>,
    /// And the checksums they were uploaded with.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(super) part_checksums: Vec<Option<(String, String)>>,
}

impl Inner {
    /// The metadata written with the file, if it still describes it.
    pub(super) fn stored_meta(&self, file: &File, md: &fs::Metadata) -> Option<StoredMeta> {
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

    pub(super) fn read_meta(&self, file: &File, md: &fs::Metadata) -> ObjectMeta {
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

    pub(super) fn write_meta(
        &self,
        temp: &TempFile,
        etag: String,
        headers: Vec<Header>,
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
}

/// ETag of a file that has no stored metadata: stable while size and mtime are.
pub(super) fn foreign_etag(md: &fs::Metadata) -> String {
    let mut h = Md5::new();
    h.update(md.len().to_le_bytes());
    h.update(mtime_ns(md).to_le_bytes());
    hex::encode(h.finalize())
}

pub(super) fn mtime_ns(md: &fs::Metadata) -> u128 {
    md.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

pub(super) fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

pub(super) fn from_ns(ns: u128) -> SystemTime {
    UNIX_EPOCH + Duration::from_nanos(ns.min(u64::MAX as u128) as u64)
}
