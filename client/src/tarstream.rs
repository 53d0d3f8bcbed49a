//! A streaming tar reader: one pass over any `Read`, no seeking, each regular file handed
//! out whole with its full name ([`TarReader::next_file`]), or its header first and its
//! bytes as they stream ([`TarReader::next_header`], [`TarReader::data`]).
//!
//! Names longer than a header holds come as GNU long-name entries (`L`) or pax extended
//! headers (`x`, `path=`); both are resolved. Sizes beyond 8 GiB (base-256 or pax `size=`)
//! are read. Directories, links and other entries are skipped. Every header's checksum is
//! checked, so a stream that is not a tar fails at its first header instead of yielding
//! garbage.

use std::io::{self, Read};

const BLOCK: usize = 512;
/// Longest name a GNU long-name entry may carry.
const MAX_LONG_NAME: u64 = 64 << 10;
/// Largest pax extended header read.
const MAX_PAX: u64 = 1 << 20;

/// Reads the regular files of a tar stream, in order.
pub struct TarReader<R> {
    inner: R,
    done: bool,
    /// Data bytes of the current file not yet read, and the padding after them.
    left: u64,
    pad: u64,
    /// Passes over `n` bytes of `inner`: reads them, unless the reader can seek.
    skipper: fn(&mut R, u64) -> io::Result<u64>,
}

/// Skips by reading (and dropping) the bytes.
fn read_past<R: Read>(r: &mut R, n: u64) -> io::Result<u64> {
    io::copy(&mut r.take(n), &mut io::sink())
}

/// The bytes of a tar stream's current file (see [`TarReader::data`]).
pub struct TarData<'a, R> {
    tar: &'a mut TarReader<R>,
}

impl<R: Read> Read for TarData<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let t = &mut *self.tar;
        if t.left == 0 || buf.is_empty() {
            return Ok(0);
        }
        let want = buf.len().min(t.left.min(usize::MAX as u64) as usize);
        let n = t.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("tar entry cut short: {} bytes missing", t.left),
            ));
        }
        t.left -= n as u64;
        Ok(n)
    }
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// The bytes of a NUL-terminated field.
fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// An octal number field (spaces and NULs around it allowed), or base-256 when the first
/// byte has its high bit set.
fn number(field: &[u8]) -> io::Result<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        let mut n: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            n = n
                .checked_mul(256)
                .and_then(|n| n.checked_add(u64::from(b)))
                .ok_or_else(|| invalid("tar size field overflows"))?;
        }
        return Ok(n);
    }
    let text = std::str::from_utf8(cstr(field)).map_err(|_| invalid("tar number field"))?;
    let text = text.trim_matches(|c: char| c == ' ' || c == '\0');
    if text.is_empty() {
        return Ok(0);
    }
    u64::from_str_radix(text, 8).map_err(|_| invalid(format!("tar number field `{text}`")))
}

fn checksum_ok(block: &[u8; BLOCK]) -> io::Result<bool> {
    let want = number(&block[148..156])?;
    let (mut unsigned, mut signed) = (0u64, 0i64);
    for (i, &b) in block.iter().enumerate() {
        let b = if (148..156).contains(&i) { b' ' } else { b };
        unsigned += u64::from(b);
        signed += i64::from(b as i8);
    }
    Ok(want == unsigned || want as i64 == signed)
}

/// The name a header holds itself: ustar's prefix joined to its name.
fn header_name(block: &[u8; BLOCK]) -> String {
    let name = cstr(&block[0..100]);
    let ustar = &block[257..263] == b"ustar\0";
    let prefix = if ustar {
        cstr(&block[345..500])
    } else {
        &[][..]
    };
    if prefix.is_empty() {
        String::from_utf8_lossy(name).into_owned()
    } else {
        format!(
            "{}/{}",
            String::from_utf8_lossy(prefix),
            String::from_utf8_lossy(name)
        )
    }
}

