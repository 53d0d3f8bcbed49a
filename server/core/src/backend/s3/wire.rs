//! The S3 backend's reads over plain HTTP. The SDK signs, times, retries and parses every
//! request as usual; a GET or HEAD to an `http://` store goes over a connection of ours,
//! which receives a large body straight into page-aligned blocks kept on huge pages
//! ([`Inbox`]). A fill writes those bytes to its file from there (`io::direct`), where
//! hyper's buffers had to be copied into an aligned one first. Everything else (a body to
//! send, TLS, a store the environment's proxies would intercept) goes to the SDK's own
//! client, built as the SDK builds its default (which it does not export).

use std::fmt;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::connector_metadata::ConnectorMetadata;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, HttpResponse};
use aws_smithy_runtime_api::client::result::ConnectorError;
use aws_smithy_runtime_api::client::runtime_components::{
    RuntimeComponents, RuntimeComponentsBuilder,
};
use aws_smithy_types::body::SdkBody;
use aws_smithy_types::config_bag::ConfigBag;
use bytes::{Bytes, BytesMut};
use futures::{Stream, StreamExt};
use granary_proto::http1::{body_length, chunk_size, BodyLength};
use http_body::{Frame, SizeHint};
use hyper_util::client::proxy::matcher::Matcher;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::io::direct::Inbox;
use crate::sync::Locked;

/// Bodies at least this large are received into [`Inbox`] blocks; smaller ones (errors,
/// small objects) into a buffer of their size.
const INBOX_FROM: u64 = 64 << 10;
/// The most a response's head may take.
const HEAD_MAX: usize = 64 << 10;
/// Each read of a response head, and of a body that is not received into blocks.
const READ: usize = 16 << 10;
/// Connections kept open between requests.
const IDLE_MAX: usize = 64;

/// The S3 client's HTTP client: ours for plain reads, the SDK's default for the rest.
pub(super) fn client() -> SharedHttpClient {
    let sdk =
        aws_smithy_http_client::Builder::new().build_with_connector_fn(|settings, components| {
            let mut conn = aws_smithy_http_client::ConnectorBuilder::default()
                .tls_provider(tls::Provider::Rustls(CryptoMode::AwsLc));
            conn.set_connector_settings(settings.cloned());
            if let Some(components) = components {
                conn.set_sleep_impl(components.sleep_impl());
            }
            conn.set_proxy_config(Some(aws_smithy_http_client::proxy::ProxyConfig::from_env()));
            conn.build()
        });
    SharedHttpClient::new(Reads {
        sdk,
        idle: Arc::default(),
        // The environment's proxies, read as the SDK's client reads them.
        proxies: Arc::new(Matcher::from_env()),
    })
}

#[derive(Debug)]
struct Reads {
    sdk: SharedHttpClient,
    idle: Arc<Idle>,
    proxies: Arc<Matcher>,
}

impl HttpClient for Reads {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(ReadConnector {
            sdk: self.sdk.http_connector(settings, components),
            idle: self.idle.clone(),
            proxies: self.proxies.clone(),
            connect_timeout: settings.connect_timeout(),
            first_byte_timeout: settings.read_timeout(),
        })
    }

    fn validate_base_client_config(
        &self,
        runtime_components: &RuntimeComponentsBuilder,
        cfg: &ConfigBag,
    ) -> Result<(), BoxError> {
        self.sdk
            .validate_base_client_config(runtime_components, cfg)
    }

    fn connector_metadata(&self) -> Option<ConnectorMetadata> {
        self.sdk.connector_metadata()
    }
}

#[derive(Debug, Clone)]
struct ReadConnector {
    sdk: SharedHttpConnector,
    idle: Arc<Idle>,
    proxies: Arc<Matcher>,
    connect_timeout: Option<Duration>,
    first_byte_timeout: Option<Duration>,
}

impl HttpConnector for ReadConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let uri = matches!(request.method(), "GET" | "HEAD")
            && request.body().bytes().is_some_and(|b| b.is_empty())
            && request.uri().starts_with("http://");
        // A request through a proxy goes the SDK's way too.
        let uri = uri
            .then(|| request.uri().parse::<http::Uri>().ok())
            .flatten()
            .filter(|uri| self.proxies.intercept(uri).is_none());
        let Some(uri) = uri else {
            return self.sdk.call(request);
        };
        let this = self.clone();
        HttpConnectorFuture::new(async move { this.send(request, uri).await })
    }
}

