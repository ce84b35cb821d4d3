//! What the layers cost on the happy path, as ratios against bare tonic in the same run.
//!
//! One process serves a 16-byte unary echo (`Reserve` with a 16-byte payload) on loopback
//! and calls it from 64 callers over one channel per variant. Without a deadline:
//!
//! - `bare`: a plain tonic channel to a plain tonic server;
//! - `retry`: the channel wrapped in a `RetryLayer` (the method marked idempotent, so the
//!   request is kept for a replay that never comes), same plain server;
//! - `shed`: the plain channel to a server behind a `ShedLayer` (default admission: an
//!   adaptive worker limit), against `shed-fixed` as its rival, the same with a fixed
//!   limit of 64 workers;
//! - `both`: the `RetryLayer` channel to the `ShedLayer` server;
//! - the peers, each against `bare` and with the stormguard variant that does its job as
//!   its rival (see `client_overhead/peers.rs`, and `docs/comparison.md` for the docs each
//!   setting follows): `tower` (tower's `Retry` with the `TpsBudget` policy of its docs,
//!   above the generated client, rival `retry`), `tonic-shed` (the plain channel to a
//!   server with tonic's own `concurrency_limit_per_connection(32)` and `load_shed(true)`,
//!   rival `shed`), `tower-both` (both, rival `both`), and `resilience`,
//!   `resilience-shed`, `resilience-both` (tower-resilience's retry with its token-bucket
//!   budget; its Vegas limiter behind tonic's `load_shed`);
//! - `retry-prometheus`, `shed-prometheus` (only with `--features otel-examples`): `retry`
//!   and `shed` with the layer recording into a meter whose provider has OpenTelemetry's
//!   Prometheus exporter registered, each against its plain variant as its rival: what
//!   being scraped costs the call path (nothing scrapes during the run; a scrape reads the
//!   layers' counters on its own path).
//!
//! With a deadline, as every real call has one (each request carries a 1 s
//! `Request::set_timeout`, so tonic's channel arms its own `grpc-timeout` timer on every
//! call, layer or not):
//!
//! - `bare-deadline`: the plain channel, plain server;
//! - `retry-deadline`: the `RetryLayer` channel (the layer's deadline timer per call);
//! - `retry-attempt`: the `RetryLayer` channel whose policy also limits each attempt to
//!   500 ms (`RetryPolicy::per_attempt_timeout`): the attempt's `grpc-timeout` is encoded
//!   anew on every call;
//! - `tower-retry`: what a tower user writes instead: `tower::retry::Retry` with a policy
//!   that retries `UNAVAILABLE` (up to 3 attempts, the same as the `RetryLayer`'s policy)
//!   paid from a `tower::retry::budget::TpsBudget` with the same 10 s window, 5/s floor and
//!   10 % ratio, and tower's exponential backoff for the delay. tonic's request
//!   (`http::Request<tonic::body::Body>`) cannot be cloned, its body being a stream, so
//!   the retry sits on `http::Request<Bytes>`: a service in front of it collects each
//!   request body into `Bytes` first (the workaround given for tonic's "tower retry needs
//!   a Clone request" issue, and what `ReplayBody` style buffering does in one step), and
//!   a `map_request` behind it turns the bytes back into a tonic body for the channel.
//!   Tower's `Retry` clones the request (headers, extensions, bytes) before every first
//!   attempt; its retries carry the caller's `grpc-timeout` unchanged, not what is left.
//! - `hedge-deadline`: the `RetryLayer` channel with the method *hedged* (two copies, the
//!   second after the 1 s deadline, so none is sent), against `retry-deadline` as its
//!   rival: what a hedged call costs when it needs no hedge. Measured with `--variant V
//!   --calls 2000,4000` (below): 62.04 allocations per call for both, to the byte (the
//!   hedges' `Vec` is never allocated until a hedge is sent).
//!
//! Over a fleet of three bare servers (all bound before any client connects), no deadline:
//!
//! - `balance-list`: tonic's `Channel::balance_list` over the three (tower's p2c behind a
//!   buffer, over connections that report no load);
//! - `replicas`: stormguard's `Replicas::from_endpoints` over the same endpoints (one
//!   lazily connected `Channel` per replica, one picked per attempt in `call()`, the choice
//!   seeded), used directly by the generated client;
//! - `retry-balance-list`: the `RetryLayer` of `retry` over `balance_list`;
//! - `retry-replicas`: the same `RetryLayer` built with `over_replicas()` over `Replicas`
//!   (each call's attempts carry a `Route`), against `retry-balance-list` as its rival.
//! - `replicas-dns`, `retry-replicas-dns`: `replicas` and `retry-replicas` with the fleet
//!   found by DNS (`Replicas::from_dns`, the demo's DNS server on loopback listing the
//!   three, an hour's TTL: one resolution, at start), against them as rivals: what the
//!   resolver costs per call on the happy path (docs/replicas.md has the figures).
//!
//! The fleet listens on 127.0.0.2, 127.0.0.3, 127.0.0.4 (one port: what a DNS name lists).
//!
//! Each variant with a layer is compared with its own baseline: `retry`, `shed` and `both`
//! with `bare`, the deadline variants with `bare-deadline`, the fleet variants with
//! `balance-list`.
//!
//! Rounds are interleaved (every variant once per round, each round starting with the next
//! variant), each variant running for the same time per round, and each round's figures
//! are divided by that round's baseline, so a machine that gets busier or quieter during
//! the run moves every variant alike. Per variant and round it prints calls per second, the
//! ratio to the baseline, allocations per call (a counting global allocator: client and
//! server together, as both live in this process) and CPU time per call (all threads of
//! the process, from `/proc/self/task/*/schedstat`).
//!
//! Run: `cargo bench --bench client_overhead` (options after `--`: `--rounds N`,
//! `--secs S` per variant and round, `--callers C`, `--variants a,b,...` to run only
//! those, their baselines added).
//!
//! Instructions and allocations per call, repeatable on a noisy machine: `--variant V
//! --calls N` runs one variant for exactly `N` calls on a single-threaded runtime (so that
//! the count does not depend on scheduling) and prints a line
//! `variant=V calls=N allocations=A bytes=B` counting the calls alone (set-up excluded;
//! deadline and attempt timeout 60 times longer, as a call under callgrind is that much
//! slower);
//! `--list` prints each variant with its baseline and rival (`-` for none).
//! Run it under callgrind twice with different counts and divide the difference by the
//! difference in calls (start-up cancels out); `benches/callgrind.sh` does all of that for
//! every variant and prints one table:
//!
//! ```text
//! benches/callgrind.sh                     # every variant
//! benches/callgrind.sh --json retry-deadline tower-retry
//! benches/callgrind.sh balance-list replicas retry-balance-list retry-replicas
//! ```
//!
//! The figures measured so: the happy path and the peers in `docs/comparison.md`, the
//! fleet variants in `docs/development.md`, the DNS variants in `docs/replicas.md`, the
//! adaptive limit in `docs/admission.md`, the meters in `docs/observability.md`.

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use stormguard_client::RefreshConfig;
use stormguard_client::ReplicaConfig;
use stormguard_client::replicas::{Dns, EndpointKey, Replicas};
use stormguard_client::{Retry, RetryLayer};
use stormguard_core::BackoffConfig;
use stormguard_core::MethodScope;
use stormguard_core::RetryController;
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::{HedgeDelay, HedgingPolicy};
use stormguard_core::{MethodTable, RetryPolicy};
use stormguard_demo::{
    Inventory, InventoryClient, InventoryServer, ReserveReply, ReserveRequest, StockLevel,
    WatchStockRequest,
};
use stormguard_server::{AdmissionConfig, ShedLayer, WorkerLimit};
use tokio::net::TcpListener;
use tokio::time::Sleep;
use tonic::body::Body;
use tonic::codegen::tokio_stream::{self, Stream};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Code, Request, Response, Status};
use tower::retry::backoff::{Backoff, ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff};
use tower::retry::budget::{Budget as _, TpsBudget};
use tower::util::MapRequest;
use tower::util::rng::HasherRng;
use tower::{Service, ServiceExt};

