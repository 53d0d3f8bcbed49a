//! The native API under `/_granary/`, in one table ([`handle`]): health, the cluster
//! view, prefetch and jobs, GetBatch (`batch`), the counters as JSON (`stats`) and for
//! Prometheus (`metrics`), and the members' calls. A member's JSON call is read and
//! answered by the node's own table of them (`Node::serve_call`, with each call's
//! definition in `granary_core::calls`); a refusal is an S3 error document, whose code
//! the caller keeps. Three routes are users' as well as members' (health, prefetch,
//! jobs), and a member's revalidation shares its route with a user's. The calls that
//! move object bytes (`calls::Copy`, `calls::Read`) are object reads marked as a
//! member's, served by the S3 read path (`s3::get`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, Method, StatusCode};
use serde_json::json;

use super::error::{S3Code, S3Error};
use super::{s3, AppState};
use granary_core::{calls, is_member_call, Exposition, Forwarded, JsonCall, ToOwner};

/// A prefetch part names its objects: room for a few hundred thousand keys.
const MAX_PART_BODY: usize = 64 << 20;
/// The most body a member's call carries here (a plan of 100,000 shards, or 1,000 keys
/// of 1 KiB and their buckets, with room to spare). Read only once the call is known
/// to be a member's.
const MAX_CALL_BODY: usize = 32 << 20;

pub async fn handle(state: &Arc<AppState>, req: Request) -> Response {
    let node = &state.node;
    let path = req.uri().path().trim_end_matches('/').to_owned();
    tracing::Span::current().record("op", path.as_str());
    let method = req.method().clone();
    let from_member = super::FromMember::of(&req).is_some();
    // A user's forced revalidation of a prefix shares the members' call's route.
    let users = path == calls::Revalidate::PATH && !from_member;
    if is_member_call(&method, &path) && !users {
        return member_call(state, req)
            .await
            .unwrap_or_else(IntoResponse::into_response);
    }
    let get = method == Method::GET || method == Method::HEAD;
    let answer = |r: Result<Response, S3Error>| r.unwrap_or_else(IntoResponse::into_response);
    match (path.as_str(), get) {
        // [`calls::Probe`]: the public health check, with the announcement's answer.
        ("/_granary/health", true) => health(state, req).await,
        (calls::Revalidate::PATH, _) if method == calls::Revalidate::METHOD => {
            answer(revalidate(state, req).await)
        }
        // [`calls::PrefetchPart`], and a user's prefetch of a prefix.
        (calls::PrefetchPart::PATH, _) if method == calls::PrefetchPart::METHOD => {
            answer(prefetch(state, req).await)
        }
        // [`calls::JobStatus`], [`calls::JobCancel`], and a user's look at a job.
        (p, _) if p.starts_with("/_granary/jobs/") => answer(job(state, req).await),
        ("/_granary/cluster", true) => {
            let q = granary_proto::encode::query_pairs(req.uri().query().unwrap_or(""));
            let arg = |n: &str| q.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
            let urls = inside(state, &req);
            match (arg("bucket"), arg("key")) {
                (Some(b), Some(k)) => json_response(node.cluster_view(Some((b, k)), urls)),
                (None, None) => json_response(node.cluster_view(None, urls)),
                _ => S3Error::new(
                    S3Code::InvalidArgument,
                    "give both bucket= and key= to ask for an owner",
                )
                .into_response(),
            }
        }
        ("/_granary/cluster/drain", false) if req.method() == Method::POST => {
            match drain(state, req).await {
                Ok(r) => r,
                Err(e) => e.into_response(),
            }
        }
        // The definitions follow the read rule: unsigned only where anonymous reads are
        // allowed, as the prepared reads they define.
        ("/_granary/pipelines", true) => {
            let parts = req.into_parts().0;
            match s3::auth::authenticate(state.creds.as_ref(), state.anonymous_read, &parts) {
                Ok(_) => json_response(node.pipelines_json()),
                Err(e) => e.into_response(),
            }
        }
        ("/_granary/catalog", true) => match catalog(state, req).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        ("/_granary/plans", _) => match plans(state, req).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        (p, _) if p.starts_with("/_granary/plans/") => match plan(state, req).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        ("/_granary/batch", _) => match super::batch::handle(state, req).await {
            Ok(r) => r,
            Err(e) => e.into_response(),
        },
        // Jobs name prefixes, keys and progress: signed whenever credentials are set,
        // `--anonymous-read` or not.
        ("/_granary/jobs", true) => {
            match s3::auth::authenticate(state.creds.as_ref(), false, &req.into_parts().0) {
                Ok(_) => json_response(serde_json::Value::Array(node.jobs_json())),
                Err(e) => e.into_response(),
            }
        }
        ("/_granary/stats", true) => {
            let mut stats = stats_json(state);
            if !inside(state, &req) {
                let kind = node.backend_name();
                stats["backend"] = json!(kind.split(':').next().unwrap_or(""));
            }
            json_response(stats)
        }
        ("/_granary/metrics", true) => {
            let accept = req
                .headers()
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok());
            let format = Exposition::accepting(accept);
            let text = node.stats_snapshot().exposition(node.id(), format);
            let mut resp = Response::new(Body::from(text));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static(format.content_type()),
            );
            resp
        }
        (
            "/_granary/health"
            | "/_granary/stats"
            | "/_granary/metrics"
            | "/_granary/cluster"
            | "/_granary/catalog"
            | "/_granary/pipelines",
            false,
        ) => S3Error::new(S3Code::MethodNotAllowed, "use GET").into_response(),
        ("/_granary/prefetch", _) => {
            S3Error::new(S3Code::MethodNotAllowed, "use POST").into_response()
        }
        (p, _) => S3Error::new(S3Code::NotFound, format!("no native route {p}"))
            .with_resource(p.to_owned())
            .into_response(),
    }
}

