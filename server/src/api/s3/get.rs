//! Reads: GetObject and HeadObject (ranges, conditionals), a member of a tar shard
//! (`?archpath=`), a transform's result (`?transform=`), and a whole `.tar` shard with a
//! member transform (a tar stream). The node reads; this file turns the request into a
//! [`ReadRequest`] and the [`Reply`] into headers: the bytes as the body, or for a
//! client on this machine that asks for it (`x-granary-local: fd` over the Unix socket),
//! a read-only descriptor of the cache file (see `crate::local`).

use std::os::fd::OwnedFd;

use axum::body::Body;
use axum::extract::ConnectInfo;
use axum::response::{IntoResponse, Response};
use granary_proto::headers::{
    CACHE, LOCAL, LOCAL_CHECKS, LOCAL_LENGTH, LOCAL_OFFSET, LOCAL_RESIDENT, NODE, PLAN, TRANSFORM,
};
use granary_proto::range::RangeSpec;
use granary_proto::Header;
use http::{header, HeaderMap, HeaderName, HeaderValue, StatusCode};

use super::{http_date, Req};
use crate::api::error::{S3Code, S3Error};
use crate::api::AppState;
use crate::local::FdSender;
use granary_core::{
    calls, etag_matches, members_in_order, ArchiveFormat as Format, ArchiveMember, Body as Bytes,
    ByteRange, CacheError, Conditions, Item, LocalFile, LocalReader, NodeError, ObjectMeta,
    ObjectParts, Origin, PartRange, ReadMode, ReadRequest, Reply, Spilled, TarIndex,
};

/// What was read: an object (and its headers), a shard member, or a transform's result.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind<'a> {
    Object,
    Member,
    Transformed(&'a str),
}

/// GetObject, HeadObject, and their `?archpath=` and `?transform=` forms.
pub async fn get(state: &AppState, r: Req, head: bool) -> Result<Response, S3Error> {
    let node = &state.node;
    if let Some(name) = r.q("pipeline").map(str::to_owned) {
        return prepared(state, r, &name, head).await;
    }
    let member = r.q("archpath");
    let transform = r.q("transform");
    if let Some(name) = transform {
        let t = node.transform(name)?;
        if member.is_none() && !t.members.is_empty() {
            let (bucket, key) = (r.bucket.clone(), r.key().to_owned());
            return whole_shard(state, (&bucket, &key), &t, head).await;
        }
    }
    // Members' own headers count only from a member.
    let from_member = crate::api::FromMember::of_parts(&r.parts).is_some();
    let peer_fill = from_member && calls::asks_copy(&r.parts.headers) && !head;
    let local = if head || peer_fill {
        None
    } else {
        local_sender(&r)
    };
    let mode = match (head, peer_fill, local.as_ref()) {
        (true, _, _) => ReadMode::Head,
        (_, true, _) => ReadMode::Committed,
        (_, _, Some((_, reader))) => ReadMode::Local(*reader),
        _ => ReadMode::Stream,
    };
    let fds = local.map(|(fds, _)| fds);
    let mut conditions = conditions(&r.parts.headers);
    let mut range = r.header("range").and_then(RangeSpec::parse);
    let part = match r.q("partNumber") {
        Some(n) if member.is_none() && transform.is_none() => {
            let ranged = r.parts.headers.contains_key(header::RANGE);
            let part = part_of(state, (&r.bucket, r.key()), n, ranged).await?;
            range = part.range;
            // The part's bytes come from the version its offsets were read from.
            conditions.if_match.get_or_insert_with(|| part.etag.clone());
            Some(part)
        }
        _ => None,
    };
    let req = ReadRequest {
        bucket: &r.bucket,
        key: r.key(),
        member,
        member_at: None,
        transform,
        range,
        conditions,
        mode,
    };
    let kind = match (transform, member) {
        (Some(t), _) => Kind::Transformed(t),
        (None, Some(_)) => Kind::Member,
        (None, None) => Kind::Object,
    };
    let reply = if kind == Kind::Object && mode == ReadMode::Stream {
        // Another node with room takes what this one cannot admit; the request carries
        // the ids of the nodes that refused it, so it never comes back.
        let tried: Vec<&str> = if from_member {
            calls::spilled_by(&r.parts.headers)
        } else {
            Vec::new()
        };
        match node.read_spilling(&req, &r.parts, &tried).await? {
            Spilled::Here(reply) => reply,
            Spilled::Answered(resp) => return Ok(resp.map(Body::new)),
        }
    } else {
        match node.read(&req).await {
            Ok(reply) => reply,
            Err(NodeError::Cache(CacheError::NotHeld)) => {
                // The usual answer to a peer's question, not a client's error.
                let mut resp =
                    S3Error::new(S3Code::NoSuchKey, "this node holds no copy of the object")
                        .with_resource(r.resource())
                        .into_response();
                resp.extensions_mut().insert(crate::api::NotAnError);
                return Ok(resp);
            }
            Err(e) => return Err(e.into()),
        }
    };
    if let Some(mark) = r.header(PLAN) {
        // The object's bytes this read sends (a member's are not counted).
        let bytes = (kind == Kind::Object && !head)
            .then(|| reply.range.map_or((0, reply.size), |b| (b.start, b.end)));
        node.planned_read(mark, r.key(), bytes, reply.origin);
    }
    let mut resp = answer(state, &r, kind, reply, fds.as_ref());
    if let Some(p) = part.filter(|p| p.count > 1 || p.etag.contains('-')) {
        let h = resp.headers_mut();
        h.insert("x-amz-mp-parts-count", HeaderValue::from(p.count));
        // A part's own checksum, as it was uploaded.
        if let Some((name, value)) = &p.checksum {
            for (name, value) in [(name.as_str(), value), ("x-amz-checksum-type", &p.kind)] {
                if let (Ok(n), Ok(v)) = (HeaderName::try_from(name), HeaderValue::from_str(value)) {
                    h.insert(n, v);
                }
            }
        }
    }
    Ok(resp)
}

