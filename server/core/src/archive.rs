//! Files inside tar shards (`?archpath=MEMBER`), for `.tar`, `.tar.gz` and `.tgz` objects.
//!
//! A cached `.tar` is read through an index of its members' offsets, built once per
//! cache entry (one pass over the headers, seeking past the data) and kept in memory: a
//! member read is then one range read of the entry, checked block by block like any hit.
//! A shard not cached yet, or compressed, is read as a stream and scanned: its headers
//! are parsed as the bytes arrive, the member's bytes are sent on, the rest dropped; a
//! cold `.tar` read this way is also admitted to the cache like any read, so the next
//! member read of it takes the index path. Parsing is the `tar` crate's (GNU long names,
//! PAX headers), decompression `flate2`'s, both on the blocking pool.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read};

use bytes::Bytes;
use futures::TryStreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio_util::io::{StreamReader, SyncIoBridge};

use crate::backend::ByteStream;

/// How a shard is packed, by its key's suffix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Tar,
    TarGz,
}

impl Format {
    pub fn of(key: &str) -> Option<Format> {
        let k = key.to_ascii_lowercase();
        if k.ends_with(".tar") {
            Some(Format::Tar)
        } else if k.ends_with(".tar.gz") || k.ends_with(".tgz") {
            Some(Format::TarGz)
        } else {
            None
        }
    }
}

/// A member's place in an uncompressed tar: data offset and size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Member {
    pub offset: u64,
    pub size: u64,
}

/// The regular files of a tar: every member in archive order, and each name's place. A
/// name held twice is found as its last copy (what extracting the tar leaves), and both
/// copies are in the order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TarIndex {
    members: Vec<(String, Member)>,
    by_name: HashMap<String, usize>,
}

impl TarIndex {
    /// Adds the next member in archive order.
    pub fn push(&mut self, name: String, m: Member) {
        self.by_name.insert(name.clone(), self.members.len());
        self.members.push((name, m));
    }

    /// The member of this name (its last copy).
    pub fn get(&self, name: &str) -> Option<&Member> {
        self.by_name.get(name).map(|&i| &self.members[i].1)
    }

    /// The copy of member `name` whose data starts at `offset`.
    pub fn at(&self, name: &str, offset: u64) -> Option<&Member> {
        self.members
            .binary_search_by_key(&offset, |(_, m)| m.offset)
            .ok()
            .map(|i| &self.members[i])
            .filter(|(n, _)| n == name)
            .map(|(_, m)| m)
    }

    /// Whether more than one member has this name.
    pub fn repeats(&self, name: &str) -> bool {
        self.members
            .iter()
            .filter(|(n, _)| n == name)
            .nth(1)
            .is_some()
    }

    /// Every member, in archive order.
    pub fn members(&self) -> &[(String, Member)] {
        &self.members
    }

    /// Bytes of memory it takes, about.
    pub fn weight(&self) -> usize {
        self.members.iter().map(|(n, _)| 2 * n.len() + 72).sum()
    }
}

/// An index's members in archive order (by data offset), repeated names included.
pub fn in_order(index: &TarIndex) -> Vec<(&String, &Member)> {
    index.members.iter().map(|(n, m)| (n, m)).collect()
}

/// A member name as the index keeps it: without a leading `./` or `/`.
pub fn normalize(name: &str) -> &str {
    let mut n = name;
    loop {
        if let Some(rest) = n.strip_prefix("./") {
            n = rest;
        } else if let Some(rest) = n.strip_prefix('/') {
            n = rest;
        } else {
            return n;
        }
    }
}

/// The regular files of a tar in archive order: name, data offset, size. `seekable`
/// archives are walked header to header, seeking past the data; others are read through.
pub fn members_of<R: Read + io::Seek>(input: R) -> io::Result<Vec<(String, u64, u64)>> {
    listed(tar::Archive::new(input).entries_with_seek()?)
}

/// [`members_of`] for a stream that cannot seek (a decompressed shard): read through.
pub fn members_streamed<R: Read>(input: R) -> io::Result<Vec<(String, u64, u64)>> {
    listed(tar::Archive::new(input).entries()?)
}

