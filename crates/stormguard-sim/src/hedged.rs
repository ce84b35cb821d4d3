//! The simulated client layer's hedged call: several copies of one call in flight, the
//! first `OK` wins.
//!
//! [`HedgedCall`] drives core's [`CallRetry`] with the calls the client layer's hedged
//! future (`stormguard-client`'s `retry/future/hedged.rs`) makes, in the same order. Each
//! time the layer would poll the call (it starts, its one timer fires, a copy answers):
//!
//! 1. the call's deadline: when it has passed, every copy is cancelled and the call ends
//!    with `DEADLINE_EXCEEDED`;
//! 2. a hedge that is due ([`CallRetry::next_hedge_at`]) is sent if
//!    [`CallRetry::start_hedge_at`] grants it (a refusal stops the call's hedges);
//! 3. when no copy is in flight and no hedge may follow, the call gives up with
//!    [`CallRetry::hedges_stopped`] (else [`Refusal::Attempts`]) and the last failure;
//! 4. the timer is armed at the earlier of the deadline and the next hedge;
//! 5. the copy that answered, if any: its latency is recorded
//!    ([`CallRetry::record_hedge_latency_at`]); `OK` wins (every other copy is cancelled,
//!    each recorded for the time it ran, then [`CallRetry::on_success_at`]); a failure
//!    goes to [`CallRetry::on_hedge_end_at`] with the copies still in flight, and its
//!    [`HedgeDecision`] says whether to wait for the others, give up or expire.
//!
//! The simulator's channel is always ready, so a due hedge never waits for it. A simulated
//! answer has no streamed body, so no copy commits.

use stormguard_core::CallTimes;
use stormguard_core::Code;
use stormguard_core::Instant;
use stormguard_core::{
    AttemptEnd, AttemptPlan, CallRetry, Failure, HedgeDecision, Refusal, RetryController,
};

use crate::client::End;

/// What the simulated layer does next with a hedged call, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send copy `copy` (0 is the first attempt, `n` the n-th hedge) as `plan` says. A
    /// copy has no timer of its own: its `plan.fire_at` is the call's deadline.
    Send {
        /// The copy's number in the call.
        copy: u32,
        /// What it carries.
        plan: AttemptPlan,
    },
    /// Cancel copy `copy` (its stream is reset, which tells the server).
    Cancel {
        /// The copy's number in the call.
        copy: u32,
    },
    /// Arm the call's one timer at this instant (replacing the one armed before), and
    /// call [`HedgedCall::timer_at`] when it fires.
    Arm(Option<Instant>),
    /// The call is over.
    End(End),
}

/// One hedged logical call of the simulated client layer.
#[derive(Debug)]
pub struct HedgedCall {
    retry: CallRetry,
    /// Copies in flight: their number and when each was sent.
    copies: Vec<(u32, Instant)>,
    /// The last failure of a copy while the others went on: what the caller gets if no
    /// copy is left and none may follow.
    last: Option<Failure>,
    /// The hedge the call's retry state refused, if one was.
    refused: Option<Refusal>,
    /// The copy that won.
    won_by: Option<u32>,
    over: bool,
}

impl HedgedCall {
    /// Starts a call to `path` at `now`, as the layer's `call` does: refused when the
    /// breaker is open, over at once when its deadline had already passed, else its first
    /// copy is sent and the call polled once (a zero hedge delay sends hedges at once).
    /// The actions go to `out`. A method with no hedging policy is sent once.
    pub fn begin_at(
        controller: &RetryController,
        path: &str,
        times: &CallTimes,
        now: Instant,
        out: &mut Vec<Action>,
    ) -> Result<HedgedCall, Refusal> {
        let retry = controller.begin_call_at(path, times, now)?;
        let mut call = HedgedCall {
            retry,
            copies: Vec::new(),
            last: None,
            refused: None,
            won_by: None,
            over: false,
        };
        if call.retry.deadline().is_some_and(|d| d <= now) {
            call.over = true;
            out.push(Action::End(End::Expired));
            return Ok(call);
        }
        let plan = call.retry.first_attempt_at(now);
        call.copies.push((0, now));
        out.push(Action::Send { copy: 0, plan });
        call.poll_at(now, out);
        Ok(call)
    }

    /// The call's retry state.
    pub fn retry(&self) -> &CallRetry {
        &self.retry
    }

    /// Copies in flight.
    pub fn in_flight(&self) -> usize {
        self.copies.len()
    }

