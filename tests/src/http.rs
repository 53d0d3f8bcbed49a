//! Raw HTTP/1.1 over a `TcpStream`, for requests no SDK would send.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};

use crate::xml::{assert_s3_error_body, xml_tag};

/// Socket read/write timeout of [`raw_request`]: a stuck server fails the test, never hangs it.
const RAW_IO_TIMEOUT: Duration = Duration::from_secs(30);

/// An HTTP response read off the wire by [`raw_request`].
#[derive(Clone, Debug)]
pub struct RawResponse {
    pub status: u16,
    /// Header names lower-cased, in the order received.
    pub headers: Vec<(String, String)>,
    /// The body, de-chunked if it came with `Transfer-Encoding: chunked`.
    pub body: Vec<u8>,
}

impl RawResponse {
    /// The first header of that (case-insensitive) name.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| v.as_str())
    }

    /// The body as (lossy) UTF-8, for messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `<Code>` of an S3 XML error body.
    pub fn s3_code(&self) -> Option<String> {
        xml_tag(&self.text(), "Code")
    }

    /// Panics unless this is `status` with an S3 XML error body whose code is one of `codes`.
    pub fn assert_s3_error(&self, status: u16, codes: &[&str]) {
        assert_eq!(
            self.status,
            status,
            "unexpected status; body: {}",
            self.text()
        );
        assert_s3_error_body(&self.body);
        let code = self.s3_code().unwrap_or_default();
        assert!(
            codes.contains(&code.as_str()),
            "expected <Code> in {codes:?}, got {code:?}; body: {}",
            self.text()
        );
    }
}

/// Builds an HTTP/1.1 request: request line with `path` sent byte for byte, then `Host`,
/// the given headers, `Content-Length` (unless given, or the body is empty for GET/HEAD)
/// and `Connection: close` (unless given), then the body.
pub fn request_bytes(
    method: &str,
    path: &str,
    host: SocketAddr,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Vec<u8> {
    let mut out = format!("{method} {path} HTTP/1.1\r\nHost: {host}\r\n").into_bytes();
    let has = |name: &str| headers.iter().any(|(k, _)| k.eq_ignore_ascii_case(name));
    for (k, v) in headers {
        out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    let bodiless = matches!(method, "GET" | "HEAD" | "DELETE") && body.is_empty();
    if !has("content-length") && !has("transfer-encoding") && !bodiless {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    if !has("connection") {
        out.extend_from_slice(b"Connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

/// Sends `request` as is over a new TCP connection and reads one response (skipping `100
/// Continue`), by `Content-Length`, chunked encoding, or until the server closes.
pub async fn raw_request(addr: SocketAddr, request: Vec<u8>) -> Result<RawResponse> {
    tokio::task::spawn_blocking(move || raw_request_blocking(addr, &request)).await?
}

/// [`raw_request`] for synchronous callers.
pub fn raw_request_blocking(addr: SocketAddr, request: &[u8]) -> Result<RawResponse> {
    raw_request_with_timeout(addr, request, RAW_IO_TIMEOUT)
}

/// [`raw_request_blocking`] with another socket timeout (connect, each read and write).
pub fn raw_request_with_timeout(
    addr: SocketAddr,
    request: &[u8],
    timeout: Duration,
) -> Result<RawResponse> {
    let mut stream = TcpStream::connect_timeout(&addr, timeout)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))?;
    // A server may answer (e.g. 431) and close before reading all of a large request; the
    // answer is what counts, so a failed write is only reported if no answer follows.
    let write_result = stream.write_all(request).and_then(|()| stream.flush());
    let is_head = request.starts_with(b"HEAD ");
    let mut reader = BufReader::new(stream);
    match read_response(&mut reader, is_head) {
        Ok(resp) => Ok(resp),
        Err(err) => match write_result {
            Err(write_err) => Err(err.context(format!("request write failed too: {write_err}"))),
            Ok(()) => Err(err),
        },
    }
}

/// Reads one HTTP/1.1 response head (status line and headers), skipping `1xx` answers.
pub fn read_response_head<R: BufRead>(reader: &mut R) -> Result<(u16, Vec<(String, String)>)> {
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            bail!("connection closed before a status line");
        }
        let mut parts = line.trim_end().splitn(3, ' ');
        let version = parts.next().unwrap_or_default();
        if !version.starts_with("HTTP/1.") {
            bail!("not an HTTP/1.x status line: {line:?}");
        }
        let status: u16 = parts
            .next()
            .ok_or_else(|| anyhow!("no status in {line:?}"))?
            .parse()?;
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h)? == 0 {
                bail!("connection closed inside the response head");
            }
            let h = h.trim_end_matches(['\r', '\n']);
            if h.is_empty() {
                break;
            }
            let (k, v) = h
                .split_once(':')
                .ok_or_else(|| anyhow!("bad header line {h:?}"))?;
            headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
        }
        if (100..200).contains(&status) {
            continue;
        }
        return Ok((status, headers));
    }
}

fn read_response<R: BufRead>(reader: &mut R, is_head: bool) -> Result<RawResponse> {
    let (status, headers) = read_response_head(reader)?;
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    };
    let mut body = Vec::new();
    if is_head || status == 204 || status == 304 {
        // No body by definition.
    } else if find("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked")) {
        body = read_chunked(reader)?;
    } else if let Some(len) = find("content-length") {
        let len: usize = len.parse().context("bad Content-Length")?;
        body.resize(len, 0);
        reader
            .read_exact(&mut body)
            .context("body shorter than Content-Length")?;
    } else {
        reader.read_to_end(&mut body)?;
    }
    Ok(RawResponse {
        status,
        headers,
        body,
    })
}

fn read_chunked<R: BufRead>(reader: &mut R) -> Result<Vec<u8>> {
    let mut body = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line)?;
        let size_str = line.trim().split(';').next().unwrap_or_default();
        let size = usize::from_str_radix(size_str, 16)
            .with_context(|| format!("bad chunk size line {line:?}"))?;
        if size == 0 {
            // Trailers, then the empty line.
            loop {
                let mut t = String::new();
                if reader.read_line(&mut t)? == 0 || t.trim().is_empty() {
                    return Ok(body);
                }
            }
        }
        let start = body.len();
        body.resize(start + size, 0);
        reader.read_exact(&mut body[start..])?;
        let mut crlf = [0u8; 2];
        reader.read_exact(&mut crlf)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_are_decoded() {
        let wire = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n";
        let resp = read_response(&mut &wire[..], false).unwrap();
        assert_eq!(resp.status, 200);
        assert_eq!(resp.body, b"abcde");
    }
}
