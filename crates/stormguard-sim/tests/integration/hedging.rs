//! Hedged calls in the simulator: the decisions core dictates, call by call (virtual
//! instants, no clock), and the fleet-level bound a budget puts on hedges.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use stormguard_core::CallTimes;
use stormguard_core::Instant;
use stormguard_core::MethodScope;
use stormguard_core::MethodTable;
use stormguard_core::Pushback;
use stormguard_core::{Budget, BudgetConfig, RetryBudget, Unlimited};
use stormguard_core::{Code, CodeSet};
use stormguard_core::{Failure, Refusal, RetryController};
use stormguard_core::{HedgeDelay, HedgingPolicy};
use stormguard_sim::{Action, End, HedgeVariant, HedgedCall, Options, PATH, hedging_scenario, run};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn controller(policy: HedgingPolicy, budget: Arc<dyn Budget>) -> RetryController {
    let mut methods = MethodTable::none();
    methods.set_hedging(MethodScope::Default, Some(policy));
    RetryController::new(methods, budget, None, 7).unwrap()
}

fn policy(max_attempts: u32, non_fatal: CodeSet) -> HedgingPolicy {
    HedgingPolicy {
        max_attempts,
        delay: HedgeDelay::Fixed(ms(10)),
        non_fatal_codes: non_fatal,
        ..HedgingPolicy::default()
    }
}

fn times() -> CallTimes {
    CallTimes {
        caller: Some(Duration::from_secs(1)),
        ..CallTimes::default()
    }
}

