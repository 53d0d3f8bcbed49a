//! `granary_client::Dataset` against the real binary: tar shards uploaded through the
//! client, then read as 4 ranks for 2 epochs — every sample exactly once per epoch with
//! its bytes intact, each rank reading only its own shards, a different order each epoch —
//! streamed, and with read-ahead and a shuffle buffer; `.tar.gz`/`.tgz` shards among
//! them; and the same through a node that requires SigV4, which the client signs.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use granary_client::{Client, Dataset, Sample};
use granary_tests::{gzip, tar_of, Pattern, Server, ServerOpts, ACCESS, SECRET};

const BUCKET: &str = "training";
const PREFIX: &str = "train/";
const SHARDS: usize = 12;
const PER_SHARD: usize = 20;
const WORLD: usize = 4;

/// The samples of the data set: key -> (`cls`, `bin`), and each shard's object key.
struct Source {
    samples: BTreeMap<String, (Vec<u8>, Vec<u8>)>,
    shards: Vec<String>,
}

/// Uploads 12 shards of 20 samples (`.cls` and `.bin` of up to 40 KiB, distinct bytes
/// each); shard 3 is a `.tar.gz` and shard 7 a `.tgz`. A README beside them is not a shard.
fn upload(client: &mut Client) -> Result<Source> {
    client.create_bucket(BUCKET)?;
    let mut samples = BTreeMap::new();
    let mut shards = Vec::new();
    for s in 0..SHARDS {
        let mut members = Vec::new();
        for i in 0..PER_SHARD {
            let key = format!("s{s:02}/{i:04}");
            let cls = format!("{}", (s * PER_SHARD + i) % 10).into_bytes();
            let size = 1 + (s * 7919 + i * 104_729) % (40 << 10);
            let bin = Pattern::new((s * PER_SHARD + i) as u64).bytes(0, size);
            members.push((format!("{key}.cls"), cls.clone()));
            members.push((format!("{key}.bin"), bin.clone()));
            samples.insert(key, (cls, bin));
        }
        let tar = tar_of(&members);
        let (name, bytes) = match s {
            3 => (format!("{PREFIX}shard-{s:04}.tar.gz"), gzip(&tar)),
            7 => (format!("{PREFIX}shard-{s:04}.tgz"), gzip(&tar)),
            _ => (format!("{PREFIX}shard-{s:04}.tar"), tar),
        };
        let etag = client.put(BUCKET, &name, &mut bytes.as_slice(), bytes.len() as u64)?;
        assert_eq!(etag, granary_tests::md5_hex(&bytes), "{name}");
        shards.push(name);
    }
    client.put_bytes(BUCKET, &format!("{PREFIX}README.md"), b"not a shard")?;
    Ok(Source { samples, shards })
}

/// One rank's reading of one epoch: its samples in order, and its shards in order.
struct RankRead {
    samples: Vec<Sample>,
    shards: Vec<String>,
}