/// Why an exchange failed, and whether any of the answer had come.
struct Failed {
    error: ConnectorError,
    answered: bool,
}

impl ReadConnector {
    async fn send(
        self,
        request: HttpRequest,
        uri: http::Uri,
    ) -> Result<HttpResponse, ConnectorError> {
        let authority = uri
            .authority()
            .ok_or_else(|| ConnectorError::user("a request URI without a host".into()))?
            .as_str()
            .to_owned();
        let addr = match uri.port_u16() {
            Some(_) => authority.clone(),
            None => format!("{}:80", uri.host().unwrap_or_default()),
        };
        let head = request_head(&request, &uri, &authority);
        let head_only = request.method() == "HEAD";
        // A kept connection the store has closed meanwhile fails before any answer: the
        // request goes once more, on a new one.
        let mut kept = self.idle.take(&addr);
        loop {
            let reused = kept.is_some();
            let stream = match kept.take() {
                Some(s) => s,
                None => self.connect(&addr).await?,
            };
            match self.exchange(stream, &head).await {
                Ok((stream, answer, rest)) => {
                    return answer_with_body(answer, rest, stream, head_only, addr, self.idle);
                }
                Err(f) if reused && !f.answered => continue,
                Err(f) => return Err(f.error),
            }
        }
    }

    async fn connect(&self, addr: &str) -> Result<TcpStream, ConnectorError> {
        let connecting = TcpStream::connect(addr);
        let stream = match self.connect_timeout {
            Some(t) => tokio::time::timeout(t, connecting).await.map_err(|_| {
                ConnectorError::timeout(format!("connecting to {addr} took over {t:?}").into())
            })?,
            None => connecting.await,
        }
        .map_err(|e| ConnectorError::io(Box::new(e)))?;
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }

    /// Sends the request's head and reads the answer's, within the first-byte timeout.
    async fn exchange(
        &self,
        mut stream: TcpStream,
        head: &[u8],
    ) -> Result<(TcpStream, Answer, Bytes), Failed> {
        let io_failed = |e: io::Error, answered| Failed {
            error: ConnectorError::io(Box::new(e)),
            answered,
        };
        stream
            .write_all(head)
            .await
            .map_err(|e| io_failed(e, false))?;
        let reading = read_answer(&mut stream);
        let (answer, rest) = match self.first_byte_timeout {
            Some(t) => tokio::time::timeout(t, reading).await.map_err(|_| Failed {
                error: ConnectorError::timeout(
                    format!("no answer from the store within {t:?}").into(),
                ),
                answered: true,
            })?,
            None => reading.await,
        }
        .map_err(|(e, answered)| io_failed(e, answered))?;
        Ok((stream, answer, rest))
    }
}

