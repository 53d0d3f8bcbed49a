//! Reading a planned epoch: the samples one rank (or one of its DataLoader workers) takes,
//! in the plan's order, fetched as runs.
//!
//! The entries are read in span order (front to back through the rank's shards), in
//! runs: consecutive samples of one shard, fetched with one range read of the listed
//! version (`If-Match`), gaps of other workers' samples read through when they are small
//! against the run ([`GAP`]).
//! A compressed shard is read whole. Each run goes to its shard's owner, then to the
//! next members in the ring's order when the owner cannot be reached, as
//! [`super::route`] routes it. `read_ahead` runs are fetched ahead by
//! as many threads, each with its own connections; the shuffle buffer's order is then
//! served from the runs fetched, which is why the buffer costs memory, not requests.

use std::sync::Arc;
use std::time::Duration;

pub use super::ahead::PlannedRead;
use super::catalog::Catalog;
pub use super::delivered::{BufferedSample, Delivered, MappedSample, ResidentSample, RunFile};
use super::plan::{epoch_list, rank_plan, PlanRound, PlanShard, PlanSpec, SampleId};
pub use super::settings::{EpochSpec, LocalReads, ReadSettings};
use crate::{Error, Result};

/// The samples `spec`'s rank and worker take in its epoch, in the order they yield them.
pub fn plan_epoch(catalog: &Catalog, spec: &EpochSpec) -> Result<Vec<(SampleId, u32)>> {
    if spec.workers == 0 || spec.worker >= spec.workers {
        return Err(Error::Invalid(format!(
            "worker {} of {}",
            spec.worker, spec.workers
        )));
    }
    let list = epoch_list(
        &catalog.counts(),
        spec.seed,
        spec.epoch,
        spec.shuffle_shards,
    );
    let plan = rank_plan(
        list,
        &spec.rounds,
        &spec.split,
        spec.rank,
        spec.seed,
        spec.epoch,
    )
    .map_err(|e| Error::Invalid(e.to_string()))?;
    Ok(plan
        .worker_entries(spec.worker, spec.workers, spec.batch_size)
        .into_iter()
        .map(|e| (plan.order[e], plan.span_pos[e]))
        .collect())
}

/// Starts reading `spec`'s samples.
pub fn read_epoch(
    catalog: Arc<Catalog>,
    spec: &EpochSpec,
    mut settings: ReadSettings,
) -> Result<PlannedRead> {
    // Prepared members come through the socket: a node's cache file holds the source.
    let pipeline = settings.pipeline.clone().map(|name| {
        settings.local = LocalReads::Off;
        Arc::new(crate::Pipelined {
            name,
            seed: spec.seed,
            epoch: spec.epoch,
        })
    });
    let entries = plan_epoch(&catalog, spec)?;
    let slots = entries.len();
    let mut wanted: Vec<(u32, SampleId, usize)> = entries
        .into_iter()
        .enumerate()
        .map(|(slot, (id, place))| (place, id, slot))
        .collect();
    wanted.sort_unstable_by_key(|w| w.0);
    let mark = if settings.plan {
        register(&catalog, spec, &settings).map(|id| {
            let mut places = vec![0u32; slots];
            for &(place, _, slot) in &wanted {
                places[slot] = place;
            }
            (format!("{id}:{}:{}:", spec.epoch, spec.rank), places)
        })
    } else {
        None
    };
    let wanted: Vec<(SampleId, usize)> = wanted.into_iter().map(|(_, id, s)| (id, s)).collect();
    Ok(PlannedRead::start_marked(
        catalog, &wanted, slots, settings, mark, pipeline,
    ))
}

