//! The RouteController: rebuilds the route table when container observations or drain marks
//! change, and carries out the edge's side of a drain ([`RouteController::drain`]): wait until
//! the published table no longer routes to the container while the hostnames others serve keep
//! an upstream, then until this edge has no request in flight to it.
//!
//! A store that cannot be read leaves the published table as it is: the failure is counted
//! ([`RouteController::rebuild_failures`]), logged once per streak, and the rebuild tried again.
//!
//! After every rebuild the edge reports what it serves in this Machine's [`EdgeReport`] record
//! (when that changed): the published generation and, for every drain mark of any Machine, the
//! requests still in flight to that container. A drained container with requests in flight is
//! watched, and the report written again once the last one ends, so the Machine draining it
//! (which waits for every edge's report) learns without asking.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use arc_swap::ArcSwap;
use ployz_core::api::{EdgeIngressPortView, EdgeRouteView, EdgeRoutes, EdgeUpstreamView};
use ployz_core::{
    AppliedDrain, ContainerId, ContainerRuntimeObservation, DrainMark, EdgeReport, GateState,
    HostProtocol, MachineId, PathMatch, ServiceId,
};
use ployz_store::drains::{stored_marks, DRAINING_NAMESPACE};
use ployz_store::edge_reports::put_report;
use ployz_store::follow::{follow, View};
use ployz_store::gates::{stored_gates, GATES_NAMESPACE};
use ployz_store::observations::{stored_observations, CONTAINERS_NAMESPACE};
use ployz_store::route_users::{stored_users, ROUTE_USERS_NAMESPACE};
use ployz_store::{KeyPrefix, Store, StoreError};
use tokio::sync::{watch, Notify};
use tokio::time::Instant;

use crate::exchanges::Exchanges;
use crate::route_table::{Fingerprint, InFlight, InFlightCounters, RouteTable, Standing};

#[derive(Default)]
pub(crate) struct Counters(Mutex<HashMap<ContainerId, Arc<InFlight>>>);

impl Counters {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<ContainerId, Arc<InFlight>>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl InFlightCounters for Counters {
    fn counter(&self, container: &ContainerId) -> Arc<InFlight> {
        self.lock().entry(container.clone()).or_default().clone()
    }
}

/// What [`RouteController::drain`] saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Drained {
    /// Whether the published table stopped routing to the container (with every hostname to
    /// keep served) before the publish deadline.
    pub unrouted: bool,
    /// Requests this edge still had in flight to the container when the drain returned (0
    /// unless the deadline came first).
    pub in_flight_left: usize,
}

/// Owns the published [`RouteTable`] and the per-container in-flight counters.
#[derive(Clone, Default)]
pub struct RouteController {
    table: Arc<ArcSwap<RouteTable>>,
    counters: Arc<Counters>,
    /// Signalled on every publish.
    published: Arc<Notify>,
    /// Rebuilds that failed because the store could not be read.
    rebuild_failures: Arc<AtomicU64>,
    /// The Machines this Machine observes down (their containers are tried last).
    down_machines: Arc<Mutex<HashSet<MachineId>>>,
    /// Exchanges in flight with containers on other Machines.
    exchanges: Arc<Exchanges>,
    /// The Ingress Ports this edge could not listen on, and why.
    not_listening: Arc<Mutex<HashMap<(u16, HostProtocol), String>>>,
    /// Rings when `down_machines` changed, or the last request in flight to a drained container
    /// ended: the table is rebuilt and the report written again.
    nudge: Arc<Notify>,
    /// The report last written, and the drained containers watched for their last request.
    reported: Arc<Mutex<Reported>>,
    /// Where the edge's milliseconds (failure marks) are counted from.
    epoch: Epoch,
}

/// A monotonic origin, set when the controller is made.
#[derive(Clone, Copy)]
struct Epoch(std::time::Instant);

impl Default for Epoch {
    fn default() -> Epoch {
        Epoch(std::time::Instant::now())
    }
}

/// What the edge last reported.
#[derive(Default)]
struct Reported {
    report: Option<EdgeReport>,
    watched: HashSet<ContainerId>,
}

impl RouteController {
    /// A controller publishing an empty table (every host is unknown until the first build).
    pub fn new() -> RouteController {
        RouteController::default()
    }

