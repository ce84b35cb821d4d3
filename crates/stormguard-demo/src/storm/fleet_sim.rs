//! The storm and a dead dependency at fleet scale on turmoil: the real layers on many
//! simulated hosts.
//!
//! # Why
//!
//! The storm runs one client process against one server on loopback; the simulator
//! (`stormguard-sim`) runs fleets of hundreds, but of the core objects only, in a model of
//! the network, the server and the client layer's future. turmoil runs real tonic, hyper,
//! h2, `RetryLayer`, `Replicas` and `ShedLayer` on as many simulated hosts as a run needs,
//! in one thread on virtual time, so the simulator's fleet figures can be checked against
//! what the layers really do, for the same parameters and deterministically for a seed.
//!
//! # What runs
//!
//! [`run_storm_policy`]: `servers` hosts, each the demo Inventory behind a fixed worker
//! limit ([`Workers`], the storm's cancelling model) and, for the shedding policies, the
//! `ShedLayer` with the storm's admission config (seeded); `clients` hosts, each an
//! open-loop Poisson fleet at its share of the offered rate, with its own retry policy
//! (the storm's `naive` loop, or its own seeded `RetryLayer` with `over_replicas`) over its
//! own [`Replicas`] (seeded) of one lazily connected channel per server, with HTTP/2
//! keepalive. Every server multiplies its service time by `slowdown` during the trigger.
//!
//! [`run_dead_dependency`]: table 2's case, `clients` hosts calling one server that
//! answers every attempt `UNAVAILABLE` at once, for each variant the layers' config
//! supports.
//!
//! # Time and determinism
//!
//! Time inside a host is tokio's virtual time, advanced by turmoil one tick at a time;
//! every host starts at virtual 0, so `Instant::now() - turmoil::elapsed()` is the same
//! origin on every host. Every random choice is seeded from the run's seed: turmoil's
//! network, the arrivals, each `RetryLayer`, each `Replicas`, each `ShedLayer`'s pushback
//! jitter. The same config gives the same figures.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use stormguard_client::ReplicaConfig;
use stormguard_client::RetryLayer;
use stormguard_client::replicas::Replicas;
use stormguard_core::AdmissionConfig;
use stormguard_core::BreakerConfig;
use stormguard_core::BudgetConfig;
use stormguard_core::Floor;
use stormguard_core::WorkerLimit;
use stormguard_core::{BudgetChoice, ClientConfig, ConfigError};
use stormguard_server::ShedLayer;
use stormguard_sim::StormConfig;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint, Server};
use tower::ServiceBuilder;

use super::client::{Caller, Delays, Naive, Observe, layered_caller, naive_caller};
use super::report::Timeline;
use super::{
    MAX_PENDING_ACCEPT_RESET_STREAMS, Policy, PolicyRun, ServerModel, StormReport, Workers,
    storm_report, stormguard_client_config,
};
use crate::server::{DemoConfig, DemoControl, DemoCounts, DemoInventory};
use crate::turmoil_net;
use crate::{InventoryClient, InventoryServer};

/// The port every simulated server listens on.
pub const PORT: u16 = 50051;

/// Why a fleet run could not run.
#[derive(Debug, thiserror::Error)]
pub enum FleetSimError {
    /// A policy's or a server's configuration was refused.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// A host failed, or the simulation ran past its time limit.
    #[error("simulation: {0}")]
    Simulation(String),
}

/// The network every run simulates.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Network {
    /// One-way delay of every message (turmoil's minimum and maximum latency).
    pub latency: Duration,
    /// Virtual time turmoil advances per step: the resolution of every timer and delivery.
    pub tick: Duration,
    /// HTTP/2 keepalive ping interval of every client channel (and the time a ping may go
    /// unanswered), as a production client sets it.
    pub keepalive: Duration,
}

impl Default for Network {
    /// 1 ms each way, a 1 ms tick, 1 s keepalive. The tick is tokio's timer resolution: a
    /// paused tokio clock advanced by less than 1 ms moves by 1 ms, so with a shorter tick
    /// the hosts' clocks would run ahead of turmoil's (and its message delays).
    fn default() -> Self {
        Network {
            latency: Duration::from_millis(1),
            tick: Duration::from_millis(1),
            keepalive: Duration::from_secs(1),
        }
    }
}

