//! End-to-end: the per-attempt timeout, over real tonic on loopback.
//!
//! The slow attempts sleep far longer than any timeout here, so every outcome is decided by
//! the timeouts, not by how fast the machine is.
#![allow(clippy::unwrap_used)]

use crate::client_support;

use std::time::Duration;

use client_support::*;
use stormguard_client::RetryLayer;
use stormguard_core::policy::RetryPolicy;
use tonic::{Code, Request};
use tower::ServiceBuilder;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Longer than any test may take: an attempt that sleeps this long only ends by a timeout.
const FOREVER: Duration = Duration::from_secs(3600);

fn with_attempt_timeout(t: Duration) -> RetryPolicy {
    RetryPolicy {
        per_attempt_timeout: Some(t),
        ..quick_policy()
    }
}

#[tokio::test]
async fn a_hung_attempt_times_out_and_is_retried() {
    let svc = Scripted::new([Step::slow(FOREVER, Step::Ok)], Step::Ok);
    let layer = RetryLayer::new(controller(with_attempt_timeout(ms(200))));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let reply = client
        .reserve(reserve("a"))
        .await
        .expect("the retry succeeds");
    assert_eq!(reply.get_ref().attempt, 2);
    let seen = svc.seen();
    assert_eq!(seen.len(), 2);
    // Without a deadline of its own, each attempt tells the server its own timeout.
    for s in &seen {
        let t = s.timeout().expect("each attempt carries grpc-timeout");
        assert!(t <= ms(200) && t > ms(100), "{t:?}");
    }
    let s = stats.snapshot();
    assert_eq!(
        (s.attempts, s.retries, s.attempt_timeouts, s.ok, s.failed),
        (2, 1, 1, 1, 0)
    );
    assert_eq!(
        s.deadline_exceeded, 0,
        "the call's own deadline did not run out"
    );
}

#[tokio::test]
async fn grpc_timeout_is_the_smaller_of_the_time_left_and_the_attempt_timeout() {
    let svc = Scripted::new([Step::slow(FOREVER, Step::Ok)], Step::Ok);
    let layer = RetryLayer::new(controller(with_attempt_timeout(ms(300))));
    let mut client = setup(&svc, layer).await;

    let mut request = Request::new(reserve("a"));
    request.set_timeout(Duration::from_secs(60));
    client.reserve(request).await.expect("the retry succeeds");
    let mut request = Request::new(reserve("b"));
    request.set_timeout(ms(100));
    client.reserve(request).await.expect("a quick answer");
    let seen = svc.seen();
    assert_eq!(seen.len(), 3);
    let t: Vec<_> = seen.iter().map(|s| s.timeout().unwrap()).collect();
    assert!(
        t[0] <= ms(300) && t[0] > ms(200),
        "per-attempt limit: {t:?}"
    );
    assert!(
        t[1] <= ms(300) && t[1] > ms(200),
        "per-attempt limit: {t:?}"
    );
    assert!(t[2] <= ms(100), "the time left is smaller: {t:?}");
}

#[tokio::test]
async fn when_every_attempt_times_out_the_caller_gets_deadline_exceeded_marked_do_not_retry() {
    let svc = Scripted::always(Step::slow(FOREVER, Step::Ok));
    let layer = RetryLayer::new(controller(with_attempt_timeout(ms(100))));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(pushback_of(&status).as_deref(), Some("-1"));
    assert_eq!(svc.seen().len(), 3);
    let s = stats.snapshot();
    assert_eq!(
        (s.attempts, s.attempt_timeouts, s.refused.attempts, s.failed),
        (3, 3, 1, 1)
    );
}

#[tokio::test]
async fn the_layer_level_timeout_applies_when_the_policy_sets_none() {
    let svc = Scripted::new([Step::slow(FOREVER, Step::Ok)], Step::Ok);
    let layer = RetryLayer::new(controller(quick_policy())).with_per_attempt_timeout(ms(150));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    client
        .reserve(reserve("a"))
        .await
        .expect("the retry succeeds");
    assert_eq!(svc.seen().len(), 2);
    assert_eq!(stats.snapshot().attempt_timeouts, 1);
}

#[tokio::test]
async fn an_endpoint_timeout_below_the_layer_is_a_per_attempt_timeout() {
    let svc = Scripted::new([Step::slow(FOREVER, Step::Ok)], Step::Ok);
    let addr = serve(svc.clone()).await;
    let channel = endpoint(addr).timeout(ms(150)).connect().await.unwrap();
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = client(channel, layer);

    client
        .reserve(reserve("a"))
        .await
        .expect("the retry succeeds");
    assert_eq!(svc.seen().len(), 2);
    assert_eq!(stats.snapshot().attempt_timeouts, 1);
}

#[tokio::test]
async fn a_tower_timeout_below_the_layer_is_a_per_attempt_timeout() {
    let svc = Scripted::always(Step::slow(FOREVER, Step::Ok));
    let addr = serve(svc.clone()).await;
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let svc_stack = ServiceBuilder::new()
        .layer(layer)
        .timeout(ms(100))
        .service(channel(addr).await);
    let mut client = stormguard_demo::InventoryClient::new(svc_stack);

    let status = client.reserve(reserve("a")).await.unwrap_err();
    // Not UNAVAILABLE: the attempts timed out, and the layer says so.
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(pushback_of(&status).as_deref(), Some("-1"));
    assert_eq!(svc.seen().len(), 3);
    assert_eq!(stats.snapshot().attempt_timeouts, 3);
}
