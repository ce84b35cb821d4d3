//! End-to-end: what the layer tells operators (counters, spans) and what the interceptor
//! stamps for code with its own call loop.
#![allow(clippy::unwrap_used)]

use crate::client_support;
use crate::tracing_support;

use std::time::Duration;

use client_support::*;
use stormguard_client::context::{self, CallContext};
use stormguard_client::{ContextInterceptor, RetryLayer};
use stormguard_demo::InventoryClient;
use tonic::{Code, Request};
use tracing_support::Recorder;

#[tokio::test]
async fn each_attempt_runs_in_a_span_with_its_number_and_reason() {
    let recorder = Recorder::default();
    let _guard = tracing::subscriber::set_default(recorder.clone());
    let svc = Scripted::new(
        [
            Step::Fail(Code::Unavailable),
            Step::pushback(Code::ResourceExhausted, "1"),
        ],
        Step::Ok,
    );
    let policy = stormguard_core::policy::RetryPolicy {
        retryable_codes: [
            stormguard_core::code::Code::Unavailable,
            stormguard_core::code::Code::ResourceExhausted,
        ]
        .into_iter()
        .collect(),
        ..quick_policy()
    };
    let mut client = setup(&svc, RetryLayer::new(controller(policy))).await;
    // Another test of this binary may have registered the span's callsite while this
    // subscriber was being installed, and cached "no interest" for it: ask again now that
    // the subscriber is in place.
    tracing::callsite::rebuild_interest_cache();
    client.reserve(reserve("a")).await.unwrap();

    let attempts: Vec<(String, String)> = recorder
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|(name, _)| name == "stormguard.attempt")
        .map(|(_, fields)| {
            let get = |k: &str| fields.iter().find(|(n, _)| n == k).unwrap().1.clone();
            (get("retry.attempt"), get("retry.reason"))
        })
        .collect();
    assert_eq!(
        attempts,
        [
            ("0".to_owned(), "initial".to_owned()),
            ("1".to_owned(), "UNAVAILABLE".to_owned()),
            ("2".to_owned(), "RESOURCE_EXHAUSTED".to_owned()),
        ]
    );
}

#[tokio::test]
async fn logical_calls_and_attempts_are_counted_apart() {
    let svc = Scripted::new(
        [
            Step::Fail(Code::Unavailable),
            Step::Fail(Code::Unavailable),
            Step::Fail(Code::Unavailable),
            Step::Fail(Code::NotFound),
        ],
        Step::Ok,
    );
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer.clone()).await;
    // A second service from the same layer counts into the same counters.
    let mut other = setup(&svc, layer).await;

    assert!(client.reserve(reserve("1")).await.is_err()); // 3 attempts, refused: attempts
    assert_eq!(
        other.reserve(reserve("2")).await.unwrap_err().code(),
        Code::NotFound
    );
    other.reserve(reserve("3")).await.unwrap();
    let s = stats.snapshot();
    assert_eq!((s.logical, s.attempts, s.retries), (3, 5, 2));
    assert_eq!((s.ok, s.failed), (1, 2));
    assert_eq!(s.refused.attempts, 1);
    assert_eq!(s.refused.not_retryable, 1);
    assert!((s.amplification() - 5.0 / 3.0).abs() < 1e-9);
}

#[tokio::test]
async fn the_interceptor_stamps_deadline_and_attempt_from_the_context() {
    let svc = Scripted::always(Step::Ok);
    let addr = serve(svc.clone()).await;
    let mut client =
        InventoryClient::with_interceptor(channel(addr).await, ContextInterceptor::new());

    // Outside any context: nothing stamped.
    client.reserve(reserve("plain")).await.unwrap();
    // A user's own loop marks its second attempt and the work's deadline.
    let ctx = CallContext::new()
        .with_timeout(Duration::from_secs(2))
        .with_previous_attempts(1);
    context::scope(ctx, client.reserve(reserve("looped")))
        .await
        .unwrap();
    // A context whose deadline passed: the call is not sent.
    let expired = CallContext::new().with_deadline(tokio::time::Instant::now());
    let status = context::scope(expired, client.reserve(Request::new(reserve("late"))))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);

    let seen = svc.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(
        (seen[0].previous_attempts.clone(), seen[0].timeout.clone()),
        (None, None)
    );
    assert_eq!(seen[1].previous_attempts.as_deref(), Some("1"));
    let t = seen[1].timeout().unwrap();
    assert!(
        t <= Duration::from_secs(2) && t > Duration::from_secs(1),
        "{t:?}"
    );
}

#[tokio::test]
async fn an_expired_context_deadline_fails_the_call_without_sending_it() {
    let svc = Scripted::always(Step::Ok);
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;
    let expired = CallContext::new().with_deadline(tokio::time::Instant::now());
    let status = context::scope(expired, client.reserve(reserve("late")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert!(svc.seen().is_empty());
    assert_eq!(stats.snapshot().deadline_exceeded, 1);
}
