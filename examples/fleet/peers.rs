//! The peers' clients over the replicas, each configured as its own documentation
//! recommends (`docs/comparison.md` cites the page or example behind every setting):
//!
//! - `tower-p2c`: tower's `balance::p2c::Balance` over one channel per replica, each
//!   measured by `PeakEwma` (tower's balance example: a 30 ms default round trip, a 10 s
//!   decay), shared behind a `Buffer`; above it `tower::retry::Retry` with the budget policy
//!   of tower's docs over `TpsBudget::default()`, the naive loop's 3 attempts 10 ms apart
//!   and 50 ms per attempt.
//! - `resilience`: the same p2c balancer over one service per replica, each behind
//!   tower-resilience's `OutlierDetectionLayer` sharing one `OutlierDetector` (its defaults:
//!   at most 50 % ejected, 30 s for a first ejection; each replica ejected after 5
//!   consecutive errors, as its docs register them) and, innermost, a `TimeLimiter` per
//!   attempt (so that a timed-out attempt counts as its replica's error); above the
//!   balancer its `RetryLayer::exponential_backoff()` with its token-bucket budget, and a
//!   `TimeLimiter` for the whole call outermost.
//!
//! Neither retry can replay a tonic request (its body is a stream, not `Clone`): as the
//! peers' own tonic examples do, each sits above a small adapter that turns a cloneable
//! call into a fresh `tonic::Request` per attempt. The adapters number the attempts in
//! `grpc-previous-rpc-attempts`, as the naive loop does, so that the replicas report every
//! policy's retries alike.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use stormguard::engine::wire::GRPC_PREVIOUS_RPC_ATTEMPTS;
use stormguard_demo::storm::{Attempt, TowerBudgetRetry};
use stormguard_demo::{InventoryClient, ReserveRequest};
use tokio::time::Instant;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Status};
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::load::{CompleteOnResponse, PeakEwmaDiscover};
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};
use tower_resilience::outlier::{OutlierDetectionLayer, OutlierDetector};
use tower_resilience::retry::{RetryBudgetBuilder, RetryLayer};
use tower_resilience::timelimiter::{TimeLimiterError, TimeLimiterLayer};

use crate::replica::CALL_ID;
use crate::run::{Caller, ClientCounts, Observe};

/// PeakEWMA's round trip for a replica it has not measured yet, and how fast a measurement
/// decays: the values of tower's own balancer example (`examples/tower-balance.rs`).
const DEFAULT_RTT: Duration = Duration::from_millis(30);
const DECAY: Duration = Duration::from_secs(10);
/// Requests the `Buffer` in front of the balancer holds: tonic's own channel buffer.
const BUFFER: usize = 1024;
/// Consecutive errors that eject a replica (tower-resilience's docs register instances
/// with 5).
const EJECT_AFTER: usize = 5;

/// A call as the `tower-p2c` retry sees it: its id and its attempt.
#[derive(Clone, Copy, Debug)]
struct Numbered {
    call: u64,
    attempt: Attempt,
}

impl std::borrow::Borrow<Attempt> for Numbered {
    fn borrow(&self) -> &Attempt {
        &self.attempt
    }
}

impl std::borrow::BorrowMut<Attempt> for Numbered {
    fn borrow_mut(&mut self) -> &mut Attempt {
        &mut self.attempt
    }
}

/// A request of one call, with its id and the call's deadline and attempt number.
fn request(call: u64, previous: u32, timeout: Option<Duration>) -> Request<ReserveRequest> {
    let mut request = Request::new(ReserveRequest::default());
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    if call != 0 {
        request.metadata_mut().insert(CALL_ID, call.into());
    }
    if previous > 0 {
        request
            .metadata_mut()
            .insert(GRPC_PREVIOUS_RPC_ATTEMPTS, previous.into());
    }
    request
}

/// The `tower-p2c` client over `endpoints`, and its budget's refusals.
pub(crate) fn tower_p2c(
    endpoints: Vec<Endpoint>,
    counts: &Arc<ClientCounts>,
    deadline: Duration,
    (attempts, backoff, per_attempt): (u32, Duration, Duration),
) -> (Caller, Arc<AtomicU64>) {
    let channels: Vec<Channel> = endpoints.iter().map(Endpoint::connect_lazy).collect();
    let discover = PeakEwmaDiscover::new(
        ServiceList::new(channels),
        DEFAULT_RTT,
        DECAY,
        CompleteOnResponse::default(),
    );
    let balanced: Balanced =
        BoxCloneSyncService::new(Buffer::new(Balance::new(discover), BUFFER).map_err(BalanceError));
    let client = InventoryClient::new(Observe::new(balanced, counts.clone()));
    let attempt = tower::service_fn(move |n: Numbered| {
        let future: BoxFuture<Result<(), Status>> =
            Box::pin(send_attempt(client.clone(), n, per_attempt));
        future
    });
    let policy = TowerBudgetRetry::new(attempts, backoff);
    let refused = policy.refused();
    let retry = tower::retry::Retry::new(policy, attempt);
    let caller = BoxCloneSyncService::new(tower::service_fn(move |call: u64| {
        retry.clone().oneshot(Numbered {
            call,
            attempt: Attempt {
                deadline: Instant::now() + deadline,
                previous: 0,
            },
        })
    }));
    (caller, refused)
}

