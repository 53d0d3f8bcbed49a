//! Objects that change behind the cache, with real processes over moto: a copy is
//! checked against the backend once its last check is older than `--revalidate-after`
//! (per bucket in the TOML), a forced revalidation of a prefix reaches every member, and
//! a write whose outcome a node never learned (killed while the backend held it) leaves
//! no old version served once the backend commits it.

use std::time::{Duration, Instant};

use anyhow::Result;
use granary_tests::{
    raw_request_blocking, raw_request_with_timeout, request_bytes, FaultProxy, Moto, Pattern,
    RawResponse, Server, ServerOpts,
};

fn send(node: &Server, method: &str, path: &str) -> RawResponse {
    let addr = node.addr();
    raw_request_blocking(addr, &request_bytes(method, path, addr, &[], b""))
        .unwrap_or_else(|e| panic!("{method} {path}: {e:#}"))
}

/// Writes `data` straight into the backend, as a pipeline would, not through Granary.
fn put_behind(moto: &Moto, bucket: &str, key: &str, data: &[u8]) -> Result<()> {
    let client = moto.client();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        if client.head_bucket().bucket(bucket).send().await.is_err() {
            client.create_bucket().bucket(bucket).send().await?;
        }
        client
            .put_object()
            .bucket(bucket)
            .key(key)
            .body(data.to_vec().into())
            .send()
            .await?;
        anyhow::Ok(())
    })
}

