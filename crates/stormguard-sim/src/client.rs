//! The simulated client layer: one logical call, step by step.
//!
//! [`SimCall`] is what the fleet runs for every call, and what the client crate's parity
//! test runs beside the real `RetryLayer`: it moves the same events (an answer, the
//! layer's timer, a retry's delay over) into the same policy object (core's
//! [`CallRetry`]) at the same moments as the layer does, so the two make the same decisions
//! by construction and the test checks that they do.

use std::time::Duration;

use stormguard_core::CallTimes;
use stormguard_core::Code;
use stormguard_core::Instant;
use stormguard_core::{
    AttemptEnd, AttemptPlan, CallRetry, Decision, Failure, Refusal, RetryController,
};

/// How a logical call ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// An attempt answered `OK`.
    Ok,
    /// The call gave up on this failure (or its retry could not start).
    GaveUp(Refusal, Failure),
    /// An attempt ran out of its per-attempt timeout and was not retried.
    TimedOut(Refusal),
    /// The caller's deadline ran out.
    Expired,
}

impl End {
    /// The status code the caller gets, as the client layer answers it.
    pub fn code(self) -> Code {
        match self {
            End::Ok => Code::Ok,
            End::GaveUp(_, failure) => failure.code,
            End::TimedOut(_) | End::Expired => Code::DeadlineExceeded,
        }
    }
}

/// What the simulated layer does next with a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send an attempt as the plan says (and arm the timer at its `fire_at`).
    Send(AttemptPlan),
    /// Wait this long, then call [`SimCall::retry_due`].
    Wait(Duration),
    /// The call is over.
    End(End),
}

/// One logical call of the simulated client layer.
#[derive(Debug)]
pub struct SimCall {
    retry: CallRetry,
    /// The failure the pending retry retries: what the caller gets if it cannot start.
    last: Option<Failure>,
}

impl SimCall {
    /// Starts a call to `path` at `now`, as the layer's `call` does: refused when the
    /// breaker is open (the layer answers `UNAVAILABLE` at once), over at once when its
    /// deadline had already passed (nothing is sent and nothing recorded), else its first
    /// attempt.
    pub fn begin_at(
        controller: &RetryController,
        path: &str,
        times: &CallTimes,
        now: Instant,
    ) -> Result<(SimCall, Step), Refusal> {
        let mut retry = controller.begin_call_at(path, times, now)?;
        let step = if retry.deadline().is_some_and(|d| d <= now) {
            Step::End(End::Expired)
        } else {
            Step::Send(retry.first_attempt_at(now))
        };
        Ok((SimCall { retry, last: None }, step))
    }

    /// The call's retry state.
    pub fn retry(&self) -> &CallRetry {
        &self.retry
    }

    /// The attempt in flight was answered at `now`: `None` for `OK`, else the failure. A
    /// failure that never reached the server's application ([`Failure::unsent`]: a refused
    /// connection or stream) is retried transparently, as the layer retries it: a
    /// [`Step::Wait`] of zero, then a [`Step::Send`] whose plan is
    /// [`transparent`](AttemptPlan::transparent) and keeps its attempt number.
    pub fn answered_at(&mut self, failure: Option<Failure>, now: Instant) -> Step {
        match failure {
            None => {
                self.retry.on_success_at(now);
                Step::End(End::Ok)
            }
            Some(failure) => self.ended_at(AttemptEnd::Failed(failure), failure, now),
        }
    }

    /// The attempt in flight could not connect to the dependency at `now` (the layer reads
    /// a connection error so, outside `Replicas`): as [`answered_at`](Self::answered_at)
    /// with an unsent `UNAVAILABLE`, its transparent retry waiting for the dependency's
    /// connection backoff ([`CallRetry::on_connect_refused_at`]), as the layer's does.
    pub fn connect_refused_at(&mut self, now: Instant) -> Step {
        self.retry.on_connect_refused_at(now);
        let failure = Failure {
            unsent: true,
            ..Failure::status(Code::Unavailable)
        };
        self.ended_at(AttemptEnd::Failed(failure), failure, now)
    }

    /// The layer's timer fired at `now` while the attempt was in flight (the caller's
    /// deadline or the attempt's own timeout: the retry state tells them apart).
    pub fn timer_at(&mut self, now: Instant) -> Step {
        let end = AttemptEnd::TimedOut {
            replayable: true,
            unsent: false,
        };
        self.ended_at(end, Failure::status(Code::DeadlineExceeded), now)
    }

    fn ended_at(&mut self, end: AttemptEnd, failure: Failure, now: Instant) -> Step {
        let verdict = self.retry.on_attempt_end_at(end, now);
        match verdict.decision {
            Decision::Retry { delay } => {
                self.last = Some(failure);
                Step::Wait(delay)
            }
            Decision::Expired => Step::End(End::Expired),
            Decision::GiveUp(refusal) if verdict.attempt_timed_out => {
                Step::End(End::TimedOut(refusal))
            }
            Decision::GiveUp(refusal) => Step::End(End::GaveUp(refusal, failure)),
        }
    }

    /// A retry's delay is over at `now`: its attempt, or the end when it cannot start. (The
    /// layer's timer watches the caller's deadline during the delay; a granted delay ends
    /// before it, and were it past, `start_retry_at` refuses and gives the grant back, as
    /// the layer's expiry does by dropping the call state.)
    pub fn retry_due(&mut self, now: Instant) -> Step {
        match self.retry.start_retry_at(now) {
            Ok(plan) => Step::Send(plan),
            Err(refusal) => {
                let last = self.last.unwrap_or(Failure::status(Code::Unavailable));
                Step::End(End::GaveUp(refusal, last))
            }
        }
    }
}
