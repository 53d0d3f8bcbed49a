//! Misses: one fill per object. The first reader of an absent object leads (it fetches
//! a peer's copy or the source's object, the policy deciding admission once the size is
//! known); a writer task puts the bytes in a temp file and commits it; every reader, the
//! leader's client included, streams behind the writer. An object the policy does not
//! admit is served straight through.

use std::fs::{self, File};
use std::io;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use futures::StreamExt;

use super::fill::{self, Fill, FillError, Phase, Resume};
use super::flight::{Flights, Joined, Lead};
use super::follow;
use super::index::{self, Entry};
use super::{room, store, Body, Cache, CacheError, Counted, Fetched, Origin, Read};
use crate::backend::{
    BackendError, ByteRange, ByteStream, GetObject, ObjectMeta, RangeFn, Refusal, Source,
};
use crate::stats::Metric;
use crate::sync::Locked;

impl Cache {
    /// Joins the fill of `ikey` in progress, or leads a new one; a new fill while a
    /// write of the key is under way never commits (the source may answer with either
    /// version).
    pub(super) fn join(&self, ikey: &str) -> Joined {
        self.flights.join(
            ikey,
            || self.lock_index().contains(ikey),
            || self.lock_writes().active(ikey),
        )
    }

    /// A follower's read of a fill: `None` when the fill is of no use to it (abandoned,
    /// failed before its first byte, or this reader's range is far ahead of the writer).
    pub(super) async fn follow(
        &self,
        fill: Arc<Fill>,
        range: &RangeFn<'_>,
    ) -> Result<Option<Read>, CacheError> {
        let st = fill.started().await;
        if st.phase != Phase::Filling && st.phase != Phase::Done {
            return Ok(None);
        }
        let meta = st.meta.clone().expect("a started fill knows its object");
        let resolved = range(&meta).map_err(CacheError::Refused)?;
        let start = resolved.map_or(0, |r| r.start);
        if follow::far_ahead(&st, start) {
            return Ok(None);
        }
        let origin = if fill.from_peer.load(Ordering::Acquire) {
            self.stats.add(Metric::PeerFills, 1);
            Origin::Peer
        } else {
            self.stats.add(Metric::Misses, 1);
            Origin::Miss
        };
        let end = resolved.map_or(meta.size, |r| r.end);
        Ok(Some(Read {
            meta,
            range: resolved,
            body: Body::Stream(follow::follow(fill, start, end)),
            origin,
        }))
    }

    /// [`Mode::Stream`] (and, with `decline`, [`Mode::StreamOrDecline`]).
    pub(super) async fn stream(
        self: &Arc<Self>,
        src: &dyn Source,
        bucket: &str,
        key: &str,
        ikey: &str,
        range: &RangeFn<'_>,
        decline: bool,
    ) -> Result<Read, CacheError> {
        // A fill that ends between the lookup and the join is looked up again, once.
        for _ in 0..2 {
            // Bound first: the index lock is not held while the read is set up.
            let cached = self.lock_index().get(ikey);
            if let Some(entry) = cached {
                if self.still_current(src, bucket, key, ikey, &entry).await? {
                    let read = self.serve_entry(ikey, entry, range)?;
                    self.stats.add(Metric::Hits, 1);
                    return Ok(read);
                }
            }
            return match self.join(ikey) {
                Joined::Held => continue,
                Joined::Lead(lead) => self.lead(src, bucket, key, lead, range, decline).await,
                Joined::Follow(fill) => match self.follow(fill, range).await? {
                    Some(read) => Ok(read),
                    // The fill is of no use to this reader: read the source directly.
                    None => self.bypass(src, bucket, key, range).await,
                },
            };
        }
        self.bypass(src, bucket, key, range).await
    }

