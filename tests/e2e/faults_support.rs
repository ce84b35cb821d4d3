//! The scenario driver of `tests/e2e/faults.rs`: real tonic servers behind the `ShedLayer` and
//! real clients behind the `RetryLayer` on turmoil's simulated network, a fault plan applied
//! at chosen virtual times, and the counts every scenario asserts.
//!
//! # One run
//!
//! A run is one turmoil simulation on one seed:
//!
//! - each server host serves the demo `Inventory` behind a `ShedLayer`, wrapped in
//!   [`Counting`], which counts executions per `request_id` in a [`World`] that outlives
//!   the host (a crashed and restarted server keeps counting into it);
//! - the client host sends one logical call every [`CALL_EVERY`], in turn a *write* (a
//!   `RetryLayer` whose config says `Reserve` is **not** idempotent), an *idempotent* call
//!   (a second `RetryLayer`, same channel, `Reserve` marked idempotent) and a *keyed
//!   write* (a third `RetryLayer`: `Reserve` not idempotent but keyed, so each logical
//!   call carries one `idempotency-key`), each with a [`DEADLINE`] and a [`PER_ATTEMPT`]
//!   timeout, each in a task of its own so that calls overlap as real traffic does;
//! - the servers run an `IdempotencyLayer` inside the `ShedLayer`, over one
//!   `MemoryStore` that every server host shares and that outlives their crashes (it is
//!   in the [`World`]): it stands for the database a team would keep its keys in, which
//!   a crash of the process does not lose (an in-memory store alone would be lost with
//!   it). Outermost, the seeded [`LoseAnswers`] layer loses [`LOST_PERCENT`] % of the
//!   keyed writes' answers after the handler ran (the other classes carry no
//!   [`CALL_HEADER`], so none of theirs is lost);
//! - [`drive`] steps the simulation and applies the scenario's [`Fault`]s at their times.
//!
//! The timeline is the same for every scenario:
//!
//! | virtual time | what |
//! |---|---|
//! | 0 – [`WARM_UP_END`] | warm-up calls: connections made, budget and breaker used |
//! | [`PROBE_BEFORE`] | no call in flight: one call on each raw channel (each connected) |
//! | [`BASELINE_AT`] | tasks counted on every host (the baseline) |
//! | [`CALLS_FROM`] – [`CALLS_UNTIL`] | calls during the fault (from 1 s) and after it |
//! | [`REST_AT`] | a quiet period longer than the budget's window later: the resting state is read, then one call on each raw channel |
//! | [`COUNT_AT_REST`] | tasks counted on every host again: as many as at the baseline |
//!
//! With `FAULTS_DEBUG` set in the environment, each run prints its figures, task counts and
//! resting state before they are asserted (for a failing scenario).
//!
//! # Clients and servers configured as in production
//!
//! turmoil's TCP does not retransmit what a partition dropped, so a partitioned connection
//! is broken for good, as behind a black hole. A production client finds such a connection
//! with HTTP/2 keepalive, and bounds its connection attempts; the clients here do the same
//! ([`endpoint`]): a ping every [`KEEPALIVE`], even when idle, the connection dropped when a
//! ping is not answered within as long again, connection attempts bounded at 200 ms. The
//! servers use keepalive too ([`add_server`]): without it, the server end of a connection
//! a partition broke stays open for good (the partition scenario counts it as a task left
//! behind).

#![allow(dead_code, unreachable_pub, missing_docs, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::error::Error;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use stormguard_client::replicas::Replicas;
use stormguard_client::{EjectionConfig, ReplicaConfig, SlowStartConfig};
use stormguard_client::{Retry, RetryLayer, RetrySnapshot, RetryStats, code_from_tonic};
use stormguard_core::AdmissionConfig;
use stormguard_core::BackoffConfig;
use stormguard_core::BreakerConfig;
use stormguard_core::BudgetConfig;
use stormguard_core::Code;
use stormguard_core::IdempotencyConfig;
use stormguard_core::MethodScope;
use stormguard_core::RetryController;
use stormguard_core::RetryPolicy;
use stormguard_core::WorkerLimit;
use stormguard_core::{BudgetChoice, ClientConfig};
use stormguard_demo::server::{DemoConfig, DemoInventory};
use stormguard_demo::turmoil_net;
use stormguard_demo::{
    Inventory, InventoryClient, InventoryServer, ReserveReply, ReserveRequest, StockLevel,
    WatchStockRequest,
};
use stormguard_server::idempotency::{IdempotencyLayer, IdempotencyStats, MemoryStore};
use stormguard_server::{DrainCounts, ShedStats};
use stormguard_server::{Occupancy, ShedLayer};
use tokio::time::Instant;
use tonic::codegen::tokio_stream::Stream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};
use tower::ServiceBuilder;

use crate::lossy_support::{CALL_HEADER, LoseAnswers};

