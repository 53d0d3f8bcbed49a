//! The node's orchestration across members, without HTTP: two nodes over one in-memory
//! store, their members' calls carried by an in-memory network to a small dispatcher
//! that answers each call as the API's table does. A rebalance hands every object to
//! its new owner; a prefetch reads each key on its owner.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use futures::TryStreamExt;
use http::{Method, Request, Response, StatusCode};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

use super::{Node, ReadMode, ReadRequest};
use crate::backend::mem::Mem;
use crate::cache::{Cache, CacheError, CachePolicy};
use crate::cluster::calls::{self, Announced, PrefetchPart, ANNOUNCE};
use crate::cluster::membership::Rounds;
use crate::cluster::source::Watch;
use crate::cluster::testnet::{answer, Net};
use crate::cluster::transport::ReplyBody;
use crate::cluster::{Cluster, ClusterConfig};
use crate::stats::{Metric, Stats};
use crate::transform::Transforms;
use crate::NodeError;

const PEERS: [&str; 2] = ["a=http://a:1", "b=http://b:1"];

/// A node of the two, its cache in `dir`.
fn node(net: &Net, id: &str, src: &Arc<Mem>, dir: &std::path::Path) -> Arc<Node> {
    let stats = Arc::new(Stats::default());
    let engine = crate::io::engine(crate::io::EngineChoice::Std).unwrap();
    let cache = Cache::open(
        dir,
        1 << 30,
        CachePolicy::NeverEvict,
        true,
        engine,
        stats.clone(),
    )
    .unwrap();
    let config = ClusterConfig {
        peer: PEERS.iter().map(|p| p.to_string()).collect(),
        ..ClusterConfig::default()
    };
    let cluster =
        Cluster::with_transport(&config, id, 1 << 30, stats.clone(), net.transport()).unwrap();
    let node = Node::new(
        src.clone(),
        Arc::new(cache),
        Arc::new(cluster),
        stats,
        Transforms::default(),
        0,
    );
    node.start();
    node
}

/// Puts `node` on the network at `url`.
fn serve(net: &Net, url: &str, node: &Arc<Node>) {
    let weak = Arc::downgrade(node);
    net.serve(
        url,
        Arc::new(move |req| {
            let weak = weak.clone();
            Box::pin(async move { dispatch(weak, req).await })
        }),
    );
}

/// What a member answers to a call, as the API's table would.
async fn dispatch(node: Weak<Node>, req: Request<Bytes>) -> Response<ReplyBody> {
    let Some(node) = node.upgrade() else {
        return answer(StatusCode::SERVICE_UNAVAILABLE, &[], "");
    };
    let json = |status, v: String| answer(status, &[("content-type", "application/json")], v);
    let body = req.body().clone();
    let path = req.uri().path().to_owned();
    match (req.method().clone(), path.as_str()) {
        (Method::GET, "/_granary/health") => {
            let (name, value) = calls::Probe::reply_header(Announced::Known);
            let h: &[(&str, &str)] = if req.headers().contains_key(ANNOUNCE) {
                &[(name, value)]
            } else {
                &[]
            };
            let health = serde_json::to_string(&node.health()).unwrap();
            answer(StatusCode::OK, h, health)
        }
        // The members' JSON calls: the node's own table, as the API serves it.
        (m, p) if super::is_member_call(&m, p) => {
            match node.serve_call(&m, p, &body).await.expect("a call") {
                Ok((status, reply)) => json(status, reply),
                Err(e) => answer(StatusCode::INTERNAL_SERVER_ERROR, &[], e.to_string()),
            }
        }
        (Method::POST, "/_granary/prefetch") => {
            let part: PrefetchPart = serde_json::from_slice(&body).unwrap();
            let job = node.start_prefetch(part).await.unwrap();
            let v = serde_json::json!({"id": job.id, "kind": job.kind, "state": "running"});
            json(StatusCode::ACCEPTED, v.to_string())
        }
        (m, p) if p.starts_with("/_granary/jobs/") => {
            let id = &p["/_granary/jobs/".len()..];
            match node.job(id, m == Method::DELETE, false).await {
                Some(v) => json(StatusCode::OK, v.to_string()),
                None => answer(StatusCode::NOT_FOUND, &[], ""),
            }
        }
        (Method::GET, p) => {
            let (bucket, key) = granary_proto::encode::split_path(p).unwrap();
            let key = key.unwrap();
            let mut read = ReadRequest::object(&bucket, &key);
            if calls::asks_copy(req.headers()) {
                read.mode = ReadMode::Committed;
            }
            match node.read(&read).await {
                Ok(reply) => {
                    let meta = &reply.meta;
                    let mut resp = answer(
                        StatusCode::OK,
                        &[
                            ("content-length", &reply.size.to_string()),
                            ("etag", &format!("\"{}\"", meta.etag)),
                            (
                                "last-modified",
                                &httpdate::fmt_http_date(meta.last_modified),
                            ),
                        ],
                        "",
                    );
                    let frames = reply
                        .body
                        .into_stream()
                        .map_ok(Frame::data)
                        .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>);
                    *resp.body_mut() = StreamBody::new(frames).boxed_unsync();
                    resp
                }
                Err(NodeError::Cache(CacheError::NotHeld)) => {
                    answer(StatusCode::NOT_FOUND, &[], "")
                }
                Err(e) => answer(StatusCode::INTERNAL_SERVER_ERROR, &[], e.to_string()),
            }
        }
        _ => answer(StatusCode::NOT_FOUND, &[], ""),
    }
}

