//! GetBatch (`POST /_granary/batch`) through the real binary: one tar stream of objects and
//! shard members in the order asked, with their exact bytes; a missing item is `404`
//! before the first byte, a cut stream after it, or with `?missing=mark` an empty
//! `__404__/NAME` member; items owned by other members of a cluster are fetched from
//! them (and from the next owner when one is killed); signatures are required where
//! plain reads need them.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Result;
use granary_tests::{
    gzip, raw_request_blocking, request_bytes, sha256_hex, tar_of, unix_now, untar, Pattern,
    RawResponse, Server, ServerOpts, SignedRequest, ACCESS, SECRET,
};
use serde_json::json;

const BUCKET: &str = "batches";

fn post(
    addr: SocketAddr,
    path: &str,
    body: &[u8],
    headers: &[(&str, &str)],
) -> Result<RawResponse> {
    raw_request_blocking(addr, &request_bytes("POST", path, addr, headers, body))
}

fn batch(node: &Server, query: &str, items: &serde_json::Value) -> Result<RawResponse> {
    post(
        node.addr(),
        &format!("/_granary/batch{query}"),
        items.to_string().as_bytes(),
        &[("content-type", "application/json")],
    )
}

fn stat(node: &Server, field: &str) -> u64 {
    node.stats().unwrap()[field].as_u64().unwrap()
}

#[test]
fn items_in_order_with_their_bytes_and_missing_ones_refused_or_marked() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(dir.join("deep/er"))?;
    let mut objects: Vec<(String, Vec<u8>)> = Vec::new();
    for (i, size) in [0usize, 1, 511, 512, 700, 100_000, (1 << 20) + 1, 3 << 20]
        .into_iter()
        .enumerate()
    {
        let key = format!("obj-{i}.bin");
        let data = Pattern::new(i as u64).bytes(0, size);
        std::fs::write(dir.join(&key), &data)?;
        objects.push((key, data));
    }
    let long = format!("deep/er/{}.bin", "k".repeat(120));
    std::fs::write(dir.join(&long), b"a key past 100 bytes")?;
    objects.push((long, b"a key past 100 bytes".to_vec()));
    let members: Vec<(String, Vec<u8>)> = (0..6u64)
        .map(|i| {
            (
                format!("{i:06}.jpg"),
                Pattern::new(100 + i).bytes(0, 3000 * i as usize + 1),
            )
        })
        .collect();
    let shard = tar_of(&members);
    std::fs::write(dir.join("shard-0.tar"), &shard)?;
    std::fs::write(dir.join("shard-1.tgz"), gzip(&shard))?;

    // Objects and members interleaved, one asked twice, in an order of our choosing.
    let mut items = Vec::new();
    let mut want: Vec<(String, Vec<u8>)> = Vec::new();
    for round in 0..2 {
        for (i, (key, data)) in objects.iter().enumerate().rev() {
            items.push(json!({"bucket": BUCKET, "key": key}));
            want.push((key.clone(), data.clone()));
            let (m, mdata) = &members[(i + round) % members.len()];
            let shard_key = if i % 2 == 0 {
                "shard-0.tar"
            } else {
                "shard-1.tgz"
            };
            items.push(json!({"bucket": BUCKET, "key": shard_key, "archpath": m}));
            want.push((format!("{shard_key}/{m}"), mdata.clone()));
        }
    }
    let r = batch(&server, "", &json!(items))?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), Some("application/x-tar"));
    let got = untar(&r.body);
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(&want) {
        assert_eq!(g.0, w.0, "member order");
        assert!(g.1 == w.1, "{}: bytes", w.0);
    }
    // The second time every item is a hit.
    let hits = stat(&server, "hits");
    let r = batch(&server, "", &json!(items))?;
    assert_eq!(untar(&r.body), want);
    assert!(stat(&server, "hits") >= hits + items.len() as u64);

    // A missing first item: 404 before any byte.
    let gone = json!([{"bucket": BUCKET, "key": "nope"}, items[0]]);
    let r = batch(&server, "", &gone)?;
    r.assert_s3_error(404, &["NoSuchKey"]);
    let r = batch(
        &server,
        "?missing=error",
        &json!([{"bucket": "no-such-bucket", "key": "k"}]),
    )?;
    r.assert_s3_error(404, &["NoSuchKey"]);
    // After the first byte: the stream is cut, never a complete-looking archive.
    let later = json!([items[0], items[1], {"bucket": BUCKET, "key": "nope"}, items[2]]);
    assert!(
        batch(&server, "", &later).is_err(),
        "a batch with a missing item must not end as a complete answer"
    );
    // Marked: an empty member in its place, the rest intact.
    let r = batch(&server, "?missing=mark", &later)?;
    assert_eq!(r.status, 200);
    let got = untar(&r.body);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            want[0].0.as_str(),
            want[1].0.as_str(),
            "__404__/nope",
            want[2].0.as_str()
        ]
    );
    assert!(got[2].1.is_empty());
    assert!(got[3].1 == want[2].1);
    let r = batch(
        &server,
        "?missing=mark",
        &json!([{"bucket": BUCKET, "key": "shard-0.tar", "archpath": "absent.jpg"}]),
    )?;
    assert_eq!(untar(&r.body)[0].0, "__404__/shard-0.tar/absent.jpg");

    // An empty batch is an empty archive (two zero blocks).
    let r = batch(&server, "", &json!([]))?;
    assert_eq!(r.status, 200);
    assert!(r.body.len() == 1024 && r.body.iter().all(|&b| b == 0));

    // Bad requests.
    let r = post(server.addr(), "/_granary/batch", b"{not json", &[])?;
    r.assert_s3_error(400, &["InvalidArgument"]);
    let r = batch(&server, "", &json!([{"bucket": BUCKET}]))?;
    r.assert_s3_error(400, &["InvalidArgument"]);
    let r = batch(
        &server,
        "",
        &json!([{"bucket": BUCKET, "key": "k", "extra": 1}]),
    )?;
    r.assert_s3_error(400, &["InvalidArgument"]);
    let r = batch(&server, "?missing=maybe", &json!([]))?;
    r.assert_s3_error(400, &["InvalidArgument"]);
    let r = batch(
        &server,
        "",
        &json!([{"bucket": BUCKET, "key": "obj-1.bin", "archpath": "x"}]),
    )?;
    r.assert_s3_error(400, &["InvalidArgument"]);
    let get = raw_request_blocking(
        server.addr(),
        &request_bytes("GET", "/_granary/batch", server.addr(), &[], b""),
    )?;
    get.assert_s3_error(405, &["MethodNotAllowed"]);
    assert!(server.stats().is_ok(), "the node serves after bad batches");
    Ok(())
}

