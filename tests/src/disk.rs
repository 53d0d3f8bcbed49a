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
    let Some((f, mut buf, base)) = direct_page(file, at, true)? else {
        return Ok(false);
    };
    let page = aligned(&mut buf);
    page[(at - base) as usize] ^= 0xff;
    f.write_all_at(page, base)?;
    // SAFETY: advice on an open descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    Ok(true)
}

/// `file` opened around the page cache (`O_DIRECT`, for writing too with `write`), and
/// the page holding byte `at` as the disk has it, read into a buffer ([`aligned`] is the
/// page in it), with the page's offset; `None` where the filesystem refuses `O_DIRECT`.
fn direct_page(file: &Path, at: u64, write: bool) -> Result<Option<(std::fs::File, Vec<u8>, u64)>> {
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(libc::O_DIRECT)
        .open(file)
    else {
        return Ok(None);
    };
    let mut buf = vec![0u8; 8192];
    let base = at / 4096 * 4096;
    f.read_exact_at(aligned(&mut buf), base)?;
    Ok(Some((f, buf, base)))
}

/// The 4 KiB-aligned page within an 8 KiB buffer, as `O_DIRECT` wants it.
fn aligned(buf: &mut [u8]) -> &mut [u8] {
    let off = buf.as_ptr().align_offset(4096);
    &mut buf[off..off + 4096]
}

/// An ext4 filesystem on a loop device over an image file, mounted for a test (root
/// only): damage written to the image reaches the disk under the filesystem and nothing
/// else, so the file's times and the pages the page cache holds stay as they were, as
/// with a failing disk. Unmounted on drop.
pub struct LoopFs {
    _dir: tempfile::TempDir,
    image: PathBuf,
    mount: PathBuf,
}

impl LoopFs {
    /// A fresh filesystem of `mib` MiB with 4 KiB blocks; the reason where one cannot be
    /// made here.
    pub fn make(mib: u64) -> std::result::Result<LoopFs, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("mounting a loop device needs root".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (image, mount) = (dir.path().join("image"), dir.path().join("mnt"));
        let run = |cmd: &mut std::process::Command| -> std::result::Result<(), String> {
            let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
            if out.status.success() {
                Ok(())
            } else {
                Err(format!(
                    "{cmd:?}: {}",
                    String::from_utf8_lossy(&out.stderr).trim()
                ))
            }
        };
        std::fs::File::create(&image)
            .and_then(|f| f.set_len(mib << 20))
            .map_err(|e| e.to_string())?;
        std::fs::create_dir(&mount).map_err(|e| e.to_string())?;
        run(std::process::Command::new("mkfs.ext4")
            .args(["-q", "-F", "-b", "4096"])
            .arg(&image))?;
        run(std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&mount))?;
        Ok(LoopFs {
            _dir: dir,
            image,
            mount,
        })
    }

    /// Where it is mounted.
    pub fn dir(&self) -> &Path {
        &self.mount
    }

    /// Flips the byte at `at` of `file` (on this filesystem) on the disk under it: the
    /// file's page there is found in the image by its bytes (read through the page
    /// cache), and changed in the image alone.
    pub fn damage(&self, file: &Path, at: u64) -> Result<()> {
        let f = std::fs::File::open(file)?;
        let base = at / 4096 * 4096;
        let mut page = vec![0u8; 4096];
        f.read_exact_at(&mut page, base)?;
        std::fs::File::open(file)?.sync_all()?;
        let img = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&self.image)?;
        let len = img.metadata()?.len();
        let mut chunk = vec![0u8; 4 << 20];
        let mut found = Vec::new();
        let mut pos = 0;
        while pos < len {
            let n = chunk.len().min((len - pos) as usize);
            img.read_exact_at(&mut chunk[..n], pos)?;
            for (i, p) in chunk[..n].chunks(4096).enumerate() {
                if p == page.as_slice() {
                    found.push(pos + i as u64 * 4096);
                }
            }
            pos += n as u64;
        }
        let [on_disk] = found.as_slice() else {
            anyhow::bail!(
                "the page at {base} of {} is at {found:?} in the image",
                file.display()
            );
        };
        let mut byte = [0u8; 1];
        let where_ = on_disk + (at - base);
        img.read_exact_at(&mut byte, where_)?;
        img.write_all_at(&[byte[0] ^ 0xff], where_)?;
        img.sync_all()?;
        Ok(())
    }

    /// The byte at `at` of `file` as the disk holds it (read around the page cache);
    /// `None` where the filesystem refuses `O_DIRECT`.
    pub fn on_disk(&self, file: &Path, at: u64) -> Result<Option<u8>> {
        let Some((_, mut buf, base)) = direct_page(file, at, false)? else {
            return Ok(None);
        };
        Ok(Some(aligned(&mut buf)[(at - base) as usize]))
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        // Lazily, where a process still holds a file there.
        for args in [&["-d"][..], &["-d", "-l"][..]] {
            let done = std::process::Command::new("umount")
                .args(args)
                .arg(&self.mount)
                .status()
                .is_ok_and(|s| s.success());
            if done {
                break;
            }
        }
    }
}

