//! Behaviours 4 and 6 (time bound): work whose `grpc-timeout` runs out while queued, or
//! that waits longer than `max_time_queued`, is answered DEADLINE_EXCEEDED and never
//! reaches the handler.

use crate::server_support;

use std::time::Duration;

use server_support::{
    HeldCall, TestServer, channel, eventually, hold_worker, release, reserve, start, with_header,
};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::WorkerLimit;
use stormguard_server::shed::MESSAGE_EXPIRED;
use stormguard_server::{AdmissionConfig, RetryThreshold};
use tonic::Code;
use tonic::transport::Channel;

fn admission(max_time_queued: Duration) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 4,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        max_time_queued,
        // Answer 100 ms before the caller's deadline: far ahead of the client's own
        // timer, so the test sees the server's answer whatever the scheduling.
        min_time_left: Duration::from_millis(100),
        ..AdmissionConfig::default()
    }
}

/// A gated server with `admission(max_time_queued)`, a client to it, and the call that
/// keeps its one worker busy (see `hold_worker`).
async fn one_worker_held(
    max_time_queued: Duration,
) -> (TestServer, InventoryClient<Channel>, HeldCall) {
    let server = start(admission(max_time_queued), DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = hold_worker(&client, &server.control).await;
    (server, client, hold)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_deadline_runs_out_while_queued_never_runs() {
    let (server, client, hold) = one_worker_held(Duration::from_secs(30)).await;

    let mut request = reserve("late", None);
    request.set_timeout(Duration::from_millis(300));
    let status = client
        .clone()
        .reserve(request)
        .await
        .expect_err("expired while queued");
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert_eq!(status.message(), MESSAGE_EXPIRED);
    let stats = server.stats.snapshot();
    assert_eq!(stats.expired, 1);
    assert_eq!(stats.queue_depth, 0);

    release(&server.control, hold).await;
    assert_eq!(server.control.entry_log(), ["hold"]);
    let stats = server.stats.snapshot();
    assert_eq!((stats.admitted, stats.completed, stats.expired), (1, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_too_close_to_wait_for_is_answered_at_once() {
    let (server, client, hold) = one_worker_held(Duration::from_secs(30)).await;
    // 50 ms left is below min_time_left (100 ms): not even queued.
    let mut request = reserve("hopeless", None);
    request.set_timeout(Duration::from_millis(50));
    let status = client.clone().reserve(request).await.expect_err("expired");
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(server.stats.snapshot().dequeued, 0, "never queued");
    release(&server.control, hold).await;
    assert_eq!(server.control.entry_log(), ["hold"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_too_close_is_answered_even_with_a_worker_free() {
    let (server, client, hold) = one_worker_held(Duration::from_secs(30)).await;
    release(&server.control, hold).await;
    // The worker is free, but 50 ms left is below min_time_left (100 ms).
    let mut request = reserve("hopeless", None);
    request.set_timeout(Duration::from_millis(50));
    let status = client.clone().reserve(request).await.expect_err("expired");
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(
        server.control.entry_log(),
        ["hold"],
        "never reached the handler"
    );
    assert_eq!(server.stats.snapshot().expired, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_queued_is_bounded_even_without_a_deadline() {
    let (server, client, hold) = one_worker_held(Duration::from_millis(50)).await;
    let status = client
        .clone()
        .reserve(reserve("waits-too-long", None))
        .await
        .expect_err("queued too long");
    assert_eq!(status.code(), Code::DeadlineExceeded);
    let stats = server.stats.snapshot();
    assert!(stats.max_time_queued_us >= 50_000, "{stats:?}");
    release(&server.control, hold).await;
    assert_eq!(server.control.entry_log(), ["hold"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_grpc_timeout_counts_as_no_deadline() {
    let (server, client, hold) = one_worker_held(Duration::from_secs(30)).await;
    let queued = tokio::spawn({
        let mut client = client.clone();
        let request = with_header(reserve("odd-timeout", None), "grpc-timeout", "12345678901m");
        async move { client.reserve(request).await }
    });
    eventually("queued", || server.stats.snapshot().queue_depth == 1).await;
    release(&server.control, hold).await;
    queued
        .await
        .expect("task")
        .expect("served despite the malformed timeout");
    assert_eq!(server.control.entry_log(), ["hold", "odd-timeout"]);
}
