//! An endpoint-aware balanced channel: [`Replicas`] chooses one replica per attempt, in
//! `call`, seeing the request.
//!
//! tonic's `Channel::balance_list` picks in `poll_ready`, before it sees the request, over
//! connections that report no load: a retry cannot avoid the replica that just failed it,
//! a replica that fails every call at once keeps its full share and spends the retries the
//! healthy ones earned. [`Replicas`] chooses through [`ReplicaSet`]
//! (the engine's balancer, which the tests drive directly): power of two choices over
//! latency and attempts in flight weighed by health, a retry sent to a replica the call has
//! not tried (with [`RetryLayer::over_replicas`](crate::RetryLayer::over_replicas) above,
//! which passes a [`Route`] down), outlier ejection, slow start, load reports and a budget
//! per replica. How each works, with its settings and measurements: the repository's
//! `docs/replicas.md`.
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use stormguard_client::{ClientConfig, ReplicaConfig, RetryLayer};
//! use stormguard_client::replicas::Replicas;
//! use tonic::transport::Endpoint;
//!
//! let endpoints = ["http://10.0.0.1:50051", "http://10.0.0.2:50051", "http://10.0.0.3:50051"]
//!     .map(Endpoint::from_static);
//! // Each replica gets its own lazily connected tonic `Channel`.
//! let replicas = Replicas::from_endpoints(ReplicaConfig::default(), endpoints)?;
//! // Clones share the replicas and their health: one to watch them.
//! let watch = replicas.clone();
//! let channel = tower::ServiceBuilder::new()
//!     .layer(RetryLayer::from_config(&ClientConfig::default())?.over_replicas())
//!     .service(replicas);
//! // let mut client = InventoryClient::new(channel);
//! for replica in watch.snapshot() {
//!     println!("{} {}", replica.key, replica.snapshot.state.as_str());
//! }
//! # let _ = channel;
//! # Ok(()) }
//! ```
//!
//! Replicas that come and go are fed as tower [`Change`]s: through the sender
//! [`Replicas::balance_channel`] returns (the shape of tonic's `Channel::balance_channel`),
//! or from any [`Discover`](tower::discover::Discover) stream with [`Replicas::discover`];
//! or they are found by DNS, resolved again as the records change, with
//! `Replicas::from_dns` (feature `dns`, on by default: see `Dns`).
//!
//! # Readiness contract
//!
//! `poll_ready` is always ready: the replica is chosen in `call`, and the response future
//! readies that replica's service (a clone of it) before sending. A tonic `Channel` is
//! ready while its buffer has room, so this waits only when a replica's buffer is full.
//! A call that finds no replica while one may soon take it (the first DNS lookup under
//! way, a replica without its first health answer) waits in its future too, within the
//! deadline its `grpc-timeout` says (see [`NotYet`]).

mod discover;
#[cfg(feature = "dns")]
mod dns;
mod future;
#[cfg(feature = "health")]
mod health;
#[cfg(feature = "opentelemetry")]
pub mod metrics;
mod route;

use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use stormguard_core::Instant;
use stormguard_core::{
    ReplicaConfig, ReplicaEvent, ReplicaId, ReplicaOutcome, ReplicaSet, ReplicaSnapshot, Unpicked,
};
use tokio::sync::oneshot;
use tower_service::Service;

#[cfg(feature = "dns")]
pub use self::dns::{Dns, DnsError, DnsReport};
pub(crate) use self::future::unwrap_error;
pub use self::future::{Error, NoReplica, NotServing, NotYet, ResponseFuture, Unresolved};
pub use self::route::Route;
/// What a DNS report counts (`DnsReport::counts`).
#[cfg(feature = "dns")]
pub use stormguard_core::RefreshCounts;
pub use tower::discover::Change;

use self::route::REMEMBERED;
use crate::status::BoxError;

