//! The disk cache through the real binary: never-evict against LRU over shuffled epochs,
//! one backend fetch for many concurrent cold readers, and crash safety (kill -9 during
//! fills, then restart). Objects are files dropped into the fs backend, so the backend's
//! reads are counted exactly by `bytes_from_backend`.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Result};
use granary_tests::disk::{cache_entries, damage_on_disk};
use granary_tests::{
    md5_hex, raw_request_blocking, request_bytes, Moto, Pattern, Server, ServerOpts,
};
use rand::seq::SliceRandom;
use rand::SeedableRng;

const BUCKET: &str = "dataset";

/// Writes `n` objects of `size` bytes into the fs backend; returns their MD5s by key.
fn lay_out(server: &Server, n: usize, size: usize) -> HashMap<String, String> {
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir).unwrap();
    (0..n)
        .map(|i| {
            let key = format!("shard-{i:04}.tar");
            let data = Pattern::new(1000 + i as u64).bytes(0, size);
            std::fs::write(dir.join(&key), &data).unwrap();
            (key, md5_hex(&data))
        })
        .collect()
}

/// Where the objects live: files in the fs backend, or a real S3 server (moto).
enum Origin {
    Fs,
    S3(Moto),
}

impl Origin {
    fn s3() -> Origin {
        Origin::S3(Moto::start().expect("start moto_server"))
    }

    /// A node over this origin, with extra `granary serve` flags.
    fn start(&self, args: &[&str]) -> Server {
        let opts = match self {
            Origin::Fs => ServerOpts::open(),
            Origin::S3(moto) => ServerOpts::s3_backend(&moto.url()),
        };
        Server::start(opts.args(args)).expect("start granary")
    }

    /// Stores `n` objects of `size` bytes in the origin; returns their MD5s by key.
    fn lay_out(&self, server: &Server, n: usize, size: usize) -> HashMap<String, String> {
        let Origin::S3(moto) = self else {
            return lay_out(server, n, size);
        };
        let client = moto.client();
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            // A second node over the same moto finds the bucket there already.
            let _ = client.create_bucket().bucket(BUCKET).send().await;
            let mut out = HashMap::new();
            for i in 0..n {
                let key = format!("shard-{i:04}.tar");
                let data = Pattern::new(1000 + i as u64).bytes(0, size);
                out.insert(key.clone(), md5_hex(&data));
                client
                    .put_object()
                    .bucket(BUCKET)
                    .key(&key)
                    .body(data.into())
                    .send()
                    .await
                    .unwrap();
            }
            out
        })
    }
}

/// GETs `/BUCKET/key`; returns (status, x-granary-cache, md5 of body, body length).
fn get(server: &Server, key: &str) -> Result<(u16, String, String, usize)> {
    let path = format!("/{BUCKET}/{key}");
    let req = request_bytes("GET", &path, server.addr(), &[], b"");
    let resp = raw_request_blocking(server.addr(), &req)?;
    let source = resp.header("x-granary-cache").unwrap_or("").to_owned();
    Ok((resp.status, source, md5_hex(&resp.body), resp.body.len()))
}

fn stat(server: &Server, field: &str) -> u64 {
    server.stats().unwrap()[field].as_u64().unwrap()
}

