//! The retry state of one logical call: what its attempts carry, how each one ended, and
//! whether another may follow. Hedged calls ([`hedging`]), transparent retries
//! ([`transparent`]) and idempotency keys ([`keying`]) each have their own file.

mod committed;
mod hedging;
pub(super) mod keying;
mod transparent;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

pub use committed::CommittedCall;
pub use hedging::HedgeDecision;
pub(super) use hedging::HedgeState;
pub use transparent::{CONNECT_SLOT_WAIT, TRANSPARENT_RETRIES};

use tokio::time::Instant;

use super::backoff::Backoff;
use super::breaker::{BreakerPermit, BreakerState};
use super::decision::{AttemptEnd, AttemptPlan, Decision, Failure, Refusal, Verdict};
use super::policy::RetryPolicy;
use super::shared::Shared;
use crate::context;
use crate::deadline::Deadline;
use crate::wire::UuidKey;
use crate::wire::code::{Code, CodeSet};
use crate::wire::orca::LoadReport;
use crate::wire::pushback::Pushback;

/// The retry state of one logical call.
pub struct CallRetry {
    pub(in crate::retry) shared: Arc<Shared>,
    pub(in crate::retry) policy: Option<Arc<RetryPolicy>>,
    pub(in crate::retry) backoff: Option<Backoff>,
    pub(in crate::retry) previous_attempts: u32,
    pub(in crate::retry) deadline: Option<Instant>,
    /// Whether the deadline is the caller's own `grpc-timeout` (the first attempt then sends
    /// the header as the caller wrote it).
    pub(in crate::retry) caller_header: bool,
    /// How long each attempt may take, if limited.
    pub(in crate::retry) attempt_timeout: Option<Duration>,
    /// When the attempt in flight times out, if before the call's deadline.
    pub(in crate::retry) attempt_deadline: Option<Instant>,
    pub(in crate::retry) permit: Option<BreakerPermit>,
    /// When the budget granted the retry that has not started yet.
    pub(in crate::retry) granted: Option<Instant>,
    /// The budget key of the attempt that ended last ([`CallRetry::set_budget_key`]).
    pub(in crate::retry) key: Option<u64>,
    /// The key that paid for the retry granted and not started yet.
    pub(in crate::retry) granted_key: Option<u64>,
    /// Whether that retry spent one of the request's allowance (given back with it).
    pub(in crate::retry) spent_allowance: bool,
    /// Whether the retry granted and not started yet is transparent (free).
    pub(in crate::retry) pending_transparent: bool,
    /// Transparent retries this call has made (see [`TRANSPARENT_RETRIES`]).
    pub(in crate::retry) transparent_retries: u32,
    /// The call's hedging, when its method is hedged.
    pub(in crate::retry) hedge: Option<HedgeState>,
    /// How many endpoints a retry could go to ([`CallRetry::set_endpoints`]).
    pub(in crate::retry) endpoints: usize,
    /// The call's idempotency key, when its method is keyed.
    pub(in crate::retry) idempotency_key: Option<UuidKey>,
    /// When the connection backoff allows the next connection, after the attempt that
    /// ended last found its connection refused ([`CallRetry::on_connect_refused_at`]).
    pub(in crate::retry) connect_at: Option<Instant>,
}

impl Drop for CallRetry {
    /// A retry the budget granted but that never started goes back to the budget.
    fn drop(&mut self) {
        if let Some(at) = self.granted.take() {
            self.refund_budget(at);
            self.refund_allowance();
        }
    }
}

impl fmt::Debug for CallRetry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallRetry")
            .field("policy", &self.policy)
            .field("previous_attempts", &self.previous_attempts)
            .field("deadline", &self.deadline)
            .finish()
    }
}

/// Records an `OK` answer: the connection works, the budget earns a deposit (and the budget
/// key's account), the breaker hears a success.
fn record_success(
    shared: &Shared,
    permit: &mut Option<BreakerPermit>,
    key: Option<u64>,
    now: Instant,
) {
    shared.connect.connected();
    shared.budget.deposit_at(now);
    if let (Some(keyed), Some(key)) = (&shared.keyed, key) {
        keyed.deposit_at(key, now);
    }
    if let Some(permit) = permit.take() {
        permit.success_at(now);
    }
}

