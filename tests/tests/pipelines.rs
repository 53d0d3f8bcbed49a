//! Pipelines (`?pipeline=NAME&seed=S&epoch=E`) through the real binary: an image and a
//! `.tar` shard's members come out as `granary_prep` makes them here (the client's code,
//! so a sample prepared on the node and in the client is the same bytes), the same for
//! the same (seed, epoch), after a restart too, and other for another; jobs reading one
//! epoch share each preparation, and a plan naming the pipeline has its samples prepared
//! ahead of its reads; members the pipeline does not take pass
//! as they are, in tar order; a damaged image is a `500` naming it before the first byte
//! and a cut stream after it; an unknown pipeline is `400`; a definition that cannot run
//! stops the node at start, naming its line.

use std::path::Path;

use anyhow::Result;
use granary_prep::{sample_key, Pipeline, PipelineSpec};
use granary_tests::{tar_of, untar, untar_whole, RawResponse, Server, ServerOpts};
use image::codecs::jpeg::JpegEncoder;
use image::{ExtendedColorType, ImageEncoder, RgbImage};

const BUCKET: &str = "images";

const PIPELINE: &str = r#"
members = ["jpg"]
steps = [
  { op = "random_resized_crop", size = [48, 64], scale = [0.08, 1.0], ratio = [0.75, 1.3333] },
  { op = "random_flip", p = 0.5 },
]
output = "raw"
"#;

fn jpeg(w: u32, h: u32, seed: u32) -> Vec<u8> {
    let img = RgbImage::from_fn(w, h, |x, y| {
        image::Rgb([
            ((x * 255 / w) as u8).wrapping_add(seed as u8),
            (y * 255 / h) as u8,
            ((x ^ y) + seed) as u8,
        ])
    });
    let mut out = Vec::new();
    JpegEncoder::new_with_quality(&mut out, 90)
        .write_image(img.as_raw(), w, h, ExtendedColorType::Rgb8)
        .unwrap();
    out
}

fn get(server: &Server, path: &str) -> Result<RawResponse> {
    server.raw_blocking("GET", path, &[], b"")
}

fn start(root: &Path, pipelines: &str) -> Result<Server> {
    let path = root.join("granary.toml");
    std::fs::write(&path, pipelines)?;
    Server::start(ServerOpts::open().args(&["--config", path.to_str().unwrap()]))
}

#[test]
fn images_and_shards_are_prepared_as_the_client_prepares_them() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut server = start(dir.path(), &format!("[pipelines.train]\n{PIPELINE}"))?;
    let origin = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(origin.join("shards"))?;
    let photo = jpeg(300, 200, 1);
    std::fs::write(origin.join("a.jpg"), &photo)?;
    let samples: Vec<(String, Vec<u8>)> = (0..4)
        .map(|i| (format!("x/{i:04}"), jpeg(120 + 40 * i, 90 + 30 * i, i)))
        .collect();
    let mut members: Vec<(String, Vec<u8>)> = Vec::new();
    for (key, img) in &samples {
        members.push((format!("{key}.jpg"), img.clone()));
        members.push((format!("{key}.cls"), key.as_bytes().to_vec()));
    }
    std::fs::write(origin.join("shards/s0.tar"), tar_of(&members))?;
    let spec: PipelineSpec = toml::from_str(PIPELINE)?;
    let here = Pipeline::new(spec)?;

    let listed: serde_json::Value =
        serde_json::from_slice(&get(&server, "/_granary/pipelines")?.body)?;
    assert_eq!(
        listed["pipelines"]["train"]["steps"][0]["op"],
        "random_resized_crop"
    );
    assert_eq!(listed["pipelines"]["train"]["output"], "raw");

    // One image: H x W x 3 raw bytes, as the client's code makes them.
    let resp = get(
        &server,
        &format!("/{BUCKET}/a.jpg?pipeline=train&seed=3&epoch=1"),
    )?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(resp.body.len(), 48 * 64 * 3);
    assert_eq!(resp.body, here.prepare(&photo, 3, 1, "a.jpg")?.bytes);
    let again = get(
        &server,
        &format!("/{BUCKET}/a.jpg?pipeline=train&seed=3&epoch=1"),
    )?;
    assert_eq!(again.body, resp.body);
    let other = get(
        &server,
        &format!("/{BUCKET}/a.jpg?pipeline=train&seed=3&epoch=2"),
    )?;
    assert_eq!(other.body.len(), resp.body.len());
    assert_ne!(other.body, resp.body, "another epoch draws another crop");

    // A shard: every member in tar order, the images prepared for their sample.
    let resp = get(
        &server,
        &format!("/{BUCKET}/shards/s0.tar?pipeline=train&seed=9&epoch=4"),
    )?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let got = untar(&resp.body);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    let want: Vec<&str> = members.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, want);
    for ((name, data), (_, source)) in got.iter().zip(&members) {
        match name.strip_suffix(".jpg") {
            Some(sample) => {
                let key = sample_key("shards/s0.tar", sample);
                assert_eq!(data, &here.prepare(source, 9, 4, &key)?.bytes, "{name}");
            }
            None => assert_eq!(data, source, "{name} passes as it is"),
        }
    }
    // a.jpg twice for epoch 1 (the second kept from the first), once for epoch 2, and
    // the shard's four images.
    let stats = server.stats()?;
    assert_eq!(stats["prep_samples"], 6, "{stats}");
    assert_eq!(stats["prep_shared"], 1, "{stats}");
    assert!(stats["prep_cpu_seconds"].as_f64().unwrap() > 0.0, "{stats}");

    // After a crash and a restart nothing is kept, and the same request makes the same
    // bytes again.
    server.kill_and_restart()?;
    let again = get(
        &server,
        &format!("/{BUCKET}/shards/s0.tar?pipeline=train&seed=9&epoch=4"),
    )?;
    assert_eq!(untar(&again.body), got);
    assert_eq!(server.stats()?["prep_samples"], 4, "made again, not kept");

    // What cannot be prepared is never a complete answer.
    std::fs::write(origin.join("bad.jpg"), &photo[..photo.len() / 2])?;
    let resp = get(&server, &format!("/{BUCKET}/bad.jpg?pipeline=train&seed=3"))?;
    resp.assert_s3_error(500, &["InternalError"]);
    assert!(resp.text().contains("bad.jpg"), "{}", resp.text());
    let cut = &samples[0].1[..samples[0].1.len() / 2];
    for (shard, broken) in [("first.tar", 0), ("later.tar", 4)] {
        let mut damaged = members.clone();
        damaged[broken].1 = cut.to_vec();
        std::fs::write(origin.join("shards").join(shard), tar_of(&damaged))?;
        let path = format!("/{BUCKET}/shards/{shard}?pipeline=train&seed=3");
        match get(&server, &path) {
            Ok(resp) if broken == 0 => {
                resp.assert_s3_error(500, &["InternalError"]);
                assert!(resp.text().contains("x/0000"), "{}", resp.text());
            }
            Ok(resp) => assert!(
                resp.status != 200 || untar_whole(&resp.body).is_none(),
                "{shard}: a complete answer with a damaged member"
            ),
            Err(_) => assert!(broken > 0, "{shard}: no answer at all"),
        }
    }

    for (path, code) in [
        (format!("/{BUCKET}/a.jpg?pipeline=nope"), 400),
        (format!("/{BUCKET}/a.jpg?pipeline=train&seed=x"), 400),
    ] {
        let resp = get(&server, &path)?;
        resp.assert_s3_error(code, &["InvalidArgument"]);
    }
    assert_eq!(get(&server, "/_granary/health")?.status, 200);
    Ok(())
}

