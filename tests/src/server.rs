//! Starting and stopping real `granary serve` processes for tests.

use std::collections::HashSet;
use std::fs::File;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};

use crate::http::{
    raw_request, raw_request_blocking, raw_request_with_timeout, request_bytes, RawResponse,
};

/// Access key every credentialed test server is started with.
pub const ACCESS: &str = "granarytest";
/// Secret key every credentialed test server is started with.
pub const SECRET: &str = "granarysecret123";

/// How long [`Server::start`] waits for `/_granary/health` to answer `200`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// How to start a test server.
#[derive(Clone, Debug, Default)]
pub struct ServerOpts {
    /// Start with `--access-key ACCESS --secret-key SECRET`.
    pub credentials: bool,
    /// Add `--anonymous-read` (only meaningful with `credentials`).
    pub anonymous_read: bool,
    /// Further `granary serve` flags.
    pub extra_args: Vec<String>,
    /// Environment variables for the server process (e.g. AWS credentials for `--backend s3`).
    pub env: Vec<(String, String)>,
    /// Listen on this address (e.g. from [`reserve_ports`]) instead of a free port chosen
    /// at start; restarts keep it. Needed where the address must be known before the
    /// server starts (a cluster's `--peer` list).
    pub listen: Option<SocketAddr>,
    /// The data directory, where not a fresh one under the server's temporary root (a
    /// filesystem the test made, say).
    pub data_dir: Option<PathBuf>,
    /// A command the server runs under (`setpriv ...`, `prlimit ...`): the binary and its
    /// arguments follow it.
    pub wrapper: Vec<String>,
}

impl ServerOpts {
    /// A server that requires SigV4 with the test credentials.
    pub fn with_credentials() -> Self {
        Self {
            credentials: true,
            ..Self::default()
        }
    }

    /// A server with no credentials: every request is allowed unsigned.
    pub fn open() -> Self {
        Self::default()
    }

    /// An open server whose backend is the S3 server at `endpoint` (e.g. [`Moto`]).
    pub fn s3_backend(endpoint: &str) -> Self {
        Self {
            extra_args: vec![
                "--backend".into(),
                "s3".into(),
                "--s3-endpoint".into(),
                endpoint.into(),
            ],
            env: vec![
                ("AWS_ACCESS_KEY_ID".into(), "testing".into()),
                ("AWS_SECRET_ACCESS_KEY".into(), "testing".into()),
                ("AWS_REGION".into(), "us-east-1".into()),
                ("AWS_DEFAULT_REGION".into(), "us-east-1".into()),
                ("AWS_CONFIG_FILE".into(), "/dev/null".into()),
                ("AWS_SHARED_CREDENTIALS_FILE".into(), "/dev/null".into()),
                ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
            ],
            ..Self::default()
        }
    }

    /// Adds `granary serve` flags.
    pub fn args(mut self, args: &[&str]) -> Self {
        self.extra_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Listens on `addr` (see [`ServerOpts::listen`]).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = Some(addr);
        self
    }

    /// Keeps the data in `dir` (see [`ServerOpts::data_dir`]).
    pub fn data_dir(mut self, dir: &Path) -> Self {
        self.data_dir = Some(dir.to_owned());
        self
    }

    /// Runs the server under `command` (see [`ServerOpts::wrapper`]).
    pub fn wrapped(mut self, command: &[&str]) -> Self {
        self.wrapper = command.iter().map(|a| a.to_string()).collect();
        self
    }
}

/// A real S3 server: `moto_server` on a free loopback port, killed on drop. The binary is
/// `$MOTO_SERVER`, else `<workspace>/tests/.venv/bin/moto_server` (the test script's venv).
pub struct Moto {
    child: Child,
    addr: SocketAddr,
}