/// Waits until no fill is in flight: a response can end a moment before its fill
/// commits (footer, fsync, rename), and only reads that start after the commit are hits.
fn settle(server: &Server) {
    for _ in 0..200 {
        if stat(server, "reserved_bytes") == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("fills still in flight after 5 s");
}

/// Reads every object once per epoch in a new seeded order; returns, per epoch, the
/// keys read as hits and the count of each source.
fn run_epochs(
    server: &Server,
    objects: &HashMap<String, String>,
    epochs: u64,
) -> Vec<(HashSet<String>, HashMap<String, usize>)> {
    let mut keys: Vec<String> = objects.keys().cloned().collect();
    keys.sort();
    let mut out = Vec::new();
    for epoch in 0..epochs {
        settle(server);
        keys.shuffle(&mut rand::rngs::StdRng::seed_from_u64(epoch));
        let mut hits = HashSet::new();
        let mut sources: HashMap<String, usize> = HashMap::new();
        for key in &keys {
            let (status, source, md5, _) = get(server, key).unwrap();
            assert_eq!(status, 200, "GET {key}");
            assert_eq!(md5, objects[key], "bytes of {key} in epoch {epoch}");
            if source == "hit" {
                hits.insert(key.clone());
            }
            *sources.entry(source).or_default() += 1;
        }
        out.push((hits, sources));
    }
    out
}

#[test]
fn never_evict_keeps_a_stable_hit_ratio_where_lru_thrashes() {
    epochs_never_evict_against_lru(Origin::Fs);
}

#[test]
fn never_evict_against_lru_over_s3() {
    epochs_never_evict_against_lru(Origin::s3());
}

fn epochs_never_evict_against_lru(origin: Origin) {
    const D: usize = 40;
    const C: usize = 20;
    const SIZE: usize = 256 << 10;
    let capacity = (C * SIZE).to_string();

    let never = origin.start(&["--cache-capacity", &capacity]);
    let objects = origin.lay_out(&never, D, SIZE);
    let epochs = run_epochs(&never, &objects, 3);
    let admitted: HashSet<String> = {
        let (_, sources) = &epochs[0];
        assert_eq!(
            sources.get("miss"),
            Some(&C),
            "epoch 1 admits exactly C objects"
        );
        assert_eq!(
            sources.get("bypass"),
            Some(&(D - C)),
            "and serves the rest through"
        );
        epochs[1].0.clone()
    };
    for (i, (hits, sources)) in epochs.iter().enumerate().skip(1) {
        let ratio = hits.len() as f64 / D as f64;
        println!(
            "never-evict epoch {}: hit ratio {ratio:.3} {sources:?}",
            i + 1
        );
        assert_eq!(
            hits,
            &admitted,
            "epoch {}: the same admitted set hits",
            i + 1
        );
        assert_eq!(hits.len(), C);
        assert_eq!(sources.get("bypass"), Some(&(D - C)));
        assert!(ratio >= 0.95 * C as f64 / D as f64);
    }
    assert_eq!(
        stat(&never, "used_bytes"),
        (C * SIZE) as u64,
        "capacity to the byte"
    );
    assert_eq!(stat(&never, "objects"), C as u64);
    // Backend bytes: all of epoch 1, and only the bypassed objects after.
    assert_eq!(
        stat(&never, "bytes_from_backend"),
        (D * SIZE + 2 * (D - C) * SIZE) as u64
    );

    let lru = origin.start(&["--cache-capacity", &capacity, "--cache-policy", "lru"]);
    let objects = origin.lay_out(&lru, D, SIZE);
    let epochs = run_epochs(&lru, &objects, 3);
    for (i, (hits, sources)) in epochs.iter().enumerate() {
        println!(
            "lru epoch {}: hit ratio {:.3} {sources:?}",
            i + 1,
            hits.len() as f64 / D as f64
        );
    }
    assert!(stat(&lru, "used_bytes") <= (C * SIZE) as u64);
    let lru_later: usize = epochs[1..].iter().map(|(h, _)| h.len()).sum();
    assert!(
        lru_later < 2 * C,
        "LRU under shuffled epochs hits less than never-evict ({lru_later} vs {})",
        2 * C
    );
}

#[test]
fn concurrent_cold_reads_fetch_the_object_once() {
    const SIZE: usize = 64 << 20;
    let server = Server::start(ServerOpts::open()).unwrap();
    let objects = lay_out(&server, 1, SIZE);
    let (key, want) = objects.iter().next().unwrap();
    let results: Vec<(u16, String, String, usize)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..32).map(|_| s.spawn(|| get(&server, key))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    let mut sources: HashMap<&str, usize> = HashMap::new();
    for (status, source, md5, len) in &results {
        assert_eq!(*status, 200);
        assert_eq!(*len, SIZE);
        assert_eq!(md5, want, "every body equals the source");
        *sources.entry(source.as_str()).or_default() += 1;
    }
    println!("32 concurrent cold GETs: {sources:?}");
    assert_eq!(sources.get("bypass"), None);
    assert_eq!(sources.values().sum::<usize>(), 32);
    assert_eq!(
        stat(&server, "bytes_from_backend"),
        SIZE as u64,
        "the backend was read once"
    );
    assert_eq!(stat(&server, "misses") + stat(&server, "hits"), 32);
    settle(&server);
    assert_eq!(get(&server, key).unwrap().1, "hit");
}

fn tmp_files(cache: &Path) -> usize {
    std::fs::read_dir(cache.join("tmp")).map_or(0, |d| d.count())
}

#[test]
fn kill_during_fills_then_restart_serves_whole_objects_only() {
    kill_during_fills(Origin::Fs);
}

#[test]
fn kill_during_fills_over_s3() {
    kill_during_fills(Origin::s3());
}

fn kill_during_fills(origin: Origin) {
    const N: usize = 20;
    const SIZE: usize = 8 << 20;
    let mut server = origin.start(&[]);
    let objects = origin.lay_out(&server, N, SIZE);
    let mut keys: Vec<String> = objects.keys().cloned().collect();
    keys.sort();
    // A few objects are committed before the crash.
    for key in &keys[..5] {
        assert_eq!(get(&server, key).unwrap().1, "miss");
    }
    settle(&server);
    // Start the other cold reads at once and kill the node while they are filling.
    std::thread::scope(|s| {
        for key in &keys[5..] {
            let addr = server.addr();
            s.spawn(move || {
                let path = format!("/{BUCKET}/{key}");
                // The connection dies with the node: any outcome is fine here.
                let _ = raw_request_blocking(addr, &request_bytes("GET", &path, addr, &[], b""));
            });
        }
        std::thread::sleep(Duration::from_millis(150));
        server.kill_and_restart().unwrap();
    });
    let cache = server.data_dir().join("cache");
    assert_eq!(
        tmp_files(&cache),
        0,
        "temp files of dead fills are cleaned at start"
    );
    let cached_after_crash = stat(&server, "objects");
    println!("entries that survived the kill: {cached_after_crash} of {N}");
    assert!(cached_after_crash >= 5, "committed entries survive kill -9");
    // A damaged entry on disk is dropped at start, never served.
    if let Some(entry) = cache_entries(&cache).first() {
        let f = std::fs::OpenOptions::new().write(true).open(entry).unwrap();
        f.set_len(1000).unwrap();
    }
    server.kill_and_restart().unwrap();
    for key in &keys {
        let (status, source, md5, len) = get(&server, key).unwrap();
        assert_eq!(status, 200);
        assert_eq!(len, SIZE, "{key} whole");
        assert_eq!(md5, objects[key], "{key} correct ({source})");
        assert!(source == "hit" || source == "miss", "{key}: {source}");
    }
    // Everything is cached now, each entry whole.
    settle(&server);
    for key in &keys {
        let (_, source, md5, _) = get(&server, key).unwrap();
        assert_eq!(source, "hit");
        assert_eq!(md5, objects[key]);
    }
    assert_eq!(stat(&server, "objects"), N as u64);
}

/// A node with `--sendfile` and `--verify-reads` as given, holding one object of `size`
/// bytes it has just read cold and committed: the node, the mode in words, the key and
/// the object's MD5.
fn one_object_in_mode(
    sendfile: &str,
    verify: &str,
    size: usize,
) -> Result<(Server, String, String, String)> {
    let how = format!("--sendfile {sendfile} --verify-reads {verify}");
    let server = Server::start(ServerOpts::open().args(&[
        "--sendfile",
        sendfile,
        "--verify-reads",
        verify,
    ]))?;
    let objects = lay_out(&server, 1, size);
    let (key, want) = objects.into_iter().next().unwrap();
    assert_eq!(get(&server, &key)?.1, "miss", "{how}");
    settle(&server);
    Ok((server, how, key, want))
}

/// A block of a cache entry damaged in place after the entry was read (and checked) is
/// never sent: with `--verify-reads true` every hit checks what came from the disk or was
/// written since it was last checked, however the bytes leave (mapped and copied, or
/// `--sendfile`); with `false`, every hit of an entry not yet read whole since the node
/// started. The read is cut short before the block, the entry is dropped and the next
/// read refetches it.
#[test]
fn corrupt_entry_is_cut_short_dropped_and_refetched() -> Result<()> {
    use std::os::unix::fs::FileExt;
    const SIZE: usize = 3 << 20;
    const DAMAGE: usize = (1 << 20) + 10;
    for (sendfile, verify) in [("false", "true"), ("true", "true"), ("false", "false")] {
        let (mut server, how, key, want) = one_object_in_mode(sendfile, verify, SIZE)?;
        assert_eq!(get(&server, &key)?.1, "hit");
        if verify == "false" {
            // Checked once read whole; after a restart, checked again until then.
            server.kill_and_restart()?;
        }
        let entries = cache_entries(&server.data_dir().join("cache"));
        let [entry] = entries.as_slice() else {
            bail!("one entry expected, found {entries:?}")
        };
        // Flip a byte of the second 1 MiB in place, as the disk might.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(entry)?;
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, DAMAGE as u64)?;
        f.write_all_at(&[byte[0] ^ 0xff], DAMAGE as u64)?;
        drop(f);
        let path = format!("/{BUCKET}/{key}");
        let req = request_bytes("GET", &path, server.addr(), &[], b"");
        let cut = raw_request_blocking(server.addr(), &req);
        // Either the connection is cut (an error here) or the body is short: never whole,
        // never the damaged byte.
        if let Ok(r) = cut {
            assert!(
                r.body.len() <= DAMAGE,
                "{how}: {} bytes of a corrupt hit sent",
                r.body.len()
            );
        }
        let (status, source, md5, _) = get(&server, &key)?;
        assert_eq!((status, source.as_str()), (200, "miss"), "{how}: refetched");
        assert_eq!(md5, want, "{how}");
    }
    Ok(())
}

