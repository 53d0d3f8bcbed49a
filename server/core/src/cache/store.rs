//! Cache entries on disk: one file per object under `<cache>/objects/<hh>/<hash>.obj`,
//! holding the object's bytes followed by a footer — a CRC32C per 64 KiB block, the
//! object's metadata as JSON, their lengths and a magic number. A fill writes the whole
//! file in `<cache>/tmp/`, fsyncs it and renames it into place: the rename is the commit,
//! so an entry is either complete with its checksums or absent.

use granary_proto::Header;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::backend::ObjectMeta;
use crate::io::crc;

/// Bytes covered by one checksum: small enough that a read of a few KiB (a shard
/// member, a range) reads and checks little more than it sends.
pub const BLOCK: u64 = 64 << 10;
/// The checksum block of entries written by earlier releases, still read.
pub const OLD_BLOCK: u64 = 1 << 20;
/// Bytes read from an entry at a time when streaming it: whole blocks, so each is
/// checked as it arrives.
pub const READ: u64 = 1 << 20;
const MAGIC: &[u8; 8] = b"GRNRYC01";
/// `u32` block count, `u32` metadata length, magic.
const TRAILER: u64 = 16;

/// What the footer records of an entry.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct FooterMeta {
    bucket: String,
    key: String,
    etag: String,
    size: u64,
    last_modified_ns: u64,
    headers: Vec<Header>,
    block: u64,
}

/// A committed entry as loaded from its footer.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub bucket: String,
    pub key: String,
    pub meta: ObjectMeta,
    pub crcs: Vec<u32>,
}

/// The file name of an entry: a stable 128-bit hash of bucket and key.
pub fn entry_path(objects: &Path, bucket: &str, key: &str) -> PathBuf {
    let mut buf = Vec::with_capacity(bucket.len() + key.len() + 1);
    buf.extend_from_slice(bucket.as_bytes());
    buf.push(0);
    buf.extend_from_slice(key.as_bytes());
    let h = format!("{:032x}", xxhash_rust::xxh3::xxh3_128(&buf));
    objects.join(&h[..2]).join(format!("{h}.obj"))
}

/// The checksum block of an entry of `size` bytes with `n` checksums: [`BLOCK`], or
/// [`OLD_BLOCK`] for an entry written by an earlier release. (Where both give one block
/// the object fits in either, and reading it is the same.)
pub fn block_of(size: u64, n: usize) -> u64 {
    if n as u64 == size.div_ceil(BLOCK) {
        BLOCK
    } else {
        OLD_BLOCK
    }
}

/// Appends the footer to a file holding exactly the object's bytes.
pub fn write_footer(
    file: &mut File,
    bucket: &str,
    key: &str,
    meta: &ObjectMeta,
    crcs: &[u32],
) -> io::Result<()> {
    write_footer_with(file, bucket, key, meta, crcs, BLOCK)
}

fn write_footer_with(
    file: &mut File,
    bucket: &str,
    key: &str,
    meta: &ObjectMeta,
    crcs: &[u32],
    block: u64,
) -> io::Result<()> {
    let fm = FooterMeta {
        bucket: bucket.to_owned(),
        key: key.to_owned(),
        etag: meta.etag.clone(),
        size: meta.size,
        last_modified_ns: meta
            .last_modified
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64),
        headers: meta.headers.clone(),
        block,
    };
    let json = serde_json::to_vec(&fm).map_err(io::Error::other)?;
    let mut out = Vec::with_capacity(crcs.len() * 4 + json.len() + TRAILER as usize);
    for c in crcs {
        out.extend_from_slice(&c.to_le_bytes());
    }
    out.extend_from_slice(&json);
    out.extend_from_slice(&(crcs.len() as u32).to_le_bytes());
    out.extend_from_slice(&(json.len() as u32).to_le_bytes());
    out.extend_from_slice(MAGIC);
    file.write_all(&out)
}