/// `path` and `size` of pax records (`LEN key=value\n`).
fn parse_pax(data: &[u8]) -> io::Result<(Option<String>, Option<u64>)> {
    let (mut path, mut size) = (None, None);
    let mut rest = data;
    while !rest.is_empty() {
        let space = rest
            .iter()
            .position(|&b| b == b' ')
            .ok_or_else(|| invalid("pax record without a length"))?;
        let len: usize = std::str::from_utf8(&rest[..space])
            .ok()
            .and_then(|s| s.parse().ok())
            .filter(|&n| n > space + 1 && n <= rest.len())
            .ok_or_else(|| invalid("pax record length"))?;
        let record = &rest[space + 1..len];
        let record = record.strip_suffix(b"\n").unwrap_or(record);
        if let Some(eq) = record.iter().position(|&b| b == b'=') {
            let (k, v) = (&record[..eq], &record[eq + 1..]);
            match k {
                b"path" => path = Some(String::from_utf8_lossy(v).into_owned()),
                b"size" => {
                    size = std::str::from_utf8(v).ok().and_then(|s| s.parse().ok());
                }
                _ => {}
            }
        }
        rest = &rest[len..];
    }
    Ok((path, size))
}

/// The zero bytes after `size` bytes of entry data, up to the next block.
fn padding(size: u64) -> u64 {
    (BLOCK as u64 - size % BLOCK as u64) % BLOCK as u64
}

impl<R: Read> TarReader<R> {
    /// Reads the archive `inner` holds, from its first header.
    pub fn new(inner: R) -> TarReader<R> {
        TarReader::with_skipper(inner, read_past::<R>)
    }

    /// Reads the archive `inner` holds, passing over the bytes it does not hand out with
    /// `skipper` (which returns how many it passed): a reader over memory or a file can
    /// jump instead of reading them.
    pub fn with_skipper(inner: R, skipper: fn(&mut R, u64) -> io::Result<u64>) -> TarReader<R> {
        TarReader {
            inner,
            done: false,
            left: 0,
            pad: 0,
            skipper,
        }
    }

    /// The stream being read (positioned after what has been read).
    pub fn get_mut(&mut self) -> &mut R {
        &mut self.inner
    }

    /// Reads one header block; `false` at a clean end of stream.
    fn read_block(&mut self, block: &mut [u8; BLOCK]) -> io::Result<bool> {
        let mut got = 0;
        while got < BLOCK {
            match self.inner.read(&mut block[got..]) {
                Ok(0) if got == 0 => return Ok(false),
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "tar header cut short",
                    ))
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }

    /// Reads a long-name or pax entry's `size` bytes (at most `limit`) and the padding
    /// after them.
    fn read_meta(&mut self, size: u64, limit: u64) -> io::Result<Vec<u8>> {
        if size > limit {
            return Err(invalid(format!("tar metadata entry of {size} bytes")));
        }
        let mut data = Vec::with_capacity(size as usize);
        (&mut self.inner).take(size).read_to_end(&mut data)?;
        if data.len() as u64 != size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("tar entry cut short: {} of {size} bytes", data.len()),
            ));
        }
        self.skip_padding(size)?;
        Ok(data)
    }

    fn skip(&mut self, n: u64) -> io::Result<()> {
        let skipped = (self.skipper)(&mut self.inner, n)?;
        if skipped != n {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "tar entry cut short",
            ));
        }
        Ok(())
    }

    fn skip_padding(&mut self, size: u64) -> io::Result<()> {
        self.skip(padding(size))
    }

    /// The next regular file: its name and bytes; `None` at the end of the archive.
    pub fn next_file(&mut self) -> io::Result<Option<(String, Vec<u8>)>> {
        let Some((name, size)) = self.next_header()? else {
            return Ok(None);
        };
        let mut data = Vec::with_capacity(size.min(8 << 20) as usize);
        self.data().read_to_end(&mut data)?;
        Ok(Some((name, data)))
    }

    /// The next regular file's name and size, its bytes left to read with
    /// [`TarReader::data`] (what is not read is skipped by the next call); `None` at the
    /// end of the archive.
    pub fn next_header(&mut self) -> io::Result<Option<(String, u64)>> {
        self.skip(self.left + self.pad)?;
        (self.left, self.pad) = (0, 0);
        let mut long_name: Option<String> = None;
        let mut pax_path: Option<String> = None;
        let mut pax_size: Option<u64> = None;
        let mut block = [0u8; BLOCK];
        loop {
            if self.done || !self.read_block(&mut block)? {
                self.done = true;
                return Ok(None);
            }
            if block.iter().all(|&b| b == 0) {
                self.done = true;
                return Ok(None);
            }
            if !checksum_ok(&block)? {
                return Err(invalid(
                    "tar header checksum mismatch (not a tar, or corrupt)",
                ));
            }
            let size = match pax_size.take() {
                Some(s) => s,
                None => number(&block[124..136])?,
            };
            match block[156] {
                b'L' => {
                    let name = self.read_meta(size, MAX_LONG_NAME)?;
                    long_name = Some(String::from_utf8_lossy(cstr(&name)).into_owned());
                }
                b'x' => {
                    let data = self.read_meta(size, MAX_PAX)?;
                    let (path, size) = parse_pax(&data)?;
                    pax_path = path.or(pax_path);
                    pax_size = size;
                }
                // Long link names and global pax headers: nothing this reader uses.
                b'K' | b'g' => {
                    self.skip(size)?;
                    self.skip_padding(size)?;
                }
                b'0' | b'\0' | b'7' => {
                    let name = pax_path
                        .take()
                        .or(long_name.take())
                        .unwrap_or_else(|| header_name(&block));
                    (self.left, self.pad) = (size, padding(size));
                    return Ok(Some((name, size)));
                }
                _ => {
                    // Directories, links, devices: no file bytes to hand out.
                    let sized = !matches!(block[156], b'1' | b'2' | b'3' | b'4' | b'5' | b'6');
                    if sized {
                        self.skip(size)?;
                        self.skip_padding(size)?;
                    }
                    long_name = None;
                    pax_path = None;
                }
            }
        }
    }

    /// The bytes of the file [`TarReader::next_header`] returned, as they stream.
    pub fn data(&mut self) -> TarData<'_, R> {
        TarData { tar: self }
    }
}

impl<R: Read> Iterator for TarReader<R> {
    type Item = io::Result<(String, Vec<u8>)>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_file() {
            Ok(Some(m)) => Some(Ok(m)),
            Ok(None) => None,
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gnu(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, data).unwrap();
    }

    #[test]
    fn files_and_long_names_come_out_in_order() {
        let long = format!("{}file.txt", "nested/".repeat(30));
        let mut b = tar::Builder::new(Vec::new());
        gnu(&mut b, "a.txt", b"alpha");
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_size(0);
        b.append_data(&mut dir, "d/", &[][..]).unwrap();
        gnu(&mut b, &long, &[9u8; 1025]);
        gnu(&mut b, "empty", b"");
        let bytes = b.into_inner().unwrap();
        let files: Vec<_> = TarReader::new(bytes.as_slice())
            .collect::<io::Result<_>>()
            .unwrap();
        assert_eq!(files.len(), 3);
        assert_eq!(files[0], ("a.txt".to_owned(), b"alpha".to_vec()));
        assert_eq!(files[1].0, long);
        assert_eq!(files[1].1, vec![9u8; 1025]);
        assert_eq!(files[2], ("empty".to_owned(), Vec::new()));
    }

