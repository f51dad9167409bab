//! The DNS server's Prometheus metrics: plain atomics on the query path, rendered as the text
//! exposition format when scraped.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

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

/// Counters one DNS server keeps. Cheap to update from every worker at once.
#[derive(Debug, Default)]
pub struct DnsMetrics {
    queries: [AtomicU64; QuerySource::ALL.len()],
    responses: [AtomicU64; Rcode::ALL.len()],
    other_responses: AtomicU64,
    truncated: AtomicU64,
    dropped: AtomicU64,
    forward_rejected: AtomicU64,
    forward_failed: AtomicU64,
    forward_tcp_retries: AtomicU64,
    tcp_connections: AtomicU64,
    tcp_rejected: AtomicU64,
}

impl DnsMetrics {
    /// Counts one query by where it went.
    pub fn query(&self, source: QuerySource) {
        self.queries[source.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one response sent, by its code.
    pub fn response(&self, rcode: Rcode) {
        self.responses[rcode_index(rcode)].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one response with a code this server does not name (an upstream's NOTAUTH...).
    pub fn response_other(&self) {
        self.other_responses.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one UDP response cut to fit, with TC set.
    pub fn truncated(&self) {
        self.truncated.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one packet that got no response at all.
    pub fn dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one forwarded query turned away because too many forwards were in flight.
    pub fn forward_rejected(&self) {
        self.forward_rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one forwarded query no upstream answered usefully.
    pub fn forward_failed(&self) {
        self.forward_failed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one truncated upstream reply retried over TCP.
    pub fn forward_tcp_retry(&self) {
        self.forward_tcp_retries.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one TCP connection accepted.
    pub fn tcp_connection(&self) {
        self.tcp_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one TCP connection closed at once because too many were open.
    pub fn tcp_rejected(&self) {
        self.tcp_rejected.fetch_add(1, Ordering::Relaxed);
    }

    /// Queries counted from `source` so far.
    pub fn queries(&self, source: QuerySource) -> u64 {
        self.queries[source.index()].load(Ordering::Relaxed)
    }

    /// Responses sent with `rcode` so far.
    pub fn responses(&self, rcode: Rcode) -> u64 {
        self.responses[rcode_index(rcode)].load(Ordering::Relaxed)
    }

    /// Appends the Prometheus text exposition of every counter to `out`; metric names start
    /// with `ployz_dns_`.
    pub fn render_prometheus(&self, out: &mut String) {
        out.push_str("# HELP ployz_dns_queries_total DNS queries received, by where they went.\n");
        out.push_str("# TYPE ployz_dns_queries_total counter\n");
        for source in QuerySource::ALL {
            let _ = writeln!(
                out,
                "ployz_dns_queries_total{{source=\"{}\"}} {}",
                source.as_str(),
                self.queries(source)
            );
        }
        out.push_str("# HELP ployz_dns_responses_total DNS responses sent, by response code.\n");
        out.push_str("# TYPE ployz_dns_responses_total counter\n");
        for rcode in Rcode::ALL {
            let _ = writeln!(
                out,
                "ployz_dns_responses_total{{rcode=\"{}\"}} {}",
                rcode.as_str(),
                self.responses(rcode)
            );
        }
        let _ = writeln!(
            out,
            "ployz_dns_responses_total{{rcode=\"OTHER\"}} {}",
            self.other_responses.load(Ordering::Relaxed)
        );
        let single = [
            (
                "ployz_dns_truncated_total",
                "UDP responses cut to fit and marked TC.",
                &self.truncated,
            ),
            (
                "ployz_dns_dropped_total",
                "Packets that got no response (too short, responses, junk from strangers).",
                &self.dropped,
            ),
            (
                "ployz_dns_forward_rejected_total",
                "Forwarded queries answered SERVFAIL at once: too many forwards in flight.",
                &self.forward_rejected,
            ),
            (
                "ployz_dns_forward_failed_total",
                "Forwarded queries answered SERVFAIL: no upstream answered usefully in time.",
                &self.forward_failed,
            ),
            (
                "ployz_dns_forward_tcp_retries_total",
                "Truncated upstream replies retried over TCP.",
                &self.forward_tcp_retries,
            ),
            (
                "ployz_dns_tcp_connections_total",
                "TCP connections accepted.",
                &self.tcp_connections,
            ),
            (
                "ployz_dns_tcp_rejected_total",
                "TCP connections closed at once: too many open.",
                &self.tcp_rejected,
            ),
        ];
        for (name, help, counter) in single {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} counter");
            let _ = writeln!(out, "{name} {}", counter.load(Ordering::Relaxed));
        }
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
}
