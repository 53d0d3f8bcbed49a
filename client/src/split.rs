//! A large object read over several connections at once, the way S3's fast clients read
//! (the AWS CRT's ranged GETs, s5cmd): the first request asks for the object's first
//! [`FIRST`] bytes, and its answer gives the object's size and version. An object no larger
//! has come whole. A larger one that the node serves from its cache (`x-granary-cache:
//! hit`) is read on: every connection takes the next [`PART`] bytes by range, pinned to
//! the same version (`If-Match`), and the kernel copies each into its place in the one
//! destination. One stream into one buffer is bound by one core's copy (and, into new
//! memory, its page faults); parts go side by side. A node filling the object (a miss)
//! sends the rest on the same connection, behind its fill, so a cold object is fetched
//! from the backend once.
//!
//! Only plain whole-object reads over TCP split: a range, a member, a transform or a
//! planned read is one request, as asked, and a Unix socket's reads are local.
//!
//! `fresh` below: the destination is new memory (`get`), faulted in as the bytes land,
//! rather than the caller's (`get_into`), in use already.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use crate::http::{BodyReader, Head};
use crate::objects::{get_request, GetOptions};
use crate::pages::huge_pages;
use crate::{Client, Error, Result};

/// What the first request asks for: an object this size or smaller comes in one answer.
pub(crate) const FIRST: u64 = 32 << 20;
/// What each later request of a split read asks for.
pub(crate) const PART: u64 = 32 << 20;

/// `Content-Range: bytes A-B/TOTAL` as `(A..B+1, TOTAL)`.
fn content_range(h: &Head) -> Option<(Range<u64>, u64)> {
    let v = h.header("content-range")?.strip_prefix("bytes ")?;
    let (span, total) = v.split_once('/')?;
    let (a, b) = span.split_once('-')?;
    let (a, b, total) = (
        a.trim().parse::<u64>().ok()?,
        b.trim().parse::<u64>().ok()?,
        total.trim().parse::<u64>().ok()?,
    );
    (a <= b && b < total).then_some((a..b + 1, total))
}

/// Whether `e` is the node's answer `status`.
fn is_status(e: &Error, status: u16) -> bool {
    matches!(e, Error::S3 { status: s, .. } | Error::Status { status: s, .. } if *s == status)
}

/// The answer to a split read's first request.
pub(crate) struct FirstPart {
    /// Its body: the object's first bytes.
    pub body: BodyReader,
    /// The bytes it holds.
    pub first: Range<u64>,
    /// The object's size.
    pub total: u64,
    /// The node served it from its cache: the rest may come in parts side by side.
    pub hit: bool,
    /// The read's options pinned to the object's version (`If-Match` its ETag).
    pub pinned: GetOptions,
}

/// What a split read's first request brought.
pub(crate) enum First {
    /// The object is empty: there was no first byte to ask for.
    Empty,
    /// The answer is the whole object, to be read as it is.
    Whole(BodyReader),
    /// Its first bytes; more is to come.
    Part(FirstPart),
}

/// The parts of `start..end` still to be read, [`PART`] bytes each, taken by the
/// threads of one split read in turn until none is left or one of them fails.
pub(crate) struct Parts {
    next: AtomicU64,
    end: u64,
    stopped: AtomicBool,
}

impl Parts {
    pub(crate) fn new(bytes: Range<u64>) -> Parts {
        Parts {
            next: AtomicU64::new(bytes.start),
            end: bytes.end,
            stopped: AtomicBool::new(false),
        }
    }

    /// The next part to read, if any is left and no thread has stopped the read.
    pub(crate) fn take(&self) -> Option<Range<u64>> {
        if self.stopped.load(Ordering::Relaxed) {
            return None;
        }
        let start = self.next.fetch_add(PART, Ordering::Relaxed);
        (start < self.end).then(|| start..(start + PART).min(self.end))
    }