#[path = "client_overhead/peers.rs"]
mod peers;

use peers::PeerServer;

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// The deadline every call of the deadline variants carries (`Request::set_timeout`) and
/// the per-attempt timeout of `retry-attempt`.
#[derive(Clone, Copy)]
struct Timeouts {
    deadline: Duration,
    per_attempt: Duration,
}

/// In rounds: a 1 s deadline, 500 ms attempts.
const TIMED: Timeouts = Timeouts {
    deadline: Duration::from_secs(1),
    per_attempt: Duration::from_millis(500),
};

/// For a fixed number of calls, the same timeouts 60 times longer: under callgrind a call
/// runs some 50 times slower, and 64 callers on one thread can take longer than a second.
/// Only the values differ (every call still arms the same timers and carries a
/// `grpc-timeout`), so the counts are those of the timed variants.
const COUNTED: Timeouts = Timeouts {
    deadline: Duration::from_secs(60),
    per_attempt: Duration::from_secs(30),
};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Answers every `Reserve` at once.
#[derive(Clone, Default)]
struct Echo;

type LevelStream = Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send>>;

#[tonic::codegen::async_trait]
impl Inventory for Echo {
    async fn reserve(
        &self,
        req: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        Ok(Response::new(ReserveReply {
            reserved: !req.get_ref().payload.is_empty(),
            attempt: 1,
            timeout_ms: 0,
        }))
    }

    type WatchStockStream = LevelStream;

    async fn watch_stock(
        &self,
        _: Request<WatchStockRequest>,
    ) -> Result<Response<LevelStream>, Status> {
        Ok(Response::new(Box::pin(tokio_stream::empty())))
    }
}

async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    (listener, addr)
}

async fn serve_bare() -> SocketAddr {
    let (listener, addr) = listener().await;
    serve_bare_on(listener, addr)
}

fn serve_bare_on(listener: TcpListener, addr: SocketAddr) -> SocketAddr {
    tokio::spawn(
        Server::builder()
            .serve_with_incoming(InventoryServer::new(Echo), TcpIncoming::from(listener)),
    );
    addr
}

/// A server behind a `ShedLayer` of `admission`; `prometheus`: recording into the
/// exporter's meter.
async fn serve_shed(prometheus: bool, admission: AdmissionConfig) -> SocketAddr {
    let (listener, addr) = listener().await;
    let shed = ShedLayer::from_config(&admission).expect("admission config");
    let shed = if prometheus {
        exporter::shed(shed)
    } else {
        shed
    };
    // Served exactly as the bare server, the layer aside (no router in either).
    tokio::spawn(
        Server::builder()
            .layer(shed)
            .serve_with_incoming(InventoryServer::new(Echo), TcpIncoming::from(listener)),
    );
    addr
}