/// `?partNumber=N`: the bytes of part N of an object completed from parts (part 1 of an
/// object written whole is all of it).
struct Part {
    range: Option<RangeSpec>,
    etag: String,
    count: usize,
    checksum: Option<(String, String)>,
    /// The object's checksum type.
    kind: String,
}

async fn part_of(
    state: &AppState,
    (bucket, key): (&str, &str),
    n: &str,
    ranged: bool,
) -> Result<Part, S3Error> {
    let n: usize = n
        .parse()
        .ok()
        .filter(|n| (1..=10_000).contains(n))
        .ok_or_else(|| {
            S3Error::new(
                S3Code::InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive",
            )
        })?;
    if ranged {
        return Err(S3Error::new(
            S3Code::InvalidRequest,
            "Cannot specify both Range header and partNumber query parameter",
        ));
    }
    let layout = state.node.part_of(bucket, key, n).await?;
    let Some(PartRange {
        start,
        len,
        checksum,
    }) = layout.part
    else {
        return Err(S3Error::new(
            S3Code::InvalidPartNumber,
            "The requested partnumber is not satisfiable",
        )
        .with_detail("PartNumberRequested", n.to_string())
        .with_detail("ActualPartCount", layout.count.to_string()));
    };
    let range = (len > 0).then_some(RangeSpec::From {
        start,
        last: Some(start + len - 1),
    });
    Ok(Part {
        range,
        etag: layout.etag,
        count: layout.count,
        checksum,
        kind: layout
            .checksum_type
            .unwrap_or_else(|| "COMPOSITE".to_owned()),
    })
}

/// GetObjectAttributes: of those `x-amz-object-attributes` names, what Granary knows:
/// `ETag`, `Checksum` (kept from the write), `ObjectParts` (of an object completed from
/// parts, where the backend tells), `StorageClass`, `ObjectSize`.
pub async fn attributes(state: &AppState, r: Req) -> Result<Response, S3Error> {
    let asked = AttributesAsked::parse(&r)?;
    let meta = state.node.head_object(&r.bucket, r.key()).await?;
    let layout = if asked.names.iter().any(|a| a == "ObjectParts") && meta.etag.contains('-') {
        state.node.parts_of(&r.bucket, r.key()).await?
    } else {
        None
    };
    let mut resp = super::xml_response(asked.render(&meta, layout.as_ref()));
    resp.headers_mut()
        .insert(header::LAST_MODIFIED, http_date(meta.last_modified));
    Ok(resp)
}

/// What a GetObjectAttributes request asks: the attributes, and a page of parts.
struct AttributesAsked {
    names: Vec<String>,
    max_parts: usize,
    marker: usize,
}