    /// A controller publishing a fixed table (the edge alone).
    pub fn fixed(table: RouteTable) -> RouteController {
        let c = RouteController::default();
        c.table.store(Arc::new(table));
        c
    }

    /// The published table, for the hot path: one atomic load.
    pub fn table(&self) -> &Arc<ArcSwap<RouteTable>> {
        &self.table
    }

    /// Completes once a table built from the store is published (generation 1 on).
    pub async fn first_published(&self) {
        loop {
            // Created before the look: a publish after it wakes it.
            let published = self.published();
            if self.table.load().generation() > 0 {
                return;
            }
            published.await;
        }
    }

    /// Milliseconds since the controller was made: the clock of upstream failure marks
    /// ([`crate::Route::mark_failed`]).
    pub fn now_ms(&self) -> u64 {
        self.epoch.0.elapsed().as_millis() as u64
    }

    /// The routes as this edge serves them now (`ployz routes`), sorted by hostname and path.
    pub fn view(&self) -> EdgeRoutes {
        let table = self.table.load();
        let now = self.now_ms();
        let upstreams = |r: &crate::Route| -> Vec<EdgeUpstreamView> {
            r.upstreams
                .iter()
                .enumerate()
                .map(|(i, u)| EdgeUpstreamView {
                    address: u.addr.to_string(),
                    container_id: u.container_id.clone(),
                    local: u.local,
                    on_down_machine: u.on_down_machine,
                    failing: r.marked_failed(i, now),
                    in_flight: u.in_flight.get(),
                })
                .collect()
        };
        let not_listening = self
            .not_listening
            .lock()
            .expect("not listening poisoned")
            .clone();
        let mut ingress_ports: Vec<EdgeIngressPortView> = table
            .routes()
            .filter_map(|r| {
                let (port, protocol) = r.ingress_port?;
                Some(EdgeIngressPortView {
                    port,
                    protocol,
                    service: r.service.to_string(),
                    not_listening: not_listening.get(&(port, protocol)).cloned(),
                    upstreams: upstreams(r),
                })
            })
            .collect();
        ingress_ports.sort_by_key(|p| (p.port, p.protocol));
        let mut routes: Vec<EdgeRouteView> = table
            .routes()
            .filter(|r| r.ingress_port.is_none())
            .map(|r| EdgeRouteView {
                hostname: r.hostname.to_string(),
                path: r.path.clone(),
                service: r.service.to_string(),
                strips: r.strip > 0,
                https: r.https,
                gate: r.gate.as_ref().map(|g| match g {
                    crate::route_table::RouteGate::Maintenance { .. } => "maintenance".to_owned(),
                    crate::route_table::RouteGate::Paused { .. } => "paused".to_owned(),
                }),
                redirect: r
                    .redirect
                    .as_ref()
                    .map(|(status, to)| ployz_core::Redirect {
                        status: *status,
                        to: to.to_string(),
                    }),
                rules: r.rules(),
                upstreams: upstreams(r),
            })
            .collect();
        routes.sort_by(|a, b| (&a.hostname, &a.path).cmp(&(&b.hostname, &b.path)));
        EdgeRoutes {
            generation: table.generation(),
            routes,
            ingress_ports,
        }
    }

    /// Records why this edge is not listening on an Ingress Port (`None`: it is), for `ployz
    /// routes`.
    pub fn set_not_listening(&self, port: (u16, HostProtocol), why: Option<String>) {
        let mut map = self.not_listening.lock().expect("not listening poisoned");
        match why {
            Some(why) => map.insert(port, why),
            None => map.remove(&port),
        };
    }