/// Records an answer other than `OK` (see `CallRetry::record_outcome_at`): a `retryable`
/// code is a failure for the breaker and the budget; an overload or expiry answer releases
/// the permit without an outcome; any other code is a sign of life.
fn record_outcome(
    shared: &Shared,
    permit: &mut Option<BreakerPermit>,
    retryable: bool,
    code: Code,
    pushback: Option<Pushback>,
    now: Instant,
) {
    let permit = permit.take();
    if retryable {
        if let Some(permit) = permit {
            permit.failure_at(now);
        }
        shared.budget.record_failure_at(now);
        if matches!(pushback, Some(Pushback::RetryAfter(_))) {
            shared.budget.record_pushback_at(now);
        }
    } else if !is_overload(code, pushback)
        && let Some(permit) = permit
    {
        permit.success_at(now);
    }
}

/// An answer that says the server is overloaded or out of time: never a sign of health.
pub(super) fn is_overload(code: Code, pushback: Option<Pushback>) -> bool {
    pushback.is_some() || code.is_overload()
}

impl CallRetry {
    /// Attempts made before the one in flight: the value of `grpc-previous-rpc-attempts`
    /// (0 on the first attempt).
    pub fn previous_attempts(&self) -> u32 {
        self.previous_attempts
    }

    /// The caller's deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// Time left at `now` on the caller's deadline.
    pub fn remaining_at(&self, now: Instant) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(now))
    }

    /// Whether the method may be sent more than once at all (retried or hedged); when it
    /// may not, there is no need to buffer its request body.
    pub fn is_retryable_method(&self) -> bool {
        self.policy.is_some() || self.hedge.is_some()
    }

    /// The attempt answered `OK`: deposits into the budget and reports a success to the
    /// breaker. Only `OK` mints retries (as in gRPC A6 and its C-core and Java clients).
    pub fn on_success_at(&mut self, now: Instant) {
        record_success(&self.shared, &mut self.permit, self.key, now);
    }

    /// The attempt failed before the call was committed. Records the failure (breaker,
    /// throttle) and decides whether to retry.
    ///
    /// A keyed call answered `ABORTED` by a server that did not run it
    /// ([`Failure::unprocessed`]) met a first run of the same key still in progress: that is
    /// no failure of the dependency (recorded nowhere) and, whatever the method's retryable
    /// codes, it is retried under every other rule, after the server's pushback, so that
    /// the retry finds the first run's recorded answer.
    pub(crate) fn on_failure_at(&mut self, failure: &Failure, now: Instant) -> Decision {
        let in_progress = self.is_keyed() && failure.unprocessed && failure.code == Code::Aborted;
        let retryable_code = if in_progress {
            drop(self.permit.take());
            true
        } else {
            self.record_outcome_at(failure.code, failure.pushback, now)
        };
        let deadline_passed = self.deadline.is_some_and(|d| now >= d);
        match self.decide(failure, retryable_code, deadline_passed, now) {
            Ok(delay) => Decision::Retry { delay },
            Err(refusal) => Decision::GiveUp(refusal),
        }
    }

    #[cfg(test)]
    /// How long each attempt may take: the method policy's
    /// [`per_attempt_timeout`](RetryPolicy::per_attempt_timeout), else the layer's (see
    /// [`RetryController::begin_call_at`](crate::RetryController::begin_call_at)), if any.
    pub(crate) fn per_attempt_timeout(&self) -> Option<Duration> {
        self.attempt_timeout
    }

    /// The first attempt is about to be sent at `now`: what it carries and when it must end.
    pub fn first_attempt_at(&mut self, now: Instant) -> AttemptPlan {
        if let Some(hedge) = self.hedge.as_mut() {
            hedge.sent = 1;
            let delay = hedge.delay_at(now);
            hedge.schedule(now, delay);
        }
        self.plan_at(now, false)
    }

    /// The limits of an attempt sent at `now` (`transparent`: a transparent retry); records
    /// its own deadline.
    fn plan_at(&mut self, now: Instant, transparent: bool) -> AttemptPlan {
        // Saturates: an absurd timeout means "no practical limit", not a panic.
        let own = self
            .attempt_timeout
            .map(|t| Deadline::after_at(now, t).instant());
        self.attempt_deadline = match (self.deadline, own) {
            (Some(call), Some(attempt)) if attempt < call => Some(attempt),
            (Some(_), _) => None,
            (None, attempt) => attempt,
        };
        let fire_at = self.attempt_deadline.or(self.deadline);
        // The first attempt of a call whose deadline is the caller's own header keeps that
        // header (it was encoded a moment ago): no second encoding. Every other attempt
        // with a limit says what is left of it, a transparent retry of the first attempt
        // too (its request is rebuilt without the header).
        let first = self.previous_attempts == 0 && !transparent;
        let keep = first && self.caller_header && self.attempt_deadline.is_none();
        AttemptPlan {
            previous_attempts: self.previous_attempts,
            grpc_timeout: fire_at
                .filter(|_| !keep)
                .map(|at| at.saturating_duration_since(now)),
            fire_at,
            attempt_limit: self.attempt_deadline.and(self.attempt_timeout),
            transparent,
        }
    }

    /// The one entry point for an attempt that ended before the call committed (an `OK`
    /// goes to [`on_success_at`](Self::on_success_at), a commit to
    /// [`on_commit_at`](Self::on_commit_at)). In this order:
    ///
    /// 1. at or after the caller's deadline the call has expired, whatever the answer (the
    ///    channel's timer or a server's late `CANCELLED` may beat the layer's timer to it):
    ///    [`Decision::Expired`]. The caller's deadline says nothing about the dependency (a
    ///    batch job with 5 ms deadlines on a 10 ms method must not open the breaker every
    ///    other caller shares), so only an answer that is not itself an expiry is recorded;
    /// 2. a timer that ended the attempt before that is the attempt timing out; so is an
    ///    expiry answer (`DEADLINE_EXCEEDED`, or `CANCELLED`, tonic's answer to an expired
    ///    `grpc-timeout`) to an attempt whose `grpc-timeout` was its own per-attempt limit
    ///    (the plan's [`attempt_limit`](AttemptPlan::attempt_limit): its own deadline came
    ///    before the call's), whenever it arrives. A server that answers early because the
    ///    attempt cannot finish within that limit (a `ShedLayer` answers a queued call at
    ///    once when its wait would outlast it) has only said sooner what the layer's timer
    ///    would have said later. The attempt timing out is a failure of the dependency (the
    ///    breaker counts it, an A6 throttle takes a token), retried whatever the method's
    ///    retryable codes, under every other rule. An expiry answer to an attempt that
    ///    carried what was left of the call's own deadline (or no limit at all) is about the
    ///    call, not the attempt, and stays a plain answer (final unless the method retries
    ///    its code);
    /// 3. a failure that never reached the server's application ([`Failure::unsent`]: a
    ///    connection that could not be made, a stream HTTP/2 refused) is retried
    ///    *transparently*, as gRPC A6 retries such attempts, while the call has made fewer
    ///    than [`TRANSPARENT_RETRIES`] of them: at once (after a refused connection, when
    ///    the connection backoff gives the call a slot: [`CallRetry::on_connect_refused_at`]), not paid from the
    ///    budget or the request's allowance, not counted against `maxAttempts` nor in
    ///    `grpc-previous-rpc-attempts`, for a non-idempotent method too, and recorded nowhere
    ///    (the breaker permit is released without an outcome). It still needs a replayable
    ///    request, room on the call's deadline for a useful attempt, no pushback saying
    ///    otherwise, and a breaker that is not open ([`Verdict::transparent`] says so);
    /// 4. any other answer (an unsent failure past the bound included) is a failure:
    ///    recorded, then retried only if every rule of [`RetryController`](crate::RetryController) holds.
    pub fn on_attempt_end_at(&mut self, end: AttemptEnd, now: Instant) -> Verdict {
        if self.deadline.is_some_and(|d| now >= d) {
            let answer = match &end {
                AttemptEnd::Failed(f) => Some(f),
                AttemptEnd::TimedOut { .. } => None,
            };
            self.on_deadline_passed_at(answer, now);
            return Verdict {
                decision: Decision::Expired,
                attempt_timed_out: false,
                transparent: false,
            };
        }
        if let AttemptEnd::Failed(f) = &end
            && !f.unsent
        {
            // An answer came over a connection.
            self.shared.connect.connected();
        }
        if let AttemptEnd::Failed(f) = &end
            && let Some(decision) = self.transparent_retry_at(f, now)
        {
            return Verdict {
                decision,
                attempt_timed_out: false,
                transparent: matches!(decision, Decision::Retry { .. }),
            };
        }
        let (failure, timed_out) = match end {
            AttemptEnd::TimedOut { replayable, unsent } => (
                Failure {
                    code: Code::DeadlineExceeded,
                    pushback: None,
                    replayable,
                    unsent,
                    unprocessed: false,
                },
                true,
            ),
            AttemptEnd::Failed(f) => {
                // Set exactly when the attempt's own limit, not the call's deadline, was what
                // its `grpc-timeout` carried (see `plan_at`).
                let own_limit = self.attempt_deadline.is_some();
                let expiry = matches!(f.code, Code::DeadlineExceeded | Code::Cancelled);
                (f, own_limit && expiry)
            }
        };
        let decision = if timed_out {
            self.on_attempt_timeout_at(&failure, now)
        } else {
            self.on_failure_at(&failure, now)
        };
        Verdict {
            decision,
            attempt_timed_out: timed_out,
            transparent: false,
        }
    }

    /// The attempt ran out of its per-attempt timeout before the call's deadline: a
    /// failure of the dependency (the breaker counts it, an A6 throttle takes a token) that
    /// is retried like a retryable status whatever the method's retryable codes, under every
    /// other rule (pushback, idempotency, attempts, deadline, breaker, budget). `failure`
    /// says whether the request can be replayed; its code is read as `DEADLINE_EXCEEDED`.
    pub(crate) fn on_attempt_timeout_at(&mut self, failure: &Failure, now: Instant) -> Decision {
        let failure = Failure {
            code: Code::DeadlineExceeded,
            ..*failure
        };
        if let Some(permit) = self.permit.take() {
            permit.failure_at(now);
        }
        self.shared.budget.record_failure_at(now);
        let deadline_passed = self.deadline.is_some_and(|d| now >= d);
        match self.decide(&failure, true, deadline_passed, now) {
            Ok(delay) => Decision::Retry { delay },
            Err(refusal) => Decision::GiveUp(refusal),
        }
    }

    /// The call committed at `now` (response headers without a status arrived; it will not
    /// be retried). A half-open probe is settled as a success here: the dependency
    /// answered, and a long stream must not hold a probe slot (and so keep the breaker
    /// half-open) for as long as it lasts. Any other permit is settled when the call ends.
    pub fn on_commit_at(&mut self, now: Instant) {
        if self.permit.as_ref().is_some_and(BreakerPermit::is_probe)
            && let Some(permit) = self.permit.take()
        {
            permit.success_at(now);
        }
    }

    /// The call committed at `now` ([`on_commit_at`](Self::on_commit_at)), and what its end
    /// records from here on: a [`CommittedCall`], much smaller than the call's retry state,
    /// for the response body that carries it. Its [`on_ended_at`](CommittedCall::on_ended_at)
    /// records the end as [`on_committed_at`](Self::on_committed_at) would. A retry granted
    /// and not started (none can start after a commit) goes back to the budget now.
    pub fn commit_at(mut self, now: Instant) -> CommittedCall {
        self.on_commit_at(now);
        CommittedCall {
            shared: Arc::clone(&self.shared),
            retryable: self.retryable_codes(),
            permit: self.permit.take(),
            key: self.key,
            deadline: self.deadline,
        }
    }

    /// The caller's own deadline ran out at `now`; the call ends without a retry. `answer`
    /// is the failure that arrived at that moment, if one did. The caller's deadline says
    /// nothing about the dependency (a batch job with 5 ms deadlines on a 10 ms method must
    /// not open the breaker every other caller shares), so an expiry is recorded nowhere:
    /// the breaker permit is released without an outcome. An answer that is itself an
    /// expiry (`DEADLINE_EXCEEDED`, or `CANCELLED`, tonic's answer to an expired
    /// `grpc-timeout`) is the same; any other answer is recorded as it came. A dependency
    /// that hangs is seen by the breaker through the per-attempt timeout
    /// ([`on_attempt_end_at`](Self::on_attempt_end_at)).
    pub(crate) fn on_deadline_passed_at(&mut self, answer: Option<&Failure>, now: Instant) {
        match answer {
            Some(f) if !matches!(f.code, Code::DeadlineExceeded | Code::Cancelled) => {
                self.record_outcome_at(f.code, f.pushback, now);
            }
            _ => drop(self.permit.take()),
        }
    }

    /// A committed call (its response headers had arrived, so it is never retried) ended
    /// with `code`, e.g. a stream whose trailers carried a status. Records the outcome in
    /// the budget and the breaker as [`on_success_at`](Self::on_success_at) and
    /// [`on_attempt_end_at`](Self::on_attempt_end_at) would, and decides nothing.
    pub fn on_committed_at(&mut self, code: Code, now: Instant) {
        if code == Code::Ok {
            self.on_success_at(now);
        } else {
            self.record_outcome_at(code, None, now);
        }
    }

    /// Records an outcome; returns whether `code` is retryable for this method.
    ///
    /// For the budget and an A6 throttle only `OK` is a success and only a retryable code
    /// is a failure; any other code is neither (it mints nothing and costs nothing). For
    /// the breaker a retryable code is a failure, `OK` and application answers
    /// (`NOT_FOUND`, `INVALID_ARGUMENT`, ...) are signs of life, and an overload or expiry
    /// answer (`UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED`, `CANCELLED`, or
    /// any answer carrying a pushback) is never health: it releases the permit without an
    /// outcome.
    fn record_outcome_at(&mut self, code: Code, pushback: Option<Pushback>, now: Instant) -> bool {
        if code == Code::Ok {
            self.on_success_at(now);
            return false;
        }
        let retryable_code = self.retryable_codes().contains(code);
        record_outcome(
            &self.shared,
            &mut self.permit,
            retryable_code,
            code,
            pushback,
            now,
        );
        retryable_code
    }

    /// The codes that are failures of the dependency for this method: its policy's
    /// retryable codes, a hedged method's non-fatal ones, else `UNAVAILABLE`.
    fn retryable_codes(&self) -> CodeSet {
        match (&self.policy, &self.hedge) {
            (Some(p), _) => p.retryable_codes,
            (None, Some(h)) => h.policy.non_fatal_codes,
            (None, None) => CodeSet::single(Code::Unavailable),
        }
    }

    fn decide(
        &mut self,
        failure: &Failure,
        retryable_code: bool,
        deadline_passed: bool,
        now: Instant,
    ) -> Result<Duration, Refusal> {
        if deadline_passed {
            return Err(Refusal::Deadline);
        }
        let (Some(policy), Some(backoff)) = (&self.policy, &mut self.backoff) else {
            return Err(Refusal::NotRetryable);
        };
        if !retryable_code {
            return Err(Refusal::NotRetryable);
        }
        let pushback = match failure.pushback {
            Some(Pushback::DoNotRetry) => return Err(Refusal::Pushback),
            Some(Pushback::RetryAfter(d)) if d > policy.max_pushback => {
                return Err(Refusal::Pushback);
            }
            Some(Pushback::RetryAfter(d)) => Some(d),
            None => None,
        };
        let keyed = self.idempotency_key.is_some();
        if !policy.idempotent && !keyed && !failure.unsent && !failure.unprocessed {
            return Err(Refusal::NotIdempotent);
        }
        if !failure.replayable {
            return Err(Refusal::ReplayLimit);
        }
        if self.previous_attempts.saturating_add(1) >= policy.effective_max_attempts() {
            return Err(Refusal::Attempts);
        }
        let delay = match pushback {
            Some(d) => {
                backoff.reset();
                d
            }
            None => backoff.next_delay(),
        };
        if let Some(deadline) = self.deadline {
            let left = deadline.saturating_duration_since(now);
            if delay.saturating_add(policy.min_attempt_time) >= left {
                return Err(Refusal::Deadline);
            }
        }
        if let Some(breaker) = &self.shared.breaker
            && matches!(breaker.state_at(now), BreakerState::Open { .. })
        {
            return Err(Refusal::Breaker);
        }
        if self.saturated_at(now) {
            return Err(Refusal::Saturated);
        }
        if !context::spend_retry() {
            return Err(Refusal::Allowance);
        }
        self.spent_allowance = true;
        let keyed = self.shared.keyed.as_ref().zip(self.key);
        if let Some((keyed, key)) = keyed
            && !keyed.withdraw_at(key, now)
        {
            self.refund_allowance();
            return Err(Refusal::KeyBudget);
        }
        if !self.shared.budget.withdraw_at(now) {
            if let Some((keyed, key)) = keyed {
                keyed.refund_at(key, now);
            }
            self.refund_allowance();
            return Err(Refusal::Budget);
        }
        self.granted = Some(now);
        self.granted_key = keyed.map(|(_, key)| key);
        Ok(delay)
    }

    /// Gives back to the budget (and to the key that paid, if any) a retry granted at
    /// `at` that never started.
    fn refund_budget(&mut self, at: Instant) {
        self.shared.budget.refund_at(at);
        if let (Some(keyed), Some(key)) = (&self.shared.keyed, self.granted_key.take()) {
            keyed.refund_at(key, at);
        }
    }

    /// The retry's delay has passed and it is about to be sent: takes a breaker permit for
    /// the next attempt and counts it. Fails when the breaker opened meanwhile or the
    /// deadline passed; the budget then gets the retry back, as it does when the call is
    /// dropped before the retry starts.
    pub fn start_retry_at(&mut self, now: Instant) -> Result<AttemptPlan, Refusal> {
        let transparent = std::mem::take(&mut self.pending_transparent);
        let started = self
            .try_start_retry_at(now, transparent)
            .map(|()| self.plan_at(now, transparent));
        if let Some(at) = self.granted.take()
            && started.is_err()
        {
            self.refund_budget(at);
            self.refund_allowance();
        }
        self.granted_key = None;
        self.spent_allowance = false;
        started
    }

    /// Gives back the allowance the pending retry spent, if it spent one.
    fn refund_allowance(&mut self) {
        if std::mem::take(&mut self.spent_allowance) {
            context::refund_retry();
        }
    }

    fn try_start_retry_at(&mut self, now: Instant, transparent: bool) -> Result<(), Refusal> {
        if self.deadline.is_some_and(|d| now >= d) {
            return Err(Refusal::Deadline);
        }
        if let Some(breaker) = &self.shared.breaker {
            self.permit = Some(breaker.acquire_at(now).map_err(|_| Refusal::Breaker)?);
        }
        if transparent {
            // The attempt it replaces never reached the application: same number.
            self.transparent_retries = self.transparent_retries.saturating_add(1);
        } else {
            self.previous_attempts = self.previous_attempts.saturating_add(1);
        }
        Ok(())
    }

    /// An attempt of this call was answered by `endpoint` (the replica, or one key for
    /// a plain channel) with the load report `report` at `now`: fed to the controller's
    /// [`Saturation`](crate::Saturation), if it has one (else nothing happens).
    pub fn record_load_report_at(&self, endpoint: u64, report: &LoadReport, now: Instant) {
        if let Some(saturation) = &self.shared.saturation {
            saturation.record_at(endpoint, report, now);
        }
    }

    /// The dependency has `n` endpoints a retry could go to (the replicas of an
    /// endpoint-aware channel; 1, the default, for a plain channel): a retry is refused as
    /// [`Refusal::Saturated`] only once that many were heard from saturated, and none
    /// heard from recently said otherwise (see [`Saturation`](crate::Saturation)).
    pub fn set_endpoints(&mut self, n: usize) {
        self.endpoints = n.max(1);
    }

    /// Whether the load reports say every endpoint is saturated.
    fn saturated_at(&self, now: Instant) -> bool {
        self.shared
            .saturation
            .as_ref()
            .is_some_and(|s| s.refuses_retry_at(self.endpoints, now))
    }
}