impl AttributesAsked {
    fn parse(r: &Req) -> Result<AttributesAsked, S3Error> {
        let names: Vec<String> = r
            .header("x-amz-object-attributes")
            .unwrap_or("")
            .split(',')
            .map(|a| a.trim().to_owned())
            .filter(|a| !a.is_empty())
            .collect();
        if names.is_empty() {
            return Err(S3Error::new(
                S3Code::InvalidArgument,
                "x-amz-object-attributes names no attribute",
            ));
        }
        let number = |name: &str, default: usize| -> Result<usize, S3Error> {
            match r.header(name) {
                None => Ok(default),
                Some(v) => v.parse().map_err(|_| {
                    S3Error::new(S3Code::InvalidArgument, format!("{name} must be a number"))
                }),
            }
        };
        Ok(AttributesAsked {
            names,
            max_parts: number("x-amz-max-parts", 1000)?.min(1000),
            marker: number("x-amz-part-number-marker", 0)?,
        })
    }

    fn render(&self, meta: &ObjectMeta, layout: Option<&ObjectParts>) -> String {
        let (max, marker) = (self.max_parts, self.marker);
        let checksums: Vec<(String, &str)> = meta
            .headers
            .iter()
            .filter_map(|Header { name: k, value: v }| {
                let alg = k.strip_prefix("x-amz-checksum-")?;
                let tag = match alg {
                    "type" => "ChecksumType".to_owned(),
                    alg => format!("Checksum{}", alg.to_ascii_uppercase()),
                };
                Some((tag, v.as_str()))
            })
            .collect();
        let mut doc = super::xml::Doc::new("GetObjectAttributesResponse");
        for a in &self.names {
            match a.as_str() {
                "ETag" => {
                    doc.elem("ETag", &meta.etag);
                }
                "Checksum" if !checksums.is_empty() => {
                    doc.open("Checksum");
                    for (tag, v) in &checksums {
                        doc.elem(tag, v);
                    }
                    doc.close("Checksum");
                }
                "ObjectParts" => {
                    if let Some(l) = layout {
                        let total = l.parts.len();
                        let page: Vec<_> =
                            l.parts.iter().enumerate().skip(marker).take(max).collect();
                        let last = page.last().map_or(marker, |(i, _)| i + 1);
                        doc.open("ObjectParts")
                            .elem("TotalPartsCount", &total.to_string())
                            .elem("PartsCount", &total.to_string())
                            .elem("PartNumberMarker", &marker.to_string())
                            .elem("NextPartNumberMarker", &last.to_string())
                            .elem("MaxParts", &max.to_string())
                            .elem("IsTruncated", if last < total { "true" } else { "false" });
                        for (i, (size, checksum)) in page {
                            doc.open("Part")
                                .elem("PartNumber", &(i + 1).to_string())
                                .elem("Size", &size.to_string());
                            if let Some((name, v)) = checksum {
                                let alg = name.trim_start_matches("x-amz-checksum-");
                                doc.elem(&format!("Checksum{}", alg.to_ascii_uppercase()), v);
                            }
                            doc.close("Part");
                        }
                        doc.close("ObjectParts");
                    }
                }
                "StorageClass" => {
                    doc.elem("StorageClass", "STANDARD");
                }
                "ObjectSize" => {
                    doc.elem("ObjectSize", &meta.size.to_string());
                }
                _ => {}
            }
        }
        doc.finish("GetObjectAttributesResponse")
    }
}

/// The answer to a read: headers for `kind`, then the bytes, or the descriptor.
fn answer(
    state: &AppState,
    r: &Req,
    kind: Kind<'_>,
    reply: Reply,
    fds: Option<&FdSender>,
) -> Response {
    let Reply {
        meta,
        size,
        range,
        origin,
        body,
    } = reply;
    // A descriptor only for a client that asked for one over the socket.
    let (body, file) = match (body, fds) {
        (Bytes::File(lf), Some(_)) => (Body::empty(), Some(lf)),
        (other, _) => (Body::from_stream(other.into_stream()), None),
    };
    let mut resp = Response::new(body);
    let h = resp.headers_mut();
    match kind {
        Kind::Member => {
            // A member is not an object: no ETag of its own.
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            );
            h.insert(header::LAST_MODIFIED, http_date(meta.last_modified));
            h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
            source_headers(state, h, origin);
        }
        Kind::Object | Kind::Transformed(_) => {
            object_headers(state, h, &meta, origin);
            // A stored checksum is of the whole object, sent when asked for.
            let asked = r
                .header("x-amz-checksum-mode")
                .is_some_and(|m| m.eq_ignore_ascii_case("ENABLED"));
            if !asked || range.is_some() || kind != Kind::Object {
                let names: Vec<HeaderName> = h
                    .keys()
                    .filter(|k| k.as_str().starts_with("x-amz-checksum-"))
                    .cloned()
                    .collect();
                for n in names {
                    h.remove(n);
                }
            }
            if let Kind::Transformed(t) = kind {
                if let Ok(v) = HeaderValue::from_str(t) {
                    h.insert(TRANSFORM, v);
                }
            }
            response_overrides(r, h);
        }
    }
    match (file, fds) {
        (Some(lf), Some(fds)) => local_answer(resp, *lf, fds),
        _ => {
            set_length(&mut resp, range, size);
            resp
        }
    }
}

