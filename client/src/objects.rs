//! Object operations over the S3 API: listing (ListObjectsV2, following continuation
//! tokens), stat (HEAD), reads whole, ranged, of one shard member, or streamed, uploads
//! streamed from a reader, deletes, and the bucket calls a script needs (list, create).

use std::io::{self, Read, Write};
use std::ops::Range;
use std::time::SystemTime;

use crate::client::{bucket_path, object_path, Client, Req};
use crate::dates::parse_http_date;
use crate::http::{Body, BodyReader, Head};
use crate::{Error, Result};
use granary_proto::encode::unquote;
use granary_proto::xml::ListPage;

/// Largest listing page or bucket list read.
const MAX_XML: usize = 64 << 20;

/// One object of a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectInfo {
    /// The full key (decoded).
    pub key: String,
    /// Bytes.
    pub size: u64,
    /// Without quotes.
    pub etag: String,
    /// When it was last written, if the listing said.
    pub last_modified: Option<SystemTime>,
}

/// A listing with a delimiter: the objects directly under the prefix, and the common
/// prefixes ("folders") below it.
#[derive(Debug, Clone, Default)]
pub struct Listing {
    /// The objects, in key order.
    pub objects: Vec<ObjectInfo>,
    /// The common prefixes, each ending with the delimiter.
    pub prefixes: Vec<String>,
}

/// What the headers of an object read or `HEAD` say.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ObjectMeta {
    /// `Content-Length`: the object's size for `stat` and whole reads, the length of the
    /// part sent for range and member reads.
    pub size: u64,
    /// Without quotes.
    pub etag: Option<String>,
    /// `Last-Modified`.
    pub last_modified: Option<SystemTime>,
    /// `Content-Type`.
    pub content_type: Option<String>,
    /// `x-granary-cache`: `hit`, `miss`, `peer` or `bypass`.
    pub cache: Option<String>,
    /// `x-granary-node`: the node that holds (or would hold) the object.
    pub node: Option<String>,
}

impl ObjectMeta {
    pub(crate) fn from_head(h: &Head) -> ObjectMeta {
        ObjectMeta {
            size: h
                .header("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            etag: h.header("etag").map(|e| unquote(e).to_owned()),
            last_modified: h.header("last-modified").and_then(parse_http_date),
            content_type: h.header("content-type").map(str::to_owned),
            cache: h.header("x-granary-cache").map(str::to_owned),
            node: h.header("x-granary-node").map(str::to_owned),
        }
    }
}

/// What to read of an object: a byte range, one member of a tar shard, the result of an
/// on-node transform (these combine as the node allows).
#[derive(Debug, Clone, Default)]
pub struct GetOptions {
    /// Bytes `start..end` (of the member, with `archpath`).
    pub range: Option<Range<u64>>,
    /// `?archpath=MEMBER`: one file out of a `.tar`/`.tar.gz`/`.tgz` shard.
    pub archpath: Option<String>,
    /// `?transform=NAME`: the object after an on-node transform.
    pub transform: Option<String>,
    /// `If-Match`: only this version (an ETag, with or without its quotes); another
    /// answers `412 PreconditionFailed`.
    pub if_match: Option<String>,
    /// `x-granary-plan`: the plan the read belongs to and where its rank stands
    /// ([`granary_proto::plan::PlanMark`]).
    pub plan: Option<String>,
    /// `?pipeline=NAME&seed=S&epoch=E`: a shard's members (those of `range`, bytes of
    /// the shard as stored) prepared on the node for a job's seed and epoch.
    pub pipeline: Option<Pipelined>,
}

/// A pipeline run on the node for one job's epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pipelined {
    pub name: String,
    pub seed: u64,
    pub epoch: u64,
}

/// An object's body as it arrives, with its headers. Owns its connection, so it can be
/// handed to another thread; the connection closes when it is dropped.
pub struct ObjectReader {
    meta: ObjectMeta,
    body: BodyReader,
    addr: String,
}

