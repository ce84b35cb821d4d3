#![allow(clippy::unwrap_used)]
use super::*;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::{Budget, KeyedBudgets};
use crate::config::ClientConfig;
use crate::deadline::CallTimes;
use crate::wire::code::Code;
use crate::wire::pushback::Pushback;

use super::breaker::BreakerConfig;
use super::policy::{HedgeDelay, HedgingPolicy};
use crate::budget::{A6Budget, A6BudgetConfig};
use crate::budget::{BudgetConfig, RetryBudget};
use crate::wire::code::CodeSet;

const PATH: &str = "/pkg.Svc/Get";

/// The default policy for a method marked idempotent.
fn retried() -> RetryPolicy {
    RetryPolicy {
        idempotent: true,
        ..RetryPolicy::default()
    }
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn budget(floor: u32, ratio: f64) -> Arc<dyn Budget> {
    Arc::new(
        RetryBudget::new(BudgetConfig {
            ttl: Duration::from_secs(10),
            min_retries_per_second: floor,
            retry_ratio: ratio,
            // These tests are about the other checks: a floor lent whatever the answers.
            floor: crate::budget::Floor::Always,
            ..BudgetConfig::default()
        })
        .unwrap(),
    )
}

fn controller(policy: RetryPolicy, budget: Arc<dyn Budget>) -> RetryController {
    RetryController::new(MethodTable::uniform(policy), budget, None, 9).unwrap()
}

fn unavailable() -> Failure {
    Failure::status(Code::Unavailable)
}

#[test]
fn saturated_load_reports_refuse_retries_and_hedges() {
    use super::saturation::{Saturation, SaturationConfig};
    use crate::wire::orca::LoadReport;
    let sat = Arc::new(Saturation::new(SaturationConfig::default()).unwrap());
    let c = controller(retried(), budget(100, 0.5)).with_saturation(Arc::clone(&sat));
    let t0 = Instant::now();
    let report = |utilization, queue| LoadReport {
        utilization,
        rps: 10.0,
        eps: 0.0,
        queue_depth: Some(queue),
    };
    // Unsaturated reports: the retry goes out.
    let mut call = c.begin_at(PATH, None, t0).unwrap();
    call.record_load_report_at(0, &report(0.5, 0.0), t0);
    let v = call.on_attempt_end_at(AttemptEnd::Failed(unavailable()), t0);
    assert!(matches!(v.decision, Decision::Retry { .. }), "{v:?}");
    drop(call);
    // Saturated ones (running at the limit, calls queued): refused, and counted as such.
    let mut call = c.begin_at(PATH, None, t0 + ms(1)).unwrap();
    for _ in 0..3 {
        call.record_load_report_at(0, &report(1.0, 4.0), t0 + ms(1));
    }
    let v = call.on_attempt_end_at(AttemptEnd::Failed(unavailable()), t0 + ms(1));
    assert_eq!(v.decision, Decision::GiveUp(Refusal::Saturated));
    assert!(Refusal::Saturated.is_retryable_but_refused());
    // Over two replicas, one heard from saturated: the other may take the retry.
    let mut call = c.begin_at(PATH, None, t0 + ms(1)).unwrap();
    call.set_endpoints(2);
    let v = call.on_attempt_end_at(AttemptEnd::Failed(unavailable()), t0 + ms(1));
    assert!(matches!(v.decision, Decision::Retry { .. }), "{v:?}");
    drop(call);
    // Another endpoint that is not saturated can take the retry.
    let mut call = c.begin_at(PATH, None, t0 + ms(2)).unwrap();
    call.record_load_report_at(1, &report(0.3, 0.0), t0 + ms(2));
    let v = call.on_attempt_end_at(AttemptEnd::Failed(unavailable()), t0 + ms(2));
    assert!(matches!(v.decision, Decision::Retry { .. }), "{v:?}");
    drop(call);
    // The reports fade: after 4 windows of silence, retries go out again.
    sat.record_at(1, &report(1.0, 4.0), t0 + ms(3));
    sat.record_at(1, &report(1.0, 4.0), t0 + ms(3));
    sat.record_at(1, &report(1.0, 4.0), t0 + ms(3));
    let later = t0 + Duration::from_secs(5);
    let mut call = c.begin_at(PATH, None, later).unwrap();
    let v = call.on_attempt_end_at(AttemptEnd::Failed(unavailable()), later);
    assert!(matches!(v.decision, Decision::Retry { .. }), "{v:?}");
    drop(call);
    // Hedges too.
    let h = hedging(10, CodeSet::EMPTY).with_saturation(Arc::clone(&sat));
    let mut call = h.begin_at(PATH, None, later).unwrap();
    let _ = call.first_attempt_at(later);
    for _ in 0..3 {
        call.record_load_report_at(1, &report(1.0, 4.0), later);
    }
    assert_eq!(call.start_hedge_at(later + ms(10)), Err(Refusal::Saturated));
}

fn hedging(delay: u64, non_fatal: CodeSet) -> RetryController {
    let mut table = MethodTable::none();
    table.set_hedging(
        MethodScope::Default,
        Some(HedgingPolicy {
            max_attempts: 3,
            delay: HedgeDelay::Fixed(ms(delay)),
            non_fatal_codes: non_fatal,
            ..HedgingPolicy::default()
        }),
    );
    RetryController::new(table, budget(100, 0.1), None, 9).unwrap()
}

#[test]
fn hedges_follow_each_delay_until_the_attempt_limit() {
    let c = hedging(10, CodeSet::EMPTY);
    let t0 = Instant::now();
    let mut call = c.begin_at(PATH, Some(t0 + ms(500)), t0).unwrap();
    assert!(call.is_hedged() && call.is_retryable_method());
    let first = call.first_attempt_at(t0);
    assert_eq!(first.previous_attempts, 0);
    assert_eq!(call.next_hedge_at(), Some(t0 + ms(10)));
    let second = call.start_hedge_at(t0 + ms(10)).unwrap();
    assert_eq!(second.previous_attempts, 1);
    assert_eq!(second.grpc_timeout, Some(ms(490)));
    assert_eq!(call.next_hedge_at(), Some(t0 + ms(20)));
    let third = call.start_hedge_at(t0 + ms(20)).unwrap();
    assert_eq!(third.previous_attempts, 2);
    assert_eq!(call.next_hedge_at(), None, "three copies at most");
    assert_eq!(call.start_hedge_at(t0 + ms(30)), Err(Refusal::Attempts));
    assert_eq!(call.hedges_sent(), 3);
}

#[test]
fn a_fatal_answer_ends_the_hedged_call_and_a_non_fatal_one_sends_the_next_copy_now() {
    let c = hedging(10, CodeSet::single(Code::Unavailable));
    let t0 = Instant::now();
    let mut call = c.begin_at(PATH, None, t0).unwrap();
    call.first_attempt_at(t0);
    let failed = |code| AttemptEnd::Failed(Failure::status(code));
    assert_eq!(
        call.on_hedge_end_at(failed(Code::Unavailable), 0, t0 + ms(2)),
        HedgeDecision::Wait
    );
    assert_eq!(call.next_hedge_at(), Some(t0 + ms(2)), "at once");
    call.start_hedge_at(t0 + ms(2)).unwrap();
    assert_eq!(
        call.on_hedge_end_at(failed(Code::NotFound), 0, t0 + ms(3)),
        HedgeDecision::GiveUp(Refusal::NotRetryable)
    );
}

#[test]
fn pushback_stops_or_delays_the_next_hedge() {
    let c = hedging(10, CodeSet::single(Code::Unavailable));
    let t0 = Instant::now();
    let pushed = |p| {
        AttemptEnd::Failed(Failure {
            pushback: Some(p),
            ..unavailable()
        })
    };
    let mut call = c.begin_at(PATH, None, t0).unwrap();
    call.first_attempt_at(t0);
    assert_eq!(
        call.on_hedge_end_at(pushed(Pushback::RetryAfter(ms(40))), 0, t0 + ms(1)),
        HedgeDecision::Wait
    );
    assert_eq!(call.next_hedge_at(), Some(t0 + ms(41)));
    call.start_hedge_at(t0 + ms(41)).unwrap();
    assert_eq!(
        call.next_hedge_at(),
        Some(t0 + ms(51)),
        "later ones follow a delay after"
    );
    // `-1` from one copy while another is in flight: no more copies, wait for it.
    assert_eq!(
        call.on_hedge_end_at(pushed(Pushback::DoNotRetry), 1, t0 + ms(42)),
        HedgeDecision::Wait
    );
    assert_eq!(call.next_hedge_at(), None);
    assert_eq!(call.hedges_stopped(), Some(Refusal::Pushback));
    assert_eq!(
        call.on_hedge_end_at(pushed(Pushback::DoNotRetry), 0, t0 + ms(43)),
        HedgeDecision::GiveUp(Refusal::Pushback)
    );
}

#[test]
fn hedges_are_paid_from_the_retry_budget_and_refused_when_it_is_empty() {
    let mut table = MethodTable::none();
    table.set_hedging(
        MethodScope::Default,
        Some(HedgingPolicy {
            max_attempts: 5,
            delay: HedgeDelay::Fixed(ms(1)),
            ..HedgingPolicy::default()
        }),
    );
    // No floor: eight successes at a ratio of 0.5 mint four retries, whose upper half
    // pays for two hedges.
    let c = RetryController::new(table, budget(0, 0.5), None, 9).unwrap();
    let t0 = Instant::now();
    for _ in 0..8 {
        c.budget().deposit_at(t0);
    }
    let mut call = c.begin_at(PATH, None, t0).unwrap();
    call.first_attempt_at(t0);
    assert!(call.start_hedge_at(t0 + ms(1)).is_ok());
    assert!(call.start_hedge_at(t0 + ms(2)).is_ok());
    assert_eq!(call.start_hedge_at(t0 + ms(3)), Err(Refusal::Budget));
    assert_eq!(call.next_hedge_at(), None, "refused, never queued");
    // The next call finds the budget spent too: its first attempt goes, no hedge.
    let mut call = c.begin_at(PATH, None, t0).unwrap();
    call.first_attempt_at(t0);
    assert_eq!(call.start_hedge_at(t0 + ms(1)), Err(Refusal::Budget));
    assert_eq!(
        c.budget().balance_at(t0),
        2.0,
        "the lower half is left to retries"
    );
}

#[test]
fn an_a6_throttle_lets_hedges_go_only_above_half_its_tokens() {
    let throttle: Arc<dyn Budget> = Arc::new(
        A6Budget::new(A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.1,
        })
        .unwrap(),
    );
    let mut table = MethodTable::none();
    table.set_hedging(MethodScope::Default, Some(HedgingPolicy::default()));
    let c = RetryController::new(table, throttle, None, 9).unwrap();
    let t0 = Instant::now();
    let mut call = c.begin_at(PATH, None, t0).unwrap();
    call.first_attempt_at(t0);
    assert!(call.start_hedge_at(t0 + ms(10)).is_ok(), "full: hedges go");
    // Five failed attempts leave 5 of 10 tokens: not more than half.
    for _ in 0..5 {
        c.budget().record_failure_at(t0);
    }
    let mut call = c.begin_at(PATH, None, t0).unwrap();
    call.first_attempt_at(t0);
    assert_eq!(call.start_hedge_at(t0 + ms(10)), Err(Refusal::Budget));
}

