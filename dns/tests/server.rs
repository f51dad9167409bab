//! The DNS server end to end on loopback: a real store feeding the controller, real DNS
//! clients (hickory-resolver and raw hickory-proto messages over UDP and TCP), and a second DNS
//! server started here as the forwarding upstream.

use std::collections::HashSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::rdata::A;
use hickory_proto::rr::{Name, RData, Record, RecordType};
use hickory_resolver::config::{
    ConnectionConfig, NameServerConfig, ProtocolConfig, ResolverConfig, ResolverOpts,
};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::TokioResolver;
use ployz_core::api::{AnswerKind, MachineInfo, QueryType, Rcode};
use ployz_core::{
    ContainerHealth, ContainerKind, ContainerRuntimeObservation, ContainerState, LocalMachinePhase,
    MachineId, ManagementAddress, ServiceId,
};
use ployz_dns::{
    lookup, AllowedSources, DnsController, DnsError, DnsMetrics, DnsServer, DnsServerConfig,
    QuerySource,
};
use ployz_store::machines::machine_key;
use ployz_store::observations::container_key;
use ployz_store::{Key, Store};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;
use tokio::task::JoinHandle;

const WAIT: Duration = Duration::from_secs(5);

// ------------------------------------------------------------------ fixtures

fn machine(name: &str, subnet: &str) -> MachineInfo {
    MachineInfo {
        id: MachineId::generate(),
        name: name.parse().unwrap(),
        phase: LocalMachinePhase::Participating,
        subnet: subnet.parse().unwrap(),
        public_key: String::new(),
        management_address: ManagementAddress::from_public_key(&[0; 32]),
        endpoints: Vec::new(),
        version: String::new(),
        wireguard_backend: None,
        edge_features: Vec::new(),
    }
}

fn container(
    machine: &MachineId,
    service: &str,
    service_id: &ServiceId,
    addr: Ipv4Addr,
) -> ContainerRuntimeObservation {
    ContainerRuntimeObservation {
        id: format!("{:064x}", rand_u128()).parse().unwrap(),
        name: format!("{service}-0001"),
        machine_id: machine.clone(),
        service_id: service_id.clone(),
        service_name: service.parse().unwrap(),
        kind: ContainerKind::Service,
        state: ContainerState::Running,
        health: Some(ContainerHealth::Healthy),
        restart_count: 0,
        address: Some(addr),
        image: "app:1".into(),
        created_at: 0,
        spec: None,
        plan_id: None,
        lease_token: None,
    }
}

fn rand_u128() -> u128 {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed) as u128;
    n | (u128::from(std::process::id()) << 64)
}

/// A Machine other than the local one: it writes into its own store and the local store merges
/// the records, as replication would.
struct Peer {
    info: MachineInfo,
    store: Store,
}

impl Peer {
    fn new(name: &str, subnet: &str) -> Peer {
        let info = machine(name, subnet);
        let store = Store::temporary(info.id.clone()).unwrap();
        Peer { info, store }
    }

    fn publish(&self, into: &Store, key: &Key, value: Vec<u8>) {
        let record = self.store.put(key, value).unwrap();
        into.merge(&[record]).unwrap();
    }

    fn announce(&self, into: &Store) {
        self.publish(
            into,
            &machine_key(&self.info.id),
            serde_json::to_vec(&self.info).unwrap(),
        );
    }

    fn observe(&self, into: &Store, o: &ContainerRuntimeObservation) {
        self.publish(into, &container_key(o), serde_json::to_vec(o).unwrap());
    }
}

/// The local Machine's store, controller and DNS server; stops everything on drop.
struct Harness {
    addr: SocketAddr,
    local: MachineInfo,
    store: Arc<Store>,
    controller: DnsController,
    metrics: Arc<DnsMetrics>,
    tasks: Vec<JoinHandle<()>>,
    _shutdown: watch::Sender<bool>,
}

impl Drop for Harness {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Harness {
    async fn start(configure: impl FnOnce(&mut DnsServerConfig)) -> Harness {
        let local = machine("alpha", "10.210.5.0/24");
        let store = Arc::new(Store::temporary(local.id.clone()).unwrap());
        store
            .put(&machine_key(&local.id), serde_json::to_vec(&local).unwrap())
            .unwrap();
        let controller = DnsController::new();
        let (tx, rx) = watch::channel(false);
        let mut config = DnsServerConfig::new("127.0.0.1:0".parse().unwrap());
        config.udp_workers = 2;
        configure(&mut config);
        let server = DnsServer::bind(config, controller.snapshot().clone())
            .await
            .unwrap();
        let addr = server.local_addr();
        let metrics = server.metrics();
        let run = {
            let (c, s, id, rx) = (
                controller.clone(),
                store.clone(),
                local.id.clone(),
                rx.clone(),
            );
            tokio::spawn(async move { c.run(s, id, rx).await })
        };
        let serve = tokio::spawn(server.run(rx));
        let h = Harness {
            addr,
            local,
            store,
            controller,
            metrics,
            tasks: vec![run, serve],
            _shutdown: tx,
        };
        // The first build publishes generation 1 (the local Machine record is a change).
        h.wait_for(|h| h.controller.snapshot().load().generation() >= 1)
            .await;
        h
    }

    fn observe(&self, o: &ContainerRuntimeObservation) {
        self.store
            .put(&container_key(o), serde_json::to_vec(o).unwrap())
            .unwrap();
    }

