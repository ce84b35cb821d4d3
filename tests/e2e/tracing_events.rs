//! Tracing: what the layers log, and at which level. A healthy service logs nothing at
//! INFO. Each refused retry, shed call, expiry and call the client throttle refuses is a
//! DEBUG event with its details; INFO gets at most one summary a second per layer, with
//! the counts by cause; each transition of a client's circuit breaker is one INFO event. Each attempt's span carries
//! `retry.attempt`, `retry.delay_ms` and `retry.reason`.
//!
//! Every test records with its own subscriber on its own thread (current-thread runtimes:
//! the servers run there too), and asks tracing to look at its callsites again once the
//! subscriber is in place, so that no test sees another's events or misses its own.
#![allow(clippy::unwrap_used)]

use crate::client_support;
use crate::server_support;
use crate::tracing_support;

use std::time::Duration;

use client_support::{Scripted, Step};
use stormguard_client::RetryLayer;
use stormguard_core::RetryController;
use stormguard_core::{BreakerConfig, CircuitBreaker};
use stormguard_core::{MethodTable, RetryPolicy};
use stormguard_demo::server::{DemoConfig, DemoInventory};
use stormguard_demo::{InventoryClient, InventoryServer};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio::time::Instant;
use tonic::Code;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tracing::Level;
use tracing_support::{Logged, Recorder};

const SERVICE: &str = "stormguard.demo.v1.Inventory";

/// A recorder installed as this thread's subscriber until the guard drops.
fn record() -> (Recorder, tracing::subscriber::DefaultGuard) {
    let recorder = Recorder::default();
    let guard = tracing::subscriber::set_default(recorder.clone());
    tracing::callsite::rebuild_interest_cache();
    (recorder, guard)
}

fn number(event: &Logged, key: &str) -> u64 {
    event
        .get(key)
        .unwrap_or_else(|| panic!("{key} missing: {event:?}"))
        .parse()
        .unwrap()
}

