//! The client side of the scenarios: how each policy makes one logical `Reserve` call.
//!
//! Every policy ends in the same place: a tonic `Channel` with the storm's h2 settings,
//! under an [`Observe`] layer that counts physical attempts and shed answers. Above it
//! sits either the [`NaiveRetry`] policy (a `tower::retry` policy, the retry loop users
//! write by hand) or stormguard's `RetryLayer`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use stormguard_client::{Retry as RetryService, RetryLayer, RetryStats};
use stormguard_core::AdaptiveThrottleConfig;
use stormguard_core::MethodScope;
use stormguard_core::RetryPolicy;
use stormguard_core::{Backoff, BackoffConfig};
use stormguard_core::{ClientConfig, ConfigError};
use stormguard_core::{Code as CoreCode, CodeSet};
use stormguard_core::{HedgeDelay, HedgingPolicy};
use stormguard_core::{wire::GRPC_PREVIOUS_RPC_ATTEMPTS, wire::GRPC_RETRY_PUSHBACK_MS};
use tokio::time::{Instant, Sleep};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};
use tower::util::BoxCloneSyncService;
use tower::{Service, ServiceBuilder, ServiceExt};

use super::report::Timeline;
use crate::{InventoryClient, ReserveReply, ReserveRequest};

/// The demo service's name, as the gRPC service config spells it.
pub const INVENTORY_SERVICE: &str = "stormguard.demo.v1.Inventory";
/// The method every scenario calls.
pub const RESERVE_METHOD: &str = "Reserve";

/// One logical `Reserve` call (request `()`): a cloneable service, whatever the policy.
pub type Caller = BoxCloneSyncService<(), ReserveReply, Status>;

/// Connects a channel to `addr` with the storm's client h2 settings (the examples'
/// clients): callers that give up reset their streams faster than h2's default local
/// limit allows, and the connection would be closed with `GOAWAY (ENHANCE_YOUR_CALM)` (see
/// `docs/operating.md`, "HTTP/2 resets").
pub async fn connect(addr: SocketAddr) -> Result<Channel, tonic::transport::Error> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .http2_max_local_error_reset_streams(None)
        .tcp_nodelay(true)
        .connect()
        .await?;
    Ok(channel)
}

/// Counts every physical attempt sent through it, the answers the server shed (see
/// [`shed`]), and failures of the connection itself (an
/// attempt whose `grpc-timeout` ran out in the channel is not one).
#[derive(Clone, Debug)]
pub(crate) struct Observe<S> {
    inner: S,
    timeline: Arc<Timeline>,
}

impl<S> Observe<S> {
    pub(crate) fn new(inner: S, timeline: Arc<Timeline>) -> Self {
        Observe { inner, timeline }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S, B, Rq> Service<http::Request<Rq>> for Observe<S>
where
    S: Service<http::Request<Rq>, Response = http::Response<B>>,
    S::Future: Send + 'static,
    S::Error: std::error::Error + 'static,
    B: 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Rq>) -> Self::Future {
        self.timeline.attempt(Instant::now());
        let timeline = Arc::clone(&self.timeline);
        let future = self.inner.call(request);
        Box::pin(async move {
            let result = future.await;
            match &result {
                Ok(response) if shed(response.headers()) => timeline.shed(Instant::now()),
                Ok(_) => {}
                Err(e) if !timed_out(e) => timeline.connection_error(),
                Err(_) => {}
            }
            result
        })
    }
}

/// Whether an answer was shed: it carries `grpc-retry-pushback-ms` (stormguard's
/// `ShedLayer`), or it is tonic's own load-shed answer, a trailers-only
/// `RESOURCE_EXHAUSTED` (the peers' servers; nothing else in the scenarios answers it).
fn shed(headers: &http::HeaderMap) -> bool {
    headers.contains_key(GRPC_RETRY_PUSHBACK_MS)
        || headers
            .get("grpc-status")
            .is_some_and(|code| code.as_bytes() == b"8")
}

/// Whether `error` is the channel's own `grpc-timeout` running out (not a connection
/// failure).
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

/// The delays of a [`NaiveRetry`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Delays {
    /// The same delay before every retry.
    Fixed(Duration),
    /// Exponential full jitter, drawn by stormguard's backoff.
    Jittered(BackoffConfig),
}

