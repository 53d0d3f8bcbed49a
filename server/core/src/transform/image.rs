//! The image transform: decode a JPEG or PNG, resize, center-crop, encode.
//!
//! The node caches what this module's definition makes, so the output must be a pure
//! function of the input bytes and the [`ImageSpec`]. It is a pipeline of
//! `granary_prep`'s deterministic steps, with the limits and the arithmetic pipelines
//! have (one image stack):
//!
//! 1. Decode (zune-jpeg for JPEG, the `image` crate for PNG; a file cut short is an
//!    error, never a picture), to 8-bit RGB (alpha dropped, 16-bit samples scaled down).
//! 2. Resize, when `resize = Some(s)`: torchvision's `Resize(s)`: the shorter side becomes
//!    `s`, the longer `int(s * long / short)` (truncated), with `filter`, antialiased.
//! 3. Center-crop, when `crop = Some([h, w])` (`[height, width]`, as pipelines and
//!    torchvision take sizes): torchvision's `CenterCrop`, at `round((H - h) / 2)`, zero
//!    where the crop reaches past a smaller image.
//! 4. Encode: JPEG at `quality`, PNG, or raw (uint8 HWC RGB, no header).
//!
//! An image over [`granary_prep::MAX_PIXELS`], a step that would make one, or a run that
//! would take more memory than a preparation may, is refused before anything is
//! allocated for it.

use granary_prep::{Filter as PrepFilter, Output, Pipeline, PipelineSpec, Step};

/// What the image transform does to each object.
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// Resize so the shorter side is this many pixels (aspect kept), before the crop.
    /// None: no resize.
    #[serde(default)]
    pub resize: Option<u32>,
    /// Center-crop to `[height, width]` after the resize. None: no crop.
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

/// The resampling filter for the resize step.
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
    /// The pipeline it is: its steps, output and filter.
    pub fn to_pipeline(&self) -> PipelineSpec {
        let mut steps = Vec::new();
        if let Some(shorter) = self.resize {
            steps.push(Step::Resize { shorter });
        }
        if let Some(size) = self.crop {
            steps.push(Step::CenterCrop { size });
        }
        PipelineSpec {
            members: vec!["jpg".into(), "jpeg".into(), "png".into()],
            steps,
            output: match self.format {
                ImageFormat::Jpeg => Output::Jpeg,
                ImageFormat::Png => Output::Png,
                ImageFormat::Raw => Output::Raw,
            },
            quality: self.quality,
            filter: match self.filter {
                Filter::Nearest => PrepFilter::Nearest,
                Filter::Triangle => PrepFilter::Bilinear,
                Filter::CatmullRom => PrepFilter::CatmullRom,
                Filter::Lanczos3 => PrepFilter::Lanczos3,
            },
        }
    }

    /// The checked pipeline (a spec that cannot run says which field).
    pub fn pipeline(&self) -> Result<Pipeline, String> {
        Pipeline::conversion(self.to_pipeline()).map_err(|e| e.to_string())
    }

    /// Checks the spec on its own: quality in 1..=100, sizes the steps take.
    pub fn validate(&self) -> Result<(), String> {
        self.pipeline().map(drop)
    }
}

/// The transform's output for `input`, as the node makes it (here, on the calling
/// thread: a job doing the work itself).
pub fn apply(spec: &ImageSpec, input: &[u8]) -> Result<Vec<u8>, String> {
    let p = spec.pipeline()?;
    p.prepare(input, 0, 0, "")
        .map(|o| o.bytes)
        .map_err(|e| e.to_string())
}

