//! A JPEG's structure, walked marker by marker without decoding a pixel: the frame's size
//! before anything is allocated for it, and whether the image is whole.
//!
//! The walk skips each scan's entropy-coded data to the marker that closes it, so it is
//! cheap (a pass over the bytes looking for `0xFF`). It refuses an image that ends early:
//! no end-of-image marker after its scans (a file cut short), a component no scan codes,
//! or, in a progressive JPEG, a coefficient never refined to full precision (a file cut
//! between two scans, an end marker appended). What it cannot see is a scan cut inside
//! its data with an end marker appended: the decoder would take the marker for the end
//! of the data and fill the rest with zeros (zune-jpeg, like libjpeg, calls that a
//! warning). [`Layout::padded`] closes that gap: the decoder is handed the scans followed
//! by bits no Huffman table can decode (all ones: JPEG reserves every all-ones code), so
//! a decoder that needs bits past the real data fails on them instead of inventing
//! pixels. A whole image never reads them. A progressive image's last scan can end in a
//! run of ended blocks that reads only correction bits: it is decoded twice, over ones
//! and over zeros ([`Layout::zero_padding`]), and two pictures mean it was cut.

use crate::PrepError;

/// The frame header: size and components.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub width: u32,
    pub height: u32,
    /// Sampling factors `(horizontal, vertical)` of each component.
    pub sampling: Vec<(u8, u8)>,
    /// Progressive (SOF2, SOF6, SOF10, SOF14): its scans refine coefficients.
    pub progressive: bool,
    ids: Vec<u8>,
}

impl Frame {
    /// Bytes of 16-bit DCT coefficients the frame holds whole (a progressive decode keeps
    /// every block's coefficients until its last scan): 128 bytes a block.
    pub fn coefficient_bytes(&self) -> u64 {
        let h_max = self
            .sampling
            .iter()
            .map(|s| u64::from(s.0))
            .max()
            .unwrap_or(1);
        let v_max = self
            .sampling
            .iter()
            .map(|s| u64::from(s.1))
            .max()
            .unwrap_or(1);
        // Blocks are counted over whole MCUs, as decoders allocate them.
        let mcus_x = u64::from(self.width).div_ceil(8 * h_max);
        let mcus_y = u64::from(self.height).div_ceil(8 * v_max);
        let blocks: u64 = self
            .sampling
            .iter()
            .map(|&(h, v)| mcus_x * u64::from(h) * mcus_y * u64::from(v))
            .sum();
        blocks * 128
    }
}

/// A whole JPEG's layout: its frame, and where its last scan's data ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    pub frame: Frame,
    /// The offset of the marker that ends the last scan's data.
    scans_end: usize,
}

/// What a prefix of a file says of its frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Probe {
    /// The frame header, read.
    Frame(Frame),
    /// Not read yet: the header lies past the prefix.
    More,
}

fn bad(why: impl std::fmt::Display) -> PrepError {
    PrepError::Decode(format!("JPEG: {why}"))
}

/// A marker's second byte.
mod marker {
    pub const SOI: u8 = 0xd8;
    pub const EOI: u8 = 0xd9;
    pub const SOS: u8 = 0xda;
    pub const DNL: u8 = 0xdc;
    pub const TEM: u8 = 0x01;

    pub fn is_rst(m: u8) -> bool {
        (0xd0..=0xd7).contains(&m)
    }

    /// SOF0-3, 5-7, 9-11, 13-15 (0xc4 is DHT, 0xc8 reserved, 0xcc DAC).
    pub fn is_sof(m: u8) -> bool {
        (0xc0..=0xcf).contains(&m) && !matches!(m, 0xc4 | 0xc8 | 0xcc)
    }

    pub fn is_progressive(m: u8) -> bool {
        matches!(m, 0xc2 | 0xc6 | 0xca | 0xce)
    }
}