/// A server behind a peer's admission (see `peers`).
async fn serve_peer(server: PeerServer) -> SocketAddr {
    let (listener, addr) = listener().await;
    peers::serve(listener, addr, server)
}

/// The `*-prometheus` variants' meter: a provider of the bench's own with OpenTelemetry's
/// Prometheus exporter registered, as a service that Prometheus scrapes has it. Nothing
/// scrapes it during the run: a scrape reads the layers' counters on the scraper's own
/// path, and what is measured is what the meter adds to each call.
#[cfg(feature = "otel-examples")]
mod exporter {
    use std::sync::OnceLock;

    use opentelemetry::metrics::MeterProvider as _;
    use opentelemetry_sdk::metrics::SdkMeterProvider;

    fn meter() -> opentelemetry::metrics::Meter {
        static PROVIDER: OnceLock<SdkMeterProvider> = OnceLock::new();
        PROVIDER
            .get_or_init(|| {
                let exporter = opentelemetry_prometheus::exporter()
                    .with_registry(prometheus::Registry::new())
                    .build()
                    .expect("the Prometheus exporter");
                SdkMeterProvider::builder().with_reader(exporter).build()
            })
            .meter("client_overhead")
    }

    pub(super) fn retry(layer: super::RetryLayer) -> super::RetryLayer {
        layer.with_meter(&meter())
    }

    pub(super) fn shed(layer: super::ShedLayer) -> super::ShedLayer {
        layer.with_meter(&meter())
    }
}

/// Without the feature the `*-prometheus` variants are not offered (`available`).
#[cfg(not(feature = "otel-examples"))]
mod exporter {
    pub(super) fn retry(layer: super::RetryLayer) -> super::RetryLayer {
        layer
    }

    pub(super) fn shed(layer: super::ShedLayer) -> super::ShedLayer {
        layer
    }
}

fn endpoint(addr: SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).expect("endpoint")
}

async fn channel(addr: SocketAddr) -> Channel {
    endpoint(addr).connect().await.expect("connect")
}

/// How many bare servers the balanced variants spread their calls over.
const FLEET: usize = 3;

/// The servers of the run, all bound (and so accepting connections) before any client
/// connects: one bare, one behind the `ShedLayer`, and the bare fleet of the balanced
/// variants.
#[derive(Clone, Copy)]
struct Servers {
    bare: SocketAddr,
    shed: SocketAddr,
    /// Behind a `ShedLayer` recording into the exporter's meter.
    shed_prometheus: SocketAddr,
    /// Behind a `ShedLayer` with a fixed limit of 64 workers.
    shed_fixed: SocketAddr,
    /// Behind tonic's own `concurrency_limit_per_connection` and `load_shed`.
    tonic_limit: SocketAddr,
    /// Behind tower-resilience's Vegas limiter and tonic's `load_shed`.
    vegas: SocketAddr,
    /// On 127.0.0.2, 127.0.0.3, ..., one port: what a DNS name can list.
    fleet: [SocketAddr; FLEET],
    /// The DNS server that lists the fleet under [`FLEET_NAME`].
    dns: SocketAddr,
}

/// The name the fleet's DNS server answers for.
const FLEET_NAME: &str = "fleet.bench.test";

async fn servers() -> Servers {
    let (bare, shed) = (
        serve_bare().await,
        serve_shed(false, AdmissionConfig::default()).await,
    );
    let fixed = AdmissionConfig {
        workers: WorkerLimit::Fixed(64),
        ..AdmissionConfig::default()
    };
    let shed_fixed = serve_shed(false, fixed).await;
    let (tonic_limit, vegas) = (
        serve_peer(PeerServer::Tonic).await,
        serve_peer(PeerServer::Vegas).await,
    );
    let shed_prometheus = if cfg!(feature = "otel-examples") {
        serve_shed(true, AdmissionConfig::default()).await
    } else {
        shed
    };
    let fleet = fleet().await;
    // A TTL of an hour: no resolution but the first during a run (the happy path).
    let dns = stormguard_demo::dns::DnsServer::start(FLEET_NAME, fleet.map(|a| a.ip()), 3600)
        .await
        .expect("dns server");
    let dns_addr = dns.addr();
    // It answers for the whole run.
    Box::leak(Box::new(dns));
    Servers {
        bare,
        shed,
        shed_prometheus,
        shed_fixed,
        tonic_limit,
        vegas,
        fleet,
        dns: dns_addr,
    }
}

/// The fleet's servers on 127.0.0.2, 127.0.0.3, ... (Linux routes 127/8 to loopback), on
/// one port free on all of them.
async fn fleet() -> [SocketAddr; FLEET] {
    for _ in 0..20 {
        let mut bound = Vec::new();
        let mut port = 0;
        for i in 0..FLEET {
            let ip = std::net::Ipv4Addr::new(127, 0, 0, 2 + i as u8);
            let Ok(listener) = TcpListener::bind((ip, port)).await else {
                break;
            };
            let addr = listener.local_addr().expect("local addr");
            port = addr.port();
            bound.push((listener, addr));
        }
        if bound.len() == FLEET {
            let addrs: Vec<SocketAddr> = bound
                .into_iter()
                .map(|(listener, addr)| serve_bare_on(listener, addr))
                .collect();
            return addrs.try_into().expect("FLEET servers");
        }
    }
    panic!("no port free on 127.0.0.2 to 127.0.0.{}", 1 + FLEET)
}

/// `Replicas` over the fleet, one lazily connected `Channel` per server (the choice seeded,
/// so that a run makes the same choices every time).
type ReplicaChannel = Replicas<Channel, EndpointKey>;