    /// Ends the read: no more parts are handed out.
    pub(crate) fn stop(&self) {
        self.stopped.store(true, Ordering::Relaxed);
    }
}

/// A read's destination: `len` bytes at `addr`, written by several threads, each its own
/// part.
#[derive(Clone, Copy)]
struct Dest {
    addr: usize,
    len: usize,
}

/// Reads `bytes` of the answer `body` (its whole remaining length) into `dst` at
/// `bytes.start`.
///
/// # Safety
///
/// `dst` is valid for writes of `dst.len` bytes and `bytes` lies inside it; no other
/// thread writes `bytes` meanwhile.
unsafe fn fill_part(
    c: &mut Client,
    mut body: BodyReader,
    dst: Dest,
    bytes: Range<u64>,
    fresh: bool,
) -> Result<()> {
    let len = (bytes.end - bytes.start) as usize;
    if body.remaining() != Some(len as u64) || bytes.end as usize > dst.len {
        return Err(Error::Protocol(format!(
            "a part's answer is {:?} bytes, not the {len} asked for",
            body.remaining()
        )));
    }
    let at = (dst.addr + bytes.start as usize) as *mut u8;
    // SAFETY: the caller vouches for the part's bytes.
    unsafe { body.fill_raw(at, len, fresh) }.map_err(|e| c.io(e))?;
    c.done(body);
    Ok(())
}

impl Client {
    /// Whether a read with `opts` may split: a plain whole-object read over TCP.
    pub(crate) fn may_split(&self, opts: &GetOptions) -> bool {
        self.streams() > 1
            && !self.endpoint().starts_with("unix:")
            && opts.range.is_none()
            && opts.archpath.is_none()
            && opts.transform.is_none()
            && opts.plan.is_none()
    }

    /// A split read's first request.
    pub(crate) fn first_part(
        &mut self,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
    ) -> Result<First> {
        let req =
            get_request(bucket, key, opts)?.header("range", &format!("bytes=0-{}", FIRST - 1));
        let (h, body) = match self.call(req) {
            Ok(answer) => answer,
            Err(e) if is_status(&e, 416) => return Ok(First::Empty),
            Err(e) => return Err(e),
        };
        let (first, total) = match (h.status, content_range(&h)) {
            (206, Some((first, total))) if first.start == 0 => (first, total),
            // The whole object came (a node that ignores ranges): read as it is.
            (200, _) => return Ok(First::Whole(body)),
            _ => {
                return Err(Error::Protocol(format!(
                    "{bucket}/{key}: answer {} to the first bytes, Content-Range {:?}",
                    h.status,
                    h.header("content-range")
                )))
            }
        };
        if first.end == total {
            return Ok(First::Whole(body));
        }
        let etag = h
            .header("etag")
            .ok_or_else(|| Error::Protocol(format!("{bucket}/{key}: an answer with no ETag")))?;
        Ok(First::Part(FirstPart {
            hit: h.header("x-granary-cache") == Some("hit"),
            body,
            first,
            total,
            pinned: GetOptions {
                if_match: Some(etag.to_owned()),
                ..opts.clone()
            },
        }))
    }

