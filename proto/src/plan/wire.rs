//! A job's plan as it crosses the wire: what a dataset registers (`POST
//! /_granary/plans`), what the cluster shows of it (`GET /_granary/plans`), and the mark
//! a planned read carries (`x-granary-plan`).

use serde::{Deserialize, Serialize};
use xxhash_rust::xxh3::Xxh3;

use super::{Round, Split};

/// One shard of a planned dataset, in key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanShard {
    pub key: String,
    #[serde(default)]
    pub etag: String,
    pub samples: u32,
    /// Bytes (0: not known).
    #[serde(default)]
    pub size: u64,
    /// Where its samples end, for a shard read by ranges (the archive's end blocks
    /// after them are never read); `None`: read whole, or not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<u64>,
}

impl PlanShard {
    /// The bytes from its start that an epoch's reads of all its samples cover: its
    /// samples' end, else its size; `None` where neither is known.
    pub fn read_end(&self) -> Option<u64> {
        let end = match (self.end, self.size) {
            (Some(e), 0) => e,
            (Some(e), size) => e.min(size),
            (None, size) => size,
        };
        (end > 0).then_some(end)
    }
}

/// One round of an epoch's resume history (as `state_dict` keeps it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanRound {
    pub world_size: usize,
    #[serde(default)]
    pub shuffle_buffer: usize,
    #[serde(default)]
    pub drop_last: bool,
    pub consumed: u64,
}

impl From<PlanRound> for Round {
    fn from(r: PlanRound) -> Round {
        Round {
            split: Split {
                world_size: r.world_size,
                shuffle_buffer: r.shuffle_buffer,
                drop_last: r.drop_last,
            },
            consumed: r.consumed,
        }
    }
}

fn one() -> usize {
    1
}

fn yes() -> bool {
    true
}

/// A job's epoch plan: everything the order of its reads is a function of.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanSpec {
    pub bucket: String,
    #[serde(default)]
    pub prefix: String,
    pub shards: Vec<PlanShard>,
    #[serde(default)]
    pub seed: u64,
    #[serde(default)]
    pub epoch: u64,
    #[serde(default = "one")]
    pub world_size: usize,
    #[serde(default)]
    pub shuffle_buffer: usize,
    #[serde(default = "yes")]
    pub shuffle_shards: bool,
    #[serde(default)]
    pub drop_last: bool,
    #[serde(default = "one")]
    pub batch_size: usize,
    #[serde(default)]
    pub rounds: Vec<PlanRound>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job: Option<String>,
    /// The node pipeline (`[pipelines.NAME]`) the job's samples are prepared by: the
    /// shards' owners prepare them ahead of the reads, for the plan's seed and epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<String>,
}

impl PlanSpec {
    /// The plan's id: the job it describes (its dataset, seed and shard shuffle),
    /// whatever epoch, round or world size it stands at (a job registering its next
    /// epoch, or resumed on other ranks, updates its plan).
    pub fn id(&self) -> String {
        let mut h = Xxh3::new();
        for part in [self.bucket.as_str(), self.prefix.as_str()] {
            h.update(part.as_bytes());
            h.update(&[0]);
        }
        h.update(self.job.as_deref().unwrap_or("").as_bytes());
        h.update(&[0]);
        for s in &self.shards {
            h.update(s.key.as_bytes());
            h.update(&[0]);
            h.update(s.etag.as_bytes());
            h.update(&[0]);
            h.update(&s.samples.to_le_bytes());
        }
        for n in [self.seed, u64::from(self.shuffle_shards)] {
            h.update(&n.to_le_bytes());
        }
        // A job whose samples another pipeline prepares is another job.
        if let Some(p) = &self.pipeline {
            h.update(&[1]);
            h.update(p.as_bytes());
        }
        format!("{:016x}", h.digest())
    }

    /// Where the job stands: its epoch, its split and its resume history (a change is
    /// news to pass on; a job resumed on another world size is the same plan).
    pub fn version(&self) -> u64 {
        let mut h = Xxh3::new();
        h.update(&self.epoch.to_le_bytes());
        for n in [
            self.world_size as u64,
            self.shuffle_buffer as u64,
            u64::from(self.drop_last),
            self.batch_size as u64,
        ] {
            h.update(&n.to_le_bytes());
        }
        for r in &self.rounds {
            for n in [
                r.world_size as u64,
                r.shuffle_buffer as u64,
                u64::from(r.drop_last),
                r.consumed,
            ] {
                h.update(&n.to_le_bytes());
            }
        }
        h.digest()
    }

