//! `granary_client::Dataset` against the real binary: tar shards uploaded through the
//! client, then read as 4 ranks for 2 epochs — every sample exactly once per epoch with
//! its bytes intact, every rank the same count, each rank's samples in the order its plan
//! said, a different order each epoch and the same order for the same epoch — without
//! and with read-ahead and a shuffle buffer; `.tar.gz`/`.tgz` shards among them; a world
//! size that does not divide the samples (padding, or `drop_last`); a shard rewritten
//! after it was listed; an empty prefix; and the same through a node that requires SigV4,
//! which the client signs.

use std::collections::{BTreeMap, BTreeSet};

use anyhow::Result;
use granary_client::{Client, Dataset, Error, Sample};
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

/// How every rank reads.
#[derive(Clone, Copy)]
struct Opts {
    world: usize,
    read_ahead: usize,
    shuffle_buffer: usize,
    drop_last: bool,
    creds: bool,
}

impl Opts {
    fn new(read_ahead: usize, shuffle_buffer: usize) -> Opts {
        Opts {
            world: WORLD,
            read_ahead,
            shuffle_buffer,
            drop_last: false,
            creds: false,
        }
    }
}

fn dataset(server: &Server, rank: usize, o: Opts) -> granary_client::Result<Dataset> {
    let mut b = Dataset::builder()
        .endpoint(&server.url())
        .bucket(BUCKET)
        .prefix(PREFIX)
        .seed(2024)
        .rank(rank)
        .world_size(o.world)
        .drop_last(o.drop_last)
        .read_ahead(o.read_ahead)
        .shuffle_buffer(o.shuffle_buffer);
    if o.creds {
        b = b.credentials(ACCESS, SECRET, "us-east-1");
    }
    b.build()
}

/// A sample's shard and its place in it, from its key (`sSS/IIII`).
fn place(s: &Sample) -> (String, u32) {
    let index = s.key.rsplit('/').next().unwrap().parse().unwrap();
    (s.shard.clone(), index)
}

/// One rank's reading of one epoch: its samples in order, what its plan said it would
/// read (shard, place), and the count it announced.
struct RankRead {
    samples: Vec<Sample>,
    plan: Vec<(String, u32)>,
    epoch_len: usize,
}

