//! The storm: a metastable failure on real tonic, and what each retry policy does with it.
//!
//! One tonic Inventory server on loopback with a fixed capacity (`workers` ×
//! `service_time` of wall time, see [`Workers`]) and an open-loop client fleet: Poisson
//! arrivals at a share of the *measured* capacity (a 10 ms `tokio::time::sleep` takes
//! about 11 ms, so `workers / service_time` overstates it), every logical call with a
//! deadline and a per-attempt timeout. From `warmup_s` on, for `trigger_s` seconds, the
//! service time is multiplied by `slowdown`; then it comes back. The same timeline runs
//! once per [`Policy`], each with a fresh server, channel and counters.
//!
//! Offered calls and goodput are counted in the second the call arrived (a call lasts at
//! most its deadline); attempts and shed answers in the second they were sent or
//! received.
//!
//! With [`LoopbackStorm::overload`] the trigger is replaced by a sustained overload (the
//! whole run at a multiple of the capacity), and with [`LoopbackStorm::reject_cost`] every
//! answer the `ShedLayer` sheds costs the server CPU before it is sent: the case the
//! client's adaptive throttle ([`Policy::Throttle`]) is for.
//!
//! The `storm` example runs it; the test suite runs [`LoopbackStorm::quick`].

pub mod chain;
mod client;
pub mod fleet_sim;
mod grpc;
mod peers;
mod report;
mod server;

use std::sync::Arc;
use std::time::Duration;

use stormguard_client::RetryLayer;
use stormguard_core::BackoffConfig;
use stormguard_core::ClientConfig;
use stormguard_core::ConfigError;
use stormguard_core::{AdmissionConfig, WorkerLimit};
use stormguard_core::{QueueOrder, RetryThreshold};
use stormguard_server::ShedLayer;
use stormguard_sim::StormConfig;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::Channel;

pub use client::{
    Attempt, Caller, Delays, INVENTORY_SERVICE, NaiveRetry, RESERVE_METHOD, connect,
    grpc_throttle_client_config, hedging_client_config, stormguard_client_config,
    throttle_client_config, unguarded_client_config,
};
pub use grpc::ClientKind;
pub use peers::{NEWCOMER_LIMIT, TowerBudgetRetry};
pub use report::{
    Hedges, PolicyRun, PolicySummary, RECOVERED_FOR_S, RECOVERED_SHARE, Second, StormReport,
    TriggerReport, recovery_s, storm_report, summarize,
};
pub use server::{
    MAX_PENDING_ACCEPT_RESET_STREAMS, RejectCost, RejectCostService, ServerModel, Serving, Workers,
};

use crate::InventoryClient;
use crate::server::{DemoConfig, DemoControl, DemoInventory};
use client::{
    Naive, Observe, attempt_service, layered_caller, layered_client, naive_caller, retry_caller,
};
use peers::{PeerServer, resilience_caller, serve_peer};
use report::Timeline;
use server::{serve, serve_costed};