/// A balanced channel over replicas that picks one per attempt (see the
/// [module docs](self)). Clones share the replicas and their health.
pub struct Replicas<S, K> {
    shared: Arc<Shared<S, K>>,
    // Dropped with the last clone of the channel, which tells the task that feeds it (see
    // `discover`) to end. Attempts in flight and routes hold `shared`, not this. `None`
    // for a channel no task feeds.
    _alive: Option<Arc<oneshot::Sender<()>>>,
}

impl<S, K> Clone for Replicas<S, K> {
    fn clone(&self) -> Self {
        Replicas {
            shared: Arc::clone(&self.shared),
            _alive: self._alive.clone(),
        }
    }
}

impl<S, K: fmt::Debug> fmt::Debug for Replicas<S, K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.shared.lock();
        f.debug_struct("Replicas")
            .field(
                "keys",
                &inner.members.iter().map(|m| &m.key).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

pub(crate) struct Shared<S, K> {
    inner: Mutex<Inner<S, K>>,
    /// Told when a replica refuses a connection or is ejected: the DNS task (if any)
    /// resolves early.
    early: Option<Arc<tokio::sync::Notify>>,
    /// What the DNS task reports after each resolution.
    #[cfg(feature = "dns")]
    dns: Option<tokio::sync::watch::Sender<DnsReport>>,
    /// Starts a replica's health-check task, when client-side health checks are on.
    health: Option<StartHealth<S>>,
    /// How many times a replica's health-check status changed ([`Replicas::health_changes`]).
    health_changes: tokio::sync::watch::Sender<u64>,
    /// Changes after anything that may let a waiting call pick a replica (a replica added,
    /// a health report, a resolution's end): what calls waiting for a replica watch.
    picks: tokio::sync::watch::Sender<u64>,
}

/// Starts the health-check task of a replica (its id, its service).
pub(crate) type StartHealth<S> = Box<dyn Fn(ReplicaId, &S) -> HealthTask + Send + Sync>;

/// A replica's health-check task: ended when dropped (with the replica).
pub(crate) struct HealthTask(#[allow(dead_code)] tokio::task::AbortHandle);

impl Drop for HealthTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Inner<S, K> {
    set: ReplicaSet,
    /// In the order of `set` (sorted by id).
    members: Vec<Member<S, K>>,
    /// Whether any attempt went out yet: a replica added after that joins with slow start.
    serving: bool,
    /// For a channel found by DNS whose name has not resolved (yet, or lately while empty):
    /// why, for the error of a call that finds no replica.
    unresolved: Option<Unresolved>,
    /// For a channel found by DNS, until its first resolution ends: the name.
    resolving: Option<Arc<str>>,
}

struct Member<S, K> {
    id: ReplicaId,
    key: K,
    name: Arc<str>,
    svc: S,
    /// Its health-check task, while checks are on.
    _health: Option<HealthTask>,
}

/// A replica as [`Replicas::snapshot`] reports it.
#[derive(Clone, Debug)]
pub struct ReplicaReport<K> {
    /// The replica's key (for [`Replicas::from_endpoints`], the endpoint's URI).
    pub key: K,
    /// Where it stands ([`state`](ReplicaSnapshot::state)), its counters and estimates.
    pub snapshot: ReplicaSnapshot,
}

impl<S, K> Shared<S, K> {
    /// The state of a channel over `set`.
    fn new(set: ReplicaSet, early: Option<Arc<tokio::sync::Notify>>) -> Self {
        Shared {
            inner: Mutex::new(Inner {
                set,
                members: Vec::new(),
                serving: false,
                unresolved: None,
                resolving: None,
            }),
            early,
            #[cfg(feature = "dns")]
            dns: None,
            health: None,
            health_changes: tokio::sync::watch::Sender::new(0),
            picks: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Wakes the calls waiting for a replica: call after any change that may let one
    /// pick (made before, so that a call that subscribes after it sees it).
    fn picks_changed(&self) {
        self.picks.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Asks the DNS task, if any, for an early resolution (it rate-limits them).
    fn resolve_early(&self) {
        if let Some(early) = &self.early {
            early.notify_one();
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner<S, K>> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a replica (see [`Replicas::insert`]).
    fn insert(&self, key: K, svc: S)
    where
        K: Eq + fmt::Display,
    {
        let now = Instant::now();
        let mut inner = self.lock();
        remove_key(&mut inner, &key);
        let id = if inner.serving {
            inner.set.insert_warming_at(now)
        } else {
            inner.set.insert_at(now)
        };
        let name = Arc::from(key.to_string());
        let _health = self.health.as_ref().map(|start| start(id, &svc));
        inner.members.push(Member {
            id,
            key,
            name,
            svc,
            _health,
        });
        drop(inner);
        self.picks_changed();
    }

    /// Applies a change from a discovery source.
    fn apply(&self, change: Change<K, S>)
    where
        K: Eq + fmt::Display,
    {
        match change {
            Change::Insert(key, svc) => self.insert(key, svc),
            Change::Remove(key) => {
                remove_key(&mut self.lock(), &key);
                self.picks_changed();
            }
        }
    }
}

/// Reports the end of an attempt to the set it was chosen from (the response future does
/// not need the replicas' service and key types).
pub(crate) trait EndAttempt: Send + Sync {
    fn end(&self, id: ReplicaId, outcome: ReplicaOutcome, started: Instant);

    /// `id` answered an attempt with the load report `report`.
    fn load_report(&self, id: ReplicaId, report: &stormguard_core::LoadReport);

    /// How many replicas the channel holds.
    fn replicas(&self) -> usize;
}

impl<S: Send, K: Send> EndAttempt for Shared<S, K> {
    fn end(&self, id: ReplicaId, outcome: ReplicaOutcome, started: Instant) {
        let now = Instant::now();
        let mut inner = self.lock();
        if outcome == ReplicaOutcome::Refused {
            self.resolve_early();
        }
        if inner.set.end_at(id, outcome, started, now).is_some() {
            let transitions = inner.set.take_transitions();
            if transitions
                .iter()
                .any(|t| matches!(t, ReplicaEvent::Ejected { .. }))
            {
                self.resolve_early();
            }
            let names: Vec<_> = transitions
                .iter()
                .map(|t| inner.name_of(transition_id(t)))
                .collect();
            drop(inner);
            for (t, name) in transitions.iter().zip(names) {
                log_transition(t, name.as_deref().unwrap_or("?"));
            }
        }
    }

    fn load_report(&self, id: ReplicaId, report: &stormguard_core::LoadReport) {
        self.lock().set.record_load_at(id, report, Instant::now());
    }

    fn replicas(&self) -> usize {
        self.lock().set.len()
    }
}

#[cfg(feature = "health")]
impl<S: Send, K: Send> health::HealthSink for Shared<S, K> {
    fn serving(&self, id: ReplicaId, status: stormguard_core::ServingStatus) {
        let mut inner = self.lock();
        let changed = inner.set.set_serving(id, status);
        let name = inner.name_of(id);
        drop(inner);
        // Even unchanged, a first report may end the wait of calls for a replica.
        self.picks_changed();
        let Some(before) = changed else {
            return;
        };
        self.health_changes.send_modify(|n| *n += 1);
        tracing::info!(
            replica = name.as_deref().unwrap_or("?"),
            from = before.as_str(),
            to = status.as_str(),
            "stormguard: replica health check changed"
        );
    }
}

fn transition_id(t: &ReplicaEvent) -> ReplicaId {
    match *t {
        ReplicaEvent::Ejected { id, .. } | ReplicaEvent::Returned { id } => id,
    }
}

/// INFO, once per transition.
fn log_transition(t: &ReplicaEvent, replica: &str) {
    match *t {
        ReplicaEvent::Ejected {
            reason,
            duration,
            ejections,
            ..
        } => tracing::info!(
            replica,
            reason = reason.as_str(),
            ejections,
            ejected_for_ms = duration.as_millis() as u64,
            "stormguard: replica ejected"
        ),
        ReplicaEvent::Returned { .. } => {
            tracing::info!(replica, "stormguard: replica returned")
        }
    }
}

impl<S, K> Inner<S, K> {
    fn index(&self, id: ReplicaId) -> Option<usize> {
        self.members.binary_search_by_key(&id, |m| m.id).ok()
    }

    fn name_of(&self, id: ReplicaId) -> Option<Arc<str>> {
        self.index(id).map(|i| Arc::clone(&self.members[i].name))
    }
}

impl<S, K> Replicas<S, K>
where
    K: Clone + Eq + Hash + fmt::Display,
{
    /// A channel over `services`, each a replica under its key (all at a full share).
    /// Client-side health checks ([`ReplicaConfig::health_check`]) need a tonic `Channel`
    /// per replica ([`from_endpoints`](Replicas::from_endpoints),
    /// [`balance_channel`](Replicas::balance_channel), `from_dns`): here they are an error.
    pub fn from_services(
        config: ReplicaConfig,
        services: impl IntoIterator<Item = (K, S)>,
    ) -> Result<Self, stormguard_core::ConfigError> {
        let replicas = Replicas::empty(config)?;
        for (key, svc) in services {
            replicas.insert(key, svc);
        }
        Ok(replicas)
    }

    /// A channel with no replica, over services of any kind (so without health checks).
    fn empty(config: ReplicaConfig) -> Result<Self, stormguard_core::ConfigError> {
        if config.health_check.is_some() {
            return Err(stormguard_core::ConfigError::invalid(
                "replicas.health_check",
                "client-side health checks need a tonic Channel per replica \
                 (Replicas::from_endpoints, balance_channel or from_dns)",
            ));
        }
        Ok(Replicas::over(Arc::new(Shared::new(
            ReplicaSet::new(config)?,
            None,
        ))))
    }

    /// The channel over `shared`, no task feeding it.
    fn over(shared: Arc<Shared<S, K>>) -> Self {
        Replicas {
            shared,
            _alive: None,
        }
    }

    /// This channel, fed by a task: what tells the task that its last clone is gone.
    fn watched(mut self) -> (Self, oneshot::Receiver<()>) {
        let (alive, gone) = oneshot::channel();
        self._alive = Some(Arc::new(alive));
        (self, gone)
    }

    /// Adds a replica (replacing the one with the same key, as tower's `Change::Insert`
    /// does). Before the first call it starts at a full share; later, it ramps up.
    pub fn insert(&self, key: K, svc: S) {
        self.shared.insert(key, svc);
    }

    /// Removes the replica with `key`; attempts in flight on it finish.
    pub fn remove(&self, key: &K) -> bool {
        let removed = remove_key(&mut self.shared.lock(), key);
        self.shared.picks_changed();
        removed
    }

    /// Every replica's key, state and counters, oldest first.
    pub fn snapshot(&self) -> Vec<ReplicaReport<K>> {
        let now = Instant::now();
        let inner = self.shared.lock();
        inner
            .members
            .iter()
            .filter_map(|m| {
                let snapshot = inner.set.snapshot_at(m.id, now)?;
                Some(ReplicaReport {
                    key: m.key.clone(),
                    snapshot,
                })
            })
            .collect()
    }

    /// A [`watch`](tokio::sync::watch) of how many times a replica's client-side health
    /// check changed status ([`ReplicaConfig::health_check`]): it changes after each, and
    /// [`snapshot`](Self::snapshot) says where each replica stands
    /// ([`ReplicaSnapshot::serving`]). Never changes while checks are off.
    pub fn health_changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.health_changes.subscribe()
    }

    /// The key of the replica `id` (as a [`Route`] or a [`ReplicaSnapshot`] names it),
    /// while the channel holds it.
    pub fn key(&self, id: ReplicaId) -> Option<K> {
        let inner = self.shared.lock();
        inner.index(id).map(|i| inner.members[i].key.clone())
    }

    /// How many replicas the channel holds.
    pub fn len(&self) -> usize {
        self.shared.lock().members.len()
    }

    /// Whether the channel holds no replica.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

fn remove_key<S, K: Eq>(inner: &mut Inner<S, K>, key: &K) -> bool {
    let Some(i) = inner.members.iter().position(|m| &m.key == key) else {
        return false;
    };
    let member = inner.members.remove(i);
    inner.set.remove(member.id);
    true
}

impl<S, K, B, RB> Service<http::Request<B>> for Replicas<S, K>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    K: Send + 'static,
{
    type Response = http::Response<RB>;
    type Error = Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Error>> {
        // The replica is chosen in `call`: its readiness, and a wait for a first replica,
        // are the response future's, bounded by the call's deadline.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let now = Instant::now();
        let route = request.extensions().get::<Route>().cloned();
        match Arc::clone(&self.shared).pick(route.as_ref(), now) {
            Picked::Replica { svc, id, ends } => ResponseFuture::new(svc, request, ends, id, now),
            Picked::Failed(error) => ResponseFuture::failed(error),
            Picked::Wait { changes, why } => {
                let picker: Arc<dyn Pick<S>> = self.shared.clone();
                ResponseFuture::waiting(picker, request, route, changes, why, now)
            }
        }
    }
}

/// What [`Pick::pick`] found for an attempt.
pub(crate) enum Picked<S> {
    /// The replica `id`, its service, and where its attempt's end is reported.
    Replica {
        svc: S,
        id: ReplicaId,
        ends: Arc<dyn EndAttempt>,
    },
    /// None yet, but one may soon take it (see [`Unpicked::Wait`]): wait for `changes`;
    /// `why` says what for.
    Wait {
        changes: tokio::sync::watch::Receiver<u64>,
        why: Arc<str>,
    },
    /// None, and the call fails at once.
    Failed(Error),
}

/// Chooses a replica for an attempt (the response future of a waiting call picks again
/// without the channel's key type).
pub(crate) trait Pick<S>: Send + Sync {
    /// A replica for an attempt at `now` of the call whose `route` it is (recorded in it).
    fn pick(self: Arc<Self>, route: Option<&Route>, now: Instant) -> Picked<S>;
}

impl<S, K> Pick<S> for Shared<S, K>
where
    S: Clone + Send + 'static,
    K: Send + 'static,
{
    fn pick(self: Arc<Self>, route: Option<&Route>, now: Instant) -> Picked<S> {
        let mut tried = [ReplicaId::default(); REMEMBERED];
        let n = route.map_or(0, |r| r.tried(&mut tried));
        let mut inner = self.lock();
        let Some(id) = inner.set.pick_at(&tried[..n], now) else {
            return match inner.set.unpicked(inner.resolving.is_some()) {
                Unpicked::Wait => Picked::Wait {
                    // Subscribed under the lock: any change after this look wakes it.
                    changes: self.picks.subscribe(),
                    why: inner.waiting_for(),
                },
                // Every replica's health check says it does not serve (gRFC A17): fail
                // fast, as gRPC's balancers do with no ready subchannel.
                Unpicked::NotServing => Picked::Failed(NotServing::of(inner.set.len()).into()),
                Unpicked::Empty => Picked::Failed(match inner.unresolved.clone() {
                    Some(e) => e.into(),
                    None => NoReplica.into(),
                }),
            };
        };
        let Some(i) = inner.index(id) else {
            return Picked::Failed(NoReplica.into());
        };
        // An attempt goes out: replicas added from now on join with slow start.
        inner.serving = true;
        let svc = inner.members[i].svc.clone();
        drop(inner);
        let ends: Arc<dyn EndAttempt> = self;
        if let Some(route) = route {
            route.record(id, Arc::clone(&ends));
        }
        Picked::Replica { svc, id, ends }
    }
}

impl<S, K> Inner<S, K> {
    /// What a call that waits for a replica waits for (see [`Unpicked::Wait`]).
    fn waiting_for(&self) -> Arc<str> {
        match &self.resolving {
            Some(name) if self.set.is_empty() => {
                format!("`{name}` has not resolved yet: the DNS server has not answered").into()
            }
            _ => format!(
                "none of the {} replicas has answered its first health check yet",
                self.set.len()
            )
            .into(),
        }
    }
}

/// The key of a replica made from an endpoint ([`Replicas::from_endpoints`]): its URI,
/// written as it is usually given. `http::Uri` writes a URI without a path with a `/`
/// (`http://10.0.0.1:50051/`); this key writes it without (`http://10.0.0.1:50051`), in
/// the snapshot, the logs and the metrics. It compares equal to its URI.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EndpointKey(http::Uri);

impl EndpointKey {
    /// The endpoint's URI.
    pub fn uri(&self) -> &http::Uri {
        &self.0
    }
}

impl From<http::Uri> for EndpointKey {
    fn from(uri: http::Uri) -> Self {
        EndpointKey(uri)
    }
}

impl PartialEq<http::Uri> for EndpointKey {
    fn eq(&self, uri: &http::Uri) -> bool {
        self.0 == *uri
    }
}

impl fmt::Display for EndpointKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let uri = &self.0;
        match (uri.scheme(), uri.authority(), uri.path_and_query()) {
            (Some(scheme), Some(authority), path) if path.is_none_or(|p| p.as_str() == "/") => {
                write!(f, "{scheme}://{authority}")
            }
            _ => uri.fmt(f),
        }
    }
}

#[cfg(feature = "transport")]
mod transport {
    use tonic::transport::{Channel, Endpoint};

    use super::*;

    /// The state of a channel of tonic `Channel`s (`state` finishes it: `early`, `dns`),
    /// starting each replica's health-check task when `config` asks for health checks
    /// (feature `health`).
    pub(crate) fn channels<K: Send + 'static>(
        config: ReplicaConfig,
        state: impl FnOnce(&mut Shared<Channel, K>),
    ) -> Result<Arc<Shared<Channel, K>>, stormguard_core::ConfigError> {
        let checks = config.health_check.clone();
        let seed = config.seed;
        let mut shared = Shared::new(ReplicaSet::new(config)?, None);
        state(&mut shared);
        let Some(checks) = checks else {
            return Ok(Arc::new(shared));
        };
        #[cfg(feature = "health")]
        {
            Ok(Arc::new_cyclic(
                |weak: &std::sync::Weak<Shared<Channel, K>>| {
                    let sink: std::sync::Weak<dyn health::HealthSink> = weak.clone();
                    shared.health = Some(health::starter(checks, seed, sink));
                    shared
                },
            ))
        }
        #[cfg(not(feature = "health"))]
        {
            let _ = (checks, seed, shared);
            Err(stormguard_core::ConfigError::invalid(
                "replicas.health_check",
                "client-side health checks need stormguard-client's feature `health`",
            ))
        }
    }

    impl Replicas<Channel, EndpointKey> {
        /// A channel over `endpoints`, each a replica with its own lazily connected tonic
        /// [`Channel`] (so an endpoint that is down at start is ejected like any failing
        /// replica, not an error here), keyed by its URI ([`EndpointKey`]). Must be called
        /// within a tokio runtime, as `Endpoint::connect_lazy`.
        pub fn from_endpoints(
            config: ReplicaConfig,
            endpoints: impl IntoIterator<Item = Endpoint>,
        ) -> Result<Self, stormguard_core::ConfigError> {
            let replicas = Replicas::over(channels(config, |_| {})?);
            for e in endpoints {
                replicas.insert(EndpointKey(e.uri().clone()), e.connect_lazy());
            }
            Ok(replicas)
        }
    }
}

#[cfg(test)]
mod tests;
