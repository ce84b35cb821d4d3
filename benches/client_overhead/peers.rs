//! The peers on the happy path: what a tonic team installs instead of stormguard, each
//! configured as its own documentation recommends (`docs/comparison.md` cites the page behind
//! every setting), doing the job of the `retry`, `shed` and `both` variants.
//!
//! - tower 0.5: `tower::retry::Retry` with the policy of tower's `retry::budget` docs
//!   (deposit on every success, withdraw before every retry) over `TpsBudget::default()`,
//!   with the `RetryLayer`'s 3 attempts and tower's exponential backoff; on the server,
//!   tonic 0.14's own `Server::builder().concurrency_limit_per_connection(n).load_shed(true)`
//!   (the pair `load_shed`'s docs recommend).
//! - tower-resilience 0.13: its `RetryLayer::exponential_backoff()` preset with the token
//!   bucket of its README (`RetryBudgetBuilder::new().token_bucket()`); on the server, its
//!   `AdaptiveLimiterLayer` with Vegas, which makes callers wait and never refuses, so
//!   tonic's `load_shed(true)` sits outside it.
//!
//! Neither retry sits on a tonic `Channel` as it is: both keep the request to send it again,
//! and a tonic request's body is a stream, not `Clone`. Each sits above the generated
//! client, over a service that sends each attempt's message as a fresh `tonic::Request`:
//! the adapter a user writes.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use stormguard_core::{BackoffConfig, RetryPolicy};
use stormguard_demo::{InventoryClient, InventoryServer, ReserveReply, ReserveRequest};
use tokio::net::TcpListener;
use tokio::time::Sleep;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Server};
use tonic::{Request, Response, Status};
use tower::retry::backoff::{Backoff, ExponentialBackoff, ExponentialBackoffMaker, MakeBackoff};
use tower::retry::budget::{Budget as _, TpsBudget};
use tower::util::rng::HasherRng;
use tower::{Layer, Service, ServiceExt};
use tower_resilience::adaptive::{AdaptiveLimiterLayer, Vegas};
use tower_resilience::retry::{RetryBudgetBuilder, RetryLayer};

use super::{Caller, Echo};

/// The per-connection limit of the tonic server: the value of the example in the docs of
/// tonic's `Server::concurrency_limit_per_connection`, the number a newcomer copies.
pub(crate) const TONIC_LIMIT: usize = 32;

/// The message every call sends: the one the generated-client variants send.
fn message() -> ReserveRequest {
    ReserveRequest {
        sku: String::new(),
        quantity: 0,
        request_id: String::new(),
        payload: vec![7; 16],
    }
}

/// A caller through a peer's retry, `svc`, which takes the message and answers the reply.
#[derive(Clone)]
pub(crate) struct PeerCaller<S> {
    svc: S,
}

impl<S> Caller for PeerCaller<S>
where
    S: Service<ReserveRequest, Response = ReserveReply> + Clone + Send + 'static,
    S::Error: std::fmt::Debug,
    S::Future: Send,
{
    async fn call(&mut self) {
        let reply = self.svc.ready().await.expect("ready").call(message()).await;
        assert!(reply.expect("echo").reserved);
    }
}

/// The adapter: sends each attempt's message as a fresh `tonic::Request` through the
/// generated client over `channel`.
fn send(
    channel: Channel,
) -> impl Service<
    ReserveRequest,
    Response = ReserveReply,
    Error = Status,
    Future = impl Future<Output = Result<ReserveReply, Status>> + Send,
> + Clone
+ Send
+ 'static {
    let client = InventoryClient::new(channel);
    tower::service_fn(move |msg: ReserveRequest| {
        let mut client = client.clone();
        async move {
            client
                .reserve(Request::new(msg))
                .await
                .map(Response::into_inner)
        }
    })
}

