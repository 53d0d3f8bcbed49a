//! Pipelines end to end, on JPEGs and PNGs made here.

use super::*;
use crate::pixels::Format;
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

/// Small real files (made by Pillow): a progressive JPEG, one with restart markers, a
/// 4:4:4 one, an 8 x 8 flat one, and a PNG.
const FILES: [(&str, &[u8]); 5] = [
    (
        "progressive.jpg",
        include_bytes!("testdata/progressive.jpg"),
    ),
    ("restarts.jpg", include_bytes!("testdata/restarts.jpg")),
    (
        "baseline444.jpg",
        include_bytes!("testdata/baseline444.jpg"),
    ),
    ("flat.jpg", include_bytes!("testdata/flat.jpg")),
    ("rgb.png", include_bytes!("testdata/rgb.png")),
];

/// Every whole file decodes to the pixels zune-jpeg makes of it without the padding.
#[test]
fn whole_files_decode_as_before() {
    for (name, bytes) in FILES {
        let img = pixels::decode(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        if name.ends_with(".jpg") {
            let opts = zune_core::options::DecoderOptions::default()
                .jpeg_set_out_colorspace(zune_core::colorspace::ColorSpace::RGB);
            let plain = zune_jpeg::JpegDecoder::new_with_options(
                zune_core::bytestream::ZCursor::new(bytes),
                opts,
            )
            .decode()
            .unwrap();
            assert_eq!(img.pixels, plain, "{name}");
        }
    }
    let jpeg_here = jpeg(&picture(500, 375));
    assert_eq!(pixels::decode(&jpeg_here).unwrap().width, 500);
}

/// A file cut at any byte, an end marker appended or not, is an error, or (cut in the
/// last bits of padding after the last code) the same picture: never another one.
#[test]
fn a_file_cut_anywhere_is_never_a_wrong_picture() {
    let made = jpeg(&picture(64, 40));
    let mut files: Vec<(&str, &[u8])> = FILES.to_vec();
    files.push(("made.jpg", &made));
    for (name, bytes) in files {
        let whole = pixels::decode(bytes).unwrap();
        let end: &[u8] = if name.ends_with(".png") {
            &bytes[bytes.len() - 12..]
        } else {
            &[0xff, 0xd9]
        };
        let mut pictures = 0;
        for cut in 0..bytes.len() - end.len() {
            for input in [bytes[..cut].to_vec(), [&bytes[..cut], end].concat()] {
                if let Ok(img) = pixels::decode(&input) {
                    assert_eq!(img, whole, "{name} cut at {cut} of {}", bytes.len());
                    pictures += 1;
                }
            }
        }
        assert!(pictures <= 4, "{name}: {pictures} cuts decoded");
    }
}

/// What a preparation allocates stays under its cost, whatever the steps (the fuzz
/// target holds every input to this; here a few shapes, with a counting allocator).
#[test]
fn a_preparation_costs_what_its_header_says_before_it_is_read() {
    let p = pipeline(SPEC_EXAMPLE);
    let img = jpeg(&picture(500, 375));
    let header = pixels::probe(&img[..600], img.len() as u64)
        .unwrap()
        .unwrap();
    assert_eq!(
        (header.width, header.height, header.format),
        (500, 375, Format::Jpeg)
    );
    let cost = p.cost(&header, img.len() as u64).unwrap();
    assert!(
        cost > pixels::rgb_bytes(500, 375) && cost < 8 << 20,
        "{cost}"
    );
    // The header lies past a prefix of 20 bytes: more is needed.
    assert_eq!(pixels::probe(&img[..20], img.len() as u64).unwrap(), None);
    // Not an image: refused from its first bytes.
    assert!(pixels::probe(b"GIF89a", 1 << 30).is_err());
    // An extreme aspect: the resize would make 256 x 16,768,000.
    let needle = pixels::Header {
        format: Format::Jpeg,
        width: 1,
        height: 65_500,
        decode_bytes: 1 << 20,
    };
    let eval = pipeline(
        r#"steps = [{ op = "resize", shorter = 256 }, { op = "center_crop", size = [224, 224] }]"#,
    );
    assert_eq!(
        eval.cost(&needle, 20_000),
        Err(PrepError::StepTooLarge {
            step: 0,
            width: 256,
            height: 16_768_000,
            max: MAX_PIXELS
        })
    );
    // 65,500 x 65,500 is refused as an input, before any step.
    let huge = pixels::Header {
        width: 65_500,
        height: 65_500,
        ..needle
    };
    assert!(matches!(
        eval.cost(&huge, 100),
        Err(PrepError::TooMuchMemory { .. }) | Err(PrepError::TooLarge { .. })
    ));
}

/// A preparation told nobody waits stops before its next step.
#[test]
fn a_preparation_stops_between_steps_when_nobody_waits() {
    let p = pipeline(SPEC_EXAMPLE);
    let img = jpeg(&picture(200, 100));
    let asked = std::cell::Cell::new(0);
    let out = p.prepare_while(&img, (0, 0, "k"), &|| {
        asked.set(asked.get() + 1);
        asked.get() < 2
    });
    assert_eq!(out, Err(PrepError::Cancelled));
    assert_eq!(
        asked.get(),
        2,
        "asked before the decode and before the first step"
    );
}
