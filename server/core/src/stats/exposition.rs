//! The Prometheus view of a [`Snapshot`]: a `prometheus-client` collector that writes
//! every row of the table (and the latency histogram) as the snapshot holds it, into a
//! registry prefixed `granary` and labelled with the node's id.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use super::{Kind, Snapshot, LATENCY, LATENCY_BUCKETS, ROWS};

/// A snapshot, written on a scrape.
#[derive(Debug)]
struct Rows(Snapshot);

impl Collector for Rows {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for r in ROWS {
            let v = self.0.get(r.metric);
            match r.kind {
                Kind::Counter => {
                    let c = ConstCounter::new(v);
                    c.encode(encoder.encode_descriptor(r.name, r.help, None, c.metric_type())?)?;
                }
                Kind::Seconds => {
                    let c = ConstCounter::new(v as f64 / 1e6);
                    c.encode(encoder.encode_descriptor(r.name, r.help, None, c.metric_type())?)?;
                }
                Kind::Gauge => {
                    let g = ConstGauge::new(v);
                    g.encode(encoder.encode_descriptor(r.name, r.help, None, g.metric_type())?)?;
                }
            }
        }
        let h = self.0.latency();
        // The encoder sums the buckets itself: each bucket's own count, `+Inf` last.
        let mut below = 0;
        let buckets: Vec<(f64, u64)> = h
            .counts
            .iter()
            .enumerate()
            .map(|(i, &cumulative)| {
                let bound = LATENCY_BUCKETS.get(i).copied().unwrap_or(f64::MAX);
                let own = cumulative - below;
                below = cumulative;
                (bound, own)
            })
            .collect();
        let total = h.counts.last().copied().unwrap_or(0);
        encoder
            .encode_descriptor(LATENCY.0, LATENCY.1, None, MetricType::Histogram)?
            .encode_histogram::<prometheus_client::encoding::NoLabelSet>(
                h.sum, total, &buckets, None,
            )
    }
}

/// The OpenMetrics text of `snap`, every series labelled `node="ID"`.
pub(super) fn write(snap: &Snapshot, node: &str) -> String {
    let mut registry = Registry::with_prefix_and_labels(
        "granary",
        [("node".into(), node.to_owned().into())].into_iter(),
    );
    registry.register_collector(Box::new(Rows(snap.clone())));
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// Prometheus text (0.0.4) from the OpenMetrics text `om` the collector writes: the same
/// samples, a counter's family named as its samples are (`_total`), no `# UNIT` and no
/// `# EOF` (prometheus-client writes OpenMetrics only).
pub(super) fn to_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len() + 8 * counters.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| line.strip_prefix(p).map(|rest| (p, rest)));
        match meta {
            Some((p, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(p);
                out.push_str(name);
                if counters.contains(name) {
                    out.push_str("_total");
                }
                if !tail.is_empty() {
                    out.push(' ');
                    out.push_str(tail);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}