/// Probe rounds on both nodes until each sees the other up and trusts its cache.
async fn meet(pairs: &mut [(&Arc<Node>, &mut Rounds)]) {
    for _ in 0..3 {
        for (n, r) in pairs.iter_mut() {
            r.round(&n.cluster).await;
        }
    }
    for (n, _) in pairs.iter() {
        assert!(n.cluster.settled() && n.cache.trusted(), "{} settled", n.id);
        assert_eq!(n.cluster.others_up().len(), 1, "{} sees the other", n.id);
    }
}

/// Nodes `a` and `b` over `src`, on a network, each seeing the other up: the network,
/// the nodes, and `a`'s probe rounds.
async fn met_pair(
    src: &Arc<Mem>,
    da: &std::path::Path,
    db: &std::path::Path,
) -> (Net, Arc<Node>, Arc<Node>, Rounds) {
    let net = Net::default();
    let a = node(&net, "a", src, da);
    let b = node(&net, "b", src, db);
    serve(&net, "http://a:1", &a);
    serve(&net, "http://b:1", &b);
    let (mut ra, mut rb) = (Rounds::new(Watch::Fixed), Rounds::new(Watch::Fixed));
    meet(&mut [(&a, &mut ra), (&b, &mut rb)]).await;
    (net, a, b, ra)
}

fn objects(prefix: &str, n: usize) -> Vec<(String, Bytes)> {
    (0..n)
        .map(|i| {
            let data: Vec<u8> = (0..(64 << 10) + i).map(|j| (j * 7 + i) as u8).collect();
            (format!("{prefix}{i:02}"), Bytes::from(data))
        })
        .collect()
}

fn store(objs: &[(String, Bytes)]) -> Arc<Mem> {
    let list: Vec<(&str, Bytes)> = objs.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
    Mem::with(&list)
}