/// Why a scenario could not run.
#[derive(Debug, thiserror::Error)]
pub enum StormError {
    /// Binding or reading a loopback socket failed.
    #[error("loopback socket: {0}")]
    Io(#[from] std::io::Error),
    /// Connecting a tonic channel failed.
    #[error("tonic transport: {0}")]
    Transport(#[from] tonic::transport::Error),
    /// A policy's configuration was refused.
    #[error("configuration: {0}")]
    Config(#[from] ConfigError),
    /// A peer library refused its configuration.
    #[error("peer configuration: {0}")]
    Peer(String),
    /// The policy has no client on the chosen client library (`--client grpc` runs only
    /// the policies whose client is stormguard's retry decision).
    #[error("the {policy} policy does not run on the {client} client")]
    Unsupported {
        /// The policy.
        policy: &'static str,
        /// The client library.
        client: &'static str,
    },
}

/// The retry policies compared, in the order they run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// 3 attempts, a fixed short backoff, no budget, pushback ignored; plain server.
    Naive,
    /// The same with full-jitter exponential backoff.
    Jitter,
    /// gRPC A6 retry throttling (10, 0.1) with the A6 backoff, from a standard service
    /// config, through stormguard's `RetryLayer`; plain server.
    GrpcThrottle,
    /// stormguard's `RetryLayer` with defaults; plain server.
    ClientOnly,
    /// The naive client against stormguard's `ShedLayer` with defaults.
    ServerOnly,
    /// Both layers tuned to the run: the `ShedLayer`'s defaults with the server's real
    /// concurrency as a fixed limit (unless [`LoopbackStorm::fixed_limit`] is off), the
    /// `RetryLayer`'s defaults with `Reserve` idempotent and the run's per-attempt timeout.
    Stormguard,
    /// Both layers exactly as a newcomer installs them: `AdmissionConfig::default()` (an
    /// adaptive worker limit, told nothing) and `ClientConfig::default()` with `Reserve`
    /// marked idempotent, nothing else set (no per-attempt timeout: each call has its
    /// deadline).
    Defaults,
    /// Both layers with defaults, but `Reserve` hedged instead of retried
    /// ([`hedging_client_config`]). Not in the default run ([`Policy::DEFAULT`]).
    Hedging,
    /// `stormguard` plus the client's adaptive throttle with its defaults
    /// ([`throttle_client_config`]): for a server whose refusals cost real work
    /// ([`LoopbackStorm::reject_cost`]). Not in the default run.
    Throttle,
    /// `stormguard` with load reports (ORCA) on both layers: the `ShedLayer` reports its
    /// load on every answer and the `RetryLayer` refuses retries while the server reports
    /// itself saturated ([`SaturationConfig`](stormguard_core::SaturationConfig)'s
    /// defaults). Not in the default run.
    Reports,
    /// The naive loop's behaviour built from stormguard's layers with every protection
    /// off, so that its metrics can be seen: the client a `RetryLayer` that retries as
    /// `naive` does, with a budget no storm uses up ([`unguarded_client_config`]); the
    /// server a `ShedLayer` that queues in arrival order and sheds nothing
    /// ([`LoopbackStorm::unguarded_admission`]). Not in the default run.
    Unguarded,
    /// tower and tonic as their docs recommend: the client `tower::retry::Retry` with the
    /// policy of tower's budget docs over `TpsBudget::default()`, the naive loop's attempts,
    /// backoff and per-attempt timeout; the server tonic's
    /// `concurrency_limit_per_connection(`[`NEWCOMER_LIMIT`]`)` with `load_shed(true)`.
    /// Not in the default run.
    Tower,
    /// `tower` with the server's limit at its real concurrency (`workers`). Not in the
    /// default run.
    TowerSized,
    /// tower-resilience as its docs recommend: the client its standard stack (a time limit
    /// per call and per attempt around its `exponential_backoff()` retry with its
    /// token-bucket budget); the server its `AdaptiveLimiterLayer` with Vegas at its
    /// defaults, tonic's `load_shed(true)` beside it. Not in the default run.
    Resilience,
    /// `resilience` with the limiter told the server's real concurrency (its initial and
    /// highest limit). Not in the default run.
    ResilienceSized,
}

impl Policy {
    /// Every policy, in the order they run when named together.
    pub const ALL: [Policy; 15] = [
        Policy::Naive,
        Policy::Jitter,
        Policy::GrpcThrottle,
        Policy::ClientOnly,
        Policy::ServerOnly,
        Policy::Stormguard,
        Policy::Defaults,
        Policy::Hedging,
        Policy::Throttle,
        Policy::Reports,
        Policy::Unguarded,
        Policy::Tower,
        Policy::TowerSized,
        Policy::Resilience,
        Policy::ResilienceSized,
    ];

    /// The policies a run compares unless told otherwise: the six retry policies and
    /// both layers on their defaults. `hedging` answers another question (slowness, not
    /// failure) and is run on request, so the default run stays at seven policies of 25 s
    /// each.
    pub const DEFAULT: [Policy; 7] = [
        Policy::Naive,
        Policy::Jitter,
        Policy::GrpcThrottle,
        Policy::ClientOnly,
        Policy::ServerOnly,
        Policy::Stormguard,
        Policy::Defaults,
    ];

    /// The policy's name in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::Naive => "naive",
            Policy::Jitter => "jitter",
            Policy::GrpcThrottle => "grpc-throttle",
            Policy::ClientOnly => "client-only",
            Policy::ServerOnly => "server-only",
            Policy::Stormguard => "stormguard",
            Policy::Defaults => "defaults",
            Policy::Hedging => "hedging",
            Policy::Throttle => "throttle",
            Policy::Reports => "reports",
            Policy::Unguarded => "unguarded",
            Policy::Tower => "tower",
            Policy::TowerSized => "tower-sized",
            Policy::Resilience => "resilience",
            Policy::ResilienceSized => "resilience-sized",
        }
    }