/// Six samples of an image and a label each, as a shard's members.
fn six_samples() -> Vec<(String, Vec<u8>)> {
    let mut members = Vec::new();
    for i in 0..6u32 {
        members.push((format!("s/{i:04}.jpg"), jpeg(96 + 16 * i, 80, i)));
        members.push((format!("s/{i:04}.cls"), vec![b'0' + i as u8]));
    }
    members
}

#[test]
fn jobs_reading_one_epoch_share_its_preparations_and_runs_of_a_shard_are_prepared_alone(
) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = start(dir.path(), &format!("[pipelines.train]\n{PIPELINE}"))?;
    let origin = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&origin)?;
    let members = six_samples();
    std::fs::write(origin.join("s.tar"), tar_of(&members))?;
    let whole = format!("/{BUCKET}/s.tar?pipeline=train&seed=5&epoch=0");

    // Four jobs of one seed ask for the epoch's shard at once: one preparation of each
    // image serves all four, and all four get the same bytes.
    let answers: Vec<RawResponse> = std::thread::scope(|s| {
        let jobs: Vec<_> = (0..4).map(|_| s.spawn(|| get(&server, &whole))).collect();
        jobs.into_iter()
            .map(|j| j.join().unwrap())
            .collect::<Vec<_>>()
    })
    .into_iter()
    .collect::<Result<_>>()?;
    for a in &answers {
        assert_eq!(a.status, 200, "{}", a.text());
        assert_eq!(a.body, answers[0].body);
    }
    assert_eq!(server.stat("prep_samples"), 6);
    assert_eq!(server.stat("prep_shared"), 18);
    let prepared = untar(&answers[0].body);
    assert_eq!(prepared.len(), members.len());

    // A run of the shard (samples 2 and 3, by the byte range ?archlist gives): its
    // members alone, as the whole shard's answer has them, kept from it.
    let list: serde_json::Value =
        serde_json::from_slice(&get(&server, &format!("/{BUCKET}/s.tar?archlist"))?.body)?;
    let at = |i: usize| list["members"][i][1].as_u64().unwrap();
    let (first, last) = (
        at(4) - 512,
        at(7) + list["members"][7][2].as_u64().unwrap() - 1,
    );
    let range = format!("bytes={first}-{last}");
    let resp = server.raw_blocking("GET", &whole, &[("range", &range)], b"")?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    assert_eq!(
        resp.header("x-granary-source-range"),
        Some(format!("bytes {first}-{last}/{}", list["size"]).as_str())
    );
    assert_eq!(untar(&resp.body), prepared[4..8].to_vec());
    assert_eq!(server.stat("prep_samples"), 6, "the run was kept");

    // A version the reader did not list is refused, not prepared.
    let resp = server.raw_blocking("GET", &whole, &[("if-match", "\"0ld\"")], b"")?;
    resp.assert_s3_error(412, &["PreconditionFailed"]);

    // Another epoch is another preparation, never a kept one.
    let next = get(
        &server,
        &format!("/{BUCKET}/s.tar?pipeline=train&seed=5&epoch=1"),
    )?;
    assert_eq!(next.status, 200);
    assert_ne!(next.body, answers[0].body);
    assert_eq!(server.stat("prep_samples"), 12);

    // With nothing kept (--prep-memory 0), a later job prepares again, to the same bytes.
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("granary.toml");
    std::fs::write(&config, format!("[pipelines.train]\n{PIPELINE}"))?;
    let lean = Server::start(ServerOpts::open().args(&[
        "--config",
        config.to_str().unwrap(),
        "--prep-memory",
        "0",
    ]))?;
    let origin = lean.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&origin)?;
    std::fs::write(origin.join("s.tar"), tar_of(&members))?;
    for round in 1..=2u64 {
        // The same members and bytes (the headers' times are this node's file's).
        let again = get(&lean, &whole)?;
        assert_eq!(untar(&again.body), untar(&answers[0].body));
        assert_eq!(lean.stat("prep_samples"), 6 * round);
    }
    assert_eq!(lean.stat("prep_shared"), 0);
    Ok(())
}