#[tokio::test]
async fn info_is_quiet_when_healthy() {
    let (recorder, _guard) = record();

    // Client, healthy: a failure retried once, an application error, successes.
    let svc = Scripted::new(
        [
            Step::Fail(Code::Unavailable),
            Step::Ok,
            Step::Fail(Code::NotFound),
        ],
        Step::Ok,
    );
    let layer = RetryLayer::new(client_support::controller(client_support::quick_policy()));
    let mut client = client_support::setup(&svc, layer).await;
    client.reserve(client_support::reserve("a")).await.unwrap();
    let not_found = client
        .reserve(client_support::reserve("b"))
        .await
        .unwrap_err();
    assert_eq!(not_found.code(), Code::NotFound);
    for i in 0..5 {
        client
            .reserve(client_support::reserve(&format!("c{i}")))
            .await
            .unwrap();
    }
    assert_eq!(
        recorder.take_info().len(),
        0,
        "a healthy client is quiet at INFO"
    );
    let retry_span = recorder
        .spans
        .lock()
        .unwrap()
        .iter()
        .find(|(name, f)| {
            name == "stormguard.attempt" && f.iter().any(|(k, v)| k == "retry.attempt" && v == "1")
        })
        .cloned()
        .unwrap();
    let field = |k: &str| {
        retry_span
            .1
            .iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(field("retry.reason").as_deref(), Some("UNAVAILABLE"));
    let delay: u64 = field("retry.delay_ms").unwrap().parse().unwrap();
    assert!(
        delay <= 5,
        "the retry's backoff delay, at most the cap: {delay}"
    );

    // Server, healthy: nothing at INFO.
    let server = server_support::start(
        server_support::one_worker_no_queue(),
        DemoConfig::default(),
        false,
    )
    .await;
    let plain = InventoryClient::new(server_support::channel(server.addr).await);
    for i in 0..3 {
        plain
            .clone()
            .reserve(server_support::reserve(&format!("ok{i}"), None))
            .await
            .unwrap();
    }
    assert_eq!(
        recorder.take_info().len(),
        0,
        "a healthy server is quiet at INFO"
    );
}

/// Paused time: the only clock that moves is the one the test advances (and the retries'
/// millisecond backoffs).
#[tokio::test(start_paused = true)]
async fn refused_retries_are_each_at_debug_and_summarised_at_info_once_a_second() {
    let (recorder, _guard) = record();
    // Every attempt fails: each call makes 3 attempts and the attempt limit refuses the
    // fourth.
    let svc = Scripted::always(Step::Fail(Code::Unavailable));
    let t0 = Instant::now();
    let layer = RetryLayer::new(client_support::controller(client_support::quick_policy()));
    let mut client = client_support::setup(&svc, layer).await;
    // `n` calls 50 ms apart.
    let mut call = async |n: usize| {
        for i in 0..n {
            let status = client
                .reserve(client_support::reserve(&format!("{i}")))
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::Unavailable);
            tokio::time::advance(Duration::from_millis(50)).await;
        }
    };

    // Nine refusals within the layer's first second: nothing at INFO yet.
    call(9).await;
    let events = recorder.take();
    assert_eq!(
        events.iter().filter(|e| e.level <= Level::INFO).count(),
        0,
        "{events:?}"
    );
    let each = Recorder::with_message(&events, Level::DEBUG, "stormguard: retry refused");
    assert_eq!(each.len(), 9, "every refusal at DEBUG");
    for event in &each {
        assert_eq!(event.get("retry.refused"), Some("attempts"));
        assert_eq!(event.get("retry.attempt"), Some("2"));
        assert_eq!(event.get("rpc.method"), Some(client_support::RESERVE));
        assert_eq!(event.get("stormguard.layer"), Some(SERVICE));
    }

    // The first refusal once the second is over writes one summary: all ten of them.
    tokio::time::sleep_until(t0 + Duration::from_secs(1)).await;
    let t1 = Instant::now();
    call(1).await;
    let events = recorder.take();
    let info: Vec<_> = events.iter().filter(|e| e.level <= Level::INFO).collect();
    assert_eq!(info.len(), 1, "{info:?}");
    let summary = info[0];
    assert_eq!(summary.level, Level::INFO);
    let message = summary.get("message").unwrap();
    assert!(
        message.starts_with("stormguard: 10 retries refused in the last 1."),
        "{message}"
    );
    assert_eq!(number(summary, "refused.attempts"), 10);
    for cause in ["deadline", "breaker", "budget", "allowance"] {
        assert_eq!(number(summary, &format!("refused.{cause}")), 0, "{cause}");
    }
    assert_eq!(summary.get("rpc.method"), Some(client_support::RESERVE));
    assert_eq!(summary.get("stormguard.layer"), Some(SERVICE));
    let window = number(summary, "summary.window_ms");
    assert!((1000..1100).contains(&window), "{window}");
    assert_eq!(
        Recorder::with_message(&events, Level::DEBUG, "stormguard: retry refused").len(),
        1
    );

    // The next second's refusals give the next summary, with their own count.
    call(4).await;
    assert_eq!(recorder.take_info().len(), 0);
    tokio::time::sleep_until(t1 + Duration::from_millis(1100)).await;
    call(1).await;
    let info = recorder.take_info();
    assert_eq!(info.len(), 1, "{info:?}");
    assert_eq!(number(&info[0], "refused.attempts"), 5);
}

#[tokio::test(start_paused = true)]
async fn shed_calls_are_each_at_debug_and_summarised_at_info_once_a_second() {
    let (recorder, _guard) = record();
    let t0 = Instant::now();
    // One worker, held; no queue: every other call is shed on arrival.
    let server = server_support::start(
        server_support::one_worker_no_queue(),
        DemoConfig::default(),
        true,
    )
    .await;
    let plain = InventoryClient::new(server_support::channel(server.addr).await);
    let held = server_support::hold_worker(&plain, &server.control).await;
    // `n` calls 100 ms apart.
    let shed = async |n: usize| {
        for i in 0..n {
            let status = plain
                .clone()
                .reserve(server_support::reserve(&format!("shed{i}"), Some("1")))
                .await
                .unwrap_err();
            // A delay comes with `UNAVAILABLE`; after half a second of shedding without a
            // break, "do not retry" with `RESOURCE_EXHAUSTED`.
            let no_retry = status
                .metadata()
                .get("grpc-retry-pushback-ms")
                .is_some_and(|v| v == "-1");
            let code = if no_retry {
                Code::ResourceExhausted
            } else {
                Code::Unavailable
            };
            assert_eq!(status.code(), code);
            tokio::time::advance(Duration::from_millis(100)).await;
        }
    };

    shed(4).await;
    let events = recorder.take();
    assert_eq!(
        events.iter().filter(|e| e.level <= Level::INFO).count(),
        0,
        "{events:?}"
    );
    let each = Recorder::with_message(&events, Level::DEBUG, "stormguard: call shed");
    assert_eq!(each.len(), 4);
    for event in &each {
        assert_eq!(event.get("rpc.method"), Some(client_support::RESERVE));
        assert_eq!(event.get("stormguard.layer"), Some(SERVICE));
        assert_eq!(event.get("shed.class"), Some("retry"));
        assert_eq!(event.get("shed.reason"), Some("queue_full"));
        assert_eq!(event.get("queue.depth"), Some("0"));
        let pushback: i64 = event.get("pushback_ms").unwrap().parse().unwrap();
        assert!(pushback >= 1 || pushback == -1, "{pushback}");
    }

    tokio::time::sleep_until(t0 + Duration::from_secs(1)).await;
    shed(1).await;
    let info = recorder.take_info();
    assert_eq!(info.len(), 1, "{info:?}");
    let summary = &info[0];
    let message = summary.get("message").unwrap();
    assert!(
        message.starts_with("stormguard: 5 calls shed and 0 expired in the last 1."),
        "{message}"
    );
    assert_eq!(number(summary, "shed.queue_full"), 5);
    assert_eq!(number(summary, "shed.retry_threshold"), 0);
    assert_eq!(number(summary, "expired"), 0);
    assert_eq!(summary.get("rpc.method"), Some(client_support::RESERVE));
    assert_eq!(summary.get("stormguard.layer"), Some(SERVICE));
    server_support::release(&server.control, held).await;
}

