//! Hedging over real tonic: a scripted server over an in-memory HTTP/2 connection, the
//! `RetryLayer` with a hedging policy, paused time (so every gap the server sees is exactly
//! what the layer waited: in memory, virtual time moves only when every task waits for a
//! timer, never while a frame is on its way).

#![allow(clippy::unwrap_used)]

use crate::client_support;
use crate::server_support;

use std::sync::Arc;
use std::time::Duration;

use client_support::*;
use stormguard_client::RetryLayer;
use stormguard_core::Budget;
use stormguard_core::Instant;
use stormguard_core::MethodScope;
use stormguard_core::MethodTable;
use stormguard_core::RetryController;
use stormguard_core::{A6Budget, A6BudgetConfig};
use stormguard_core::{BreakerConfig, CircuitBreaker};
use stormguard_core::{Code as CoreCode, CodeSet};
use stormguard_core::{HedgeDelay, HedgingPolicy};
use tonic::Code;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Three copies, 10 ms apart, `UNAVAILABLE` non-fatal.
fn policy() -> HedgingPolicy {
    HedgingPolicy {
        max_attempts: 3,
        delay: HedgeDelay::Fixed(ms(10)),
        non_fatal_codes: CodeSet::single(CoreCode::Unavailable),
        ..HedgingPolicy::default()
    }
}

fn hedging_controller(
    policy: HedgingPolicy,
    budget: Arc<dyn Budget>,
    breaker: Option<CircuitBreaker>,
) -> RetryController {
    let mut table = MethodTable::none();
    table.set_hedging(MethodScope::Default, Some(policy));
    RetryController::new(table, budget, breaker, 7).unwrap()
}

fn layer(policy: HedgingPolicy) -> RetryLayer {
    RetryLayer::new(hedging_controller(policy, budget(100, 0.1), None))
}

fn previous(seen: &Seen) -> Option<&str> {
    seen.previous_attempts.as_deref()
}

#[tokio::test(start_paused = true)]
async fn a_slow_first_copy_is_beaten_by_a_hedge_sent_after_the_delay_and_cancelled() {
    let svc = Scripted::new([Step::slow(ms(1000), Step::Ok)], Step::Ok);
    let layer = layer(policy());
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;

    let started = tokio::time::Instant::now();
    let reply = client.reserve(reserve("a")).await.unwrap();
    assert_eq!(
        started.elapsed(),
        ms(10),
        "answered by the hedge, not after 1 s"
    );
    assert_eq!(reply.get_ref().attempt, 2, "the hedge answered");
    let seen = svc.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[1].at - seen[0].at, ms(10));
    assert_eq!(previous(&seen[0]), None);
    assert_eq!(
        previous(&seen[1]),
        Some("1"),
        "a server sheds hedges as it sheds retries"
    );
    assert_eq!(seen[1].payload, seen[0].payload);
    // The loser's stream was reset: its handler was dropped before it answered.
    tokio::time::sleep(ms(1)).await;
    assert_eq!(svc.cancelled(), 1);
    let s = stats.snapshot();
    assert_eq!(
        (s.logical, s.attempts, s.hedges, s.hedges_won, s.retries),
        (1, 2, 1, 1, 0)
    );
    assert_eq!(s.ok, 1);
}

#[tokio::test(start_paused = true)]
async fn an_answer_before_the_delay_sends_no_hedge() {
    let svc = Scripted::always(Step::slow(ms(9), Step::Ok));
    let layer = layer(policy());
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    for id in ["a", "b", "c"] {
        client.reserve(reserve(id)).await.unwrap();
    }
    assert_eq!(svc.seen().len(), 3);
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.hedges), (3, 0));
}

#[tokio::test(start_paused = true)]
async fn hedges_follow_every_delay_up_to_the_attempt_limit() {
    let slow = || Step::slow(ms(1000), Step::Ok);
    let svc = Scripted::new([slow(), slow(), slow()], Step::Ok);
    let mut client = setup_in_memory(&svc, layer(policy())).await;
    let started = tokio::time::Instant::now();
    client.reserve(reserve("a")).await.unwrap();
    assert_eq!(
        started.elapsed(),
        ms(1000),
        "every copy was slow: the first answer wins"
    );
    let seen = svc.seen();
    assert_eq!(seen.len(), 3, "three copies at most");
    assert_eq!(seen[1].at - seen[0].at, ms(10));
    assert_eq!(seen[2].at - seen[0].at, ms(20));
    assert_eq!(previous(&seen[2]), Some("2"));
    // Each copy tells the server what is left of the call's deadline, when it has one.
}