/// The retry loop users write by hand, as a `tower::retry` policy: up to `max_attempts`
/// attempts of a call that failed `UNAVAILABLE` or ran out of its per-attempt time
/// (`DEADLINE_EXCEEDED`, or `CANCELLED`, which tonic answers when the server's
/// `grpc-timeout` fires), a delay between them, no budget, and server pushback ignored.
/// Retries carry `grpc-previous-rpc-attempts`, as every standard gRPC client's do.
#[derive(Clone, Debug)]
pub struct NaiveRetry {
    max_attempts: u32,
    delays: Delays,
    seeds: Arc<AtomicU64>,
    backoff: Option<Backoff>,
}

impl NaiveRetry {
    /// A policy of `max_attempts` attempts with `delays`; jitter seeded from `seed`.
    pub fn new(max_attempts: u32, delays: Delays, seed: u64) -> Self {
        NaiveRetry {
            max_attempts,
            delays,
            seeds: Arc::new(AtomicU64::new(seed)),
            backoff: None,
        }
    }
}

/// One attempt of a [`NaiveRetry`] call: the logical deadline and the attempts before it.
#[derive(Clone, Copy, Debug)]
pub struct Attempt {
    /// When the logical call gives up.
    pub deadline: Instant,
    /// Attempts sent before this one.
    pub previous: u32,
}

impl tower::retry::Policy<Attempt, ReserveReply, Status> for NaiveRetry {
    type Future = Sleep;

    fn retry(
        &mut self,
        request: &mut Attempt,
        result: &mut Result<ReserveReply, Status>,
    ) -> Option<Sleep> {
        let Err(status) = result else { return None };
        let retryable = matches!(
            status.code(),
            Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
        );
        if !retryable || request.previous + 1 >= self.max_attempts {
            return None;
        }
        let delay = match self.delays {
            Delays::Fixed(delay) => delay,
            Delays::Jittered(_) => self
                .backoff
                .as_mut()
                .map_or(Duration::ZERO, Backoff::next_delay),
        };
        let at = Instant::now() + delay;
        if at >= request.deadline {
            return None;
        }
        request.previous += 1;
        Some(tokio::time::sleep_until(at))
    }

    fn clone_request(&mut self, request: &Attempt) -> Option<Attempt> {
        // tower calls this on the shared policy before copying it for a new call: a first
        // attempt gets a fresh jitter sequence of its own.
        if request.previous == 0
            && let Delays::Jittered(config) = self.delays
        {
            let seed = self
                .seeds
                .fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
            self.backoff = Some(Backoff::new(config, seed));
        }
        Some(*request)
    }
}

/// How a naive caller behaves.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Naive {
    pub(crate) max_attempts: u32,
    pub(crate) delays: Delays,
    pub(crate) deadline: Duration,
    pub(crate) per_attempt: Option<Duration>,
    pub(crate) seed: u64,
}

/// What the scenarios' generated client runs over: a tonic `Channel`, or anything
/// `tower` stacks on one (the storm's [`Observe`], the `RetryLayer`, `Replicas` over
/// several channels), cloneable and sendable as a [`Caller`] needs.
pub(crate) trait Transport:
    tonic::client::GrpcService<
        tonic::body::Body,
        Future: Send,
        Error: Into<tonic::codegen::StdError>,
        ResponseBody: tonic::codegen::Body<
            Data = tonic::codegen::Bytes,
            Error: Into<tonic::codegen::StdError> + Send,
        > + Send
                          + 'static,
    > + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> Transport for T where
    T: tonic::client::GrpcService<
            tonic::body::Body,
            Future: Send,
            Error: Into<tonic::codegen::StdError>,
            ResponseBody: tonic::codegen::Body<
                Data = tonic::codegen::Bytes,
                Error: Into<tonic::codegen::StdError> + Send,
            > + Send
                              + 'static,
        > + Clone
        + Send
        + Sync
        + 'static
{
}

/// A caller that retries with [`NaiveRetry`] through a plain tonic client.
pub(crate) fn naive_caller<T: Transport>(client: InventoryClient<T>, naive: Naive) -> Caller {
    let policy = NaiveRetry::new(naive.max_attempts, naive.delays, naive.seed);
    retry_caller(
        attempt_service(client, naive.per_attempt),
        policy,
        naive.deadline,
    )
}

