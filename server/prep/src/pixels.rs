//! Pixels: decode (JPEG with zune-jpeg, PNG with the `image` crate), cut, resize
//! (fast_image_resize's convolution, antialiased like Pillow's filters), flip, encode;
//! and what a file's first bytes say of the image ([`probe`]), so that what preparing it
//! takes is known before it is read whole or decoded.

use std::io::Cursor;
use std::sync::{Mutex, PoisonError};

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::codecs::jpeg::JpegEncoder;
use image::codecs::png::PngEncoder;
use image::{ExtendedColorType, ImageDecoder, ImageEncoder, Limits};
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use crate::crop::Rect;
use crate::spec::Filter;
use crate::{jpeg, PrepError, MAX_PIXELS};

/// An RGB image, 3 bytes a pixel, rows top to bottom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
}

/// Bytes of an RGB image of `width` x `height`.
pub fn rgb_bytes(width: u32, height: u32) -> u64 {
    u64::from(width) * u64::from(height) * 3
}

fn refuse_large(width: u64, height: u64) -> Result<(), PrepError> {
    if width * height > MAX_PIXELS {
        return Err(PrepError::TooLarge {
            width,
            height,
            max: MAX_PIXELS,
        });
    }
    Ok(())
}

/// An image format this decodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Jpeg,
    Png,
}

/// What an image's header says: its format and size, and the bytes its decode holds at
/// once besides the input (its output, the decoder's own buffers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub format: Format,
    pub width: u32,
    pub height: u32,
    pub decode_bytes: u64,
}

const JPEG_MAGIC: [u8; 3] = [0xff, 0xd8, 0xff];
const PNG_MAGIC: &[u8; 8] = b"\x89PNG\r\n\x1a\n";

/// The header of the image whose first bytes are `prefix`, of `len` bytes in all:
/// `Ok(None)` where it lies past the prefix. Anything but a JPEG or a PNG is refused
/// from its first bytes.
pub fn probe(prefix: &[u8], len: u64) -> Result<Option<Header>, PrepError> {
    let magic = |m: &[u8]| prefix.len() >= m.len() && prefix.starts_with(m);
    if magic(&JPEG_MAGIC) {
        let frame = match jpeg::probe(prefix)? {
            jpeg::Probe::Frame(f) => f,
            jpeg::Probe::More => return Ok(None),
        };
        refuse_large(u64::from(frame.width), u64::from(frame.height))?;
        let out = rgb_bytes(frame.width, frame.height);
        // The decoder reads a copy of the input with its padding, and holds every block's
        // coefficients where the image is progressive (or its components come in scans
        // of their own, which the header does not say: counted always). A progressive
        // image is decoded twice, the first picture kept beside the second.
        let padded = len + jpeg::MAX_PADDING;
        let twice = if frame.progressive { out } else { 0 };
        return Ok(Some(Header {
            format: Format::Jpeg,
            width: frame.width,
            height: frame.height,
            // Row buffers of whole MCUs, per component, for the colour conversion.
            decode_bytes: padded
                + out
                + twice
                + frame.coefficient_bytes()
                + u64::from(frame.width) * 256
                + (1 << 20),
        }));
    }
    if magic(PNG_MAGIC) {
        // IHDR is the first chunk: width, height, bit depth, colour type.
        let Some(ihdr) = prefix.get(8..29) else {
            return Ok(None);
        };
        if &ihdr[4..8] != b"IHDR" {
            return Err(PrepError::Decode("PNG: no IHDR chunk first".into()));
        }
        let be = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        let (width, height) = (be(&ihdr[8..12]), be(&ihdr[12..16]));
        let (depth, colour) = (ihdr[16], ihdr[17]);
        if width == 0 || height == 0 {
            return Err(PrepError::Decode(format!(
                "PNG: an image of {width}x{height}"
            )));
        }
        refuse_large(u64::from(width), u64::from(height))?;
        // The decoder's own layout (a palette expands to RGBA), then RGB8 beside it.
        let samples: u64 = match colour {
            0 => 1,
            4 => 2,
            2 => 3,
            _ => 4,
        };
        let native =
            u64::from(width) * u64::from(height) * samples * if depth == 16 { 2 } else { 1 };
        return Ok(Some(Header {
            format: Format::Png,
            width,
            height,
            decode_bytes: native + rgb_bytes(width, height) + (1 << 20),
        }));
    }
    let short = prefix.len() < PNG_MAGIC.len()
        && (JPEG_MAGIC.starts_with(&prefix[..prefix.len().min(3)])
            || PNG_MAGIC.starts_with(prefix));
    if short && (prefix.len() as u64) < len {
        return Ok(None);
    }
    Err(PrepError::Decode("neither a JPEG nor a PNG".into()))
}

