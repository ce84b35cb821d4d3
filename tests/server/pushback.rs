//! Behaviour 5: a shed answer is trailers-only, with the configured status and a
//! jittered `grpc-retry-pushback-ms` within [1 ms, max], never 0; `-1` for retries
//! under deep overload when configured, for a call whose deadline leaves no room for the
//! pushback and the drain (the deadline rule), and for every shed call once shedding has
//! gone on without a break for `no_retry_after_shedding` (the sustained-overload rule).

use crate::server_support;

use std::collections::BTreeSet;
use std::convert::Infallible;
use std::time::Duration;

use server_support::{
    Background, channel, eventually, hold_worker, one_worker_no_queue, pushback, release, reserve,
    start,
};
use stormguard_core::Code as CoreCode;
use stormguard_demo::server::DemoConfig;
use stormguard_demo::{InventoryClient, ReserveRequest};
use stormguard_server::WorkerLimit;
use stormguard_server::{AdmissionConfig, RetryThreshold, ShedLayer};
use tokio::sync::watch;
use tonic::transport::Channel;
use tower::{Layer, ServiceExt};

/// One worker, no queue, and neither "do not retry" rule (each has its own test), so
/// that a long run of shed answers on a loaded machine keeps its delays.
fn no_queue(pushback_max_ms: u64) -> AdmissionConfig {
    AdmissionConfig {
        pushback_max: Duration::from_millis(pushback_max_ms),
        no_retry_margin: None,
        no_retry_after_shedding: None,
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
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 2,
        retry_threshold: RetryThreshold {
            depth: Some(1),
            queue_delay: None,
        },
        no_retry_depth: Some(2),
        no_retry_margin: None,
        no_retry_after_shedding: None,
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
    let layer = ShedLayer::from_config(&AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 4,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        pushback_max: Duration::from_secs(1),
        no_retry_margin: None,
        no_retry_after_shedding: None,
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

/// The `grpc-retry-pushback-ms` of a response from the tower service, as sent.
fn header_pushback<B>(response: &http::Response<B>) -> String {
    response.headers()["grpc-retry-pushback-ms"]
        .to_str()
        .expect("ascii")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_deadline_leaves_no_room_after_pushback_and_drain_is_told_not_to_retry() {
    // No completion seen yet: the drain estimate E is pushback_max (200 ms) and the
    // pushback P is within [100, 200] ms; with the 5 ms margin, a call needs at least
    // 305 ms left to be told to come back.
    let admission = AdmissionConfig {
        no_retry_margin: Some(Duration::from_millis(5)),
        ..no_queue(200)
    };
    let server = start(admission, DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = hold_worker(&client, &server.control).await;
    let with_timeout = |ms, previous| {
        let mut request = reserve("", previous);
        request.set_timeout(Duration::from_millis(ms));
        request
    };
    for previous in [None, Some("1")] {
        // 250 ms left: P + E alone is 300 ms or more. First attempts too.
        let status = shed(&client, with_timeout(250, previous)).await;
        // "Do not retry" comes as `RESOURCE_EXHAUSTED`, which retry loops that read only
        // the code leave alone too (`no_retry_code`).
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(pushback(&status).as_deref(), Some("-1"), "{previous:?}");
        // 30 s left: room for P + E + S (at most 405 ms) even on a slow machine.
        let status = shed(&client, with_timeout(30_000, previous)).await;
        let ms = pushback_ms(&status);
        assert!((100..=200).contains(&ms), "{previous:?}: {ms}");
        // No deadline: nothing to run out of.
        let status = shed(&client, reserve("", previous)).await;
        assert!((100..=200).contains(&pushback_ms(&status)));
    }
    release(&server.control, hold).await;
}

/// Driven through the tower service on paused time: the shed answers are exactly 50 ms
/// apart, so the stretch of shedding is exact.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn sustained_shedding_turns_pushback_to_do_not_retry_and_back_when_it_ends() {
    let layer = ShedLayer::from_config(&AdmissionConfig {
        // Drain estimate: pushback_max (100 ms), no rate known; sheds 50 ms apart are
        // one stretch.
        pushback_max: Duration::from_millis(100),
        no_retry_margin: None,
        no_retry_after_shedding: Some(Duration::from_millis(300)),
        ..one_worker_no_queue()
    })
    .expect("valid config");
    let stats = layer.stats();
    let (gate, gate_rx) = watch::channel(false);
    let service = layer.layer(tower::service_fn(move |_req: http::Request<String>| {
        let mut gate = gate_rx.clone();
        async move {
            let _ = gate.wait_for(|open| *open).await;
            Ok::<_, Infallible>(http::Response::new(String::new()))
        }
    }));
    let call = |retry: bool| {
        let mut request = http::Request::new(String::new());
        if retry {
            request.headers_mut().insert(
                "grpc-previous-rpc-attempts",
                http::HeaderValue::from_static("1"),
            );
        }
        service.clone().oneshot(request)
    };
    let hold = |gate: &watch::Sender<bool>| {
        gate.send_replace(false);
        tokio::spawn(call(false))
    };
    let running = || async {
        while stats.snapshot().in_flight < 1 {
            tokio::task::yield_now().await;
        }
    };
    let shed_now = |retry| async move { header_pushback(&call(retry).await.expect("infallible")) };
    let step = Duration::from_millis(50);

    let held = hold(&gate);
    running().await;
    // 0 to 250 ms of shedding: delays, for first attempts and retries.
    for i in 0..6 {
        let pb = shed_now(i % 2 == 1).await;
        assert!(pb.parse::<u64>().is_ok_and(|ms| ms >= 1), "{i}: {pb}");
        tokio::time::advance(step).await;
    }
    // 300 ms: every shed call is told not to come back.
    assert_eq!(shed_now(true).await, "-1");
    assert_eq!(shed_now(false).await, "-1");
    tokio::time::advance(step).await;
    assert_eq!(shed_now(true).await, "-1");

    // The overload ends: the held call finishes and the next arrival finds the worker
    // free. A new overload starts a new stretch, with delays again.
    gate.send_replace(true);
    held.await.expect("task").expect("infallible");
    let held = hold(&gate);
    running().await;
    let pb = shed_now(true).await;
    assert!(
        pb.parse::<u64>().is_ok_and(|ms| ms >= 1),
        "after the break: {pb}"
    );
    gate.send_replace(true);
    held.await.expect("task").expect("infallible");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_loopback_a_long_overload_is_told_not_to_retry_after_the_configured_time() {
    // Real time, so only bounds that a slow machine cannot break: the first shed answer
    // of a stretch always has a delay (the stretch starts with it), the first `-1` comes
    // no sooner than the configured time after it, and a new stretch after a served call
    // starts with a delay again.
    let after = Duration::from_millis(300);
    let admission = AdmissionConfig {
        // A 10 s drain estimate: no gap between two sheds on a loaded machine is a break.
        pushback_max: Duration::from_secs(10),
        no_retry_margin: None,
        no_retry_after_shedding: Some(after),
        ..one_worker_no_queue()
    };
    let server = start(admission, DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    for round in 0..2 {
        let hold = hold_worker(&client, &server.control).await;
        let started = tokio::time::Instant::now();
        let first = shed(&client, reserve("", Some("1"))).await;
        assert!(pushback_ms(&first) >= 1, "round {round}");
        let mut told = None;
        for _ in 0..20_000 {
            let status = shed(&client, reserve("", Some("1"))).await;
            if pushback(&status).as_deref() == Some("-1") {
                told = Some(started.elapsed());
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let told = told.expect("a -1 within 20 000 shed answers");
        assert!(told >= after, "round {round}: -1 after only {told:?}");
        release(&server.control, hold).await;
        server.control.close_gate();
    }
}

/// The fields of `google.rpc.Status`, `google.rpc.RetryInfo` and the well-known types in
/// them that this test reads, declared
/// from the published protos (a decoder skips the rest), so the answer is checked as any
/// client of the rich error model reads it.
mod rpc {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Status {
        #[prost(int32, tag = "1")]
        pub(super) code: i32,
        #[prost(string, tag = "2")]
        pub(super) message: String,
        #[prost(message, repeated, tag = "3")]
        pub(super) details: Vec<Any>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct RetryInfo {
        #[prost(message, optional, tag = "1")]
        pub(super) retry_delay: Option<Duration>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Any {
        #[prost(string, tag = "1")]
        pub(super) type_url: String,
        #[prost(bytes = "vec", tag = "2")]
        pub(super) value: Vec<u8>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Duration {
        #[prost(int64, tag = "1")]
        pub(super) seconds: i64,
        #[prost(int32, tag = "2")]
        pub(super) nanos: i32,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_retry_info_a_shed_answer_carries_its_pushback_as_a_retry_info_too() {
    use prost::Message as _;

    let admission = AdmissionConfig {
        retry_info: true,
        ..no_queue(50)
    };
    let server = start(admission, DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = hold_worker(&client, &server.control).await;

    for _ in 0..5 {
        let status = shed(&client, reserve("", None)).await;
        let ms = pushback_ms(&status);
        let rich = rpc::Status::decode(status.details()).expect("a google.rpc.Status");
        assert_eq!(rich.code, status.code() as i32, "the same code");
        assert_eq!(rich.message, status.message(), "the same message");
        assert_eq!(rich.details.len(), 1);
        let any = &rich.details[0];
        assert_eq!(any.type_url, "type.googleapis.com/google.rpc.RetryInfo");
        let info = rpc::RetryInfo::decode(any.value.as_slice()).expect("a RetryInfo");
        let delay = info.retry_delay.expect("retry_delay");
        let delay_ms = delay.seconds * 1000 + i64::from(delay.nanos) / 1_000_000;
        assert_eq!(delay_ms, ms as i64, "the delay of grpc-retry-pushback-ms");
        assert_eq!(
            delay.nanos % 1_000_000,
            0,
            "whole milliseconds, as the header"
        );
    }
    release(&server.control, hold).await;

    // Off by default: the header alone.
    let server = start(no_queue(50), DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = hold_worker(&client, &server.control).await;
    let status = shed(&client, reserve("", None)).await;
    assert!(status.details().is_empty());
    assert!(pushback_ms(&status) >= 1);
    release(&server.control, hold).await;
}
