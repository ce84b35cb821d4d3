//! Behaviour 7: a caller that cancels or times out while queued frees its slot at once;
//! after 100 000 such calls nothing is leaked.
//!
//! The 100 000-call test drives the tower service directly (no network), on paused
//! time, so it runs in about a second; the network test shows the same over tonic,
//! where the server learns of the caller leaving from an HTTP/2 reset.

use crate::server_support;

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use server_support::{channel, eventually, hold_worker, release, reserve, start};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::WorkerLimit;
use stormguard_server::{
    AdmissionConfig, Occupancy, RetryThreshold, ShedBody, ShedLayer, ShedService, ShedStats,
};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tower::{Layer, Service, ServiceExt};

fn admission(workers: usize, queue: usize) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(workers),
        queue_capacity: queue,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        max_time_queued: Duration::from_secs(3600),
        ..AdmissionConfig::default()
    }
}

/// A handler that waits for a permit from `gate` before answering.
fn gated_handler(
    gate: Arc<Semaphore>,
) -> impl Service<
    http::Request<String>,
    Response = http::Response<String>,
    Error = Infallible,
    Future = impl Future<Output = Result<http::Response<String>, Infallible>> + Send,
> + Clone {
    tower::service_fn(move |_req: http::Request<String>| {
        let gate = Arc::clone(&gate);
        async move {
            gate.acquire().await.expect("gate open").forget();
            Ok::<_, Infallible>(http::Response::new(String::new()))
        }
    })
}

/// A `ShedService` around `gated_handler`, with `N` calls already running in it.
struct Busy<S, const N: usize> {
    service: ShedService<S>,
    stats: ShedStats,
    /// The handler's gate, with no permits yet.
    gate: Arc<Semaphore>,
    /// The running calls, each holding a worker until it gets a permit.
    blockers: [JoinHandle<Result<http::Response<ShedBody<String>>, Infallible>>; N],
}

/// Builds a `ShedLayer` from `config` around `gated_handler`, starts `N` calls and
/// returns once all of them are running.
async fn busy<const N: usize>(
    config: AdmissionConfig,
) -> Busy<
    impl Service<http::Request<String>, Response = http::Response<String>, Error = Infallible> + Clone,
    N,
> {
    let layer = ShedLayer::from_config(&config).expect("config");
    let stats = layer.stats();
    let gate = Arc::new(Semaphore::new(0));
    let service = layer.layer(gated_handler(Arc::clone(&gate)));
    let blockers = std::array::from_fn(|_| tokio::spawn(service.clone().oneshot(request(None))));
    while stats.snapshot().in_flight < N {
        tokio::task::yield_now().await;
    }
    Busy {
        service,
        stats,
        gate,
        blockers,
    }
}

fn request(grpc_timeout: Option<&'static str>) -> http::Request<String> {
    let mut builder = http::Request::builder().uri("/stormguard.demo.v1.Inventory/Reserve");
    if let Some(timeout) = grpc_timeout {
        builder = builder.header("grpc-timeout", timeout);
    }
    builder.body(String::new()).expect("request")
}

