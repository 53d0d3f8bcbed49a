//! The `Range` header as S3 reads it: one `bytes=` range. A header S3 would not parse
//! (another unit, several ranges, `5-2`, junk) is ignored and the whole object is sent; a
//! range that parses but starts past the end is unsatisfiable (`416 InvalidRange`).

use std::ops::Range;

/// A parsed, not yet resolved, range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeSpec {
    /// `bytes=a-b` (inclusive) or `bytes=a-`.
    From { start: u64, last: Option<u64> },
    /// `bytes=-n`: the last `n` bytes.
    Suffix(u64),
}

/// A range that names no byte of the object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsatisfiable;

impl RangeSpec {
    /// Parses a header value; `None` for anything S3 would ignore.
    pub fn parse(value: &str) -> Option<RangeSpec> {
        let spec = value.trim().strip_prefix("bytes=")?.trim();
        if spec.contains(',') {
            return None;
        }
        let (a, b) = spec.split_once('-')?;
        let (a, b) = (a.trim(), b.trim());
        let num = |s: &str| -> Option<u64> {
            if s.is_empty() || !s.bytes().all(|c| c.is_ascii_digit()) {
                return None;
            }
            s.parse().ok()
        };
        if a.is_empty() {
            return Some(RangeSpec::Suffix(num(b)?));
        }
        let start = num(a)?;
        if b.is_empty() {
            return Some(RangeSpec::From { start, last: None });
        }
        let last = num(b)?;
        if last < start {
            return None;
        }
        Some(RangeSpec::From {
            start,
            last: Some(last),
        })
    }

    /// The bytes this range names in an object of `size` bytes.
    pub fn resolve(self, size: u64) -> Result<Range<u64>, Unsatisfiable> {
        match self {
            RangeSpec::From { start, last } => {
                if start >= size {
                    return Err(Unsatisfiable);
                }
                let end = last.map_or(size, |l| l.saturating_add(1).min(size));
                Ok(start..end)
            }
            RangeSpec::Suffix(n) => {
                if n == 0 || size == 0 {
                    return Err(Unsatisfiable);
                }
                Ok(size.saturating_sub(n)..size)
            }
        }
    }

    /// What S3 answers this range with in an object of `size` bytes: the bytes it names
    /// (`206`), `None` for the whole object (`200`), or unsatisfiable (`416`). Unlike
    /// RFC 9110, which finds no byte to send, AWS answers a suffix of an empty object
    /// (`bytes=-N`, N > 0) `200` with the empty body: readers that ask for a file's tail
    /// before its size (Trino, Arrow's object_store, Parquet footers) read empty files so.
    /// `bytes=0-` of an empty object stays `416`, as AWS answers it.
    pub fn answer(self, size: u64) -> Result<Option<Range<u64>>, Unsatisfiable> {
        match self {
            RangeSpec::Suffix(n) if n > 0 && size == 0 => Ok(None),
            _ => self.resolve(size).map(Some),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::S3Code;

    fn r(s: &str, size: u64) -> Option<Result<(u64, u64), S3Code>> {
        RangeSpec::parse(s).map(|spec| {
            spec.resolve(size)
                .map(|b| (b.start, b.end))
                .map_err(|Unsatisfiable| S3Code::InvalidRange)
        })
    }

    #[test]
    fn ranges_as_s3_reads_them() {
        assert_eq!(r("bytes=0-9", 100), Some(Ok((0, 10))));
        assert_eq!(r("bytes=10-", 100), Some(Ok((10, 100))));
        assert_eq!(r("bytes=-5", 100), Some(Ok((95, 100))));
        assert_eq!(r("bytes=-500", 100), Some(Ok((0, 100))));
        assert_eq!(r("bytes=90-200", 100), Some(Ok((90, 100))));
        assert_eq!(r("bytes=100-", 100), Some(Err(S3Code::InvalidRange)));
        assert_eq!(r("bytes=-0", 100), Some(Err(S3Code::InvalidRange)));
        assert_eq!(r("bytes=0-0", 0), Some(Err(S3Code::InvalidRange)));
        // What S3 answers: an empty object's tail is the whole (empty) object.
        let answer = |s: &str, size| RangeSpec::parse(s).unwrap().answer(size);
        assert_eq!(answer("bytes=-5", 0), Ok(None));
        assert_eq!(answer("bytes=-5", 100), Ok(Some(95..100)));
        assert_eq!(answer("bytes=-0", 0), Err(Unsatisfiable));
        assert_eq!(answer("bytes=0-", 0), Err(Unsatisfiable));
        // Ignored: the whole object is served.
        for junk in [
            "bytes=abc",
            "bytes=5-2",
            "items=0-1",
            "bytes=0-1,3-4",
            "bytes=",
            "bytes=-",
            "bytes=+1-2",
        ] {
            assert_eq!(RangeSpec::parse(junk), None, "{junk}");
        }
    }
}