fn replicas(fleet: &[SocketAddr]) -> ReplicaChannel {
    Replicas::from_endpoints(replica_config(), fleet.iter().copied().map(endpoint))
        .expect("replicas")
}

fn replica_config() -> ReplicaConfig {
    ReplicaConfig {
        seed: Some(17),
        ..ReplicaConfig::default()
    }
}

/// `Replicas` over the same fleet found by DNS: its name resolved by the fleet's DNS
/// server, once (an hour's TTL and `max_interval`).
fn replicas_from_dns(servers: &Servers) -> ReplicaChannel {
    let hour = Duration::from_secs(3600);
    let dns = Dns::new(FLEET_NAME)
        .expect("name")
        .port(servers.fleet[0].port())
        .name_servers([servers.dns])
        .refresh(RefreshConfig {
            max_interval: hour,
            seed: Some(17),
            ..RefreshConfig::default()
        });
    Replicas::from_dns(replica_config(), dns).expect("replicas from dns")
}

/// The `RetryLayer` of the layered variants: the default policy, the method idempotent (so
/// the body is kept for a replay), and `per_attempt` as the attempt's timeout.
fn retry_layer(per_attempt: Option<Duration>) -> RetryLayer {
    let budget: Arc<dyn Budget> =
        Arc::new(RetryBudget::new(BudgetConfig::default()).expect("budget"));
    let policy = RetryPolicy {
        idempotent: true,
        per_attempt_timeout: per_attempt,
        ..RetryPolicy::default()
    };
    RetryLayer::new(
        RetryController::new(MethodTable::uniform(policy), budget, None, 1).expect("policy"),
    )
}

/// The `RetryLayer` of the hedged variant: two copies, the second after `delay` (the
/// call's deadline, so that none is sent: what a hedged call costs when it needs no hedge).
fn hedge_layer(delay: Duration) -> RetryLayer {
    let budget: Arc<dyn Budget> =
        Arc::new(RetryBudget::new(BudgetConfig::default()).expect("budget"));
    let mut table = MethodTable::none();
    table.set_hedging(
        MethodScope::Default,
        Some(HedgingPolicy {
            delay: HedgeDelay::Fixed(delay),
            ..HedgingPolicy::default()
        }),
    );
    RetryLayer::new(RetryController::new(table, budget, None, 1).expect("policy"))
}

/// A `tower::retry::Policy` doing the `RetryLayer`'s job the way tower offers: retry
/// `UNAVAILABLE` (a trailers-only answer, or an error of the channel other than its own
/// timeout), at most as many attempts as the stormguard policy, each retry paid from a
/// shared `TpsBudget` and delayed by tower's exponential backoff. A response with headers
/// and no `grpc-status` (how every successful unary call answers) is a success: tower's
/// policy never sees the trailers, so that is where it deposits.
#[derive(Clone)]
struct GrpcPolicy {
    budget: Arc<TpsBudget>,
    backoff: ExponentialBackoff,
    retries_left: u32,
}

impl GrpcPolicy {
    /// The same figures as the `RetryLayer`'s: the budget's window, floor and ratio, the
    /// attempts, the backoff's base and cap.
    fn new() -> Self {
        let budget = BudgetConfig::default();
        let policy = RetryPolicy::default();
        let (base, cap) = match policy.backoff {
            BackoffConfig::FullJitter { base, cap, .. } => (base, cap),
            other => panic!("the default backoff is full jitter, not {other:?}"),
        };
        GrpcPolicy {
            budget: Arc::new(TpsBudget::new(
                budget.ttl,
                budget.min_retries_per_second,
                budget.retry_ratio as f32,
            )),
            backoff: ExponentialBackoffMaker::new(base, cap, 1.0, HasherRng::default())
                .expect("backoff")
                .make_backoff(),
            retries_left: policy.max_attempts - 1,
        }
    }
}

/// Whether `error` (from the channel) is its `grpc-timeout` running out.
fn is_timeout(error: &tonic::transport::Error) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(e) = source {
        if e.is::<tonic::TimeoutExpired>() {
            return true;
        }
        source = e.source();
    }
    false
}

impl tower::retry::Policy<http::Request<Bytes>, http::Response<Body>, tonic::transport::Error>
    for GrpcPolicy
{
    type Future = Sleep;

    fn retry(
        &mut self,
        _: &mut http::Request<Bytes>,
        result: &mut Result<http::Response<Body>, tonic::transport::Error>,
    ) -> Option<Sleep> {
        let retryable = match result {
            Ok(response) => match Status::from_header_map(response.headers()) {
                None => {
                    self.budget.deposit();
                    return None;
                }
                Some(status) if status.code() == Code::Ok => {
                    self.budget.deposit();
                    return None;
                }
                Some(status) => status.code() == Code::Unavailable,
            },
            Err(error) => !is_timeout(error),
        };
        if !retryable || self.retries_left == 0 || !self.budget.withdraw() {
            return None;
        }
        self.retries_left -= 1;
        Some(self.backoff.next_backoff())
    }

    fn clone_request(&mut self, request: &http::Request<Bytes>) -> Option<http::Request<Bytes>> {
        Some(request.clone())
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Collects each request body into `Bytes` (so that `tower::retry` can clone the request),
/// then calls `inner` with it.
#[derive(Clone)]
struct CollectBody<S> {
    inner: S,
}

impl<S> Service<http::Request<Body>> for CollectBody<S>
where
    S: Service<http::Request<Bytes>, Response = http::Response<Body>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send,
{
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = BoxFuture<Result<http::Response<Body>, BoxError>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The readied service goes with the call; a clone stays for the next `poll_ready`.
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            let bytes = body.collect().await?.to_bytes();
            inner
                .call(http::Request::from_parts(parts, bytes))
                .await
                .map_err(Into::into)
        })
    }
}