/// Reads an entry's footer; `None` if the file is not a complete, consistent entry.
pub fn read_footer(file: &File) -> io::Result<Option<Loaded>> {
    let len = file.metadata()?.len();
    if len < TRAILER {
        return Ok(None);
    }
    let mut trailer = [0u8; TRAILER as usize];
    file.read_exact_at(&mut trailer, len - TRAILER)?;
    if &trailer[8..] != MAGIC {
        return Ok(None);
    }
    let n = u32::from_le_bytes(trailer[0..4].try_into().expect("4 bytes")) as u64;
    let m = u32::from_le_bytes(trailer[4..8].try_into().expect("4 bytes")) as u64;
    let footer_len = n * 4 + m + TRAILER;
    if footer_len > len {
        return Ok(None);
    }
    let mut buf = vec![0u8; (n * 4 + m) as usize];
    file.read_exact_at(&mut buf, len - footer_len)?;
    let (crc_bytes, json) = buf.split_at((n * 4) as usize);
    let Ok(fm) = serde_json::from_slice::<FooterMeta>(json) else {
        return Ok(None);
    };
    let known_block = fm.block == BLOCK || fm.block == OLD_BLOCK;
    if !known_block || fm.size != len - footer_len || fm.size.div_ceil(fm.block) != n {
        return Ok(None);
    }
    let crcs = crc_bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    Ok(Some(Loaded {
        meta: ObjectMeta {
            size: fm.size,
            etag: fm.etag,
            last_modified: UNIX_EPOCH + Duration::from_nanos(fm.last_modified_ns),
            headers: fm.headers,
        },
        bucket: fm.bucket,
        key: fm.key,
        crcs,
    }))
}

/// Running per-block CRC32C of a stream of bytes.
#[derive(Debug, Default)]
pub struct BlockSums {
    crcs: Vec<u32>,
    current: u32,
    in_block: u64,
}

impl BlockSums {
    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let room = (BLOCK - self.in_block) as usize;
            let n = room.min(data.len());
            self.current = crc::crc32c_append(self.current, &data[..n]);
            self.in_block += n as u64;
            data = &data[n..];
            if self.in_block == BLOCK {
                self.crcs.push(self.current);
                self.current = 0;
                self.in_block = 0;
            }
        }
    }

    /// The checksums of the blocks finished so far.
    pub fn done(&self) -> &[u32] {
        &self.crcs
    }

    pub fn finish(mut self) -> Vec<u32> {
        if self.in_block > 0 {
            self.crcs.push(self.current);
        }
        self.crcs
    }
}

/// Moves a written entry file from `temp` to `dest`, its place (the commit, done under
/// the commit lock): one `rename`, its directory made first only where it is missing
/// ([`scan`] makes them all when the cache opens).
pub fn publish(temp: &Path, dest: &Path) -> io::Result<()> {
    match fs::rename(temp, dest) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if let Some(dir) = dest.parent() {
                fs::create_dir_all(dir)?;
            }
            fs::rename(temp, dest)
        }
        r => r,
    }
}