/// HTTP/2 keepalive of clients and servers: a ping this often, the connection dropped when
/// one is not answered within as long again.
pub const KEEPALIVE: Duration = Duration::from_millis(500);
/// The port every server listens on.
pub const PORT: u16 = 50051;
/// Every logical call's deadline (`Request::set_timeout`).
pub const DEADLINE: Duration = Duration::from_millis(300);
/// The per-attempt timeout of `Reserve`, in both clients' configs.
pub const PER_ATTEMPT: Duration = Duration::from_millis(100);
/// How far past its deadline a call may end (virtual time) before it counts as late.
pub const LATE_BOUND: Duration = Duration::from_millis(10);
/// One logical call is started this often.
pub const CALL_EVERY: Duration = Duration::from_millis(10);
/// Warm-up calls start from 0 until this.
pub const WARM_UP_END: Duration = Duration::from_millis(500);
/// No call is in flight (the last warm-up call ended by its deadline): one call on each
/// raw channel, so that each has its connection ...
pub const PROBE_BEFORE: Duration = Duration::from_millis(820);
/// ... and every host's tasks are counted (the baseline).
pub const BASELINE_AT: Duration = Duration::from_millis(880);
/// Calls around the fault start here...
pub const CALLS_FROM: Duration = Duration::from_millis(900);
/// ... and the last one starts before this.
pub const CALLS_UNTIL: Duration = Duration::from_millis(3500);
/// Every scenario's fault starts here ...
pub const FAULT_FROM: Duration = Duration::from_millis(1000);
/// ... and the layers have mostly recovered from it by this: the calls started before
/// [`FAULT_FROM`] or from here are the *clear* ones, where the lost answers, not the
/// fault or a breaker's phase, make the difference between the keyed and unkeyed writes.
pub const CLEAR_FROM: Duration = Duration::from_millis(3000);
/// The budget's window: the resting state is read more than this after the last call.
pub const BUDGET_TTL: Duration = Duration::from_secs(2);
/// The resting state of the layers and the servers is read here, then each raw channel
/// carries one call ...
pub const REST_AT: Duration = Duration::from_millis(6000);
/// ... and every host's tasks are counted.
pub const COUNT_AT_REST: Duration = Duration::from_millis(6100);
/// The share of the keyed writes' attempts whose answer the servers lose after the
/// handler ran, in percent.
pub const LOST_PERCENT: u64 = 5;
/// The budget's standing floor, retries per second: at rest the balance is
/// `MIN_RETRIES_PER_SECOND × BUDGET_TTL`.
pub const MIN_RETRIES_PER_SECOND: u32 = 10;

/// Which client sent a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// `Reserve` through the layer whose config does not mark it idempotent.
    Write,
    /// `Reserve` through the layer whose config marks it idempotent.
    Idempotent,
    /// `Reserve` through the layer whose config does not mark it idempotent but keyed:
    /// one `idempotency-key` per logical call, deduplicated by the servers.
    Keyed,
}

/// The kinds in the order the client sends them.
pub const KINDS: [Kind; 3] = [Kind::Write, Kind::Idempotent, Kind::Keyed];

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Write => "w",
            Kind::Idempotent => "i",
            Kind::Keyed => "k",
        }
    }

    fn of(id: &str) -> Kind {
        if id.starts_with("w-") {
            Kind::Write
        } else if id.starts_with("k-") {
            Kind::Keyed
        } else {
            Kind::Idempotent
        }
    }
}

/// A fault the driver applies to the simulation at a virtual time.
#[derive(Clone, Debug)]
pub enum Fault {
    /// Drop every message between the two hosts (both ways).
    Partition(&'static str, &'static str),
    /// Deliver messages between the two hosts again.
    Repair(&'static str, &'static str),
    /// Hold every message between the two hosts until [`Fault::Release`].
    Hold(&'static str, &'static str),
    /// Deliver the held messages.
    Release(&'static str, &'static str),
    /// Stop the host's software (its tasks and sockets are dropped).
    Crash(&'static str),
    /// Start the host's software again.
    Bounce(&'static str),
    /// Every message on the link takes exactly this long.
    Latency(&'static str, &'static str, Duration),
}

impl Fault {
    fn apply(&self, sim: &mut turmoil::Sim<'_>) {
        match *self {
            Fault::Partition(a, b) => sim.partition(a, b),
            Fault::Repair(a, b) => sim.repair(a, b),
            Fault::Hold(a, b) => sim.hold(a, b),
            Fault::Release(a, b) => sim.release(a, b),
            Fault::Crash(h) => sim.crash(h),
            Fault::Bounce(h) => sim.bounce(h),
            Fault::Latency(a, b, d) => sim.set_link_latency(a, b, d),
        }
    }
}

/// One logical call, as the client saw it.
#[derive(Clone, Debug)]
pub struct CallRecord {
    pub kind: Kind,
    /// Simulation time when the call started.
    pub started_at: Duration,
    /// Simulation time when it ended, how long it took (tokio's virtual clock) and its
    /// status code; `None` while it has not ended.
    pub ended: Option<(Duration, Duration, Code)>,
    /// How many ends were recorded for it (1 when all is well).
    pub ends: u32,
}

/// Executions of one `request_id` on the servers.
#[derive(Clone, Debug, Default)]
pub struct Executions {
    /// Handler entries, over every server and every boot.
    pub count: u32,
    /// Handler runs that finished with an answer: the write committed. A run cancelled
    /// before (its caller went away, its host crashed) did not commit; a keyed handler
    /// commits its write with the key's record, in one transaction (`docs/idempotency.md`),
    /// so this is what a repeat must not do twice.
    pub committed: u32,
    /// Simulation time of the last entry.
    pub last_at: Duration,
}

/// A host's alive tasks at [`BASELINE_AT`] and at [`COUNT_AT_REST`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskCounts {
    pub baseline: Option<usize>,
    pub rest: Option<usize>,
}

/// The current host's alive tasks (within a host's software).
fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// What the client read of its layers and replicas at [`REST_AT`].
#[derive(Clone, Debug, Default)]
pub struct ClientRest {
    /// Budget balance of each layer at rest.
    pub balance: BTreeMap<Kind, f64>,
    /// Breaker state of each layer at rest (`"closed"`, `"open"`, `"half_open"`).
    pub breaker: BTreeMap<Kind, &'static str>,
    /// Each replica's state at rest (endpoint-aware channel only).
    pub replicas: Vec<(String, &'static str)>,
    /// The replicas the client was given (0 over one channel).
    pub replicas_given: usize,
    /// Each layer's counters at rest.
    pub stats: BTreeMap<Kind, RetrySnapshot>,
}

#[derive(Debug, Default)]
struct State {
    calls: BTreeMap<String, CallRecord>,
    /// Ends recorded for an id that was never started.
    unknown_ends: u64,
    executions: BTreeMap<String, Executions>,
    /// Each server host's `ShedLayer` counters, one per boot.
    shed: BTreeMap<&'static str, Vec<ShedStats>>,
    /// Each server host's `IdempotencyLayer` counters, one per boot.
    idempotency: BTreeMap<&'static str, Vec<IdempotencyStats>>,
    tasks: BTreeMap<&'static str, TaskCounts>,
    rest: Option<ClientRest>,
    /// Replicas ejected at some point (endpoint-aware channel only).
    ejected: BTreeMap<String, u32>,
    /// Probes (see `probe`) that failed.
    probe_failures: Vec<String>,
}

/// What every host of one run shares: the call ledger, the executions per request id,
/// the layers' counters and the task counts; and what the servers keep across their
/// crashes: the idempotency keys' store (the database a team would use) and the
/// answer-losing layer's count. Clones share one state; everything runs on turmoil's one
/// thread, the lock is never contended.
#[derive(Clone, Debug)]
pub struct World {
    state: Arc<Mutex<State>>,
    /// Created outside every host's software, so a crash and restart keeps its keys.
    store: Arc<MemoryStore>,
    /// Outermost on every server (seeded per run, see [`World::new`]).
    lose: LoseAnswers,
}

impl World {
    /// A run's world on `seed` (the seed of the answers the servers lose).
    pub fn new(seed: u64) -> World {
        World {
            state: Arc::default(),
            store: Arc::new(
                MemoryStore::new(IdempotencyConfig::default()).expect("the default is valid"),
            ),
            lose: LoseAnswers {
                seed,
                percent: LOST_PERCENT,
                lost: Arc::default(),
            },
        }
    }
}

impl World {
    fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        f(&mut self.state.lock().unwrap_or_else(PoisonError::into_inner))
    }