/// `METHOD path HTTP/1.1`, the SDK's headers (signed), and `Host` where it set none.
fn request_head(request: &HttpRequest, uri: &http::Uri, authority: &str) -> Vec<u8> {
    let target = uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
    let mut head = format!("{} {target} HTTP/1.1\r\n", request.method()).into_bytes();
    if request.headers().get("host").is_none() {
        head.extend_from_slice(format!("host: {authority}\r\n").as_bytes());
    }
    for (name, value) in request.headers().iter() {
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(b": ");
        head.extend_from_slice(value.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    head
}

/// An answer's head.
struct Answer {
    status: u16,
    headers: Vec<(String, Vec<u8>)>,
    keep_alive: bool,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }
}

/// Reads an answer's head (skipping interim `1xx` ones); returns it and the bytes read
/// past it. A failure says whether any byte had come.
async fn read_answer(stream: &mut TcpStream) -> Result<(Answer, Bytes), (io::Error, bool)> {
    let mut buf = BytesMut::with_capacity(READ);
    loop {
        let mut headers = [httparse::EMPTY_HEADER; 128];
        let mut parsed = httparse::Response::new(&mut headers);
        match parsed.parse(&buf) {
            Ok(httparse::Status::Complete(n)) => {
                let status = parsed.code.unwrap_or(0);
                let close = parsed.headers.iter().any(|h| {
                    h.name.eq_ignore_ascii_case("connection")
                        && h.value.eq_ignore_ascii_case(b"close")
                });
                let answer = Answer {
                    status,
                    headers: parsed
                        .headers
                        .iter()
                        .map(|h| (h.name.to_owned(), h.value.to_vec()))
                        .collect(),
                    keep_alive: parsed.version == Some(1) && !close,
                };
                let _ = buf.split_to(n);
                if (100..200).contains(&status) && status != 101 {
                    continue;
                }
                return Ok((answer, buf.freeze()));
            }
            Ok(httparse::Status::Partial) if buf.len() < HEAD_MAX => {}
            Ok(httparse::Status::Partial) => {
                return Err((bad(format!("an answer's head over {HEAD_MAX} bytes")), true));
            }
            Err(e) => return Err((bad(format!("a malformed answer: {e}")), true)),
        }
        buf.reserve(READ);
        let answered = !buf.is_empty();
        match stream.read_buf(&mut buf).await {
            Ok(0) => {
                let e = io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the store closed the connection before answering",
                );
                return Err((e, answered));
            }
            Ok(_) => {}
            Err(e) => return Err((e, answered)),
        }
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The SDK's response: the head, and a body read from `stream` (given back to `idle`
/// once read to its end, where the store keeps it open).
fn answer_with_body(
    answer: Answer,
    rest: Bytes,
    stream: TcpStream,
    head_only: bool,
    addr: String,
    idle: Arc<Idle>,
) -> Result<HttpResponse, ConnectorError> {
    let text = |name| {
        answer
            .header(name)
            .and_then(|v| std::str::from_utf8(v).ok())
    };
    let framing = body_length(
        answer.status,
        head_only,
        text("transfer-encoding"),
        text("content-length"),
    )
    .map_err(|e| ConnectorError::io(Box::new(bad(format!("a malformed answer: {e}")))))?;
    let keep = answer.keep_alive && framing != BodyLength::UntilClose;
    let mut http = http::Response::builder().status(answer.status);
    for (name, value) in &answer.headers {
        http = http.header(name.as_str(), value.as_slice());
    }
    let body = match framing {
        BodyLength::Length(0) => {
            if keep && rest.is_empty() {
                idle.put(addr, stream);
            }
            SdkBody::empty()
        }
        framing => {
            let size = match framing {
                BodyLength::Length(n) => Some(n),
                _ => None,
            };
            let reader = Reader {
                stream,
                rest,
                addr,
                idle,
                keep,
            };
            let chunks: Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>> = match framing {
                BodyLength::Length(n) => Box::pin(reader.length(n)),
                BodyLength::Chunked => Box::pin(reader.chunked()),
                BodyLength::UntilClose => Box::pin(reader.until_close()),
            };
            SdkBody::from_body_1_x(Body {
                chunks: Mutex::new(chunks),
                size,
            })
        }
    };
    let http = http
        .body(body)
        .map_err(|e| ConnectorError::other(Box::new(e), None))?;
    HttpResponse::try_from(http).map_err(|e| ConnectorError::other(Box::new(e), None))
}

/// A body's source: the connection and what was read past the head.
struct Reader {
    stream: TcpStream,
    rest: Bytes,
    addr: String,
    idle: Arc<Idle>,
    keep: bool,
}

impl Reader {
    /// `n` bytes: a large body into [`Inbox`] blocks, from its first byte on.
    fn length(mut self, n: u64) -> impl Stream<Item = io::Result<Bytes>> + Send {
        async_stream::try_stream! {
            let mut left = n;
            if n < INBOX_FROM {
                let mut buf = BytesMut::with_capacity(n as usize);
                let k = self.rest.len().min(n as usize);
                buf.extend_from_slice(&self.rest[..k]);
                self.rest = self.rest.slice(k..);
                while buf.len() < n as usize {
                    if self.stream.read_buf(&mut buf).await? == 0 {
                        Err(short(buf.len() as u64, n))?;
                    }
                }
                yield buf.freeze();
            } else {
                let mut inbox = Inbox::new();
                if !self.rest.is_empty() {
                    let k = self.rest.len().min(n as usize);
                    inbox.spare()[..k].copy_from_slice(&self.rest[..k]);
                    self.rest = self.rest.slice(k..);
                    left -= k as u64;
                    yield inbox.take(k);
                }
                while left > 0 {
                    let spare = inbox.spare();
                    let want = spare.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let got = self.stream.read(&mut spare[..want]).await?;
                    if got == 0 {
                        Err(short(n - left, n))?;
                    }
                    left -= got as u64;
                    yield inbox.take(got);
                }
            }
            self.done();
        }
    }

    /// A chunked body, each chunk's data as it comes.
    fn chunked(mut self) -> impl Stream<Item = io::Result<Bytes>> + Send {
        async_stream::try_stream! {
            let mut buf = BytesMut::from(&self.rest[..]);
            self.rest = Bytes::new();
            loop {
                let line = self.line(&mut buf).await?;
                let size = std::str::from_utf8(&line)
                    .ok()
                    .and_then(chunk_size)
                    .ok_or_else(|| bad("a malformed chunk size".into()))?;
                if size == 0 {
                    // Trailers, up to the empty line.
                    while !self.line(&mut buf).await?.is_empty() {}
                    break;
                }
                let mut left = size;
                while left > 0 {
                    if buf.is_empty() && self.stream.read_buf(&mut buf).await? == 0 {
                        Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the store closed the connection in a chunk"))?;
                    }
                    let k = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    left -= k as u64;
                    yield buf.split_to(k).freeze();
                }
                if !self.line(&mut buf).await?.is_empty() {
                    Err(bad("a chunk longer than its size".into()))?;
                }
            }
            self.rest = buf.freeze();
            self.done();
        }
    }

    /// Everything up to the end of the connection.
    fn until_close(mut self) -> impl Stream<Item = io::Result<Bytes>> + Send {
        async_stream::try_stream! {
            if !self.rest.is_empty() {
                yield std::mem::take(&mut self.rest);
            }
            loop {
                let mut buf = BytesMut::with_capacity(READ);
                if self.stream.read_buf(&mut buf).await? == 0 {
                    break;
                }
                yield buf.freeze();
            }
        }
    }

    /// The next line of a chunked body, without its CRLF.
    async fn line(&mut self, buf: &mut BytesMut) -> io::Result<Vec<u8>> {
        loop {
            if let Some(i) = buf.windows(2).position(|w| w == b"\r\n") {
                let line = buf.split_to(i + 2);
                return Ok(line[..i].to_vec());
            }
            if buf.len() > HEAD_MAX {
                return Err(bad("a chunk line too long".into()));
            }
            buf.reserve(READ);
            if self.stream.read_buf(buf).await? == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the store closed the connection in a chunked body",
                ));
            }
        }
    }

    /// The body was read to its end: the connection may carry the next request.
    fn done(self) {
        if self.keep && self.rest.is_empty() {
            self.idle.put(self.addr, self.stream);
        }
    }
}