/// The sends, cancels, timer and end among `actions`, as (kind, copy or previous attempts).
fn sends(actions: &[Action]) -> Vec<(u32, u32)> {
    actions
        .iter()
        .filter_map(|a| match a {
            Action::Send { copy, plan } => Some((*copy, plan.previous_attempts)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_slow_first_copy_is_beaten_by_the_hedge_sent_after_the_delay() {
    let c = controller(policy(2, CodeSet::EMPTY), Arc::new(Unlimited));
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut call = HedgedCall::begin_at(&c, PATH, &times(), t0, &mut out).unwrap();
    // The first copy at once; the timer at the hedge (before the 1 s deadline). A copy's
    // own limit is the call's deadline.
    assert_eq!(sends(&out), [(0, 0)]);
    assert!(
        matches!(out[0], Action::Send { plan, .. } if plan.fire_at == Some(t0 + Duration::from_secs(1)))
    );
    assert_eq!(out.last(), Some(&Action::Arm(Some(t0 + ms(10)))));
    out.clear();
    // Nothing before the delay: the hedge goes when the timer fires, carrying one
    // previous attempt; then the timer waits for the deadline only (two copies at most).
    call.timer_at(t0 + ms(10), &mut out);
    assert_eq!(sends(&out), [(1, 1)]);
    assert_eq!(
        out.last(),
        Some(&Action::Arm(Some(t0 + Duration::from_secs(1))))
    );
    assert_eq!((call.in_flight(), call.retry().hedges_sent()), (2, 2));
    out.clear();
    // The hedge answers OK 2 ms after it was sent: it wins, the first copy is cancelled.
    call.answered_at(1, None, t0 + ms(12), &mut out);
    assert_eq!(
        out,
        [Action::Cancel { copy: 0 }, Action::End(End::Ok)],
        "{out:?}"
    );
    assert_eq!(call.won_by(), Some(1));
    assert!(call.is_over());
    // The cancelled copy's late answer changes nothing.
    out.clear();
    call.answered_at(0, None, t0 + ms(30), &mut out);
    assert!(out.is_empty());
}

#[test]
fn a_fast_first_copy_sends_no_hedge() {
    let c = controller(policy(3, CodeSet::EMPTY), Arc::new(Unlimited));
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut call = HedgedCall::begin_at(&c, PATH, &times(), t0, &mut out).unwrap();
    out.clear();
    call.answered_at(0, None, t0 + ms(3), &mut out);
    assert_eq!(out, [Action::End(End::Ok)]);
    assert_eq!(call.retry().hedges_sent(), 1);
}

#[test]
fn hedges_are_refused_when_the_budget_is_empty() {
    // No floor and no success yet: the budget has nothing to grant.
    let empty = RetryBudget::new(BudgetConfig {
        min_retries_per_second: 0,
        ..BudgetConfig::default()
    })
    .unwrap();
    let c = controller(policy(3, CodeSet::EMPTY), Arc::new(empty));
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut call = HedgedCall::begin_at(&c, PATH, &times(), t0, &mut out).unwrap();
    out.clear();
    call.timer_at(t0 + ms(10), &mut out);
    // Refused, not queued: no copy is sent and the call's hedges stop; the first copy
    // goes on, with only the deadline armed.
    assert!(sends(&out).is_empty(), "{out:?}");
    assert_eq!(call.refused(), Some(Refusal::Budget));
    assert_eq!(call.retry().hedges_stopped(), Some(Refusal::Budget));
    assert_eq!(call.retry().next_hedge_at(), None);
    assert_eq!(out, [Action::Arm(Some(t0 + Duration::from_secs(1)))]);
    out.clear();
    call.answered_at(0, None, t0 + ms(40), &mut out);
    assert_eq!(out, [Action::End(End::Ok)]);
}

#[test]
fn pushback_minus_one_stops_the_hedges() {
    let unavailable = CodeSet::single(Code::Unavailable);
    let c = controller(policy(4, unavailable), Arc::new(Unlimited));
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut call = HedgedCall::begin_at(&c, PATH, &times(), t0, &mut out).unwrap();
    call.timer_at(t0 + ms(10), &mut out);
    assert_eq!(sends(&out), [(0, 0), (1, 1)]);
    out.clear();
    // The first copy fails non-fatally with "do not retry": no more hedges, the second
    // copy goes on.
    let told = Failure {
        pushback: Some(Pushback::DoNotRetry),
        ..Failure::status(Code::Unavailable)
    };
    call.answered_at(0, Some(told), t0 + ms(12), &mut out);
    assert!(sends(&out).is_empty(), "{out:?}");
    assert_eq!(call.retry().hedges_stopped(), Some(Refusal::Pushback));
    assert_eq!(call.in_flight(), 1);
    out.clear();
    // Its failure ends the call: nothing in flight, nothing may follow.
    let failed = Failure::status(Code::Unavailable);
    call.answered_at(1, Some(failed), t0 + ms(15), &mut out);
    assert_eq!(out, [Action::End(End::GaveUp(Refusal::Pushback, failed))]);
}

#[test]
fn a_non_fatal_failure_sends_the_next_copy_at_once_and_a_fatal_one_ends_the_call() {
    let unavailable = CodeSet::single(Code::Unavailable);
    let c = controller(policy(3, unavailable), Arc::new(Unlimited));
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut call = HedgedCall::begin_at(&c, PATH, &times(), t0, &mut out).unwrap();
    out.clear();
    // Non-fatal, without pushback: the next copy is due at once (before the delay).
    call.answered_at(
        0,
        Some(Failure::status(Code::Unavailable)),
        t0 + ms(2),
        &mut out,
    );
    assert_eq!(sends(&out), [(1, 1)]);
    out.clear();
    // A fatal status wins over the copies still running: they are cancelled.
    call.timer_at(t0 + ms(12), &mut out);
    assert_eq!(sends(&out), [(2, 2)]);
    out.clear();
    let fatal = Failure::status(Code::InvalidArgument);
    call.answered_at(2, Some(fatal), t0 + ms(13), &mut out);
    assert_eq!(
        out,
        [
            Action::Cancel { copy: 1 },
            Action::End(End::GaveUp(Refusal::NotRetryable, fatal))
        ]
    );
}

#[test]
fn the_deadline_cancels_every_copy() {
    let c = controller(policy(2, CodeSet::EMPTY), Arc::new(Unlimited));
    let t0 = Instant::now();
    let mut out = Vec::new();
    let mut call = HedgedCall::begin_at(&c, PATH, &times(), t0, &mut out).unwrap();
    call.timer_at(t0 + ms(10), &mut out);
    out.clear();
    call.timer_at(t0 + Duration::from_secs(1), &mut out);
    assert_eq!(out.len(), 3, "{out:?}");
    assert!(out.contains(&Action::Cancel { copy: 0 }));
    assert!(out.contains(&Action::Cancel { copy: 1 }));
    assert_eq!(out[2], Action::End(End::Expired));
}

/// The hedging table's capacity drop, quick: every hedge a copy the server must serve.
#[test]
fn a_budget_bounds_the_fleets_hedges_where_an_unbudgeted_hedge_does_not() {
    let options = Options {
        quick: true,
        seed: 3,
    };
    let none = run(&hedging_scenario(HedgeVariant::NoHedging, &options)).unwrap();
    let unbudgeted = run(&hedging_scenario(HedgeVariant::Unbudgeted, &options)).unwrap();
    let budgeted = run(&hedging_scenario(HedgeVariant::Budgeted, &options)).unwrap();
    assert_eq!(none.hedges, 0);
    assert_eq!(none.amplification(), 1.0);
    // Every copy is an attempt: first attempts plus hedges.
    for s in [&unbudgeted, &budgeted] {
        assert_eq!(s.attempts, s.calls + s.hedges + s.retries, "{s:?}");
        assert_eq!(s.retries, 0);
    }
    // The budget: at most its ratio (10 %) of the successes, plus what its floor (5/s
    // per process, a reserve of one 10 s window to start) adds to the measured calls.
    let sc = hedging_scenario(HedgeVariant::Budgeted, &options);
    let floor = 5.0 * sc.clients as f64 * (budgeted.measured_seconds + 10.0);
    let bound = 1.0 + 0.1 + floor / budgeted.calls as f64;
    assert!(
        budgeted.amplification() <= bound,
        "{} > {bound}",
        budgeted.amplification()
    );
    // Without one, hedges double the load on the slowed server.
    assert!(unbudgeted.amplification() > 1.5, "{unbudgeted:?}");
    assert!(budgeted.success_rate() > unbudgeted.success_rate());
}

#[test]
fn hedged_runs_are_reproducible() {
    let options = Options {
        quick: true,
        seed: 5,
    };
    let sc = hedging_scenario(HedgeVariant::Budgeted, &options);
    assert_eq!(run(&sc).unwrap(), run(&sc).unwrap());
}
