//! Sharded datasets as both sides see them: which keys are shards, how a shard's tar
//! members group into samples (the WebDataset way: consecutive members sharing a key),
//! where each sample lies, and the two documents that describe a dataset: the catalog a
//! node serves (`GET /_granary/catalog`) and the index a dataset may keep beside its
//! shards (`{prefix}wids.json`, WebDataset's `wids` shard list).

use serde::{Deserialize, Serialize};

/// The extensions that mark a shard.
const SHARD_SUFFIXES: [&str; 3] = [".tar", ".tar.gz", ".tgz"];

/// The name of a dataset's index, beside its shards.
pub const INDEX_NAME: &str = "wids.json";

/// Whether a key names a shard (`.tar`, `.tar.gz`, `.tgz`).
pub fn is_shard(key: &str) -> bool {
    SHARD_SUFFIXES.iter().any(|s| key.ends_with(s))
}

/// Whether a shard is compressed (`.tar.gz`, `.tgz`): read whole, never by range.
pub fn is_compressed(key: &str) -> bool {
    key.ends_with(".tar.gz") || key.ends_with(".tgz")
}

/// `(key, extension)` of a member name; `None` for names with no extension or a file
/// name starting with `.` (which WebDataset skips too).
pub fn split_name(name: &str) -> Option<(&str, String)> {
    let base_start = name.rfind('/').map_or(0, |i| i + 1);
    let dot = name[base_start..].find('.')?;
    if dot == 0 {
        return None;
    }
    let cut = base_start + dot;
    Some((&name[..cut], name[cut + 1..].to_ascii_lowercase()))
}

/// A sample's bytes in its shard: from the first header of its first member to the end
/// of its last member's padding (an uncompressed tar's offsets; for a compressed shard,
/// offsets in the decompressed stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SampleSpan {
    pub start: u64,
    pub end: u64,
}

/// Where a member's data ends, with its padding to a whole block.
fn padded_end(offset: u64, size: u64) -> u64 {
    (offset + size).div_ceil(512) * 512
}

/// Samples out of members in archive order (name, data offset, size): consecutive
/// members sharing a key. Each sample's span starts where the one before ends, so the
/// spans tile the shard, headers and skipped entries included.
pub fn sample_spans(members: impl IntoIterator<Item = (String, u64, u64)>) -> Vec<SampleSpan> {
    let mut out: Vec<SampleSpan> = Vec::new();
    let mut current: Option<String> = None;
    for (name, offset, size) in members {
        let Some((key, _)) = split_name(&name) else {
            continue;
        };
        let end = padded_end(offset, size);
        match (&current, out.last_mut()) {
            (Some(k), Some(last)) if k == key => last.end = end,
            _ => {
                let start = out.last().map_or(0, |s| s.end);
                out.push(SampleSpan { start, end });
                current = Some(key.to_owned());
            }
        }
    }
    out
}

/// One shard of a catalog.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CatalogShard {
    pub key: String,
    /// The version catalogued, without quotes.
    pub etag: String,
    pub size: u64,
    /// Its samples.
    pub samples: u32,
    /// Where each sample ends (spans tile the shard from 0), when known: a shard
    /// catalogued from an index has its count only, and is read from its start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ends: Option<Vec<u64>>,
}

impl CatalogShard {
    /// The samples' spans, when known.
    pub fn spans(&self) -> Option<Vec<SampleSpan>> {
        let ends = self.ends.as_ref()?;
        let mut start = 0;
        Some(
            ends.iter()
                .map(|&end| {
                    let s = SampleSpan { start, end };
                    start = end;
                    s
                })
                .collect(),
        )
    }

    /// A shard entry of these spans.
    pub fn of_spans(key: &str, etag: &str, size: u64, spans: &[SampleSpan]) -> CatalogShard {
        CatalogShard {
            key: key.to_owned(),
            etag: etag.to_owned(),
            size,
            samples: spans.len() as u32,
            ends: Some(spans.iter().map(|s| s.end).collect()),
        }
    }
}

