//! What the retry decision answers: why not ([`Refusal`]), what happened ([`Failure`],
//! [`AttemptEnd`]), what follows ([`Decision`], [`Verdict`]) and what the next attempt
//! carries ([`AttemptPlan`]).

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

use crate::wire::code::Code;
use crate::wire::pushback::Pushback;

/// Why a failed attempt was not retried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Refusal {
    /// The status is not retryable for this method, or the method has no retry policy.
    NotRetryable,
    /// The method is neither idempotent nor keyed (an idempotency key) and the request may
    /// have reached the server.
    NotIdempotent,
    /// The server's pushback said not to retry.
    Pushback,
    /// The attempt limit was reached.
    Attempts,
    /// Not enough time is left on the caller's deadline.
    Deadline,
    /// The circuit breaker is open.
    Breaker,
    /// The retry budget is spent.
    Budget,
    /// The key the failed attempt went to (its replica, or the request's shard) has spent
    /// its own account: see [`KeyedBudgets`](crate::budget::KeyedBudgets).
    KeyBudget,
    /// The request body was too large to buffer for replay.
    ReplayLimit,
    /// The request-scoped retry allowance (`x-retry-budget`) is spent.
    Allowance,
    /// The dependency's recent load reports (ORCA) say it is saturated: every endpoint
    /// heard from is running at its limit with calls queued (see
    /// [`LoadReport`](crate::LoadReport)).
    Saturated,
    /// The dependency refused connections and is in connection backoff (gRPC's
    /// `TRANSIENT_FAILURE`): a call's first attempt is not sent, except the one probe per
    /// backoff slot (see [`RetryController::begin_call_at`](crate::RetryController::begin_call_at)).
    ConnectBackoff,
}

impl Refusal {
    /// Every refusal, in declaration order (the [docs](crate::RetryController) give the order in which
    /// the checks run: a passed deadline first, the budget last).
    pub const ALL: [Refusal; 12] = [
        Refusal::NotRetryable,
        Refusal::NotIdempotent,
        Refusal::Pushback,
        Refusal::Attempts,
        Refusal::Deadline,
        Refusal::Breaker,
        Refusal::Budget,
        Refusal::KeyBudget,
        Refusal::ReplayLimit,
        Refusal::Allowance,
        Refusal::Saturated,
        Refusal::ConnectBackoff,
    ];

    /// A short stable name, used as a metric label and a JSON key.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::NotRetryable => "not_retryable",
            Refusal::NotIdempotent => "not_idempotent",
            Refusal::Pushback => "pushback",
            Refusal::Attempts => "attempts",
            Refusal::Deadline => "deadline",
            Refusal::Breaker => "breaker",
            Refusal::Budget => "budget",
            Refusal::KeyBudget => "key_budget",
            Refusal::ReplayLimit => "replay_limit",
            Refusal::Allowance => "allowance",
            Refusal::Saturated => "saturated",
            Refusal::ConnectBackoff => "connect_backoff",
        }
    }

    /// Whether the failure was retryable and stormguard chose not to retry it (budget,
    /// breaker, attempts, deadline, request allowance). Such a failure should not be retried
    /// by any layer above either: the client layer answers it with
    /// `grpc-retry-pushback-ms: -1`.
    pub fn is_retryable_but_refused(self) -> bool {
        matches!(
            self,
            Refusal::Attempts
                | Refusal::Deadline
                | Refusal::Breaker
                | Refusal::Budget
                | Refusal::KeyBudget
                | Refusal::Allowance
                | Refusal::Saturated
        )
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What is known about a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failure {
    /// The status code of the attempt (`UNAVAILABLE` for a transport failure).
    pub code: Code,
    /// The server's `grpc-retry-pushback-ms`, if it sent one.
    pub pushback: Option<Pushback>,
    /// Whether the request can be sent again (its body was buffered).
    pub replayable: bool,
    /// Whether the request provably never reached the server's application: the connection
    /// could not be made, HTTP/2 refused the stream (`REFUSED_STREAM`, or a stream above a
    /// `GOAWAY`'s last stream id), or the request was never handed to a connection. Even a
    /// non-idempotent method may then be retried, and the retry is
    /// [transparent](super::CallRetry::on_attempt_end_at) while the call has transparent
    /// retries left.
    pub unsent: bool,
    /// Whether the server said its application never ran the request (a stormguard
    /// server's own answer: shed, shutting down, expired while queued; the
    /// `stormguard-unprocessed` header), so that a non-idempotent method may be retried
    /// too. Unlike `unsent`, such a retry is paid and counted as any other.
    pub unprocessed: bool,
}

impl Failure {
    /// A replayable failure with `code`, no pushback, that may have reached the server.
    pub fn status(code: Code) -> Self {
        Failure {
            code,
            pushback: None,
            replayable: true,
            unsent: false,
            unprocessed: false,
        }
    }
}

/// The verdict on a failed attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Wait `delay`, call [`CallRetry::start_retry_at`](super::CallRetry::start_retry_at),
    /// then send the next attempt.
    Retry {
        /// How long to wait first.
        delay: Duration,
    },
    /// Return the last status to the caller.
    GiveUp(Refusal),
    /// The caller's deadline has passed: the call ends with `DEADLINE_EXCEEDED`, never
    /// retried, whatever the attempt's answer was (only
    /// [`CallRetry::on_attempt_end_at`](super::CallRetry::on_attempt_end_at) decides this).
    Expired,
}