#[test]
fn a_breaker_that_is_not_closed_sends_no_hedge() {
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 2,
            ..BreakerConfig::default()
        },
        3,
    )
    .unwrap();
    let mut table = MethodTable::none();
    table.set_hedging(
        MethodScope::Default,
        Some(HedgingPolicy {
            non_fatal_codes: CodeSet::single(Code::Unavailable),
            ..HedgingPolicy::default()
        }),
    );
    let c = RetryController::new(table, budget(100, 0.1), Some(breaker.clone()), 9).unwrap();
    let t0 = Instant::now();
    let mut call = c.begin_at(PATH, None, t0).unwrap();
    call.first_attempt_at(t0);
    for _ in 0..10 {
        if let Ok(permit) = breaker.acquire_at(t0) {
            permit.failure_at(t0);
        }
    }
    assert!(matches!(breaker.state_at(t0), BreakerState::Open { .. }));
    assert_eq!(call.start_hedge_at(t0 + ms(10)), Err(Refusal::Breaker));
}

#[test]
fn a_learned_delay_sends_no_hedge_until_it_has_samples() {
    let mut table = MethodTable::none();
    table.set_hedging(
        MethodScope::Default,
        Some(HedgingPolicy {
            delay: HedgeDelay::Learned(crate::retry::LearnedDelay {
                min_samples: 10,
                ..Default::default()
            }),
            ..HedgingPolicy::default()
        }),
    );
    let c = RetryController::new(table, budget(100, 0.1), None, 9).unwrap();
    let t0 = Instant::now();
    let mut call = c.begin_at(PATH, None, t0).unwrap();
    call.first_attempt_at(t0);
    assert_eq!(call.next_hedge_at(), None);
    for _ in 0..10 {
        call.record_hedge_latency_at(ms(4), t0);
    }
    let mut call = c.begin_at(PATH, None, t0).unwrap();
    call.first_attempt_at(t0);
    let due = call
        .next_hedge_at()
        .expect("learned")
        .saturating_duration_since(t0);
    assert!(due >= ms(4) && due <= ms(5), "{due:?}");
}

#[test]
fn retries_until_the_attempt_limit() {
    let c = controller(retried(), budget(5, 0.1));
    let now = Instant::now();
    let mut call = c.begin_at(PATH, None, now).unwrap();
    assert_eq!(call.previous_attempts(), 0);
    for n in 1..=2 {
        let Decision::Retry { delay } = call.on_failure_at(&unavailable(), now) else {
            panic!("retry {n} refused");
        };
        call.start_retry_at(now + delay).unwrap();
        assert_eq!(call.previous_attempts(), n);
    }
    assert_eq!(
        call.on_failure_at(&unavailable(), now),
        Decision::GiveUp(Refusal::Attempts)
    );
}

#[test]
fn only_retryable_codes_of_retryable_methods() {
    let mut table = MethodTable::none();
    table.set_retry(MethodScope::Method("pkg.Svc", "Get"), Some(retried()));
    let c = RetryController::new(table, budget(5, 0.1), None, 1).unwrap();
    let now = Instant::now();
    let mut call = c.begin_at(PATH, None, now).unwrap();
    assert!(call.is_retryable_method());
    assert_eq!(
        call.on_failure_at(&Failure::status(Code::Internal), now),
        Decision::GiveUp(Refusal::NotRetryable)
    );
    let mut other = c.begin_at("/pkg.Svc/Put", None, now).unwrap();
    assert!(!other.is_retryable_method());
    assert_eq!(
        other.on_failure_at(&unavailable(), now),
        Decision::GiveUp(Refusal::NotRetryable)
    );
}

#[test]
fn pushback_is_exact_and_restarts_the_backoff() {
    let c = controller(
        RetryPolicy {
            max_attempts: 5,
            ..retried()
        },
        budget(5, 0.1),
    );
    let now = Instant::now();
    let mut call = c.begin_at(PATH, None, now).unwrap();
    // Two backoff steps so the window has grown.
    for _ in 0..2 {
        let Decision::Retry { delay } = call.on_failure_at(&unavailable(), now) else {
            panic!()
        };
        call.start_retry_at(now + delay).unwrap();
    }
    let f = Failure {
        pushback: Some(Pushback::RetryAfter(ms(777))),
        ..unavailable()
    };
    assert_eq!(
        call.on_failure_at(&f, now),
        Decision::Retry { delay: ms(777) }
    );
    call.start_retry_at(now).unwrap();
    // After the pushback the next backoff is drawn from the first window again.
    let Decision::Retry { delay } = call.on_failure_at(&unavailable(), now) else {
        panic!()
    };
    assert!(delay <= ms(50), "backoff did not restart: {delay:?}");
}