/// The admission config of a shedding server: the defaults with the server's worker
/// count, as the storm's, seeded from `seed`.
fn admission(storm: &StormConfig, seed: u64) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(storm.workers),
        seed: Some(seed),
        ..AdmissionConfig::default()
    }
}

/// splitmix64 of `seed` and `stream`: unrelated seeds for every host and object.
fn mix(seed: u64, stream: u64) -> u64 {
    let mut x = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// The instant every host's clock started from (virtual 0).
fn origin() -> Instant {
    Instant::now() - turmoil::elapsed()
}

fn sim_error(e: impl std::fmt::Display) -> FleetSimError {
    FleetSimError::Simulation(e.to_string())
}

fn turmoil_sim(network: &Network, seed: u64, limit: Duration) -> turmoil::Sim<'static> {
    turmoil::Builder::new()
        .simulation_duration(limit)
        .tick_duration(network.tick)
        .min_message_latency(network.latency)
        .max_message_latency(network.latency)
        .rng_seed(seed)
        .build()
}

/// Adds the client hosts `client0`, `client1`, ... (`clients` of them) to `sim`, host `c`
/// running the future `client(c)` makes, and runs the simulation: what each client
/// returned, in the order they ended, and the virtual time the run took.
fn run_clients<T: Send + 'static, F>(
    mut sim: turmoil::Sim<'static>,
    clients: usize,
    client: impl Fn(usize) -> F,
) -> Result<(Vec<T>, Duration), FleetSimError>
where
    F: Future<Output = turmoil::Result<T>> + 'static,
{
    let results: Arc<Mutex<Vec<T>>> = Arc::default();
    for c in 0..clients {
        let (run, results) = (client(c), Arc::clone(&results));
        sim.client(format!("client{c}"), async move {
            let result = run.await?;
            results
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(result);
            Ok(())
        });
    }
    sim.run().map_err(sim_error)?;
    let elapsed = sim.elapsed();
    let results = std::mem::take(&mut *results.lock().unwrap_or_else(PoisonError::into_inner));
    Ok((results, elapsed))
}

/// A lazily connected channel to `host`, with keepalive and the storm's reset settings.
fn channel(host: &str, network: &Network) -> Result<Channel, tonic::transport::Error> {
    let endpoint: Endpoint = turmoil_net::endpoint(host, PORT)?
        .http2_keep_alive_interval(network.keepalive)
        .keep_alive_timeout(network.keepalive)
        .http2_max_local_error_reset_streams(None);
    Ok(turmoil_net::connect_lazy_with(endpoint))
}

/// Serves `service` on [`PORT`] of the current host, behind a `ShedLayer` for `admission`
/// when given; counts the server as bound in `bound` first.
async fn serve<T: crate::Inventory>(
    service: T,
    admission: Option<AdmissionConfig>,
    bound: &watch::Sender<usize>,
) -> turmoil::Result {
    let incoming = turmoil_net::incoming(PORT).await?;
    bound.send_modify(|n| *n += 1);
    let builder = Server::builder()
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS));
    let service = InventoryServer::new(service);
    match admission {
        Some(config) => {
            builder
                .layer(ShedLayer::from_config(&config)?)
                .add_service(service)
                .serve_with_incoming(incoming)
                .await?
        }
        None => {
            let mut builder = builder;
            builder
                .add_service(service)
                .serve_with_incoming(incoming)
                .await?
        }
    }
    Ok(())
}

/// What one client host measured.
#[derive(Debug, Default)]
struct ClientResult {
    timeline: Vec<super::Second>,
    budget_refusals: Option<u64>,
    connection_errors: u64,
}

/// Offers `rate` Poisson calls per second through `caller` from `origin` for `total`,
/// counting them in `timeline`; returns when every call has ended.
async fn offer(
    caller: Caller,
    timeline: &Arc<Timeline>,
    origin: Instant,
    total: Duration,
    rate: f64,
    deadline: Duration,
    seed: u64,
) {
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut calls = JoinSet::new();
    let mut next = origin;
    while next < origin + total {
        tokio::time::sleep_until(next).await;
        let second = timeline.second(next);
        timeline.offered(second);
        let caller = caller.clone();
        let timeline = Arc::clone(timeline);
        calls.spawn(async move {
            let called = Instant::now();
            let answer =
                tokio::time::timeout(deadline, tower::ServiceExt::oneshot(caller, ())).await;
            if matches!(answer, Ok(Ok(_))) && called.elapsed() <= deadline {
                timeline.goodput(second);
            }
        });
        // Exponential gaps: a Poisson process at `rate` per second.
        let gap = -(1.0 - rng.f64()).ln() / rate;
        next += Duration::from_secs_f64(gap);
        while calls.try_join_next().is_some() {}
    }
    while calls.join_next().await.is_some() {}
}

