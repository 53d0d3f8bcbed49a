//! The cluster through its life, with real processes: members agree on who is up (and so
//! on every key's owner) as soon as each answers health, over several fresh starts; a
//! whole cluster killed and restarted never serves an old version of an object written
//! through any node; the member list followed from a file (a ConfigMap's symlink swap)
//! and from a real DNS server (dnsmasq on loopback); after a member dies and returns, one
//! joins and one leaves, the disks hold about one copy of each object again and the room
//! freed admits new objects; and members' headers mean nothing from anyone else.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use granary_tests::{
    encode_key, list_files, raw_request_blocking, request_bytes, reserve_ports, Pattern,
    RawResponse, Server, ServerOpts,
};

const BUCKET: &str = "dataset";
const UP_TIMEOUT: Duration = Duration::from_secs(20);
/// How long membership stays still before a node's rebalance pass starts.
const REBALANCE_DEBOUNCE: Duration = Duration::from_secs(2);

fn obj_path(key: &str) -> String {
    format!("/{BUCKET}/{}", encode_key(key))
}

fn send(
    node: &Server,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> RawResponse {
    let addr = node.addr();
    raw_request_blocking(addr, &request_bytes(method, path, addr, headers, body))
        .unwrap_or_else(|e| panic!("{method} {path} via {addr}: {e:#}"))
}

/// `count` objects of `size` bytes, `key{i}`, in `origin/dataset/`; their bytes.
fn lay_out(
    origin: &Path,
    prefix: &str,
    count: usize,
    size: usize,
    seed: u64,
) -> Vec<(String, Vec<u8>)> {
    let dir = origin.join(BUCKET);
    std::fs::create_dir_all(&dir).unwrap();
    (0..count)
        .map(|i| {
            let key = format!("{prefix}{i:04}");
            let data = Pattern::new(seed + i as u64).bytes(0, size);
            std::fs::write(dir.join(&key), &data).unwrap();
            (key, data)
        })
        .collect()
}

/// Reads every object through `node`, checking its bytes.
fn read_all(node: &Server, objects: &[(String, Vec<u8>)]) {
    for (key, data) in objects {
        let r = send(node, "GET", &obj_path(key), &[], b"");
        assert_eq!(r.status, 200, "GET {key} via {}: {}", node.addr(), r.text());
        assert!(r.body == *data, "bytes of {key} via {}", node.addr());
    }
}

fn used(nodes: &[&Server]) -> u64 {
    nodes.iter().map(|n| n.stat("used_bytes")).sum()
}

/// Waits until `cond` holds, or fails after `timeout` with `what`.
fn wait_for(timeout: Duration, what: &str, mut cond: impl FnMut() -> bool) -> Duration {
    let started = Instant::now();
    while !cond() {
        assert!(
            started.elapsed() < timeout,
            "{what}: not within {timeout:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    started.elapsed()
}

/// Every node sees every one of `ids` up, and each names the same owner for each of
/// `keys`; the first disagreement when not.
fn agreement(nodes: &[&Server], ids: &[&str], keys: &[String]) -> Result<(), String> {
    for n in nodes {
        for id in ids {
            if n.member_state(id).as_deref() != Some("up") {
                return Err(format!("{} does not see {id} up", n.addr()));
            }
        }
    }
    for key in keys {
        let owners: Vec<String> = nodes
            .iter()
            .map(|n| {
                n.cluster_view(Some((BUCKET, key))).expect("cluster view")["owner"]
                    .as_str()
                    .unwrap_or("")
                    .to_owned()
            })
            .collect();
        if owners.iter().any(|o| *o != owners[0]) {
            return Err(format!("owners of {key} differ: {owners:?}"));
        }
    }
    Ok(())
}

/// Five fresh starts of three nodes: the moment each answers health (the harness waits
/// for `200` of each in turn), they all see one another and name the same owner for
/// every key.
#[test]
fn members_agree_as_soon_as_they_answer_health() -> Result<()> {
    let ids = ["a", "b", "c"];
    let keys: Vec<String> = (0..100).map(|i| format!("k{i}")).collect();
    let mut starts = Vec::new();
    for round in 0..5 {
        let started = Instant::now();
        let nodes = Server::start_cluster(&ids, &ServerOpts::open())?;
        let healthy = started.elapsed();
        let all: Vec<&Server> = nodes.iter().collect();
        if let Err(e) = agreement(&all, &ids, &keys) {
            bail!("round {round}: all healthy after {healthy:?}, yet {e}");
        }
        starts.push(healthy);
    }
    eprintln!("three nodes healthy and agreed after {starts:?}");
    Ok(())
}

/// Three nodes whose objects are cached on their owners are all killed (SIGKILL) and
/// restarted; one key is rewritten through the first node back while the others are
/// still down, and then every key through every node in turn, right after they answer
/// health. Every read through every node has the new bytes, then and later.
#[test]
fn a_whole_cluster_killed_and_restarted_serves_no_old_version() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let objects = lay_out(origin.path(), "k", 24, 40_000, 1);
    let opts = ServerOpts::open().args(&["--backend", &format!("fs:{}", origin.path().display())]);
    let mut nodes = Server::start_cluster(&["a", "b", "c"], &opts)?;
    Server::wait_cluster_up(&nodes.iter().collect::<Vec<_>>(), UP_TIMEOUT)?;
    for n in &nodes {
        read_all(n, &objects);
    }
    Server::settle(&nodes.iter().collect::<Vec<_>>());
    let held: u64 = nodes.iter().map(|n| n.stat("objects")).sum();
    assert_eq!(
        held,
        objects.len() as u64,
        "each object cached once, on its owner"
    );

    for n in nodes.iter_mut() {
        n.kill()?;
    }
    nodes[0].restart(false)?;
    // The others are down: the first node owns every key now.
    let (early_key, _) = &objects[0];
    let early = Pattern::new(900).bytes(0, 33_333);
    let r = send(&nodes[0], "PUT", &obj_path(early_key), &[], &early);
    assert_eq!(r.status, 200, "{}", r.text());
    nodes[1].restart(false)?;
    nodes[2].restart(false)?;
    // No waiting: they answered health.
    let mut want: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, (key, _)) in objects.iter().enumerate() {
        let data = Pattern::new(1000 + i as u64).bytes(0, 20_000 + i);
        let r = send(&nodes[i % 3], "PUT", &obj_path(key), &[], &data);
        assert_eq!(r.status, 200, "PUT {key}: {}", r.text());
        want.push((key.clone(), data));
    }
    for _ in 0..2 {
        let mut stale = Vec::new();
        for n in &nodes {
            for (key, data) in &want {
                let r = send(n, "GET", &obj_path(key), &[], b"");
                if r.status != 200 || r.body != *data {
                    stale.push(format!(
                        "GET {key} via {}: {} ({} bytes, x-granary-cache {:?}, node {:?})",
                        n.addr(),
                        r.status,
                        r.body.len(),
                        r.header("x-granary-cache"),
                        r.header("x-granary-node")
                    ));
                }
            }
        }
        assert!(
            stale.is_empty(),
            "old versions served:\n{}",
            stale.join("\n")
        );
        std::thread::sleep(Duration::from_secs(3));
    }
    Ok(())
}

/// A peers file as Kubernetes mounts a ConfigMap: `peers` is a symlink into a data
/// directory, replaced whole by swapping a symlink.
struct PeersFile {
    dir: tempfile::TempDir,
    version: u32,
}

impl PeersFile {
    fn new() -> Result<PeersFile> {
        Ok(PeersFile {
            dir: tempfile::tempdir()?,
            version: 0,
        })
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("peers")
    }

    fn write(&mut self, members: &[(&str, SocketAddr)]) -> Result<()> {
        self.version += 1;
        let data = self.dir.path().join(format!("..data-{}", self.version));
        std::fs::create_dir(&data)?;
        let text: String = members
            .iter()
            .map(|(id, addr)| format!("{id}=http://{addr}\n"))
            .collect();
        std::fs::write(data.join("peers"), text)?;
        let tmp = self.dir.path().join("peers.tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(data.join("peers"), &tmp)?;
        std::fs::rename(&tmp, self.path())?;
        Ok(())
    }
}

fn file_node(peers: &PeersFile, id: &str, addr: SocketAddr, opts: &ServerOpts) -> Result<Server> {
    let path = peers.path();
    Server::start(opts.clone().listen(addr).args(&[
        "--node-id",
        id,
        "--peers-file",
        &path.to_string_lossy(),
    ]))
}

fn sees(nodes: &[&Server], ids: &[&str]) -> bool {
    nodes.iter().all(|n| {
        let v = n.cluster_view(None).expect("cluster view");
        let members = v["members"].as_array().cloned().unwrap_or_default();
        members.len() == ids.len()
            && ids
                .iter()
                .all(|id| members.iter().any(|m| m["id"] == *id && m["state"] == "up"))
    })
}

fn rebalances_done(nodes: &[&Server]) -> u64 {
    nodes
        .iter()
        .map(|n| {
            let r = send(n, "GET", "/_granary/jobs", &[], b"");
            let jobs: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
            jobs.as_array()
                .map(|a| {
                    a.iter()
                        .filter(|j| j["kind"] == "rebalance" && j["state"] == "done")
                        .count() as u64
                })
                .unwrap_or(0)
        })
        .sum()
}

/// Three members from `peers` (the first three of `ids`), once they see one another and
/// hold one copy of each of `objects`, read through the first.
fn three_holding(
    peers: &PeersFile,
    ids: &[&str],
    addrs: &[SocketAddr],
    opts: &ServerOpts,
    objects: &[(String, Vec<u8>)],
) -> Result<Vec<Server>> {
    let nodes: Vec<Server> = (0..3)
        .map(|i| file_node(peers, ids[i], addrs[i], opts))
        .collect::<Result<_>>()?;
    let all3: Vec<&Server> = nodes.iter().collect();
    wait_for(UP_TIMEOUT, "three members up", || sees(&all3, &ids[..3]));
    read_all(&nodes[0], objects);
    Server::settle(&all3);
    let dataset: u64 = objects.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(used(&all3), dataset, "one copy of each object");
    Ok(nodes)
}

/// A data set in an origin of its own, and three members (the first three of the ids,
/// from a peers file) over it that hold one copy of it.
struct Holding {
    _origin: tempfile::TempDir,
    objects: Vec<(String, Vec<u8>)>,
    dataset: u64,
    /// One per id.
    addrs: Vec<SocketAddr>,
    peers: PeersFile,
    opts: ServerOpts,
    nodes: Vec<Server>,
}

impl Holding {
    /// `(prefix, count, size, seed)` of [`lay_out`]; members handing over at `rate`
    /// bytes per second.
    fn start(set: (&str, usize, usize, u64), ids: &[&str], rate: &str) -> Result<Holding> {
        let origin = tempfile::tempdir()?;
        let objects = lay_out(origin.path(), set.0, set.1, set.2, set.3);
        let dataset = objects.iter().map(|(_, d)| d.len() as u64).sum();
        let addrs = reserve_ports(ids.len())?;
        let mut peers = PeersFile::new()?;
        peers.write(&[(ids[0], addrs[0]), (ids[1], addrs[1]), (ids[2], addrs[2])])?;
        let opts = ServerOpts::open().args(&[
            "--backend",
            &format!("fs:{}", origin.path().display()),
            "--rebalance-rate",
            rate,
        ]);
        let nodes = three_holding(&peers, ids, &addrs, &opts, &objects)?;
        Ok(Holding {
            _origin: origin,
            objects,
            dataset,
            addrs,
            peers,
            opts,
            nodes,
        })
    }
}

/// Cached bytes over data set bytes after one churn step: as soon as the step's reads
/// are done, and once rebalance has had its chance.
struct Step {
    what: &'static str,
    at_once: f64,
    settled: f64,
    took: Duration,
}

/// Waits (up to a minute) for the cluster's cached bytes to come within 1.05× of
/// `dataset`, when rebalance is on; with it off, gives it the same first moments to show
/// nothing happens. The ratio then, and how long it took.
fn settle_ratio(nodes: &[&Server], dataset: u64, rebalance: bool) -> (f64, Duration) {
    let started = Instant::now();
    if rebalance {
        wait_for(
            Duration::from_secs(60),
            "one copy of each object again",
            || {
                Server::settle(nodes);
                used(nodes) as f64 <= dataset as f64 * 1.05
            },
        );
        // The passes' last objects.
        wait_for(Duration::from_secs(60), "the rebalance passes done", || {
            nodes.iter().all(|n| {
                rebalance_jobs(n)
                    .iter()
                    .all(|(state, _, _)| state != "running")
            })
        });
        // An object its owner was not ready for is offered again a pass later: give it
        // that pass to reach exactly one copy, so what follows starts from still disks.
        let retried = Instant::now() + Duration::from_secs(15);
        while used(nodes) != dataset && Instant::now() < retried {
            std::thread::sleep(Duration::from_millis(200));
            Server::settle(nodes);
        }
    } else {
        std::thread::sleep(REBALANCE_DEBOUNCE * 3);
        Server::settle(nodes);
    }
    (used(nodes) as f64 / dataset as f64, started.elapsed())
}

/// The life of a cluster whose member list is a file it follows: a member dies and
/// everything is read again (its keys fill on their next owners), it comes back (those
/// copies go back to it or are dropped), a fourth joins through the file (its keys move to
/// it), one leaves. With `rebalance`, the test's own checks: after each step the disks
/// settle back to about one copy of each object (≤ 1.05×), and the room freed admits new
/// objects.
fn churn(rebalance: bool) -> Result<Vec<Step>> {
    let origin = tempfile::tempdir()?;
    let objects = lay_out(origin.path(), "obj", 60, 200_000, 7);
    let dataset: u64 = objects.iter().map(|(_, d)| d.len() as u64).sum();
    let addrs = reserve_ports(4)?;
    let ids = ["n0", "n1", "n2", "n3"];
    let mut peers = PeersFile::new()?;
    peers.write(&[(ids[0], addrs[0]), (ids[1], addrs[1]), (ids[2], addrs[2])])?;
    // Room for 0.45 of the data set each: three hold it all, two cannot.
    let capacity = format!("{}", dataset * 45 / 100);
    let mut args = vec![
        "--backend".to_owned(),
        format!("fs:{}", origin.path().display()),
        "--cache-capacity".to_owned(),
        capacity,
    ];
    if !rebalance {
        args.extend(["--rebalance-rate".to_owned(), "0".to_owned()]);
    }
    let opts = ServerOpts::open().args(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut nodes = three_holding(&peers, &ids, &addrs, &opts, &objects)?;
    let mut steps = Vec::new();

    // A member dies; everything is read again: its keys fill on their next owners.
    nodes[2].kill()?;
    let two: Vec<&Server> = nodes[..2].iter().collect();
    wait_for(UP_TIMEOUT, "n2 seen down", || {
        two.iter()
            .all(|n| n.member_state("n2").as_deref() == Some("down"))
    });
    read_all(&nodes[0], &objects);
    Server::settle(&two);
    // n2's disk still holds its copies while it is down.
    let on_n2: u64 = list_files(&nodes[2].data_dir().join("cache").join("objects"), None)
        .iter()
        .map(|f| std::fs::metadata(f).map_or(0, |m| m.len()))
        .sum();
    let down = (used(&two) + on_n2) as f64 / dataset as f64;
    assert!(down > 1.1, "the next owners took copies: {down:.2}");
    steps.push(Step {
        what: "n2 killed, all read again (its disk counted)",
        at_once: down,
        settled: down,
        took: Duration::ZERO,
    });

    // It comes back: the copies taken for it go back or are dropped.
    let done_before = rebalances_done(&two);
    drop(two);
    nodes[2].restart(false)?;
    let all3: Vec<&Server> = nodes.iter().collect();
    wait_for(UP_TIMEOUT, "n2 back up", || sees(&all3, &ids[..3]));
    let at_once = used(&all3) as f64 / dataset as f64;
    let (settled, took) = settle_ratio(&all3, dataset, rebalance);
    steps.push(Step {
        what: "n2 back",
        at_once,
        settled,
        took,
    });
    read_all(&nodes[1], &objects);
    let mut dataset = dataset;
    let mut objects = objects;
    if rebalance {
        assert!(
            rebalances_done(&all3[..2]) > done_before,
            "a rebalance job ran"
        );
        // The room freed admits new objects: every one of them is cached once (on its
        // owner, or on the next member with room when its owner is full).
        let before = used(&all3);
        let more = lay_out(origin.path(), "more", 6, 200_000, 500);
        read_all(&nodes[0], &more);
        Server::settle(&all3);
        for (key, _) in &more {
            let r = send(&nodes[0], "GET", &obj_path(key), &[], b"");
            let from = r.header("x-granary-cache");
            assert!(
                matches!(from, Some("hit" | "peer")),
                "{key} was admitted: x-granary-cache {from:?}"
            );
        }
        let more_bytes: u64 = more.iter().map(|(_, d)| d.len() as u64).sum();
        assert_eq!(
            used(&all3),
            before + more_bytes,
            "each new object cached once"
        );
        dataset += more_bytes;
        objects.extend(more);
    }

    // A fourth member joins through the file; everything is read through it.
    peers.write(&[
        (ids[0], addrs[0]),
        (ids[1], addrs[1]),
        (ids[2], addrs[2]),
        (ids[3], addrs[3]),
    ])?;
    nodes.push(file_node(&peers, ids[3], addrs[3], &opts)?);
    let all4: Vec<&Server> = nodes.iter().collect();
    wait_for(UP_TIMEOUT, "four members up", || sees(&all4, &ids));
    read_all(&nodes[3], &objects);
    let at_once = used(&all4) as f64 / dataset as f64;
    let (settled, took) = settle_ratio(&all4, dataset, rebalance);
    assert!(
        nodes[3].stat("objects") > 0,
        "the new member holds its share"
    );
    steps.push(Step {
        what: "n3 joined, all read through it",
        at_once,
        settled,
        took,
    });

    // One leaves: out of the file, then stopped; everything is read again.
    peers.write(&[(ids[0], addrs[0]), (ids[2], addrs[2]), (ids[3], addrs[3])])?;
    let left = nodes.remove(1);
    let rest: Vec<&Server> = nodes.iter().collect();
    wait_for(UP_TIMEOUT, "n1 out of every view", || {
        sees(&rest, &["n0", "n2", "n3"])
    });
    drop(left);
    read_all(&nodes[0], &objects);
    Server::settle(&rest);
    let at_once = used(&rest) as f64 / dataset as f64;
    let (settled, took) = settle_ratio(&rest, dataset, rebalance);
    steps.push(Step {
        what: "n1 left, all read again",
        at_once,
        settled,
        took,
    });
    let summary: Vec<String> = steps
        .iter()
        .map(|s| {
            format!(
                "{}: {:.2} at once, {:.2} after {:.1} s",
                s.what,
                s.at_once,
                s.settled,
                s.took.as_secs_f64()
            )
        })
        .collect();
    eprintln!(
        "cached bytes / data set bytes, rebalance {}: {}",
        if rebalance { "on" } else { "off" },
        summary.join("; ")
    );
    Ok(steps)
}

/// With rebalance (the default), every churn step settles back to about one copy of each
/// object.
#[test]
fn churn_settles_back_to_one_copy_of_each_object() -> Result<()> {
    // While n2 is down, the copies on its disk wait for it: the other steps settle.
    for s in churn(true)?.iter().skip(1) {
        assert!(s.settled <= 1.05, "{}: {:.2}", s.what, s.settled);
    }
    Ok(())
}

/// With rebalance off (`--rebalance-rate 0`), the same churn leaves copies nobody reads:
/// the measure above can see them.
#[test]
fn without_rebalance_churn_leaves_copies_behind() -> Result<()> {
    let steps = churn(false)?;
    let joined = steps
        .iter()
        .find(|s| s.what.starts_with("n3 joined"))
        .expect("the join step");
    assert!(
        joined.settled > 1.1,
        "copies stay on the old owners: {:.2}",
        joined.settled
    );
    Ok(())
}

/// The rebalance jobs of `node`: `(state, objects_done, objects_total)` each.
fn rebalance_jobs(node: &Server) -> Vec<(String, u64, u64)> {
    let r = send(node, "GET", "/_granary/jobs", &[], b"");
    let jobs: serde_json::Value = serde_json::from_slice(&r.body).unwrap_or_default();
    jobs.as_array()
        .into_iter()
        .flatten()
        .filter(|j| j["kind"] == "rebalance")
        .map(|j| {
            (
                j["state"].as_str().unwrap_or("").to_owned(),
                j["objects_done"].as_u64().unwrap_or(0),
                j["objects_total"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// Reads every object, over and over, through the given addresses until told to stop,
/// checking every byte; failures are kept with the moment each read started.
fn keep_reading(
    addrs: Vec<SocketAddr>,
    objects: Vec<(String, Vec<u8>)>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<(u64, Vec<(Instant, String)>)> {
    std::thread::spawn(move || {
        let mut reads = 0u64;
        let mut failed = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            for (i, (key, data)) in objects.iter().enumerate() {
                let addr = addrs[i % addrs.len()];
                let started = Instant::now();
                let req = request_bytes("GET", &obj_path(key), addr, &[], b"");
                match raw_request_blocking(addr, &req) {
                    Ok(r) if r.status == 200 && r.body == *data => {}
                    Ok(r) => failed.push((
                        started,
                        format!(
                            "GET {key} via {addr}: {} ({} bytes, {})",
                            r.status,
                            r.body.len(),
                            if r.status == 200 {
                                "wrong bytes"
                            } else {
                                "error"
                            }
                        ),
                    )),
                    Err(e) => failed.push((started, format!("GET {key} via {addr}: {e:#}"))),
                }
                reads += 1;
            }
        }
        (reads, failed)
    })
}

/// A rebalance paced slowly enough to cut: a fourth member joins through the file, and
/// while the others hand it its keys, reads through two members go on, every byte
/// checked. A sender is killed mid-way and restarted, then the receiver. No read fails
/// but those started in the moments before a killed member is seen down (and none ever
/// returns wrong bytes), and the cluster still ends with one copy of each object.
#[test]
fn a_rebalance_cut_by_restarts_fails_no_read_and_finishes() -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let ids = ["m0", "m1", "m2", "m3"];
    // About a second per object handed over.
    let Holding {
        _origin,
        objects,
        dataset,
        addrs,
        mut peers,
        opts,
        mut nodes,
    } = Holding::start(("r", 48, 250_000, 40), &ids, "250000")?;

    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let reader = keep_reading(vec![addrs[0], addrs[1]], objects.clone(), stop.clone());
    peers.write(&[
        (ids[0], addrs[0]),
        (ids[1], addrs[1]),
        (ids[2], addrs[2]),
        (ids[3], addrs[3]),
    ])?;
    nodes.push(file_node(&peers, ids[3], addrs[3], &opts)?);
    // A sender mid-way: some handed over, some not.
    let mut sender = None;
    wait_for(Duration::from_secs(30), "a rebalance under way", || {
        sender = (0..3).find(|&i| {
            rebalance_jobs(&nodes[i])
                .iter()
                .any(|(state, done, total)| state == "running" && *done >= 1 && done < total)
        });
        sender.is_some()
    });
    let sender = sender.unwrap_or(2);
    let mut kills = vec![Instant::now()];
    nodes[sender].restart(false)?;
    std::thread::sleep(Duration::from_millis(1500));
    kills.push(Instant::now());
    nodes[3].restart(false)?;
    let all4: Vec<&Server> = nodes.iter().collect();
    wait_for(UP_TIMEOUT, "four members up again", || sees(&all4, &ids));
    let took = wait_for(
        Duration::from_secs(90),
        "one copy of each object after the cut rebalance",
        || {
            Server::settle(&all4);
            used(&all4) as f64 <= dataset as f64 * 1.05
        },
    );
    stop.store(true, Ordering::Relaxed);
    let (reads, failed) = reader.join().expect("the reader");
    // Seen down within 5 s of dying: reads that started before that may fail.
    let outside: Vec<&String> = failed
        .iter()
        .filter(|(at, what)| {
            what.contains("wrong bytes")
                || !kills.iter().any(|k| {
                    *at + Duration::from_millis(200) >= *k && *at < *k + Duration::from_secs(6)
                })
        })
        .map(|(_, what)| what)
        .collect();
    assert!(
        outside.is_empty(),
        "{} of {reads} reads failed outside a detection window:\n{}",
        outside.len(),
        outside
            .iter()
            .map(|s| s.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    for n in &nodes {
        read_all(n, &objects);
    }
    assert!(
        nodes[3].stat("objects") > 0,
        "the new member holds its share"
    );
    eprintln!(
        "rebalance cut by restarts of {} and m3: one copy again {:.1} s after; {reads} reads, {} failed, all within a detection window",
        ids[sender],
        took.as_secs_f64(),
        failed.len()
    );
    Ok(())
}

/// A drain: three members hold a data set; one is drained through another while reads go
/// on through all three, every byte checked. It hands its copies to their new owners: no
/// read fails, the backend serves nothing for it (≤ 1% of what it held), and it ends
/// `drained` holding nothing, as every member's view says. It stays drained across a
/// restart. Stopped and taken out of the list, it leaves every key readable from about
/// one copy of each object, without a read of the backend.
#[test]
fn a_drained_member_hands_its_copies_over_and_the_backend_serves_none() -> Result<()> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let ids = ["d0", "d1", "d2"];
    // A few seconds to hand d2's third of the data set over.
    let Holding {
        _origin,
        objects,
        dataset,
        addrs,
        mut peers,
        mut nodes,
        ..
    } = Holding::start(("d", 60, 200_000, 90), &ids, "1500000")?;
    let held = nodes[2].stat("used_bytes");
    assert!(
        held > dataset / 6,
        "d2 holds its share: {held} of {dataset}"
    );
    let from_backend = |nodes: &[Server]| -> Vec<u64> {
        nodes.iter().map(|n| n.stat("bytes_from_backend")).collect()
    };
    let before = from_backend(&nodes);

    let drain = |body: &[u8]| send(&nodes[0], "POST", "/_granary/cluster/drain", &[], body);
    // Misuse first: an unknown member, and no body.
    let r = drain(br#"{"node":"dx"}"#);
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.text().contains("InvalidArgument"), "{}", r.text());
    let r = drain(b"");
    assert_eq!(r.status, 400, "{}", r.text());

    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let reader = keep_reading(addrs.to_vec(), objects.clone(), stop.clone());
    std::thread::sleep(Duration::from_millis(500));
    let r = drain(br#"{"node":"d2"}"#);
    assert_eq!(r.status, 202, "{}", r.text());
    let said: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(
        (said["node"].as_str(), said["state"].as_str()),
        (Some("d2"), Some("draining"))
    );
    // Every member sees it leave within a probe or two, and it owns no key from then on.
    wait_for(
        Duration::from_secs(5),
        "every member sees d2 draining",
        || {
            nodes.iter().all(|n| {
                matches!(
                    n.member_state("d2").as_deref(),
                    Some("draining" | "drained")
                )
            })
        },
    );
    for (key, _) in objects.iter().take(20) {
        assert_ne!(
            owner_in(&nodes[0], key),
            "d2",
            "a draining member owns {key}"
        );
    }
    let took = wait_for(Duration::from_secs(60), "d2 drained", || {
        nodes
            .iter()
            .all(|n| n.member_state("d2").as_deref() == Some("drained"))
    });
    stop.store(true, Ordering::Relaxed);
    let (reads, failed) = reader.join().expect("the reader");
    assert!(
        failed.is_empty(),
        "{} of {reads} reads failed during the drain:\n{}",
        failed.len(),
        failed
            .iter()
            .map(|(_, w)| w.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(nodes[2].stat("objects"), 0, "d2 holds nothing");
    let view = nodes[0].cluster_view(None)?;
    let d2 = view["members"]
        .as_array()
        .and_then(|m| m.iter().find(|m| m["id"] == "d2").cloned())
        .unwrap_or_default();
    assert_eq!(
        d2["handover"]["bytes_done"], d2["handover"]["bytes_total"],
        "{view}"
    );
    let now = from_backend(&nodes);
    let during: u64 = now.iter().zip(&before).map(|(n, b)| n - b).sum();
    // d2's count ends here: a restart starts it again.
    let d2_during = now[2] - before[2];
    assert!(
        during as f64 <= held as f64 * 0.01,
        "the backend served {during} bytes for a drain of {held}"
    );
    // A drained member stays out of the ring across a restart.
    nodes[2].restart(false)?;
    wait_for(UP_TIMEOUT, "d2 back, drained", || {
        nodes[0].member_state("d2").as_deref() == Some("drained")
    });
    assert_eq!(nodes[2].stat("objects"), 0);
    // Undone, it owns its keys again (and is handed their copies back); drained again,
    // it gives them up again.
    let r = send(
        &nodes[1],
        "POST",
        "/_granary/cluster/drain",
        &[],
        br#"{"node":"d2","undo":true}"#,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert!(r.text().contains(r#""state":"serving""#), "{}", r.text());
    wait_for(Duration::from_secs(5), "d2 up again everywhere", || {
        nodes
            .iter()
            .all(|n| n.member_state("d2").as_deref() == Some("up"))
    });
    assert!(
        objects
            .iter()
            .any(|(key, _)| owner_in(&nodes[0], key) == "d2"),
        "d2 owns keys again"
    );
    wait_for(Duration::from_secs(60), "d2 handed its copies back", || {
        Server::settle(&[&nodes[0], &nodes[1], &nodes[2]]);
        nodes[2].stat("objects") > 0
    });
    let r = send(
        &nodes[1],
        "POST",
        "/_granary/cluster/drain",
        &[],
        br#"{"node":"d2"}"#,
    );
    assert_eq!(r.status, 202, "{}", r.text());
    wait_for(Duration::from_secs(60), "d2 drained again", || {
        nodes[0].member_state("d2").as_deref() == Some("drained") && nodes[2].stat("objects") == 0
    });

    // Stopped, and out of the list: every key reads, from the two that hold it all.
    nodes[2].kill()?;
    let gone = nodes.pop().expect("three nodes");
    peers.write(&[(ids[0], addrs[0]), (ids[1], addrs[1])])?;
    let two: Vec<&Server> = nodes.iter().collect();
    wait_for(UP_TIMEOUT, "two members", || sees(&two, &ids[..2]));
    read_all(&nodes[0], &objects);
    read_all(&nodes[1], &objects);
    Server::settle(&two);
    drop(gone);
    let leave: u64 = from_backend(&nodes)
        .iter()
        .zip(&before)
        .map(|(n, b)| n - b)
        .sum::<u64>()
        + d2_during;
    assert!(
        leave as f64 <= held as f64 * 0.01,
        "the backend served {leave} bytes for a leave of {held}"
    );
    let cached = used(&two);
    assert!(
        cached as f64 <= dataset as f64 * 1.05 && cached >= dataset,
        "one copy of each object: {cached} of {dataset}"
    );
    eprintln!(
        "drain of {held} bytes: drained in {:.1} s, {reads} reads, none failed; backend bytes for the leave: {}",
        took.as_secs_f64(),
        leave
    );
    Ok(())
}

/// dnsmasq on loopback, answering for `granary.test` from a hosts file it reads again on
/// SIGHUP.
struct Dns {
    child: Child,
    hosts: PathBuf,
    _dir: tempfile::TempDir,
    addr: SocketAddr,
}

impl Dns {
    fn start(records: &[(&str, &str)]) -> Result<Dns> {
        let dir = tempfile::tempdir()?;
        let hosts = dir.path().join("hosts");
        let port = reserve_ports(1)?[0].port();
        let mut dns = Dns {
            child: Command::new("true").spawn()?,
            hosts,
            _dir: dir,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        dns.set(records)?;
        let bin = ["/usr/sbin/dnsmasq", "/usr/local/sbin/dnsmasq"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .unwrap_or("dnsmasq");
        dns.child = Command::new(bin)
            .args([
                "--keep-in-foreground",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--listen-address=127.0.0.1",
                "--user=root",
                "--local-ttl=0",
                &format!("--port={port}"),
                &format!("--addn-hosts={}", dns.hosts.display()),
                "--pid-file=",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("dnsmasq (Debian's dnsmasq-base; tests/run.sh installs it)")?;
        std::thread::sleep(Duration::from_millis(300));
        Ok(dns)
    }

    /// `(id, ip)`: `ip` answers for `granary.test`, and its reverse name is `id.granary.test`.
    fn set(&mut self, records: &[(&str, &str)]) -> Result<()> {
        let text: String = records
            .iter()
            .map(|(id, ip)| format!("{ip} {id}.granary.test granary.test\n"))
            .collect();
        std::fs::write(&self.hosts, text)?;
        // SAFETY: signals a child this struct started and still owns.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGHUP) };
        Ok(())
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Members as the addresses of a name, from a real DNS server: two members, then a third
/// added to the records (it joins), then one removed (it leaves); no node restarts.
#[test]
fn members_follow_a_dns_name() -> Result<()> {
    let port = reserve_ports(1)?[0].port();
    let ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4"];
    let ids = ["g0", "g1", "g2"];
    let mut dns = Dns::start(&[(ids[0], ips[0]), (ids[1], ips[1])])?;
    let server = dns.addr.to_string();
    let node = |i: usize| {
        Server::start(
            ServerOpts::open()
                .listen(format!("{}:{port}", ips[i]).parse().unwrap())
                .args(&[
                    "--node-id",
                    ids[i],
                    "--peers-dns",
                    &format!("granary.test:{port}"),
                    "--peers-dns-server",
                    &server,
                ]),
        )
    };
    let mut nodes = vec![node(0)?, node(1)?];
    let two: Vec<&Server> = nodes.iter().collect();
    wait_for(UP_TIMEOUT, "two members from DNS", || sees(&two, &ids[..2]));
    dns.set(&[(ids[0], ips[0]), (ids[1], ips[1]), (ids[2], ips[2])])?;
    nodes.push(node(2)?);
    let three: Vec<&Server> = nodes.iter().collect();
    let joined = wait_for(UP_TIMEOUT, "three members from DNS", || sees(&three, &ids));
    dns.set(&[(ids[0], ips[0]), (ids[2], ips[2])])?;
    let rest: Vec<&Server> = vec![&nodes[0], &nodes[2]];
    let left = wait_for(UP_TIMEOUT, "g1 gone from the records", || {
        sees(&rest, &["g0", "g2"])
    });
    eprintln!("a member added to DNS seen by all after {joined:?}; one removed after {left:?}");
    Ok(())
}

fn owned_elsewhere(nodes: &[&Server], via: &Server) -> String {
    (0..1000)
        .map(|i| format!("k{i}"))
        .find(|k| {
            let v = via.cluster_view(Some((BUCKET, k))).expect("view");
            v["owner"] != v["node_id"]
        })
        .unwrap_or_else(|| panic!("no key owned elsewhere among {} nodes", nodes.len()))
}

/// With credentials and anonymous reads, an unsigned client cannot make a non-owner serve
/// and keep an object (`x-granary-hop`), learn whether a node holds one
/// (`x-granary-peer-fill`), or call a member's route; nor can it in an open cluster with
/// a cluster secret.
#[test]
fn members_headers_mean_nothing_from_others() -> Result<()> {
    for (name, opts) in [
        (
            "credentials, anonymous reads",
            ServerOpts {
                credentials: true,
                anonymous_read: true,
                ..ServerOpts::default()
            },
        ),
        (
            "open, cluster secret",
            ServerOpts::open().args(&["--cluster-secret", "a cluster secret"]),
        ),
    ] {
        let origin = tempfile::tempdir()?;
        let dir = origin.path().join(BUCKET);
        std::fs::create_dir_all(&dir)?;
        let opts = opts.args(&["--backend", &format!("fs:{}", origin.path().display())]);
        let nodes = Server::start_cluster(&["a", "b"], &opts)?;
        let all: Vec<&Server> = nodes.iter().collect();
        Server::wait_cluster_up(&all, UP_TIMEOUT)?;
        let key = owned_elsewhere(&all, &nodes[0]);
        std::fs::write(dir.join(&key), b"steered?")?;
        let owner_id = nodes[0].cluster_view(Some((BUCKET, &key)))?["owner"]
            .as_str()
            .unwrap_or("")
            .to_owned();
        // A forged hop: the request is routed to the owner like any other.
        for hop in ["zz", "a 1700000000 00", "b"] {
            let r = send(
                &nodes[0],
                "GET",
                &obj_path(&key),
                &[("x-granary-hop", hop)],
                b"",
            );
            assert_eq!(r.status, 200, "{name}: {}", r.text());
            assert_eq!(
                r.header("x-granary-node"),
                Some(owner_id.as_str()),
                "{name}, hop {hop}"
            );
        }
        assert_eq!(
            nodes[0].stat("objects"),
            0,
            "{name}: the non-owner kept nothing"
        );
        // A forged peer fill is an ordinary read: no 404 that tells what a node holds.
        let other = owned_elsewhere(&all, &nodes[1]);
        std::fs::write(dir.join(&other), b"held?")?;
        let r = send(
            &nodes[0],
            "GET",
            &obj_path(&other),
            &[("x-granary-peer-fill", "1")],
            b"",
        );
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        assert_eq!(r.body, b"held?");
        // Members' routes.
        for path in ["/_granary/invalidate", "/_granary/take"] {
            let r = send(&nodes[0], "POST", path, &[("x-granary-hop", "b")], b"[]");
            r.assert_s3_error(403, &["AccessDenied"]);
        }
        // A member's revalidation of every copy is a user's request from anyone else:
        // refused unsigned where credentials are set, and otherwise made to name a bucket.
        let r = send(
            &nodes[0],
            "POST",
            "/_granary/revalidate",
            &[("x-granary-hop", "b")],
            b"{}",
        );
        if opts.credentials {
            r.assert_s3_error(403, &["AccessDenied"]);
        } else {
            r.assert_s3_error(400, &["InvalidArgument"]);
        }
    }
    Ok(())
}

/// `granary-bench rebalance`, small: a fourth member joins three that cache 80 objects,
/// paced slowly enough to time reads during the passes. The others hand it about its
/// share, no read fails, and the cluster holds one copy of each object after.
#[test]
fn the_rebalance_bench_hands_a_new_member_its_share_and_fails_no_read() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let json = dir.path().join("rebalance.json");
    let out = Command::new(granary_tests::bench_bin())
        .args(["rebalance", "--objects", "80", "--object-size", "256KiB"])
        .args(["--steady", "1s", "--readers", "2"])
        .args(["--serve-arg=--rebalance-rate", "--serve-arg=2MB"])
        .arg("--granary")
        .arg(granary_tests::granary_bin())
        .arg("--dir")
        .arg(dir.path().join("run"))
        .arg("--json")
        .arg(&json)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    let moved = r["moved_objects"].as_u64().unwrap_or(0);
    assert!((5..=40).contains(&moved), "a quarter of 80 or so: {text}");
    assert_eq!(r["failed_reads"], 0, "{text}");
    assert!(r["steady"]["reads"].as_u64() > Some(0), "{text}");
    assert!(r["during_rebalance"]["reads"].as_u64() > Some(0), "{text}");
    assert!(r["rebalance_mb_per_s"].as_f64() > Some(0.0), "{text}");
    let after = r["cached_over_dataset_after"].as_f64().unwrap_or(9.0);
    assert!((0.95..=1.05).contains(&after), "{text}");
    // Two leaves: a drained member costs the backend nothing; one simply stopped, the
    // refill of what it held.
    let (drain, plain) = (&r["drain"], &r["plain_leave"]);
    assert!(drain["held_bytes"].as_u64() > Some(0), "{text}");
    assert!(drain["backend_over_held"].as_f64() <= Some(0.01), "{text}");
    assert!(plain["backend_over_held"].as_f64() >= Some(0.9), "{text}");
    assert_eq!(
        (
            drain["failed_reads"].as_u64(),
            plain["failed_reads"].as_u64()
        ),
        (Some(0), Some(0)),
        "{text}"
    );
    eprintln!("{text}");
    Ok(())
}

fn health_status(node: &Server) -> u16 {
    send(node, "GET", "/_granary/health", &[], b"").status
}

/// The owner of `key` in `node`'s view.
fn owner_in(node: &Server, key: &str) -> String {
    node.cluster_view(Some((BUCKET, key))).expect("view")["owner"]
        .as_str()
        .unwrap_or("")
        .to_owned()
}

/// A key `node` names `want` the owner of, among `k0`, `k1`, …; its name.
fn key_owned(node: &Server, want: &str, also: Option<(&Server, &str)>) -> String {
    (0..5000)
        .map(|i| format!("k{i}"))
        .find(|k| owner_in(node, k) == want && also.is_none_or(|(n, w)| owner_in(n, k) == w))
        .expect("such a key")
}

/// Members whose lists disagree for a while, as they do while a ConfigMap update or a
/// DNS change reaches them one by one. Each member follows its own peers file here, so
/// the test decides who lags.
///
/// - A new member that a lagging member does not list yet stays unsettled (health `503`)
///   and keeps nothing while it could miss that member's writes; reads routed to it by
///   the others and writes through the lagging one stay consistent. Once the lagging
///   member lists it, it settles.
/// - A member taken out of some lists but not yet out of another still hears of writes
///   made through the members that dropped it: a read routed to it by the lagging member
///   never returns the version it held before.
#[test]
fn members_whose_lists_lag_never_serve_an_old_version() -> Result<()> {
    let origin = tempfile::tempdir()?;
    std::fs::create_dir_all(origin.path().join(BUCKET))?;
    let addrs = reserve_ports(4)?;
    let ids = ["a", "b", "c", "d"];
    let opts = ServerOpts::open().args(&["--backend", &format!("fs:{}", origin.path().display())]);
    let list =
        |n: usize| -> Vec<(&str, SocketAddr)> { (0..n).map(|i| (ids[i], addrs[i])).collect() };
    let mut files: Vec<PeersFile> = (0..4).map(|_| PeersFile::new()).collect::<Result<_>>()?;
    for f in files.iter_mut().take(3) {
        f.write(&list(3))?;
    }
    let mut nodes: Vec<Server> = (0..3)
        .map(|i| file_node(&files[i], ids[i], addrs[i], &opts))
        .collect::<Result<_>>()?;
    let three: Vec<&Server> = nodes.iter().collect();
    wait_for(UP_TIMEOUT, "three members up", || sees(&three, &ids[..3]));

    // d joins; a and b list it, c lags.
    files[3].write(&list(4))?;
    files[0].write(&list(4))?;
    files[1].write(&list(4))?;
    let path = files[3].path();
    let d = Server::start_unready(opts.clone().listen(addrs[3]).args(&[
        "--node-id",
        "d",
        "--peers-file",
        &path.to_string_lossy(),
    ]))?;
    nodes.push(d);
    let (a, c, d) = (&nodes[0], &nodes[2], &nodes[3]);
    wait_for(UP_TIMEOUT, "a sees d up", || {
        a.member_state("d").as_deref() == Some("up")
    });
    // A key d owns in a's view and c owns in its own.
    let key = key_owned(a, "d", Some((c, "c")));
    let path_k = obj_path(&key);
    for round in 0..4u64 {
        let data = Pattern::new(70 + round).bytes(0, 10_000 + round as usize);
        let r = send(c, "PUT", &path_k, &[], &data);
        assert_eq!(r.status, 200, "{}", r.text());
        for _ in 0..2 {
            let r = send(a, "GET", &path_k, &[], b"");
            assert_eq!(r.status, 200);
            assert!(
                r.body == data,
                "round {round}: an old version through a (routed to d)"
            );
            assert_eq!(r.header("x-granary-node"), Some("d"));
        }
        assert_eq!(health_status(d), 503, "d settles only once c lists it");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert_eq!(
        d.stat("objects"),
        0,
        "d keeps nothing while c may write without telling it"
    );
    files[2].write(&list(4))?;
    let settled = wait_for(UP_TIMEOUT, "d settles once c lists it", || {
        health_status(d) == 200
    });
    let all: Vec<&Server> = nodes.iter().collect();
    wait_for(UP_TIMEOUT, "four members up", || sees(&all, &ids));

    // d, settled, holds the key now.
    let r = send(a, "GET", &path_k, &[], b"");
    assert_eq!(r.status, 200);
    Server::settle(&all);
    let r = send(a, "GET", &path_k, &[], b"");
    assert_eq!(
        r.header("x-granary-cache"),
        Some("hit"),
        "d caches what it owns"
    );

    // Versions written through a while every member lists d: d, their owner, holds
    // them. (Once the others drop d, d trusts its copies no more and admits nothing.)
    let (a, b) = (&nodes[0], &nodes[1]);
    let old = Pattern::new(90).bytes(0, 12_345);
    let on_d: Vec<String> = (0..5000)
        .map(|i| format!("k{i}"))
        .filter(|k| owner_in(a, k) == "d")
        .take(24)
        .collect();
    for k in &on_d {
        assert_eq!(send(a, "PUT", &obj_path(k), &[], &old).status, 200);
        assert_eq!(
            send(a, "GET", &obj_path(k), &[], b"").header("x-granary-cache"),
            Some("hit"),
            "d holds the version a wrote through it"
        );
    }
    // d leaves: b and c drop it, a lags. One of those keys b owns in its view now.
    files[1].write(&list(3))?;
    files[2].write(&list(3))?;
    wait_for(UP_TIMEOUT, "b and c drop d", || {
        sees(&[&nodes[1], &nodes[2]], &ids[..3])
    });
    let held = on_d
        .iter()
        .find(|k| owner_in(b, k) == "b")
        .expect("a key d held that b owns now");
    let path_h = obj_path(held);
    let r = send(a, "GET", &path_h, &[], b"");
    assert_eq!(r.header("x-granary-node"), Some("d"));
    for round in 0..3u64 {
        let data = Pattern::new(91 + round).bytes(0, 23_456 + round as usize);
        assert_eq!(send(b, "PUT", &path_h, &[], &data).status, 200);
        let r = send(a, "GET", &path_h, &[], b"");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-granary-node"), Some("d"), "a still routes to d");
        assert!(
            r.body == data,
            "round {round}: d served a version older than b's write"
        );
    }
    eprintln!("a new member settled {settled:?} after the lagging member listed it");
    Ok(())
}

/// Sends a captured request again, to `to`, with `body` in place of its own; its
/// headers as captured (the host and length made right for the new target and body).
fn replay(to: &Server, captured: &granary_tests::faults::Recorded, body: &[u8]) -> RawResponse {
    let headers: Vec<(&str, &str)> = captured
        .headers
        .iter()
        .filter(|(k, _)| {
            !["host", "content-length", "connection"].contains(&k.to_ascii_lowercase().as_str())
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    send(to, &captured.method, &captured.target, &headers, body)
}

/// A member's own requests are good once, at the member they were sent to, with the body
/// they were sent with. A man in the middle between a and b captures a's invalidation
/// and its prefetch hand-over; replayed to b, to c, or with another body (a key list of
/// what b or c holds), each is refused `403`, and no cached copy or job comes of it.
#[test]
fn a_members_captured_requests_are_refused_when_replayed() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let objects = lay_out(origin.path(), "", 60, 1000, 77);
    let opts = ServerOpts::open().args(&[
        "--cluster-secret",
        "a cluster secret",
        "--backend",
        &format!("fs:{}", origin.path().display()),
    ]);
    let addrs = reserve_ports(3)?;
    // a reaches b through the proxy; b and c reach everyone directly.
    let proxy = granary_tests::FaultProxy::start(addrs[1])?;
    let direct: Vec<String> = ["a", "b", "c"]
        .iter()
        .zip(&addrs)
        .map(|(id, addr)| format!("{id}=http://{addr}"))
        .collect();
    let mut via_proxy = direct.clone();
    via_proxy[1] = format!("b={}", proxy.url());
    let mut nodes = Vec::new();
    for (i, id) in ["a", "b", "c"].iter().enumerate() {
        let peers = if i == 0 { &via_proxy } else { &direct };
        let mut args = vec!["--node-id", id];
        for p in peers {
            args.extend(["--peer", p.as_str()]);
        }
        nodes.push(Server::start(opts.clone().listen(addrs[i]).args(&args))?);
    }
    let all: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&all, UP_TIMEOUT)?;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);

    // b and c cache what they own.
    read_all(b, &objects);
    Server::settle(&all);
    let (held_b, held_c) = (b.stat("objects"), c.stat("objects"));
    assert!(held_b > 5 && held_c > 5, "b holds {held_b}, c {held_c}");
    let held_by = |id: &str| {
        objects
            .iter()
            .map(|(k, _)| k.clone())
            .find(|k| owner_in(a, k) == id)
            .expect("an object of each member")
    };
    let (key_b, key_c) = (held_by("b"), held_by("c"));
    let key_a = key_owned(a, "a", None);
    for (node, key) in [(b, &key_b), (c, &key_c)] {
        let r = send(node, "GET", &obj_path(key), &[], b"");
        assert_eq!(r.header("x-granary-cache"), Some("hit"), "{key}");
    }

    // A write through a: a tells b (through the proxy) and c to drop their copies.
    let r = send(a, "PUT", &obj_path(&key_a), &[], b"new bytes");
    assert_eq!(r.status, 200, "{}", r.text());
    wait_for(UP_TIMEOUT, "a's invalidation through the proxy", || {
        !proxy.recorded("POST", "/_granary/invalidate").is_empty()
    });
    let told = proxy.recorded("POST", "/_granary/invalidate");
    let inv = told.last().expect("recorded");
    assert!(
        String::from_utf8_lossy(&inv.body).contains(&key_a),
        "it lists {key_a}"
    );
    let list = |key: &str| format!("[{{\"bucket\":\"{BUCKET}\",\"key\":\"{key}\"}}]");
    for (to, body, what) in [
        (b, inv.body.clone(), "verbatim, to b"),
        (b, list(&key_b).into_bytes(), "to b, listing what b holds"),
        (c, inv.body.clone(), "verbatim, to c"),
        (c, list(&key_c).into_bytes(), "to c, listing what c holds"),
    ] {
        let r = replay(to, inv, &body);
        assert_eq!(r.status, 403, "{what}: {}", r.text());
        r.assert_s3_error(403, &["AccessDenied"]);
    }
    assert_eq!((b.stat("objects"), c.stat("objects")), (held_b, held_c));
    for (node, key) in [(b, &key_b), (c, &key_c)] {
        let r = send(node, "GET", &obj_path(key), &[], b"");
        assert_eq!(r.header("x-granary-cache"), Some("hit"), "{key} kept");
    }

    // A copy a asks b for on a miss (through the proxy): replayed by an outsider, it
    // gets nothing, though a read changes nothing.
    let more = lay_out(origin.path(), "fill-", 20, 1000, 79);
    let (fill_key, fill_data) = more
        .iter()
        .find(|(k, _)| owner_in(a, k) == "a")
        .expect("a key a owns");
    let r = send(a, "GET", &obj_path(fill_key), &[], b"");
    assert!(r.body == *fill_data, "{fill_key} through a");
    let asked = proxy.recorded("GET", &obj_path(fill_key));
    let ask = asked
        .first()
        .expect("a asked b for a copy through the proxy");
    assert!(ask
        .headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("x-granary-peer-fill")));
    let r = replay(b, ask, b"");
    r.assert_s3_error(403, &["AccessDenied"]);
    assert!(r.text().contains("seen before"), "{}", r.text());

    // b restarts, forgetting the nonces it saw: what a signed for its earlier
    // incarnation is refused all the same (within the window: not as too old).
    let inv = inv.clone();
    nodes[1].kill_and_restart()?;
    let all: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&all, UP_TIMEOUT)?;
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let r = replay(b, &inv, &inv.body);
    r.assert_s3_error(403, &["AccessDenied"]);
    assert!(r.text().contains("bad peer signature"), "{}", r.text());

    // A prefetch through a hands b its part (through the proxy).
    lay_out(origin.path(), "more-", 30, 1000, 78);
    let r = send(
        a,
        "POST",
        "/_granary/prefetch",
        &[],
        format!("{{\"bucket\":\"{BUCKET}\",\"prefix\":\"more-\"}}").as_bytes(),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    let id = serde_json::from_slice::<serde_json::Value>(&r.body)?["id"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    wait_for(UP_TIMEOUT, "the prefetch done", || {
        let job = send(a, "GET", &format!("/_granary/jobs/{id}"), &[], b"");
        serde_json::from_slice::<serde_json::Value>(&job.body).is_ok_and(|v| v["state"] == "done")
    });
    let parts = proxy.recorded("POST", "/_granary/prefetch");
    let part = parts.first().expect("b's part went through the proxy");
    assert!(String::from_utf8_lossy(&part.body).contains("more-"));
    let jobs_b = send(b, "GET", "/_granary/jobs", &[], b"")
        .text()
        .matches("\"id\"")
        .count();
    let held_b = b.stat("objects");
    let others = String::from_utf8_lossy(&part.body).replace("more-", "else-");
    for (to, body) in [
        (b, part.body.clone()),
        (b, others.clone().into_bytes()),
        (c, part.body.clone()),
    ] {
        replay(to, part, &body).assert_s3_error(403, &["AccessDenied"]);
    }
    let jobs_now = send(b, "GET", "/_granary/jobs", &[], b"")
        .text()
        .matches("\"id\"")
        .count();
    assert_eq!(jobs_now, jobs_b, "no job came of a replay");
    assert_eq!(b.stat("objects"), held_b);
    Ok(())
}

fn signal(node: &Server, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &node.pid().to_string()])
        .status()
        .expect("kill");
    assert!(status.success(), "kill {sig}");
}

/// A member paused (SIGSTOP) while the others mark it down and acknowledge a write of a
/// key it holds; reads queued at it meanwhile are answered when it resumes (SIGCONT),
/// before it has heard anything. Its lease ran out during the pause, so it checks its
/// copy first: never the old version, in any of the runs.
#[test]
fn a_paused_member_never_serves_what_was_written_while_it_slept() -> Result<()> {
    const RUNS: u64 = 50;
    const READS: usize = 4;
    let origin = tempfile::tempdir()?;
    std::fs::create_dir_all(origin.path().join(BUCKET))?;
    let opts = ServerOpts::open().args(&["--backend", &format!("fs:{}", origin.path().display())]);
    let nodes = Server::start_cluster(&["a", "b", "c"], &opts)?;
    let all: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&all, UP_TIMEOUT)?;
    let (a, c) = (&nodes[0], &nodes[2]);
    let key = key_owned(a, "c", None);
    let path = obj_path(&key);
    let first = Pattern::new(500).bytes(0, 50_000);
    assert_eq!(send(a, "PUT", &path, &[], &first).status, 200);
    send(c, "GET", &path, &[], b"");
    Server::settle(&all);
    let r = send(c, "GET", &path, &[], b"");
    assert_eq!(r.header("x-granary-cache"), Some("hit"), "c holds its key");
    let mut old = 0;
    for run in 0..RUNS {
        wait_for(UP_TIMEOUT, "a sees c up", || {
            a.member_state("c").as_deref() == Some("up")
        });
        signal(c, "-STOP");
        wait_for(UP_TIMEOUT, "a marks the paused c down", || {
            a.member_state("c").as_deref() == Some("down")
        });
        let data = Pattern::new(501 + run).bytes(0, 50_000 + run as usize);
        let w = send(a, "PUT", &path, &[], &data);
        assert_eq!(w.status, 200, "{}", w.text());
        let addr = c.addr();
        let readers: Vec<_> = (0..READS)
            .map(|_| {
                let req = request_bytes("GET", &path, addr, &[], b"");
                std::thread::spawn(move || {
                    granary_tests::raw_request_with_timeout(addr, &req, Duration::from_secs(30))
                })
            })
            .collect();
        // Queued at the paused member before it resumes.
        std::thread::sleep(Duration::from_millis(200));
        signal(c, "-CONT");
        for r in readers {
            let r = r.join().unwrap()?;
            assert_eq!(r.status, 200, "{}", r.text());
            if r.body != data {
                old += 1;
                eprintln!(
                    "run {run}: an old version from c ({:?})",
                    r.header("x-granary-cache")
                );
            }
        }
    }
    assert_eq!(old, 0, "old versions served by the resumed member");
    Ok(())
}