#[test]
fn pushback_beyond_the_policy_maximum_is_refused_even_without_a_deadline() {
    let c = controller(
        RetryPolicy {
            max_pushback: Duration::from_secs(10),
            ..retried()
        },
        budget(5, 0.1),
    );
    let now = Instant::now();
    let mut call = c.begin_at(PATH, None, now).unwrap();
    let days = Failure {
        pushback: Some(Pushback::RetryAfter(Duration::from_secs(49 * 24 * 3600))),
        ..unavailable()
    };
    assert_eq!(
        call.on_failure_at(&days, now),
        Decision::GiveUp(Refusal::Pushback)
    );
    let mut call = c.begin_at(PATH, None, now).unwrap();
    let at_max = Failure {
        pushback: Some(Pushback::RetryAfter(Duration::from_secs(10))),
        ..unavailable()
    };
    assert_eq!(
        call.on_failure_at(&at_max, now),
        Decision::Retry {
            delay: Duration::from_secs(10)
        }
    );
}

#[test]
fn pushback_zero_means_retry_now() {
    let c = controller(retried(), budget(5, 0.1));
    let now = Instant::now();
    let mut call = c.begin_at(PATH, None, now).unwrap();
    let f = Failure {
        pushback: Some(Pushback::RetryAfter(Duration::ZERO)),
        ..unavailable()
    };
    assert_eq!(
        call.on_failure_at(&f, now),
        Decision::Retry {
            delay: Duration::ZERO
        }
    );
}

#[test]
fn do_not_retry_pushback_is_final_and_costs_nothing() {
    let b = budget(1, 0.1);
    let c = controller(retried(), Arc::clone(&b));
    let now = Instant::now();
    let before = b.balance_at(now);
    let mut call = c.begin_at(PATH, None, now).unwrap();
    let f = Failure {
        pushback: Some(Pushback::DoNotRetry),
        ..unavailable()
    };
    assert_eq!(
        call.on_failure_at(&f, now),
        Decision::GiveUp(Refusal::Pushback)
    );
    assert_eq!(b.balance_at(now), before);
}

#[test]
fn pushback_longer_than_the_time_left_is_refused() {
    let c = controller(retried(), budget(5, 0.1));
    let now = Instant::now();
    let mut call = c.begin_at(PATH, Some(now + ms(100)), now).unwrap();
    let f = Failure {
        pushback: Some(Pushback::RetryAfter(ms(100))),
        ..unavailable()
    };
    assert_eq!(
        call.on_failure_at(&f, now),
        Decision::GiveUp(Refusal::Deadline)
    );
    let mut call = c.begin_at(PATH, Some(now + ms(100)), now).unwrap();
    let f = Failure {
        pushback: Some(Pushback::RetryAfter(ms(90))),
        ..unavailable()
    };
    assert_eq!(
        call.on_failure_at(&f, now),
        Decision::Retry { delay: ms(90) }
    );
}

#[test]
fn own_deadline_passing_is_final_whatever_the_code() {
    let c = controller(
        RetryPolicy {
            retryable_codes: [Code::Unavailable, Code::Cancelled].into_iter().collect(),
            ..retried()
        },
        budget(5, 0.1),
    );
    let now = Instant::now();
    let mut call = c.begin_at(PATH, Some(now + ms(50)), now).unwrap();
    assert_eq!(
        call.on_failure_at(&Failure::status(Code::Cancelled), now + ms(50)),
        Decision::GiveUp(Refusal::Deadline)
    );
    assert_eq!(call.start_retry_at(now + ms(60)), Err(Refusal::Deadline));
}

#[test]
fn non_idempotent_methods_retry_only_unsent_requests() {
    let c = controller(
        RetryPolicy {
            idempotent: false,
            ..retried()
        },
        budget(5, 0.1),
    );
    let now = Instant::now();
    let mut call = c.begin_at(PATH, None, now).unwrap();
    assert_eq!(
        call.on_failure_at(&unavailable(), now),
        Decision::GiveUp(Refusal::NotIdempotent)
    );
    let mut call = c.begin_at(PATH, None, now).unwrap();
    let unsent = Failure {
        unsent: true,
        ..unavailable()
    };
    assert!(matches!(
        call.on_failure_at(&unsent, now),
        Decision::Retry { .. }
    ));
}

/// A controller whose every method is retried with `policy` and carries a key.
fn keyed_controller(policy: RetryPolicy, seed: u64) -> RetryController {
    let mut table = MethodTable::uniform(policy);
    table.set_idempotency_key(MethodScope::Default, true);
    RetryController::new(table, budget(5, 0.1), None, seed).unwrap()
}

#[test]
fn a_keyed_method_is_retried_after_it_may_have_run() {
    let policy = RetryPolicy {
        idempotent: false,
        ..retried()
    };
    let now = Instant::now();
    let mut call = keyed_controller(policy.clone(), 1)
        .begin_at(PATH, None, now)
        .unwrap();
    assert!(call.is_keyed());
    assert!(matches!(
        call.on_failure_at(&unavailable(), now),
        Decision::Retry { .. }
    ));
    // The same method without a key: the answer may mean it ran, so no retry.
    let mut call = controller(policy, budget(5, 0.1))
        .begin_at(PATH, None, now)
        .unwrap();
    assert!(!call.is_keyed());
    assert!(call.idempotency_key().is_none());
    assert_eq!(
        call.on_failure_at(&unavailable(), now),
        Decision::GiveUp(Refusal::NotIdempotent)
    );
}

#[test]
fn keys_are_drawn_per_call_from_the_seed() {
    let now = Instant::now();
    let keys = |seed| {
        let c = keyed_controller(retried(), seed);
        (0..50)
            .map(|_| {
                *c.begin_at(PATH, None, now)
                    .unwrap()
                    .idempotency_key()
                    .unwrap()
            })
            .collect::<Vec<_>>()
    };
    let a = keys(7);
    assert_eq!(a, keys(7), "a seeded run stamps the same keys");
    assert_ne!(a, keys(8));
    let distinct: std::collections::HashSet<_> = a.iter().collect();
    assert_eq!(distinct.len(), a.len(), "one key per logical call");
    for key in &a {
        assert_eq!(
            crate::wire::parse_idempotency_key([key.as_str().as_bytes()]),
            Ok(Some(key.as_str()))
        );
    }
    // A key does not change the backoff a call draws (the jitter of call `n` is the
    // same with and without keys).
    let delay = |c: RetryController| {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        call.on_failure_at(&unavailable(), now)
    };
    let plain =
        RetryController::new(MethodTable::uniform(retried()), budget(5, 0.1), None, 7).unwrap();
    assert_eq!(delay(keyed_controller(retried(), 7)), delay(plain));
}

#[test]
fn a_keyed_call_waits_out_a_first_run_still_in_progress() {
    let now = Instant::now();
    let policy = RetryPolicy {
        idempotent: false,
        ..retried()
    };
    // ABORTED from a server that did not run the call, with a pushback: its key is in
    // use. Retried after exactly the pushback, though ABORTED is not a retryable code.
    let in_progress = Failure {
        unprocessed: true,
        pushback: Some(Pushback::RetryAfter(ms(40))),
        ..Failure::status(Code::Aborted)
    };
    let mut call = keyed_controller(policy.clone(), 1)
        .begin_at(PATH, None, now)
        .unwrap();
    assert_eq!(
        call.on_failure_at(&in_progress, now),
        Decision::Retry { delay: ms(40) }
    );
    // The application's own ABORTED (it ran) is final, as for any method.
    let mut call = keyed_controller(policy.clone(), 1)
        .begin_at(PATH, None, now)
        .unwrap();
    assert_eq!(
        call.on_failure_at(&Failure::status(Code::Aborted), now),
        Decision::GiveUp(Refusal::NotRetryable)
    );
    // And a method without a key reads the same answer as final.
    let mut call = controller(policy, budget(5, 0.1))
        .begin_at(PATH, None, now)
        .unwrap();
    assert_eq!(
        call.on_failure_at(&in_progress, now),
        Decision::GiveUp(Refusal::NotRetryable)
    );
}

fn refused_stream() -> Failure {
    Failure {
        unsent: true,
        ..unavailable()
    }
}

