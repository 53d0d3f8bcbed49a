//! Grouping a shard's tar members into samples, the WebDataset way: consecutive members
//! whose names share a key (the path up to the first `.` of the file name) form one
//! sample, each member filed under its extension (what follows that `.`, in lower case).

use std::collections::BTreeMap;
use std::io::{self, Read};

use granary_proto::shards::split_name;

use crate::tarstream::TarReader;
use crate::{Error, Result};

/// One training sample: the members of a shard that share a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The members' common name up to the first `.` of the file name (`dir/000123`).
    pub key: String,
    /// The object key of the shard it came from.
    pub shard: String,
    /// Member bytes by extension (`jpg`, `cls`, `seg.png`…).
    pub fields: BTreeMap<String, Vec<u8>>,
}

impl Sample {
    /// The bytes of the member with this extension.
    pub fn get(&self, ext: &str) -> Option<&[u8]> {
        self.fields.get(ext).map(Vec::as_slice)
    }

    /// Bytes of all members together.
    pub fn len_bytes(&self) -> u64 {
        self.fields.values().map(|v| v.len() as u64).sum()
    }
}

/// The samples of one shard, read as the shard streams in.
pub(crate) struct ShardSamples {
    shard: String,
    tar: TarReader<Box<dyn Read + Send>>,
    /// A member read past the end of the previous sample.
    pending: Option<(String, String, Vec<u8>)>,
    done: bool,
}

impl ShardSamples {
    pub(crate) fn new(shard: String, reader: Box<dyn Read + Send>) -> ShardSamples {
        ShardSamples {
            shard,
            tar: TarReader::new(reader),
            pending: None,
            done: false,
        }
    }

    fn fail(&mut self, source: io::Error) -> Option<Result<Sample>> {
        self.done = true;
        Some(Err(Error::Shard {
            shard: self.shard.clone(),
            source,
        }))
    }

    fn next_member(&mut self) -> io::Result<Option<(String, String, Vec<u8>)>> {
        if let Some(m) = self.pending.take() {
            return Ok(Some(m));
        }
        while let Some((name, data)) = self.tar.next_file()? {
            if let Some((key, ext)) = split_name(&name) {
                return Ok(Some((key.to_owned(), ext, data)));
            }
        }
        Ok(None)
    }
}

impl Iterator for ShardSamples {
    type Item = Result<Sample>;

    fn next(&mut self) -> Option<Result<Sample>> {
        if self.done {
            return None;
        }
        let mut sample: Option<Sample> = None;
        loop {
            let member = match self.next_member() {
                Ok(m) => m,
                Err(e) => return self.fail(e),
            };
            let Some((key, ext, data)) = member else {
                self.done = true;
                return sample.map(Ok);
            };
            match &mut sample {
                Some(s) if s.key != key => {
                    self.pending = Some((key, ext, data));
                    return sample.map(Ok);
                }
                Some(s) => {
                    if s.fields.contains_key(&ext) {
                        let msg = format!("sample {key} has two `.{ext}` members");
                        return self.fail(io::Error::new(io::ErrorKind::InvalidData, msg));
                    }
                    s.fields.insert(ext, data);
                }
                None => {
                    sample = Some(Sample {
                        key,
                        shard: self.shard.clone(),
                        fields: BTreeMap::from([(ext, data)]),
                    })
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::tar_of;

    fn samples(tar: Vec<u8>) -> Vec<Result<Sample>> {
        ShardSamples::new("s.tar".into(), Box::new(std::io::Cursor::new(tar))).collect()
    }

    #[test]
    fn consecutive_members_with_one_key_form_a_sample() {
        let tar = tar_of(&[
            ("a/001.jpg", b"J1"),
            ("a/001.cls", b"3"),
            ("a/002.jpg", b"J2"),
            ("README", b"skipped"),
            ("a/002.json", b"{}"),
            ("a/003.cls", b"7"),
        ]);
        let got: Vec<Sample> = samples(tar).into_iter().map(|s| s.unwrap()).collect();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].key, "a/001");
        assert_eq!(got[0].shard, "s.tar");
        assert_eq!(got[0].get("jpg"), Some(&b"J1"[..]));
        assert_eq!(got[0].get("cls"), Some(&b"3"[..]));
        assert_eq!(
            got[1].fields.keys().collect::<Vec<_>>(),
            vec!["jpg", "json"]
        );
        assert_eq!(got[2].key, "a/003");
        assert_eq!(got[2].len_bytes(), 1);
    }

    #[test]
    fn a_repeated_extension_and_a_broken_tar_are_errors() {
        let tar = tar_of(&[("001.jpg", b"a"), ("001.jpg", b"b")]);
        let got = samples(tar);
        assert_eq!(got.len(), 1);
        assert!(matches!(&got[0], Err(Error::Shard { shard, .. }) if shard == "s.tar"));

        let mut tar = tar_of(&[("001.jpg", &[1u8; 3000]), ("002.jpg", b"b")]);
        tar.truncate(1500);
        let got = samples(tar);
        assert_eq!(got.len(), 1);
        assert!(got[0].is_err());
    }
}
