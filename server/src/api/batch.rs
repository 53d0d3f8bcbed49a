//! GetBatch (`POST /_granary/batch`): many objects and shard members in one tar stream,
//! in the order asked. Items are fetched in parallel, each from its owner (this node's
//! cache, or the owning member over HTTP), a bounded number ahead of the one being sent;
//! small items are read whole while they wait, large ones stream when their turn comes.
//! The stream is assembled as it is sent: nothing holds the whole answer.
//!
//! Member names are `KEY` for an object and `KEY/ARCHPATH` for a shard member. A missing
//! item fails the request (`404` before the first byte, a cut stream after it), or with
//! `?missing=mark` becomes an empty member `__404__/NAME`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::{BufMut, Bytes, BytesMut};
use futures::{FutureExt, StreamExt};
use http::{header, HeaderValue, Method};

use super::error::{S3Code, S3Error};
use super::s3::{auth, Req};
use super::AppState;
use granary_core::Node;
use granary_core::{Data, Item, Outcome, Prep};

/// Items fetched ahead of the one being sent.
pub const PARALLEL: usize = 16;
/// Gathered small members are sent once they reach this many bytes.
const SEND_AT: usize = 256 << 10;
/// The most items one batch may name.
pub const MAX_ITEMS: usize = 100_000;

/// A spawned fetch, aborted when the answer is dropped (the client left).
struct Fetch(tokio::task::JoinHandle<Result<Outcome, S3Error>>);

impl Drop for Fetch {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Future for Fetch {
    type Output = Result<Outcome, S3Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| match r {
            Ok(out) => out,
            Err(e) => Err(S3Error::internal(format!(
                "a batch item's fetch failed: {e}"
            ))),
        })
    }
}

pub async fn handle(state: &Arc<AppState>, req: Request) -> Result<Response, S3Error> {
    let (parts, body) = req.into_parts();
    if parts.method != Method::POST {
        return Err(S3Error::new(S3Code::MethodNotAllowed, "use POST"));
    }
    let query = granary_proto::encode::query_pairs(parts.uri.query().unwrap_or(""));
    let mark = match query
        .iter()
        .find(|(k, _)| k == "missing")
        .map(|(_, v)| v.as_str())
    {
        None | Some("error") => false,
        Some("mark") => true,
        Some(other) => {
            return Err(S3Error::new(
                S3Code::InvalidArgument,
                format!("missing= takes `error` or `mark`, not `{other}`"),
            ))
        }
    };
    // A batch only reads: allowed unsigned where plain reads are.
    let verdict = if state.anonymous_read
        && !granary_proto::auth::client_signed(&parts)
        && !parts
            .headers
            .contains_key(granary_proto::headers::PEER_AUTH)
    {
        auth::Verdict {
            signed: false,
            payload: auth::Payload::Unsigned,
            peer: None,
        }
    } else {
        auth::authenticate(state.creds.as_ref(), state.anonymous_read, &parts)?
    };
    let mut r = Req {
        parts,
        body,
        bucket: String::new(),
        key: None,
        query,
        verdict,
    };
    let raw = r.read_small_body().await?;
    let mut items: Vec<Item> = serde_json::from_slice(&raw).map_err(|e| {
        S3Error::new(
            S3Code::InvalidArgument,
            format!("the body must be a JSON array of {{\"bucket\",\"key\",\"archpath\"?}}: {e}"),
        )
    })?;
    if items.len() > MAX_ITEMS {
        return Err(S3Error::new(
            S3Code::InvalidArgument,
            format!("a batch names at most {MAX_ITEMS} items"),
        ));
    }
    // `?transform=NAME` on the batch applies to every item that names none.
    let all = r.q("transform").map(str::to_owned);
    for it in &mut items {
        if it.transform.is_none() {
            it.transform.clone_from(&all);
        }
        if let Some(t) = &it.transform {
            state.node.transform(t)?;
        }
    }
    for it in &items {
        if it.bucket.is_empty() || it.key.is_empty() || it.archpath.as_deref() == Some("") {
            return Err(S3Error::new(
                S3Code::InvalidArgument,
                "every batch item needs a bucket and a key (and a non-empty archpath if any)",
            ));
        }
    }
    let names: Vec<String> = items.iter().map(Item::name).collect();
    stream(state.node.clone(), names, items, mark, None).await
}

/// The answer to a list of items: a tar stream of them in order, member `names[i]` for
/// `items[i]`. Also serves a whole-shard transform (`?transform=` on a `.tar`), which
/// reads its members through the same object path that leads here: the future is boxed
/// (a named `Send` type) so that the cycle has an end the compiler can see.
pub(crate) fn stream(
    node: Arc<Node>,
    names: Vec<String>,
    items: Vec<Item>,
    mark: bool,
    prep: Option<Prep>,
) -> futures::future::BoxFuture<'static, Result<Response, S3Error>> {
    async move { stream_items(node, names, items, mark, prep).await }.boxed()
}