fn listed<'a, R: 'a + Read>(entries: tar::Entries<'a, R>) -> io::Result<Vec<(String, u64, u64)>> {
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        out.push((
            normalize(&name).to_owned(),
            entry.raw_file_position(),
            entry.size(),
        ));
    }
    Ok(out)
}

/// Indexes the tar held in the first `size` bytes of `file` (a cache entry: the object,
/// then its footer). Parsing never reads past the object, and a member whose data runs
/// past it (a shard cut short) makes the whole shard unreadable as a tar rather than
/// indexing bytes that are not the member's.
pub fn index_tar(file: &File, size: u64) -> io::Result<TarIndex> {
    let mut archive = tar::Archive::new(Bounded { file, size, pos: 0 });
    let mut index = TarIndex::default();
    for entry in archive.entries_with_seek()? {
        let entry = entry?;
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = entry.path()?.to_string_lossy().into_owned();
        let m = Member {
            offset: entry.raw_file_position(),
            size: entry.size(),
        };
        if m.offset.checked_add(m.size).is_none_or(|end| end > size) {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("member `{name}` runs past the end of the shard ({size} bytes)"),
            ));
        }
        if index
            .members
            .last()
            .is_some_and(|(_, last)| last.offset >= m.offset)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("member `{name}` starts before the member ahead of it"),
            ));
        }
        index.push(normalize(&name).to_owned(), m);
    }
    Ok(index)
}

/// The first `size` bytes of a file, readable and seekable, for the tar parser.
struct Bounded<'a> {
    file: &'a File,
    size: u64,
    pos: u64,
}

impl Read for Bounded<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let left = self.size.saturating_sub(self.pos);
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl io::Seek for Bounded<'_> {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let target = match to {
            io::SeekFrom::Start(n) => Some(n),
            io::SeekFrom::End(d) => self.size.checked_add_signed(d),
            io::SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = target
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "seek before the start"))?;
        Ok(self.pos)
    }
}

/// Bytes of a member handed on per message while scanning.
const SCAN_CHUNK: usize = 256 << 10;