    /// The hedge the retry state refused (its refusal stopped the call's hedges), if one
    /// was.
    pub fn refused(&self) -> Option<Refusal> {
        self.refused
    }

    /// The copy whose `OK` won the call, once one has.
    pub fn won_by(&self) -> Option<u32> {
        self.won_by
    }

    /// Whether the call is over.
    pub fn is_over(&self) -> bool {
        self.over
    }

    /// The timer armed by the last [`Action::Arm`] fired at `now`.
    pub fn timer_at(&mut self, now: Instant, out: &mut Vec<Action>) {
        self.poll_at(now, out);
    }

    /// Copy `copy` was answered at `now`: `None` for `OK`, else the failure. A copy that is
    /// not in flight (cancelled, or the call is over) is ignored.
    pub fn answered_at(
        &mut self,
        copy: u32,
        failure: Option<Failure>,
        now: Instant,
        out: &mut Vec<Action>,
    ) {
        if self.over || !self.copies.iter().any(|(c, _)| *c == copy) {
            return;
        }
        // The layer sees the answer when it polls the copies, after its own checks.
        if !self.checks_at(now, out) {
            return;
        }
        let Some(i) = self.copies.iter().position(|(c, _)| *c == copy) else {
            return;
        };
        let (_, started) = self.copies.swap_remove(i);
        self.retry
            .record_hedge_latency_at(now.saturating_duration_since(started), now);
        let Some(failure) = failure else {
            self.won_by = Some(copy);
            self.cancel_all(now, out);
            self.retry.on_success_at(now);
            self.end(End::Ok, out);
            return;
        };
        let in_flight = self.copies.len();
        match self
            .retry
            .on_hedge_end_at(AttemptEnd::Failed(failure), in_flight, now)
        {
            HedgeDecision::Wait => {
                self.last = Some(failure);
                self.poll_at(now, out);
            }
            HedgeDecision::GiveUp(refusal) => {
                self.cancel_all(now, out);
                self.end(End::GaveUp(refusal, failure), out);
            }
            HedgeDecision::Expired => {
                self.cancel_all(now, out);
                self.end(End::Expired, out);
            }
        }
    }

    /// One poll of the layer without an answer: its checks, then its timer.
    fn poll_at(&mut self, now: Instant, out: &mut Vec<Action>) {
        if !self.checks_at(now, out) {
            return;
        }
        out.push(Action::Arm(earlier(
            self.retry.deadline(),
            self.retry.next_hedge_at(),
        )));
    }

    /// The checks the layer makes each poll before it polls the copies (deadline, due
    /// hedges, nothing left to wait for); `false` when they ended the call.
    fn checks_at(&mut self, now: Instant, out: &mut Vec<Action>) -> bool {
        loop {
            if self.over {
                return false;
            }
            if self.retry.deadline().is_some_and(|d| now >= d) {
                self.cancel_all(now, out);
                self.end(End::Expired, out);
                return false;
            }
            if self.retry.next_hedge_at().is_some_and(|at| at <= now) {
                self.send_hedge(now, out);
            }
            if self.copies.is_empty() && self.retry.next_hedge_at().is_none() {
                let why = self.retry.hedges_stopped().unwrap_or(Refusal::Attempts);
                let last = self
                    .last
                    .take()
                    .unwrap_or(Failure::status(Code::Unavailable));
                self.end(End::GaveUp(why, last), out);
                return false;
            }
            // A hedge due now (a zero delay) fires the layer's timer at once: poll again.
            if self.retry.next_hedge_at().is_none_or(|at| at > now) {
                return true;
            }
        }
    }

    fn send_hedge(&mut self, now: Instant, out: &mut Vec<Action>) {
        match self.retry.start_hedge_at(now) {
            Ok(plan) => {
                let copy = self.retry.hedges_sent().saturating_sub(1);
                self.copies.push((copy, now));
                out.push(Action::Send { copy, plan });
            }
            Err(refusal) => self.refused = Some(refusal),
        }
    }

    /// Cancels every copy in flight at `now`, recording how long each ran.
    fn cancel_all(&mut self, now: Instant, out: &mut Vec<Action>) {
        for (copy, started) in self.copies.drain(..) {
            self.retry
                .record_hedge_latency_at(now.saturating_duration_since(started), now);
            out.push(Action::Cancel { copy });
        }
    }

    fn end(&mut self, end: End, out: &mut Vec<Action>) {
        self.over = true;
        out.push(Action::End(end));
    }
}

/// The earlier of two optional instants.
fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}