/// A collected request as the channel takes it.
fn to_body(request: http::Request<Bytes>) -> http::Request<Body> {
    request.map(|bytes| Body::new(Full::new(bytes)))
}

type ToBody = fn(http::Request<Bytes>) -> http::Request<Body>;

/// The `tower-retry` stack under the generated client.
type TowerRetry = CollectBody<tower::retry::Retry<GrpcPolicy, MapRequest<Channel, ToBody>>>;

fn tower_retry(channel: Channel) -> TowerRetry {
    CollectBody {
        inner: tower::retry::Retry::new(GrpcPolicy::new(), channel.map_request(to_body as ToBody)),
    }
}

/// What stands between the generated client and the channel.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stack {
    Plain,
    /// A `RetryLayer`; `per_attempt`: with a per-attempt timeout.
    Layer {
        per_attempt: bool,
    },
    Tower,
    /// A `RetryLayer` that hedges the method, after a delay no call reaches (the happy
    /// path of a hedged call: answered before its delay, no hedge sent).
    Hedge,
    /// tonic's `Channel::balance_list` over the fleet; `retry`: under a `RetryLayer`.
    BalanceList {
        retry: bool,
    },
    /// tower's `Retry` with a `TpsBudget` above the generated client (see `peers`).
    PeerTower,
    /// tower-resilience's retry with its token bucket above the generated client.
    PeerResilience,
    /// stormguard's `Replicas` over the fleet; `retry`: under a `RetryLayer` built with
    /// `over_replicas`; `dns`: the fleet found by DNS (`Replicas::from_dns`).
    Replicas {
        retry: bool,
        dns: bool,
    },
}

/// One configuration measured.
struct Variant {
    name: &'static str,
    /// The variant its ratios are taken against.
    baseline: &'static str,
    /// A variant it is also compared with (stormguard against what tower offers).
    rival: Option<&'static str>,
    stack: Stack,
    shed_server: bool,
    /// Whether every call carries a deadline.
    deadline: bool,
    /// Whether the variant's layers record into a meter whose provider has
    /// OpenTelemetry's Prometheus exporter registered (only with `--features
    /// otel-examples`): what a service scraped by Prometheus runs on its call path.
    prometheus: bool,
    /// Whether its `ShedLayer` has a fixed worker limit (64) instead of the default,
    /// adaptive one.
    fixed_limit: bool,
    /// A peer's server admission instead of stormguard's (`shed_server` false).
    peer_server: Option<PeerServer>,
}

/// What a variant is unless it says otherwise: bare tonic on both sides.
const BARE: Variant = Variant {
    name: "bare",
    baseline: "bare",
    rival: None,
    stack: Stack::Plain,
    shed_server: false,
    deadline: false,
    prometheus: false,
    fixed_limit: false,
    peer_server: None,
};

const VARIANTS: [Variant; 24] = [
    BARE,
    Variant {
        name: "retry",
        stack: Stack::Layer { per_attempt: false },
        ..BARE
    },
    Variant {
        name: "shed",
        rival: Some("shed-fixed"),
        shed_server: true,
        ..BARE
    },
    Variant {
        name: "shed-fixed",
        shed_server: true,
        fixed_limit: true,
        ..BARE
    },
    Variant {
        name: "both",
        stack: Stack::Layer { per_attempt: false },
        shed_server: true,
        ..BARE
    },
    Variant {
        name: "tower",
        rival: Some("retry"),
        stack: Stack::PeerTower,
        ..BARE
    },
    Variant {
        name: "tonic-shed",
        rival: Some("shed"),
        peer_server: Some(PeerServer::Tonic),
        ..BARE
    },
    Variant {
        name: "tower-both",
        rival: Some("both"),
        stack: Stack::PeerTower,
        peer_server: Some(PeerServer::Tonic),
        ..BARE
    },
    Variant {
        name: "resilience",
        rival: Some("retry"),
        stack: Stack::PeerResilience,
        ..BARE
    },
    Variant {
        name: "resilience-shed",
        rival: Some("shed"),
        peer_server: Some(PeerServer::Vegas),
        ..BARE
    },
    Variant {
        name: "resilience-both",
        rival: Some("both"),
        stack: Stack::PeerResilience,
        peer_server: Some(PeerServer::Vegas),
        ..BARE
    },
    Variant {
        name: "bare-deadline",
        baseline: "bare-deadline",
        deadline: true,
        ..BARE
    },
    Variant {
        name: "retry-deadline",
        baseline: "bare-deadline",
        rival: Some("tower-retry"),
        stack: Stack::Layer { per_attempt: false },
        deadline: true,
        ..BARE
    },
    Variant {
        name: "retry-attempt",
        baseline: "bare-deadline",
        rival: Some("tower-retry"),
        stack: Stack::Layer { per_attempt: true },
        deadline: true,
        ..BARE
    },
    Variant {
        name: "hedge-deadline",
        baseline: "bare-deadline",
        rival: Some("retry-deadline"),
        stack: Stack::Hedge,
        deadline: true,
        ..BARE
    },
    Variant {
        name: "tower-retry",
        baseline: "bare-deadline",
        stack: Stack::Tower,
        deadline: true,
        ..BARE
    },
    Variant {
        name: "balance-list",
        baseline: "balance-list",
        stack: Stack::BalanceList { retry: false },
        ..BARE
    },
    Variant {
        name: "replicas",
        baseline: "balance-list",
        stack: Stack::Replicas {
            retry: false,
            dns: false,
        },
        ..BARE
    },
    Variant {
        name: "retry-balance-list",
        baseline: "balance-list",
        stack: Stack::BalanceList { retry: true },
        ..BARE
    },
    Variant {
        name: "retry-replicas",
        baseline: "balance-list",
        rival: Some("retry-balance-list"),
        stack: Stack::Replicas {
            retry: true,
            dns: false,
        },
        ..BARE
    },
    Variant {
        name: "replicas-dns",
        baseline: "balance-list",
        rival: Some("replicas"),
        stack: Stack::Replicas {
            retry: false,
            dns: true,
        },
        ..BARE
    },
    Variant {
        name: "retry-replicas-dns",
        baseline: "balance-list",
        rival: Some("retry-replicas"),
        stack: Stack::Replicas {
            retry: true,
            dns: true,
        },
        ..BARE
    },
    Variant {
        name: "retry-prometheus",
        rival: Some("retry"),
        stack: Stack::Layer { per_attempt: false },
        prometheus: true,
        ..BARE
    },
    Variant {
        name: "shed-prometheus",
        rival: Some("shed"),
        shed_server: true,
        prometheus: true,
        ..BARE
    },
];

