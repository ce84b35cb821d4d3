//! End-to-end: the retry decision of the client layer, over real tonic on loopback.
#![allow(clippy::unwrap_used)]

use crate::client_support;

use std::time::Duration;

use client_support::*;
use stormguard_client::RetryLayer;
use stormguard_core::MethodScope;
use stormguard_core::RetryController;
use stormguard_core::{Code as CoreCode, CodeSet};
use stormguard_core::{MethodTable, RetryPolicy};
use tonic::{Code, Request};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[tokio::test]
async fn n_failures_then_success_is_retried_with_attempt_headers() {
    let svc = Scripted::new(
        [Step::Fail(Code::Unavailable), Step::Fail(Code::Unavailable)],
        Step::Ok,
    );
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let reply = client
        .reserve(reserve("a"))
        .await
        .expect("third attempt succeeds");
    assert_eq!(
        reply.get_ref().attempt,
        3,
        "the server saw the third attempt"
    );
    let seen = svc.seen();
    let attempts: Vec<_> = seen.iter().map(|s| s.previous_attempts.clone()).collect();
    assert_eq!(attempts, [None, Some("1".into()), Some("2".into())]);
    assert!(
        seen.iter().all(|s| s.request_id == "a"),
        "every attempt resends the same request"
    );
    let s = stats.snapshot();
    assert_eq!(
        (s.logical, s.attempts, s.retries, s.ok, s.failed),
        (1, 3, 2, 1, 0)
    );
}

#[tokio::test]
async fn attempt_limit_gives_up_with_do_not_retry_pushback() {
    let svc = Scripted::always(Step::Fail(Code::Unavailable));
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(pushback_of(&status).as_deref(), Some("-1"));
    assert_eq!(svc.seen().len(), 3, "max 3 attempts");
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.refused.attempts, s.failed), (3, 1, 1));
}

#[tokio::test]
async fn a_non_retryable_status_is_returned_at_once_unmarked() {
    let svc = Scripted::always(Step::Fail(Code::InvalidArgument));
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(pushback_of(&status), None, "not a retryable failure: no -1");
    assert_eq!(svc.seen().len(), 1);
    assert_eq!(stats.snapshot().refused.not_retryable, 1);
}

#[tokio::test]
async fn a_method_without_a_retry_policy_is_sent_once() {
    let svc = Scripted::always(Step::Fail(Code::Unavailable));
    let mut methods = MethodTable::none();
    methods.set_retry(MethodScope::Service("other.Service"), Some(quick_policy()));
    let controller = RetryController::new(methods, budget(100, 0.1), None, 1).unwrap();
    let layer = RetryLayer::new(controller);
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(svc.seen().len(), 1);
    assert_eq!(pushback_of(&status), None);
    assert_eq!(stats.snapshot().refused.not_retryable, 1);
}

#[tokio::test]
async fn configured_retryable_codes_are_retried() {
    let svc = Scripted::new([Step::Fail(Code::ResourceExhausted)], Step::Ok);
    let policy = RetryPolicy {
        retryable_codes: [CoreCode::Unavailable, CoreCode::ResourceExhausted]
            .into_iter()
            .collect::<CodeSet>(),
        ..quick_policy()
    };
    let mut client = setup(&svc, RetryLayer::new(controller(policy))).await;
    client.reserve(reserve("a")).await.expect("retried");
    assert_eq!(svc.seen().len(), 2);
}

/// Paused time: the only timer is the retry delay, so the virtual gap between the two
/// attempts the server saw is exactly the delay the client waited.
#[tokio::test(start_paused = true)]
async fn the_delay_is_the_servers_pushback_exactly() {
    // 30 s is far beyond the 2 s backoff cap: only the pushback can explain such a wait.
    let svc = Scripted::new(
        [
            Step::pushback(Code::Unavailable, "30000"),
            Step::pushback(Code::Unavailable, "700"),
        ],
        Step::Ok,
    );
    let mut client = setup(&svc, RetryLayer::new(controller(idempotent_policy()))).await;

    client
        .reserve(reserve("a"))
        .await
        .expect("third attempt succeeds");
    let seen = svc.seen();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[1].at - seen[0].at, ms(30_000));
    assert_eq!(seen[2].at - seen[1].at, ms(700));
}