/// Reads `bucket/key` until its bytes are `want`: how long that took from `since`.
fn served_new_after(
    node: &Server,
    bucket: &str,
    key: &str,
    want: &[u8],
    since: Instant,
) -> Duration {
    let deadline = since + Duration::from_secs(10);
    loop {
        let r = send(node, "GET", &format!("/{bucket}/{key}"));
        assert_eq!(r.status, 200, "{}", r.text());
        if r.body == want {
            return since.elapsed();
        }
        assert!(
            Instant::now() < deadline,
            "{bucket}/{key} still old after 10 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A bucket revalidated after 1 s is served new within 1 s + 1 s of an overwrite made
/// straight in the backend, and its hits check the backend at most once a second; a
/// bucket set to `never` in the TOML keeps its copy until a forced revalidation.
#[test]
fn an_object_overwritten_in_the_backend_is_served_new_within_revalidate_after() -> Result<()> {
    let moto = Moto::start()?;
    let (old, new) = (
        Pattern::new(1).bytes(0, 300_000),
        Pattern::new(2).bytes(0, 300_001),
    );
    for bucket in ["fresh", "frozen"] {
        put_behind(&moto, bucket, "wids.json", &old)?;
    }
    let dir = tempfile::tempdir()?;
    let toml = dir.path().join("granary.toml");
    std::fs::write(&toml, "[buckets.frozen]\nrevalidate_after = \"never\"\n")?;
    let node = Server::start(ServerOpts::s3_backend(&moto.url()).args(&[
        "--revalidate-after",
        "1s",
        "--config",
        &toml.to_string_lossy(),
    ]))?;
    for bucket in ["fresh", "frozen"] {
        let path = format!("/{bucket}/wids.json");
        assert_eq!(send(&node, "GET", &path).body, old);
        Server::settle(&[&node]);
        let hit = send(&node, "GET", &path);
        assert_eq!(hit.header("x-granary-cache"), Some("hit"), "{bucket}");
        assert_eq!(hit.body, old);
    }
    // Hits within the second since the last check ask the backend nothing.
    let checks = node.stat("hit_checks");
    for _ in 0..10 {
        assert_eq!(send(&node, "GET", "/fresh/wids.json").body, old);
    }
    assert!(
        node.stat("hit_checks") - checks <= 1,
        "one check a second at most"
    );

    let changed = Instant::now();
    for bucket in ["fresh", "frozen"] {
        put_behind(&moto, bucket, "wids.json", &new)?;
    }
    let took = served_new_after(&node, "fresh", "wids.json", &new, changed);
    assert!(took <= Duration::from_secs(2), "served new after {took:?}");
    Server::settle(&[&node]);
    let again = send(&node, "GET", "/fresh/wids.json");
    assert_eq!(again.body, new);
    assert_eq!(
        again.header("x-granary-cache"),
        Some("hit"),
        "the new copy is kept"
    );

    // Immutable by configuration: still the old copy well past the default's bound.
    std::thread::sleep(Duration::from_millis(2500).saturating_sub(changed.elapsed()));
    let frozen = send(&node, "GET", "/frozen/wids.json");
    assert_eq!(frozen.header("x-granary-cache"), Some("hit"));
    assert!(frozen.body == old, "never revalidated: the copy stays");
    // Until a forced revalidation of its prefix.
    let r = send(
        &node,
        "POST",
        "/_granary/revalidate?bucket=frozen&prefix=wids",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(
        (v["marked"].as_u64(), v["every_member"].as_bool()),
        (Some(1), Some(true))
    );
    let forced = send(&node, "GET", "/frozen/wids.json");
    assert!(forced.body == new, "new after a forced revalidation");
    send(&node, "POST", "/_granary/revalidate").assert_s3_error(400, &["InvalidArgument"]);
    Ok(())
}

/// A forced revalidation asked of one member reaches every member's copies: objects
/// overwritten straight in the backend are served new through any node at once.
#[test]
fn a_forced_revalidation_reaches_every_members_copies() -> Result<()> {
    let moto = Moto::start()?;
    let keys: Vec<String> = (0..30).map(|i| format!("shards/{i:03}.tar")).collect();
    for (i, k) in keys.iter().enumerate() {
        put_behind(
            &moto,
            "data",
            k,
            &Pattern::new(10 + i as u64).bytes(0, 20_000),
        )?;
    }
    let nodes = Server::start_cluster(&["a", "b", "c"], &ServerOpts::s3_backend(&moto.url()))?;
    let all: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&all, Duration::from_secs(20))?;
    for k in &keys {
        assert_eq!(send(&nodes[0], "GET", &format!("/data/{k}")).status, 200);
    }
    Server::settle(&all);
    let held: u64 = nodes.iter().map(|n| n.stat("objects")).sum();
    assert_eq!(held, keys.len() as u64, "one copy of each, on its owner");
    for (i, k) in keys.iter().enumerate() {
        put_behind(
            &moto,
            "data",
            k,
            &Pattern::new(100 + i as u64).bytes(0, 20_001),
        )?;
    }
    let r = send(
        &nodes[1],
        "POST",
        "/_granary/revalidate?bucket=data&prefix=shards/",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v: serde_json::Value = serde_json::from_slice(&r.body)?;
    assert_eq!(v["marked"].as_u64(), Some(keys.len() as u64), "{v}");
    for (i, k) in keys.iter().enumerate() {
        let r = send(&nodes[2], "GET", &format!("/data/{k}"));
        assert!(
            r.body == Pattern::new(100 + i as u64).bytes(0, 20_001),
            "{k} new"
        );
    }
    Ok(())
}

/// How long the store holds a write it took whole before committing it.
const HOLD: Duration = Duration::from_secs(3);
/// After the commit, the most a read may still see the old version.
const BOUND: Duration = Duration::from_secs(3);

/// A client's PUT of `new` through `nodes[writer]` reaches the store whole; the store
/// holds it, and the writer is SIGKILLed 50 ms later and restarted: the write's outcome
/// was never learned. Reads through every node until well after the store commits: none
/// that starts more than [`BOUND`] after the commit returns the old version, and none
/// after another restart of the writer.
fn lost_write(
    nodes: &mut [Server],
    writer: usize,
    proxy: &FaultProxy,
    path: &str,
    old: &[u8],
    new: &[u8],
) -> Result<()> {
    let puts = || proxy.recorded("PUT", path).len();
    let before = puts();
    proxy.hold_writes(Some(HOLD));
    let addr = nodes[writer].addr();
    let req = request_bytes("PUT", path, addr, &[], new);
    let client =
        std::thread::spawn(move || raw_request_with_timeout(addr, &req, Duration::from_secs(30)));
    let deadline = Instant::now() + Duration::from_secs(20);
    while puts() == before {
        assert!(
            Instant::now() < deadline,
            "the write never reached the store"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(50));
    nodes[writer].kill()?;
    proxy.hold_writes(None);
    assert!(
        client.join().unwrap().is_err(),
        "the client learned no outcome"
    );
    nodes[writer].restart(false)?;
    let all: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&all, Duration::from_secs(20))?;
    let (mut old_before, mut old_late, mut reads_after) = (0, 0, 0);
    loop {
        let committed = proxy.released().first().copied();
        if committed.is_some_and(|c| c.elapsed() > BOUND + Duration::from_secs(3)) {
            break;
        }
        for n in nodes.iter() {
            let started = Instant::now();
            let r = send(n, "GET", path);
            assert_eq!(r.status, 200, "{}", r.text());
            assert!(r.body == old || r.body == new, "a whole version");
            let late = committed.is_some_and(|c| started > c + BOUND);
            if late {
                reads_after += 1;
            }
            if r.body == old {
                if late {
                    old_late += 1;
                } else {
                    old_before += 1;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    eprintln!("old versions read before the commit and its bound: {old_before}");
    assert!(reads_after > 0);
    assert_eq!(
        old_late, 0,
        "old versions read more than {BOUND:?} after the store committed"
    );
    nodes[writer].restart(false)?;
    let all: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&all, Duration::from_secs(20))?;
    for n in nodes.iter() {
        assert!(
            send(n, "GET", path).body == new,
            "new after another restart"
        );
    }
    Ok(())
}

#[test]
fn a_lost_writes_commit_is_seen_on_one_node() -> Result<()> {
    let moto = Moto::start()?;
    let proxy = FaultProxy::start(moto.addr())?;
    let (old, new) = (
        Pattern::new(3).bytes(0, 8 << 20),
        Pattern::new(4).bytes(0, 8 << 20),
    );
    put_behind(&moto, "data", "big.bin", &old)?;
    let mut nodes = vec![Server::start(ServerOpts::s3_backend(&proxy.url()))?];
    assert!(send(&nodes[0], "GET", "/data/big.bin").body == old);
    Server::settle(&[&nodes[0]]);
    assert_eq!(
        send(&nodes[0], "GET", "/data/big.bin").header("x-granary-cache"),
        Some("hit")
    );
    lost_write(&mut nodes, 0, &proxy, "/data/big.bin", &old, &new)
}

#[test]
fn a_lost_writes_commit_is_seen_on_three_nodes() -> Result<()> {
    let moto = Moto::start()?;
    let proxy = FaultProxy::start(moto.addr())?;
    let (old, new) = (
        Pattern::new(5).bytes(0, 8 << 20),
        Pattern::new(6).bytes(0, 8 << 20),
    );
    put_behind(&moto, "data", "big.bin", &old)?;
    let mut nodes = Server::start_cluster(&["a", "b", "c"], &ServerOpts::s3_backend(&proxy.url()))?;
    let all: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&all, Duration::from_secs(20))?;
    for n in &nodes {
        assert!(send(n, "GET", "/data/big.bin").body == old);
    }
    Server::settle(&all);
    let owner = nodes[0].cluster_view(Some(("data", "big.bin")))?["owner"]
        .as_str()
        .unwrap_or("")
        .to_owned();
    let writer = ["a", "b", "c"]
        .iter()
        .position(|id| *id == owner)
        .expect("an owner");
    lost_write(&mut nodes, writer, &proxy, "/data/big.bin", &old, &new)
}