/// The conditional headers of a request.
fn conditions(h: &HeaderMap) -> Conditions {
    let text = |n: &str| h.get(n).and_then(|v| v.to_str().ok());
    let date = |n: &str| text(n).and_then(|v| httpdate::parse_http_date(v).ok());
    Conditions {
        if_match: text("if-match").map(str::to_owned),
        if_none_match: text("if-none-match").map(str::to_owned),
        if_modified_since: date("if-modified-since"),
        if_unmodified_since: date("if-unmodified-since"),
    }
}

/// Where the bytes came from, and the node that holds them.
fn source_headers(state: &AppState, h: &mut HeaderMap, origin: Origin) {
    h.insert(CACHE, HeaderValue::from_static(origin.as_str()));
    if let Ok(v) = HeaderValue::from_str(state.node.id()) {
        h.insert(NODE, v);
    }
}

/// The headers every object read carries.
fn object_headers(state: &AppState, h: &mut HeaderMap, meta: &ObjectMeta, origin: Origin) {
    h.insert(header::ETAG, super::quoted(&meta.etag));
    h.insert(header::LAST_MODIFIED, http_date(meta.last_modified));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    let mut has_type = false;
    for Header { name: k, value: v } in &meta.headers {
        let value = HeaderValue::from_bytes(&granary_proto::headers::latin1_bytes(v));
        if let (Ok(name), Ok(value)) = (HeaderName::try_from(k.as_str()), value) {
            has_type |= name == header::CONTENT_TYPE;
            h.insert(name, value);
        }
    }
    if !has_type {
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/octet-stream"),
        );
    }
    source_headers(state, h, origin);
}

/// `response-content-type` and friends override the stored headers.
fn response_overrides(r: &Req, h: &mut HeaderMap) {
    for (param, name) in [
        ("response-content-type", header::CONTENT_TYPE),
        ("response-content-disposition", header::CONTENT_DISPOSITION),
        ("response-content-encoding", header::CONTENT_ENCODING),
        ("response-content-language", header::CONTENT_LANGUAGE),
        ("response-cache-control", header::CACHE_CONTROL),
        ("response-expires", header::EXPIRES),
    ] {
        if let Some(v) = r.q(param).and_then(|v| HeaderValue::from_str(v).ok()) {
            h.insert(name, v);
        }
    }
}

/// `Content-Length`, and for a range `206` with its `Content-Range`, of a body cut from
/// `size` bytes.
fn set_length(resp: &mut Response, resolved: Option<ByteRange>, size: u64) {
    match resolved {
        Some(br) => {
            *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
            let h = resp.headers_mut();
            h.insert(header::CONTENT_LENGTH, br.len().into());
            h.insert(
                header::CONTENT_RANGE,
                HeaderValue::from_str(&format!("bytes {}-{}/{}", br.start, br.end - 1, size))
                    .expect("digits are ASCII"),
            );
        }
        None => {
            resp.headers_mut()
                .insert(header::CONTENT_LENGTH, size.into());
        }
    }
}

/// The connection's descriptor channel, when the request asks for a descriptor and came
/// over the Unix socket, and how the client will read the file: `fd` maps it,
/// `fd-resident` copies out the range only where it finds it resident.
fn local_sender(r: &Req) -> Option<(FdSender, LocalReader)> {
    let reader = match r.header(LOCAL)? {
        v if v.eq_ignore_ascii_case("fd") => LocalReader::Maps,
        v if v.eq_ignore_ascii_case(LOCAL_RESIDENT) => LocalReader::CopiesResident,
        _ => return None,
    };
    let fds = r.parts.extensions.get::<ConnectInfo<FdSender>>()?;
    Some((fds.0.clone(), reader))
}

