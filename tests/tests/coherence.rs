//! Objects that change behind the cache, with real processes over moto: a copy is
//! checked against the backend once its last check is older than `--revalidate-after`
//! (per bucket in the TOML), and a forced revalidation of a prefix reaches every member.

use std::time::{Duration, Instant};

use anyhow::Result;
use granary_tests::{
    raw_request_blocking, request_bytes, Moto, Pattern, RawResponse, Server, ServerOpts,
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
