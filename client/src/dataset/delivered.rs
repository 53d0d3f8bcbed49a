//! A sample as it is delivered (owned, ranges of its run's buffer, mapped from the
//! node's cache file), and a run's bytes parsed into samples, its tar headers walked
//! in place.

use std::io::Read;
use std::sync::Arc;

use crate::{Error, Result, Sample};

/// A sample as it is delivered: its bytes, ranges of the run's bytes read whole, or
/// where they lie in the node's cache file on this machine (a local read: the bytes are
/// mapped, never copied).
#[derive(Debug)]
pub enum Delivered {
    Owned(Sample),
    Buffered(BufferedSample),
    Mapped(MappedSample),
    Resident(ResidentSample),
}

/// A sample whose members are ranges of its run's bytes, received whole into one buffer
/// (no copy between the socket and it): a caller copies each member out once, into
/// what it hands on.
#[derive(Debug, Clone)]
pub struct BufferedSample {
    /// The members' common name up to the first `.` of the file name.
    pub key: String,
    /// The object key of the shard it came from.
    pub shard: String,
    /// The run's bytes.
    pub run: Arc<Vec<u8>>,
    /// Extension and range in `run`; in archive order.
    pub fields: Vec<(String, std::ops::Range<usize>)>,
}

impl BufferedSample {
    /// The sample with its members copied out.
    pub fn into_sample(self) -> Sample {
        let fields = self
            .fields
            .into_iter()
            .map(|(ext, r)| (ext, self.run[r].to_vec()))
            .collect();
        Sample {
            key: self.key,
            shard: self.shard,
            fields,
        }
    }
}

/// A sample whose members are ranges of a run mapped from the cache file of a node on
/// this machine, every page of it in the page cache when it was read (the node checked
/// them just before): each member is copied out once, by
/// [`PlannedRead::copy_member`], straight from the cache into what the caller hands on.
#[derive(Debug, Clone)]
pub struct ResidentSample {
    /// The members' common name up to the first `.` of the file name.
    pub key: String,
    /// The object key of the shard it came from.
    pub shard: String,
    pub(super) run: Arc<ResidentRun>,
    /// Extension and range of the run's bytes; in archive order.
    pub fields: Vec<(String, std::ops::Range<usize>)>,
}

/// A run's bytes mapped, and where they lie in their shard (to ask the node for a member
/// whose pages left memory).
#[derive(Debug)]
pub(super) struct ResidentRun {
    pub(super) map: crate::Mapping,
    pub(super) shard: u32,
    pub(super) start: u64,
}

/// A sample whose members are ranges of a node's cache file.
#[derive(Debug, Clone)]
pub struct MappedSample {
    /// The members' common name up to the first `.` of the file name.
    pub key: String,
    /// The object key of the shard it came from.
    pub shard: String,
    /// The file the node passed for the run the sample was read in.
    pub file: Arc<RunFile>,
    /// Extension, offset in the file, length; in archive order.
    pub fields: Vec<(String, u64, u64)>,
}

/// A node's cache file, passed for one run: read-only, open while a sample needs it.
#[derive(Debug)]
pub struct RunFile {
    pub file: std::fs::File,
    /// Where the run's bytes start in the file, and how many there are.
    pub offset: u64,
    pub len: u64,
}

/// Bytes in memory, read by a tar reader that jumps over what it does not hand out.
pub(super) struct InMemory<'a> {
    pub(super) buf: &'a [u8],
    pub(super) pos: usize,
}

impl Read for InMemory<'_> {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        let n = out.len().min(self.buf.len() - self.pos);
        out[..n].copy_from_slice(&self.buf[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

pub(super) fn jump(r: &mut InMemory<'_>, n: u64) -> std::io::Result<u64> {
    let k = (n.min((r.buf.len() - r.pos) as u64)) as usize;
    r.pos += k;
    Ok(k as u64)
}

/// A sample's key and its members: extension, where the member's bytes start, their
/// length.
pub(super) type Members = (String, Vec<(String, u64, u64)>);

/// A run's samples in bytes held whole, in archive order, its headers walked in place.
/// A sample with two members of one extension is an error, as in a streamed shard.
pub(super) fn samples_in(shard: &str, buf: &[u8]) -> Result<Vec<Members>> {
    let broken = |source| Error::Shard {
        shard: shard.to_owned(),
        source,
    };
    let mut tar = crate::TarReader::with_skipper(InMemory { buf, pos: 0 }, jump);
    let mut out: Vec<Members> = Vec::new();
    while let Some((name, size)) = tar.next_header().map_err(broken)? {
        let at = tar.get_mut().pos as u64;
        if at + size > buf.len() as u64 {
            let cut = std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "tar entry cut short");
            return Err(broken(cut));
        }
        let Some((key, ext)) = granary_proto::shards::split_name(&name) else {
            continue;
        };
        match out.last_mut() {
            Some((k, fields)) if k == key => {
                if fields.iter().any(|(e, _, _)| *e == ext) {
                    let msg = format!("sample {key} has two `.{ext}` members");
                    let twice = std::io::Error::new(std::io::ErrorKind::InvalidData, msg);
                    return Err(broken(twice));
                }
                fields.push((ext, at, size));
            }
            _ => out.push((key.to_owned(), vec![(ext, at, size)])),
        }
    }
    Ok(out)
}

/// The samples of a run the node passed as a file: its headers walked in the mapping,
/// each member a range of the file.
pub(super) fn mapped_samples(
    shard: &str,
    local: crate::LocalFile,
) -> Result<Vec<Result<MappedSample>>> {
    let map = local.map().map_err(Error::Local)?;
    let samples = samples_in(shard, &map)?;
    drop(map);
    let (offset, len) = (local.offset(), local.len());
    let file = Arc::new(RunFile {
        file: local.into_fd().into(),
        offset,
        len,
    });
    Ok(samples
        .into_iter()
        .map(|(key, fields)| {
            Ok(MappedSample {
                key,
                shard: shard.to_owned(),
                file: file.clone(),
                fields: fields
                    .into_iter()
                    .map(|(ext, at, size)| (ext, offset + at, size))
                    .collect(),
            })
        })
        .collect())
}

/// Members as ranges of the bytes they were walked in.
pub(super) fn ranges(fields: Vec<(String, u64, u64)>) -> Vec<(String, std::ops::Range<usize>)> {
    fields
        .into_iter()
        .map(|(ext, at, size)| (ext, at as usize..(at + size) as usize))
        .collect()
}

/// The samples of a run received whole: each member a range of its bytes.
pub(super) fn buffered_samples(shard: &str, run: Vec<u8>) -> Result<Vec<Result<BufferedSample>>> {
    let samples = samples_in(shard, &run)?;
    let run = Arc::new(run);
    Ok(samples
        .into_iter()
        .map(|(key, fields)| {
            Ok(BufferedSample {
                key,
                shard: shard.to_owned(),
                run: run.clone(),
                fields: ranges(fields),
            })
        })
        .collect())
}