/// Checked hits check what comes from the disk, not what memory holds: a warm object
/// read twice is checked once (the node's `bytes_checked` and `bytes_checked_earlier`
/// say so); a block then damaged on the disk around the page cache (`O_DIRECT`), its
/// pages dropped from memory, is read in again, checked and never sent.
#[test]
fn a_block_damaged_on_the_disk_after_its_pages_left_memory_is_never_sent() -> Result<()> {
    const SIZE: usize = 12 << 20;
    const DAMAGE: u64 = (9 << 20) + 77;
    let (server, how, key, want) = one_object_in_mode("false", "true", SIZE)?;
    let (checked0, earlier0) = (
        stat(&server, "bytes_checked"),
        stat(&server, "bytes_checked_earlier"),
    );
    for _ in 0..2 {
        let (status, source, md5, _) = get(&server, &key)?;
        assert_eq!(
            (status, source.as_str(), md5.as_str()),
            (200, "hit", want.as_str()),
            "{how}"
        );
    }
    let checked = stat(&server, "bytes_checked") - checked0;
    let earlier = stat(&server, "bytes_checked_earlier") - earlier0;
    assert_eq!(
        (checked, earlier),
        (SIZE as u64, SIZE as u64),
        "checked once, sent twice"
    );

    let entries = cache_entries(&server.data_dir().join("cache"));
    let [entry] = entries.as_slice() else {
        bail!("one entry expected, found {entries:?}")
    };
    if !damage_on_disk(entry, DAMAGE)? {
        granary_tests::skip(
            "this filesystem refuses O_DIRECT: nothing to damage around the page cache",
        );
        return Ok(());
    }
    let path = format!("/{BUCKET}/{key}");
    let req = request_bytes("GET", &path, server.addr(), &[], b"");
    if let Ok(r) = raw_request_blocking(server.addr(), &req) {
        assert!(
            r.body.len() as u64 <= DAMAGE,
            "{} bytes of a damaged hit sent",
            r.body.len()
        );
    }
    let (status, source, md5, _) = get(&server, &key)?;
    assert_eq!((status, source.as_str()), (200, "miss"), "refetched");
    assert_eq!(md5, want);
    Ok(())
}