/// Decodes a JPEG or PNG (by its magic bytes) to RGB.
pub fn decode(input: &[u8]) -> Result<Rgb, PrepError> {
    if input.starts_with(&JPEG_MAGIC) {
        decode_jpeg(input)
    } else if input.starts_with(PNG_MAGIC) {
        decode_png(input)
    } else {
        Err(PrepError::Decode("neither a JPEG nor a PNG".into()))
    }
}

fn decode_jpeg(input: &[u8]) -> Result<Rgb, PrepError> {
    // The walk refuses a file cut short, or cut between scans, before any pixel buffer is
    // made; the padding makes a scan cut inside its data fail in the decoder.
    let layout = crate::jpeg::layout(input)?;
    let (width, height) = (layout.frame.width, layout.frame.height);
    refuse_large(u64::from(width), u64::from(height))?;
    let mut padded = layout.padded(input);
    let pixels = zune_decode(&padded, (width, height))?;
    if layout.frame.progressive {
        layout.zero_padding(&mut padded);
        if zune_decode(&padded, (width, height))? != pixels {
            return Err(PrepError::Decode(
                "JPEG: the last scan ends early: the file is cut short".into(),
            ));
        }
    }
    Ok(Rgb {
        width,
        height,
        pixels,
    })
}

/// zune-jpeg's RGB pixels of `input`, a `width` x `height` JPEG, in strict mode.
fn zune_decode(input: &[u8], (width, height): (u32, u32)) -> Result<Vec<u8>, PrepError> {
    let options = DecoderOptions::default()
        .jpeg_set_out_colorspace(ColorSpace::RGB)
        .set_max_width(usize::from(u16::MAX))
        .set_max_height(usize::from(u16::MAX))
        .set_strict_mode(true);
    let mut d = JpegDecoder::new_with_options(ZCursor::new(input), options);
    d.decode_headers()
        .map_err(|e| PrepError::Decode(format!("JPEG: {e:?}")))?;
    let info = d
        .info()
        .ok_or_else(|| PrepError::Decode("JPEG: no frame header".into()))?;
    if (u32::from(info.width), u32::from(info.height)) != (width, height) {
        return Err(PrepError::Decode(format!(
            "JPEG: the decoder reads {}x{} where the frame says {width}x{height}",
            info.width, info.height
        )));
    }
    let pixels = d
        .decode()
        .map_err(|e| PrepError::Decode(format!("JPEG: {e:?}")))?;
    if pixels.len() != width as usize * height as usize * 3 {
        return Err(PrepError::Decode(format!(
            "JPEG: {} bytes decoded for {width}x{height} RGB",
            pixels.len()
        )));
    }
    Ok(pixels)
}

fn decode_png(input: &[u8]) -> Result<Rgb, PrepError> {
    let bad = |e: image::ImageError| PrepError::Decode(format!("PNG: {e}"));
    let mut decoder = image::codecs::png::PngDecoder::new(Cursor::new(input)).map_err(bad)?;
    let (w, h) = decoder.dimensions();
    refuse_large(u64::from(w), u64::from(h))?;
    let mut limits = Limits::default();
    limits.max_alloc = Some(MAX_PIXELS * 8);
    decoder.set_limits(limits).map_err(bad)?;
    let rgb = image::DynamicImage::from_decoder(decoder)
        .map_err(bad)?
        .to_rgb8();
    Ok(Rgb {
        width: rgb.width(),
        height: rgb.height(),
        pixels: rgb.into_raw(),
    })
}

/// The most scratch a resizer keeps between images: a resize that needs more gets a
/// resizer of its own, dropped with its buffers. Kept resizers save allocating and zeroing
/// their buffers for every image (8% of the resize's instructions at ImageNet's sizes, by
/// callgrind).
pub const KEEP_SCRATCH: u64 = 4 << 20;

/// Resizers between resizes of at most [`KEEP_SCRATCH`]: one is taken for a resize and put
/// back after it, so there are never more than resizes have run at once (at most
/// `--prep-threads`; the node's prep budget leaves room for them). (A
/// resizer per thread would be kept by every thread of the blocking pool that ever ran one.)
static RESIZERS: Mutex<Vec<Resizer>> = Mutex::new(Vec::new());