impl Moto {
    pub fn start() -> Result<Moto> {
        let bin = std::env::var_os("MOTO_SERVER")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
                manifest.join(".venv").join("bin").join("moto_server")
            });
        if !bin.exists() {
            bail!(
                "moto_server not found at {} (run ./tests/run.sh, which installs it, or set MOTO_SERVER)",
                bin.display()
            );
        }
        let addr = free_port()?;
        let mut child = Command::new(&bin)
            .args(["-H", "127.0.0.1", "-p", &addr.port().to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("spawning {}", bin.display()))?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait()? {
                bail!("moto_server exited during start-up with {status}");
            }
            let req = request_bytes("GET", "/", addr, &[], b"");
            if raw_request_with_timeout(addr, &req, Duration::from_secs(2)).is_ok() {
                return Ok(Moto { child, addr });
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!("moto_server did not answer within {START_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// `127.0.0.1:PORT` of the server.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// An S3 client talking to moto directly.
    pub fn client(&self) -> aws_sdk_s3::Client {
        let creds = Credentials::new("testing", "testing", None, None, "granary-tests");
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(self.url())
            .force_path_style(true)
            .region(Region::new("us-east-1"))
            .credentials_provider(creds)
            .build();
        aws_sdk_s3::Client::from_conf(config)
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A running `granary serve` process on `127.0.0.1:<free port>` with a private temp dir.
///
/// Layout of the temp dir: `data/` is the server's `--data-dir`, `server.log` its stdout and
/// stderr; tests may create anything else beside them (e.g. a sentinel `outside/`).
/// The process is killed when the value is dropped, including on a test's panic.
pub struct Server {
    opts: ServerOpts,
    child: Child,
    addr: SocketAddr,
    root: tempfile::TempDir,
    data_dir: PathBuf,
    log_path: PathBuf,
}

impl Server {
    /// Starts a server and waits until `GET /_granary/health` answers `200`.
    ///
    /// Blocks the calling thread for up to 20 s; the binary is `$GRANARY_BIN`, else
    /// `<workspace>/target/release/granary`.
    pub fn start(opts: ServerOpts) -> Result<Server> {
        Server::start_waiting(opts, &[200])
    }

    /// [`Server::start`], returning as soon as it serves HTTP, before its cluster view is
    /// settled (health `503`, "settling").
    pub fn start_unready(opts: ServerOpts) -> Result<Server> {
        Server::start_waiting(opts, &[200, 503])
    }

    fn start_waiting(opts: ServerOpts, health: &[u16]) -> Result<Server> {
        let root = tempfile::Builder::new().prefix("granary-test-").tempdir()?;
        let data_dir = opts
            .data_dir
            .clone()
            .unwrap_or_else(|| root.path().join("data"));
        std::fs::create_dir_all(&data_dir)?;
        let log_path = root.path().join("server.log");

        // The port comes from binding :0 and letting go of it, so another process may take
        // it before the server binds; a server that dies at start-up is retried on a new port
        // (a fixed `listen` address is tried once: the caller chose it).
        let mut last_err = anyhow!("server did not start");
        let attempts = if opts.listen.is_some() { 1 } else { 3 };
        for _attempt in 0..attempts {
            let addr = match opts.listen {
                Some(addr) => addr,
                None => free_port()?,
            };
            let mut child = spawn_granary(&opts, addr, &data_dir, &log_path)?;
            match wait_healthy(&mut child, addr, health) {
                Ok(()) => {
                    return Ok(Server {
                        opts,
                        child,
                        addr,
                        root,
                        data_dir,
                        log_path,
                    })
                }
                Err(err) => {
                    let exited = child.try_wait().ok().flatten().is_some();
                    let _ = child.kill();
                    let _ = child.wait();
                    let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                    last_err = err.context(format!("server log:\n{log}"));
                    if !exited {
                        break;
                    }
                }
            }
        }
        Err(last_err)
    }

    /// Kills the server with SIGKILL (as a crash would) and starts it again on the same
    /// data dir, on a new port (the same one with [`ServerOpts::listen`]). The old log is
    /// kept as `server.log.N`.
    pub fn kill_and_restart(&mut self) -> Result<()> {
        self.restart(false)
    }

    /// Kills the server with SIGKILL, as a crash would, and waits for it to exit; the
    /// data dir stays. [`Server::restart`] starts it again.
    pub fn kill(&mut self) -> Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }

    /// Starts the server again (killing it first with SIGKILL if it still runs): on the
    /// same data dir, or on an empty one with `wipe_data` (a node that lost its disk), on
    /// a new port, or the same one with [`ServerOpts::listen`]. The old log is kept as
    /// `server.log.N`.
    pub fn restart(&mut self, wipe_data: bool) -> Result<()> {
        if self.child.try_wait()?.is_none() {
            self.kill()?;
        }
        let mut n = 1;
        while self.log_path.with_extension(format!("log.{n}")).exists() {
            n += 1;
        }
        std::fs::rename(
            &self.log_path,
            self.log_path.with_extension(format!("log.{n}")),
        )?;
        if wipe_data {
            std::fs::remove_dir_all(&self.data_dir)?;
            std::fs::create_dir_all(&self.data_dir)?;
        }
        let addr = match self.opts.listen {
            Some(addr) => addr,
            None => free_port()?,
        };
        let mut child = spawn_granary(&self.opts, addr, &self.data_dir, &self.log_path)?;
        if let Err(err) = wait_healthy(&mut child, addr, &[200]) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(err.context(format!("server log:\n{}", self.log())));
        }
        self.child = child;
        self.addr = addr;
        Ok(())
    }

    /// Starts a cluster: one node per id, each with `opts` plus `--node-id ID` and the
    /// same `--peer ID=URL` list (every node, itself included), on loopback ports chosen
    /// before any starts. A node that cannot start (its port taken meanwhile) makes the
    /// whole cluster start again on new ports. Returns the nodes in the order of `ids`,
    /// healthy but not necessarily seeing one another yet: see [`Server::wait_cluster_up`].
    pub fn start_cluster(ids: &[&str], opts: &ServerOpts) -> Result<Vec<Server>> {
        let mut last_err = anyhow!("cluster did not start");
        for _attempt in 0..3 {
            let addrs = reserve_ports(ids.len())?;
            let peers: Vec<String> = ids
                .iter()
                .zip(&addrs)
                .flat_map(|(id, addr)| ["--peer".to_owned(), format!("{id}=http://{addr}")])
                .collect();
            let mut nodes = Vec::new();
            for (id, addr) in ids.iter().zip(&addrs) {
                let mut node_opts = opts.clone().listen(*addr).args(&["--node-id", id]);
                node_opts.extra_args.extend(peers.iter().cloned());
                match Server::start(node_opts) {
                    Ok(node) => nodes.push(node),
                    Err(err) => {
                        last_err = err.context(format!("starting node {id} on {addr}"));
                        break;
                    }
                }
            }
            if nodes.len() == ids.len() {
                return Ok(nodes);
            }
        }
        Err(last_err)
    }

    /// Waits until every node's `GET /_granary/cluster` shows all its members `up` and
    /// itself trusted.
    pub fn wait_cluster_up(nodes: &[&Server], timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut pending = Vec::new();
            for node in nodes {
                let view = node.cluster_view(None);
                // Every member up, and the node trusting its copies (settled, within
                // its lease): before that it keeps nothing it reads.
                let all_up = view.as_ref().is_ok_and(|v| {
                    v["members"]
                        .as_array()
                        .is_some_and(|ms| ms.iter().all(|m| m["state"] == "up"))
                        && v["trusted"] != false
                });
                if !all_up {
                    pending.push(format!("{}: {view:?}", node.addr));
                }
            }
            if pending.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "members not all up within {timeout:?}:\n{}",
                    pending.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One counter of `GET /_granary/stats`; panics when it has none.
    pub fn stat(&self, field: &str) -> u64 {
        let stats = self.stats().expect("GET /_granary/stats");
        stats[field]
            .as_u64()
            .unwrap_or_else(|| panic!("no {field} in {stats}"))
    }

    /// The state (`up`, `down`) of member `id` in this node's view.
    pub fn member_state(&self, id: &str) -> Option<String> {
        let view = self.cluster_view(None).ok()?;
        view["members"]
            .as_array()?
            .iter()
            .find(|m| m["id"] == id)
            .and_then(|m| m["state"].as_str().map(str::to_owned))
    }

    /// Waits until no node has a fill in flight: a response may end a moment before its
    /// fill commits, and only reads that start after the commit are hits.
    pub fn settle(nodes: &[&Server]) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while nodes.iter().any(|n| n.stat("reserved_bytes") != 0) {
            assert!(
                Instant::now() < deadline,
                "fills still in flight after 20 s"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `GET /_granary/cluster`, parsed; with `Some((bucket, key))` it names the key's owner.
    pub fn cluster_view(&self, key: Option<(&str, &str)>) -> Result<serde_json::Value> {
        let path = match key {
            Some((bucket, key)) => {
                format!(
                    "/_granary/cluster?{}",
                    granary_proto::encode::query_string([("bucket", bucket), ("key", key)])
                )
            }
            None => "/_granary/cluster".to_owned(),
        };
        let req = request_bytes("GET", &path, self.addr, &[], b"");
        let resp = raw_request_with_timeout(self.addr, &req, Duration::from_secs(5))?;
        if resp.status != 200 {
            bail!("{path} answered {}: {}", resp.status, resp.text());
        }
        Ok(serde_json::from_slice(&resp.body)?)
    }

    /// `GET /_granary/stats`, parsed.
    pub fn stats(&self) -> Result<serde_json::Value> {
        let req = request_bytes("GET", "/_granary/stats", self.addr, &[], b"");
        let resp = raw_request_blocking(self.addr, &req)?;
        if resp.status != 200 {
            bail!("stats answered {}", resp.status);
        }
        Ok(serde_json::from_slice(&resp.body)?)
    }

    /// `http://127.0.0.1:PORT`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The socket address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The server's `--data-dir`.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The temp dir that holds `data/`, the log and whatever a test puts beside them.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the server wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Peak resident set size of the server (`VmHWM` in `/proc/PID/status`), in KiB.
    pub fn peak_rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid()))?;
        status_kib(&status, "VmHWM:")
            .ok_or_else(|| anyhow!("no VmHWM in /proc/{}/status", self.pid()))
    }

    /// Samples the server's own memory (`RssAnon`: not the page-cache pages it maps,
    /// which its RSS counts too) every 5 ms until [`AnonPeak::peak_kib`].
    pub fn watch_anon(&self) -> AnonPeak {
        let pid = self.pid();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let done = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status"));
                if let Some(kib) = status
                    .ok()
                    .as_deref()
                    .and_then(|s| status_kib(s, "RssAnon:"))
                {
                    peak = peak.max(kib);
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            peak
        });
        AnonPeak { stop, handle }
    }

    /// True while the process runs and `GET /_granary/health` answers `200`.
    pub async fn is_healthy(&self) -> bool {
        match self.raw("GET", "/_granary/health", &[], b"").await {
            Ok(resp) => resp.status == 200,
            Err(_) => false,
        }
    }

    /// Panics, with the server's log, unless the server is healthy.
    pub async fn assert_healthy(&self, after: &str) {
        assert!(
            self.is_healthy().await,
            "server unhealthy after {after}; log:\n{}",
            self.log()
        );
    }

    /// Sends one request built by [`request_bytes`] (adds `Host`, `Content-Length` and
    /// `Connection: close`) and reads the whole answer.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<RawResponse> {
        raw_request(
            self.addr,
            request_bytes(method, path, self.addr, headers, body),
        )
        .await
    }

    /// [`Server::raw`], from a thread that is not in a runtime.
    pub fn raw_blocking(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Result<RawResponse> {
        raw_request_blocking(
            self.addr,
            &request_bytes(method, path, self.addr, headers, body),
        )
    }

    /// [`Server::raw_blocking`] with an empty body, signed (SigV4) with the test
    /// credentials.
    pub fn signed_blocking(&self, method: &str, path: &str) -> Result<RawResponse> {
        let sig = crate::SignedRequest::new(
            method,
            path,
            self.addr,
            &[],
            &crate::sha256_hex(b""),
            ACCESS,
            SECRET,
            crate::unix_now(),
        );
        self.raw_blocking(method, path, &sig.header_refs(), b"")
    }

    /// A number of `/proc/PID/status` (`Threads:`, `RssAnon:` in KiB).
    pub fn proc_status(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        status_kib(&status, field)
    }

    /// An S3 client for this server signing with the test credentials.
    pub fn s3_client(&self) -> aws_sdk_s3::Client {
        self.s3_client_with(ACCESS, SECRET)
    }

    /// An S3 client for this server signing with the given keys.
    ///
    /// Path-style, `us-east-1`, no retries (a test must see the first answer), and every
    /// operation bounded to 120 s.
    pub fn s3_client_with(&self, access: &str, secret: &str) -> aws_sdk_s3::Client {
        let creds = Credentials::new(access, secret, None, None, "granary-tests");
        let timeouts = aws_sdk_s3::config::timeout::TimeoutConfig::builder()
            .connect_timeout(Duration::from_secs(5))
            .operation_timeout(Duration::from_secs(120))
            .build();
        let config = aws_sdk_s3::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .endpoint_url(self.url())
            .force_path_style(true)
            .region(Region::new("us-east-1"))
            .credentials_provider(creds)
            .retry_config(aws_sdk_s3::config::retry::RetryConfig::disabled())
            .timeout_config(timeouts)
            .build();
        aws_sdk_s3::Client::from_conf(config)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- granary log ({}) ----\n{}", self.addr, self.log());
        }
    }
}

