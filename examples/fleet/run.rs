//! One run: a fresh fleet of replica processes, one policy's client over all of them, and
//! one scenario's fault, on one timeline.
//!
//! The client is one process: an open-loop Poisson generator (seeded, so every run of a
//! scenario offers the same arrivals) that spawns a task per logical call. Every call has
//! a deadline and a per-attempt timeout and carries its id in `x-call-id` on every
//! attempt. Under the policy's retry logic, [`Observe`] counts each attempt sent and the
//! ones that failed with their connection (refused by a dead replica: they reach no
//! server); the replicas report the attempts that reached them.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use clap::ValueEnum;
use stormguard::client::ReplicaConfig;
use stormguard::client::RetryLayer;

use crate::meters::Meters;
use stormguard::client::replicas::{EndpointKey, Replicas};
use stormguard::engine::wire::GRPC_PREVIOUS_RPC_ATTEMPTS;
use stormguard_demo::storm::stormguard_client_config;
use stormguard_demo::{InventoryClient, ReserveRequest};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceExt};

use crate::peers;
use crate::process::{Received, Replica, SharedReports};
use crate::replica::CALL_ID;

/// The width of one timeline bucket.
pub(crate) const BUCKET: Duration = Duration::from_millis(100);
/// The fault's replica, in every scenario but `rolling`.
pub(crate) const BAD: usize = 0;
/// A `slow` replica's service time is this many times the normal one.
pub(crate) const SLOWDOWN: f64 = 10.0;

/// `--scenarios`: what goes wrong, from the fault's time on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Scenario {
    /// One replica answers every call UNAVAILABLE at once
    FailFast,
    /// One replica's service time x10
    Slow,
    /// One replica's process is killed (SIGKILL) and never comes back
    Killed,
    /// Killed, then started again on the same port, cold
    Restart,
    /// Every replica restarted in turn, each with a graceful shutdown
    Rolling,
}

impl Scenario {
    pub(crate) const ALL: [Scenario; 5] = [
        Scenario::FailFast,
        Scenario::Slow,
        Scenario::Killed,
        Scenario::Restart,
        Scenario::Rolling,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scenario::FailFast => "fail-fast",
            Scenario::Slow => "slow",
            Scenario::Killed => "killed",
            Scenario::Restart => "restart",
            Scenario::Rolling => "rolling",
        }
    }
}

/// `--policies`: how the client retries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Policy {
    /// 3 attempts, 10 ms apart, over tonic's Channel::balance_list
    Naive,
    /// stormguard's RetryLayer with defaults (Reserve idempotent) over Channel::balance_list
    Layer,
    /// The RetryLayer over stormguard's endpoint-aware replica channel
    Stormguard,
    /// tower's p2c balancer (PeakEWMA) over the replicas, tower's retry with a TpsBudget
    #[value(name = "tower-p2c")]
    TowerP2c,
    /// tower-resilience's outlier ejection under tower's p2c balancer, its retry with its
    /// token-bucket budget and its time limits
    Resilience,
}

impl Policy {
    pub(crate) const ALL: [Policy; 5] = [
        Policy::Naive,
        Policy::Layer,
        Policy::Stormguard,
        Policy::TowerP2c,
        Policy::Resilience,
    ];
    /// The policies a run compares unless told otherwise (the peers' run on request).
    pub(crate) const DEFAULT: [Policy; 3] = [Policy::Naive, Policy::Layer, Policy::Stormguard];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Policy::Naive => "naive",
            Policy::Layer => "layer",
            Policy::Stormguard => "stormguard",
            Policy::TowerP2c => "tower-p2c",
            Policy::Resilience => "resilience",
        }
    }
}

/// When things happen in a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Timing {
    /// The healthy phase ends and the fault begins.
    pub(crate) fault: Duration,
    /// The whole run.
    pub(crate) total: Duration,
    /// `restart`: the replica comes back this long after it was killed.
    pub(crate) back_after: Duration,
    /// `restart`: how long a returning replica stays cold.
    pub(crate) cold: Duration,
    /// `rolling`: one replica's restart begins this long after the previous one's.
    pub(crate) rolling_gap: Duration,
}

