//! Jobs' plans through the real binary, on a dataset twice the cache: epochs read with
//! the planner are the very samples, in the very order, of epochs read without it, while
//! the node fetches ahead and drops planned entries needed later; entries of no plan
//! survive a planned job that fills the cache; a plan expires after `--plan-ttl` once
//! its job stops, and its fetching with it; two jobs with different seeds over one
//! dataset both finish; a member killed mid-epoch leaves its shards to the next owner
//! and the job finishes with every sample; a full owner keeps a planned dataset's
//! shards rather than leaving them to a member with room; and `/_granary/plans`,
//! `granaryctl plans` and a drop.

use std::time::{Duration, Instant};

use anyhow::Result;
use granary_client::{Client, Dataset, Sample};
use granary_proto::plan::PlanView;
use granary_tests::ctl::granaryctl;
use granary_tests::{tar_of, Pattern, Server, ServerOpts};

const BUCKET: &str = "train";
const PREFIX: &str = "p/";
const SHARDS: usize = 16;
const PER_SHARD: usize = 8;
/// Bytes of each sample's `.bin`: a shard is about 200 KiB.
const BIN: usize = 24 << 10;
const WORLD: usize = 2;
/// The dataset's size at most, known before a node starts (the same bytes each time).
const SIZE: u64 = (SHARDS * (PER_SHARD * (BIN + 512 + 1024) + 1024)) as u64;

/// The dataset's bytes, written into the node's fs backend; their size.
fn lay_out(server: &Server) -> Result<u64> {
    let names: Vec<String> = (0..SHARDS).map(|s| format!("shard-{s:04}.tar")).collect();
    lay_out_as(server, &names)
}

/// The dataset under these shard names (`SHARDS` of them).
fn lay_out_as(server: &Server, names: &[String]) -> Result<u64> {
    let root = server.data_dir().join("origin").join(BUCKET).join(PREFIX);
    std::fs::create_dir_all(&root)?;
    let mut total = 0;
    for (s, name) in names.iter().enumerate() {
        let mut members = Vec::new();
        for i in 0..PER_SHARD {
            let key = format!("s{s:02}/{i:04}");
            members.push((format!("{key}.cls"), format!("{}", i % 10).into_bytes()));
            members.push((
                format!("{key}.bin"),
                Pattern::new((s * PER_SHARD + i) as u64).bytes(0, BIN),
            ));
        }
        let tar = tar_of(&members);
        total += tar.len() as u64;
        std::fs::write(root.join(name), tar)?;
    }
    Ok(total)
}

/// A node whose cache holds about half the dataset.
fn half_cache_node(extra: &[&str]) -> Result<(Server, u64)> {
    let cap = (SIZE / 2).to_string();
    let mut args = vec!["--cache-capacity", &cap];
    args.extend_from_slice(extra);
    let server = Server::start(ServerOpts::open().args(&args))?;
    let total = lay_out(&server)?;
    assert!(total <= SIZE && total > SIZE * 9 / 10, "{total} vs {SIZE}");
    let mut c = Client::new(&server.url())?;
    c.create_bucket(BUCKET).ok();
    Ok((server, total))
}

/// Members with `cap` bytes of cache each, up, all reading the first one's store.
fn cluster(ids: &[&str], cap: u64) -> Result<Vec<Server>> {
    let cap = cap.to_string();
    let nodes = Server::start_cluster(ids, &ServerOpts::open().args(&["--cache-capacity", &cap]))?;
    let refs: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&refs, Duration::from_secs(20))?;
    let origin = nodes[0].data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&origin)?;
    for n in &nodes[1..] {
        let link = n.data_dir().join("origin").join(BUCKET);
        std::fs::create_dir_all(link.parent().unwrap())?;
        std::os::unix::fs::symlink(&origin, &link)?;
    }
    Client::new(&nodes[0].url())?.create_bucket(BUCKET).ok();
    Ok(nodes)
}