/// Waits until a job of `node` is no longer running: its JSON.
async fn finished(node: &Arc<Node>, id: &str) -> serde_json::Value {
    for _ in 0..500 {
        let v = node.job(id, false, false).await.expect("the job");
        if v["state"] != "running" {
            return v;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("job {id} never ended");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebalance_hands_each_object_to_its_new_owner_once() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let objs = objects("o/", 40);
    let src = store(&objs);
    let net = Net::default();
    let a = node(&net, "a", &src, da.path());
    let b = node(&net, "b", &src, db.path());
    serve(&net, "http://a:1", &a);
    // b is not there yet: a owns every key, and caches all of them.
    let mut ra = Rounds::new(Watch::Fixed);
    ra.round(&a.cluster).await;
    assert!(a.cluster.settled() && a.cache.trusted());
    for (k, v) in &objs {
        assert_eq!(a.warm("bk", k).await.unwrap(), Some(v.len() as u64));
    }
    // The last fills commit a moment after their readers are done.
    for _ in 0..500 {
        if a.cache.usage().objects == 40 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(a.cache.usage().objects, 40);
    let fetched = src.gets.load(std::sync::atomic::Ordering::SeqCst);

    // b joins: a third of the keys or so are b's now.
    serve(&net, "http://b:1", &b);
    let mut rb = Rounds::new(Watch::Fixed);
    meet(&mut [(&a, &mut ra), (&b, &mut rb)]).await;
    let b_owns: Vec<&(String, Bytes)> = objs
        .iter()
        .filter(|(k, _)| a.cluster.owner("bk", k).id == "b")
        .collect();
    assert!((8..=32).contains(&b_owns.len()), "{}", b_owns.len());
    a.rebalance().await;
    for (k, v) in &objs {
        let (on_a, on_b) = (a.cache.holds("bk", k), b.cache.holds("bk", k));
        if a.cluster.owner("bk", k).id == "b" {
            assert_eq!((on_a, on_b), (None, Some(v.len() as u64)), "{k} moved to b");
        } else {
            assert_eq!((on_a, on_b), (Some(v.len() as u64), None), "{k} stays on a");
        }
    }
    let moved: u64 = b_owns.iter().map(|(_, v)| v.len() as u64).sum();
    assert_eq!(
        b.stats.get(Metric::BytesFromPeers),
        moved,
        "b read a's copies"
    );
    assert_eq!(a.stats.get(Metric::PeerServes), b_owns.len() as u64);
    assert_eq!(
        src.gets.load(std::sync::atomic::Ordering::SeqCst),
        fetched,
        "nothing read from the store again"
    );
    let jobs = a.jobs_json();
    assert_eq!(jobs.len(), 1);
    assert_eq!(jobs[0]["kind"], "rebalance");
    assert_eq!(jobs[0]["objects_done"], b_owns.len());
    assert_eq!(jobs[0]["bytes_done"], moved);
    // A second pass finds nothing to move.
    a.rebalance().await;
    assert_eq!(a.jobs_json().len(), 1);
    // Reads through b are hits of what it took.
    let (k, v) = b_owns[0];
    let reply = b.read(&ReadRequest::object("bk", k)).await.unwrap();
    assert_eq!(reply.origin, crate::cache::Origin::Hit);
    let got: Vec<Bytes> = reply.body.into_stream().try_collect().await.unwrap();
    assert_eq!(got.concat(), v.to_vec());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefetch_reads_each_key_on_its_owner() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut objs = objects("p/", 30);
    let others = objects("q/", 5);
    objs.extend(others.iter().cloned());
    let src = store(&objs);
    let (_net, a, b, _) = met_pair(&src, da.path(), db.path()).await;

    let job = a
        .start_prefetch(PrefetchPart {
            bucket: "bk".into(),
            prefix: "p/".into(),
            objects: None,
            part_of: None,
        })
        .await
        .unwrap();
    let done = finished(&a, &job.id).await;
    let total: u64 = objs[..30].iter().map(|(_, v)| v.len() as u64).sum();
    assert_eq!(done["state"], "done");
    assert_eq!(done["objects_total"], 30);
    assert_eq!(done["objects_done"], 30);
    assert_eq!(done["bytes_done"], total);
    assert_eq!(done["errors"], 0);
    assert_eq!(done["nodes"], 2, "b ran a part");
    // The last fills commit a moment after their readers are done.
    for _ in 0..500 {
        if a.cache.usage().objects + b.cache.usage().objects == 30 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let parts = b.jobs_json();
    assert_eq!(parts.len(), 1);
    assert_eq!(parts[0]["part_of"], job.id.as_str());
    for (k, v) in &objs {
        let owner = a.cluster.owner("bk", k).id.clone();
        let (on_a, on_b) = (a.cache.holds("bk", k), b.cache.holds("bk", k));
        let want = Some(v.len() as u64);
        if k.starts_with("q/") {
            assert_eq!((on_a, on_b), (None, None), "{k} is not under the prefix");
        } else if owner == "a" {
            assert_eq!((on_a, on_b), (want, None), "{k} read on a");
        } else {
            assert_eq!((on_a, on_b), (None, want), "{k} read on b");
        }
    }
    assert_eq!(
        src.gets.load(std::sync::atomic::Ordering::SeqCst),
        30,
        "each key read from the store once"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plans_shards_follow_their_owners_as_members_go_and_come() {
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // A plan of 40 shards of bucket `b`, which the store does not hold: its fetches
    // fail, and which shards are this node's is all the test asks.
    let src = store(&[]);
    let (_net, a, _b, mut ra) = met_pair(&src, da.path(), db.path()).await;
    let spec = crate::plans::test_spec(40, 1 << 16, 1);
    let keys: Vec<String> = spec.shards.iter().map(|s| s.key.clone()).collect();
    a.register_plan(spec).unwrap();
    let mut mine: Vec<String> = keys
        .iter()
        .filter(|k| a.cluster.owner("b", k).id == "a")
        .cloned()
        .collect();
    mine.sort();
    assert!((8..=32).contains(&mine.len()), "{}", mine.len());
    assert_eq!(a.planned_keys_here(), mine);
    // Asked again with the same owners: the same shards.
    assert_eq!(a.planned_keys_here(), mine);
    // b is down: a owns the whole plan.
    let gone = a.cluster.member("b").unwrap();
    a.cluster.mark_down(&gone, "a test");
    assert_eq!(a.planned_keys_here().len(), 40);
    // b is back: a owns its part again.
    ra.round(&a.cluster).await;
    assert_eq!(a.cluster.others_up().len(), 1, "a sees b again");
    assert_eq!(a.planned_keys_here(), mine);
}
