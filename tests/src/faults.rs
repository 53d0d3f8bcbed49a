//! A fault-injecting HTTP proxy to put in front of a real S3 server (moto): requests are
//! passed on one at a time, each over a fresh connection to the upstream, and the answers
//! to GETs of object keys can be spoiled on purpose — delayed, slowed, replaced by an S3
//! error status, cut mid-body with a reset, or ended early with fewer bytes than their
//! `Content-Length` promised. The fault applies to the next `times` object GETs, then the
//! proxy passes answers on untouched again. Writes (PUTs with a body) can be held: taken
//! whole, then sent on after a delay whatever became of their sender, as a store that
//! commits a write after its client gave up would. Every request passed on is recorded,
//! as a man in the middle would capture it.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use anyhow::{bail, Context, Result};

/// What happens to a spoiled answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Passed on untouched.
    None,
    /// Passed on after this long.
    Delay(Duration),
    /// Replaced by this status with an S3 error document (`500 InternalError`,
    /// `503 SlowDown`).
    Status(u16),
    /// The head and this many body bytes, then a TCP reset.
    ResetAfter(usize),
    /// The head and this many body bytes, then an orderly close: fewer bytes than the
    /// `Content-Length` promised.
    ShortBy(usize),
    /// The whole answer, its body at this many bytes a second (a slow store).
    Throttle(usize),
}

struct Plan {
    fault: Fault,
    times: usize,
}

/// A request as it went through the proxy.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    /// Path and query.
    pub target: String,
    /// Name and value of each header, as sent.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// The proxy: listens on a loopback port until dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    plan: Arc<Mutex<Plan>>,
    stop: Arc<AtomicBool>,
    /// Object GETs seen, and those spoiled.
    gets: Arc<AtomicU64>,
    spoiled: Arc<AtomicU64>,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    hold: Arc<Mutex<Option<Duration>>>,
    /// When each held write reached the upstream and was answered.
    released: Arc<Mutex<Vec<std::time::Instant>>>,
}

impl FaultProxy {
    /// A proxy to `upstream` (`host:port`), passing everything on.
    pub fn start(upstream: SocketAddr) -> Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let proxy = FaultProxy {
            addr,
            plan: Arc::new(Mutex::new(Plan {
                fault: Fault::None,
                times: 0,
            })),
            stop: Arc::new(AtomicBool::new(false)),
            gets: Arc::new(AtomicU64::new(0)),
            spoiled: Arc::new(AtomicU64::new(0)),
            recorded: Arc::default(),
            hold: Arc::default(),
            released: Arc::default(),
        };
        let shared = Shared {
            upstream,
            plan: proxy.plan.clone(),
            gets: proxy.gets.clone(),
            spoiled: proxy.spoiled.clone(),
            recorded: proxy.recorded.clone(),
            hold: proxy.hold.clone(),
            released: proxy.released.clone(),
        };
        let stop = proxy.stop.clone();
        thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                match listener.accept() {
                    Ok((client, _)) => {
                        let shared = shared.clone();
                        thread::spawn(move || {
                            let _ = client.set_nonblocking(false);
                            let _ = serve(client, &shared);
                        });
                    }
                    Err(_) => thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Ok(proxy)
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Spoils the next `times` object GETs with `fault`.
    pub fn inject(&self, fault: Fault, times: usize) {
        *self.plan.lock().unwrap() = Plan { fault, times };
    }

    /// Holds every write (a PUT with a body) for `d` once it is taken whole, then sends it
    /// on; `None`: writes pass at once.
    pub fn hold_writes(&self, d: Option<Duration>) {
        *self.hold.lock().unwrap() = d;
    }

    /// When each held write was sent on and answered, so far.
    pub fn released(&self) -> Vec<std::time::Instant> {
        self.released.lock().unwrap().clone()
    }

    /// Object GETs seen so far.
    pub fn gets(&self) -> u64 {
        self.gets.load(Ordering::Acquire)
    }

    /// Object GETs spoiled so far.
    pub fn spoiled(&self) -> u64 {
        self.spoiled.load(Ordering::Acquire)
    }

    /// The requests passed on so far whose method and path are these.
    pub fn recorded(&self, method: &str, path: &str) -> Vec<Recorded> {
        self.recorded
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.method == method && r.target.split('?').next() == Some(path))
            .cloned()
            .collect()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
    }
}

