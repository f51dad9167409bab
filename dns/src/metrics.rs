//! The DNS server's Prometheus metrics: `prometheus-client` counters (plain atomics) on the
//! query path, rendered in the Prometheus text format when scraped.

use prometheus_client::encoding::{prometheus_text, EncodeMetric, MetricEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

use crate::wire::Rcode;

/// Where a query went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuerySource {
    /// Answered from the snapshot: an `.internal` name.
    Internal,
    /// Sent to the upstream resolvers (or refused for want of one).
    Forwarded,
    /// From a source outside the allowed networks.
    Refused,
    /// Not a query this server can answer: unparsable, bad opcode, bad EDNS version.
    Malformed,
}

impl QuerySource {
    /// Every source, in the order metrics render them.
    pub const ALL: [QuerySource; 4] = [
        QuerySource::Internal,
        QuerySource::Forwarded,
        QuerySource::Refused,
        QuerySource::Malformed,
    ];

    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            QuerySource::Internal => "internal",
            QuerySource::Forwarded => "forwarded",
            QuerySource::Refused => "refused",
            QuerySource::Malformed => "malformed",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

fn rcode_index(rcode: Rcode) -> usize {
    Rcode::ALL
        .iter()
        .position(|r| *r == rcode)
        .unwrap_or_default()
}

/// The `rcode` label of `ployz_dns_responses_total`: every code of [`Rcode::ALL`], then
/// `OTHER` for codes this server does not name.
const RESPONSE_CODES: usize = Rcode::ALL.len() + 1;

/// Counters one DNS server keeps, in a `prometheus-client` [`Registry`] rendered in the
/// Prometheus text format (version 0.0.4). Cheap to update from every worker at once: each
/// update is one atomic add through a handle taken when the metrics were built, with no lock
/// and no label lookup.
#[derive(Debug)]
pub struct DnsMetrics {
    /// What a scrape renders: every counter below, registered once.
    registry: Registry,
    /// Indexed as [`QuerySource::ALL`].
    queries: [Counter; QuerySource::ALL.len()],
    /// Indexed as [`Rcode::ALL`], then `OTHER`.
    responses: [Counter; RESPONSE_CODES],
    truncated: Counter,
    dropped: Counter,
    forward_rejected: Counter,
    forward_failed: Counter,
    forward_tcp_retries: Counter,
    tcp_connections: Counter,
    tcp_rejected: Counter,
    cache_hits: Counter,
}

impl Default for DnsMetrics {
    fn default() -> DnsMetrics {
        let queries: [Counter; QuerySource::ALL.len()] = Default::default();
        let responses: [Counter; RESPONSE_CODES] = Default::default();
        let truncated = Counter::default();
        let dropped = Counter::default();
        let forward_rejected = Counter::default();
        let forward_failed = Counter::default();
        let forward_tcp_retries = Counter::default();
        let tcp_connections = Counter::default();
        let tcp_rejected = Counter::default();
        let cache_hits = Counter::default();
        // Names without the `_total` a counter's samples get; help without the `.` the
        // registry appends.
        let mut registry = Registry::default();
        registry.register(
            "ployz_dns_queries",
            "DNS queries received, by where they went",
            LabelledCounters {
                label: "source",
                values: QuerySource::ALL.map(QuerySource::as_str),
                counters: queries.clone(),
            },
        );
        registry.register(
            "ployz_dns_responses",
            "DNS responses sent, by response code",
            LabelledCounters {
                label: "rcode",
                values: std::array::from_fn(|i| Rcode::ALL.get(i).map_or("OTHER", |r| r.as_str())),
                counters: responses.clone(),
            },
        );
        for (name, help, counter) in [
            (
                "ployz_dns_truncated",
                "UDP responses cut to fit and marked TC",
                &truncated,
            ),
            (
                "ployz_dns_dropped",
                "Packets that got no response (too short, responses, junk from strangers)",
                &dropped,
            ),
            (
                "ployz_dns_forward_rejected",
                "Forwarded queries answered SERVFAIL at once: too many forwards in flight",
                &forward_rejected,
            ),
            (
                "ployz_dns_forward_failed",
                "Forwarded queries answered SERVFAIL: no upstream answered usefully in time",
                &forward_failed,
            ),
            (
                "ployz_dns_forward_tcp_retries",
                "Truncated upstream replies retried over TCP",
                &forward_tcp_retries,
            ),
            (
                "ployz_dns_tcp_connections",
                "TCP connections accepted",
                &tcp_connections,
            ),
            (
                "ployz_dns_tcp_rejected",
                "TCP connections closed at once: too many open",
                &tcp_rejected,
            ),
            (
                "ployz_dns_forward_cache_hits",
                "Forwarded queries answered from the cache of upstream answers",
                &cache_hits,
            ),
        ] {
            registry.register(name, help, counter.clone());
        }
        DnsMetrics {
            registry,
            queries,
            responses,
            truncated,
            dropped,
            forward_rejected,
            forward_failed,
            forward_tcp_retries,
            tcp_connections,
            tcp_rejected,
            cache_hits,
        }
    }
}

impl DnsMetrics {
    /// Counts one query by where it went.
    pub fn query(&self, source: QuerySource) {
        self.queries[source.index()].inc();
    }

