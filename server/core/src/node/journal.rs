//! Writes whose outcome the node may never learn. Before a write (PUT, copy, multipart
//! completion, delete) goes to the backend, its keys are appended to a small log on
//! disk and synced; once the outcome is known (the backend answered, and the other
//! members dropped their copies) they are marked done. A key whose outcome is not known
//! (the node was killed, the backend timed out or failed mid-request, the client went
//! away) is **unsettled**: the backend may still commit the write at any moment. The
//! node watches each unsettled key (`Node::settle`): it asks the backend's version every
//! [`POLL`], drops the key's copies cluster-wide at each change (and at the first look),
//! and lets the key go once the answer has held for [`SETTLED_AFTER`]. The log is one
//! JSON record a line, rewritten with only the open keys when it opens and when it grows
//! past [`COMPACT_AT`].

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::cluster::calls::ObjectKey;
use crate::sync::Locked;
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;

/// How often an unsettled key's version is asked of the backend.
pub const POLL: Duration = Duration::from_millis(500);
/// How long the backend's answer must hold before an unsettled key is let go: its
/// longest wait for an answer (a write the backend took may commit until then).
pub const SETTLED_AFTER: Duration = Duration::from_secs(30);
/// The log is rewritten with the open keys alone once it is this large.
const COMPACT_AT: u64 = 4 << 20;

/// One line of the log.
#[derive(Debug, Serialize, Deserialize)]
struct Record {
    id: u64,
    /// Opened with its key; absent: done.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    bucket: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    key: Option<String>,
}

/// An unsettled key: its log id and the object.
#[derive(Debug)]
pub struct Unsettled {
    pub id: u64,
    pub object: ObjectKey,
}

struct Log {
    file: File,
    /// The same file, synced outside the lock, so that concurrent writes share syncs.
    sync: std::sync::Arc<File>,
    path: PathBuf,
    /// Bytes written since the last rewrite.
    size: u64,
    next_id: u64,
    open: HashMap<u64, ObjectKey>,
}

/// The journal of writes in flight; without a directory (`keep_in` not called) it keeps
/// nothing and every write is taken as settled.
pub struct Journal {
    log: OnceLock<Mutex<Log>>,
    unsettled_tx: mpsc::UnboundedSender<Unsettled>,
    unsettled_rx: Mutex<Option<mpsc::UnboundedReceiver<Unsettled>>>,
}

impl Default for Journal {
    fn default() -> Journal {
        let (tx, rx) = mpsc::unbounded_channel();
        Journal {
            log: OnceLock::new(),
            unsettled_tx: tx,
            unsettled_rx: Mutex::new(Some(rx)),
        }
    }
}

impl Journal {
    /// Keeps the log in `dir`. Keys it holds open (their writes' outcomes were never
    /// learned: the node was killed) are queued as unsettled: their count.
    pub fn keep_in(&self, dir: &Path) -> io::Result<usize> {
        fs::create_dir_all(dir)?;
        let path = dir.join("writes.log");
        let mut open = HashMap::new();
        let mut next_id = 1;
        if let Ok(f) = File::open(&path) {
            for line in io::BufReader::new(f).lines() {
                // A torn last line (killed mid-append) is a write never sent.
                let Ok(r) = serde_json::from_str::<Record>(&line?) else {
                    continue;
                };
                next_id = next_id.max(r.id + 1);
                match (r.bucket, r.key) {
                    (Some(bucket), Some(key)) => {
                        open.insert(r.id, ObjectKey { bucket, key });
                    }
                    _ => {
                        open.remove(&r.id);
                    }
                }
            }
        }
        let found = open.len();
        for (id, object) in &open {
            let _ = self.unsettled_tx.send(Unsettled {
                id: *id,
                object: object.clone(),
            });
        }
        let (file, size) = rewrite(&path, &open)?;
        let log = Log {
            sync: std::sync::Arc::new(file.try_clone()?),
            file,
            path,
            size,
            next_id,
            open,
        };
        if self.log.set(Mutex::new(log)).is_err() {
            return Err(io::Error::other("the journal is kept already"));
        }
        Ok(found)
    }