/// One attempt of a call through `client`, as the naive loop sends it: at most
/// `per_attempt` and what is left of the call's deadline (sent as `grpc-timeout` and
/// enforced by a timer), numbered in `grpc-previous-rpc-attempts`.
pub(crate) fn attempt_service<T: Transport>(
    client: InventoryClient<T>,
    per_attempt: Option<Duration>,
) -> BoxCloneSyncService<Attempt, ReserveReply, Status> {
    BoxCloneSyncService::new(tower::service_fn(move |attempt: Attempt| {
        let mut client = client.clone();
        async move {
            let left = attempt.deadline.saturating_duration_since(Instant::now());
            let timeout = per_attempt.map_or(left, |p| p.min(left));
            if timeout.is_zero() {
                return Err(Status::deadline_exceeded("naive: deadline passed"));
            }
            let mut request = Request::new(ReserveRequest::default());
            request.set_timeout(timeout);
            if attempt.previous > 0 {
                request
                    .metadata_mut()
                    .insert(GRPC_PREVIOUS_RPC_ATTEMPTS, attempt.previous.into());
            }
            match tokio::time::timeout(timeout, client.reserve(request)).await {
                Ok(answer) => answer.map(tonic::Response::into_inner),
                Err(_) => Err(Status::deadline_exceeded("naive: attempt timed out")),
            }
        }
    }))
}

/// A caller that sends each logical call's attempts through `attempt` under
/// `tower::retry::Retry` with `policy`, the call given `deadline`.
pub(crate) fn retry_caller<P>(
    attempt: BoxCloneSyncService<Attempt, ReserveReply, Status>,
    policy: P,
    deadline: Duration,
) -> Caller
where
    P: tower::retry::Policy<Attempt, ReserveReply, Status> + Clone + Send + Sync + 'static,
    P::Future: Send,
{
    let retry = tower::retry::Retry::new(policy, attempt);
    BoxCloneSyncService::new(tower::service_fn(move |()| {
        let retry = retry.clone();
        retry.oneshot(Attempt {
            deadline: Instant::now() + deadline,
            previous: 0,
        })
    }))
}

/// `Reserve`'s retry policy in `config`: `policy`.
fn set_reserve_retry(config: &mut ClientConfig, policy: RetryPolicy) {
    let reserve = MethodScope::Method(INVENTORY_SERVICE, RESERVE_METHOD);
    config.methods.set_retry(reserve, Some(policy));
}

/// stormguard's client defaults, with `Reserve` configured explicitly as idempotent (so
/// the scenario does not depend on the default idempotency of methods).
pub fn stormguard_client_config(per_attempt: Option<Duration>) -> ClientConfig {
    let mut config = ClientConfig::default();
    let policy = RetryPolicy {
        idempotent: true,
        per_attempt_timeout: per_attempt,
        ..RetryPolicy::default()
    };
    set_reserve_retry(&mut config, policy);
    config
}

/// The `unguarded` policy's client: the naive loop's behaviour on a `RetryLayer`, so that
/// its metrics can be seen. `max_attempts` attempts of `Reserve` (idempotent) with
/// `per_attempt` each, a fixed `backoff` (the A6 backoff at a multiplier of 1: ±20 %),
/// `UNAVAILABLE`, `DEADLINE_EXCEEDED` and `CANCELLED` retried, and a budget no storm uses
/// up (a floor of a million retries a second, lent always): nothing that keeps a loop from
/// forming.
pub fn unguarded_client_config(
    per_attempt: Option<Duration>,
    backoff: Duration,
    max_attempts: u32,
) -> ClientConfig {
    let mut config = ClientConfig::default();
    config.budget = stormguard_core::BudgetChoice::Stormguard(stormguard_core::BudgetConfig {
        min_retries_per_second: 1_000_000,
        // Lent whether or not the dependency answers, as a loop without a budget would.
        floor: stormguard_core::Floor::Always,
        ..stormguard_core::BudgetConfig::default()
    });
    let policy = RetryPolicy {
        max_attempts,
        retryable_codes: [
            CoreCode::Unavailable,
            CoreCode::DeadlineExceeded,
            CoreCode::Cancelled,
        ]
        .into_iter()
        .collect(),
        backoff: BackoffConfig::A6 {
            initial: backoff,
            max: backoff,
            multiplier: 1.0,
        },
        idempotent: true,
        per_attempt_timeout: per_attempt,
        ..RetryPolicy::default()
    };
    set_reserve_retry(&mut config, policy);
    config
}

/// The `throttle` policy's client: [`stormguard_client_config`] with the client-side
/// adaptive throttle at its defaults (`K = 2`, at most 90 % of calls refused locally, a
/// 10 s window; see [`stormguard_core::AdaptiveThrottle`]).
pub fn throttle_client_config(per_attempt: Option<Duration>) -> ClientConfig {
    let mut config = stormguard_client_config(per_attempt);
    config.adaptive_throttle = Some(AdaptiveThrottleConfig::default());
    config
}