    fn started(&self, id: &str, kind: Kind) {
        let started_at = now();
        self.with(|s| {
            s.calls.insert(
                id.to_owned(),
                CallRecord {
                    kind,
                    started_at,
                    ended: None,
                    ends: 0,
                },
            );
        });
    }

    fn ended(&self, id: &str, took: Duration, code: Code) {
        let at = now();
        self.with(|s| match s.calls.get_mut(id) {
            Some(call) => {
                call.ends += 1;
                call.ended.get_or_insert((at, took, code));
            }
            None => s.unknown_ends += 1,
        });
    }

    fn executed(&self, id: &str) {
        if id.is_empty() {
            // A probe (see `probe`), not a logical call.
            return;
        }
        let at = now();
        self.with(|s| {
            let e = s.executions.entry(id.to_owned()).or_default();
            e.count += 1;
            e.last_at = at;
        });
    }

    fn committed(&self, id: &str) {
        if id.is_empty() {
            return;
        }
        self.with(|s| s.executions.entry(id.to_owned()).or_default().committed += 1);
    }

    fn booted(&self, host: &'static str, stats: ShedStats, idempotency: IdempotencyStats) {
        self.with(|s| {
            s.shed.entry(host).or_default().push(stats);
            s.idempotency.entry(host).or_default().push(idempotency);
        });
    }

    fn tasks(&self, host: &'static str, rest: bool, n: usize) {
        self.with(|s| {
            let t = s.tasks.entry(host).or_default();
            if rest {
                t.rest = Some(n);
            } else {
                t.baseline = Some(n);
            }
        });
    }
}

/// Simulation time (the same clock on every host).
fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// The demo service with every `Reserve` counted by `request_id` before it runs.
#[derive(Clone, Debug)]
pub struct Counting {
    inner: DemoInventory,
    world: World,
}

#[tonic::async_trait]
impl Inventory for Counting {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let id = request.get_ref().request_id.clone();
        self.world.executed(&id);
        let answer = self.inner.reserve(request).await;
        self.world.committed(&id);
        answer
    }

    type WatchStockStream = Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send>>;

    async fn watch_stock(
        &self,
        request: Request<WatchStockRequest>,
    ) -> Result<Response<Self::WatchStockStream>, Status> {
        self.inner.watch_stock(request).await
    }
}

/// The admission settings of every server: 16 workers, 32 queued, seeded pushback jitter.
pub fn admission(seed: u64) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(16),
        queue_capacity: 32,
        seed: Some(seed),
        ..AdmissionConfig::default()
    }
}