/// The variants this build can run: those with a Prometheus exporter need the
/// `otel-examples` feature.
fn available() -> impl Iterator<Item = &'static Variant> {
    VARIANTS
        .iter()
        .filter(|v| !v.prometheus || cfg!(feature = "otel-examples"))
}

fn variant(name: &str) -> &'static Variant {
    available().find(|v| v.name == name).unwrap_or_else(|| {
        let names: Vec<_> = available().map(|v| v.name).collect();
        panic!("unknown variant {name:?}; expected one of {names:?}")
    })
}

#[derive(Clone)]
enum Stub {
    Bare(InventoryClient<Channel>),
    Retry(InventoryClient<Retry<Channel>>),
    Tower(InventoryClient<TowerRetry>),
    Replicas(InventoryClient<ReplicaChannel>),
    RetryReplicas(InventoryClient<Retry<ReplicaChannel>>),
}

#[derive(Clone)]
struct Client {
    stub: Stub,
    deadline: Option<Duration>,
}

/// What the callers of a run call through: the generated client (`Client`), or a peer's
/// retry above it (`peers`).
trait Caller: Clone + Send + 'static {
    /// One call, its answer checked.
    fn call(&mut self) -> impl Future<Output = ()> + Send;
}

impl Caller for Client {
    fn call(&mut self) -> impl Future<Output = ()> + Send {
        Client::call(self)
    }
}

/// A variant's callers behind one type, for the runs that hold several variants: the runs
/// are boxed, once each, and the calls in them are not.
struct Runner {
    timed: Box<dyn Fn(usize, f64) -> LocalFuture<Sample>>,
    counted: Box<dyn Fn(usize, u64) -> LocalFuture<()>>,
}

/// A run, awaited on the thread that started it.
type LocalFuture<T> = Pin<Box<dyn Future<Output = T>>>;

impl Runner {
    fn new<C: Caller>(caller: C) -> Runner {
        let again = caller.clone();
        Runner {
            timed: Box::new(move |callers, secs| {
                let caller = caller.clone();
                Box::pin(async move { run_for(&caller, callers, secs).await })
            }),
            counted: Box::new(move |callers, total| {
                let caller = again.clone();
                Box::pin(async move { run_calls(&caller, callers, total).await })
            }),
        }
    }
}

/// The callers of `v`.
async fn runner(v: &Variant, timeouts: Timeouts, servers: Servers) -> Runner {
    match v.stack {
        Stack::PeerTower => Runner::new(peers::tower(channel(server_of(v, servers)).await)),
        Stack::PeerResilience => {
            Runner::new(peers::resilience(channel(server_of(v, servers)).await))
        }
        _ => Runner::new(client(v, timeouts, servers).await),
    }
}

impl Client {
    async fn call(&mut self) {
        let mut request = Request::new(ReserveRequest {
            sku: String::new(),
            quantity: 0,
            request_id: String::new(),
            payload: vec![7; 16],
        });
        if let Some(deadline) = self.deadline {
            request.set_timeout(deadline);
        }
        let reply = match &mut self.stub {
            Stub::Bare(c) => c.reserve(request).await,
            Stub::Retry(c) => c.reserve(request).await,
            Stub::Tower(c) => c.reserve(request).await,
            Stub::Replicas(c) => c.reserve(request).await,
            Stub::RetryReplicas(c) => c.reserve(request).await,
        };
        assert!(reply.expect("echo").get_ref().reserved);
    }
}

async fn client(v: &Variant, timeouts: Timeouts, servers: Servers) -> Client {
    let stub = match v.stack {
        Stack::BalanceList { retry } => {
            let channel = Channel::balance_list(servers.fleet.iter().copied().map(endpoint));
            if retry {
                Stub::Retry(InventoryClient::new(
                    tower::ServiceBuilder::new()
                        .layer(retry_layer(None))
                        .service(channel),
                ))
            } else {
                Stub::Bare(InventoryClient::new(channel))
            }
        }
        Stack::Replicas { retry, dns } => {
            let channel = if dns {
                replicas_from_dns(&servers)
            } else {
                replicas(&servers.fleet)
            };
            if retry {
                Stub::RetryReplicas(InventoryClient::new(
                    tower::ServiceBuilder::new()
                        .layer(retry_layer(None).over_replicas())
                        .service(channel),
                ))
            } else {
                Stub::Replicas(InventoryClient::new(channel))
            }
        }
        _ => one_server_stub(v, timeouts, servers).await,
    };
    Client {
        stub,
        deadline: v.deadline.then_some(timeouts.deadline),
    }
}