/// A memory cgroup of this test's own (cgroup v1 or v2, root only) that processes are
/// put in, and whose pages are reclaimed on demand, mapped ones too: as memory pressure
/// would, at the moment the test chooses. Removed on drop, its processes given back to
/// the parent.
pub struct Squeeze {
    dir: PathBuf,
    parent: PathBuf,
    /// `memory.force_empty` (v1) or `memory.reclaim` (v2), and what to write there.
    knob: (PathBuf, &'static str),
}

impl Squeeze {
    /// A fresh child of this process's memory cgroup; the reason where there is none.
    pub fn new() -> std::result::Result<Squeeze, String> {
        let cgroups = std::fs::read_to_string("/proc/self/cgroup").map_err(|e| e.to_string())?;
        let mut found = None;
        for line in cgroups.lines() {
            let mut parts = line.splitn(3, ':');
            let (_, controllers, path) = (parts.next(), parts.next(), parts.next());
            let (Some(controllers), Some(path)) = (controllers, path) else {
                continue;
            };
            let path = path.trim_start_matches('/');
            if controllers.split(',').any(|c| c == "memory") {
                let parent = Path::new("/sys/fs/cgroup/memory").join(path);
                found = Some((parent, "memory.force_empty", "0"));
                break;
            }
            if controllers.is_empty() {
                for root in ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"] {
                    let parent = Path::new(root).join(path);
                    if parent.join("memory.reclaim").exists()
                        || parent.join("cgroup.subtree_control").exists()
                    {
                        found = Some((parent, "memory.reclaim", "1G"));
                    }
                }
            }
        }
        let Some((parent, knob, value)) = found else {
            return Err("no memory cgroup to squeeze here".into());
        };
        let dir = parent.join(format!("granary-squeeze-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let knob = dir.join(knob);
        if !knob.exists() {
            let _ = std::fs::remove_dir(&dir);
            return Err(format!("{} has no {}", dir.display(), knob.display()));
        }
        Ok(Squeeze {
            dir,
            parent,
            knob: (knob, value),
        })
    }

    /// Puts process `pid` in the cgroup: pages it reads in from now on are its.
    pub fn add(&self, pid: u32) -> Result<()> {
        std::fs::write(self.dir.join("cgroup.procs"), pid.to_string())?;
        Ok(())
    }

    /// Reclaims what the cgroup's pages the kernel can (locked ones stay).
    pub fn squeeze(&self) {
        // Busy or partly done is as good: the next call goes on.
        let _ = std::fs::write(&self.knob.0, self.knob.1);
    }
}

impl Drop for Squeeze {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = std::fs::write(self.parent.join("cgroup.procs"), pid);
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}
