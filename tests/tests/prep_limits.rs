//! Pipelines and image transforms as any reader may call them, careless or hostile,
//! through the real binary: every preparation is bounded before it is spent, counted,
//! and exact.
//! - An image of an extreme aspect whose resize would make billions of pixels is refused
//!   naming the sample, and the node lives (it aborted on the allocation).
//! - Requests cut by their clients never run more than `--prep-threads` preparations at
//!   once, the work they started is counted, and it stops once nobody waits for it.
//! - Inputs are read whole only once the prep memory budget admits them: concurrent
//!   requests for a large object keep the node's memory under the stated formula
//!   (`--prep-memory` + 1 GiB + 64 MiB x `--prep-threads`), and one that is not an image
//!   is refused from its first bytes.
//! - A JPEG whose scan was cut (an end marker appended or not) and a cut PNG are errors
//!   naming the sample, never a picture.
//! - Requests made at once for a sample that fails share one preparation and its error.
//! - `If-Match` holds on a prepared image; a shard holding a name twice keeps both copies
//!   in its prepared stream; `GET /_granary/pipelines` follows the read rule.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use granary_prep::{sample_key, Pipeline, PipelineSpec};
use granary_tests::{tar_of, untar, untar_whole, RawResponse, Server, ServerOpts};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder, RgbImage};

const BUCKET: &str = "images";

const TRAIN: &str = r#"
[pipelines.train]
members = ["jpg", "png"]
steps = [
  { op = "random_resized_crop", size = [32, 32] },
  { op = "random_flip", p = 0.5 },
]
output = "raw"

[pipelines.eval]
members = ["jpg", "png"]
steps = [{ op = "resize", shorter = 256 }, { op = "center_crop", size = [224, 224] }]
output = "raw"

[transforms.eval]
kind = "image"
resize = 256
crop = [224, 224]
format = "raw"
"#;

fn picture(w: u32, h: u32, seed: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            ((x * 255 / w.max(1)) as u8).wrapping_add(seed as u8),
            ((y * 255 / h.max(1)) as u8) ^ (x as u8),
            ((x / 7 + y / 5 + seed) % 251) as u8,
        ])
    })
}

fn jpeg(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, 90)
        .write_image(picture(w, h, seed).as_raw(), w, h, ExtendedColorType::Rgb8)
        .unwrap();
    out
}

fn png(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let mut out = Vec::new();
    PngEncoder::new(&mut out)
        .write_image(picture(w, h, seed).as_raw(), w, h, ExtendedColorType::Rgb8)
        .unwrap();
    out
}

/// Where a JPEG's first scan's data starts.
fn scan_start(jpeg: &[u8]) -> usize {
    let sos = jpeg.windows(2).position(|w| w == [0xff, 0xda]).unwrap();
    sos + 2 + usize::from(u16::from_be_bytes([jpeg[sos + 2], jpeg[sos + 3]]))
}

fn start(root: &Path, config: &str, args: &[&str]) -> Result<Server> {
    let path = root.join("granary.toml");
    std::fs::write(&path, config)?;
    let mut all = vec!["--config", path.to_str().unwrap()];
    all.extend_from_slice(args);
    Server::start(ServerOpts::open().args(&all))
}