/// Runs the storm `config` for `policy` on turmoil over `network`: `config.servers` server
/// hosts, `config.clients` client hosts. Returns the run, its counters summed over the
/// clients (offered calls and goodput by the second the call arrived, attempts by the
/// second they were sent), and the virtual time it took.
pub fn run_storm_policy(
    policy: Policy,
    config: &StormConfig,
    network: &Network,
) -> Result<(PolicyRun, Duration), FleetSimError> {
    if !matches!(
        policy,
        Policy::Naive | Policy::ClientOnly | Policy::ServerOnly | Policy::Stormguard
    ) {
        return Err(FleetSimError::Simulation(format!(
            "policy {} is not run on turmoil (naive, client-only, server-only, stormguard are)",
            policy.as_str()
        )));
    }
    let total = Duration::from_secs(u64::from(config.total_s()));
    // Every call ends within its deadline of the last arrival; the rest is slack.
    let limit = total + config.deadline + Duration::from_secs(5);
    let mut sim = turmoil_sim(network, config.seed, limit);
    let (bound, ready) = watch::channel(0usize);
    let bound = Arc::new(bound);
    let servers: Vec<String> = (0..config.servers).map(|i| format!("server{i}")).collect();
    for (i, name) in servers.iter().enumerate() {
        let config = config.clone();
        let bound = Arc::clone(&bound);
        let seed = mix(config.seed, 100 + i as u64);
        sim.host(name.as_str(), move || {
            storm_server(policy, config.clone(), seed, Arc::clone(&bound))
        });
    }
    let (results, elapsed) = run_clients(sim, config.clients, |c| {
        let host = StormClient {
            policy,
            config: config.clone(),
            network: *network,
            servers: servers.clone(),
            seed: mix(config.seed, 1_000 + c as u64),
        };
        let mut ready = ready.clone();
        async move {
            ready.wait_for(|n| *n >= host.servers.len()).await?;
            host.run().await
        }
    })?;
    Ok((sum_clients(policy, config, &results), elapsed))
}

/// One server host of the storm: the demo Inventory, slowed during the trigger, behind
/// the storm's workers and, for a shedding policy, the `ShedLayer` seeded from `seed`.
async fn storm_server(
    policy: Policy,
    config: StormConfig,
    seed: u64,
    bound: Arc<watch::Sender<usize>>,
) -> turmoil::Result {
    let demo = DemoInventory::new(DemoConfig {
        service_time: config.service_time,
        fail_rate: 0.0,
        seed,
    });
    let control = demo.control();
    let origin = origin();
    let (normal, slowed) = (
        config.service_time,
        config.service_time.mul_f64(config.slowdown),
    );
    let trigger = config.trigger();
    tokio::spawn(async move {
        tokio::time::sleep_until(origin + trigger.from).await;
        control.set_service_time(slowed);
        tokio::time::sleep_until(origin + trigger.until).await;
        control.set_service_time(normal);
    });
    let workers = Workers::new(demo, config.workers, ServerModel::Cancelling);
    let admission = policy.sheds().then(|| admission(&config, seed));
    serve(workers, admission, &bound).await
}

/// One client host of the storm.
struct StormClient {
    policy: Policy,
    config: StormConfig,
    network: Network,
    servers: Vec<String>,
    seed: u64,
}

