//! The cache's state machine against an in-memory source whose bodies can be held back
//! or made to fail: one fetch for many readers, a failed leader, a write or an
//! invalidation overlapping a fill, admission when full.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;

use super::{Body, Cache, CacheError, Mode, Origin, Read};
use crate::backend::mem::Mem;
use crate::backend::{ByteRange, ByteStream, ObjectMeta, PutOptions};
use crate::cache::CachePolicy;
use crate::stats::{Metric, Stats};
use crate::testing::skipped;

fn cache(dir: &std::path::Path, capacity: u64) -> Arc<Cache> {
    let engine = crate::io::engine(crate::io::EngineChoice::Std).unwrap();
    Arc::new(
        Cache::open(
            dir,
            capacity,
            CachePolicy::NeverEvict,
            true,
            engine,
            Arc::new(Stats::default()),
        )
        .unwrap(),
    )
}

fn data(n: usize, seed: u8) -> Bytes {
    Bytes::from((0..n).map(|i| (i as u8) ^ seed).collect::<Vec<u8>>())
}

async fn read(c: &Arc<Cache>, src: &Mem, key: &str) -> std::result::Result<Read, CacheError> {
    c.read(src, "b", key, &|_| Ok(None), Mode::Stream).await
}

async fn bytes(r: Read) -> std::io::Result<Bytes> {
    let Body::Stream(mut s) = r.body else {
        panic!("a stream");
    };
    let mut out = Vec::new();
    while let Some(chunk) = s.next().await {
        out.extend_from_slice(&chunk?);
    }
    Ok(Bytes::from(out))
}

/// Waits for the fill of `bucket/key` to end, and for every reservation to be given
/// back or committed (a fill taken out of the table by an invalidation still ends).
async fn settled_in(c: &Cache, bucket: &str, key: &str) {
    if let Some(f) = c.flights.get(&super::index::key_of(bucket, key)) {
        let mut rx = f.state.subscribe();
        let _ = rx
            .wait_for(|s| {
                !matches!(
                    s.phase,
                    super::fill::Phase::Starting | super::fill::Phase::Filling
                )
            })
            .await;
    }
    for _ in 0..500 {
        if c.usage().reserved == 0 {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("a reservation was never given back");
}

async fn settled(c: &Cache, key: &str) {
    settled_in(c, "b", key).await
}

#[tokio::test]
async fn a_leader_and_its_followers_fetch_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let obj = data(1 << 20, 7);
    let src = Mem::with(&[("k", obj.clone())]);
    let gate = src.hold_bodies();
    let lead = read(&c, &src, "k").await.unwrap();
    let follow = read(&c, &src, "k").await.unwrap();
    assert_eq!((lead.origin, follow.origin), (Origin::Miss, Origin::Miss));
    gate.add_permits(1000);
    let (a, b) = tokio::join!(bytes(lead), bytes(follow));
    assert_eq!((a.unwrap(), b.unwrap()), (obj.clone(), obj.clone()));
    assert_eq!(src.gets.load(Ordering::SeqCst), 1, "one fetch for both");
    settled(&c, "k").await;
    let hit = read(&c, &src, "k").await.unwrap();
    assert_eq!(hit.origin, Origin::Hit);
    assert_eq!(bytes(hit).await.unwrap(), obj);
    assert_eq!(src.gets.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_leader_fails_every_reader_and_commits_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let obj = data(1 << 20, 3);
    let src = Mem::with(&[("k", obj.clone())]);
    src.fail.store(true, Ordering::SeqCst);
    let gate = src.hold_bodies();
    let lead = read(&c, &src, "k").await.unwrap();
    let follow = read(&c, &src, "k").await.unwrap();
    gate.add_permits(1000);
    let (a, b) = tokio::join!(bytes(lead), bytes(follow));
    assert!(
        a.is_err() && b.is_err(),
        "no reader sees a short body as complete"
    );
    settled(&c, "k").await;
    assert_eq!(c.holds("b", "k"), None);
    assert_eq!(c.usage().reserved, 0, "the reservation is given back");
    // The next read fetches again, and fills.
    src.fail.store(false, Ordering::SeqCst);
    *src.gate.lock().unwrap() = None;
    let again = read(&c, &src, "k").await.unwrap();
    assert_eq!(again.origin, Origin::Miss);
    assert_eq!(bytes(again).await.unwrap(), obj);
    assert_eq!(src.gets.load(Ordering::SeqCst), 2);
    settled(&c, "k").await;
    assert_eq!(c.holds("b", "k"), Some(1 << 20));
}

#[tokio::test]
async fn a_write_during_a_fill_wins() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let (old, new) = (data(1 << 20, 1), data(300_000, 2));
    let src = Mem::with(&[("k", old.clone())]);
    let gate = src.hold_bodies();
    let reading = read(&c, &src, "k").await.unwrap();
    let body: ByteStream = Box::pin(futures::stream::iter(vec![Ok(new.clone())]));
    let opts = PutOptions {
        size: Some(new.len() as u64),
        ..PutOptions::default()
    };
    c.put_through(&*src, "b", "k", body, opts).await.unwrap();
    gate.add_permits(1000);
    // The reader that started before the write gets the version it started on.
    assert_eq!(bytes(reading).await.unwrap(), old);
    settled(&c, "k").await;
    let now = read(&c, &src, "k").await.unwrap();
    assert_eq!(now.origin, Origin::Hit, "the write was cached");
    assert_eq!(
        bytes(now).await.unwrap(),
        new,
        "never the old bytes after the write"
    );
}

#[tokio::test]
async fn an_invalidation_during_a_fill_keeps_it_from_committing() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let obj = data(1 << 20, 9);
    let src = Mem::with(&[("k", obj.clone())]);
    let gate = src.hold_bodies();
    let reading = read(&c, &src, "k").await.unwrap();
    c.invalidate("b", "k");
    gate.add_permits(1000);
    assert_eq!(
        bytes(reading).await.unwrap(),
        obj,
        "its reader is still served"
    );
    settled(&c, "k").await;
    assert_eq!(c.holds("b", "k"), None);
    assert_eq!(read(&c, &src, "k").await.unwrap().origin, Origin::Miss);
}