/// Reads `epoch` as every rank, concurrently.
fn read_epoch(
    server: &Server,
    epoch: u64,
    read_ahead: usize,
    shuffle_buffer: usize,
    creds: bool,
) -> Vec<RankRead> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..WORLD)
            .map(|rank| {
                scope.spawn(move || {
                    let mut b = Dataset::builder()
                        .endpoint(&server.url())
                        .bucket(BUCKET)
                        .prefix(PREFIX)
                        .seed(2024)
                        .rank(rank)
                        .world_size(WORLD)
                        .read_ahead(read_ahead)
                        .shuffle_buffer(shuffle_buffer);
                    if creds {
                        b = b.credentials(ACCESS, SECRET, "us-east-1");
                    }
                    let ds = b.build().unwrap();
                    let samples = ds
                        .epoch(epoch)
                        .collect::<granary_client::Result<Vec<_>>>()
                        .unwrap();
                    RankRead {
                        samples,
                        shards: ds.epoch_shards(epoch),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Every sample of the source exactly once across ranks, with its bytes; each rank's
/// samples from its own shards only; ranks' shards a partition of all shards.
fn check_epoch(source: &Source, reads: &[RankRead]) {
    let mut seen = BTreeSet::new();
    let mut all_shards = Vec::new();
    for (rank, r) in reads.iter().enumerate() {
        assert_eq!(r.shards.len(), SHARDS / WORLD, "rank {rank}");
        all_shards.extend(r.shards.iter().cloned());
        let mine: BTreeSet<&String> = r.shards.iter().collect();
        assert_eq!(r.samples.len(), PER_SHARD * SHARDS / WORLD, "rank {rank}");
        for s in &r.samples {
            assert!(seen.insert(s.key.clone()), "{} read twice", s.key);
            assert!(
                mine.contains(&s.shard),
                "rank {rank} read {} of {}",
                s.key,
                s.shard
            );
            let (cls, bin) = &source.samples[&s.key];
            assert_eq!(s.fields.len(), 2, "{}", s.key);
            assert_eq!(s.get("cls"), Some(cls.as_slice()), "{}", s.key);
            assert_eq!(s.get("bin").map(<[u8]>::len), Some(bin.len()), "{}", s.key);
            assert!(
                s.get("bin") == Some(bin.as_slice()),
                "{} bin bytes differ",
                s.key
            );
        }
    }
    let want: BTreeSet<String> = source.samples.keys().cloned().collect();
    assert_eq!(seen, want);
    all_shards.sort();
    let mut want_shards = source.shards.clone();
    want_shards.sort();
    assert_eq!(all_shards, want_shards);
}

fn keys(reads: &[RankRead]) -> Vec<Vec<String>> {
    reads
        .iter()
        .map(|r| r.samples.iter().map(|s| s.key.clone()).collect())
        .collect()
}

fn shard_lists(reads: &[RankRead]) -> Vec<Vec<String>> {
    reads.iter().map(|r| r.shards.clone()).collect()
}

/// Whether samples of one shard come out in a run (no shuffle buffer) or mixed.
fn shard_runs(r: &RankRead) -> usize {
    let mut runs = 0;
    let mut last: Option<&str> = None;
    for s in &r.samples {
        if last != Some(s.shard.as_str()) {
            runs += 1;
            last = Some(&s.shard);
        }
    }
    runs
}

#[test]
fn four_ranks_read_every_sample_once_per_epoch() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let mut client = Client::new(&server.url())?;
    let source = upload(&mut client)?;

    // Streamed shards, no sample shuffle.
    let e0 = read_epoch(&server, 0, 0, 0, false);
    let e1 = read_epoch(&server, 1, 0, 0, false);
    check_epoch(&source, &e0);
    check_epoch(&source, &e1);
    assert_ne!(shard_lists(&e0), shard_lists(&e1), "shard order repeats");
    assert_ne!(keys(&e0), keys(&e1), "sample order repeats");
    for r in e0.iter().chain(&e1) {
        // Without a shuffle buffer, a rank reads its shards one after another, in order.
        assert_eq!(shard_runs(r), SHARDS / WORLD);
        let order: Vec<&String> = r.samples.iter().map(|s| &s.shard).collect::<Vec<_>>();
        let mut firsts: Vec<&String> = Vec::new();
        for s in order {
            if firsts.last() != Some(&s) {
                firsts.push(s);
            }
        }
        assert_eq!(firsts, r.shards.iter().collect::<Vec<_>>());
    }

    // Read-ahead and a shuffle buffer: the same samples and shards, mixed order.
    let m0 = read_epoch(&server, 0, 2, 16, false);
    let m1 = read_epoch(&server, 1, 2, 16, false);
    check_epoch(&source, &m0);
    check_epoch(&source, &m1);
    assert_eq!(
        shard_lists(&m0),
        shard_lists(&e0),
        "shard order depends on the seed only"
    );
    assert_ne!(keys(&m0), keys(&m1));
    assert_ne!(keys(&m0), keys(&e0), "the shuffle buffer changed nothing");
    assert!(m0.iter().any(|r| shard_runs(r) > SHARDS / WORLD));

    // The same epoch read again is the same order (a resumed job sees what it saw).
    let m0_again = read_epoch(&server, 0, 2, 16, false);
    assert_eq!(keys(&m0_again), keys(&m0));

    // The second reading of everything came from the cache.
    let stats = client.stats()?;
    assert!(
        stats["hits"].as_u64().unwrap_or(0) >= SHARDS as u64,
        "{stats}"
    );
    Ok(())
}

#[test]
fn a_node_that_requires_sigv4_serves_a_signed_dataset() -> Result<()> {
    let server = Server::start(ServerOpts::with_credentials())?;
    let mut client = Client::new(&server.url())?.with_credentials(ACCESS, SECRET, "us-east-1");
    let source = upload(&mut client)?;

    // Signed object calls round-trip.
    let key = &source.shards[0];
    let meta = client.stat(BUCKET, key)?;
    let whole = client.get(BUCKET, key)?;
    assert_eq!(meta.size, whole.len() as u64);
    assert_eq!(
        meta.etag.as_deref(),
        Some(granary_tests::md5_hex(&whole).as_str())
    );
    assert_eq!(client.get_range(BUCKET, key, 512..1024)?, whole[512..1024]);
    let (cls, _) = &source.samples["s00/0003"];
    assert_eq!(client.get_member(BUCKET, key, "s00/0003.cls")?, *cls);
    let listed: Vec<String> = client
        .list(BUCKET, PREFIX)?
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(listed.len(), SHARDS + 1);
    assert_eq!(client.list_buckets()?, vec![BUCKET.to_owned()]);

    // Unsigned: refused with the S3 code.
    let mut anonymous = Client::new(&server.url())?;
    let err = anonymous.get(BUCKET, key).unwrap_err();
    assert_eq!(err.status(), Some(403));
    assert_eq!(err.code(), Some("AccessDenied"));
    // Wrong secret: the signature does not match.
    let mut wrong =
        Client::new(&server.url())?.with_credentials(ACCESS, "not-the-secret", "us-east-1");
    let err = wrong.stat(BUCKET, key).unwrap_err();
    assert_eq!(err.status(), Some(403));
    let err = wrong.get(BUCKET, key).unwrap_err();
    assert_eq!(err.code(), Some("SignatureDoesNotMatch"));
    let err = Dataset::builder()
        .endpoint(&server.url())
        .bucket(BUCKET)
        .prefix(PREFIX)
        .build()
        .err()
        .expect("an unsigned listing is refused");
    assert_eq!(err.status(), Some(403));

    let e0 = read_epoch(&server, 0, 1, 8, true);
    check_epoch(&source, &e0);

    // Signed deletes.
    client.delete(BUCKET, key)?;
    assert!(client.stat(BUCKET, key).unwrap_err().is_not_found());
    Ok(())
}