/// Polls `future` once and reports whether it was still pending.
async fn poll_once<F: Future + Unpin>(future: &mut F) -> bool {
    std::future::poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut *future).poll(cx).is_pending()))
        .await
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_hundred_thousand_calls_cancelled_or_timed_out_while_queued_leak_nothing() {
    // Both workers busy until the gate opens.
    let Busy {
        mut service,
        stats,
        gate,
        blockers,
    } = busy::<2>(admission(2, 64)).await;

    let (mut dropped, mut timed_out, mut expired) = (0u64, 0u64, 0u64);
    for i in 0..100_000u32 {
        match i % 3 {
            // The caller goes away (an HTTP/2 reset drops the future).
            0 => {
                let mut call = Box::pin(service.ready().await.expect("ready").call(request(None)));
                assert!(poll_once(&mut call).await, "queued");
                assert_eq!(stats.snapshot().queue_depth, 1);
                drop(call);
                dropped += 1;
            }
            // The caller times out (a timeout layer outside drops the future).
            1 => {
                let call = service.ready().await.expect("ready").call(request(None));
                let outcome = tokio::time::timeout(Duration::from_millis(3), call).await;
                assert!(outcome.is_err(), "timed out while queued");
                timed_out += 1;
            }
            // The call's own grpc-timeout runs out: answered DEADLINE_EXCEEDED.
            _ => {
                let call = service
                    .ready()
                    .await
                    .expect("ready")
                    .call(request(Some("5m")));
                let response = call.await.expect("infallible");
                assert_eq!(response.headers()["grpc-status"], "4");
                expired += 1;
            }
        }
        assert_eq!(stats.snapshot().queue_depth, 0, "slot freed at once ({i})");
    }

    let s = stats.snapshot();
    assert_eq!(s.cancelled_queued, dropped + timed_out);
    assert_eq!(s.expired, expired);
    assert_eq!(s.admitted, 2);
    assert_eq!(
        stats.occupancy(),
        Occupancy {
            free_workers: 0,
            waiting: 0,
            unsettled: 0
        }
    );

    gate.add_permits(2);
    for blocker in blockers {
        blocker.await.expect("task").expect("infallible");
    }
    assert_eq!(
        stats.occupancy(),
        Occupancy {
            free_workers: 2,
            waiting: 0,
            unsettled: 0
        }
    );
    // Both workers are really free: two calls run at once without queuing.
    gate.add_permits(2);
    let a = service.ready().await.expect("ready").call(request(None));
    let b = service.ready().await.expect("ready").call(request(None));
    assert_eq!(stats.snapshot().queue_depth, 0);
    a.await.expect("infallible");
    b.await.expect("infallible");
    assert_eq!(stats.snapshot().completed, 4);
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_worker_granted_to_a_caller_that_left_goes_to_the_next() {
    let Busy {
        mut service,
        stats,
        gate,
        blockers: [blocker],
    } = busy(admission(1, 8)).await;
    let mut first = Box::pin(service.ready().await.expect("ready").call(request(None)));
    let mut second = Box::pin(service.ready().await.expect("ready").call(request(None)));
    assert!(poll_once(&mut first).await && poll_once(&mut second).await);
    assert_eq!(stats.snapshot().queue_depth, 2);

    // The blocker finishes: its worker is granted to `first` (FIFO)...
    gate.add_permits(1);
    blocker.await.expect("task").expect("infallible");
    assert_eq!(
        stats.occupancy(),
        Occupancy {
            free_workers: 0,
            waiting: 1,
            unsettled: 1
        }
    );
    // ...whose caller leaves before using it: the worker passes to `second`.
    drop(first);
    assert_eq!(
        stats.occupancy(),
        Occupancy {
            free_workers: 0,
            waiting: 0,
            unsettled: 1
        }
    );
    gate.add_permits(1);
    second.await.expect("infallible");
    assert_eq!(
        stats.occupancy(),
        Occupancy {
            free_workers: 1,
            waiting: 0,
            unsettled: 0
        }
    );
    let s = stats.snapshot();
    assert_eq!((s.admitted, s.completed, s.cancelled_queued), (2, 2, 1));
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_grant_that_comes_after_the_expiry_is_passed_on_not_run() {
    let Busy {
        mut service,
        stats,
        gate,
        blockers: [blocker],
    } = busy(AdmissionConfig {
        min_time_left: Duration::ZERO,
        ..admission(1, 8)
    })
    .await;
    // `late` expires in 10 ms; `patient` has no deadline.
    let mut late = Box::pin(
        service
            .ready()
            .await
            .expect("ready")
            .call(request(Some("10m"))),
    );
    let mut patient = Box::pin(service.ready().await.expect("ready").call(request(None)));
    assert!(poll_once(&mut late).await && poll_once(&mut patient).await);
    // Time passes beyond `late`'s expiry, then the worker frees: the hand-off skips
    // `late` and gives the worker to `patient`.
    tokio::time::advance(Duration::from_millis(20)).await;
    gate.add_permits(2);
    blocker.await.expect("task").expect("infallible");
    let response = late.await.expect("infallible");
    assert_eq!(response.headers()["grpc-status"], "4");
    patient.await.expect("infallible");
    let s = stats.snapshot();
    assert_eq!((s.admitted, s.completed, s.expired), (2, 2, 1));
    assert_eq!(stats.occupancy().free_workers, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callers_that_give_up_while_queued_free_their_slots_over_the_network() {
    let server = start(admission(1, 8), DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let hold = hold_worker(&client, &server.control).await;

    // 40 callers: 8 wait in the queue, the others are shed at once. Which is which is
    // the server's decision, read from its counters, not from how long anything took.
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..40 {
        let mut client = client.clone();
        calls.spawn(async move { client.reserve(reserve("", None)).await });
    }
    let mut shed = 0u64;
    while shed < 32 {
        match calls.join_next().await.expect("a caller").expect("task") {
            Err(status) if status.code() == tonic::Code::Unavailable => shed += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    eventually("8 callers queued", || {
        server.stats.snapshot().queue_depth == 8
    })
    .await;
    // The 8 queued callers give up (client side only, no grpc-timeout sent): dropping
    // their calls resets their HTTP/2 streams.
    assert_eq!(calls.len(), 8);
    calls.shutdown().await;
    // The resets reach the server and every queued slot is freed.
    eventually("queue emptied by resets", || {
        server.stats.snapshot().queue_depth == 0
    })
    .await;
    let s = server.stats.snapshot();
    assert_eq!((s.cancelled_queued, s.shed()), (8, 32), "{s:?}");
    assert_eq!(
        server.stats.occupancy(),
        Occupancy {
            free_workers: 0,
            waiting: 0,
            unsettled: 0
        }
    );
    release(&server.control, hold).await;
    // Nothing left holding a slot: a new call runs at once.
    client
        .clone()
        .reserve(reserve("after", None))
        .await
        .expect("served");
    assert_eq!(server.control.entry_log(), ["hold", "after"]);
    assert_eq!(server.stats.occupancy().free_workers, 1);
}
