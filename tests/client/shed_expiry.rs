//! End-to-end: a `ShedLayer` that answers a queued attempt `DEADLINE_EXCEEDED` at once,
//! because the attempt cannot finish within its own `grpc-timeout` (the client's
//! per-attempt timeout), has timed that attempt out early: the client's `RetryLayer`
//! retries it while the call's deadline has time left, instead of taking the answer as
//! final. An answer about the call's own deadline stays final.
//!
//! The queue answers a queued call `min_time_left` before its `grpc-timeout` runs out. With
//! a 3 s per-attempt timeout and `min_time_left` of 2 s, the first attempt (queued behind a
//! held worker) is answered 1 s after it arrives, long before the client's own 3 s timer:
//! the outcome is the server's answer, whatever the scheduling.
#![allow(clippy::unwrap_used)]

use crate::server_support;

use std::sync::Arc;
use std::time::Duration;

use server_support::{channel, eventually, hold_worker, release, reserve, start};
use stormguard_client::RetryLayer;
use stormguard_core::BackoffConfig;
use stormguard_core::RetryController;
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::{MethodTable, RetryPolicy};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::AdmissionConfig;
use stormguard_server::shed::MESSAGE_EXPIRED;
use tonic::Code;
use tower::ServiceBuilder;

const PER_ATTEMPT: Duration = Duration::from_secs(3);

fn admission() -> AdmissionConfig {
    AdmissionConfig {
        min_time_left: Duration::from_secs(2),
        ..server_support::one_worker_short_queue()
    }
}

/// `Reserve` is idempotent (it carries a request id); DEADLINE_EXCEEDED is not among the
/// retryable codes (the default: UNAVAILABLE only), so only the attempt-timeout rule can
/// retry it.
fn retry_layer(per_attempt: Option<Duration>) -> RetryLayer {
    let policy = RetryPolicy {
        idempotent: true,
        backoff: BackoffConfig::FullJitter {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(5),
            multiplier: 2.0,
        },
        ..RetryPolicy::default()
    };
    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 100,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    let layer = RetryLayer::new(
        RetryController::new(MethodTable::uniform(policy), budget, None, 7).unwrap(),
    );
    match per_attempt {
        Some(t) => layer.with_per_attempt_timeout(t),
        None => layer,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_the_queue_cannot_finish_in_its_own_time_is_retried() {
    let server = start(admission(), DemoConfig::default(), true).await;
    let plain = InventoryClient::new(channel(server.addr).await);
    let hold = hold_worker(&plain, &server.control).await;

    let layer = retry_layer(Some(PER_ATTEMPT));
    let stats = layer.stats();
    let mut client = InventoryClient::new(
        ServiceBuilder::new()
            .layer(layer)
            .service(channel(server.addr).await),
    );
    let call = tokio::spawn(async move {
        let mut request = reserve("a", None);
        request.set_timeout(Duration::from_secs(60));
        client.reserve(request).await
    });
    // The first attempt waits behind the held worker until the queue answers it.
    eventually("the first attempt answered DEADLINE_EXCEEDED", || {
        server.stats.snapshot().expired == 1
    })
    .await;
    // The worker frees up: the retry runs now, or as soon as it arrives.
    release(&server.control, hold).await;
    let reply = call
        .await
        .unwrap()
        .expect("the retry after the early answer succeeds");
    assert_eq!(reply.get_ref().attempt, 2, "served on the retry");

    let s = stats.snapshot();
    assert_eq!(
        (s.attempts, s.retries, s.attempt_timeouts, s.ok),
        (2, 1, 1, 1)
    );
    assert_eq!(s.refused.not_retryable, 0);
    assert_eq!(server.control.entry_log(), ["hold", "a"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_answer_about_the_calls_own_deadline_is_final() {
    let server = start(admission(), DemoConfig::default(), true).await;
    let plain = InventoryClient::new(channel(server.addr).await);
    let hold = hold_worker(&plain, &server.control).await;

    // No per-attempt timeout: the attempt's `grpc-timeout` is the call's own deadline.
    let layer = retry_layer(None);
    let stats = layer.stats();
    let mut client = InventoryClient::new(
        ServiceBuilder::new()
            .layer(layer)
            .service(channel(server.addr).await),
    );
    let mut request = reserve("a", None);
    request.set_timeout(PER_ATTEMPT);
    let status = client.reserve(request).await.expect_err("final");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(status.message(), MESSAGE_EXPIRED, "the server's answer");
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.retries, s.attempt_timeouts), (1, 0, 0));
    assert_eq!(s.refused.not_retryable, 1);

    release(&server.control, hold).await;
    assert_eq!(server.control.entry_log(), ["hold"]);
}