fn origin(server: &Server) -> Result<std::path::PathBuf> {
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn get(server: &Server, path: &str) -> Result<RawResponse> {
    server.raw_blocking("GET", path, &[], b"")
}

fn stat(server: &Server, field: &str) -> u64 {
    server.stat(field)
}

/// Waits (up to a minute) for `done`.
fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(60), "never: {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn an_image_of_an_extreme_aspect_is_refused_and_the_node_lives() -> Result<()> {
    let root = tempfile::tempdir()?;
    let server = start(root.path(), TRAIN, &[])?;
    let dir = origin(&server)?;
    // 1 x 65,500: resized to a shorter side of 256 it would be 256 x 16,768,000.
    std::fs::write(dir.join("needle.jpg"), jpeg(1, 65_500, 1))?;
    std::fs::write(dir.join("flat.png"), png(8_000, 1, 2))?;
    let shard = tar_of(&[
        ("0001.jpg".into(), jpeg(64, 48, 3)),
        ("0002.jpg".into(), jpeg(1, 65_500, 4)),
    ]);
    std::fs::write(dir.join("s.tar"), shard)?;
    for (path, names) in [
        ("needle.jpg?pipeline=eval", "needle.jpg"),
        ("flat.png?pipeline=eval&seed=4", "flat.png"),
        ("needle.jpg?transform=eval", "eval"),
    ] {
        let r = get(&server, &format!("/{BUCKET}/{path}"))?;
        r.assert_s3_error(500, &["InternalError"]);
        let text = r.text();
        assert!(text.contains(names), "{path}: {text}");
        assert!(
            text.contains("more than 100000000 pixels"),
            "{path}: {text}"
        );
        assert_eq!(get(&server, "/_granary/health")?.status, 200, "{path}");
    }
    // In a shard, after a member that prepares: never a complete answer (the stream is
    // cut, before or after its head went out).
    if let Ok(r) = get(&server, &format!("/{BUCKET}/s.tar?pipeline=eval")) {
        assert!(
            r.status != 200 || untar_whole(&r.body).is_none(),
            "a complete answer"
        );
    }
    assert_eq!(get(&server, "/_granary/health")?.status, 200);
    // A sample of ordinary size still prepares.
    std::fs::write(dir.join("ok.jpg"), jpeg(300, 200, 5))?;
    let r = get(&server, &format!("/{BUCKET}/ok.jpg?pipeline=eval"))?;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.body.len(), 224 * 224 * 3);
    assert!(stat(&server, "prep_errors") >= 2);
    assert_eq!(stat(&server, "transform_errors"), 1);
    Ok(())
}

#[test]
fn cut_requests_never_run_more_than_the_prep_threads_and_their_work_is_counted() -> Result<()> {
    let root = tempfile::tempdir()?;
    let server = start(root.path(), TRAIN, &["--prep-threads", "1"])?;
    let dir = origin(&server)?;
    std::fs::write(dir.join("big.jpg"), jpeg(6_000, 4_000, 7))?;
    // Warm: the source in the cache, one whole preparation.
    let r = get(&server, &format!("/{BUCKET}/big.jpg?pipeline=train&seed=0"))?;
    assert_eq!(r.status, 200, "{}", r.text());
    let before = server.stats()?;
    let threads_before = server.proc_status("Threads:").unwrap();
    let addr = server.addr();
    // One client every 20 ms, each gone 80 ms after it asked: a few at a time, each
    // leaving while a preparation it started may still run.
    let clients: Vec<_> = (1..=80)
        .map(|seed| {
            std::thread::sleep(Duration::from_millis(20));
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(addr).unwrap();
                let req = format!(
                    "GET /{BUCKET}/big.jpg?pipeline=train&seed={seed} HTTP/1.1\r\nHost: {addr}\r\n\r\n"
                );
                s.write_all(req.as_bytes()).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(80))).unwrap();
                let mut buf = [0u8; 64];
                // Nothing comes in 80 ms: the client hangs up.
                let _ = s.read(&mut buf);
            })
        })
        .collect();
    let mut most_threads = threads_before;
    for c in clients {
        most_threads = most_threads.max(server.proc_status("Threads:").unwrap());
        c.join().unwrap();
    }
    // Every client has gone: what they started ends soon, and none is left waiting.
    wait_for("the prep threads idle", || {
        let s = server.stats().unwrap();
        s["prep_running"] == 0 && s["prep_under_way"] == 0 && s["prep_admitted_bytes"] == 0
    });
    let after = server.stats()?;
    let delta = |f: &str| after[f].as_f64().unwrap() - before[f].as_f64().unwrap();
    assert_eq!(after["prep_running_peak"], 1, "{after}");
    assert!(
        most_threads <= threads_before + 16,
        "{most_threads} threads (from {threads_before}): work outside the prep threads"
    );
    // The work they started is counted: its CPU is most of what the node spent.
    let (prep, process) = (delta("prep_cpu_seconds"), delta("process_cpu_seconds"));
    eprintln!(
        "threads {threads_before} -> at most {most_threads}; prep CPU {prep:.3} s of the node's {process:.3} s; prepared {}, stopped {}",
        delta("prep_samples"),
        delta("prep_cancelled")
    );
    assert!(prep > 0.0, "{after}");
    assert!(
        prep >= 0.5 * process,
        "prep CPU {prep:.3} s of the node's {process:.3} s: work not counted"
    );
    let ended = delta("prep_samples") + delta("prep_cancelled") + delta("prep_errors");
    assert!(ended >= 1.0, "{after}");
    assert!(
        delta("prep_cancelled") >= 1.0,
        "nothing stopped when its readers went: {after}"
    );
    assert_eq!(get(&server, "/_granary/health")?.status, 200);
    Ok(())
}