#[tokio::test(start_paused = true)]
async fn a_zero_pushback_retries_at_once() {
    let svc = Scripted::new([Step::pushback(Code::Unavailable, "0")], Step::Ok);
    let mut client = setup(&svc, RetryLayer::new(controller(idempotent_policy()))).await;

    let reply = client
        .reserve(reserve("a"))
        .await
        .expect("retried at once and succeeded");
    assert_eq!(reply.get_ref().attempt, 2);
    let seen = svc.seen();
    assert_eq!(seen[1].at - seen[0].at, Duration::ZERO);
}

#[tokio::test]
async fn a_negative_pushback_is_not_retried() {
    let svc = Scripted::new([Step::pushback(Code::Unavailable, "-1")], Step::Ok);
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        pushback_of(&status).as_deref(),
        Some("-1"),
        "the server's -1 is passed up"
    );
    assert_eq!(svc.seen().len(), 1);
    assert_eq!(stats.snapshot().refused.pushback, 1);
}

#[tokio::test]
async fn a_garbage_or_repeated_pushback_is_not_retried() {
    for values in [vec!["soon"], vec![""], vec!["1.5"], vec!["5", "5"]] {
        let svc = Scripted::new(
            [Step::Pushback(Code::Unavailable, values.clone())],
            Step::Ok,
        );
        let layer = RetryLayer::new(controller(quick_policy()));
        let stats = layer.stats();
        let mut client = setup(&svc, layer).await;

        let status = client.reserve(reserve("a")).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable, "{values:?}");
        assert_eq!(svc.seen().len(), 1, "{values:?} means do not retry");
        assert_eq!(stats.snapshot().refused.pushback, 1, "{values:?}");
    }
}

#[tokio::test]
async fn a_retry_carries_what_is_left_of_the_deadline() {
    let svc = Scripted::new([Step::pushback(Code::Unavailable, "300")], Step::Ok);
    let mut client = setup(&svc, RetryLayer::new(controller(idempotent_policy()))).await;

    let mut request = Request::new(reserve("a"));
    request.set_timeout(Duration::from_secs(5));
    client.reserve(request).await.expect("retried");
    let seen = svc.seen();
    assert_eq!(seen.len(), 2);
    let first = seen[0]
        .timeout()
        .expect("first attempt carries grpc-timeout");
    let second = seen[1].timeout().expect("the retry carries grpc-timeout");
    assert!(first <= Duration::from_secs(5));
    // Not a fresh timeout: at least the 300 ms pushback has been spent.
    assert!(
        second <= Duration::from_secs(5) - ms(300),
        "retry got {second:?}"
    );
    assert!(second >= Duration::from_secs(1), "retry got {second:?}");
    assert!(second < first);
    assert_eq!(seen[1].previous_attempts.as_deref(), Some("1"));
}

#[tokio::test]
async fn the_layer_default_deadline_applies_to_calls_without_one() {
    let svc = Scripted::always(Step::Ok);
    let layer =
        RetryLayer::new(controller(quick_policy())).with_default_timeout(Duration::from_secs(2));
    let mut client = setup(&svc, layer).await;

    client.reserve(reserve("a")).await.unwrap();
    let mut request = Request::new(reserve("b"));
    request.set_timeout(ms(700));
    client.reserve(request).await.unwrap();
    let seen = svc.seen();
    let t0 = seen[0].timeout().expect("the default deadline is sent");
    assert!(
        t0 <= Duration::from_secs(2) && t0 > Duration::from_secs(1),
        "{t0:?}"
    );
    let t1 = seen[1]
        .timeout()
        .expect("the caller's own deadline is sent");
    assert!(
        t1 <= ms(700),
        "the caller's deadline wins over the default: {t1:?}"
    );
}

#[tokio::test]
async fn a_deadline_in_the_call_context_is_inherited() {
    use stormguard_client::context::{self, CallContext};
    let svc = Scripted::always(Step::Ok);
    let mut client = setup(&svc, RetryLayer::new(controller(quick_policy()))).await;

    let ctx = CallContext::new().with_timeout(Duration::from_secs(3));
    let mut request = Request::new(reserve("a"));
    request.set_timeout(Duration::from_secs(60));
    context::scope(ctx, client.reserve(request)).await.unwrap();
    let t = svc.seen()[0].timeout().unwrap();
    assert!(
        t <= Duration::from_secs(3),
        "the inherited deadline is shorter: {t:?}"
    );
}