    /// Counts one response sent, by its code.
    pub fn response(&self, rcode: Rcode) {
        self.responses[rcode_index(rcode)].inc();
    }

    /// Counts one response with a code this server does not name (an upstream's NOTAUTH...).
    pub fn response_other(&self) {
        self.responses[Rcode::ALL.len()].inc();
    }

    /// Counts one UDP response cut to fit, with TC set.
    pub fn truncated(&self) {
        self.truncated.inc();
    }

    /// Counts one packet that got no response at all.
    pub fn dropped(&self) {
        self.dropped.inc();
    }

    /// Counts one forwarded query turned away because too many forwards were in flight.
    pub fn forward_rejected(&self) {
        self.forward_rejected.inc();
    }

    /// Counts one forwarded query no upstream answered usefully.
    pub fn forward_failed(&self) {
        self.forward_failed.inc();
    }

    /// Counts one truncated upstream reply retried over TCP.
    pub fn forward_tcp_retry(&self) {
        self.forward_tcp_retries.inc();
    }

    /// Counts one TCP connection accepted.
    pub fn tcp_connection(&self) {
        self.tcp_connections.inc();
    }

    /// Counts one TCP connection closed at once because too many were open.
    pub fn tcp_rejected(&self) {
        self.tcp_rejected.inc();
    }

    /// Counts one forwarded query answered from the cache.
    pub fn cache_hit(&self) {
        self.cache_hits.inc();
    }

    /// Forwarded queries answered from the cache so far.
    pub fn cache_hits(&self) -> u64 {
        self.cache_hits.get()
    }

    /// Queries counted from `source` so far.
    pub fn queries(&self, source: QuerySource) -> u64 {
        self.queries[source.index()].get()
    }

    /// Responses sent with `rcode` so far.
    pub fn responses(&self, rcode: Rcode) -> u64 {
        self.responses[rcode_index(rcode)].get()
    }