/// The policy of tower's `retry::budget` docs on a shared `TpsBudget::default()` (10 s,
/// 10 retries a second, 20 % of the successes): every success deposits, every failure is
/// retried (tower's docs treat every error as one) after tower's exponential backoff while
/// attempts are left and a withdrawal succeeds.
#[derive(Clone)]
struct TowerPolicy {
    budget: Arc<TpsBudget>,
    backoff: ExponentialBackoff,
    retries_left: u32,
}

impl TowerPolicy {
    /// The `RetryLayer`'s attempts, and tower's backoff over the window of its default policy.
    fn new() -> Self {
        let policy = RetryPolicy::default();
        let (base, cap) = match policy.backoff {
            BackoffConfig::FullJitter { base, cap, .. } => (base, cap),
            other => panic!("the default backoff is full jitter, not {other:?}"),
        };
        TowerPolicy {
            budget: Arc::new(TpsBudget::default()),
            backoff: ExponentialBackoffMaker::new(base, cap, 1.0, HasherRng::default())
                .expect("backoff")
                .make_backoff(),
            retries_left: policy.max_attempts - 1,
        }
    }
}

impl tower::retry::Policy<ReserveRequest, ReserveReply, Status> for TowerPolicy {
    type Future = Sleep;

    fn retry(
        &mut self,
        _: &mut ReserveRequest,
        result: &mut Result<ReserveReply, Status>,
    ) -> Option<Sleep> {
        if result.is_ok() {
            self.budget.deposit();
            return None;
        }
        if self.retries_left == 0 || !self.budget.withdraw() {
            return None;
        }
        self.retries_left -= 1;
        Some(self.backoff.next_backoff())
    }

    fn clone_request(&mut self, request: &ReserveRequest) -> Option<ReserveRequest> {
        Some(request.clone())
    }
}

/// The `tower` client: tower's `Retry` with [`TowerPolicy`] above the generated client.
pub(crate) fn tower(channel: Channel) -> impl Caller {
    PeerCaller {
        svc: tower::retry::Retry::new(TowerPolicy::new(), send(channel)),
    }
}

/// The `resilience` client: tower-resilience's `exponential_backoff()` preset (3 attempts,
/// 100 ms doubling) paid from the token bucket of its README (10 retries a second,
/// bursting to 100, one back per success); every error retried (its default).
pub(crate) fn resilience(channel: Channel) -> impl Caller {
    let budget = RetryBudgetBuilder::new()
        .token_bucket()
        .build()
        .expect("the README's budget");
    let retry = RetryLayer::<ReserveRequest, ReserveReply, Status>::exponential_backoff()
        .budget(budget)
        .build();
    PeerCaller {
        svc: retry.layer(send(channel)),
    }
}

/// How a peer's server admits calls.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum PeerServer {
    /// tonic's `concurrency_limit_per_connection(TONIC_LIMIT)` with `load_shed(true)`.
    Tonic,
    /// tower-resilience's `AdaptiveLimiterLayer` with Vegas at the values of its README
    /// (`Vegas::builder().build()`: an initial limit of 10 between 1 and 100, alpha 3,
    /// beta 6), tonic's `load_shed(true)` outside it.
    Vegas,
}

/// Serves the echo on `listener` behind `server`'s admission, as the bare server is served
/// otherwise (no router).
pub(crate) fn serve(listener: TcpListener, addr: SocketAddr, server: PeerServer) -> SocketAddr {
    let incoming = TcpIncoming::from(listener);
    let builder = Server::builder().load_shed(true);
    match server {
        PeerServer::Tonic => {
            let builder = builder.concurrency_limit_per_connection(TONIC_LIMIT);
            tokio::spawn(builder.serve_with_incoming(InventoryServer::new(Echo), incoming));
        }
        PeerServer::Vegas => {
            let vegas = Vegas::builder().build().expect("the README's Vegas");
            let builder = builder.layer(AdaptiveLimiterLayer::new(vegas));
            tokio::spawn(builder.serve_with_incoming(InventoryServer::new(Echo), incoming));
        }
    }
    addr
}
