//! On-node transforms (`?transform=NAME`) through the real binary: a built-in image
//! transform gives the bytes of the same steps run here as pipeline steps, is
//! computed once and then served from the cache, and is recomputed (never stale) when its
//! source or its definition changes; four jobs reading the same transformed shard members
//! at once run the transform once per member and read the backend once; an external
//! command that fails, hangs or floods its output gets a clear `500` within its bounds
//! and the node stays healthy.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Result;
use granary_tests::{raw_request_blocking, request_bytes, RawResponse, Server, ServerOpts};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageEncoder, RgbImage};

const BUCKET: &str = "images";

const CONFIG: &str = r#"
[transforms.thumb]
kind = "image"
resize = 32
crop = [28, 28]
format = "png"

[transforms.tensor]
kind = "image"
resize = 24
crop = [24, 24]
format = "raw"

[transforms.tensor-all]
kind = "image"
resize = 24
crop = [24, 24]
format = "raw"
members = ["png"]

[transforms.small-jpeg]
kind = "image"
resize = 40
format = "jpeg"
quality = 80

[transforms.upper]
kind = "exec"
command = ["tr", "a-z", "A-Z"]

[transforms.fails]
kind = "exec"
command = ["sh", "-c", "echo 'cannot parse the sample' >&2; exit 3"]

[transforms.hangs]
kind = "exec"
command = ["sleep", "60"]
timeout_secs = 1.0

[transforms.floods]
kind = "exec"
command = ["yes"]
max_output = 1048576
"#;

/// A `w`×`h` picture with some structure (gradients and a disc), deterministic.
fn picture(w: u32, h: u32, seed: u32) -> RgbImage {
    RgbImage::from_fn(w, h, |x, y| {
        let (cx, cy) = (w as i64 / 2, h as i64 / 2);
        let d = (x as i64 - cx).pow(2) + (y as i64 - cy).pow(2);
        let disc = if d < (w.min(h) as i64 / 3).pow(2) {
            90
        } else {
            0
        };
        image::Rgb([
            ((x * 255 / w) as u8).wrapping_add(seed as u8),
            ((y * 255 / h) as u8).wrapping_add(disc),
            ((x + y + seed) % 256) as u8,
        ])
    })
}

fn jpeg(img: &RgbImage) -> Vec<u8> {
    encoded(img, "jpeg", 92)
}

fn png(img: &RgbImage) -> Vec<u8> {
    encoded(img, "png", 0)
}

/// `img` as `png`, `jpeg` (at quality `q`) or raw RGB bytes, with the image crate.
fn encoded(img: &RgbImage, format: &str, q: u8) -> Vec<u8> {
    let (w, h) = img.dimensions();
    let mut out = Vec::new();
    match format {
        "png" => PngEncoder::new(&mut out)
            .write_image(img.as_raw(), w, h, ExtendedColorType::Rgb8)
            .unwrap(),
        "jpeg" => JpegEncoder::new_with_quality(&mut out, q)
            .write_image(img.as_raw(), w, h, ExtendedColorType::Rgb8)
            .unwrap(),
        _ => out = img.as_raw().clone(),
    }
    out
}

/// The documented steps of the image transform (a pipeline of resize and center crop,
/// `crop = [height, width]`), run here with the node's own code.
fn direct(
    input: &[u8],
    resize: Option<u32>,
    crop: Option<[u32; 2]>,
    format: &str,
    q: u8,
) -> Vec<u8> {
    let mut steps = Vec::new();
    if let Some(shorter) = resize {
        steps.push(serde_json::json!({"op": "resize", "shorter": shorter}));
    }
    if let Some(size) = crop {
        steps.push(serde_json::json!({"op": "center_crop", "size": size}));
    }
    let quality = if q == 0 { 90 } else { q };
    let spec = serde_json::json!({"steps": steps, "output": format, "quality": quality});
    let spec: granary_prep::PipelineSpec = serde_json::from_value(spec).unwrap();
    granary_prep::Pipeline::conversion(spec)
        .unwrap()
        .prepare(input, 0, 0, "")
        .unwrap()
        .bytes
}

fn start(root: &Path, config: &str) -> Result<Server> {
    let path = root.join("granary.toml");
    std::fs::write(&path, config)?;
    Server::start(ServerOpts::open().args(&["--config", path.to_str().unwrap()]))
}

fn get(server: &Server, path: &str) -> RawResponse {
    raw_request_blocking(
        server.addr(),
        &request_bytes("GET", path, server.addr(), &[], b""),
    )
    .unwrap()
}

fn stat(server: &Server, field: &str) -> u64 {
    server.stats().unwrap()[field].as_u64().unwrap()
}

fn settle(server: &Server) {
    for _ in 0..400 {
        if stat(server, "reserved_bytes") == 0 {
            return;
        }
        std::thread::sleep(Duration::from_millis(25));
    }
    panic!("fills still in flight after 10 s");
}

