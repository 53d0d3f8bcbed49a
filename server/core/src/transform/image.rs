//! The image transform: decode a JPEG or PNG, resize, center-crop, encode.
//!
//! The node caches what this module returns, so the output must be a pure function of the
//! input bytes and the [`ImageSpec`]. The pipeline is deliberately made of plain `image`
//! crate calls, and anyone can reproduce it byte for byte:
//!
//! 1. Decode: `image::ImageReader::new(Cursor::new(input)).with_guessed_format()`, then
//!    `decode()` (the format comes from the magic bytes; only JPEG and PNG are accepted).
//!    The same bytes through `image::load_from_memory` give the same pixels; the reader is
//!    only used to set [`image::Limits`] (see below).
//! 2. Convert: `DynamicImage::to_rgb8()`.
//! 3. Resize, when `resize = Some(s)`: with `(w, h)` the decoded size and `m = min(w, h)`,
//!    the new size is `(w * s + m / 2) / m` by `(h * s + m / 2) / m` in integer arithmetic
//!    (the product rounded half up, so the shorter side becomes exactly `s`), then
//!    `image::imageops::resize(&rgb, new_w, new_h, filter)`.
//! 4. Center-crop, when `crop = Some([cw, ch])`: with `(w, h)` the size after step 3,
//!    `image::imageops::crop_imm(&rgb, (w - cw) / 2, (h - ch) / 2, cw, ch).to_image()`.
//! 5. Encode: `JpegEncoder::new_with_quality(&mut out, quality)` or `PngEncoder::new(&mut
//!    out)`, each through `ImageEncoder::write_image(rgb.as_raw(), w, h,
//!    ExtendedColorType::Rgb8)`; `raw` is `rgb.into_raw()` (uint8 HWC RGB, no header).
//!
//! Decompression bombs: an image whose header claims more than [`MAX_PIXELS`] pixels is
//! refused before its pixel data is decoded, and the decoder runs under [`image::Limits`]
//! as a second line. A resize whose result would exceed [`MAX_PIXELS`] is refused too.

use std::io::Cursor;

use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::imageops::{self, FilterType};
use image::{DynamicImage, ExtendedColorType, ImageEncoder, ImageReader, Limits, RgbImage};

/// The most pixels (width * height) an input or a resized image may have: 100 megapixels.
pub const MAX_PIXELS: u64 = 100_000_000;

/// Bytes the decoder may allocate: [`MAX_PIXELS`] at 8 bytes a pixel, the widest layout
/// the accepted formats decode to (16-bit RGBA PNG).
const MAX_DECODE_ALLOC: u64 = MAX_PIXELS * 8;

/// What the image transform does to each object.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// Resize so the shorter side is this many pixels (aspect kept), before the crop.
    /// None: no resize.
    #[serde(default)]
    pub resize: Option<u32>,
    /// Center-crop to `[width, height]` after the resize. None: no crop.
    #[serde(default)]
    pub crop: Option<[u32; 2]>,
    /// Output format: "jpeg" (default), "png" or "raw".
    #[serde(default)]
    pub format: ImageFormat,
    /// JPEG quality, 1..=100 (default 90). Checked for every format, used by JPEG only.
    #[serde(default = "default_quality")]
    pub quality: u8,
    /// Resize filter: "triangle" (default), "nearest", "catmullrom" or "lanczos3".
    #[serde(default)]
    pub filter: Filter,
}

/// The encoding of the transform's output.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ImageFormat {
    /// Baseline JPEG at [`ImageSpec::quality`].
    #[default]
    Jpeg,
    /// PNG with the encoder's default compression and filter.
    Png,
    /// Bare pixels: uint8 RGB, row-major, height x width x 3 bytes, no header.
    Raw,
}

/// The resampling filter for the resize step; each maps to an [`image::imageops::FilterType`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Filter {
    /// Nearest neighbour.
    Nearest,
    /// Linear (bilinear) filter.
    #[default]
    Triangle,
    /// Cubic filter.
    CatmullRom,
    /// Lanczos with a window of 3.
    Lanczos3,
}

