//! A 1 GiB object streamed in and out through one node: the bytes survive (MD5 and a range
//! compared against the generator), and the server's own memory stays under 100 MiB, i.e.
//! it streams rather than buffers: its peak RSS on a cold read, its anonymous memory
//! (sampled) where hits leave from mappings of the cache file kept between hits, whose
//! page-cache pages the RSS counts too.

use std::io::{BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context, Result};
use granary_tests::{read_response_head, Pattern, RawResponse, Server, ServerOpts};
use md5::{Digest, Md5};

const SIZE: u64 = 1 << 30;
const CHUNK: usize = 1 << 20;
const PEAK_RSS_LIMIT_KIB: u64 = 100 * 1024;
const IO_TIMEOUT: Duration = Duration::from_secs(120);

fn connect(addr: SocketAddr) -> Result<TcpStream> {
    let stream = TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    Ok(stream)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// PUTs `size` bytes of `pattern` with a plain Content-Length, generated one chunk at a
/// time; returns the MD5 of what was sent and the ETag the server answered.
fn stream_put(
    addr: SocketAddr,
    path: &str,
    size: u64,
    pattern: Pattern,
) -> Result<(String, String)> {
    let mut stream = connect(addr)?;
    let head = format!(
        "PUT {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {size}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes())?;
    let mut md5 = Md5::new();
    let mut buf = vec![0u8; CHUNK];
    let mut sent = 0u64;
    let mut write_err = None;
    while sent < size {
        let n = CHUNK.min((size - sent) as usize);
        pattern.fill(sent, &mut buf[..n]);
        md5.update(&buf[..n]);
        if let Err(e) = stream.write_all(&buf[..n]) {
            write_err = Some(e);
            break;
        }
        sent += n as u64;
    }
    let mut reader = BufReader::new(stream);
    let (status, headers) = match read_response_head(&mut reader) {
        Ok(h) => h,
        Err(e) => match write_err {
            Some(w) => bail!("PUT failed after {sent} bytes: {w}; then {e:#}"),
            None => return Err(e.context("reading the PUT response")),
        },
    };
    if status != 200 {
        let mut body = String::new();
        let _ = reader.read_to_string(&mut body);
        bail!("PUT {path} answered {status} after {sent} bytes: {body}");
    }
    ensure!(
        write_err.is_none(),
        "PUT answered 200 before its body was sent"
    );
    let etag = header(&headers, "etag").context("PUT answer has no ETag")?;
    Ok((hex::encode(md5.finalize()), etag.to_string()))
}

/// What [`stream_get`] saw.
struct Download {
    headers: Vec<(String, String)>,
    len: u64,
    md5: String,
    /// Offset of the first byte that differs from the generator.
    first_diff: Option<u64>,
    /// From sending the request to holding the first body byte.
    first_byte: Duration,
    /// From sending the request to holding the last body byte.
    total: Duration,
}

/// GETs `path` and reads the body chunk by chunk, comparing it with `pattern` as it goes.
fn stream_get(addr: SocketAddr, path: &str, pattern: Pattern) -> Result<Download> {
    let mut stream = connect(addr)?;
    let head = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    let start = Instant::now();
    stream.write_all(head.as_bytes())?;
    let mut reader = BufReader::with_capacity(CHUNK, stream);
    let (status, headers) = read_response_head(&mut reader)?;
    ensure!(status == 200, "GET {path} answered {status}");
    let len: u64 = header(&headers, "content-length")
        .context("GET of an object has a Content-Length")?
        .parse()?;
    let mut md5 = Md5::new();
    let mut buf = vec![0u8; CHUNK];
    let mut want = vec![0u8; CHUNK];
    let mut got = 0u64;
    let mut first_diff = None;
    let mut first_byte = None;
    while got < len {
        let n = reader.read(&mut buf)?;
        if n == 0 {
            bail!("GET body ended after {got} of {len} bytes");
        }
        first_byte.get_or_insert_with(|| start.elapsed());
        let n = n.min((len - got) as usize);
        md5.update(&buf[..n]);
        if first_diff.is_none() {
            pattern.fill(got, &mut want[..n]);
            if let Some(i) = (0..n).find(|&i| buf[i] != want[i]) {
                first_diff = Some(got + i as u64);
            }
        }
        got += n as u64;
    }
    Ok(Download {
        headers,
        len: got,
        md5: hex::encode(md5.finalize()),
        first_diff,
        first_byte: first_byte.unwrap_or_default(),
        total: start.elapsed(),
    })
}

/// Writes `size` bytes of `pattern` to `path`, one chunk at a time; returns their MD5.
fn write_pattern_file(path: &std::path::Path, size: u64, pattern: Pattern) -> Result<String> {
    let mut file = std::io::BufWriter::with_capacity(CHUNK, std::fs::File::create(path)?);
    let mut md5 = Md5::new();
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    while done < size {
        let n = CHUNK.min((size - done) as usize);
        pattern.fill(done, &mut buf[..n]);
        md5.update(&buf[..n]);
        file.write_all(&buf[..n])?;
        done += n as u64;
    }
    file.flush()?;
    Ok(hex::encode(md5.finalize()))
}

fn get_range(addr: SocketAddr, path: &str, range: &str) -> Result<RawResponse> {
    let mut stream = connect(addr)?;
    let head = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nRange: {range}\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(head.as_bytes())?;
    let mut reader = BufReader::new(stream);
    let (status, headers) = read_response_head(&mut reader)?;
    let len: usize = header(&headers, "content-length")
        .context("ranged GET has a Content-Length")?
        .parse()?;
    ensure!(
        len <= 16 * CHUNK,
        "ranged GET of {range} answered {len} bytes"
    );
    let mut body = vec![0u8; len];
    reader.read_exact(&mut body)?;
    Ok(RawResponse {
        status,
        headers,
        body,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_gib_streams_through_in_bounded_memory() {
    let server = Server::start(ServerOpts::open()).expect("start granary");
    let resp = server.raw("PUT", "/big", &[], b"").await.unwrap();
    assert_eq!(resp.status, 200, "create bucket: {}", resp.text());
    let addr = server.addr();
    let pattern = Pattern::new(0x5eed_0f6a_1a00);
    println!(
        "server RSS peak at start: {} KiB",
        server.peak_rss_kib().unwrap()
    );

    let own = server.watch_anon();
    let start = Instant::now();
    let (sent_md5, etag) =
        tokio::task::spawn_blocking(move || stream_put(addr, "/big/blob.bin", SIZE, pattern))
            .await
            .unwrap()
            .expect("streaming PUT of 1 GiB");
    let secs = start.elapsed().as_secs_f64();
    println!("PUT 1 GiB in {secs:.1} s ({:.0} MiB/s)", 1024.0 / secs);
    assert_eq!(etag, format!("\"{sent_md5}\""), "ETag of the 1 GiB PUT");

    let down = tokio::task::spawn_blocking(move || stream_get(addr, "/big/blob.bin", pattern))
        .await
        .unwrap()
        .expect("streaming GET of 1 GiB");
    let secs = down.total.as_secs_f64();
    println!("GET 1 GiB in {secs:.1} s ({:.0} MiB/s)", 1024.0 / secs);
    assert_eq!(down.len, SIZE);
    assert_eq!(
        down.first_diff, None,
        "first byte that differs from what was PUT"
    );
    assert_eq!(down.md5, sent_md5);
    assert_eq!(header(&down.headers, "etag"), Some(etag.as_str()));

    // Ranges in the middle and at the end, compared with the generator.
    for (lo, hi) in [
        (SIZE / 2 - 12_345, SIZE / 2 + 250_000),
        (SIZE / 3, SIZE / 3),
        (SIZE - 1000, SIZE - 1),
    ] {
        let range = format!("bytes={lo}-{hi}");
        let r = range.clone();
        let resp = tokio::task::spawn_blocking(move || get_range(addr, "/big/blob.bin", &r))
            .await
            .unwrap()
            .expect("ranged GET");
        assert_eq!(resp.status, 206, "{range}");
        assert_eq!(
            resp.header("content-range"),
            Some(format!("bytes {lo}-{hi}/{SIZE}").as_str()),
            "{range}"
        );
        let want = pattern.bytes(lo, (hi - lo + 1) as usize);
        assert!(
            resp.body == want,
            "bytes of {range} differ from what was PUT"
        );
    }

    // Hits leave from mappings of the entry's file, kept between hits: their pages are
    // the page cache's, counted in the RSS (VmHWM) but not in the node's own memory.
    let peak = own.peak_kib();
    println!(
        "server peak RssAnon over 1 GiB in and out: {peak} KiB ({:.1} MiB); VmHWM {} KiB",
        peak as f64 / 1024.0,
        server.peak_rss_kib().unwrap()
    );
    assert!(peak > 0, "RssAnon was sampled");
    assert!(
        peak < PEAK_RSS_LIMIT_KIB,
        "server peak RssAnon {peak} KiB >= {PEAK_RSS_LIMIT_KIB} KiB: it buffers instead of streaming"
    );
    server.assert_healthy("1 GiB transfer").await;
}

/// A 1 GiB file dropped into the fs backend, never seen by the node: the first read
/// streams it (first byte long before the last) in bounded memory, with the object-read
/// headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_in_file_streams_in_bounded_memory() {
    let server = Server::start(ServerOpts::open()).expect("start granary");
    let resp = server.raw("PUT", "/big", &[], b"").await.unwrap();
    assert_eq!(resp.status, 200, "create bucket: {}", resp.text());
    let addr = server.addr();
    let cold = Pattern::new(0xc01d);
    let origin = server
        .data_dir()
        .join("origin")
        .join("big")
        .join("cold.bin");
    let cold_md5 = tokio::task::spawn_blocking(move || write_pattern_file(&origin, SIZE, cold))
        .await
        .unwrap()
        .expect("write the cold object into the backend");
    let down = tokio::task::spawn_blocking(move || stream_get(addr, "/big/cold.bin", cold))
        .await
        .unwrap()
        .expect("cold GET of 1 GiB");
    println!(
        "cold GET 1 GiB: first byte after {:?}, all after {:.1} s",
        down.first_byte,
        down.total.as_secs_f64()
    );
    assert_eq!(down.len, SIZE);
    assert_eq!(
        down.first_diff, None,
        "first byte of the cold read that differs"
    );
    assert_eq!(down.md5, cold_md5);

    let peak = server.peak_rss_kib().unwrap();
    println!(
        "server peak RSS (VmHWM) after a 1 GiB read of a dropped-in file: {peak} KiB ({:.1} MiB)",
        peak as f64 / 1024.0
    );
    assert!(
        peak < PEAK_RSS_LIMIT_KIB,
        "server peak RSS {peak} KiB >= {PEAK_RSS_LIMIT_KIB} KiB on a read of a dropped-in file"
    );

    assert!(
        header(&down.headers, "x-granary-node").is_some_and(|n| !n.is_empty()),
        "object reads carry x-granary-node"
    );
    assert!(
        matches!(
            header(&down.headers, "x-granary-cache"),
            Some("hit" | "miss" | "peer" | "bypass")
        ),
        "object reads say where their bytes came from"
    );
    assert!(
        down.first_byte < down.total / 4,
        "the first byte came after {:?} of {:?}: the read waited for the whole object",
        down.first_byte,
        down.total
    );
}