    /// Whether the server runs behind a `ShedLayer`.
    pub fn sheds(self) -> bool {
        matches!(
            self,
            Policy::ServerOnly
                | Policy::Stormguard
                | Policy::Defaults
                | Policy::Hedging
                | Policy::Throttle
                | Policy::Reports
                | Policy::Unguarded
        )
    }

    /// Whether the policy is a peer's stack (tower with tonic's limits, or
    /// tower-resilience) rather than stormguard's or a loop of this repository's.
    pub fn is_peer(self) -> bool {
        self.peer_server(1).is_some()
    }

    /// The admission of a peer's server (`None`: the policy is not a peer's), for a server
    /// of `workers` workers.
    fn peer_server(self, workers: usize) -> Option<PeerServer> {
        match self {
            Policy::Tower => Some(PeerServer::Tonic {
                limit: NEWCOMER_LIMIT,
            }),
            Policy::TowerSized => Some(PeerServer::Tonic { limit: workers }),
            Policy::Resilience => Some(PeerServer::Vegas { capacity: None }),
            Policy::ResilienceSized => Some(PeerServer::Vegas {
                capacity: Some(workers),
            }),
            _ => None,
        }
    }
}

/// Applied to each layer before it serves, with the name the run gives it (the storm: the
/// policy's; the chain: the case's and the hop's): the examples' `--metrics-addr` gives
/// the layers a meter and that name.
#[derive(Clone, Default)]
pub struct Instruments {
    client: Option<Arc<ClientInstrument>>,
    server: Option<Arc<ServerInstrument>>,
}

type ClientInstrument = dyn Fn(RetryLayer, &str) -> RetryLayer + Send + Sync;
type ServerInstrument = dyn Fn(ShedLayer, &str) -> ShedLayer + Send + Sync;

impl Instruments {
    /// `client` applied to every `RetryLayer`, `server` to every `ShedLayer`.
    pub fn new(
        client: impl Fn(RetryLayer, &str) -> RetryLayer + Send + Sync + 'static,
        server: impl Fn(ShedLayer, &str) -> ShedLayer + Send + Sync + 'static,
    ) -> Self {
        Instruments {
            client: Some(Arc::new(client)),
            server: Some(Arc::new(server)),
        }
    }

    pub(crate) fn client(&self, layer: RetryLayer, name: &str) -> RetryLayer {
        match &self.client {
            Some(instrument) => instrument(layer, name),
            None => layer,
        }
    }

    pub(crate) fn server(&self, layer: ShedLayer, name: &str) -> ShedLayer {
        match &self.server {
            Some(instrument) => instrument(layer, name),
            None => layer,
        }
    }
}

impl std::fmt::Debug for Instruments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Instruments")
            .field("client", &self.client.is_some())
            .field("server", &self.server.is_some())
            .finish()
    }
}