/// Serves the demo Inventory (no shed layer) on a loopback port bound before this returns;
/// its fail rate can change while it runs.
async fn demo_server(demo: DemoInventory) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .serve_with_incoming(InventoryServer::new(demo), TcpIncoming::from(listener)),
    );
    addr
}

#[tokio::test(start_paused = true)]
async fn a_breaker_opening_half_opening_and_closing_is_three_info_events() {
    let (recorder, _guard) = record();
    let demo = DemoInventory::new(DemoConfig {
        service_time: Duration::from_millis(1),
        fail_rate: 1.0,
        seed: 3,
    });
    let control = demo.control();
    let addr = demo_server(demo).await;
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 8,
            open_for: Duration::from_secs(5),
            open_jitter: 0.0,
            half_open_probes: 4,
            ..BreakerConfig::default()
        },
        11,
    )
    .unwrap();
    // The default policy does not retry answers of a method that is not idempotent, but
    // counts their UNAVAILABLE for the breaker: one attempt per call.
    let controller = RetryController::new(
        MethodTable::uniform(RetryPolicy::default()),
        client_support::budget(100, 0.1),
        Some(breaker),
        5,
    )
    .unwrap();
    let layer = RetryLayer::new(controller).with_name("inventory-eu");
    let stats = layer.stats();
    let client = client_support::client(client_support::channel(addr).await, layer);
    let calls = |n: usize| {
        let mut set = JoinSet::new();
        for i in 0..n {
            let mut client = client.clone();
            set.spawn(async move {
                client
                    .reserve(client_support::reserve(&format!("{i}")))
                    .await
            });
        }
        set.join_all()
    };

    // The dependency is down: many calls at once, the breaker opens once.
    let failed = calls(32).await;
    assert!(failed.iter().all(|r| r.is_err()));
    let refused = stats.snapshot().refused.breaker;
    let mut one = client.clone();
    one.reserve(client_support::reserve("fast"))
        .await
        .unwrap_err();
    assert_eq!(
        stats.snapshot().refused.breaker,
        refused + 1,
        "the breaker is open"
    );
    let opened = recorder.take_info();
    assert_eq!(opened.len(), 1, "{opened:?}");
    let event = &opened[0];
    assert_eq!(
        event.get("message"),
        Some("stormguard: circuit breaker opened")
    );
    assert_eq!(event.get("stormguard.layer"), Some("inventory-eu"));
    assert_eq!(event.get("breaker.from"), Some("closed"));
    assert_eq!(event.get("breaker.to"), Some("open"));
    assert_eq!(event.get("breaker.failure_rate"), Some("1.0"));
    assert_eq!(number(event, "breaker.open_ms"), 5000);

    // It comes back; once the open period is over, many calls at once again: four probes
    // go through, the others are refused, and the probes' successes close it.
    control.set_fail_rate(0.0);
    tokio::time::advance(Duration::from_secs(5)).await;
    calls(32).await;
    let back = recorder.take_info();
    let messages: Vec<_> = back.iter().map(|e| e.get("message").unwrap()).collect();
    assert_eq!(
        messages,
        [
            "stormguard: circuit breaker half-opened",
            "stormguard: circuit breaker closed"
        ],
        "{back:?}"
    );
    assert_eq!(back[0].get("breaker.from"), Some("open"));
    assert_eq!(back[0].get("breaker.open_ms"), None);
    assert_eq!(back[1].get("breaker.from"), Some("half_open"));
    assert!(
        back.iter()
            .all(|e| e.get("stormguard.layer") == Some("inventory-eu"))
    );

    // Closed: everything goes through, and nothing more is said.
    let ok = calls(16).await;
    assert!(ok.iter().all(|r| r.is_ok()));
    assert_eq!(recorder.take_info().len(), 0);
}