impl From<Filter> for FilterType {
    fn from(f: Filter) -> FilterType {
        match f {
            Filter::Nearest => FilterType::Nearest,
            Filter::Triangle => FilterType::Triangle,
            Filter::CatmullRom => FilterType::CatmullRom,
            Filter::Lanczos3 => FilterType::Lanczos3,
        }
    }
}

fn default_quality() -> u8 {
    90
}

impl Default for ImageSpec {
    fn default() -> Self {
        ImageSpec {
            resize: None,
            crop: None,
            format: ImageFormat::Jpeg,
            quality: default_quality(),
            filter: Filter::Triangle,
        }
    }
}

impl ImageSpec {
    /// Checks the spec on its own: quality in 1..=100 and no zero sizes.
    pub fn validate(&self) -> Result<(), String> {
        if !(1..=100).contains(&self.quality) {
            return Err(format!(
                "image quality must be in 1..=100, not {}",
                self.quality
            ));
        }
        if self.resize == Some(0) {
            return Err("image resize must be at least 1 pixel".to_string());
        }
        if let Some([w, h]) = self.crop {
            if w == 0 || h == 0 {
                return Err(format!("image crop {w}x{h} has a zero side"));
            }
            if u64::from(w) * u64::from(h) > MAX_PIXELS {
                return Err(format!(
                    "image crop {w}x{h} exceeds the {} megapixel limit",
                    MAX_PIXELS / 1_000_000
                ));
            }
        }
        Ok(())
    }
}

/// The content type of the output ("image/jpeg", "image/png", "application/octet-stream").
pub fn content_type(spec: &ImageSpec) -> &'static str {
    match spec.format {
        ImageFormat::Jpeg => "image/jpeg",
        ImageFormat::Png => "image/png",
        ImageFormat::Raw => "application/octet-stream",
    }
}

/// Runs the pipeline on encoded image bytes (JPEG or PNG, format guessed from the bytes).
///
/// CPU-bound: callers run it on the blocking pool. The input is converted to RGB8 (alpha
/// dropped, 16-bit samples scaled down). The steps are those of the module doc.
pub fn apply(spec: &ImageSpec, input: &[u8]) -> Result<Vec<u8>, String> {
    spec.validate()?;
    let rgb = decode(input)?.to_rgb8();
    let rgb = match spec.resize {
        Some(side) => {
            let (w, h) = resized_size(rgb.dimensions(), side)?;
            imageops::resize(&rgb, w, h, spec.filter.into())
        }
        None => rgb,
    };
    let rgb = match spec.crop {
        Some([cw, ch]) => {
            let (w, h) = rgb.dimensions();
            if w < cw || h < ch {
                return Err(format!("image {w}x{h} is smaller than the crop {cw}x{ch}"));
            }
            imageops::crop_imm(&rgb, (w - cw) / 2, (h - ch) / 2, cw, ch).to_image()
        }
        None => rgb,
    };
    encode(spec, rgb)
}

/// Decodes JPEG or PNG bytes, refusing images over [`MAX_PIXELS`] from their header alone.
fn decode(input: &[u8]) -> Result<DynamicImage, String> {
    let reader = || {
        let reader = ImageReader::new(Cursor::new(input))
            .with_guessed_format()
            .map_err(|e| format!("cannot read the image: {e}"))?;
        match reader.format() {
            Some(image::ImageFormat::Jpeg | image::ImageFormat::Png) => Ok(reader),
            Some(other) => Err(format!(
                "unsupported image format {other:?}: only JPEG and PNG are decoded"
            )),
            None => Err("not a JPEG or PNG image".to_string()),
        }
    };
    // The header pass only parses the size, so a bomb is refused before any pixel buffer
    // is allocated.
    let (w, h) = reader()?
        .into_dimensions()
        .map_err(|e| format!("cannot decode the image header: {e}"))?;
    if u64::from(w) * u64::from(h) > MAX_PIXELS {
        return Err(format!(
            "image {w}x{h} exceeds the {} megapixel limit",
            MAX_PIXELS / 1_000_000
        ));
    }
    let mut limits = Limits::default();
    limits.max_image_width = Some(MAX_PIXELS as u32);
    limits.max_image_height = Some(MAX_PIXELS as u32);
    limits.max_alloc = Some(MAX_DECODE_ALLOC);
    let mut reader = reader()?;
    reader.limits(limits);
    reader
        .decode()
        .map_err(|e| format!("cannot decode the image: {e}"))
}