/// A warm hit of a large object leaves as slices of a mapping of its cache file (copied
/// once, by the kernel, into the socket), or with `--sendfile true` from the file itself:
/// byte for byte either way, whether blocks are checked on every read or not; ranges too.
/// `auto` (the default) sends files to readers on other machines only, so a reader on
/// loopback gets the copy.
#[test]
fn large_hits_leave_from_the_cache_file_with_every_byte() -> Result<()> {
    const SIZE: usize = 5 << 20;
    for (sendfile, verify) in [
        ("false", "true"),
        ("false", "false"),
        ("true", "true"),
        ("true", "false"),
        ("auto", "true"),
    ] {
        let (server, how, key, want) = one_object_in_mode(sendfile, verify, SIZE)?;
        let before = stat(&server, "bytes_sent_from_files");
        for _ in 0..2 {
            let (status, source, md5, len) = get(&server, &key)?;
            assert_eq!((status, source.as_str(), len), (200, "hit", SIZE), "{how}");
            assert_eq!(md5, want, "{how}");
        }
        let sent = stat(&server, "bytes_sent_from_files") - before;
        if sendfile == "true" {
            assert!(
                sent >= 2 * SIZE as u64 - (64 << 10),
                "{how}: {sent} bytes by sendfile"
            );
        } else {
            assert_eq!(sent, 0, "{how}: nothing by sendfile");
        }
        // Ranges across windows and check steps, starting and ending mid-block.
        let path = format!("/{BUCKET}/{key}");
        let whole = raw_request_blocking(
            server.addr(),
            &request_bytes("GET", &path, server.addr(), &[], b""),
        )?;
        assert_eq!(whole.body.len(), SIZE, "{how}");
        for (a, b) in [
            (1_000_003usize, 4_500_001usize),
            (0, 0),
            (SIZE - 1, SIZE - 1),
            (65_536, 2_162_687),
        ] {
            let range = format!("bytes={a}-{b}");
            let req = request_bytes("GET", &path, server.addr(), &[("range", &range)], b"");
            let resp = raw_request_blocking(server.addr(), &req)?;
            assert_eq!(resp.status, 206, "{how} {range}");
            assert_eq!(resp.body, &whole.body[a..=b], "{how} {range}");
        }
    }
    Ok(())
}

/// The cache paths over a real S3 server (moto) as the backend.
#[test]
fn cache_over_a_real_s3_backend() -> Result<()> {
    const SMALL: usize = 1 << 20;
    const BIG: usize = 64 << 20;
    let rt = tokio::runtime::Runtime::new()?;
    let moto = Moto::start()?;
    let direct = moto.client();
    let mut objects = HashMap::new();
    let big = Pattern::new(77).bytes(0, BIG);
    let big_md5 = md5_hex(&big);
    rt.block_on(async {
        direct.create_bucket().bucket(BUCKET).send().await?;
        for i in 0..10u64 {
            let data = Pattern::new(500 + i).bytes(0, SMALL);
            let key = format!("small-{i:02}");
            objects.insert(key.clone(), md5_hex(&data));
            direct
                .put_object()
                .bucket(BUCKET)
                .key(&key)
                .body(data.into())
                .send()
                .await?;
        }
        direct
            .put_object()
            .bucket(BUCKET)
            .key("big")
            .body(big.clone().into())
            .send()
            .await?;
        anyhow::Ok(())
    })?;

    // Capacity: the big object and 5 of the 10 small ones.
    let capacity = (BIG + 5 * SMALL).to_string();
    let mut server =
        Server::start(ServerOpts::s3_backend(&moto.url()).args(&["--cache-capacity", &capacity]))?;
    let addr = server.addr();

    // A cold range read streams the range while the object fills.
    let req = request_bytes(
        "GET",
        &format!("/{BUCKET}/big"),
        addr,
        &[("range", "bytes=100-199")],
        b"",
    );
    let resp = raw_request_blocking(addr, &req)?;
    assert_eq!(resp.status, 206);
    assert_eq!(resp.body, &big[100..200]);
    assert_eq!(resp.header("x-granary-cache"), Some("miss"));

    // 32 concurrent reads of it: equal bytes, the backend read once.
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..32).map(|_| sc.spawn(|| get(&server, "big"))).collect();
        for h in hs {
            let (status, _, md5, len) = h.join().unwrap().unwrap();
            assert_eq!((status, len), (200, BIG));
            assert_eq!(md5, big_md5);
        }
    });
    assert_eq!(
        stat(&server, "bytes_from_backend"),
        BIG as u64,
        "one backend fetch of the big object"
    );
    settle(&server);

    // Two epochs over the small objects: the admitted five hit in the second.
    let epochs = run_epochs(&server, &objects, 2);
    assert_eq!(epochs[0].1.get("miss"), Some(&5));
    assert_eq!(epochs[1].0.len(), 5, "epoch 2 hits the admitted set");
    assert_eq!(stat(&server, "used_bytes"), (BIG + 5 * SMALL) as u64);

    // A write through the node reaches S3 and replaces the cached copy.
    let key = epochs[1].0.iter().next().unwrap().clone();
    let new = Pattern::new(999).bytes(0, 1000);
    let put = raw_request_blocking(
        addr,
        &request_bytes("PUT", &format!("/{BUCKET}/{key}"), addr, &[], &new),
    )?;
    assert_eq!(put.status, 200);
    let in_s3 = rt.block_on(async {
        let got = direct.get_object().bucket(BUCKET).key(&key).send().await?;
        anyhow::Ok(got.body.collect().await?.into_bytes())
    })?;
    assert_eq!(in_s3.as_ref(), &new[..], "written through to S3");
    let (status, _, md5, _) = get(&server, &key)?;
    assert_eq!(
        (status, md5),
        (200, md5_hex(&new)),
        "the old cached copy is gone"
    );

    // A restart keeps the committed entries.
    settle(&server);
    server.kill_and_restart()?;
    let (status, source, md5, _) = get(&server, "big")?;
    assert_eq!((status, source.as_str()), (200, "hit"));
    assert_eq!(md5, big_md5);
    Ok(())
}