/// An invalidation racing a fill's commit: whichever comes first, nothing is held after
/// both (the commit is removed, or never happens).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_racing_a_commit_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let src = Mem::with(&[("k", data(100_000, 4))]);
    for i in 0..100 {
        let r = read(&c, &src, "k").await.unwrap();
        let c2 = c.clone();
        let inv = tokio::spawn(async move {
            for _ in 0..(i % 7) {
                tokio::task::yield_now().await;
            }
            c2.invalidate("b", "k");
        });
        let _ = bytes(r).await;
        inv.await.unwrap();
        settled(&c, "k").await;
        assert_eq!(c.holds("b", "k"), None, "round {i}");
    }
}

#[tokio::test]
async fn a_full_never_evict_cache_serves_through_until_room_returns() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 20);
    let (a, b) = (data(600_000, 1), data(600_000, 2));
    let src = Mem::with(&[("a", a.clone()), ("b", b.clone())]);
    let first = read(&c, &src, "a").await.unwrap();
    assert_eq!(first.origin, Origin::Miss);
    assert_eq!(bytes(first).await.unwrap(), a);
    settled(&c, "a").await;
    let second = read(&c, &src, "b").await.unwrap();
    assert_eq!(second.origin, Origin::Bypass, "no room");
    assert_eq!(bytes(second).await.unwrap(), b);
    assert!(c.refusing());
    assert!(matches!(
        c.read(&*src, "b", "b", &|_| Ok(None), Mode::StreamOrDecline)
            .await,
        Err(CacheError::NotAdmitted { .. })
    ));
    assert_eq!(c.holds("b", "a"), Some(600_000), "never evicted");
    c.invalidate("b", "a");
    assert!(!c.refusing());
    let third = read(&c, &src, "b").await.unwrap();
    assert_eq!(third.origin, Origin::Miss);
    assert_eq!(bytes(third).await.unwrap(), b);
}

