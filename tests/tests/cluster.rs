//! Several granary nodes as one cluster, through the real binary: keys placed on one
//! owner each and reachable through any node, a node killed under reads and the reads
//! carrying on, a node back with an empty disk filling from its peers, `307` redirects,
//! and signed writes through any node reaching the owner (never a stale read after).
//!
//! Every node of a cluster gets the same `--peer` list, so the ports are chosen before
//! any node starts ([`Server::start_cluster`]); every test waits until each node sees all
//! members up before it reads.
//! A member the others saw down (so they did not tell it of writes) but that never saw
//! itself cut off (a paused process) must not serve its old copies once back, and a read
//! forwarded to an owner that hangs must carry on past it.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use granary_tests::{
    encode_key, expect_sdk_error, md5_hex, multipart_etag, raw_request_blocking,
    raw_request_with_timeout, request_bytes, sha256_hex, unix_now, Moto, Pattern, RawResponse,
    Server, ServerOpts, SignedRequest, ACCESS, SECRET,
};

const BUCKET: &str = "dataset";
const IDS: [&str; 3] = ["n1", "n2", "n3"];
/// How long a started cluster may take until every node sees every member up.
const UP_TIMEOUT: Duration = Duration::from_secs(20);

/// One object of a test data set.
struct Obj {
    key: String,
    data: Vec<u8>,
}

/// `n` objects of 1 KiB to 3 MiB (most small, a few large), deterministic bytes.
fn dataset(n: usize) -> Vec<Obj> {
    const SIZES: [usize; 10] = [
        1 << 10,
        3 << 10,
        10 << 10,
        33 << 10,
        64 << 10,
        100 << 10,
        256 << 10,
        700 << 10,
        1 << 20,
        3 << 20,
    ];
    (0..n)
        .map(|i| {
            // Not a multiple of anything: the last block of each object is partial.
            let size = SIZES[i % SIZES.len()] + 7 * i;
            // Some keys need encoding in a URL: spaces, `+`, non-ASCII, a folder.
            let key = if i % 10 == 4 {
                format!("dir {i}/shard+{i:03} ü.bin")
            } else {
                format!("shard-{i:03}.bin")
            };
            Obj {
                key,
                data: Pattern::new(4000 + i as u64).bytes(0, size),
            }
        })
        .collect()
}

/// Creates `BUCKET` in moto and puts `objects` there directly.
fn put_into_moto(moto: &Moto, objects: &[Obj]) -> Result<()> {
    let client = moto.client();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        client.create_bucket().bucket(BUCKET).send().await?;
        for o in objects {
            client
                .put_object()
                .bucket(BUCKET)
                .key(&o.key)
                .body(o.data.clone().into())
                .send()
                .await?;
        }
        anyhow::Ok(())
    })
}

/// A cluster of `IDS` over moto, each node caching up to 1 GiB, all members up.
fn moto_cluster(moto: &Moto) -> Result<Vec<Server>> {
    let opts = ServerOpts::s3_backend(&moto.url()).args(&["--cache-capacity", "1GiB"]);
    let nodes = Server::start_cluster(&IDS, &opts)?;
    Server::wait_cluster_up(&nodes.iter().collect::<Vec<_>>(), UP_TIMEOUT)?;
    Ok(nodes)
}

/// A cluster of `IDS` whose backend is the one directory `origin` (`--backend fs:DIR`).
fn fs_cluster(origin: &std::path::Path, opts: ServerOpts) -> Result<Vec<Server>> {
    let backend = format!("fs:{}", origin.display());
    let opts = opts.args(&["--backend", &backend, "--cache-capacity", "1GiB"]);
    let nodes = Server::start_cluster(&IDS, &opts)?;
    Server::wait_cluster_up(&nodes.iter().collect::<Vec<_>>(), UP_TIMEOUT)?;
    Ok(nodes)
}

/// `/BUCKET/key`, the key percent-encoded as S3 clients do (`/` kept).
fn obj_path(key: &str) -> String {
    format!("/{BUCKET}/{}", encode_key(key))
}

/// Writes `objects` into `origin/BUCKET/` (the fs backend's layout).
fn lay_out_fs(origin: &std::path::Path, objects: &[Obj]) -> Result<()> {
    for o in objects {
        let path = origin.join(BUCKET).join(&o.key);
        std::fs::create_dir_all(path.parent().context("a parent")?)?;
        std::fs::write(path, &o.data)?;
    }
    Ok(())
}

/// An unsigned request to `addr` for `path`, bounded by the harness's 30 s socket timeout.
fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
) -> Result<RawResponse> {
    raw_request_blocking(addr, &request_bytes(method, path, addr, headers, b""))
}

/// Unsigned `GET /BUCKET/key` through `node`.
fn get(node: &Server, key: &str) -> Result<RawResponse> {
    send(node.addr(), "GET", &obj_path(key), &[])
}