impl StormClient {
    /// Offers the host's share of the calls through its policy over its own `Replicas` of
    /// every server, and returns what it counted.
    async fn run(self) -> turmoil::Result<ClientResult> {
        let config = &self.config;
        let origin = origin();
        let timeline = Arc::new(Timeline::new(origin, config.total_s() as usize));
        let mut members = Vec::with_capacity(self.servers.len());
        for name in &self.servers {
            let observed = Observe::new(channel(name, &self.network)?, Arc::clone(&timeline));
            members.push((name.clone(), observed));
        }
        let replicas = Replicas::from_services(
            ReplicaConfig {
                seed: Some(mix(self.seed, 1)),
                ..ReplicaConfig::default()
            },
            members,
        )?;
        let (caller, stats) = match self.policy {
            Policy::Naive | Policy::ServerOnly => {
                let naive = Naive {
                    max_attempts: config.naive_attempts,
                    delays: Delays::Fixed(config.naive_backoff),
                    deadline: config.deadline,
                    per_attempt: Some(config.per_attempt),
                    seed: mix(self.seed, 2),
                };
                (naive_caller(InventoryClient::new(replicas), naive), None)
            }
            _ => {
                let client_config = stormguard_client_config(Some(config.per_attempt));
                let layer =
                    RetryLayer::from_config(&client_config.clone().with_seed(mix(self.seed, 3)))?
                        .over_replicas();
                let stats = layer.stats();
                let service = ServiceBuilder::new().layer(layer).service(replicas);
                (
                    layered_caller(InventoryClient::new(service), Some(config.deadline)),
                    Some(stats),
                )
            }
        };
        let total = Duration::from_secs(u64::from(config.total_s()));
        let rate = config.offered_per_second() / config.clients as f64;
        offer(
            caller,
            &timeline,
            origin,
            total,
            rate,
            config.deadline,
            mix(self.seed, 4),
        )
        .await;
        Ok(ClientResult {
            timeline: timeline.snapshot(),
            budget_refusals: stats.map(|s| s.snapshot().refused.budget),
            connection_errors: timeline.connection_errors(),
        })
    }
}

/// The run of `policy`: the clients' counters summed second by second.
fn sum_clients(policy: Policy, config: &StormConfig, results: &[ClientResult]) -> PolicyRun {
    let mut timeline: Vec<super::Second> = (0..config.total_s())
        .map(|t| super::Second {
            t,
            ..super::Second::default()
        })
        .collect();
    let mut budget_refusals = None;
    let mut connection_errors = 0;
    for r in results {
        for (sum, s) in timeline.iter_mut().zip(&r.timeline) {
            sum.offered += s.offered;
            sum.goodput += s.goodput;
            sum.attempts += s.attempts;
            sum.shed += s.shed;
        }
        if let Some(n) = r.budget_refusals {
            budget_refusals = Some(budget_refusals.unwrap_or(0) + n);
        }
        connection_errors += r.connection_errors;
    }
    PolicyRun {
        policy,
        timeline,
        budget_refusals,
        connection_errors,
        reject_cpu: Duration::ZERO,
        throttled: None,
        saturated_refusals: None,
        hedges: None,
    }
}

/// The storm's report of `runs` (from [`run_storm_policy`] with `config`), with the
/// nominal capacity (on virtual time a sleep takes exactly its duration, rounded up to the
/// tick).
pub fn fleet_storm_report(runs: &[PolicyRun], config: &StormConfig) -> StormReport {
    let capacity = config.capacity();
    storm_report(
        runs,
        config.warmup_s,
        config.warmup_s + config.trigger_s,
        capacity,
        capacity / config.slowdown,
        config.offered_per_second(),
    )
}

// ---------------------------------------------------------------------------------------
// A dead dependency

/// The variants of the simulator's table 2 that the layers' config can express.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeadVariant {
    /// 3 attempts, a fixed 20 ms backoff, no budget: the storm's naive loop.
    ThreeAttempts,
    /// The `RetryLayer` with its default budget: a floor of 5 retries/s per process.
    PerProcessFloor,
    /// The default budget with `retry.budget.fleet_size` set to the number of clients.
    FleetAwareFloor,
    /// The default budget and the default circuit breaker (`retry.breaker`).
    FloorWithBreaker,
    /// `ClientConfig::default()` with the method marked idempotent, nothing else: the
    /// floor lent only while the dependency answers, no fleet size, no breaker.
    Defaults,
}

impl DeadVariant {
    /// All five, in table 2's order.
    pub const ALL: [DeadVariant; 5] = [
        DeadVariant::ThreeAttempts,
        DeadVariant::PerProcessFloor,
        DeadVariant::FleetAwareFloor,
        DeadVariant::FloorWithBreaker,
        DeadVariant::Defaults,
    ];