#[tokio::test]
async fn derived_objects_are_computed_once() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let runs = Arc::new(AtomicUsize::new(0));
    let compute = || {
        let runs = runs.clone();
        async move {
            runs.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            let out = data(70_000, 5);
            Ok::<_, std::io::Error>((Mem::meta(&out), out))
        }
    };
    let whole = |_: &ObjectMeta| Ok(None);
    let (x, y) = tokio::join!(
        c.read_derived("_r", "k", &whole, Mode::Stream, compute),
        c.read_derived("_r", "k", &whole, Mode::Stream, compute)
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(bytes(x).await.unwrap(), data(70_000, 5));
    assert_eq!(bytes(y).await.unwrap(), data(70_000, 5));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    settled_in(&c, "_r", "k").await;
    let hit = c
        .read_derived("_r", "k", &whole, Mode::Stream, compute)
        .await
        .unwrap();
    assert_eq!(hit.origin, Origin::Hit);
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    // A failing computation is the caller's error, and nothing is cached.
    let failing = || async { Err::<(ObjectMeta, Bytes), _>(std::io::Error::other("no")) };
    let e = c
        .read_derived("_r", "f", &whole, Mode::Stream, failing)
        .await;
    assert!(matches!(e, Err(super::DeriveError::Compute(e)) if e.to_string() == "no"));
    assert_eq!(c.holds("_r", "f"), None);
}

#[tokio::test]
async fn a_corrupt_block_is_never_served_and_the_entry_is_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let obj = data(1 << 20, 6);
    let src = Mem::with(&[("k", obj.clone())]);
    assert_eq!(
        bytes(read(&c, &src, "k").await.unwrap()).await.unwrap(),
        obj
    );
    settled(&c, "k").await;
    // Flip a byte of the third 64 KiB block on disk.
    let path = super::store::entry_path(&dir.path().join("objects"), "b", "k");
    let mut file_bytes = std::fs::read(&path).unwrap();
    file_bytes[(2 << 16) + 5] ^= 0xff;
    std::fs::write(&path, &file_bytes).unwrap();
    // A range inside the first block is still good: only what is sent is checked.
    let first = c
        .read(
            &*src,
            "b",
            "k",
            &|_| Ok(Some(ByteRange { start: 0, end: 100 })),
            Mode::Stream,
        )
        .await
        .unwrap();
    assert_eq!(first.origin, Origin::Hit);
    assert_eq!(bytes(first).await.unwrap(), obj.slice(0..100));
    // The whole object: the stream fails before the bad block's bytes leave.
    let hit = read(&c, &src, "k").await.unwrap();
    let Body::Stream(mut s) = hit.body else {
        panic!("a stream");
    };
    let mut sent = 0;
    let mut failed = false;
    while let Some(chunk) = s.next().await {
        match chunk {
            Ok(b) => sent += b.len(),
            Err(_) => failed = true,
        }
    }
    assert!(
        failed && sent < 2 << 16,
        "sent {sent} bytes, then failed: {failed}"
    );
    assert_eq!(c.holds("b", "k"), None, "the entry is dropped");
    let again = read(&c, &src, "k").await.unwrap();
    assert_eq!(again.origin, Origin::Miss, "the next read refetches");
    assert_eq!(bytes(again).await.unwrap(), obj);
}

/// Flips byte `at` of a file on the disk around the page cache (`O_DIRECT`); false where
/// the filesystem refuses direct I/O.
fn damage_on_disk(path: &std::path::Path, at: u64) -> bool {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const ALIGN: usize = 4096;
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
    else {
        return false;
    };
    let mut buf = vec![0u8; 2 * ALIGN];
    let off = buf.as_ptr().align_offset(ALIGN);
    let page = &mut buf[off..off + ALIGN];
    let base = at / ALIGN as u64 * ALIGN as u64;
    if f.read_exact_at(page, base).is_err() {
        return false;
    }
    page[(at - base) as usize] ^= 0xff;
    f.write_all_at(page, base).is_ok()
}