#[tokio::test(start_paused = true)]
async fn a_non_fatal_status_sends_the_next_copy_at_once() {
    let svc = Scripted::new([Step::Fail(Code::Unavailable)], Step::Ok);
    let layer = layer(HedgingPolicy {
        delay: HedgeDelay::Fixed(ms(500)),
        ..policy()
    });
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    let reply = client.reserve(reserve("a")).await.unwrap();
    assert_eq!(reply.get_ref().attempt, 2);
    let seen = svc.seen();
    assert_eq!(
        seen[1].at - seen[0].at,
        Duration::ZERO,
        "not after the 500 ms delay"
    );
    assert_eq!(stats.snapshot().hedges, 1);
}

#[tokio::test(start_paused = true)]
async fn a_fatal_status_ends_the_call_and_cancels_the_other_copies() {
    // The first copy is slow; the hedge answers INVALID_ARGUMENT, which is fatal.
    let svc = Scripted::new(
        [
            Step::slow(ms(1000), Step::Ok),
            Step::Fail(Code::InvalidArgument),
        ],
        Step::Ok,
    );
    let mut client = setup_in_memory(&svc, layer(policy())).await;
    let started = tokio::time::Instant::now();
    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(started.elapsed(), ms(10));
    tokio::time::sleep(ms(50)).await;
    assert_eq!(svc.seen().len(), 2, "no copy after a fatal answer");
    assert_eq!(svc.cancelled(), 1, "the slow first copy was reset");
}

#[tokio::test(start_paused = true)]
async fn when_every_copy_fails_non_fatally_the_last_failure_is_answered_and_nothing_retries() {
    let svc = Scripted::always(Step::Fail(Code::Unavailable));
    let layer = layer(policy());
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    let status = client.reserve(reserve("a")).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(svc.seen().len(), 3, "the hedges, and no retries after them");
    assert_eq!(
        pushback_of(&status).as_deref(),
        Some("-1"),
        "no layer above should retry it either"
    );
    assert_eq!(stats.snapshot().refused.attempts, 1);
}

#[tokio::test(start_paused = true)]
async fn pushback_minus_one_stops_further_hedges() {
    // The hedge at 10 ms answers "do not retry"; the third copy (due at 20 ms) is not sent
    // and the first copy still answers.
    let svc = Scripted::new(
        [
            Step::slow(ms(100), Step::Ok),
            Step::pushback(Code::Unavailable, "-1"),
        ],
        Step::Ok,
    );
    let layer = layer(policy());
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    let started = tokio::time::Instant::now();
    let reply = client.reserve(reserve("a")).await.unwrap();
    assert_eq!(reply.get_ref().attempt, 1);
    assert_eq!(started.elapsed(), ms(100));
    assert_eq!(svc.seen().len(), 2);
    assert_eq!(
        stats.snapshot().hedges_refused.pushback,
        0,
        "none was due after it"
    );
}

#[tokio::test(start_paused = true)]
async fn pushback_n_puts_the_next_hedge_off_by_n() {
    let svc = Scripted::new(
        [
            Step::slow(ms(1000), Step::Ok),
            Step::pushback(Code::Unavailable, "50"),
        ],
        Step::Ok,
    );
    let mut client = setup_in_memory(&svc, layer(policy())).await;
    let reply = client.reserve(reserve("a")).await.unwrap();
    assert_eq!(reply.get_ref().attempt, 3);
    let seen = svc.seen();
    assert_eq!(seen[1].at - seen[0].at, ms(10));
    assert_eq!(
        seen[2].at - seen[1].at,
        ms(50),
        "the pushback, not the 10 ms delay"
    );
}

