//! Where the crops fall, by torchvision's rules (`transforms.RandomResizedCrop.get_params`,
//! `functional.center_crop`, `functional.resize`'s output size), in the same arithmetic:
//! Python's `round` rounds half to even, and so does [`f64::round_ties_even`].

use crate::draw::Draws;

/// A rectangle of an image, in pixels. Where it reaches past the image (a center crop
/// larger than the image) the pixels outside are zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rect {
    pub left: i64,
    pub top: i64,
    pub width: u32,
    pub height: u32,
}

/// torchvision's `RandomResizedCrop.get_params(img, scale, ratio)` on a `width` ×
/// `height` image: ten tries of an area fraction uniform in `scale` and an aspect
/// log-uniform in `ratio`, the first that fits placed uniformly; else the whole image,
/// cut to the nearest aspect in `ratio`, centred.
pub fn random_resized_crop(
    width: u32,
    height: u32,
    scale: [f64; 2],
    ratio: [f64; 2],
    draws: &mut Draws,
) -> Rect {
    let (fw, fh) = (f64::from(width), f64::from(height));
    let area = fw * fh;
    let (log_lo, log_hi) = (ratio[0].ln(), ratio[1].ln());
    for _ in 0..10 {
        let target_area = area * draws.uniform(scale[0], scale[1]);
        let aspect = draws.uniform(log_lo, log_hi).exp();
        let w = (target_area * aspect).sqrt().round_ties_even();
        let h = (target_area / aspect).sqrt().round_ties_even();
        if 0.0 < w && w <= fw && 0.0 < h && h <= fh {
            let (w, h) = (w as u32, h as u32);
            // torch.randint(0, n + 1): uniform in 0..=n.
            let top = draws.below(u64::from(height - h) + 1) as i64;
            let left = draws.below(u64::from(width - w) + 1) as i64;
            return Rect {
                left,
                top,
                width: w,
                height: h,
            };
        }
    }
    let in_ratio = fw / fh;
    let (w, h) = if in_ratio < ratio[0] {
        (width, ((fw / ratio[0]).round_ties_even() as u32).max(1))
    } else if in_ratio > ratio[1] {
        (((fh * ratio[1]).round_ties_even() as u32).max(1), height)
    } else {
        (width, height)
    };
    Rect {
        left: i64::from((width - w) / 2),
        top: i64::from((height - h) / 2),
        width: w,
        height: h,
    }
}

/// torchvision's `center_crop(img, [height, width])`: centred at `round((H - h) / 2)`,
/// reaching past a smaller image (where torchvision pads with zeros first, to the same
/// pixels).
pub fn center_crop(width: u32, height: u32, size: [u32; 2]) -> Rect {
    let [ch, cw] = size;
    let offset = |outer: u32, inner: u32| -> i64 {
        if inner > outer {
            // torchvision pads (inner - outer) // 2 before: the crop starts that far out.
            -i64::from((inner - outer) / 2)
        } else {
            (f64::from(outer - inner) / 2.0).round_ties_even() as i64
        }
    };
    Rect {
        left: offset(width, cw),
        top: offset(height, ch),
        width: cw,
        height: ch,
    }
}

/// torchvision's `resize(img, shorter)` output size: the shorter side becomes `shorter`,
/// the longer `int(shorter * long / short)` (truncated).
pub fn resized_shorter(width: u32, height: u32, shorter: u32) -> (u32, u32) {
    // An image has no side of 0 (a decoder refuses one); one would divide by zero here.
    let (short, long) = (width.min(height).max(1), width.max(height));
    let new_long = ((u64::from(shorter) * u64::from(long)) / u64::from(short)).max(1) as u32;
    if width <= height {
        (shorter, new_long)
    } else {
        (new_long, shorter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every crop lies inside the image, keeps its area fraction in `scale` and its aspect
    /// in `ratio` (up to the rounding to whole pixels), and is the same for the same
    /// draws; across samples the crops spread over the whole image.
    #[test]
    fn random_resized_crops_follow_torchvisions_ranges() {
        let (scale, ratio) = ([0.08, 1.0], [3.0 / 4.0, 4.0 / 3.0]);
        let (mut lefts, mut fallbacks) = (Vec::new(), 0);
        for (w, h) in [
            (500u32, 375u32),
            (375, 500),
            (640, 427),
            (224, 224),
            (1000, 40),
        ] {
            for i in 0..2_000 {
                let key = format!("s/{i}");
                let r = random_resized_crop(w, h, scale, ratio, &mut Draws::new(7, 1, 0, &key));
                assert_eq!(
                    r,
                    random_resized_crop(w, h, scale, ratio, &mut Draws::new(7, 1, 0, &key))
                );
                assert!(r.left >= 0 && r.top >= 0, "{r:?}");
                assert!(
                    r.left as u32 + r.width <= w && r.top as u32 + r.height <= h,
                    "{r:?}"
                );
                let whole = r.width == w || r.height == h;
                let area = f64::from(r.width) * f64::from(r.height) / (f64::from(w) * f64::from(h));
                let aspect = f64::from(r.width) / f64::from(r.height);
                let slack_area = 2.0 * (f64::from(r.width) + f64::from(r.height))
                    / (f64::from(w) * f64::from(h));
                if (1000, 40) == (w, h) {
                    // No crop of aspect 3/4..4/3 and 8% or more of the area fits: the
                    // fallback, the whole height at the widest aspect, centred.
                    assert_eq!(
                        r,
                        Rect {
                            left: 473,
                            top: 0,
                            width: 53,
                            height: 40
                        }
                    );
                    fallbacks += 1;
                    continue;
                }
                assert!(
                    area >= scale[0] - slack_area && area <= scale[1] + slack_area || whole,
                    "{w}x{h} {r:?} area {area}"
                );
                let slack_aspect = aspect * (1.0 / f64::from(r.width) + 1.0 / f64::from(r.height));
                assert!(
                    aspect >= ratio[0] - slack_aspect && aspect <= ratio[1] + slack_aspect,
                    "{w}x{h} {r:?} aspect {aspect}"
                );
                if (w, h) == (500, 375) {
                    lefts.push(r.left);
                }
            }
        }
        assert_eq!(fallbacks, 2_000);
        // Lefts reach both edges' neighbourhoods: placement is uniform, not centred.
        assert!(lefts.iter().filter(|&&l| l == 0).count() > 5);
        assert!(*lefts.iter().max().unwrap() > 350);
    }

    #[test]
    fn center_crops_and_resizes_round_as_torchvision_does() {
        // (375 - 224) / 2 = 75.5 rounds to 76 (half to even), (500 - 224) / 2 = 138.
        assert_eq!(
            center_crop(500, 375, [224, 224]),
            Rect {
                left: 138,
                top: 76,
                width: 224,
                height: 224
            }
        );
        // (225 - 224) / 2 = 0.5 rounds to 0.
        assert_eq!(center_crop(225, 225, [224, 224]).left, 0);
        // Larger than the image: starts (224 - 200) / 2 = 12 pixels out.
        assert_eq!(
            center_crop(200, 300, [224, 224]),
            Rect {
                left: -12,
                top: 38,
                width: 224,
                height: 224
            }
        );
        assert_eq!(resized_shorter(500, 375, 256), (341, 256));
        assert_eq!(resized_shorter(375, 500, 256), (256, 341));
        assert_eq!(resized_shorter(300, 300, 256), (256, 256));
    }
}
