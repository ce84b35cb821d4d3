//! Criticality over real tonic: sheddable work is shed first, then retries, then the
//! rest; a full queue gives a critical call the place of a lower-criticality waiter; a
//! peer's claim is capped by the server's table; the client layer stamps the class.

use crate::server_support;

use server_support::{
    ReserveResult, channel, eventually, hold_worker, pushback, reserve, start_with, with_header,
};
use stormguard_client::CriticalityLayer;
use stormguard_core::{Criticality, CriticalityTable};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::WorkerLimit;
use stormguard_server::shed::{MESSAGE_QUEUE_FULL, MESSAGE_SHEDDABLE};
use stormguard_server::{AdmissionConfig, QueueOrder, RetryThreshold};
use tonic::transport::Server;
use tower::ServiceBuilder;

const RESERVE: &str = "/stormguard.demo.v1.Inventory/Reserve";

fn admission() -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 3,
        retry_threshold: RetryThreshold {
            depth: Some(2),
            queue_delay: None,
        },
        queue_order: QueueOrder::Fifo,
        ..AdmissionConfig::default()
    }
}

fn shed_message(result: &ReserveResult) -> &str {
    match result {
        Err(status) if status.code() == tonic::Code::Unavailable => {
            assert!(pushback(status).is_some_and(|p| p != "-1" && p != "0"));
            status.message()
        }
        other => panic!("expected a shed answer, got {other:?}"),
    }
}

/// Runs the scenario against a server whose table is `table`; returns the entry log.
async fn scenario(table: CriticalityTable, critical_granted: bool) -> Vec<String> {
    let server = start_with(
        admission(),
        DemoConfig::default(),
        true,
        |layer, inv, incoming| {
            Server::builder()
                .layer(layer.with_criticality(table))
                .add_service(inv)
                .serve_with_incoming(incoming)
        },
    )
    .await;
    let channel = channel(server.addr).await;
    let client = InventoryClient::new(channel.clone());
    let held = hold_worker(&client, &server.control).await;
    let depth = |n| {
        let stats = server.stats.clone();
        async move { eventually("queue depth", || stats.snapshot().queue_depth == n).await }
    };

    // A call the client layer stamps sheddable, with the only worker busy and nothing
    // queued: shed at once.
    let stamping = CriticalityLayer::new(
        CriticalityTable::default()
            .with_method(RESERVE, Criticality::Sheddable)
            .expect("valid"),
    );
    let mut sheddable =
        InventoryClient::new(ServiceBuilder::new().layer(stamping).service(channel));
    let answer = sheddable.reserve(reserve("s1", None)).await;
    assert_eq!(shed_message(&answer), MESSAGE_SHEDDABLE);

    // A retry still queues below the retry threshold; first attempts fill the queue.
    let send = |request| {
        let mut client = client.clone();
        tokio::spawn(async move { client.reserve(request).await })
    };
    let mut bg = Vec::new();
    let r1 = send(reserve("r1", Some("1")));
    depth(1).await;
    let q1 = send(reserve("q1", None));
    depth(2).await;
    bg.push(send(reserve("q2", None)));
    depth(3).await;

    // Full: between calls of one criticality nothing gives way; a malformed claim is
    // the default class.
    let mut c = client.clone();
    let answer = c.reserve(reserve("q3", None)).await;
    assert_eq!(shed_message(&answer), MESSAGE_QUEUE_FULL);
    let claim = |id| with_header(reserve(id, None), "stormguard-criticality", "CRITICAL");
    let answer = c.reserve(claim("x1")).await;
    assert_eq!(shed_message(&answer), MESSAGE_QUEUE_FULL);

    // A claim of critical, where the server grants it, takes the place of the retry,
    // then of the oldest first attempt; where it does not, it is a default call.
    let claim = |id| with_header(reserve(id, None), "stormguard-criticality", "critical");
    if critical_granted {
        bg.push(send(claim("c1")));
        let r1 = r1.await.expect("task");
        assert_eq!(shed_message(&r1), MESSAGE_SHEDDABLE);
        bg.push(send(claim("c2")));
        let q1 = q1.await.expect("task");
        assert_eq!(shed_message(&q1), MESSAGE_SHEDDABLE);
        depth(3).await;
    } else {
        for id in ["c1", "c2"] {
            let answer = c.reserve(claim(id)).await;
            assert_eq!(shed_message(&answer), MESSAGE_QUEUE_FULL);
        }
        // Nothing left the queue for them.
        assert_eq!(server.stats.snapshot().queue_depth, 3);
        bg.push(r1);
        bg.push(q1);
    }
    let snapshot = server.stats.snapshot();
    let granted = u64::from(critical_granted);
    assert_eq!(snapshot.shed_sheddable, 1, "{snapshot:?}");
    assert_eq!(snapshot.shed_retry, granted, "{snapshot:?}");
    assert_eq!(
        snapshot.shed_first,
        2 + (1 - granted) * 2 + granted,
        "{snapshot:?}"
    );
    assert_eq!(snapshot.shed_displaced, 2 * granted, "{snapshot:?}");

    server.control.open_gate();
    held.await.expect("task").expect("held call served");
    for call in bg {
        call.await.expect("task").expect("queued call served");
    }
    server.control.entry_log()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sheddable_then_retries_then_the_rest_and_critical_only_where_granted() {
    let granted = CriticalityTable::default()
        .with_method(RESERVE, Criticality::Critical)
        .expect("valid");
    assert_eq!(scenario(granted, true).await, ["hold", "q2", "c1", "c2"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_cannot_claim_more_than_the_server_grants() {
    assert_eq!(
        scenario(CriticalityTable::default(), false).await,
        ["hold", "r1", "q1", "q2"]
    );
}
