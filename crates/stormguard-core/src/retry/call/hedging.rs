//! The hedging half of a call: copies sent on a schedule, each one an attempt paid from the
//! budget, the first useful answer wins.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::CallRetry;
use super::is_overload;
use crate::context;
use crate::deadline::Deadline;
use crate::retry::breaker::BreakerState;
use crate::retry::decision::{AttemptEnd, AttemptPlan, Failure, Refusal};
use crate::retry::delay::DelayEstimator;
use crate::retry::policy::{HedgeDelay, HedgingPolicy};
use crate::wire::code::Code;
use crate::wire::pushback::Pushback;

/// The hedges of one call.
pub(in crate::retry) struct HedgeState {
    pub(in crate::retry) policy: Arc<HedgingPolicy>,
    pub(in crate::retry) estimator: Option<Arc<DelayEstimator>>,
    /// Copies sent so far, the first included.
    pub(in crate::retry) sent: u32,
    /// When the next copy is due, if one may follow.
    pub(in crate::retry) next_at: Option<Instant>,
    /// Why no copy may follow any more, once that is known.
    pub(in crate::retry) stopped: Option<Refusal>,
}

impl HedgeState {
    /// The delay before the next copy, at `now`; `None` while a learned delay has too few
    /// samples (then no hedge is sent).
    pub(super) fn delay_at(&self, now: Instant) -> Option<Duration> {
        match (&self.policy.delay, &self.estimator) {
            (HedgeDelay::Fixed(d), _) => Some(*d),
            (HedgeDelay::Learned(_), Some(e)) => e.delay_at(now),
            (HedgeDelay::Learned(_), None) => None,
        }
    }

    /// Schedules the copy after one sent (or answered non-fatally) at `now`, `after` from
    /// now, if another may follow.
    pub(super) fn schedule(&mut self, now: Instant, after: Option<Duration>) {
        self.next_at = match self.stopped {
            Some(_) => None,
            None if self.sent >= self.policy.effective_max_attempts() => None,
            None => after.map(|d| Deadline::after_at(now, d).instant()),
        };
    }
}

/// What follows a hedged copy that ended without winning: from
/// [`CallRetry::on_hedge_end_at`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeDecision {
    /// Other copies are in flight or another is due ([`CallRetry::next_hedge_at`]): wait for
    /// them.
    Wait,
    /// The call ends with this copy's answer: a fatal status
    /// ([`Refusal::NotRetryable`]: every other copy is cancelled), or the last copy failed
    /// and no other may follow (why).
    GiveUp(Refusal),
    /// The caller's deadline has passed: the call ends with `DEADLINE_EXCEEDED`.
    Expired,
}

impl CallRetry {
    /// Whether the method is hedged: its copies are sent by
    /// [`start_hedge_at`](Self::start_hedge_at) and their failures go to
    /// [`on_hedge_end_at`](Self::on_hedge_end_at), never retried.
    pub fn is_hedged(&self) -> bool {
        self.hedge.is_some()
    }

    /// When the next hedge is due, if one may follow (set by the first attempt, each hedge
    /// and each non-fatal answer).
    pub fn next_hedge_at(&self) -> Option<Instant> {
        self.hedge.as_ref().and_then(|h| h.next_at)
    }

    /// Why the call's hedges stopped, once no hedge may follow for a reason other than
    /// its answers (budget, breaker, allowance, deadline, pushback).
    pub fn hedges_stopped(&self) -> Option<Refusal> {
        self.hedge.as_ref().and_then(|h| h.stopped)
    }

    /// No copy of the call may follow (`why`): its request cannot be sent twice at once (a
    /// streaming body, which only one copy at a time can read), or the channel cannot take
    /// another. Copies in flight go on.
    pub fn stop_hedges(&mut self, why: Refusal) {
        if let Some(hedge) = self.hedge.as_mut() {
            hedge.stopped.get_or_insert(why);
            hedge.next_at = None;
        }
    }

    /// Copies of the call sent so far (the first included); 0 when it is not hedged.
    pub fn hedges_sent(&self) -> u32 {
        self.hedge.as_ref().map_or(0, |h| h.sent)
    }

    /// The next copy of a hedged call is about to be sent at `now`: what it carries. Every
    /// hedge is an attempt, checked in this order, and refused (not queued: the refusal
    /// stops the call's hedges) when one fails:
    ///
    /// 1. enough time is left on the call's deadline for a useful attempt
    ///    ([`Refusal::Deadline`]);
    /// 2. copies so far < `maxAttempts` ([`Refusal::Attempts`]);
    /// 3. no pushback stopped the hedges ([`Refusal::Pushback`]);
    /// 4. the breaker is closed: neither open nor probing ([`Refusal::Breaker`]);
    /// 5. the load reports do not say the dependency is saturated
    ///    ([`Refusal::Saturated`], with [`RetryController::with_saturation`](crate::RetryController::with_saturation));
    /// 6. the request's retry allowance has one left (it spends one;
    ///    [`Refusal::Allowance`]);
    /// 7. the budget grants a withdrawal, from the same budget that pays for retries but
    ///    only from its upper half ([`Budget::withdraw_hedge_at`](crate::Budget::withdraw_hedge_at)): a stormguard budget
    ///    while half of what its window minted is left after it, an A6 throttle while it
    ///    holds more than half its tokens ([`Refusal::Budget`]).
    ///
    /// A hedge granted is spent: it carries `grpc-previous-rpc-attempts` (the copies sent
    /// before it), and the next copy is scheduled a delay later.
    pub fn start_hedge_at(&mut self, now: Instant) -> Result<AttemptPlan, Refusal> {
        let refusal = self.hedge_refusal_at(now);
        let Some(hedge) = self.hedge.as_mut() else {
            return Err(Refusal::NotRetryable);
        };
        if let Some(refusal) = refusal {
            hedge.stopped = Some(refusal);
            hedge.next_at = None;
            return Err(refusal);
        }
        self.previous_attempts = hedge.sent;
        hedge.sent += 1;
        let delay = hedge.delay_at(now);
        hedge.schedule(now, delay);
        Ok(self.plan_at(now, false))
    }