/// The storm on loopback: the storm's settings and what this run adds to them (its
/// capacity measurement, its server model, the hedging policy's delay, the sustained
/// overload and the cost of a refusal).
#[derive(Clone, Debug, PartialEq)]
pub struct LoopbackStorm {
    /// The storm (its `clients` and `servers` are one each here; its `load` is a share of
    /// the *measured* capacity).
    pub storm: StormConfig,
    /// How long each capacity measurement takes.
    pub calibration: Duration,
    /// What the server does with work whose caller left.
    pub model: ServerModel,
    /// Whether the shed layer's worker limit is fixed at the server's real concurrency
    /// (`workers`, what an operator who measured it would set) rather than the default,
    /// adaptive. The [`Policy::Defaults`] row always runs the default.
    pub fixed_limit: bool,
    /// When the `hedging` policy sends the second copy of a call that has not answered.
    ///
    /// [`standard`](Self::standard): 20 ms, twice the service time. A call takes about
    /// 11 ms at normal speed plus its wait for a worker at 78 % load; 15 ms hedges one
    /// healthy call in ten (as many as the budget pays for), 25 ms one in a hundred, and
    /// 20 ms is about the 98th percentile on an idle 2-core machine (2 % of healthy calls
    /// hedge; up to 8 % when other builds share the machine and stall it): the "hedge
    /// where the tail begins" a team would configure, a few percent more load while
    /// healthy. It is also below the trigger's slowed service time, so every call the
    /// trigger slows is due a hedge: the run shows what the budget and the `ShedLayer` do
    /// with hedges sent exactly while the server is slow.
    pub hedge_delay: Duration,
    /// With `Some(x)`, a sustained overload instead of the trigger: logical calls are
    /// offered at `x` times the measured capacity for the whole run, and the service time
    /// never changes (`load` and `slowdown` are not used). `None` in
    /// [`standard`](Self::standard).
    pub overload: Option<f64>,
    /// CPU each answer the `ShedLayer` sheds costs the server before it is sent: a busy
    /// loop on the server's runtime thread (what decoding, authenticating or a cache miss
    /// before the shed decision cost a real server), totalled in
    /// [`PolicySummary::reject_cpu_ms`]. Zero in [`standard`](Self::standard).
    pub reject_cost: Duration,
    /// The client library the policies' calls go out on: tonic (the default), or the
    /// official `grpc` crate under stormguard's interceptor.
    pub client: ClientKind,
}

impl LoopbackStorm {
    /// The default run: [`StormConfig::loopback`], capacity measured for 1.5 s, a
    /// cancelling server, hedges after 20 ms.
    pub fn standard() -> Self {
        LoopbackStorm {
            storm: StormConfig::loopback(),
            calibration: Duration::from_millis(1500),
            model: ServerModel::Cancelling,
            fixed_limit: true,
            hedge_delay: Duration::from_millis(20),
            overload: None,
            reject_cost: Duration::ZERO,
            client: ClientKind::Tonic,
        }
    }

    /// A shorter run for tests: [`StormConfig::loopback_quick`], capacity measured for
    /// 0.6 s.
    pub fn quick() -> Self {
        LoopbackStorm {
            storm: StormConfig::loopback_quick(),
            calibration: Duration::from_millis(600),
            ..LoopbackStorm::standard()
        }
    }

    /// The seconds the report's trigger spans: the trigger, or with
    /// [`overload`](Self::overload) the whole run (it is all overload).
    fn reported_trigger(&self) -> (u32, u32) {
        let storm = &self.storm;
        match self.overload {
            Some(_) => (0, storm.total_s()),
            None => (storm.warmup_s, storm.warmup_s + storm.trigger_s),
        }
    }

    /// The `unguarded` policy's shed layer: the server's real concurrency, callers served
    /// in arrival order from a queue of 10,000, nothing shed before the queue is full, no
    /// "do not retry", calls given until their deadline: what a plain server with a
    /// semaphore does, counted.
    pub fn unguarded_admission(&self) -> AdmissionConfig {
        AdmissionConfig {
            workers: WorkerLimit::Fixed(self.storm.workers),
            queue_capacity: 10_000,
            retry_threshold: RetryThreshold {
                depth: None,
                queue_delay: None,
            },
            queue_order: QueueOrder::Fifo,
            min_time_left: Duration::ZERO,
            no_retry_code: None,
            no_retry_margin: None,
            no_retry_after_shedding: None,
            ..AdmissionConfig::default()
        }
    }