    async fn wait_for(&self, done: impl Fn(&Harness) -> bool) {
        let deadline = Instant::now() + WAIT;
        while !done(self) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the controller"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits until the published snapshot answers `name` with `count` addresses.
    async fn wait_addresses(&self, name: &str, count: usize) {
        self.wait_for(|h| {
            lookup(&h.controller.snapshot().load(), name, QueryType::A)
                .addresses
                .len()
                == count
        })
        .await;
    }

    fn resolver(&self, protocol: ProtocolConfig) -> TokioResolver {
        resolver_for(self.addr, protocol)
    }
}

fn resolver_for(addr: SocketAddr, protocol: ProtocolConfig) -> TokioResolver {
    let mut connection = ConnectionConfig::new(protocol);
    connection.port = addr.port();
    let ns = NameServerConfig::new(addr.ip(), true, vec![connection]);
    let mut opts = ResolverOpts::default();
    opts.cache_size = 0;
    opts.attempts = 1;
    opts.timeout = Duration::from_secs(3);
    TokioResolver::builder_with_config(
        ResolverConfig::from_name_servers(vec![ns]),
        TokioRuntimeProvider::default(),
    )
    .with_options(opts)
    .build()
    .unwrap()
}

async fn resolve_a(resolver: &TokioResolver, name: &str) -> Result<Vec<Ipv4Addr>, String> {
    match resolver.lookup(name, RecordType::A).await {
        Ok(l) => Ok(l
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(a.0),
                _ => None,
            })
            .collect()),
        Err(e) if e.is_nx_domain() => Err("NXDOMAIN".into()),
        Err(e) => Err(e.to_string()),
    }
}

fn question(name: &str, rtype: RecordType, edns: Option<u16>) -> Message {
    let mut m = Message::query();
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), rtype));
    m.metadata.recursion_desired = true;
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size);
        m.set_edns(e);
    }
    m
}

async fn udp_raw(server: SocketAddr, packet: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.send_to(packet, server).await.unwrap();
    let mut buf = vec![0u8; 65535];
    match tokio::time::timeout(wait, socket.recv_from(&mut buf)).await {
        Ok(Ok((n, from))) => {
            assert_eq!(from, server);
            Some(buf[..n].to_vec())
        }
        _ => None,
    }
}

async fn udp(server: SocketAddr, m: &Message) -> (Message, usize) {
    let raw = udp_raw(server, &m.to_vec().unwrap(), WAIT)
        .await
        .expect("a UDP response");
    let reply = Message::from_vec(&raw).unwrap();
    assert_eq!(reply.metadata.id, m.metadata.id);
    (reply, raw.len())
}

async fn tcp_raw(stream: &mut TcpStream, packet: &[u8]) -> Option<Vec<u8>> {
    stream
        .write_all(&(packet.len() as u16).to_be_bytes())
        .await
        .ok()?;
    stream.write_all(packet).await.ok()?;
    let len = tokio::time::timeout(WAIT, stream.read_u16())
        .await
        .ok()?
        .ok()?;
    let mut buf = vec![0u8; usize::from(len)];
    stream.read_exact(&mut buf).await.ok()?;
    Some(buf)
}

async fn tcp(server: SocketAddr, m: &Message) -> Message {
    let mut stream = TcpStream::connect(server).await.unwrap();
    let raw = tcp_raw(&mut stream, &m.to_vec().unwrap())
        .await
        .expect("a TCP response");
    let reply = Message::from_vec(&raw).unwrap();
    assert_eq!(reply.metadata.id, m.metadata.id);
    reply
}

fn addresses(m: &Message) -> Vec<Ipv4Addr> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect()
}

fn sorted(mut v: Vec<Ipv4Addr>) -> Vec<Ipv4Addr> {
    v.sort();
    v
}

// ------------------------------------------------------------------ the upstream

