//! A scripted HTTP/1.1 server on a thread, for unit tests: it answers each request with
//! the next canned [`Reply`] and records what it received.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::Duration;

/// One canned answer.
pub(crate) struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    raw: Option<Vec<u8>>,
    chunk: Option<usize>,
    close: bool,
    head_only: bool,
    abort: bool,
}

impl Reply {
    pub(crate) fn status(status: u16, body: Vec<u8>) -> Reply {
        Reply {
            status,
            headers: Vec::new(),
            body,
            raw: None,
            chunk: None,
            close: false,
            head_only: false,
            abort: false,
        }
    }

    pub(crate) fn ok(body: Vec<u8>) -> Reply {
        Reply::status(200, body)
    }

    /// Exactly these bytes.
    pub(crate) fn raw(bytes: &[u8]) -> Reply {
        let mut r = Reply::ok(Vec::new());
        r.raw = Some(bytes.to_vec());
        r
    }

    pub(crate) fn with_header(mut self, name: &str, value: &str) -> Reply {
        self.headers.push((name.to_owned(), value.to_owned()));
        self
    }

    /// Sends the body chunked, in chunks of this size.
    pub(crate) fn chunked(mut self, size: usize) -> Reply {
        self.chunk = Some(size);
        self
    }

    /// Closes the connection after this answer.
    pub(crate) fn then_close(mut self) -> Reply {
        self.close = true;
        self
    }

    /// An answer to HEAD: headers as given, no body.
    pub(crate) fn head_only(mut self) -> Reply {
        self.head_only = true;
        self
    }

    /// Sends the body without its end (no last chunk) and closes.
    pub(crate) fn aborted(mut self) -> Reply {
        self.abort = true;
        self.close = true;
        self
    }

    fn bytes(&self) -> Vec<u8> {
        if let Some(raw) = &self.raw {
            return raw.clone();
        }
        let mut out = format!("HTTP/1.1 {} X\r\n", self.status);
        for (k, v) in &self.headers {
            out.push_str(&format!("{k}: {v}\r\n"));
        }
        let has_length = self.headers.iter().any(|(k, _)| k == "content-length");
        match self.chunk {
            Some(_) => out.push_str("transfer-encoding: chunked\r\n"),
            None if !has_length && !self.head_only => {
                out.push_str(&format!("content-length: {}\r\n", self.body.len()));
            }
            None => {}
        }
        out.push_str("\r\n");
        let mut out = out.into_bytes();
        if self.head_only {
            return out;
        }
        match self.chunk {
            Some(size) => {
                for c in self.body.chunks(size) {
                    out.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
                    out.extend_from_slice(c);
                    out.extend_from_slice(b"\r\n");
                }
                if !self.abort {
                    out.extend_from_slice(b"0\r\n\r\n");
                }
            }
            None => out.extend_from_slice(&self.body),
        }
        out
    }
}

/// A request as received.
#[derive(Debug)]
pub(crate) struct Recorded {
    pub method: String,
    pub target: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Which accepted connection it came on, from 0.
    pub connection: usize,
}

impl Recorded {
    pub(crate) fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

pub(crate) struct FakeServer {
    addr: std::net::SocketAddr,
    thread: JoinHandle<Vec<Recorded>>,
}

fn read_request(r: &mut BufReader<TcpStream>, connection: usize) -> Option<Recorded> {
    let mut line = String::new();
    if r.read_line(&mut line).ok()? == 0 {
        return None;
    }
    let mut parts = line.split_whitespace();
    let method = parts.next()?.to_owned();
    let target = parts.next()?.to_owned();
    let mut headers = Vec::new();
    loop {
        line.clear();
        r.read_line(&mut line).ok()?;
        let l = line.trim_end();
        if l.is_empty() {
            break;
        }
        let (k, v) = l.split_once(':')?;
        headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
    }
    let len: u64 = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = Vec::new();
    r.by_ref().take(len).read_to_end(&mut body).ok()?;
    Some(Recorded {
        method,
        target,
        headers,
        body,
        connection,
    })
}

impl FakeServer {
    /// Serves `replies` one per request, then stops. With none, it takes one connection
    /// and reads it to its end.
    pub(crate) fn start(replies: Vec<Reply>) -> FakeServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let thread = std::thread::spawn(move || {
            let mut seen = Vec::new();
            let accept = |n: &mut usize| {
                let (s, _) = listener.accept().unwrap();
                s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                *n += 1;
                BufReader::new(s)
            };
            let mut count = 0;
            if replies.is_empty() {
                let mut conn = accept(&mut count);
                let _ = std::io::copy(&mut conn, &mut std::io::sink());
                return seen;
            }
            let mut conn: Option<BufReader<TcpStream>> = None;
            for reply in replies {
                let req = loop {
                    let c = conn.get_or_insert_with(|| accept(&mut count));
                    match read_request(c, count - 1) {
                        Some(req) => break req,
                        None => conn = None,
                    }
                };
                seen.push(req);
                let c = conn.as_mut().expect("read from above");
                let _ = c.get_mut().write_all(&reply.bytes());
                if reply.close {
                    let _ = c.get_mut().shutdown(std::net::Shutdown::Both);
                    conn = None;
                }
            }
            seen
        });
        FakeServer { addr, thread }
    }

    pub(crate) fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits for the script to end; the requests received.
    pub(crate) fn finish(self) -> Vec<Recorded> {
        self.thread.join().unwrap()
    }
}

/// A tar of `(name, bytes)` members (GNU headers), for shard and batch tests.
pub(crate) fn tar_of(members: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, *data)
            .expect("a member into memory");
    }
    b.into_inner().expect("a tar in memory")
}