fn short(got: u64, want: u64) -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        format!("the store closed the connection after {got} of {want} bytes"),
    )
}

/// A response body for the SDK, which asks it to be `Sync`: the `Mutex` is never locked,
/// only reached through `&mut`.
struct Body {
    chunks: Mutex<Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>>,
    size: Option<u64>,
}

impl http_body::Body for Body {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let chunks = self
            .get_mut()
            .chunks
            .get_mut()
            .unwrap_or_else(|p| p.into_inner());
        chunks
            .poll_next_unpin(cx)
            .map(|item| item.map(|r| r.map(Frame::data)))
    }

    fn size_hint(&self) -> SizeHint {
        match self.size {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// Connections the store left open, by address.
#[derive(Default)]
struct Idle(Mutex<Vec<(String, TcpStream)>>);

impl fmt::Debug for Idle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Idle")
    }
}

impl Idle {
    fn take(&self, addr: &str) -> Option<TcpStream> {
        let mut idle = self.0.locked();
        let i = idle.iter().rposition(|(a, _)| a == addr)?;
        Some(idle.swap_remove(i).1)
    }

    fn put(&self, addr: String, stream: TcpStream) {
        let mut idle = self.0.locked();
        if idle.len() < IDLE_MAX {
            idle.push((addr, stream));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::net::TcpListener;

    /// The SDK's client, never reached by these requests.
    #[derive(Debug)]
    struct Unused;

    impl HttpConnector for Unused {
        fn call(&self, _: HttpRequest) -> HttpConnectorFuture {
            panic!("a plain read went to the SDK's client")
        }
    }

    fn big() -> Vec<u8> {
        (0..200_000u32).map(|i| (i * 7 + i / 251) as u8).collect()
    }

    /// Answers each request on a connection by its path: a large body by length, a
    /// chunked one (an extension and a trailer), and a HEAD's. Counts connections.
    async fn store() -> (String, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    loop {
                        let mut b = [0u8; 4096];
                        let n = s.read(&mut b).await.unwrap_or(0);
                        if n == 0 {
                            return;
                        }
                        buf.extend_from_slice(&b[..n]);
                        while let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                            buf.drain(..end + 4);
                            let answer: Vec<u8> = if head.starts_with("GET /big ") {
                                let mut a =
                                    b"HTTP/1.1 200 OK\r\ncontent-length: 200000\r\n\r\n".to_vec();
                                a.extend_from_slice(&big());
                                a
                            } else if head.starts_with("GET /chunked ") {
                                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\
                                  5;x=y\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nx-t: 1\r\n\r\n"
                                    .to_vec()
                            } else {
                                b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n".to_vec()
                            };
                            s.write_all(&answer).await.unwrap();
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    async fn read(conn: &ReadConnector, method: &str, url: &str) -> (u16, Vec<Bytes>) {
        let mut request = HttpRequest::get(url).unwrap();
        if method == "HEAD" {
            request.set_method("HEAD").unwrap();
        }
        let uri = url.parse().unwrap();
        let answer = conn.clone().send(request, uri).await.unwrap();
        let status = answer.status().as_u16();
        let mut body = answer.into_body();
        let mut chunks = Vec::new();
        while let Some(frame) = body.frame().await {
            if let Ok(data) = frame.unwrap().into_data() {
                chunks.push(data);
            }
        }
        (status, chunks)
    }

    /// Bodies framed by length, by chunks and by a HEAD come whole, one after the other
    /// on one kept connection; a large one lies in page-aligned memory from its first
    /// byte, each chunk following the last.
    #[tokio::test]
    async fn bodies_come_whole_on_one_kept_connection_the_large_one_aligned() {
        let (addr, accepted) = store().await;
        let conn = ReadConnector {
            sdk: SharedHttpConnector::new(Unused),
            idle: Arc::default(),
            proxies: Arc::new(Matcher::builder().build()),
            connect_timeout: Some(Duration::from_secs(5)),
            first_byte_timeout: Some(Duration::from_secs(5)),
        };
        for _ in 0..2 {
            let (status, chunks) = read(&conn, "GET", &format!("http://{addr}/big")).await;
            assert_eq!(status, 200);
            assert!(chunks.concat() == big(), "the large body, byte for byte");
            assert!((chunks[0].as_ptr() as usize).is_multiple_of(crate::io::direct::ALIGN));
            for w in chunks.windows(2) {
                let (a, b) = (&w[0], &w[1]);
                // Or the next block's start, aligned (from the heap once the kept ones are out).
                let next_block = (b.as_ptr() as usize).is_multiple_of(crate::io::direct::ALIGN);
                assert!(a.as_ptr() as usize + a.len() == b.as_ptr() as usize || next_block);
            }
            let (status, chunks) = read(&conn, "GET", &format!("http://{addr}/chunked")).await;
            assert_eq!((status, chunks.concat()), (200, b"hello world".to_vec()));
            let (status, chunks) = read(&conn, "HEAD", &format!("http://{addr}/h")).await;
            assert_eq!((status, chunks.concat()), (200, Vec::new()));
        }
        assert_eq!(
            accepted.load(Ordering::SeqCst),
            1,
            "one connection for all six"
        );
    }
}