/// How an attempt ended before the call committed, as the layer (or the simulator) saw it:
/// the one input of [`CallRetry::on_attempt_end_at`](super::CallRetry::on_attempt_end_at).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptEnd {
    /// An answer that is not `OK`: a trailers-only status, a proxy's HTTP error, or a
    /// transport error read as a status.
    Failed(Failure),
    /// A timer ended the attempt without an answer: the layer's own timer, or one below it
    /// (the channel's `grpc-timeout` timer, `Endpoint::timeout`, a `tower::timeout`).
    TimedOut {
        /// Whether the request can be sent again.
        replayable: bool,
        /// Whether the request provably never reached the server (a connection that timed
        /// out), as in [`Failure::unsent`].
        unsent: bool,
    },
}

/// The verdict on an ended attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verdict {
    /// What follows.
    pub decision: Decision,
    /// Whether the attempt ran out of its per-attempt timeout (then it was recorded as a
    /// failure of the dependency, and a give-up answers `DEADLINE_EXCEEDED`).
    pub attempt_timed_out: bool,
    /// Whether the retry granted is transparent: the attempt never reached the server's
    /// application ([`Failure::unsent`]), so its retry is free. It is not paid from the
    /// budget, not counted against `maxAttempts` nor in `grpc-previous-rpc-attempts` (the
    /// plan [`start_retry_at`](super::CallRetry::start_retry_at) makes carries the same number as the
    /// attempt it replaces), not a failure for the breaker, and sent without a delay. Only
    /// with [`Decision::Retry`].
    pub transparent: bool,
}

/// What the attempt about to be sent carries and when it must end: from
/// [`CallRetry::first_attempt_at`](super::CallRetry::first_attempt_at) and
/// [`CallRetry::start_retry_at`](super::CallRetry::start_retry_at).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttemptPlan {
    /// Attempts before this one: the value of `grpc-previous-rpc-attempts` (0 on the first).
    pub previous_attempts: u32,
    /// The `grpc-timeout` to write on the attempt; `None` when the request must keep what it
    /// has (no deadline, or the caller's own header, which is already this attempt's limit).
    pub grpc_timeout: Option<Duration>,
    /// When the layer's timer fires: the earlier of the call's deadline and the attempt's own.
    pub fire_at: Option<Instant>,
    /// The per-attempt timeout, when it is what limits this attempt (its own deadline comes
    /// before the call's): `grpc_timeout` is then exactly this, the same for every such
    /// attempt of the method, so a layer may encode it once.
    pub attempt_limit: Option<Duration>,
    /// Whether this attempt is a transparent retry (see [`Verdict::transparent`]): it
    /// replaces an attempt that never reached the server's application, and carries the same
    /// `previous_attempts`. A layer counts it apart from the retries it paid for.
    pub transparent: bool,
}