/// A 64 MiB JPEG of a 64 x 64 picture: 1,024 comment segments of 64 KiB between its
/// frame header and its scan. Its header says what preparing it takes before it is read.
fn padded_jpeg() -> Vec<u8> {
    let small = jpeg(64, 64, 9);
    let sos = small.windows(2).position(|w| w == [0xff, 0xda]).unwrap();
    let mut out = small[..sos].to_vec();
    let body = vec![b'c'; 65_533];
    for _ in 0..1_024 {
        out.extend_from_slice(&[0xff, 0xfe, 0xff, 0xff]);
        out.extend_from_slice(&body);
    }
    out.extend_from_slice(&small[sos..]);
    out
}

#[test]
fn inputs_are_read_whole_only_once_the_budget_admits_them() -> Result<()> {
    let root = tempfile::tempdir()?;
    let server = start(
        root.path(),
        TRAIN,
        &["--prep-threads", "1", "--prep-memory", "64MiB"],
    )?;
    let dir = origin(&server)?;
    let big = padded_jpeg();
    std::fs::write(dir.join("big.jpg"), &big)?;
    std::fs::write(
        dir.join("big.bin"),
        (0..64u32 << 20)
            .map(|i| (i % 253) as u8)
            .collect::<Vec<u8>>(),
    )?;
    // Both in the cache first; then the node's own memory at rest.
    for key in ["big.jpg", "big.bin"] {
        assert_eq!(get(&server, &format!("/{BUCKET}/{key}"))?.status, 200);
    }
    let stats = server.stats()?;
    let budget = stats["prep_budget_bytes"].as_u64().unwrap();
    // 4 MiB of each thread's 64 MiB is left for a resizer kept between images.
    assert_eq!(budget, (1 << 30) + (60 << 20), "1 GiB + 60 MiB x 1 thread");
    let rest = server.proc_status("RssAnon:").unwrap();
    let watch = server.watch_anon();
    let addr = server.addr();
    let run = |key: &'static str, n: u32| {
        let clients: Vec<_> = (0..n)
            .map(|seed| {
                std::thread::spawn(move || {
                    let path = format!("/{BUCKET}/{key}?pipeline=train&seed={seed}");
                    let req = granary_tests::request_bytes("GET", &path, addr, &[], b"");
                    granary_tests::raw_request_blocking(addr, &req).unwrap()
                })
            })
            .collect();
        clients
            .into_iter()
            .map(|c| c.join().unwrap())
            .collect::<Vec<_>>()
    };
    // Not an image: refused from its first bytes, never read whole.
    let served_before = stat(&server, "bytes_served");
    for r in run("big.bin", 100) {
        r.assert_s3_error(500, &["InternalError"]);
        assert!(
            r.text().contains("neither a JPEG nor a PNG"),
            "{}",
            r.text()
        );
    }
    // An image whose header is small and whose file is 64 MiB: read whole, 40 at once.
    let here = Pipeline::new(toml::from_str::<PipelineSpec>(
        r#"steps = [{ op = "random_resized_crop", size = [32, 32] }, { op = "random_flip", p = 0.5 }]
members = ["jpg", "png"]"#,
    )?)?;
    for (seed, r) in run("big.jpg", 40).into_iter().enumerate() {
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.body, here.prepare(&big, seed as u64, 0, "big.jpg")?.bytes);
    }
    let peak = watch.peak_kib();
    // README's formula: --prep-memory (64 MiB) + 1 GiB + 64 MiB x --prep-threads (1).
    let formula_kib = (64 << 10) + (1 << 20) + (64 << 10);
    // 256 KiB of a header per request, and the node's own slack (answers, buffers).
    let slack_kib = 140 * 256 + (64 << 10);
    eprintln!(
        "RssAnon at rest {rest} KiB, peak {peak} KiB; formula {formula_kib} KiB + slack {slack_kib} KiB"
    );
    assert!(
        peak.saturating_sub(rest) <= formula_kib + slack_kib,
        "the node grew by {} KiB, past --prep-memory + the prep budget ({formula_kib} KiB)",
        peak.saturating_sub(rest)
    );
    assert!(
        stat(&server, "bytes_served") - served_before < 64 << 20,
        "nothing large was sent"
    );
    Ok(())
}