/// A SigV4-signed request without a body (test credentials, `extra` headers signed too)
/// through `node`.
fn signed_with(
    node: &Server,
    method: &str,
    path: &str,
    extra: &[(&str, &str)],
) -> Result<RawResponse> {
    let empty = sha256_hex(b"");
    let sig = SignedRequest::new(
        method,
        path,
        node.addr(),
        extra,
        &empty,
        ACCESS,
        SECRET,
        unix_now(),
    );
    let mut headers = extra.to_vec();
    headers.extend(sig.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    send(node.addr(), method, path, &headers)
}

/// A signed request without a body through `node`.
fn signed(node: &Server, method: &str, path: &str) -> Result<RawResponse> {
    signed_with(node, method, path, &[])
}

fn header(resp: &RawResponse, name: &str) -> String {
    resp.header(name).unwrap_or_default().to_owned()
}

fn stat(node: &Server, field: &str) -> u64 {
    node.stat(field)
}

fn sum_stat(nodes: &[&Server], field: &str) -> u64 {
    nodes.iter().map(|n| stat(n, field)).sum()
}

fn settle(nodes: &[&Server]) {
    Server::settle(nodes)
}

/// The owner of `key` as every node names it; panics unless they agree.
fn owner(nodes: &[&Server], key: &str) -> String {
    let names: Vec<String> = nodes
        .iter()
        .map(|n| {
            let view = n.cluster_view(Some((BUCKET, key))).expect("cluster view");
            view["owner"].as_str().expect("owner in view").to_owned()
        })
        .collect();
    assert!(
        names.iter().all(|o| *o == names[0]),
        "nodes disagree on the owner of {key}: {names:?}"
    );
    names[0].clone()
}

fn member_state(node: &Server, id: &str) -> Option<String> {
    node.member_state(id)
}

/// GETs `o` through `node`: panics unless `200` with exactly its bytes; returns the
/// response for its headers.
fn get_exact(node: &Server, o: &Obj) -> RawResponse {
    let resp =
        get(node, &o.key).unwrap_or_else(|e| panic!("GET {} via {}: {e:#}", o.key, node.addr()));
    assert_eq!(
        resp.status,
        200,
        "GET {} via {}: {}",
        o.key,
        node.addr(),
        resp.text()
    );
    assert_eq!(resp.body.len(), o.data.len(), "length of {}", o.key);
    assert!(
        resp.body == o.data,
        "bytes of {} via {}",
        o.key,
        node.addr()
    );
    resp
}

/// Keys spread over the owners of a cluster: placement over 60 keys and 3 equal members,
/// every key read through every node with the same bytes and the same serving owner,
/// and each object cached once, on its owner, after one backend read.
#[test]
fn three_nodes_over_moto() -> Result<()> {
    const N: usize = 60;
    let moto = Moto::start()?;
    let objects = dataset(N);
    put_into_moto(&moto, &objects)?;
    let total: u64 = objects.iter().map(|o| o.data.len() as u64).sum();
    let nodes = moto_cluster(&moto)?;
    let all: Vec<&Server> = nodes.iter().collect();

    // The view: three members up, equal weights, the route mode.
    let view = nodes[0].cluster_view(None)?;
    assert_eq!(view["node_id"], "n1");
    assert_eq!(view["route"], "proxy");
    let members = view["members"].as_array().context("members")?;
    assert_eq!(members.len(), 3);
    for (m, (id, node)) in members.iter().zip(IDS.iter().zip(&nodes)) {
        assert_eq!(m["id"], *id);
        assert_eq!(m["url"], node.url());
        assert_eq!(m["weight"], 1u64 << 30);
    }

    // Every node names the same owner for every key; each member owns a share.
    let owners: HashMap<&str, String> = objects
        .iter()
        .map(|o| (o.key.as_str(), owner(&all, &o.key)))
        .collect();
    let mut owned: BTreeMap<&str, (u64, u64)> = IDS.iter().map(|id| (*id, (0, 0))).collect();
    for o in &objects {
        let e = owned.get_mut(owners[o.key.as_str()].as_str()).unwrap();
        e.0 += 1;
        e.1 += o.data.len() as u64;
    }
    println!("keys (count, bytes) per owner: {owned:?}");
    for (id, (count, _)) in &owned {
        assert!(*count >= 5, "{id} owns a share of 60 keys: {owned:?}");
    }

    // Every key through every node: exact bytes, served by the owner; the first pass
    // fills (each object once, on its owner), the later passes hit.
    for (pass, node) in nodes.iter().enumerate() {
        let mut sources: BTreeMap<String, usize> = BTreeMap::new();
        for o in &objects {
            let resp = get_exact(node, o);
            assert_eq!(
                header(&resp, "x-granary-node"),
                owners[o.key.as_str()],
                "{} via {}",
                o.key,
                IDS[pass]
            );
            *sources.entry(header(&resp, "x-granary-cache")).or_default() += 1;
        }
        println!("pass {} via {}: {sources:?}", pass + 1, IDS[pass]);
        let want = if pass == 0 { "miss" } else { "hit" };
        assert_eq!(
            sources.get(want),
            Some(&N),
            "pass {}: {sources:?}",
            pass + 1
        );
        settle(&all);
    }

    // HEAD through a non-owner answers for the owner too.
    let o = &objects[9];
    let via = IDS
        .iter()
        .position(|id| *id != owners[o.key.as_str()])
        .unwrap();
    let head = send(nodes[via].addr(), "HEAD", &obj_path(&o.key), &[])?;
    assert_eq!(head.status, 200);
    assert_eq!(header(&head, "content-length"), o.data.len().to_string());
    assert_eq!(header(&head, "etag"), format!("\"{}\"", md5_hex(&o.data)));
    assert_eq!(header(&head, "x-granary-node"), owners[o.key.as_str()]);

    // Each object is cached once, on its owner, and the backend was read once per object.
    for (node, id) in nodes.iter().zip(IDS) {
        let (count, bytes) = owned[id];
        let s = node.stats()?;
        println!("{id}: {s}");
        assert_eq!(s["objects"], count, "{id} caches what it owns");
        assert_eq!(s["used_bytes"], bytes, "{id} used bytes");
        assert_eq!(s["misses"], count, "{id} filled each of its objects once");
        assert_eq!(
            s["hits"],
            2 * count,
            "{id} served the later passes from cache"
        );
        assert_eq!(s["bytes_from_backend"], bytes, "{id} read its objects once");
        assert_eq!(s["peer_fills"], 0);
        assert_eq!(s["bytes_from_peers"], 0);
        // Its own pass forwarded every key it does not own.
        assert!(
            s["proxied"].as_u64().unwrap() >= N as u64 - count,
            "{id} proxied the keys it does not own"
        );
    }
    assert_eq!(sum_stat(&all, "objects"), N as u64);
    assert_eq!(sum_stat(&all, "bytes_from_backend"), total);
    Ok(())
}

/// kill -9 of one node while a reader loops over the keys through the two others: the
/// survivors see it down within 5 s and then serve every key; back with an empty disk,
/// it fills the keys it owns from the survivors that held them meanwhile.
#[test]
fn kill_a_node_under_reads_then_restart_it_empty() -> Result<()> {
    const N: usize = 40;
    let moto = Moto::start()?;
    let objects = dataset(N);
    put_into_moto(&moto, &objects)?;
    let mut nodes = moto_cluster(&moto)?;
    let owners: HashMap<String, String> = {
        let all: Vec<&Server> = nodes.iter().collect();
        objects
            .iter()
            .map(|o| (o.key.clone(), owner(&all, &o.key)))
            .collect()
    };
    let victim_id = IDS[2];
    let victims: Vec<&Obj> = objects
        .iter()
        .filter(|o| owners[&o.key] == victim_id)
        .collect();
    let victim_bytes: u64 = victims.iter().map(|o| o.data.len() as u64).sum();
    println!("{victim_id} owns {} of {N} keys", victims.len());
    assert!(!victims.is_empty());
    // Warm every owner's cache.
    for o in &objects {
        get_exact(&nodes[0], o);
    }
    settle(&nodes.iter().collect::<Vec<_>>());

    let (survivors, victim) = nodes.split_at_mut(2);
    let survivors: &[Server] = survivors;
    let victim = &mut victim[0];
    let stop = AtomicBool::new(false);
    let reads = AtomicUsize::new(0);
    let (ok, failed, detected) = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let (mut ok, mut failed) = (0usize, Vec::new());
            let mut i = 0usize;
            while !stop.load(Ordering::Acquire) {
                let o = &objects[i % N];
                let node = &survivors[i % 2];
                i += 1;
                match get(node, &o.key) {
                    Ok(r) if r.status == 200 => {
                        // An answer that came whole is the object, always.
                        assert!(
                            r.body == o.data,
                            "wrong bytes for {} during the kill",
                            o.key
                        );
                        ok += 1;
                    }
                    Ok(r) => failed.push(format!("{}: {} {}", o.key, r.status, r.text())),
                    Err(e) => failed.push(format!("{}: {e:#}", o.key)),
                }
                reads.fetch_add(1, Ordering::Release);
            }
            (ok, failed)
        });
        // Kill once the reader is well under way.
        let deadline = Instant::now() + Duration::from_secs(30);
        while reads.load(Ordering::Acquire) < N / 2 {
            assert!(Instant::now() < deadline, "the reader made no progress");
            std::thread::sleep(Duration::from_millis(5));
        }
        victim.kill().expect("kill -9");
        let killed = Instant::now();
        let mut detected = None;
        while killed.elapsed() < Duration::from_secs(10) {
            if survivors
                .iter()
                .all(|n| member_state(n, victim_id).as_deref() == Some("down"))
            {
                detected = Some(killed.elapsed());
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Some more reads with the victim known down, then stop the reader.
        let at = reads.load(Ordering::Acquire);
        while reads.load(Ordering::Acquire) < at + N && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        stop.store(true, Ordering::Release);
        let (ok, failed) = reader.join().expect("reader");
        (ok, failed, detected)
    });
    println!(
        "reads during the kill: {ok} whole, {} failed {failed:?}; down seen after {detected:?}",
        failed.len()
    );
    let detected = detected.context("the survivors never marked the killed node down")?;
    assert!(
        detected <= Duration::from_secs(5),
        "the killed node was seen down after {detected:?}"
    );

    // With the victim down: every key through both survivors, none failing, exact bytes;
    // the victim's keys have a new owner, the same on both.
    let survivor_refs: Vec<&Server> = survivors.iter().collect();
    for o in &objects {
        let new_owner = owner(&survivor_refs, &o.key);
        assert_ne!(new_owner, victim_id);
        if owners[&o.key] != victim_id {
            assert_eq!(
                new_owner, owners[&o.key],
                "{}: only the victim's keys move",
                o.key
            );
        }
        for node in survivors.iter() {
            let resp = get_exact(node, o);
            assert_eq!(header(&resp, "x-granary-node"), new_owner, "{}", o.key);
        }
    }
    settle(&survivor_refs);
    let serves_before = sum_stat(&survivor_refs, "peer_serves");
    let sent_before = sum_stat(&survivor_refs, "bytes_to_peers");

    // Back with an empty disk, same port and id.
    victim.restart(true)?;
    Server::wait_cluster_up(&nodes.iter().collect::<Vec<_>>(), UP_TIMEOUT)?;
    let all: Vec<&Server> = nodes.iter().collect();
    let mut sources: BTreeMap<String, usize> = BTreeMap::new();
    for (i, o) in objects.iter().enumerate() {
        let resp = get_exact(all[i % 2], o);
        let source = header(&resp, "x-granary-cache");
        assert_eq!(
            header(&resp, "x-granary-node"),
            owners[&o.key],
            "{}: owner again",
            o.key
        );
        if owners[&o.key] == victim_id {
            assert_eq!(
                source, "peer",
                "{}: filled from the survivor that held it",
                o.key
            );
        } else {
            assert_eq!(source, "hit", "{}", o.key);
        }
        *sources.entry(source).or_default() += 1;
    }
    println!("after the empty restart: {sources:?}");
    settle(&all);
    let victim = &nodes[2];
    let s = victim.stats()?;
    println!("{victim_id} after the restart: {s}");
    assert_eq!(s["peer_fills"], victims.len());
    assert_eq!(s["bytes_from_peers"], victim_bytes);
    assert_eq!(s["bytes_from_backend"], 0, "nothing came from the backend");
    assert_eq!(s["objects"], victims.len());
    let survivor_refs: Vec<&Server> = nodes[..2].iter().collect();
    assert_eq!(
        sum_stat(&survivor_refs, "peer_serves") - serves_before,
        victims.len() as u64
    );
    assert_eq!(
        sum_stat(&survivor_refs, "bytes_to_peers") - sent_before,
        victim_bytes
    );
    // And now the victim's keys hit on it.
    for o in &victims {
        let resp = get_exact(&nodes[0], o);
        assert_eq!(header(&resp, "x-granary-cache"), "hit");
        assert_eq!(header(&resp, "x-granary-node"), victim_id);
    }
    Ok(())
}