#[test]
fn image_results_equal_the_pipeline_steps_are_cached_and_never_stale() -> Result<()> {
    let root = tempfile::tempdir()?;
    let server = start(root.path(), CONFIG)?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    let photo = jpeg(&picture(97, 64, 1));
    let drawing = png(&picture(50, 80, 2));
    std::fs::write(dir.join("photo.jpg"), &photo)?;
    std::fs::write(dir.join("drawing.png"), &drawing)?;

    let cases = [
        (
            "photo.jpg",
            &photo,
            "thumb",
            direct(&photo, Some(32), Some([28, 28]), "png", 0),
            "image/png",
        ),
        (
            "photo.jpg",
            &photo,
            "tensor",
            direct(&photo, Some(24), Some([24, 24]), "raw", 0),
            "application/octet-stream",
        ),
        (
            "drawing.png",
            &drawing,
            "small-jpeg",
            direct(&drawing, Some(40), None, "jpeg", 80),
            "image/jpeg",
        ),
        (
            "drawing.png",
            &drawing,
            "thumb",
            direct(&drawing, Some(32), Some([28, 28]), "png", 0),
            "image/png",
        ),
    ];
    for (key, _, t, want, ctype) in &cases {
        let r = get(&server, &format!("/{BUCKET}/{key}?transform={t}"));
        assert_eq!(r.status, 200, "{key} {t}: {}", r.text());
        assert!(
            r.body == *want,
            "{key} {t}: bytes differ from the library's steps"
        );
        assert_eq!(r.header("content-type"), Some(*ctype));
        assert_eq!(r.header("x-granary-cache"), Some("miss"));
        assert_eq!(r.header("x-granary-transform"), Some(*t));
    }
    assert_eq!(cases[1].3.len(), 24 * 24 * 3, "raw is uint8 HWC");
    assert_eq!(stat(&server, "transforms_run"), 4);
    settle(&server);
    // Again: every result from the cache, nothing computed.
    for (key, _, t, want, _) in &cases {
        let r = get(&server, &format!("/{BUCKET}/{key}?transform={t}"));
        assert!(r.body == *want);
        assert_eq!(r.header("x-granary-cache"), Some("hit"), "{key} {t}");
    }
    assert_eq!(stat(&server, "transforms_run"), 4);
    assert_eq!(stat(&server, "transform_hits"), 4);
    // A range of a result.
    let r = raw_request_blocking(
        server.addr(),
        &request_bytes(
            "GET",
            &format!("/{BUCKET}/photo.jpg?transform=tensor"),
            server.addr(),
            &[("range", "bytes=100-199")],
            b"",
        ),
    )?;
    assert_eq!(r.status, 206);
    assert!(r.body == cases[1].3[100..200]);

    // A new version of the source: a new result, never the old one.
    let photo2 = jpeg(&picture(97, 64, 77));
    let s3 = server.s3_client();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(
        s3.put_object()
            .bucket(BUCKET)
            .key("photo.jpg")
            .body(photo2.clone().into())
            .send(),
    )?;
    let r = get(&server, &format!("/{BUCKET}/photo.jpg?transform=thumb"));
    let want2 = direct(&photo2, Some(32), Some([28, 28]), "png", 0);
    assert_ne!(want2, cases[0].3);
    assert!(r.body == want2, "the result follows the new source");
    assert_eq!(stat(&server, "transforms_run"), 5);

    // Unknown transform: 400.
    get(&server, &format!("/{BUCKET}/photo.jpg?transform=nope"))
        .assert_s3_error(400, &["InvalidArgument"]);
    // Not an image: a clear 500, counted.
    std::fs::write(dir.join("notes.txt"), b"not a picture")?;
    let r = get(&server, &format!("/{BUCKET}/notes.txt?transform=thumb"));
    r.assert_s3_error(500, &["InternalError"]);
    assert!(r.text().contains("thumb"), "{}", r.text());
    assert_eq!(stat(&server, "transform_errors"), 1);
    drop(server);

    // A changed definition: the same URL, a new result.
    let changed = CONFIG.replace("resize = 32", "resize = 30");
    let server = start(root.path(), &changed)?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("photo.jpg"), &photo)?;
    let r = get(&server, &format!("/{BUCKET}/photo.jpg?transform=thumb"));
    assert!(r.body == direct(&photo, Some(30), Some([28, 28]), "png", 0));
    Ok(())
}

