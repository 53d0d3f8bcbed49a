//! An in-memory network for unit tests: each member is a handler at its URL, called
//! with the request as the transport would send it (body gathered) and answering a
//! response; a URL with no handler refuses, as a dead process does. Every request is
//! kept, for tests to see what was sent.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};

use super::transport::PeerBody;
use super::transport::{ReplyBody, Sending, Transport};

/// A member: its answer to a request.
pub type Handler =
    Arc<dyn Fn(Request<Bytes>) -> BoxFuture<'static, Response<ReplyBody>> + Send + Sync>;

#[derive(Clone, Default)]
pub struct Net {
    members: Arc<Mutex<HashMap<String, Handler>>>,
    /// Every request sent: the URL it went to, its method and its path with query.
    sent: Arc<Mutex<Vec<(String, String, String)>>>,
}

/// A body of these bytes.
pub fn body(bytes: impl Into<Bytes>) -> ReplyBody {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A response with this status, body and headers.
pub fn answer(
    status: StatusCode,
    headers: &[(&str, &str)],
    bytes: impl Into<Bytes>,
) -> Response<ReplyBody> {
    let mut resp = Response::new(body(bytes));
    *resp.status_mut() = status;
    for (k, v) in headers {
        resp.headers_mut().insert(
            http::HeaderName::from_bytes(k.as_bytes()).expect("a header name"),
            v.parse().expect("a header value"),
        );
    }
    resp
}

impl Net {
    /// Puts member `url` on the network.
    pub fn serve(&self, url: &str, h: Handler) {
        self.members.lock().unwrap().insert(url.to_owned(), h);
    }

    /// Takes member `url` off: its requests are refused.
    pub fn cut(&self, url: &str) {
        self.members.lock().unwrap().remove(url);
    }

    /// The requests sent to `url`: method and path with query, in order.
    pub fn sent_to(&self, url: &str) -> Vec<(String, String)> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|(u, _, _)| u == url)
            .map(|(_, m, t)| (m.clone(), t.clone()))
            .collect()
    }

    /// Forgets the requests sent so far.
    pub fn clear(&self) {
        self.sent.lock().unwrap().clear();
    }

    /// The network as a transport.
    pub fn transport(&self) -> Box<dyn Transport> {
        Box::new(self.clone())
    }
}

impl Transport for Net {
    fn send(&self, req: Request<PeerBody>) -> Sending {
        let uri = req.uri();
        let url = format!(
            "{}://{}",
            uri.scheme_str().unwrap_or("http"),
            uri.authority().map_or("", |a| a.as_str())
        );
        let target = uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str())
            .to_owned();
        self.sent
            .lock()
            .unwrap()
            .push((url.clone(), req.method().to_string(), target));
        let handler = self.members.lock().unwrap().get(&url).cloned();
        Box::pin(async move {
            let Some(h) = handler else {
                return Err(format!("{url}: connection refused").into());
            };
            let (parts, body) = req.into_parts();
            let bytes = body.collect().await?.to_bytes();
            Ok(h(Request::from_parts(parts, bytes)).await)
        })
    }
}
