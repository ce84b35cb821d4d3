//! End-to-end: streaming calls are retried only before response headers (gRPC A6 commit).
#![allow(clippy::unwrap_used)]

use crate::client_support;

use client_support::*;
use stormguard_client::RetryLayer;
use stormguard_demo::WatchStockRequest;
use tonic::Code;

fn watch(count: u32) -> WatchStockRequest {
    WatchStockRequest {
        sku: "sku-9".into(),
        count,
        interval_ms: 0,
    }
}

#[tokio::test]
async fn a_stream_that_fails_before_headers_is_retried() {
    let svc = Scripted::new([Step::Fail(Code::Unavailable)], Step::Ok);
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let mut stream = client
        .watch_stock(watch(3))
        .await
        .expect("retried")
        .into_inner();
    let mut seqs = Vec::new();
    while let Some(level) = stream.message().await.unwrap() {
        seqs.push(level.seq);
    }
    assert_eq!(seqs, [0, 1, 2]);
    let seen = svc.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].previous_attempts.as_deref(), Some("1"));
    let s = stats.snapshot();
    // The retried stream ended OK in its trailers: one logical call, ok.
    assert_eq!(
        (s.committed, s.ok, s.failed, s.committed_failed),
        (1, 1, 0, 0)
    );
}

#[tokio::test]
async fn a_committed_stream_is_never_retried() {
    // Headers, two messages, then UNAVAILABLE in the trailers: retryable code, but the
    // caller has seen messages, so the failure is passed through.
    let svc = Scripted::new(
        [Step::Stream {
            messages: 2,
            then: Some(Code::Unavailable),
        }],
        Step::Ok,
    );
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let mut stream = client.watch_stock(watch(5)).await.unwrap().into_inner();
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 0);
    assert_eq!(stream.message().await.unwrap().unwrap().seq, 1);
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(svc.seen().len(), 1, "no retry after commit");
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.retries, s.committed), (1, 0, 1));
    assert_eq!((s.ok, s.failed, s.committed_failed), (0, 1, 1));
}

#[tokio::test]
async fn a_stream_committed_without_messages_is_not_retried() {
    // Response headers went out, then the stream failed before its first message.
    let svc = Scripted::new(
        [Step::Stream {
            messages: 0,
            then: Some(Code::Unavailable),
        }],
        Step::Ok,
    );
    let mut client = setup(&svc, RetryLayer::new(controller(quick_policy()))).await;

    let mut stream = client.watch_stock(watch(5)).await.unwrap().into_inner();
    let status = stream.message().await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(svc.seen().len(), 1);
}

#[tokio::test]
async fn long_streams_pass_through_the_layer_untouched() {
    let svc = Scripted::always(Step::Ok);
    let mut client = setup(&svc, RetryLayer::new(controller(quick_policy()))).await;
    let mut stream = client.watch_stock(watch(500)).await.unwrap().into_inner();
    let mut n = 0;
    while let Some(level) = stream.message().await.unwrap() {
        assert_eq!(level.seq, n);
        n += 1;
    }
    assert_eq!(n, 500);
}
