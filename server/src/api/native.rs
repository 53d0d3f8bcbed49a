//! The native API under `/_granary/`: health, the cluster view, prefetch and jobs,
//! GetBatch (`batch`), the counters as JSON (`stats`) and for Prometheus (`metrics`).
//! Members' own calls are answered through `peer`'s table, which hands the routes users
//! share with members (health, prefetch, jobs) to the handlers here.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, Method, StatusCode};
use serde_json::json;

use super::error::{S3Code, S3Error};
use super::{s3, AppState};
use granary_core::{calls, Announced, Exposition};

/// A prefetch part names its objects: room for a few hundred thousand keys.
const MAX_PART_BODY: usize = 64 << 20;

pub async fn handle(state: &Arc<AppState>, req: Request) -> Response {
    let node = &state.node;
    let path = req.uri().path().trim_end_matches('/').to_owned();
    tracing::Span::current().record("op", path.as_str());
    let req = match super::peer::serve(state, req).await {
        Ok(resp) => return resp,
        Err(req) => req,
    };
    let get = req.method() == Method::GET || req.method() == Method::HEAD;
    match (path.as_str(), get) {
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
        ("/_granary/pipelines", true) => json_response(node.pipelines_json()),
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
        resp.headers_mut().insert(
            calls::ANNOUNCE,
            HeaderValue::from_static(match known {
                Announced::Known => calls::KNOWN,
                Announced::Down => calls::KNOWN_DOWN,
                Announced::Unknown => "unknown",
            }),
        );
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
        if let Some(m) = node.owner_elsewhere(bucket, &format!("{prefix}\0catalog")) {
            let target = granary_core::target_of(&parts.uri);
            let body = super::route::peer_body(Body::empty());
            match node
                .forward(&m, &parts.method, &target, &parts.headers, body)
                .await
            {
                Ok(resp) => return Ok(resp.map(Body::new)),
                Err(why) => node.mark_down(&m, why),
            }
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