#[test]
fn a_cut_jpeg_or_png_is_an_error_naming_it_never_a_picture() -> Result<()> {
    let root = tempfile::tempdir()?;
    let server = start(root.path(), TRAIN, &[])?;
    let dir = origin(&server)?;
    let whole = jpeg(480, 480, 11);
    let scan = scan_start(&whole);
    let data = whole.len() - 2 - scan;
    let mut cases: Vec<(String, Vec<u8>)> = Vec::new();
    for percent in [10, 50, 99] {
        let cut = &whole[..scan + data * percent / 100];
        cases.push((
            format!("cut{percent}-eoi.jpg"),
            [cut, &[0xff, 0xd9]].concat(),
        ));
        cases.push((format!("cut{percent}.jpg"), cut.to_vec()));
    }
    let pic = png(300, 200, 12);
    // A PNG cut inside its image data, its end chunk appended.
    let iend = &pic[pic.len() - 12..];
    cases.push((
        "cut-iend.png".into(),
        [&pic[..pic.len() / 2], iend].concat(),
    ));
    cases.push(("cut.png".into(), pic[..pic.len() / 2].to_vec()));
    for (name, bytes) in &cases {
        std::fs::write(dir.join(name), bytes)?;
        let r = get(&server, &format!("/{BUCKET}/{name}?pipeline=train&seed=1"))?;
        r.assert_s3_error(500, &["InternalError"]);
        assert!(r.text().contains(name.as_str()), "{name}: {}", r.text());
        let r = get(&server, &format!("/{BUCKET}/{name}?transform=eval"))?;
        r.assert_s3_error(500, &["InternalError"]);
    }
    // In a shard: the member is named, the answer never whole.
    let members: Vec<(String, Vec<u8>)> = vec![
        ("0001.jpg".into(), cases[0].1.clone()),
        ("0002.jpg".into(), whole.clone()),
    ];
    std::fs::write(dir.join("s.tar"), tar_of(&members))?;
    let r = get(&server, &format!("/{BUCKET}/s.tar?pipeline=train&seed=1"))?;
    r.assert_s3_error(500, &["InternalError"]);
    assert!(r.text().contains("0001"), "{}", r.text());
    // The whole ones prepare.
    std::fs::write(dir.join("whole.jpg"), &whole)?;
    std::fs::write(dir.join("whole.png"), &pic)?;
    for name in ["whole.jpg", "whole.png"] {
        let r = get(&server, &format!("/{BUCKET}/{name}?pipeline=train&seed=1"))?;
        assert_eq!(r.status, 200, "{name}: {}", r.text());
    }
    Ok(())
}

#[test]
fn requests_made_at_once_for_a_failing_sample_share_one_preparation() -> Result<()> {
    let root = tempfile::tempdir()?;
    let server = start(root.path(), TRAIN, &["--prep-threads", "1"])?;
    let dir = origin(&server)?;
    std::fs::write(dir.join("slow.jpg"), jpeg(6_000, 4_500, 13))?;
    let whole = jpeg(2_000, 1_500, 14);
    let scan = scan_start(&whole);
    let cut = [&whole[..scan + (whole.len() - scan) / 2], &[0xff, 0xd9][..]].concat();
    std::fs::write(dir.join("bad.jpg"), &cut)?;
    for key in ["slow.jpg", "bad.jpg"] {
        assert_eq!(get(&server, &format!("/{BUCKET}/{key}"))?.status, 200);
    }
    let errors = stat(&server, "prep_errors");
    let addr = server.addr();
    let ask = move |path: String| {
        std::thread::spawn(move || {
            let req = granary_tests::request_bytes("GET", &path, addr, &[], b"");
            granary_tests::raw_request_blocking(addr, &req).unwrap()
        })
    };
    // The one prep thread is busy with a large sample (27 megapixels: long enough, on a
    // loaded machine, for the thirty to arrive behind it).
    let busy = ask(format!("/{BUCKET}/slow.jpg?pipeline=train&seed=5"));
    wait_for("the prep thread busy", || {
        stat(&server, "prep_running") == 1
    });
    let waiting: Vec<_> = (0..30)
        .map(|_| ask(format!("/{BUCKET}/bad.jpg?pipeline=train&seed=6")))
        .collect();
    wait_for("thirty requests waiting", || {
        stat(&server, "prep_under_way") == 2
    });
    for w in waiting {
        let r = w.join().unwrap();
        r.assert_s3_error(500, &["InternalError"]);
        assert!(r.text().contains("bad.jpg"), "{}", r.text());
    }
    assert_eq!(busy.join().unwrap().status, 200);
    assert_eq!(
        stat(&server, "prep_errors") - errors,
        1,
        "one preparation for thirty requests"
    );
    assert_eq!(stat(&server, "prep_under_way"), 0);
    Ok(())
}

