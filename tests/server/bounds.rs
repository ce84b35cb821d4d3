//! Behaviour 1 (bounded workers, bounded queue, memory bounded under any offered load)
//! and behaviour 9 (counters), end to end over tonic on loopback.

use crate::server_support;

use server_support::{channel, reserve, start};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::WorkerLimit;
use stormguard_server::shed::MESSAGE_QUEUE_FULL;
use stormguard_server::{AdmissionConfig, Occupancy, RetryThreshold};
use tokio::task::JoinSet;
use tonic::Code;

fn admission(workers: usize, queue: usize) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(workers),
        queue_capacity: queue,
        retry_threshold: RetryThreshold {
            depth: Some(queue),
            queue_delay: None,
        },
        ..AdmissionConfig::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn workers_and_queue_are_bounded_and_the_excess_is_shed_at_once() {
    let server = start(admission(2, 3), DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);

    // 200 first attempts at once while the 2 workers are held at the gate.
    let mut calls = JoinSet::new();
    for i in 0..200 {
        let mut client = client.clone();
        calls.spawn(async move { client.reserve(reserve(&format!("c{i}"), None)).await });
    }
    // Everything beyond 2 running + 3 queued is answered at once, before any worker
    // frees up: the first 195 answers are all queue-full sheds.
    for _ in 0..195 {
        let status = calls
            .join_next()
            .await
            .expect("a call")
            .expect("task")
            .expect_err("shed while the workers are held");
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), MESSAGE_QUEUE_FULL);
    }
    let held = server.stats.snapshot();
    assert_eq!(held.in_flight, 2);
    assert_eq!(held.queue_depth, 3);
    assert_eq!(held.shed_first, 195);
    assert_eq!(held.admitted, 2);
    assert_eq!(
        server.stats.occupancy(),
        Occupancy {
            free_workers: 0,
            waiting: 3,
            unsettled: 0
        }
    );
    assert_eq!(server.control.counts().running, 2);

    server.control.open_gate();
    while let Some(result) = calls.join_next().await {
        let reply = result.expect("task").expect("queued calls are served");
        assert!(reply.get_ref().reserved);
    }
    let done = server.stats.snapshot();
    assert_eq!(done.admitted, 5);
    assert_eq!(done.completed, 5);
    assert_eq!(done.shed_first + done.shed_retry, 195);
    assert_eq!(done.expired, 0);
    assert_eq!(done.queue_depth, 0);
    assert_eq!(done.in_flight, 0);
    assert_eq!(done.dequeued, 3, "the three queued calls left the queue");
    assert!(done.max_time_queued_us > 0);
    // Never more than `workers` handlers at once.
    assert_eq!(server.control.counts().max_running, 2);
    assert_eq!(server.control.counts().entered, 5);
    assert_eq!(
        server.stats.occupancy(),
        Occupancy {
            free_workers: 2,
            waiting: 0,
            unsettled: 0
        }
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sustained_overload_never_runs_more_than_workers_or_queues_more_than_capacity() {
    let server = start(
        admission(3, 5),
        DemoConfig {
            service_time: std::time::Duration::from_millis(2),
            ..DemoConfig::default()
        },
        false,
    )
    .await;
    let client = InventoryClient::new(channel(server.addr).await);
    let mut calls = JoinSet::new();
    // 64 closed-loop callers against capacity for 8: constant overload.
    for t in 0..64 {
        let mut client = client.clone();
        let stats = server.stats.clone();
        calls.spawn(async move {
            let mut max_depth = 0;
            let (mut ok, mut shed) = (0u64, 0u64);
            for i in 0..30 {
                match client.reserve(reserve(&format!("t{t}-{i}"), None)).await {
                    Ok(_) => ok += 1,
                    Err(status) => {
                        assert_eq!(status.code(), Code::Unavailable, "{status:?}");
                        shed += 1;
                    }
                }
                let s = stats.snapshot();
                max_depth = max_depth.max(s.queue_depth);
                assert!(s.in_flight <= 3, "{s:?}");
            }
            (ok, shed, max_depth)
        });
    }
    let (mut ok, mut shed) = (0, 0);
    while let Some(result) = calls.join_next().await {
        let (o, s, depth) = result.expect("task");
        assert!(depth <= 5, "queue depth {depth} above capacity");
        ok += o;
        shed += s;
    }
    let stats = server.stats.snapshot();
    assert_eq!(ok + shed, 64 * 30);
    assert_eq!(stats.completed, ok);
    assert_eq!(stats.shed(), shed);
    assert!(shed > 0, "the load did overload the server");
    assert!(server.control.counts().max_running <= 3);
    assert_eq!(server.stats.occupancy().free_workers, 3);
}
