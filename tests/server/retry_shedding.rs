//! Behaviours 2 and 3: attempt classes from the standard and the older header, malformed
//! values counted as retries; retries shed past the threshold, first attempts only when
//! the queue is full; under 4× overload retries absorb the shedding (on paused time, so
//! the overload run's decisions are the same on every machine).

use crate::server_support;

use std::convert::Infallible;
use std::time::Duration;

use server_support::{Background, channel, eventually, pushback, reserve, start, with_header};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use stormguard_server::WorkerLimit;
use stormguard_server::shed::{MESSAGE_QUEUE_FULL, MESSAGE_RETRY_SHED};
use stormguard_server::{AdmissionConfig, RetryThreshold, ShedLayer};
use tokio::task::JoinSet;
use tonic::Code;
use tower::{Layer, ServiceExt};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_shed_past_the_threshold_and_first_attempts_queue_until_full() {
    let admission = AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 4,
        retry_threshold: RetryThreshold {
            depth: Some(1),
            queue_delay: None,
        },
        ..AdmissionConfig::default()
    };
    let server = start(admission, DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let mut queued = Background::new(&client);

    queued.send(reserve("hold", None));
    server.control.wait_running(1).await;
    // A retry below the threshold waits like anyone else.
    queued.send(reserve("retry-below-threshold", Some("1")));
    eventually("first queued call", || {
        server.stats.snapshot().queue_depth == 1
    })
    .await;

    // Past the threshold, every retry form is answered at once.
    let retries = [
        reserve("r1", Some("1")),
        reserve("r2", Some("7")),
        with_header(reserve("r3", None), "x-retry-attempt", "2"),
        reserve("r4", Some("abc")),
        reserve("r5", Some("-1")),
        reserve("r6", Some("")),
    ];
    for request in retries {
        let status = client
            .clone()
            .reserve(request)
            .await
            .expect_err("retry shed at once");
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(status.message(), MESSAGE_RETRY_SHED);
        assert!(pushback(&status).is_some());
    }
    // First attempts, however marked, still queue.
    queued.send(reserve("f1", Some("0")));
    eventually("f1 queued", || server.stats.snapshot().queue_depth == 2).await;
    queued.send(with_header(reserve("f2", None), "x-retry-attempt", "0"));
    eventually("f2 queued", || server.stats.snapshot().queue_depth == 3).await;
    queued.send(reserve("f3", None));
    eventually("f3 queued", || server.stats.snapshot().queue_depth == 4).await;

    // The queue is full: first attempts are shed too, and so are retries.
    let status = client
        .clone()
        .reserve(reserve("f4", None))
        .await
        .expect_err("queue full");
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(status.message(), MESSAGE_QUEUE_FULL);
    let status = client
        .clone()
        .reserve(reserve("r7", Some("2")))
        .await
        .expect_err("queue full");
    assert_eq!(status.message(), MESSAGE_QUEUE_FULL);

    let stats = server.stats.snapshot();
    assert_eq!((stats.shed_first, stats.shed_retry), (1, 7));

    queued.serve_all(&server.control).await;
    let log = server.control.entry_log();
    assert_eq!(log, ["hold", "retry-below-threshold", "f1", "f2", "f3"]);
    assert_eq!(server.control.counts().entered_retry, 1);
}