/// The server a variant that calls one server calls.
fn server_of(v: &Variant, servers: Servers) -> SocketAddr {
    match (v.peer_server, v.shed_server, v.prometheus, v.fixed_limit) {
        (Some(PeerServer::Tonic), ..) => servers.tonic_limit,
        (Some(PeerServer::Vegas), ..) => servers.vegas,
        (None, true, true, _) => servers.shed_prometheus,
        (None, true, false, true) => servers.shed_fixed,
        (None, true, false, false) => servers.shed,
        (None, false, _, _) => servers.bare,
    }
}

/// The stub of a variant that calls one server over one connected channel.
async fn one_server_stub(v: &Variant, timeouts: Timeouts, servers: Servers) -> Stub {
    let channel = channel(server_of(v, servers)).await;
    match v.stack {
        Stack::Plain => Stub::Bare(InventoryClient::new(channel)),
        Stack::Layer { per_attempt } => {
            let layer = retry_layer(per_attempt.then_some(timeouts.per_attempt));
            let layer = if v.prometheus {
                exporter::retry(layer)
            } else {
                layer
            };
            Stub::Retry(InventoryClient::new(
                tower::ServiceBuilder::new().layer(layer).service(channel),
            ))
        }
        Stack::Tower => Stub::Tower(InventoryClient::new(tower_retry(channel))),
        Stack::Hedge => Stub::Retry(InventoryClient::new(
            tower::ServiceBuilder::new()
                .layer(hedge_layer(timeouts.deadline))
                .service(channel),
        )),
        Stack::BalanceList { .. } | Stack::Replicas { .. } => {
            unreachable!("balanced variants call the fleet")
        }
        Stack::PeerTower | Stack::PeerResilience => unreachable!("peers call without a stub"),
    }
}

/// CPU time used so far by every thread of this process.
fn cpu_time() -> Duration {
    let mut total = 0u64;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat"))
                && let Some(ns) = s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
            {
                total += ns;
            }
        }
    }
    Duration::from_nanos(total)
}

struct Sample {
    calls: u64,
    secs: f64,
    allocations: u64,
    cpu: Duration,
}

impl Sample {
    fn rate(&self) -> f64 {
        self.calls as f64 / self.secs
    }
}

/// `callers` callers calling as fast as they can for `secs`.
async fn run_for<C: Caller>(client: &C, callers: usize, secs: f64) -> Sample {
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let allocs0 = GLOBAL.stats().allocations;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let mut client = client.clone();
            let (stop, calls) = (Arc::clone(&stop), Arc::clone(&calls));
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    client.call().await;
                    n += 1;
                }
                calls.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("caller");
    }
    Sample {
        calls: calls.load(Ordering::Relaxed),
        secs: t0.elapsed().as_secs_f64(),
        allocations: (GLOBAL.stats().allocations - allocs0) as u64,
        cpu: cpu_time() - cpu0,
    }
}

/// Exactly `total` calls shared by `callers` callers (for instruction counts).
async fn run_calls<C: Caller>(client: &C, callers: usize, total: u64) {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let mut client = client.clone();
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    client.call().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("caller");
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct Options {
    rounds: usize,
    secs: f64,
    callers: usize,
    variant: Option<&'static Variant>,
    calls: Option<u64>,
    variants: Option<Vec<&'static Variant>>,
    list: bool,
}

fn options() -> Options {
    let mut o = Options {
        rounds: 5,
        secs: 2.0,
        callers: 64,
        variant: None,
        calls: None,
        variants: None,
        list: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--rounds" => o.rounds = value().parse().expect("--rounds N"),
            "--secs" => o.secs = value().parse().expect("--secs S"),
            "--callers" => o.callers = value().parse().expect("--callers C"),
            "--variant" => o.variant = Some(variant(&value())),
            "--calls" => o.calls = Some(value().parse().expect("--calls N")),
            "--variants" => o.variants = Some(value().split(',').map(variant).collect()),
            "--list" => o.list = true,
            // Passed by `cargo bench`.
            "--bench" => {}
            other => panic!("unknown option {other:?}"),
        }
    }
    o
}