#[test]
fn cold_range_far_into_an_object_is_read_at_once_while_it_fills() -> Result<()> {
    const SIZE: usize = 64 << 20;
    let server = Server::start(ServerOpts::open())?;
    let objects = lay_out(&server, 1, SIZE);
    let (key, want) = objects.iter().next().unwrap();
    let data = Pattern::new(1000).bytes(0, SIZE);
    let (a, b) = (SIZE - 100, SIZE - 1);
    let range = format!("bytes={a}-{b}");
    let path = format!("/{BUCKET}/{key}");
    let req = request_bytes("GET", &path, server.addr(), &[("range", &range)], b"");
    let resp = raw_request_blocking(server.addr(), &req)?;
    assert_eq!(resp.status, 206);
    assert_eq!(resp.body, &data[a..=b]);
    assert_eq!(resp.header("x-granary-cache"), Some("miss"));
    settle(&server);
    // The whole object once for the fill, and the range once for the reader.
    assert_eq!(stat(&server, "bytes_from_backend"), (SIZE + 100) as u64);
    let (status, source, md5, _) = get(&server, key)?;
    assert_eq!((status, source.as_str()), (200, "hit"));
    assert_eq!(&md5, want);
    Ok(())
}

#[test]
fn small_hot_objects_follow_writes_and_deletes() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let objects = lay_out(&server, 1, 100 << 10);
    let (key, want) = objects.iter().next().unwrap();
    assert_eq!(get(&server, key)?.1, "miss");
    settle(&server);
    for _ in 0..3 {
        let (status, source, md5, _) = get(&server, key)?;
        assert_eq!(
            (status, source.as_str(), md5.as_str()),
            (200, "hit", want.as_str())
        );
    }
    // A range of a small hit.
    let path = format!("/{BUCKET}/{key}");
    let req = request_bytes(
        "GET",
        &path,
        server.addr(),
        &[("range", "bytes=10-19")],
        b"",
    );
    let r = raw_request_blocking(server.addr(), &req)?;
    assert_eq!(r.status, 206);
    assert_eq!(r.body, Pattern::new(1000).bytes(10, 10));
    // Overwrite through the node: the next read has the new bytes.
    let new = b"new contents".to_vec();
    let put = raw_request_blocking(
        server.addr(),
        &request_bytes("PUT", &path, server.addr(), &[], &new),
    )?;
    assert_eq!(put.status, 200);
    let (status, source, md5, len) = get(&server, key)?;
    assert_eq!((status, len, md5), (200, new.len(), md5_hex(&new)));
    assert_eq!(source, "hit", "a write through the node is cached");
    // Delete through the node: gone.
    let del = raw_request_blocking(
        server.addr(),
        &request_bytes("DELETE", &path, server.addr(), &[], b""),
    )?;
    assert_eq!(del.status, 204);
    assert_eq!(get(&server, key)?.0, 404);
    Ok(())
}