/// Turns `resp` (an answer's headers, its body empty) into a descriptor answer: the file
/// leaves with the answer's head; the headers say which of its bytes were asked.
fn local_answer(mut resp: Response, lf: LocalFile, fds: &FdSender) -> Response {
    let h = resp.headers_mut();
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(0u64));
    h.remove(header::CONTENT_RANGE);
    h.insert(LOCAL, HeaderValue::from_static("fd"));
    h.insert(LOCAL_OFFSET, HeaderValue::from(lf.offset));
    h.insert(LOCAL_LENGTH, HeaderValue::from(lf.len));
    if let Some(v) = lf
        .checks
        .as_ref()
        .and_then(|c| HeaderValue::from_str(&c.encode()).ok())
    {
        h.insert(LOCAL_CHECKS, v);
    }
    *resp.status_mut() = StatusCode::OK;
    *resp.body_mut() = Body::empty();
    fds.send(OwnedFd::from(lf.file));
    resp
}

/// `?transform=` with a member filter on a whole `.tar` shard: the shard as a tar
/// stream, its members in order, those the filter takes transformed (each result cached
/// like a member's), the others as they are.
async fn whole_shard(
    state: &AppState,
    (bucket, key): (&str, &str),
    t: &granary_core::Named,
    head: bool,
) -> Result<Response, S3Error> {
    if Format::of(key) != Some(Format::Tar) {
        return Err(S3Error::new(
            S3Code::InvalidArgument,
            format!(
                "transform `{}` applies to the members of .tar shards; name one member of a compressed shard with archpath",
                t.name
            ),
        ));
    }
    if head {
        return Err(S3Error::new(
            S3Code::InvalidRequest,
            "a transformed shard's size is known once it is built: use GET",
        ));
    }
    let (_, idx) = state.node.shard_index(bucket, key).await?;
    let members = members_in_order(&idx);
    let names: Vec<String> = members.iter().map(|(n, _)| (*n).clone()).collect();
    let items = members
        .iter()
        .map(|(n, m)| {
            let apply = t.takes_member(n).then_some(t.name.as_str());
            in_place(&idx, Item::member(bucket, key, n, apply), m)
        })
        .collect();
    let mut resp = crate::api::batch::stream(state.node.clone(), names, items, false, None).await?;
    if let Ok(v) = HeaderValue::from_str(&t.name) {
        resp.headers_mut().insert(TRANSFORM, v);
    }
    Ok(resp)
}

