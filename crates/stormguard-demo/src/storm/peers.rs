//! The peers: what a tonic team installs instead of stormguard, each configured as its own
//! documentation recommends (`docs/comparison.md` cites the page or example behind every
//! setting).
//!
//! - **tower 0.5 and tonic 0.14** ([`Policy::Tower`](super::Policy::Tower),
//!   [`Policy::TowerSized`](super::Policy::TowerSized)): the client is `tower::retry::Retry`
//!   with [`TowerBudgetRetry`], the policy of tower's `retry::budget` docs (deposit on every
//!   success, withdraw before every retry) over `TpsBudget::default()`, with the naive
//!   loop's 3 attempts, fixed backoff and per-attempt timeout; the server is tonic's own
//!   `Server::builder().concurrency_limit_per_connection(n).load_shed(true)`.
//! - **tower-resilience 0.13** ([`Policy::Resilience`](super::Policy::Resilience),
//!   [`Policy::ResilienceSized`](super::Policy::ResilienceSized)): the client is its
//!   "standard stack", a `TimeLimiter` for the whole call outside its `RetryLayer`
//!   (the `exponential_backoff()` preset with its token-bucket budget) outside a
//!   `TimeLimiter` per attempt; the server is its `AdaptiveLimiterLayer` with Vegas, which
//!   makes callers wait and never refuses, so tonic's `load_shed(true)` sits beside it.
//!
//! Neither retry can sit on a tonic `Channel` as it is: both replay the request, and a
//! tonic request's body is a stream, not `Clone`. As the peers' own tonic examples do, the
//! retry sits above the generated client, over a small service that turns a cloneable
//! request into a fresh `tonic::Request` per attempt.

use std::borrow::BorrowMut;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::{Instant, Sleep};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Status};
use tower::retry::budget::{Budget, TpsBudget};
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};
use tower_resilience::adaptive::{AdaptiveLimiterLayer, Vegas};
use tower_resilience::retry::{RetryBudgetBuilder, RetryLayer};
use tower_resilience::timelimiter::{TimeLimiterError, TimeLimiterLayer};

use super::StormError;
use super::client::{Attempt, Caller, Transport};
use super::server::{MAX_PENDING_ACCEPT_RESET_STREAMS, Serving};
use crate::{Inventory, InventoryClient, InventoryServer, ReserveReply, ReserveRequest};

/// The per-connection limit of the `tower` row's server: the value of the example in the
/// docs of tonic's `Server::concurrency_limit_per_connection` (whose `load_shed` docs
/// recommend the pair). tonic's transport module docs show 256; 32 is the tighter of the
/// two, the number a newcomer copies.
pub const NEWCOMER_LIMIT: usize = 32;

/// How a peer's server admits calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PeerServer {
    /// tonic's `concurrency_limit_per_connection(limit)` with `load_shed(true)`.
    Tonic {
        /// Calls running or queued per connection.
        limit: usize,
    },
    /// tower-resilience's `AdaptiveLimiterLayer` with Vegas, tonic's `load_shed(true)`
    /// outside it: Vegas's defaults, or with `Some(n)` its limit started at and capped to
    /// the server's real concurrency `n`.
    Vegas {
        /// The capacity the limiter is told, if any.
        capacity: Option<usize>,
    },
}

/// The Vegas limiter of a [`PeerServer::Vegas`]: `Vegas::builder().build()` (an initial
/// limit of 10 between 1 and 100, alpha 3, beta 6: the values of tower-resilience's README),
/// or told `capacity` as its initial and highest limit.
fn vegas(capacity: Option<usize>) -> Result<Vegas, StormError> {
    let builder = Vegas::builder();
    let builder = match capacity {
        Some(n) => builder.initial_limit(n).max_limit(n),
        None => builder,
    };
    builder.build().map_err(|e| StormError::Peer(e.to_string()))
}

/// Serves `service` on a fresh loopback port behind `server`'s admission, with the storm's
/// h2 settings.
pub(crate) async fn serve_peer<T: Inventory>(
    service: T,
    server: PeerServer,
) -> Result<Serving, StormError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let builder = Server::builder()
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        .load_shed(true);
    let service = InventoryServer::new(service);
    Ok(match server {
        PeerServer::Tonic { limit } => {
            let mut builder = builder.concurrency_limit_per_connection(limit);
            Serving::spawn(
                addr,
                builder.add_service(service).serve_with_incoming(incoming),
            )
        }
        PeerServer::Vegas { capacity } => {
            let mut builder = builder.layer(AdaptiveLimiterLayer::new(vegas(capacity)?));
            Serving::spawn(
                addr,
                builder.add_service(service).serve_with_incoming(incoming),
            )
        }
    })
}

