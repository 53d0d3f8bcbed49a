//! Pixels: decode (JPEG with zune-jpeg, PNG with the `image` crate), cut, resize
//! (fast_image_resize's bilinear convolution, Pillow's antialiased filter), flip, encode.

use std::cell::RefCell;
use std::io::Cursor;

use fast_image_resize::images::{Image, ImageRef};
use fast_image_resize::{FilterType, PixelType, ResizeAlg, ResizeOptions, Resizer};
use image::codecs::jpeg::JpegEncoder;
use image::{ExtendedColorType, ImageDecoder, ImageEncoder, Limits};
use zune_core::bytestream::ZCursor;
use zune_core::colorspace::ColorSpace;
use zune_core::options::DecoderOptions;
use zune_jpeg::JpegDecoder;

use crate::crop::Rect;
use crate::PrepError;

/// The most pixels an input may have: 100 megapixels, checked from the header before any
/// pixel is decoded.
pub const MAX_PIXELS: u64 = 100_000_000;

/// An RGB image, 3 bytes a pixel, rows top to bottom.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rgb {
    pub width: u32,
    pub height: u32,
    pub pixels: Vec<u8>,
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

/// Decodes a JPEG or PNG (by its magic bytes) to RGB.
pub fn decode(input: &[u8]) -> Result<Rgb, PrepError> {
    if input.starts_with(&[0xff, 0xd8, 0xff]) {
        decode_jpeg(input)
    } else if input.starts_with(b"\x89PNG\r\n\x1a\n") {
        decode_png(input)
    } else {
        Err(PrepError::Decode("neither a JPEG nor a PNG".into()))
    }
}

fn decode_jpeg(input: &[u8]) -> Result<Rgb, PrepError> {
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
    refuse_large(u64::from(info.width), u64::from(info.height))?;
    let pixels = d
        .decode()
        .map_err(|e| PrepError::Decode(format!("JPEG: {e:?}")))?;
    let (width, height) = (u32::from(info.width), u32::from(info.height));
    if pixels.len() != width as usize * height as usize * 3 {
        return Err(PrepError::Decode(format!(
            "JPEG: {} bytes decoded for {width}x{height} RGB",
            pixels.len()
        )));
    }
    Ok(Rgb {
        width,
        height,
        pixels,
    })
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

thread_local! {
    /// Each thread's resizer: it keeps its scratch buffers between images.
    static RESIZER: RefCell<Resizer> = RefCell::new(Resizer::new());
}

/// `region` of `src`, resized to `width` × `height` with Pillow's antialiased bilinear
/// filter (what torchvision's `resize` does to a PIL image). `region` lies inside `src`.
pub fn resize(src: &Rgb, region: Rect, width: u32, height: u32) -> Result<Rgb, PrepError> {
    debug_assert!(region.left >= 0 && region.top >= 0);
    let view = ImageRef::new(src.width, src.height, &src.pixels, PixelType::U8x3)
        .map_err(|e| PrepError::Internal(format!("resize source: {e}")))?;
    let mut dst = Image::new(width, height, PixelType::U8x3);
    let options = ResizeOptions::new()
        .resize_alg(ResizeAlg::Convolution(FilterType::Bilinear))
        .crop(
            region.left as f64,
            region.top as f64,
            f64::from(region.width),
            f64::from(region.height),
        );
    RESIZER
        .with(|r| r.borrow_mut().resize(&view, &mut dst, &options))
        .map_err(|e| PrepError::Internal(format!("resize: {e}")))?;
    Ok(Rgb {
        width,
        height,
        pixels: dst.into_vec(),
    })
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
        assert_eq!(resize(&img, whole, 8, 8).unwrap(), img);
        let flat = Rgb {
            width: 8,
            height: 8,
            pixels: vec![200; 192],
        };
        let half = resize(&flat, whole, 4, 4).unwrap();
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