/// Removes temp files a killed process left behind, makes the 256 directories entries
/// go in (so a commit does not make one, an inode and a block allocated, under the
/// commit lock), and returns every committed entry file under `objects`.
pub fn scan(objects: &Path, tmp: &Path) -> io::Result<Vec<PathBuf>> {
    if tmp.exists() {
        fs::remove_dir_all(tmp)?;
    }
    fs::create_dir_all(tmp)?;
    fs::create_dir_all(objects)?;
    // Best effort: a node on a full disk still starts, and a commit makes a directory
    // that is missing.
    for i in 0..=255u8 {
        let _ = fs::create_dir(objects.join(format!("{i:02x}")));
    }
    let mut out = Vec::new();
    for dir in fs::read_dir(objects)?.flatten() {
        if !dir.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        for f in fs::read_dir(dir.path())?.flatten() {
            let p = f.path();
            if p.extension().is_some_and(|e| e == "obj") {
                out.push(p);
            } else {
                let _ = fs::remove_file(&p);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::SystemTime;

    #[test]
    fn scan_makes_every_entry_directory_and_keeps_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let (objects, tmp) = (dir.path().join("objects"), dir.path().join("tmp"));
        let kept = entry_path(&objects, "b", "k");
        assert!(scan(&objects, &tmp).unwrap().is_empty());
        assert_eq!(fs::read_dir(&objects).unwrap().count(), 256);
        assert!(kept.parent().unwrap().is_dir());
        fs::write(&kept, b"x").unwrap();
        fs::write(tmp.join("left-behind"), b"y").unwrap();
        assert_eq!(scan(&objects, &tmp).unwrap(), vec![kept]);
        assert_eq!(fs::read_dir(&tmp).unwrap().count(), 0);
    }

    #[test]
    fn publish_makes_a_missing_directory() {
        let dir = tempfile::tempdir().unwrap();
        let temp = dir.path().join("t");
        fs::write(&temp, b"x").unwrap();
        let dest = entry_path(&dir.path().join("objects"), "b", "k");
        publish(&temp, &dest).unwrap();
        assert_eq!(fs::read(&dest).unwrap(), b"x");
        assert!(!temp.exists());
    }

    #[test]
    fn footer_round_trips_and_rejects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("e.obj");
        let data = vec![7u8; (BLOCK + 10) as usize];
        let mut sums = BlockSums::default();
        sums.update(&data[..100]);
        sums.update(&data[100..]);
        let crcs = sums.finish();
        assert_eq!(crcs.len(), 2);
        assert_eq!(crcs[1], crc::crc32c(&data[BLOCK as usize..]));
        let meta = ObjectMeta {
            size: data.len() as u64,
            etag: "abc".into(),
            last_modified: SystemTime::now(),
            headers: vec![Header::new("content-type", "x/y")],
        };
        let mut f = File::create(&path).unwrap();
        f.write_all(&data).unwrap();
        write_footer(&mut f, "b", "k", &meta, &crcs).unwrap();
        let loaded = read_footer(&File::open(&path).unwrap()).unwrap().unwrap();
        assert_eq!((loaded.bucket.as_str(), loaded.key.as_str()), ("b", "k"));
        assert_eq!(loaded.meta.size, meta.size);
        assert_eq!(loaded.crcs, crcs);
        // A truncated file is not an entry.
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        f.set_len(BLOCK).unwrap();
        assert!(read_footer(&File::open(&path).unwrap()).unwrap().is_none());
    }

    #[test]
    fn entries_with_the_old_1_mib_blocks_still_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.obj");
        let data = vec![3u8; (OLD_BLOCK + 10) as usize];
        let crcs = vec![
            crc::crc32c(&data[..OLD_BLOCK as usize]),
            crc::crc32c(&data[OLD_BLOCK as usize..]),
        ];
        let meta = ObjectMeta {
            size: data.len() as u64,
            etag: "old".into(),
            last_modified: SystemTime::now(),
            headers: Vec::new(),
        };
        let mut f = File::create(&path).unwrap();
        f.write_all(&data).unwrap();
        write_footer_with(&mut f, "b", "k", &meta, &crcs, OLD_BLOCK).unwrap();
        let loaded = read_footer(&File::open(&path).unwrap()).unwrap().unwrap();
        assert_eq!(loaded.crcs, crcs);
        assert_eq!(block_of(loaded.meta.size, loaded.crcs.len()), OLD_BLOCK);
        // New entries: one checksum per 64 KiB.
        assert_eq!(block_of(OLD_BLOCK + 10, 17), BLOCK);
        assert_eq!(block_of(100, 1), BLOCK);
        // A block size no release wrote is not an entry.
        let mut f = File::create(&path).unwrap();
        f.write_all(&data).unwrap();
        write_footer_with(&mut f, "b", "k", &meta, &crcs[..1], 4 << 20).unwrap();
        assert!(read_footer(&File::open(&path).unwrap()).unwrap().is_none());
    }

    #[test]
    fn entry_paths_are_stable_and_distinct() {
        let root = Path::new("/c");
        assert_eq!(entry_path(root, "b", "k"), entry_path(root, "b", "k"));
        assert_ne!(entry_path(root, "b", "k"), entry_path(root, "b", "k2"));
        assert_ne!(entry_path(root, "ab", "c"), entry_path(root, "a", "bc"));
    }
}