#[test]
fn a_pipeline_that_cannot_run_stops_the_node_naming_its_line() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let config = format!(
        "[pipelines.fine]\n{PIPELINE}\n\n[pipelines.wrong]\nsteps = [{{ op = \"random_flip\", p = 2.0 }}]\n"
    );
    let err = match start(dir.path(), &config) {
        Ok(_) => panic!("a node started with a pipeline whose p is 2"),
        Err(e) => format!("{e:#}"),
    };
    let line = config
        .lines()
        .position(|l| l.starts_with("[pipelines.wrong]"))
        .unwrap()
        + 1;
    assert!(err.contains("[pipelines.wrong]"), "{err}");
    assert!(err.contains(&format!("line {line}")), "{err}");
    assert!(err.contains("steps[0]: p = 2"), "{err}");
    Ok(())
}

#[test]
fn a_plan_that_names_a_pipeline_has_its_samples_prepared_before_its_reads() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let server = start(dir.path(), &format!("[pipelines.train]\n{PIPELINE}"))?;
    let origin = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(origin.join("d"))?;
    let members = six_samples();
    let shard = tar_of(&members);
    std::fs::write(origin.join("d/s.tar"), &shard)?;
    let head = server.raw_blocking("HEAD", &format!("/{BUCKET}/d/s.tar"), &[], b"")?;
    let etag = head
        .header("etag")
        .unwrap_or_default()
        .trim_matches('"')
        .to_owned();
    // In the cache, as the planner brings a plan's next shards (the first, due now, is
    // left to the readers).
    assert_eq!(get(&server, &format!("/{BUCKET}/d/s.tar"))?.body, shard);
    let plan = serde_json::json!({
        "bucket": BUCKET, "prefix": "d/", "seed": 5, "epoch": 2, "pipeline": "train",
        "shards": [{"key": "d/s.tar", "etag": etag, "samples": 6, "size": shard.len()}],
    });
    let resp = server.raw_blocking(
        "POST",
        "/_granary/plans",
        &[("content-type", "application/json")],
        plan.to_string().as_bytes(),
    )?;
    assert_eq!(resp.status, 201, "{}", resp.text());
    let view: serde_json::Value = serde_json::from_slice(&resp.body)?;
    assert_eq!(view["pipeline"], "train", "{view}");

    // No prepared read yet: the node prepares the shard's images for the plan.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while server.stat("prep_samples") < 6 {
        assert!(
            std::time::Instant::now() < deadline,
            "not prepared ahead: {}",
            server.stats()?
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert_eq!(server.stat("prep_shared"), 0);

    // The job's read finds every image prepared, the bytes the client's code makes.
    let resp = get(
        &server,
        &format!("/{BUCKET}/d/s.tar?pipeline=train&seed=5&epoch=2"),
    )?;
    assert_eq!(resp.status, 200, "{}", resp.text());
    let here = Pipeline::new(toml::from_str::<PipelineSpec>(PIPELINE)?)?;
    for ((name, data), (_, source)) in untar(&resp.body).iter().zip(&members) {
        match name.strip_suffix(".jpg") {
            Some(sample) => {
                let key = sample_key("d/s.tar", sample);
                assert_eq!(data, &here.prepare(source, 5, 2, &key)?.bytes, "{name}");
            }
            None => assert_eq!(data, source),
        }
    }
    assert_eq!(server.stat("prep_samples"), 6, "none prepared twice");
    assert_eq!(server.stat("prep_shared"), 6);
    Ok(())
}