/// `--route redirect`: an unsigned GET or HEAD for another node's key is answered `307`
/// to the owner, path and query kept; the owner serves it; writes are still proxied.
#[test]
fn redirect_mode() -> Result<()> {
    let origin = tempfile::Builder::new()
        .prefix("granary-origin-")
        .tempdir()?;
    let objects = dataset(9); // nothing over 1 MiB needed here
    lay_out_fs(origin.path(), &objects)?;
    let nodes = fs_cluster(
        origin.path(),
        ServerOpts::open().args(&["--route", "redirect"]),
    )?;
    let all: Vec<&Server> = nodes.iter().collect();
    assert_eq!(nodes[1].cluster_view(None)?["route"], "redirect");
    let by_id: HashMap<&str, &Server> = IDS.iter().copied().zip(nodes.iter()).collect();

    let mut redirects: HashMap<&str, u64> = HashMap::new();
    for o in &objects {
        let owner_id = owner(&all, &o.key);
        let owner = by_id[owner_id.as_str()];
        let path = obj_path(&o.key);
        for (node, id) in nodes.iter().zip(IDS) {
            let resp = send(node.addr(), "GET", &path, &[])?;
            if id == owner_id {
                assert_eq!(resp.status, 200, "GET {} on its owner", o.key);
                assert!(resp.body == o.data);
                assert_eq!(header(&resp, "x-granary-node"), owner_id);
                continue;
            }
            assert_eq!(resp.status, 307, "GET {} via {id}: {}", o.key, resp.text());
            assert_eq!(header(&resp, "location"), format!("{}{path}", owner.url()));
            assert_eq!(header(&resp, "x-granary-node"), owner_id);
            *redirects.entry(id).or_default() += 1;
            // Following it: the owner's answer, exact bytes.
            let follow = send(owner.addr(), "GET", &path, &[])?;
            assert_eq!(follow.status, 200);
            assert!(
                follow.body == o.data,
                "bytes of {} after the redirect",
                o.key
            );
            assert_eq!(header(&follow, "x-granary-node"), owner_id);

            // HEAD is redirected the same way; so is a ranged GET with a query, kept whole.
            let head = send(node.addr(), "HEAD", &path, &[])?;
            assert_eq!(head.status, 307);
            assert_eq!(header(&head, "location"), format!("{}{path}", owner.url()));
            *redirects.entry(id).or_default() += 1;
            let query = format!("{path}?response-content-type=text%2Fplain");
            let ranged = send(node.addr(), "GET", &query, &[("range", "bytes=10-19")])?;
            assert_eq!(ranged.status, 307);
            assert_eq!(
                header(&ranged, "location"),
                format!("{}{query}", owner.url())
            );
            *redirects.entry(id).or_default() += 1;
            let follow = send(owner.addr(), "GET", &query, &[("range", "bytes=10-19")])?;
            assert_eq!(follow.status, 206);
            assert_eq!(follow.body, &o.data[10..20]);
            assert_eq!(header(&follow, "content-type"), "text/plain");
        }
    }
    for (node, id) in nodes.iter().zip(IDS) {
        assert_eq!(
            stat(node, "redirects"),
            redirects.get(id).copied().unwrap_or(0),
            "{id} counts its redirects"
        );
    }

    // A write through a non-owner is proxied, not redirected (its body would be lost).
    let o = &objects[3];
    let owner_id = owner(&all, &o.key);
    let via = IDS.iter().position(|id| *id != owner_id).unwrap();
    let new = Pattern::new(4242).bytes(0, 20_000);
    let path = obj_path(&o.key);
    let addr = nodes[via].addr();
    let put = raw_request_blocking(addr, &request_bytes("PUT", &path, addr, &[], &new))?;
    assert_eq!(put.status, 200, "PUT via {}: {}", IDS[via], put.text());
    assert_eq!(header(&put, "etag"), format!("\"{}\"", md5_hex(&new)));
    let owner = by_id[owner_id.as_str()];
    let resp = send(owner.addr(), "GET", &path, &[])?;
    assert_eq!(resp.status, 200);
    assert!(resp.body == new, "the owner serves the new bytes");
    assert_eq!(std::fs::read(origin.path().join(BUCKET).join(&o.key))?, new);
    // A signed GET (header or query signature) is proxied, not redirected: its signature
    // names the host it was sent to. An open node does not check it.
    let proxied_before = stat(&nodes[via], "proxied");
    let auth = "AWS4-HMAC-SHA256 Credential=x/20240101/us-east-1/s3/aws4_request, \
                SignedHeaders=host, Signature=00";
    let presigned = format!("{path}?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=00");
    for (target, headers) in [
        (path.as_str(), vec![("authorization", auth)]),
        (presigned.as_str(), vec![]),
    ] {
        let resp = send(addr, "GET", target, &headers)?;
        assert_eq!(resp.status, 200, "signed GET {target}: {}", resp.text());
        assert!(resp.body == new);
        assert_eq!(header(&resp, "x-granary-node"), owner_id);
    }
    assert_eq!(stat(&nodes[via], "proxied"), proxied_before + 2);
    Ok(())
}

