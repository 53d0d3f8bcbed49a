//! [`Client`]: one node's address, a keep-alive connection to it, optional credentials;
//! building, signing and sending requests, following redirects, and turning error answers
//! into [`Error`]s. The operations themselves live in `objects.rs` and `native.rs`.

use std::time::{Duration, SystemTime};

use granary_proto::{encode, Header};

use crate::http::{Body, BodyReader, Conn, Head};
use crate::sign::{self, Credentials, Signable, UNSIGNED_PAYLOAD};
use crate::{Error, Result};

/// How many redirects (`307`/`308` from a node in `--route redirect` mode) are followed.
const MAX_REDIRECTS: usize = 4;
/// Largest error body read to explain a failure.
const MAX_ERROR_BODY: usize = 64 << 10;

/// A response read whole: status, headers (names in lower case) and body.
#[derive(Debug, Clone)]
pub struct Response {
    /// The HTTP status code.
    pub status: u16,
    /// Header names in lower case, values as sent, in order.
    pub headers: Vec<Header>,
    /// The whole body.
    pub body: Vec<u8>,
}

impl Response {
    /// The first header of this (lower-case) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        Header::find(&self.headers, name)
    }
}

/// The most connections one read uses.
pub(crate) const MAX_STREAMS: usize = 8;

/// How many connections a large hit is read over by default: two per core, four to
/// eight (`GRANARY_CLIENT_STREAMS` sets it; 1 reads every object on one connection).
pub(crate) fn default_streams() -> usize {
    if let Some(n) = std::env::var("GRANARY_CLIENT_STREAMS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        return n.clamp(1, MAX_STREAMS);
    }
    std::thread::available_parallelism().map_or(4, |n| (n.get() * 2).clamp(4, MAX_STREAMS))
}

/// A client of one Granary node: a keep-alive HTTP/1.1 connection, reopened when needed.
///
/// Calls take `&mut self` and run one at a time; use one client per thread (they are cheap:
/// one socket each).
pub struct Client {
    endpoint: String,
    conn: Conn,
    creds: Option<Credentials>,
    /// The node's Unix socket on this machine, for local reads (`with_local_socket`).
    pub(crate) local: Option<Box<Client>>,
    /// How many connections a large object is read over (`with_streams`).
    streams: usize,
    /// Clients of the same node whose connections read a large object's other parts
    /// (kept alive between reads).
    pub(crate) helpers: Vec<Client>,
}

/// One request to build: method, encoded path, raw query pairs, headers, body.
pub(crate) struct Req<'a> {
    pub method: &'static str,
    /// Already encoded (`granary_proto::encode::path`).
    pub path: String,
    /// Not yet encoded.
    pub query: Vec<(String, String)>,
    pub headers: Vec<Header>,
    pub body: Body<'a>,
}