type BoxFuture<T> = std::pin::Pin<Box<dyn Future<Output = T> + Send>>;

/// One `tower-p2c` attempt: at most `per_attempt` and what is left of the call's deadline
/// (sent as `grpc-timeout` and enforced by a timer), as the naive loop's.
async fn send_attempt(
    mut client: InventoryClient<Observe<Balanced>>,
    n: Numbered,
    per_attempt: Duration,
) -> Result<(), Status> {
    let left = n.attempt.deadline.saturating_duration_since(Instant::now());
    let timeout = per_attempt.min(left);
    if timeout.is_zero() {
        return Err(Status::deadline_exceeded("tower-p2c: deadline passed"));
    }
    let request = request(n.call, n.attempt.previous, Some(timeout));
    match tokio::time::timeout(timeout, client.reserve(request)).await {
        Ok(answer) => answer.map(drop),
        Err(_) => Err(Status::deadline_exceeded("tower-p2c: attempt timed out")),
    }
}

/// The balanced channels of `tower-p2c`, boxed.
type Balanced = BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    BalanceError,
>;

/// An error of the balanced channels (of the balancer, its buffer or a replica's channel),
/// as a type of its own: `Observe` reads its source chain.
#[derive(Debug)]
pub(crate) struct BalanceError(BoxError);

impl std::fmt::Display for BalanceError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for BalanceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

impl crate::run::ErrorChain for BalanceError {
    fn chain(&self) -> &(dyn std::error::Error + 'static) {
        self
    }
}

/// A call as the `resilience` retry sees it: its id, and the attempts sent so far (shared
/// by the copies the retry makes of it).
#[derive(Clone, Debug)]
struct Counted {
    call: u64,
    sent: Arc<AtomicU32>,
}

/// The `resilience` client over `endpoints`, and its budget's refusals.
pub(crate) fn resilience(
    endpoints: Vec<Endpoint>,
    counts: &Arc<ClientCounts>,
    deadline: Duration,
    per_attempt: Duration,
) -> Result<(Caller, Arc<AtomicU64>), String> {
    let detector = OutlierDetector::new().name("fleet");
    let mut replicas = Vec::with_capacity(endpoints.len());
    for (i, endpoint) in endpoints.iter().enumerate() {
        let name = format!("replica-{i}");
        detector.register(name.clone(), EJECT_AFTER);
        let client = InventoryClient::new(Observe::new(endpoint.connect_lazy(), counts.clone()));
        let send = tower::service_fn(move |c: Counted| {
            let mut client = client.clone();
            async move {
                let previous = c.sent.fetch_add(1, Ordering::Relaxed);
                client
                    .reserve(request(c.call, previous, None))
                    .await
                    .map(drop)
            }
        });
        let outlier = OutlierDetectionLayer::builder()
            .detector(detector.clone())
            .instance_name(name)
            .build()
            .map_err(|e| e.to_string())?;
        let replica = ServiceBuilder::new()
            .layer(outlier)
            .layer(
                TimeLimiterLayer::builder()
                    .timeout_duration(per_attempt)
                    .build(),
            )
            .service(send);
        replicas.push(replica);
    }
    let discover = PeakEwmaDiscover::new(
        ServiceList::new(replicas),
        DEFAULT_RTT,
        DECAY,
        CompleteOnResponse::default(),
    );
    let balanced = Buffer::new(Balance::new(discover), BUFFER);
    let budget = RetryBudgetBuilder::new()
        .token_bucket()
        .build()
        .map_err(|e| e.to_string())?;
    let refused = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&refused);
    let retry = RetryLayer::<Counted, (), BoxError>::exponential_backoff()
        .budget(budget)
        .on_budget_exhausted(move |_| {
            counted.fetch_add(1, Ordering::Relaxed);
        })
        .build();
    let stack = ServiceBuilder::new()
        .layer(
            TimeLimiterLayer::builder()
                .timeout_duration(deadline)
                .build(),
        )
        .layer(retry)
        .service(balanced)
        .map_err(|e: TimeLimiterError<BoxError>| match e {
            TimeLimiterError::Timeout => Status::deadline_exceeded("resilience: call timed out"),
            TimeLimiterError::Inner(e) => Status::unavailable(e.to_string()),
        });
    let caller = BoxCloneSyncService::new(tower::service_fn(move |call: u64| {
        stack.clone().oneshot(Counted {
            call,
            sent: Arc::default(),
        })
    }));
    Ok((caller, refused))
}