    /// The shed layer's configuration: the defaults, with (`fixed_limit`) the server's
    /// real concurrency as a fixed limit, else the default adaptive limit, told nothing.
    pub fn admission(&self) -> AdmissionConfig {
        if self.fixed_limit {
            return AdmissionConfig {
                workers: WorkerLimit::Fixed(self.storm.workers),
                ..AdmissionConfig::default()
            };
        }
        AdmissionConfig::default()
    }
}

/// Completions per second the server managed at normal speed and during the trigger.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Capacity {
    /// At the normal service time.
    pub normal: f64,
    /// At the slowed-down service time.
    pub reduced: f64,
}

/// The demo Inventory at the normal service time behind the scenario's capacity model,
/// and the handle that changes its service time.
fn capacity_model(config: &LoopbackStorm) -> (Workers, DemoControl) {
    let demo = DemoInventory::new(DemoConfig {
        service_time: config.storm.service_time,
        fail_rate: 0.0,
        seed: config.storm.seed,
    });
    let control = demo.control();
    (
        Workers::new(demo, config.storm.workers, config.model),
        control,
    )
}

/// Measures the server's capacity at both service times: `2 × workers` callers in a
/// closed loop without deadlines keep every worker busy, and completions are counted.
pub async fn measure_capacity(config: &LoopbackStorm) -> Result<Capacity, StormError> {
    let (workers, control) = capacity_model(config);
    let serving = serve(workers.clone(), None).await?;
    let client = InventoryClient::new(connect(serving.addr).await?);
    let mut callers = JoinSet::new();
    for _ in 0..2 * config.storm.workers {
        let mut client = client.clone();
        callers.spawn(async move {
            loop {
                if client
                    .reserve(crate::ReserveRequest::default())
                    .await
                    .is_err()
                {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
            }
        });
    }
    let mut rates = [0.0; 2];
    let storm = &config.storm;
    for (i, service_time) in [
        storm.service_time,
        storm.service_time.mul_f64(storm.slowdown),
    ]
    .into_iter()
    .enumerate()
    {
        control.set_service_time(service_time);
        // Let the callers settle at the new speed, then count.
        tokio::time::sleep(config.calibration / 4).await;
        let (before, t0) = (control.counts().ok, Instant::now());
        tokio::time::sleep(config.calibration).await;
        let done = control.counts().ok - before;
        rates[i] = done as f64 / t0.elapsed().as_secs_f64();
    }
    callers.abort_all();
    workers.close();
    Ok(Capacity {
        normal: rates[0],
        reduced: rates[1],
    })
}

/// The whole storm: measures the capacity, offers `config.storm.load` of it to each of
/// `policies` in turn, and reports. `progress` is called with each policy and the share of
/// its run done (1.0 when it ends).
pub async fn run_storm(
    config: &LoopbackStorm,
    policies: &[Policy],
    progress: &(dyn Fn(Policy, f64) + Send + Sync),
    instruments: &Instruments,
) -> Result<StormReport, StormError> {
    let capacity = measure_capacity(config).await?;
    let rate = config.overload.unwrap_or(config.storm.load) * capacity.normal;
    let mut runs = Vec::with_capacity(policies.len());
    for &policy in policies {
        let progress = |done| progress(policy, done);
        runs.push(run_policy(policy, config, rate, &progress, instruments).await?);
    }
    let (start_s, end_s) = config.reported_trigger();
    // Under a sustained overload the service time never changes: the capacity is the one
    // the run has throughout.
    let reduced = match config.overload {
        Some(_) => capacity.normal,
        None => capacity.reduced,
    };
    let mut report = storm_report(&runs, start_s, end_s, capacity.normal, reduced, rate);
    report.overload = config.overload;
    Ok(report)
}

/// Runs `policy` through the scenario at `rate` logical calls per second, its layers
/// through `instruments`. `progress` is called with the share of the run done: 0 when the
/// run's clock starts, then about ten times a second.
pub async fn run_policy(
    policy: Policy,
    config: &LoopbackStorm,
    rate: f64,
    progress: &(dyn Fn(f64) + Send + Sync),
    instruments: &Instruments,
) -> Result<PolicyRun, StormError> {
    let (workers, control) = capacity_model(config);
    let admission = match policy {
        Policy::Defaults => Some(AdmissionConfig::default()),
        Policy::Unguarded => Some(config.unguarded_admission()),
        _ => policy.sheds().then(|| config.admission()),
    };
    // Only a server that sheds has refusals to pay for; without a cost the stack is the
    // default run's.
    let reject_cost = (policy.sheds() && !config.reject_cost.is_zero())
        .then(|| RejectCost::new(config.reject_cost));
    let reports = policy == Policy::Reports;
    let instrument = |layer| instruments.server(layer, policy.as_str());
    let serving = match policy.peer_server(config.storm.workers) {
        Some(peer) => serve_peer(workers.clone(), peer).await?,
        None => {
            serve_costed(
                workers.clone(),
                admission,
                reject_cost.clone(),
                reports,
                &instrument,
            )
            .await?
        }
    };
    let (start, timeline, client) = match config.client {
        ClientKind::Tonic => {
            let channel: Channel = connect(serving.addr).await?;
            let start = Instant::now();
            let timeline = Arc::new(Timeline::new(start, config.storm.total_s() as usize));
            let observed = Observe::new(channel, Arc::clone(&timeline));
            let client = policy_caller(policy, config, observed, instruments)?;
            (start, timeline, client)
        }
        ClientKind::Grpc => {
            let client_config = interceptor_config(policy, config)?;
            // The `grpc` channel connects on its first call, as tonic's lazily would.
            let start = Instant::now();
            let timeline = Arc::new(Timeline::new(start, config.storm.total_s() as usize));
            let (caller, stats) = grpc::grpc_caller(
                serving.addr,
                &client_config,
                config.storm.seed,
                Arc::clone(&timeline),
                config.storm.deadline,
            )?;
            let client = PolicyClient {
                caller,
                stats: None,
                refused: None,
                interceptor: Some(stats),
            };
            (start, timeline, client)
        }
    };
    progress(0.0);
    let PolicyClient {
        caller,
        stats,
        refused,
        interceptor,
    } = client;
    let offered = Offered {
        config,
        control: &control,
        timeline: &timeline,
        start,
        rate,
    };
    offered.offer(caller, progress).await;
    progress(1.0);
    workers.close();
    drop(serving);
    let snapshot = stats.map(|s| s.snapshot());
    let on_grpc = interceptor.map(|s| s.snapshot());
    Ok(PolicyRun {
        policy,
        timeline: timeline.snapshot(),
        // A hedge is paid from the same budget as a retry; the layer counts a refused hedge
        // once as a hedge and again as the call's refusal if its other copy then failed.
        budget_refusals: snapshot
            .map(|s| match policy {
                Policy::Hedging => s.hedges_refused.budget,
                _ => s.refused.budget,
            })
            .or_else(|| {
                on_grpc.as_ref().map(|s| match policy {
                    Policy::Hedging => s.hedges_refused(stormguard_core::Refusal::Budget),
                    _ => s.refused(stormguard_core::Refusal::Budget),
                })
            })
            .or_else(|| refused.map(|n| n.load(std::sync::atomic::Ordering::Relaxed))),
        connection_errors: timeline.connection_errors(),
        reject_cpu: reject_cost.map_or(Duration::ZERO, |c| c.spent()),
        throttled: snapshot.map(|s| s.throttled.total()),
        saturated_refusals: snapshot.filter(|_| reports).map(|s| s.refused.saturated),
        hedges: snapshot
            .map(|s| Hedges {
                sent: s.hedges,
                won: s.hedges_won,
                refused: s.hedges_refused.iter().filter(|(_, n)| *n > 0).collect(),
            })
            .or_else(|| {
                on_grpc.as_ref().map(|s| Hedges {
                    sent: s.hedges,
                    won: s.hedges_won,
                    refused: stormguard_core::Refusal::ALL
                        .into_iter()
                        .map(|r| (r.as_str(), s.hedges_refused(r)))
                        .filter(|(_, n)| *n > 0)
                        .collect(),
                })
            })
            .filter(|_| policy == Policy::Hedging),
    })
}

/// A policy's client: its caller, the retry layer's counters if it has one, the retries a
/// peer's budget refused if it is a peer's.
struct PolicyClient {
    caller: client::Caller,
    stats: Option<stormguard_client::RetryStats>,
    refused: Option<Arc<std::sync::atomic::AtomicU64>>,
    /// The interceptor's counters, on the `grpc` client.
    interceptor: Option<stormguard_grpc::InterceptorStats>,
}

impl From<(client::Caller, Option<stormguard_client::RetryStats>)> for PolicyClient {
    fn from((caller, stats): (client::Caller, Option<stormguard_client::RetryStats>)) -> Self {
        PolicyClient {
            caller,
            stats,
            refused: None,
            interceptor: None,
        }
    }
}

/// The client of `policy` over `observed`.
fn policy_caller(
    policy: Policy,
    config: &LoopbackStorm,
    observed: Observe<Channel>,
    instruments: &Instruments,
) -> Result<PolicyClient, StormError> {
    let storm = &config.storm;
    let per_attempt = Some(storm.per_attempt);
    let naive = |delays| Naive {
        max_attempts: storm.naive_attempts,
        delays,
        deadline: storm.deadline,
        per_attempt,
        seed: storm.seed,
    };
    let fixed = Delays::Fixed(storm.naive_backoff);
    Ok(PolicyClient::from(match policy {
        Policy::Tower | Policy::TowerSized => {
            let retry = TowerBudgetRetry::new(storm.naive_attempts, storm.naive_backoff);
            let refused = retry.refused();
            let attempt = attempt_service(InventoryClient::new(observed), per_attempt);
            return Ok(PolicyClient {
                caller: retry_caller(attempt, retry, storm.deadline),
                stats: None,
                refused: Some(refused),
                interceptor: None,
            });
        }
        Policy::Resilience | Policy::ResilienceSized => {
            let (caller, refused) = resilience_caller(
                InventoryClient::new(observed),
                storm.deadline,
                storm.per_attempt,
            )?;
            return Ok(PolicyClient {
                caller,
                stats: None,
                refused: Some(refused),
                interceptor: None,
            });
        }
        Policy::Naive | Policy::ServerOnly => (
            naive_caller(InventoryClient::new(observed), naive(fixed)),
            None,
        ),
        Policy::Jitter => {
            let jitter = Delays::Jittered(BackoffConfig::FullJitter {
                base: storm.naive_backoff,
                cap: storm.deadline,
                multiplier: 2.0,
            });
            (
                naive_caller(InventoryClient::new(observed), naive(jitter)),
                None,
            )
        }
        Policy::GrpcThrottle
        | Policy::ClientOnly
        | Policy::Stormguard
        | Policy::Defaults
        | Policy::Hedging
        | Policy::Throttle
        | Policy::Reports
        | Policy::Unguarded => {
            let client_config = match policy {
                Policy::GrpcThrottle => grpc_throttle_client_config(per_attempt)?,
                // A newcomer's client sets no per-attempt timeout.
                Policy::Defaults => stormguard_client_config(None),
                Policy::Hedging => hedging_client_config(config.hedge_delay),
                Policy::Throttle => throttle_client_config(per_attempt),
                Policy::Unguarded => {
                    unguarded_client_config(per_attempt, storm.naive_backoff, storm.naive_attempts)
                }
                _ => stormguard_client_config(per_attempt),
            };
            let reports = policy == Policy::Reports;
            let instrument = |layer| instruments.client(layer, policy.as_str());
            let (client, stats) =
                layered_client(observed, &client_config, storm.seed, reports, instrument)?;
            (layered_caller(client, Some(storm.deadline)), Some(stats))
        }
    }))
}

/// The client config of `policy` on the `grpc` client: the one its `RetryLayer` has on
/// tonic. The policies whose client is a loop of their own (`naive`, `jitter`,
/// `server-only`, the peers') or uses what the interceptor does not have yet (the adaptive
/// throttle, load reports) do not run on it.
fn interceptor_config(policy: Policy, config: &LoopbackStorm) -> Result<ClientConfig, StormError> {
    let per_attempt = Some(config.storm.per_attempt);
    Ok(match policy {
        Policy::GrpcThrottle => grpc_throttle_client_config(per_attempt)?,
        Policy::Defaults => stormguard_client_config(None),
        Policy::ClientOnly | Policy::Stormguard => stormguard_client_config(per_attempt),
        Policy::Hedging => hedging_client_config(config.hedge_delay),
        Policy::Unguarded => unguarded_client_config(
            per_attempt,
            config.storm.naive_backoff,
            config.storm.naive_attempts,
        ),
        _ => {
            return Err(StormError::Unsupported {
                policy: policy.as_str(),
                client: ClientKind::Grpc.as_str(),
            });
        }
    })
}

/// The open-loop arrivals of one policy's run, and the trigger on the server's speed.
struct Offered<'a> {
    config: &'a LoopbackStorm,
    control: &'a DemoControl,
    timeline: &'a Arc<Timeline>,
    start: Instant,
    rate: f64,
}