#[test]
fn items_come_from_their_owners_and_from_the_next_when_one_is_killed() -> Result<()> {
    let origin = tempfile::tempdir()?;
    let dir = origin.path().join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    let objects: Vec<(String, Vec<u8>)> = (0..60u64)
        .map(|i| {
            let size = if i % 20 == 0 {
                2 << 20
            } else {
                1000 + 37 * i as usize
            };
            (format!("part/{i:03}.bin"), Pattern::new(i).bytes(0, size))
        })
        .collect();
    for (k, d) in &objects {
        std::fs::create_dir_all(dir.join(k).parent().unwrap())?;
        std::fs::write(dir.join(k), d)?;
    }
    let backend = format!("fs:{}", origin.path().display());
    let opts = ServerOpts::open().args(&["--backend", &backend, "--cache-capacity", "1GiB"]);
    let mut nodes = Server::start_cluster(&["n1", "n2", "n3"], &opts)?;
    Server::wait_cluster_up(&nodes.iter().collect::<Vec<_>>(), Duration::from_secs(20))?;
    let items: Vec<_> = objects
        .iter()
        .map(|(k, _)| json!({"bucket": BUCKET, "key": k}))
        .collect();

    let r = batch(&nodes[0], "", &json!(items))?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(untar(&r.body), objects);
    // Each item was read once from the backend, by its owner, which keeps it.
    let mut owned = std::collections::HashMap::new();
    for (k, _) in &objects {
        let view = nodes[0].cluster_view(Some((BUCKET, k)))?;
        *owned
            .entry(view["owner"].as_str().unwrap().to_owned())
            .or_insert(0u64) += 1;
    }
    for n in &nodes {
        let id = n.stats()?["node_id"].as_str().unwrap().to_owned();
        let mine = owned.get(&id).copied().unwrap_or(0);
        assert!(mine > 0, "every node owns some of 60 keys");
        assert_eq!(stat(n, "misses"), mine, "{id}: one fill per owned key");
    }

    // A member killed: its items come from the next owner; the answer is whole.
    nodes[2].kill()?;
    let r = batch(&nodes[0], "", &json!(items))?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(untar(&r.body), objects);
    let r = batch(&nodes[1], "?missing=mark", &json!(items))?;
    assert_eq!(untar(&r.body), objects);
    Ok(())
}

fn signed_post(node: &Server, path: &str, body: &[u8]) -> Result<RawResponse> {
    let sha = sha256_hex(body);
    let sig = SignedRequest::new(
        "POST",
        path,
        node.addr(),
        &[],
        &sha,
        ACCESS,
        SECRET,
        unix_now(),
    );
    let headers = sig.header_refs();
    post(node.addr(), path, body, &headers)
}

#[test]
fn batches_need_a_signature_where_reads_do() -> Result<()> {
    let items = json!([{"bucket": BUCKET, "key": "a.bin"}]).to_string();
    for anonymous_read in [false, true] {
        let server = Server::start(ServerOpts {
            credentials: true,
            anonymous_read,
            ..ServerOpts::default()
        })?;
        let dir = server.data_dir().join("origin").join(BUCKET);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("a.bin"), b"signed bytes")?;
        let r = post(server.addr(), "/_granary/batch", items.as_bytes(), &[])?;
        if anonymous_read {
            assert_eq!(r.status, 200, "{}", r.text());
            assert_eq!(
                untar(&r.body),
                [("a.bin".to_owned(), b"signed bytes".to_vec())]
            );
        } else {
            r.assert_s3_error(403, &["AccessDenied"]);
        }
        let r = signed_post(&server, "/_granary/batch", items.as_bytes())?;
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(
            untar(&r.body),
            [("a.bin".to_owned(), b"signed bytes".to_vec())]
        );
        // A body that is not the one signed is refused.
        let sha = sha256_hex(items.as_bytes());
        let sig = SignedRequest::new(
            "POST",
            "/_granary/batch",
            server.addr(),
            &[],
            &sha,
            ACCESS,
            SECRET,
            unix_now(),
        );
        let headers = sig.header_refs();
        let other = json!([{"bucket": BUCKET, "key": "b.bin"}]).to_string();
        let r = post(server.addr(), "/_granary/batch", other.as_bytes(), &headers)?;
        assert_eq!(r.status, 400, "{}", r.text());
    }
    Ok(())
}