    /// A leader's read: fetch (a peer's copy first, else the source, admission decided
    /// once the size is known), then fill, or serve through when not admitted. Dropping
    /// `lead` on an early return abandons the fill: followers fetch on their own.
    pub(super) async fn lead(
        self: &Arc<Self>,
        src: &dyn Source,
        bucket: &str,
        key: &str,
        lead: Lead,
        range: &RangeFn<'_>,
        decline: bool,
    ) -> Result<Read, CacheError> {
        let (fetched, admitted) = self.fetch(src, bucket, key, range, decline).await?;
        if !admitted {
            drop(lead);
            return Ok(self.through(fetched));
        }
        let client = fetched.client;
        let size = fetched.obj.meta.size;
        let resume = self.resume_from(src, bucket, key);
        let (read, fill) = match self.start_fill(lead, bucket, key, fetched, resume) {
            Ok(started) => started,
            Err(e) => {
                if room::is_full(&e) {
                    self.room.refused("no room for a temp file");
                }
                tracing::error!(error = %e, "cannot create a cache temp file; serving through");
                self.lock_index().release(size);
                self.stats.add(Metric::Bypasses, 1);
                return self.bypass(src, bucket, key, range).await;
            }
        };
        let start = client.map_or(0, |r| r.start);
        if !follow::far_ahead(&fill.state.borrow(), start) {
            return Ok(read);
        }
        // The fill goes on in the background; this reader's range, far into the object,
        // comes from the source now rather than after the bytes before it.
        let etag = read.meta.etag.clone();
        let exact = move |m: &ObjectMeta| -> Result<Option<ByteRange>, Refusal> {
            if m.etag != etag {
                return Err(Refusal::Changed(
                    "the object changed while it was read; retry",
                ));
            }
            Ok(client)
        };
        let (obj, _) = src.get_object(bucket, key, &exact).await?;
        Ok(Read {
            meta: read.meta,
            range: client,
            body: Body::Stream(self.count(obj.body, Counted::Backend)),
            origin: Origin::Miss,
        })
    }

    /// A leader's fetch, and whether the policy admitted the object: a peer's copy of the
    /// version the source has, else the source. The policy is asked once the size is
    /// known, inside the source's call, so that a refused object is fetched as the
    /// client's range only, and a declined one not at all.
    pub(super) async fn fetch(
        &self,
        src: &dyn Source,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
        decline: bool,
    ) -> Result<(Fetched, bool), CacheError> {
        let decision: Mutex<Option<(u64, Option<ByteRange>, bool)>> = Mutex::new(None);
        let decide = |meta: &ObjectMeta, decline: bool| -> Result<Option<ByteRange>, Refusal> {
            let client = range(meta)?;
            let admitted = self.admit(meta.size);
            *decision.locked() = Some((meta.size, client, admitted));
            if !admitted && decline {
                return Err(Refusal::Declined);
            }
            Ok(if admitted { None } else { client })
        };
        // A peer's copy first: the previous owner after a membership change, or the node
        // an object this one could not admit was left to.
        let (got, origin) = match self.peer_copy(src, bucket, key).await {
            Some(obj) => (
                decide(&obj.meta, false)
                    .map(|_| obj)
                    .map_err(BackendError::Refused),
                Origin::Peer,
            ),
            None if decline && self.refusing() => {
                // The size is not known yet: any node with room may take it.
                return Err(CacheError::NotAdmitted { size: 0 });
            }
            None => {
                let got = src
                    .get_object_whole_likely(bucket, key, &|m| decide(m, decline))
                    .await;
                (got.map(|(obj, _)| obj), Origin::Miss)
            }
        };
        let decided = decision.locked().take();
        let obj = match got {
            Ok(obj) => obj,
            Err(e) => {
                match decided {
                    Some((size, _, true)) => self.lock_index().release(size),
                    Some((size, _, false)) if decline && origin == Origin::Miss => {
                        return Err(CacheError::NotAdmitted { size });
                    }
                    _ => {}
                }
                return Err(e.into());
            }
        };
        let (_, client, admitted) = decided.expect("the source consulted the range");
        let counted = match origin {
            Origin::Peer => Counted::Peers,
            _ => Counted::Backend,
        };
        Ok((
            Fetched {
                obj,
                client,
                origin,
                counted,
            },
            admitted,
        ))
    }

