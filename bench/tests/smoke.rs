//! End to end: a real `granary serve`, objects written and read back by the built
//! `granary-bench`, and the JSON report's numbers checked.
//!
//! The server binary is `$GRANARY_BIN`, else `granary` beside this test's bench binary
//! (the workspace's target directory); the test says so and passes when neither exists,
//! so `cargo test -p granary-bench` works before the server is built.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const BENCH: &str = env!("CARGO_BIN_EXE_granary-bench");

struct Server {
    child: Child,
    endpoint: String,
    _dir: tempfile::TempDir,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn granary_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("GRANARY_BIN") {
        return Some(PathBuf::from(p));
    }
    let beside = Path::new(BENCH).with_file_name("granary");
    beside.exists().then_some(beside)
}

fn health(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /_granary/health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    if s.write_all(req.as_bytes()).is_err() {
        return false;
    }
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.starts_with("HTTP/1.1 200")
}

fn start(bin: &Path) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let child = Command::new(bin)
        .args(["serve", "--listen", &addr, "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", bin.display()));
    let server = Server {
        child,
        endpoint: format!("http://{addr}"),
        _dir: dir,
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while !health(&addr) {
        assert!(
            Instant::now() < deadline,
            "granary did not come up on {addr}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    server
}

/// Polls `/_granary/stats` until the cache holds `n` objects.
fn wait_committed(server: &Server, n: u64) {
    let addr = server.endpoint.trim_start_matches("http://");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut s = TcpStream::connect(addr).unwrap();
        let req =
            format!("GET /_granary/stats HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        s.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        let body = out.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        let objects = serde_json::from_str::<Value>(body)
            .ok()
            .and_then(|v| v["objects"].as_u64())
            .unwrap_or(0);
        if objects >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "only {objects} of {n} objects committed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn bench(server: &Server, args: &[&str]) -> Value {
    let json = tempfile::NamedTempFile::new().unwrap();
    let out = Command::new(BENCH)
        .args(["run", "--endpoint", &server.endpoint, "--bucket", "smoke"])
        .args(["--workers", "4", "--progress", "false", "--json"])
        .arg(json.path())
        .args(args)
        .args(if args.contains(&"--prefix") {
            &[][..]
        } else {
            &["--prefix", "s/"][..]
        })
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "granary-bench {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&std::fs::read_to_string(json.path()).unwrap()).unwrap()
}

#[test]
fn put_then_two_epochs_of_gets() {
    let bin = granary_bin().expect(
        "no granary binary: build the workspace (`cargo build --release`) or set GRANARY_BIN",
    );
    let server = start(&bin);
    const N: u64 = 8;
    const SIZE: u64 = 64 * 1024;

    let put = bench(
        &server,
        &[
            "--pct-put",
            "100",
            "--objects",
            "8",
            "--object-size",
            "64KiB",
            "--epochs",
            "1",
            "--verify",
        ],
    );
    assert_eq!(put["puts"], N);
    assert_eq!(put["bytes_written"], N * SIZE);
    assert_eq!(put["errors"]["total"], 0);
    assert_eq!(put["verify"]["checked"], N);
    assert_eq!(put["verify"]["mismatched"], 0);
    // The PUTs were cached on the way; their entries commit just after each answer.
    wait_committed(&server, N);

    // Objects laid straight into the backend directory are cold. Epoch 1 misses every
    // one of them; the epoch-end snapshot waits for the fills to commit, so epoch 2 hits
    // every one, and the per-epoch backend bytes say so.
    let cold_dir = server._dir.path().join("origin/smoke/c");
    std::fs::create_dir_all(&cold_dir).unwrap();
    for i in 0..N {
        std::fs::write(
            cold_dir.join(format!("{i:03}")),
            vec![i as u8; SIZE as usize],
        )
        .unwrap();
    }
    let plot = tempfile::Builder::new().suffix(".svg").tempfile().unwrap();
    let cold = bench(
        &server,
        &[
            "--prefix",
            "c/",
            "--epochs",
            "2",
            "--plot",
            plot.path().to_str().unwrap(),
        ],
    );
    assert_eq!(cold["config"]["objects"], N);
    assert_eq!(cold["requests"], N * 2);
    assert_eq!(cold["bytes_read"], N * 2 * SIZE);
    let epochs = cold["epochs"].as_array().unwrap();
    assert_eq!(epochs[0]["cache"]["miss"], N, "{}", epochs[0]);
    assert_eq!(epochs[1]["cache"]["hit"], N, "{}", epochs[1]);
    let (d1, d2) = (
        &epochs[0]["server_stats_delta"],
        &epochs[1]["server_stats_delta"],
    );
    assert_eq!(d1["bytes_from_backend"], N * SIZE, "{d1}");
    assert_eq!(d1["used_bytes"], N * SIZE, "{d1}");
    assert_eq!(d2["bytes_from_backend"], 0, "{d2}");
    assert_eq!(d2["hits"], N, "{d2}");
    let svg = std::fs::read_to_string(plot.path()).unwrap();
    assert!(
        svg.starts_with("<svg") && svg.contains("MB/s"),
        "{svg:.200}"
    );
    assert!(!cold["timeline"].as_array().unwrap().is_empty());
    let dist = cold["latency_distribution"].as_array().unwrap();
    assert_eq!(dist.len(), 16);
    assert!(dist
        .windows(2)
        .all(|w| w[0]["micros"].as_u64() <= w[1]["micros"].as_u64()));

    let get = bench(
        &server,
        &[
            "--epochs",
            "2",
            "--verify",
            "--gpus",
            "2",
            "--gpu-rate",
            "1TB/s",
        ],
    );
    assert_eq!(get["config"]["objects"], N);
    assert_eq!(get["requests"], N * 2);
    assert_eq!(get["gets"], N * 2);
    assert_eq!(get["bytes_read"], N * 2 * SIZE);
    assert_eq!(get["errors"]["total"], 0);
    assert_eq!(get["verify"]["checked"], N * 2);
    let epochs = get["epochs"].as_array().unwrap();
    assert_eq!(epochs.len(), 2);
    for e in epochs {
        assert_eq!(e["requests"], N);
        assert_eq!(e["bytes_read"], N * SIZE);
        assert_eq!(e["hit_ratio"].as_f64(), Some(1.0), "{e}");
        assert_eq!(e["cache"]["hit"], N);
    }
    assert_eq!(get["hit_ratio"].as_f64(), Some(1.0));
    let delta = &get["server_stats_delta"];
    assert_eq!(delta["hits"], N * 2);
    assert_eq!(delta["misses"], 0);
    assert_eq!(delta["bytes_from_backend"], 0);
    // 2 TB/s of demand is never met on loopback: the group stalls, and feeds no GPU.
    let stall = get["stall"]["stall_fraction"].as_f64().unwrap();
    assert!(stall > 0.9 && stall <= 1.0, "{stall}");
    assert_eq!(get["stall"]["max_gpus"], 0);

    let ranged = bench(
        &server,
        &[
            "--objects",
            "8",
            "--object-size",
            "64KiB",
            "--range-size",
            "1KiB",
        ],
    );
    assert_eq!(ranged["requests"], N);
    assert_eq!(ranged["bytes_read"], N * 1024);
    assert_eq!(ranged["errors"]["total"], 0);
}
