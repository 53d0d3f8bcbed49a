//! `granary-bench` against the three kinds of target it serves: Granary requiring SigV4,
//! an S3 server reached directly (moto, which refuses anonymous reads), and a plain HTTP
//! server (Python's `http.server`, standing in for nginx). Each run's JSON report is
//! checked against the bytes laid out.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use granary_tests::{bench_bin, Moto, Server, ServerOpts, ACCESS, SECRET};
use serde_json::Value;

/// Runs `granary-bench ARGS --json F`; returns whether it succeeded, the report (when
/// written) and its output. AWS credentials from the environment never leak in.
fn bench(args: &[&str]) -> (bool, Value, String) {
    let json = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(bench_bin())
        .args(args)
        .args(["--progress", "false", "--json"])
        .arg(json.path())
        .env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bench_bin().display()));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let report = std::fs::read_to_string(json.path())
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    (out.status.success(), report, text)
}

fn ok(args: &[&str]) -> Value {
    let (success, report, text) = bench(args);
    assert!(success, "granary-bench {args:?} failed:\n{text}");
    report
}

fn u(v: &Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// PUTs of seeded sizes, then reads of the listing, both signed and verified; then the
/// same reads unsigned, which the server refuses.
fn signed_round_trip(endpoint: &str, access: &str, secret: &str, bucket: &str) {
    let creds = ["--access-key", access, "--secret-key", secret];
    let target = ["--endpoint", endpoint, "--bucket", bucket, "--prefix", "p/"];
    let put = ok(&[
        &["run"][..],
        &target,
        &creds,
        &[
            "--objects",
            "6",
            "--object-size",
            "32KiB-96KiB",
            "--pct-put",
            "100",
            "--verify",
            "--workers",
            "3",
        ],
    ]
    .concat());
    assert_eq!(u(&put["puts"]), 6);
    assert_eq!(u(&put["errors"]["total"]), 0, "{put}");
    assert_eq!(u(&put["verify"]["checked"]), 6);
    assert_eq!(u(&put["verify"]["mismatched"]), 0);
    let written = u(&put["bytes_written"]);
    assert!(
        (6 * 32 * 1024..=6 * 96 * 1024).contains(&written),
        "{written}"
    );

    // The object set from a signed ListObjectsV2; every body checked against its ETag.
    let get = ok(&[
        &["run"][..],
        &target,
        &creds,
        &["--epochs", "2", "--verify"],
    ]
    .concat());
    assert_eq!(u(&get["config"]["objects"]), 6);
    assert_eq!(u(&get["config"]["object_bytes_total"]), written);
    assert_eq!(u(&get["gets"]), 12);
    assert_eq!(u(&get["bytes_read"]), 2 * written);
    assert_eq!(u(&get["errors"]["total"]), 0, "{get}");
    assert_eq!(u(&get["verify"]["checked"]), 12);
    assert_eq!(u(&get["verify"]["mismatched"]), 0);

    // Unsigned, every read is refused: the bench counts 403s and exits non-zero.
    let (success, report, text) = bench(
        &[
            &["run"][..],
            &target,
            &["--objects", "6", "--object-size", "32KiB"],
        ]
        .concat(),
    );
    assert!(!success, "unsigned reads succeeded:\n{text}");
    assert_eq!(u(&report["errors"]["by_status"]["403"]), 6, "{text}");
    assert_eq!(u(&report["bytes_read"]), 0);
}

#[test]
fn granary_with_credentials() {
    let server = Server::start(ServerOpts::with_credentials()).unwrap();
    let endpoint = server.url();
    signed_round_trip(&endpoint, ACCESS, SECRET, "signed");
    // A wrong secret is refused as well.
    let (success, report, _) = bench(&[
        "get",
        "--endpoint",
        &endpoint,
        "--path",
        "/signed/p/000000",
        "--duration",
        "300ms",
        "--access-key",
        ACCESS,
        "--secret-key",
        "wrong-secret",
    ]);
    assert!(!success);
    assert!(u(&report["errors"]["by_status"]["403"]) > 0, "{report}");
}

#[test]
fn s3_server_directly() {
    let moto = Moto::start().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(moto.client().create_bucket().bucket("direct").send())
        .unwrap();
    signed_round_trip(&moto.url(), "testing", "testing", "direct");
}

/// `python3 -m http.server` over a directory, killed on drop.
struct PlainHttp {
    child: Child,
    addr: SocketAddr,
}

impl PlainHttp {
    /// The port is free when picked, but another test's server may take it before
    /// http.server binds it: then the connection reaches that server and http.server
    /// exits, so a server that is not still running after the connection is started
    /// again on another port.
    fn start(root: &Path) -> PlainHttp {
        for _ in 0..5 {
            let addr = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap();
            let mut child = Command::new("python3")
                .args(["-m", "http.server", "--bind", "127.0.0.1"])
                .arg(addr.port().to_string())
                .current_dir(root)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("python3 -m http.server");
            let deadline = Instant::now() + Duration::from_secs(20);
            while TcpStream::connect(addr).is_err() && child.try_wait().unwrap().is_none() {
                assert!(Instant::now() < deadline, "http.server did not start");
                std::thread::sleep(Duration::from_millis(50));
            }
            std::thread::sleep(Duration::from_millis(100));
            if child.try_wait().unwrap().is_none() {
                return PlainHttp { child, addr };
            }
        }
        panic!("http.server could not bind a port in five tries");
    }
}

impl Drop for PlainHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn plain_http_server() {
    const N: u64 = 5;
    const SIZE: u64 = 10 * 1024;
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("bkt")).unwrap();
    for i in 0..N {
        std::fs::write(
            dir.path().join(format!("bkt/k{i:06}")),
            vec![b'a' + i as u8; SIZE as usize],
        )
        .unwrap();
    }
    let http = PlainHttp::start(dir.path());
    let endpoint = format!("http://{}", http.addr);
    // Generated names `k000000…` over two epochs: every byte, no cache labels, no stats.
    let run = ok(&[
        "run",
        "--endpoint",
        &endpoint,
        "--bucket",
        "bkt",
        "--prefix",
        "k",
        "--objects",
        "5",
        "--object-size",
        "10KiB",
        "--epochs",
        "2",
        "--workers",
        "2",
    ]);
    assert_eq!(u(&run["gets"]), 2 * N);
    assert_eq!(u(&run["bytes_read"]), 2 * N * SIZE);
    assert_eq!(u(&run["errors"]["total"]), 0, "{run}");
    assert_eq!(run["hit_ratio"], Value::Null);
    assert_eq!(u(&run["cache"]["none"]), 2 * N);
    assert_eq!(run["server_stats_delta"], Value::Null);
    assert_eq!(run["epochs"].as_array().unwrap().len(), 2);

    // `get` reads one object round and round for a duration.
    let get = ok(&[
        "get",
        "--endpoint",
        &endpoint,
        "--path",
        "/bkt/k000003",
        "--duration",
        "500ms",
        "--workers",
        "2",
    ]);
    let n = u(&get["gets"]);
    assert!(n > 0);
    assert_eq!(u(&get["bytes_read"]), n * SIZE);
    assert_eq!(u(&get["errors"]["total"]), 0);
    assert_eq!(get["epochs"].as_array().unwrap().len(), 1);

    // A missing object is a 404 per request, never a success.
    let (success, report, _) = bench(&[
        "get",
        "--endpoint",
        &endpoint,
        "--path",
        "/bkt/missing",
        "--duration",
        "200ms",
    ]);
    assert!(!success);
    assert!(u(&report["errors"]["by_status"]["404"]) > 0, "{report}");
}