    /// Completes at the next publish of a table (created before the table is looked at, it
    /// sees a publish made after the look).
    pub fn published(&self) -> tokio::sync::futures::Notified<'_> {
        self.published.notified()
    }

    /// Requests this edge has in flight to `container`.
    pub fn in_flight(&self, container: &ContainerId) -> usize {
        self.counters.lock().get(container).map_or(0, |c| c.get())
    }

    /// Sets the Machines this Machine observes down; a change rebuilds the table (their
    /// containers move to the end of each route, tried only when no other is left).
    ///
    /// The exchanges this edge has open with containers on a Machine newly observed down end
    /// at once ([`Exchanges::cut`]): nothing comes back from a Machine that lost power, and
    /// they would wait out an I/O timeout.
    pub fn set_machines_down(&self, down: HashSet<MachineId>) {
        let mut current = self.down_machines.lock().expect("down machines poisoned");
        if *current != down {
            for (m, cut) in self.exchanges.set_down(&down) {
                if cut > 0 {
                    tracing::info!(machine = %m, exchanges = cut, "Machine observed down: its exchanges in flight were ended");
                }
            }
            *current = down;
            self.nudge.notify_one();
        }
    }

    /// The in-flight counters, for tests that build a table by hand.
    #[cfg(test)]
    pub(crate) fn counters_for_tests(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// The exchanges this edge has open with containers on other Machines.
    pub fn exchanges(&self) -> &Arc<Exchanges> {
        &self.exchanges
    }

    /// How many rebuilds failed because the store could not be read (each left the published
    /// table as it was).
    pub fn rebuild_failures(&self) -> u64 {
        self.rebuild_failures.load(Ordering::Relaxed)
    }

    /// Rebuilds from the store and publishes if anything changed. Returns the new generation
    /// when it published. When the store cannot be read, the published table stays as it is,
    /// the failure is counted ([`RouteController::rebuild_failures`]) and returned.
    pub fn rebuild(
        &self,
        store: &Store,
        last: &mut Fingerprint,
    ) -> Result<Option<u64>, StoreError> {
        let read = stored_observations(store).and_then(|observations| {
            Ok((
                observations,
                stored_marks(store)?,
                stored_gates(store)?,
                stored_users(store)?,
            ))
        });
        let (observations, marks, gates, users) = match read {
            Ok(read) => read,
            Err(e) => {
                self.rebuild_failures.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        let draining: HashSet<ContainerId> = marks.iter().map(|m| m.container_id.clone()).collect();
        let generation = self.table.load().generation() + 1;
        let down = self
            .down_machines
            .lock()
            .expect("down machines poisoned")
            .clone();
        let gates: HashMap<ServiceId, GateState> =
            gates.into_iter().map(|g| (g.service_id, g.state)).collect();
        let users: HashMap<String, Arc<crate::auth::Users>> = users
            .into_iter()
            .filter_map(|(digest, list)| {
                Some((digest, Arc::new(crate::auth::Users::parse(&list)?)))
            })
            .collect();
        let table = RouteTable::build_gated(
            &observations,
            &draining,
            (store.local(), &down),
            self.counters.as_ref(),
            Standing {
                generation,
                gates: &gates,
                users: &users,
            },
        );
        // Counters of containers that are gone are dropped (in-flight requests keep theirs).
        {
            let live: HashSet<&ContainerId> = observations.iter().map(|o| &o.id).collect();
            self.counters
                .lock()
                .retain(|id, c| live.contains(id) || c.get() > 0);
        }
        let fp = table.fingerprint();
        // The first rebuild publishes even an empty table: generation 1 says the store has
        // been read (a handed-over Ingress Port it does not route then closes).
        let published = if &fp == last && generation > 1 {
            None
        } else {
            *last = fp;
            self.table.store(Arc::new(table));
            self.published.notify_waiters();
            Some(generation)
        };
        self.report(store, &marks);
        Ok(published)
    }

    /// Writes this Machine's [`EdgeReport`] when it changed: the published generation, and per
    /// drain mark the requests in flight to its container (the published table routes to none
    /// of them). A container with requests left is watched until they end, then the table is
    /// rebuilt (which reports again). A report that cannot be written is logged; the next
    /// rebuild tries again.
    fn report(&self, store: &Store, marks: &[DrainMark]) {
        let mut drains: Vec<AppliedDrain> = marks
            .iter()
            .map(|m| AppliedDrain {
                container_id: m.container_id.clone(),
                set_at_ms: m.set_at_ms,
                in_flight: self.in_flight(&m.container_id),
            })
            .collect();
        drains.sort_by(|a, b| a.container_id.cmp(&b.container_id));
        let report = EdgeReport {
            generation: self.table.load().generation(),
            drains,
        };
        let mut reported = self.reported.lock().unwrap_or_else(PoisonError::into_inner);
        for d in report.drains.iter().filter(|d| d.in_flight > 0) {
            if !reported.watched.insert(d.container_id.clone()) {
                continue;
            }
            let (counter, nudge, reported_too) = (
                self.counters.counter(&d.container_id),
                self.nudge.clone(),
                self.reported.clone(),
            );
            let container = d.container_id.clone();
            // A drain lasts an hour at most; a watch ends with it.
            let until = Instant::now() + std::time::Duration::from_secs(3600);
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move {
                    counter.wait_for_zero(until).await;
                    reported_too
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .watched
                        .remove(&container);
                    nudge.notify_one();
                });
            }
        }
        if reported.report.as_ref() == Some(&report) {
            return;
        }
        match put_report(store, &report) {
            Ok(()) => reported.report = Some(report),
            Err(e) => tracing::warn!(error = %e, "the edge report could not be written"),
        }
    }

    /// Keeps the table current until `shutdown` turns true: a rebuild at start and after every
    /// change to container observations, drain marks, Service Gates or users lists, and again
    /// shortly after
    /// a rebuild the
    /// store could not be read for (the table published before stays meanwhile).
    pub async fn run(&self, store: Arc<Store>, shutdown: watch::Receiver<bool>) {
        let prefixes = vec![
            KeyPrefix::machine_namespace(CONTAINERS_NAMESPACE),
            KeyPrefix::machine_namespace(DRAINING_NAMESPACE),
            KeyPrefix::cluster_namespace(GATES_NAMESPACE),
            KeyPrefix::cluster_namespace(ROUTE_USERS_NAMESPACE),
        ];
        let view = PublishedRoutes {
            controller: self.clone(),
            last: Fingerprint::new(),
        };
        follow(store, prefixes, view, shutdown).await;
    }

    /// The edge's side of draining `container` (already marked draining in the store):
    ///
    /// 1. waits until the published table no longer routes to it while every route (hostname
    ///    and path) in `keep_served` still has an upstream, or until `publish_by`;
    /// 2. then waits until this edge has no request in flight to it, or until `deadline`.
    ///
    /// Both waits are woken by what they wait for (a publish, the last request in flight
    /// ending); nothing polls.
    pub async fn drain(
        &self,
        container: &ContainerId,
        keep_served: &[(String, PathMatch)],
        publish_by: Instant,
        deadline: Instant,
    ) -> Drained {
        let unrouted = loop {
            // Registered before the table is looked at: a publish after the look wakes it.
            let published = self.published.notified();
            let table = self.table.load();
            if !table.routes_to(container)
                && keep_served.iter().all(|(h, p)| table.has_upstream(h, p))
            {
                break true;
            }
            if tokio::time::timeout_at(publish_by, published)
                .await
                .is_err()
            {
                break false;
            }
        };
        let counter = self.counters.counter(container);
        let in_flight_left = counter.wait_for_zero(deadline).await;
        Drained {
            unrouted,
            in_flight_left,
        }
    }
}