impl Timing {
    /// 2 s healthy, 8 s of fault; `restart` back after 2 s, cold for 2 s; `rolling` one
    /// replica every 1.2 s.
    pub(crate) fn standard() -> Self {
        Timing {
            fault: Duration::from_secs(2),
            total: Duration::from_secs(10),
            back_after: Duration::from_secs(2),
            cold: Duration::from_secs(2),
            rolling_gap: Duration::from_millis(1200),
        }
    }

    /// 1 s healthy, 4 s of fault; back after 1 s, cold for 0.5 s; one replica every 0.5 s.
    /// (A returning replica then has 2.5 s warm: time for the endpoint-aware channel's
    /// probes, whose ejections may have doubled while it was away or cold.)
    pub(crate) fn quick() -> Self {
        Timing {
            fault: Duration::from_secs(1),
            total: Duration::from_secs(5),
            back_after: Duration::from_secs(1),
            cold: Duration::from_millis(500),
            rolling_gap: Duration::from_millis(500),
        }
    }

    pub(crate) fn buckets(&self) -> usize {
        (self.total.as_micros() / BUCKET.as_micros()) as usize
    }
}

/// The knobs every run shares.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RunConfig {
    pub(crate) replicas: usize,
    /// Logical calls per second.
    pub(crate) rate: f64,
    pub(crate) deadline: Duration,
    pub(crate) per_attempt: Duration,
    pub(crate) seed: u64,
    pub(crate) timing: Timing,
}

/// Attempts of a naive call.
const NAIVE_ATTEMPTS: u32 = 3;
/// The delay between a naive call's attempts.
const NAIVE_BACKOFF: Duration = Duration::from_millis(10);

/// One logical call as the client saw it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Call {
    pub(crate) id: u64,
    /// Its scheduled arrival, since the start.
    pub(crate) at: Duration,
    pub(crate) ok: bool,
    pub(crate) latency: Duration,
}

/// An attempt that failed with its connection (it reached no server), seen by the client.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Refused {
    pub(crate) call: u64,
    pub(crate) attempt: u32,
    pub(crate) at: Duration,
}

/// A replica's process was down (killed or stopping) from `from` until `to` (`None`: for
/// the rest of the run).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Down {
    pub(crate) replica: usize,
    pub(crate) from: Duration,
    pub(crate) to: Option<Duration>,
}

/// What one run measured.
#[derive(Debug)]
pub(crate) struct RunData {
    pub(crate) calls: Vec<Call>,
    /// Attempts the client sent, per bucket.
    pub(crate) attempts: Vec<u64>,
    pub(crate) refused: Vec<Refused>,
    /// What the replicas received; `at_us` counted from the run's start.
    pub(crate) received: Vec<Received>,
    pub(crate) downs: Vec<Down>,
    /// `stormguard`: when the client's channel first ejected the bad replica.
    pub(crate) ejected_at: Option<Duration>,
    /// `stormguard`: ejections of any replica over the run.
    pub(crate) ejections: Option<u64>,
    /// `layer`, `stormguard`: retries the budget refused.
    pub(crate) budget_refusals: Option<u64>,
}

/// One logical call of a policy (request: the call id).
pub(crate) type Caller = BoxCloneSyncService<u64, (), Status>;

