//! `granary-client`: a small typed client for a Granary node's native API
//! (`/_granary/…`) and plain object reads, over blocking HTTP/1.1 keep-alive
//! connections. S3 operations are best done with an S3 SDK pointed at the node.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Why a call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("bad endpoint `{0}`: expected http://host:port")]
    Endpoint(String),
    #[error("connection to {addr} failed: {source}")]
    Io {
        addr: String,
        source: std::io::Error,
    },
    #[error("malformed HTTP response: {0}")]
    Protocol(String),
    #[error("{status} from {path}: {body}")]
    Status {
        status: u16,
        path: String,
        body: String,
    },
    #[error("bad JSON from {path}: {source}")]
    Json {
        path: String,
        source: serde_json::Error,
    },
}

pub type Result<T> = std::result::Result<T, Error>;

/// A response: status, headers (names in lower case) and body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One keep-alive connection to a node.
pub struct Client {
    addr: String,
    conn: Option<BufReader<TcpStream>>,
    timeout: Duration,
}

impl Client {
    /// `endpoint` is `http://host:port`.
    pub fn new(endpoint: &str) -> Result<Client> {
        let addr = endpoint
            .strip_prefix("http://")
            .map(|s| s.trim_end_matches('/'))
            .filter(|s| !s.is_empty() && !s.contains('/'))
            .ok_or_else(|| Error::Endpoint(endpoint.to_owned()))?;
        Ok(Client {
            addr: addr.to_owned(),
            conn: None,
            timeout: Duration::from_secs(30),
        })
    }

    fn io(&self, source: std::io::Error) -> Error {
        Error::Io {
            addr: self.addr.clone(),
            source,
        }
    }

    fn connection(&mut self) -> Result<&mut BufReader<TcpStream>> {
        if self.conn.is_none() {
            let s = TcpStream::connect(&self.addr).map_err(|e| self.io(e))?;
            s.set_nodelay(true).map_err(|e| self.io(e))?;
            s.set_read_timeout(Some(self.timeout))
                .map_err(|e| self.io(e))?;
            self.conn = Some(BufReader::with_capacity(256 << 10, s));
        }
        Ok(self.conn.as_mut().expect("connected above"))
    }

    /// Sends a GET of `path` and streams the body into `sink`; returns the response
    /// with an empty body and the number of body bytes.
    pub fn get_into(&mut self, path: &str, sink: &mut dyn Write) -> Result<(Response, u64)> {
        let req = format!(
            "GET {path} HTTP/1.1\r\nhost: {}\r\nuser-agent: granary-client\r\n\r\n",
            self.addr
        );
        let result = self.exchange(req.as_bytes(), sink);
        if result.is_err() {
            self.conn = None;
        }
        result
    }

    /// GETs `path` into memory.
    pub fn get(&mut self, path: &str) -> Result<Response> {
        let mut body = Vec::new();
        let (mut resp, _) = self.get_into(path, &mut body)?;
        resp.body = body;
        Ok(resp)
    }

    fn exchange(&mut self, req: &[u8], sink: &mut dyn Write) -> Result<(Response, u64)> {
        let addr = self.addr.clone();
        let io = |source| Error::Io {
            addr: addr.clone(),
            source,
        };
        let conn = self.connection()?;
        conn.get_mut().write_all(req).map_err(io)?;
        let mut line = String::new();
        conn.read_line(&mut line).map_err(io)?;
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Error::Protocol(format!("status line `{}`", line.trim())))?;
        let mut headers = Vec::new();
        loop {
            line.clear();
            conn.read_line(&mut line).map_err(io)?;
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            if let Some((k, v)) = l.split_once(':') {
                headers.push((k.trim().to_ascii_lowercase(), v.trim().to_owned()));
            }
        }
        let resp = Response {
            status,
            headers,
            body: Vec::new(),
        };
        let n = if resp.header("transfer-encoding") == Some("chunked") {
            read_chunked(conn, sink).map_err(io)?
        } else {
            let len: u64 = resp
                .header("content-length")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            std::io::copy(&mut conn.by_ref().take(len), sink).map_err(io)?
        };
        Ok((resp, n))
    }

    fn json(&mut self, path: &str) -> Result<serde_json::Value> {
        let resp = self.get(path)?;
        if resp.status != 200 {
            return Err(Error::Status {
                status: resp.status,
                path: path.to_owned(),
                body: String::from_utf8_lossy(&resp.body).into_owned(),
            });
        }
        serde_json::from_slice(&resp.body).map_err(|source| Error::Json {
            path: path.to_owned(),
            source,
        })
    }

    /// `GET /_granary/health`.
    pub fn health(&mut self) -> Result<serde_json::Value> {
        self.json("/_granary/health")
    }

    /// `GET /_granary/stats`.
    pub fn stats(&mut self) -> Result<serde_json::Value> {
        self.json("/_granary/stats")
    }
}

fn read_chunked(r: &mut BufReader<TcpStream>, sink: &mut dyn Write) -> std::io::Result<u64> {
    let mut total = 0;
    let mut line = String::new();
    loop {
        line.clear();
        r.read_line(&mut line)?;
        let size = u64::from_str_radix(line.trim().split(';').next().unwrap_or(""), 16)
            .map_err(|_| std::io::Error::other("bad chunk size"))?;
        if size == 0 {
            // Trailers, then the blank line.
            loop {
                line.clear();
                r.read_line(&mut line)?;
                if line.trim().is_empty() {
                    return Ok(total);
                }
            }
        }
        total += std::io::copy(&mut r.by_ref().take(size), sink)?;
        line.clear();
        r.read_line(&mut line)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        assert!(Client::new("http://127.0.0.1:7070").is_ok());
        assert!(Client::new("http://127.0.0.1:7070/").is_ok());
        assert!(Client::new("127.0.0.1:7070").is_err());
        assert!(Client::new("http://h:1/path").is_err());
    }

    #[test]
    fn chunked_bodies_are_decoded() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let server = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf).unwrap();
            s.write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n")
                .unwrap();
        });
        let mut c = Client::new(&format!("http://{addr}")).unwrap();
        let r = c.get("/x").unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"hello world");
        server.join().unwrap();
    }
}
