//! Datasets' catalogs through the real binary (`GET /_granary/catalog`): built once per
//! version from the shards' headers, not their bytes; kept across requests and restarts;
//! from the dataset's index (`wids.json`, which `granaryctl index` writes) without
//! reading a shard; once for a whole cluster; and read by the client's dataset.

use std::collections::BTreeSet;
use std::io::Read;

use anyhow::Result;
use granary_proto::shards::{sample_spans, Catalog, INDEX_NAME};
use granary_tests::ctl::granaryctl;
use granary_tests::{raw_request_blocking, request_bytes, tar_of, Pattern, Server, ServerOpts};

const BUCKET: &str = "datasets";

/// `n` shards of `samples` samples each: a `.jpg` of 64 to 100 KiB, a `.cls` and a
/// `.json` per sample. Their bytes by key.
fn shards(prefix: &str, n: usize, samples: usize) -> Vec<(String, Vec<u8>)> {
    (0..n)
        .map(|s| {
            let mut members = Vec::new();
            for i in 0..samples {
                let name = format!("{s:03}{i:04}");
                let jpg = (64 << 10) + (s * 977 + i * 3301) % (36 << 10);
                members.push((
                    format!("{name}.jpg"),
                    Pattern::new((s * 1000 + i) as u64).bytes(0, jpg),
                ));
                members.push((format!("{name}.cls"), vec![b'0' + (i % 10) as u8]));
                members.push((
                    format!("{name}.json"),
                    format!("{{\"i\":{i}}}").into_bytes(),
                ));
            }
            (format!("{prefix}shard-{s:04}.tar"), tar_of(&members))
        })
        .collect()
}

/// Writes the shards into the node's fs backend.
fn lay_out(server: &Server, shards: &[(String, Vec<u8>)]) -> Result<u64> {
    let root = server.data_dir().join("origin").join(BUCKET);
    for (key, bytes) in shards {
        let path = root.join(key);
        std::fs::create_dir_all(path.parent().unwrap())?;
        std::fs::write(path, bytes)?;
    }
    Ok(shards.iter().map(|(_, b)| b.len() as u64).sum())
}

/// Writes the shards into the first node's fs backend, which the others read too (one
/// store shared by the cluster: a network file system, say).
fn lay_out_shared(nodes: &[Server], shards: &[(String, Vec<u8>)]) -> Result<u64> {
    let total = lay_out(&nodes[0], shards)?;
    let origin = nodes[0].data_dir().join("origin").join(BUCKET);
    for n in &nodes[1..] {
        let link = n.data_dir().join("origin").join(BUCKET);
        std::fs::create_dir_all(link.parent().unwrap())?;
        std::os::unix::fs::symlink(&origin, &link)?;
    }
    Ok(total)
}

/// Where each sample of a tar ends, computed here from its bytes.
fn ends_of(tar: &[u8]) -> Vec<u64> {
    let mut ar = tar::Archive::new(tar);
    let members: Vec<(String, u64, u64)> = ar
        .entries()
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            let name = String::from_utf8(e.path_bytes().into_owned()).unwrap();
            (name, e.raw_file_position(), e.size())
        })
        .collect();
    sample_spans(members).iter().map(|s| s.end).collect()
}

fn catalog_of(server: &Server, prefix: &str, query: &str) -> Result<(u16, Vec<u8>)> {
    let path = format!(
        "/_granary/catalog?bucket={BUCKET}&prefix={}{query}",
        granary_proto::encode::query_value(prefix)
    );
    let req = request_bytes("GET", &path, server.addr(), &[], b"");
    let resp = raw_request_blocking(server.addr(), &req)?;
    Ok((resp.status, resp.body))
}

fn catalog(server: &Server, prefix: &str) -> Result<Catalog> {
    let (status, body) = catalog_of(server, prefix, "")?;
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    Ok(serde_json::from_slice(&body)?)
}

fn stat(server: &Server, field: &str) -> u64 {
    server.stats().unwrap()[field].as_u64().unwrap()
}

