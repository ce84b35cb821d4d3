//! Shed answers are sent before the request body is read. The connection they travel
//! on must survive any number of them: h2 charges small request DATA frames that are
//! never read to a per-connection budget and closes the connection
//! (`GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"`) when it runs out, failing every
//! call on it. The layer reads and discards what a caller sends after an early answer,
//! so the budget is given back.

use crate::server_support;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use server_support::{channel, hold_worker, one_worker_no_queue, reserve, start_with};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::WorkerLimit;
use stormguard_server::shed::MESSAGE_QUEUE_FULL;
use stormguard_server::{AdmissionConfig, RetryThreshold};
use tonic::codegen::tokio_stream::StreamExt;
use tonic::transport::Server;

/// Shed answers sent over the one connection.
const SHED_CALLS: u64 = 200_000;
/// Callers sharing the connection.
const CALLERS: u64 = 64;

/// Two runtime threads, so that the connection task and the layer race as on a real
/// server: on one thread every request's DATA frame is buffered before the layer answers
/// and h2 charges nothing, so the test could not fail. About 25 s in a debug build on an
/// idle 2-core machine (it prints its figures).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_thousand_shed_answers_keep_one_connection() {
    let admission = one_worker_no_queue();
    let accepted = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&accepted);
    // tonic's default server settings: nothing but the layer and the service.
    let server = start_with(
        admission,
        DemoConfig::default(),
        true,
        move |layer, inventory, incoming| {
            let incoming = incoming.map(move |io| {
                counter.fetch_add(1, Ordering::SeqCst);
                io
            });
            Server::builder()
                .layer(layer)
                .add_service(inventory)
                .serve_with_incoming(incoming)
        },
    )
    .await;
    let client = InventoryClient::new(channel(server.addr).await);
    // The only worker is held: every other call is shed on arrival.
    let held = hold_worker(&client, &server.control).await;

    let started = std::time::Instant::now();
    let mut callers = tokio::task::JoinSet::new();
    for _ in 0..CALLERS {
        let mut client = client.clone();
        callers.spawn(async move {
            let (mut shed, mut other) = (0u64, Vec::new());
            for _ in 0..SHED_CALLS / CALLERS {
                let call = client.reserve(reserve("", None));
                let Ok(outcome) = tokio::time::timeout(Duration::from_secs(10), call).await else {
                    other.push("no answer in 10 s".to_owned());
                    break;
                };
                match outcome {
                    // `UNAVAILABLE` with a delay; after half a second of shedding,
                    // "do not retry" with `RESOURCE_EXHAUSTED`.
                    Err(status)
                        if matches!(
                            status.code(),
                            tonic::Code::Unavailable | tonic::Code::ResourceExhausted
                        ) && status.message() == MESSAGE_QUEUE_FULL =>
                    {
                        shed += 1
                    }
                    outcome => other.push(format!("{outcome:?}")),
                }
            }
            (shed, other)
        });
    }
    let (mut shed, mut other) = (0, Vec::new());
    while let Some(result) = callers.join_next().await {
        let (s, o) = result.expect("caller task");
        shed += s;
        other.extend(o);
    }
    let drains = server.stats.drains();
    // Figures for the record, not assertions: the time depends on the machine.
    eprintln!(
        "shed answers {shed}, other outcomes {}, connections {}, {:?}, drains {drains:?}",
        other.len(),
        accepted.load(Ordering::SeqCst),
        started.elapsed(),
    );
    assert!(
        other.is_empty(),
        "{} calls not shed, first: {:?}",
        other.len(),
        other.first()
    );
    assert_eq!(shed, SHED_CALLS);
    assert_eq!(server.stats.snapshot().shed_first, SHED_CALLS);
    server.control.open_gate();
    held.await
        .expect("task")
        .expect("held call served over the same connection");
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "the client reconnected");
}

/// Every kind of early answer reads what the caller sent: shed, expired on arrival,
/// expired while queued, and a queued call dropped by the transport.
#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn every_early_answer_reads_the_request_body() {
    use std::convert::Infallible;
    use tower::{Layer, ServiceExt};

    let layer = stormguard_server::ShedLayer::from_config(&AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 1,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        min_time_left: Duration::ZERO,
        ..AdmissionConfig::default()
    })
    .expect("valid config");
    let stats = layer.stats();
    let (open, gate) = tokio::sync::watch::channel(false);
    let service = layer.layer(tower::service_fn(move |_req: http::Request<String>| {
        let mut gate = gate.clone();
        async move {
            let _ = gate.wait_for(|open| *open).await;
            Ok::<_, Infallible>(http::Response::new(String::new()))
        }
    }));
    let call = |timeout: Option<&'static str>| {
        let mut request = http::Request::new("a request body".to_owned());
        if let Some(timeout) = timeout {
            request
                .headers_mut()
                .insert("grpc-timeout", timeout.parse().expect("header"));
        }
        service.clone().oneshot(request)
    };
    let held = tokio::spawn(call(None));
    while stats.snapshot().in_flight < 1 {
        tokio::task::yield_now().await;
    }
    let read = || stats.drains().ended;
    // Expired on arrival.
    let response = call(Some("0n")).await.expect("infallible");
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(read(), 1);
    // Expired while queued.
    let response = call(Some("10m")).await.expect("infallible");
    assert_eq!(response.headers()["grpc-status"], "4");
    assert_eq!(read(), 2);
    // Dropped while queued (the caller reset the stream, or a timeout outside gave up).
    let queued = tokio::time::timeout(Duration::from_millis(5), call(None)).await;
    assert!(queued.is_err(), "still queued");
    assert_eq!(read(), 3);
    // Shed: one call queued, the next one shed.
    let queued = tokio::spawn(call(None));
    while stats.snapshot().queue_depth < 1 {
        tokio::task::yield_now().await;
    }
    let response = call(None).await.expect("infallible");
    assert_eq!(response.headers()["grpc-status"], "14");
    assert_eq!(read(), 4);
    // Calls that ran were read by their handler (here: not at all), not by the layer.
    open.send_replace(true);
    held.await.expect("task").expect("infallible");
    queued.await.expect("task").expect("infallible");
    assert_eq!(
        stats.drains(),
        stormguard_server::DrainCounts {
            ended: 4,
            ..Default::default()
        }
    );
}