impl ObjectReader {
    pub(crate) fn new(h: &Head, body: BodyReader, addr: &str) -> ObjectReader {
        ObjectReader {
            meta: ObjectMeta::from_head(h),
            body,
            addr: addr.to_owned(),
        }
    }

    /// The answer's headers.
    pub fn meta(&self) -> &ObjectMeta {
        &self.meta
    }
}

impl ObjectReader {
    /// Reads until `buf` is full or the body ends; the bytes read. Where the answer's
    /// length is known this waits on the socket for all of them in one call, where
    /// `read` returns each burst as it arrives: fewer wake-ups for a caller that wants
    /// large pieces anyway.
    pub fn read_full(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.body
            .read_full(buf)
            .map_err(|e| io::Error::new(e.kind(), format!("reading from {}: {e}", self.addr)))
    }
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.body
            .read(buf)
            .map_err(|e| io::Error::new(e.kind(), format!("reading from {}: {e}", self.addr)))
    }
}

impl std::fmt::Debug for ObjectReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectReader")
            .field("meta", &self.meta)
            .field("addr", &self.addr)
            .finish()
    }
}

pub(crate) fn get_request(bucket: &str, key: &str, opts: &GetOptions) -> Result<Req<'static>> {
    let mut req = Req::new("GET", object_path(bucket, key)?);
    if let Some(a) = &opts.archpath {
        req = req.query("archpath", a);
    }
    if let Some(t) = &opts.transform {
        req = req.query("transform", t);
    }
    if let Some(p) = &opts.pipeline {
        req = req
            .query("pipeline", &p.name)
            .query("seed", &p.seed.to_string())
            .query("epoch", &p.epoch.to_string());
    }
    if let Some(r) = &opts.range {
        if r.start >= r.end {
            return Err(Error::Invalid(format!("empty range {r:?}")));
        }
        req = req.header("range", &format!("bytes={}-{}", r.start, r.end - 1));
    }
    if let Some(etag) = &opts.if_match {
        req = req.header("if-match", &format!("\"{}\"", etag.trim_matches('"')));
    }
    if let Some(mark) = &opts.plan {
        req = req.header(granary_proto::headers::PLAN, mark);
    }
    Ok(req)
}

/// Copies `body` into `sink`, telling the node's failures from the sink's.
fn copy(client: &Client, body: &mut BodyReader, sink: &mut dyn Write) -> Result<u64> {
    let mut buf = vec![0u8; 256 << 10];
    let mut total = 0u64;
    loop {
        let n = match body.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(client.io(e)),
        };
        sink.write_all(&buf[..n]).map_err(Error::Local)?;
        total += n as u64;
    }
}

impl Client {
    /// Every object under `prefix` (all of them, following continuation tokens), in key
    /// order.
    pub fn list(&mut self, bucket: &str, prefix: &str) -> Result<Vec<ObjectInfo>> {
        Ok(self.list_with(bucket, prefix, None)?.objects)
    }

    /// The objects under `prefix`, and with a `delimiter` (usually `/`) the common
    /// prefixes below it, following continuation tokens.
    pub fn list_with(
        &mut self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
    ) -> Result<Listing> {
        let path = bucket_path(bucket)?;
        let mut out = Listing::default();
        let mut token: Option<String> = None;
        loop {
            let mut req = Req::new("GET", path.clone())
                .query("list-type", "2")
                .query("encoding-type", "url")
                .query("prefix", prefix);
            if let Some(d) = delimiter {
                req = req.query("delimiter", d);
            }
            if let Some(t) = &token {
                req = req.query("continuation-token", t);
            }
            let target = req.target();
            let (_, body) = self.call_bytes(req, MAX_XML)?;
            let page = ListPage::parse(&body).map_err(|e| Error::Xml {
                path: target,
                message: e.to_string(),
            })?;
            out.objects
                .extend(page.objects.into_iter().map(|o| ObjectInfo {
                    key: o.key,
                    size: o.size,
                    etag: o.etag,
                    last_modified: o.last_modified,
                }));
            out.prefixes.extend(page.prefixes);
            let next = page.next_token.filter(|_| page.is_truncated);
            match next {
                Some(t) if Some(&t) != token.as_ref() => token = Some(t),
                _ => return Ok(out),
            }
        }
    }

