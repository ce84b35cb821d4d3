//! End-to-end: a `ShedLayer` shutting down gracefully ([`ShutdownHandle`]) answers what it
//! has queued with `UNAVAILABLE` and a pushback instead of dropping it, lets the running
//! call finish, and tonic's `serve_with_shutdown` then ends; a client `RetryLayer` reads
//! the answer as retryable (it retries after the pushback).
#![allow(clippy::unwrap_used)]

use crate::server_support;

use std::sync::Arc;

use server_support::{channel, eventually, hold_worker, pushback, release, reserve, start_with};
use stormguard_client::RetryLayer;
use stormguard_core::RetryController;
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::{MethodTable, RetryPolicy};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::AdmissionConfig;
use stormguard_server::ShutdownHandle;
use stormguard_server::shed::MESSAGE_SHUTTING_DOWN;
use tonic::Code;
use tonic::transport::Server;
use tower::ServiceBuilder;

fn admission() -> AdmissionConfig {
    server_support::one_worker_short_queue()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_calls_get_a_pushback_and_the_running_one_finishes() {
    let mut shutdown: Option<ShutdownHandle> = None;
    let mut server = start_with(
        admission(),
        DemoConfig::default(),
        true,
        |layer, svc, incoming| {
            let handle = layer.shutdown_handle();
            let signal = handle.begun();
            shutdown = Some(handle);
            Server::builder()
                .layer(layer)
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, signal)
        },
    )
    .await;
    let shutdown = shutdown.unwrap();
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = hold_worker(&client, &server.control).await;
    let queued: Vec<_> = ["q1", "q2"]
        .into_iter()
        .map(|id| {
            let mut client = client.clone();
            tokio::spawn(async move { client.reserve(reserve(id, None)).await })
        })
        .collect();
    eventually("two calls queued", || {
        server.stats.snapshot().queue_depth == 2
    })
    .await;

    assert!(shutdown.begin());
    for call in queued {
        let status = call.await.unwrap().expect_err("answered, not run");
        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
        assert_eq!(status.message(), MESSAGE_SHUTTING_DOWN);
        assert_eq!(pushback(&status).as_deref(), Some("1"));
    }
    let stats = server.stats.snapshot();
    assert_eq!((stats.shutting_down, stats.queue_depth), (2, 0));

    // The running call finishes, then tonic's graceful shutdown ends the server.
    release(&server.control, hold).await;
    drop(client);
    (&mut server.task).await.unwrap();
    assert_eq!(server.control.entry_log(), ["hold"]);
    assert_eq!(server.stats.occupancy().waiting, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retrying_client_reads_the_shutdown_answer_as_retryable() {
    // The queue is shut down while tonic still serves: every attempt reaches the gate.
    let mut shutdown: Option<ShutdownHandle> = None;
    let server = start_with(
        admission(),
        DemoConfig::default(),
        false,
        |layer, svc, incoming| {
            shutdown = Some(layer.shutdown_handle());
            Server::builder()
                .layer(layer)
                .add_service(svc)
                .serve_with_incoming(incoming)
        },
    )
    .await;
    assert!(shutdown.unwrap().begin());

    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 100,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    let policy = RetryPolicy {
        idempotent: true,
        ..RetryPolicy::default()
    };
    let layer = RetryLayer::new(
        RetryController::new(MethodTable::uniform(policy), budget, None, 5).unwrap(),
    );
    let stats = layer.stats();
    let mut client = InventoryClient::new(
        ServiceBuilder::new()
            .layer(layer)
            .service(channel(server.addr).await),
    );
    let status = client.reserve(reserve("a", None)).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), MESSAGE_SHUTTING_DOWN);
    let s = stats.snapshot();
    // Retried after the pushback each time, until the attempt limit (3).
    assert_eq!(
        (
            s.attempts,
            s.retries,
            s.delayed_by_pushback,
            s.refused.attempts
        ),
        (3, 2, 2, 1),
        "{s:?}"
    );
    assert_eq!(server.stats.snapshot().shutting_down, 3);
    assert!(server.control.entry_log().is_empty(), "nothing ran");
}

/// With the server's health service handed to the layer (`with_readiness`), the shutdown
/// sets it `NOT_SERVING` (a readiness probe on gRPC health fails, the pod leaves the
/// Service's endpoints) while the queue answers with pushback, then ends the open `Watch`
/// streams (which would hold the graceful shutdown); health checks are still answered
/// during the drain.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shutdown_sets_the_health_service_not_serving() {
    shutdown_sets_not_serving(Order::ReadinessFirst).await;
}

/// The same with the handle taken before the health service is handed to the layer: the
/// layer and its handles share one readiness, so the order does not matter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_taken_before_with_readiness_still_sets_not_serving() {
    shutdown_sets_not_serving(Order::HandleFirst).await;
}

/// Which of `with_readiness` and `shutdown_handle` the server's code calls first.
#[derive(Clone, Copy)]
enum Order {
    ReadinessFirst,
    HandleFirst,
}

async fn shutdown_sets_not_serving(order: Order) {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let mut shutdown: Option<ShutdownHandle> = None;
    let server = start_with(
        admission(),
        DemoConfig::default(),
        false,
        |layer, svc, incoming| {
            let (reporter, health) = tonic_health::server::health_reporter();
            let layer = match order {
                Order::ReadinessFirst => {
                    let layer = layer.with_readiness(reporter, "");
                    shutdown = Some(layer.shutdown_handle());
                    layer
                }
                Order::HandleFirst => {
                    shutdown = Some(layer.shutdown_handle());
                    layer.with_readiness(reporter, "")
                }
            };
            Server::builder()
                .layer(layer)
                .add_service(health)
                .add_service(svc)
                .serve_with_incoming(incoming)
        },
    )
    .await;
    let shutdown = shutdown.unwrap();
    let mut health = HealthClient::new(channel(server.addr).await);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    assert!(shutdown.begin());
    let next = tokio::time::timeout(std::time::Duration::from_secs(10), watch.message())
        .await
        .expect("the health service changed")
        .unwrap()
        .unwrap();
    assert_eq!(next.status(), ServingStatus::NotServing);
    // Then the Watch stream ends (tonic's graceful shutdown waits for every open stream: a
    // watching client would hold it), and the service is no longer known.
    let end = tokio::time::timeout(std::time::Duration::from_secs(10), watch.message())
        .await
        .expect("the Watch stream ended");
    assert!(matches!(end, Ok(None)), "{end:?}");
    let check = health
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(check.code(), tonic::Code::NotFound);
    // The queue answers with pushback as before.
    let mut client = InventoryClient::new(channel(server.addr).await);
    let status = client.reserve(reserve("late", None)).await.unwrap_err();
    assert_eq!(status.message(), MESSAGE_SHUTTING_DOWN);
}
