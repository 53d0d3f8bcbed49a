//! A node over a real S3 server (moto) behind a fault-injecting proxy: throttling and
//! server errors are retried; a store that keeps failing is an error to the client, never
//! a body; a body cut by a reset or ended before its length is resumed from where it
//! broke (pinned to the same version), and when it cannot be, the client's answer is cut
//! short too — never a complete-looking 200 — and nothing is committed to the cache; a
//! block damaged in a fill's temp file is never sent.
//! Also the load limits: `--max-requests` answers `503 SlowDown` beyond it (health
//! probes still pass), `--max-backend-fetches` refuses reads that wait too long for a
//! place, and `--idle-timeout` closes connections that make no progress.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use granary_client::Client;
use granary_tests::{Fault, FaultProxy, Moto, Pattern, Server, ServerOpts};

const BUCKET: &str = "faulty";

/// moto with `objects` uploaded directly, a proxy before it, and a node over the proxy.
struct Rig {
    _moto: Moto,
    proxy: FaultProxy,
    node: Server,
}

fn rig(objects: &[(&str, usize)], extra: &[&str]) -> Result<Rig> {
    let moto = Moto::start()?;
    let rt = tokio::runtime::Runtime::new()?;
    let s3 = moto.client();
    rt.block_on(async {
        s3.create_bucket().bucket(BUCKET).send().await?;
        for (i, (key, size)) in objects.iter().enumerate() {
            let body = Pattern::new(i as u64).bytes(0, *size);
            s3.put_object()
                .bucket(BUCKET)
                .key(*key)
                .body(body.into())
                .send()
                .await?;
        }
        anyhow::Ok(())
    })?;
    let proxy = FaultProxy::start(moto.addr())?;
    let node = Server::start(ServerOpts::s3_backend(&proxy.url()).args(extra))?;
    Ok(Rig {
        _moto: moto,
        proxy,
        node,
    })
}

fn expected(i: usize, size: usize) -> Vec<u8> {
    Pattern::new(i as u64).bytes(0, size)
}

/// A GET over a fresh connection: status, `x-granary-cache`, the body as far as it came,
/// and whether it came whole (as long as its `Content-Length`).
struct Got {
    status: u16,
    cache: Option<String>,
    body: Vec<u8>,
    whole: bool,
}

fn get(node: &Server, key: &str) -> Result<Got> {
    let mut s = TcpStream::connect(node.addr())?;
    s.set_read_timeout(Some(Duration::from_secs(60)))?;
    write!(
        s,
        "GET /{BUCKET}/{key} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"
    )?;
    let mut r = std::io::BufReader::new(s);
    let (status, headers) = granary_tests::read_response_head(&mut r)?;
    let header = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let len: Option<usize> = header("content-length").and_then(|v| v.parse().ok());
    let mut body = Vec::new();
    // A reset or an early close ends the read; what came is what counts.
    let _ = r.read_to_end(&mut body);
    let whole = len == Some(body.len());
    Ok(Got {
        status,
        cache: header("x-granary-cache"),
        body,
        whole,
    })
}