/// Scans a shard's stream for `member`: its size and a stream of its bytes, or `None`
/// when the shard has no such regular file. Fails when the stream is not a tar (or gzip).
pub async fn scan(
    body: ByteStream,
    format: Format,
    member: &str,
) -> io::Result<Option<(u64, ByteStream)>> {
    let want = normalize(member).to_owned();
    let reader = SyncIoBridge::new(StreamReader::new(body.map_err(io::Error::other)));
    let (found_tx, found_rx) = oneshot::channel::<io::Result<Option<u64>>>();
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(4);
    tokio::task::spawn_blocking(move || {
        let input: Box<dyn Read> = match format {
            Format::Tar => Box::new(reader),
            Format::TarGz => Box::new(flate2::read::GzDecoder::new(reader)),
        };
        let mut archive = tar::Archive::new(input);
        let mut found_tx = Some(found_tx);
        let result = (|| -> io::Result<()> {
            for entry in archive.entries()? {
                let mut entry = entry?;
                if !entry.header().entry_type().is_file() {
                    continue;
                }
                let name = entry.path()?.to_string_lossy().into_owned();
                if normalize(&name) != want {
                    continue;
                }
                if let Some(f) = found_tx.take() {
                    let _ = f.send(Ok(Some(entry.size())));
                }
                let mut buf = vec![0u8; SCAN_CHUNK];
                loop {
                    let n = entry.read(&mut buf)?;
                    if n == 0 {
                        return Ok(());
                    }
                    if tx
                        .blocking_send(Ok(Bytes::copy_from_slice(&buf[..n])))
                        .is_err()
                    {
                        return Ok(()); // the client left
                    }
                }
            }
            Ok(())
        })();
        match (result, found_tx) {
            (Ok(()), Some(f)) => {
                let _ = f.send(Ok(None));
            }
            (Err(e), Some(f)) => {
                let _ = f.send(Err(e));
            }
            (Err(e), None) => {
                let _ = tx.blocking_send(Err(e));
            }
            (Ok(()), None) => {}
        }
    });
    let size = match found_rx.await {
        Ok(r) => r?,
        Err(_) => return Err(io::Error::other("the shard scan stopped")),
    };
    Ok(size.map(|s| {
        let body = futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        });
        (s, Box::pin(body) as ByteStream)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    fn shard(members: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for (name, data) in members {
            let mut h = tar::Header::new_gnu();
            h.set_size(data.len() as u64);
            h.set_mode(0o644);
            h.set_cksum();
            b.append_data(&mut h, name, *data).unwrap();
        }
        b.into_inner().unwrap()
    }

    async fn collect(s: ByteStream) -> Vec<u8> {
        s.map(|c| c.unwrap().to_vec()).concat().await
    }

    #[test]
    fn formats_follow_the_suffix() {
        assert_eq!(Format::of("a/b.tar"), Some(Format::Tar));
        assert_eq!(Format::of("b.TAR.GZ"), Some(Format::TarGz));
        assert_eq!(Format::of("b.tgz"), Some(Format::TarGz));
        assert_eq!(Format::of("b.zip"), None);
        assert_eq!(normalize("./a/b.jpg"), "a/b.jpg");
    }

    #[test]
    fn an_index_finds_every_member() {
        let long = "d/".repeat(70) + "sample.cls";
        let data = shard(&[
            ("000.jpg", b"jpeg bytes"),
            (&long, b"7"),
            ("000.json", b"{}"),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.tar");
        std::fs::write(&p, &data).unwrap();
        let idx = index_tar(&File::open(&p).unwrap(), data.len() as u64).unwrap();
        // Cut inside the last member: it runs past the end, so there is no index.
        let last = *idx.get("000.json").unwrap();
        let cut = index_tar(&File::open(&p).unwrap(), last.offset + 1);
        assert_eq!(cut.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(idx.members().len(), 3);
        let m = *idx.get("000.jpg").unwrap();
        assert_eq!(
            &data[m.offset as usize..(m.offset + m.size) as usize],
            b"jpeg bytes"
        );
        let m = *idx.get(long.as_str()).unwrap();
        assert_eq!(&data[m.offset as usize..(m.offset + m.size) as usize], b"7");
    }

    /// A name held twice: both copies in the order, the last found by name, each by its
    /// offset.
    #[test]
    fn a_repeated_name_keeps_both_copies() {
        let data = shard(&[("a.jpg", b"first"), ("b.cls", b"1"), ("a.jpg", b"second")]);
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s.tar");
        std::fs::write(&p, &data).unwrap();
        let idx = index_tar(&File::open(&p).unwrap(), data.len() as u64).unwrap();
        let names: Vec<&str> = in_order(&idx).iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a.jpg", "b.cls", "a.jpg"]);
        let bytes = |m: &Member| &data[m.offset as usize..(m.offset + m.size) as usize];
        assert_eq!(bytes(idx.get("a.jpg").unwrap()), b"second");
        let first = idx.members()[0].1;
        assert_eq!(bytes(idx.at("a.jpg", first.offset).unwrap()), b"first");
        assert!(idx.at("b.cls", first.offset).is_none());
        assert!(idx.repeats("a.jpg") && !idx.repeats("b.cls"));
    }

    #[tokio::test]
    async fn a_scan_streams_one_member_of_tar_and_tgz() {
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let data = shard(&[("a.txt", b"alpha"), ("./b.bin", &big), ("c.txt", b"gamma")]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &data).unwrap();
        let gz = gz.finish().unwrap();
        for (bytes, format) in [(data, Format::Tar), (gz, Format::TarGz)] {
            let body = || {
                let chunks: Vec<io::Result<Bytes>> = bytes
                    .chunks(7000)
                    .map(|c| Ok(Bytes::copy_from_slice(c)))
                    .collect();
                Box::pin(futures::stream::iter(chunks)) as ByteStream
            };
            let (size, s) = scan(body(), format, "b.bin").await.unwrap().unwrap();
            assert_eq!(size, big.len() as u64);
            assert_eq!(collect(s).await, big);
            let (_, s) = scan(body(), format, "c.txt").await.unwrap().unwrap();
            assert_eq!(collect(s).await, b"gamma");
            assert!(scan(body(), format, "nope").await.unwrap().is_none());
        }
        let junk = Box::pin(futures::stream::iter(vec![Ok(Bytes::from(vec![
            7u8;
            5000
        ]))]));
        assert!(scan(junk, Format::TarGz, "x").await.is_err());
    }
}