impl<'a> Req<'a> {
    pub(crate) fn new(method: &'static str, path: String) -> Req<'a> {
        Req {
            method,
            path,
            query: Vec::new(),
            headers: Vec::new(),
            body: Body::Empty,
        }
    }

    pub(crate) fn query(mut self, name: &str, value: &str) -> Self {
        self.query.push((name.to_owned(), value.to_owned()));
        self
    }

    pub(crate) fn header(mut self, name: &str, value: &str) -> Self {
        self.headers
            .push(Header::new(name.to_ascii_lowercase(), value));
        self
    }

    pub(crate) fn body(mut self, body: Body<'a>) -> Self {
        self.body = body;
        self
    }

    /// The query, encoded.
    fn encoded_query(&self) -> String {
        encode::query_string(self.query.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    /// The request target: path and encoded query.
    pub(crate) fn target(&self) -> String {
        let q = self.encoded_query();
        if q.is_empty() {
            return self.path.clone();
        }
        format!("{}?{q}", self.path)
    }
}

/// `/{bucket}` with the bucket name encoded.
pub(crate) fn bucket_path(bucket: &str) -> Result<String> {
    if bucket.is_empty() || bucket.contains('/') {
        return Err(Error::Invalid(format!("bucket name `{bucket}`")));
    }
    Ok(format!("/{}", encode::query_value(bucket)))
}

/// `/{bucket}/{key}` with both encoded; the key keeps its slashes.
pub(crate) fn object_path(bucket: &str, key: &str) -> Result<String> {
    if key.is_empty() {
        return Err(Error::Invalid(format!("empty key in bucket `{bucket}`")));
    }
    Ok(format!("{}/{}", bucket_path(bucket)?, encode::path(key)))
}

/// The address to connect to: `host:port` of `http://host:port[/]`, or `unix:PATH` of
/// `unix:PATH` / `unix://PATH` (a node's `--listen-unix` socket).
fn addr_of(endpoint: &str) -> Option<String> {
    if let Some(path) = endpoint.strip_prefix("unix:") {
        let path = path.strip_prefix("//").unwrap_or(path);
        return (!path.is_empty()).then(|| format!("unix:{path}"));
    }
    endpoint
        .strip_prefix("http://")
        .map(|s| s.trim_end_matches('/'))
        .filter(|s| !s.is_empty() && !s.contains('/'))
        .map(str::to_owned)
}

/// The `Host` header for `addr` (a Unix socket has no host name).
fn host_header(addr: &str) -> &str {
    if addr.starts_with("unix:") {
        "localhost"
    } else {
        addr
    }
}

impl Client {
    /// A client of the node at `endpoint`: `http://host:port`, or `unix:PATH` for a node's
    /// Unix socket on this machine (`--listen-unix`); connects on first use.
    pub fn new(endpoint: &str) -> Result<Client> {
        let addr = addr_of(endpoint).ok_or_else(|| Error::Endpoint(endpoint.to_owned()))?;
        let endpoint = if addr.starts_with("unix:") {
            addr.clone()
        } else {
            format!("http://{addr}")
        };
        Ok(Client {
            endpoint,
            conn: Conn::new(addr, Duration::from_secs(60)),
            creds: None,
            local: None,
            streams: default_streams(),
            helpers: Vec::new(),
        })
    }

    /// Reads an object larger than 32 MiB that the node holds over up to `streams`
    /// connections at once, each taking the next 32 MiB by range (default: two per core,
    /// four to eight; env `GRANARY_CLIENT_STREAMS`); 1 reads every object on one
    /// connection.
    pub fn with_streams(mut self, streams: usize) -> Client {
        self.streams = streams.clamp(1, MAX_STREAMS);
        self.helpers.clear();
        self
    }

    /// How many connections a large object is read over.
    pub fn streams(&self) -> usize {
        self.streams
    }

    /// Signs every request with SigV4 under these credentials (needed when the node runs
    /// with `--access-key`/`--secret-key`, unless it allows anonymous reads).
    pub fn with_credentials(self, access_key: &str, secret_key: &str, region: &str) -> Client {
        self.with_credentials_opt(Some(Credentials::new(access_key, secret_key, region)))
    }

    /// Signs with `creds`, or sends unsigned requests with `None`.
    pub fn with_credentials_opt(mut self, creds: Option<Credentials>) -> Client {
        self.local = self
            .local
            .map(|l| Box::new(l.with_credentials_opt(creds.clone())));
        self.creds = creds;
        self.helpers.clear();
        self
    }

    /// How long a read or write on the socket may wait (default 60 s). A node filling a
    /// cold object streams as it goes, so this bounds stalls, not whole transfers.
    pub fn with_timeout(mut self, timeout: Duration) -> Client {
        self.conn.timeout = timeout;
        self.local = self.local.map(|l| Box::new(l.with_timeout(timeout)));
        self.helpers.clear();
        self
    }

    /// Whether a node on this machine may move the connection to its Unix socket when it
    /// offers it (default: yes, unless `GRANARY_LOCAL_SOCKET=off`); `false` keeps every
    /// request on the address given.
    pub fn with_socket_offers(mut self, take: bool) -> Client {
        if !take {
            self.conn.keep_address();
        }
        self.helpers.clear();
        self
    }

    /// `http://host:port` (or `unix:PATH`) of the node.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Whether this client reaches its node over the node's Unix socket (given, or
    /// offered by the node on this machine), where the node can pass its cache file.
    pub fn reads_locally(&self) -> bool {
        self.local.is_some() || self.endpoint.starts_with("unix:") || self.conn.on_offered_socket()
    }

    /// How long a read or write on the socket may wait.
    pub(crate) fn timeout(&self) -> Duration {
        self.conn.timeout
    }

    /// The credentials requests are signed with, if any.
    pub fn credentials(&self) -> Option<&Credentials> {
        self.creds.as_ref()
    }

    /// A new client of the same node with the same settings and its own connection.
    pub fn fresh(&self) -> Client {
        Client {
            endpoint: self.endpoint.clone(),
            conn: self.conn.fresh(),
            creds: self.creds.clone(),
            local: self.local.as_ref().map(|l| Box::new(l.fresh())),
            streams: self.streams,
            helpers: Vec::new(),
        }
    }

    /// Builds the request head for `host`, signed when credentials are set.
    fn head_bytes(&self, req: &Req<'_>, host: &str) -> Vec<u8> {
        let mut headers = req.headers.clone();
        headers.push(Header::new("host", host));
        let mut extra = Vec::new();
        if let Some(creds) = &self.creds {
            let payload_hash = match &req.body {
                Body::Empty => sign::sha256_hex(b""),
                Body::Bytes(b) => sign::sha256_hex(b),
                Body::Reader(..) => UNSIGNED_PAYLOAD.to_owned(),
            };
            extra = sign::sign(
                creds,
                &Signable {
                    method: req.method,
                    path: &req.path,
                    query: &req.encoded_query(),
                    headers: &headers,
                    payload_hash: &payload_hash,
                },
                SystemTime::now(),
            );
        }
        let mut out = format!("{} {} HTTP/1.1\r\n", req.method, req.target());
        for Header { name, value } in headers.iter().chain(&extra) {
            out.push_str(&format!("{name}: {value}\r\n"));
        }
        let with_body = !matches!(req.body, Body::Empty) || matches!(req.method, "PUT" | "POST");
        if with_body {
            out.push_str(&format!("content-length: {}\r\n", req.body.len()));
        }
        out.push_str("user-agent: granary-client/");
        out.push_str(env!("CARGO_PKG_VERSION"));
        out.push_str("\r\n\r\n");
        out.into_bytes()
    }

    /// Sends a request and reads the answer's head, whatever its status; follows
    /// redirects of unsigned reads to the node named in `Location`.
    pub(crate) fn send(&mut self, mut req: Req<'_>) -> Result<(Head, BodyReader)> {
        let head_request = req.method == "HEAD";
        // POST starts jobs: never sent twice.
        let idempotent = req.method != "POST";
        let head = self.head_bytes(&req, host_header(&self.conn.addr));
        let (mut h, mut body) =
            self.conn
                .exchange(&head, &mut req.body, head_request, idempotent)?;
        let mut hops = 0;
        while matches!(h.status, 307 | 308)
            && matches!(req.method, "GET" | "HEAD")
            && self.creds.is_none()
            && hops < MAX_REDIRECTS
        {
            let Some((host, target)) = h.header("location").and_then(split_location) else {
                break;
            };
            let _ = body.read_all(MAX_ERROR_BODY);
            if host == self.conn.addr {
                self.conn.put_back(body.finish());
            }
            let (path, query) = target.split_once('?').unwrap_or((&target, ""));
            req.path = path.to_owned();
            req.query = encode::query_pairs(query);
            let head = self.head_bytes(&req, &host);
            let mut other = Conn::new(host, self.conn.timeout);
            (h, body) = other.exchange(&head, &mut req.body, head_request, idempotent)?;
            hops += 1;
        }
        Ok((h, body))
    }

    /// Like [`Client::send`], but an answer outside `2xx` becomes an [`Error`].
    pub(crate) fn call(&mut self, req: Req<'_>) -> Result<(Head, BodyReader)> {
        let target = req.target();
        let (h, mut body) = self.send(req)?;
        if (200..300).contains(&h.status) {
            return Ok((h, body));
        }
        let text = body.read_all(MAX_ERROR_BODY).unwrap_or_default();
        self.conn.put_back(body.finish());
        // A HEAD's error has no body: the node (and S3) name it in headers.
        if let (true, Some(code)) = (text.is_empty(), h.header("x-amz-error-code")) {
            return Err(Error::S3 {
                status: h.status,
                code: code.to_owned(),
                message: h
                    .header("x-amz-error-message")
                    .unwrap_or("(no message: the answer has no body)")
                    .to_owned(),
                path: target,
            });
        }
        Err(status_error(h.status, &target, &text))
    }

    /// Like [`Client::call`], reading the whole body (at most `limit` bytes).
    pub(crate) fn call_bytes(&mut self, req: Req<'_>, limit: usize) -> Result<(Head, Vec<u8>)> {
        let (h, mut body) = self.call(req)?;
        let bytes = body.read_all(limit).map_err(|e| self.io(e))?;
        self.conn.put_back(body.finish());
        Ok((h, bytes))
    }

    /// Keeps the connection of a body read to its end.
    pub(crate) fn done(&mut self, body: BodyReader) {
        self.conn.put_back(body.finish());
    }

    pub(crate) fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            addr: self.conn.addr.clone(),
            source,
        }
    }

    /// Sends any request (`target` is a path with its query, already encoded) and reads
    /// the whole answer, whatever its status: for routes this client has no method for.
    pub fn raw(&mut self, method: &str, target: &str, body: &[u8]) -> Result<Response> {
        let method: &'static str = match method.to_ascii_uppercase().as_str() {
            "GET" => "GET",
            "HEAD" => "HEAD",
            "PUT" => "PUT",
            "POST" => "POST",
            "DELETE" => "DELETE",
            other => return Err(Error::Invalid(format!("method {other}"))),
        };
        let (path, query) = target.split_once('?').unwrap_or((target, ""));
        let mut req = Req::new(method, path.to_owned());
        req.query = encode::query_pairs(query);
        if !body.is_empty() {
            req = req.body(Body::Bytes(body));
        }
        let (h, mut reader) = self.send(req)?;
        let body = reader.read_all(usize::MAX - 1).map_err(|e| self.io(e))?;
        self.conn.put_back(reader.finish());
        Ok(Response {
            status: h.status,
            headers: h.headers,
            body,
        })
    }
}

