//! The node's side of its members' JSON calls, in one table ([`Node::serve_call`]): the
//! call read from its body with its definition in `cluster::calls`, answered by the
//! node, and the reply written as the same definition reads it on the caller's side.
//! The API serves it (after checking that a member sent it) and so does the in-memory
//! network of the node's tests. Routes that users share with members (health,
//! prefetch, jobs) are the API's.

use std::future::Future;
use std::sync::Arc;

use http::{Method, StatusCode};

use super::{Node, NodeError};
use crate::cluster::calls::{self, JsonCall};

/// A call the node answers: what it does with one.
trait Answer: JsonCall + 'static {
    fn answer(
        node: Arc<Node>,
        call: Self,
    ) -> impl Future<Output = Result<Self::Reply, NodeError>> + Send;
}

impl Answer for calls::Revalidate {
    async fn answer(node: Arc<Node>, call: Self) -> Result<calls::Revalidated, NodeError> {
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
    }
}

impl Answer for calls::Invalidate {
    async fn answer(node: Arc<Node>, call: Self) -> Result<calls::Invalidated, NodeError> {
        Ok(node.take_invalidation(&call))
    }
}

impl Answer for calls::StartDrain {
    async fn answer(node: Arc<Node>, call: Self) -> Result<calls::Draining, NodeError> {
        node.drain_here(call.undo)
    }
}

impl Answer for calls::Take {
    async fn answer(node: Arc<Node>, call: Self) -> Result<calls::Taken, NodeError> {
        node.take(&call).await
    }
}

impl Answer for calls::IndexShards {
    async fn answer(node: Arc<Node>, call: Self) -> Result<calls::Indexed, NodeError> {
        let shards = node.index_shards(&call.bucket, &call.shards).await?;
        Ok(calls::Indexed { shards })
    }
}

impl Answer for calls::SharePlan {
    async fn answer(node: Arc<Node>, call: Self) -> Result<calls::Noted, NodeError> {
        node.take_plan(call.spec)?;
        Ok(calls::Noted {})
    }
}

impl Answer for calls::DropPlan {
    async fn answer(node: Arc<Node>, call: Self) -> Result<calls::Noted, NodeError> {
        node.forget_plan(&call.id);
        Ok(calls::Noted {})
    }
}

impl Answer for calls::PlanReport {
    async fn answer(
        node: Arc<Node>,
        call: Self,
    ) -> Result<Option<crate::plans::Standing>, NodeError> {
        Ok(node.plan_report(call))
    }
}

/// `body` read as call `C` and answered: the reply's status and JSON.
async fn serve<C: Answer>(node: Arc<Node>, body: &[u8]) -> Result<(StatusCode, String), NodeError> {
    // A call with nothing to say sends no body.
    let text: &[u8] = if body.is_empty() { b"{}" } else { body };
    let call: C = serde_json::from_slice(text)
        .map_err(|e| NodeError::Invalid(format!("bad {}: {e}", C::WHAT)))?;
    let reply = C::answer(node, call).await?;
    Ok((C::OK, serde_json::to_string(&reply).unwrap_or_default()))
}

/// The table: each call's route, and the node's answer to it.
macro_rules! table {
    ($($call:ty),* $(,)?) => {
        /// Whether `method` and `path` are a member's JSON call's route.
        pub fn is_member_call(method: &Method, path: &str) -> bool {
            false $(|| (*method == <$call>::METHOD && path == <$call>::PATH))*
        }

        impl Node {
            /// A member's JSON call at `method` and `path`, its body `body`: the reply's
            /// status and JSON, or the node's refusal (`None`: no such call).
            pub async fn serve_call(
                self: &Arc<Self>,
                method: &Method,
                path: &str,
                body: &[u8],
            ) -> Option<Result<(StatusCode, String), NodeError>> {
                $(
                    if *method == <$call>::METHOD && path == <$call>::PATH {
                        return Some(serve::<$call>(self.clone(), body).await);
                    }
                )*
                None
            }
        }
    };
}

table!(
    calls::Revalidate,
    calls::Invalidate,
    calls::StartDrain,
    calls::Take,
    calls::IndexShards,
    calls::SharePlan,
    calls::DropPlan,
    calls::PlanReport,
);
