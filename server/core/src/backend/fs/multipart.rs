//! Multipart uploads: each under `<root>/.granary/uploads/<id>/`, its record
//! (`upload.json`: bucket, key, headers, when it began) and its parts (`N.ETAG`, a part's
//! checksum as an extended attribute), until completed into one object (ETag
//! `md5(part md5s)-N`) or aborted.

use granary_proto::Header;
use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use md5::{Digest, Md5};
use serde::{Deserialize, Serialize};

use super::meta::{from_ns, now_ns, PART_CHECKSUM_XATTR};
use super::{check_written, FsBackend, Inner, TempFile};
use crate::backend::{
    check_key, BackendError, ByteStream, ObjectMeta, PartInfo, PutOptions, Result, UploadInfo,
};

/// S3's smallest part other than the last.
const MIN_PART_SIZE: u64 = 5 << 20;
/// What a multipart upload records at creation.
#[derive(Debug, Serialize, Deserialize)]
struct UploadRecord {
    bucket: String,
    key: String,
    headers: Vec<Header>,
    initiated_ns: u128,
}

impl Inner {
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

impl FsBackend {
    pub(super) async fn start_upload(
        &self,
        bucket: &str,
        key: &str,
        opts: PutOptions,
    ) -> Result<String> {
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

    pub(super) async fn put_part(
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
            .find(|h| h.name.starts_with("x-amz-checksum-"))
            .map(|h| (h.name.clone(), h.value.clone()));
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

    pub(super) async fn upload_parts(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<Vec<PartInfo>> {
        let (b, k, id) = (bucket.to_owned(), key.to_owned(), upload_id.to_owned());
        self.blocking(move |inner| {
            let (dir, _) = inner.upload_record(&b, &k, &id)?;
            Ok(inner.parts(&dir)?.into_iter().map(|(p, _)| p).collect())
        })
        .await
    }

    pub(super) async fn complete_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
        parts: &[(u32, String)],
        headers: &[Header],
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
            headers.retain(|h| !extra.iter().any(|e| e.name == h.name));
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

    pub(super) async fn abort_upload(
        &self,
        bucket: &str,
        key: &str,
        upload_id: &str,
    ) -> Result<()> {
        let (b, k, id) = (bucket.to_owned(), key.to_owned(), upload_id.to_owned());
        self.blocking(move |inner| {
            let (dir, _) = inner.upload_record(&b, &k, &id)?;
            fs::remove_dir_all(dir)?;
            Ok(())
        })
        .await
    }

    pub(super) async fn uploads_in(&self, bucket: &str, prefix: &str) -> Result<Vec<UploadInfo>> {
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
