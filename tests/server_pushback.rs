//! Behaviour 5: a shed answer is trailers-only, with the configured status and a
//! jittered `grpc-retry-pushback-ms` within [1 ms, max], never 0; `-1` for retries
//! under deep overload when configured.

mod server_support;

use std::collections::BTreeSet;
use std::time::Duration;

use server_support::{
    Background, channel, eventually, hold_worker, pushback, release, reserve, start,
};
use stormguard_core::code::Code as CoreCode;
use stormguard_demo::server::DemoConfig;
use stormguard_demo::{InventoryClient, ReserveRequest};
use stormguard_server::{AdmissionConfig, RetryThreshold};
use tonic::transport::Channel;
use tower::ServiceExt;

fn no_queue(pushback_max_ms: u64) -> AdmissionConfig {
    AdmissionConfig {
        workers: 1,
        queue_capacity: 0,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        pushback_max: Duration::from_millis(pushback_max_ms),
        ..AdmissionConfig::default()
    }
}

/// Sends `request`, which the server is expected to shed, and returns the answer.
async fn shed(
    client: &InventoryClient<Channel>,
    request: tonic::Request<ReserveRequest>,
) -> tonic::Status {
    client.clone().reserve(request).await.expect_err("shed")
}

/// The `grpc-retry-pushback-ms` of a shed answer, as a number of milliseconds.
fn pushback_ms(status: &tonic::Status) -> u64 {
    pushback(status)
        .expect("pushback header")
        .parse()
        .expect("a non-negative integer")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shed_answers_carry_a_jittered_pushback_never_zero_never_above_max() {
    let server = start(no_queue(200), DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = hold_worker(&client, &server.control).await;
    let mut seen = BTreeSet::new();
    for i in 0..100 {
        let status = shed(&client, reserve("", (i % 2 == 1).then_some("1"))).await;
        assert_eq!(status.code(), tonic::Code::Unavailable);
        let ms = pushback_ms(&status);
        // No completion observed yet: the drain estimate is the max, jittered over
        // [max/2, max].
        assert!((100..=200).contains(&ms), "{ms}");
        seen.insert(ms);
    }
    assert!(seen.len() >= 20, "pushback not jittered: {seen:?}");
    release(&server.control, hold).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shed_status_is_configurable_and_the_answer_is_trailers_only() {
    let admission = AdmissionConfig {
        shed_code: CoreCode::ResourceExhausted,
        ..no_queue(50)
    };
    let server = start(admission, DemoConfig::default(), true).await;
    let channel = channel(server.addr).await;
    let client = InventoryClient::new(channel.clone());
    let hold = hold_worker(&client, &server.control).await;

    let status = shed(&client, reserve("", None)).await;
    assert_eq!(status.code(), tonic::Code::ResourceExhausted);

    // The raw HTTP/2 answer: status and pushback in the response *headers* (no body, no
    // separate trailers), which is what makes it retryable under gRPC A6.
    let request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{}/stormguard.demo.v1.Inventory/Reserve",
            server.addr
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::empty())
        .expect("request");
    let response = channel.oneshot(request).await.expect("http response");
    assert_eq!(response.status(), http::StatusCode::OK);
    let headers = response.headers();
    assert_eq!(headers["content-type"], "application/grpc");
    assert_eq!(headers["grpc-status"], "8");
    let ms: u64 = headers["grpc-retry-pushback-ms"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("integer");
    assert!((1..=50).contains(&ms), "{ms}");

    release(&server.control, hold).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_shed_under_deep_overload_are_told_not_to_retry() {
    let admission = AdmissionConfig {
        workers: 1,
        queue_capacity: 2,
        retry_threshold: RetryThreshold {
            depth: Some(1),
            queue_delay: None,
        },
        no_retry_depth: Some(2),
        ..AdmissionConfig::default()
    };
    let server = start(admission, DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let mut held = Background::new(&client);
    held.send(reserve("hold", None));
    server.control.wait_running(1).await;
    held.send(reserve("q1", None));
    eventually("q1 queued", || server.stats.snapshot().queue_depth == 1).await;
    // Depth 1: past the retry threshold, below the no-retry depth.
    let status = shed(&client, reserve("", Some("1"))).await;
    assert!(pushback_ms(&status) >= 1);

    held.send(reserve("q2", None));
    eventually("q2 queued", || server.stats.snapshot().queue_depth == 2).await;
    // Depth 2: retries are told "do not retry"...
    let status = shed(&client, reserve("", Some("1"))).await;
    assert_eq!(pushback(&status).as_deref(), Some("-1"));
    // ...first attempts never are.
    let status = shed(&client, reserve("", None)).await;
    assert!(pushback_ms(&status) >= 1);

    held.serve_all(&server.control).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pushback_follows_the_observed_completion_rate() {
    let admission = AdmissionConfig {
        workers: 1,
        queue_capacity: 4,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        pushback_max: Duration::from_secs(1),
        ..AdmissionConfig::default()
    };
    let demo = DemoConfig {
        service_time: Duration::from_millis(20),
        ..DemoConfig::default()
    };
    let server = start(admission, demo, false).await;
    let client = InventoryClient::new(channel(server.addr).await);
    // Warm up: completions about 21 ms apart (a 20 ms sleep and the call around it).
    for _ in 0..20 {
        client
            .clone()
            .reserve(reserve("", None))
            .await
            .expect("served");
    }
    // One running (held at the gate, so the queue stays full while we look), four
    // queued, then the rest shed: the drain estimate is about (4 + 1) × 21 ms ≈ 105 ms,
    // jittered over [e/2, e]. Without a rate it would be the max (1 s), jittered over
    // [500, 1000].
    server.control.close_gate();
    let mut calls = Background::new(&client);
    for _ in 0..5 {
        calls.send(reserve("", None));
    }
    eventually("queue full", || server.stats.snapshot().queue_depth == 4).await;
    for _ in 0..10 {
        let ms = pushback_ms(&shed(&client, reserve("", None)).await);
        assert!((40..=400).contains(&ms), "pushback {ms} ms");
    }
    calls.serve_all(&server.control).await;
}
