//! The edge's Prometheus metrics, kept in a `prometheus-client` [`Registry`] and rendered in
//! the Prometheus text format (version 0.0.4) when scraped.
//!
//! The request path only adds to atomics: every counter is a handle taken once, when the
//! metrics are built, and the latency histogram is a set of atomic buckets (the crate's own
//! `Histogram` takes a lock per observation).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{prometheus_text, EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// Upper bounds of the latency histogram, seconds.
const BUCKETS: [f64; 12] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
];

/// The `code` label of `ployz_edge_requests_total`, by status class: "none" (no response),
/// then 1xx to 5xx.
const STATUS_CLASSES: [&str; 6] = ["none", "1xx", "2xx", "3xx", "4xx", "5xx"];
/// Why a TLS handshake failed, as the `reason` label says it.
const HANDSHAKE_FAILURES: [&str; 2] = ["failed", "timeout"];

/// The metrics the edge keeps.
#[derive(Debug)]
pub struct EdgeMetrics {
    /// What a scrape renders: every metric below, registered once.
    registry: Registry,
    /// Requests by status class, indexed as [`STATUS_CLASSES`].
    by_class: [Counter; STATUS_CLASSES.len()],
    latency: LatencyHistogram,
    /// Requests that failed to connect to or get an answer from an upstream.
    upstream_errors: Counter,
    /// TLS handshakes that failed, indexed as [`HANDSHAKE_FAILURES`].
    tls_handshake_failures: [Counter; HANDSHAKE_FAILURES.len()],
    /// Set from the route table at each scrape.
    route_table_generation: Gauge<u64, AtomicU64>,
    /// Set from the route table at each scrape.
    route_table_hostnames: Gauge<u64, AtomicU64>,
}

impl Default for EdgeMetrics {
    fn default() -> EdgeMetrics {
        let by_class: [Counter; STATUS_CLASSES.len()] = Default::default();
        let latency = LatencyHistogram::default();
        let upstream_errors = Counter::default();
        let tls_handshake_failures: [Counter; HANDSHAKE_FAILURES.len()] = Default::default();
        let route_table_generation = Gauge::<u64, AtomicU64>::default();
        let route_table_hostnames = Gauge::<u64, AtomicU64>::default();
        // Names without the `_total` a counter's samples get; help without the `.` the
        // registry appends.
        let mut registry = Registry::default();
        registry.register(
            "ployz_edge_requests",
            "Requests the edge answered, by status class",
            LabelledCounters {
                label: "code",
                values: STATUS_CLASSES,
                counters: by_class.clone(),
            },
        );
        registry.register(
            "ployz_edge_request_duration_seconds",
            "Time from request to response end",
            latency.clone(),
        );
        registry.register(
            "ployz_edge_upstream_errors",
            "Requests whose upstream failed",
            upstream_errors.clone(),
        );
        registry.register(
            "ployz_edge_tls_handshake_failures",
            "TLS handshakes that failed (no protocol or certificate in common, or broken off) or \
             did not end within the header timeout",
            LabelledCounters {
                label: "reason",
                values: HANDSHAKE_FAILURES,
                counters: tls_handshake_failures.clone(),
            },
        );
        registry.register(
            "ployz_edge_route_table_generation",
            "Generation of the published route table",
            route_table_generation.clone(),
        );
        registry.register(
            "ployz_edge_route_table_hostnames",
            "Ingress Hostnames with a route",
            route_table_hostnames.clone(),
        );
        EdgeMetrics {
            registry,
            by_class,
            latency,
            upstream_errors,
            tls_handshake_failures,
            route_table_generation,
            route_table_hostnames,
        }
    }
}

impl EdgeMetrics {
    /// Records one finished request: a status of 0 (or outside 100..600) counts as "none".
    pub fn observe(&self, status: u16, seconds: f64, upstream_error: bool) {
        let class = if (100..600).contains(&status) {
            (status / 100) as usize
        } else {
            0
        };
        self.by_class[class].inc();
        self.latency.observe(seconds);
        if upstream_error {
            self.upstream_errors.inc();
        }
    }

    /// Counts one failed TLS handshake: `timed_out`, or refused or broken off.
    pub fn tls_handshake_failed(&self, timed_out: bool) {
        self.tls_handshake_failures[usize::from(timed_out)].inc();
    }

    /// The text exposition, with the route table's generation and hostname count alongside.
    pub fn render(&self, route_table_generation: u64, hostnames: usize) -> String {
        self.route_table_generation.set(route_table_generation);
        self.route_table_hostnames
            .set(u64::try_from(hostnames).unwrap_or(u64::MAX));
        let mut out = String::new();
        // Writing to a String cannot fail, and nothing registered here fails to encode.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        out
    }
}

/// One counter per value of a single label, rendered as one family in the order of `values`:
/// a request increments its counter through a handle, with no label lookup.
#[derive(Debug)]
struct LabelledCounters<const N: usize> {
    label: &'static str,
    values: [&'static str; N],
    counters: [Counter; N],
}

impl<const N: usize> EncodeMetric for LabelledCounters<N> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (value, counter) in self.values.iter().zip(&self.counters) {
            let labels = [(self.label, *value)];
            counter.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Counter
    }
}

