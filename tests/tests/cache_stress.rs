//! A concurrent stress test of the cache: readers, writers and deleters on a few keys of
//! mixed sizes through one node whose small LRU cache keeps evicting. Every complete
//! `200` body must be exactly one version that was written for its key — never a mix,
//! never a stale version after a later write finished — and the node's accounting must
//! stay within its capacity.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use granary_tests::{md5_hex, raw_request_blocking, request_bytes, Pattern, Server, ServerOpts};

const BUCKET: &str = "stress";
const KEYS: usize = 6;

fn size_of(key: usize) -> usize {
    // Small (memory tier), one block, several blocks.
    [40 << 10, 300 << 10, (2 << 20) + 17][key % 3]
}

#[test]
fn readers_writers_and_evictions_never_mix_versions() {
    let capacity = (3 << 20).to_string();
    let server = Server::start(ServerOpts::open().args(&[
        "--cache-capacity",
        &capacity,
        "--cache-policy",
        "lru",
    ]))
    .unwrap();
    let addr = server.addr();
    let put = |key: usize, version: u64| -> String {
        let data = Pattern::new(key as u64 * 1000 + version).bytes(0, size_of(key));
        let path = format!("/{BUCKET}/k{key}");
        let r = raw_request_blocking(addr, &request_bytes("PUT", &path, addr, &[], &data)).unwrap();
        assert_eq!(r.status, 200, "PUT {path}");
        md5_hex(&data)
    };
    let r = raw_request_blocking(
        addr,
        &request_bytes("PUT", &format!("/{BUCKET}"), addr, &[], b""),
    )
    .unwrap();
    assert_eq!(r.status, 200);

    // Versions whose PUT has started (a reader may see them), by MD5, and the last one
    // finished.
    let started: Mutex<HashMap<usize, HashMap<String, u64>>> = Mutex::new(HashMap::new());
    let finished: Mutex<HashMap<usize, (u64, String)>> = Mutex::new(HashMap::new());
    for k in 0..KEYS {
        let md5 = md5_hex(&Pattern::new(k as u64 * 1000).bytes(0, size_of(k)));
        started
            .lock()
            .unwrap()
            .entry(k)
            .or_default()
            .insert(md5.clone(), 0);
        put(k, 0);
        finished.lock().unwrap().insert(k, (0, md5));
    }

    let stop = AtomicBool::new(false);
    let reads = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(6);
    std::thread::scope(|s| {
        // Writers: new versions, and now and then a delete followed by a rewrite.
        for w in 0..2u64 {
            let (started, finished, stop) = (&started, &finished, &stop);
            s.spawn(move || {
                let mut version = 1 + w * 1_000_000;
                while !stop.load(Ordering::Relaxed) {
                    let key = (version as usize * 7 + w as usize) % KEYS;
                    let md5 =
                        md5_hex(&Pattern::new(key as u64 * 1000 + version).bytes(0, size_of(key)));
                    started
                        .lock()
                        .unwrap()
                        .entry(key)
                        .or_default()
                        .insert(md5.clone(), version);
                    if version % 5 == 0 {
                        let path = format!("/{BUCKET}/k{key}");
                        let r = raw_request_blocking(
                            addr,
                            &request_bytes("DELETE", &path, addr, &[], b""),
                        )
                        .unwrap();
                        assert_eq!(r.status, 204);
                    }
                    assert_eq!(put(key, version), md5);
                    finished.lock().unwrap().insert(key, (version, md5));
                    version += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
            });
        }
        // Readers: whole objects and ranges.
        for rdr in 0..6usize {
            let (started, finished, stop, reads) = (&started, &finished, &stop, &reads);
            s.spawn(move || {
                let mut i = rdr;
                while !stop.load(Ordering::Relaxed) {
                    let key = i % KEYS;
                    i += 1;
                    let before = finished.lock().unwrap().get(&key).cloned();
                    let path = format!("/{BUCKET}/k{key}");
                    let Ok(r) =
                        raw_request_blocking(addr, &request_bytes("GET", &path, addr, &[], b""))
                    else {
                        continue; // a cut-short response is never taken as complete
                    };
                    reads.fetch_add(1, Ordering::Relaxed);
                    if r.status == 404 {
                        continue; // deleted in between
                    }
                    assert_eq!(r.status, 200);
                    if r.body.len() != size_of(key) {
                        continue; // cut short: the harness read until close
                    }
                    let got = md5_hex(&r.body);
                    let version = started.lock().unwrap()[&key].get(&got).copied();
                    let Some(version) = version else {
                        panic!("k{key}: the body is no version ever written (mixed bytes?)");
                    };
                    // A version older than one finished before this read began is stale.
                    // (Writers count versions from different bases, so compare within a
                    // writer's series only.)
                    if let Some((v, _)) = before {
                        if version / 1_000_000 == v / 1_000_000 {
                            assert!(
                                version >= v,
                                "k{key}: v{version} served after v{v} was finished"
                            );
                        }
                    }
                }
            });
        }
        while Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        stop.store(true, Ordering::Relaxed);
    });
    let stats = server.stats().unwrap();
    let used = stats["used_bytes"].as_u64().unwrap();
    let reserved = stats["reserved_bytes"].as_u64().unwrap();
    println!(
        "stress: {} reads; hits {} misses {} bypasses {}; used {used} of {capacity}",
        reads.load(Ordering::Relaxed),
        stats["hits"],
        stats["misses"],
        stats["bypasses"]
    );
    assert!(reads.load(Ordering::Relaxed) > 100, "the readers ran");
    assert!(used + reserved <= 3 << 20, "accounting within capacity");
}