    /// The unsettled keys, as they come (once: the node's watcher takes them).
    pub fn take_unsettled(&self) -> Option<mpsc::UnboundedReceiver<Unsettled>> {
        self.unsettled_rx.locked().take()
    }

    /// Records `objects` as being written, durably, before the write is sent: what
    /// settles them, or leaves them to be watched when dropped unsettled. The records
    /// are appended under the lock and synced outside it (on the blocking pool), so that
    /// writes at once share a sync.
    pub async fn begin(&self, objects: &[(&str, &str)]) -> io::Result<Pending<'_>> {
        let Some(log) = self.log.get() else {
            return Ok(Pending {
                journal: self,
                open: Vec::new(),
            });
        };
        let (open, sync) = self.append(log, objects)?;
        // Unsettled from here on, whatever happens to the sync or the write.
        let pending = Pending {
            journal: self,
            open,
        };
        tokio::task::spawn_blocking(move || sync.sync_data())
            .await
            .map_err(io::Error::other)??;
        Ok(pending)
    }

    /// Appends `objects`' records to the log (not yet synced): their ids, and the file
    /// to sync.
    fn append(
        &self,
        log: &Mutex<Log>,
        objects: &[(&str, &str)],
    ) -> io::Result<(Vec<Unsettled>, std::sync::Arc<File>)> {
        let mut log = log.locked();
        let mut lines = String::new();
        let mut open = Vec::with_capacity(objects.len());
        for (bucket, key) in objects {
            let id = log.next_id;
            log.next_id += 1;
            let r = Record {
                id,
                bucket: Some((*bucket).to_owned()),
                key: Some((*key).to_owned()),
            };
            lines.push_str(&serde_json::to_string(&r).map_err(io::Error::other)?);
            lines.push('\n');
            open.push(Unsettled {
                id,
                object: ObjectKey::new(bucket, key),
            });
        }
        log.file.write_all(lines.as_bytes())?;
        log.size += lines.len() as u64;
        for u in &open {
            log.open.insert(u.id, u.object.clone());
        }
        Ok((open, log.sync.clone()))
    }

    /// Marks these keys done (not synced: a done mark lost to a crash costs a watch).
    pub fn end(&self, ids: &[u64]) {
        let Some(log) = self.log.get() else {
            return;
        };
        let mut log = log.locked();
        let mut lines = String::new();
        for &id in ids {
            if log.open.remove(&id).is_some() {
                let r = Record {
                    id,
                    bucket: None,
                    key: None,
                };
                lines.push_str(&serde_json::to_string(&r).unwrap_or_default());
                lines.push('\n');
            }
        }
        if let Err(e) = log.file.write_all(lines.as_bytes()) {
            tracing::warn!(error = %e, "the write journal could not mark writes done");
        }
        log.size += lines.len() as u64;
        if log.size >= COMPACT_AT {
            match rewrite(&log.path, &log.open).and_then(|(f, size)| Ok((f.try_clone()?, f, size)))
            {
                Ok((sync, file, size)) => {
                    log.sync = std::sync::Arc::new(sync);
                    log.file = file;
                    log.size = size;
                }
                Err(e) => tracing::warn!(error = %e, "the write journal could not be compacted"),
            }
        }
    }

    /// Keys of writes in flight or unsettled.
    #[cfg(test)]
    pub fn open_count(&self) -> usize {
        self.log.get().map_or(0, |l| l.locked().open.len())
    }
}

