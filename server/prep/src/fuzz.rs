//! Arbitrary bytes as a pipeline and an image, prepared or refused, never a panic, and
//! never more memory than the preparation's cost: the fuzz target's body (`fuzz_prep`,
//! and the node's fuzz tests), and granary-prep's own test over the corpus.

use crate::{Filter, Output, Pipeline, PipelineSpec, PrepError, Step};

/// A pipeline from the first 9 bytes of `data` (up to four steps, any output and filter):
/// `None` where the bytes make a definition a node would refuse at start. The rest of
/// `data` is the image.
pub fn pipeline_of(data: &[u8]) -> Option<(Pipeline, &[u8])> {
    let (head, image) = data.split_at_checked(9)?;
    let side = |b: u8, c: u8| 1 + u32::from(b) * 7 + u32::from(c % 8);
    let mut steps = Vec::new();
    for pair in head[1..9].chunks_exact(2).take(usize::from(head[0] % 5)) {
        let (b, c) = (pair[0], pair[1]);
        steps.push(match c % 4 {
            0 => Step::RandomResizedCrop {
                size: [side(b, c), side(b.rotate_left(3), c)],
                scale: [0.08, 1.0],
                ratio: [0.75, 4.0 / 3.0],
            },
            1 => Step::RandomFlip { p: 0.5 },
            2 => Step::Resize {
                shorter: side(b, c),
            },
            _ => Step::CenterCrop {
                size: [side(b, c), side(c, b)],
            },
        });
    }
    let spec = PipelineSpec {
        members: vec!["jpg".into()],
        steps,
        output: [Output::Raw, Output::Jpeg, Output::Png][usize::from(head[0] / 5 % 3)],
        quality: 80,
        filter: [Filter::Bilinear, Filter::Lanczos3][usize::from(head[0] / 15 % 2)],
    };
    Some((Pipeline::conversion(spec).ok()?, image))
}

/// Prepares the image of `data` by its pipeline ([`pipeline_of`]) where its cost is at
/// most `most` bytes; `measure`: the most bytes allocated at once while a closure runs,
/// where it can say (with [`crate::measure::Counting`] installed). Panics where a
/// preparation allocates more than its cost (beside its input, which the caller holds),
/// succeeds where its cost refuses it, or makes raw output of the wrong length.
pub fn prep_measured(data: &[u8], most: u64, measure: &dyn Fn(&mut dyn FnMut()) -> Option<u64>) {
    let Some((pipeline, image)) = pipeline_of(data) else {
        return;
    };
    let len = image.len() as u64;
    let cost = match crate::pixels::probe(image, len) {
        Ok(Some(header)) => pipeline.cost(&header, len),
        _ => Err(PrepError::Decode("no header".into())),
    };
    if cost.as_ref().is_ok_and(|&c| c > most) {
        return;
    }
    let mut out = None;
    let peak = measure(&mut || out = Some(pipeline.prepare(image, 1, 2, "k")));
    let out = out.expect("the preparation ran");
    match (cost, peak) {
        (Ok(cost), Some(peak)) => assert!(
            peak + len <= cost,
            "allocated {peak} bytes beside a {len}-byte input, past its cost {cost}"
        ),
        (Err(_), _) => assert!(out.is_err(), "prepared what its cost refused"),
        _ => {}
    }
    if let Ok(p) = out {
        if pipeline.spec().output == Output::Raw {
            let raw = u64::from(p.width) * u64::from(p.height) * 3;
            assert_eq!(p.bytes.len() as u64, raw);
        }
    }
}
