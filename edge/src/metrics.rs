//! The edge's Prometheus metrics: plain atomics on the request path, rendered as the text
//! exposition format when scraped.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

/// Upper bounds of the latency histogram, seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// Counters the edge keeps.
#[derive(Debug, Default)]
pub struct EdgeMetrics {
    /// Requests by status class: 1xx..5xx, and 0 for "no response".
    by_class: [AtomicU64; 6],
    /// Latency histogram: one count per bucket (cumulative at render), plus +Inf.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    /// Sum of latencies, microseconds.
    sum_micros: AtomicU64,
    /// Requests that failed to connect to or get an answer from an upstream.
    upstream_errors: AtomicU64,
}

impl EdgeMetrics {
    /// Records one finished request.
    pub fn observe(&self, status: u16, seconds: f64, upstream_error: bool) {
        let class = if (100..600).contains(&status) {
            (status / 100) as usize
        } else {
            0
        };
        self.by_class[class].fetch_add(1, Ordering::Relaxed);
        let bucket = BUCKETS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(BUCKETS.len());
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((seconds * 1_000_000.0) as u64, Ordering::Relaxed);
        if upstream_error {
            self.upstream_errors.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The text exposition, with the route table generation alongside.
    pub fn render(&self, route_table_generation: u64, hostnames: usize) -> String {
        let mut out = String::new();
        out.push_str(
            "# HELP ployz_edge_requests_total Requests the edge answered, by status class.\n",
        );
        out.push_str("# TYPE ployz_edge_requests_total counter\n");
        for (i, c) in self.by_class.iter().enumerate() {
            let class = if i == 0 {
                "none".to_owned()
            } else {
                format!("{i}xx")
            };
            let _ = writeln!(
                out,
                "ployz_edge_requests_total{{code=\"{class}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        out.push_str(
            "# HELP ployz_edge_request_duration_seconds Time from request to response end.\n",
        );
        out.push_str("# TYPE ployz_edge_request_duration_seconds histogram\n");
        let mut cumulative = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cumulative += self.buckets[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "ployz_edge_request_duration_seconds_bucket{{le=\"{b}\"}} {cumulative}"
            );
        }
        cumulative += self.buckets[BUCKETS.len()].load(Ordering::Relaxed);
        let _ = writeln!(
            out,
            "ployz_edge_request_duration_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let _ = writeln!(
            out,
            "ployz_edge_request_duration_seconds_sum {}",
            self.sum_micros.load(Ordering::Relaxed) as f64 / 1_000_000.0
        );
        let _ = writeln!(
            out,
            "ployz_edge_request_duration_seconds_count {cumulative}"
        );
        out.push_str("# HELP ployz_edge_upstream_errors_total Requests whose upstream failed.\n");
        out.push_str("# TYPE ployz_edge_upstream_errors_total counter\n");
        let _ = writeln!(
            out,
            "ployz_edge_upstream_errors_total {}",
            self.upstream_errors.load(Ordering::Relaxed)
        );
        out.push_str(
            "# HELP ployz_edge_route_table_generation Generation of the published route table.\n",
        );
        out.push_str("# TYPE ployz_edge_route_table_generation gauge\n");
        let _ = writeln!(
            out,
            "ployz_edge_route_table_generation {route_table_generation}"
        );
        out.push_str("# HELP ployz_edge_route_table_hostnames Ingress Hostnames with a route.\n");
        out.push_str("# TYPE ployz_edge_route_table_hostnames gauge\n");
        let _ = writeln!(out, "ployz_edge_route_table_hostnames {hostnames}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_classes_buckets_and_errors() {
        let m = EdgeMetrics::default();
        m.observe(200, 0.002, false);
        m.observe(404, 0.3, false);
        m.observe(502, 20.0, true);
        let text = m.render(7, 3);
        for line in [
            "ployz_edge_requests_total{code=\"2xx\"} 1",
            "ployz_edge_requests_total{code=\"4xx\"} 1",
            "ployz_edge_requests_total{code=\"5xx\"} 1",
            "ployz_edge_request_duration_seconds_bucket{le=\"0.0025\"} 1",
            "ployz_edge_request_duration_seconds_bucket{le=\"0.5\"} 2",
            "ployz_edge_request_duration_seconds_bucket{le=\"+Inf\"} 3",
            "ployz_edge_request_duration_seconds_count 3",
            "ployz_edge_upstream_errors_total 1",
            "ployz_edge_route_table_generation 7",
            "ployz_edge_route_table_hostnames 3",
        ] {
            assert!(text.lines().any(|l| l == line), "missing {line}:\n{text}");
        }
    }
}
