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
pub mod fuzz;
pub mod jpeg;
pub mod measure;
pub mod pixels;
pub mod spec;

pub use draw::Draws;
pub use pixels::{Format, Header, Rgb};
pub use spec::{Filter, Output, PipelineSpec, SpecError, Step};

use crop::Rect;
use pixels::{encode_bytes, resize_scratch, rgb_bytes};

/// The most pixels an image may have, as input (checked from the header before any pixel
/// is decoded) and after any step (checked from the definition and the input's size
/// before the step allocates): 100 megapixels.
pub const MAX_PIXELS: u64 = 100_000_000;

/// The most memory one preparation may take, input included: a preparation whose
/// definition and input's header say it would take more is refused before it begins. A
/// node admits preparations against a budget of these (its prep threads' share).
pub const MAX_WORK: u64 = 1 << 30;

/// Why a sample could not be prepared.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PrepError {
    /// The input is not an image this can decode, or is damaged.
    #[error("cannot decode: {0}")]
    Decode(String),
    /// The input's header claims more pixels than a node decodes.
    #[error("the image is {width}x{height}, more than {max} pixels")]
    TooLarge { width: u64, height: u64, max: u64 },
    /// A step would make an image of more pixels than a node makes (a resize of an image
    /// of an extreme aspect).
    #[error("step {step} would make a {width}x{height} image, more than {max} pixels")]
    StepTooLarge {
        step: usize,
        width: u64,
        height: u64,
        max: u64,
    },
    /// Preparing it would take more memory than one preparation may.
    #[error("preparing it would take {needs} bytes of memory, more than the {max} a preparation may take")]
    TooMuchMemory { needs: u64, max: u64 },
    /// The preparation was stopped between two steps: nobody waits for it any more.
    #[error("stopped: no reader waits for it any more")]
    Cancelled,
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
        Ok(Pipeline::checked(spec))
    }

    /// A conversion: like [`Pipeline::new`], with no step needed (decode, then encode as
    /// `output` says).
    pub fn conversion(spec: PipelineSpec) -> Result<Pipeline, SpecError> {
        spec.check_fields()?;
        Ok(Pipeline::checked(spec))
    }

    fn checked(spec: PipelineSpec) -> Pipeline {
        let fingerprint = spec.fingerprint();
        Pipeline { spec, fingerprint }
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

    /// The memory preparing an image with this header takes at most, its input of
    /// `input_len` bytes included: every step's output size follows from the definition
    /// and the header, so this is known before the input is read whole. Refused where an
    /// image, any step's output or the whole would be too large.
    pub fn cost(&self, header: &Header, input_len: u64) -> Result<u64, PrepError> {
        let (mut w, mut h) = (header.width, header.height);
        let mut peak = header.decode_bytes;
        for (i, step) in self.spec.steps.iter().enumerate() {
            let (nw, nh, scratch) = match *step {
                Step::RandomResizedCrop { size, .. } => {
                    (size[1], size[0], resize_scratch((w, h), (size[1], size[0])))
                }
                Step::RandomFlip { .. } => (w, h, 0),
                Step::Resize { shorter } => {
                    let (nw, nh) = crop::resized_shorter(w, h, shorter);
                    (nw, nh, resize_scratch((w, h), (nw, nh)))
                }
                Step::CenterCrop { size } => (size[1], size[0], 0),
            };
            if u64::from(nw) * u64::from(nh) > MAX_PIXELS {
                return Err(PrepError::StepTooLarge {
                    step: i,
                    width: u64::from(nw),
                    height: u64::from(nh),
                    max: MAX_PIXELS,
                });
            }
            peak = peak.max(rgb_bytes(w, h) + rgb_bytes(nw, nh) + scratch);
            (w, h) = (nw, nh);
        }
        if self.spec.output != Output::Raw {
            let png = self.spec.output == Output::Png;
            peak = peak.max(rgb_bytes(w, h) + encode_bytes(png, w, h));
        }
        // An eighth more, for what the model leaves out (measured: examples/peak.rs).
        let needs = (input_len + peak) / 8 * 9;
        if needs > MAX_WORK {
            return Err(PrepError::TooMuchMemory {
                needs,
                max: MAX_WORK,
            });
        }
        Ok(needs)
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
        self.prepare_while(input, (seed, epoch, key), &|| true)
    }

    /// [`Pipeline::prepare`], asking `go_on` before the decode and before each step
    /// whether anyone still waits for the sample: [`PrepError::Cancelled`] where not.
    /// What it will take is checked first ([`Pipeline::cost`]): nothing is decoded or
    /// allocated for an input that would take too much.
    pub fn prepare_while(
        &self,
        input: &[u8],
        (seed, epoch, key): (u64, u64, &str),
        go_on: &dyn Fn() -> bool,
    ) -> Result<Prepared, PrepError> {
        let header = pixels::probe(input, input.len() as u64)?
            .ok_or_else(|| PrepError::Decode("the image ends inside its header".into()))?;
        self.cost(&header, input.len() as u64)?;
        let stop = || (!go_on()).then_some(PrepError::Cancelled);
        if let Some(e) = stop() {
            return Err(e);
        }
        let mut img = pixels::decode(input)?;
        if (img.width, img.height) != (header.width, header.height) {
            return Err(PrepError::Decode(format!(
                "the header says {}x{}, the decoder made {}x{}",
                header.width, header.height, img.width, img.height
            )));
        }
        let mut draws = Draws::new(self.fingerprint, seed, epoch, key);
        for step in &self.spec.steps {
            if let Some(e) = stop() {
                return Err(e);
            }
            img = apply(step, img, self.spec.filter, &mut draws)?;
        }
        let bytes = match self.spec.output {
            Output::Raw => std::mem::take(&mut img.pixels),
            Output::Jpeg => pixels::encode_jpeg(&img, self.spec.quality)?,
            Output::Png => pixels::encode_png(&img)?,
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

fn apply(step: &Step, mut img: Rgb, filter: Filter, draws: &mut Draws) -> Result<Rgb, PrepError> {
    Ok(match *step {
        Step::RandomResizedCrop { size, scale, ratio } => {
            let region = crop::random_resized_crop(img.width, img.height, scale, ratio, draws);
            pixels::resize(&img, region, size[1], size[0], filter)?
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
            pixels::resize(&img, whole, w, h, filter)?
        }
        Step::CenterCrop { size } => {
            pixels::cut(&img, crop::center_crop(img.width, img.height, size))
        }
    })
}

#[cfg(test)]
mod tests;
