//! Behaviours 4 and 6 (time bound): work whose `grpc-timeout` runs out while queued, or
//! that waits longer than `max_time_queued`, is answered DEADLINE_EXCEEDED and never
//! reaches the handler.

mod server_support;

use std::time::Duration;

use server_support::{channel, eventually, reserve, start, with_header};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::shed::MESSAGE_EXPIRED;
use stormguard_server::{AdmissionConfig, RetryThreshold};
use tonic::Code;

fn admission(max_time_queued: Duration) -> AdmissionConfig {
    AdmissionConfig {
        workers: 1,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_deadline_runs_out_while_queued_never_runs() {
    let server = start(
        admission(Duration::from_secs(30)),
        DemoConfig::default(),
        true,
    )
    .await;
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = tokio::spawn({
        let mut client = client.clone();
        async move { client.reserve(reserve("hold", None)).await }
    });
    server.control.wait_running(1).await;

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

    server.control.open_gate();
    hold.await.expect("task").expect("held call served");
    assert_eq!(server.control.entry_log(), ["hold"]);
    let stats = server.stats.snapshot();
    assert_eq!((stats.admitted, stats.completed, stats.expired), (1, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deadline_too_close_to_wait_for_is_answered_at_once() {
    let server = start(
        admission(Duration::from_secs(30)),
        DemoConfig::default(),
        true,
    )
    .await;
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = tokio::spawn({
        let mut client = client.clone();
        async move { client.reserve(reserve("hold", None)).await }
    });
    server.control.wait_running(1).await;
    // 50 ms left is below min_time_left (100 ms): not even queued.
    let mut request = reserve("hopeless", None);
    request.set_timeout(Duration::from_millis(50));
    let status = client.clone().reserve(request).await.expect_err("expired");
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(server.stats.snapshot().dequeued, 0, "never queued");
    server.control.open_gate();
    hold.await.expect("task").expect("held call served");
    assert_eq!(server.control.entry_log(), ["hold"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn time_queued_is_bounded_even_without_a_deadline() {
    let server = start(
        admission(Duration::from_millis(50)),
        DemoConfig::default(),
        true,
    )
    .await;
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = tokio::spawn({
        let mut client = client.clone();
        async move { client.reserve(reserve("hold", None)).await }
    });
    server.control.wait_running(1).await;
    let status = client
        .clone()
        .reserve(reserve("waits-too-long", None))
        .await
        .expect_err("queued too long");
    assert_eq!(status.code(), Code::DeadlineExceeded);
    let stats = server.stats.snapshot();
    assert!(stats.max_time_queued_us >= 50_000, "{stats:?}");
    server.control.open_gate();
    hold.await.expect("task").expect("held call served");
    assert_eq!(server.control.entry_log(), ["hold"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_grpc_timeout_counts_as_no_deadline() {
    let server = start(
        admission(Duration::from_secs(30)),
        DemoConfig::default(),
        true,
    )
    .await;
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = tokio::spawn({
        let mut client = client.clone();
        async move { client.reserve(reserve("hold", None)).await }
    });
    server.control.wait_running(1).await;
    let queued = tokio::spawn({
        let mut client = client.clone();
        let request = with_header(reserve("odd-timeout", None), "grpc-timeout", "12345678901m");
        async move { client.reserve(request).await }
    });
    eventually("queued", || server.stats.snapshot().queue_depth == 1).await;
    server.control.open_gate();
    hold.await.expect("task").expect("held call served");
    queued
        .await
        .expect("task")
        .expect("served despite the malformed timeout");
    assert_eq!(server.control.entry_log(), ["hold", "odd-timeout"]);
}