/// A dataset's catalog, as `GET /_granary/catalog` serves it: its shards in key order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Catalog {
    pub bucket: String,
    pub prefix: String,
    /// The dataset's version: a hash of its shards' keys and ETags (and the index's).
    pub version: String,
    /// Whether the sample counts came from the dataset's index.
    pub from_index: bool,
    pub shards: Vec<CatalogShard>,
}

/// One shard of an index: its key relative to the dataset's prefix, and its samples.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexShard {
    pub url: String,
    pub nsamples: u64,
}

/// A dataset's index, `{prefix}wids.json`: WebDataset's `wids` shard list (more fields
/// may come with it; they are kept out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Index {
    pub shardlist: Vec<IndexShard>,
}

impl Index {
    /// The index of a catalog's shards.
    pub fn of(catalog: &Catalog) -> Index {
        Index {
            shardlist: catalog
                .shards
                .iter()
                .map(|s| IndexShard {
                    url: s
                        .key
                        .strip_prefix(&catalog.prefix)
                        .unwrap_or(&s.key)
                        .to_owned(),
                    nsamples: u64::from(s.samples),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_keys_are_recognised() {
        assert!(is_shard("a/b-0001.tar"));
        assert!(is_shard("x.tar.gz"));
        assert!(is_shard("x.tgz"));
        assert!(!is_shard("x.tar.zst"));
        assert!(!is_shard("x.json"));
        assert!(is_compressed("x.tgz") && is_compressed("a/x.tar.gz"));
        assert!(!is_compressed("x.tar"));
    }

    #[test]
    fn names_split_into_key_and_extension() {
        assert_eq!(split_name("000.jpg"), Some(("000", "jpg".into())));
        assert_eq!(
            split_name("a.b/c/0001.seg.PNG"),
            Some(("a.b/c/0001", "seg.png".into()))
        );
        assert_eq!(split_name("dir/noext"), None);
        assert_eq!(split_name("dir/.hidden"), None);
        assert_eq!(split_name("x."), Some(("x", String::new())));
    }

    #[test]
    fn members_group_into_spans_that_tile_the_shard() {
        let m = |n: &str, off: u64, size: u64| (n.to_owned(), off, size);
        let spans = sample_spans(vec![
            m("a/001.jpg", 512, 100),
            m("a/001.cls", 1536, 1),
            m("README", 2560, 3),
            m("a/002.jpg", 3584, 600),
            m("a/003.cls", 5120, 1),
        ]);
        let want = [(0, 2048), (2048, 4608), (4608, 5632)];
        assert_eq!(
            spans,
            want.map(|(start, end)| SampleSpan { start, end }).to_vec()
        );
        let entry = CatalogShard::of_spans("p/a.tar", "e", 6144, &spans);
        assert_eq!(entry.samples, 3);
        assert_eq!(entry.ends, Some(vec![2048, 4608, 5632]));
        assert_eq!(entry.spans(), Some(spans));
    }

    #[test]
    fn an_index_names_shards_relative_to_the_prefix() {
        let catalog = Catalog {
            bucket: "b".into(),
            prefix: "train/".into(),
            version: "v".into(),
            from_index: false,
            shards: vec![CatalogShard {
                key: "train/s-0.tar".into(),
                etag: "e".into(),
                size: 10,
                samples: 7,
                ends: None,
            }],
        };
        let text = serde_json::to_string(&Index::of(&catalog)).unwrap();
        assert_eq!(text, r#"{"shardlist":[{"url":"s-0.tar","nsamples":7}]}"#);
        // wids lists carry more fields (a name, a format): they are read past.
        let read: Index = serde_json::from_str(
            r#"{"__kind__":"wids-shard-index-v1","name":"x","shardlist":[{"url":"s-0.tar","nsamples":7,"filesize":10}]}"#,
        )
        .unwrap();
        assert_eq!(read, Index::of(&catalog));
    }
}