/// Reads `epoch` as every rank, concurrently.
fn read_epoch(server: &Server, epoch: u64, o: Opts) -> Vec<RankRead> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..o.world)
            .map(|rank| {
                scope.spawn(move || {
                    let ds = dataset(server, rank, o).unwrap();
                    assert_eq!(ds.shards().len(), SHARDS);
                    assert_eq!(ds.len(), SHARDS * PER_SHARD);
                    let plan = ds
                        .plan(epoch)
                        .unwrap()
                        .into_iter()
                        .map(|id| (ds.shards()[id.shard as usize].key.clone(), id.index))
                        .collect();
                    let samples = ds
                        .epoch(epoch)
                        .collect::<granary_client::Result<Vec<_>>>()
                        .unwrap();
                    RankRead {
                        samples,
                        plan,
                        epoch_len: ds.epoch_len(),
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// Each rank's samples are its plan, as many as it announced, each with its bytes; the
/// samples of all ranks together, with how often each was read.
fn check_reads(source: &Source, reads: &[RankRead], per_rank: usize) -> BTreeMap<String, usize> {
    let mut seen = BTreeMap::new();
    for (rank, r) in reads.iter().enumerate() {
        assert_eq!(r.epoch_len, per_rank, "rank {rank}");
        assert_eq!(r.samples.len(), per_rank, "rank {rank}");
        let got: Vec<(String, u32)> = r.samples.iter().map(place).collect();
        assert_eq!(got, r.plan, "rank {rank} read other than it planned");
        for s in &r.samples {
            *seen.entry(s.key.clone()).or_insert(0) += 1;
            let (cls, bin) = &source.samples[&s.key];
            assert_eq!(s.fields.len(), 2, "{}", s.key);
            assert_eq!(s.get("cls"), Some(cls.as_slice()), "{}", s.key);
            assert_eq!(s.get("bin").map(<[u8]>::len), Some(bin.len()), "{}", s.key);
            assert!(
                s.get("bin") == Some(bin.as_slice()),
                "{} bin bytes differ",
                s.key
            );
            let shard = &source.shards[s.key[1..3].parse::<usize>().unwrap()];
            assert_eq!(&s.shard, shard, "{}", s.key);
        }
    }
    seen
}

/// Every sample of the source exactly once across the ranks, each rank an equal share.
fn check_epoch(source: &Source, reads: &[RankRead]) {
    let seen = check_reads(source, reads, SHARDS * PER_SHARD / reads.len());
    assert!(seen.values().all(|&n| n == 1), "a sample read twice");
    let want: BTreeSet<&String> = source.samples.keys().collect();
    assert_eq!(seen.keys().collect::<BTreeSet<_>>(), want);
}

fn keys(reads: &[RankRead]) -> Vec<Vec<String>> {
    reads
        .iter()
        .map(|r| r.samples.iter().map(|s| s.key.clone()).collect())
        .collect()
}

/// Each rank's keys as a set: which samples it read, whatever the order.
fn key_sets(reads: &[RankRead]) -> Vec<BTreeSet<String>> {
    keys(reads).into_iter().map(BTreeSet::from_iter).collect()
}

/// The shards of a rank's samples, one entry per run of consecutive samples of a shard.
fn shard_runs(r: &RankRead) -> Vec<&str> {
    let mut runs: Vec<&str> = Vec::new();
    for s in &r.samples {
        if runs.last() != Some(&s.shard.as_str()) {
            runs.push(&s.shard);
        }
    }
    runs
}

#[test]
fn four_ranks_read_every_sample_once_per_epoch() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let mut client = Client::new(&server.url())?;
    let source = upload(&mut client)?;

    // No read-ahead, no sample shuffle.
    let e0 = read_epoch(&server, 0, Opts::new(0, 0));
    let e1 = read_epoch(&server, 1, Opts::new(0, 0));
    check_epoch(&source, &e0);
    check_epoch(&source, &e1);
    assert_ne!(keys(&e0), keys(&e1), "sample order repeats");
    for e in [&e0, &e1] {
        // Shards of 20 and spans of 60: without a shuffle buffer each rank reads 3 whole
        // shards, one after another, each front to back; together, every shard once.
        let mut all_shards = Vec::new();
        for r in e.iter() {
            let runs = shard_runs(r);
            assert_eq!(runs.len(), SHARDS / WORLD, "{runs:?}");
            all_shards.extend(runs.iter().map(|s| s.to_string()));
            let places: Vec<(String, u32)> = r.samples.iter().map(place).collect();
            for (i, (shard, index)) in places.iter().enumerate() {
                assert_eq!(*index as usize, i % PER_SHARD, "{shard}");
            }
        }
        all_shards.sort();
        let mut want_shards = source.shards.clone();
        want_shards.sort();
        assert_eq!(all_shards, want_shards);
    }

    // Read-ahead and a shuffle buffer: each rank the same samples, in a mixed order.
    let m0 = read_epoch(&server, 0, Opts::new(2, 16));
    let m1 = read_epoch(&server, 1, Opts::new(2, 16));
    check_epoch(&source, &m0);
    check_epoch(&source, &m1);
    assert_eq!(
        key_sets(&m0),
        key_sets(&e0),
        "the buffer mixes within a span"
    );
    assert_eq!(key_sets(&m1), key_sets(&e1));
    assert_ne!(keys(&m0), keys(&m1));
    assert_ne!(keys(&m0), keys(&e0), "the shuffle buffer changed nothing");
    assert!(m0.iter().any(|r| shard_runs(r).len() > SHARDS / WORLD));

    // The same epoch read again is the same order (a resumed job sees what it saw), with
    // or without read-ahead.
    let m0_again = read_epoch(&server, 0, Opts::new(2, 16));
    assert_eq!(keys(&m0_again), keys(&m0));
    let m0_inline = read_epoch(&server, 0, Opts::new(0, 16));
    assert_eq!(keys(&m0_inline), keys(&m0));

    // The readings after the first came from the cache.
    let stats = client.stats()?;
    assert!(
        stats["hits"].as_u64().unwrap_or(0) >= SHARDS as u64,
        "{stats}"
    );
    Ok(())
}

#[test]
fn a_world_size_that_does_not_divide_the_samples_pads_or_drops() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let mut client = Client::new(&server.url())?;
    let source = upload(&mut client)?;
    let n = SHARDS * PER_SHARD;

    // 240 samples on 7 ranks: 35 each, the last rank's span wrapping to repeat 5.
    let seven = Opts {
        world: 7,
        ..Opts::new(1, 8)
    };
    let padded = check_reads(&source, &read_epoch(&server, 0, seven), n.div_ceil(7));
    assert_eq!(padded.len(), n, "every sample at least once");
    let repeated: usize = padded.values().map(|&k| k - 1).sum();
    assert_eq!(repeated, n.div_ceil(7) * 7 - n);
    assert!(padded.values().all(|&k| k <= 2));

    // drop_last: 34 each, the last 2 of the epoch's list left out, none repeated.
    let dropped = Opts {
        drop_last: true,
        ..seven
    };
    let kept = check_reads(&source, &read_epoch(&server, 0, dropped), n / 7);
    assert_eq!(kept.len(), n / 7 * 7);
    assert!(kept.values().all(|&k| k == 1));
    Ok(())
}

#[test]
fn a_shard_rewritten_after_listing_ends_the_epoch_and_an_empty_prefix_is_refused() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let mut client = Client::new(&server.url())?;
    let source = upload(&mut client)?;

    // Nothing under the prefix, or nothing that is a shard: no dataset.
    for prefix in ["nothing/", "train/README"] {
        let err = Dataset::builder()
            .endpoint(&server.url())
            .bucket(BUCKET)
            .prefix(prefix)
            .build()
            .err()
            .expect("an empty prefix is refused");
        assert!(matches!(err, Error::Invalid(_)), "{prefix}: {err}");
    }

    // One rank lists the shards; then shard 5 changes. The samples planned before it
    // come, then the read of the version listed fails (`If-Match`), and the epoch ends.
    let one = Opts {
        world: 1,
        ..Opts::new(0, 0)
    };
    let ds = dataset(&server, 0, one)?;
    let rewritten = &source.shards[5];
    let plan = ds.plan(0)?;
    let first = plan
        .iter()
        .position(|id| ds.shards()[id.shard as usize].key == *rewritten)
        .unwrap();
    let tar = tar_of(&[("x/0000.cls".to_owned(), b"new".to_vec())]);
    client.put(BUCKET, rewritten, &mut tar.as_slice(), tar.len() as u64)?;
    let got: Vec<granary_client::Result<Sample>> = ds.epoch(0).collect();
    assert_eq!(got.len(), first + 1);
    for (s, id) in got[..first].iter().zip(&plan) {
        let s = s.as_ref().unwrap();
        assert_eq!(s.shard, ds.shards()[id.shard as usize].key);
        assert_eq!(s.get("cls"), Some(source.samples[&s.key].0.as_slice()));
    }
    let err = got[first].as_ref().unwrap_err();
    assert_eq!(err.status(), Some(412), "{err}");
    assert_eq!(err.code(), Some("PreconditionFailed"), "{err}");

    // A dataset built now lists the new version and reads it.
    let ds = dataset(&server, 0, one)?;
    assert_eq!(ds.len(), (SHARDS - 1) * PER_SHARD + 1);
    let got = ds.epoch(0).collect::<granary_client::Result<Vec<_>>>()?;
    assert_eq!(got.len(), ds.len());
    let new = got.iter().find(|s| s.shard == *rewritten).unwrap();
    assert_eq!(
        (new.key.as_str(), new.get("cls")),
        ("x/0000", Some(&b"new"[..]))
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
        .expect("an unsigned dataset is refused");
    assert_eq!(err.status(), Some(403));

    let e0 = read_epoch(
        &server,
        0,
        Opts {
            creds: true,
            ..Opts::new(1, 8)
        },
    );
    check_epoch(&source, &e0);

    // Signed deletes.
    client.delete(BUCKET, key)?;
    assert!(client.stat(BUCKET, key).unwrap_err().is_not_found());
    Ok(())
}