#[test]
fn an_unsent_attempt_is_retried_transparently_for_free_a_bounded_number_of_times() {
    // A budget that grants nothing and a breaker that opens on two failures of two: a
    // transparent retry needs neither, and records nothing in either.
    let dry = budget(0, 0.001);
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 2,
            failure_rate: 0.5,
            ..BreakerConfig::default()
        },
        3,
    )
    .unwrap();
    let policy = RetryPolicy {
        idempotent: false,
        max_attempts: 2,
        ..retried()
    };
    let c = RetryController::new(
        MethodTable::uniform(policy),
        Arc::clone(&dry),
        Some(breaker),
        1,
    )
    .unwrap();
    let t0 = Instant::now();
    let mut call = c.begin_call_at(PATH, &times(Some(300), None), t0).unwrap();
    call.first_attempt_at(t0);
    for n in 1..=TRANSPARENT_RETRIES {
        let verdict = call.on_attempt_end_at(AttemptEnd::Failed(refused_stream()), t0);
        assert_eq!(
            verdict,
            Verdict {
                decision: Decision::Retry {
                    delay: Duration::ZERO
                },
                attempt_timed_out: false,
                transparent: true,
            },
            "transparent retry {n}"
        );
        let plan = call.start_retry_at(t0).unwrap();
        assert!(plan.transparent);
        assert_eq!(plan.previous_attempts, 0, "not counted as an attempt");
        assert_eq!(call.transparent_retries(), n);
    }
    assert_eq!(dry.balance_at(t0), 0.0, "nothing was withdrawn");
    assert_eq!(
        c.breaker().unwrap().state_at(t0),
        BreakerState::Closed,
        "no failure was recorded"
    );
    // Past the bound an unsent failure is an ordinary one: paid from the budget (here
    // dry), and recorded.
    assert_eq!(
        call.on_attempt_end_at(AttemptEnd::Failed(refused_stream()), t0),
        Verdict {
            decision: Decision::GiveUp(Refusal::Budget),
            attempt_timed_out: false,
            transparent: false,
        }
    );
}

#[test]
fn transparent_retries_leave_the_attempt_limit_to_real_attempts_and_keep_to_the_deadline() {
    let c = controller(
        RetryPolicy {
            max_attempts: 2,
            ..retried()
        },
        budget(5, 0.1),
    );
    let t0 = Instant::now();
    let mut call = c.begin_call_at(PATH, &times(Some(300), None), t0).unwrap();
    call.first_attempt_at(t0);
    let verdict = call.on_attempt_end_at(AttemptEnd::Failed(refused_stream()), t0);
    assert!(verdict.transparent);
    call.start_retry_at(t0).unwrap();
    // The refused attempt did not count: an ordinary failure still has its retry.
    let verdict = call.on_attempt_end_at(AttemptEnd::Failed(unavailable()), t0 + ms(1));
    assert!(!verdict.transparent);
    let Decision::Retry { delay } = verdict.decision else {
        panic!("refused: {verdict:?}");
    };
    let plan = call.start_retry_at(t0 + ms(1) + delay).unwrap();
    assert_eq!((plan.previous_attempts, plan.transparent), (1, false));
    // A transparent retry after it keeps that number, and the limit holds for the next
    // ordinary failure.
    let now = t0 + ms(10);
    assert!(
        call.on_attempt_end_at(AttemptEnd::Failed(refused_stream()), now)
            .transparent
    );
    assert_eq!(call.start_retry_at(now).unwrap().previous_attempts, 1);
    assert_eq!(
        call.on_attempt_end_at(AttemptEnd::Failed(unavailable()), now)
            .decision,
        Decision::GiveUp(Refusal::Attempts)
    );
    // The first attempt kept the caller's own `grpc-timeout`; its transparent retry is
    // a new request and says what is left.
    let mut call = c.begin_call_at(PATH, &times(Some(300), None), t0).unwrap();
    assert_eq!(call.first_attempt_at(t0).grpc_timeout, None);
    call.on_attempt_end_at(AttemptEnd::Failed(refused_stream()), t0 + ms(5));
    let plan = call.start_retry_at(t0 + ms(5)).unwrap();
    assert_eq!(
        (plan.previous_attempts, plan.grpc_timeout),
        (0, Some(ms(295)))
    );
    // Too close to the deadline for a useful attempt: no transparent retry either.
    let mut call = c.begin_call_at(PATH, &times(Some(300), None), t0).unwrap();
    call.first_attempt_at(t0);
    let late = t0 + ms(296);
    assert_eq!(
        call.on_attempt_end_at(AttemptEnd::Failed(refused_stream()), late)
            .decision,
        Decision::GiveUp(Refusal::Deadline)
    );
    // Nor without a copy of the request.
    let mut call = c.begin_call_at(PATH, &times(Some(300), None), t0).unwrap();
    call.first_attempt_at(t0);
    let unbuffered = Failure {
        replayable: false,
        ..refused_stream()
    };
    assert_eq!(
        call.on_attempt_end_at(AttemptEnd::Failed(unbuffered), t0)
            .decision,
        Decision::GiveUp(Refusal::ReplayLimit)
    );
}

#[test]
fn unbuffered_bodies_are_not_replayed() {
    let c = controller(retried(), budget(5, 0.1));
    let now = Instant::now();
    let mut call = c.begin_at(PATH, None, now).unwrap();
    let f = Failure {
        replayable: false,
        ..unavailable()
    };
    assert_eq!(
        call.on_failure_at(&f, now),
        Decision::GiveUp(Refusal::ReplayLimit)
    );
}

#[test]
fn budget_bounds_retries_to_the_ratio_of_successes() {
    // No floor: only successes mint retries, 1 per 10.
    let c = controller(retried(), budget(0, 0.1));
    let now = Instant::now();
    let mut call = c.begin_at(PATH, None, now).unwrap();
    assert_eq!(
        call.on_failure_at(&unavailable(), now),
        Decision::GiveUp(Refusal::Budget)
    );
    for _ in 0..100 {
        c.begin_at(PATH, None, now).unwrap().on_success_at(now);
    }
    let mut granted = Vec::new();
    for _ in 0..100 {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        match call.on_failure_at(&unavailable(), now) {
            // Kept: a granted retry dropped before it starts goes back to the budget.
            Decision::Retry { .. } => granted.push(call),
            other => assert_eq!(other, Decision::GiveUp(Refusal::Budget)),
        }
    }
    assert_eq!(granted.len(), 10);
}

#[test]
fn a_failing_key_spends_its_own_account_not_what_healthy_keys_earned() {
    // Floor 1/s (10 per window per key and shared), ratio 0.1.
    let config = BudgetConfig {
        min_retries_per_second: 1,
        ..BudgetConfig::default()
    };
    let shared: Arc<dyn Budget> = Arc::new(RetryBudget::new(config.clone()).unwrap());
    let c = controller(retried(), shared).with_key_budgets(KeyedBudgets::new(config, 16).unwrap());
    let now = Instant::now();
    // Replicas 1 and 2 answer 500 calls each: 100 retries earned, plus the floor.
    for key in [1, 2] {
        for _ in 0..500 {
            let mut call = c.begin_at(PATH, None, now).unwrap();
            call.set_budget_key(Some(key));
            call.on_success_at(now);
        }
    }
    let retry_after_failure_on = |key| {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        call.set_budget_key(Some(key));
        match call.on_failure_at(&unavailable(), now) {
            Decision::Retry { .. } => {
                // Sent: the grant is spent, not refunded.
                call.start_retry_at(now).unwrap();
                Ok(())
            }
            Decision::GiveUp(r) => Err(r),
            Decision::Expired => unreachable!(),
        }
    };
    // Replica 3 never succeeded: its failures get its floor, then nothing.
    let bad: Vec<_> = (0..50).map(|_| retry_after_failure_on(3)).collect();
    assert_eq!(bad.iter().filter(|r| r.is_ok()).count(), 10);
    assert!(bad[10..].iter().all(|r| *r == Err(Refusal::KeyBudget)));
    // The healthy replicas' failures are still paid.
    let good = (0..40)
        .filter(|_| retry_after_failure_on(1).is_ok())
        .count();
    assert_eq!(good, 40);
    // Without a key, only the shared budget counts (as before).
    let mut call = c.begin_at(PATH, None, now).unwrap();
    assert!(matches!(
        call.on_failure_at(&unavailable(), now),
        Decision::Retry { .. }
    ));
    // A granted retry that never starts goes back to its key.
    drop(call);
    let before = c.key_budgets().unwrap().balance_at(1, now).unwrap();
    let mut call = c.begin_at(PATH, None, now).unwrap();
    call.set_budget_key(Some(1));
    assert!(matches!(
        call.on_failure_at(&unavailable(), now),
        Decision::Retry { .. }
    ));
    assert_eq!(
        c.key_budgets().unwrap().balance_at(1, now).unwrap(),
        before - 1.0
    );
    drop(call);
    assert_eq!(c.key_budgets().unwrap().balance_at(1, now).unwrap(), before);
}