/// Runs `policy` through `scenario`. `progress` is called with the share of the run done,
/// about ten times a second.
pub(crate) async fn run(
    (scenario, policy): (Scenario, Policy),
    config: &RunConfig,
    meters: &Meters,
    progress: &(dyn Fn(f64) + Send + Sync),
) -> Result<RunData, String> {
    let reports = SharedReports::default();
    let mut fleet = start_fleet(config, &reports).await?;
    let endpoints = fleet
        .iter()
        .map(|r| endpoint(r.port))
        .collect::<Result<Vec<_>, _>>()?;
    let counts = Arc::new(ClientCounts::new(config.timing.buckets()));
    let keys: Vec<http::Uri> = endpoints.iter().map(|e| e.uri().clone()).collect();
    let Client {
        caller,
        budget,
        peer_refused,
        replicas,
    } = client((scenario, policy), endpoints, config, (&counts, meters))?;

    // Connections up before the clock starts: calls with no id, not counted anywhere.
    for _ in 0..4 * config.replicas {
        let _ = caller.clone().oneshot(0).await;
    }

    let start = Instant::now();
    let start_unix = unix_us();
    counts.start.get_or_init(|| start);
    // The fault runs in a task of its own: starting, waiting for and killing processes
    // must not hold up the arrivals. The fleet comes back with it (and is killed with the
    // task if the run ends early).
    let driver = {
        let (config, reports) = (*config, reports.clone());
        tokio::spawn(async move {
            let downs = fault(scenario, &mut fleet, &config, start, &reports).await;
            (fleet, downs)
        })
    };
    let ejections = replicas
        .clone()
        .map(|replicas| watch_ejection(scenario, replicas, keys, config, start));
    let calls = generate(&caller, config, start, progress).await?;
    let ejected_at = match ejections {
        Some(task) => task
            .await
            .map_err(|e| format!("the ejection watch failed: {e}"))?
            .map(|at| at - start),
        None => None,
    };
    let (mut fleet, downs) = driver
        .await
        .map_err(|e| format!("the fault's task failed: {e}"))?;
    let downs = downs?;
    drop(caller);
    for replica in &mut fleet {
        replica.stop().await?;
    }
    Ok(RunData {
        calls,
        attempts: counts
            .attempts
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .collect(),
        refused: std::mem::take(
            &mut *counts
                .refused
                .lock()
                .unwrap_or_else(PoisonError::into_inner),
        ),
        received: received_since(&reports, start_unix)?,
        downs,
        ejected_at,
        ejections: replicas.map(|r| r.snapshot().iter().map(|r| r.snapshot.ejections).sum()),
        budget_refusals: budget
            .map(|stats| stats.snapshot().refused.budget)
            .or_else(|| peer_refused.map(|n| n.load(Ordering::Relaxed))),
    })
}

/// The fleet of `config.replicas` replicas, each started warm, reporting into `reports`.
async fn start_fleet(config: &RunConfig, reports: &SharedReports) -> Result<Vec<Replica>, String> {
    let mut fleet = Vec::with_capacity(config.replicas);
    for i in 0..config.replicas {
        fleet.push(
            Replica::start(i, 0, replica_seed(config.seed, i), Duration::ZERO, reports).await?,
        );
    }
    Ok(fleet)
}

/// Watches, from the fault to the end of the run, for the channel's first ejection of a
/// replica the `scenario`'s fault hits (all of `keys` in `rolling`, else the bad one).
fn watch_ejection(
    scenario: Scenario,
    replicas: ReplicaChannel,
    keys: Vec<http::Uri>,
    config: &RunConfig,
    start: Instant,
) -> tokio::task::JoinHandle<Option<Instant>> {
    let watched = match scenario {
        Scenario::Rolling => keys,
        _ => vec![keys[BAD].clone()],
    };
    tokio::spawn(first_ejection(
        replicas,
        watched,
        start + config.timing.fault,
        start + config.timing.total,
    ))
}

/// What the replicas received from the run's calls (started at `start_unix`), its time
/// counted from that start; an error if a replica reported one.
fn received_since(reports: &SharedReports, start_unix: u64) -> Result<Vec<Received>, String> {
    let mut reports = std::mem::take(&mut *reports.lock().unwrap_or_else(PoisonError::into_inner));
    if !reports.errors.is_empty() {
        return Err(reports.errors.join("; "));
    }
    reports
        .received
        .retain(|r| r.call != 0 && r.at_us >= start_unix);
    for r in &mut reports.received {
        r.at_us -= start_unix;
    }
    Ok(reports.received)
}

pub(crate) fn replica_seed(seed: u64, replica: usize) -> u64 {
    seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(replica as u64)
}

pub(crate) fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
}

/// A replica's endpoint, with the client h2 settings of `docs/operating.md` (callers that
/// give up must not get the connection closed).
fn endpoint(port: u16) -> Result<Endpoint, String> {
    Endpoint::from_shared(format!("http://127.0.0.1:{port}"))
        .map(|e| {
            e.http2_max_local_error_reset_streams(None)
                .tcp_nodelay(true)
        })
        .map_err(|e| e.to_string())
}

/// The endpoint-aware channel of the `stormguard` policy.
type ReplicaChannel = Replicas<Channel, EndpointKey>;

/// A policy's client: one logical call, the retry layer's counters where it has one, the
/// retries a peer's budget refused where it is a peer's, the replica channel where it is
/// one.
struct Client {
    caller: Caller,
    budget: Option<stormguard::client::RetryStats>,
    peer_refused: Option<Arc<AtomicU64>>,
    replicas: Option<ReplicaChannel>,
}