    /// The simulator's name for it (`three-attempts`, `per-process-floor`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DeadVariant::ThreeAttempts => "three-attempts",
            DeadVariant::PerProcessFloor => "per-process-floor",
            DeadVariant::FleetAwareFloor => "fleet-aware-floor",
            DeadVariant::FloorWithBreaker => "per-process-floor+breaker",
            DeadVariant::Defaults => "defaults",
        }
    }

    /// The client config of the variant for a fleet of `clients` (`None`: the naive loop).
    pub fn client_config(self, clients: usize) -> Option<ClientConfig> {
        let mut config = stormguard_client_config(None);
        // The floor variants lend their floor always, as the budgets table 2 compares do.
        let always = BudgetConfig {
            floor: Floor::Always,
            ..BudgetConfig::default()
        };
        match self {
            DeadVariant::ThreeAttempts => return None,
            DeadVariant::Defaults => {}
            DeadVariant::PerProcessFloor => config.budget = BudgetChoice::Stormguard(always),
            DeadVariant::FleetAwareFloor => {
                config.budget = BudgetChoice::Stormguard(BudgetConfig {
                    fleet_size: u32::try_from(clients).unwrap_or(u32::MAX),
                    ..always
                });
            }
            DeadVariant::FloorWithBreaker => {
                config.budget = BudgetChoice::Stormguard(always);
                config.breaker = Some(BreakerConfig::default());
            }
        }
        Some(config)
    }
}

/// Table 2's case on turmoil.
#[derive(Clone, Debug, PartialEq)]
pub struct DeadDependencyConfig {
    /// Client hosts.
    pub clients: usize,
    /// Logical calls per second of each client (Poisson).
    pub rate_per_client: f64,
    /// Seconds before the measured window (the budgets' reserves drain in it).
    pub warmup_s: u32,
    /// Seconds measured.
    pub measured_s: u32,
    /// Deadline of a logical call.
    pub deadline: Duration,
    /// The naive loop's fixed delay between attempts.
    pub naive_backoff: Duration,
    /// The simulated network.
    pub network: Network,
    /// Seed of the whole run.
    pub seed: u64,
}

impl DeadDependencyConfig {
    /// 50 clients × 10 calls/s, 1 s deadline, measured from 10 s to 40 s, as table 2.
    pub fn standard() -> Self {
        DeadDependencyConfig {
            clients: 50,
            rate_per_client: 10.0,
            warmup_s: 10,
            measured_s: 30,
            deadline: Duration::from_secs(1),
            naive_backoff: Duration::from_millis(20),
            network: Network::default(),
            seed: 1,
        }
    }

    /// Measured from 5 s to 15 s, as table 2's quick run.
    pub fn quick() -> Self {
        DeadDependencyConfig {
            warmup_s: 5,
            measured_s: 10,
            ..DeadDependencyConfig::standard()
        }
    }
}

/// What a dead-dependency run measured over its window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeadDependencyRun {
    /// The variant.
    pub variant: DeadVariant,
    /// Logical calls per second offered in the window.
    pub calls_per_second: f64,
    /// Retries per second reaching the server (attempts carrying
    /// `grpc-previous-rpc-attempts`).
    pub retries_per_second: f64,
    /// Attempts per second reaching the server.
    pub attempts_per_second: f64,
    /// Attempts per logical call.
    pub amplification: f64,
    /// Virtual time the run took.
    pub virtual_time: Duration,
}

/// The dead server's counters at the start and at the end of the measured window.
type Window = Arc<Mutex<(Option<DemoCounts>, Option<DemoCounts>)>>;

/// The dead dependency: the demo Inventory failing every call at once, reading its
/// counters into `window` at both ends of the measured window `(from, total)`.
async fn dead_server(
    seed: u64,
    (from, total): (Duration, Duration),
    bound: Arc<watch::Sender<usize>>,
    window: Window,
) -> turmoil::Result {
    instant_server(seed, 1.0, bound, move |control, origin| async move {
        tokio::time::sleep_until(origin + from).await;
        window.lock().unwrap_or_else(PoisonError::into_inner).0 = Some(control.counts());
        tokio::time::sleep_until(origin + total).await;
        window.lock().unwrap_or_else(PoisonError::into_inner).1 = Some(control.counts());
    })
    .await
}