/// Kibibytes locked in memory of the mapping holding `addr` (the kernel may have merged
/// it with a neighbour), as `/proc/self/smaps` says.
fn locked_kib(addr: usize) -> Option<u64> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let holds = |l: &str| {
        let range = l.split(' ').next()?;
        let (a, b) = range.split_once('-')?;
        let (a, b) = (
            usize::from_str_radix(a, 16).ok()?,
            usize::from_str_radix(b, 16).ok()?,
        );
        (a <= addr && addr < b).then_some(())
    };
    let mut lines = smaps.lines().skip_while(|l| holds(l).is_none()).skip(1);
    lines
        .find_map(|l| l.strip_prefix("Locked:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// A checked hit seals each window it keeps: its pages locked in memory, then checked
/// whole. Later hits send a sealed window with no check (`bytes_checked_earlier`), and
/// the kernel cannot reclaim its pages meanwhile (smaps counts them locked), so no page
/// can come in again from the disk unchecked between a check and the socket's copy.
/// A block damaged on the disk (written around the page cache, which moves the file's
/// times) lets the windows go: the next hit seals anew, its check fails, and nothing
/// damaged is sent. With no lock budget every hit reads the windows into buffers and
/// checks them there.
#[tokio::test]
async fn a_sealed_window_is_locked_and_checked_once_else_every_hit_checks_its_copy() {
    use super::hit::WINDOW;
    const SIZE: usize = (12 << 20) + 5;
    const DAMAGE: u64 = (9 << 20) + 77;
    let dir = tempfile::tempdir().unwrap();
    for locks in [true, false] {
        let c = cache(&dir.path().join(format!("locks-{locks}")), 1 << 30);
        if !locks {
            c.maps.limit_locks_to(0);
        }
        let obj = data(SIZE, 3);
        let src = Mem::with(&[("k", obj.clone())]);
        assert_eq!(
            bytes(read(&c, &src, "k").await.unwrap()).await.unwrap(),
            obj
        );
        settled(&c, "k").await;
        let checked = || c.stats.get(Metric::BytesChecked);
        let earlier = || c.stats.get(Metric::BytesCheckedEarlier);
        let hit = |c: &Arc<Cache>| {
            let c = c.clone();
            let src = src.clone();
            async move {
                let r = read(&c, &src, "k").await.unwrap();
                assert_eq!(r.origin, Origin::Hit);
                bytes(r).await
            }
        };
        let (checked0, earlier0) = (checked(), earlier());
        assert_eq!(hit(&c).await.unwrap(), obj);
        assert_eq!(
            (checked() - checked0, earlier() - earlier0),
            (SIZE as u64, 0),
            "locks {locks}: the first hit checks it all"
        );
        let locked = c.maps.locked();
        if locks && locked == 0 {
            skipped("this process may not lock memory (RLIMIT_MEMLOCK without CAP_IPC_LOCK): no window is sealed");
        }
        if !locks {
            assert_eq!(locked, 0, "no budget, nothing locked");
        }
        let entry = c.lock_index().get(&super::index::key_of("b", "k")).unwrap();
        for (addr, len) in entry.maps.bases() {
            let sealed = locked_kib(addr).expect("the window's mapping in smaps");
            if locked == SIZE as u64 {
                let pages = (len as u64).div_ceil(4096) * 4;
                assert!(
                    sealed >= pages,
                    "locks {locks}: {sealed} KiB locked at {addr:x}"
                );
            } else if locked == 0 {
                assert_eq!(sealed, 0, "locks {locks}");
            }
        }
        drop(entry);
        let (checked1, earlier1) = (checked(), earlier());
        assert_eq!(hit(&c).await.unwrap(), obj);
        assert_eq!(
            (checked() - checked1, earlier() - earlier1),
            (SIZE as u64 - locked, locked),
            "locks {locks}: sealed windows are sent as checked, the others checked again"
        );
        assert!(SIZE as u64 > 2 * WINDOW);

        let path = super::store::entry_path(&c.objects, "b", "k");
        if !damage_on_disk(&path, DAMAGE) {
            skipped("this filesystem refuses O_DIRECT: nothing to damage around the page cache");
            continue;
        }
        let r = read(&c, &src, "k").await.unwrap();
        let Body::Stream(mut s) = r.body else {
            panic!("a stream");
        };
        let (mut sent, mut failed) = (0u64, false);
        while let Some(chunk) = s.next().await {
            match chunk {
                Ok(b) => sent += b.len() as u64,
                Err(_) => failed = true,
            }
        }
        assert!(
            failed && sent <= DAMAGE,
            "locks {locks}: sent {sent} bytes, then failed: {failed}"
        );
        drop(s);
        assert_eq!(c.holds("b", "k"), None, "the entry is dropped");
        assert_eq!(c.maps.locked(), 0, "and its windows unlocked");
        let again = read(&c, &src, "k").await.unwrap();
        assert_eq!(again.origin, Origin::Miss, "the next read refetches");
        assert_eq!(bytes(again).await.unwrap(), obj);
    }
}

/// A large fill writes its file around the page cache unless told not to; either way
/// the entry it commits serves the same bytes.
#[tokio::test]
async fn fills_written_around_the_page_cache_or_through_it_commit_the_same_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let probe = dir.path().join("probe");
    let takes_direct =
        crate::io::direct::DirectWriter::new(std::fs::File::create(&probe).unwrap(), 1 << 20)
            .is_direct();
    for direct in [true, false] {
        let root = dir.path().join(format!("cache-{direct}"));
        let c = Arc::new(
            Arc::into_inner(cache(&root, 1 << 30))
                .unwrap()
                .with_direct_fills(direct),
        );
        let obj = data((3 << 20) + 5, 9);
        let src = Mem::with(&[("k", obj.clone())]);
        let cold = read(&c, &src, "k").await.unwrap();
        assert_eq!(cold.origin, Origin::Miss);
        // The fill does not wait for its reader; the reader starts once the entry is
        // committed, so none of its read-backs has brought pages in yet.
        settled(&c, "k").await;
        let path = super::store::entry_path(&c.objects, "b", "k");
        let file = std::fs::File::open(&path).unwrap();
        let cached = crate::io::mapped::Mapped::new(&file, 0, 3 << 20)
            .unwrap()
            .resident();
        assert_eq!(
            cached,
            !(direct && takes_direct),
            "direct {direct}: in the page cache"
        );
        assert_eq!(bytes(cold).await.unwrap(), obj, "direct {direct}, cold");
        let hit = read(&c, &src, "k").await.unwrap();
        assert_eq!(hit.origin, Origin::Hit);
        assert_eq!(bytes(hit).await.unwrap(), obj, "direct {direct}");
        assert_eq!(src.gets.load(Ordering::SeqCst), 1);
    }
}

/// One object through the cache: a miss reads the source once while it fills; once the
/// fill commits, reads are hits (whole or a range, checked) that read no source; a peer
/// asking for a committed copy gets one; the counters say each.
#[tokio::test]
async fn a_miss_fills_and_later_reads_are_hits() {
    use crate::stats::Metric;
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let obj = data(3 << 20, 7);
    let src = Mem::with(&[("k", obj.clone())]);
    // Before any read: no copy, and a peer's question finds none.
    assert_eq!(c.holds("b", "k"), None);
    let peer = c
        .read(&*src, "b", "k", &|_| Ok(None), Mode::Committed)
        .await;
    assert!(matches!(peer, Err(CacheError::NotHeld)));

    let miss = read(&c, &src, "k").await.unwrap();
    assert_eq!(miss.origin, Origin::Miss);
    assert_eq!(miss.meta.size, obj.len() as u64);
    assert_eq!(bytes(miss).await.unwrap(), obj);
    settled(&c, "k").await;
    assert_eq!(c.holds("b", "k"), Some(obj.len() as u64));
    let u = c.usage();
    assert_eq!((u.objects, u.used, u.reserved), (1, obj.len() as u64, 0));

    let hit = read(&c, &src, "k").await.unwrap();
    assert_eq!(hit.origin, Origin::Hit);
    assert_eq!(bytes(hit).await.unwrap(), obj);
    let part = ByteRange {
        start: 1_000_000,
        end: 1_000_100,
    };
    let ranged = c
        .read(&*src, "b", "k", &|_| Ok(Some(part)), Mode::Stream)
        .await
        .unwrap();
    assert_eq!((ranged.origin, ranged.range), (Origin::Hit, Some(part)));
    assert_eq!(
        bytes(ranged).await.unwrap(),
        obj.slice(1_000_000..1_000_100)
    );
    let head = c
        .read(&*src, "b", "k", &|_| Ok(None), Mode::Head)
        .await
        .unwrap();
    assert_eq!(head.meta.etag, Mem::meta(&obj).etag);
    let copy = c
        .read(&*src, "b", "k", &|_| Ok(None), Mode::Committed)
        .await
        .unwrap();
    assert_eq!(bytes(copy).await.unwrap(), obj);
    assert_eq!(src.gets.load(Ordering::SeqCst), 1, "one fetch in all");
    let s = c.stats.snapshot();
    assert_eq!(s.get(Metric::Misses), 1);
    assert_eq!(s.get(Metric::Hits), 2, "the whole read and the range");
    assert_eq!(s.get(Metric::BytesFromBackend), obj.len() as u64);
}

/// Past its lease, a node checks every hit against the source (a copy changed behind it
/// is dropped and read anew) and keeps nothing new; renewed, it trusts its copies again.
#[tokio::test]
async fn past_its_lease_every_hit_is_checked() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let old = data(100 << 10, 1);
    let new = data(100 << 10, 2);
    let src = Mem::with(&[("k", old.clone())]);
    let now = crate::clock::now_ms();
    c.set_lease(now + 60_000);
    assert_eq!(
        bytes(read(&c, &src, "k").await.unwrap()).await.unwrap(),
        old
    );
    settled(&c, "k").await;
    // Changed behind the cache while the lease holds: the copy is served.
    src.objects.lock().unwrap().insert("k".into(), new.clone());
    let hit = read(&c, &src, "k").await.unwrap();
    assert_eq!(hit.origin, Origin::Hit);
    assert_eq!(bytes(hit).await.unwrap(), old);
    // The lease runs out (a pause, a partition): the next hit is checked.
    c.set_lease(now);
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(!c.trusted());
    let read_new = read(&c, &src, "k").await.unwrap();
    assert_eq!(
        read_new.origin,
        Origin::Bypass,
        "the old copy is dropped, the new one read through"
    );
    assert_eq!(bytes(read_new).await.unwrap(), new);
    settled(&c, "k").await;
    assert_eq!(
        c.holds("b", "k"),
        None,
        "nothing is kept while out of lease"
    );
    // Renewed: trusted, and keeping again.
    c.set_lease(crate::clock::now_ms() + 60_000);
    assert!(c.trusted());
    assert_eq!(
        bytes(read(&c, &src, "k").await.unwrap()).await.unwrap(),
        new
    );
    settled(&c, "k").await;
    assert_eq!(c.holds("b", "k"), Some(new.len() as u64));
}