#[test]
fn a6_throttle_counts_failures_and_stops_retries_at_half() {
    let throttle: Arc<dyn Budget> = Arc::new(
        A6Budget::new(A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.1,
        })
        .unwrap(),
    );
    let c = controller(retried(), throttle);
    let now = Instant::now();
    let mut refused_after = None;
    for i in 0..10 {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        if call.on_failure_at(&unavailable(), now) == Decision::GiveUp(Refusal::Budget) {
            refused_after = Some(i);
            break;
        }
    }
    // 10 tokens; each failure costs one; retries stop once tokens <= 5.
    assert_eq!(refused_after, Some(4));
}

#[test]
fn open_breaker_rejects_first_attempts_and_retries() {
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 4,
            failure_rate: 0.5,
            ..BreakerConfig::default()
        },
        3,
    )
    .unwrap();
    let c = RetryController::new(
        MethodTable::uniform(retried()),
        budget(100, 0.1),
        Some(breaker),
        1,
    )
    .unwrap();
    let now = Instant::now();
    let mut refusals = vec![];
    for _ in 0..4 {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        if let Decision::GiveUp(r) = call.on_failure_at(&unavailable(), now) {
            refusals.push(r);
        }
    }
    // The fourth failure opened the breaker: its own retry was refused.
    assert_eq!(refusals, [Refusal::Breaker]);
    assert_eq!(c.begin_at(PATH, None, now).err(), Some(Refusal::Breaker));
}

#[test]
fn only_ok_mints_retries() {
    let b = budget(0, 0.5);
    let c = controller(retried(), Arc::clone(&b));
    let now = Instant::now();
    let answers = [
        Failure::status(Code::NotFound),
        Failure::status(Code::InvalidArgument),
        // A late CANCELLED (tonic's answer to an expired grpc-timeout).
        Failure::status(Code::Cancelled),
        // A shed answer with a code the policy does not retry.
        Failure {
            pushback: Some(Pushback::DoNotRetry),
            ..Failure::status(Code::ResourceExhausted)
        },
        Failure {
            pushback: Some(Pushback::RetryAfter(ms(10))),
            ..Failure::status(Code::ResourceExhausted)
        },
    ];
    for f in answers {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        assert!(matches!(call.on_failure_at(&f, now), Decision::GiveUp(_)));
        c.begin_at(PATH, None, now)
            .unwrap()
            .on_committed_at(f.code, now);
    }
    assert_eq!(b.balance_at(now), 0.0, "no answer but OK mints");
    c.begin_at(PATH, None, now).unwrap().on_success_at(now);
    assert!((b.balance_at(now) - 0.5).abs() < 1e-9);
}

#[test]
fn only_retryable_codes_cost_a6_tokens() {
    let throttle: Arc<dyn Budget> = Arc::new(
        A6Budget::new(A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.5,
        })
        .unwrap(),
    );
    let c = controller(retried(), Arc::clone(&throttle));
    let now = Instant::now();
    // Two failures: 8 tokens, 3 above the threshold.
    for _ in 0..2 {
        c.begin_at(PATH, None, now)
            .unwrap()
            .on_committed_at(Code::Unavailable, now);
    }
    assert!((throttle.balance_at(now) - 3.0).abs() < 1e-9);
    for code in [Code::NotFound, Code::Cancelled, Code::ResourceExhausted] {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        let f = Failure {
            pushback: Some(Pushback::DoNotRetry),
            ..Failure::status(code)
        };
        let _ = call.on_failure_at(&f, now);
    }
    assert!(
        (throttle.balance_at(now) - 3.0).abs() < 1e-9,
        "neither a success nor a failure: {}",
        throttle.balance_at(now)
    );
}

fn breaker(min_requests: u32, failure_rate: f64, probes: u32) -> CircuitBreaker {
    CircuitBreaker::new(
        BreakerConfig {
            min_requests,
            failure_rate,
            half_open_probes: probes,
            open_for: Duration::from_secs(1),
            open_jitter: 0.0,
            ..BreakerConfig::default()
        },
        3,
    )
    .unwrap()
}

#[test]
fn an_overload_answer_is_never_health_for_the_breaker() {
    let c = RetryController::new(
        MethodTable::uniform(retried()),
        budget(100, 0.1),
        Some(breaker(2, 0.6, 1)),
        1,
    )
    .unwrap();
    let now = Instant::now();
    let overload = [
        Failure::status(Code::ResourceExhausted),
        Failure {
            pushback: Some(Pushback::DoNotRetry),
            ..Failure::status(Code::NotFound)
        },
    ];
    let fail = || {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        let _ = call.on_failure_at(&Failure::status(Code::Unavailable), now);
    };
    fail();
    for f in overload {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        let _ = call.on_failure_at(&f, now);
    }
    fail();
    // Two failures of two counted outcomes: open (had the overload answers counted as
    // successes, 2 of 4 would have stayed under 60 %).
    assert_eq!(c.begin_at(PATH, None, now).err(), Some(Refusal::Breaker));
    // An application answer is still a sign of life.
    let c = RetryController::new(
        MethodTable::uniform(retried()),
        budget(100, 0.1),
        Some(breaker(2, 0.6, 1)),
        1,
    )
    .unwrap();
    for code in [
        Code::Unavailable,
        Code::NotFound,
        Code::NotFound,
        Code::Unavailable,
    ] {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        let _ = call.on_failure_at(&Failure::status(code), now);
    }
    assert!(c.begin_at(PATH, None, now).is_ok(), "2 of 4 is under 60 %");
}

#[test]
fn the_callers_own_deadline_does_not_count_for_the_breaker() {
    let c = RetryController::new(
        MethodTable::uniform(RetryPolicy {
            retryable_codes: [Code::Unavailable, Code::DeadlineExceeded]
                .into_iter()
                .collect(),
            ..retried()
        }),
        budget(100, 0.1),
        Some(breaker(2, 0.5, 1)),
        1,
    )
    .unwrap();
    let now = Instant::now();
    for answer in [
        None,
        Some(Failure::status(Code::DeadlineExceeded)),
        Some(Failure::status(Code::Cancelled)),
        None,
    ] {
        let mut call = c.begin_at(PATH, Some(now + ms(5)), now).unwrap();
        call.on_deadline_passed_at(answer.as_ref(), now + ms(5));
    }
    assert!(c.begin_at(PATH, None, now + ms(5)).is_ok());
    // A real failure that arrived with the deadline is recorded as it came.
    for _ in 0..2 {
        let mut call = c.begin_at(PATH, Some(now + ms(5)), now).unwrap();
        call.on_deadline_passed_at(Some(&unavailable()), now + ms(5));
    }
    assert_eq!(
        c.begin_at(PATH, None, now + ms(5)).err(),
        Some(Refusal::Breaker)
    );
}

#[test]
fn a_half_open_probe_is_settled_when_its_call_commits() {
    let c = RetryController::new(
        MethodTable::uniform(retried()),
        budget(100, 0.1),
        Some(breaker(1, 0.5, 1)),
        1,
    )
    .unwrap();
    let now = Instant::now();
    let mut call = c.begin_at(PATH, None, now).unwrap();
    let _ = call.on_failure_at(&unavailable(), now);
    let later = now + Duration::from_secs(2);
    assert_eq!(c.begin_at(PATH, None, now).err(), Some(Refusal::Breaker));
    let mut probe = c.begin_at(PATH, None, later).unwrap();
    probe.on_commit_at(later);
    // The probe's stream is still open, but its slot is free and the breaker closed.
    assert!(c.begin_at(PATH, None, later).is_ok());
    assert!(c.begin_at(PATH, None, later).is_ok());
    probe.on_committed_at(Code::Ok, later + Duration::from_secs(3600));
}

