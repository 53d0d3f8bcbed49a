//! `granary-bench soak`, briefly: the bench starts a node, kills it with SIGKILL and
//! restarts it twice while 4 workers write, delete and read; every byte read must be what
//! was written and no acknowledged write may be lost. (The 10-minute run is recorded in
//! docs/reliability.md.)

use std::process::Command;

use granary_tests::{bench_bin, granary_bin, reserve_ports};

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
}