#[test]
fn if_match_holds_and_a_repeated_name_keeps_both_copies() -> Result<()> {
    let root = tempfile::tempdir()?;
    let server = start(root.path(), TRAIN, &[])?;
    let dir = origin(&server)?;
    let photo = jpeg(120, 90, 15);
    std::fs::write(dir.join("a.jpg"), &photo)?;
    let head = server.raw_blocking("HEAD", &format!("/{BUCKET}/a.jpg"), &[], b"")?;
    let etag = head.header("etag").unwrap().trim_matches('"').to_owned();
    let path = format!("/{BUCKET}/a.jpg?pipeline=train&seed=2");
    let r = server.raw_blocking("GET", &path, &[("if-match", "\"other\"")], b"")?;
    r.assert_s3_error(412, &["PreconditionFailed"]);
    let r = server.raw_blocking("GET", &path, &[("if-match", &format!("\"{etag}\""))], b"")?;
    assert_eq!(r.status, 200, "{}", r.text());

    let (first, second) = (jpeg(80, 60, 16), jpeg(60, 80, 17));
    let members: Vec<(String, Vec<u8>)> = vec![
        ("x/0001.jpg".into(), first.clone()),
        ("x/0001.cls".into(), b"3".to_vec()),
        ("x/0001.jpg".into(), second.clone()),
    ];
    std::fs::write(dir.join("twice.tar"), tar_of(&members))?;
    let r = get(
        &server,
        &format!("/{BUCKET}/twice.tar?pipeline=train&seed=4&epoch=1"),
    )?;
    assert_eq!(r.status, 200, "{}", r.text());
    let got = untar(&r.body);
    let here = Pipeline::new(toml::from_str::<PipelineSpec>(
        r#"steps = [{ op = "random_resized_crop", size = [32, 32] }, { op = "random_flip", p = 0.5 }]
members = ["jpg", "png"]"#,
    )?)?;
    let key = sample_key("twice.tar", "x/0001");
    let want = vec![
        (
            "x/0001.jpg".to_string(),
            here.prepare(&first, 4, 1, &key)?.bytes,
        ),
        ("x/0001.cls".to_string(), b"3".to_vec()),
        (
            "x/0001.jpg".to_string(),
            here.prepare(&second, 4, 1, &key)?.bytes,
        ),
    ];
    assert_eq!(got, want, "both copies, each prepared from its own bytes");
    Ok(())
}

#[test]
fn the_pipelines_list_follows_the_read_rule() -> Result<()> {
    for (anonymous, unsigned) in [(false, 403), (true, 200)] {
        let root = tempfile::tempdir()?;
        let config = root.path().join("granary.toml");
        std::fs::write(&config, TRAIN)?;
        let mut opts = ServerOpts::with_credentials().args(&["--config", config.to_str().unwrap()]);
        opts.anonymous_read = anonymous;
        let server = Server::start(opts)?;
        let r = get(&server, "/_granary/pipelines")?;
        assert_eq!(
            r.status,
            unsigned,
            "anonymous read {anonymous}: {}",
            r.text()
        );
        let signed = server.signed_blocking("GET", "/_granary/pipelines")?;
        assert_eq!(signed.status, 200, "{}", signed.text());
        let listed: serde_json::Value = serde_json::from_slice(&signed.body)?;
        assert_eq!(listed["pipelines"]["eval"]["steps"][0]["op"], "resize");
    }
    Ok(())
}