/// The policy's client over `endpoints`, its layers recording into `meters` (the
/// `RetryLayer` named `SCENARIO.POLICY`).
fn client(
    (scenario, policy): (Scenario, Policy),
    endpoints: Vec<Endpoint>,
    config: &RunConfig,
    (counts, meters): (&Arc<ClientCounts>, &Meters),
) -> Result<Client, String> {
    let (deadline, per_attempt) = (config.deadline, config.per_attempt);
    // The `RetryLayer`: defaults with `Reserve` idempotent; for `layer`, 50 ms per attempt
    // as the naive loop, for `stormguard` nothing else (no number to find).
    let name = format!("{}.{}", scenario.as_str(), policy.as_str());
    let layer = |per_attempt: Option<Duration>| {
        RetryLayer::from_config(&stormguard_client_config(per_attempt).with_seed(config.seed))
            .map(|layer| meters.retry(layer, &name))
            .map_err(|e| e.to_string())
    };
    match policy {
        Policy::Naive => {
            let channel = Channel::balance_list(endpoints.into_iter());
            let client = InventoryClient::new(Observe::new(channel, counts.clone()));
            Ok(Client {
                caller: naive(client, deadline, per_attempt),
                budget: None,
                peer_refused: None,
                replicas: None,
            })
        }
        Policy::Layer => {
            let channel = Channel::balance_list(endpoints.into_iter());
            let layer = layer(Some(per_attempt))?;
            let budget = Some(layer.stats());
            let service = tower::ServiceBuilder::new()
                .layer(layer)
                .service(Observe::new(channel, counts.clone()));
            Ok(Client {
                caller: layered(InventoryClient::new(service), deadline),
                budget,
                peer_refused: None,
                replicas: None,
            })
        }
        Policy::Stormguard => {
            let replicas = Replicas::from_endpoints(ReplicaConfig::default(), endpoints)
                .map(|replicas| meters.replicas(replicas))
                .map_err(|e| e.to_string())?;
            let layer = layer(None)?.over_replicas();
            let budget = Some(layer.stats());
            // `Observe` passes the layer's `Route` down to the channel in the extensions.
            let service = tower::ServiceBuilder::new()
                .layer(layer)
                .service(Observe::new(replicas.clone(), counts.clone()));
            Ok(Client {
                caller: layered(InventoryClient::new(service), deadline),
                budget,
                peer_refused: None,
                replicas: Some(replicas),
            })
        }
        Policy::TowerP2c => {
            let limits = (NAIVE_ATTEMPTS, NAIVE_BACKOFF, per_attempt);
            let (caller, refused) = peers::tower_p2c(endpoints, counts, deadline, limits);
            Ok(Client {
                caller,
                budget: None,
                peer_refused: Some(refused),
                replicas: None,
            })
        }
        Policy::Resilience => {
            let (caller, refused) = peers::resilience(endpoints, counts, deadline, per_attempt)?;
            Ok(Client {
                caller,
                budget: None,
                peer_refused: Some(refused),
                replicas: None,
            })
        }
    }
}

/// The first moment from `from` on that the channel reports one of `watched` ejected,
/// looked at every 10 ms until `until`.
async fn first_ejection(
    replicas: ReplicaChannel,
    watched: Vec<http::Uri>,
    from: Instant,
    until: Instant,
) -> Option<Instant> {
    tokio::time::sleep_until(from).await;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while Instant::now() < until {
        tick.tick().await;
        let ejected = replicas
            .snapshot()
            .iter()
            .any(|r| r.snapshot.state.is_ejected() && watched.iter().any(|uri| r.key == *uri));
        if ejected {
            return Some(Instant::now());
        }
    }
    None
}

/// Sets the call's id on a request.
fn with_call_id(request: &mut Request<ReserveRequest>, call: u64) {
    if call != 0 {
        request.metadata_mut().insert(CALL_ID, call.into());
    }
}

