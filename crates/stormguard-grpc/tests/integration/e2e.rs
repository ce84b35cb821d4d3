//! The interceptor over loopback: the `grpc` crate's channel (0.9) to a tonic server, with
//! a retried call, a server-streaming call retried before it committed, one deadline
//! across attempts, the budget refusing, and what the preview drops of a pushback.

use std::time::Duration;

use crate::support::{
    self, Answer, Scripted, Seen, call, channel, reserve, reserve_request, serve,
};
use grpc::client::CallOptions;
use grpc::client::interceptor::InvokeExt;
use stormguard_core::{BudgetChoice, BudgetConfig, Code, Refusal};
use stormguard_demo::{ReserveReply, StockLevel, WatchStockRequest};
use stormguard_grpc::{ClientConfig, MethodScope, RetryInterceptor, RetryPolicy};
use tokio::time::Instant;

/// Reserve and WatchStock retried on UNAVAILABLE (3 attempts, full jitter from 50 ms), a
/// fixed seed.
fn config() -> ClientConfig {
    let mut config = ClientConfig::default();
    let policy = RetryPolicy {
        idempotent: true,
        ..RetryPolicy::default()
    };
    for method in ["Reserve", "WatchStock"] {
        config.methods.set_retry(
            MethodScope::Method("stormguard.demo.v1.Inventory", method),
            Some(policy.clone()),
        );
    }
    config.seed = Some(7);
    config
}

#[tokio::test]
async fn a_failed_attempt_is_retried_with_its_attempt_number() {
    let inventory = Scripted::default();
    inventory.script([Answer::Fail(tonic::Code::Unavailable, None)]);
    let addr = serve(inventory.clone()).await;
    let interceptor = RetryInterceptor::from_config(&config()).unwrap();
    let stats = interceptor.stats();
    let chan = channel(addr).with_interceptor(interceptor);

    let answer = reserve(&chan, CallOptions::new()).await;

    assert_eq!(answer.code(), Code::Ok);
    assert_eq!(answer.messages.len(), 1);
    assert_eq!(
        answer.messages[0].attempt, 2,
        "the server saw the retry as attempt 2"
    );
    let seen = inventory.take_seen();
    assert_eq!(
        seen.iter().map(|s| s.previous).collect::<Vec<_>>(),
        [0, 1],
        "grpc-previous-rpc-attempts on the retry"
    );
    let s = stats.snapshot();
    assert_eq!((s.logical, s.attempts, s.retries, s.ok), (1, 2, 1, 1));
}

#[tokio::test]
async fn a_server_streaming_call_is_retried_before_it_commits() {
    let inventory = Scripted::default();
    inventory.script([Answer::Fail(tonic::Code::Unavailable, None)]);
    let addr = serve(inventory.clone()).await;
    let interceptor = RetryInterceptor::from_config(&config()).unwrap();
    let chan = channel(addr).with_interceptor(interceptor);
    let request = WatchStockRequest {
        sku: "sku-9".into(),
        count: 3,
        interval_ms: 0,
    };

    let answer =
        call::<_, _, StockLevel>(&chan, support::WATCH, &request, CallOptions::new()).await;

    assert_eq!(answer.code(), Code::Ok);
    assert!(
        answer.headers,
        "the committed attempt's headers reach the caller"
    );
    let seqs: Vec<u32> = answer.messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [0, 1, 2]);
    assert!(
        answer.messages.iter().all(|m| m.sku == "sku-9"),
        "the retry replayed the request"
    );
    assert_eq!(inventory.take_seen().len(), 2);
}

#[tokio::test]
async fn one_deadline_holds_across_attempts() {
    let inventory = Scripted::default();
    // The first attempt fails at once, the retry is never answered.
    inventory.script([Answer::Fail(tonic::Code::Unavailable, None), Answer::Hang]);
    let addr = serve(inventory.clone()).await;
    let interceptor = RetryInterceptor::from_config(&config()).unwrap();
    let stats = interceptor.stats();
    let chan = channel(addr).with_interceptor(interceptor);
    let deadline = Duration::from_millis(400);
    let started = Instant::now();
    let mut options = CallOptions::new();
    options.set_deadline((started + deadline).into_std());

    let answer = reserve(&chan, options).await;
    let took = started.elapsed();

    assert_eq!(answer.code(), Code::DeadlineExceeded);
    assert!(
        took >= deadline,
        "ended at the call's deadline, took {took:?}"
    );
    assert!(
        took < deadline + Duration::from_millis(300),
        "one deadline for both attempts, not one each: took {took:?}"
    );
    let seen = inventory.take_seen();
    assert_eq!(seen.len(), 2);
    let [first, retry] = [&seen[0], &seen[1]].map(|s: &Seen| s.timeout.expect("grpc-timeout sent"));
    assert!(
        first <= deadline && first > deadline - Duration::from_millis(100),
        "{first:?}"
    );
    assert!(
        retry < first,
        "the retry carries what is left: {retry:?} after {first:?}"
    );
    assert_eq!(stats.snapshot().deadline_exceeded, 1);
}