/// The retry policy of tower's `retry::budget` docs on a `TpsBudget`, with the naive loop's
/// limits: every answer that succeeded deposits, every failed attempt is retried (tower's
/// examples retry every error) while the call has attempts and deadline left and a
/// withdrawal succeeds, after a fixed delay.
///
/// The request is anything that holds the call's [`Attempt`] (the fleet's also carries the
/// call's id); the policy counts the attempt in it.
#[derive(Clone, Debug)]
pub struct TowerBudgetRetry {
    max_attempts: u32,
    backoff: Duration,
    budget: Arc<TpsBudget>,
    refused: Arc<AtomicU64>,
}

impl TowerBudgetRetry {
    /// `max_attempts` attempts `backoff` apart, paid from `TpsBudget::default()` (10 s,
    /// 10 retries a second, 20 % of the successes).
    pub fn new(max_attempts: u32, backoff: Duration) -> Self {
        TowerBudgetRetry {
            max_attempts,
            backoff,
            budget: Arc::new(TpsBudget::default()),
            refused: Arc::default(),
        }
    }

    /// Retries the budget refused so far (shared by clones).
    pub fn refused(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.refused)
    }
}

impl<Rq, Res, E> tower::retry::Policy<Rq, Res, E> for TowerBudgetRetry
where
    Rq: BorrowMut<Attempt> + Clone,
{
    type Future = Sleep;

    fn retry(&mut self, request: &mut Rq, result: &mut Result<Res, E>) -> Option<Sleep> {
        if result.is_ok() {
            self.budget.deposit();
            return None;
        }
        let attempt = request.borrow_mut();
        let at = Instant::now() + self.backoff;
        if attempt.previous + 1 >= self.max_attempts || at >= attempt.deadline {
            return None;
        }
        if !self.budget.withdraw() {
            self.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        attempt.previous += 1;
        Some(tokio::time::sleep_until(at))
    }

    fn clone_request(&mut self, request: &Rq) -> Option<Rq> {
        Some(request.clone())
    }
}

/// The `resilience` rows' client over `client`, and the counter of retries its budget
/// refused: tower-resilience's standard client stack (its composition guide), outside in:
///
/// - a `TimeLimiter` of `deadline` for the whole call;
/// - `RetryLayer::exponential_backoff()` (3 attempts, 100 ms doubling) with the token
///   bucket of its docs, `RetryBudgetBuilder::new().token_bucket()` (10 retries a second,
///   bursting to 100, and one more per success); every error retried (its default);
/// - a `TimeLimiter` of `per_attempt` for each attempt;
/// - the adapter: a fresh `tonic::Request` per attempt.
pub(crate) fn resilience_caller<T: Transport>(
    client: InventoryClient<T>,
    deadline: Duration,
    per_attempt: Duration,
) -> Result<(Caller, Arc<AtomicU64>), StormError> {
    let send = tower::service_fn(move |()| {
        let mut client = client.clone();
        async move {
            client
                .reserve(Request::new(ReserveRequest::default()))
                .await
                .map(tonic::Response::into_inner)
        }
    });
    let budget = RetryBudgetBuilder::new()
        .token_bucket()
        .build()
        .map_err(|e| StormError::Peer(e.to_string()))?;
    let refused = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&refused);
    let retry = RetryLayer::<(), ReserveReply, TimeLimiterError<Status>>::exponential_backoff()
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
        .layer(
            TimeLimiterLayer::builder()
                .timeout_duration(per_attempt)
                .build(),
        )
        .service(send)
        .map_err(|e: TimeLimiterError<TimeLimiterError<Status>>| match e {
            TimeLimiterError::Inner(TimeLimiterError::Inner(status)) => status,
            TimeLimiterError::Inner(TimeLimiterError::Timeout) => {
                Status::deadline_exceeded("resilience: attempt timed out")
            }
            TimeLimiterError::Timeout => Status::deadline_exceeded("resilience: call timed out"),
        });
    Ok((BoxCloneSyncService::new(stack), refused))
}