/// A `dead` host: the demo Inventory answering at once, failing at `fail_rate`, while
/// `script` runs beside it with the Inventory's control and the run's origin.
async fn instant_server<F: Future<Output = ()> + Send + 'static>(
    seed: u64,
    fail_rate: f64,
    bound: Arc<watch::Sender<usize>>,
    script: impl FnOnce(DemoControl, Instant) -> F,
) -> turmoil::Result {
    let demo = DemoInventory::new(DemoConfig {
        service_time: Duration::ZERO,
        fail_rate,
        seed,
    });
    tokio::spawn(script(demo.control(), origin()));
    serve(demo, None, &bound).await
}

/// One client host of the dead dependency: its calls through the naive loop (no
/// `client_config`) or the variant's layer until `total`; returns the calls it offered
/// in the measured window.
async fn dead_client(
    config: &DeadDependencyConfig,
    client_config: Option<&ClientConfig>,
    seed: u64,
    total: Duration,
) -> turmoil::Result<u64> {
    let (origin, timeline) = offer_to_dead(config, client_config, seed, total).await?;
    // The server reads its counters at the end of the window: stay until then.
    tokio::time::sleep_until(origin + total + config.deadline).await;
    Ok(timeline
        .snapshot()
        .iter()
        .skip(config.warmup_s as usize)
        .map(|s| s.offered)
        .sum())
}

/// A client host's open-loop calls to the `dead` host until `total`, through the naive
/// loop (no `client_config`) or the variant's layer: the run's origin and the host's
/// timeline, second by second.
async fn offer_to_dead(
    config: &DeadDependencyConfig,
    client_config: Option<&ClientConfig>,
    seed: u64,
    total: Duration,
) -> turmoil::Result<(Instant, Arc<Timeline>)> {
    let origin = origin();
    let seconds = (config.warmup_s + config.measured_s) as usize;
    let timeline = Arc::new(Timeline::new(origin, seconds));
    let observed = Observe::new(channel("dead", &config.network)?, Arc::clone(&timeline));
    let caller = dead_caller(config, client_config, observed, seed)?;
    let rate = config.rate_per_client;
    offer(
        caller,
        &timeline,
        origin,
        total,
        rate,
        config.deadline,
        mix(seed, 4),
    )
    .await;
    Ok((origin, timeline))
}

/// The caller of a dead-dependency client host over `observed`: the naive loop (no
/// `client_config`) or the variant's layer, seeded from `seed`.
fn dead_caller(
    config: &DeadDependencyConfig,
    client_config: Option<&ClientConfig>,
    observed: Observe<Channel>,
    seed: u64,
) -> Result<Caller, ConfigError> {
    Ok(match client_config {
        None => naive_caller(
            InventoryClient::new(observed),
            Naive {
                max_attempts: 3,
                delays: Delays::Fixed(config.naive_backoff),
                deadline: config.deadline,
                per_attempt: None,
                seed: mix(seed, 2),
            },
        ),
        Some(client_config) => {
            let layer = RetryLayer::from_config(&client_config.clone().with_seed(mix(seed, 3)))?;
            let service = ServiceBuilder::new().layer(layer).service(observed);
            layered_caller(InventoryClient::new(service), Some(config.deadline))
        }
    })
}

/// What a run against the `dead` host starts from: its measured window, from the end of
/// the warm-up (`from`) to `total`; a simulation long enough for the last calls to end;
/// and the channel by which the host says that it listens.
struct DeadRun {
    from: Duration,
    total: Duration,
    sim: turmoil::Sim<'static>,
    bound: Arc<watch::Sender<usize>>,
    ready: watch::Receiver<usize>,
}

impl DeadRun {
    fn new(config: &DeadDependencyConfig) -> Self {
        let from = Duration::from_secs(u64::from(config.warmup_s));
        let total = from + Duration::from_secs(u64::from(config.measured_s));
        let limit = total + config.deadline + Duration::from_secs(5);
        let (bound, ready) = watch::channel(0usize);
        DeadRun {
            from,
            total,
            sim: turmoil_sim(&config.network, config.seed, limit),
            bound: Arc::new(bound),
            ready,
        }
    }
}