/// The client's own deadline running out is final, even when the code the caller would see
/// is configured as retryable (tonic servers answer an expired `grpc-timeout` with
/// CANCELLED).
#[tokio::test]
async fn the_callers_deadline_running_out_is_final() {
    let svc = Scripted::new(
        [Step::slow(
            Duration::from_secs(30),
            Step::Fail(Code::Unavailable),
        )],
        Step::Ok,
    );
    let policy = RetryPolicy {
        retryable_codes: [
            CoreCode::Unavailable,
            CoreCode::Cancelled,
            CoreCode::DeadlineExceeded,
        ]
        .into_iter()
        .collect::<CodeSet>(),
        ..quick_policy()
    };
    let layer = RetryLayer::new(controller(policy));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let mut request = Request::new(reserve("a"));
    request.set_timeout(ms(400));
    let status = client.reserve(request).await.unwrap_err();
    // The server's own timer answers CANCELLED after ours ran out: still DEADLINE_EXCEEDED.
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    let s = stats.snapshot();
    assert_eq!(
        (s.attempts, s.retries),
        (1, 0),
        "no retry after the deadline"
    );
    assert_eq!((s.deadline_exceeded, s.refused.deadline), (1, 0));
    assert_eq!(svc.seen().len(), 1);
}

/// "Slow then fail": the failure is retryable, but the time left cannot hold the pushback
/// plus a useful attempt, so the layer gives up at once and says so with -1.
#[tokio::test]
async fn no_retry_when_the_deadline_leaves_no_room() {
    let svc = Scripted::new(
        [Step::slow(
            ms(300),
            Step::pushback(Code::Unavailable, "5000"),
        )],
        Step::Ok,
    );
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let mut request = Request::new(reserve("a"));
    request.set_timeout(Duration::from_secs(3));
    let status = client.reserve(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(pushback_of(&status).as_deref(), Some("-1"));
    assert_eq!(stats.snapshot().refused.deadline, 1);
    assert_eq!(svc.seen().len(), 1);
}

#[tokio::test]
async fn successes_pay_for_retries_and_an_empty_budget_refuses_with_minus_one() {
    // No standing reserve: only successes mint retries (0.1 each).
    let svc = Scripted::new([Step::Fail(Code::Unavailable)], Step::Ok);
    let controller = RetryController::new(
        MethodTable::uniform(quick_policy()),
        budget(0, 0.1),
        None,
        5,
    )
    .unwrap();
    let budget = controller.budget().clone();
    let layer = RetryLayer::new(controller);
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    let status = client.reserve(reserve("first")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(pushback_of(&status).as_deref(), Some("-1"));
    assert_eq!(stats.snapshot().refused.budget, 1);

    for i in 0..10 {
        client.reserve(reserve(&format!("ok{i}"))).await.unwrap();
    }
    assert!(
        budget.balance() >= 1.0,
        "ten successes mint one retry: {}",
        budget.balance()
    );
    svc.push([Step::Fail(Code::Unavailable)]);
    let reply = client
        .reserve(reserve("paid"))
        .await
        .expect("the deposits pay for one retry");
    assert_eq!(reply.get_ref().attempt, 2);
    assert_eq!(stats.snapshot().refused.budget, 1);
}

#[tokio::test]
async fn an_open_breaker_rejects_the_first_attempt_fast() {
    use stormguard_core::{BreakerConfig, CircuitBreaker};
    let svc = Scripted::always(Step::Fail(Code::Unavailable));
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 4,
            open_for: Duration::from_secs(60),
            ..BreakerConfig::default()
        },
        3,
    )
    .unwrap();
    let controller = RetryController::new(
        MethodTable::uniform(quick_policy()),
        budget(100, 0.1),
        Some(breaker),
        5,
    )
    .unwrap();
    let layer = RetryLayer::new(controller);
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    // Failures until the breaker opens (it may open mid-call, refusing a retry).
    let mut sent_before_open = 0;
    for i in 0..10 {
        let status = client.reserve(reserve(&format!("{i}"))).await.unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        if stats.snapshot().refused.breaker > 0 {
            sent_before_open = svc.seen().len();
            break;
        }
    }
    assert!(sent_before_open >= 4, "the breaker opened after failures");
    let status = client.reserve(reserve("fast")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(pushback_of(&status).as_deref(), Some("-1"));
    assert_eq!(
        svc.seen().len(),
        sent_before_open,
        "rejected without touching the network"
    );
}

#[tokio::test]
async fn connection_refused_is_retried_as_unavailable() {
    // A port with nothing listening: every attempt fails before response headers.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = client(endpoint(addr).connect_lazy(), layer);

    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(pushback_of(&status).as_deref(), Some("-1"));
    let s = stats.snapshot();
    // Never sent: three transparent retries first (free, uncounted), then the three
    // attempts the policy allows.
    assert_eq!(
        (
            s.attempts,
            s.transparent_retries,
            s.retries,
            s.refused.attempts
        ),
        (6, 3, 2, 1)
    );
}

#[tokio::test]
async fn a_connection_reset_before_headers_is_retried_on_a_new_connection() {
    use tonic::codegen::tokio_stream::wrappers::ReceiverStream;
    use tonic::transport::Server;

    // The first connection is accepted and dropped at once; later ones are served.
    let svc = Scripted::always(Step::Ok);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<tokio::net::TcpStream, std::io::Error>>(4);
    tokio::spawn(async move {
        let (first, _) = listener.accept().await.unwrap();
        drop(first);
        loop {
            let accepted = listener.accept().await.map(|(s, _)| s);
            if tx.send(accepted).await.is_err() {
                break;
            }
        }
    });
    tokio::spawn(Server::builder().serve_with_incoming(
        stormguard_demo::InventoryServer::new(svc.clone()),
        ReceiverStream::new(rx),
    ));
    let layer = RetryLayer::new(controller(quick_policy()));
    let stats = layer.stats();
    let mut client = client(endpoint(addr).connect_lazy(), layer);

    client
        .reserve(reserve("a"))
        .await
        .expect("the retry reaches the server");
    assert_eq!(svc.seen().len(), 1, "only the retry reached the handler");
    // The connection never carried the request: the retry is transparent.
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.transparent_retries, s.retries), (2, 1, 0));
}