/// Credentials on every node: an SDK client of any node writes, overwrites, uploads in
/// parts and deletes keys owned by other nodes; every read after a write, through any
/// node, has the new bytes; a deleted key is gone everywhere. Unsigned and forged peer
/// requests are refused.
#[test]
fn writes_go_to_the_owner_and_signed_clients_work_through_any_node() -> Result<()> {
    let origin = tempfile::Builder::new()
        .prefix("granary-origin-")
        .tempdir()?;
    let nodes = fs_cluster(origin.path(), ServerOpts::with_credentials())?;
    let all: Vec<&Server> = nodes.iter().collect();
    let (a, b, c) = (&nodes[0], &nodes[1], &nodes[2]);
    let clients: Vec<aws_sdk_s3::Client> = nodes.iter().map(Server::s3_client).collect();
    let rt = tokio::runtime::Runtime::new()?;

    // Keys by owner: two owned by n2, two by n3, one by n1.
    let mut by_owner: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for i in 0..200 {
        let key = format!("obj/{i:03}");
        let o = owner(&all, &key);
        let list = by_owner.entry(o).or_default();
        if list.len() < 2 {
            list.push(key);
        }
        if by_owner.len() == 3 && by_owner.values().all(|l| l.len() == 2) {
            break;
        }
    }
    let keys = [
        by_owner["n2"][0].clone(),
        by_owner["n2"][1].clone(),
        by_owner["n3"][0].clone(),
        by_owner["n3"][1].clone(),
        by_owner["n1"][0].clone(),
    ];
    // Version `v` of a key's bytes: distinct per key and version, sizes differing too.
    let content = |key: &str, version: u64| {
        let seed = (version << 32) | u64::from(crc32fast::hash(key.as_bytes()));
        Pattern::new(seed).bytes(0, 100_000 + version as usize * 13)
    };

    rt.block_on(async {
        clients[0].create_bucket().bucket(BUCKET).send().await?;
        for key in &keys {
            let data = content(key, 1);
            let put = clients[0]
                .put_object()
                .bucket(BUCKET)
                .key(key)
                .body(data.clone().into())
                .send()
                .await?;
            assert_eq!(
                put.e_tag(),
                Some(format!("\"{}\"", md5_hex(&data)).as_str())
            );
            // Written through to the shared backend.
            assert_eq!(std::fs::read(origin.path().join(BUCKET).join(key))?, data);
        }
        // Read back through n3 and n1 (SDK) and signed raw GETs for the serving node.
        for key in &keys {
            let want = content(key, 1);
            for client in [&clients[2], &clients[0]] {
                let got = client.get_object().bucket(BUCKET).key(key).send().await?;
                let body = got.body.collect().await?.into_bytes();
                assert!(body.as_ref() == want.as_slice(), "bytes of {key}");
            }
        }
        anyhow::Ok(())
    })?;
    for key in &keys {
        let o = owner(&all, key);
        for node in &nodes {
            let resp = signed(node, "GET", &format!("/{BUCKET}/{key}"))?;
            assert_eq!(resp.status, 200, "{}", resp.text());
            assert!(resp.body == content(key, 1));
            assert_eq!(header(&resp, "x-granary-node"), o);
        }
    }
    settle(&all);

    // Overwrites through a non-owner and through the owner, read at once through every
    // node, several rounds: only the newest bytes, ever.
    let writers = [
        (1usize, &keys[2]),
        (1, &keys[0]),
        (2, &keys[4]),
        (0, &keys[3]),
    ];
    for version in 2..6u64 {
        for (w, key) in writers {
            let data = content(key, version);
            rt.block_on(async {
                clients[w]
                    .put_object()
                    .bucket(BUCKET)
                    .key(key)
                    .body(data.clone().into())
                    .send()
                    .await
            })?;
            for (node, id) in nodes.iter().zip(IDS) {
                let resp = signed(node, "GET", &format!("/{BUCKET}/{key}"))?;
                assert_eq!(resp.status, 200);
                assert!(
                    resp.body == data,
                    "{key} v{version} written via {} read via {id}: {} bytes, v{:?}",
                    IDS[w],
                    resp.body.len(),
                    (1..=version).find(|v| resp.body == content(key, *v))
                );
            }
        }
    }
    // Ranges and conditions through a node that is not the owner are answered by it.
    let key = &keys[2]; // owned by n3, at version 5
    let data = content(key, 5);
    let etag = format!("\"{}\"", md5_hex(&data));
    let path = format!("/{BUCKET}/{key}");
    let resp = signed_with(a, "GET", &path, &[("range", "bytes=1000-1999")])?;
    assert_eq!(resp.status, 206);
    assert_eq!(resp.body, &data[1000..2000]);
    assert_eq!(header(&resp, "x-granary-node"), "n3");
    let resp = signed_with(a, "GET", &path, &[("if-none-match", &etag)])?;
    assert_eq!(resp.status, 304);
    assert!(resp.body.is_empty());
    let resp = signed_with(
        b,
        "GET",
        &path,
        &[("if-match", "\"0123456789abcdef0123456789abcdef\"")],
    )?;
    resp.assert_s3_error(412, &["PreconditionFailed"]);
    let resp = signed(a, "HEAD", &path)?;
    assert_eq!(resp.status, 200);
    assert_eq!(header(&resp, "etag"), etag);
    assert_eq!(header(&resp, "content-length"), data.len().to_string());

    // CopyObject through n1 onto a key n2 owns (already cached there), from a key of n3.
    let (src, dst) = (&keys[2], &keys[1]);
    rt.block_on(
        clients[0]
            .copy_object()
            .bucket(BUCKET)
            .key(dst)
            .copy_source(format!("{BUCKET}/{src}"))
            .send(),
    )?;
    for (node, id) in nodes.iter().zip(IDS) {
        let resp = signed(node, "GET", &format!("/{BUCKET}/{dst}"))?;
        assert_eq!(resp.status, 200);
        assert!(resp.body == data, "the copy of {src} read via {id}");
        assert_eq!(header(&resp, "x-granary-node"), "n2");
    }

    // Only the owners hold copies.
    settle(&all);
    let objects: Vec<u64> = nodes.iter().map(|n| stat(n, "objects")).collect();
    println!("objects per node: {objects:?}");
    for (node, id) in nodes.iter().zip(IDS) {
        let count = keys.iter().filter(|k| owner(&all, k) == id).count() as u64;
        assert_eq!(
            stat(node, "objects"),
            count,
            "{id} caches what it owns, only"
        );
    }

    // A multipart upload through n1 of a key n2 owns, read through n3.
    let mp_key = (0..200)
        .map(|i| format!("mp/{i:03}"))
        .find(|k| owner(&all, k) == "n2")
        .context("a multipart key n2 owns")?;
    let part1 = Pattern::new(61).bytes(0, 5 << 20);
    let part2 = Pattern::new(62).bytes(0, 3000);
    rt.block_on(async {
        use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
        let up = clients[0]
            .create_multipart_upload()
            .bucket(BUCKET)
            .key(&mp_key)
            .send()
            .await?;
        let id = up.upload_id().context("upload id")?;
        let mut done = Vec::new();
        for (n, part) in [(1, &part1), (2, &part2)] {
            let p = clients[0]
                .upload_part()
                .bucket(BUCKET)
                .key(&mp_key)
                .upload_id(id)
                .part_number(n)
                .body(part.clone().into())
                .send()
                .await?;
            done.push(
                CompletedPart::builder()
                    .part_number(n)
                    .set_e_tag(p.e_tag().map(str::to_owned))
                    .build(),
            );
        }
        let complete = clients[0]
            .complete_multipart_upload()
            .bucket(BUCKET)
            .key(&mp_key)
            .upload_id(id)
            .multipart_upload(
                CompletedMultipartUpload::builder()
                    .set_parts(Some(done))
                    .build(),
            )
            .send()
            .await?;
        assert_eq!(
            complete.e_tag(),
            Some(multipart_etag(&[&part1, &part2]).as_str())
        );
        let got = clients[2]
            .get_object()
            .bucket(BUCKET)
            .key(&mp_key)
            .send()
            .await?;
        let body = got.body.collect().await?.into_bytes();
        assert!(body.len() == part1.len() + part2.len());
        assert!(body[..part1.len()] == part1[..] && body[part1.len()..] == part2[..]);
        anyhow::Ok(())
    })?;

    // Listing through any node sees every key (bucket requests are served where they land).
    for client in &clients {
        let listed = rt.block_on(client.list_objects_v2().bucket(BUCKET).send())?;
        let mut names: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
        names.sort();
        let mut want: Vec<&str> = keys.iter().map(String::as_str).collect();
        want.push(&mp_key);
        want.sort();
        assert_eq!(names, want);
    }

    // Delete through n3 (a key owned by n2, cached there): 404 through every node.
    let gone = &keys[0];
    rt.block_on(clients[2].delete_object().bucket(BUCKET).key(gone).send())?;
    for client in &clients {
        expect_sdk_error(
            rt.block_on(client.get_object().bucket(BUCKET).key(gone).send()),
            404,
            &["NoSuchKey"],
        );
    }
    // DeleteObjects through n2 (a bucket request, served there): gone through every node.
    rt.block_on(async {
        use aws_sdk_s3::types::{Delete, ObjectIdentifier};
        let del = Delete::builder()
            .objects(ObjectIdentifier::builder().key(&mp_key).build()?)
            .objects(ObjectIdentifier::builder().key(&keys[2]).build()?)
            .build()?;
        let out = clients[1]
            .delete_objects()
            .bucket(BUCKET)
            .delete(del)
            .send()
            .await?;
        assert_eq!(out.deleted().len(), 2);
        assert!(out.errors().is_empty());
        anyhow::Ok(())
    })?;
    for key in [&mp_key, &keys[2]] {
        for node in &nodes {
            let resp = signed(node, "GET", &format!("/{BUCKET}/{key}"))?;
            resp.assert_s3_error(404, &["NoSuchKey"]);
        }
    }

    // Without a signature nothing is served, through the owner or any other node, and
    // the headers peers use among themselves do not stand in for one.
    let key = &keys[4];
    let path = format!("/{BUCKET}/{key}");
    for node in [a, b, c] {
        send(node.addr(), "GET", &path, &[])?.assert_s3_error(403, &["AccessDenied"]);
        send(node.addr(), "GET", &path, &[("x-granary-hop", "n1")])?
            .assert_s3_error(403, &["AccessDenied"]);
        send(
            node.addr(),
            "GET",
            &path,
            &[("x-granary-hop", "n1"), ("x-granary-peer-fill", "1")],
        )?
        .assert_s3_error(403, &["AccessDenied"]);
        let forged = format!("n1 {} {}", unix_now(), "0".repeat(64));
        send(
            node.addr(),
            "GET",
            &path,
            &[("x-granary-hop", "n1"), ("x-granary-peer-auth", &forged)],
        )?
        .assert_s3_error(403, &["AccessDenied"]);
        let addr = node.addr();
        let body = format!("[{{\"bucket\":\"{BUCKET}\",\"key\":\"{key}\"}}]");
        let inv = raw_request_blocking(
            addr,
            &request_bytes("POST", "/_granary/invalidate", addr, &[], body.as_bytes()),
        )?;
        inv.assert_s3_error(403, &["AccessDenied"]);
    }
    let resp = signed(b, "GET", &path)?;
    assert_eq!(resp.status, 200);
    assert!(resp.body == content(key, 5));

    // The owner of a key killed: a write through another node that has not yet seen it
    // go is refused `503` (its body is spent; the client retries) and marks it down;
    // the retry lands on the next owner, and every node reads it there.
    let key = &keys[3];
    assert_eq!(owner(&all, key), "n3");
    let data = content(key, 9);
    #[allow(clippy::result_large_err)] // the SDK's error type, as the SDK returns it
    let put = |client: &aws_sdk_s3::Client| {
        rt.block_on(
            client
                .put_object()
                .bucket(BUCKET)
                .key(key)
                .body(data.clone().into())
                .send(),
        )
    };
    signal(c.pid(), "KILL")?; // the harness reaps it on drop
    let killed = Instant::now();
    expect_sdk_error(put(&clients[0]), 503, &["ServiceUnavailable"]);
    assert_eq!(member_state(a, "n3").as_deref(), Some("down"));
    put(&clients[0])?;
    let survivors = [a, b];
    // n2 forwarded nothing to n3: its probes alone find it gone, in two missed rounds.
    while member_state(b, "n3").as_deref() != Some("down") {
        assert!(
            killed.elapsed() < Duration::from_secs(5),
            "n2 did not see n3 down within 5 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("n2 saw n3 down by its probes after {:?}", killed.elapsed());
    let new_owner = owner(&survivors, key);
    for node in survivors {
        let resp = signed(node, "GET", &format!("/{BUCKET}/{key}"))?;
        assert_eq!(resp.status, 200);
        assert!(resp.body == data);
        assert_eq!(header(&resp, "x-granary-node"), new_owner);
    }
    Ok(())
}

/// How a node is away from its cluster for a while.
#[derive(Clone, Copy, Debug)]
enum Absence {
    /// kill -9, then a restart on the same disk (a crash, a reboot).
    Crash,
    /// SIGSTOP, then SIGCONT: alive but unreachable (a partition, a long pause).
    Pause,
}

/// A node that was down while its keys were overwritten and deleted through the others
/// comes back with its disk: it must not serve the copies it held from before.
#[test]
fn a_node_back_after_a_crash_serves_no_copy_overwritten_meanwhile() -> Result<()> {
    back_after_absence(Absence::Crash)
}

/// The same for a node that was unreachable but alive: the others, seeing it down,
/// did not tell it of the writes, and it never saw itself cut off (it was paused).
#[test]
fn a_node_back_after_a_pause_serves_no_copy_overwritten_meanwhile() -> Result<()> {
    back_after_absence(Absence::Pause)
}

/// Sends `signal` (`STOP`, `CONT`) to a process this test started.
fn signal(pid: u32, signal: &str) -> Result<()> {
    let status = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()?;
    anyhow::ensure!(status.success(), "kill -{signal} {pid}: {status}");
    if signal == "STOP" {
        // kill(2) returns once the signal is queued: the process goes on until one of its
        // threads is scheduled to take it and stops the others. On busy cores that takes
        // a while, and a request that arrives meanwhile is still answered.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !every_thread_stopped(pid) {
            anyhow::ensure!(Instant::now() < deadline, "{pid} never stopped");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    Ok(())
}

/// Whether every thread of `pid` that runs its code is stopped (state `T` in /proc).
/// The kernel's io_uring workers (`iou-*`) run none and do not take job control.
fn every_thread_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            return false;
        };
        // `PID (COMM) STATE ...`: the command may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            return false;
        };
        let comm = &stat[open + 1..close];
        let state = stat[close + 1..].split_whitespace().next();
        comm.starts_with("iou-") || state == Some("T")
    })
}