    /// An object fetched but not admitted: served through.
    pub(super) fn through(&self, f: Fetched) -> Read {
        let Fetched {
            obj,
            client,
            origin,
            counted,
        } = f;
        if origin == Origin::Peer {
            // The peer sends the whole object; this reader gets its range of it.
            self.stats.add(Metric::PeerFills, 1);
            let (start, end) = client.map_or((0, obj.meta.size), |r| (r.start, r.end));
            return Read {
                body: Body::Stream(self.count(follow::slice(obj.body, start, end), counted)),
                meta: obj.meta,
                range: client,
                origin,
            };
        }
        self.stats.add(Metric::Bypasses, 1);
        Read {
            meta: obj.meta,
            range: client,
            body: Body::Stream(self.count(obj.body, counted)),
            origin: Origin::Bypass,
        }
    }

    /// Where the readers of a fill of `src`'s object go on from if the disk fails: the
    /// source itself when it is the one named by [`Cache::set_source`].
    pub(super) fn resume_from(&self, src: &dyn Source, bucket: &str, key: &str) -> Option<Resume> {
        let named = self.source.get()?;
        if !std::ptr::addr_eq(Arc::as_ptr(named), src as *const dyn Source) {
            return None;
        }
        let stats = self.stats.clone();
        Some(Resume::Source {
            src: named.clone(),
            bucket: bucket.to_owned(),
            key: key.to_owned(),
            on_bytes: Arc::new(move |n| {
                stats.add(Metric::BytesFromBackend, n);
            }),
        })
    }

    /// Starts the fill a leader fetched: a writer task puts the bytes in a temp file and
    /// commits it; this reader, like every follower, streams behind the writer (and
    /// goes on from `resume` if the disk fails). An error (no temp file) abandons the
    /// fill; the reservation is the caller's to give back.
    pub(super) fn start_fill(
        self: &Arc<Self>,
        lead: Lead,
        bucket: &str,
        key: &str,
        f: Fetched,
        resume: Option<Resume>,
    ) -> io::Result<(Read, Arc<Fill>)> {
        let temp = self
            .tmp
            .join(format!("fill-{}", uuid::Uuid::new_v4().simple()));
        let (writer, reader) =
            File::create(&temp).and_then(|w| File::open(&temp).map(|r| (w, r)))?;
        let fill = lead.start();
        let _ = fill.file.set(Arc::new(reader));
        if let Some(r) = resume {
            let _ = fill.resume.set(r);
        }
        let meta = f.obj.meta.clone();
        fill.state.send_modify(|s| {
            s.meta = Some(meta.clone());
            s.phase = Phase::Filling;
        });
        if f.origin == Origin::Peer {
            self.stats.add(Metric::PeerFills, 1);
            fill.from_peer.store(true, Ordering::Release);
        } else {
            self.stats.add(Metric::Misses, 1);
        }
        let commit = fill::Commit {
            bucket: bucket.to_owned(),
            key: key.to_owned(),
        };
        let ikey = index::key_of(bucket, key);
        let dest = store::entry_path(&self.objects, bucket, key);
        let (cache, task_fill, task_meta) = (self.clone(), fill.clone(), meta.clone());
        let (stats, counted, room) = (self.stats.clone(), f.counted, self.room.clone());
        let direct = self.direct_fills;
        tokio::spawn(async move {
            let on_bytes = move |n: u64| match counted {
                Counted::Backend => {
                    stats.add(Metric::BytesFromBackend, n);
                }
                Counted::Peers => {
                    stats.add(Metric::BytesFromPeers, n);
                }
                Counted::Nowhere => {}
            };
            // The commit runs on the writer's thread once its file is durable.
            let (body_fill, body_meta) = (task_fill.clone(), task_meta.clone());
            let _ = fill::write_body(
                body_fill,
                room,
                fill::writer(writer, task_meta.size, direct),
                body_meta,
                f.obj.body,
                commit,
                on_bytes,
                move |written| cache.finish_fill(ikey, task_fill, task_meta, temp, dest, written),
            )
            .await;
        });
        let start = f.client.map_or(0, |r| r.start);
        let end = f.client.map_or(meta.size, |r| r.end);
        let read = Read {
            body: Body::Stream(follow::follow(fill.clone(), start, end)),
            meta,
            range: f.client,
            origin: f.origin,
        };
        Ok((read, fill))
    }