/// Adds a server host: the demo service (`service_time` per `Reserve`) behind a
/// `ShedLayer`, on [`PORT`]. On every boot (the first, and each `bounce`) it binds first,
/// then records its `ShedLayer`'s counters and starts counting its tasks.
pub fn add_server(
    sim: &mut turmoil::Sim<'_>,
    host: &'static str,
    world: &World,
    service_time: Duration,
    seed: u64,
) {
    let world = world.clone();
    sim.host(host, move || {
        let world = world.clone();
        async move {
            let incoming = turmoil_net::incoming(PORT).await?;
            let inner = DemoInventory::new(DemoConfig {
                service_time,
                fail_rate: 0.0,
                seed,
            });
            let shed = ShedLayer::from_config(&admission(seed))?;
            // A new layer per boot over the store that outlives the host.
            let idempotency = IdempotencyLayer::new().with_store(world.store.clone());
            world.booted(host, shed.stats(), idempotency.stats());
            tokio::spawn(count_tasks(world.clone(), host));
            let service = Counting {
                inner,
                world: world.clone(),
            };
            Server::builder()
                // A partition leaves the server a connection whose peer is gone; without
                // keepalive it stays open (one task and its buffers) for good.
                .http2_keepalive_interval(Some(KEEPALIVE))
                .http2_keepalive_timeout(Some(KEEPALIVE))
                .layer(world.lose.clone())
                .layer(shed)
                .layer(idempotency)
                .add_service(InventoryServer::new(service))
                .serve_with_incoming(incoming)
                .await?;
            Ok(())
        }
    });
}

/// Counts the host's alive tasks at [`BASELINE_AT`] and [`COUNT_AT_REST`] (a mark that
/// passed while the host was down is skipped).
async fn count_tasks(world: World, host: &'static str) {
    for (rest, at) in [(false, BASELINE_AT), (true, COUNT_AT_REST)] {
        let left = at.checked_sub(now());
        let Some(left) = left else { continue };
        tokio::time::sleep(left).await;
        world.tasks(host, rest, alive_tasks());
    }
}

/// The endpoint of `host` as a production client configures it (see the module docs).
pub fn endpoint(host: &str) -> Endpoint {
    turmoil_net::endpoint(host, PORT)
        .unwrap()
        .http2_keep_alive_interval(KEEPALIVE)
        .keep_alive_timeout(KEEPALIVE)
        .keep_alive_while_idle(true)
        .connect_timeout(Duration::from_millis(200))
}

/// A client config: stormguard's budget over a [`BUDGET_TTL`] window with a floor of
/// [`MIN_RETRIES_PER_SECOND`], a breaker (50 % failures over 1 s of at least 10 calls, open
/// 500 ms ± 50 %), and `Reserve` retried on `UNAVAILABLE` and on its [`PER_ATTEMPT`]
/// timeout, up to 3 attempts, marked idempotent or not, keyed or not.
pub fn client_config(idempotent: bool, keyed: bool) -> ClientConfig {
    let mut config = ClientConfig::default();
    config.budget = BudgetChoice::Stormguard(BudgetConfig {
        ttl: BUDGET_TTL,
        min_retries_per_second: MIN_RETRIES_PER_SECOND,
        ..BudgetConfig::default()
    });
    config.breaker = Some(BreakerConfig {
        window: Duration::from_secs(1),
        min_requests: 10,
        open_for: Duration::from_millis(500),
        ..BreakerConfig::default()
    });
    config.methods.set_retry(
        MethodScope::Method("stormguard.demo.v1.Inventory", "Reserve"),
        Some(RetryPolicy {
            idempotent,
            per_attempt_timeout: Some(PER_ATTEMPT),
            backoff: BackoffConfig::FullJitter {
                base: Duration::from_millis(10),
                cap: Duration::from_millis(100),
                multiplier: 2.0,
            },
            ..RetryPolicy::default()
        }),
    );
    config.methods.set_idempotency_key(
        MethodScope::Method("stormguard.demo.v1.Inventory", "Reserve"),
        keyed,
    );
    config
}

/// The three retry layers of a client: one per [`Kind`], seeded apart.
fn layers(seed: u64, over_replicas: bool) -> Result<[(Kind, RetryLayer); 3], Box<dyn Error>> {
    let layer = |kind: Kind, idempotent: bool, keyed: bool, seed: u64| {
        let layer =
            RetryLayer::from_config(&(client_config(idempotent, keyed)).clone().with_seed(seed))?;
        Ok::<_, Box<dyn Error>>((
            kind,
            if over_replicas {
                layer.over_replicas()
            } else {
                layer
            },
        ))
    };
    Ok([
        layer(Kind::Write, false, false, seed)?,
        layer(Kind::Idempotent, true, false, seed.wrapping_add(1))?,
        layer(Kind::Keyed, false, true, seed.wrapping_add(2))?,
    ])
}

/// The endpoint-aware channel's settings: the defaults (ejected at 5 failures in a row,
/// for 500 ms doubling), with the doubling capped at 2 s and a 1 s slow start, so that a
/// replica ejected by the fault is back at a full share before the resting state is read.
pub fn replica_config(seed: u64) -> ReplicaConfig {
    ReplicaConfig {
        ejection: EjectionConfig {
            max_time: Duration::from_secs(2),
            ..EjectionConfig::default()
        },
        slow_start: SlowStartConfig {
            window: Duration::from_secs(1),
            ..SlowStartConfig::default()
        },
        seed: Some(seed),
        ..ReplicaConfig::default()
    }
}

type OneClient = InventoryClient<Retry<Channel>>;
type ReplicasClient = InventoryClient<Retry<Replicas<Channel, String>>>;

/// A client over one server, or over the endpoint-aware channel.
#[derive(Clone, Debug)]
enum Caller {
    One(OneClient),
    Replicas(ReplicasClient),
}

impl Caller {
    async fn reserve(&mut self, request: Request<ReserveRequest>) -> Result<(), Status> {
        match self {
            Caller::One(c) => c.reserve(request).await.map(drop),
            Caller::Replicas(c) => c.reserve(request).await.map(drop),
        }
    }
}