/// The retry loop users write by hand: up to 3 attempts of a call that failed
/// `UNAVAILABLE` or ran out of its per-attempt time, 10 ms apart, within the deadline.
fn naive<S>(client: InventoryClient<S>, deadline: Duration, per_attempt: Duration) -> Caller
where
    InventoryClient<S>: Clone + Send + Sync + 'static,
    S: tonic::client::GrpcService<tonic::body::Body> + Send + 'static,
    S::Future: Send,
    S::Error: Into<tonic::codegen::StdError>,
    S::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <S::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    BoxCloneSyncService::new(tower::service_fn(move |call: u64| {
        let mut client = client.clone();
        async move {
            let until = Instant::now() + deadline;
            let mut last = Status::deadline_exceeded("naive: no time for an attempt");
            for previous in 0..NAIVE_ATTEMPTS {
                if previous > 0 {
                    if Instant::now() + NAIVE_BACKOFF >= until {
                        break;
                    }
                    tokio::time::sleep(NAIVE_BACKOFF).await;
                }
                let timeout = per_attempt.min(until.saturating_duration_since(Instant::now()));
                if timeout.is_zero() {
                    break;
                }
                let mut request = Request::new(ReserveRequest::default());
                request.set_timeout(timeout);
                with_call_id(&mut request, call);
                if previous > 0 {
                    request
                        .metadata_mut()
                        .insert(GRPC_PREVIOUS_RPC_ATTEMPTS, previous.into());
                }
                match tokio::time::timeout(timeout, client.reserve(request)).await {
                    Ok(Ok(_)) => return Ok(()),
                    Ok(Err(status)) => {
                        let retryable = matches!(
                            status.code(),
                            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
                        );
                        if !retryable {
                            return Err(status);
                        }
                        last = status;
                    }
                    Err(_) => last = Status::deadline_exceeded("naive: attempt timed out"),
                }
            }
            Err(last)
        }
    }))
}

/// A call through a client whose service retries: one request with the deadline.
pub(crate) fn layered<S>(client: InventoryClient<S>, deadline: Duration) -> Caller
where
    InventoryClient<S>: Clone + Send + Sync + 'static,
    S: tonic::client::GrpcService<tonic::body::Body> + Send + 'static,
    S::Future: Send,
    S::Error: Into<tonic::codegen::StdError>,
    S::ResponseBody: tonic::codegen::Body<Data = tonic::codegen::Bytes> + Send + 'static,
    <S::ResponseBody as tonic::codegen::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    BoxCloneSyncService::new(tower::service_fn(move |call: u64| {
        let mut client = client.clone();
        async move {
            let mut request = Request::new(ReserveRequest::default());
            request.set_timeout(deadline);
            with_call_id(&mut request, call);
            client.reserve(request).await.map(drop)
        }
    }))
}

/// The open-loop generator: Poisson arrivals at `config.rate` until the end of the run,
/// a task per call; returns every call's outcome.
pub(crate) async fn generate(
    caller: &Caller,
    config: &RunConfig,
    start: Instant,
    progress: &(dyn Fn(f64) + Send + Sync),
) -> Result<Vec<Call>, String> {
    let end = start + config.timing.total;
    let deadline = config.deadline;
    let mut rng = fastrand::Rng::with_seed(config.seed);
    let mut calls = JoinSet::new();
    let mut done = Vec::new();
    let (mut next, mut id, mut last_progress) = (start, 0u64, start);
    while next < end {
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        if now - last_progress >= BUCKET {
            progress((now - start).as_secs_f64() / config.timing.total.as_secs_f64());
            last_progress = now;
        }
        id += 1;
        let (caller, at) = (caller.clone(), next - start);
        calls.spawn(async move {
            let called = Instant::now();
            let answer = tokio::time::timeout(deadline, caller.oneshot(id)).await;
            let latency = called.elapsed();
            Call {
                id,
                at,
                ok: matches!(answer, Ok(Ok(()))) && latency <= deadline,
                latency,
            }
        });
        // Exponential gaps: a Poisson process at `rate` per second.
        next += Duration::from_secs_f64(-(1.0 - rng.f64()).ln() / config.rate);
        while let Some(call) = calls.try_join_next() {
            done.push(call.map_err(|e| format!("a call task failed: {e}"))?);
        }
    }
    while let Some(call) = calls.join_next().await {
        done.push(call.map_err(|e| format!("a call task failed: {e}"))?);
    }
    progress(1.0);
    Ok(done)
}