/// A second DNS server on loopback, standing in for the host's resolver:
/// `host<N>.example.` -> 10.88.0.N (TTL 60); `short.example.` -> 10.88.1.1 (TTL 1);
/// `tc.example.` is truncated over UDP and answered (10.88.9.9) over TCP; `servfail.example.`
/// fails; `gone.example.` is NXDOMAIN with an SOA (TTL 300, MINIMUM 120); anything else is
/// NXDOMAIN without one. It counts the queries it gets, in all and per name and type.
struct Upstream {
    addr: SocketAddr,
    udp_queries: Arc<AtomicUsize>,
    asked: Arc<std::sync::Mutex<std::collections::HashMap<(String, RecordType), usize>>>,
    /// The source port of every UDP query, in order.
    ports: Arc<std::sync::Mutex<Vec<u16>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Upstream {
    /// How often `name` (lowercase, with its trailing dot) was asked for `rtype`.
    fn asked(&self, name: &str, rtype: RecordType) -> usize {
        self.asked
            .lock()
            .unwrap()
            .get(&(name.to_owned(), rtype))
            .copied()
            .unwrap_or(0)
    }
}

impl Drop for Upstream {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn upstream_answer(query: &Message, over_tcp: bool) -> Message {
    let mut reply = Message::response(query.metadata.id, OpCode::Query);
    reply.metadata.recursion_desired = query.metadata.recursion_desired;
    reply.metadata.recursion_available = true;
    let Some(q) = query.queries.first() else {
        reply.metadata.response_code = ResponseCode::FormErr;
        return reply;
    };
    reply.add_query(q.clone());
    let name = q.name().to_ascii().to_ascii_lowercase();
    let a = |addr: Ipv4Addr| Record::from_rdata(q.name().clone(), 60, RData::A(A(addr)));
    if let Some(n) = name
        .strip_prefix("host")
        .and_then(|r| r.strip_suffix(".example."))
        .and_then(|n| n.parse::<u8>().ok())
    {
        reply.add_answer(a(Ipv4Addr::new(10, 88, 0, n)));
    } else if name == "tc.example." {
        if over_tcp {
            reply.add_answer(a(Ipv4Addr::new(10, 88, 9, 9)));
        } else {
            reply.metadata.truncation = true;
        }
    } else if name == "short.example." {
        reply.add_answer(Record::from_rdata(
            q.name().clone(),
            1,
            RData::A(A(Ipv4Addr::new(10, 88, 1, 1))),
        ));
    } else if name == "servfail.example." {
        reply.metadata.response_code = ResponseCode::ServFail;
    } else if name == "gone.example." {
        reply.metadata.response_code = ResponseCode::NXDomain;
        let apex = Name::from_ascii("example.").unwrap();
        reply.add_authority(Record::from_rdata(
            apex.clone(),
            300,
            RData::SOA(hickory_proto::rr::rdata::SOA::new(
                apex.clone(),
                apex,
                1,
                7200,
                3600,
                1_209_600,
                120,
            )),
        ));
    } else {
        reply.metadata.response_code = ResponseCode::NXDomain;
    }
    reply
}

impl Upstream {
    async fn start() -> Upstream {
        let (socket, listener) = bind_udp_and_tcp().await;
        let addr = socket.local_addr().unwrap();
        let udp_queries = Arc::new(AtomicUsize::new(0));
        let counter = udp_queries.clone();
        let asked: Arc<std::sync::Mutex<std::collections::HashMap<(String, RecordType), usize>>> =
            Arc::default();
        let asked_udp = asked.clone();
        let ports: Arc<std::sync::Mutex<Vec<u16>>> = Arc::default();
        let ports_udp = ports.clone();
        let udp_task = tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            loop {
                let Ok((n, from)) = socket.recv_from(&mut buf).await else {
                    continue;
                };
                counter.fetch_add(1, Ordering::Relaxed);
                ports_udp.lock().unwrap().push(from.port());
                if let Ok(q) = Message::from_vec(&buf[..n]) {
                    if let Some(question) = q.queries.first() {
                        *asked_udp
                            .lock()
                            .unwrap()
                            .entry((
                                question.name().to_ascii().to_ascii_lowercase(),
                                question.query_type(),
                            ))
                            .or_default() += 1;
                    }
                    let reply = upstream_answer(&q, false).to_vec().unwrap();
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        let tcp_task = tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let Ok(len) = stream.read_u16().await else {
                        return;
                    };
                    let mut buf = vec![0u8; usize::from(len)];
                    if stream.read_exact(&mut buf).await.is_err() {
                        return;
                    }
                    if let Ok(q) = Message::from_vec(&buf) {
                        let reply = upstream_answer(&q, true).to_vec().unwrap();
                        let _ = stream.write_all(&(reply.len() as u16).to_be_bytes()).await;
                        let _ = stream.write_all(&reply).await;
                    }
                });
            }
        });
        Upstream {
            addr,
            udp_queries,
            asked,
            ports,
            tasks: vec![udp_task, tcp_task],
        }
    }
}

/// A UDP socket and a TCP listener on the same random loopback port.
async fn bind_udp_and_tcp() -> (UdpSocket, TcpListener) {
    for _ in 0..20 {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        if let Ok(listener) = TcpListener::bind(socket.local_addr().unwrap()).await {
            return (socket, listener);
        }
    }
    panic!("no free port for the upstream");
}

/// A port where nothing answers: a UDP socket that never reads (queries vanish).
async fn black_hole() -> (UdpSocket, SocketAddr) {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    (socket, addr)
}

/// A loopback port nothing is bound to (UDP gets port unreachable at once).
async fn closed_port() -> SocketAddr {
    let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket.local_addr().unwrap()
}

