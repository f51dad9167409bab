//! The Cluster DNS Verdict: does an Ingress Hostname resolve to one of this Cluster's Machine
//! public addresses?
//!
//! The lookup goes to a configurable resolver (the daemon's `--verdict-resolver ADDR:PORT`), or
//! to the system's resolvers. `/etc/hosts` is not consulted: the authority validates against
//! public DNS, not this Machine's hosts file.
//!
//! When no Machine public address is known, the verdict is
//! [`ClusterDnsVerdict::Unknown`] without a lookup, and ordering goes ahead: the authority's own
//! validation is the judge then, and the status record says the verdict was unknown.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use hickory_resolver::config::{
    ConnectionConfig, LookupIpStrategy, NameServerConfig, ResolveHosts, ResolverConfig,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use ployz_core::ClusterDnsVerdict;

/// Which resolver the Cluster DNS Verdict asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VerdictResolver {
    /// The system's resolvers (`/etc/resolv.conf`).
    #[default]
    System,
    /// One resolver at this address, over UDP (and TCP for truncated answers).
    At(SocketAddr),
}

/// Takes Cluster DNS Verdicts with one resolver configuration.
pub struct VerdictProbe {
    resolver: TokioResolver,
    timeout: Duration,
}

impl std::fmt::Debug for VerdictProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerdictProbe")
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl VerdictProbe {
    /// A probe asking `resolver`, each lookup bounded by `timeout` (the Certificate Policy's
    /// probe timeout).
    pub fn new(resolver: VerdictResolver, timeout: Duration) -> Result<VerdictProbe, String> {
        let mut builder = match resolver {
            VerdictResolver::System => TokioResolver::builder_tokio()
                .map_err(|e| format!("the system resolver configuration is unusable: {e}"))?,
            VerdictResolver::At(addr) => {
                let mut udp = ConnectionConfig::udp();
                udp.port = addr.port();
                let mut tcp = ConnectionConfig::tcp();
                tcp.port = addr.port();
                let server = NameServerConfig::new(addr.ip(), true, vec![udp, tcp]);
                TokioResolver::builder_with_config(
                    ResolverConfig::from_name_servers(vec![server]),
                    TokioRuntimeProvider::default(),
                )
            }
        };
        let opts = builder.options_mut();
        opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
        opts.use_hosts_file = ResolveHosts::Never;
        opts.timeout = timeout;
        opts.attempts = 1;
        // A verdict should follow DNS changes within a minute, not a day-long TTL.
        opts.positive_max_ttl = Some(Duration::from_secs(60));
        opts.negative_max_ttl = Some(Duration::from_secs(30));
        let resolver = builder
            .build()
            .map_err(|e| format!("the verdict resolver cannot be built: {e}"))?;
        Ok(VerdictProbe { resolver, timeout })
    }

    /// The A and AAAA addresses of `hostname`; empty when the name does not exist or has no
    /// address records. Errors are lookups that failed (timeout, SERVFAIL, refused...).
    pub async fn resolve(&self, hostname: &str) -> Result<Vec<IpAddr>, String> {
        // Fully qualified: no search-domain guesses.
        let fqdn = format!("{}.", hostname.trim_end_matches('.'));
        // The resolver's own timeout applies per query; this bounds the whole lookup.
        let bound = self.timeout * 2 + Duration::from_millis(100);
        match tokio::time::timeout(bound, self.resolver.lookup_ip(fqdn.as_str())).await {
            Err(_) => Err(format!(
                "looking up {hostname} took longer than {} ms",
                bound.as_millis()
            )),
            Ok(Ok(lookup)) => {
                let mut addrs: Vec<IpAddr> = lookup.iter().collect();
                addrs.sort();
                addrs.dedup();
                Ok(addrs)
            }
            Ok(Err(e)) if e.is_no_records_found() || e.is_nx_domain() => Ok(Vec::new()),
            Ok(Err(e)) => Err(format!("looking up {hostname} failed: {e}")),
        }
    }

    /// The Cluster DNS Verdict of `hostname` against the Cluster's Machine public addresses
    /// `expected`. An empty `expected` set (public addresses unknown) gives
    /// [`ClusterDnsVerdict::Unknown`] without a lookup.
    pub async fn verdict(&self, hostname: &str, expected: &BTreeSet<IpAddr>) -> ClusterDnsVerdict {
        let expected: Vec<IpAddr> = expected.iter().copied().collect();
        if expected.is_empty() {
            return ClusterDnsVerdict::judge(&[], &expected);
        }
        match self.resolve(hostname).await {
            Ok(resolved) => ClusterDnsVerdict::judge(&resolved, &expected),
            Err(reason) => ClusterDnsVerdict::Unknown { reason },
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use hickory_proto::op::{Message, MessageType, ResponseCode};
    use hickory_proto::rr::{RData, Record, RecordType};
    use std::collections::BTreeMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use tokio::net::UdpSocket;

    /// A tiny authoritative DNS responder on loopback: answers A/AAAA from `answers`, NXDOMAIN
    /// for names not in it, and SERVFAIL for `servfail.test`. Counts queries. Stops when the
    /// returned handle is dropped.
    pub(crate) struct TestDns {
        pub(crate) addr: SocketAddr,
        pub(crate) queries: Arc<AtomicUsize>,
        task: tokio::task::JoinHandle<()>,
    }

    impl Drop for TestDns {
        fn drop(&mut self) {
            self.task.abort();
        }
    }

    pub(crate) async fn test_dns(answers: BTreeMap<String, Vec<IpAddr>>) -> TestDns {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let queries = Arc::new(AtomicUsize::new(0));
        let count = queries.clone();
        let task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, peer)) = socket.recv_from(&mut buf).await else {
                    return;
                };
                let Ok(query) = Message::from_vec(&buf[..n]) else {
                    continue;
                };
                count.fetch_add(1, Ordering::SeqCst);
                let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
                reply.metadata.recursion_desired = query.metadata.recursion_desired;
                reply.metadata.recursion_available = true;
                reply.metadata.authoritative = true;
                reply.metadata.message_type = MessageType::Response;
                for q in &query.queries {
                    reply.add_query(q.clone());
                    let name = q.name().to_string().trim_end_matches('.').to_lowercase();
                    if name == "servfail.test" {
                        reply.metadata.response_code = ResponseCode::ServFail;
                        continue;
                    }
                    match answers.get(&name) {
                        None => reply.metadata.response_code = ResponseCode::NXDomain,
                        Some(addrs) => {
                            for a in addrs {
                                let rdata = match (a, q.query_type()) {
                                    (IpAddr::V4(v4), RecordType::A) => RData::A((*v4).into()),
                                    (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA((*v6).into()),
                                    _ => continue,
                                };
                                reply.add_answer(Record::from_rdata(q.name().clone(), 5, rdata));
                            }
                        }
                    }
                }
                if let Ok(bytes) = reply.to_vec() {
                    let _ = socket.send_to(&bytes, peer).await;
                }
            }
        });
        TestDns {
            addr,
            queries,
            task,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[tokio::test]
    async fn verdicts_from_a_resolver_on_loopback() {
        let dns = test_dns(BTreeMap::from([
            (
                "here.test".to_owned(),
                vec![ip("203.0.113.7"), ip("2001:db8::7")],
            ),
            ("elsewhere.test".to_owned(), vec![ip("198.51.100.9")]),
            ("v6only.test".to_owned(), vec![ip("2001:db8::7")]),
        ]))
        .await;
        let probe =
            VerdictProbe::new(VerdictResolver::At(dns.addr), Duration::from_millis(500)).unwrap();
        let public = BTreeSet::from([ip("203.0.113.7"), ip("2001:db8::7")]);

        assert_eq!(
            probe.resolve("here.test").await.unwrap(),
            vec![ip("203.0.113.7"), ip("2001:db8::7")]
        );
        assert!(matches!(
            probe.verdict("here.test", &public).await,
            ClusterDnsVerdict::Points { .. }
        ));
        assert!(matches!(
            probe.verdict("v6only.test", &public).await,
            ClusterDnsVerdict::Points { .. }
        ));
        assert_eq!(
            probe.verdict("elsewhere.test", &public).await,
            ClusterDnsVerdict::ElsewhereOrUnresolved {
                resolved: vec![ip("198.51.100.9")],
                expected: public.iter().copied().collect(),
            }
        );
        assert_eq!(
            probe.verdict("missing.test", &public).await,
            ClusterDnsVerdict::ElsewhereOrUnresolved {
                resolved: vec![],
                expected: public.iter().copied().collect(),
            }
        );
        let v = probe.verdict("servfail.test", &public).await;
        assert!(matches!(v, ClusterDnsVerdict::Unknown { .. }), "{v:?}");

        // Unknown public addresses: no lookup at all.
        let before = dns.queries.load(Ordering::SeqCst);
        let v = probe.verdict("elsewhere.test", &BTreeSet::new()).await;
        assert!(matches!(v, ClusterDnsVerdict::Unknown { .. }));
        assert!(v.permits_order());
        assert_eq!(dns.queries.load(Ordering::SeqCst), before);
    }

    #[tokio::test]
    async fn a_silent_resolver_gives_unknown_within_the_probe_timeout() {
        // A socket that never answers.
        let silent = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let probe = VerdictProbe::new(
            VerdictResolver::At(silent.local_addr().unwrap()),
            Duration::from_millis(200),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let v = probe
            .verdict("app.test", &BTreeSet::from([ip("127.0.0.1")]))
            .await;
        assert!(matches!(v, ClusterDnsVerdict::Unknown { .. }), "{v:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }
}