    /// What `opts` asks for: read into `alloc`'s memory where the read splits (the
    /// bytes written), else the answer, for the caller to read as it is: a read that
    /// does not split, an object whose first answer is all of it, an empty object, or one
    /// that changed under a split read (asked for again as one request, and `alloc`
    /// asked again).
    ///
    /// # Safety
    ///
    /// As for [`Client::get_with_alloc`].
    pub(crate) unsafe fn read_or_answer(
        &mut self,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
        alloc: &mut dyn FnMut(usize) -> Result<*mut u8>,
        fresh: bool,
    ) -> Result<std::result::Result<usize, BodyReader>> {
        let plain = |c: &mut Client| Ok(Err(c.call(get_request(bucket, key, opts)?)?.1));
        if !self.may_split(opts) {
            return plain(self);
        }
        let FirstPart {
            body,
            first,
            total,
            hit,
            pinned,
        } = match self.first_part(bucket, key, opts)? {
            First::Part(part) => part,
            First::Whole(body) => return Ok(Err(body)),
            First::Empty => return plain(self),
        };
        let n = usize::try_from(total).map_err(|_| {
            Error::Invalid(format!(
                "{bucket}/{key}: {total} bytes do not fit in memory"
            ))
        })?;
        let dst = Dest {
            addr: alloc(n)? as usize,
            len: n,
        };
        let rest = first.end..total;
        let read = if hit {
            if fresh {
                huge_pages(dst.addr, dst.len);
            }
            // SAFETY: `dst` is `alloc`'s, `n` bytes; the parts are disjoint, inside it.
            unsafe { self.read_parts(bucket, key, &pinned, dst, (body, first), rest) }
        } else {
            // SAFETY: as above.
            unsafe { fill_part(self, body, dst, first, fresh) }
                .and_then(|()| unsafe { self.read_range(bucket, key, &pinned, dst, rest, fresh) })
        };
        match read {
            Ok(()) => Ok(Ok(n)),
            // The object changed under the read: once more, as one request.
            Err(e) if is_status(&e, 412) => plain(self),
            Err(e) => Err(e),
        }
    }

    /// `bytes` of the object in one request, into `dst`.
    ///
    /// # Safety
    ///
    /// As for [`fill_part`].
    unsafe fn read_range(
        &mut self,
        bucket: &str,
        key: &str,
        pinned: &GetOptions,
        dst: Dest,
        bytes: Range<u64>,
        fresh: bool,
    ) -> Result<()> {
        let body = self.part_answer(bucket, key, pinned, bytes.clone())?;
        // SAFETY: the caller vouches for `bytes` of `dst`.
        unsafe { fill_part(self, body, dst, bytes, fresh) }
    }

    /// The answer to a ranged GET of `bytes` of the version `pinned` names, checked to
    /// be those bytes (`206`, its `Content-Range`); its body not yet read.
    pub(crate) fn part_answer(
        &mut self,
        bucket: &str,
        key: &str,
        pinned: &GetOptions,
        bytes: Range<u64>,
    ) -> Result<BodyReader> {
        let req = get_request(bucket, key, pinned)?
            .header("range", &format!("bytes={}-{}", bytes.start, bytes.end - 1));
        let (h, body) = self.call(req)?;
        if h.status != 206 || content_range(&h).map(|(r, _)| r) != Some(bytes.clone()) {
            return Err(Error::Protocol(format!(
                "{bucket}/{key}: answer {} to bytes {bytes:?}, Content-Range {:?}",
                h.status,
                h.header("content-range")
            )));
        }
        Ok(body)
    }

    /// Takes this client's `n` helper clients (made as needed), to be put back in
    /// `self.helpers` once the read is done.
    pub(crate) fn take_helpers(&mut self, n: usize) -> Vec<Client> {
        let mut helpers = std::mem::take(&mut self.helpers);
        while helpers.len() < n {
            helpers.push(self.fresh());
        }
        helpers
    }