    fn hedge_refusal_at(&mut self, now: Instant) -> Option<Refusal> {
        let hedge = self.hedge.as_ref()?;
        if let Some(stopped) = hedge.stopped {
            return Some(stopped);
        }
        if self
            .deadline
            .is_some_and(|d| hedge.policy.min_attempt_time >= d.saturating_duration_since(now))
        {
            return Some(Refusal::Deadline);
        }
        if hedge.sent >= hedge.policy.effective_max_attempts() {
            return Some(Refusal::Attempts);
        }
        if let Some(breaker) = &self.shared.breaker
            && !matches!(breaker.state_at(now), BreakerState::Closed)
        {
            return Some(Refusal::Breaker);
        }
        if self.saturated_at(now) {
            return Some(Refusal::Saturated);
        }
        if !context::spend_retry() {
            return Some(Refusal::Allowance);
        }
        if !self.shared.budget.withdraw_hedge_at(now) {
            context::refund_retry();
            return Some(Refusal::Budget);
        }
        None
    }

    /// A copy of a hedged call ended at `now` without winning (`end`: a status, a transport
    /// failure, a timer below the layer) while `in_flight` other copies still run. A6's
    /// rules, in this order:
    ///
    /// 1. at or after the caller's deadline the call has expired ([`HedgeDecision::Expired`]);
    /// 2. a status that is not one of the policy's non-fatal codes ends the call with this
    ///    answer: the layer cancels every other copy. A copy that never reached the
    ///    server's application is non-fatal whatever its code: one that was never sent
    ///    ([`Failure::unsent`]), or one a stormguard server shed, or refused while shutting
    ///    down, without running it ([`Failure::unprocessed`]): a server that sheds a hedge
    ///    (as it sheds hedges before first attempts) must not fail the copy still running;
    /// 3. a non-fatal failure costs an A6 throttle a token; its pushback `-1` (or one longer
    ///    than `max_pushback`) stops further hedges, `N` ms puts the next one `N` from now,
    ///    and without one the next copy is due at once;
    /// 4. when no copy is in flight and none may follow, the call ends with this answer.
    pub fn on_hedge_end_at(
        &mut self,
        end: AttemptEnd,
        in_flight: usize,
        now: Instant,
    ) -> HedgeDecision {
        let failure = match end {
            AttemptEnd::Failed(f) => f,
            AttemptEnd::TimedOut { replayable, unsent } => Failure {
                code: Code::DeadlineExceeded,
                pushback: None,
                replayable,
                unsent,
                unprocessed: false,
            },
        };
        if self.deadline.is_some_and(|d| now >= d) {
            self.on_deadline_passed_at(Some(&failure), now);
            return HedgeDecision::Expired;
        }
        let Some(hedge) = self.hedge.as_mut() else {
            return HedgeDecision::GiveUp(Refusal::NotRetryable);
        };
        // A copy the server never ran (a stormguard server shed it, or it never reached
        // the server) says nothing about the call: the others may still answer.
        let non_fatal = failure.unsent
            || failure.unprocessed
            || hedge.policy.non_fatal_codes.contains(failure.code);
        if !non_fatal {
            self.record_outcome_at(failure.code, failure.pushback, now);
            return HedgeDecision::GiveUp(Refusal::NotRetryable);
        }
        if !failure.unsent {
            self.shared.budget.record_failure_at(now);
            if matches!(failure.pushback, Some(Pushback::RetryAfter(_))) {
                self.shared.budget.record_pushback_at(now);
            }
        }
        let after = match failure.pushback {
            Some(Pushback::DoNotRetry) => None,
            Some(Pushback::RetryAfter(d)) if d > hedge.policy.max_pushback => None,
            Some(Pushback::RetryAfter(d)) => Some(d),
            None => Some(Duration::ZERO),
        };
        if after.is_none() {
            hedge.stopped = Some(Refusal::Pushback);
        }
        hedge.schedule(now, after);
        if in_flight == 0 && hedge.next_at.is_none() {
            let why = hedge.stopped.unwrap_or(Refusal::Attempts);
            // The call's last copy failed: the breaker hears how.
            self.record_breaker_outcome_at(failure.code, failure.pushback, now);
            return HedgeDecision::GiveUp(why);
        }
        HedgeDecision::Wait
    }

    /// A copy of the call ran for `elapsed` and ended at `now`, whichever way (won, lost
    /// and cancelled, failed, cut off by the deadline): the method's learned hedge delay
    /// counts it. Nothing when the delay is fixed.
    pub fn record_hedge_latency_at(&self, elapsed: Duration, now: Instant) {
        if let Some(e) = self.hedge.as_ref().and_then(|h| h.estimator.as_ref()) {
            e.record_at(elapsed, now);
        }
    }

    /// Settles the breaker permit for a final non-fatal answer of a hedged call: a failure,
    /// unless it is an overload answer (never health, never a failure).
    fn record_breaker_outcome_at(&mut self, code: Code, pushback: Option<Pushback>, now: Instant) {
        if let Some(permit) = self.permit.take()
            && !is_overload(code, pushback)
        {
            permit.failure_at(now);
        }
    }
}

#[cfg(test)]
mod tests;