/// Walks the segments of `input`: `on_segment(marker, body)` for each, with the body
/// past its length field; after each SOS, the scan's data is skipped. Returns the offset
/// of the end-of-image marker, or `Ok(None)` where `input` ends first.
fn walk(
    input: &[u8],
    mut on_segment: impl FnMut(u8, &[u8], usize) -> Result<bool, PrepError>,
) -> Result<Option<usize>, PrepError> {
    if !input.starts_with(&[0xff, marker::SOI]) {
        return Err(bad("no start-of-image marker"));
    }
    let mut at = 2;
    loop {
        // Bytes between segments are not the format's; the fill bytes before a marker are.
        while at < input.len() && input[at] != 0xff {
            at += 1;
        }
        while at + 1 < input.len() && input[at + 1] == 0xff {
            at += 1;
        }
        if at + 1 >= input.len() {
            return Ok(None);
        }
        let m = input[at + 1];
        let here = at;
        at += 2;
        match m {
            0x00 => continue,
            marker::EOI => return Ok(Some(here)),
            marker::SOI => return Err(bad("a second start-of-image marker")),
            marker::TEM => continue,
            m if marker::is_rst(m) => continue,
            _ => {}
        }
        let Some(len) = input.get(at..at + 2) else {
            return Ok(None);
        };
        let len = usize::from(u16::from_be_bytes([len[0], len[1]]));
        if len < 2 {
            return Err(bad(format!("a segment 0xFF{m:02X} of length {len}")));
        }
        let Some(body) = input.get(at + 2..at + len) else {
            return Ok(None);
        };
        at += len;
        if !on_segment(m, body, here)? {
            return Ok(Some(here));
        }
        if m == marker::SOS {
            // The scan's data runs to the first marker that is not a restart (a 0xFF is
            // followed by 0x00 where it is data).
            loop {
                at = memchr::memchr(0xff, &input[at..]).map_or(input.len(), |i| at + i);
                if at + 1 >= input.len() {
                    return Ok(None);
                }
                let next = input[at + 1];
                if next == 0x00 || marker::is_rst(next) {
                    at += 2;
                } else if next == 0xff {
                    at += 1;
                } else {
                    break;
                }
            }
        }
    }
}

fn frame_of(m: u8, body: &[u8]) -> Result<Frame, PrepError> {
    if body.len() < 6 {
        return Err(bad("a frame header too short"));
    }
    let height = u32::from(u16::from_be_bytes([body[1], body[2]]));
    let width = u32::from(u16::from_be_bytes([body[3], body[4]]));
    let n = usize::from(body[5]);
    if height == 0 || width == 0 {
        return Err(bad(format!(
            "a frame of {width}x{height} (a height set by a DNL marker is not read)"
        )));
    }
    if n == 0 || body.len() < 6 + 3 * n {
        return Err(bad(format!("a frame header of {n} components")));
    }
    let mut ids = Vec::with_capacity(n);
    let mut sampling = Vec::with_capacity(n);
    for c in body[6..6 + 3 * n].chunks_exact(3) {
        let (h, v) = (c[1] >> 4, c[1] & 15);
        if !(1..=4).contains(&h) || !(1..=4).contains(&v) {
            return Err(bad(format!("sampling factors {h}x{v}")));
        }
        ids.push(c[0]);
        sampling.push((h, v));
    }
    Ok(Frame {
        width,
        height,
        sampling,
        progressive: marker::is_progressive(m),
        ids,
    })
}

/// The frame header, where `prefix` (the first bytes of a JPEG) holds it.
pub fn probe(prefix: &[u8]) -> Result<Probe, PrepError> {
    let mut found = None;
    walk(prefix, |m, body, _| {
        if marker::is_sof(m) {
            found = Some(frame_of(m, body)?);
            return Ok(false);
        }
        if m == marker::SOS {
            return Err(bad("a scan before the frame header"));
        }
        Ok(true)
    })?;
    Ok(found.map_or(Probe::More, Probe::Frame))
}

/// What the scans code of each component: sequential, whether a scan codes it;
/// progressive, the precision each of its 64 coefficients has reached (`None` before its
/// first scan, then the scan's low bit: 0 is full precision).
struct Coverage {
    progressive: bool,
    coded: Vec<[Option<u8>; 64]>,
}

impl Coverage {
    fn scan(&mut self, frame: &Frame, body: &[u8]) -> Result<(), PrepError> {
        let n = usize::from(*body.first().ok_or_else(|| bad("an empty scan header"))?);
        if n == 0 || body.len() < 1 + 2 * n + 3 {
            return Err(bad(format!("a scan header of {n} components")));
        }
        let tail = &body[1 + 2 * n..];
        let (ss, se, al) = (usize::from(tail[0]), usize::from(tail[1]), tail[2] & 15);
        let (ss, se) = if self.progressive {
            if ss > se || se > 63 {
                return Err(bad(format!("a scan of coefficients {ss} to {se}")));
            }
            (ss, se)
        } else {
            // A sequential scan codes every coefficient at full precision.
            (0, 63)
        };
        for sel in body[1..1 + 2 * n].chunks_exact(2) {
            let c = frame
                .ids
                .iter()
                .position(|&id| id == sel[0])
                .ok_or_else(|| bad(format!("a scan of component {}, not in the frame", sel[0])))?;
            for k in ss..=se {
                self.coded[c][k] = Some(if self.progressive { al } else { 0 });
            }
        }
        Ok(())
    }