/// A call only a member may make: its JSON request read and answered by the node's
/// table, with the call's status.
async fn member_call(state: &AppState, req: Request) -> Result<Response, S3Error> {
    let (parts, body) = req.into_parts();
    s3::auth::peer_only(&state.node, &parts)?;
    let body = axum::body::to_bytes(body, MAX_CALL_BODY)
        .await
        .map_err(|_| S3Error::new(S3Code::EntityTooLarge, "the call's body is too large"))?;
    let path = parts.uri.path().trim_end_matches('/');
    let (status, json) = match state.node.serve_call(&parts.method, path, &body).await {
        Some(answer) => answer?,
        None => return Err(S3Error::new(S3Code::NotFound, format!("no call {path}"))),
    };
    let mut resp = (status, json).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

/// `GET /_granary/health`: `200` once the node's view is settled (`503` until then,
/// with the same fields). A member's probe from its regular round announces it: it is
/// seen up first, and told whether it is in this node's list.
pub async fn health(state: &AppState, req: Request) -> Response {
    let node = &state.node;
    let mut known = None;
    if req.headers().contains_key(calls::ANNOUNCE) {
        if let Some(id) = super::FromMember::of(&req) {
            known = Some(node.announced(id).await);
        }
    }
    let health = node.health();
    let settled = health.settled();
    let mut resp = json_response(serde_json::to_value(&health).unwrap_or_default());
    if !settled {
        // Not every member probed yet: not ready to agree on owners.
        *resp.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
        resp.extensions_mut().insert(super::NotAnError);
    }
    if let Some(known) = known {
        let (name, value) = calls::Probe::reply_header(known);
        resp.headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    resp
}

/// A request's JSON body (its signature's payload checked as it is read), or
/// `InvalidArgument` saying it must be `what`.
async fn json_body<T: serde::de::DeserializeOwned>(
    parts: http::request::Parts,
    body: Body,
    verdict: s3::auth::Verdict,
    what: &str,
) -> Result<T, S3Error> {
    let mut r = s3::Req {
        parts,
        body,
        bucket: String::new(),
        key: None,
        query: Vec::new(),
        verdict,
    };
    let raw = r.read_body_up_to(MAX_PART_BODY).await?;
    serde_json::from_slice(&raw).map_err(|e| {
        S3Error::new(
            S3Code::InvalidArgument,
            format!("the body must be {what}: {e}"),
        )
    })
}

/// `POST /_granary/prefetch`: `{"bucket","prefix"}` starts a cluster-wide prefetch,
/// answered `202 {"id"}`; from a prefetch's coordinator, one member's part of it.
pub async fn prefetch(state: &Arc<AppState>, req: Request) -> Result<Response, S3Error> {
    let (parts, body) = req.into_parts();
    let verdict = s3::auth::authenticate(state.creds.as_ref(), state.anonymous_read, &parts)?;
    let asked: calls::PrefetchPart =
        json_body(parts, body, verdict, "{\"bucket\":…,\"prefix\":…}").await?;
    let resource = format!("/{}/{}", asked.bucket, asked.prefix);
    let job = state
        .node
        .start_prefetch(asked)
        .await
        .map_err(|e| S3Error::from(e).with_resource(resource))?;
    let mut resp =
        json_response(json!({"id": job.id, "kind": job.kind, "state": job.state().as_str()}));
    *resp.status_mut() = StatusCode::ACCEPTED;
    Ok(resp)
}

/// `POST /_granary/cluster/drain`: `{"node": ID}` drains that member (signed whenever
/// credentials are set): answered `202 {"node", "state"}`; its progress shows in
/// `/_granary/cluster`. `{"node": ID, "undo": true}` ends a drain: the member serves
/// its keys again (`state: "serving"`).
pub async fn drain(state: &Arc<AppState>, req: Request) -> Result<Response, S3Error> {
    #[derive(serde::Deserialize)]
    struct Asked {
        node: String,
        #[serde(default)]
        undo: bool,
    }
    let (parts, body) = req.into_parts();
    let verdict = s3::auth::authenticate(state.creds.as_ref(), false, &parts)?;
    let asked: Asked = json_body(parts, body, verdict, "{\"node\": ID}").await?;
    let drained = state.node.drain_member(&asked.node, asked.undo).await?;
    let mut resp = json_response(json!({"node": drained.node, "state": drained.state}));
    *resp.status_mut() = StatusCode::ACCEPTED;
    Ok(resp)
}

/// `POST /_granary/plans`: a job registers its plan (the body, a
/// [`granary_proto::plan::PlanSpec`]), answered `201` with its id and how it shows;
/// `GET /_granary/plans`: the plans the cluster holds, `{"plans": [...]}`.
pub async fn plans(state: &Arc<AppState>, req: Request) -> Result<Response, S3Error> {
    let (parts, body) = req.into_parts();
    let verdict = s3::auth::authenticate(state.creds.as_ref(), state.anonymous_read, &parts)?;
    match parts.method {
        Method::GET | Method::HEAD => {
            return Ok(json_response(json!({ "plans": state.node.plans() })));
        }
        Method::POST => {}
        _ => return Err(S3Error::new(S3Code::MethodNotAllowed, "use GET or POST")),
    }
    let spec: granary_proto::plan::PlanSpec = json_body(
        parts,
        body,
        verdict,
        "a plan (bucket, prefix, shards, seed, epoch, world_size, ...)",
    )
    .await?;
    let view = state.node.register_plan(spec)?;
    let mut resp = json_response(serde_json::to_value(&view).unwrap_or_default());
    *resp.status_mut() = StatusCode::CREATED;
    Ok(resp)
}

/// `GET /_granary/plans/{id}`: one plan; `DELETE`: drop it cluster-wide (`204`).
pub async fn plan(state: &Arc<AppState>, req: Request) -> Result<Response, S3Error> {
    let (parts, _) = req.into_parts();
    s3::auth::authenticate(state.creds.as_ref(), state.anonymous_read, &parts)?;
    let path = parts.uri.path().trim_end_matches('/');
    let id = &path["/_granary/plans/".len()..];
    match parts.method {
        Method::GET | Method::HEAD => match state.node.plan(id) {
            Some(v) => Ok(json_response(serde_json::to_value(&v).unwrap_or_default())),
            None => Err(S3Error::new(S3Code::NotFound, format!("no plan {id}"))
                .with_resource(path.to_owned())),
        },
        Method::DELETE => {
            state.node.drop_plan(id).await;
            let mut resp = Response::new(Body::empty());
            *resp.status_mut() = StatusCode::NO_CONTENT;
            Ok(resp)
        }
        _ => Err(S3Error::new(S3Code::MethodNotAllowed, "use GET or DELETE")),
    }
}

/// A query's `bucket=` (required: `InvalidArgument` naming what it is `for`) and
/// `prefix=` (default empty).
fn bucket_prefix<'q>(q: &'q [(String, String)], what: &str) -> Result<(&'q str, &'q str), S3Error> {
    let arg = |n: &str| q.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    let Some(bucket) = arg("bucket").filter(|b| !b.is_empty()) else {
        return Err(S3Error::new(
            S3Code::InvalidArgument,
            format!("name a bucket= {what}"),
        ));
    };
    Ok((bucket, arg("prefix").unwrap_or("")))
}

/// `POST /_granary/revalidate?bucket=&prefix=`: every cached copy under the prefix, on
/// every member, is checked against the backend before its next hit (signed whenever
/// credentials are set). `200` when every member took it; `202` when one did not (it
/// checks all its copies before it is routed to again).
pub async fn revalidate(state: &Arc<AppState>, req: Request) -> Result<Response, S3Error> {
    let (parts, _) = req.into_parts();
    s3::auth::authenticate(state.creds.as_ref(), false, &parts)?;
    let q = granary_proto::encode::query_pairs(parts.uri.query().unwrap_or(""));
    let (bucket, prefix) = bucket_prefix(&q, "to revalidate (and a prefix= within it)")?;
    let (marked, all) = state.node.revalidate_everywhere(bucket, prefix).await;
    let mut resp = json_response(json!({
        "bucket": bucket,
        "prefix": prefix,
        "marked": marked,
        "every_member": all,
    }));
    if !all {
        *resp.status_mut() = StatusCode::ACCEPTED;
    }
    Ok(resp)
}

/// `GET|DELETE /_granary/jobs/{id}`: a job's progress, or its cancellation. A job this
/// node does not know is looked for on the other members (it was taken by another),
/// unless a member asks.
pub async fn job(state: &Arc<AppState>, req: Request) -> Result<Response, S3Error> {
    let (parts, _) = req.into_parts();
    s3::auth::authenticate(state.creds.as_ref(), false, &parts)?;
    let path = parts.uri.path().trim_end_matches('/');
    let id = &path["/_granary/jobs/".len()..];
    let cancel = match parts.method {
        Method::GET | Method::HEAD => false,
        Method::DELETE => true,
        _ => return Err(S3Error::new(S3Code::MethodNotAllowed, "use GET or DELETE")),
    };
    let from_member = super::FromMember::of_parts(&parts).is_some();
    match state.node.job(id, cancel, !from_member).await {
        Some(job) => Ok(json_response(job)),
        None => {
            Err(S3Error::new(S3Code::NotFound, format!("no job {id}"))
                .with_resource(path.to_owned()))
        }
    }
}

/// `GET /_granary/catalog?bucket=&prefix=[&index=ignore]`: the dataset's catalog, built
/// once per version by one member (the owner of the dataset's catalog, as if it were a
/// key of its own) and kept. Read-only: allowed where listings are.
async fn catalog(state: &Arc<AppState>, req: Request) -> Result<Response, S3Error> {
    let (parts, _) = req.into_parts();
    s3::auth::authenticate(state.creds.as_ref(), state.anonymous_read, &parts)?;
    let q = granary_proto::encode::query_pairs(parts.uri.query().unwrap_or(""));
    let arg = |n: &str| q.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
    let (bucket, prefix) = bucket_prefix(&q, "for the catalog")?;
    let use_index = match arg("index") {
        None | Some("use") => true,
        Some("ignore") => false,
        Some(other) => {
            return Err(S3Error::new(
                S3Code::InvalidArgument,
                format!("index= takes `use` or `ignore`, not `{other}`"),
            ))
        }
    };
    let node = &state.node;
    if super::FromMember::of_parts(&parts).is_none() {
        let to = ToOwner {
            bucket,
            key: &format!("{prefix}\0catalog"),
            method: &parts.method,
            uri: &parts.uri,
            headers: &parts.headers,
            may_redirect: false,
        };
        if let Forwarded::Answered(resp) = node.forward_to_owner(&to, &mut None, |b| b).await {
            return Ok(resp.map(Body::new));
        }
    }
    let catalog = node
        .catalog(bucket, prefix, use_index)
        .await
        .map_err(|e| S3Error::from(e).with_resource(format!("/{bucket}/{prefix}")))?;
    let mut resp = Response::new(Body::from(
        serde_json::to_vec(&*catalog).unwrap_or_default(),
    ));
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}

fn json_response(v: serde_json::Value) -> Response {
    let mut resp = (StatusCode::OK, v.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

/// Whether a request may see where things are (the backend's path or endpoint, the
/// members' URLs): on an open node anyone; with credentials, a signed request or a
/// member's. Health checks and Prometheus scrapes need neither.
fn inside(state: &AppState, req: &Request) -> bool {
    let Some(creds) = state.creds.as_ref() else {
        return true;
    };
    let (parts, _) = Request::new(()).into_parts();
    let mut parts = parts;
    parts.method = req.method().clone();
    parts.uri = req.uri().clone();
    parts.headers = req.headers().clone();
    granary_proto::auth::authenticate(Some(creds), false, &parts).is_ok_and(|v| v.signed)
}

/// `/_granary/stats`: every row of the counter table, and what the node is.
fn stats_json(state: &AppState) -> serde_json::Value {
    let node = &state.node;
    let mut j = node.stats_snapshot().json();
    j.insert("node_id".into(), json!(node.id()));
    j.insert("policy".into(), json!(node.cache_policy().as_str()));
    j.insert("backend".into(), json!(node.backend_name()));
    j.insert("admitting".into(), json!(node.admitting()));
    serde_json::Value::Object(j)
}
