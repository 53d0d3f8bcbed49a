//! Training-time preparation of a sample (a pipeline): decode, torchvision's
//! `RandomResizedCrop`, `RandomHorizontalFlip`, `Resize` and `CenterCrop`, to raw RGB or
//! a JPEG.
//!
//! A prepared sample is a pure function of the input bytes, the pipeline's definition and
//! (seed, epoch, sample key): every random choice comes from [`Draws`] keyed by those
//! alone, so the node that owns a shard, any other member, a node after a restart and the
//! client preparing locally all make the same bytes. The node and the client share this
//! crate for that reason.
//!
//! Where this differs from torchvision on PIL images (the draws' generator aside, which
//! is ours, not torch's): JPEGs are decoded by zune-jpeg, whose IDCT and chroma
//! upsampling can differ from libjpeg's by a level or so on a few pixels; resizes use
//! fast_image_resize's bilinear convolution, Pillow's antialiased filter in its own
//! fixed-point arithmetic. The crop rectangles and the flip follow torchvision's rules
//! exactly ([`crop`]).

pub mod crop;
pub mod draw;
pub mod pixels;
pub mod spec;

pub use draw::Draws;
pub use pixels::{Rgb, MAX_PIXELS};
pub use spec::{Output, PipelineSpec, SpecError, Step};

use crop::Rect;

/// Why a sample could not be prepared.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PrepError {
    /// The input is not an image this can decode, or is damaged.
    #[error("cannot decode: {0}")]
    Decode(String),
    /// The input's header claims more pixels than a node decodes.
    #[error("the image is {width}x{height}, more than {max} pixels")]
    TooLarge { width: u64, height: u64, max: u64 },
    /// A step failed on a decoded image (a bug, not the input's fault).
    #[error("preparation failed: {0}")]
    Internal(String),
}

/// A checked pipeline, ready to prepare samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Pipeline {
    spec: PipelineSpec,
    fingerprint: u64,
}

/// A prepared member: its bytes (raw RGB or a JPEG) and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepared {
    pub bytes: Vec<u8>,
    pub width: u32,
    pub height: u32,
}

impl Pipeline {
    /// Checks `spec`; the error says which field is wrong.
    pub fn new(spec: PipelineSpec) -> Result<Pipeline, SpecError> {
        spec.check()?;
        let fingerprint = spec.fingerprint();
        Ok(Pipeline { spec, fingerprint })
    }

    pub fn spec(&self) -> &PipelineSpec {
        &self.spec
    }

    /// The definition's hash, which the draws are keyed by.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Whether a member with this name (`0001.jpg`) is one the pipeline prepares.
    pub fn prepares(&self, member: &str) -> bool {
        self.spec.prepares(member)
    }

    /// Prepares `input` as sample `key` of `epoch` in a job seeded `seed`. Every member
    /// of one sample draws the same crops and flips (an image and its mask stay aligned).
    pub fn prepare(
        &self,
        input: &[u8],
        seed: u64,
        epoch: u64,
        key: &str,
    ) -> Result<Prepared, PrepError> {
        let mut img = pixels::decode(input)?;
        let mut draws = Draws::new(self.fingerprint, seed, epoch, key);
        for step in &self.spec.steps {
            img = apply(step, img, &mut draws)?;
        }
        let bytes = match self.spec.output {
            Output::Raw => std::mem::take(&mut img.pixels),
            Output::Jpeg => pixels::encode_jpeg(&img, self.spec.quality)?,
        };
        Ok(Prepared {
            bytes,
            width: img.width,
            height: img.height,
        })
    }
}

/// The key a shard member's draws are keyed by: the shard's key, a `/`, and the
/// sample's WebDataset key (its member names up to the file name's first dot), so every
/// member of a sample draws alike and no two samples of a bucket share draws.
pub fn sample_key(shard: &str, sample: &str) -> String {
    format!("{shard}/{sample}")
}

fn apply(step: &Step, mut img: Rgb, draws: &mut Draws) -> Result<Rgb, PrepError> {
    Ok(match *step {
        Step::RandomResizedCrop { size, scale, ratio } => {
            let region = crop::random_resized_crop(img.width, img.height, scale, ratio, draws);
            pixels::resize(&img, region, size[1], size[0])?
        }
        Step::RandomFlip { p } => {
            // torchvision: `if torch.rand(1) < p`.
            if draws.unit() < p {
                pixels::flip_horizontal(&mut img);
            }
            img
        }
        Step::Resize { shorter } => {
            let (w, h) = crop::resized_shorter(img.width, img.height, shorter);
            let whole = Rect {
                left: 0,
                top: 0,
                width: img.width,
                height: img.height,
            };
            pixels::resize(&img, whole, w, h)?
        }
        Step::CenterCrop { size } => {
            pixels::cut(&img, crop::center_crop(img.width, img.height, size))
        }
    })
}

#[cfg(test)]
mod tests;