/// A large entry's windows stay mapped between hits (whole reads and ranges alike), in
/// the budget, and are let go with the entry; with no budget every hit maps for itself.
/// The bytes are the same either way.
#[tokio::test]
async fn windows_stay_mapped_between_hits_and_go_with_their_entry() {
    use super::hit::WINDOW;
    const SIZE: usize = 2 * WINDOW as usize + 12_345;
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let obj = data(SIZE, 5);
    let src = Mem::with(&[("k", obj.clone()), ("j", data(SIZE, 6))]);
    let ranged = |c: &Arc<Cache>, key: &'static str, a: u64, b: u64| {
        let (c, src) = (c.clone(), src.clone());
        async move {
            let r = c
                .read(
                    &*src,
                    "b",
                    key,
                    &|_| Ok(Some(ByteRange { start: a, end: b })),
                    Mode::Stream,
                )
                .await
                .unwrap();
            assert_eq!(r.origin, Origin::Hit);
            bytes(r).await.unwrap()
        }
    };
    assert_eq!(
        bytes(read(&c, &src, "k").await.unwrap()).await.unwrap(),
        obj
    );
    settled(&c, "k").await;
    let entry = c.lock_index().get(&super::index::key_of("b", "k")).unwrap();
    assert_eq!(
        (entry.maps.kept(), c.maps.used()),
        (0, 0),
        "a fill maps nothing"
    );
    for _ in 0..2 {
        assert_eq!(ranged(&c, "k", 0, SIZE as u64).await, obj);
    }
    assert_eq!(entry.maps.kept(), 3, "every window kept");
    assert_eq!(
        c.maps.used(),
        SIZE as u64,
        "the budget holds the whole file"
    );
    let (a, b) = (WINDOW - 10, 2 * WINDOW + 100);
    assert_eq!(
        ranged(&c, "k", a, b).await,
        obj.slice(a as usize..b as usize)
    );
    assert_eq!(entry.maps.kept(), 3, "a range uses the kept windows");

    // Dropped with the entry once its last holder lets it go.
    c.invalidate("b", "k");
    assert_eq!(
        c.maps.used(),
        SIZE as u64,
        "held while this test holds the entry"
    );
    drop(entry);
    assert_eq!(c.maps.used(), 0, "let go with the entry");

    // Past the budget, a hit maps what it sends and lets it go.
    c.maps.limit_to(WINDOW);
    assert_eq!(
        bytes(read(&c, &src, "j").await.unwrap()).await.unwrap(),
        data(SIZE, 6)
    );
    settled(&c, "j").await;
    for _ in 0..2 {
        assert_eq!(ranged(&c, "j", 0, SIZE as u64).await, data(SIZE, 6));
    }
    let entry = c.lock_index().get(&super::index::key_of("b", "j")).unwrap();
    assert_eq!(entry.maps.kept(), 1, "one window in the budget");
    assert_eq!(c.maps.used(), WINDOW);
}