/// `region` of `src`, resized to `width` x `height` with `filter`, antialiased (what
/// torchvision's `resize` does to a PIL image with the bilinear filter). `region` lies
/// inside `src`.
pub fn resize(
    src: &Rgb,
    region: Rect,
    width: u32,
    height: u32,
    filter: Filter,
) -> Result<Rgb, PrepError> {
    debug_assert!(region.left >= 0 && region.top >= 0);
    let view = ImageRef::new(src.width, src.height, &src.pixels, PixelType::U8x3)
        .map_err(|e| PrepError::Internal(format!("resize source: {e}")))?;
    let mut dst = Image::new(width, height, PixelType::U8x3);
    let alg = match filter {
        Filter::Bilinear => ResizeAlg::Convolution(FilterType::Bilinear),
        Filter::Nearest => ResizeAlg::Nearest,
        Filter::CatmullRom => ResizeAlg::Convolution(FilterType::CatmullRom),
        Filter::Lanczos3 => ResizeAlg::Convolution(FilterType::Lanczos3),
    };
    let options = ResizeOptions::new().resize_alg(alg).crop(
        region.left as f64,
        region.top as f64,
        f64::from(region.width),
        f64::from(region.height),
    );
    let scratch = resize_scratch((region.width, region.height), (width, height));
    let resized = if scratch <= KEEP_SCRATCH {
        let kept = || RESIZERS.lock().unwrap_or_else(PoisonError::into_inner);
        let mut resizer = kept().pop().unwrap_or_default();
        let resized = resizer.resize(&view, &mut dst, &options);
        kept().push(resizer);
        resized
    } else {
        Resizer::new().resize(&view, &mut dst, &options)
    };
    resized.map_err(|e| PrepError::Internal(format!("resize: {e}")))?;
    Ok(Rgb {
        width,
        height,
        pixels: dst.into_vec(),
    })
}

/// Bytes a resize of a `src` image (or a region of it) to `dst` holds besides both:
/// the vertical pass's image (the source's used columns by the output's rows) and the
/// filters' weights.
pub fn resize_scratch(src: (u32, u32), dst: (u32, u32)) -> u64 {
    let (sw, sh) = (u64::from(src.0), u64::from(src.1));
    let (dw, dh) = (u64::from(dst.0), u64::from(dst.1));
    // Lanczos3 reaches 3 source pixels each side per output pixel, scaled by the
    // reduction: about 6 weights (8 bytes, and a 2-byte copy) per source pixel a side.
    sw * dh * 3 + 128 * (sw + sh + dw + dh) + (64 << 10)
}

/// `region` of `src`, cut out as it is; pixels of the region outside `src` are zero.
pub fn cut(src: &Rgb, region: Rect) -> Rgb {
    let (w, h) = (region.width as usize, region.height as usize);
    let mut pixels = vec![0u8; w * h * 3];
    let (sw, sh) = (i64::from(src.width), i64::from(src.height));
    // The columns of the region inside the source, once for every row.
    let x0 = region.left.clamp(0, sw);
    let x1 = (region.left + w as i64).clamp(0, sw);
    if x1 > x0 {
        let len = (x1 - x0) as usize * 3;
        let dst_x = (x0 - region.left) as usize * 3;
        for row in 0..h {
            let y = region.top + row as i64;
            if !(0..sh).contains(&y) {
                continue;
            }
            let src_at = (y as usize * src.width as usize + x0 as usize) * 3;
            let dst_at = row * w * 3 + dst_x;
            pixels[dst_at..dst_at + len].copy_from_slice(&src.pixels[src_at..src_at + len]);
        }
    }
    Rgb {
        width: region.width,
        height: region.height,
        pixels,
    }
}

/// Mirrors the image left to right, in place.
pub fn flip_horizontal(img: &mut Rgb) {
    let w = img.width as usize;
    for row in img.pixels.chunks_exact_mut(w * 3) {
        for x in 0..w / 2 {
            let (a, b) = (x * 3, (w - 1 - x) * 3);
            for c in 0..3 {
                row.swap(a + c, b + c);
            }
        }
    }
}

/// A baseline JPEG of `img` at `quality`.
pub fn encode_jpeg(img: &Rgb, quality: u8) -> Result<Vec<u8>, PrepError> {
    let mut out = Vec::with_capacity(img.pixels.len() / 8);
    JpegEncoder::new_with_quality(&mut out, quality)
        .write_image(&img.pixels, img.width, img.height, ExtendedColorType::Rgb8)
        .map_err(|e| PrepError::Internal(format!("JPEG encode: {e}")))?;
    Ok(out)
}

