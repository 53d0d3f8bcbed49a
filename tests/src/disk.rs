//! The node's cache files as a test reaches them on disk: where its entries are, and
//! damage done to one around the page cache (as a failing disk would), its pages then
//! dropped from memory.

use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Result;

/// The entry files under a node's cache directory (`DATA_DIR/cache`), sorted.
pub fn cache_entries(cache: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for d in std::fs::read_dir(cache.join("objects"))
        .into_iter()
        .flatten()
        .flatten()
    {
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            out.push(f.path());
        }
    }
    out.sort();
    out
}

/// Flips the byte at `at` of `file` on the disk, around the page cache (`O_DIRECT`),
/// and drops the file's pages from memory (those no process maps). `false`, and nothing
/// done, where the filesystem refuses `O_DIRECT`.
pub fn damage_on_disk(file: &Path, at: u64) -> Result<bool> {
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)
    else {
        return Ok(false);
    };
    let mut buf = vec![0u8; 8192];
    let off = buf.as_ptr().align_offset(4096);
    let page = &mut buf[off..off + 4096];
    let base = at / 4096 * 4096;
    f.read_exact_at(page, base)?;
    page[(at - base) as usize] ^= 0xff;
    f.write_all_at(page, base)?;
    // SAFETY: advice on an open descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(true)
}