#[test]
fn four_jobs_on_one_transformed_shard_run_each_member_once_and_read_the_backend_once() -> Result<()>
{
    let root = tempfile::tempdir()?;
    let server = start(root.path(), CONFIG)?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    let mut b = tar::Builder::new(Vec::new());
    let mut members = Vec::new();
    for i in 0..8u32 {
        let img = png(&picture(60 + i, 48 + 2 * i, i));
        let name = format!("{i:06}.png");
        let mut h = tar::Header::new_gnu();
        h.set_size(img.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, &name, img.as_slice())?;
        let cls = format!("{}", i % 3);
        let mut h = tar::Header::new_gnu();
        h.set_size(cls.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, format!("{i:06}.cls"), cls.as_bytes())?;
        members.push((name, direct(&img, Some(24), Some([24, 24]), "raw", 0)));
    }
    let shard = b.into_inner()?;
    std::fs::write(dir.join("shard-000000.tar"), &shard)?;

    let addr = server.addr();
    let jobs: Vec<_> = (0..4)
        .map(|job| {
            let members = members.clone();
            std::thread::spawn(move || {
                // Each job walks the members in its own order.
                for k in 0..members.len() {
                    let (name, want) = &members[(k * 3 + job * 5) % members.len()];
                    let path =
                        format!("/{BUCKET}/shard-000000.tar?archpath={name}&transform=tensor");
                    let r =
                        raw_request_blocking(addr, &request_bytes("GET", &path, addr, &[], b""))
                            .unwrap();
                    assert_eq!(r.status, 200, "{name}: {}", r.text());
                    assert!(r.body == *want, "job {job}, {name}: bytes");
                }
            })
        })
        .collect();
    for j in jobs {
        j.join().expect("a job panicked");
    }
    assert_eq!(stat(&server, "transforms_run"), 8, "one run per member");
    assert_eq!(
        stat(&server, "bytes_from_backend"),
        shard.len() as u64,
        "the shard is read from the backend once"
    );
    settle(&server);
    // Transformed members in a batch: from the cache.
    let items: Vec<_> = members
        .iter()
        .map(|(n, _)| serde_json::json!({"bucket": BUCKET, "key": "shard-000000.tar", "archpath": n}))
        .collect();
    let body = serde_json::Value::Array(items).to_string();
    let r = raw_request_blocking(
        addr,
        &request_bytes(
            "POST",
            "/_granary/batch?transform=tensor",
            addr,
            &[],
            body.as_bytes(),
        ),
    )?;
    assert_eq!(r.status, 200, "{}", r.text());
    let mut ar = tar::Archive::new(&r.body[..]);
    let mut n = 0;
    for (e, (name, want)) in ar.entries()?.zip(&members) {
        let mut e = e?;
        assert_eq!(
            e.path_bytes().as_ref(),
            format!("shard-000000.tar/{name}").as_bytes()
        );
        let mut data = Vec::new();
        std::io::Read::read_to_end(&mut e, &mut data)?;
        assert!(data == *want);
        n += 1;
    }
    assert_eq!(n, members.len());
    assert_eq!(
        stat(&server, "transforms_run"),
        8,
        "the batch was served from results"
    );
    // The whole shard, its .png members transformed and the others as they are.
    let whole = format!("/{BUCKET}/shard-000000.tar?transform=tensor-all");
    for pass in 0..2 {
        let r = get(&server, &whole);
        assert_eq!(r.status, 200, "{}", r.text());
        assert_eq!(r.header("content-type"), Some("application/x-tar"));
        let mut ar = tar::Archive::new(&r.body[..]);
        let mut got = Vec::new();
        for e in ar.entries()? {
            let mut e = e?;
            let name = String::from_utf8(e.path_bytes().into_owned())?;
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data)?;
            got.push((name, data));
        }
        assert_eq!(got.len(), 16, "every member, in order");
        for (i, (name, want)) in members.iter().enumerate() {
            assert_eq!(got[2 * i].0, *name);
            assert!(got[2 * i].1 == *want, "{name}: transformed bytes");
            assert_eq!(got[2 * i + 1].0, format!("{i:06}.cls"));
            assert_eq!(got[2 * i + 1].1, format!("{}", i % 3).into_bytes());
        }
        assert_eq!(
            stat(&server, "transforms_run"),
            16,
            "pass {pass}: 8 more runs the first time (another definition), none after"
        );
        settle(&server);
    }
    let cpu = server.stats()?["transform_cpu_seconds"].as_f64().unwrap();
    assert!(cpu > 0.0, "transform CPU time is counted: {cpu}");
    Ok(())
}

#[test]
fn commands_that_fail_hang_or_flood_get_a_clear_error_in_bounds() -> Result<()> {
    let root = tempfile::tempdir()?;
    let server = start(root.path(), CONFIG)?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("text.txt"), b"shout this")?;

    let r = get(&server, &format!("/{BUCKET}/text.txt?transform=upper"));
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.body, b"SHOUT THIS");

    for (t, says, bound) in [
        ("fails", "cannot parse the sample", Duration::from_secs(5)),
        ("hangs", "limit", Duration::from_secs(5)),
        ("floods", "more than 1048576 bytes", Duration::from_secs(5)),
    ] {
        let started = Instant::now();
        let r = get(&server, &format!("/{BUCKET}/text.txt?transform={t}"));
        let took = started.elapsed();
        r.assert_s3_error(500, &["InternalError"]);
        assert!(r.text().contains(says), "{t}: {}", r.text());
        assert!(took < bound, "{t} took {took:?}");
        // The node still serves.
        let ok = get(&server, &format!("/{BUCKET}/text.txt"));
        assert_eq!(ok.body, b"shout this");
    }
    assert_eq!(stat(&server, "transform_errors"), 3);
    // A failed result is not cached: asking again runs the command again.
    let r = get(&server, &format!("/{BUCKET}/text.txt?transform=fails"));
    r.assert_s3_error(500, &["InternalError"]);
    assert_eq!(stat(&server, "transform_errors"), 4);
    Ok(())
}