    /// Commits (or drops) a fill once its writer is done, on the writer's blocking
    /// thread: the rename, and the directory's fsync that makes it durable.
    pub(super) fn finish_fill(
        &self,
        ikey: String,
        fill: Arc<Fill>,
        meta: ObjectMeta,
        temp: PathBuf,
        dest: PathBuf,
        written: Result<Vec<u32>, FillError>,
    ) {
        let size = meta.size;
        // Decide and commit under the commit lock: `invalidate` takes it too, so an
        // overwrite or delete either comes after the commit (and removes the entry) or
        // before it (and the fill, seen stale here, does not commit).
        let mut table = self.flights.lock();
        let outcome = match written {
            Err(e) => Err(e),
            // Every byte arrived, but the object changed meanwhile: readers of the old
            // version may finish; nothing is committed.
            Ok(_) if fill::is_stale(&fill) => Ok(None),
            Ok(crcs) => store::publish(&temp, &dest)
                .map(|()| Some(crcs))
                .map_err(FillError::Disk),
        };
        match outcome {
            Ok(Some(crcs)) => {
                self.lock_index().commit(
                    ikey.clone(),
                    Entry::fresh(dest.clone(), meta, crcs, self.generation()),
                    size,
                );
                fill.set_phase(Phase::Done);
            }
            Ok(None) => {
                let _ = fs::remove_file(&temp);
                self.lock_index().release(size);
                fill.set_phase(Phase::Done);
            }
            Err(e) => {
                let _ = fs::remove_file(&temp);
                self.lock_index().release(size);
                tracing::warn!(key = %ikey, error = %e, "cache fill failed");
                fill.set_phase(match e {
                    FillError::Disk(e) => {
                        if room::is_full(&e) {
                            self.room.refused("a fill met a full disk");
                        }
                        Phase::DiskFailed(e.to_string())
                    }
                    FillError::Source(e) => Phase::Failed(e.to_string()),
                });
            }
        }
        Flights::finished(&mut table, &ikey, &fill);
        drop(table);
        // Make the rename durable.
        if let Some(parent) = dest.parent() {
            if let Ok(d) = File::open(parent) {
                let _ = d.sync_all();
            }
        }
    }

    /// A peer's copy of the object, if one holds the version the source has now (a
    /// peer may hold a version written before it last heard of a change).
    pub(super) async fn peer_copy(
        &self,
        src: &dyn Source,
        bucket: &str,
        key: &str,
    ) -> Option<GetObject> {
        let peers = self.peers.get()?;
        let (meta, body) = peers.peer_copy(bucket, key).await?;
        match src.head_object(bucket, key).await {
            Ok(now) if now.etag == meta.etag && now.size == meta.size => {
                Some(GetObject { meta: now, body })
            }
            _ => None,
        }
    }

    /// The object straight from the source, not admitted.
    pub(super) async fn bypass(
        &self,
        src: &dyn Source,
        bucket: &str,
        key: &str,
        range: &RangeFn<'_>,
    ) -> Result<Read, CacheError> {
        let (obj, resolved) = src.get_object(bucket, key, range).await?;
        self.stats.add(Metric::Bypasses, 1);
        Ok(Read {
            meta: obj.meta,
            range: resolved,
            body: Body::Stream(self.count(obj.body, Counted::Backend)),
            origin: Origin::Bypass,
        })
    }

    /// A body whose bytes add to a counter as they pass.
    pub(super) fn count(&self, body: ByteStream, counted: Counted) -> ByteStream {
        if counted == Counted::Nowhere {
            return body;
        }
        let stats = self.stats.clone();
        Box::pin(body.map(move |item| {
            if let Ok(b) = &item {
                let counter = if counted == Counted::Peers {
                    Metric::BytesFromPeers
                } else {
                    Metric::BytesFromBackend
                };
                stats.add(counter, b.len() as u64);
            }
            item
        }))
    }
}