/// The `hedging` policy's client: stormguard's defaults (the retry budget, no breaker), with
/// `Reserve` hedged instead of retried, as a team would configure it against a slow tail:
///
/// - 2 copies at most: a hedge may double a call's cost, never more, and the budget
///   bounds how often it does;
/// - the second after `delay`
///   ([`LoopbackStorm::hedge_delay`](super::LoopbackStorm::hedge_delay), which says why 20 ms);
/// - `UNAVAILABLE` non-fatal, the code stormguard retries by default: a copy that
///   failed it lets the other go on. (A copy the `ShedLayer` shed is non-fatal whatever
///   the codes, since it never ran; its pushback puts off, or with `-1` stops, the
///   hedge.) `RESOURCE_EXHAUSTED` stays fatal: it means a quota, which a second copy
///   would only spend faster.
///
/// No per-attempt timeout: a hedged call's copies each have what is left of its deadline
/// (the slow copy is answered by the next one, not by a timer).
pub fn hedging_client_config(delay: Duration) -> ClientConfig {
    let mut config = ClientConfig::default();
    let policy = HedgingPolicy {
        max_attempts: 2,
        delay: HedgeDelay::Fixed(delay),
        non_fatal_codes: CodeSet::single(CoreCode::Unavailable),
        ..HedgingPolicy::default()
    };
    config.methods.set_hedging(
        MethodScope::Method(INVENTORY_SERVICE, RESERVE_METHOD),
        Some(policy),
    );
    config
}

/// A standard gRPC service config with A6 retry throttling (10, 0.1) and the A6 backoff,
/// `Reserve` configured explicitly as idempotent.
pub fn grpc_throttle_client_config(
    per_attempt: Option<Duration>,
) -> Result<ClientConfig, ConfigError> {
    let per_attempt = per_attempt.map_or_else(String::new, |t| {
        format!(r#", "perAttemptRecvTimeout": "{}s""#, t.as_secs_f64())
    });
    let json = format!(
        r#"{{ "methodConfig": [{{
              "name": [{{ "service": "{INVENTORY_SERVICE}", "method": "{RESERVE_METHOD}" }}],
              "retryPolicy": {{ "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.1s",
                                "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]{per_attempt} }} }}],
            "retryThrottling": {{ "maxTokens": 10, "tokenRatio": 0.1 }} }}"#
    );
    let mut config = ClientConfig::from_service_config_json(&json)?;
    let path = format!("/{INVENTORY_SERVICE}/{RESERVE_METHOD}");
    if let Some(policy) = config.methods.lookup(&path) {
        let policy = RetryPolicy {
            idempotent: true,
            ..RetryPolicy::clone(policy)
        };
        set_reserve_retry(&mut config, policy);
    }
    Ok(config)
}

/// The client stack of the stormguard policies, below the generated client.
pub(crate) type Layered = RetryService<Observe<Channel>>;

/// `channel` under a `RetryLayer` for `config` (whose policies carry the per-attempt
/// timeout); returns the client and its counters.
pub(crate) fn layered_client(
    channel: Observe<Channel>,
    config: &ClientConfig,
    seed: u64,
    load_reports: bool,
    instrument: impl FnOnce(RetryLayer) -> RetryLayer,
) -> Result<(InventoryClient<Layered>, RetryStats), ConfigError> {
    let mut layer = RetryLayer::from_config(&config.clone().with_seed(seed))?;
    if load_reports {
        layer = layer.with_load_reports(stormguard_core::SaturationConfig::default())?;
    }
    let layer = instrument(layer);
    let stats = layer.stats();
    let service = ServiceBuilder::new().layer(layer).service(channel);
    Ok((InventoryClient::new(service), stats))
}

/// A caller through a layered client: `timeout` is the logical call's deadline (sent as
/// `grpc-timeout`); without one the call inherits the inbound call's context.
pub(crate) fn layered_caller<T: Transport>(
    client: InventoryClient<T>,
    timeout: Option<Duration>,
) -> Caller {
    BoxCloneSyncService::new(tower::service_fn(move |()| {
        let mut client = client.clone();
        async move {
            let mut request = Request::new(ReserveRequest::default());
            if let Some(timeout) = timeout {
                request.set_timeout(timeout);
            }
            client
                .reserve(request)
                .await
                .map(tonic::Response::into_inner)
        }
    }))
}
