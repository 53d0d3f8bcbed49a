//! `granary-bench soak`, briefly: the bench starts a node, kills it with SIGKILL and
//! restarts it twice while 4 workers write, delete and read; every byte read must be what
//! was written and no acknowledged write may be lost. And the cluster soak: three members
//! over moto behind the fault proxy, one killed and restarted, one joining and one leaving
//! under the load. (The long runs are recorded in docs/reliability.md.)

use std::process::{Command, Stdio};
use std::time::Duration;

use granary_tests::{bench_bin, granary_bin, reserve_ports, Fault, FaultProxy, Moto};

#[test]
fn a_short_soak_with_restarts_reads_back_every_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let addr = reserve_ports(1).unwrap()[0];
    let json = dir.path().join("soak.json");
    let data = dir.path().join("data");
    let out = Command::new(bench_bin())
        .args(["soak", "--endpoint", &format!("http://{addr}")])
        .args(["--duration", "9s", "--workers", "4", "--keys", "200"])
        .args(["--object-size", "1KiB-128KiB", "--restart-every", "3s"])
        .arg("--granary")
        .arg(granary_bin())
        .args(["--serve-arg=--listen", &format!("--serve-arg={addr}")])
        .arg("--serve-arg=--data-dir")
        .arg(format!("--serve-arg={}", data.display()))
        .arg("--node-log")
        .arg(dir.path().join("node.log"))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("running granary-bench soak");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["mismatches"], 0, "{text}");
    assert_eq!(r["lost_writes"], 0, "{text}");
    assert_eq!(r["errors"], 0, "{text}");
    assert!(r["restarts"].as_u64() >= Some(2), "{text}");
    assert!(
        r["puts"].as_u64() > Some(100) && r["gets"].as_u64() > Some(100),
        "{text}"
    );
    assert!(r["rss_max_kib"].as_u64() > Some(0), "{text}");
    assert!(r["anon_max_kib"].as_u64() > Some(0), "{text}");
}

/// Three members whose backend is moto behind the fault proxy (object reads slowed, or
/// refused with `503 SlowDown` for the members' S3 client to retry, all along). Under
/// GET/PUT/DELETE load through every member, a member is killed and restarted, a fourth
/// joins through the peers file and one leaves. No read returns bytes that were not the
/// last acknowledged write, no acknowledged write is lost, no read fails but in the
/// moments after the kill, every key reads back right at the end, and once rebalance has
/// settled the members cache about one copy of each object. 5% of the requests are
/// writes straight to the bucket in moto, with the members revalidating after 1 s: no
/// read that starts 2 s after one returns the key's earlier state.
#[test]
fn a_short_cluster_soak_through_churn_and_backend_faults() {
    let moto = Moto::start().expect("moto");
    let proxy = FaultProxy::start(moto.addr()).expect("fault proxy");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("soak.json");
    let secs = std::env::var("GRANARY_CLUSTER_SOAK_SECS").unwrap_or_else(|_| "30".into());
    let mut bench = Command::new(bench_bin())
        .args(["soak", "--cluster", "3", "--churn", "--duration"])
        .arg(format!("{secs}s"))
        .args([
            "--workers",
            "4",
            "--keys",
            "300",
            "--object-size",
            "1KiB-128KiB",
        ])
        .arg("--granary")
        .arg(granary_bin())
        .arg("--cluster-dir")
        .arg(dir.path().join("cluster"))
        .args([
            "--serve-arg=--backend",
            "--serve-arg=s3",
            "--serve-arg=--s3-endpoint",
        ])
        .arg(format!("--serve-arg={}", proxy.url()))
        // Writes straight to the bucket too, seen within a second of revalidation.
        .args(["--serve-arg=--revalidate-after", "--serve-arg=1s"])
        .arg("--direct-endpoint")
        .arg(moto.url())
        .args(["--direct-pct", "5", "--direct-bound", "2s"])
        .arg("--json")
        .arg(&json)
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_DEFAULT_REGION", "us-east-1")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running granary-bench soak");
    // Faults all along: slow answers, and refusals the S3 client retries.
    let mut round = 0u32;
    while bench.try_wait().expect("the bench").is_none() {
        round += 1;
        if round.is_multiple_of(2) {
            proxy.inject(Fault::Status(503), 1);
        } else {
            proxy.inject(Fault::Delay(Duration::from_millis(200)), 3);
        }
        std::thread::sleep(Duration::from_millis(700));
    }
    let out = bench.wait_with_output().expect("the bench's output");
    let text = String::from_utf8_lossy(&out.stdout);
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}\n{log}");
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["mismatches"], 0, "{text}");
    assert_eq!(r["lost_writes"], 0, "{text}");
    assert_eq!(r["errors"], 0, "{text}");
    assert_eq!(r["failed_reads"], 0, "{text}");
    assert_eq!(r["swept"], 300, "{text}");
    assert_eq!(r["events"].as_array().map(Vec::len), Some(4), "{text}");
    assert!(
        r["cached_over_distinct"].as_f64().unwrap_or(9.0) <= 1.05,
        "{text}"
    );
    assert!(
        r["puts"].as_u64() > Some(50) && r["gets"].as_u64() > Some(50),
        "{text}"
    );
    assert!(proxy.spoiled() > 0, "faults were injected");
    assert!(r["direct_writes"].as_u64() > Some(0), "{text}");
    eprintln!(
        "{text}membership: {}\nbackend object GETs {}, spoiled by the fault proxy {}",
        r["events"],
        proxy.gets(),
        proxy.spoiled()
    );
}