/// The scenario's fault, on the run's clock; returns when each replica was down.
async fn fault(
    scenario: Scenario,
    fleet: &mut [Replica],
    config: &RunConfig,
    start: Instant,
    reports: &SharedReports,
) -> Result<Vec<Down>, String> {
    let timing = &config.timing;
    let at = |d: Duration| start + d;
    tokio::time::sleep_until(at(timing.fault)).await;
    let mut downs = Vec::new();
    match scenario {
        Scenario::FailFast => fleet[BAD].send("fail")?,
        Scenario::Slow => fleet[BAD].send(&format!("slow {SLOWDOWN}"))?,
        Scenario::Killed => {
            fleet[BAD].kill();
            downs.push(Down {
                replica: BAD,
                from: timing.fault,
                to: None,
            });
        }
        Scenario::Restart => {
            fleet[BAD].kill();
            tokio::time::sleep_until(at(timing.fault + timing.back_after)).await;
            let seed = replica_seed(config.seed, BAD) + 1;
            fleet[BAD] = Replica::start(BAD, fleet[BAD].port, seed, timing.cold, reports).await?;
            downs.push(Down {
                replica: BAD,
                from: timing.fault,
                to: Some(start.elapsed()),
            });
        }
        Scenario::Rolling => {
            for (i, replica) in fleet.iter_mut().enumerate() {
                let gap = timing.rolling_gap.saturating_mul(i as u32);
                tokio::time::sleep_until(at(timing.fault + gap)).await;
                let from = start.elapsed();
                replica.stop().await?;
                let seed = replica_seed(config.seed, i) + 1;
                *replica = Replica::start(i, replica.port, seed, Duration::ZERO, reports).await?;
                downs.push(Down {
                    replica: i,
                    from,
                    to: Some(start.elapsed()),
                });
            }
        }
    }
    Ok(downs)
}

/// What the client counts below its retry logic.
#[derive(Debug)]
pub(crate) struct ClientCounts {
    /// The run's start; nothing is counted before it is set.
    pub(crate) start: OnceLock<Instant>,
    attempts: Vec<AtomicU64>,
    refused: Mutex<Vec<Refused>>,
}

impl ClientCounts {
    pub(crate) fn new(buckets: usize) -> Self {
        ClientCounts {
            start: OnceLock::new(),
            attempts: (0..buckets).map(|_| AtomicU64::new(0)).collect(),
            refused: Mutex::new(Vec::new()),
        }
    }
}

/// Counts every attempt sent through it and those that failed with their connection (an
/// attempt whose `grpc-timeout` ran out in the channel is not one).
#[derive(Clone, Debug)]
pub(crate) struct Observe<S> {
    inner: S,
    counts: Arc<ClientCounts>,
}

impl<S> Observe<S> {
    pub(crate) fn new(inner: S, counts: Arc<ClientCounts>) -> Self {
        Observe { inner, counts }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A header's value as a number, if it is one.
fn number<T: std::str::FromStr>(headers: &http::HeaderMap, name: &str) -> Option<T> {
    headers.get(name)?.to_str().ok()?.trim().parse().ok()
}

impl<S, B, R> Service<http::Request<B>> for Observe<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: ErrorChain,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let call = number::<u64>(request.headers(), CALL_ID).unwrap_or(0);
        let attempt = number::<u32>(request.headers(), GRPC_PREVIOUS_RPC_ATTEMPTS).unwrap_or(0);
        let sent = self
            .counts
            .start
            .get()
            .filter(|_| call != 0)
            .map(|s| s.elapsed());
        if let Some(sent) = sent {
            let bucket = (sent.as_micros() / BUCKET.as_micros()) as usize;
            if let Some(n) = self.counts.attempts.get(bucket) {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
        let counts = self.counts.clone();
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = future.await;
            if let (Err(e), Some(at)) = (&result, sent)
                && !timed_out(e.chain())
            {
                let refused = Refused { call, attempt, at };
                counts
                    .refused
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(refused);
            }
            result
        })
    }
}

/// An error whose source chain [`timed_out`] can read: tonic's channel's, and the boxed
/// errors of other services.
pub(crate) trait ErrorChain {
    fn chain(&self) -> &(dyn std::error::Error + 'static);
}

impl ErrorChain for tonic::transport::Error {
    fn chain(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

impl ErrorChain for stormguard::client::replicas::Error {
    fn chain(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

impl ErrorChain for tower::BoxError {
    fn chain(&self) -> &(dyn std::error::Error + 'static) {
        &**self
    }
}

/// Whether `error` is the channel's own `grpc-timeout` running out.
fn timed_out(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(error);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = e.source();
    }
    false
}
