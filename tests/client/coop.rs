//! A caller's plain loop over calls the layer refuses without I/O yields to the runtime, as
//! a loop over bare tonic does (tonic's buffer spends tokio's cooperative budget): one test
//! per cause of refusal. Each runs on a current-thread runtime, where a task beside the
//! loop runs only when the loop's task yields: it counts its turns while the loop makes
//! `CALLS` refused calls. A loop that never yields leaves it at 0; one that spends the
//! budget (128 units a turn) gives it a turn every 128 calls or so.
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http::Response;
use stormguard::client::{
    AdaptiveThrottleConfig, BreakerConfig, MethodScope, MethodTable, RetryLayer, RetryPolicy,
};
use stormguard::engine::{AdaptiveThrottle, CircuitBreaker, RetryController};
use stormguard_demo::InventoryClient;
use tonic::body::Body;
use tonic::{Code, Status};
use tower::ServiceBuilder;

use crate::client_support::{budget, idempotent_policy, reserve};

/// Refused calls per test.
const CALLS: u64 = 4_096;

/// The turns a task beside the loop must get: half of one per 128 calls.
const TURNS: u64 = CALLS / 256;

/// Runs `CALLS` calls made by `call`, each checked by `refused`, beside a task that counts
/// its turns; returns the turns it got.
async fn turns_beside<F, Fut, T>(mut call: F, refused: impl Fn(&Result<T, Status>) -> bool) -> u64
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, Status>>,
{
    let turns = Arc::new(AtomicU64::new(0));
    let counter = tokio::spawn({
        let turns = Arc::clone(&turns);
        async move {
            loop {
                turns.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        }
    });
    let mut not_refused = 0;
    for _ in 0..CALLS {
        if !refused(&call().await) {
            not_refused += 1;
        }
    }
    let got = turns.load(Ordering::Relaxed);
    counter.abort();
    assert!(
        not_refused <= CALLS / 10,
        "{not_refused} of {CALLS} calls were not refused"
    );
    got
}

fn assert_yielded(cause: &str, turns: u64) {
    assert!(
        turns >= TURNS,
        "{cause}: the task beside the loop ran {turns} times in {CALLS} refused calls (want ≥ {TURNS})"
    );
}

/// A service answering every call at once, without I/O, with `code` (trailers-only).
fn answering(
    code: Code,
) -> impl tower::Service<
    http::Request<Body>,
    Response = Response<Body>,
    Error = std::convert::Infallible,
    Future = std::future::Ready<Result<Response<Body>, std::convert::Infallible>>,
> + Clone {
    tower::service_fn(move |_: http::Request<Body>| {
        std::future::ready(Ok(Status::new(code, "answered at once").into_http()))
    })
}

/// The generated client over `inner` through `layer`.
macro_rules! client {
    ($layer:expr, $inner:expr) => {
        InventoryClient::new(ServiceBuilder::new().layer($layer).service($inner))
    };
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_refused_by_an_open_breaker_yields() {
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 1,
            open_for: Duration::from_secs(3600),
            ..BreakerConfig::default()
        },
        1,
    )
    .unwrap();
    let controller = RetryController::new(
        MethodTable::uniform(RetryPolicy::default()),
        budget(0, 0.01),
        Some(breaker),
        1,
    )
    .unwrap();
    let layer = RetryLayer::new(controller);
    let stats = layer.stats();
    let c = client!(layer, answering(Code::Unavailable));
    while stats.snapshot().refused.breaker == 0 {
        let _ = c.clone().reserve(reserve("warm-up")).await;
    }
    let turns = turns_beside(
        || {
            let mut c = c.clone();
            async move { c.reserve(reserve("r")).await }
        },
        |r| r.as_ref().is_err_and(|s| s.message().contains("breaker")),
    )
    .await;
    assert_yielded("breaker open", turns);
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_refused_by_the_adaptive_throttle_yields() {
    let throttle = AdaptiveThrottle::new(
        AdaptiveThrottleConfig {
            max_reject_probability: 0.95,
            ..AdaptiveThrottleConfig::default()
        },
        5,
    )
    .unwrap();
    let layer = RetryLayer::new(stormguard_support_controller()).with_adaptive_throttle(throttle);
    let stats = layer.stats();
    let c = client!(layer, answering(Code::ResourceExhausted));
    // Enough refusals recorded that the throttle refuses most calls.
    for _ in 0..2_000 {
        let _ = c.clone().reserve(reserve("warm-up")).await;
    }
    let before = stats.snapshot().throttled.total();
    let turns = turns_beside(
        || {
            let mut c = c.clone();
            async move { c.reserve(reserve("r")).await }
        },
        |r| r.as_ref().is_err_and(|s| s.code() == Code::Unavailable),
    )
    .await;
    assert!(stats.snapshot().throttled.total() - before >= CALLS * 8 / 10);
    assert_yielded("adaptive throttle", turns);
}

fn stormguard_support_controller() -> RetryController {
    RetryController::new(
        MethodTable::uniform(RetryPolicy::default()),
        budget(0, 0.01),
        None,
        3,
    )
    .unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_whose_retries_the_budget_refuses_yields() {
    // An empty budget: every retry of the dependency's immediate `UNAVAILABLE` is refused.
    let controller = RetryController::new(
        MethodTable::uniform(idempotent_policy()),
        budget(0, 0.01),
        None,
        2,
    )
    .unwrap();
    let layer = RetryLayer::new(controller);
    let stats = layer.stats();
    let c = client!(layer, answering(Code::Unavailable));
    let turns = turns_beside(
        || {
            let mut c = c.clone();
            async move { c.reserve(reserve("r")).await }
        },
        |r| r.as_ref().is_err_and(|s| s.code() == Code::Unavailable),
    )
    .await;
    assert_eq!(stats.snapshot().refused.budget, CALLS);
    assert_yielded("budget", turns);
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_of_calls_past_their_deadline_yields() {
    let layer = RetryLayer::new(stormguard_support_controller());
    let stats = layer.stats();
    let c = client!(layer, answering(Code::Ok));
    let turns = turns_beside(
        || {
            let mut request = tonic::Request::new(reserve("r"));
            request.set_timeout(Duration::ZERO);
            let mut c = c.clone();
            async move { c.reserve(request).await }
        },
        |r| {
            r.as_ref()
                .is_err_and(|s| s.code() == Code::DeadlineExceeded)
        },
    )
    .await;
    assert_eq!(stats.snapshot().deadline_exceeded, CALLS);
    assert_yielded("deadline already past", turns);
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_of_calls_with_a_bad_idempotency_key_yields() {
    let mut table = MethodTable::uniform(RetryPolicy::default());
    table.set_idempotency_key(MethodScope::Default, true);
    let controller = RetryController::new(table, budget(0, 0.01), None, 4).unwrap();
    let c = client!(RetryLayer::new(controller), answering(Code::Ok));
    let turns = turns_beside(
        || {
            let mut request = tonic::Request::new(reserve("r"));
            request
                .metadata_mut()
                .insert("idempotency-key", "not visible".parse().unwrap());
            let mut c = c.clone();
            async move { c.reserve(request).await }
        },
        |r| r.as_ref().is_err_and(|s| s.code() == Code::InvalidArgument),
    )
    .await;
    assert_yielded("bad idempotency key", turns);
}

#[tokio::test(flavor = "current_thread")]
async fn a_loop_over_replicas_with_none_yields() {
    use stormguard::client::replicas::Replicas;
    let replicas = Replicas::from_services(
        stormguard::client::ReplicaConfig::default(),
        std::iter::empty::<(String, tonic::transport::Channel)>(),
    )
    .unwrap();
    // Bare, and under the retry layer.
    let bare = InventoryClient::new(replicas.clone());
    let turns = turns_beside(
        || {
            let mut c = bare.clone();
            async move { c.reserve(reserve("r")).await }
        },
        |r| {
            r.as_ref()
                .is_err_and(|s| s.message().contains("no replica"))
        },
    )
    .await;
    assert_yielded("no replica (bare)", turns);
    let layer = RetryLayer::new(stormguard_support_controller()).over_replicas();
    let layered = client!(layer, replicas);
    let turns = turns_beside(
        || {
            let mut c = layered.clone();
            async move { c.reserve(reserve("r")).await }
        },
        |r| {
            r.as_ref()
                .is_err_and(|s| s.message().contains("no replica"))
        },
    )
    .await;
    assert_yielded("no replica (retry layer)", turns);
}
