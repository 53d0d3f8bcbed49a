//! The members' calls this node answers, in one table ([`serve`]). Each entry reads the
//! call with its definition in `granary_core::calls`, asks the node, and writes
//! the reply the same definition reads on the caller's side; a refusal is an S3 error
//! document, whose code the caller keeps. Three routes are users' as well as members'
//! (health, prefetch, jobs): their entries name the native handler that serves both.
//! The calls that move object bytes ([`calls::Copy`], [`calls::Read`]) are object reads
//! marked as a member's, served by the S3 read path (`s3::get`).

use std::future::Future;
use std::sync::Arc;

use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use http::{header, HeaderValue, Method};
use serde::Serialize;

use super::error::{S3Code, S3Error};
use super::{native, s3, AppState};
use granary_core::{calls, JsonCall, Node, NodeError};

/// The most body a member's call carries here (a plan of 100,000 shards, or 1,000 keys
/// of 1 KiB and their buckets, with room to spare). Read only once the call is known
/// to be a member's.
const MAX_CALL_BODY: usize = 32 << 20;

/// Answers a member's call; the request back when it is none of them.
pub async fn serve(state: &Arc<AppState>, req: Request) -> Result<Response, Request> {
    let path = req.uri().path().trim_end_matches('/');
    let answer = match (req.method().clone(), path) {
        // [`calls::Probe`]: the public health check, with the announcement's answer.
        (Method::GET | Method::HEAD, "/_granary/health") => Ok(native::health(state, req).await),
        (calls::Revalidate::METHOD, calls::Revalidate::PATH)
            if super::FromMember::of(&req).is_some() =>
        {
            json_call(state, req, |node, call: calls::Revalidate| async move {
                let marked = match &call.bucket {
                    Some(bucket) => node.revalidate_prefix(bucket, &call.prefix),
                    None => {
                        node.revalidate();
                        0
                    }
                };
                Ok(calls::Revalidated {
                    revalidate: true,
                    marked,
                })
            })
            .await
        }
        // A user's forced revalidation of a prefix, cluster-wide.
        (calls::Revalidate::METHOD, calls::Revalidate::PATH) => {
            native::revalidate(state, req).await
        }
        (calls::Invalidate::METHOD, calls::Invalidate::PATH) => {
            json_call(state, req, |node, call: calls::Invalidate| async move {
                Ok(node.take_invalidation(&call))
            })
            .await
        }
        (calls::StartDrain::METHOD, calls::StartDrain::PATH) => {
            json_call(state, req, |node, call: calls::StartDrain| async move {
                node.drain_here(call.undo)
            })
            .await
        }
        (calls::Take::METHOD, calls::Take::PATH) => {
            json_call(state, req, |node, call: calls::Take| async move {
                node.take(&call).await
            })
            .await
        }
        (calls::IndexShards::METHOD, calls::IndexShards::PATH) => {
            json_call(state, req, |node, call: calls::IndexShards| async move {
                let shards = node.index_shards(&call.bucket, &call.shards).await?;
                Ok(calls::Indexed { shards })
            })
            .await
        }
        (calls::SharePlan::METHOD, calls::SharePlan::PATH) => {
            json_call(state, req, |node, call: calls::SharePlan| async move {
                node.take_plan(call.spec)?;
                Ok(calls::Noted {})
            })
            .await
        }
        (calls::DropPlan::METHOD, calls::DropPlan::PATH) => {
            json_call(state, req, |node, call: calls::DropPlan| async move {
                node.forget_plan(&call.id);
                Ok(calls::Noted {})
            })
            .await
        }
        (calls::PlanReport::METHOD, calls::PlanReport::PATH) => {
            json_call(state, req, |node, call: calls::PlanReport| async move {
                Ok(node.plan_report(call))
            })
            .await
        }
        // [`calls::PrefetchPart`], and a user's prefetch of a prefix.
        (calls::PrefetchPart::METHOD, calls::PrefetchPart::PATH) => {
            native::prefetch(state, req).await
        }
        // [`calls::JobStatus`], [`calls::JobCancel`], and a user's look at a job.
        (_, p) if p.starts_with("/_granary/jobs/") => native::job(state, req).await,
        _ => return Err(req),
    };
    Ok(answer.unwrap_or_else(IntoResponse::into_response))
}

/// A call only a member may make: its JSON request read, the node's reply written with
/// the call's status.
async fn json_call<C, R, F, Fut>(
    state: &AppState,
    req: Request,
    answer: F,
) -> Result<Response, S3Error>
where
    C: JsonCall,
    R: Serialize,
    F: FnOnce(Arc<Node>, C) -> Fut,
    Fut: Future<Output = Result<R, NodeError>>,
{
    let (parts, body) = req.into_parts();
    s3::auth::peer_only(&state.node, &parts)?;
    let body = axum::body::to_bytes(body, MAX_CALL_BODY)
        .await
        .map_err(|_| S3Error::new(S3Code::EntityTooLarge, "the call's body is too large"))?;
    // A call with nothing to say sends no body.
    let text: &[u8] = if body.is_empty() { b"{}" } else { &body };
    let call: C = serde_json::from_slice(text)
        .map_err(|e| S3Error::new(S3Code::InvalidArgument, format!("bad {}: {e}", C::WHAT)))?;
    let reply = answer(state.node.clone(), call).await?;
    let mut resp = (C::OK, serde_json::to_string(&reply).unwrap_or_default()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Ok(resp)
}
