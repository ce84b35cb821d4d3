//! End-to-end: a committed call (response headers without a status) is never retried, but
//! how it ends still counts. Its final status arrives in the trailers; a failure there must
//! cost the budget (an A6 token) and count for the breaker, a success must deposit, and a
//! stream the caller drops half-read must record nothing.
#![allow(clippy::unwrap_used)]

use crate::client_support;

use std::sync::Arc;
use std::time::Duration;

use client_support::*;
use stormguard_client::RetryLayer;
use stormguard_core::Budget;
use stormguard_core::MethodTable;
use stormguard_core::RetryController;
use stormguard_core::{A6Budget, A6BudgetConfig};
use stormguard_core::{BreakerConfig, CircuitBreaker};
use stormguard_demo::WatchStockRequest;
use tonic::Code;

fn watch(count: u32) -> WatchStockRequest {
    WatchStockRequest {
        sku: "sku-7".into(),
        count,
        interval_ms: 0,
    }
}

/// A layer paying for retries from an A6 throttle of 10 tokens, ratio 0.5: its balance
/// (tokens above the half-way threshold) is 5 when full, each failure costs 1 and each
/// success adds 0.5.
fn a6_layer(breaker: Option<CircuitBreaker>) -> RetryLayer {
    let throttle: Arc<dyn Budget> = Arc::new(
        A6Budget::new(A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.5,
        })
        .unwrap(),
    );
    RetryLayer::new(
        RetryController::new(MethodTable::uniform(quick_policy()), throttle, breaker, 42).unwrap(),
    )
}

fn balance(layer: &RetryLayer) -> f64 {
    layer.controller().budget().balance()
}

fn assert_balance(layer: &RetryLayer, expected: f64) {
    let got = balance(layer);
    assert!(
        (got - expected).abs() < 1e-9,
        "throttle balance {got}, expected {expected}"
    );
}

/// Two failures recorded straight on the throttle, so that a deposit shows (a full
/// bucket cannot grow).
fn spend_two_tokens(layer: &RetryLayer) {
    layer.controller().budget().record_failure();
    layer.controller().budget().record_failure();
    assert_balance(layer, 3.0);
}

#[tokio::test]
async fn a_stream_failing_in_its_trailers_is_not_retried_and_costs_a_token() {
    let svc = Scripted::new(
        [Step::Stream {
            messages: 2,
            then: Some(Code::Unavailable),
        }],
        Step::Ok,
    );
    let layer = a6_layer(None);
    let stats = layer.stats();
    let mut client = setup(&svc, layer.clone()).await;
    assert_balance(&layer, 5.0);

    let mut stream = client.watch_stock(watch(5)).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 0);
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 1);
    // Committed: nothing is recorded until the trailers say how the call ended.
    assert_balance(&layer, 5.0);
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);

    assert_eq!(svc.seen().len(), 1, "no retry after commit");
    assert_balance(&layer, 4.0);
    let s = stats.snapshot();
    assert_eq!((s.logical, s.attempts, s.retries), (1, 1, 0));
    assert_eq!((s.committed, s.committed_failed), (1, 1));
    assert_eq!((s.ok, s.failed, s.committed_abandoned), (0, 1, 0));
}

#[tokio::test]
async fn a_stream_ending_ok_deposits() {
    let svc = Scripted::always(Step::Ok);
    let layer = a6_layer(None);
    let stats = layer.stats();
    let mut client = setup(&svc, layer.clone()).await;
    spend_two_tokens(&layer);

    let mut stream = client.watch_stock(watch(3)).await.unwrap().into_inner();
    let mut n = 0;
    while stream.message().await.unwrap().is_some() {
        n += 1;
    }
    assert_eq!(n, 3);

    assert_balance(&layer, 3.5);
    let s = stats.snapshot();
    assert_eq!((s.committed, s.committed_failed), (1, 0));
    assert_eq!((s.ok, s.failed), (1, 0));
}

#[tokio::test]
async fn a_stream_dropped_midway_records_nothing() {
    // Had it been read to the end, its UNAVAILABLE would have cost a token.
    let svc = Scripted::always(Step::Stream {
        messages: 5,
        then: Some(Code::Unavailable),
    });
    let layer = a6_layer(None);
    let stats = layer.stats();
    let mut client = setup(&svc, layer.clone()).await;
    spend_two_tokens(&layer);

    let mut stream = client.watch_stock(watch(5)).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 0);
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 1);
    drop(stream);

    assert_balance(&layer, 3.0);
    let s = stats.snapshot();
    assert_eq!((s.committed, s.committed_abandoned), (1, 1));
    assert_eq!((s.ok, s.failed, s.committed_failed), (0, 0, 0));
    assert_eq!(svc.seen().len(), 1);
}

#[tokio::test]
async fn a_unary_call_is_counted_when_its_trailers_arrive() {
    // tonic answers a successful unary call with headers, the message, then `grpc-status:
    // 0` in the trailers: a committed call whose OK comes last.
    let svc = Scripted::always(Step::Ok);
    let layer = a6_layer(None);
    let stats = layer.stats();
    let mut client = setup(&svc, layer.clone()).await;
    spend_two_tokens(&layer);

    client.reserve(reserve("u")).await.unwrap();

    assert_balance(&layer, 3.5);
    let s = stats.snapshot();
    assert_eq!(
        (s.committed, s.ok, s.failed, s.committed_abandoned),
        (1, 1, 0, 0)
    );
}

#[tokio::test]
async fn streams_failing_in_their_trailers_open_the_breaker() {
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 2,
            failure_rate: 0.5,
            open_for: Duration::from_secs(60),
            ..BreakerConfig::default()
        },
        5,
    )
    .unwrap();
    let svc = Scripted::always(Step::Stream {
        messages: 1,
        then: Some(Code::Unavailable),
    });
    let layer = a6_layer(Some(breaker));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    for _ in 0..2 {
        let mut stream = client.watch_stock(watch(5)).await.unwrap().into_inner();
        assert_eq!(stream.message().await.unwrap().unwrap().seq, 0);
        assert_eq!(
            stream.message().await.unwrap_err().code(),
            Code::Unavailable
        );
    }
    // Both failures reached the breaker: the next call fails fast, unsent.
    let status = client.watch_stock(watch(5)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(pushback_of(&status).as_deref(), Some("-1"));
    assert_eq!(svc.seen().len(), 2);
    let s = stats.snapshot();
    assert_eq!((s.committed_failed, s.refused.breaker), (2, 1));
}
