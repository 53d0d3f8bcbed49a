//! Temp files made ahead of the fills that take them. Creating a file allocates an
//! inode and adds a directory entry: tens of microseconds on a quiet filesystem, a
//! millisecond and more where many files were deleted a moment ago (ext4 steps over
//! inodes freed in the last minute), and more again when the directory's blocks are not
//! in memory. A cold read's first byte waits for its fill's temp file, so the file is
//! taken ready-made: a few empty ones wait in `<cache>/tmp/`, made again on a blocking
//! thread as they are taken. An empty spare left at exit is removed with the other temp
//! files when the cache opens.

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Spares kept ready: more than the fills that start at once on a busy node.
const READY: usize = 8;

/// An empty temp file, open for writing and for reading.
pub struct Spare {
    pub path: PathBuf,
    pub writer: File,
    pub reader: File,
}

impl Spare {
    /// Makes one in `dir`.
    fn create(dir: &Path) -> io::Result<Spare> {
        let path = dir.join(format!("spare-{}", uuid::Uuid::new_v4().simple()));
        let writer = File::create(&path)?;
        match File::open(&path) {
            Ok(reader) => Ok(Spare {
                path,
                writer,
                reader,
            }),
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                Err(e)
            }
        }
    }
}

pub struct Spares {
    dir: PathBuf,
    ready: Mutex<Vec<Spare>>,
    /// Set while a blocking thread makes spares.
    making: AtomicBool,
}

impl Spares {
    pub fn new(dir: PathBuf) -> Arc<Spares> {
        Arc::new(Spares {
            dir,
            ready: Mutex::new(Vec::with_capacity(READY)),
            making: AtomicBool::new(false),
        })
    }

    /// A spare: a ready one if there is one (others are made meanwhile), else one made
    /// now.
    pub fn take(self: &Arc<Self>) -> io::Result<Spare> {
        let taken = self.ready.lock().unwrap_or_else(|p| p.into_inner()).pop();
        self.make_more();
        match taken {
            Some(spare) => Ok(spare),
            None => Spare::create(&self.dir),
        }
    }

    /// How many are ready now.
    pub fn ready(&self) -> usize {
        self.ready.lock().unwrap_or_else(|p| p.into_inner()).len()
    }

    /// Fills the pool up on a blocking thread, unless one is at it already or there is
    /// no runtime to run it on. A failure (a full disk, say) leaves the pool short:
    /// `take` makes its file itself then, and reports the failure.
    fn make_more(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.making.swap(true, Ordering::AcqRel) {
            return;
        }
        let spares = self.clone();
        rt.spawn_blocking(move || {
            while spares.ready() < READY {
                match Spare::create(&spares.dir) {
                    Ok(spare) => spares
                        .ready
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push(spare),
                    Err(e) => {
                        tracing::debug!(error = %e, "cannot make a spare temp file");
                        break;
                    }
                }
            }
            spares.making.store(false, Ordering::Release);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn without_a_runtime_each_spare_is_made_when_taken() {
        let dir = tempfile::tempdir().unwrap();
        let spares = Spares::new(dir.path().to_owned());
        let a = spares.take().unwrap();
        let b = spares.take().unwrap();
        assert_ne!(a.path, b.path);
        assert_eq!(spares.ready(), 0);
        assert_eq!(names(dir.path()).len(), 2);
    }

    #[tokio::test]
    async fn taken_spares_are_made_again_and_each_is_its_own_empty_file() {
        use std::io::{Read, Write};
        let dir = tempfile::tempdir().unwrap();
        let spares = Spares::new(dir.path().to_owned());
        let mut first = spares.take().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while spares.ready() < READY {
            assert!(std::time::Instant::now() < deadline, "no spares were made");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert_eq!(names(dir.path()).len(), READY + 1);
        let mut taken = vec![];
        for _ in 0..READY {
            taken.push(spares.take().unwrap());
        }
        let mut paths: Vec<&PathBuf> = taken.iter().map(|s| &s.path).collect();
        paths.push(&first.path);
        paths.sort();
        paths.dedup();
        assert_eq!(paths.len(), READY + 1, "a spare was handed out twice");
        // Empty, and what is written through one handle is read through the other.
        assert_eq!(first.writer.metadata().unwrap().len(), 0);
        first.writer.write_all(b"granary").unwrap();
        let mut back = String::new();
        first.reader.read_to_string(&mut back).unwrap();
        assert_eq!(back, "granary");
    }

    #[test]
    fn a_spare_that_cannot_be_made_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let spares = Spares::new(dir.path().join("gone"));
        assert_eq!(
            spares.take().err().map(|e| e.kind()),
            Some(io::ErrorKind::NotFound)
        );
    }
}