#[tokio::test(start_paused = true)]
async fn an_empty_budget_refuses_hedges_and_the_call_waits_for_its_first_copy() {
    // No floor and no successes yet: nothing to pay a hedge with.
    let svc = Scripted::always(Step::slow(ms(200), Step::Ok));
    let layer = RetryLayer::new(hedging_controller(policy(), budget(0, 0.1), None));
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    let started = tokio::time::Instant::now();
    client.reserve(reserve("a")).await.unwrap();
    assert_eq!(
        started.elapsed(),
        ms(200),
        "refused, not queued until the budget fills"
    );
    assert_eq!(svc.seen().len(), 1);
    let s = stats.snapshot();
    assert_eq!((s.hedges, s.hedges_refused.budget), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn hedges_spend_the_upper_half_of_the_retry_budget_and_leave_the_rest_to_retries() {
    // A hundred successes at a ratio of 0.1 mint ten retries. Hedges may spend only down to
    // half of what was minted: five of eight slow calls are hedged (each winner mints 0.1
    // more, not enough for a sixth), and the five left still pay for retries.
    let budget = budget(0, 0.1);
    for _ in 0..100 {
        budget.deposit_at(Instant::now());
    }
    let svc = Scripted::always(Step::slow(ms(100), Step::Ok));
    let layer = RetryLayer::new(hedging_controller(
        HedgingPolicy {
            max_attempts: 2,
            ..policy()
        },
        Arc::clone(&budget),
        None,
    ));
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    for id in ["a", "b", "c", "d", "e", "f", "g", "h"] {
        client.reserve(reserve(id)).await.unwrap();
    }
    let s = stats.snapshot();
    assert_eq!(s.hedges, 5);
    assert_eq!(s.hedges_refused.budget, 3);
    let now = Instant::now();
    assert_eq!((0..10).filter(|_| budget.withdraw_at(now)).count(), 5);
}

#[tokio::test(start_paused = true)]
async fn an_a6_throttle_sends_hedges_only_above_half_its_tokens() {
    let throttle: Arc<dyn Budget> = Arc::new(
        A6Budget::new(A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.1,
        })
        .unwrap(),
    );
    let svc = Scripted::always(Step::slow(ms(100), Step::Ok));
    let layer = RetryLayer::new(hedging_controller(policy(), Arc::clone(&throttle), None));
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    client.reserve(reserve("a")).await.unwrap();
    assert_eq!(
        stats.snapshot().hedges,
        2,
        "a full throttle lets both hedges go"
    );
    // Five failures leave 5 tokens of 10: no longer more than half.
    for _ in 0..5 {
        throttle.record_failure_at(Instant::now());
    }
    client.reserve(reserve("b")).await.unwrap();
    let s = stats.snapshot();
    assert_eq!(s.hedges, 2);
    assert_eq!(s.hedges_refused.budget, 1);
}

#[tokio::test(start_paused = true)]
async fn a_half_open_breaker_lets_the_probe_go_alone() {
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 2,
            open_for: ms(1000),
            open_jitter: 0.0,
            ..BreakerConfig::default()
        },
        3,
    )
    .unwrap();
    let now = Instant::now();
    for _ in 0..4 {
        if let Ok(permit) = breaker.acquire_at(now) {
            permit.failure_at(now);
        }
    }
    tokio::time::advance(ms(1001)).await;
    let svc = Scripted::always(Step::slow(ms(100), Step::Ok));
    let layer = RetryLayer::new(hedging_controller(
        policy(),
        budget(100, 0.1),
        Some(breaker),
    ));
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    client.reserve(reserve("probe")).await.unwrap();
    assert_eq!(svc.seen().len(), 1, "a probe is one copy");
    assert_eq!(stats.snapshot().hedges_refused.breaker, 1);
}

#[tokio::test(start_paused = true)]
async fn the_requests_retry_allowance_pays_for_hedges_too() {
    use stormguard_core::{context::RequestScope, context::request_scope};
    let svc = Scripted::always(Step::slow(ms(100), Step::Ok));
    let layer = layer(policy());
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    // One retry allowed for the whole request: one hedge, not two.
    request_scope(RequestScope::new().with_allowance(1), async {
        client.reserve(reserve("a")).await.unwrap();
    })
    .await;
    let s = stats.snapshot();
    assert_eq!(s.hedges, 1);
    assert_eq!(s.hedges_refused.allowance, 1);
}

#[tokio::test(start_paused = true)]
async fn a_request_too_large_to_replay_is_not_hedged() {
    let svc = Scripted::always(Step::slow(ms(100), Step::Ok));
    let layer = layer(policy()).with_replay_limit(16);
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    let mut request = reserve("big");
    request.payload = vec![7; 1024];
    client.reserve(request).await.unwrap();
    assert_eq!(svc.seen().len(), 1);
    let s = stats.snapshot();
    assert_eq!((s.hedges, s.hedges_refused.replay_limit), (0, 1));
}