/// The variants to run in rounds: those asked for (all by default) and their baselines and
/// rivals, in table order.
fn selected(asked: Option<&[&'static Variant]>) -> Vec<&'static Variant> {
    let Some(asked) = asked else {
        return available().collect();
    };
    available()
        .filter(|v| {
            asked.iter().any(|a| {
                a.name == v.name || a.baseline == v.name || a.rival.is_some_and(|r| r == v.name)
            })
        })
        .collect()
}

/// Runs exactly `calls` calls of `v` and prints what they allocated.
async fn count_calls(v: &Variant, calls: u64, callers: usize, servers: Servers) {
    let runner = runner(v, COUNTED, servers).await;
    let before = GLOBAL.stats();
    (runner.counted)(callers, calls).await;
    let after = GLOBAL.stats();
    println!(
        "variant={} calls={calls} allocations={} bytes={}",
        v.name,
        after.allocations - before.allocations,
        after.bytes_allocated - before.bytes_allocated
    );
}

/// Per variant, one figure a round: its throughput over its baseline's (and over its
/// rival's), its allocations and CPU time per call.
struct Rounds {
    ratios: Vec<Vec<f64>>,
    rival_ratios: Vec<Vec<f64>>,
    allocs: Vec<Vec<f64>>,
    cpus: Vec<Vec<f64>>,
}

impl Rounds {
    fn new(n: usize) -> Rounds {
        Rounds {
            ratios: vec![Vec::new(); n],
            rival_ratios: vec![Vec::new(); n],
            allocs: vec![Vec::new(); n],
            cpus: vec![Vec::new(); n],
        }
    }
}

fn main() {
    let o = options();
    if o.list {
        // For `benches/callgrind.sh`: which ratios to take, from this one table.
        for v in available() {
            println!("{} {} {}", v.name, v.baseline, v.rival.unwrap_or("-"));
        }
        return;
    }
    // A fixed number of calls is for instruction counts: one thread, so that the count
    // does not depend on how the scheduler happened to spread the work.
    let runtime = if o.calls.is_some() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()
    .expect("runtime");
    runtime.block_on(async {
        let servers = servers().await;
        if let (Some(v), Some(calls)) = (o.variant, o.calls) {
            count_calls(v, calls, o.callers, servers).await;
            return;
        }
        let variants = selected(o.variants.as_deref());
        let rounds = time_rounds(&o, &variants, servers).await;
        print_medians(&variants, &rounds);
    });
}

/// Runs `o.rounds` timed rounds of every variant, printing a line per variant and round.
async fn time_rounds(o: &Options, variants: &[&'static Variant], servers: Servers) -> Rounds {
    let mut clients = Vec::new();
    for v in variants {
        let c = runner(v, TIMED, servers).await;
        // Warm up: connections, h2 windows, allocator caches.
        (c.timed)(o.callers, 0.3).await;
        clients.push(c);
    }
    println!(
        "{} callers, one channel per variant, {} rounds of {} s per variant",
        o.callers, o.rounds, o.secs
    );
    println!(
        "{:>5} {:>14} {:>10} {:>14} {:>7} {:>12} {:>11}",
        "round", "variant", "calls/s", "baseline", "ratio", "allocs/call", "cpu µs/call"
    );
    let n = variants.len();
    let mut rounds = Rounds::new(n);
    for round in 1..=o.rounds {
        // Each round starts with a different variant, so that no variant always runs
        // first (or right after the same other one).
        let mut samples: Vec<Option<Sample>> = (0..n).map(|_| None).collect();
        for k in 0..n {
            let i = (round - 1 + k) % n;
            samples[i] = Some((clients[i].timed)(o.callers, o.secs).await);
        }
        record_round(round, variants, &samples, &mut rounds);
    }
    rounds
}

/// Records and prints round `round`'s `samples` (one per variant).
fn record_round(
    round: usize,
    variants: &[&'static Variant],
    samples: &[Option<Sample>],
    rounds: &mut Rounds,
) {
    let index = |name: &str| variants.iter().position(|v| v.name == name);
    let rate_of = |name: &str| {
        index(name)
            .and_then(|j| samples[j].as_ref())
            .map_or(f64::NAN, Sample::rate)
    };
    for (i, s) in samples.iter().enumerate() {
        let Some(s) = s else { continue };
        let v = variants[i];
        let per_call_allocs = s.allocations as f64 / s.calls as f64;
        let cpu = s.cpu.as_secs_f64() * 1e6 / s.calls as f64;
        let ratio = s.rate() / rate_of(v.baseline);
        rounds.ratios[i].push(ratio);
        if let Some(rival) = v.rival {
            rounds.rival_ratios[i].push(s.rate() / rate_of(rival));
        }
        rounds.allocs[i].push(per_call_allocs);
        rounds.cpus[i].push(cpu);
        println!(
            "{round:>5} {:>14} {:>10.0} {:>14} {ratio:>7.3} {per_call_allocs:>12.2} {cpu:>11.2}",
            v.name,
            s.rate(),
            v.baseline,
        );
    }
}

/// Prints each variant's medians over the rounds.
fn print_medians(variants: &[&'static Variant], rounds: &Rounds) {
    let index = |name: &str| variants.iter().position(|v| v.name == name);
    let Rounds {
        ratios,
        rival_ratios,
        allocs,
        cpus,
    } = rounds;
    println!("medians over rounds (ratio to the same round's baseline):");
    for (i, v) in variants.iter().enumerate() {
        let b = index(v.baseline).unwrap_or(i);
        let (r, a, c) = (
            median(ratios[i].clone()),
            median(allocs[i].clone()),
            median(cpus[i].clone()),
        );
        let rival = match v.rival {
            Some(name) if !rival_ratios[i].is_empty() => format!(
                ", throughput {:.3}x {name}",
                median(rival_ratios[i].clone())
            ),
            _ => String::new(),
        };
        println!(
            "{:>14}: throughput {r:.3}x {} (min {:.3}, max {:.3}){rival}, allocs/call {a:.2} ({:+.2}), cpu/call {c:.2} µs ({:+.2})",
            v.name,
            v.baseline,
            ratios[i].iter().copied().fold(f64::INFINITY, f64::min),
            ratios[i].iter().copied().fold(f64::NEG_INFINITY, f64::max),
            a - median(allocs[b].clone()),
            c - median(cpus[b].clone()),
        );
    }
}
