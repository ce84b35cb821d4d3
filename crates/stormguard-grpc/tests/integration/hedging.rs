//! Hedging through the interceptor over loopback: the `grpc` crate's channel (0.9) to a
//! tonic server, a slow first copy hedged and the faster answer winning, and the budget
//! refusing the hedge.

use crate::support::{
    self, Answer, HEDGE_DELAY, Scripted, a6, call, channel, hedged, reserve, serve,
};
use grpc::client::CallOptions;
use grpc::client::interceptor::InvokeExt;
use stormguard_core::{BudgetChoice, BudgetConfig, Code, Refusal};
use stormguard_demo::{StockLevel, WatchStockRequest};
use stormguard_grpc::ClientConfig;
use stormguard_grpc::{InterceptorStats, RetryInterceptor};
use tokio::time::Instant;

fn interceptor(config: &ClientConfig) -> (RetryInterceptor, InterceptorStats) {
    let interceptor = RetryInterceptor::from_config(config).unwrap();
    let stats = interceptor.stats();
    (interceptor, stats)
}

#[tokio::test]
async fn a_slow_first_copy_is_hedged_and_the_faster_answer_wins() {
    let inventory = Scripted::default();
    inventory.script([Answer::Hang]);
    let addr = serve(inventory.clone()).await;
    let (interceptor, stats) = interceptor(&hedged(a6()));
    let chan = channel(addr).with_interceptor(interceptor);
    let started = Instant::now();

    let answer = reserve(&chan, CallOptions::new()).await;
    let took = started.elapsed();

    assert_eq!(answer.code(), Code::Ok);
    assert!(answer.headers, "the winner's headers reach the caller");
    assert_eq!(answer.messages.len(), 1);
    assert_eq!(
        answer.messages[0].attempt, 2,
        "the hedge answered: the server saw it as attempt 2"
    );
    assert!(took >= HEDGE_DELAY, "the hedge waited its delay: {took:?}");
    let seen = inventory.take_seen();
    assert_eq!(
        seen.iter().map(|s| s.previous).collect::<Vec<_>>(),
        [0, 1],
        "grpc-previous-rpc-attempts on the hedge"
    );
    let s = stats.snapshot();
    assert_eq!(
        (
            s.logical,
            s.attempts,
            s.retries,
            s.hedges,
            s.hedges_won,
            s.ok
        ),
        (1, 2, 0, 1, 1, 1)
    );
}

#[tokio::test]
async fn a_prompt_answer_is_not_hedged() {
    let inventory = Scripted::default();
    let addr = serve(inventory.clone()).await;
    let (interceptor, stats) = interceptor(&hedged(a6()));
    let chan = channel(addr).with_interceptor(interceptor);

    let answer = reserve(&chan, CallOptions::new()).await;

    assert_eq!(answer.code(), Code::Ok);
    assert_eq!(answer.messages[0].attempt, 1);
    assert_eq!(inventory.take_seen().len(), 1);
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.hedges, s.hedges_won), (1, 0, 0));
}

#[tokio::test]
async fn a_server_streaming_call_is_hedged_and_its_messages_come_once() {
    let inventory = Scripted::default();
    inventory.script([Answer::Hang]);
    let addr = serve(inventory.clone()).await;
    let (interceptor, stats) = interceptor(&hedged(a6()));
    let chan = channel(addr).with_interceptor(interceptor);
    let request = WatchStockRequest {
        sku: "sku-4".into(),
        count: 3,
        interval_ms: 0,
    };

    let answer =
        call::<_, _, StockLevel>(&chan, support::WATCH, &request, CallOptions::new()).await;

    assert_eq!(answer.code(), Code::Ok);
    let seqs: Vec<u32> = answer.messages.iter().map(|m| m.seq).collect();
    assert_eq!(seqs, [0, 1, 2], "the winner's messages, once");
    assert!(answer.messages.iter().all(|m| m.sku == "sku-4"));
    assert_eq!(inventory.take_seen().len(), 2);
    assert_eq!(stats.snapshot().hedges_won, 1);
}

#[tokio::test]
async fn the_budget_refusing_stops_the_hedge() {
    let inventory = Scripted::default();
    // Slower than the hedge delay, then OK.
    inventory.script([Answer::After(HEDGE_DELAY * 3)]);
    let addr = serve(inventory.clone()).await;
    // No standing reserve and no success yet: nothing to pay a hedge with.
    let budget = BudgetChoice::Stormguard(BudgetConfig {
        min_retries_per_second: 0,
        ..BudgetConfig::default()
    });
    let (interceptor, stats) = interceptor(&hedged(budget));
    let chan = channel(addr).with_interceptor(interceptor);
    let started = Instant::now();

    let answer = reserve(&chan, CallOptions::new()).await;

    assert_eq!(answer.code(), Code::Ok);
    assert_eq!(answer.messages[0].attempt, 1, "the first copy answered");
    assert!(started.elapsed() >= HEDGE_DELAY * 3);
    assert_eq!(inventory.take_seen().len(), 1, "the hedge was not sent");
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.hedges, s.hedges_won), (1, 0, 0));
    assert_eq!(s.hedges_refused(Refusal::Budget), 1);
}

#[tokio::test]
async fn a_fatal_answer_of_one_copy_ends_the_call() {
    let inventory = Scripted::default();
    // The first copy is slow and the hedge fails with a code that is not non-fatal.
    inventory.script([
        Answer::After(HEDGE_DELAY * 10),
        Answer::Fail(tonic::Code::NotFound, None),
    ]);
    let addr = serve(inventory.clone()).await;
    let (interceptor, stats) = interceptor(&hedged(a6()));
    let chan = channel(addr).with_interceptor(interceptor);
    let started = Instant::now();

    let answer = reserve(&chan, CallOptions::new()).await;

    assert_eq!(answer.code(), Code::NotFound);
    assert!(
        started.elapsed() < HEDGE_DELAY * 10,
        "the slow copy was cancelled, not waited for"
    );
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.hedges, s.failed), (2, 1, 1));
}