    /// The split of the epoch's current round.
    pub fn split(&self) -> Split {
        Split {
            world_size: self.world_size.max(1),
            shuffle_buffer: self.shuffle_buffer,
            drop_last: self.drop_last,
        }
    }

    /// The per-shard sample counts, in key order.
    pub fn counts(&self) -> Vec<u32> {
        self.shards.iter().map(|s| s.samples).collect()
    }
}

/// A plan as the cluster shows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PlanView {
    pub id: String,
    #[serde(default)]
    pub job: Option<String>,
    /// The pipeline its samples are prepared by, where it names one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<String>,
    pub bucket: String,
    pub prefix: String,
    pub epoch: u64,
    pub world_size: usize,
    /// Shards in the plan.
    #[serde(default)]
    pub shards: usize,
    /// Samples per rank in the epoch's current round.
    #[serde(default)]
    pub per_rank: u64,
    /// Samples all ranks consumed in the epoch, as the cluster last learned it.
    pub consumed: u64,
    /// Samples the ranks' reads reach, per rank (the slowest rank's place).
    #[serde(default)]
    pub place: u64,
    /// Samples per second per rank, as measured.
    #[serde(default)]
    pub rate: f64,
    pub fetched_bytes: u64,
    pub evicted_bytes: u64,
    pub reads_ready: u64,
    pub reads_waited: u64,
    pub expires_in_s: f64,
}

/// What a planned read says of itself: `PLAN:EPOCH:RANK:PLACE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlanMark {
    pub plan: String,
    pub epoch: u64,
    pub rank: u32,
    pub place: u64,
}

impl PlanMark {
    pub fn to_header(&self) -> String {
        format!("{}:{}:{}:{}", self.plan, self.epoch, self.rank, self.place)
    }

    /// The mark in a header's value; `None` for anything else.
    pub fn parse(value: &str) -> Option<PlanMark> {
        let mut it = value.trim().split(':');
        let plan = it.next().filter(|p| !p.is_empty() && p.len() <= 64)?;
        if !plan.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return None;
        }
        let mark = PlanMark {
            plan: plan.to_owned(),
            epoch: it.next()?.parse().ok()?,
            rank: it.next()?.parse().ok()?,
            place: it.next()?.parse().ok()?,
        };
        it.next().is_none().then_some(mark)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> PlanSpec {
        serde_json::from_str(
            r#"{"bucket":"b","prefix":"p/","shards":[{"key":"p/a.tar","etag":"e1","samples":3}],"seed":7}"#,
        )
        .unwrap()
    }

    #[test]
    fn a_plan_keeps_its_id_across_epochs_and_rounds_and_changes_version() {
        let a = spec();
        assert_eq!((a.world_size, a.batch_size, a.shuffle_shards), (1, 1, true));
        let mut b = a.clone();
        b.epoch = 3;
        b.rounds.push(PlanRound {
            world_size: 1,
            shuffle_buffer: 0,
            drop_last: false,
            consumed: 2,
        });
        assert_eq!(a.id(), b.id());
        assert_ne!(a.version(), b.version());
        let mut c = a.clone();
        c.seed = 8;
        assert_ne!(a.id(), c.id());
        let mut w = a.clone();
        w.world_size = 3;
        assert_eq!(a.id(), w.id(), "resumed on other ranks: the same job");
        assert_ne!(a.version(), w.version());
        let mut d = a.clone();
        d.shards[0].etag = "e2".into();
        assert_ne!(a.id(), d.id(), "another version of a shard is another plan");
        assert_eq!(a.id().len(), 16);
    }

    #[test]
    fn marks_round_trip_and_anything_else_is_none() {
        let m = PlanMark {
            plan: "00ff".into(),
            epoch: 2,
            rank: 5,
            place: 1234,
        };
        assert_eq!(PlanMark::parse(&m.to_header()), Some(m));
        for bad in [
            "",
            "a:1:2",
            "a:1:2:3:4",
            "a/b:1:2:3",
            ":1:2:3",
            "a:x:2:3",
            "a:1:-2:3",
        ] {
            assert_eq!(PlanMark::parse(bad), None, "{bad}");
        }
    }
}