#[derive(Clone)]
struct Shared {
    upstream: SocketAddr,
    plan: Arc<Mutex<Plan>>,
    gets: Arc<AtomicU64>,
    spoiled: Arc<AtomicU64>,
    recorded: Arc<Mutex<Vec<Recorded>>>,
    hold: Arc<Mutex<Option<Duration>>>,
    released: Arc<Mutex<Vec<std::time::Instant>>>,
}

/// One request's head as read: request line, header lines, and its body's length.
struct Head {
    line: String,
    headers: Vec<String>,
    body_len: usize,
}

fn read_head(r: &mut impl BufRead) -> Result<Option<Head>> {
    let mut line = String::new();
    if r.read_line(&mut line)? == 0 {
        return Ok(None);
    }
    let mut headers = Vec::new();
    let mut body_len = 0;
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            bail!("closed inside a head");
        }
        let t = h.trim_end().to_owned();
        if t.is_empty() {
            break;
        }
        if let Some((k, v)) = t.split_once(':') {
            if k.trim().eq_ignore_ascii_case("content-length") {
                body_len = v.trim().parse()?;
            }
            if k.trim().eq_ignore_ascii_case("transfer-encoding") {
                bail!("chunked requests are not proxied");
            }
        }
        headers.push(t);
    }
    Ok(Some(Head {
        line: line.trim_end().to_owned(),
        headers,
        body_len,
    }))
}

/// Whether a request line is a GET of an object (`GET /bucket/key…`), not a listing.
fn object_get(line: &str) -> bool {
    let mut parts = line.split(' ');
    let (Some("GET"), Some(target)) = (parts.next(), parts.next()) else {
        return false;
    };
    let path = target.split('?').next().unwrap_or("");
    path.trim_start_matches('/')
        .split_once('/')
        .is_some_and(|(_, k)| !k.is_empty())
}

fn serve(client: TcpStream, s: &Shared) -> Result<()> {
    client.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut reader = BufReader::new(client.try_clone()?);
    let mut out = client;
    while let Some(head) = read_head(&mut reader)? {
        let mut body = vec![0u8; head.body_len];
        reader.read_exact(&mut body)?;
        let mut words = head.line.split(' ');
        s.recorded.lock().unwrap().push(Recorded {
            method: words.next().unwrap_or("").to_owned(),
            target: words.next().unwrap_or("").to_owned(),
            headers: head
                .headers
                .iter()
                .filter_map(|h| h.split_once(':'))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect(),
            body: body.clone(),
        });
        let fault = if object_get(&head.line) {
            s.gets.fetch_add(1, Ordering::AcqRel);
            let mut plan = s.plan.lock().unwrap();
            if plan.times > 0 && plan.fault != Fault::None {
                plan.times -= 1;
                s.spoiled.fetch_add(1, Ordering::AcqRel);
                plan.fault
            } else {
                Fault::None
            }
        } else {
            Fault::None
        };
        if let Fault::Status(code) = fault {
            let (name, reason) = match code {
                503 => ("SlowDown", "Slow Down"),
                _ => ("InternalError", "Internal Server Error"),
            };
            let xml = format!(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{name}</Code><Message>injected</Message></Error>"
            );
            write!(
                out,
                "HTTP/1.1 {code} {reason}\r\ncontent-type: application/xml\r\ncontent-length: {}\r\n\r\n{xml}",
                xml.len()
            )?;
            continue;
        }
        let held = *s.hold.lock().unwrap();
        if let Some(d) = held.filter(|_| head.line.starts_with("PUT ") && !body.is_empty()) {
            // Sent on whatever became of the sender, as a store commits what it took.
            thread::sleep(d);
            let answer = exchange(s.upstream, &head, &body);
            s.released.lock().unwrap().push(std::time::Instant::now());
            let (resp_head, resp_body) = answer?;
            out.write_all(&resp_head)?;
            out.write_all(&resp_body)?;
            continue;
        }
        let (resp_head, resp_body) = exchange(s.upstream, &head, &body)?;
        match fault {
            Fault::Delay(d) => thread::sleep(d),
            Fault::ResetAfter(n) | Fault::ShortBy(n) => {
                out.write_all(&resp_head)?;
                let keep = match fault {
                    Fault::ResetAfter(_) => n.min(resp_body.len()),
                    _ => resp_body.len().saturating_sub(n.max(1)),
                };
                out.write_all(&resp_body[..keep])?;
                out.flush()?;
                if matches!(fault, Fault::ResetAfter(_)) {
                    reset(&out);
                } else {
                    out.shutdown(Shutdown::Both)?;
                }
                return Ok(());
            }
            Fault::Throttle(rate) => {
                out.write_all(&resp_head)?;
                let piece = (rate / 20).max(1);
                for chunk in resp_body.chunks(piece) {
                    out.write_all(chunk)?;
                    thread::sleep(Duration::from_millis(50));
                }
                continue;
            }
            _ => {}
        }
        out.write_all(&resp_head)?;
        out.write_all(&resp_body)?;
    }
    Ok(())
}