    fn whole(&self) -> Result<(), PrepError> {
        for (c, coded) in self.coded.iter().enumerate() {
            if let Some(k) = coded.iter().position(|p| *p != Some(0)) {
                return Err(bad(format!(
                    "component {c}'s coefficient {k} is not coded to full precision: the scans end early"
                )));
            }
        }
        Ok(())
    }
}

/// The layout of a whole JPEG: refused where it ends before its end-of-image marker,
/// where a scan precedes the frame, or where its scans leave a component (or a
/// progressive coefficient) short of full precision.
pub fn layout(input: &[u8]) -> Result<Layout, PrepError> {
    let mut frame: Option<Frame> = None;
    let mut coverage: Option<Coverage> = None;
    let mut scans_end = 0;
    let mut last_scan = None;
    let end = walk(input, |m, body, at| {
        if last_scan.take().is_some() {
            // The segment after a scan starts where the scan's data ended.
            scans_end = at;
        }
        if marker::is_sof(m) {
            if frame.is_some() {
                return Err(bad("a second frame header"));
            }
            let f = frame_of(m, body)?;
            coverage = Some(Coverage {
                progressive: f.progressive,
                coded: vec![[None; 64]; f.sampling.len()],
            });
            frame = Some(f);
        } else if m == marker::SOS {
            let (Some(f), Some(c)) = (&frame, &mut coverage) else {
                return Err(bad("a scan before the frame header"));
            };
            c.scan(f, body)?;
            last_scan = Some(());
        } else if m == marker::DNL {
            return Err(bad(
                "a DNL marker (a height set after the scan) is not read",
            ));
        }
        Ok(true)
    })?;
    let Some(end) = end else {
        return Err(bad(
            "the data ends before the end-of-image marker: the file is cut short",
        ));
    };
    if last_scan.is_some() {
        scans_end = end;
    }
    let (Some(frame), Some(coverage)) = (frame, coverage) else {
        return Err(bad("no frame header before the end of the image"));
    };
    if scans_end == 0 {
        return Err(bad("no scan"));
    }
    coverage.whole()?;
    Ok(Layout { frame, scans_end })
}

/// Stuffed all-ones bytes (`FF 00`): bits no Huffman code starts with.
const ONES: [u8; 2] = [0xff, 0x00];

/// Bytes of all-ones after a sequential scan: a sequential decoder reads a Huffman code
/// within 16 bits of any point.
const SEQUENTIAL_ONES: usize = 64;

/// Bytes of all-ones after a progressive scan: a refinement scan inside a run of ended
/// blocks reads a correction bit for each coded coefficient of up to 32,767 blocks (the
/// longest run) before its next code.
const PROGRESSIVE_ONES: usize = 32_767 * 63 / 8 + 64;

/// The most bytes [`Layout::padded`] adds to an input.
pub const MAX_PADDING: u64 = (2 * PROGRESSIVE_ONES + 2) as u64;

impl Layout {
    /// Bytes of all-ones after the scans: enough that a decoder reading past the real
    /// data meets a Huffman code before it meets the end marker.
    fn padding(&self) -> usize {
        if self.frame.progressive {
            PROGRESSIVE_ONES
        } else {
            SEQUENTIAL_ONES
        }
    }

    /// Turns the all-ones after the scans of a [`Self::padded`] input into zeros. A
    /// progressive scan cut inside its last run of ended blocks reads correction bits
    /// only, never a code, to its end: decoded over ones and over zeros, it makes two
    /// pictures where a whole one makes the same picture twice.
    pub fn zero_padding(&self, padded: &mut [u8]) {
        let end = padded.len() - 2;
        padded[self.scans_end..end].fill(0);
    }

    /// What a decoder is given: the header and scans of `input`, then [`Self::padding`]
    /// bytes of all-ones, then the end-of-image marker.
    pub fn padded(&self, input: &[u8]) -> Vec<u8> {
        let pad = self.padding();
        let mut out = Vec::with_capacity(self.scans_end + 2 * pad + 2);
        out.extend_from_slice(&input[..self.scans_end]);
        for _ in 0..pad {
            out.extend_from_slice(&ONES);
        }
        out.extend_from_slice(&[0xff, marker::EOI]);
        out
    }
}