#[tokio::test]
async fn a_replica_ejected_is_logged_once_at_info() {
    use stormguard_client::ReplicaConfig;
    use stormguard_client::replicas::Replicas;
    let (recorder, _guard) = record();
    let bad = Scripted::always(Step::Fail(Code::Unavailable));
    let good = Scripted::always(Step::Ok);
    let bad_addr = client_support::serve(bad.clone()).await;
    let good_addr = client_support::serve(good).await;
    let replicas = Replicas::from_endpoints(
        ReplicaConfig {
            seed: Some(9),
            ..ReplicaConfig::default()
        },
        [bad_addr, good_addr].map(client_support::endpoint),
    )
    .unwrap();
    let layer =
        RetryLayer::new(client_support::controller(client_support::quick_policy())).over_replicas();
    let mut client =
        InventoryClient::new(tower::ServiceBuilder::new().layer(layer).service(replicas));
    // Each call first tries the replica it has not: the bad one gets its share until the
    // fifth failure in a row ejects it.
    let mut i = 0;
    while bad.seen().len() < 5 && i < 2000 {
        client
            .reserve(client_support::reserve(&format!("{i}")))
            .await
            .unwrap();
        i += 1;
    }
    let events = recorder.take_info();
    let ejected = Recorder::with_message(&events, Level::INFO, "stormguard: replica ejected");
    assert_eq!(ejected.len(), 1, "{events:?}");
    assert_eq!(
        ejected[0].get("replica"),
        Some(format!("http://{bad_addr}").as_str())
    );
    assert_eq!(ejected[0].get("reason"), Some("consecutive_failures"));
    assert_eq!(ejected[0].get("ejections"), Some("1"));
}

#[tokio::test(start_paused = true)]
async fn calls_the_throttle_refuses_are_each_at_debug_and_summarised_at_info_once_a_second() {
    let (recorder, _guard) = record();
    // Every call is shed: the throttle soon refuses about nine in ten locally.
    let svc = Scripted::always(Step::pushback(Code::Unavailable, "10"));
    let t0 = Instant::now();
    let throttle = stormguard_core::AdaptiveThrottle::new(
        stormguard_core::AdaptiveThrottleConfig::default(),
        5,
    )
    .unwrap();
    let layer = RetryLayer::new(
        RetryController::new(
            MethodTable::default(),
            client_support::budget(10, 0.1),
            None,
            1,
        )
        .unwrap(),
    )
    .with_adaptive_throttle(throttle);
    let stats = layer.stats();
    let mut client = client_support::setup(&svc, layer).await;
    for i in 0..50 {
        let status = client
            .reserve(client_support::reserve(&format!("{i}")))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        tokio::time::advance(Duration::from_millis(10)).await;
    }
    let refused = stats.snapshot().throttled.default;
    assert!(refused > 30, "{refused}");
    let events = recorder.take();
    assert_eq!(events.iter().filter(|e| e.level <= Level::INFO).count(), 0);
    let each = Recorder::with_message(
        &events,
        Level::DEBUG,
        "stormguard: call rejected by the client throttle",
    );
    assert_eq!(each.len() as u64, refused, "every refusal at DEBUG");
    for event in &each {
        assert_eq!(event.get("throttle.criticality"), Some("default"));
        assert_eq!(event.get("rpc.method"), Some(client_support::RESERVE));
        assert_eq!(event.get("stormguard.layer"), Some(SERVICE));
        assert!(event.get("throttle.probability").is_some());
    }
    // The first refusal once the second is over writes one summary with all of them.
    tokio::time::sleep_until(t0 + Duration::from_secs(1)).await;
    let mut i = 0;
    while stats.snapshot().throttled.default == refused {
        let _ = client
            .reserve(client_support::reserve(&format!("late-{i}")))
            .await;
        i += 1;
    }
    let info = recorder.take_info();
    assert_eq!(info.len(), 1, "{info:?}");
    let message = info[0].get("message").unwrap();
    assert!(
        message.starts_with(&format!(
            "stormguard: {} calls rejected by the client throttle in the last 1.",
            refused + 1
        )),
        "{message}"
    );
    assert_eq!(number(&info[0], "throttled.default"), refused + 1);
    assert_eq!(number(&info[0], "throttled.sheddable"), 0);
    assert_eq!(number(&info[0], "throttled.critical"), 0);
}