#[test]
fn a_catalog_reads_headers_only_and_is_built_once_per_version() -> Result<()> {
    let mut server = Server::start(ServerOpts::open())?;
    let data = shards("train/", 16, 20);
    let total = lay_out(&server, &data)?;
    let c = catalog(&server, "train/")?;
    assert!(!c.from_index);
    assert_eq!(c.shards.len(), 16);
    for ((key, bytes), s) in data.iter().zip(&c.shards) {
        assert_eq!(&s.key, key);
        assert_eq!(s.size, bytes.len() as u64);
        assert_eq!(s.samples, 20);
        assert_eq!(s.ends.as_deref(), Some(&ends_of(bytes)[..]), "{key}");
    }
    let read = stat(&server, "bytes_from_backend");
    assert!(
        read * 20 <= total,
        "indexing read {read} of {total} bytes (more than 5%)"
    );
    assert_eq!(stat(&server, "shards_indexed"), 16);
    assert_eq!(stat(&server, "catalogs_built"), 1);

    // The same version again: nothing read, nothing built.
    assert_eq!(catalog(&server, "train/")?, c);
    assert_eq!(stat(&server, "bytes_from_backend"), read);
    assert_eq!(stat(&server, "catalogs_built"), 1);

    // A restart keeps it.
    server.kill_and_restart()?;
    assert_eq!(catalog(&server, "train/")?, c);
    assert_eq!(stat(&server, "bytes_from_backend"), 0);
    assert_eq!(stat(&server, "shards_indexed"), 0);

    // A changed shard is a new version; only it is read again.
    let changed = shards("train/", 4, 21).swap_remove(3);
    lay_out(&server, std::slice::from_ref(&changed))?;
    std::thread::sleep(granary_core_fresh());
    let again = catalog(&server, "train/")?;
    assert_ne!(again.version, c.version);
    assert_eq!(again.shards[3].samples, 21);
    assert_eq!(
        again.shards[3].ends.as_deref(),
        Some(&ends_of(&changed.1)[..])
    );
    assert_eq!(again.shards[2], c.shards[2]);
    assert_eq!(stat(&server, "shards_indexed"), 1);

    // A shard written through the cluster is seen at once: no listing is trusted past
    // a write under the prefix.
    let through = shards("train/", 6, 22).swap_remove(5);
    let put = request_bytes(
        "PUT",
        &format!("/{BUCKET}/{}", through.0),
        server.addr(),
        &[],
        &through.1,
    );
    assert_eq!(raw_request_blocking(server.addr(), &put)?.status, 200);
    let now = catalog(&server, "train/")?;
    assert_ne!(now.version, again.version);
    assert_eq!(now.shards[5].samples, 22);
    Ok(())
}

/// How long a catalog is served without listing again (the node's `FRESH_FOR`), and a
/// moment more.
fn granary_core_fresh() -> std::time::Duration {
    std::time::Duration::from_millis(2_200)
}

#[test]
fn with_an_index_no_shard_is_read_and_granaryctl_writes_one() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let data = shards("idx/", 6, 9);
    lay_out(&server, &data)?;
    // granaryctl counts the samples from the shards, and writes the index.
    let out = granaryctl(&server.url(), &["index", &format!("{BUCKET}/idx/")], b"")?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("{BUCKET}/idx/{INDEX_NAME}: 6 shards, 54 samples")
    );
    let index_path = server
        .data_dir()
        .join("origin")
        .join(BUCKET)
        .join("idx")
        .join(INDEX_NAME);
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(&index_path)?)?;
    assert_eq!(index["shardlist"][0]["url"], "shard-0000.tar");
    assert_eq!(index["shardlist"][5]["nsamples"], 9);

    // A second node over the same store: its catalog comes from the index alone.
    let fresh = Server::start(ServerOpts::open().args(&[
        "--backend",
        &format!("fs:{}", server.data_dir().join("origin").display()),
    ]))?;
    let c = catalog(&fresh, "idx/")?;
    assert!(c.from_index);
    assert_eq!(c.shards.len(), 6);
    assert!(c.shards.iter().all(|s| s.samples == 9 && s.ends.is_none()));
    let index_size = std::fs::metadata(&index_path)?.len();
    assert_eq!(
        stat(&fresh, "bytes_from_backend"),
        index_size,
        "the index and nothing else"
    );
    assert_eq!(stat(&fresh, "shards_indexed"), 0);
    // Asked to ignore it, the node indexes the shards.
    let (status, body) = catalog_of(&fresh, "idx/", "&index=ignore")?;
    assert_eq!(status, 200);
    let from_shards: Catalog = serde_json::from_slice(&body)?;
    assert!(!from_shards.from_index);
    assert!(from_shards.shards.iter().all(|s| s.ends.is_some()));
    assert_eq!(stat(&fresh, "shards_indexed"), 6);

    // The client reads an index-only catalog: every sample once, each with its bytes.
    let ds = |rank: usize| {
        granary_client::Dataset::builder()
            .endpoint(&fresh.url())
            .bucket(BUCKET)
            .prefix("idx/")
            .seed(3)
            .rank(rank)
            .world_size(2)
            .build()
            .unwrap()
    };
    let (a, b) = (ds(0), ds(1));
    assert!(a.shards().iter().all(|s| !s.ranged()));
    let mut seen = BTreeSet::new();
    for d in [&a, &b] {
        for sample in d.epoch(1) {
            let sample = sample?;
            let (s, i): (usize, usize) = (
                sample.key[..3].parse().unwrap(),
                sample.key[3..].parse().unwrap(),
            );
            let jpg = (64 << 10) + (s * 977 + i * 3301) % (36 << 10);
            assert_eq!(
                sample.get("jpg").unwrap(),
                Pattern::new((s * 1000 + i) as u64).bytes(0, jpg)
            );
            assert!(seen.insert(sample.key.clone()), "{} twice", sample.key);
        }
    }
    assert_eq!(seen.len(), 54);
    Ok(())
}