/// Cold reads over S3 open the object with one GET and decide on its answer: an admitted
/// read fills; a full cache serves a Range as exactly those bytes (a second, pinned GET);
/// conditionals and missing keys answer as S3 does.
#[test]
fn cold_reads_over_s3_whole_ranged_and_conditional() -> Result<()> {
    let origin = Origin::s3();
    // Room for the first object only.
    let server = origin.start(&["--cache-capacity", "100KiB"]);
    let objects = origin.lay_out(&server, 2, 64 * 1024);
    let data = |i: u64| Pattern::new(1000 + i).bytes(0, 64 * 1024);

    let (status, source, md5, _) = get(&server, "shard-0000.tar")?;
    assert_eq!((status, source.as_str()), (200, "miss"));
    assert_eq!(md5, objects["shard-0000.tar"]);
    settle(&server);
    assert_eq!(stat(&server, "objects"), 1);

    // Not admitted: a Range is served from the backend as exactly its bytes.
    let path = format!("/{BUCKET}/shard-0001.tar");
    let req = request_bytes(
        "GET",
        &path,
        server.addr(),
        &[("range", "bytes=1000-1999")],
        b"",
    );
    let resp = raw_request_blocking(server.addr(), &req)?;
    assert_eq!(resp.status, 206);
    assert_eq!(resp.header("x-granary-cache"), Some("bypass"));
    assert_eq!(resp.body, data(1)[1000..2000]);
    assert_eq!(resp.header("content-range"), Some("bytes 1000-1999/65536"));

    // A conditional GET of a cold object is decided on the object's ETag.
    let etag = format!("\"{}\"", objects["shard-0001.tar"]);
    let req = request_bytes(
        "GET",
        &path,
        server.addr(),
        &[("if-none-match", &etag)],
        b"",
    );
    let resp = raw_request_blocking(server.addr(), &req)?;
    assert_eq!(resp.status, 304);
    assert!(resp.body.is_empty());
    let req = request_bytes(
        "GET",
        &path,
        server.addr(),
        &[("if-match", "\"0123456789abcdef0123456789abcdef\"")],
        b"",
    );
    raw_request_blocking(server.addr(), &req)?.assert_s3_error(412, &["PreconditionFailed"]);

    let (status, _, _, _) = get(&server, "shard-0009.tar")?;
    assert_eq!(status, 404);
    let (status, source, md5, _) = get(&server, "shard-0001.tar")?;
    assert_eq!((status, source.as_str()), (200, "bypass"));
    assert_eq!(md5, objects["shard-0001.tar"]);
    Ok(())
}