#[test]
fn a_retry_granted_but_never_started_gives_its_token_back() {
    let b = budget(0, 1.0);
    let c = RetryController::new(
        MethodTable::uniform(retried()),
        Arc::clone(&b),
        Some(breaker(5, 0.6, 1)),
        1,
    )
    .unwrap();
    let now = Instant::now();
    c.begin_at(PATH, None, now).unwrap().on_success_at(now);
    c.begin_at(PATH, None, now).unwrap().on_success_at(now);
    assert_eq!(b.balance_at(now), 2.0);
    // The deadline runs out during the delay.
    let mut call = c.begin_at(PATH, Some(now + ms(100)), now).unwrap();
    let Decision::Retry { .. } = call.on_failure_at(&unavailable(), now) else {
        panic!("granted")
    };
    assert_eq!(b.balance_at(now), 1.0);
    assert_eq!(call.start_retry_at(now + ms(100)), Err(Refusal::Deadline));
    assert_eq!(b.balance_at(now), 2.0);
    // The breaker opens during the delay.
    let mut call = c.begin_at(PATH, None, now).unwrap();
    let Decision::Retry { .. } = call.on_failure_at(&unavailable(), now) else {
        panic!("granted")
    };
    // Three failures of five: the breaker opens.
    let mut other = c.begin_at(PATH, None, now).unwrap();
    let _ = other.on_failure_at(&unavailable(), now);
    assert_eq!(call.start_retry_at(now + ms(1)), Err(Refusal::Breaker));
    assert_eq!(b.balance_at(now), 2.0);
    // The caller went away during the delay.
    let c = controller(retried(), Arc::clone(&b));
    let mut call = c
        .begin_at(PATH, None, now + Duration::from_secs(2))
        .unwrap();
    let Decision::Retry { .. } = call.on_failure_at(&unavailable(), now + Duration::from_secs(2))
    else {
        panic!("granted")
    };
    drop(call);
    drop(other);
    assert_eq!(b.balance_at(now + Duration::from_secs(2)), 2.0);
    // A retry that starts keeps its token.
    let mut call = c
        .begin_at(PATH, None, now + Duration::from_secs(2))
        .unwrap();
    let _ = call.on_failure_at(&unavailable(), now + Duration::from_secs(2));
    call.start_retry_at(now + Duration::from_secs(2)).unwrap();
    drop(call);
    assert_eq!(b.balance_at(now + Duration::from_secs(2)), 1.0);
}

#[test]
fn committed_outcomes_are_recorded_without_a_decision() {
    let throttle: Arc<dyn Budget> = Arc::new(
        A6Budget::new(A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.5,
        })
        .unwrap(),
    );
    let c = controller(retried(), Arc::clone(&throttle));
    let now = Instant::now();
    // The balance is tokens above maxTokens / 2: 5 when full.
    assert!((throttle.balance_at(now) - 5.0).abs() < 1e-9);
    // A stream that failed in its trailers costs a token, like a failed attempt.
    c.begin_at(PATH, None, now)
        .unwrap()
        .on_committed_at(Code::Unavailable, now);
    assert!((throttle.balance_at(now) - 4.0).abs() < 1e-9);
    // One that ended OK pays it back in part.
    c.begin_at(PATH, None, now)
        .unwrap()
        .on_committed_at(Code::Ok, now);
    assert!((throttle.balance_at(now) - 4.5).abs() < 1e-9);
}

#[test]
fn from_config_builds_the_named_budget_and_breaker() {
    let json = r#"{"retryThrottling": {"maxTokens": 4, "tokenRatio": 0.1},
            "methodConfig": [{"name": [{}], "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.1s",
            "maxBackoff": "1s", "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}"#;
    let config = ClientConfig::from_service_config_json(json).unwrap();
    let c = RetryController::from_config(&config.clone().with_seed(1)).unwrap();
    let now = Instant::now();
    // An A6 throttle of 4 tokens: 2 above the threshold.
    assert!((c.budget().balance_at(now) - 2.0).abs() < 1e-9);
    assert!(c.breaker().is_none());
    let mut with_breaker = ClientConfig::default();
    with_breaker.breaker = Some(BreakerConfig::default());
    assert!(
        RetryController::from_config(&with_breaker.clone().with_seed(1))
            .unwrap()
            .breaker()
            .is_some()
    );
    let mut bad = ClientConfig::default();
    bad.breaker = Some(BreakerConfig {
        failure_rate: 0.0,
        ..BreakerConfig::default()
    });
    assert!(RetryController::from_config(&bad.clone().with_seed(1)).is_err());
}

#[test]
fn an_attempt_timeout_is_a_retryable_failure_whatever_the_codes() {
    let throttle: Arc<dyn Budget> = Arc::new(
        A6Budget::new(A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.1,
        })
        .unwrap(),
    );
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 2,
            failure_rate: 0.5,
            ..BreakerConfig::default()
        },
        3,
    )
    .unwrap();
    let policy = RetryPolicy {
        // DEADLINE_EXCEEDED is not among them: the timeout is retried anyway.
        retryable_codes: CodeSet::single(Code::Unavailable),
        per_attempt_timeout: Some(ms(50)),
        ..retried()
    };
    let c = RetryController::new(
        MethodTable::uniform(policy),
        Arc::clone(&throttle),
        Some(breaker),
        1,
    )
    .unwrap();
    let now = Instant::now();
    let mut call = c.begin_at(PATH, Some(now + ms(500)), now).unwrap();
    assert_eq!(call.per_attempt_timeout(), Some(ms(50)));
    let timeout = Failure::status(Code::Cancelled);
    assert!(matches!(
        call.on_attempt_timeout_at(&timeout, now + ms(50)),
        Decision::Retry { .. }
    ));
    // It cost a token, as a failure does.
    assert!((throttle.balance_at(now) - 4.0).abs() < 1e-9);
    call.start_retry_at(now + ms(60)).unwrap();
    // The second timeout opens the breaker (2 failures of 2): its retry is refused.
    assert_eq!(
        call.on_attempt_timeout_at(&timeout, now + ms(110)),
        Decision::GiveUp(Refusal::Breaker)
    );
    // Not idempotent: the attempt may have done the work.
    let c = controller(
        RetryPolicy {
            idempotent: false,
            per_attempt_timeout: Some(ms(50)),
            ..retried()
        },
        budget(5, 0.1),
    );
    let mut call = c.begin_at(PATH, None, now).unwrap();
    assert_eq!(
        call.on_attempt_timeout_at(&timeout, now + ms(50)),
        Decision::GiveUp(Refusal::NotIdempotent)
    );
}

#[tokio::test]
async fn the_requests_allowance_is_spent_last_and_given_back_when_unused() {
    use crate::context;
    use crate::context::RequestScope;
    let now = Instant::now();
    let failure = Failure::status(Code::Unavailable);
    // A budget that grants nothing: the allowance it was about to spend comes back.
    let dry = budget(0, 0.001);
    let c = RetryController::new(MethodTable::uniform(retried()), dry, None, 1).unwrap();
    let left = context::request_scope(RequestScope::new().with_allowance(1), async {
        let mut call = c.begin_at(PATH, None, now).unwrap();
        let d = call.on_failure_at(&failure, now);
        (d, context::remaining_allowance())
    })
    .await;
    assert_eq!(left, (Decision::GiveUp(Refusal::Budget), Some(1)));

    // With a budget: a granted retry dropped before it started gives its allowance
    // back; then each retry spends one, and the one after the last is refused.
    let five = RetryPolicy {
        max_attempts: 5,
        ..retried()
    };
    let c = RetryController::new(MethodTable::uniform(five), budget(100, 0.1), None, 1).unwrap();
    let seen = context::request_scope(RequestScope::new().with_allowance(2), async {
        let mut dropped = c.begin_at(PATH, None, now).unwrap();
        assert!(matches!(
            dropped.on_failure_at(&failure, now),
            Decision::Retry { .. }
        ));
        let while_granted = context::remaining_allowance();
        drop(dropped);
        let after_drop = context::remaining_allowance();
        let mut call = c.begin_at(PATH, None, now).unwrap();
        for _ in 0..2 {
            assert!(matches!(
                call.on_failure_at(&failure, now),
                Decision::Retry { .. }
            ));
            call.start_retry_at(now).unwrap();
        }
        let third = call.on_failure_at(&failure, now);
        (
            while_granted,
            after_drop,
            third,
            context::remaining_allowance(),
        )
    })
    .await;
    assert_eq!(
        seen,
        (
            Some(1),
            Some(2),
            Decision::GiveUp(Refusal::Allowance),
            Some(0)
        )
    );
}