    #[test]
    fn pax_paths_and_ustar_prefixes_are_resolved() {
        let mut b = tar::Builder::new(Vec::new());
        let pax_name = format!("{}.bin", "p".repeat(300));
        let record = {
            let body = format!(" path={pax_name}\n");
            // The length counts its own digits.
            let mut len = body.len() + 1;
            while body.len() + len.to_string().len() != len {
                len = body.len() + len.to_string().len();
            }
            format!("{len}{body}")
        };
        let mut x = tar::Header::new_ustar();
        x.set_entry_type(tar::EntryType::XHeader);
        x.set_size(record.len() as u64);
        x.set_path("PaxHeaders/x").unwrap();
        x.set_cksum();
        b.append(&x, record.as_bytes()).unwrap();
        let mut h = tar::Header::new_ustar();
        h.set_path("short").unwrap();
        h.set_size(3);
        h.set_cksum();
        b.append(&h, &b"pax"[..]).unwrap();
        // A ustar name split into prefix and name.
        let split = format!("{}/{}", "q".repeat(120), "r.txt");
        let mut u = tar::Header::new_ustar();
        u.set_path(&split).unwrap();
        u.set_size(2);
        u.set_cksum();
        b.append(&u, &b"us"[..]).unwrap();
        let bytes = b.into_inner().unwrap();
        let files: Vec<_> = TarReader::new(bytes.as_slice())
            .collect::<io::Result<_>>()
            .unwrap();
        assert_eq!(files[0], (pax_name, b"pax".to_vec()));
        assert_eq!(files[1], (split, b"us".to_vec()));
    }

    #[test]
    fn garbage_and_truncation_are_errors() {
        let garbage = vec![b'x'; 2048];
        assert!(TarReader::new(garbage.as_slice()).next_file().is_err());
        let mut b = tar::Builder::new(Vec::new());
        gnu(&mut b, "a", &[1u8; 4000]);
        let bytes = b.into_inner().unwrap();
        let cut = &bytes[..2000];
        let err = TarReader::new(cut).next_file().unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        // An empty stream is an empty archive.
        assert!(TarReader::new(&[][..]).next_file().unwrap().is_none());
    }

    #[test]
    fn headers_then_data_as_it_streams() {
        let long = format!("{}x.bin", "deep/".repeat(40));
        let mut b = tar::Builder::new(Vec::new());
        gnu(&mut b, "a.bin", b"AAA");
        gnu(&mut b, &long, &[7u8; 5000]);
        gnu(&mut b, "skipped", &[1u8; 700]);
        gnu(&mut b, "last", b"z");
        let bytes = b.into_inner().unwrap();
        let mut tar = TarReader::new(bytes.as_slice());
        assert_eq!(tar.next_header().unwrap(), Some(("a.bin".to_owned(), 3)));
        let mut got = Vec::new();
        tar.data().read_to_end(&mut got).unwrap();
        assert_eq!(got, b"AAA");
        assert_eq!(tar.next_header().unwrap(), Some((long, 5000)));
        let mut part = [0u8; 100];
        tar.data().read_exact(&mut part).unwrap();
        assert_eq!(part, [7u8; 100]);
        // Unread data (the rest of this file, all of the next) is skipped.
        assert_eq!(
            tar.next_header().unwrap(),
            Some(("skipped".to_owned(), 700))
        );
        assert_eq!(
            tar.next_file().unwrap(),
            Some(("last".to_owned(), b"z".to_vec()))
        );
        assert_eq!(tar.next_header().unwrap(), None);
        let cut = &bytes[..1200];
        let mut tar = TarReader::new(cut);
        tar.next_header().unwrap();
        let err = tar.next_header().map(|_| ()).and_then(|()| {
            let mut sink = Vec::new();
            tar.data().read_to_end(&mut sink).map(|_| ())
        });
        assert_eq!(err.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn numbers_parse() {
        assert_eq!(number(b"0000644\0").unwrap(), 0o644);
        assert_eq!(number(b"   17 \0").unwrap(), 0o17);
        assert_eq!(number(b"\0\0\0").unwrap(), 0);
        let mut big = [0u8; 12];
        big[0] = 0x80;
        big[7] = 0x02;
        big[11] = 0x01;
        assert_eq!(number(&big).unwrap(), (2u64 << 32) + 1);
    }
}