    /// Appends the Prometheus text exposition (version 0.0.4) of every counter to `out`;
    /// metric names start with `ployz_dns_`.
    pub fn render_prometheus(&self, out: &mut String) {
        // Writing to a String cannot fail, and nothing registered here fails to encode.
        let _ = prometheus_text::encode(out, &self.registry);
    }
}

/// One counter per value of a single label, rendered as one family in the order of `values`:
/// a query increments its counter through a handle, with no label lookup.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_by_source_and_code() {
        let m = DnsMetrics::default();
        m.query(QuerySource::Internal);
        m.query(QuerySource::Internal);
        m.query(QuerySource::Refused);
        m.response(Rcode::NxDomain);
        m.response(Rcode::BadVers);
        m.truncated();
        m.response_other();
        let mut out = String::new();
        m.render_prometheus(&mut out);
        assert!(out.contains("ployz_dns_queries_total{source=\"internal\"} 2\n"));
        assert!(out.contains("ployz_dns_queries_total{source=\"refused\"} 1\n"));
        assert!(out.contains("ployz_dns_queries_total{source=\"forwarded\"} 0\n"));
        assert!(out.contains("ployz_dns_responses_total{rcode=\"NXDOMAIN\"} 1\n"));
        assert!(out.contains("ployz_dns_responses_total{rcode=\"BADVERS\"} 1\n"));
        assert!(out.contains("ployz_dns_truncated_total 1\n"));
        assert!(out.contains("ployz_dns_responses_total{rcode=\"OTHER\"} 1\n"));
        for line in out.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("ployz_dns_"), "{line}");
            let value = line.rsplit(' ').next().unwrap();
            assert!(value.parse::<u64>().is_ok(), "{line}");
        }
    }

    /// Names, types, help texts and labels as dashboards read them, appended to what is
    /// already in the buffer (the edge's metrics).
    #[test]
    fn appends_the_documented_exposition() {
        let m = DnsMetrics::default();
        m.query(QuerySource::Forwarded);
        m.query(QuerySource::Malformed);
        m.response(Rcode::NoError);
        m.response(Rcode::ServFail);
        m.dropped();
        m.forward_rejected();
        m.forward_failed();
        m.forward_failed();
        m.forward_tcp_retry();
        m.tcp_connection();
        m.tcp_rejected();
        let mut out = String::from("before\n");
        m.render_prometheus(&mut out);
        let expected = "\
before
# HELP ployz_dns_queries_total DNS queries received, by where they went.
# TYPE ployz_dns_queries_total counter
ployz_dns_queries_total{source=\"internal\"} 0
ployz_dns_queries_total{source=\"forwarded\"} 1
ployz_dns_queries_total{source=\"refused\"} 0
ployz_dns_queries_total{source=\"malformed\"} 1
# HELP ployz_dns_responses_total DNS responses sent, by response code.
# TYPE ployz_dns_responses_total counter
ployz_dns_responses_total{rcode=\"NOERROR\"} 1
ployz_dns_responses_total{rcode=\"FORMERR\"} 0
ployz_dns_responses_total{rcode=\"SERVFAIL\"} 1
ployz_dns_responses_total{rcode=\"NXDOMAIN\"} 0
ployz_dns_responses_total{rcode=\"NOTIMP\"} 0
ployz_dns_responses_total{rcode=\"REFUSED\"} 0
ployz_dns_responses_total{rcode=\"BADVERS\"} 0
ployz_dns_responses_total{rcode=\"OTHER\"} 0
# HELP ployz_dns_truncated_total UDP responses cut to fit and marked TC.
# TYPE ployz_dns_truncated_total counter
ployz_dns_truncated_total 0
# HELP ployz_dns_dropped_total Packets that got no response (too short, responses, junk from strangers).
# TYPE ployz_dns_dropped_total counter
ployz_dns_dropped_total 1
# HELP ployz_dns_forward_rejected_total Forwarded queries answered SERVFAIL at once: too many forwards in flight.
# TYPE ployz_dns_forward_rejected_total counter
ployz_dns_forward_rejected_total 1
# HELP ployz_dns_forward_failed_total Forwarded queries answered SERVFAIL: no upstream answered usefully in time.
# TYPE ployz_dns_forward_failed_total counter
ployz_dns_forward_failed_total 2
# HELP ployz_dns_forward_tcp_retries_total Truncated upstream replies retried over TCP.
# TYPE ployz_dns_forward_tcp_retries_total counter
ployz_dns_forward_tcp_retries_total 1
# HELP ployz_dns_tcp_connections_total TCP connections accepted.
# TYPE ployz_dns_tcp_connections_total counter
ployz_dns_tcp_connections_total 1
# HELP ployz_dns_tcp_rejected_total TCP connections closed at once: too many open.
# TYPE ployz_dns_tcp_rejected_total counter
ployz_dns_tcp_rejected_total 1
# HELP ployz_dns_forward_cache_hits_total Forwarded queries answered from the cache of upstream answers.
# TYPE ployz_dns_forward_cache_hits_total counter
ployz_dns_forward_cache_hits_total 0
";
        assert_eq!(out, expected);
    }
}