/// Runs `sim` with the config's client hosts of `variant`: once the `dead` host listens
/// (`ready`), client `c` runs what `client` makes of the config, the variant's layer
/// config (none: the naive loop) and the client's seed. What each returned, and the
/// virtual time the run took.
fn run_dead_clients<T: Send + 'static, F>(
    sim: turmoil::Sim<'static>,
    ready: &watch::Receiver<usize>,
    (variant, config): (DeadVariant, &DeadDependencyConfig),
    client: impl Fn(DeadDependencyConfig, Option<ClientConfig>, u64) -> F,
) -> Result<(Vec<T>, Duration), FleetSimError>
where
    F: Future<Output = turmoil::Result<T>> + 'static,
{
    let layer = variant.client_config(config.clients);
    run_clients(sim, config.clients, |c| {
        let mut ready = ready.clone();
        let seed = mix(config.seed, 1_000 + c as u64);
        let run = client(config.clone(), layer.clone(), seed);
        async move {
            ready.wait_for(|n| *n >= 1).await?;
            run.await
        }
    })
}

/// Runs `variant` against a server that answers every attempt `UNAVAILABLE` at once.
pub fn run_dead_dependency(
    variant: DeadVariant,
    config: &DeadDependencyConfig,
) -> Result<DeadDependencyRun, FleetSimError> {
    let mut run = DeadRun::new(config);
    let window: Window = Arc::default();
    {
        let window = Arc::clone(&window);
        let seed = mix(config.seed, 100);
        run.sim.host("dead", move || {
            dead_server(
                seed,
                (run.from, run.total),
                Arc::clone(&run.bound),
                Arc::clone(&window),
            )
        });
    }
    let (calls, virtual_time) = run_dead_clients(
        run.sim,
        &run.ready,
        (variant, config),
        |config, layer, seed| async move { dead_client(&config, layer.as_ref(), seed, run.total).await },
    )?;
    let (Some(start), Some(end)) = *window.lock().unwrap_or_else(PoisonError::into_inner) else {
        return Err(FleetSimError::Simulation(
            "the server did not read its counters at both ends of the window".into(),
        ));
    };
    let calls: u64 = calls.iter().sum();
    let seconds = f64::from(config.measured_s);
    let attempts = end.entered - start.entered;
    let retries = end.entered_retry - start.entered_retry;
    Ok(DeadDependencyRun {
        variant,
        calls_per_second: calls as f64 / seconds,
        retries_per_second: retries as f64 / seconds,
        attempts_per_second: attempts as f64 / seconds,
        amplification: if calls == 0 {
            0.0
        } else {
            attempts as f64 / calls as f64
        },
        virtual_time,
    })
}

// ---------------------------------------------------------------------------------------
// A dependency that refuses connections

/// What a run against a dependency that refuses every connection measured.
#[derive(Clone, Debug, PartialEq)]
pub struct RefusingDependencyRun {
    /// The variant.
    pub variant: DeadVariant,
    /// Logical calls per second offered after the first second.
    pub calls_per_second: f64,
    /// Connection attempts per logical call after the first second (every client's
    /// channel, counted by its connector).
    pub connections_per_call: f64,
    /// The most connection attempts one host made in one second.
    pub max_connections_per_host_second: u64,
    /// Virtual time the run took.
    pub virtual_time: Duration,
}

/// What one client host of the refusing dependency counted: calls offered after the
/// first second, and its connection attempts per second.
struct Refused {
    calls: u64,
    dials_per_second: Vec<u64>,
}

