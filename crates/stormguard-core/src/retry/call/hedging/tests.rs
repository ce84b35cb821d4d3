//! Properties of a hedged call's decisions under any sequence of events: copies sent,
//! answers of every code with any pushback (hostile values included, as the wire parses
//! them), time passing. Whatever happens: never more copies than the policy allows, each
//! copy after the first paid once from the budget (a refused one costs nothing), nothing sent once the call's
//! hedges stopped, and every copy numbered by the copies before it.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::HedgeDecision;
use crate::budget::{Budget, BudgetConfig, RetryBudget};
use crate::retry::controller::RetryController;
use crate::retry::decision::{AttemptEnd, Failure};
use crate::retry::policy::MethodScope;
use crate::retry::policy::MethodTable;
use crate::retry::policy::{HedgeDelay, HedgingPolicy};
use crate::wire::code::{Code, CodeSet};
use crate::wire::pushback::Pushback;
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Event {
    /// Time passes, then the layer sends the copy that is due, if one is.
    Advance(u64),
    /// A copy answers with a code (an index into `Code::ALL`) and a pushback.
    Answer {
        code: usize,
        pushback: Option<i64>,
        in_flight: usize,
    },
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        (0u64..50).prop_map(Event::Advance),
        (0usize..17, proptest::option::of(-3i64..200), 0usize..4).prop_map(
            |(code, pushback, in_flight)| Event::Answer {
                code,
                pushback,
                in_flight
            }
        ),
    ]
}

proptest! {
    #[test]
    fn hedges_stay_within_the_policy_and_are_paid_once(
        max_attempts in 2u32..8,
        delay_ms in 0u64..30,
        budget_floor in 0u32..4,
        events in proptest::collection::vec(event(), 0..40),
    ) {
        let policy = HedgingPolicy {
            max_attempts,
            delay: HedgeDelay::Fixed(Duration::from_millis(delay_ms)),
            non_fatal_codes: CodeSet::single(Code::Unavailable),
            ..HedgingPolicy::default()
        };
        let mut table = MethodTable::none();
        table.set_hedging(MethodScope::Default, Some(policy.clone()));
        let budget = RetryBudget::new(BudgetConfig {
            min_retries_per_second: budget_floor,
            ttl: Duration::from_secs(1),
            ..BudgetConfig::default()
        })
        .unwrap();
        let budget: Arc<dyn Budget> = Arc::new(budget);
        let controller = RetryController::new(table, Arc::clone(&budget), None, 3).unwrap();
        let mut now = Instant::now();
        let mut call = controller.begin_at("/p.S/M", None, now).unwrap();
        let first = call.first_attempt_at(now);
        prop_assert_eq!(first.previous_attempts, 0);
        let mut sent = 1u32;
        let mut ended = false;
        for e in events {
            if ended {
                break;
            }
            match e {
                Event::Advance(ms) => {
                    now += Duration::from_millis(ms);
                    if call.next_hedge_at().is_some_and(|at| at <= now) {
                        let was_stopped = call.hedges_stopped().is_some();
                        let balance = budget.balance_at(now);
                        if let Ok(plan) = call.start_hedge_at(now) {
                            prop_assert!(!was_stopped, "a copy after the hedges stopped");
                            prop_assert_eq!(plan.previous_attempts, sent);
                            let paid = balance - budget.balance_at(now);
                            prop_assert!((paid - 1.0).abs() < 1e-6, "a hedge paid {}", paid);
                            sent += 1;
                        } else {
                            prop_assert_eq!(call.next_hedge_at(), None, "a refusal is not queued");
                            prop_assert_eq!(budget.balance_at(now), balance, "a refusal costs nothing");
                        }
                    }
                }
                Event::Answer { code, pushback, in_flight } => {
                    let code = Code::ALL[code];
                    if code == Code::Ok {
                        continue;
                    }
                    let pushback = pushback.map(|p| match p {
                        p if p < 0 => Pushback::DoNotRetry,
                        p => Pushback::RetryAfter(Duration::from_millis(p as u64)),
                    });
                    let failure = Failure { pushback, ..Failure::status(code) };
                    match call.on_hedge_end_at(AttemptEnd::Failed(failure), in_flight, now) {
                        HedgeDecision::Wait => {
                            prop_assert!(
                                in_flight > 0 || call.next_hedge_at().is_some(),
                                "waiting for nothing"
                            );
                        }
                        HedgeDecision::GiveUp(_) | HedgeDecision::Expired => ended = true,
                    }
                    if matches!(pushback, Some(Pushback::DoNotRetry)) && code == Code::Unavailable {
                        prop_assert_eq!(call.next_hedge_at(), None, "-1 stops the hedges");
                    }
                }
            }
            prop_assert!(sent <= policy.effective_max_attempts());
            prop_assert_eq!(call.hedges_sent(), sent);
        }
    }
}
