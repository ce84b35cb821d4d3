//! Behaviour 5: a shed answer is trailers-only, with the configured status and a
//! jittered `grpc-retry-pushback-ms` within [1 ms, max], never 0; `-1` for retries
//! under deep overload when configured.

mod server_support;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use server_support::{
    Background, channel, eventually, hold_worker, one_worker_no_queue, pushback, release, reserve,
    start,
};
use stormguard_core::code::Code as CoreCode;
use stormguard_demo::server::DemoConfig;
use stormguard_demo::{InventoryClient, ReserveRequest};
use stormguard_server::{AdmissionConfig, RetryThreshold, ShedLayer};
use tokio::sync::watch;
use tonic::transport::Channel;
use tower::{Layer, ServiceExt};

fn no_queue(pushback_max_ms: u64) -> AdmissionConfig {
    AdmissionConfig {
        pushback_max: Duration::from_millis(pushback_max_ms),
        ..one_worker_no_queue()
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

/// The `grpc-retry-pushback-ms` of a response from the tower service, in milliseconds.
fn header_pushback_ms<B>(response: &http::Response<B>) -> u64 {
    response.headers()["grpc-retry-pushback-ms"]
        .to_str()
        .expect("ascii")
        .parse()
        .expect("a non-negative integer")
}

/// Driven through the tower service on paused time, so the completions are exactly
/// 20 ms apart and no idle time passes between them and the shed answers: the drain
/// estimate is exact, not a band wide enough for a loaded machine.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn the_pushback_follows_the_observed_completion_rate() {
    let layer = ShedLayer::from_config(AdmissionConfig {
        workers: 1,
        queue_capacity: 4,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        pushback_max: Duration::from_secs(1),
        ..AdmissionConfig::default()
    })
    .expect("valid config");
    let stats = layer.stats();
    // The handler waits at the gate (open or closed), then takes 20 ms.
    let (gate, gate_rx) = watch::channel(true);
    let service = layer.layer(tower::service_fn(move |_req: http::Request<String>| {
        let mut gate = gate_rx.clone();
        async move {
            let _ = gate.wait_for(|open| *open).await;
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok::<_, Infallible>(http::Response::new(String::new()))
        }
    }));
    let call = || service.clone().oneshot(http::Request::new(String::new()));
    // One running (held at the gate, so the queue stays full while we look), four
    // queued, then `n` shed: their pushbacks.
    let shed_while_full = |n: usize| {
        let gate = &gate;
        let stats = &stats;
        async move {
            gate.send_replace(false);
            let mut calls = vec![tokio::spawn(call())];
            while stats.snapshot().in_flight < 1 {
                tokio::task::yield_now().await;
            }
            calls.extend((0..4).map(|_| tokio::spawn(call())));
            while stats.snapshot().queue_depth < 4 {
                tokio::task::yield_now().await;
            }
            let mut pushbacks = Vec::new();
            for _ in 0..n {
                pushbacks.push(header_pushback_ms(&call().await.expect("infallible")));
            }
            gate.send_replace(true);
            for call in calls {
                call.await.expect("task").expect("infallible");
            }
            pushbacks
        }
    };
    // Before any completion the estimate is the max (1 s), jittered over [500, 1000].
    for ms in shed_while_full(10).await {
        assert!((500..=1000).contains(&ms), "no rate yet: pushback {ms} ms");
    }
    // Warm up: 20 calls one after another, completions exactly 20 ms apart.
    for _ in 0..20 {
        call().await.expect("infallible");
    }
    // Shed at the instant of the last completion: the drain estimate is
    // (4 + 1) × 20 ms = 100 ms, jittered over [50, 100].
    let mut seen = BTreeSet::new();
    for ms in shed_while_full(20).await {
        assert!((50..=100).contains(&ms), "pushback {ms} ms");
        seen.insert(ms);
    }
    assert!(seen.len() > 1, "pushback not jittered: {seen:?}");
}
