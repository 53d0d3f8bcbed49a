//! ListObjectsV2 and ListObjects (v1): prefix, delimiter, max-keys, continuation-token /
//! start-after (v2), marker (v1), and `encoding-type=url`, which the AWS CLI always asks
//! for.

use axum::response::Response;
use base64::Engine;

use super::xml::Doc;
use super::{xml_response, Req};
use crate::api::error::{S3Code, S3Error};
use crate::api::AppState;
use granary_core::{ListPage, ListQuery};

const MAX_KEYS: usize = 1000;

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
}

/// What a listing request asks: its query, and how to write the answer.
struct Listing {
    v2: bool,
    query: ListQuery,
    /// Keys and prefixes written URL-encoded (`encoding-type=url`).
    url: bool,
    /// The continuation token given (v2).
    token: Option<String>,
    start_after: Option<String>,
    marker: Option<String>,
    /// Each object's owner is named (v1 always, v2 with `fetch-owner=true`).
    owner: bool,
}

/// ListObjectsV2 (`v2`) and ListObjects: the request read, one page from the node,
/// the page written.
pub async fn list_objects(state: &AppState, r: Req, v2: bool) -> Result<Response, S3Error> {
    let listing = parse(&r, v2)?;
    let mut page = state.node.list_objects(&r.bucket, &listing.query).await?;
    // A page of no keys, asked for, is all of the answer (as S3 says of `max-keys=0`).
    page.is_truncated &= listing.query.max_keys > 0;
    Ok(xml_response(render(&r.bucket, &listing, &page)))
}

fn parse(r: &Req, v2: bool) -> Result<Listing, S3Error> {
    let prefix = r.q("prefix").unwrap_or("").to_owned();
    let delimiter = r
        .q("delimiter")
        .filter(|d| !d.is_empty())
        .map(str::to_owned);
    let max_keys = match r.q("max-keys") {
        None => MAX_KEYS,
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .map(|n| (n as usize).min(MAX_KEYS))
            .ok_or_else(|| {
                S3Error::new(
                    S3Code::InvalidArgument,
                    "max-keys must be a non-negative integer",
                )
            })?,
    };
    let url = match r.q("encoding-type") {
        None => false,
        Some(e) if e.eq_ignore_ascii_case("url") => true,
        Some(_) => {
            return Err(S3Error::new(
                S3Code::InvalidArgument,
                "Invalid Encoding Method specified in Request",
            ))
        }
    };
    let token = r.q("continuation-token").filter(|_| v2);
    let after = match token {
        Some(t) => Some(
            b64()
                .decode(t)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| {
                    S3Error::new(
                        S3Code::InvalidArgument,
                        "The continuation token provided is incorrect",
                    )
                })?,
        ),
        None if v2 => r.q("start-after").map(str::to_owned),
        None => r.q("marker").map(str::to_owned),
    }
    .filter(|a| !a.is_empty());
    Ok(Listing {
        v2,
        query: ListQuery {
            prefix,
            delimiter,
            after,
            max_keys,
        },
        url,
        token: token.map(str::to_owned),
        start_after: r.q("start-after").map(str::to_owned),
        marker: r.q("marker").map(str::to_owned),
        owner: !v2 || r.q("fetch-owner") == Some("true"),
    })
}

fn render(bucket: &str, l: &Listing, page: &ListPage) -> String {
    let q = &l.query;
    let enc = |s: &str| -> String {
        if l.url {
            // `encoding-type=url`: all but unreserved characters and `/`.
            granary_proto::encode::path(s)
        } else {
            s.to_owned()
        }
    };
    let mut doc = Doc::new("ListBucketResult");
    // v1 sends its prefix back as given (boto3 decodes it in v2 only).
    let echoed = if l.v2 {
        enc(&q.prefix)
    } else {
        q.prefix.clone()
    };
    doc.elem("Name", bucket).elem("Prefix", &echoed);
    if let Some(d) = &q.delimiter {
        doc.elem("Delimiter", &enc(d));
    }
    doc.elem("MaxKeys", &q.max_keys.to_string());
    if l.url {
        doc.elem("EncodingType", "url");
    }
    doc.elem(
        "IsTruncated",
        if page.is_truncated { "true" } else { "false" },
    );
    if l.v2 {
        let count = page.objects.len() + page.common_prefixes.len();
        doc.elem("KeyCount", &count.to_string());
        if let Some(t) = &l.token {
            doc.elem("ContinuationToken", t);
        }
        if let Some(sa) = &l.start_after {
            doc.elem("StartAfter", &enc(sa));
        }
        if page.is_truncated {
            if let Some(last) = &page.last {
                doc.elem("NextContinuationToken", &b64().encode(last));
            }
        }
    } else {
        doc.elem("Marker", &enc(l.marker.as_deref().unwrap_or("")));
        if page.is_truncated {
            if let Some(last) = &page.last {
                doc.elem("NextMarker", &enc(last));
            }
        }
    }
    for o in &page.objects {
        doc.open("Contents")
            .elem("Key", &enc(&o.key))
            .time("LastModified", o.last_modified)
            .elem("ETag", &format!("\"{}\"", o.etag))
            .elem("Size", &o.size.to_string());
        if l.owner {
            doc.open("Owner")
                .elem("ID", super::OWNER)
                .elem("DisplayName", super::OWNER)
                .close("Owner");
        }
        doc.elem("StorageClass", "STANDARD").close("Contents");
    }
    for p in &page.common_prefixes {
        doc.open("CommonPrefixes")
            .elem("Prefix", &enc(p))
            .close("CommonPrefixes");
    }
    doc.finish("ListBucketResult")
}