/// Writes racing readers that keep missing: once a write has returned and the fills in
/// flight have ended, a read gets the written bytes. (A fill led between a write's
/// invalidation and its registration once committed the old bytes over the new.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_racing_a_write_never_commits_the_old_bytes_over_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let size = 64 << 10;
    let src = Mem::with(&[("k", data(size, 0))]);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|_| {
            let (c, src, stop) = (c.clone(), src.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(r) = read(&c, &src, "k").await {
                        let _ = bytes(r).await;
                    }
                    // Misses, again and again.
                    c.drop_if_unread("b", "k");
                    tokio::task::yield_now().await;
                }
            })
        })
        .collect();
    for i in 1..=500u32 {
        let new = data(size, (i % 251) as u8 + 1);
        let body: ByteStream = Box::pin(futures::stream::iter(vec![Ok(new.clone())]));
        let opts = PutOptions {
            size: Some(size as u64),
            ..PutOptions::default()
        };
        c.put_through(&*src, "b", "k", body, opts).await.unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), c.fill_ended("b", "k"))
            .await
            .expect("a fill ends");
        let got = bytes(read(&c, &src, "k").await.unwrap()).await.unwrap();
        assert!(
            got == new,
            "write {i}: an older version was served after it"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        r.await.unwrap();
    }
}

