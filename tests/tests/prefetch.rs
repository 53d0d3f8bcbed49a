//! Prefetch jobs through the real binary: `POST /_granary/prefetch` warms a prefix across
//! a 3-node cluster over a real S3 server (moto), each owner reading its own keys; the job
//! reaches 100% (objects and bytes) as seen from any node, and every later read is a hit
//! on its owner with no byte from the backend. A job can be cancelled; bad requests get
//! S3-style errors; with credentials a prefetch must be signed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use granary_tests::{
    encode_key, raw_request_blocking, request_bytes, sha256_hex, unix_now, Moto, Pattern,
    RawResponse, Server, ServerOpts, SignedRequest, ACCESS, SECRET,
};
use serde_json::{json, Value};

const BUCKET: &str = "warmup";

fn send(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> Result<RawResponse> {
    raw_request_blocking(addr, &request_bytes(method, path, addr, &[], body))
}

fn start(node: &Server, body: &Value) -> Result<String> {
    let r = send(
        node.addr(),
        "POST",
        "/_granary/prefetch",
        body.to_string().as_bytes(),
    )?;
    assert_eq!(r.status, 202, "{}", r.text());
    let v: Value = serde_json::from_slice(&r.body)?;
    Ok(v["id"].as_str().context("an id")?.to_owned())
}

fn job(node: &Server, id: &str) -> Result<Value> {
    let r = send(node.addr(), "GET", &format!("/_granary/jobs/{id}"), b"")?;
    assert_eq!(r.status, 200, "{}", r.text());
    Ok(serde_json::from_slice(&r.body)?)
}

/// Polls the job until it leaves `running` (at most 60 s); returns its last state.
fn wait(node: &Server, id: &str) -> Result<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = job(node, id)?;
        if v["state"] != "running" {
            return Ok(v);
        }
        assert!(Instant::now() < deadline, "job still running: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `DELETE /_granary/jobs/{id}`: the job as it answers.
fn cancel(node: &Server, id: &str) -> Result<Value> {
    let r = send(node.addr(), "DELETE", &format!("/_granary/jobs/{id}"), b"")?;
    assert_eq!(r.status, 200, "{}", r.text());
    Ok(serde_json::from_slice(&r.body)?)
}

fn stat(node: &Server, field: &str) -> u64 {
    node.stats().unwrap()[field].as_u64().unwrap()
}

#[test]
fn a_prefetch_warms_every_owner_and_later_reads_are_hits() -> Result<()> {
    let moto = Moto::start()?;
    let objects: Vec<(String, Vec<u8>)> = (0..90u64)
        .map(|i| {
            let size = [1000, 64 << 10, 300 << 10, (1 << 20) + 3][i as usize % 4] + i as usize;
            let key = if i % 9 == 4 {
                format!("train/dir {i}/x+{i:03} ü.bin")
            } else {
                format!("train/{i:03}.bin")
            };
            (key, Pattern::new(7000 + i).bytes(0, size))
        })
        .collect();
    let client = moto.client();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        client.create_bucket().bucket(BUCKET).send().await?;
        for (k, d) in objects
            .iter()
            .chain([&("val/000.bin".to_owned(), vec![1u8; 10])])
        {
            client
                .put_object()
                .bucket(BUCKET)
                .key(k)
                .body(d.clone().into())
                .send()
                .await?;
        }
        anyhow::Ok(())
    })?;
    let opts = ServerOpts::s3_backend(&moto.url()).args(&["--cache-capacity", "1GiB"]);
    let nodes = Server::start_cluster(&["n1", "n2", "n3"], &opts)?;
    Server::wait_cluster_up(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(20))?;

    let id = start(&nodes[0], &json!({"bucket": BUCKET, "prefix": "train/"}))?;
    let done = wait(&nodes[0], &id)?;
    let total_bytes: u64 = objects.iter().map(|(_, d)| d.len() as u64).sum();
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["kind"], "prefetch");
    assert_eq!(done["id"], id.as_str());
    assert_eq!(done["objects_total"], 90);
    assert_eq!(done["objects_done"], 90);
    assert_eq!(done["bytes_total"], total_bytes);
    assert_eq!(done["bytes_done"], total_bytes);
    assert_eq!(done["errors"], 0);
    // The job is found through any node.
    assert_eq!(job(&nodes[2], &id)?["objects_done"], 90);

    // Each owner read its own keys once, and holds them.
    let mut owned: HashMap<String, u64> = HashMap::new();
    for (k, _) in &objects {
        let view = nodes[0].cluster_view(Some((BUCKET, k)))?;
        *owned
            .entry(view["owner"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    for n in &nodes {
        let id = n.stats()?["node_id"].as_str().unwrap().to_owned();
        let mine = owned.get(&id).copied().unwrap_or(0);
        assert!(mine > 0, "{id} owns some of 90 keys");
        assert_eq!(stat(n, "objects"), mine, "{id} holds its share");
        assert_eq!(stat(n, "misses"), mine, "{id} read each of its keys once");
    }
    let backend_before: u64 = nodes.iter().map(|n| stat(n, "bytes_from_backend")).sum();
    assert_eq!(backend_before, total_bytes);

    // Every later read, through any node, is a hit on its owner with the exact bytes.
    for (i, (k, d)) in objects.iter().enumerate() {
        let r = send(
            nodes[i % 3].addr(),
            "GET",
            &format!("/{BUCKET}/{}", encode_key(k)),
            b"",
        )?;
        assert_eq!(r.status, 200, "{k}: {}", r.text());
        assert_eq!(r.header("x-granary-cache"), Some("hit"), "{k}");
        assert!(r.body == *d, "{k}: bytes");
    }
    let backend_after: u64 = nodes.iter().map(|n| stat(n, "bytes_from_backend")).sum();
    assert_eq!(
        backend_after, backend_before,
        "no backend byte after the prefetch"
    );

    // Prefetching again reads nothing: every key is already held.
    let again = start(&nodes[1], &json!({"bucket": BUCKET, "prefix": "train/"}))?;
    let v = wait(&nodes[1], &again)?;
    assert_eq!(v["state"], "done");
    assert_eq!(v["objects_done"], 90);
    let backend_again: u64 = nodes.iter().map(|n| stat(n, "bytes_from_backend")).sum();
    assert_eq!(backend_again, backend_before);
    Ok(())
}

/// 400 objects of 1 MiB in the node's fs backend, `big-0000`…: a prefetch of them runs
/// long enough to be seen running.
fn lay_out_big(server: &Server) -> Result<()> {
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    let chunk = Pattern::new(1).bytes(0, 1 << 20);
    for i in 0..400 {
        std::fs::write(dir.join(format!("big-{i:04}")), &chunk)?;
    }
    Ok(())
}

/// A node coordinates at most 8 prefetches at once: the ninth is `503 SlowDown` (which
/// S3 clients back off and retry), and once the eight are cancelled a new one starts.
#[test]
fn prefetches_past_the_cap_are_told_to_slow_down() -> Result<()> {
    let server = Server::start(ServerOpts::open().args(&["--cache-capacity", "2GiB"]))?;
    lay_out_big(&server)?;
    let ids: Vec<String> = (0..8)
        .map(|_| start(&server, &json!({"bucket": BUCKET})))
        .collect::<Result<_>>()?;
    let ninth = send(
        server.addr(),
        "POST",
        "/_granary/prefetch",
        json!({"bucket": BUCKET}).to_string().as_bytes(),
    )?;
    ninth.assert_s3_error(503, &["SlowDown"]);
    for id in &ids {
        cancel(&server, id)?;
    }
    start(&server, &json!({"bucket": BUCKET}))?;
    Ok(())
}

#[test]
fn jobs_can_be_cancelled_and_bad_requests_are_refused() -> Result<()> {
    let server = Server::start(ServerOpts::open().args(&["--cache-capacity", "2GiB"]))?;
    lay_out_big(&server)?;
    let id = start(&server, &json!({"bucket": BUCKET}))?;
    let v = cancel(&server, &id)?;
    assert_eq!(v["state"], "cancelled");
    // It stops: the count settles below the total and stays there.
    std::thread::sleep(Duration::from_millis(500));
    let a = job(&server, &id)?;
    std::thread::sleep(Duration::from_millis(500));
    let b = job(&server, &id)?;
    assert_eq!(b["state"], "cancelled");
    assert_eq!(a["objects_done"], b["objects_done"]);
    assert!(b["objects_done"].as_u64().unwrap() < 400, "{b}");
    let listed = send(server.addr(), "GET", "/_granary/jobs", b"")?;
    let all: Value = serde_json::from_slice(&listed.body)?;
    assert!(all
        .as_array()
        .unwrap()
        .iter()
        .any(|j| j["id"] == id.as_str()));

    let post = |body: &[u8]| send(server.addr(), "POST", "/_granary/prefetch", body);
    post(b"{\"bucket\":\"no-such-bucket\"}")?.assert_s3_error(404, &["NoSuchBucket"]);
    post(b"not json")?.assert_s3_error(400, &["InvalidArgument"]);
    post(b"{\"prefix\":\"x\"}")?.assert_s3_error(400, &["InvalidArgument"]);
    send(server.addr(), "GET", "/_granary/prefetch", b"")?
        .assert_s3_error(405, &["MethodNotAllowed"]);
    send(server.addr(), "GET", "/_granary/jobs/feedbeef", b"")?.assert_s3_error(404, &["NotFound"]);
    send(server.addr(), "PUT", &format!("/_granary/jobs/{id}"), b"")?
        .assert_s3_error(405, &["MethodNotAllowed"]);
    Ok(())
}

#[test]
fn with_credentials_a_prefetch_must_be_signed() -> Result<()> {
    let server = Server::start(ServerOpts {
        credentials: true,
        anonymous_read: true,
        ..ServerOpts::default()
    })?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("a"), b"bytes")?;
    let body = json!({"bucket": BUCKET}).to_string();
    send(server.addr(), "POST", "/_granary/prefetch", body.as_bytes())?
        .assert_s3_error(403, &["AccessDenied"]);
    let sig = SignedRequest::new(
        "POST",
        "/_granary/prefetch",
        server.addr(),
        &[],
        &sha256_hex(body.as_bytes()),
        ACCESS,
        SECRET,
        unix_now(),
    );
    let headers = sig.header_refs();
    let r = raw_request_blocking(
        server.addr(),
        &request_bytes(
            "POST",
            "/_granary/prefetch",
            server.addr(),
            &headers,
            body.as_bytes(),
        ),
    )?;
    assert_eq!(r.status, 202, "{}", r.text());
    let id: Value = serde_json::from_slice(&r.body)?;
    let id = id["id"].as_str().unwrap();
    // Jobs name prefixes and keys: signed whenever credentials are set, even with
    // --anonymous-read.
    for path in ["/_granary/jobs".to_owned(), format!("/_granary/jobs/{id}")] {
        send(server.addr(), "GET", &path, b"")?.assert_s3_error(403, &["AccessDenied"]);
    }
    let signed_get = |path: &str| -> Result<Value> {
        let r = server.signed_blocking("GET", path)?;
        assert_eq!(r.status, 200, "{}", r.text());
        Ok(serde_json::from_slice(&r.body)?)
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let v = loop {
        let v = signed_get(&format!("/_granary/jobs/{id}"))?;
        if v["state"] != "running" || Instant::now() > deadline {
            break v;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(v["state"], "done");
    assert_eq!(v["objects_done"], 1);
    let all = signed_get("/_granary/jobs")?;
    assert!(
        all.as_array()
            .is_some_and(|a| a.iter().any(|j| j["id"] == id)),
        "{all}"
    );
    Ok(())
}

/// A prefix of 25,000 keys is listed, split and handed out 10,000 keys at a time: the job
/// counts every key once, each owner holds exactly its own, and the members' parts are
/// one per batch.
#[test]
fn a_prefetch_larger_than_a_batch_reads_every_key_once() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let dir = origin.path().join(BUCKET).join("many");
    std::fs::create_dir_all(&dir)?;
    const N: u64 = 25_000;
    for i in 0..N {
        std::fs::write(dir.join(format!("{i:05}")), [i as u8])?;
    }
    let opts = ServerOpts::open().args(&[
        "--cache-capacity",
        "1GiB",
        "--backend",
        &format!("fs:{}", origin.path().display()),
    ]);
    let nodes = Server::start_cluster(&["n1", "n2"], &opts)?;
    Server::wait_cluster_up(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(20))?;
    let id = start(&nodes[0], &json!({"bucket": BUCKET, "prefix": "many/"}))?;
    let deadline = Instant::now() + Duration::from_secs(120);
    let done = loop {
        let v = job(&nodes[0], &id)?;
        if v["state"] != "running" {
            break v;
        }
        assert!(Instant::now() < deadline, "job still running: {v}");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(done["state"], "done", "{done}");
    assert_eq!(done["objects_total"], N);
    assert_eq!(done["objects_done"], N);
    assert_eq!(done["errors"], 0);
    assert_eq!(stat(&nodes[0], "objects") + stat(&nodes[1], "objects"), N);
    let parts = send(nodes[1].addr(), "GET", "/_granary/jobs", b"")?;
    let parts: Value = serde_json::from_slice(&parts.body)?;
    let on_n2 = parts.as_array().map_or(0, |a| {
        a.iter()
            .filter(|j| j["objects_total"].as_u64() > Some(0))
            .count()
    });
    assert_eq!(on_n2, 3, "one part per batch of 10,000: {parts}");
    Ok(())
}