// ------------------------------------------------------------------ tests

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_names_follow_the_replicated_observations() {
    let h = Harness::start(|_| {}).await;
    let beta = Peer::new("beta", "10.210.1.0/24");
    beta.announce(&h.store);
    let web = ServiceId::generate();
    let mut local = container(&h.local.id, "web", &web, Ipv4Addr::new(10, 210, 5, 2));
    let remote = container(&beta.info.id, "web", &web, Ipv4Addr::new(10, 210, 1, 2));
    h.observe(&local);
    beta.observe(&h.store, &remote);
    h.wait_addresses("web.internal", 2).await;

    let resolver = h.resolver(ProtocolConfig::Udp);
    let both = vec![Ipv4Addr::new(10, 210, 1, 2), Ipv4Addr::new(10, 210, 5, 2)];
    assert_eq!(
        sorted(resolve_a(&resolver, "web.internal.").await.unwrap()),
        both
    );
    assert_eq!(
        sorted(
            resolve_a(&resolver, &format!("{web}.internal."))
                .await
                .unwrap()
        ),
        both
    );
    assert_eq!(
        resolve_a(&resolver, "beta.m.web.internal.").await.unwrap(),
        vec![Ipv4Addr::new(10, 210, 1, 2)]
    );
    assert_eq!(
        resolve_a(&resolver, &format!("{}.m.web.internal.", h.local.id))
            .await
            .unwrap(),
        vec![Ipv4Addr::new(10, 210, 5, 2)]
    );
    let over_tcp = h.resolver(ProtocolConfig::Tcp);
    assert_eq!(
        sorted(resolve_a(&over_tcp, "rr.web.internal.").await.unwrap()),
        both
    );

    // Unhealthy: the local container stops answering; the remote one still does.
    local.health = Some(ContainerHealth::Unhealthy);
    h.observe(&local);
    h.wait_addresses("web.internal", 1).await;
    assert_eq!(
        resolve_a(&resolver, "web.internal.").await.unwrap(),
        vec![Ipv4Addr::new(10, 210, 1, 2)]
    );
    assert_eq!(
        resolve_a(&resolver, "alpha.m.web.internal.").await,
        Err("NXDOMAIN".into())
    );

    // Stopped: the name disappears.
    let mut stopped = remote.clone();
    stopped.state = ContainerState::Exited;
    beta.observe(&h.store, &stopped);
    h.wait_addresses("web.internal", 0).await;
    assert_eq!(
        resolve_a(&resolver, "web.internal.").await,
        Err("NXDOMAIN".into())
    );
    let answer = lookup(
        &h.controller.snapshot().load(),
        "web.internal",
        QueryType::A,
    );
    assert_eq!(answer.kind, AnswerKind::Unknown);
    assert_eq!(answer.rcode, Some(Rcode::NxDomain));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_name_answers_under_its_dns_label_in_any_case() {
    let h = Harness::start(|_| {}).await;
    let svc = ServiceId::generate();
    let addr = Ipv4Addr::new(10, 210, 5, 9);
    h.observe(&container(&h.local.id, "My_App", &svc, addr));
    h.wait_addresses("my-app.internal", 1).await;

    let resolver = h.resolver(ProtocolConfig::Udp);
    for name in [
        "my-app.internal.",
        "MY-APP.Internal.",
        "alpha.m.my-app.internal.",
        "nearest.My-App.internal.",
    ] {
        assert_eq!(
            resolve_a(&resolver, name).await.unwrap(),
            vec![addr],
            "{name}"
        );
    }
    // A raw query in mixed case gets the address too.
    let (reply, _) = udp(h.addr, &question("My-App.internal.", RecordType::A, None)).await;
    assert_eq!(reply.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addresses(&reply), vec![addr]);
    // The name as written is no DNS name of it (asked raw: resolvers refuse '_' in a host name).
    let (reply, _) = udp(h.addr, &question("my_app.internal.", RecordType::A, None)).await;
    assert_eq!(reply.metadata.response_code, ResponseCode::NXDomain);
    assert!(addresses(&reply).is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn machine_names_answer_only_while_unambiguous() {
    let h = Harness::start(|_| {}).await;
    let twin_a = Peer::new("twin", "10.210.1.0/24");
    let twin_b = Peer::new("twin", "10.210.2.0/24");
    twin_a.announce(&h.store);
    let api = ServiceId::generate();
    twin_a.observe(
        &h.store,
        &container(&twin_a.info.id, "api", &api, Ipv4Addr::new(10, 210, 1, 7)),
    );
    h.wait_addresses("twin.m.api.internal", 1).await;
    let resolver = h.resolver(ProtocolConfig::Udp);
    assert_eq!(
        resolve_a(&resolver, "twin.m.api.internal.").await.unwrap(),
        vec![Ipv4Addr::new(10, 210, 1, 7)]
    );
    // A second Machine takes the same name: the name no longer selects; the ID still does.
    twin_b.announce(&h.store);
    h.wait_addresses("twin.m.api.internal", 0).await;
    assert_eq!(
        resolve_a(&resolver, "twin.m.api.internal.").await,
        Err("NXDOMAIN".into())
    );
    assert_eq!(
        resolve_a(&resolver, &format!("{}.m.api.internal.", twin_a.info.id))
            .await
            .unwrap(),
        vec![Ipv4Addr::new(10, 210, 1, 7)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nearest_orders_the_local_subnet_first() {
    let h = Harness::start(|_| {}).await;
    let beta = Peer::new("beta", "10.210.1.0/24");
    beta.announce(&h.store);
    let web = ServiceId::generate();
    for i in 2..4 {
        h.observe(&container(
            &h.local.id,
            "web",
            &web,
            Ipv4Addr::new(10, 210, 5, i),
        ));
    }
    for i in 2..5 {
        beta.observe(
            &h.store,
            &container(&beta.info.id, "web", &web, Ipv4Addr::new(10, 210, 1, i)),
        );
    }
    h.wait_addresses("web.internal", 5).await;
    let mut local_firsts = HashSet::new();
    let mut rr_firsts = HashSet::new();
    for _ in 0..40 {
        let (m, _) = udp(
            h.addr,
            &question("nearest.web.internal.", RecordType::A, None),
        )
        .await;
        let got = addresses(&m);
        assert_eq!(got.len(), 5);
        assert!(
            got[..2].iter().all(|a| a.octets()[2] == 5),
            "local subnet first: {got:?}"
        );
        assert!(got[2..].iter().all(|a| a.octets()[2] == 1), "{got:?}");
        local_firsts.insert(got[0]);
        let (m, _) = udp(h.addr, &question("web.internal.", RecordType::A, None)).await;
        rr_firsts.insert(addresses(&m)[0]);
    }
    assert_eq!(local_firsts.len(), 2, "the local group is shuffled");
    assert!(rr_firsts.len() >= 3, "round robin shuffles: {rr_firsts:?}");
    let answer = lookup(
        &h.controller.snapshot().load(),
        "nearest.web.internal",
        QueryType::A,
    );
    assert_eq!(answer.local_addresses, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_are_authoritative_ttl_zero_and_negative_answers_are_exact() {
    let h = Harness::start(|_| {}).await;
    h.observe(&container(
        &h.local.id,
        "web",
        &ServiceId::generate(),
        Ipv4Addr::new(10, 210, 5, 9),
    ));
    h.wait_addresses("web.internal", 1).await;

    // Case-insensitive, the question echoed as asked, AA, TTL 0.
    let (m, _) = udp(h.addr, &question("WeB.InTeRnAl.", RecordType::A, None)).await;
    assert_eq!(m.metadata.message_type, MessageType::Response);
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert!(m.metadata.authoritative);
    assert_eq!(m.queries[0].name().to_ascii(), "WeB.InTeRnAl.");
    assert_eq!(m.answers.len(), 1);
    assert_eq!(m.answers[0].ttl, 0);
    assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 210, 5, 9)]);

    // Unknown name: NXDOMAIN with the zone's SOA.
    let (m, _) = udp(h.addr, &question("db.internal.", RecordType::A, Some(1232))).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    assert!(m.metadata.authoritative);
    assert!(m.answers.is_empty());
    assert_eq!(m.authorities.len(), 1);
    assert_eq!(m.authorities[0].record_type(), RecordType::SOA);
    assert_eq!(m.authorities[0].name.to_ascii(), "internal.");
    assert!(m.edns.is_some(), "EDNS in, EDNS out");

    // Known name, other types: NOERROR without answers.
    for t in [RecordType::AAAA, RecordType::TXT, RecordType::MX] {
        let (m, _) = udp(h.addr, &question("web.internal.", t, None)).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{t}");
        assert!(m.answers.is_empty(), "{t}");
        assert!(m.metadata.authoritative);
    }
    // ANY: the A records (RFC 8482 minimal answer).
    let (m, _) = udp(h.addr, &question("web.internal.", RecordType::ANY, None)).await;
    assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 210, 5, 9)]);
    // The empty non-terminal of the Machine-Service DNS Selector exists.
    let (m, _) = udp(h.addr, &question("m.web.internal.", RecordType::A, None)).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    // The apex answers its SOA.
    let (m, _) = udp(h.addr, &question("internal.", RecordType::SOA, None)).await;
    assert_eq!(m.answers.len(), 1);
    assert_eq!(m.answers[0].record_type(), RecordType::SOA);
    // Through a full resolver too.
    let resolver = h.resolver(ProtocolConfig::Udp);
    let nx = resolver
        .lookup("nothing.internal.", RecordType::A)
        .await
        .unwrap_err();
    assert!(nx.is_nx_domain(), "{nx}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_answers_are_truncated_over_udp_and_whole_over_tcp() {
    let h = Harness::start(|_| {}).await;
    let big = ServiceId::generate();
    for i in 0..60u8 {
        h.observe(&container(
            &h.local.id,
            "big",
            &big,
            Ipv4Addr::new(10, 210, 5, 10 + i),
        ));
    }
    h.wait_addresses("big.internal", 60).await;
    let all: Vec<Ipv4Addr> = (0..60).map(|i| Ipv4Addr::new(10, 210, 5, 10 + i)).collect();

    let (m, len) = udp(h.addr, &question("big.internal.", RecordType::A, None)).await;
    assert!(m.metadata.truncation, "TC over plain UDP");
    assert!(len <= 512, "{len} bytes");
    assert!(m.answers.len() < 60);
    // EDNS raises the limit up to the cap: 60 records fit in 1232 bytes.
    let (m, len) = udp(
        h.addr,
        &question("big.internal.", RecordType::A, Some(4096)),
    )
    .await;
    assert!(!m.metadata.truncation);
    assert!(len <= 1232, "{len} bytes");
    assert_eq!(m.answers.len(), 60);

    let m = tcp(h.addr, &question("big.internal.", RecordType::A, None)).await;
    assert!(!m.metadata.truncation);
    assert_eq!(sorted(addresses(&m)), all);
    let resolver = h.resolver(ProtocolConfig::Tcp);
    assert_eq!(
        sorted(resolve_a(&resolver, "big.internal.").await.unwrap()),
        all
    );
    let mut text = String::new();
    h.metrics.render_prometheus(&mut text);
    assert!(text.contains("ployz_dns_truncated_total 1\n"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_names_are_forwarded_to_the_upstream() {
    let upstream = Upstream::start().await;
    let dead = closed_port().await;
    let h = Harness::start(|c| {
        c.upstreams = vec![dead, upstream.addr];
        c.forward_timeout = Duration::from_millis(500);
    })
    .await;
    let resolver = h.resolver(ProtocolConfig::Udp);
    assert_eq!(
        resolve_a(&resolver, "host7.example.").await.unwrap(),
        vec![Ipv4Addr::new(10, 88, 0, 7)]
    );
    // The client's ID and question come back; the answer is the upstream's.
    let q = question("HOST42.example.", RecordType::A, None);
    let (m, _) = udp(h.addr, &q).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(m.queries[0].name().to_ascii(), "HOST42.example.");
    assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 88, 0, 42)]);
    assert_eq!(m.answers[0].ttl, 60);
    assert!(!m.metadata.authoritative);
    // Over TCP as well.
    let m = tcp(h.addr, &question("host9.example.", RecordType::A, None)).await;
    assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 88, 0, 9)]);
    // NXDOMAIN from the upstream passes through.
    let (m, _) = udp(h.addr, &question("nope.example.", RecordType::A, None)).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    // A truncated upstream reply is asked again over TCP.
    let (m, _) = udp(h.addr, &question("tc.example.", RecordType::A, None)).await;
    assert!(!m.metadata.truncation);
    assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 88, 9, 9)]);
    // An upstream SERVFAIL with no other upstream left: SERVFAIL.
    let (m, _) = udp(h.addr, &question("servfail.example.", RecordType::A, None)).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    assert!(upstream.udp_queries.load(Ordering::Relaxed) >= 5);

    let mut text = String::new();
    h.metrics.render_prometheus(&mut text);
    assert!(
        text.contains("ployz_dns_forward_tcp_retries_total 1\n"),
        "{text}"
    );
    assert!(h.metrics.queries(QuerySource::Forwarded) >= 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarded_answers_are_kept_for_their_ttl_per_type_and_negative_ones_by_the_soa() {
    let upstream = Upstream::start().await;
    let h = Harness::start(|c| c.upstreams = vec![upstream.addr]).await;
    // Asked twice, by two clients (other IDs, other case): the upstream is asked once, and
    // the second answer is the first with the client's ID and question.
    let (first, _) = udp(h.addr, &question("host5.example.", RecordType::A, None)).await;
    assert_eq!(addresses(&first), vec![Ipv4Addr::new(10, 88, 0, 5)]);
    let again = question("HoSt5.EXAMPLE.", RecordType::A, None);
    let (second, _) = udp(h.addr, &again).await;
    assert_eq!(second.metadata.id, again.metadata.id);
    assert_eq!(second.queries[0].name().to_ascii(), "HoSt5.EXAMPLE.");
    assert_eq!(addresses(&second), vec![Ipv4Addr::new(10, 88, 0, 5)]);
    assert!(second.answers[0].ttl <= 60, "{}", second.answers[0].ttl);
    // Over TCP too.
    let m = tcp(h.addr, &question("host5.example.", RecordType::A, None)).await;
    assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 88, 0, 5)]);
    assert_eq!(upstream.asked("host5.example.", RecordType::A), 1);
    assert_eq!(h.metrics.cache_hits(), 2);
    // Another type is another question.
    udp(h.addr, &question("host5.example.", RecordType::AAAA, None)).await;
    assert_eq!(upstream.asked("host5.example.", RecordType::AAAA), 1);

    // NXDOMAIN with an SOA is kept too (for its MINIMUM); without one, it is asked again.
    for _ in 0..3 {
        let (m, _) = udp(h.addr, &question("gone.example.", RecordType::A, None)).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
        let (m, _) = udp(h.addr, &question("nope.example.", RecordType::A, None)).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    }
    assert_eq!(upstream.asked("gone.example.", RecordType::A), 1);
    assert_eq!(upstream.asked("nope.example.", RecordType::A), 3);

    // A one-second TTL: kept, then asked again once it has run out.
    udp(h.addr, &question("short.example.", RecordType::A, None)).await;
    let (m, _) = udp(h.addr, &question("short.example.", RecordType::A, None)).await;
    assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 88, 1, 1)]);
    let kept_for = Instant::now();
    while upstream.asked("short.example.", RecordType::A) < 2 {
        assert!(
            kept_for.elapsed() < WAIT,
            "the answer outlived its TTL: {} asks",
            upstream.asked("short.example.", RecordType::A)
        );
        let (m, _) = udp(h.addr, &question("short.example.", RecordType::A, None)).await;
        assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 88, 1, 1)]);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        kept_for.elapsed() >= Duration::from_millis(500),
        "asked again after {:?}, inside its TTL",
        kept_for.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_reuse_connected_sockets_for_a_while_then_change_port() {
    let upstream = Upstream::start().await;
    let h = Harness::start(|c| c.upstreams = vec![upstream.addr]).await;
    // 200 different names one after the other: no answer kept can serve them.
    for n in 0..200u32 {
        let name = format!("q{n}.example.");
        let (m, _) = udp(h.addr, &question(&name, RecordType::A, None)).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
    }
    let ports = upstream.ports.lock().unwrap().clone();
    assert_eq!(ports.len(), 200);
    let distinct: HashSet<u16> = ports.iter().copied().collect();
    // Sockets are reused (no bind and connect per query), and worn out ones replaced by
    // sockets on other ports.
    assert!(
        distinct.len() < 20,
        "{} ports for 200 queries",
        distinct.len()
    );
    assert!(
        distinct.len() >= 3,
        "one port for 200 queries: {distinct:?}"
    );
    // Consecutive uses of one port never exceed what a socket serves.
    let longest = ports
        .chunk_by(|a, b| a == b)
        .map(<[u16]>::len)
        .max()
        .unwrap_or(0);
    assert!(longest <= 64, "{longest} queries on one port in a row");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwarding_fails_over_and_ends_in_servfail() {
    let (_hole, hole) = black_hole().await;
    let dead = closed_port().await;
    let h = Harness::start(|c| {
        c.upstreams = vec![hole, dead];
        c.forward_timeout = Duration::from_millis(300);
    })
    .await;
    let started = Instant::now();
    let (m, _) = udp(h.addr, &question("host1.example.", RecordType::A, None)).await;
    assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(2),
        "one timeout, then a refused port: {took:?}"
    );
    let mut text = String::new();
    h.metrics.render_prometheus(&mut text);
    assert!(
        text.contains("ployz_dns_forward_failed_total 1\n"),
        "{text}"
    );

    // Without upstreams, other names are refused rather than forwarded.
    let lonely = Harness::start(|_| {}).await;
    let (m, _) = udp(
        lonely.addr,
        &question("host1.example.", RecordType::A, None),
    )
    .await;
    assert_eq!(m.metadata.response_code, ResponseCode::Refused);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sources_outside_the_allowed_networks_are_refused() {
    let upstream = Upstream::start().await;
    let h = Harness::start(|c| {
        c.allowed_sources = AllowedSources::new(["10.0.0.0/8".parse().unwrap()]);
        c.upstreams = vec![upstream.addr];
    })
    .await;
    h.observe(&container(
        &h.local.id,
        "web",
        &ServiceId::generate(),
        Ipv4Addr::new(10, 210, 5, 2),
    ));
    h.wait_addresses("web.internal", 1).await;
    for name in ["web.internal.", "host1.example."] {
        let (m, _) = udp(h.addr, &question(name, RecordType::A, None)).await;
        assert_eq!(m.metadata.response_code, ResponseCode::Refused, "{name}");
        assert!(m.answers.is_empty());
        // Over TCP a stranger gets no connection slot at all: closed before any answer.
        let mut stream = TcpStream::connect(h.addr).await.unwrap();
        let packet = question(name, RecordType::A, None).to_vec().unwrap();
        assert_eq!(tcp_raw(&mut stream, &packet).await, None, "{name}");
    }
    assert_eq!(
        upstream.udp_queries.load(Ordering::Relaxed),
        0,
        "never forwarded"
    );
    assert_eq!(h.metrics.queries(QuerySource::Refused), 2);
    assert_eq!(h.metrics.responses(Rcode::Refused), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_packets_do_not_kill_the_server() {
    let h = Harness::start(|_| {}).await;
    h.observe(&container(
        &h.local.id,
        "web",
        &ServiceId::generate(),
        Ipv4Addr::new(10, 210, 5, 2),
    ));
    h.wait_addresses("web.internal", 1).await;

    // Random junk, fast.
    let junk = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    for i in 0..2000 {
        let len = (i * 7) % 700;
        let packet: Vec<u8> = (0..len)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed as u8
            })
            .collect();
        junk.send_to(&packet, h.addr).await.unwrap();
    }

    let good = question("web.internal.", RecordType::A, None)
        .to_vec()
        .unwrap();
    // Two questions: FORMERR.
    let mut two = good.clone();
    two[5] = 2;
    let reply = udp_raw(h.addr, &two, WAIT).await.expect("FORMERR");
    assert_eq!(reply[3] & 0x0f, 1);
    // No question at all: FORMERR.
    let mut none = good.clone();
    none[5] = 0;
    let reply = udp_raw(h.addr, &none, WAIT).await.expect("FORMERR");
    assert_eq!(reply[3] & 0x0f, 1);
    // An oversized name: FORMERR.
    let mut long = good[..12].to_vec();
    for _ in 0..5 {
        long.push(63);
        long.extend_from_slice(&[b'a'; 63]);
    }
    long.extend_from_slice(&[0, 0, 1, 0, 1]);
    let reply = udp_raw(h.addr, &long, WAIT).await.expect("FORMERR");
    assert_eq!(reply[3] & 0x0f, 1);
    // Too short for a header, or a response: no reply at all.
    assert_eq!(
        udp_raw(h.addr, &good[..7], Duration::from_millis(300)).await,
        None
    );
    let mut response = good.clone();
    response[2] |= 0x80;
    assert_eq!(
        udp_raw(h.addr, &response, Duration::from_millis(300)).await,
        None
    );
    // Junk over TCP closes that connection only.
    let mut stream = TcpStream::connect(h.addr).await.unwrap();
    assert_eq!(tcp_raw(&mut stream, &[1, 2, 3]).await, None);

    // Still answering, over both transports.
    let (m, _) = udp(h.addr, &question("web.internal.", RecordType::A, None)).await;
    assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 210, 5, 2)]);
    let m = tcp(h.addr, &question("web.internal.", RecordType::A, None)).await;
    assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 210, 5, 2)]);
    assert!(h.metrics.queries(QuerySource::Malformed) >= 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_forwards_cannot_starve_internal_answers() {
    let (_hole, hole) = black_hole().await;
    // The forwards to the black hole hang for the whole test: whatever is answered meanwhile was
    // not waiting for them (no timing involved).
    const FORWARD_TIMEOUT: Duration = Duration::from_secs(30);
    let h = Harness::start(|c| {
        c.upstreams = vec![hole];
        c.forward_timeout = FORWARD_TIMEOUT;
        c.max_concurrent_forwards = 16;
    })
    .await;
    h.observe(&container(
        &h.local.id,
        "web",
        &ServiceId::generate(),
        Ipv4Addr::new(10, 210, 5, 2),
    ));
    h.wait_addresses("web.internal", 1).await;

    let flood = Arc::new(UdpSocket::bind("127.0.0.1:0").await.unwrap());
    let queries: Vec<Message> = (0..500)
        .map(|i| question(&format!("host{i}.example."), RecordType::A, None))
        .collect();
    let ids: HashSet<u16> = queries.iter().map(|q| q.metadata.id).collect();
    // Read the answers while sending, so the client's socket buffer never overflows.
    let reader = {
        let flood = flood.clone();
        tokio::spawn(async move {
            let mut servfails = 0;
            let mut buf = vec![0u8; 512];
            // Far inside the forward timeout: a SERVFAIL read here was not a timed-out forward.
            let deadline = Instant::now() + FORWARD_TIMEOUT / 3;
            while servfails < 500 - 16 {
                let left = deadline.saturating_duration_since(Instant::now());
                let Ok(Ok((n, _))) = tokio::time::timeout(left, flood.recv_from(&mut buf)).await
                else {
                    break;
                };
                let m = Message::from_vec(&buf[..n]).unwrap();
                assert!(ids.contains(&m.metadata.id));
                assert_eq!(m.metadata.response_code, ResponseCode::ServFail);
                servfails += 1;
            }
            servfails
        })
    };
    // Paced a little, so no socket buffer on the way (ours or the client's) overflows.
    for chunk in queries.chunks(25) {
        for q in chunk {
            flood.send_to(&q.to_vec().unwrap(), h.addr).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(3)).await;
    }
    // While 16 forwards hang on the black hole, `.internal` queries are answered, correctly.
    for _ in 0..20 {
        let (m, _) = udp(h.addr, &question("web.internal.", RecordType::A, None)).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(addresses(&m), vec![Ipv4Addr::new(10, 210, 5, 2)]);
    }
    let metric = |name: &str| -> u64 {
        let mut text = String::new();
        h.metrics.render_prometheus(&mut text);
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .unwrap_or_else(|| panic!("no {name} in {text}"))
            .parse()
            .unwrap()
    };
    // No forward has ended yet: every internal answer above came while the pool was full.
    assert_eq!(
        metric("ployz_dns_forward_failed_total"),
        0,
        "a forward ended before the internal answers: they may have waited for it"
    );
    // The forwards beyond the cap were answered SERVFAIL without waiting for a forward slot.
    let servfails = reader.await.unwrap();
    assert!(servfails >= 500 - 16, "{servfails} immediate SERVFAILs");
    let rejected = metric("ployz_dns_forward_rejected_total");
    assert!(rejected >= 484, "{rejected}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_is_reported_with_its_usual_holders() {
    let holder = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = holder.local_addr().unwrap();
    let err = DnsServer::bind(
        DnsServerConfig::new(addr),
        DnsController::new().snapshot().clone(),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, DnsError::AddressInUse { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains(&addr.to_string()), "{text}");
    assert!(text.contains("systemd-resolved"), "{text}");
    assert!(text.contains("dnsmasq"), "{text}");
    assert!(text.contains("0.0.0.0:53"), "{text}");

    // Taken for TCP only: reported too.
    let tcp_holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp_holder.local_addr().unwrap();
    if std::net::UdpSocket::bind(addr).is_ok() {
        let err = ployz_dns::check_port_free(addr).unwrap_err();
        assert!(
            matches!(
                err,
                DnsError::AddressInUse {
                    protocol: "TCP",
                    ..
                }
            ),
            "{err:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_stops_every_socket() {
    let controller = DnsController::new();
    let server = DnsServer::bind(
        DnsServerConfig::new("127.0.0.1:0".parse().unwrap()),
        controller.snapshot().clone(),
    )
    .await
    .unwrap();
    let addr = server.local_addr();
    let (tx, rx) = watch::channel(false);
    let serving = tokio::spawn(server.run(rx));
    let (m, _) = udp(addr, &question("x.internal.", RecordType::A, None)).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);
    tx.send(true).unwrap();
    tokio::time::timeout(WAIT, serving).await.unwrap().unwrap();
    // The UDP threads notice within their poll interval and release the port.
    let deadline = Instant::now() + WAIT;
    while ployz_dns::check_port_free(addr).is_err() {
        assert!(Instant::now() < deadline, "port still held after shutdown");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dig_agrees_when_installed() {
    let Ok(out) = std::process::Command::new("sh")
        .args(["-c", "command -v dig"])
        .output()
    else {
        return;
    };
    if !out.status.success() {
        eprintln!("dig is not installed; skipping");
        return;
    }
    let h = Harness::start(|_| {}).await;
    h.observe(&container(
        &h.local.id,
        "web",
        &ServiceId::generate(),
        Ipv4Addr::new(10, 210, 5, 2),
    ));
    h.wait_addresses("web.internal", 1).await;
    let out = tokio::process::Command::new("dig")
        .args([
            "+time=2",
            "+tries=1",
            &format!("@{}", h.addr.ip()),
            "-p",
            &h.addr.port().to_string(),
            "web.internal",
            "A",
        ])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("status: NOERROR"), "{text}");
    assert!(text.contains(" aa "), "{text}");
    assert!(text.contains("10.210.5.2"), "{text}");
}
