//! `?archpath=MEMBER`: files out of tar shards through the real binary. A cold `.tar` is
//! scanned as it streams in (and admitted), a cached one is read through its member
//! index (`hit`); `.tar.gz`/`.tgz` are scanned; ranges apply to the member; a missing
//! member is `404 NoSuchKey`, a key that is not a shard `400 InvalidArgument`.

use std::time::Duration;

use anyhow::Result;
use granary_tests::{
    gzip, raw_request_blocking, request_bytes, tar_of, Pattern, RawResponse, Server, ServerOpts,
};

const BUCKET: &str = "shards";

/// WebDataset-like samples: `{i:06}.jpg` (sizes up to 3 MiB), `.cls`, `.json`, and one
/// member with a name longer than a tar header holds.
fn samples() -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..12u64 {
        let size = [1, 700, 100_000, 3 << 20][i as usize % 4];
        out.push((format!("{i:06}.jpg"), Pattern::new(i).bytes(0, size)));
        out.push((format!("{i:06}.cls"), format!("{}", i % 10).into_bytes()));
        out.push((
            format!("{i:06}.json"),
            format!("{{\"i\":{i}}}").into_bytes(),
        ));
    }
    out.push((
        format!("{}deep.txt", "nested/".repeat(30)),
        b"far down".to_vec(),
    ));
    out
}

fn get(server: &Server, key: &str, member: &str, headers: &[(&str, &str)]) -> RawResponse {
    let member: String = member
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let path = format!("/{BUCKET}/{key}?archpath={member}");
    let req = request_bytes("GET", &path, server.addr(), headers, b"");
    raw_request_blocking(server.addr(), &req).unwrap()
}