#[tokio::test(start_paused = true)]
async fn no_hedge_goes_out_without_time_for_a_useful_attempt() {
    // 12 ms deadline: the hedge due at 10 ms would have 2 ms, under the 5 ms minimum.
    let svc = Scripted::always(Step::slow(ms(100), Step::Ok));
    let layer = layer(policy());
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    let mut request = tonic::Request::new(reserve("a"));
    request.set_timeout(ms(12));
    let status = client.reserve(request).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(svc.seen().len(), 1);
    assert_eq!(stats.snapshot().hedges_refused.deadline, 1);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_ends_every_copy() {
    let svc = Scripted::always(Step::slow(ms(1000), Step::Ok));
    let mut client = setup_in_memory(&svc, layer(policy())).await;
    let mut request = tonic::Request::new(reserve("a"));
    request.set_timeout(ms(100));
    let started = tokio::time::Instant::now();
    let status = client.reserve(request).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded);
    assert_eq!(started.elapsed(), ms(100));
    let seen = svc.seen();
    assert_eq!(seen.len(), 3);
    // Each copy carried what was left of the deadline.
    assert_eq!(seen[1].timeout(), Some(ms(90)));
    assert_eq!(seen[2].timeout(), Some(ms(80)));
    tokio::time::sleep(ms(1)).await;
    assert_eq!(svc.cancelled(), 3);
}

