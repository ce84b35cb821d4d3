//! Criticality over real tonic: sheddable work is shed first, then retries, then the
//! rest; a full queue gives a lower-ranked waiter's place to a higher-ranked call; a
//! peer's claim is capped by the server's table; the client layer stamps the class.

mod server_support;

use server_support::{
    ReserveResult, channel, eventually, hold_worker, pushback, reserve, start_with, with_header,
};
use stormguard_client::CriticalityLayer;
use stormguard_core::criticality::{Criticality, CriticalityTable};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::shed::{MESSAGE_QUEUE_FULL, MESSAGE_SHEDDABLE};
use stormguard_server::{AdmissionConfig, QueueOrder, RetryThreshold};
use tonic::transport::Server;
use tower::ServiceBuilder;

const RESERVE: &str = "/stormguard.demo.v1.Inventory/Reserve";

fn admission() -> AdmissionConfig {
    AdmissionConfig {
        workers: 1,
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
    let displaced = send(reserve("r1", Some("1")));
    depth(1).await;
    let oldest_first = send(reserve("q1", None));
    depth(2).await;
    bg.push(send(reserve("q2", None)));
    depth(3).await;

    // Full: a first attempt takes the retry's place; the retry is answered shed.
    bg.push(send(reserve("q3", None)));
    let r1 = displaced.await.expect("task");
    assert_eq!(shed_message(&r1), MESSAGE_SHEDDABLE);
    depth(3).await;

    // Full of first attempts: another one is shed, and so is a malformed claim.
    let mut c = client.clone();
    let answer = c.reserve(reserve("q4", None)).await;
    assert_eq!(shed_message(&answer), MESSAGE_QUEUE_FULL);
    let answer = c
        .reserve(with_header(
            reserve("x1", None),
            "stormguard-criticality",
            "CRITICAL",
        ))
        .await;
    assert_eq!(shed_message(&answer), MESSAGE_QUEUE_FULL);

    // A claim of critical: displaces the oldest first attempt only where granted.
    let claim = with_header(reserve("c1", None), "stormguard-criticality", "critical");
    if critical_granted {
        bg.push(send(claim));
        let q1 = oldest_first.await.expect("task");
        assert_eq!(shed_message(&q1), MESSAGE_SHEDDABLE);
    } else {
        let answer = c.reserve(claim).await;
        assert_eq!(shed_message(&answer), MESSAGE_QUEUE_FULL);
        // Nothing left the queue for it: q1 still waits.
        assert_eq!(server.stats.snapshot().queue_depth, 3);
        bg.push(oldest_first);
    }
    let snapshot = server.stats.snapshot();
    assert_eq!(snapshot.shed_sheddable, 1, "{snapshot:?}");
    assert_eq!(
        snapshot.shed_displaced,
        if critical_granted { 2 } else { 1 }
    );

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
    assert_eq!(scenario(granted, true).await, ["hold", "q2", "q3", "c1"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_cannot_claim_more_than_the_server_grants() {
    assert_eq!(
        scenario(CriticalityTable::default(), false).await,
        ["hold", "q1", "q2", "q3"]
    );
}
