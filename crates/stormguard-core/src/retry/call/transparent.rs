//! Transparent retries: an attempt that never reached the server's application is sent
//! again for free, a bounded number of times per call: at once, or after a refused
//! connection when the connection backoff allows the next one.

use std::time::Duration;

use tokio::time::Instant;

use super::CallRetry;
use crate::retry::breaker::BreakerState;
use crate::retry::decision::{Decision, Failure, Refusal};
use crate::wire::pushback::Pushback;

/// How many transparent retries one logical call may make (see
/// [`CallRetry::on_attempt_end_at`], step 3); past them an unsent failure is an ordinary
/// failure: recorded, paid from the budget, counted against `maxAttempts`.
///
/// Why a bound, and why 3: gRPC A6 retries an attempt that never left the client without
/// limit, but against a single server whose process is gone every connection attempt
/// fails at once, and an unbounded free retry would be a hot loop until the deadline. A
/// rolling restart or a graceful `GOAWAY` refuses a call once or twice (the connection that
/// closed, then perhaps a replica that is also draining); three free retries cover that.
/// Against a dead server a refused connection makes the next transparent retry wait for
/// the connection backoff ([`CallRetry::on_connect_refused_at`]), so a call costs about one
/// connection attempt. A failure that is not unsent does not use them up.
pub const TRANSPARENT_RETRIES: u32 = 3;

/// The longest a call without a deadline waits for its slot of the connection backoff
/// before a transparent retry ([`CallRetry::on_connect_refused_at`]): 10 s, the longest
/// backoff step. A slot further off (the slots of calls refused before it come first) is
/// not waited for: the call fails with the refused attempt's `UNAVAILABLE`, as a call with
/// a deadline does when its slot is past it. So a caller without deadlines waits at most
/// 10 s per transparent retry however many calls are refused beside it.
pub const CONNECT_SLOT_WAIT: Duration = Duration::from_secs(10);

impl CallRetry {
    /// The transparent retry of `failure`, when it is one (see
    /// [`on_attempt_end_at`](Self::on_attempt_end_at), step 3): `None` when the failure may
    /// have reached the application or the call has used its transparent retries, and it
    /// goes the ordinary way.
    pub(super) fn transparent_retry_at(
        &mut self,
        failure: &Failure,
        now: Instant,
    ) -> Option<Decision> {
        if !failure.unsent || self.transparent_retries >= TRANSPARENT_RETRIES {
            return None;
        }
        let policy = self.policy.as_ref()?;
        // Recorded nowhere: the dependency's application never saw the attempt.
        drop(self.permit.take());
        // After a refused connection, the next connection the backoff allows.
        let delay = self
            .connect_at
            .take()
            .map_or(Duration::ZERO, |at| at.saturating_duration_since(now));
        let refusal = if matches!(failure.pushback, Some(Pushback::DoNotRetry)) {
            Some(Refusal::Pushback)
        } else if !failure.replayable {
            Some(Refusal::ReplayLimit)
        } else if self
            .deadline
            .is_some_and(|d| delay + policy.min_attempt_time >= d.saturating_duration_since(now))
        {
            Some(Refusal::Deadline)
        } else if self.deadline.is_none() && delay > CONNECT_SLOT_WAIT {
            Some(Refusal::ConnectBackoff)
        } else if self
            .shared
            .breaker
            .as_ref()
            .is_some_and(|b| matches!(b.state_at(now), BreakerState::Open { .. }))
        {
            Some(Refusal::Breaker)
        } else {
            None
        };
        Some(match refusal {
            Some(refusal) => Decision::GiveUp(refusal),
            None => {
                self.pending_transparent = true;
                Decision::Retry { delay }
            }
        })
    }

    /// The attempt that just ended could not connect to the dependency: its transparent
    /// retry, if any, waits for the next free slot of the dependency's connection backoff
    /// (1 s after the first refusal, each refused call one step later, ×1.6 per refusal
    /// in a row, at most 10 s, jittered), and is not made when that is past the call's
    /// deadline; until an answer comes, new calls' first attempts are refused but for one
    /// probe per slot ([`RetryController::begin_call_at`](crate::RetryController::begin_call_at)). Call it
    /// before [`on_attempt_end_at`](Self::on_attempt_end_at) with the attempt's unsent
    /// failure, for a connection to the dependency as a whole: a failed connection to one
    /// replica of several is the balancer's to route around, at once.
    ///
    /// A call without a deadline waits at most [`CONNECT_SLOT_WAIT`] for its slot. A call
    /// that will not wait for its slot (past its deadline or that bound, or no transparent
    /// retry left) leaves it to the next refused call.
    pub fn on_connect_refused_at(&mut self, now: Instant) {
        let limit = match &self.policy {
            Some(_) if self.transparent_retries >= TRANSPARENT_RETRIES => now,
            Some(policy) => match self.deadline {
                // The check of `transparent_retry_at`: a slot leaving less than
                // `min_attempt_time` before the deadline is not waited for.
                Some(deadline) => deadline
                    .checked_sub(policy.min_attempt_time + Duration::from_nanos(1))
                    .unwrap_or(now),
                None => now + CONNECT_SLOT_WAIT,
            },
            None => now,
        };
        self.connect_at = Some(match self.shared.connect.refused_at(now, limit) {
            Ok(slot) | Err(slot) => slot,
        });
    }

    #[cfg(test)]
    /// Transparent retries this call has made (each replaced an attempt that never reached
    /// the server's application; see [`on_attempt_end_at`](Self::on_attempt_end_at)).
    pub(crate) fn transparent_retries(&self) -> u32 {
        self.transparent_retries
    }
}