#[tokio::test(start_paused = true)]
async fn a_hedge_whose_response_headers_arrive_first_commits_the_call() {
    let svc = Scripted::new(
        [
            Step::slow(ms(1000), Step::Ok),
            Step::Stream {
                messages: 3,
                then: None,
            },
        ],
        Step::Ok,
    );
    let layer = layer(policy());
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    let mut stream = client
        .watch_stock(stormguard_demo::WatchStockRequest {
            sku: "s".into(),
            count: 3,
            interval_ms: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut got = 0;
    while let Some(level) = stream.message().await.unwrap() {
        assert_eq!(level.seq, got);
        got += 1;
    }
    assert_eq!(got, 3);
    let s = stats.snapshot();
    assert_eq!((s.committed, s.hedges, s.hedges_won, s.ok), (1, 1, 1, 1));
    tokio::time::sleep(ms(1)).await;
    assert_eq!(svc.seen().len(), 2, "no third copy once the call committed");
    assert_eq!(svc.cancelled(), 1);
}

#[tokio::test(start_paused = true)]
async fn each_hedge_goes_to_a_replica_the_call_has_not_used() {
    use stormguard_client::ReplicaConfig;
    use stormguard_client::replicas::Replicas;
    use tower::ServiceBuilder;

    // Three replicas, every attempt slow: the three copies of each call must go to three
    // different replicas.
    let servers: Vec<Scripted> = (0..3)
        .map(|_| Scripted::always(Step::slow(ms(100), Step::Ok)))
        .collect();
    let mut channels = Vec::new();
    for (i, svc) in servers.iter().enumerate() {
        channels.push((i, serve_in_memory(svc.clone()).await));
    }
    let config = ReplicaConfig {
        seed: Some(3),
        ..ReplicaConfig::default()
    };
    let replicas = Replicas::from_services(config, channels).unwrap();
    let layer = layer(policy()).over_replicas();
    let mut client =
        stormguard_demo::InventoryClient::new(ServiceBuilder::new().layer(layer).service(replicas));
    for call in 0..5 {
        client.reserve(reserve(&format!("c{call}"))).await.unwrap();
        for (i, svc) in servers.iter().enumerate() {
            let ids: Vec<_> = svc.seen().into_iter().map(|s| s.request_id).collect();
            let here = ids.iter().filter(|id| **id == format!("c{call}")).count();
            assert_eq!(here, 1, "replica {i} saw call {call} {here} times");
        }
    }
}

fn learned_layer() -> RetryLayer {
    use stormguard_core::LearnedDelay;
    layer(HedgingPolicy {
        max_attempts: 2,
        delay: HedgeDelay::Learned(LearnedDelay {
            min_samples: 20,
            ..LearnedDelay::default()
        }),
        ..policy()
    })
}

#[tokio::test(start_paused = true)]
async fn a_learned_delay_hedges_only_once_it_knows_the_latency_then_at_its_tail() {
    let svc = Scripted::always(Step::slow(ms(2), Step::Ok));
    let layer = learned_layer();
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    // Before 20 samples: no hedge, however slow the call.
    svc.push([Step::slow(ms(300), Step::Ok)]);
    let started = tokio::time::Instant::now();
    client.reserve(reserve("cold")).await.unwrap();
    assert_eq!(started.elapsed(), ms(300));
    assert_eq!(stats.snapshot().hedges, 0);
    // 40 fast calls: the cold one is below the slowest 3 %.
    for i in 0..40 {
        client.reserve(reserve(&format!("warm-{i}"))).await.unwrap();
    }
    // Now the p97 is about 2 ms: a stalled first copy is hedged right after it.
    svc.push([Step::slow(ms(300), Step::Ok)]);
    let started = tokio::time::Instant::now();
    client.reserve(reserve("tail")).await.unwrap();
    let took = started.elapsed();
    assert!(took > ms(2) && took < ms(6), "{took:?}");
    assert_eq!(stats.snapshot().hedges, 1);
}

#[tokio::test(start_paused = true)]
async fn copies_cut_off_by_the_deadline_raise_the_learned_delay_so_a_slowdown_stops_hedging() {
    let svc = Scripted::always(Step::slow(ms(2), Step::Ok));
    let layer = learned_layer();
    let stats = layer.stats();
    let mut client = setup_in_memory(&svc, layer).await;
    for i in 0..40 {
        client.reserve(reserve(&format!("warm-{i}"))).await.unwrap();
    }
    // The server stalls: every copy runs into the 100 ms deadline. No copy finishes, so a
    // delay learned from finished calls would stay at 2 ms and hedge every call; counted
    // for the time they ran, the cut-off copies lift the estimate past the deadline.
    svc.push((0..200).map(|_| Step::slow(ms(1000), Step::Ok)));
    let mut hedged_late = 0;
    for i in 0..60 {
        let before = stats.snapshot().hedges;
        let mut request = tonic::Request::new(reserve(&format!("slow-{i}")));
        request.set_timeout(ms(100));
        let status = client.reserve(request).await.unwrap_err();
        assert_eq!(status.code(), Code::DeadlineExceeded);
        if i >= 40 {
            hedged_late += stats.snapshot().hedges - before;
        }
    }
    assert_eq!(hedged_late, 0, "still hedging 40 calls into the slowdown");
    assert!(
        stats.snapshot().hedges >= 1,
        "the first stalled calls were hedged"
    );
}

#[tokio::test(start_paused = true)]
async fn a_hedge_a_shedding_server_refuses_does_not_fail_the_copy_still_running() {
    use stormguard_server::ShedLayer;
    use tonic::transport::Server;

    // One worker, no queue: while the first copy runs, the hedge is shed on arrival. The
    // policy names no non-fatal code (A6's default), yet the shed answer (the handler never
    // ran) must not end the call: the first copy answers.
    let admission = server_support::one_worker_no_queue();
    let svc = Scripted::always(Step::slow(ms(100), Step::Ok));
    let channel = in_memory(|incoming| {
        tokio::spawn(
            Server::builder()
                .layer(ShedLayer::from_config(&admission).unwrap())
                .add_service(stormguard_demo::InventoryServer::new(svc.clone()))
                .serve_with_incoming(incoming),
        );
    })
    .await;
    let layer = layer(HedgingPolicy {
        non_fatal_codes: CodeSet::EMPTY,
        // Two copies: the hedge is shed while the first copy holds the worker.
        max_attempts: 2,
        ..policy()
    });
    let stats = layer.stats();
    let mut client = client(channel, layer);
    let started = tokio::time::Instant::now();
    let reply = client.reserve(reserve("a")).await.unwrap();
    assert_eq!(started.elapsed(), ms(100));
    assert_eq!(reply.get_ref().attempt, 1, "the first copy answered");
    assert_eq!(
        svc.seen().len(),
        1,
        "the handler ran once: the hedges were shed"
    );
    assert_eq!(stats.snapshot().hedges, 1);
}