fn back_after_absence(absence: Absence) -> Result<()> {
    let origin = tempfile::Builder::new()
        .prefix("granary-origin-")
        .tempdir()?;
    let objects = dataset(12);
    lay_out_fs(origin.path(), &objects)?;
    let mut nodes = fs_cluster(origin.path(), ServerOpts::open())?;
    let all: Vec<&Server> = nodes.iter().collect();
    let victim_id = IDS[2];
    let mine: Vec<&Obj> = objects
        .iter()
        .filter(|o| owner(&all, &o.key) == victim_id)
        .collect();
    assert!(mine.len() >= 2, "{victim_id} owns {} keys", mine.len());
    // The victim caches its keys.
    for o in &mine {
        get_exact(&nodes[0], o);
    }
    settle(&all);
    assert_eq!(stat(&nodes[2], "objects"), mine.len() as u64);

    match absence {
        Absence::Crash => nodes[2].kill()?,
        Absence::Pause => signal(nodes[2].pid(), "STOP")?,
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while !nodes[..2]
        .iter()
        .all(|n| member_state(n, victim_id).as_deref() == Some("down"))
    {
        assert!(
            Instant::now() < deadline,
            "the killed node was never seen down"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Meanwhile: one key overwritten, one deleted, through a survivor.
    let (changed, deleted) = (mine[0], mine[1]);
    let new = Pattern::new(31337).bytes(0, 12_345);
    let addr = nodes[0].addr();
    let path = obj_path(&changed.key);
    let put = raw_request_blocking(addr, &request_bytes("PUT", &path, addr, &[], &new))?;
    assert_eq!(put.status, 200, "{}", put.text());
    let del = send(addr, "DELETE", &obj_path(&deleted.key), &[])?;
    assert_eq!(del.status, 204);

    match absence {
        Absence::Crash => nodes[2].restart(false)?,
        Absence::Pause => signal(nodes[2].pid(), "CONT")?,
    }
    Server::wait_cluster_up(&nodes.iter().collect::<Vec<_>>(), UP_TIMEOUT)?;
    let mut stale = Vec::new();
    for (node, id) in nodes.iter().zip(IDS) {
        let resp = get(node, &changed.key)?;
        if resp.status != 200 || resp.body != new {
            stale.push(format!(
                "GET {} via {id}: {} with {} bytes{} (x-granary-node {}, x-granary-cache {})",
                changed.key,
                resp.status,
                resp.body.len(),
                if resp.body == changed.data {
                    ", the old copy"
                } else {
                    ""
                },
                header(&resp, "x-granary-node"),
                header(&resp, "x-granary-cache"),
            ));
        }
        let resp = get(node, &deleted.key)?;
        if resp.status != 404 {
            stale.push(format!(
                "GET {} (deleted) via {id}: {} with {} bytes (x-granary-node {}, x-granary-cache {})",
                deleted.key,
                resp.status,
                resp.body.len(),
                header(&resp, "x-granary-node"),
                header(&resp, "x-granary-cache"),
            ));
        }
    }
    assert!(stale.is_empty(), "stale reads:\n{}", stale.join("\n"));
    Ok(())
}

/// An owner that hangs (SIGSTOP: its kernel still accepts connections, nothing answers):
/// reads of its keys through the other nodes are served by the next owner, within a few
/// seconds, and both see it down.
#[test]
fn reads_carry_on_past_a_hung_owner() -> Result<()> {
    let origin = tempfile::Builder::new()
        .prefix("granary-origin-")
        .tempdir()?;
    let objects = dataset(12);
    lay_out_fs(origin.path(), &objects)?;
    let nodes = fs_cluster(origin.path(), ServerOpts::open())?;
    let all: Vec<&Server> = nodes.iter().collect();
    let o = objects
        .iter()
        .find(|o| owner(&all, &o.key) == "n3")
        .context("a key n3 owns")?;
    get_exact(&nodes[0], o);
    signal(nodes[2].pid(), "STOP")?;
    let stopped = Instant::now();
    let result = std::thread::scope(|s| {
        let readers: Vec<_> = nodes[..2]
            .iter()
            .map(|node| {
                s.spawn(move || {
                    let addr = node.addr();
                    let path = obj_path(&o.key);
                    let req = request_bytes("GET", &path, addr, &[], b"");
                    let r = raw_request_with_timeout(addr, &req, Duration::from_secs(10));
                    (r, stopped.elapsed())
                })
            })
            .collect();
        // The probes see it down meanwhile; a read that starts then is served at once.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !nodes[..2]
            .iter()
            .all(|n| member_state(n, "n3").as_deref() == Some("down"))
        {
            assert!(Instant::now() < deadline, "n3 never seen down");
            std::thread::sleep(Duration::from_millis(20));
        }
        println!("n3 seen down by both after {:?}", stopped.elapsed());
        let fresh = get_exact(&nodes[0], o);
        assert_ne!(header(&fresh, "x-granary-node"), "n3");
        readers
            .into_iter()
            .map(|h| h.join().expect("reader"))
            .collect::<Vec<_>>()
    });
    signal(nodes[2].pid(), "CONT")?;
    for (i, (resp, took)) in result.into_iter().enumerate() {
        let resp = resp.with_context(|| format!("GET via {} after {took:?}", IDS[i]))?;
        println!(
            "GET via {} with n3 hung: {} after {took:?}",
            IDS[i], resp.status
        );
        assert_eq!(resp.status, 200);
        assert!(resp.body == o.data);
        assert_ne!(header(&resp, "x-granary-node"), "n3");
        assert!(took < Duration::from_secs(6), "answered after {took:?}");
    }
    Ok(())
}