/// The routes of `container` (hostname, lowercase, and path) that another Serving Container
/// among `observations` also serves: a drain of `container` keeps them routed
/// ([`RouteController::drain`]'s `keep_served`).
pub fn paths_served_by_others(
    container: &ContainerRuntimeObservation,
    observations: &[ContainerRuntimeObservation],
) -> Vec<(String, PathMatch)> {
    let Some(spec) = &container.spec else {
        return Vec::new();
    };
    let serves = |o: &ContainerRuntimeObservation, host: &str, path: &PathMatch| {
        o.spec.as_ref().is_some_and(|spec| {
            spec.served_paths()
                .iter()
                .any(|s| s.hostname.eq_ignore_ascii_case(host) && &s.path == path)
        })
    };
    spec.served_paths()
        .into_iter()
        .filter(|s| {
            observations
                .iter()
                .any(|o| o.id != container.id && o.is_serving() && serves(o, s.hostname, &s.path))
        })
        .map(|s| (s.hostname.to_ascii_lowercase(), s.path))
        .collect()
}

/// The route table as a view of the store ([`follow`] keeps it current).
struct PublishedRoutes {
    controller: RouteController,
    /// The fingerprint of the table published last.
    last: Fingerprint,
}

impl View for PublishedRoutes {
    fn what(&self) -> &'static str {
        "route table"
    }

    fn rebuild(&mut self, store: &Store) -> Result<Option<u64>, StoreError> {
        self.controller.rebuild(store, &mut self.last)
    }

    fn size(&self) -> String {
        let t = self.controller.table.load();
        format!("generation {}, {} hostnames", t.generation(), t.len())
    }

    fn nudge(&self) -> Option<Arc<Notify>> {
        Some(self.controller.nudge.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::{ContainerState, DrainMark, IngressProtocol, MachineId};
    use ployz_store::observations::container_key;
    use std::time::Duration;

    /// Far enough that a drain returning means it was woken, not timed out.
    const FAR: Duration = Duration::from_secs(3600);
    /// The longest a woken drain may take to return before the test fails.
    const WAKE: Duration = Duration::from_secs(30);

    /// A running Service Container `web-<n>` serving `host` over HTTP on port 80.
    fn obs(machine: &MachineId, n: u8, host: &str) -> ContainerRuntimeObservation {
        crate::route_table::tests::obs(
            machine,
            n,
            &[(host, 80, IngressProtocol::Http)],
            ContainerState::Running,
            None,
        )
    }

    fn observe(store: &Store, o: &ContainerRuntimeObservation) {
        store
            .put(&container_key(o), serde_json::to_vec(o).unwrap())
            .unwrap();
    }

    fn mark(store: &Store, container: &ContainerId) {
        ployz_store::drains::put_mark(
            store,
            &DrainMark {
                container_id: container.clone(),
                machine_id: store.local().clone(),
                lease_token: None,
                set_by: "a test".into(),
                set_at_ms: 0,
                deadline_ms: u64::MAX,
            },
        )
        .unwrap();
    }

    /// A store with two containers serving `app.test`, and a controller publishing them.
    fn two_upstreams() -> (
        Store,
        RouteController,
        Fingerprint,
        ContainerRuntimeObservation,
        ContainerRuntimeObservation,
    ) {
        let store = Store::temporary(MachineId::generate()).unwrap();
        let (a, b) = (
            obs(store.local(), 2, "app.test"),
            obs(store.local(), 3, "app.test"),
        );
        observe(&store, &a);
        observe(&store, &b);
        let routes = RouteController::new();
        let mut fp = Fingerprint::new();
        assert_eq!(routes.rebuild(&store, &mut fp).unwrap(), Some(1));
        (store, routes, fp, a, b)
    }

    /// The first rebuild publishes even when the store routes nothing: generation 1 says the
    /// store was read (a handed-over Ingress Port it does not route closes on it).
    #[test]
    fn the_first_rebuild_publishes_an_empty_table_and_the_next_only_a_change() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        let routes = RouteController::new();
        let mut fp = Fingerprint::new();
        assert_eq!(routes.table().load().generation(), 0);
        assert_eq!(routes.rebuild(&store, &mut fp).unwrap(), Some(1));
        assert_eq!(routes.table().load().generation(), 1);
        assert_eq!(routes.rebuild(&store, &mut fp).unwrap(), None);
    }

    #[test]
    fn a_store_that_cannot_be_read_leaves_the_published_table() {
        let (store, routes, mut fp, a, b) = two_upstreams();
        store.fail_reads(Some("injected read failure"));
        mark(&store, &a.id);
        let e = routes.rebuild(&store, &mut fp).unwrap_err();
        assert!(e.to_string().contains("injected read failure"), "{e}");
        assert_eq!(routes.rebuild_failures(), 1);
        let table = routes.table().load();
        assert_eq!(table.generation(), 1);
        assert!(table.routes_to(&a.id) && table.routes_to(&b.id));

        // Once the store reads again, the next rebuild catches up.
        store.fail_reads(None);
        assert_eq!(routes.rebuild(&store, &mut fp).unwrap(), Some(2));
        assert!(!routes.table().load().routes_to(&a.id));
        assert_eq!(routes.rebuild_failures(), 1);
    }

    #[tokio::test]
    async fn a_drain_returns_once_the_table_drops_the_container_and_its_requests_end() {
        let (store, routes, mut fp, a, _b) = two_upstreams();
        // A request in flight to `a`, taken from the published table as the request path does.
        let held = routes
            .table()
            .load()
            .match_host(b"app.test")
            .unwrap()
            .upstreams[0]
            .in_flight
            .clone();
        held.acquire();
        assert_eq!(routes.in_flight(&a.id), 1);

        let start = Instant::now();
        let drain = tokio::spawn({
            let (routes, id) = (routes.clone(), a.id.clone());
            async move {
                routes
                    .drain(
                        &id,
                        &[("app.test".to_owned(), PathMatch::root())],
                        start + FAR,
                        start + FAR,
                    )
                    .await
            }
        });
        // The mark is published; the drain then waits for the request in flight.
        mark(&store, &a.id);
        assert_eq!(routes.rebuild(&store, &mut fp).unwrap(), Some(2));
        tokio::task::yield_now().await;
        assert!(!drain.is_finished(), "a request is still in flight");
        held.release();
        let drained = tokio::time::timeout(WAKE, drain)
            .await
            .expect("the drain is woken by the last request ending, not by a poll")
            .unwrap();
        assert_eq!(
            drained,
            Drained {
                unrouted: true,
                in_flight_left: 0
            }
        );
    }

    #[tokio::test]
    async fn a_drain_waits_for_a_publish_without_polling() {
        let (store, routes, mut fp, a, _b) = two_upstreams();
        let start = Instant::now();
        let drain = tokio::spawn({
            let (routes, id) = (routes.clone(), a.id.clone());
            async move {
                routes
                    .drain(
                        &id,
                        &[("app.test".to_owned(), PathMatch::root())],
                        start + FAR,
                        start + FAR,
                    )
                    .await
            }
        });
        tokio::task::yield_now().await;
        assert!(
            !drain.is_finished(),
            "the table still routes to the container"
        );
        mark(&store, &a.id);
        routes.rebuild(&store, &mut fp).unwrap();
        let drained = tokio::time::timeout(WAKE, drain)
            .await
            .expect("the drain is woken by the publish, not by a poll")
            .unwrap();
        assert!(drained.unrouted);
        assert_eq!(drained.in_flight_left, 0);
    }

    #[tokio::test]
    async fn a_drain_returns_at_its_deadline_with_the_requests_left() {
        let (store, routes, mut fp, a, _b) = two_upstreams();
        let counter = routes.counters.counter(&a.id);
        counter.acquire();
        counter.acquire();
        mark(&store, &a.id);
        routes.rebuild(&store, &mut fp).unwrap();
        let start = Instant::now();
        let drained = routes
            .drain(
                &a.id,
                &[("app.test".to_owned(), PathMatch::root())],
                start + FAR,
                start + Duration::from_millis(20),
            )
            .await;
        assert_eq!(
            drained,
            Drained {
                unrouted: true,
                in_flight_left: 2
            }
        );
        counter.release();
        counter.release();
        assert_eq!(routes.in_flight(&a.id), 0);
    }

    #[tokio::test]
    async fn a_drain_that_would_leave_a_hostname_without_upstream_waits_until_its_publish_deadline()
    {
        let (store, routes, mut fp, a, b) = two_upstreams();
        // Both marked: `app.test` would have no upstream left.
        mark(&store, &a.id);
        mark(&store, &b.id);
        routes.rebuild(&store, &mut fp).unwrap();
        let start = Instant::now();
        let drained = routes
            .drain(
                &a.id,
                &[("app.test".to_owned(), PathMatch::root())],
                start + Duration::from_millis(20),
                start + FAR,
            )
            .await;
        assert_eq!(
            drained,
            Drained {
                unrouted: false,
                in_flight_left: 0
            }
        );
    }

    #[test]
    fn the_hostnames_to_keep_are_those_another_serving_container_serves() {
        let m = MachineId::generate();
        let a = obs(&m, 2, "App.Test");
        let b = obs(&m, 3, "app.test");
        let c = obs(&m, 4, "only-c.test");
        let mut stopped = obs(&m, 5, "only-c.test");
        stopped.state = ContainerState::Exited;
        let all = [a.clone(), b, c.clone(), stopped];
        assert_eq!(
            paths_served_by_others(&a, &all),
            [("app.test".to_owned(), PathMatch::root())]
        );
        assert!(paths_served_by_others(&c, &all).is_empty());
        assert!(paths_served_by_others(&a, std::slice::from_ref(&a)).is_empty());
    }
}