async fn stream_items(
    node: Arc<Node>,
    names: Vec<String>,
    items: Vec<Item>,
    mark: bool,
    prep: Option<Prep>,
) -> Result<Response, S3Error> {
    let n = node.clone();
    let mut fetches = futures::stream::iter(items)
        .map(move |it| {
            let (n, prep) = (n.clone(), prep.clone());
            Fetch(tokio::spawn(async move {
                match &prep {
                    Some(p) => n.fetch_prepared(&it, p).await,
                    None => n.fetch_item(&it).await,
                }
                .map_err(S3Error::from)
            }))
        })
        .buffered(PARALLEL);
    // The first item is settled before the answer starts, so that a batch whose first
    // item is missing is a plain `404`.
    let first = match fetches.next().await {
        None => None,
        Some(got) => Some(settle(got, mark, &names[0])?),
    };
    let node = node.id().to_owned();
    let body = async_stream::stream! {
        // Small members are gathered into one buffer and sent when it is large or when
        // the next item is not ready yet: a write per member would cost a segment each.
        let mut out = BytesMut::new();
        let mut next = first;
        let mut i = 0;
        while let Some(outcome) = next.take() {
            let name = &names[i];
            match outcome {
                Outcome::Missing => out.put(tar_header(&format!("__404__/{name}"), 0, 0)),
                Outcome::Found { size, mtime, data } => {
                    out.put(tar_header(name, size, mtime));
                    match data {
                        Data::Whole(b) => out.put(b),
                        Data::Stream(mut s) => {
                            yield Ok(out.split().freeze());
                            let mut sent = 0u64;
                            while let Some(chunk) = s.next().await {
                                match chunk {
                                    Ok(c) => {
                                        sent += c.len() as u64;
                                        yield Ok(c);
                                    }
                                    Err(e) => {
                                        tracing::warn!(item = %name, error = %e, "batch item cut short");
                                        yield Err(e);
                                        return;
                                    }
                                }
                            }
                            if sent != size {
                                tracing::warn!(item = %name, sent, size, "batch item cut short");
                                yield Err(std::io::Error::other(format!(
                                    "batch item {name}: {sent} of {size} bytes"
                                )));
                                return;
                            }
                        }
                    }
                    out.put(&ZEROS[..padding(size)]);
                }
            }
            i += 1;
            if out.len() >= SEND_AT {
                yield Ok(out.split().freeze());
            }
            let got = match fetches.next().now_or_never() {
                Some(got) => got,
                None => {
                    if !out.is_empty() {
                        yield Ok(out.split().freeze());
                    }
                    fetches.next().await
                }
            };
            next = match got {
                None => None,
                Some(got) => match settle(got, mark, &names[i]) {
                    Ok(o) => Some(o),
                    Err(e) => {
                        tracing::warn!(item = %names[i], error = %e.message, "batch cut: an item failed");
                        yield Err(std::io::Error::other(e.message));
                        return;
                    }
                },
            };
        }
        // The end of the archive: two zero blocks.
        out.put(&ZEROS[..]);
        yield Ok(out.freeze());
    };
    let mut resp = Response::new(Body::from_stream(body));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-tar"),
    );
    if let Ok(v) = HeaderValue::from_str(&node) {
        h.insert("x-granary-node", v);
    }
    Ok(resp)
}

/// An item's outcome as the answer takes it: a missing item is an error unless marked.
fn settle(got: Result<Outcome, S3Error>, mark: bool, name: &str) -> Result<Outcome, S3Error> {
    match got? {
        Outcome::Missing if !mark => Err(S3Error::new(
            S3Code::NoSuchKey,
            format!("batch item `{name}` does not exist"),
        )
        .with_resource(name.to_owned())),
        o => Ok(o),
    }
}

static ZEROS: [u8; 1024] = [0; 1024];

/// Zero bytes after `size` bytes of data, to the next 512-byte block.
fn padding(size: u64) -> usize {
    ((512 - size % 512) % 512) as usize
}

/// The header block(s) of a regular member: a GNU long-name entry first when the name
/// does not fit the header's 100 bytes.
fn tar_header(name: &str, size: u64, mtime: u64) -> Bytes {
    let name = name.as_bytes();
    let mut out = BytesMut::with_capacity(512);
    if name.len() > 100 {
        let mut h = tar::Header::new_gnu();
        put_name(&mut h, b"././@LongLink");
        h.set_entry_type(tar::EntryType::GNULongName);
        h.set_size(name.len() as u64 + 1);
        h.set_mode(0o644);
        h.set_mtime(0);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(name);
        out.put_u8(0);
        out.extend_from_slice(&ZEROS[..padding(name.len() as u64 + 1)]);
    }
    let mut h = tar::Header::new_gnu();
    put_name(&mut h, &name[..name.len().min(100)]);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_size(size);
    h.set_mode(0o644);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h.set_cksum();
    out.extend_from_slice(h.as_bytes());
    out.freeze()
}

/// Writes a name's bytes into the header as they are (keys may hold `..` or a leading
/// `/`, which the tar crate's path setter refuses; readers extracting to disk apply
/// their own checks).
fn put_name(h: &mut tar::Header, name: &[u8]) {
    let old = h.as_old_mut();
    old.name = [0; 100];
    old.name[..name.len()].copy_from_slice(name);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(parts: &[(String, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        for (name, data) in parts {
            out.extend_from_slice(&tar_header(name, data.len() as u64, 1_700_000_000));
            out.extend_from_slice(data);
            out.extend_from_slice(&ZEROS[..padding(data.len() as u64)]);
        }
        out.extend_from_slice(&ZEROS);
        out
    }

    #[test]
    fn the_tar_crate_reads_what_we_write() {
        let long = format!("{}/sample.jpg", "d".repeat(150));
        let parts = vec![
            ("a/b.cls".to_owned(), b"7".to_vec()),
            (long.clone(), vec![9u8; 1000]),
            ("__404__/gone".to_owned(), Vec::new()),
            ("x/../y".to_owned(), vec![1u8; 512]),
        ];
        let bytes = archive(&parts);
        let mut ar = tar::Archive::new(&bytes[..]);
        let mut got = Vec::new();
        for e in ar.entries().unwrap() {
            let mut e = e.unwrap();
            let name = String::from_utf8(e.path_bytes().into_owned()).unwrap();
            assert_eq!(e.header().mtime().unwrap(), 1_700_000_000);
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).unwrap();
            got.push((name, data));
        }
        assert_eq!(got, parts);
    }
}