#[test]
fn a_cluster_builds_a_catalog_once() -> Result<()> {
    let nodes = Server::start_cluster(&["c1", "c2", "c3"], &ServerOpts::open())?;
    let refs: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&refs, std::time::Duration::from_secs(20))?;
    let data = shards("big/", 24, 8);
    let total = lay_out_shared(&nodes, &data)?;
    let catalogs: Vec<Catalog> = nodes
        .iter()
        .map(|n| catalog(n, "big/"))
        .collect::<Result<_>>()?;
    assert!(catalogs.windows(2).all(|w| w[0] == w[1]), "one catalog");
    let sum = |field: &str| nodes.iter().map(|n| stat(n, field)).sum::<u64>();
    assert_eq!(sum("catalogs_built"), 1, "built once, by one member");
    assert_eq!(sum("shards_indexed"), 24, "each shard indexed once");
    assert!(
        sum("shards_indexed")
            > nodes
                .iter()
                .map(|n| stat(n, "shards_indexed"))
                .max()
                .unwrap(),
        "by more than one member"
    );
    assert!(sum("bytes_from_backend") * 20 <= total);
    for (s, (_, bytes)) in catalogs[0].shards.iter().zip(&data) {
        assert_eq!(s.ends.as_deref(), Some(&ends_of(bytes)[..]));
    }
    Ok(())
}

/// A member indexes its shards of many samples for a catalog built on another: where
/// each sample ends comes to more than the 64 KiB a peer's reply to most calls may be
/// (here about 100 KB from each member), and the catalog is whole all the same.
#[test]
fn a_cluster_catalogs_shards_of_many_samples() -> Result<()> {
    let nodes = Server::start_cluster(&["m1", "m2"], &ServerOpts::open())?;
    let refs: Vec<&Server> = nodes.iter().collect();
    Server::wait_cluster_up(&refs, std::time::Duration::from_secs(20))?;
    let data: Vec<(String, Vec<u8>)> = (0..24)
        .map(|s| {
            let members: Vec<(String, Vec<u8>)> = (0..1200)
                .map(|i| (format!("{s:02}{i:05}.bin"), vec![(s + i) as u8; 700]))
                .collect();
            (format!("many/shard-{s:04}.tar"), tar_of(&members))
        })
        .collect();
    lay_out_shared(&nodes, &data)?;
    let cat = catalog(&nodes[0], "many/")?;
    assert_eq!(cat.shards.len(), 24);
    for (s, (key, bytes)) in cat.shards.iter().zip(&data) {
        assert_eq!(&s.key, key);
        assert_eq!(s.samples, 1200);
        assert_eq!(s.ends.as_deref(), Some(&ends_of(bytes)[..]));
    }
    assert!(
        stat(&nodes[1], "shards_indexed") >= 8,
        "the other member indexed its own"
    );
    assert_eq!(catalog(&nodes[1], "many/")?, cat, "one catalog");
    Ok(())
}

/// Shards of small members: hopping from header to header would read most of their
/// bytes in many requests, so they are read through, and catalogued all the same.
#[test]
fn shards_of_small_members_are_read_through() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let data: Vec<(String, Vec<u8>)> = (0..3)
        .map(|s| {
            let members: Vec<(String, Vec<u8>)> = (0..300)
                .flat_map(|i| {
                    [
                        (format!("{s}{i:04}.txt"), vec![b'a'; 700 + i % 300]),
                        (format!("{s}{i:04}.cls"), vec![b'1']),
                    ]
                })
                .collect();
            (format!("small/shard-{s}.tar"), tar_of(&members))
        })
        .collect();
    let total = lay_out(&server, &data)?;
    let c = catalog(&server, "small/")?;
    for ((_, bytes), s) in data.iter().zip(&c.shards) {
        assert_eq!(s.samples, 300);
        assert_eq!(s.ends.as_deref(), Some(&ends_of(bytes)[..]));
    }
    let read = stat(&server, "bytes_from_backend");
    assert!(read >= total * 9 / 10 && read <= total, "{read} of {total}");
    Ok(())
}

#[test]
fn a_compressed_shard_is_read_once_and_its_samples_counted() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let (key, tar) = shards("gz/", 1, 5).remove(0);
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, &tar)?;
    let gz = gz.finish()?;
    lay_out(&server, &[(key.replace(".tar", ".tar.gz"), gz.clone())])?;
    let c = catalog(&server, "gz/")?;
    assert_eq!(c.shards[0].samples, 5);
    // Offsets in the decompressed stream, as the client reads it.
    assert_eq!(c.shards[0].ends.as_deref(), Some(&ends_of(&tar)[..]));
    let mut back = Vec::new();
    flate2::read::MultiGzDecoder::new(&gz[..]).read_to_end(&mut back)?;
    assert_eq!(back, tar);
    // Not a shard and no shards: an empty catalog, which the client refuses.
    let (status, body) = catalog_of(&server, "none/", "")?;
    assert_eq!(status, 200);
    let empty: Catalog = serde_json::from_slice(&body)?;
    assert!(empty.shards.is_empty());
    let (status, _) = catalog_of(&server, "gz/", "&index=maybe")?;
    assert_eq!(status, 400);
    Ok(())
}