/// `?pipeline=NAME&seed=S&epoch=E`: a `.tar` shard as a tar stream of its members in
/// order, those the pipeline takes prepared for (seed, epoch) and the others as they
/// are; any other object, an image, as its prepared bytes. A member that cannot be
/// prepared fails the answer: `500` naming it before the first byte, a cut stream after.
///
/// On a shard, `Range: bytes=A-B` names bytes of the shard as stored (a run of samples
/// a reader found by `?archlist`): the answer is the tar stream of the members whose
/// data starts in them, prepared, with `200` (its length is known once it is prepared)
/// and `x-granary-source-range` saying the bytes. `If-Match` is checked against the
/// shard's ETag.
async fn prepared(state: &AppState, r: Req, name: &str, head: bool) -> Result<Response, S3Error> {
    let node = &state.node;
    let pipeline = node.pipeline(name)?;
    // The closure borrows the request, which must not live across the awaits below.
    let job = {
        let number = |n: &str| -> Result<u64, S3Error> {
            match r.q(n) {
                None => Ok(0),
                Some(v) => v.parse().map_err(|_| {
                    S3Error::new(
                        S3Code::InvalidArgument,
                        format!("{n}={v:?}: a whole number"),
                    )
                }),
            }
        };
        (number("seed")?, number("epoch")?)
    };
    if head {
        return Err(S3Error::new(
            S3Code::InvalidRequest,
            "a prepared sample's size is known once it is prepared: use GET",
        ));
    }
    if r.q("archpath").is_some() || r.q("transform").is_some() {
        return Err(S3Error::new(
            S3Code::InvalidArgument,
            "pipeline= prepares a whole shard, a run of its bytes, or an image: no archpath or transform with it",
        ));
    }
    let range = match r.header("range") {
        None => None,
        Some(v) => Some(RangeSpec::parse(v).ok_or_else(|| {
            S3Error::new(
                S3Code::InvalidArgument,
                format!("Range {v:?}: with pipeline=, one range of the shard's bytes"),
            )
        })?),
    };
    let if_match = r.header("if-match").map(str::to_owned);
    let (bucket, key) = (r.bucket.as_str(), r.key());
    match Format::of(key) {
        Some(Format::Tar) => {
            let (meta, idx) = node.shard_index(bucket, key).await?;
            if if_match.is_some_and(|v| !etag_matches(&v, &meta.etag)) {
                return Err(S3Error::new(
                    S3Code::PreconditionFailed,
                    "the shard is not the version If-Match names",
                ));
            }
            let bytes = match range {
                None => 0..u64::MAX,
                Some(spec) => spec.resolve(meta.size).map_err(|_| {
                    S3Error::new(
                        S3Code::InvalidRange,
                        format!("the range is outside the shard's {} bytes", meta.size),
                    )
                })?,
            };
            let members: Vec<_> = members_in_order(&idx)
                .into_iter()
                .filter(|(_, m)| bytes.contains(&m.offset))
                .collect();
            let names: Vec<String> = members.iter().map(|(n, _)| (*n).clone()).collect();
            let items = members
                .iter()
                .map(|(n, m)| in_place(&idx, Item::member(bucket, key, n, None), m))
                .collect();
            let prep = node.prep_of(pipeline.clone(), job, bucket, key, &meta);
            let mut resp =
                crate::api::batch::stream(node.clone(), names, items, false, Some(prep)).await?;
            let h = resp.headers_mut();
            if let Ok(v) = HeaderValue::from_str(&pipeline.name) {
                h.insert(PIPELINE, v);
            }
            if range.is_some() {
                let said = format!("bytes {}-{}/{}", bytes.start, bytes.end - 1, meta.size);
                if let Ok(v) = HeaderValue::from_str(&said) {
                    h.insert("x-granary-source-range", v);
                }
            }
            Ok(resp)
        }
        Some(_) => Err(S3Error::new(
            S3Code::InvalidArgument,
            "pipelines prepare the members of .tar shards and single images, not compressed shards",
        )),
        None => {
            let out = node
                .read_prepared(bucket, key, &pipeline, job, if_match.as_deref())
                .await?;
            let mut resp = Response::new(Body::from(out));
            let h = resp.headers_mut();
            h.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(pipeline.content_type()),
            );
            if let Ok(v) = HeaderValue::from_str(&pipeline.name) {
                h.insert(PIPELINE, v);
            }
            if let Ok(v) = HeaderValue::from_str(node.id()) {
                h.insert("x-granary-node", v);
            }
            Ok(resp)
        }
    }
}

/// The pipeline an answer was prepared by.
const PIPELINE: &str = "x-granary-pipeline";

/// `it`, a member of a shard this node indexed as `idx`, found by its place where the
/// shard holds its name twice (each copy is read, as a plain GET sends both).
fn in_place(idx: &TarIndex, it: Item, m: &ArchiveMember) -> Item {
    match &it.archpath {
        Some(name) if idx.repeats(name) => it.at(m.offset),
        _ => it,
    }
}

/// `GET /{bucket}/{key}?archlist`: the regular files of a `.tar` shard in archive order,
/// with their data offsets and sizes in the version the ETag names, so that a reader can
/// fetch runs of members with range reads (`If-Match` that ETag) instead of the whole
/// shard. The shard is read into the cache if need be; a shard the cache cannot hold
/// answers `503`, and a compressed one `400` (its members have no byte offsets).
pub async fn archive_list(state: &AppState, r: Req) -> Result<Response, S3Error> {
    let (bucket, key) = (&r.bucket, r.key());
    if Format::of(key) != Some(Format::Tar) {
        return Err(S3Error::new(
            S3Code::InvalidArgument,
            "archlist lists the members of .tar shards (a compressed shard has no member offsets)",
        )
        .with_resource(r.resource()));
    }
    let (meta, idx) = state.node.shard_index(bucket, key).await?;
    let members = members_in_order(&idx);
    let body = serde_json::json!({
        "etag": meta.etag,
        "size": meta.size,
        "members": members
            .iter()
            .map(|(n, m)| serde_json::json!([n, m.offset, m.size]))
            .collect::<Vec<_>>(),
    });
    let mut resp = (StatusCode::OK, body.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp.headers_mut()
        .insert(header::ETAG, super::quoted(&meta.etag));
    Ok(resp)
}
