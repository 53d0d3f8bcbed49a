//! How requests reach members: a small seam ([`Transport`]) with one implementation in a
//! running node, HTTP over hyper's client ([`Http`]: plain to `http://` members, TLS to
//! `https://` ones, trusting the node's own certificate), and one in tests, in memory.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// An error a transport gives back: the request got no answer.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body sent to a member: a call's bytes, or a client's body streamed on.
pub type PeerBody = UnsyncBoxBody<Bytes, BoxError>;

/// An answer's body as a transport hands it over.
pub type ReplyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A request on its way to a member: its answer's head, or why none came.
pub type Sending = Pin<Box<dyn Future<Output = Result<Response<ReplyBody>, BoxError>> + Send>>;

/// Sends a request to the member its URI names.
pub trait Transport: Send + Sync + 'static {
    fn send(&self, req: Request<PeerBody>) -> Sending;
}

/// Members over HTTP.
pub struct Http(Client<HttpsConnector<HttpConnector>, PeerBody>);

impl Transport for Http {
    fn send(&self, req: Request<PeerBody>) -> Sending {
        let sent = self.0.request(req);
        Box::pin(async move {
            let resp = sent.await?;
            Ok(resp.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync()))
        })
    }
}

impl Http {
    /// The client members speak to each other with: `http://` peers in plain HTTP, `https://`
    /// peers over TLS, trusting the certificates of `trust` (the node's own `--tls-cert`: the
    /// members of a cluster share a certificate or its issuer) and nothing else.
    pub fn new(trust: Option<&std::path::Path>) -> Result<Http, String> {
        use rustls::pki_types::pem::PemObject;
        let mut roots = rustls::RootCertStore::empty();
        if let Some(path) = trust {
            let certs = rustls::pki_types::CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            for cert in certs {
                let cert = cert.map_err(|e| format!("bad PEM in {}: {e}", path.display()))?;
                roots.add(cert).map_err(|e| {
                    format!("a certificate of {} cannot be trusted: {e}", path.display())
                })?;
            }
        }
        let provider = std::sync::Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS protocol versions: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut conn = HttpConnector::new();
        conn.set_connect_timeout(Some(Duration::from_secs(1)));
        conn.set_nodelay(true);
        conn.enforce_http(false);
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(conn);
        Ok(Http(
            Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .build(https),
        ))
    }
}