/// Offered load 4× capacity, half of it marked as retries (`grpc-previous-rpc-attempts:
/// 1`), driven through the tower service on paused time: the handler takes exactly
/// 10 ms, arrivals come exactly every 10 ms, so every run makes the same decisions.
/// Returns (ok first, ok retry, shed first, shed retry, expired).
async fn overload_run(retry_threshold: RetryThreshold) -> [u64; 5] {
    let layer = ShedLayer::from_config(&AdmissionConfig {
        workers: WorkerLimit::Fixed(2),
        queue_capacity: 16,
        retry_threshold,
        ..AdmissionConfig::default()
    })
    .expect("valid config");
    let stats = layer.stats();
    let service = layer.layer(tower::service_fn(|_req: http::Request<String>| async {
        tokio::time::sleep(Duration::from_millis(10)).await;
        Ok::<_, Infallible>(http::Response::new(String::new()))
    }));
    // Capacity is 2 workers / 10 ms = 2 calls per 10 ms. Offer 8 per 10 ms, half
    // retries, for 1.5 s.
    let mut calls = JoinSet::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    // Shuffled so that neither class is systematically first in a round.
    let mut rng = fastrand::Rng::with_seed(4);
    for _round in 0..150 {
        tick.tick().await;
        let mut classes = [false, true, false, true, false, true, false, true];
        rng.shuffle(&mut classes);
        for retry in classes {
            let mut request = http::Request::new(String::new());
            if retry {
                request
                    .headers_mut()
                    .insert("grpc-previous-rpc-attempts", "1".parse().expect("header"));
            }
            let call = service.clone().oneshot(request);
            calls.spawn(async move { (retry, call.await) });
        }
    }
    let mut out = [0u64; 5];
    while let Some(result) = calls.join_next().await {
        let (retry, response) = result.expect("task");
        let response = response.expect("infallible");
        let status = response
            .headers()
            .get("grpc-status")
            .map(|v| v.to_str().expect("ascii").to_owned());
        let slot = match (status.as_deref(), retry) {
            (None, false) => 0,
            (None, true) => 1,
            // `UNAVAILABLE` with a delay, `RESOURCE_EXHAUSTED` with "do not retry".
            (Some("14" | "8"), false) => 2,
            (Some("14" | "8"), true) => 3,
            (Some("4"), _) => 4,
            (Some(other), _) => panic!("unexpected status {other}"),
        };
        out[slot] += 1;
    }
    let stats = stats.snapshot();
    assert_eq!(stats.shed_first, out[2]);
    assert_eq!(stats.shed_retry, out[3]);
    assert_eq!(stats.completed, out[0] + out[1]);
    out
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn under_four_times_overload_retries_absorb_the_shedding() {
    let shed_first = overload_run(RetryThreshold {
        depth: Some(4),
        queue_delay: None,
    })
    .await;
    let equal = overload_run(RetryThreshold {
        depth: None,
        queue_delay: None,
    })
    .await;
    let share = |r: [u64; 5]| r[0] as f64 / (r[0] + r[1]).max(1) as f64;
    eprintln!(
        "4x overload, half retries [ok_first, ok_retry, shed_first, shed_retry, expired]: \
         retries shed first {shed_first:?} (first-attempt share of goodput {:.3}); \
         no retry threshold {equal:?} (share {:.3})",
        share(shed_first),
        share(equal)
    );
    // Both runs served at capacity (2 per 10 ms over 1.5 s, the queue drained after)
    // and were overloaded.
    for run in [shed_first, equal] {
        assert_eq!(run.iter().sum::<u64>(), 1200, "{run:?}");
        assert!(run[0] + run[1] >= 300, "{run:?}");
        assert!(run[2] + run[3] > run[0] + run[1], "{run:?}");
    }
    // With the retry threshold, first attempts get the capacity...
    assert!(share(shed_first) >= 0.9, "{shed_first:?}");
    // ...and retries take the shedding.
    assert!(shed_first[3] > shed_first[2], "{shed_first:?}");
    // Without it, capacity is split about evenly between the classes.
    assert!((0.3..=0.7).contains(&share(equal)), "{equal:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_are_shed_once_the_oldest_queued_call_has_waited_past_the_delay_threshold() {
    let admission = AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 8,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: Some(Duration::from_secs(1)),
        },
        max_time_queued: Duration::from_secs(30),
        ..AdmissionConfig::default()
    };
    let server = start(admission, DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let mut queued = Background::new(&client);
    queued.send(reserve("hold", None));
    server.control.wait_running(1).await;
    queued.send(reserve("f1", None));
    eventually("f1 queued", || server.stats.snapshot().queue_depth == 1).await;
    // The oldest call has just been queued: a retry still waits.
    queued.send(reserve("r1", Some("1")));
    eventually("r1 queued", || server.stats.snapshot().queue_depth == 2).await;
    // Once the oldest has waited a second, retries are answered at once, whatever the
    // depth, while first attempts still queue.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let status = client
        .clone()
        .reserve(reserve("r2", Some("1")))
        .await
        .expect_err("shed by queue delay");
    assert_eq!(status.message(), MESSAGE_RETRY_SHED);
    queued.send(reserve("f2", None));
    eventually("f2 queued", || server.stats.snapshot().queue_depth == 3).await;
    queued.serve_all(&server.control).await;
    assert_eq!(server.control.entry_log(), ["hold", "f1", "r1", "f2"]);
}