fn dataset(url: &str, rank: usize, seed: u64, plan: bool) -> Dataset {
    Dataset::builder()
        .endpoint(url)
        .bucket(BUCKET)
        .prefix(PREFIX)
        .seed(seed)
        .rank(rank)
        .world_size(WORLD)
        .shuffle_buffer(4)
        .read_ahead(1)
        .plan(plan)
        .build()
        .unwrap()
}

/// Each rank's sample keys of `epochs` through the node at `url`, the ranks reading at
/// once, a training step of `step` per sample.
fn read(url: &str, seed: u64, epochs: u64, plan: bool, step: Duration) -> Vec<Vec<Vec<String>>> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..WORLD)
            .map(|rank| {
                scope.spawn(move || {
                    let ds = dataset(url, rank, seed, plan);
                    (0..epochs)
                        .map(|e| {
                            ds.epoch(e)
                                .map(|s| {
                                    let s: Sample = s.unwrap();
                                    std::thread::sleep(step);
                                    check(&s);
                                    s.key
                                })
                                .collect::<Vec<_>>()
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// A sample's bytes are its own.
fn check(s: &Sample) {
    let (shard, index) = s.key.split_once('/').unwrap();
    let shard: usize = shard[1..].parse().unwrap();
    let index: usize = index.parse().unwrap();
    assert_eq!(
        s.fields["bin"],
        Pattern::new((shard * PER_SHARD + index) as u64).bytes(0, BIN),
        "{}",
        s.key
    );
}

/// Every sample once per epoch over the ranks.
fn every_sample_once(reads: &[Vec<Vec<String>>], epochs: u64) {
    for e in 0..epochs as usize {
        let mut all: Vec<&String> = reads.iter().flat_map(|r| &r[e]).collect();
        all.sort();
        let n = all.len();
        all.dedup();
        assert_eq!(
            (n, all.len()),
            (SHARDS * PER_SHARD, SHARDS * PER_SHARD),
            "epoch {e}"
        );
    }
}

fn plans(server: &Server) -> Vec<PlanView> {
    Client::new(&server.url()).unwrap().plans().unwrap()
}

#[test]
fn planned_epochs_read_the_same_samples_while_the_node_fetches_ahead_and_drops() -> Result<()> {
    let epochs = 3;
    let step = Duration::from_millis(3);
    let (plain, _) = half_cache_node(&[])?;
    let without = read(&plain.url(), 7, epochs, false, step);
    assert!(plans(&plain).is_empty());
    assert_eq!(plain.stat("bytes_planned"), 0);
    drop(plain);

    let (node, total) = half_cache_node(&[])?;
    let with = read(&node.url(), 7, epochs, true, step);
    assert_eq!(with, without, "the planner changes no sample and no order");
    every_sample_once(&with, epochs);

    // The plan, as the cluster shows it: the last epoch, both ranks' reads counted.
    let shown = plans(&node);
    assert_eq!(shown.len(), 1, "{shown:?}");
    let p = &shown[0];
    assert_eq!((p.bucket.as_str(), p.prefix.as_str()), (BUCKET, PREFIX));
    assert_eq!(
        (p.epoch, p.world_size, p.shards),
        (epochs - 1, WORLD, SHARDS)
    );
    assert!(p.expires_in_s > 0.0);
    // Within the exchange's second, the reads are counted.
    let deadline = Instant::now() + Duration::from_secs(5);
    let p = loop {
        let p = plans(&node).remove(0);
        if p.reads_ready + p.reads_waited > 0 || Instant::now() > deadline {
            break p;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(p.reads_ready + p.reads_waited > 0, "{p:?}");
    // What the planner fetched for this registration (the last epoch): on a loaded
    // machine the readers may have reached every shard of it first; then what it
    // fetched over the job shows in the node's count, checked below.
    assert!(
        p.fetched_bytes > 0 || node.stat("bytes_planned") > 0,
        "{p:?}"
    );

    // A dataset twice the cache: the planner dropped planned entries for ones needed
    // sooner, and never held more than the cache.
    let planned = node.stat("bytes_planned");
    let evicted = node.stat("bytes_evicted");
    assert!(
        planned > 0 && evicted > 0,
        "planned {planned}, evicted {evicted}"
    );
    assert!(
        node.stat("used_bytes") <= total / 2 + 1024,
        "{}",
        node.stat("used_bytes")
    );
    assert_eq!(node.stat("plans"), 1);
    Ok(())
}

#[test]
fn entries_of_no_plan_survive_a_planned_job_that_fills_the_cache() -> Result<()> {
    let (node, _) = half_cache_node(&[])?;
    let mut c = Client::new(&node.url())?;
    // Four objects of no plan, cached first.
    let mut kept = Vec::new();
    for i in 0..4 {
        let key = format!("other/{i}");
        let bytes = Pattern::new(900 + i).bytes(0, 40 << 10);
        c.put_bytes(BUCKET, &key, &bytes)?;
        assert_eq!(c.get(BUCKET, &key)?, bytes);
        kept.push((key, bytes));
    }
    let held = |c: &mut Client, key: &str| -> String {
        let r = c
            .open_with(BUCKET, key, &granary_client::GetOptions::default())
            .unwrap();
        r.meta().cache.clone().unwrap_or_default()
    };
    for (key, _) in &kept {
        assert_eq!(held(&mut c, key), "hit", "{key}");
    }
    let reads = read(&node.url(), 3, 2, true, Duration::from_millis(2));
    every_sample_once(&reads, 2);
    assert!(
        node.stat("bytes_evicted") > 0,
        "the planner dropped nothing"
    );
    for (key, bytes) in &kept {
        assert_eq!(held(&mut c, key), "hit", "{key} was dropped");
        assert_eq!(&c.get(BUCKET, key)?, bytes);
    }
    Ok(())
}

#[test]
fn a_plan_expires_after_its_ttl_once_its_job_stops_and_fetching_stops() -> Result<()> {
    let (node, _) = half_cache_node(&["--plan-ttl", "2s"])?;
    // One rank of two reads a few samples and stops: the plan is registered, and the
    // other rank never comes.
    let ds = dataset(&node.url(), 0, 11, true);
    let got: Vec<Sample> = ds.epoch(0).take(3).collect::<granary_client::Result<_>>()?;
    assert_eq!(got.len(), 3);
    drop(ds);
    assert_eq!(plans(&node).len(), 1);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !plans(&node).is_empty() {
        assert!(Instant::now() < deadline, "the plan never expired");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(node.stat("plans"), 0);
    // Nothing is fetched for it any more.
    std::thread::sleep(Duration::from_millis(500));
    let before = node.stat("bytes_planned");
    std::thread::sleep(Duration::from_secs(1));
    assert_eq!(node.stat("bytes_planned"), before);
    Ok(())
}

#[test]
fn two_jobs_with_different_seeds_over_one_dataset_both_finish() -> Result<()> {
    let (node, _) = half_cache_node(&[])?;
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| read(&node.url(), 1, 2, true, Duration::from_millis(2)));
        let b = s.spawn(|| read(&node.url(), 2, 2, true, Duration::from_millis(2)));
        (a.join().unwrap(), b.join().unwrap())
    });
    every_sample_once(&a, 2);
    every_sample_once(&b, 2);
    assert_ne!(a, b, "two seeds, two orders");
    assert_eq!(plans(&node).len(), 2);
    Ok(())
}

#[test]
fn plans_show_in_granaryctl_and_a_drop_ends_them_cluster_wide() -> Result<()> {
    let (node, _) = half_cache_node(&[])?;
    let ds = dataset(&node.url(), 0, 5, true);
    let _ = ds
        .epoch(0)
        .take(2)
        .collect::<granary_client::Result<Vec<_>>>()?;
    let shown = plans(&node);
    assert_eq!(shown.len(), 1);
    let id = shown[0].id.clone();
    let out = granaryctl(&node.url(), &["plans"], b"")?;
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout)?;
    let line = text.lines().nth(1).unwrap_or_default();
    let cols: Vec<&str> = line.split('\t').collect();
    assert_eq!(cols[0], id, "{text}");
    assert_eq!(cols[2], format!("{BUCKET}/{PREFIX}"), "{text}");
    assert_eq!((cols[3], cols[4]), ("0", "2"), "{text}");
    // Not a terminal: the consumed count, not a bar.
    assert!(
        cols[5].ends_with(&format!("/{}", SHARDS * PER_SHARD)),
        "{text}"
    );
    // A plan the body does not describe is refused with a clear error.
    let resp = granary_tests::raw_request_blocking(
        node.addr(),
        &granary_tests::request_bytes(
            "POST",
            "/_granary/plans",
            node.addr(),
            &[],
            b"{\"shards\":7}",
        ),
    )?;
    resp.assert_s3_error(400, &["InvalidArgument"]);
    let out = granaryctl(&node.url(), &["plans", "--drop", &id], b"")?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(plans(&node).is_empty());
    Ok(())
}

#[test]
fn a_member_killed_mid_epoch_leaves_its_shards_to_the_next_owner() -> Result<()> {
    let mut nodes = cluster(&["a", "b", "c"], SIZE / 6)?;
    lay_out(&nodes[0])?;
    let url = nodes[0].url();
    let (reads, killed) = std::thread::scope(|s| {
        let job = s.spawn(|| read(&url, 9, 2, true, Duration::from_millis(12)));
        // Killed once it has served the job (its reads, or its planned fetches).
        let served = |n: &Server| n.stat("hits") + n.stat("misses") + n.stat("bytes_planned");
        let deadline = Instant::now() + Duration::from_secs(20);
        while served(&nodes[2]) == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let killed = served(&nodes[2]);
        nodes[2].kill().unwrap();
        (job.join().unwrap(), killed)
    });
    every_sample_once(&reads, 2);
    assert!(killed > 0, "the killed member had served none of the job");
    // The survivors hold the plan, moved on to the last epoch.
    for n in &nodes[..2] {
        let shown = plans(n);
        assert_eq!(shown.len(), 1, "{shown:?}");
        assert_eq!(shown[0].epoch, 1);
    }
    Ok(())
}

#[test]
fn a_full_owner_keeps_a_planned_datasets_shards_and_leaves_none_to_a_member_with_room() -> Result<()>
{
    let nodes = cluster(&["a", "b"], SIZE / 2)?;
    let (a, b) = (&nodes[0], &nodes[1]);
    // Every shard owned by `a`, which holds half of them; `b` owns none and has room
    // for the other half. An object of no plan that `a` cannot admit is left to `b`.
    let owner = |name: &str| -> String {
        let key = format!("{PREFIX}{name}");
        a.cluster_view(Some((BUCKET, &key))).unwrap()["owner"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let names: Vec<String> = (0..2000)
        .map(|n| format!("shard-{n:04}.tar"))
        .filter(|name| owner(name) == "a")
        .take(SHARDS)
        .collect();
    assert_eq!(names.len(), SHARDS);
    lay_out_as(a, &names)?;

    let reads = read(&b.url(), 5, 2, true, Duration::from_millis(2));
    every_sample_once(&reads, 2);
    // `a` made room by dropping planned entries, and `b` holds nothing of the dataset:
    // a copy there would take room no plan counts on, never dropped.
    assert!(a.stat("bytes_evicted") > 0, "a dropped nothing");
    assert_eq!((b.stat("objects"), b.stat("used_bytes")), (0, 0));
    assert!(a.stat("used_bytes") <= SIZE / 2);
    Ok(())
}