    /// `bytes` of the object in [`PART`]s over this client's connection and its helpers',
    /// each taking the next part until none is left; this one reads the answer `first`
    /// (the first request's) before it takes any.
    ///
    /// # Safety
    ///
    /// As for [`fill_part`].
    unsafe fn read_parts(
        &mut self,
        bucket: &str,
        key: &str,
        pinned: &GetOptions,
        dst: Dest,
        first: (BodyReader, Range<u64>),
        bytes: Range<u64>,
    ) -> Result<()> {
        let parts = (bytes.end - bytes.start).div_ceil(PART) as usize;
        let streams = self.streams().min(parts);
        let mut helpers = self.take_helpers(streams - 1);
        let todo = Parts::new(bytes);
        let first_error: Mutex<Option<Error>> = Mutex::new(None);
        let fail = |e: Error| {
            todo.stop();
            first_error
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get_or_insert(e);
        };
        let work = |c: &mut Client| {
            while let Some(part) = todo.take() {
                // SAFETY: each part is taken by one thread only, inside `bytes`.
                if let Err(e) = unsafe { c.read_range(bucket, key, pinned, dst, part, false) } {
                    fail(e);
                    return;
                }
            }
        };
        std::thread::scope(|scope| {
            for h in helpers.iter_mut().take(streams - 1) {
                scope.spawn(|| work(h));
            }
            let (body, range) = first;
            // SAFETY: the first part is this thread's alone.
            match unsafe { fill_part(self, body, dst, range, false) } {
                Ok(()) => work(self),
                Err(e) => fail(e),
            }
        });
        self.helpers = helpers;
        match first_error.into_inner().unwrap_or_else(|p| p.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeServer, Reply};
    use granary_proto::Header;

    fn head(v: &str) -> Head {
        Head {
            status: 206,
            headers: vec![Header::new("content-range", v)],
        }
    }

    const SIZE: u64 = FIRST + 10;

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 31 % 251) as u8).collect()
    }

    fn first_answer(data: &[u8], cache: &str) -> Reply {
        Reply::status(206, data[..FIRST as usize].to_vec())
            .with_header("content-range", &format!("bytes 0-{}/{SIZE}", FIRST - 1))
            .with_header("etag", "\"v1\"")
            .with_header("x-granary-cache", cache)
    }

    #[test]
    fn a_miss_reads_the_rest_on_one_connection_pinned_to_its_version() {
        let data = pattern(SIZE as usize);
        let server = FakeServer::start(vec![
            first_answer(&data, "miss"),
            Reply::status(206, data[FIRST as usize..].to_vec()).with_header(
                "content-range",
                &format!("bytes {FIRST}-{}/{SIZE}", SIZE - 1),
            ),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap().with_streams(4);
        assert!(c.get("b", "k").unwrap() == data);
        let seen = server.finish();
        assert_eq!(
            seen[0].header("range"),
            Some(format!("bytes=0-{}", FIRST - 1).as_str())
        );
        assert_eq!(
            seen[1].header("range"),
            Some(format!("bytes={FIRST}-{}", SIZE - 1).as_str())
        );
        assert_eq!(seen[1].header("if-match"), Some("\"v1\""));
        assert_eq!(seen[1].connection, 0, "the same connection");
    }

    #[test]
    fn an_object_that_changes_under_a_split_read_is_read_again_whole() {
        let old = pattern(SIZE as usize);
        let new: Vec<u8> = old.iter().rev().copied().chain([7u8; 10]).collect();
        let failed = "<Error><Code>PreconditionFailed</Code><Message>no</Message></Error>";
        let server = FakeServer::start(vec![
            first_answer(&old, "hit"),
            Reply::status(412, failed.as_bytes().to_vec()),
            Reply::ok(new.clone()),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap().with_streams(4);
        assert!(c.get("b", "k").unwrap() == new, "the new version, whole");
        let seen = server.finish();
        assert_eq!(seen.len(), 3);
        assert_eq!(seen[1].header("if-match"), Some("\"v1\""));
        assert_eq!(seen[2].header("range"), None);
        assert_eq!(seen[2].header("if-match"), None);
    }

    #[test]
    fn content_ranges_parse_and_bad_ones_do_not() {
        assert_eq!(content_range(&head("bytes 0-9/100")), Some((0..10, 100)));
        assert_eq!(
            content_range(&head("bytes 90-99/100")),
            Some((90..100, 100))
        );
        assert_eq!(content_range(&head("bytes 0-100/100")), None);
        assert_eq!(content_range(&head("bytes 9-0/100")), None);
        assert_eq!(content_range(&head("bytes */100")), None);
        assert_eq!(content_range(&head("0-9/100")), None);
    }
}