/// A fill led while writes of its key were under way (the source could answer with
/// either version) is not followed once they are done, even where neither write was
/// cached (they overlapped): a later reader gets the last write's bytes.
#[tokio::test]
async fn a_fill_led_during_writes_is_not_followed_after_them() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let size = 200_000;
    let (old, first, last) = (data(size, 1), data(size, 2), data(size, 3));
    let src = Mem::with(&[("k", old.clone())]);
    let write = |body: Bytes| {
        let (c, src) = (c.clone(), src.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let body: ByteStream = Box::pin(async_stream::stream! {
                let _ = rx.await;
                yield Ok(body);
            });
            let opts = PutOptions {
                size: Some(size as u64),
                ..PutOptions::default()
            };
            c.put_through(&*src, "b", "k", body, opts).await.unwrap();
        });
        (tx, task)
    };
    // Two writes under way at once: neither is cached.
    let (go_first, first_write) = write(first.clone());
    let (go_last, last_write) = write(last.clone());
    while !c.lock_writes().active(&super::index::key_of("b", "k")) {
        tokio::task::yield_now().await;
    }
    // A reader now leads a fill of the version the source has before the writes.
    let gate = src.hold_bodies();
    let during = read(&c, &src, "k").await.unwrap();
    go_first.send(()).unwrap();
    first_write.await.unwrap();
    go_last.send(()).unwrap();
    last_write.await.unwrap();
    // Read while that fill is still in flight.
    let after = read(&c, &src, "k").await.unwrap();
    gate.add_permits(1000);
    assert!(
        bytes(during).await.unwrap() == old,
        "a read during the writes gets the version it started on"
    );
    assert!(
        bytes(after).await.unwrap() == last,
        "never an older version after the writes"
    );
}