/// Closes with a TCP reset (SO_LINGER 0) instead of a FIN.
fn reset(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt reads the struct given; the descriptor is open.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
    let _ = stream.shutdown(Shutdown::Read);
}

/// Sends one request to the upstream over a fresh connection; its answer's head (bytes,
/// ending with the blank line) and body.
fn exchange(upstream: SocketAddr, head: &Head, body: &[u8]) -> Result<(Vec<u8>, Vec<u8>)> {
    let mut up = TcpStream::connect(upstream).context("connecting upstream")?;
    up.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut req = format!("{}\r\n", head.line);
    for h in &head.headers {
        let lower = h.to_ascii_lowercase();
        if !lower.starts_with("connection:") {
            req.push_str(h);
            req.push_str("\r\n");
        }
    }
    req.push_str("connection: close\r\n\r\n");
    up.write_all(req.as_bytes())?;
    up.write_all(body)?;
    let mut r = BufReader::new(up);
    let mut resp_head = Vec::new();
    let mut len: Option<usize> = None;
    let mut status_line = String::new();
    r.read_line(&mut status_line)?;
    resp_head.extend_from_slice(status_line.as_bytes());
    let no_body = head.line.starts_with("HEAD ");
    loop {
        let mut h = String::new();
        if r.read_line(&mut h)? == 0 {
            bail!("upstream closed inside a head");
        }
        let t = h.trim_end();
        if t.is_empty() {
            break;
        }
        let lower = t.to_ascii_lowercase();
        if let Some(v) = lower.strip_prefix("content-length:") {
            len = Some(v.trim().parse()?);
        }
        if lower.starts_with("connection:") || lower.starts_with("transfer-encoding:") {
            continue;
        }
        resp_head.extend_from_slice(t.as_bytes());
        resp_head.extend_from_slice(b"\r\n");
    }
    let mut resp_body = Vec::new();
    if !no_body {
        match len {
            Some(n) => {
                resp_body.resize(n, 0);
                r.read_exact(&mut resp_body)?;
            }
            None => {
                r.read_to_end(&mut resp_body)?;
                let n = resp_body.len();
                resp_head.extend_from_slice(format!("content-length: {n}\r\n").as_bytes());
            }
        }
    }
    resp_head.extend_from_slice(b"\r\n");
    Ok((resp_head, resp_body))
}