#[test]
fn refusal_names_are_stable() {
    let names: Vec<_> = Refusal::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        names,
        [
            "not_retryable",
            "not_idempotent",
            "pushback",
            "attempts",
            "deadline",
            "breaker",
            "budget",
            "key_budget",
            "replay_limit",
            "allowance",
            "saturated",
            "connect_backoff"
        ]
    );
    assert!(Refusal::Budget.is_retryable_but_refused());
    assert!(Refusal::Allowance.is_retryable_but_refused());
    assert!(!Refusal::Pushback.is_retryable_but_refused());
    assert!(!Refusal::NotRetryable.is_retryable_but_refused());
}

#[test]
fn seeded_controllers_draw_the_same_delays() {
    let delays = |seed| {
        let c = RetryController::new(
            MethodTable::uniform(RetryPolicy {
                retryable_codes: CodeSet::single(Code::Unavailable),
                ..retried()
            }),
            budget(100, 0.1),
            None,
            seed,
        )
        .unwrap();
        let now = Instant::now();
        (0..20)
            .map(|_| {
                c.begin_at(PATH, None, now)
                    .unwrap()
                    .on_failure_at(&unavailable(), now)
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(delays(5), delays(5));
    assert_ne!(delays(5), delays(6));
}

fn times(caller: Option<u64>, per_attempt: Option<u64>) -> CallTimes {
    CallTimes {
        caller: caller.map(ms),
        per_attempt: per_attempt.map(ms),
        ..CallTimes::default()
    }
}

#[test]
fn the_first_attempt_keeps_the_callers_header_and_retries_say_what_is_left() {
    let c = controller(retried(), budget(5, 0.1));
    let t0 = Instant::now();
    let mut call = c.begin_call_at(PATH, &times(Some(300), None), t0).unwrap();
    let first = call.first_attempt_at(t0);
    assert_eq!(first.previous_attempts, 0);
    assert_eq!(
        first.grpc_timeout, None,
        "the caller's header is already right"
    );
    assert_eq!(first.fire_at, Some(t0 + ms(300)));
    let failed = AttemptEnd::Failed(unavailable());
    let Decision::Retry { delay } = call.on_attempt_end_at(failed, t0 + ms(10)).decision else {
        panic!("refused");
    };
    let at = t0 + ms(10) + delay;
    let retry = call.start_retry_at(at).unwrap();
    assert_eq!(retry.previous_attempts, 1);
    assert_eq!(retry.grpc_timeout, Some((t0 + ms(300)) - at));
    assert_eq!(retry.fire_at, Some(t0 + ms(300)));
}

#[test]
fn an_attempt_timeout_shorter_than_the_call_sets_the_timer_and_the_header() {
    let c = controller(retried(), budget(5, 0.1));
    let t0 = Instant::now();
    let mut call = c
        .begin_call_at(PATH, &times(Some(300), Some(50)), t0)
        .unwrap();
    let first = call.first_attempt_at(t0);
    assert_eq!(first.grpc_timeout, Some(ms(50)));
    assert_eq!(first.fire_at, Some(t0 + ms(50)));
    // No deadline at all: the attempt's own timeout alone.
    let mut free = c.begin_call_at(PATH, &times(None, Some(50)), t0).unwrap();
    assert_eq!(free.first_attempt_at(t0).fire_at, Some(t0 + ms(50)));
    // A policy's own per-attempt timeout wins over the layer's.
    let own = controller(
        RetryPolicy {
            per_attempt_timeout: Some(ms(20)),
            ..retried()
        },
        budget(5, 0.1),
    );
    let mut call = own.begin_call_at(PATH, &times(None, Some(50)), t0).unwrap();
    assert_eq!(call.per_attempt_timeout(), Some(ms(20)));
    assert_eq!(call.first_attempt_at(t0).fire_at, Some(t0 + ms(20)));
}

#[test]
fn the_callers_deadline_ends_the_call_whatever_the_answer() {
    let c = controller(retried(), budget(5, 0.1));
    let t0 = Instant::now();
    let mut call = c
        .begin_call_at(PATH, &times(Some(100), Some(50)), t0)
        .unwrap();
    call.first_attempt_at(t0);
    let late = AttemptEnd::Failed(unavailable());
    assert_eq!(
        call.on_attempt_end_at(late, t0 + ms(100)),
        Verdict {
            decision: Decision::Expired,
            attempt_timed_out: false,
            transparent: false
        }
    );
    let mut call = c.begin_call_at(PATH, &times(Some(100), None), t0).unwrap();
    call.first_attempt_at(t0);
    let timer = AttemptEnd::TimedOut {
        replayable: true,
        unsent: false,
    };
    assert_eq!(
        call.on_attempt_end_at(timer, t0 + ms(100)).decision,
        Decision::Expired
    );
}

#[test]
fn an_early_expiry_answer_to_an_attempt_limited_by_its_own_timeout_is_that_attempt_timing_out() {
    // A server that cannot finish the attempt within its 50 ms `grpc-timeout` says so at
    // once (10 ms in): the attempt timed out, and with 290 ms left the call retries,
    // although DEADLINE_EXCEEDED is not among the method's retryable codes.
    let throttle: Arc<dyn Budget> = Arc::new(
        A6Budget::new(A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.1,
        })
        .unwrap(),
    );
    let c = controller(retried(), Arc::clone(&throttle));
    let t0 = Instant::now();
    let mut call = c
        .begin_call_at(PATH, &times(Some(300), Some(50)), t0)
        .unwrap();
    let first = call.first_attempt_at(t0);
    assert_eq!(first.attempt_limit, Some(ms(50)), "the attempt's own limit");
    for code in [Code::DeadlineExceeded, Code::Cancelled] {
        let early = AttemptEnd::Failed(Failure::status(code));
        let verdict = call.on_attempt_end_at(early, t0 + ms(10));
        assert!(verdict.attempt_timed_out, "{code:?}");
        let Decision::Retry { delay } = verdict.decision else {
            panic!("{code:?} not retried: {verdict:?}");
        };
        let retry = call.start_retry_at(t0 + ms(10) + delay).unwrap();
        assert_eq!(retry.attempt_limit, Some(ms(50)));
    }
    // Each was paid like a timeout: an A6 throttle took a token for each (5 above the
    // threshold when full).
    assert!((throttle.balance_at(t0) - 3.0).abs() < 1e-9);
    // Not idempotent: the attempt may have done the work, as with the layer's timer.
    let c = controller(
        RetryPolicy {
            idempotent: false,
            ..retried()
        },
        budget(5, 0.1),
    );
    let mut call = c
        .begin_call_at(PATH, &times(Some(300), Some(50)), t0)
        .unwrap();
    call.first_attempt_at(t0);
    let early = AttemptEnd::Failed(Failure::status(Code::DeadlineExceeded));
    assert_eq!(
        call.on_attempt_end_at(early, t0 + ms(10)),
        Verdict {
            decision: Decision::GiveUp(Refusal::NotIdempotent),
            attempt_timed_out: true,
            transparent: false,
        }
    );
}

#[test]
fn an_early_expiry_answer_for_the_calls_own_deadline_stays_final() {
    let c = controller(retried(), budget(5, 0.1));
    let t0 = Instant::now();
    let final_answer = Verdict {
        decision: Decision::GiveUp(Refusal::NotRetryable),
        attempt_timed_out: false,
        transparent: false,
    };
    // No per-attempt timeout: the `grpc-timeout` was the call's deadline.
    let mut call = c.begin_call_at(PATH, &times(Some(300), None), t0).unwrap();
    assert_eq!(call.first_attempt_at(t0).attempt_limit, None);
    let early = AttemptEnd::Failed(Failure::status(Code::DeadlineExceeded));
    assert_eq!(call.on_attempt_end_at(early, t0 + ms(10)), final_answer);
    // A per-attempt timeout longer than what is left of the call: the attempt carried
    // the call's own deadline, and an answer about it is final.
    let mut call = c
        .begin_call_at(PATH, &times(Some(40), Some(50)), t0)
        .unwrap();
    assert_eq!(call.first_attempt_at(t0).attempt_limit, None);
    let early = AttemptEnd::Failed(Failure::status(Code::Cancelled));
    assert_eq!(call.on_attempt_end_at(early, t0 + ms(10)), final_answer);
}

#[test]
fn an_expiry_answer_past_the_attempts_deadline_is_that_attempt_timing_out() {
    // DEADLINE_EXCEEDED is not a retryable code here, yet past the attempt's own
    // deadline it is the attempt timing out, and retried.
    let c = controller(retried(), budget(5, 0.1));
    let t0 = Instant::now();
    let mut call = c
        .begin_call_at(PATH, &times(Some(300), Some(50)), t0)
        .unwrap();
    call.first_attempt_at(t0);
    let cancelled = AttemptEnd::Failed(Failure::status(Code::Cancelled));
    let verdict = call.on_attempt_end_at(cancelled, t0 + ms(50));
    assert!(verdict.attempt_timed_out);
    assert!(matches!(verdict.decision, Decision::Retry { .. }));
    // Any other code before the attempt's deadline is the server's own answer.
    let mut call = c
        .begin_call_at(PATH, &times(Some(300), Some(50)), t0)
        .unwrap();
    call.first_attempt_at(t0);
    let early = AttemptEnd::Failed(Failure::status(Code::Internal));
    assert_eq!(
        call.on_attempt_end_at(early, t0 + ms(49)),
        Verdict {
            decision: Decision::GiveUp(Refusal::NotRetryable),
            attempt_timed_out: false,
            transparent: false
        }
    );
}

#[test]
fn a_transparent_retry_after_a_refused_connection_waits_for_the_connection_backoff() {
    let c = controller(retried(), budget(5, 0.1));
    let now = Instant::now();
    let refused = Failure {
        unsent: true,
        ..unavailable()
    };
    // Begun while connections were made (once one is refused, first attempts wait too).
    let mut call = c.begin_at(PATH, Some(now + ms(5_000)), now).unwrap();
    let mut short = c.begin_at(PATH, Some(now + ms(500)), now).unwrap();
    let mut drained = c.begin_at(PATH, Some(now + ms(5_000)), now).unwrap();
    // A call with time to wait: its transparent retry waits out the backoff (1 s ± 20 %).
    call.on_connect_refused_at(now);
    let v = call.on_attempt_end_at(AttemptEnd::Failed(refused), now);
    let Decision::Retry { delay } = v.decision else {
        panic!("{v:?}")
    };
    assert!(v.transparent);
    assert!((ms(800)..=ms(1_200)).contains(&delay), "{delay:?}");
    // A call whose deadline comes first gives up at once instead of connecting again.
    short.on_connect_refused_at(now + ms(1));
    let v = short.on_attempt_end_at(AttemptEnd::Failed(refused), now + ms(1));
    assert_eq!(v.decision, Decision::GiveUp(Refusal::Deadline));
    // A stream refused over a working connection (a draining server) is retried at once.
    let v = drained.on_attempt_end_at(AttemptEnd::Failed(refused), now + ms(2));
    assert_eq!(v.decision, Decision::Retry { delay: ms(0) });
    // An answer (to the slot's probe: the slots are at most 1.2 s + 1.92 s apart) resets
    // the backoff: the next refusal waits about 1 s again, not 1.6 s.
    let later = now + ms(4_000);
    let mut ok = c.begin_at(PATH, None, later).unwrap();
    ok.on_success_at(later);
    let mut call = c.begin_at(PATH, Some(later + ms(5_000)), later).unwrap();
    call.on_connect_refused_at(later);
    let v = call.on_attempt_end_at(AttemptEnd::Failed(refused), later);
    assert!(
        matches!(v.decision, Decision::Retry { delay } if delay <= ms(1_200)),
        "{v:?}"
    );
}

#[test]
fn a_call_without_a_deadline_waits_for_its_connection_slot_at_most_connect_slot_wait() {
    // Calls without a deadline refused together: each takes the next slot, one step after
    // the last; a call whose slot is more than 10 s off fails at once instead of waiting
    // behind every call before it (32 callers would wait minutes each).
    let c = controller(retried(), budget(5, 0.1));
    let now = Instant::now();
    let refused = Failure {
        unsent: true,
        ..unavailable()
    };
    let mut waited = Vec::new();
    let mut gave_up = 0;
    // Begun while connections were made (once one is refused, first attempts wait too).
    let calls: Vec<_> = (0..10)
        .map(|_| c.begin_at(PATH, None, now).unwrap())
        .collect();
    for mut call in calls {
        call.on_connect_refused_at(now);
        match call
            .on_attempt_end_at(AttemptEnd::Failed(refused), now)
            .decision
        {
            Decision::Retry { delay } => waited.push(delay),
            Decision::GiveUp(Refusal::ConnectBackoff) => gave_up += 1,
            other => panic!("{other:?}"),
        }
    }
    assert!(!waited.is_empty() && gave_up > 0, "{waited:?}, {gave_up}");
    assert!(waited.iter().all(|d| *d <= CONNECT_SLOT_WAIT), "{waited:?}");
}

#[test]
fn while_connections_are_refused_a_first_attempt_is_sent_only_as_the_slots_probe() {
    let c = controller(retried(), budget(5, 0.1));
    let now = Instant::now();
    let mut first = c.begin_at(PATH, Some(now + ms(1_000)), now).unwrap();
    first.on_connect_refused_at(now + ms(10));
    // In backoff: every first attempt is refused, none dials.
    for t in [11, 100, 700] {
        assert_eq!(
            c.begin_at(PATH, Some(now + ms(t + 1_000)), now + ms(t))
                .err(),
            Some(Refusal::ConnectBackoff),
            "{t} ms"
        );
    }
    // Once the slot (1 s ± 20 % after the refusal) has come: one probe, the others wait.
    let slot = now + ms(1_300);
    let probe = c.begin_at(PATH, Some(slot + ms(1_000)), slot);
    assert!(probe.is_ok());
    assert_eq!(
        c.begin_at(PATH, None, slot + ms(1)).err(),
        Some(Refusal::ConnectBackoff)
    );
    // The probe is answered: the dependency is back, every call goes.
    let mut probe = probe.unwrap();
    probe.on_success_at(slot + ms(5));
    assert!((0..3).all(|i| c.begin_at(PATH, None, slot + ms(6 + i)).is_ok()));
}

/// A table built by hand is checked as a config file's is: the error names the field.
#[test]
fn a_controller_refuses_a_table_with_a_policy_out_of_range() {
    let field = |methods: MethodTable| match RetryController::new(
        methods,
        Arc::new(crate::budget::Unlimited),
        None,
        1,
    ) {
        Err(crate::error::ConfigError::Invalid { field, .. }) => field,
        other => panic!("{:?}", other.map(|_| ())),
    };
    let one_attempt = RetryPolicy {
        max_attempts: 1,
        ..RetryPolicy::default()
    };
    assert_eq!(
        field(MethodTable::uniform(one_attempt)),
        "retry.maxAttempts"
    );
    let mut hedged = MethodTable::none();
    hedged.set_hedging(
        crate::retry::MethodScope::Method("pkg.Svc", "Get"),
        Some(HedgingPolicy {
            non_fatal_codes: CodeSet::single(Code::Ok),
            ..HedgingPolicy::default()
        }),
    );
    assert_eq!(field(hedged), "hedging.nonFatalStatusCodes");
    // A valid table is taken.
    assert!(
        RetryController::new(
            MethodTable::uniform(RetryPolicy::default()),
            Arc::new(crate::budget::Unlimited),
            None,
            1
        )
        .is_ok()
    );
}