impl Offered<'_> {
    /// Offers Poisson calls at `rate` through `caller` for the run's length, slowing the
    /// server during the trigger; returns when every call has ended.
    async fn offer(&self, caller: client::Caller, progress: &(dyn Fn(f64) + Send + Sync)) {
        let storm = &self.config.storm;
        let total = Duration::from_secs(u64::from(storm.total_s()));
        let trigger = storm.trigger();
        let mut rng = fastrand::Rng::with_seed(storm.seed);
        let mut calls = JoinSet::new();
        let mut next = self.start;
        let mut slowed = false;
        let mut restored = false;
        let mut last_progress = self.start;
        let deadline = storm.deadline;
        while next < self.start + total {
            tokio::time::sleep_until(next).await;
            let now = Instant::now();
            let elapsed = now - self.start;
            // A sustained overload keeps the service time as it is.
            if !slowed && self.config.overload.is_none() && elapsed >= trigger.from {
                self.control
                    .set_service_time(storm.service_time.mul_f64(storm.slowdown));
                slowed = true;
            }
            if !restored && elapsed >= trigger.until {
                self.control.set_service_time(storm.service_time);
                restored = true;
            }
            if now - last_progress >= Duration::from_millis(100) {
                progress(elapsed.as_secs_f64() / total.as_secs_f64());
                last_progress = now;
            }
            let second = self.timeline.second(next);
            self.timeline.offered(second);
            let caller = caller.clone();
            let timeline = Arc::clone(self.timeline);
            calls.spawn(async move {
                let called = Instant::now();
                let answer =
                    tokio::time::timeout(deadline, tower::ServiceExt::oneshot(caller, ())).await;
                if matches!(answer, Ok(Ok(_))) && called.elapsed() <= deadline {
                    timeline.goodput(second);
                }
            });
            // Exponential gaps: a Poisson process at `rate` per second.
            let gap = -(1.0 - rng.f64()).ln() / self.rate;
            next += Duration::from_secs_f64(gap);
            while calls.try_join_next().is_some() {}
        }
        while calls.join_next().await.is_some() {}
    }
}