/// What the client host is given to build: one server, or replicas.
#[derive(Clone, Debug)]
pub enum Target {
    /// Both layers over one lazily connected channel to this host.
    One(&'static str),
    /// Both layers over one endpoint-aware [`Replicas`] channel over these hosts.
    Replicas(Vec<&'static str>),
}

/// Adds the client host: builds both layers over `target`, sends the calls of the
/// timeline, reads the baseline and the resting state, and ends.
pub fn add_client(sim: &mut turmoil::Sim<'_>, world: &World, target: Target, seed: u64) {
    let world = world.clone();
    sim.client("client", async move {
        let over_replicas = matches!(target, Target::Replicas(_));
        let layers = layers(seed, over_replicas)?;
        let stats: Vec<(Kind, RetryStats, RetryController)> = layers
            .iter()
            .map(|(k, l)| (*k, l.stats(), l.controller().clone()))
            .collect();
        let (callers, replicas, channels) = match &target {
            Target::One(host) => {
                let channel = turmoil_net::connect_lazy_with(endpoint(host));
                let callers = layers.map(|(k, l)| {
                    let svc = ServiceBuilder::new().layer(l).service(channel.clone());
                    (k, Caller::One(InventoryClient::new(svc)))
                });
                (callers, None, vec![channel])
            }
            Target::Replicas(hosts) => {
                let channels: Vec<Channel> = hosts
                    .iter()
                    .map(|h| turmoil_net::connect_lazy_with(endpoint(h)))
                    .collect();
                let replicas = Replicas::from_services(
                    replica_config(seed),
                    hosts
                        .iter()
                        .map(|h| (*h).to_owned())
                        .zip(channels.iter().cloned()),
                )?;
                let callers = layers.map(|(k, l)| {
                    let svc = ServiceBuilder::new().layer(l).service(replicas.clone());
                    (k, Caller::Replicas(InventoryClient::new(svc)))
                });
                (callers, Some(replicas), channels)
            }
        };
        let origin = Instant::now();
        let mut i = 0u32;
        let send = |i: &mut u32| {
            let (kind, caller) = &callers[(*i as usize) % KINDS.len()];
            let id = format!("{}-{:04}", kind.prefix(), *i);
            *i += 1;
            world.started(&id, *kind);
            let mut caller = caller.clone();
            let world = world.clone();
            let kind = *kind;
            tokio::spawn(async move {
                let mut request = Request::new(ReserveRequest {
                    sku: "sku".into(),
                    quantity: 1,
                    request_id: id.clone(),
                    payload: Vec::new(),
                });
                request.set_timeout(DEADLINE);
                if kind == Kind::Keyed {
                    // The servers lose a seeded share of these answers (see `LoseAnswers`).
                    request
                        .metadata_mut()
                        .insert(CALL_HEADER, id.parse().unwrap());
                }
                let started = Instant::now();
                let code = match caller.reserve(request).await {
                    Ok(()) => Code::Ok,
                    Err(status) => code_from_tonic(status.code()),
                };
                world.ended(&id, started.elapsed(), code);
            });
        };
        // The ejections the replicas go through, watched every 10 ms.
        let watch = replicas.clone().map(|replicas| {
            let world = world.clone();
            tokio::spawn(async move {
                let mut was = BTreeMap::new();
                loop {
                    for r in replicas.snapshot() {
                        let ejected = r.snapshot.state.is_ejected();
                        if ejected && !was.get(&r.key).copied().unwrap_or(false) {
                            world.with(|s| *s.ejected.entry(r.key.clone()).or_default() += 1);
                        }
                        was.insert(r.key, ejected);
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        });
        let mut at = Duration::ZERO;
        while at < WARM_UP_END {
            tokio::time::sleep_until(origin + at).await;
            send(&mut i);
            at += CALL_EVERY;
        }
        tokio::time::sleep_until(origin + PROBE_BEFORE).await;
        probe(&world, &channels).await;
        tokio::time::sleep_until(origin + BASELINE_AT).await;
        // Less the replica watcher, gone at rest.
        world.tasks(
            "client",
            false,
            alive_tasks() - usize::from(watch.is_some()),
        );
        let mut at = CALLS_FROM;
        while at < CALLS_UNTIL {
            tokio::time::sleep_until(origin + at).await;
            send(&mut i);
            at += CALL_EVERY;
        }
        tokio::time::sleep_until(origin + REST_AT).await;
        if let Some(watch) = watch {
            watch.abort();
        }
        let now = Instant::now();
        let mut rest = ClientRest {
            replicas_given: match &target {
                Target::One(_) => 0,
                Target::Replicas(hosts) => hosts.len(),
            },
            ..ClientRest::default()
        };
        for (kind, stats, controller) in &stats {
            rest.balance
                .insert(*kind, controller.budget().balance_at(now));
            if let Some(b) = controller.breaker() {
                rest.breaker.insert(*kind, b.state_at(now).as_str());
            }
            rest.stats.insert(*kind, stats.snapshot());
        }
        if let Some(replicas) = &replicas {
            rest.replicas = replicas
                .snapshot()
                .into_iter()
                .map(|r| (r.key, r.snapshot.state.as_str()))
                .collect();
        }
        world.with(|s| s.rest = Some(rest));
        probe(&world, &channels).await;
        tokio::time::sleep_until(origin + COUNT_AT_REST).await;
        world.tasks("client", true, alive_tasks());
        Ok(())
    });
}

/// One call on each raw channel (below the layers, not in the ledger: no `request_id`),
/// so that each holds one live connection when the tasks are counted: a channel connects
/// lazily, and one the fault disconnected is connected again by the next call it carries.
/// A probe that fails is recorded (and fails the run's assertions).
async fn probe(world: &World, channels: &[Channel]) {
    for (i, channel) in channels.iter().enumerate() {
        let mut request = Request::new(ReserveRequest::default());
        request.set_timeout(DEADLINE);
        if let Err(status) = InventoryClient::new(channel.clone()).reserve(request).await {
            let failure = format!("channel {i} at {:?}: {status:?}", now());
            world.with(|s| s.probe_failures.push(failure));
        }
    }
}

/// Builds the simulation on `seed`: 1 ms ticks, 1 to 3 ms per message, 10 s at most.
pub fn sim<'a>(seed: u64) -> turmoil::Sim<'a> {
    turmoil::Builder::new()
        .simulation_duration(Duration::from_secs(10))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(3))
        .rng_seed(seed)
        .build()
}

/// Runs `sim` to its end, applying each fault at its simulation time.
pub fn drive(sim: &mut turmoil::Sim<'_>, mut faults: Vec<(Duration, Fault)>) {
    faults.sort_by_key(|(at, _)| *at);
    let mut faults = faults.into_iter().peekable();
    loop {
        while let Some((_, fault)) = faults.next_if(|(at, _)| sim.elapsed() >= *at) {
            fault.apply(sim);
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => panic!("simulation failed at {:?}: {e}", sim.elapsed()),
        }
    }
    assert!(
        faults.next().is_none(),
        "the simulation ended before every fault was applied"
    );
}

/// Everything one run measured.
#[derive(Debug)]
pub struct Run {
    pub calls: BTreeMap<String, CallRecord>,
    pub unknown_ends: u64,
    pub executions: BTreeMap<String, Executions>,
    pub shed: BTreeMap<&'static str, Vec<ShedStats>>,
    pub idempotency: BTreeMap<&'static str, Vec<IdempotencyStats>>,
    /// Answers the servers lost after the handler ran (keyed writes only).
    pub answers_lost: u64,
    pub tasks: BTreeMap<&'static str, TaskCounts>,
    pub rest: ClientRest,
    pub ejected: BTreeMap<String, u32>,
    pub probe_failures: Vec<String>,
}

impl Run {
    /// Takes what the hosts recorded in `world` (after [`drive`]).
    pub fn take(world: &World) -> Run {
        world.with(|s| Run {
            calls: std::mem::take(&mut s.calls),
            unknown_ends: s.unknown_ends,
            executions: std::mem::take(&mut s.executions),
            shed: std::mem::take(&mut s.shed),
            idempotency: std::mem::take(&mut s.idempotency),
            answers_lost: world.lose.lost(),
            tasks: std::mem::take(&mut s.tasks),
            rest: s.rest.take().expect("the client read the resting state"),
            ejected: std::mem::take(&mut s.ejected),
            probe_failures: std::mem::take(&mut s.probe_failures),
        })
    }

    /// The figures of this run (compared across two runs of one seed).
    pub fn figures(&self) -> Figures {
        let mut f = Figures::default();
        for (id, call) in &self.calls {
            let k = &mut f.by_kind.entry(call.kind).or_default();
            k.calls += 1;
            if call.started_at < FAULT_FROM || call.started_at >= CLEAR_FROM {
                k.clear_calls += 1;
                if matches!(call.ended, Some((_, _, Code::Ok))) {
                    k.clear_ok += 1;
                }
            }
            match call.ended {
                None => k.never_ended += 1,
                Some((_, took, code)) => {
                    *k.codes.entry(code.name()).or_default() += 1;
                    let late = took.saturating_sub(DEADLINE);
                    if late > LATE_BOUND {
                        k.late += 1;
                    }
                    k.max_late_ms = k.max_late_ms.max(late.as_millis() as u64);
                    k.max_took_ms = k.max_took_ms.max(took.as_millis() as u64);
                }
            }
            if call.ends > 1 {
                k.ended_twice += 1;
            }
            if let Some(e) = self.executions.get(id) {
                k.executed += 1;
                k.executions += u64::from(e.count);
                k.duplicates += u64::from(e.count.saturating_sub(1));
                k.committed += u64::from(e.committed.min(1));
                k.duplicate_commits += u64::from(e.committed.saturating_sub(1));
                if call.ended.is_some_and(|(end, _, _)| e.last_at > end) {
                    k.executed_after_end += 1;
                }
            }
        }
        for (kind, s) in &self.rest.stats {
            let k = f.by_kind.entry(*kind).or_default();
            k.attempts = s.attempts;
            k.retries = s.retries;
            k.transparent_retries = s.transparent_retries;
            k.attempt_timeouts = s.attempt_timeouts;
            k.refused_not_idempotent = s.refused.not_idempotent;
            k.logical = s.logical;
            k.outcomes = s.ok + s.failed;
        }
        f.executions_unknown = self
            .executions
            .keys()
            .filter(|id| !self.calls.contains_key(*id))
            .count() as u64;
        f.unknown_ends = self.unknown_ends;
        for (host, boots) in &self.shed {
            let mut h = ServerFigures {
                boots: boots.len(),
                ..ServerFigures::default()
            };
            for b in boots {
                let s = b.snapshot();
                h.admitted += s.admitted;
                h.completed += s.completed;
                h.shed += s.shed();
                h.expired += s.expired;
                h.cancelled_queued += s.cancelled_queued;
            }
            for b in self.idempotency.get(host).into_iter().flatten() {
                let s = b.snapshot();
                h.keyed += s.keyed;
                h.replayed += s.replayed;
                h.in_flight += s.in_flight;
                h.released += s.released;
            }
            f.servers.insert(host, h);
        }
        f.answers_lost = self.answers_lost;
        f.ejected = self.ejected.clone();
        f
    }

    /// The `ShedLayer` counters of the host's last boot.
    pub fn last_shed(&self, host: &str) -> &ShedStats {
        self.shed
            .get(host)
            .and_then(|b| b.last())
            .expect("the server booted")
    }
}

/// The figures of one kind of call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KindFigures {
    /// Logical calls started.
    pub calls: u64,
    /// Calls started outside the fault's span (before [`FAULT_FROM`], from
    /// [`CLEAR_FROM`]), and those of them that ended `OK`. (The crash's second restart, at
    /// 2.5 s, still fails a few unkeyed writes after [`CLEAR_FROM`].)
    pub clear_calls: u64,
    pub clear_ok: u64,
    /// Calls that never recorded an end by the end of the run.
    pub never_ended: u64,
    /// Calls that recorded more than one end.
    pub ended_twice: u64,
    /// Calls that ended more than [`LATE_BOUND`] past their deadline.
    pub late: u64,
    /// The most a call ended past its deadline, in ms of virtual time.
    pub max_late_ms: u64,
    /// The longest call, in ms of virtual time.
    pub max_took_ms: u64,
    /// Calls by final status code.
    pub codes: BTreeMap<&'static str, u64>,
    /// Calls that reached a server's handler at least once.
    pub executed: u64,
    /// Handler entries.
    pub executions: u64,
    /// Handler entries beyond the first, per call, summed.
    pub duplicates: u64,
    /// Calls whose handler finished at least once (committed its write).
    pub committed: u64,
    /// Handler runs that finished beyond the first, per call, summed: writes committed
    /// twice.
    pub duplicate_commits: u64,
    /// Calls whose last execution began after the caller had its answer (the attempt's
    /// request arrived after the caller gave up on it).
    pub executed_after_end: u64,
    /// From the layer's counters: logical calls, their recorded outcomes, attempts,
    /// retries, transparent retries, attempt timeouts, retries refused as not idempotent.
    pub logical: u64,
    pub outcomes: u64,
    pub attempts: u64,
    pub retries: u64,
    pub transparent_retries: u64,
    pub attempt_timeouts: u64,
    pub refused_not_idempotent: u64,
}

/// The figures of one server host, summed over its boots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerFigures {
    pub boots: usize,
    pub admitted: u64,
    pub completed: u64,
    pub shed: u64,
    pub expired: u64,
    pub cancelled_queued: u64,
    /// From the `IdempotencyLayer`: keyed calls, answers replayed from the store, repeats
    /// answered `ABORTED` while their key was in flight, keys released for a retry.
    pub keyed: u64,
    pub replayed: u64,
    pub in_flight: u64,
    pub released: u64,
}

/// The figures of a run: two runs of the same seed must give equal ones.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Figures {
    pub by_kind: BTreeMap<Kind, KindFigures>,
    /// Executions of ids the client never started (none expected).
    pub executions_unknown: u64,
    /// Ends recorded for ids never started (none expected).
    pub unknown_ends: u64,
    pub servers: BTreeMap<&'static str, ServerFigures>,
    /// How many times each replica was ejected (endpoint-aware channel only).
    pub ejected: BTreeMap<String, u32>,
    /// Keyed writes' answers the servers lost after the handler ran.
    pub answers_lost: u64,
}

impl Figures {
    pub fn kind(&self, kind: Kind) -> &KindFigures {
        self.by_kind.get(&kind).expect("calls of this kind")
    }

    /// One Markdown table row per kind of call (the rows of `docs/faults.md`).
    pub fn rows(&self, scenario: &str, seed: u64) -> String {
        let mut out = String::new();
        for (kind, k) in &self.by_kind {
            let ok = k.codes.get("OK").copied().unwrap_or(0);
            out += &format!(
                "| {scenario} | {seed} | {kind:?} | {} | {ok} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                k.calls,
                k.attempts,
                k.retries,
                k.transparent_retries,
                k.attempt_timeouts,
                k.refused_not_idempotent,
                k.late,
                k.max_late_ms,
                k.duplicates,
                k.duplicate_commits,
                k.executed_after_end,
            );
        }
        out
    }
}

/// The guarantees every scenario asserts, on one run.
pub fn assert_guarantees(name: &str, run: &Run) {
    let f = run.figures();
    for (kind, k) in &f.by_kind {
        assert_eq!(
            k.never_ended, 0,
            "{name}: {kind:?} calls that never ended: {f:#?}"
        );
        assert_eq!(
            k.ended_twice, 0,
            "{name}: {kind:?} calls that ended twice: {f:#?}"
        );
        assert_eq!(
            k.late, 0,
            "{name}: {kind:?} calls that ended more than {LATE_BOUND:?} past their deadline \
             ({} ms at most): {f:#?}",
            k.max_late_ms
        );
        // Every started call was counted by its layer, and its outcome recorded.
        assert_eq!(
            (k.logical, k.outcomes),
            (k.calls, k.calls),
            "{name}: {kind:?} {f:#?}"
        );
    }
    assert_eq!(
        f.kind(Kind::Write).duplicates,
        0,
        "{name}: a non-idempotent call ran twice: {}",
        duplicated(run, Kind::Write)
    );
    let (w, k) = (f.kind(Kind::Write), f.kind(Kind::Keyed));
    let ok = |k: &KindFigures| k.codes.get("OK").copied().unwrap_or(0);
    // A keyed write is run again only after its first run was cancelled before it
    // answered (and so before it committed): entries may repeat, commits may not.
    assert_eq!(
        k.duplicate_commits,
        0,
        "{name}: a keyed write committed twice: {}",
        duplicated(run, Kind::Keyed)
    );
    assert!(
        k.committed >= ok(k),
        "{name}: a keyed write answered OK never ran: {f:#?}"
    );
    // Answers were lost (5 % of the keyed writes' attempts), and the key is what let
    // their calls be retried: the keyed writes were retried, and outside the fault's span
    // they succeeded at least as often as the unkeyed writes, which lost no answer. Over
    // the whole run, see `assert_keyed_ok_at_least_unkeyed`.
    assert!(
        f.answers_lost > 0 && k.retries > 0,
        "{name}: answers lost {}, keyed retries {}: {f:#?}",
        f.answers_lost,
        k.retries
    );
    assert!(
        k.clear_ok >= w.clear_ok,
        "{name}: outside the fault, keyed writes OK {} of {}, unkeyed writes OK {} of {}: {f:#?}",
        k.clear_ok,
        k.clear_calls,
        w.clear_ok,
        w.clear_calls
    );
    assert_eq!(
        (f.unknown_ends, f.executions_unknown),
        (0, 0),
        "{name}: {f:#?}"
    );
    assert_at_rest(name, run);
}

/// Over the whole run, the keyed writes succeeded at least as often as the unkeyed ones.
/// Not part of [`assert_guarantees`]: through a partition the breakers of the layers that
/// retry (the idempotent calls' and the keyed writes') may be open when the network comes
/// back, for their jittered open time, while the unkeyed writes' closes at once: that is
/// the breaker's phase, not the key (the idempotent calls fail as long).
pub fn assert_keyed_ok_at_least_unkeyed(name: &str, f: &Figures) {
    let ok = |k: &KindFigures| k.codes.get("OK").copied().unwrap_or(0);
    let (w, k) = (f.kind(Kind::Write), f.kind(Kind::Keyed));
    assert!(
        ok(k) >= ok(w),
        "{name}: keyed writes OK {}, unkeyed writes OK {}: {f:#?}",
        ok(k),
        ok(w)
    );
}

/// The write calls that ran more than once, with their records, for a failure message.
fn duplicated(run: &Run, kind: Kind) -> String {
    let mut out = String::new();
    for (id, e) in &run.executions {
        if e.count > 1 && Kind::of(id) == kind {
            out += &format!(
                "\n  {id}: {} executions, {} committed, call {:?}",
                e.count,
                e.committed,
                run.calls.get(id)
            );
        }
    }
    out
}

/// After the fault and a quiet period: budgets full, breakers closed, replicas back,
/// servers idle, no drain left, as many tasks as before the fault on every host.
pub fn assert_at_rest(name: &str, run: &Run) {
    if std::env::var_os("FAULTS_DEBUG").is_some() {
        eprintln!(
            "{name}: {:#?}\n{:#?}\n{:#?}",
            run.figures(),
            run.tasks,
            run.rest
        );
    }
    let rest = &run.rest;
    let reserve = f64::from(MIN_RETRIES_PER_SECOND) * BUDGET_TTL.as_secs_f64();
    for (kind, balance) in &rest.balance {
        assert_eq!(
            *balance, reserve,
            "{name}: {kind:?} budget not back at its standing reserve"
        );
    }
    assert_eq!(
        rest.breaker.len(),
        KINDS.len(),
        "{name}: every layer has a breaker"
    );
    for (kind, state) in &rest.breaker {
        assert_eq!(
            *state, "closed",
            "{name}: {kind:?} breaker not closed at rest"
        );
    }
    assert_eq!(
        rest.replicas.len(),
        rest.replicas_given,
        "{name}: every replica given is in the channel at rest: {:?}",
        rest.replicas
    );
    for (key, state) in &rest.replicas {
        assert_eq!(*state, "active", "{name}: replica {key} not back at rest");
    }
    for (host, boots) in &run.shed {
        let stats = boots.last().expect("booted");
        let s = stats.snapshot();
        assert_eq!(
            stats.occupancy(),
            Occupancy {
                free_workers: stats.workers(),
                waiting: 0,
                unsettled: 0
            },
            "{name}: {host} queue not at rest: {s:?}"
        );
        assert_eq!(
            (s.queue_depth, s.in_flight),
            (0, 0),
            "{name}: {host}: {s:?}"
        );
        let DrainCounts { active, .. } = stats.drains();
        assert_eq!(
            active, 0,
            "{name}: {host}: a request body drain left behind"
        );
    }
    assert!(
        run.probe_failures.is_empty(),
        "{name}: a channel could not carry a call before the fault or at rest: {:?}",
        run.probe_failures
    );
    for (host, t) in &run.tasks {
        let (Some(baseline), Some(at_rest)) = (t.baseline, t.rest) else {
            panic!("{name}: {host}: tasks not counted at both marks: {t:?}");
        };
        // Each channel holds one live connection at both marks (see `probe`): any task
        // left behind (a connection kept open, a timer task, a drain) shows here.
        assert_eq!(
            at_rest, baseline,
            "{name}: {host}: {at_rest} tasks alive at rest, {baseline} before the fault"
        );
    }
}