/// The plan of `spec`'s epoch, as the cluster takes it.
pub fn plan_spec(catalog: &Catalog, spec: &EpochSpec) -> PlanSpec {
    PlanSpec {
        bucket: catalog.bucket.clone(),
        prefix: catalog.prefix.clone(),
        shards: catalog
            .shards
            .iter()
            .map(|s| PlanShard {
                key: s.key.clone(),
                etag: s.etag.clone(),
                samples: s.count,
                size: s.size,
                end: s.samples_end(),
            })
            .collect(),
        seed: spec.seed,
        epoch: spec.epoch,
        world_size: spec.split.world_size,
        shuffle_buffer: spec.split.shuffle_buffer,
        shuffle_shards: spec.shuffle_shards,
        drop_last: spec.split.drop_last,
        batch_size: spec.batch_size,
        rounds: spec
            .rounds
            .iter()
            .map(|r| PlanRound {
                world_size: r.split.world_size,
                shuffle_buffer: r.split.shuffle_buffer,
                drop_last: r.split.drop_last,
                consumed: r.consumed,
            })
            .collect(),
        job: None,
        pipeline: None,
    }
}

/// Registers `spec`'s plan with the cluster through the dataset's node: the plan's id,
/// or `None` where it is not taken (a node without plans): the reads are the same.
pub fn register(catalog: &Catalog, spec: &EpochSpec, settings: &ReadSettings) -> Option<String> {
    let plan = PlanSpec {
        pipeline: settings.pipeline.clone(),
        ..plan_spec(catalog, spec)
    };
    let mut c = crate::Client::new(settings.router.endpoint())
        .ok()?
        .with_credentials_opt(settings.credentials.clone())
        .with_timeout(settings.timeout.min(Duration::from_secs(10)));
    c.register_plan(&plan).ok().map(|v| v.id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataset::fetch::fetch;
    use crate::dataset::route::{Clients, Router};
    use crate::dataset::runs::{runs_of, Run};

    /// A run whose answer is cut mid-way is read whole from the next member: a shard read
    /// from its start (streamed), and a range of a spanned shard (received whole).
    #[test]
    fn a_run_cut_mid_answer_is_read_whole_from_the_next_member() {
        use super::super::catalog::{SampleSpan, ShardInfo};
        use crate::fake::{tar_of, FakeServer, Reply};
        use crate::{ClusterView, Member, MemberState};
        use granary_proto::ring::{key_hash, Ring};
        let tar = tar_of(&[
            ("s/0.bin", &[7u8; 3000]),
            ("s/1.bin", &[8u8; 3000]),
            ("s/2.bin", &[9u8; 3000]),
        ]);
        // Each sample: a header and 3000 bytes padded to 3072.
        let spanned: Vec<SampleSpan> = (0..3u64)
            .map(|i| SampleSpan {
                start: i * 3584,
                end: (i + 1) * 3584,
            })
            .collect();
        for spans in [None, Some(spanned)] {
            let ranged = spans.is_some();
            let body = if ranged {
                tar[..3 * 3584].to_vec()
            } else {
                tar.clone()
            };
            // The owner stops halfway through; the next member serves the run whole.
            let cut = Reply::ok(body[..body.len() / 2].to_vec())
                .with_header("content-length", &body.len().to_string())
                .then_close();
            let owner = FakeServer::start(vec![cut]);
            let next = FakeServer::start(vec![Reply::ok(body.clone())]);
            let order = Ring::uniform(["a", "b"]).ranked(key_hash("bk", "d/s.tar"));
            let urls = if order[0] == 0 {
                [owner.endpoint(), next.endpoint()]
            } else {
                [next.endpoint(), owner.endpoint()]
            };
            let members = ["a", "b"]
                .iter()
                .zip(&urls)
                .map(|(id, url)| Member {
                    id: (*id).into(),
                    url: url.clone(),
                    state: MemberState::Up,
                    weight: 100.0,
                    handover: None,
                })
                .collect();
            let view = ClusterView {
                node_id: "a".into(),
                members,
                owner: None,
            };
            let router = Router::from_view(&next.endpoint(), &view);
            let catalog = Catalog {
                bucket: "bk".into(),
                prefix: "d/".into(),
                shards: vec![ShardInfo {
                    key: "d/s.tar".into(),
                    etag: String::new(),
                    count: 3,
                    spans,
                    size: 0,
                }],
            };
            let run = Run {
                shard: 0,
                first: 0,
                last: 2,
                take: vec![(0, 0), (2, 1)],
                mark: None,
                pipeline: None,
            };
            let mut clients = Clients::new(router, None, Duration::from_secs(5));
            let (got, here) = fetch(&catalog, &run, &mut clients, LocalReads::Off, true).unwrap();
            assert!(!here, "a run read over HTTP is not taken from a file here");
            let got: Vec<(usize, Vec<u8>)> = got
                .into_iter()
                .map(|(slot, d)| match d {
                    Delivered::Buffered(s) if ranged => {
                        (slot, s.into_sample().fields["bin"].clone())
                    }
                    Delivered::Owned(s) if !ranged => (slot, s.fields["bin"].clone()),
                    other => panic!("{other:?} for a run ranged: {ranged}"),
                })
                .collect();
            assert_eq!(got, vec![(0, vec![7u8; 3000]), (1, vec![9u8; 3000])]);
            let asked = owner.finish();
            assert_eq!(asked.len(), 1);
            let range = asked[0].header("range").map(str::to_owned);
            assert_eq!(range, ranged.then(|| format!("bytes=0-{}", 3 * 3584 - 1)));
            assert_eq!(next.finish().len(), 1);
        }
    }

    #[test]
    fn runs_join_near_samples_of_one_shard_and_split_at_gaps_and_limits() {
        use super::super::catalog::{SampleSpan, ShardInfo};
        let spans = |sizes: &[u64]| {
            let mut at = 0;
            sizes
                .iter()
                .map(|&n| {
                    let s = SampleSpan {
                        start: at,
                        end: at + n,
                    };
                    at += n;
                    s
                })
                .collect::<Vec<_>>()
        };
        let shard = |key: &str, sizes: &[u64]| ShardInfo {
            key: key.into(),
            etag: "e".into(),
            count: sizes.len() as u32,
            spans: Some(spans(sizes)),
            size: 0,
        };
        let catalog = Catalog {
            bucket: "bk".into(),
            prefix: String::new(),
            shards: vec![
                shard("a.tar", &[1024; 8]),
                shard(
                    "b.tar",
                    &[300 << 10, 300 << 10, 300 << 10, 10 << 20, 8 << 20],
                ),
                shard("c.tar.gz", &[10; 4]),
                // Catalogued from an index: its count, no spans.
                ShardInfo {
                    key: "d.tar".into(),
                    etag: "e".into(),
                    count: 10,
                    spans: None,
                    size: 0,
                },
                shard("e.tar", &[1 << 20, 200 << 10, 1 << 20]),
            ],
        };
        let id = |shard, index| SampleId { shard, index };
        let wanted = vec![
            (id(0, 0), 0),
            (id(0, 2), 1),
            (id(0, 5), 2),
            (id(0, 3), 3), // goes back: a new run
            (id(1, 0), 4),
            (id(1, 2), 5), // a 300 KiB gap after 300 KiB: a new run
            (id(1, 3), 6),
            (id(1, 4), 7), // past 16 MiB: a new run
            (id(2, 0), 8),
            (id(2, 3), 9), // compressed: one run, read whole
            (id(3, 1), 10),
            (id(3, 8), 11), // no spans: one run, read from the start
            (id(4, 0), 12),
            (id(4, 2), 13), // a 200 KiB gap after 1 MiB: read through
        ];
        let runs = runs_of(&catalog, &wanted);
        let shape: Vec<(u32, u32, u32, usize)> = runs
            .iter()
            .map(|r| (r.shard, r.first, r.last, r.take.len()))
            .collect();
        assert_eq!(
            shape,
            vec![
                (0, 0, 5, 3),
                (0, 3, 3, 1),
                (1, 0, 0, 1),
                (1, 2, 3, 2),
                (1, 4, 4, 1),
                (2, 0, 3, 2),
                (3, 1, 8, 2),
                (4, 0, 2, 2)
            ]
        );
    }
}
