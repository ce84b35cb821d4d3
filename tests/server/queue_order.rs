//! Behaviour 6 (discipline): FIFO serves the oldest first; adaptive LIFO serves the
//! newest first once the queue is deep, and the oldest again when it is short.

use crate::server_support;

use server_support::{channel, eventually, reserve, start};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::WorkerLimit;
use stormguard_server::{AdmissionConfig, QueueOrder, RetryThreshold};
use tokio::task::JoinSet;

async fn service_order(queue_order: QueueOrder) -> Vec<String> {
    let admission = AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 8,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        queue_order,
        ..AdmissionConfig::default()
    };
    let server = start(admission, DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let mut calls = JoinSet::new();
    for (i, id) in ["hold", "q1", "q2", "q3", "q4", "q5"]
        .into_iter()
        .enumerate()
    {
        let mut client = client.clone();
        calls.spawn(async move { client.reserve(reserve(id, None)).await });
        if i == 0 {
            server.control.wait_running(1).await;
        } else {
            eventually("queued in order", || {
                server.stats.snapshot().queue_depth == i
            })
            .await;
        }
    }
    server.control.open_gate();
    while let Some(result) = calls.join_next().await {
        result.expect("task").expect("served");
    }
    server.control.entry_log()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifo_serves_the_oldest_first() {
    assert_eq!(
        service_order(QueueOrder::Fifo).await,
        ["hold", "q1", "q2", "q3", "q4", "q5"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adaptive_lifo_serves_the_newest_first_while_the_queue_is_deep() {
    // Depths at each hand-off: 5, 4, 3 (newest first), then 2, 1 (oldest first).
    assert_eq!(
        service_order(QueueOrder::AdaptiveLifo { from_depth: 3 }).await,
        ["hold", "q5", "q4", "q3", "q1", "q2"]
    );
}