fn settle(server: &Server) {
    for _ in 0..200 {
        if server.stats().unwrap()["reserved_bytes"].as_u64() == Some(0) {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("fills still in flight after 5 s");
}

#[test]
fn members_of_tar_and_tgz_shards() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    let members = samples();
    let tar = tar_of(&members);
    std::fs::write(dir.join("shard-000000.tar"), &tar)?;
    std::fs::write(dir.join("shard-000001.tar.gz"), gzip(&tar))?;
    std::fs::write(dir.join("shard-000002.tgz"), gzip(&tar))?;
    std::fs::write(dir.join("notes.txt"), b"not a shard")?;
    std::fs::write(dir.join("broken.tar"), vec![0x5a; 4096])?;

    // Cold: the shard streams in and is scanned; its fill is admitted.
    let (name, data) = &members[3 * 3]; // 000003.jpg, 3 MiB
    let r = get(&server, "shard-000000.tar", name, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("x-granary-cache"), Some("miss"));
    assert!(r.body == *data, "cold member bytes");
    assert_eq!(
        r.header("content-length"),
        Some(data.len().to_string().as_str())
    );
    settle(&server);
    // Cached: every member through the index, as hits.
    for (name, data) in &members {
        let r = get(&server, "shard-000000.tar", name, &[]);
        assert_eq!(r.status, 200, "{name}: {}", r.text());
        assert_eq!(r.header("x-granary-cache"), Some("hit"), "{name}");
        assert!(r.body == *data, "{name}: bytes");
    }
    // A `./` prefix names the same member; ranges are within the member.
    let r = get(&server, "shard-000000.tar", "./000002.jpg", &[]);
    assert!(r.body == members[6].1);
    let r = get(
        &server,
        "shard-000000.tar",
        "000003.jpg",
        &[("range", "bytes=1000-1999")],
    );
    assert_eq!(r.status, 206);
    assert!(r.body == data[1000..2000]);
    assert_eq!(
        r.header("content-range"),
        Some(format!("bytes 1000-1999/{}", data.len()).as_str())
    );
    let r = get(
        &server,
        "shard-000000.tar",
        "000003.jpg",
        &[("range", "bytes=-10")],
    );
    assert!(r.body == data[data.len() - 10..]);
    // Compressed shards are scanned, every time.
    for key in ["shard-000001.tar.gz", "shard-000002.tgz"] {
        for (name, data) in members.iter().step_by(5) {
            let r = get(&server, key, name, &[]);
            assert_eq!(r.status, 200, "{key} {name}: {}", r.text());
            assert!(r.body == *data, "{key} {name}: bytes");
        }
        let r = get(&server, key, "000003.jpg", &[("range", "bytes=5-9")]);
        assert_eq!(r.status, 206);
        assert!(r.body == data[5..10]);
    }
    // Errors.
    for key in ["shard-000000.tar", "shard-000001.tar.gz"] {
        get(&server, key, "000099.jpg", &[]).assert_s3_error(404, &["NoSuchKey"]);
    }
    get(&server, "notes.txt", "x", &[]).assert_s3_error(400, &["InvalidArgument"]);
    get(&server, "shard-000000.tar", "", &[]).assert_s3_error(400, &["InvalidArgument"]);
    get(&server, "missing.tar", "x", &[]).assert_s3_error(404, &["NoSuchKey"]);
    let r = get(&server, "broken.tar", "x", &[]);
    assert!(
        r.status == 400 || r.status == 404,
        "{} {}",
        r.status,
        r.text()
    );
    get(
        &server,
        "shard-000000.tar",
        "000003.jpg",
        &[("range", "bytes=999999999-")],
    )
    .assert_s3_error(416, &["InvalidRange"]);
    // A conditional on the shard's ETag.
    let head = request_bytes(
        "HEAD",
        &format!("/{BUCKET}/shard-000000.tar"),
        server.addr(),
        &[],
        b"",
    );
    let etag = raw_request_blocking(server.addr(), &head)?
        .header("etag")
        .expect("an ETag")
        .to_owned();
    let r = get(
        &server,
        "shard-000000.tar",
        "000001.cls",
        &[("if-none-match", &etag)],
    );
    assert_eq!(r.status, 304);
    let r = get(
        &server,
        "shard-000000.tar",
        "000001.cls",
        &[("if-match", &etag)],
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"1");
    let req = request_bytes("GET", "/_granary/health", server.addr(), &[], b"");
    assert_eq!(raw_request_blocking(server.addr(), &req)?.status, 200);
    Ok(())
}

/// A cached shard's member index is built once, however many reads ask for it at once:
/// after a restart (indexes live in memory), 32 concurrent member reads of a shard of
/// 20,000 members build it one time, and every read gets its member's bytes.
#[test]
fn a_shards_index_is_built_once_for_concurrent_reads() -> Result<()> {
    let mut server = Server::start(ServerOpts::open())?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    let members: Vec<(String, Vec<u8>)> = (0..20_000u64)
        .map(|i| (format!("{i:06}.cls"), format!("{i}").into_bytes()))
        .collect();
    std::fs::write(dir.join("big.tar"), tar_of(&members))?;
    // Admitted whole, then the node restarts: the copy stays, its index does not.
    let r = get(&server, "big.tar", &members[0].0, &[]);
    assert_eq!(r.status, 200, "{}", r.text());
    settle(&server);
    server.restart(false)?;
    assert_eq!(server.stat("tar_indexes_built"), 0);
    let server = std::sync::Arc::new(server);
    let readers: Vec<_> = (0..32)
        .map(|t| {
            let (server, (name, data)) = (server.clone(), members[t * 600].clone());
            std::thread::spawn(move || {
                let r = get(&server, "big.tar", &name, &[]);
                assert_eq!((r.status, &r.body), (200, &data), "{name}");
                r.header("x-granary-cache").map(str::to_owned)
            })
        })
        .collect();
    for r in readers {
        assert_eq!(r.join().unwrap().as_deref(), Some("hit"));
    }
    assert_eq!(server.stat("tar_indexes_built"), 1);
    Ok(())
}
