//! A pipeline's definition as the TOML names it (`[pipelines.NAME]`), checked, with the
//! fingerprint its random draws are keyed by.

use granary_proto::shards::split_name;
use serde::{Deserialize, Serialize};

use crate::MAX_PIXELS;

/// The longest side a step may ask for: a definition past it is a typo, not a recipe.
pub const MAX_SIDE: u32 = 16_384;

/// One pipeline, as written in the config.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct PipelineSpec {
    /// The members of a sample it prepares, by extension (`jpg` for `0001.jpg`); the
    /// sample's other members pass as they are.
    #[serde(default = "default_members")]
    pub members: Vec<String>,
    /// The steps, in order.
    pub steps: Vec<Step>,
    /// What a prepared member holds.
    #[serde(default)]
    pub output: Output,
    /// JPEG quality of `output = "jpeg"`, 1..=100.
    #[serde(default = "default_quality")]
    pub quality: u8,
    /// The filter every resize uses. Written only where it is not the default, so a
    /// definition that does not name one keeps its fingerprint (and its draws).
    #[serde(default, skip_serializing_if = "Filter::is_default")]
    pub filter: Filter,
}

/// A resize's filter (antialiased: its support scales with the reduction).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Filter {
    /// Bilinear (triangle): torchvision's antialiased `BILINEAR` on PIL images.
    #[default]
    Bilinear,
    /// Nearest neighbour.
    Nearest,
    /// Catmull-Rom cubic.
    CatmullRom,
    /// Lanczos with a window of 3.
    Lanczos3,
}

impl Filter {
    fn is_default(&self) -> bool {
        *self == Filter::Bilinear
    }
}

/// One step. Sizes are `[height, width]`, as torchvision takes them.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// torchvision's `RandomResizedCrop(size, scale, ratio)`: a crop of a random area
    /// fraction (uniform in `scale`) and aspect (log-uniform in `ratio`), resized to
    /// `size` (bilinear, antialiased).
    RandomResizedCrop {
        size: [u32; 2],
        #[serde(default = "default_scale")]
        scale: [f64; 2],
        #[serde(default = "default_ratio")]
        ratio: [f64; 2],
    },
    /// torchvision's `RandomHorizontalFlip(p)`.
    RandomFlip {
        #[serde(default = "default_p")]
        p: f64,
    },
    /// torchvision's `Resize(shorter)`: the shorter side becomes `shorter`, the longer
    /// keeps the aspect (truncated), bilinear and antialiased.
    Resize { shorter: u32 },
    /// torchvision's `CenterCrop(size)`, zero-padded where the image is smaller.
    CenterCrop { size: [u32; 2] },
}

/// What a prepared member holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Output {
    /// uint8 RGB, height × width × 3 bytes, rows top to bottom, no header.
    #[default]
    Raw,
    /// A baseline JPEG at `quality`.
    Jpeg,
    /// A PNG (8-bit RGB, the encoder's default compression).
    Png,
}

fn default_members() -> Vec<String> {
    ["jpg", "jpeg", "png"].map(String::from).to_vec()
}

fn default_quality() -> u8 {
    90
}

fn default_scale() -> [f64; 2] {
    [0.08, 1.0]
}

fn default_ratio() -> [f64; 2] {
    [3.0 / 4.0, 4.0 / 3.0]
}

fn default_p() -> f64 {
    0.5
}

/// A definition that cannot run, in words (the config's loader adds where it stands).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SpecError(pub String);

impl PipelineSpec {
    /// Checks every field: the pipeline then runs on any image without a config error.
    pub fn check(&self) -> Result<(), SpecError> {
        if self.steps.is_empty() {
            return Err(SpecError("steps: a pipeline has at least one step".into()));
        }
        self.check_fields()
    }

    /// [`PipelineSpec::check`] without its rule of one step at least: a conversion (a
    /// transform that decodes and encodes again) has none.
    pub fn check_fields(&self) -> Result<(), SpecError> {
        let bad = |m: String| Err(SpecError(m));
        if self.members.is_empty() {
            return bad("members: name at least one member extension (\"jpg\")".into());
        }
        for m in &self.members {
            if m.is_empty() || m.contains(['.', '/']) {
                return bad(format!(
                    "members: {m:?} is not an extension (\"jpg\", not \".jpg\")"
                ));
            }
        }
        if !(1..=100).contains(&self.quality) {
            return bad(format!("quality = {}: 1 to 100", self.quality));
        }
        for (i, step) in self.steps.iter().enumerate() {
            step.check()
                .map_err(|e| SpecError(format!("steps[{i}]: {e}")))?;
        }
        Ok(())
    }

    /// Whether a member with this name (`dir/0001.jpg`) is one the pipeline prepares:
    /// its extension as WebDataset reads it (all of the file name after its first dot).
    pub fn prepares(&self, member: &str) -> bool {
        split_name(member)
            .is_some_and(|(_, ext)| self.members.iter().any(|m| m.eq_ignore_ascii_case(&ext)))
    }

    /// A hash of the definition: every random draw is keyed by it, so another definition
    /// gives other draws, and the same one the same on any machine.
    pub fn fingerprint(&self) -> u64 {
        // The derived serialisation writes fields in declaration order and floats by
        // their shortest exact form: the same definition, the same text.
        let text = serde_json::to_string(self).expect("a spec serialises");
        xxhash_rust::xxh3::xxh3_64(text.as_bytes())
    }
}

/// A step's output of `size` (`[height, width]`) holds at most [`MAX_PIXELS`].
fn area(size: &[u32; 2]) -> Result<(), String> {
    let pixels = u64::from(size[0]) * u64::from(size[1]);
    if pixels > MAX_PIXELS {
        return Err(format!(
            "size = [{}, {}] makes {pixels} pixels, more than {MAX_PIXELS}",
            size[0], size[1]
        ));
    }
    Ok(())
}

impl Step {
    fn check(&self) -> Result<(), String> {
        let side = |what: &str, n: u32| {
            if (1..=MAX_SIDE).contains(&n) {
                Ok(())
            } else {
                Err(format!("{what} = {n}: 1 to {MAX_SIDE}"))
            }
        };
        match self {
            Step::RandomResizedCrop { size, scale, ratio } => {
                side("size[0]", size[0])?;
                side("size[1]", size[1])?;
                area(size)?;
                let [s0, s1] = *scale;
                if !(s0.is_finite() && s1.is_finite() && 0.0 < s0 && s0 <= s1 && s1 <= 1.0) {
                    return Err(format!(
                        "scale = [{s0}, {s1}]: 0 < low <= high <= 1 (an area fraction)"
                    ));
                }
                let [r0, r1] = *ratio;
                if !(r0.is_finite() && r1.is_finite() && 0.0 < r0 && r0 <= r1) {
                    return Err(format!(
                        "ratio = [{r0}, {r1}]: 0 < low <= high (width over height)"
                    ));
                }
                Ok(())
            }
            Step::RandomFlip { p } => {
                if (0.0..=1.0).contains(p) {
                    Ok(())
                } else {
                    Err(format!("p = {p}: a probability, 0 to 1"))
                }
            }
            Step::Resize { shorter } => side("shorter", *shorter),
            Step::CenterCrop { size } => {
                side("size[0]", size[0])?;
                side("size[1]", size[1])?;
                area(size)
            }
        }
    }
}