#[tokio::test]
async fn per_method_policies_from_a_grpc_service_config() {
    use stormguard_core::ClientConfig;
    let json = r#"{"methodConfig":[{"name":[{"service":"stormguard.demo.v1.Inventory","method":"Reserve"}],
        "retryPolicy":{"maxAttempts":2,"initialBackoff":"0.001s","maxBackoff":"0.002s",
        "backoffMultiplier":2,"retryableStatusCodes":["UNAVAILABLE"]}}]}"#;
    let config = ClientConfig::from_service_config_json(json).unwrap();
    let svc = Scripted::always(Step::Fail(Code::Unavailable));
    let layer = RetryLayer::from_config(&config.clone().with_seed(9)).unwrap();
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;

    // Reserve has a policy of 2 attempts.
    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(svc.seen().len(), 2);
    // WatchStock is not named: no policy, one attempt.
    let request = stormguard_demo::WatchStockRequest {
        sku: "s".into(),
        count: 1,
        interval_ms: 0,
    };
    assert!(client.watch_stock(request).await.is_err());
    assert_eq!(svc.seen().len(), 3);
    let s = stats.snapshot();
    assert_eq!((s.refused.attempts, s.refused.not_retryable), (1, 1));
}

#[tokio::test]
async fn a_non_idempotent_method_is_retried_only_when_the_request_was_never_sent() {
    let policy = RetryPolicy {
        idempotent: false,
        ..quick_policy()
    };
    // The server saw the request: not retried.
    let svc = Scripted::new([Step::Fail(Code::Unavailable)], Step::Ok);
    let layer = RetryLayer::new(controller(policy.clone()));
    let stats = layer.stats();
    let mut client = setup(&svc, layer).await;
    assert!(client.reserve(reserve("a")).await.is_err());
    assert_eq!(svc.seen().len(), 1);
    assert_eq!(stats.snapshot().refused.not_idempotent, 1);

    // The connection was refused: the request never left, so it is retried.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let layer = RetryLayer::new(controller(policy));
    let stats = layer.stats();
    let mut refused = client_support::client(endpoint(addr).connect_lazy(), layer);
    assert!(refused.reserve(reserve("b")).await.is_err());
    let s = stats.snapshot();
    assert_eq!(
        (
            s.attempts,
            s.transparent_retries,
            s.refused.attempts,
            s.refused.not_idempotent
        ),
        (6, 3, 1, 0)
    );
}