/// The request latency histogram: one atomic count per bucket of [`BUCKETS`] plus one over
/// the last, and the sum in microseconds. Clones share the counts.
#[derive(Debug, Clone, Default)]
struct LatencyHistogram {
    inner: Arc<LatencyCounts>,
}

#[derive(Debug, Default)]
struct LatencyCounts {
    /// Observations per bucket (not cumulative); the last is over every bound.
    buckets: [AtomicU64; BUCKETS.len() + 1],
    sum_micros: AtomicU64,
}

impl LatencyHistogram {
    fn observe(&self, seconds: f64) {
        let bucket = BUCKETS
            .iter()
            .position(|b| seconds <= *b)
            .unwrap_or(BUCKETS.len());
        self.inner.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        self.inner
            .sum_micros
            .fetch_add((seconds * 1_000_000.0) as u64, Ordering::Relaxed);
    }
}

impl EncodeMetric for LatencyHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let mut buckets = [(f64::INFINITY, 0); BUCKETS.len() + 1];
        for (((bound, count), upper), counted) in buckets
            .iter_mut()
            .zip(BUCKETS.iter().chain([&f64::INFINITY]))
            .zip(&self.inner.buckets)
        {
            *bound = *upper;
            *count = counted.load(Ordering::Relaxed);
        }
        // The count is the buckets' total, so the `+Inf` bucket always equals it.
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.inner.sum_micros.load(Ordering::Relaxed) as f64 / 1_000_000.0;
        encoder.encode_histogram::<NoLabelSet>(
            sum,
            count,
            &buckets,
            None::<&HashMap<usize, Exemplar<NoLabelSet, f64>>>,
        )
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
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

    /// Names, types, help texts, labels and bucket bounds as dashboards read them.
    #[test]
    fn renders_the_documented_exposition() {
        let m = EdgeMetrics::default();
        m.observe(0, 0.0, true);
        m.observe(101, 1.5, false);
        m.observe(302, 0.01, false);
        m.tls_handshake_failed(false);
        m.tls_handshake_failed(true);
        m.tls_handshake_failed(false);
        let expected = "\
# HELP ployz_edge_requests_total Requests the edge answered, by status class.
# TYPE ployz_edge_requests_total counter
ployz_edge_requests_total{code=\"none\"} 1
ployz_edge_requests_total{code=\"1xx\"} 1
ployz_edge_requests_total{code=\"2xx\"} 0
ployz_edge_requests_total{code=\"3xx\"} 1
ployz_edge_requests_total{code=\"4xx\"} 0
ployz_edge_requests_total{code=\"5xx\"} 0
# HELP ployz_edge_request_duration_seconds Time from request to response end.
# TYPE ployz_edge_request_duration_seconds histogram
ployz_edge_request_duration_seconds_bucket{le=\"0.001\"} 1
ployz_edge_request_duration_seconds_bucket{le=\"0.0025\"} 1
ployz_edge_request_duration_seconds_bucket{le=\"0.005\"} 1
ployz_edge_request_duration_seconds_bucket{le=\"0.01\"} 2
ployz_edge_request_duration_seconds_bucket{le=\"0.025\"} 2
ployz_edge_request_duration_seconds_bucket{le=\"0.05\"} 2
ployz_edge_request_duration_seconds_bucket{le=\"0.1\"} 2
ployz_edge_request_duration_seconds_bucket{le=\"0.25\"} 2
ployz_edge_request_duration_seconds_bucket{le=\"0.5\"} 2
ployz_edge_request_duration_seconds_bucket{le=\"1\"} 2
ployz_edge_request_duration_seconds_bucket{le=\"2.5\"} 3
ployz_edge_request_duration_seconds_bucket{le=\"10\"} 3
ployz_edge_request_duration_seconds_bucket{le=\"+Inf\"} 3
ployz_edge_request_duration_seconds_sum 1.51
ployz_edge_request_duration_seconds_count 3
# HELP ployz_edge_upstream_errors_total Requests whose upstream failed.
# TYPE ployz_edge_upstream_errors_total counter
ployz_edge_upstream_errors_total 1
# HELP ployz_edge_tls_handshake_failures_total TLS handshakes that failed (no protocol or certificate in common, or broken off) or did not end within the header timeout.
# TYPE ployz_edge_tls_handshake_failures_total counter
ployz_edge_tls_handshake_failures_total{reason=\"failed\"} 2
ployz_edge_tls_handshake_failures_total{reason=\"timeout\"} 1
# HELP ployz_edge_route_table_generation Generation of the published route table.
# TYPE ployz_edge_route_table_generation gauge
ployz_edge_route_table_generation 12
# HELP ployz_edge_route_table_hostnames Ingress Hostnames with a route.
# TYPE ployz_edge_route_table_hostnames gauge
ployz_edge_route_table_hostnames 0
";
        assert_eq!(m.render(12, 0), expected);
    }
}