/// GETs `key` until the node answers from its cache (a fill commits just after its last
/// byte is sent); every answer must be whole.
fn get_hit(node: &Server, key: &str) -> Result<Got> {
    for _ in 0..100 {
        let got = get(node, key)?;
        assert_eq!((got.status, got.whole), (200, true), "{key}");
        if got.cache.as_deref() == Some("hit") {
            return Ok(got);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::bail!("{key} never became a cache hit")
}

#[test]
fn throttling_and_server_errors_from_the_store_are_retried() -> Result<()> {
    let rig = rig(&[("a.bin", 300_000), ("b.bin", 300_000)], &[])?;
    rig.proxy.inject(Fault::Status(503), 2);
    let got = get(&rig.node, "a.bin")?;
    assert_eq!((got.status, got.whole), (200, true));
    assert_eq!(got.body, expected(0, 300_000));
    assert_eq!(
        rig.proxy.spoiled(),
        2,
        "both throttled answers were seen and retried"
    );
    rig.proxy.inject(Fault::Status(500), 2);
    let got = get(&rig.node, "b.bin")?;
    assert_eq!((got.status, got.whole), (200, true));
    assert_eq!(got.body, expected(1, 300_000));
    assert_eq!(rig.proxy.spoiled(), 4);
    get_hit(&rig.node, "a.bin")?;
    Ok(())
}

#[test]
fn a_store_that_keeps_failing_is_an_error_and_nothing_is_cached() -> Result<()> {
    let rig = rig(&[("a.bin", 200_000)], &[])?;
    rig.proxy.inject(Fault::Status(500), 1000);
    let got = get(&rig.node, "a.bin")?;
    assert!(got.status >= 500, "status {}", got.status);
    assert!(
        String::from_utf8_lossy(&got.body).contains("<Code>"),
        "an S3 error document"
    );
    rig.proxy.inject(Fault::None, 0);
    let got = get(&rig.node, "a.bin")?;
    assert_eq!((got.status, got.cache.as_deref()), (200, Some("miss")));
    assert_eq!(got.body, expected(0, 200_000));
    assert_eq!(get_hit(&rig.node, "a.bin")?.body, expected(0, 200_000));
    Ok(())
}

#[test]
fn bodies_cut_short_are_resumed_from_where_they_broke() -> Result<()> {
    let size = 3 << 20;
    let rig = rig(&[("reset.bin", size), ("short.bin", size)], &[])?;
    for (i, key, fault) in [
        (0, "reset.bin", Fault::ResetAfter(1 << 20)),
        (1, "short.bin", Fault::ShortBy(1000)),
    ] {
        // The first GET breaks; the resumed one (a range of the rest) goes through.
        rig.proxy.inject(fault, 1);
        let before = rig.proxy.gets();
        let got = get(&rig.node, key)?;
        assert_eq!((got.status, got.whole), (200, true), "{key}");
        assert!(got.body == expected(i, size), "{key}: bytes differ");
        assert_eq!(rig.proxy.gets() - before, 2, "{key}: one resume");
        let again = get_hit(&rig.node, key)?;
        assert!(
            again.body == expected(i, size),
            "{key}: cached bytes differ"
        );
    }
    Ok(())
}

#[test]
fn a_body_that_keeps_breaking_is_cut_short_for_the_client_and_not_cached() -> Result<()> {
    let size = 3 << 20;
    let rig = rig(&[("cut.bin", size)], &[])?;
    // Every answer breaks a fifth of the object in: the first GET and each resume. (At a
    // quarter, the third resume's answer, the last quarter, could arrive whole before its
    // reset, and the read then rightly completes.)
    rig.proxy.inject(Fault::ResetAfter(size / 5), 100);
    let got = get(&rig.node, "cut.bin")?;
    assert!(
        got.status != 200 || !got.whole,
        "a broken read looked complete: {} bytes of {size}",
        got.body.len()
    );
    assert!(got.body.len() < size);
    let prefix = &expected(0, size)[..got.body.len().min(size)];
    if got.status == 200 {
        assert!(got.body == prefix, "the bytes that came are the object's");
    }
    rig.proxy.inject(Fault::None, 0);
    let got = get(&rig.node, "cut.bin")?;
    assert_eq!((got.status, got.whole), (200, true));
    assert_eq!(got.cache.as_deref(), Some("miss"), "nothing was committed");
    assert!(got.body == expected(0, size));
    Ok(())
}

/// A block damaged in a fill's temp file while the fill runs is never sent: a reader
/// that joins late (reading the first bytes back from the temp file, checked against
/// the checksums of what the store sent) stops before it; the reader close behind the
/// writer gets every byte, from memory; and the fill is not committed.
#[test]
fn a_block_damaged_in_a_fills_temp_file_is_never_sent() -> Result<()> {
    use std::os::unix::fs::FileExt;
    let size = 12 << 20;
    let rig = rig(&[("slow.bin", size)], &[])?;
    let want = expected(0, size);
    // A 3-second fill.
    rig.proxy.inject(Fault::Throttle(4 << 20), 1);
    let node = &rig.node;
    std::thread::scope(|s| -> Result<()> {
        let leader = s.spawn(|| get(node, "slow.bin"));
        let tmp = node.data_dir().join("cache").join("tmp");
        let deadline = Instant::now() + Duration::from_secs(20);
        let temp = loop {
            let found = std::fs::read_dir(&tmp)?
                .flatten()
                .map(|e| e.path())
                .find(|p| std::fs::metadata(p).is_ok_and(|m| m.len() >= 4 << 20));
            if let Some(p) = found {
                break p;
            }
            anyhow::ensure!(Instant::now() < deadline, "the fill never reached 4 MiB");
            std::thread::sleep(Duration::from_millis(20));
        };
        // Damage a byte of the second block in place, as the disk might.
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&temp)?;
        let mut byte = [0u8; 1];
        f.read_exact_at(&mut byte, 100_000)?;
        f.write_all_at(&[byte[0] ^ 0xff], 100_000)?;
        // Closed before the head (nothing was sent), or cut short before the block.
        if let Ok(late) = get(node, "slow.bin") {
            assert!(!late.whole, "a late reader got {} bytes", late.body.len());
            assert!(late.body.len() < 2 << 16, "never past the damaged block");
            assert!(
                late.body == want[..late.body.len()],
                "only the object's bytes"
            );
        }
        let first = leader
            .join()
            .expect("leader")
            .context("the leader's read")?;
        assert_eq!((first.status, first.whole), (200, true));
        assert!(
            first.body == want,
            "the reader behind the writer got every byte"
        );
        Ok(())
    })?;
    // Nothing was committed: once the fill has ended, the next whole read is a miss.
    rig.proxy.inject(Fault::None, 0);
    for _ in 0..100 {
        // A read that joins the damaged fill before it ends is cut like the late one.
        let Ok(got) = get(node, "slow.bin") else {
            std::thread::sleep(Duration::from_millis(50));
            continue;
        };
        if got.whole {
            assert_eq!(
                got.cache.as_deref(),
                Some("miss"),
                "the damaged fill was not kept"
            );
            assert!(got.body == want);
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    anyhow::bail!("no whole read after the damaged fill")
}

#[test]
fn a_slow_store_is_waited_for() -> Result<()> {
    let rig = rig(&[("slow.bin", 100_000)], &[])?;
    rig.proxy
        .inject(Fault::Delay(Duration::from_millis(1500)), 1);
    let started = Instant::now();
    let got = get(&rig.node, "slow.bin")?;
    assert!(started.elapsed() >= Duration::from_millis(1500));
    assert_eq!((got.status, got.whole), (200, true));
    assert_eq!(got.body, expected(0, 100_000));
    Ok(())
}

#[test]
fn backend_reads_beyond_the_cap_slow_down() -> Result<()> {
    let rig = rig(
        &[("one.bin", 100_000), ("two.bin", 100_000)],
        &["--max-backend-fetches", "1"],
    )?;
    // The first cold read holds the only place for 4 s; the second waits 2 s and is refused.
    rig.proxy.inject(Fault::Delay(Duration::from_secs(4)), 1);
    let node = &rig.node;
    let slow = std::thread::scope(|s| -> Result<(Got, Got)> {
        let first = s.spawn(|| get(node, "one.bin"));
        std::thread::sleep(Duration::from_millis(500));
        let second = get(node, "two.bin")?;
        Ok((first.join().expect("first GET")?, second))
    })?;
    let (first, second) = slow;
    assert_eq!((first.status, first.whole), (200, true));
    assert_eq!(second.status, 503);
    assert!(String::from_utf8_lossy(&second.body).contains("<Code>SlowDown</Code>"));
    // Once the place is free, the same read goes through.
    let got = get(node, "two.bin")?;
    assert_eq!((got.status, got.whole), (200, true));
    assert_eq!(got.body, expected(1, 100_000));
    Ok(())
}

#[test]
fn requests_beyond_the_limit_slow_down_and_health_still_answers() -> Result<()> {
    let node = Server::start(ServerOpts::open().args(&["--max-requests", "2"]))?;
    let mut c = Client::new(&node.url())?;
    c.create_bucket(BUCKET)?;
    let big = Pattern::new(9).bytes(0, 32 << 20);
    c.put_bytes(BUCKET, "big.bin", &big)?;
    // Two readers that stop reading hold both places (their answers wait on them).
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut s = TcpStream::connect(node.addr())?;
        write!(s, "GET /{BUCKET}/big.bin HTTP/1.1\r\nhost: x\r\n\r\n")?;
        let mut first = [0u8; 64];
        s.read_exact(&mut first)?;
        held.push(s);
    }
    let e = c.get(BUCKET, "big.bin").unwrap_err();
    assert_eq!((e.status(), e.code()), (Some(503), Some("SlowDown")), "{e}");
    assert_eq!(c.health()?["status"], "ok");
    assert!(node.stats()?["slowdowns"].as_u64() >= Some(1));
    drop(held);
    // The places come back when those answers end.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match c.get(BUCKET, "big.bin") {
            Ok(bytes) => {
                assert!(bytes == big);
                break;
            }
            Err(e) if e.code() == Some("SlowDown") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[test]
fn connections_without_progress_are_closed() -> Result<()> {
    let node = Server::start(ServerOpts::open().args(&["--idle-timeout", "1s"]))?;
    // Silent after connecting; and a head sent in part, then nothing.
    for partial in [&b""[..], &b"GET /_granary/health HTTP/1.1\r\nhost:"[..]] {
        let mut s = TcpStream::connect(node.addr())?;
        s.set_read_timeout(Some(Duration::from_secs(10)))?;
        s.write_all(partial)?;
        let started = Instant::now();
        let mut buf = [0u8; 64];
        let n = s.read(&mut buf).unwrap_or(0);
        assert_eq!(n, 0, "the node closed the connection");
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(900) && waited < Duration::from_secs(8),
            "closed after {waited:?}"
        );
    }
    // A connection that keeps asking stays open past the timeout.
    let mut c = Client::new(&node.url())?;
    for _ in 0..6 {
        assert_eq!(c.health()?["status"], "ok");
        std::thread::sleep(Duration::from_millis(400));
    }
    Ok(())
}