/// The planner's drop never takes an entry a read holds, even where the memory tier
/// holds an earlier version's entry of the key: what a hit on that version leaves
/// there when its read ends after a write replaced it (the read takes the entry, the
/// write drops the memory tier's copy, the read's last block puts one back).
#[tokio::test]
async fn an_entry_a_read_holds_is_not_dropped_beside_an_earlier_versions_memory() {
    let dir = tempfile::tempdir().unwrap();
    let c = cache(dir.path(), 1 << 30);
    let (old, new) = (data(64 << 10, 1), data(64 << 10, 2));
    let src = Mem::with(&[("k", old.clone())]);
    let _ = bytes(read(&c, &src, "k").await.unwrap()).await.unwrap();
    settled(&c, "k").await;
    let ikey = super::index::key_of("b", "k");
    let earlier = c.lock_index().get(&ikey).expect("the old version's entry");
    let body: ByteStream = Box::pin(futures::stream::iter(vec![Ok(new.clone())]));
    let opts = PutOptions {
        size: Some(new.len() as u64),
        ..PutOptions::default()
    };
    c.put_through(&*src, "b", "k", body, opts).await.unwrap();
    c.hot.insert(ikey, (earlier, old.clone()));
    // A read of the new entry, not yet sent: the entry is the read's to keep.
    let now = read(&c, &src, "k").await.unwrap();
    assert_eq!(now.origin, Origin::Hit);
    assert_eq!(c.drop_if_unread("b", "k"), None, "a read holds it");
    assert!(bytes(now).await.unwrap() == new);
    assert_eq!(c.drop_if_unread("b", "k"), Some(64 << 10), "unread now");
}

/// A hit looked up before a write of its key and opened after it never sends the new
/// version's file as the old version's bytes, even where hits are not checked: the
/// write publishes its copy at the same path, and the read finds another file there.
#[tokio::test]
async fn a_hit_opened_after_a_write_never_sends_the_new_file_as_the_old_version() {
    let dir = tempfile::tempdir().unwrap();
    let engine = crate::io::engine(crate::io::EngineChoice::Std).unwrap();
    let unchecked = Arc::new(
        Cache::open(
            dir.path(),
            1 << 30,
            CachePolicy::NeverEvict,
            false,
            engine,
            Arc::new(Stats::default()),
        )
        .unwrap(),
    );
    let c = &unchecked;
    for size in [64 << 10, 3 << 20] {
        let key = format!("k{size}");
        let (old, new) = (data(size, 1), data(size, 2));
        let src = Mem::with(&[(key.as_str(), old.clone())]);
        let _ = bytes(read(c, &src, &key).await.unwrap()).await.unwrap();
        settled(c, &key).await;
        let late = read(c, &src, &key).await.unwrap();
        assert_eq!(late.origin, Origin::Hit);
        let body: ByteStream = Box::pin(futures::stream::iter(vec![Ok(new.clone())]));
        let opts = PutOptions {
            size: Some(size as u64),
            ..PutOptions::default()
        };
        c.put_through(&*src, "b", &key, body, opts).await.unwrap();
        match bytes(late).await {
            Ok(b) => assert!(b == old, "{size}: only the old version's bytes, if any"),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{size}: {e}"),
        }
        let now = read(c, &src, &key).await.unwrap();
        assert_eq!(now.origin, Origin::Hit);
        assert!(bytes(now).await.unwrap() == new, "{size}: the new version");
    }
}