    /// The names of all buckets (`GET /`).
    pub fn list_buckets(&mut self) -> Result<Vec<String>> {
        let (_, body) = self.call_bytes(Req::new("GET", "/".into()), MAX_XML)?;
        granary_proto::xml::parse_buckets(&body).map_err(|e| Error::Xml {
            path: "/".into(),
            message: e.to_string(),
        })
    }

    /// Creates a bucket (`PUT /{bucket}`).
    pub fn create_bucket(&mut self, bucket: &str) -> Result<()> {
        let req = Req::new("PUT", bucket_path(bucket)?);
        self.call_bytes(req, 1 << 20).map(drop)
    }

    /// The object's headers (`HEAD`): size, ETag, dates, and where Granary has it.
    pub fn stat(&mut self, bucket: &str, key: &str) -> Result<ObjectMeta> {
        let req = Req::new("HEAD", object_path(bucket, key)?);
        let (h, body) = self.call(req)?;
        self.done(body);
        Ok(ObjectMeta::from_head(&h))
    }

    /// Opens an object for reading as it streams in.
    pub fn open(&mut self, bucket: &str, key: &str) -> Result<ObjectReader> {
        self.open_with(bucket, key, &GetOptions::default())
    }

    /// Opens an object (a range of it, a member, a transform result) for reading as it
    /// streams in. The reader takes this client's connection; the client opens a new one
    /// for its next call.
    pub fn open_with(
        &mut self,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
    ) -> Result<ObjectReader> {
        let (h, body) = self.call(get_request(bucket, key, opts)?)?;
        Ok(ObjectReader::new(&h, body, self.endpoint()))
    }

    /// Reads a whole object into memory.
    pub fn get(&mut self, bucket: &str, key: &str) -> Result<Vec<u8>> {
        self.get_with(bucket, key, &GetOptions::default())
    }

    /// Reads bytes `range.start..range.end` of an object.
    pub fn get_range(&mut self, bucket: &str, key: &str, range: Range<u64>) -> Result<Vec<u8>> {
        let opts = GetOptions {
            range: Some(range),
            ..GetOptions::default()
        };
        self.get_with(bucket, key, &opts)
    }

    /// Reads one member of a tar shard (`?archpath=MEMBER`).
    pub fn get_member(&mut self, bucket: &str, key: &str, archpath: &str) -> Result<Vec<u8>> {
        let opts = GetOptions {
            archpath: Some(archpath.to_owned()),
            ..GetOptions::default()
        };
        self.get_with(bucket, key, &opts)
    }

