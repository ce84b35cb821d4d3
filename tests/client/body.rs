//! End-to-end: request bodies are replayed on retry within a bound; larger ones are sent
//! once.
#![allow(clippy::unwrap_used)]

use crate::client_support;

use client_support::*;
use stormguard_client::{DEFAULT_REPLAY_LIMIT, RetryLayer};
use stormguard_demo::ReserveRequest;
use tonic::Code;

fn with_payload(len: usize) -> ReserveRequest {
    ReserveRequest {
        payload: (0..len).map(|i| (i % 251) as u8).collect(),
        ..reserve("big")
    }
}

#[tokio::test]
async fn every_retry_resends_the_same_body() {
    let svc = Scripted::new(
        [Step::Fail(Code::Unavailable), Step::Fail(Code::Unavailable)],
        Step::Ok,
    );
    let mut client = setup(&svc, RetryLayer::new(controller(quick_policy()))).await;

    let request = with_payload(10_000);
    client
        .reserve(request.clone())
        .await
        .expect("third attempt succeeds");
    let seen = svc.seen();
    assert_eq!(seen.len(), 3);
    for s in &seen {
        assert_eq!(
            s.payload, request.payload,
            "a replayed body must be byte-identical"
        );
    }
}

#[tokio::test]
async fn a_body_over_the_bound_is_sent_once_and_not_retried() {
    let svc = Scripted::new([Step::Fail(Code::Unavailable)], Step::Ok);
    let layer = RetryLayer::new(controller(quick_policy())).with_replay_limit(1024);
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let request = with_payload(4096);
    let status = client.reserve(request.clone()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    let seen = svc.seen();
    assert_eq!(seen.len(), 1, "not retried");
    assert_eq!(
        seen[0].payload, request.payload,
        "the whole body still went out once"
    );
    assert_eq!(stats.snapshot().refused.replay_limit, 1);

    // A small body on the same layer is still retried.
    svc.push([Step::Fail(Code::Unavailable)]);
    client
        .reserve(with_payload(100))
        .await
        .expect("small bodies replay");
    assert_eq!(svc.seen().len(), 3);
}

#[tokio::test]
async fn the_default_bound_is_64_kib() {
    assert_eq!(DEFAULT_REPLAY_LIMIT, 64 * 1024);
    let svc = Scripted::new([Step::Fail(Code::Unavailable)], Step::Ok);
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    // ~60 KB on the wire: buffered and retried.
    client
        .reserve(with_payload(60_000))
        .await
        .expect("under the bound: retried");
    assert_eq!(svc.seen().len(), 2);

    // ~70 KB: over the bound, sent once.
    svc.push([Step::Fail(Code::Unavailable)]);
    let status = client.reserve(with_payload(70_000)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(svc.seen().len(), 3);
    assert_eq!(stats.snapshot().refused.replay_limit, 1);
}

#[tokio::test]
async fn a_method_that_is_never_retried_is_not_buffered_whatever_its_size() {
    // No policy: the body goes straight through, and the call still works.
    let svc = Scripted::always(Step::Ok);
    let controller = stormguard_core::RetryController::new(
        stormguard_core::MethodTable::none(),
        budget(10, 0.1),
        None,
        1,
    )
    .unwrap();
    let mut client = setup(&svc, RetryLayer::new(controller).with_replay_limit(16)).await;
    let request = with_payload(200_000);
    client.reserve(request.clone()).await.unwrap();
    assert_eq!(svc.seen()[0].payload, request.payload);
}