/// `(host:port, target)` of an `http://` Location.
fn split_location(location: &str) -> Option<(String, String)> {
    let rest = location.strip_prefix("http://")?;
    let (host, target) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    (!host.is_empty()).then(|| (host.to_owned(), target.to_owned()))
}

/// The error for an answer outside `2xx`: the S3 code and message when the body is an S3
/// error document, else the body as text.
pub(crate) fn status_error(status: u16, target: &str, body: &[u8]) -> Error {
    if let Some((code, message)) = granary_proto::xml::parse_error(body) {
        return Error::S3 {
            status,
            code,
            message,
            path: target.to_owned(),
        };
    }
    let mut text = String::from_utf8_lossy(body).trim().to_owned();
    if text.len() > 1000 {
        let mut end = 1000;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    Error::Status {
        status,
        path: target.to_owned(),
        body: text,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::{FakeServer, Reply};

    #[test]
    fn endpoints() {
        assert!(Client::new("http://127.0.0.1:7070").is_ok());
        assert!(Client::new("http://127.0.0.1:7070/").is_ok());
        assert!(Client::new("127.0.0.1:7070").is_err());
        assert!(Client::new("http://h:1/path").is_err());
        assert_eq!(Client::new("http://h:1/").unwrap().endpoint(), "http://h:1");
    }

    #[test]
    fn paths_encode_keys_but_keep_slashes() {
        assert_eq!(
            object_path("b", "a dir/x+y%z.tar").unwrap(),
            "/b/a%20dir/x%2By%25z.tar"
        );
        assert_eq!(object_path("b", "é").unwrap(), "/b/%C3%A9");
        assert!(object_path("b", "").is_err());
        assert!(object_path("", "k").is_err());
        let req = Req::new("GET", "/b".into())
            .query("prefix", "a b/c")
            .query("list-type", "2");
        assert_eq!(req.target(), "/b?prefix=a%20b%2Fc&list-type=2");
    }

    #[test]
    fn chunked_bodies_are_decoded() {
        let server = FakeServer::start(vec![Reply::raw(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n",
        )]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let r = c.raw("GET", "/x", b"").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"hello world");
        let reqs = server.finish();
        assert_eq!(reqs[0].method, "GET");
        assert_eq!(reqs[0].target, "/x");
    }

    #[test]
    fn one_connection_carries_many_requests() {
        let server = FakeServer::start(vec![
            Reply::ok(b"one".to_vec()),
            Reply::ok(b"two".to_vec()),
            Reply::ok(b"three".to_vec()),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        for want in ["one", "two", "three"] {
            assert_eq!(c.raw("GET", "/k", b"").unwrap().body, want.as_bytes());
        }
        let reqs = server.finish();
        assert_eq!(reqs.len(), 3);
        assert!(reqs.iter().all(|r| r.connection == 0));
    }

    /// A node on this machine that offers its Unix socket is reached over it from the
    /// next request, once the process listening there is the one that offered it; an
    /// offer naming another process is not taken, then or later.
    #[test]
    fn a_local_nodes_socket_is_taken_only_from_the_process_that_offers_it() {
        use std::io::{BufRead, BufReader, Write};
        let path = std::env::temp_dir().join(format!("granary-offer-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        let offer = |pid: u32| format!("{pid} {}", path.display());

        // Offered by this process (which listens there): the second request comes over
        // the socket, and the TCP side sees only the first.
        let server =
            FakeServer::start(vec![Reply::ok(b"tcp".to_vec())
                .with_header("x-granary-socket", &offer(std::process::id()))]);
        let unix = std::thread::spawn(move || {
            let (s, _) = listener.accept().unwrap();
            let mut r = BufReader::new(s.try_clone().unwrap());
            let mut line = String::new();
            r.read_line(&mut line).unwrap();
            let target = line.split(' ').nth(1).unwrap_or_default().to_owned();
            while r.read_line(&mut line).unwrap() > 0 && !line.ends_with("\r\n\r\n") {}
            (&s).write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 4\r\n\r\nunix")
                .unwrap();
            (target, listener)
        });
        let mut c = Client::new(&server.endpoint()).unwrap();
        assert_eq!(c.raw("GET", "/a", b"").unwrap().body, b"tcp");
        assert_eq!(c.raw("GET", "/b", b"").unwrap().body, b"unix");
        let (target, listener) = unix.join().unwrap();
        assert_eq!(target, "/b");
        assert_eq!(server.finish().len(), 1, "only the first request over TCP");

        // Offered in another process's name: the socket is tried, refused, and every
        // request stays on TCP.
        let server = FakeServer::start(vec![
            Reply::ok(b"one".to_vec())
                .with_header("x-granary-socket", &offer(std::process::id() + 1)),
            Reply::ok(b"two".to_vec()),
            Reply::ok(b"three".to_vec())
                .with_header("x-granary-socket", &offer(std::process::id())),
            Reply::ok(b"four".to_vec()),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        for want in ["one", "two", "three", "four"] {
            assert_eq!(c.raw("GET", "/k", b"").unwrap().body, want.as_bytes());
        }
        assert_eq!(server.finish().len(), 4, "every request over TCP");
        drop(listener);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_connection_the_node_closed_is_replaced() {
        let server = FakeServer::start(vec![
            Reply::ok(b"one".to_vec()).then_close(),
            Reply::ok(b"two".to_vec()),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        assert_eq!(c.raw("GET", "/a", b"").unwrap().body, b"one");
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(c.raw("GET", "/b", b"").unwrap().body, b"two");
        let reqs = server.finish();
        assert_eq!(reqs[0].connection, 0);
        assert_eq!(reqs[1].connection, 1);
    }

    #[test]
    fn s3_errors_carry_code_and_message() {
        let xml = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NoSuchKey</Code>\
                   <Message>The specified key does not exist.</Message><Resource>/b/k</Resource></Error>";
        let server = FakeServer::start(vec![Reply::status(404, xml.as_bytes().to_vec())]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let err = c.get("b", "k").unwrap_err();
        assert_eq!(err.status(), Some(404));
        assert_eq!(err.code(), Some("NoSuchKey"));
        assert!(err.is_not_found());
        assert!(!err.is_retryable());
        assert!(err
            .to_string()
            .contains("The specified key does not exist."));
        server.finish();
    }

    /// A HEAD's error has no body: its code and message come from the headers.
    #[test]
    fn a_heads_error_is_named_from_its_headers() {
        let server = FakeServer::start(vec![
            Reply::status(404, Vec::new())
                .with_header("x-amz-error-code", "NoSuchKey")
                .with_header("x-amz-error-message", "The specified key does not exist.")
                .head_only(),
            Reply::status(403, Vec::new())
                .with_header("x-amz-error-code", "AccessDenied")
                .head_only(),
        ]);
        let mut c = Client::new(&server.endpoint()).unwrap();
        let err = c.stat("b", "k").unwrap_err();
        assert_eq!((err.status(), err.code()), (Some(404), Some("NoSuchKey")));
        assert_eq!(
            err.to_string(),
            "404 NoSuchKey from /b/k: The specified key does not exist."
        );
        let err = c.stat("b", "k").unwrap_err();
        assert_eq!(
            (err.status(), err.code()),
            (Some(403), Some("AccessDenied"))
        );
        server.finish();
    }

    #[test]
    fn redirects_of_reads_are_followed() {
        let owner = FakeServer::start(vec![Reply::ok(b"from the owner".to_vec())]);
        let location = format!("{}/b/k%20x", owner.endpoint());
        let first = FakeServer::start(vec![
            Reply::status(307, Vec::new()).with_header("location", &location)
        ]);
        let mut c = Client::new(&first.endpoint()).unwrap();
        assert_eq!(c.get("b", "k x").unwrap(), b"from the owner");
        assert_eq!(first.finish()[0].target, "/b/k%20x");
        let host = owner.endpoint().trim_start_matches("http://").to_owned();
        let reqs = owner.finish();
        assert_eq!(reqs[0].target, "/b/k%20x");
        assert_eq!(reqs[0].header("host"), Some(host.as_str()));
    }

    #[test]
    fn signed_requests_carry_sigv4_headers() {
        let server = FakeServer::start(vec![Reply::ok(b"x".to_vec())]);
        let mut c =
            Client::new(&server.endpoint())
                .unwrap()
                .with_credentials("AK", "SK", "us-east-1");
        c.get_range("b", "k", 0..4).unwrap();
        let reqs = server.finish();
        let auth = reqs[0].header("authorization").unwrap();
        assert!(auth.starts_with("AWS4-HMAC-SHA256 Credential=AK/"));
        assert!(auth.contains("/us-east-1/s3/aws4_request,"));
        assert!(auth.contains("SignedHeaders=host;range;x-amz-content-sha256;x-amz-date,"));
        assert_eq!(
            reqs[0].header("x-amz-content-sha256"),
            Some("e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        );
        assert_eq!(reqs[0].header("range"), Some("bytes=0-3"));
    }
}