/// `field` of the node's stats once it reaches `want` (a read is counted as its answer
/// ends, a moment after the client has it), or what it is after 2 s.
fn counted(server: &Server, field: &str, want: u64) -> u64 {
    for _ in 0..80 {
        let n = stat(server, field);
        if n >= want {
            return n;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    stat(server, field)
}

/// `Client::get` of an object larger than its first request's 32 MiB: a miss comes on
/// one connection behind the fill (the backend reads it once), a hit in 32 MiB parts over
/// several connections at once; either way every byte is the object's, into new memory
/// (`get`) or the caller's (`get_to_slice`). An empty object and one of exactly 32 MiB
/// come in one answer.
#[test]
fn large_reads_split_over_connections_are_whole_and_fetched_once() -> Result<()> {
    const FIRST: usize = 32 << 20;
    let server = Server::start(ServerOpts::open())?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    let sizes = [0, 1000, FIRST, FIRST + 1, 3 * FIRST + 12_345];
    let mut client = granary_client::Client::new(&server.url())?.with_streams(4);
    for (i, &size) in sizes.iter().enumerate() {
        let key = format!("big-{i}");
        let data = Pattern::new(77 + i as u64).bytes(0, size);
        std::fs::write(dir.join(&key), &data)?;
        let (backend, hits, misses) = (
            stat(&server, "bytes_from_backend"),
            stat(&server, "hits"),
            stat(&server, "misses"),
        );
        let got = client.get(BUCKET, &key)?;
        assert!(got == data, "{key}: cold read of {size} bytes differs");
        assert_eq!(
            stat(&server, "bytes_from_backend") - backend,
            size as u64,
            "{key}"
        );
        // The first answer is a miss; the rest's, read behind the fill, a miss too, or a
        // hit where the fill committed before it was asked for.
        let cold_reads = u64::from(size > FIRST) + 1;
        let answered = || stat(&server, "misses") - misses + stat(&server, "hits") - hits;
        for _ in 0..80 {
            if answered() >= cold_reads {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        assert_eq!(answered(), cold_reads, "{key}");
        assert!(stat(&server, "misses") > misses, "{key}: not a miss");
        settle(&server);
        // An empty object's fill reserves nothing, so `settle` does not wait for it.
        for _ in 0..80 {
            if size > 0 || get(&server, &key)?.1 == "hit" {
                break;
            }
            std::thread::sleep(Duration::from_millis(25));
        }

        let hits = stat(&server, "hits");
        assert!(
            client.get(BUCKET, &key)? == data,
            "{key}: warm read differs"
        );
        // The first 32 MiB, then the rest in 32 MiB parts.
        let parts = 1 + size.saturating_sub(FIRST).div_ceil(FIRST) as u64;
        assert_eq!(
            counted(&server, "hits", hits + parts),
            hits + parts,
            "{key}: warm read"
        );
        let mut buf = vec![0xa5u8; size + 7];
        let n = client.get_to_slice(BUCKET, &key, &Default::default(), &mut buf)?;
        assert_eq!(n, size, "{key}");
        assert!(buf[..size] == data[..], "{key}: get_to_slice differs");
        assert_eq!(
            &buf[size..],
            &[0xa5u8; 7],
            "{key}: bytes past the object written"
        );
        if size > 0 {
            let mut small = vec![0u8; size - 1];
            let e = client.get_to_slice(BUCKET, &key, &Default::default(), &mut small);
            assert!(
                matches!(e, Err(granary_client::Error::Invalid(_))),
                "{key}: a buffer one byte short: {e:?}"
            );
        }
        let mut one = granary_client::Client::new(&server.url())?.with_streams(1);
        let hits = stat(&server, "hits");
        assert!(one.get(BUCKET, &key)? == data, "{key}: one connection");
        assert_eq!(
            counted(&server, "hits", hits + 1),
            hits + 1,
            "{key}: one connection"
        );
    }
    assert_eq!(
        stat(&server, "bytes_from_backend"),
        sizes.iter().sum::<usize>() as u64
    );
    Ok(())
}

/// A split read signs every part: against a node that requires SigV4 the parts (each with
/// its `Range` and `If-Match` signed) come whole, and an unsigned client is refused at
/// its first request.
#[test]
fn large_reads_split_over_connections_sign_every_part() -> Result<()> {
    const SIZE: usize = (100 << 20) + 3;
    let server = Server::start(ServerOpts::with_credentials())?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    let data = Pattern::new(5).bytes(0, SIZE);
    std::fs::write(dir.join("big"), &data)?;
    let mut client = granary_client::Client::new(&server.url())?
        .with_credentials(granary_tests::ACCESS, granary_tests::SECRET, "us-east-1")
        .with_streams(4);
    assert!(client.get(BUCKET, "big")? == data, "cold");
    settle(&server);
    let hits = stat(&server, "hits");
    assert!(client.get(BUCKET, "big")? == data, "warm");
    assert_eq!(
        counted(&server, "hits", hits + 4),
        hits + 4,
        "32 MiB, then 3 parts"
    );
    let mut open = granary_client::Client::new(&server.url())?.with_streams(4);
    match open.get(BUCKET, "big") {
        Err(granary_client::Error::S3 { status: 403, .. }) => {}
        other => panic!("an unsigned split read: {:?}", other.map(|b| b.len())),
    }
    Ok(())
}

/// A GET read by a slow client (64 KiB at a time, a pause after each, a small receive
/// buffer), so that the node's send of each piece waits on it: the status, the `x-granary-cache`
/// header, and the body, `None` where the answer was cut short of its `Content-Length`.
fn slow_get(addr: std::net::SocketAddr, path: &str) -> Result<(u16, String, Option<Vec<u8>>)> {
    use std::io::{Read, Write};
    use std::os::fd::AsRawFd;
    let mut s = std::net::TcpStream::connect(addr)?;
    let small: libc::c_int = 64 << 10;
    // SAFETY: setting an option of our own socket from a local value.
    unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&small as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    s.set_read_timeout(Some(Duration::from_secs(30)))?;
    s.write_all(&request_bytes("GET", path, addr, &[], b""))?;
    let mut r = std::io::BufReader::with_capacity(64 << 10, s);
    let (status, headers) = granary_tests::read_response_head(&mut r)?;
    let field = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.clone())
    };
    let length: usize = field("content-length").unwrap_or_default().parse()?;
    let source = field("x-granary-cache").unwrap_or_default();
    let mut body = Vec::with_capacity(length);
    let mut buf = vec![0u8; 64 << 10];
    while body.len() < length {
        match r.read(&mut buf) {
            Ok(0) | Err(_) => return Ok((status, source, None)),
            Ok(n) => body.extend_from_slice(&buf[..n]),
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    Ok((status, source, Some(body)))
}

/// Every byte a hit sends is a byte that was checked, whatever the kernel reclaims while
/// it is sent. The node's data directory is an ext4 filesystem on a loop device. A warm
/// entry is damaged on that device, a byte in every MiB: its times untouched, the good
/// bytes still in the page cache. Then, while slow clients take large hits and a client
/// on the node's machine copies the object out of the cache file, the node's memory
/// cgroup is squeezed in a loop, so that every page not locked is reclaimed and read in
/// again from the damaged disk. No complete answer and no copy kept carries a damaged
/// byte:
/// - a node that may lock memory sends its sealed windows from locked pages, which never
///   leave memory: every answer comes whole and right;
/// - one that may not (no `CAP_IPC_LOCK`, `RLIMIT_MEMLOCK` 0) reads each window into a
///   buffer and checks it there, and cuts the answer where the check fails, and the
///   client checks its copies against the blocks' checksums.
#[test]
fn no_answer_carries_a_page_reclaimed_and_read_in_damaged() -> Result<()> {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const SIZE: usize = 24 << 20;
    const ROUNDS: usize = 6;
    let fs = match granary_tests::disk::LoopFs::make(256) {
        Ok(fs) => fs,
        Err(why) => {
            granary_tests::skip(&format!("no loop-device filesystem: {why}"));
            return Ok(());
        }
    };
    let squeeze = match granary_tests::disk::Squeeze::new() {
        Ok(s) => s,
        Err(why) => {
            granary_tests::skip(&format!("no memory cgroup to reclaim from: {why}"));
            return Ok(());
        }
    };
    let origin = tempfile::tempdir()?;
    std::fs::create_dir_all(origin.path().join(BUCKET))?;
    let data = Pattern::new(77).bytes(0, SIZE);
    std::fs::write(origin.path().join(BUCKET).join("obj"), &data)?;
    let want = md5_hex(&data);
    let backend = format!("fs:{}", origin.path().display());
    for locks in [true, false] {
        let dir = fs.dir().join(format!("node-{locks}"));
        let sock = origin.path().join(format!("node-{locks}.sock"));
        let mut opts = ServerOpts::open().data_dir(&dir).args(&[
            "--backend",
            &backend,
            "--verify-reads",
            "true",
            "--listen-unix",
            sock.to_str().unwrap(),
        ]);
        if !locks {
            opts = opts.wrapped(&[
                "prlimit",
                "--memlock=0:0",
                "setpriv",
                "--bounding-set",
                "-ipc_lock",
                "--inh-caps",
                "-ipc_lock",
            ]);
        }
        let server = Server::start(opts)?;
        squeeze.add(server.pid())?;
        let path = format!("/{BUCKET}/obj");
        let (_, source, md5, _) = get(&server, "obj")?;
        assert_eq!((source.as_str(), md5.as_str()), ("miss", want.as_str()));
        settle(&server);
        for _ in 0..2 {
            let (_, source, md5, _) = get(&server, "obj")?;
            assert_eq!(
                (source.as_str(), md5.as_str()),
                ("hit", want.as_str()),
                "locks {locks}"
            );
        }
        let locked = server.stat("locked_bytes");
        if locks && locked == 0 {
            granary_tests::skip("this process may not lock memory: no window is sealed");
            continue;
        }
        assert_eq!(
            locked,
            if locks { SIZE as u64 } else { 0 },
            "locks {locks}: sealed"
        );

        let entries = cache_entries(&dir.join("cache"));
        let [entry] = entries.as_slice() else {
            bail!("one entry expected, found {entries:?}")
        };
        let spots: Vec<u64> = (0..SIZE as u64 >> 20)
            .map(|m| (m << 20) + 4097 + m)
            .collect();
        for &at in &spots {
            fs.damage(entry, at)?;
        }
        match fs.on_disk(entry, spots[3])? {
            None => {
                granary_tests::skip(
                    "this filesystem refuses O_DIRECT: the damage cannot be confirmed",
                );
                continue;
            }
            Some(b) => assert_ne!(b, data[spots[3] as usize], "the disk holds the damage"),
        }

        let stop = AtomicBool::new(false);
        let squeezes = AtomicU64::new(0);
        let (mut whole, mut cut, mut copies, mut refused) = (0, 0, 0, 0);
        std::thread::scope(|s| -> Result<()> {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    squeeze.squeeze();
                    squeezes.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            let mut run = || -> Result<()> {
                // The reads begin once the squeezing has: pages that are not locked are
                // out of memory by then.
                while squeezes.load(Ordering::Relaxed) < 5 {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let mut local = granary_client::Client::new(&format!("unix:{}", sock.display()))?;
                for round in 0..ROUNDS {
                    let opts = granary_client::GetOptions::default();
                    match local.get_resident(BUCKET, "obj", &opts) {
                        Ok(copy) => {
                            assert!(
                                copy == data,
                                "locks {locks}, round {round}: a damaged copy kept"
                            );
                            copies += 1;
                        }
                        Err(_) => refused += 1,
                    }
                    let (status, source, body) = slow_get(server.addr(), &path)?;
                    match body {
                        Some(body) => {
                            assert_eq!(status, 200, "locks {locks}, round {round}");
                            assert_eq!(
                                md5_hex(&body),
                                want,
                                "locks {locks}, round {round}: a complete answer ({source}) with damaged bytes"
                            );
                            whole += 1;
                        }
                        None => cut += 1,
                    }
                }
                Ok(())
            };
            // The squeezing stops however the reads end, a failed assertion too.
            struct Stop<'a>(&'a AtomicBool);
            impl Drop for Stop<'_> {
                fn drop(&mut self) {
                    self.0.store(true, Ordering::Relaxed);
                }
            }
            let _stop = Stop(&stop);
            run()
        })?;
        let squeezes = squeezes.into_inner();
        eprintln!(
            "locks {locks}: {whole} whole answers, {cut} cut, {copies} copies, {refused} refused, {squeezes} squeezes, misses {}",
            server.stat("misses")
        );
        assert!(squeezes > 10, "the cgroup was squeezed while the hits ran");
        if locks {
            assert_eq!(
                (whole, copies),
                (ROUNDS, ROUNDS),
                "sealed windows never leave memory: every answer whole and right"
            );
            assert_eq!(server.stat("locked_bytes"), SIZE as u64);
        } else {
            assert!(
                cut + refused > 0 || server.stat("misses") > 1,
                "the squeeze read damaged pages in, and the checks caught them"
            );
        }
        let (_, _, md5, _) = get(&server, "obj")?;
        assert_eq!(md5, want, "locks {locks}: the right bytes after");
    }
    Ok(())
}