    /// Reads what `opts` asks for into memory: one buffer sized from the answer's
    /// `Content-Length`, which the kernel copies the bytes into straight from the socket
    /// (no buffer in between, no regrowth).
    pub fn get_with(&mut self, bucket: &str, key: &str, opts: &GetOptions) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        let mut room = |n: usize| {
            out.try_reserve_exact(n).map_err(|_| {
                Error::Invalid(format!("{bucket}/{key}: {n} bytes do not fit in memory"))
            })?;
            Ok(out.as_mut_ptr())
        };
        // SAFETY: the pointer is `out`'s, with room for `n` bytes, and `out` is not
        // touched again until the call returns.
        let n = unsafe { self.get_with_alloc(bucket, key, opts, &mut room)? };
        // SAFETY: the call wrote all `n` bytes.
        unsafe { out.set_len(n) };
        Ok(out)
    }

    /// Reads what `opts` asks for into memory that `alloc` hands out once the answer's
    /// length `n` is known (a Python `bytes`, a pinned buffer), straight from the socket;
    /// returns `n`. An answer of unknown length (chunked) is read first and copied in.
    ///
    /// # Safety
    ///
    /// The pointer `alloc(n)` returns must be valid for writes of `n` bytes until this
    /// call returns; the bytes are all written only if it returns `Ok`.
    pub unsafe fn get_with_alloc(
        &mut self,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
        alloc: &mut dyn FnMut(usize) -> Result<*mut u8>,
    ) -> Result<usize> {
        // SAFETY: the caller vouches for `alloc`'s memory.
        let mut body = match unsafe { self.read_or_answer(bucket, key, opts, alloc, true)? } {
            Ok(n) => return Ok(n),
            Err(body) => body,
        };
        let n = match body.remaining() {
            Some(n) => {
                let n = usize::try_from(n).map_err(|_| {
                    Error::Invalid(format!("{bucket}/{key}: {n} bytes do not fit in memory"))
                })?;
                let dst = alloc(n)?;
                // SAFETY: the caller vouches for `dst..dst + n`.
                unsafe { body.fill_raw(dst, n, true) }.map_err(|e| self.io(e))?;
                n
            }
            None => {
                let mut all = Vec::new();
                copy(self, &mut body, &mut all)?;
                let dst = alloc(all.len())?;
                // SAFETY: as above, for `all.len()` bytes, which are not the caller's.
                unsafe { std::ptr::copy_nonoverlapping(all.as_ptr(), dst, all.len()) };
                all.len()
            }
        };
        self.done(body);
        Ok(n)
    }

    /// Reads what `opts` asks for into `buf` (memory the caller brings: pinned, reused),
    /// straight from the socket; the bytes written. An answer larger than `buf` is
    /// [`Error::Invalid`], before any byte is read.
    pub fn get_to_slice(
        &mut self,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
        buf: &mut [u8],
    ) -> Result<usize> {
        let room = buf.len();
        let at = buf.as_mut_ptr();
        let mut fits = |n: usize| {
            if n > room {
                return Err(Error::Invalid(format!(
                    "{bucket}/{key}: the answer is {n} bytes; the buffer holds {room}"
                )));
            }
            Ok(at)
        };
        // SAFETY: `buf` holds `room` bytes, and `fits` hands it out for no more.
        let mut body = match unsafe { self.read_or_answer(bucket, key, opts, &mut fits, false)? } {
            Ok(n) => return Ok(n),
            Err(body) => body,
        };
        let too_large = |n: Option<u64>| {
            let size = n.map_or_else(|| format!("more than {room}"), |n| n.to_string());
            Error::Invalid(format!(
                "{bucket}/{key}: the answer is {size} bytes; the buffer holds {room}"
            ))
        };
        let n = match body.remaining() {
            Some(n) if n > buf.len() as u64 => return Err(too_large(Some(n))),
            Some(n) => {
                let n = n as usize;
                body.read_full(&mut buf[..n]).map_err(|e| self.io(e))?;
                n
            }
            None => {
                let n = body.read_full(buf).map_err(|e| self.io(e))?;
                if !body.is_done() && body.read(&mut [0u8; 1]).map_err(|e| self.io(e))? > 0 {
                    return Err(too_large(None));
                }
                n
            }
        };
        self.done(body);
        Ok(n)
    }

    /// Streams a whole object into `sink`; returns its headers.
    pub fn get_into(
        &mut self,
        bucket: &str,
        key: &str,
        sink: &mut dyn Write,
    ) -> Result<ObjectMeta> {
        self.get_with_into(bucket, key, &GetOptions::default(), sink)
    }

    /// Streams what `opts` asks for into `sink`; returns the answer's headers.
    pub fn get_with_into(
        &mut self,
        bucket: &str,
        key: &str,
        opts: &GetOptions,
        sink: &mut dyn Write,
    ) -> Result<ObjectMeta> {
        let (h, mut body) = self.call(get_request(bucket, key, opts)?)?;
        let meta = ObjectMeta::from_head(&h);
        copy(self, &mut body, sink)?;
        self.done(body);
        Ok(meta)
    }

    /// Uploads `len` bytes read from `body` as the object, streaming them as they are read
    /// (signed as `UNSIGNED-PAYLOAD`); returns the new object's ETag.
    pub fn put(
        &mut self,
        bucket: &str,
        key: &str,
        body: &mut dyn Read,
        len: u64,
    ) -> Result<String> {
        let req = Req::new("PUT", object_path(bucket, key)?)
            .header("content-type", "application/octet-stream")
            .body(Body::Reader(body, len));
        let (h, _) = self.call_bytes(req, 1 << 20)?;
        Ok(h.header("etag")
            .map(|e| unquote(e).to_owned())
            .unwrap_or_default())
    }

    /// Uploads bytes held in memory; returns the new object's ETag.
    pub fn put_bytes(&mut self, bucket: &str, key: &str, data: &[u8]) -> Result<String> {
        let req = Req::new("PUT", object_path(bucket, key)?)
            .header("content-type", "application/octet-stream")
            .body(Body::Bytes(data));
        let (h, _) = self.call_bytes(req, 1 << 20)?;
        Ok(h.header("etag")
            .map(|e| unquote(e).to_owned())
            .unwrap_or_default())
    }

    /// Deletes an object (as S3 does, deleting a missing key succeeds).
    pub fn delete(&mut self, bucket: &str, key: &str) -> Result<()> {
        let req = Req::new("DELETE", object_path(bucket, key)?);
        self.call_bytes(req, 1 << 20).map(drop)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeServer, Reply};

    fn pattern(n: usize) -> Vec<u8> {
        (0..n).map(|i| (i * 7 % 253) as u8).collect()
    }

    #[test]
    fn get_lands_bodies_whole_however_they_are_framed() {
        // Large enough to be received ahead-faulted; one sent by length, one chunked,
        // one cut short.
        let big = pattern(40 << 20);
        let small = pattern(1000);
        let server = FakeServer::start(vec![
            Reply::ok(big.clone()),
            Reply::ok(small.clone()).chunked(333),
            Reply::ok(small.clone()),
            Reply::raw(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nonly ten b").then_close(),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        assert!(c.get("b", "big").unwrap() == big);
        assert_eq!(c.get("b", "chunked").unwrap(), small);
        assert_eq!(
            c.get("b", "again").unwrap(),
            small,
            "the connection is reused"
        );
        let err = c.get("b", "cut").unwrap_err();
        assert!(matches!(err, Error::Io { .. }), "{err}");
        let reqs = server.finish();
        assert_eq!(reqs[2].connection, 0);
    }

    #[test]
    fn get_to_slice_fills_the_callers_buffer_or_refuses_it() {
        let body = pattern(300_000);
        let server = FakeServer::start(vec![
            Reply::ok(body.clone()),
            Reply::ok(body.clone()).chunked(4096),
            Reply::ok(body.clone()).chunked(4096),
            Reply::ok(body.clone()).then_close(),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let opts = GetOptions::default();
        let mut buf = vec![0xAAu8; 400_000];
        assert_eq!(
            c.get_to_slice("b", "k", &opts, &mut buf).unwrap(),
            body.len()
        );
        assert!(buf[..body.len()] == body[..] && buf[body.len()..].iter().all(|&b| b == 0xAA));
        buf.fill(0);
        assert_eq!(
            c.get_to_slice("b", "k", &opts, &mut buf).unwrap(),
            body.len()
        );
        assert!(buf[..body.len()] == body[..]);
        // Too small: refused, by length before a byte is read, or as the chunks overflow.
        let mut small = vec![0u8; 1000];
        let err = c.get_to_slice("b", "k", &opts, &mut small).unwrap_err();
        assert!(err.to_string().contains("more than 1000 bytes"), "{err}");
        let err = c.get_to_slice("b", "k", &opts, &mut small).unwrap_err();
        assert!(err.to_string().contains("is 300000 bytes"), "{err}");
        assert!(matches!(err, Error::Invalid(_)), "{err}");
        server.finish();
    }

    fn page(keys: &[&str], next: Option<&str>) -> Vec<u8> {
        let mut s =
            String::from("<ListBucketResult><Name>b</Name><EncodingType>url</EncodingType>");
        s.push_str(&format!("<IsTruncated>{}</IsTruncated>", next.is_some()));
        if let Some(n) = next {
            s.push_str(&format!(
                "<NextContinuationToken>{n}</NextContinuationToken>"
            ));
        }
        for k in keys {
            s.push_str(&format!(
                "<Contents><Key>{k}</Key><ETag>\"e\"</ETag><Size>3</Size></Contents>"
            ));
        }
        s.push_str("</ListBucketResult>");
        s.into_bytes()
    }

    #[test]
    fn listings_follow_continuation_tokens() {
        let server = FakeServer::start(vec![
            Reply::ok(page(&["p/a", "p/b%2Bc"], Some("t+1/="))),
            Reply::ok(page(&["p/d"], None)),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let keys: Vec<String> = c
            .list("b", "p/")
            .unwrap()
            .into_iter()
            .map(|o| o.key)
            .collect();
        assert_eq!(keys, vec!["p/a", "p/b+c", "p/d"]);
        let reqs = server.finish();
        assert_eq!(
            reqs[0].target,
            "/b?list-type=2&encoding-type=url&prefix=p%2F"
        );
        assert_eq!(
            reqs[1].target,
            "/b?list-type=2&encoding-type=url&prefix=p%2F&continuation-token=t%2B1%2F%3D"
        );
    }

    #[test]
    fn stat_reads_the_headers() {
        let server = FakeServer::start(vec![Reply::ok(Vec::new())
            .with_header("content-length", "1234")
            .with_header("etag", "\"abc\"")
            .with_header("last-modified", "Thu, 29 Feb 2024 12:34:56 GMT")
            .with_header("x-granary-cache", "hit")
            .with_header("x-granary-node", "n1")
            .head_only()]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let m = c.stat("b", "k").unwrap();
        assert_eq!(m.size, 1234);
        assert_eq!(m.etag.as_deref(), Some("abc"));
        assert_eq!(m.cache.as_deref(), Some("hit"));
        assert_eq!(m.node.as_deref(), Some("n1"));
        assert!(m.last_modified.is_some());
        let reqs = server.finish();
        assert_eq!(reqs[0].method, "HEAD");
    }

    #[test]
    fn uploads_stream_their_length_and_members_are_asked_by_query() {
        let server = FakeServer::start(vec![
            Reply::ok(Vec::new()).with_header("etag", "\"e1\""),
            Reply::ok(b"member".to_vec()),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let data = vec![7u8; 300_000];
        let etag = c.put("b", "dir/k", &mut data.as_slice(), 300_000).unwrap();
        assert_eq!(etag, "e1");
        assert_eq!(c.get_member("b", "s.tar", "x/0.jpg").unwrap(), b"member");
        let reqs = server.finish();
        assert_eq!(reqs[0].method, "PUT");
        assert_eq!(reqs[0].target, "/b/dir/k");
        assert_eq!(reqs[0].body, data);
        assert_eq!(reqs[1].target, "/b/s.tar?archpath=x%2F0.jpg");
    }

    #[test]
    fn a_short_upload_source_is_a_local_error() {
        let server = FakeServer::start(vec![]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let err = c.put("b", "k", &mut &b"abc"[..], 10).unwrap_err();
        assert!(matches!(err, Error::Local(_)), "{err:?}");
        drop(c);
        server.finish();
    }
}