/// Writes the open records to a new log, synced, and puts it in place: the file to
/// append to and its size.
fn rewrite(path: &Path, open: &HashMap<u64, ObjectKey>) -> io::Result<(File, u64)> {
    let tmp = path.with_extension("log.tmp");
    let mut text = String::new();
    let mut ids: Vec<_> = open.keys().copied().collect();
    ids.sort_unstable();
    for id in ids {
        let o = &open[&id];
        let r = Record {
            id,
            bucket: Some(o.bucket.clone()),
            key: Some(o.key.clone()),
        };
        text.push_str(&serde_json::to_string(&r).map_err(io::Error::other)?);
        text.push('\n');
    }
    {
        let mut f = File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    if let Some(dir) = path.parent() {
        File::open(dir)?.sync_all()?;
    }
    let file = OpenOptions::new().append(true).open(path)?;
    Ok((file, text.len() as u64))
}

/// Keys being written: settled by [`Pending::settle`] once the write's outcome is
/// known; dropped otherwise (an error of uncertain outcome, or the request dropped
/// mid-way), they are left to the node's watcher.
pub struct Pending<'a> {
    journal: &'a Journal,
    open: Vec<Unsettled>,
}

impl Pending<'_> {
    /// The outcome is known for every key.
    pub fn settle(mut self) {
        let ids: Vec<u64> = self.open.drain(..).map(|u| u.id).collect();
        self.journal.end(&ids);
    }

    /// The outcome is known for the keys `known` says; the others are left unsettled.
    pub fn settle_where(mut self, known: impl Fn(&str, &str) -> bool) {
        let (done, left): (Vec<_>, Vec<_>) = self
            .open
            .drain(..)
            .partition(|u| known(&u.object.bucket, &u.object.key));
        self.open = left;
        let ids: Vec<u64> = done.into_iter().map(|u| u.id).collect();
        self.journal.end(&ids);
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        for u in self.open.drain(..) {
            tracing::info!(bucket = %u.object.bucket, key = %u.object.key, "a write's outcome is not known: watching the backend's version");
            let _ = self.journal.unsettled_tx.send(u);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(rx: &mut mpsc::UnboundedReceiver<Unsettled>) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while let Ok(u) = rx.try_recv() {
            out.push((u.object.bucket, u.object.key));
        }
        out.sort();
        out
    }

    #[tokio::test]
    async fn writes_whose_outcome_was_never_learned_are_found_again() {
        let dir = tempfile::tempdir().unwrap();
        let j = Journal::default();
        assert_eq!(j.keep_in(dir.path()).unwrap(), 0);
        let mut rx = j.take_unsettled().unwrap();
        // Settled, left by an error, settled in part, and in flight when killed.
        j.begin(&[("b", "done")]).await.unwrap().settle();
        drop(j.begin(&[("b", "failed")]).await.unwrap());
        j.begin(&[("b", "x\n\"odd\""), ("b", "gone")])
            .await
            .unwrap()
            .settle_where(|_, k| k == "gone");
        let killed = j.begin(&[("c", "in flight")]).await.unwrap();
        std::mem::forget(killed);
        assert_eq!(
            drain(&mut rx),
            [
                ("b".into(), "failed".into()),
                ("b".into(), "x\n\"odd\"".into())
            ]
        );
        assert_eq!(j.open_count(), 3);

        // A restart finds what was not marked done, a torn line included.
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("writes.log"))
            .unwrap();
        f.write_all(b"{\"id\":99,\"bucket\":\"b\",\"ke").unwrap();
        let again = Journal::default();
        assert_eq!(again.keep_in(dir.path()).unwrap(), 3);
        let mut rx = again.take_unsettled().unwrap();
        assert_eq!(
            drain(&mut rx),
            [
                ("b".into(), "failed".into()),
                ("b".into(), "x\n\"odd\"".into()),
                ("c".into(), "in flight".into())
            ]
        );
        // New ids do not reuse old ones, and done marks survive another restart.
        let p = again.begin(&[("d", "new")]).await.unwrap();
        assert!(p.open[0].id > 5);
        p.settle();
        again.end(&[1, 2, 3, 4, 5]);
        let third = Journal::default();
        assert_eq!(third.keep_in(dir.path()).unwrap(), 0);
    }

    #[tokio::test]
    async fn without_a_directory_nothing_is_kept() {
        let j = Journal::default();
        let mut rx = j.take_unsettled().unwrap();
        drop(j.begin(&[("b", "k")]).await.unwrap());
        assert!(rx.try_recv().is_err());
        assert_eq!(j.open_count(), 0);
    }
}
