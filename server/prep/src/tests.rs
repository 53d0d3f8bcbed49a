//! Pipelines end to end, on JPEGs and PNGs made here.

use super::*;
use image::ImageEncoder;

const SPEC_EXAMPLE: &str = r#"
members = ["jpg", "jpeg", "png"]
steps = [
  { op = "random_resized_crop", size = [224, 224], scale = [0.08, 1.0], ratio = [0.75, 1.3333] },
  { op = "random_flip", p = 0.5 },
]
output = "raw"
"#;

fn pipeline(text: &str) -> Pipeline {
    Pipeline::new(toml::from_str(text).unwrap()).unwrap()
}

/// A photograph-like 500 x 375 picture: smooth gradients and a few hard edges.
fn picture(width: u32, height: u32) -> Rgb {
    let mut pixels = Vec::with_capacity((width * height * 3) as usize);
    for y in 0..height {
        for x in 0..width {
            let edge = if (x / 40 + y / 30) % 2 == 0 { 60 } else { 0 };
            pixels.extend_from_slice(&[
                (x * 255 / width) as u8,
                (y * 255 / height) as u8,
                (((x + y) % 200) as u8).saturating_add(edge),
            ]);
        }
    }
    Rgb {
        width,
        height,
        pixels,
    }
}

fn jpeg(img: &Rgb) -> Vec<u8> {
    pixels::encode_jpeg(img, 90).unwrap()
}

#[test]
fn the_spec_example_parses_and_other_definitions_draw_otherwise() {
    let p = pipeline(SPEC_EXAMPLE);
    assert_eq!(p.spec().steps.len(), 2);
    assert!(p.prepares("s/0001.jpg") && p.prepares("a.PNG") && !p.prepares("a.cls"));
    let q = pipeline(&SPEC_EXAMPLE.replace("p = 0.5", "p = 0.25"));
    assert_ne!(p.fingerprint(), q.fingerprint());
    assert_eq!(p.fingerprint(), pipeline(SPEC_EXAMPLE).fingerprint());
}

#[test]
fn definitions_that_cannot_run_say_which_field() {
    for (text, says) in [
        (r#"steps = []"#, "at least one step"),
        (
            r#"steps = [{ op = "random_resized_crop", size = [0, 224] }]"#,
            "steps[0]: size[0] = 0",
        ),
        (
            r#"steps = [{ op = "random_resized_crop", size = [224, 224], scale = [0.5, 0.2] }]"#,
            "scale = [0.5, 0.2]",
        ),
        (
            r#"steps = [{ op = "random_resized_crop", size = [9, 9], ratio = [0.0, 1.0] }]"#,
            "ratio",
        ),
        (r#"steps = [{ op = "random_flip", p = 1.5 }]"#, "p = 1.5"),
        (
            r#"steps = [{ op = "resize", shorter = 256 }, { op = "center_crop", size = [99999, 1] }]"#,
            "steps[1]: size[0] = 99999",
        ),
        (
            r#"members = [".jpg"]
steps = [{ op = "random_flip" }]"#,
            "not an extension",
        ),
        (
            r#"quality = 0
steps = [{ op = "random_flip" }]"#,
            "quality = 0",
        ),
    ] {
        let spec: PipelineSpec = toml::from_str(text).unwrap();
        let err = Pipeline::new(spec).unwrap_err().to_string();
        assert!(err.contains(says), "{text}: {err}");
    }
    for text in [
        r#"steps = [{ op = "random_rotate" }]"#,
        r#"steps = [{ op = "random_flip", probability = 0.5 }]"#,
        r#"output = "webp"
steps = [{ op = "random_flip" }]"#,
    ] {
        assert!(toml::from_str::<PipelineSpec>(text).is_err(), "{text}");
    }
}

/// The same (seed, epoch, key) gives the same bytes, on any thread; another seed, epoch or
/// key gives other crops; raw output is exactly H x W x 3 bytes.
#[test]
fn a_prepared_sample_is_a_function_of_seed_epoch_and_key() {
    let p = pipeline(SPEC_EXAMPLE);
    let input = jpeg(&picture(500, 375));
    let a = p.prepare(&input, 7, 3, "shard-0001/s0001").unwrap();
    assert_eq!(
        (a.width, a.height, a.bytes.len()),
        (224, 224, 224 * 224 * 3)
    );
    let elsewhere = {
        let (p, input) = (p.clone(), input.clone());
        std::thread::spawn(move || p.prepare(&input, 7, 3, "shard-0001/s0001").unwrap())
            .join()
            .unwrap()
    };
    assert_eq!(a, elsewhere);
    let mut others = std::collections::HashSet::new();
    for (seed, epoch, key) in [
        (8, 3, "shard-0001/s0001"),
        (7, 4, "shard-0001/s0001"),
        (7, 3, "shard-0001/s0002"),
    ] {
        others.insert(p.prepare(&input, seed, epoch, key).unwrap().bytes);
    }
    assert!(!others.contains(&a.bytes));
    assert_eq!(others.len(), 3);
}

/// Flip alone (p = 1) mirrors the decoded image; p = 0 leaves it; p = 0.5 flips about
/// half of the samples.
#[test]
fn flips_mirror_the_decoded_image_at_their_rate() {
    let img = picture(64, 48);
    let png = {
        let mut out = Vec::new();
        image::codecs::png::PngEncoder::new(&mut out)
            .write_image(&img.pixels, 64, 48, image::ExtendedColorType::Rgb8)
            .unwrap();
        out
    };
    let flip = |p: f64, key: &str| {
        pipeline(&format!(r#"steps = [{{ op = "random_flip", p = {p} }}]"#))
            .prepare(&png, 0, 0, key)
            .unwrap()
            .bytes
    };
    let mut mirrored = img.clone();
    pixels::flip_horizontal(&mut mirrored);
    assert_eq!(flip(1.0, "k"), mirrored.pixels);
    assert_eq!(flip(0.0, "k"), img.pixels);
    let flipped = (0..400)
        .filter(|i| flip(0.5, &format!("k{i}")) == mirrored.pixels)
        .count();
    assert!((160..240).contains(&flipped), "{flipped} of 400");
}

/// torchvision's evaluation recipe: Resize(256) then CenterCrop(224), to a JPEG.
#[test]
fn resize_then_center_crop_gives_the_evaluation_crop() {
    let p = pipeline(
        r#"
steps = [{ op = "resize", shorter = 256 }, { op = "center_crop", size = [224, 200] }]
output = "jpeg"
quality = 80
"#,
    );
    let out = p.prepare(&jpeg(&picture(500, 375)), 0, 0, "k").unwrap();
    assert_eq!((out.width, out.height), (200, 224));
    let back = pixels::decode(&out.bytes).unwrap();
    assert_eq!((back.width, back.height), (200, 224));
    // A deterministic pipeline: the seed changes nothing.
    assert_eq!(
        out,
        p.prepare(&jpeg(&picture(500, 375)), 99, 5, "other")
            .unwrap()
    );
}

#[test]
fn damaged_inputs_are_errors_not_pictures() {
    let p = pipeline(SPEC_EXAMPLE);
    let whole = jpeg(&picture(500, 375));
    for broken in [
        &whole[..whole.len() / 3],
        &whole[..200],
        b"GIF89a....".as_slice(),
    ] {
        assert!(
            p.prepare(broken, 0, 0, "k").is_err(),
            "{} bytes",
            broken.len()
        );
    }
}