/// One client host calling the refusing host through `client_config` (`None`: the naive
/// loop) until `total`, over a channel that records its connection attempts.
async fn refused_client(
    config: &DeadDependencyConfig,
    client_config: Option<&ClientConfig>,
    seed: u64,
    total: Duration,
) -> turmoil::Result<Refused> {
    let origin = origin();
    let seconds = (config.warmup_s + config.measured_s) as usize;
    let timeline = Arc::new(Timeline::new(origin, seconds));
    let dials = turmoil_net::Dials::default();
    let endpoint = turmoil_net::endpoint("refusing", PORT)?
        .http2_keep_alive_interval(config.network.keepalive)
        .keep_alive_timeout(config.network.keepalive);
    let channel = turmoil_net::connect_lazy_counting(endpoint, Arc::clone(&dials));
    let observed = Observe::new(channel, Arc::clone(&timeline));
    let caller = dead_caller(config, client_config, observed, seed)?;
    offer(
        caller,
        &timeline,
        origin,
        total,
        config.rate_per_client,
        config.deadline,
        mix(seed, 4),
    )
    .await;
    let calls = timeline.snapshot().iter().skip(1).map(|s| s.offered).sum();
    let mut dials_per_second = vec![0; seconds + 2];
    for at in dials.lock().unwrap_or_else(PoisonError::into_inner).iter() {
        let s = at.saturating_duration_since(origin).as_secs() as usize;
        if let Some(n) = dials_per_second.get_mut(s) {
            *n += 1;
        }
    }
    Ok(Refused {
        calls,
        dials_per_second,
    })
}

/// Runs `variant` against a host that refuses every connection (it listens on nothing),
/// for the config's warm-up and measured seconds together.
pub fn run_refusing_dependency(
    variant: DeadVariant,
    config: &DeadDependencyConfig,
) -> Result<RefusingDependencyRun, FleetSimError> {
    let total = Duration::from_secs(u64::from(config.warmup_s + config.measured_s));
    let limit = total + config.deadline + Duration::from_secs(5);
    let mut sim = turmoil_sim(&config.network, config.seed, limit);
    sim.host("refusing", move || async move {
        tokio::time::sleep(limit).await;
        Ok(())
    });
    let client_config = variant.client_config(config.clients);
    let (results, virtual_time) = run_clients(sim, config.clients, |c| {
        let config = config.clone();
        let client_config = client_config.clone();
        let seed = mix(config.seed, 1_000 + c as u64);
        async move { refused_client(&config, client_config.as_ref(), seed, total).await }
    })?;
    let calls: u64 = results.iter().map(|r| r.calls).sum();
    let dials: u64 = results
        .iter()
        .map(|r| r.dials_per_second.iter().skip(1).sum::<u64>())
        .sum();
    let seconds = f64::from(config.warmup_s + config.measured_s - 1);
    Ok(RefusingDependencyRun {
        variant,
        calls_per_second: calls as f64 / seconds,
        connections_per_call: if calls == 0 {
            0.0
        } else {
            dials as f64 / calls as f64
        },
        max_connections_per_host_second: results
            .iter()
            .flat_map(|r| r.dials_per_second.iter().copied())
            .max()
            .unwrap_or(0),
        virtual_time,
    })
}

// ---------------------------------------------------------------------------------------
// A blip

/// A healthy server that answers every attempt `UNAVAILABLE` for one second, from the
/// config's `warmup_s`: the calls offered and those that succeeded, summed over the
/// clients second by second (by the second each call arrived).
pub fn run_blip(
    variant: DeadVariant,
    config: &DeadDependencyConfig,
) -> Result<Vec<super::Second>, FleetSimError> {
    let mut run = DeadRun::new(config);
    let seed = mix(config.seed, 100);
    run.sim.host("dead", move || {
        instant_server(
            seed,
            0.0,
            Arc::clone(&run.bound),
            move |control, origin| async move {
                tokio::time::sleep_until(origin + run.from).await;
                control.set_fail_rate(1.0);
                tokio::time::sleep_until(origin + run.from + Duration::from_secs(1)).await;
                control.set_fail_rate(0.0);
            },
        )
    });
    let (results, _) = run_dead_clients(
        run.sim,
        &run.ready,
        (variant, config),
        |config, layer, seed| async move {
            let (_, timeline) = offer_to_dead(&config, layer.as_ref(), seed, run.total).await?;
            Ok(ClientResult {
                timeline: timeline.snapshot(),
                ..ClientResult::default()
            })
        },
    )?;
    let seconds = config.warmup_s + config.measured_s;
    let mut timeline: Vec<super::Second> = (0..seconds)
        .map(|t| super::Second {
            t,
            ..super::Second::default()
        })
        .collect();
    for r in &results {
        for (sum, s) in timeline.iter_mut().zip(&r.timeline) {
            sum.offered += s.offered;
            sum.goodput += s.goodput;
            sum.attempts += s.attempts;
        }
    }
    Ok(timeline)
}
