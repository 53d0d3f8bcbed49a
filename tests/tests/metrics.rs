//! The node's counters through the real binary: `/_granary/stats` (JSON) and
//! `/_granary/metrics` (the Prometheus exposition: Prometheus text, or OpenMetrics where
//! the scraper asks for it) are two views of one table, so after a known run of reads
//! both say the same numbers, under their own names.

use anyhow::Result;
use granary_tests::{raw_request_blocking, request_bytes, Pattern, Server, ServerOpts};

const BUCKET: &str = "metrics";

/// The value of the sample `name{node="ID"}` in an exposition.
fn sample(text: &str, name: &str, node: &str) -> Option<f64> {
    let prefix = format!("{name}{{node=\"{node}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.parse().ok())
}

#[test]
fn stats_and_metrics_say_the_same_numbers() -> Result<()> {
    let server = Server::start(ServerOpts::open())?;
    let dir = server.data_dir().join("origin").join(BUCKET);
    std::fs::create_dir_all(&dir)?;
    let sizes = [1000usize, 70_000, 300_000];
    for (i, n) in sizes.iter().enumerate() {
        std::fs::write(
            dir.join(format!("k{i}")),
            Pattern::new(i as u64).bytes(0, *n),
        )?;
    }
    let get = |path: &str| -> Result<u16> {
        let req = request_bytes("GET", path, server.addr(), &[], b"");
        Ok(raw_request_blocking(server.addr(), &req)?.status)
    };
    for i in 0..sizes.len() {
        assert_eq!(get(&format!("/{BUCKET}/k{i}"))?, 200);
    }
    // Only reads that start after a fill commits are hits.
    for _ in 0..200 {
        if server.stats()?["reserved_bytes"] == 0 && server.stats()?["objects"] == 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for i in 0..sizes.len() {
        assert_eq!(get(&format!("/{BUCKET}/k{i}"))?, 200);
    }
    assert_eq!(get(&format!("/{BUCKET}/missing"))?, 404);

    let stats = server.stats()?;
    // What Prometheus itself sends.
    let om = [(
        "Accept",
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    )];
    let req = request_bytes("GET", "/_granary/metrics", server.addr(), &om, b"");
    let resp = raw_request_blocking(server.addr(), &req)?;
    assert_eq!(resp.status, 200);
    assert!(
        resp.header("content-type")
            .is_some_and(|t| t.starts_with("application/openmetrics-text")),
        "{:?}",
        resp.header("content-type")
    );
    let text = resp.text();
    assert!(text.ends_with("# EOF\n"), "an exposition ends with # EOF");
    let node = stats["node_id"].as_str().unwrap();
    let total: usize = sizes.iter().sum();
    for (field, metric, want) in [
        ("hits", "granary_cache_hits_total", 3),
        ("misses", "granary_cache_misses_total", 3),
        ("bypasses", "granary_cache_bypasses_total", 0),
        ("errors", "granary_errors_total", 1),
        ("bytes_from_backend", "granary_backend_bytes_total", total),
        ("objects", "granary_cache_objects", 3),
        ("used_bytes", "granary_cache_used_bytes", total),
    ] {
        assert_eq!(stats[field], want, "{field}");
        assert_eq!(sample(&text, metric, node), Some(want as f64), "{metric}");
    }
    // The counters' own help and kind, and the request histogram over every request so
    // far (the stats request included, the scrape itself not yet done).
    assert!(text.contains("# TYPE granary_cache_hits counter\n"));
    assert!(text.contains("# TYPE granary_cache_used_bytes gauge\n"));
    let served = sample(&text, "granary_request_duration_seconds_count", node).unwrap();
    assert!(served >= 10.0, "{served}");
    let inf =
        format!("granary_request_duration_seconds_bucket{{node=\"{node}\",le=\"+Inf\"}} {served}");
    assert!(text.lines().any(|l| l == inf), "{inf}");

    // A scraper that names no format, or asks for Prometheus text, gets Prometheus text:
    // the same samples, each counter's family named as its samples, no `# EOF`.
    for headers in [&[][..], &[("Accept", "text/plain; version=0.0.4")][..]] {
        let req = request_bytes("GET", "/_granary/metrics", server.addr(), headers, b"");
        let resp = raw_request_blocking(server.addr(), &req)?;
        assert_eq!(resp.status, 200);
        assert_eq!(
            resp.header("content-type"),
            Some("text/plain; version=0.0.4; charset=utf-8")
        );
        let plain = resp.text();
        assert!(!plain.contains("# EOF"), "{plain}");
        assert!(plain.contains("# TYPE granary_cache_hits_total counter\n"));
        assert!(plain.contains("# HELP granary_cache_hits_total "));
        assert!(plain.contains("# TYPE granary_cache_used_bytes gauge\n"));
        assert_eq!(sample(&plain, "granary_cache_hits_total", node), Some(3.0));
        assert_eq!(
            sample(&plain, "granary_backend_bytes_total", node),
            Some(total as f64)
        );
    }
    Ok(())
}