/// The size after scaling `(w, h)` so that its shorter side is `side` (module doc, step 3).
fn resized_size((w, h): (u32, u32), side: u32) -> Result<(u32, u32), String> {
    let short = u64::from(w.min(h));
    if short == 0 {
        return Err(format!("image {w}x{h} has a zero side"));
    }
    let scale = |x: u32| (u64::from(x) * u64::from(side) + short / 2) / short;
    let (nw, nh) = (scale(w), scale(h));
    if nw.saturating_mul(nh) > MAX_PIXELS {
        return Err(format!(
            "resizing image {w}x{h} to {nw}x{nh} exceeds the {} megapixel limit",
            MAX_PIXELS / 1_000_000
        ));
    }
    // Both fit in u32: their product is at most MAX_PIXELS and each is at least 1.
    Ok((nw as u32, nh as u32))
}

fn encode(spec: &ImageSpec, rgb: RgbImage) -> Result<Vec<u8>, String> {
    let (w, h) = rgb.dimensions();
    let mut out = Vec::new();
    match spec.format {
        ImageFormat::Jpeg => JpegEncoder::new_with_quality(&mut out, spec.quality)
            .write_image(rgb.as_raw(), w, h, ExtendedColorType::Rgb8)
            .map_err(|e| format!("cannot encode JPEG: {e}"))?,
        ImageFormat::Png => PngEncoder::new(&mut out)
            .write_image(rgb.as_raw(), w, h, ExtendedColorType::Rgb8)
            .map_err(|e| format!("cannot encode PNG: {e}"))?,
        ImageFormat::Raw => return Ok(rgb.into_raw()),
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 64x48 RGB gradient: every pixel differs from its neighbours, so a crop taken at the
    /// wrong offset shows up in the bytes.
    fn gradient() -> RgbImage {
        RgbImage::from_fn(64, 48, |x, y| {
            image::Rgb([(x * 4) as u8, (y * 5) as u8, ((x + y) * 2) as u8])
        })
    }

    /// An input image, through the module's own encoder.
    fn png_bytes(img: &RgbImage) -> Vec<u8> {
        encode(&spec(None, None, ImageFormat::Png), img.clone()).unwrap()
    }

    fn jpeg_bytes(img: &RgbImage) -> Vec<u8> {
        let s = ImageSpec {
            quality: 95,
            ..spec(None, None, ImageFormat::Jpeg)
        };
        encode(&s, img.clone()).unwrap()
    }

    fn spec(resize: Option<u32>, crop: Option<[u32; 2]>, format: ImageFormat) -> ImageSpec {
        ImageSpec {
            resize,
            crop,
            format,
            ..ImageSpec::default()
        }
    }

    fn decoded_size(bytes: &[u8]) -> (u32, u32) {
        let img = image::load_from_memory(bytes).unwrap();
        (img.width(), img.height())
    }

    #[test]
    fn resize_keeps_aspect_and_sets_the_shorter_side() {
        let input = png_bytes(&gradient());
        let out = apply(&spec(Some(24), None, ImageFormat::Png), &input).unwrap();
        assert_eq!(decoded_size(&out), (32, 24));
        // 64x48 to a shorter side of 10: 64 * 10 / 48 = 13.33, rounded to 13.
        let out = apply(&spec(Some(10), None, ImageFormat::Png), &input).unwrap();
        assert_eq!(decoded_size(&out), (13, 10));
        // Upscaling follows the same rule: 64 * 100 / 48 = 133.33.
        let out = apply(&spec(Some(100), None, ImageFormat::Raw), &input).unwrap();
        assert_eq!(out.len(), 133 * 100 * 3);
    }

    #[test]
    fn resized_size_rounds_half_up() {
        assert_eq!(resized_size((64, 48), 24), Ok((32, 24)));
        assert_eq!(resized_size((3, 2), 1), Ok((2, 1)));
        assert_eq!(resized_size((5, 2), 1), Ok((3, 1)));
        assert_eq!(resized_size((2, 7), 3), Ok((3, 11)));
        assert!(resized_size((1, 100_000), 1_000).is_err());
    }

    #[test]
    fn crop_takes_the_center() {
        let img = gradient();
        let input = png_bytes(&img);
        let out = apply(&spec(None, Some([10, 6]), ImageFormat::Raw), &input).unwrap();
        assert_eq!(out.len(), 10 * 6 * 3);
        let expected = imageops::crop_imm(&img, 27, 21, 10, 6)
            .to_image()
            .into_raw();
        assert_eq!(out, expected);
        // The first pixel is the source pixel at (27, 21).
        assert_eq!(&out[..3], &[27 * 4, 21 * 5, 48 * 2]);
    }

    #[test]
    fn resize_then_crop() {
        let input = jpeg_bytes(&gradient());
        for format in [ImageFormat::Jpeg, ImageFormat::Png] {
            let out = apply(&spec(Some(32), Some([20, 30]), format), &input).unwrap();
            assert_eq!(decoded_size(&out), (20, 30));
        }
        let out = apply(&spec(Some(32), Some([20, 30]), ImageFormat::Raw), &input).unwrap();
        assert_eq!(out.len(), 20 * 30 * 3);
    }

    #[test]
    fn no_steps_reencodes_at_full_size() {
        let input = png_bytes(&gradient());
        let out = apply(&spec(None, None, ImageFormat::Raw), &input).unwrap();
        assert_eq!(out, gradient().into_raw());
        let out = apply(&spec(None, None, ImageFormat::Jpeg), &input).unwrap();
        assert_eq!(&out[..3], &[0xFF, 0xD8, 0xFF]);
        assert_eq!(decoded_size(&out), (64, 48));
    }

    #[test]
    fn output_matches_the_documented_steps() {
        let input = jpeg_bytes(&gradient());
        for (filter, ftype) in [
            (Filter::Triangle, FilterType::Triangle),
            (Filter::Nearest, FilterType::Nearest),
            (Filter::CatmullRom, FilterType::CatmullRom),
            (Filter::Lanczos3, FilterType::Lanczos3),
        ] {
            let s = ImageSpec {
                resize: Some(40),
                crop: Some([30, 40]),
                format: ImageFormat::Jpeg,
                quality: 80,
                filter,
            };
            let rgb = image::load_from_memory(&input).unwrap().to_rgb8();
            // 64x48 to a shorter side of 40: 64 * 40 / 48 = 53.33, so 53x40.
            let rgb = imageops::resize(&rgb, 53, 40, ftype);
            let rgb = imageops::crop_imm(&rgb, 11, 0, 30, 40).to_image();
            let mut expected = Vec::new();
            JpegEncoder::new_with_quality(&mut expected, 80)
                .write_image(rgb.as_raw(), 30, 40, ExtendedColorType::Rgb8)
                .unwrap();
            assert_eq!(apply(&s, &input).unwrap(), expected, "{filter:?}");
        }
    }

    #[test]
    fn output_is_deterministic() {
        let input = jpeg_bytes(&gradient());
        for format in [ImageFormat::Jpeg, ImageFormat::Png, ImageFormat::Raw] {
            let s = ImageSpec {
                filter: Filter::Lanczos3,
                ..spec(Some(30), Some([30, 30]), format)
            };
            assert_eq!(apply(&s, &input).unwrap(), apply(&s, &input).unwrap());
        }
    }

    #[test]
    fn crop_larger_than_the_image_is_an_error() {
        let input = png_bytes(&gradient());
        let err = apply(&spec(None, Some([65, 10]), ImageFormat::Png), &input).unwrap_err();
        assert!(err.contains("64x48 is smaller than the crop"), "{err}");
        // The crop applies to the resized image: 64x48 at a shorter side of 24 is 32x24.
        let err = apply(&spec(Some(24), Some([30, 30]), ImageFormat::Png), &input).unwrap_err();
        assert!(err.contains("32x24 is smaller than the crop"), "{err}");
    }

    #[test]
    fn bad_bytes_are_an_error() {
        let s = ImageSpec::default();
        assert!(apply(&s, b"not an image at all").is_err());
        assert!(apply(&s, b"").is_err());
        let mut truncated = png_bytes(&gradient());
        truncated.truncate(truncated.len() / 2);
        assert!(apply(&s, &truncated).is_err());
    }

    #[test]
    fn header_over_the_pixel_limit_is_refused() {
        // A 20000x20000 PNG header (400 megapixels).
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = b"IHDR".to_vec();
        ihdr.extend_from_slice(&20_000u32.to_be_bytes());
        ihdr.extend_from_slice(&20_000u32.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        png.extend_from_slice(&13u32.to_be_bytes());
        png.extend_from_slice(&ihdr);
        png.extend_from_slice(&crc32fast::hash(&ihdr).to_be_bytes());
        // The decoder reads up to the first IDAT before it reports the size; this one holds
        // a zlib stream of a few rows, far short of the 1.2 GB the header promises.
        let mut z = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut z, &[0u8; 3 * 60_001]).unwrap();
        let mut idat = b"IDAT".to_vec();
        idat.extend_from_slice(&z.finish().unwrap());
        png.extend_from_slice(&(idat.len() as u32 - 4).to_be_bytes());
        png.extend_from_slice(&idat);
        png.extend_from_slice(&crc32fast::hash(&idat).to_be_bytes());
        let err = apply(&ImageSpec::default(), &png).unwrap_err();
        assert!(
            err.contains("20000x20000 exceeds the 100 megapixel limit"),
            "{err}"
        );
    }

    #[test]
    fn validate_checks_quality_and_sizes() {
        assert!(ImageSpec::default().validate().is_ok());
        for q in [0, 101] {
            let s = ImageSpec {
                quality: q,
                ..ImageSpec::default()
            };
            assert!(s.validate().is_err());
            assert!(apply(&s, &png_bytes(&gradient())).is_err());
        }
        assert!(spec(Some(0), None, ImageFormat::Jpeg).validate().is_err());
        assert!(spec(None, Some([0, 5]), ImageFormat::Jpeg)
            .validate()
            .is_err());
        assert!(spec(None, Some([5, 0]), ImageFormat::Jpeg)
            .validate()
            .is_err());
        assert!(spec(Some(1), Some([1, 1]), ImageFormat::Raw)
            .validate()
            .is_ok());
    }

    #[test]
    fn spec_parses_with_defaults_and_names() {
        let s: ImageSpec = serde_json::from_str("{}").unwrap();
        assert_eq!(s, ImageSpec::default());
        assert_eq!(s.quality, 90);
        let s: ImageSpec = serde_json::from_str(
            r#"{"resize": 256, "crop": [224, 224], "format": "raw", "filter": "catmullrom"}"#,
        )
        .unwrap();
        assert_eq!(s.resize, Some(256));
        assert_eq!(s.crop, Some([224, 224]));
        assert_eq!(s.format, ImageFormat::Raw);
        assert_eq!(s.filter, Filter::CatmullRom);
        assert_eq!(content_type(&s), "application/octet-stream");
        let s: ImageSpec = serde_json::from_str(r#"{"format": "png"}"#).unwrap();
        assert_eq!(content_type(&s), "image/png");
        assert_eq!(content_type(&ImageSpec::default()), "image/jpeg");
        assert!(serde_json::from_str::<ImageSpec>(r#"{"size": 3}"#).is_err());
        assert!(serde_json::from_str::<ImageSpec>(r#"{"filter": "bicubic"}"#).is_err());
    }
}