fn spawn_granary(
    opts: &ServerOpts,
    addr: SocketAddr,
    data_dir: &Path,
    log_path: &Path,
) -> Result<Child> {
    let bin = granary_bin();
    if !bin.exists() {
        bail!(
            "granary binary not found at {} (build it with `cargo build --release -p granary-server` or set GRANARY_BIN)",
            bin.display()
        );
    }
    let log = File::create(log_path)?;
    let mut cmd = match opts.wrapper.split_first() {
        Some((first, rest)) => {
            let mut cmd = Command::new(first);
            cmd.args(rest).arg(&bin);
            cmd
        }
        None => Command::new(&bin),
    };
    cmd.arg("serve")
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--data-dir")
        .arg(data_dir);
    if opts.credentials {
        cmd.args(["--access-key", ACCESS, "--secret-key", SECRET]);
    }
    if opts.anonymous_read {
        cmd.arg("--anonymous-read");
    }
    cmd.args(&opts.extra_args);
    cmd.envs(opts.env.iter().map(|(k, v)| (k, v)));
    // Settings must come from the flags above only, not from the developer's environment.
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("GRANARY_") {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("spawning {}", bin.display()))
}

/// `$GRANARY_BIN`, else `<workspace>/target/release/granary`.
pub fn granary_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("GRANARY_BIN") {
        return PathBuf::from(bin);
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let workspace = manifest.parent().unwrap_or(manifest);
    workspace.join("target").join("release").join("granary")
}