#[tokio::test]
async fn the_budget_refuses_and_the_refusal_is_marked_do_not_retry() {
    let inventory = Scripted::default();
    let addr = serve(inventory.clone()).await;
    let mut config = config();
    // No standing reserve: only successes pay for retries, one per ten.
    config.budget = BudgetChoice::Stormguard(BudgetConfig {
        min_retries_per_second: 0,
        retry_ratio: 0.1,
        ..BudgetConfig::default()
    });
    let interceptor = RetryInterceptor::from_config(&config).unwrap();
    let stats = interceptor.stats();
    let chan = channel(addr).with_interceptor(interceptor);
    let request = reserve_request();
    let reserve =
        || call::<_, _, ReserveReply>(&chan, support::RESERVE, &request, CallOptions::new());

    inventory.script([Answer::Fail(tonic::Code::Unavailable, None)]);
    let refused = reserve().await;
    assert_eq!(refused.code(), Code::Unavailable);
    assert_eq!(
        refused.pushback(),
        Some("-1"),
        "no caller above retries what the budget refused"
    );
    assert_eq!(inventory.take_seen().len(), 1, "the retry was not sent");
    assert_eq!(stats.snapshot().refused(Refusal::Budget), 1);

    // Ten successes mint one retry.
    for _ in 0..10 {
        assert_eq!(reserve().await.code(), Code::Ok);
    }
    inventory.take_seen();
    inventory.script([Answer::Fail(tonic::Code::Unavailable, None)]);
    let paid = reserve().await;
    assert_eq!(paid.code(), Code::Ok);
    assert_eq!(paid.messages[0].attempt, 2);
    assert_eq!(stats.snapshot().refused(Refusal::Budget), 1);
}

/// `grpc` 0.9's transport drops the metadata of a trailers-only answer (the form every
/// tonic handler error and every shed takes): a server's `grpc-retry-pushback-ms: -1`
/// never reaches an interceptor, so the interceptor retries under its other rules (the
/// budget still bounds it). This test fails once a `grpc` release carries the metadata:
/// then docs/grpc.md and this test change (the scripted channel of `parity.rs` shows the
/// interceptor honouring the same answer once it can read it).
#[tokio::test]
async fn grpc_0_9_drops_a_trailers_only_pushback_before_the_interceptor() {
    let inventory = Scripted::default();
    inventory.script([Answer::Fail(tonic::Code::Unavailable, Some("-1"))]);
    let addr = serve(inventory.clone()).await;
    let chan = channel(addr).with_interceptor(RetryInterceptor::from_config(&config()).unwrap());

    let answer = reserve(&chan, CallOptions::new()).await;

    assert_eq!(answer.code(), Code::Ok);
    assert_eq!(
        inventory.take_seen().len(),
        2,
        "the pushback was not seen: retried"
    );
}

/// Dropping the response half cancels the call: the caller's next send fails, whatever the
/// request log still keeps.
#[tokio::test]
async fn a_dropped_call_refuses_further_sends() {
    use grpc::client::{Invoke, SendOptions, SendStream};
    use grpc::core::RequestHeaders;

    let inventory = Scripted::default();
    inventory.script([Answer::Hang]);
    let addr = serve(inventory.clone()).await;
    let chan = channel(addr).with_interceptor(RetryInterceptor::from_config(&config()).unwrap());
    let headers = RequestHeaders::new().with_method_name(support::RESERVE);
    let (mut tx, rx) = chan.invoke(headers, CallOptions::new()).await;
    let request = reserve_request();
    assert_eq!(
        tx.send(&support::Out(&request), SendOptions::new()).await,
        Ok(())
    );
    drop(rx);
    assert_eq!(
        tx.send(&support::Out(&request), SendOptions::new()).await,
        Err(())
    );
}
