//! The ceiling the client's reads are measured against: a plain HTTP/1.1 GET over one
//! kept-alive `std` TCP socket, its body received with `read(2)` straight into memory the
//! caller brings (what a Python socket's `recv_into` does). None of the client's own
//! machinery is on this path; benchmarks (`granary-bench wire`, the P7 example) time it
//! beside [`Client::get`](crate::Client::get) in the same run.

use std::io::{self, Read, Write};
use std::net::TcpStream;

/// One connection to a node, for plain GETs.
pub struct PlainGet {
    stream: TcpStream,
    host: String,
    head: Vec<u8>,
}

fn bad(what: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what)
}

impl PlainGet {
    /// Connects to `http://host:port`.
    pub fn connect(endpoint: &str) -> io::Result<PlainGet> {
        let host = endpoint
            .strip_prefix("http://")
            .ok_or_else(|| bad(format!("`{endpoint}` is not http://host:port")))?
            .trim_end_matches('/')
            .to_owned();
        let stream = TcpStream::connect(&host)?;
        stream.set_nodelay(true)?;
        Ok(PlainGet {
            stream,
            host,
            head: Vec::with_capacity(64 << 10),
        })
    }

    /// `GET target` (a path, encoded), its body written into `dst`: the body's length.
    /// A status other than 200 or a body larger than `dst` is an error.
    pub fn get_into(&mut self, target: &str, dst: &mut [u8]) -> io::Result<usize> {
        let req = format!("GET {target} HTTP/1.1\r\nHost: {}\r\n\r\n", self.host);
        self.stream.write_all(req.as_bytes())?;
        // The head, and whatever of the body came with it.
        self.head.clear();
        let end = loop {
            if let Some(i) = self.head.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            let at = self.head.len();
            self.head.resize(at + (64 << 10), 0);
            let n = self.stream.read(&mut self.head[at..])?;
            self.head.truncate(at + n);
            if n == 0 {
                return Err(bad("the connection closed before the head".into()));
            }
        };
        let text = std::str::from_utf8(&self.head[..end]).map_err(|e| bad(e.to_string()))?;
        if !text.starts_with("HTTP/1.1 200") {
            return Err(bad(format!(
                "answer `{}`",
                text.lines().next().unwrap_or("")
            )));
        }
        let len: usize = text
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .ok_or_else(|| bad("no content-length".into()))?;
        if len > dst.len() {
            return Err(bad(format!("{len} bytes; the buffer holds {}", dst.len())));
        }
        let early = (self.head.len() - end).min(len);
        dst[..early].copy_from_slice(&self.head[end..end + early]);
        let mut got = early;
        while got < len {
            let n = self.stream.read(&mut dst[got..len])?;
            if n == 0 {
                return Err(bad(format!("cut short at {got} of {len} bytes")));
            }
            got += n;
        }
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_body_lands_whole_across_two_requests_on_one_connection() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let body: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        let sent = body.clone();
        let server = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            for _ in 0..2 {
                let mut req = Vec::new();
                let mut b = [0u8; 1];
                while !req.ends_with(b"\r\n\r\n") {
                    s.read_exact(&mut b).unwrap();
                    req.push(b[0]);
                }
                assert!(req.starts_with(b"GET /b/k HTTP/1.1\r\n"));
                let head = format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", sent.len());
                s.write_all(head.as_bytes()).unwrap();
                s.write_all(&sent).unwrap();
            }
        });
        let mut c = PlainGet::connect(&format!("http://{addr}")).unwrap();
        for _ in 0..2 {
            let mut dst = vec![0u8; 400_000];
            assert_eq!(c.get_into("/b/k", &mut dst).unwrap(), body.len());
            assert_eq!(&dst[..body.len()], &body[..]);
        }
        server.join().unwrap();
        let mut dst = vec![0u8; 400_000];
        assert!(c.get_into("/b/k", &mut dst).is_err(), "the server closed");
    }
}