/// `$GRANARY_BENCH_BIN`, else `granary-bench` beside [`granary_bin`].
pub fn bench_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("GRANARY_BENCH_BIN") {
        return PathBuf::from(bin);
    }
    granary_bin().with_file_name("granary-bench")
}

/// Waits until `GET /_granary/health` answers one of `statuses`.
fn wait_healthy(child: &mut Child, addr: SocketAddr, statuses: &[u16]) -> Result<()> {
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = child.try_wait()? {
            bail!("granary exited during start-up with {status}");
        }
        let req = request_bytes("GET", "/_granary/health", addr, &[], b"");
        if let Ok(resp) = raw_request_with_timeout(addr, &req, Duration::from_secs(2)) {
            if statuses.contains(&resp.status) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("GET /_granary/health did not answer {statuses:?} within {START_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn free_port() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?)
}

/// `n` distinct loopback addresses free now, for servers whose addresses must be known
/// before they start (a cluster's peer list). They are drawn at random below the kernel's
/// ephemeral range, where no outgoing connection (and no `:0` bind of a parallel test)
/// takes them meanwhile; each is checked by binding it.
pub fn reserve_ports(n: usize) -> Result<Vec<SocketAddr>> {
    use rand::Rng;
    let ephemeral_low: u16 = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32768);
    if ephemeral_low < 12000 {
        // No room below the ephemeral range: fall back to ports the kernel hands out.
        let held: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0"))
            .collect::<std::io::Result<_>>()?;
        return held
            .iter()
            .map(|l| Ok(l.local_addr()?))
            .collect::<Result<_>>();
    }
    let mut rng = rand::thread_rng();
    let mut held = Vec::new();
    for _ in 0..1000 {
        if held.len() == n {
            break;
        }
        let port = rng.gen_range(10000..ephemeral_low);
        if let Ok(l) = TcpListener::bind(("127.0.0.1", port)) {
            held.push(l);
        }
    }
    if held.len() < n {
        bail!("could not find {n} free loopback ports");
    }
    held.iter().map(|l| Ok(l.local_addr()?)).collect()
}

/// Every file (not directory) under `dir`, recursively, skipping the subtree `skip`.
pub fn list_files(dir: &Path, skip: Option<&Path>) -> HashSet<PathBuf> {
    let mut out = HashSet::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if Some(path.as_path()) == skip {
                continue;
            }
            match entry.file_type() {
                Ok(t) if t.is_dir() => stack.push(path),
                Ok(_) => {
                    out.insert(path);
                }
                Err(_) => {}
            }
        }
    }
    out
}

/// A field of `/proc/PID/status` in KiB (`VmHWM:`, `RssAnon:`).
fn status_kib(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// The highest `RssAnon` of a server seen since [`Server::watch_anon`].
pub struct AnonPeak {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<u64>,
}

impl AnonPeak {
    /// Stops sampling: the peak in KiB (0 if no sample was read).
    pub fn peak_kib(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap_or(0)
    }
}