/// The content type of the output ("image/jpeg", "image/png", "application/octet-stream").
pub fn content_type(spec: &ImageSpec) -> &'static str {
    match spec.format {
        ImageFormat::Jpeg => "image/jpeg",
        ImageFormat::Png => "image/png",
        ImageFormat::Raw => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageEncoder, RgbImage};

    /// A 64x48 RGB gradient: every pixel differs from its neighbours, so a crop taken at the
    /// wrong offset shows up in the bytes.
    fn gradient() -> RgbImage {
        RgbImage::from_fn(64, 48, |x, y| {
            image::Rgb([(x * 4) as u8, (y * 5) as u8, ((x + y) * 2) as u8])
        })
    }

    fn png_bytes(img: &RgbImage) -> Vec<u8> {
        encoded(img, true)
    }

    fn jpeg_bytes(img: &RgbImage) -> Vec<u8> {
        encoded(img, false)
    }

    /// `img` as a PNG, or a JPEG at quality 95.
    fn encoded(img: &RgbImage, png: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let (w, h, rgb) = (img.width(), img.height(), image::ExtendedColorType::Rgb8);
        let written = if png {
            image::codecs::png::PngEncoder::new(&mut out).write_image(img.as_raw(), w, h, rgb)
        } else {
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 95).write_image(
                img.as_raw(),
                w,
                h,
                rgb,
            )
        };
        written.unwrap();
        out
    }

    fn spec(resize: Option<u32>, crop: Option<[u32; 2]>, format: ImageFormat) -> ImageSpec {
        ImageSpec {
            resize,
            crop,
            format,
            ..ImageSpec::default()
        }
    }

    fn apply(s: &ImageSpec, input: &[u8]) -> Result<granary_prep::Prepared, String> {
        s.pipeline()?
            .prepare(input, 0, 0, "")
            .map_err(|e| e.to_string())
    }

    fn size(s: &ImageSpec, input: &[u8]) -> (u32, u32) {
        let out = apply(s, input).unwrap();
        (out.width, out.height)
    }

    /// torchvision's rule: the shorter side becomes the size, the longer is truncated.
    #[test]
    fn resize_keeps_aspect_and_sets_the_shorter_side() {
        let input = png_bytes(&gradient());
        assert_eq!(
            size(&spec(Some(24), None, ImageFormat::Png), &input),
            (32, 24)
        );
        // 64 * 10 / 48 = 13.33, truncated.
        assert_eq!(
            size(&spec(Some(10), None, ImageFormat::Png), &input),
            (13, 10)
        );
        // 64 * 100 / 48 = 133.33.
        let out = apply(&spec(Some(100), None, ImageFormat::Raw), &input).unwrap();
        assert_eq!(out.bytes.len(), 133 * 100 * 3);
        // 64 * 47 / 48 = 62.67: truncated to 62, where rounding gave 63.
        assert_eq!(
            size(&spec(Some(47), None, ImageFormat::Raw), &input),
            (62, 47)
        );
    }

    /// `crop = [height, width]`, centred, as pipelines and torchvision take sizes.
    #[test]
    fn crop_takes_the_center_height_first() {
        let img = gradient();
        let input = png_bytes(&img);
        let out = apply(&spec(None, Some([6, 10]), ImageFormat::Raw), &input).unwrap();
        assert_eq!((out.width, out.height), (10, 6));
        let expected = image::imageops::crop_imm(&img, 27, 21, 10, 6)
            .to_image()
            .into_raw();
        assert_eq!(out.bytes, expected);
        // The first pixel is the source pixel at (27, 21).
        assert_eq!(&out.bytes[..3], &[27 * 4, 21 * 5, 48 * 2]);
    }

    #[test]
    fn an_image_transform_is_the_pipeline_of_its_steps() {
        let s = ImageSpec {
            resize: Some(40),
            crop: Some([40, 30]),
            format: ImageFormat::Png,
            quality: 80,
            filter: Filter::Lanczos3,
        };
        let p = s.to_pipeline();
        assert_eq!(
            p.steps,
            [
                Step::Resize { shorter: 40 },
                Step::CenterCrop { size: [40, 30] }
            ]
        );
        assert_eq!(
            (p.output, p.quality, p.filter),
            (Output::Png, 80, PrepFilter::Lanczos3)
        );
        let input = jpeg_bytes(&gradient());
        let direct = Pipeline::conversion(p)
            .unwrap()
            .prepare(&input, 5, 6, "x")
            .unwrap();
        assert_eq!(
            apply(&s, &input).unwrap(),
            direct,
            "no draws: the seed changes nothing"
        );
        let back = image::load_from_memory(&direct.bytes).unwrap();
        assert_eq!((back.width(), back.height()), (30, 40));
    }

    #[test]
    fn no_steps_reencodes_at_full_size() {
        let input = png_bytes(&gradient());
        let out = apply(&spec(None, None, ImageFormat::Raw), &input).unwrap();
        assert_eq!(out.bytes, gradient().into_raw());
        let out = apply(&spec(None, None, ImageFormat::Jpeg), &input).unwrap();
        assert_eq!(&out.bytes[..3], &[0xFF, 0xD8, 0xFF]);
        assert_eq!((out.width, out.height), (64, 48));
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

    /// A crop larger than the image reaches past it, zero there (torchvision pads).
    #[test]
    fn a_crop_larger_than_the_image_is_padded_with_zeros() {
        let input = png_bytes(&gradient());
        let out = apply(&spec(None, Some([50, 64]), ImageFormat::Raw), &input).unwrap();
        assert_eq!((out.width, out.height), (64, 50));
        assert!(
            out.bytes[..64 * 3].iter().all(|&b| b == 0),
            "the first row is padding"
        );
        assert_eq!(&out.bytes[64 * 3..64 * 3 + 3], &[0, 0, 0]);
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
        let err = apply(&ImageSpec::default(), &png).unwrap_err();
        assert!(
            err.contains("20000x20000, more than 100000000 pixels"),
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
        }
        assert!(spec(Some(0), None, ImageFormat::Jpeg).validate().is_err());
        assert!(spec(None, Some([0, 5]), ImageFormat::Jpeg)
            .validate()
            .is_err());
        assert!(spec(None, Some([5, 0]), ImageFormat::Jpeg)
            .validate()
            .is_err());
        assert!(spec(None, Some([16_000, 16_000]), ImageFormat::Raw)
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