/// An 8-bit RGB PNG of `img`, at the encoder's default compression and filter.
pub fn encode_png(img: &Rgb) -> Result<Vec<u8>, PrepError> {
    let mut out = Vec::with_capacity(img.pixels.len() / 2);
    PngEncoder::new(&mut out)
        .write_image(&img.pixels, img.width, img.height, ExtendedColorType::Rgb8)
        .map_err(|e| PrepError::Internal(format!("PNG encode: {e}")))?;
    Ok(out)
}

/// Bytes an encoding of `width` x `height` may hold: its output (a growing buffer, up to
/// twice what it holds), and for a PNG the filtered rows the encoder compresses whole;
/// the encoder's tables and windows.
pub fn encode_bytes(png: bool, width: u32, height: u32) -> u64 {
    let (times, tables) = if png { (6, 2 << 20) } else { (2, 1 << 20) };
    times * rgb_bytes(width, height) + tables
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ramp(width: u32, height: u32) -> Rgb {
        let mut pixels = Vec::new();
        for y in 0..height {
            for x in 0..width {
                pixels.extend_from_slice(&[x as u8, y as u8, (x + y) as u8]);
            }
        }
        Rgb {
            width,
            height,
            pixels,
        }
    }

    #[test]
    fn cut_copies_inside_and_zeroes_outside() {
        let img = ramp(10, 6);
        let inside = cut(
            &img,
            Rect {
                left: 2,
                top: 1,
                width: 3,
                height: 2,
            },
        );
        assert_eq!(&inside.pixels[..3], &[2, 1, 3]);
        assert_eq!(&inside.pixels[15..], &[4, 2, 6]);
        let over = cut(
            &img,
            Rect {
                left: -1,
                top: -1,
                width: 12,
                height: 8,
            },
        );
        assert_eq!(&over.pixels[..3], &[0, 0, 0]);
        // Row 1, column 1 of the cut is the source's (0, 0).
        let at = (12 + 1) * 3;
        assert_eq!(&over.pixels[at..at + 3], &[0, 0, 0]);
        let at = (12 * 2 + 2) * 3;
        assert_eq!(&over.pixels[at..at + 3], &[1, 1, 2]);
        assert_eq!(&over.pixels[over.pixels.len() - 3..], &[0, 0, 0]);
    }

    #[test]
    fn flip_mirrors_each_row() {
        let mut img = ramp(5, 2);
        flip_horizontal(&mut img);
        assert_eq!(&img.pixels[..3], &[4, 0, 4]);
        assert_eq!(&img.pixels[12..15], &[0, 0, 0]);
        flip_horizontal(&mut img);
        assert_eq!(img, ramp(5, 2));
    }

    #[test]
    fn a_resize_to_the_same_size_keeps_the_pixels_and_a_halving_averages() {
        let img = ramp(8, 8);
        let whole = Rect {
            left: 0,
            top: 0,
            width: 8,
            height: 8,
        };
        assert_eq!(resize(&img, whole, 8, 8, Filter::Bilinear).unwrap(), img);
        let flat = Rgb {
            width: 8,
            height: 8,
            pixels: vec![200; 192],
        };
        let half = resize(&flat, whole, 4, 4, Filter::Bilinear).unwrap();
        assert!(half.pixels.iter().all(|&p| p == 200), "{:?}", half.pixels);
    }

    #[test]
    fn undecodable_and_oversized_inputs_are_refused() {
        assert!(matches!(decode(b"not an image"), Err(PrepError::Decode(_))));
        assert!(matches!(
            decode(&[0xff, 0xd8, 0xff, 0xe0, 0, 0]),
            Err(PrepError::Decode(_))
        ));
        // A JPEG header claiming 60000 x 60000 (3.6 gigapixels), and nothing after it.
        let mut sof = vec![0xff, 0xd8, 0xff, 0xc0, 0x00, 0x11, 0x08];
        sof.extend_from_slice(&60000u16.to_be_bytes());
        sof.extend_from_slice(&60000u16.to_be_bytes());
        sof.extend_from_slice(&[3, 1, 0x11, 0, 2, 0x11, 1, 3, 0x11, 1]);
        let got = decode(&sof);
        assert!(
            matches!(
                got,
                Err(PrepError::TooLarge { .. }) | Err(PrepError::Decode(_))
            ),
            "{got:?}"
        );
    }
}
