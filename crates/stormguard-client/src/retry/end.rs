//! How a call ends when the layer does not pass an answer through: the status the caller
//! gets, what is counted, and the event that says why.
//!
//! Every give-up on a *retryable* failure (budget, breaker, attempts, deadline, the
//! request's allowance) is marked `grpc-retry-pushback-ms: -1`, so that no layer above
//! retries the same failure, and is recorded in the current request scope, so that the
//! server layer around a handler can mark the handler's own answer too.

use std::time::Duration;

use http::Uri;
use stormguard_core::Code;
use stormguard_core::Refusal;
use stormguard_core::Throttled;
use stormguard_core::context;
use tonic::Status;

use super::body::ResponseBody;
use super::classify::Last;
use super::record::CallStats;
use crate::status::{
    BoxError, classify_error, mark_do_not_retry, status_do_not_retry, status_from_error,
};

/// What the future of a call returns.
pub(super) type CallResult<B> = Result<http::Response<ResponseBody<B>>, BoxError>;

/// The retry state refused the call before its first attempt (`breaker`: the breaker is
/// open; `connect_backoff`: the dependency refused connections and its connection backoff
/// holds new attempts until the next probe): the first attempt is not sent, and callers
/// above are told not to retry into it either.
pub(super) fn not_sent(stats: &mut CallStats, refusal: Refusal) -> Status {
    stats.refused(refusal);
    stats.outcome(Code::Unavailable);
    let why = match refusal {
        Refusal::ConnectBackoff => {
            "the dependency refused connections and its connection is in backoff \
             (one probe per backoff slot tries to connect)"
        }
        _ => "the circuit breaker is open",
    };
    status_do_not_retry(Status::unavailable(format!(
        "stormguard: call not sent ({refusal}): {why}"
    )))
}

/// The adaptive throttle refused the call locally: it is not sent, and callers above are
/// told not to retry it either (the dependency is refusing calls for overload).
pub(super) fn throttled(stats: &mut CallStats, uri: &Uri, throttled: Throttled) -> Status {
    stats.throttled(throttled.class);
    stats.outcome(Code::Unavailable);
    let events = stats.events();
    tracing::debug!(
        stormguard.layer = events.name().get().map_or("", |n| &**n),
        rpc.method = uri.path(),
        throttle.criticality = throttled.class.as_str(),
        throttle.probability = throttled.probability,
        "stormguard: call rejected by the client throttle"
    );
    events.throttled(throttled.class, uri.path());
    status_do_not_retry(Status::unavailable(format!(
        "stormguard: call not sent: {throttled}"
    )))
}

/// The caller set an idempotency key the server would refuse (empty, too long, not visible
/// ASCII, repeated): the call is not sent, and the caller gets `INVALID_ARGUMENT` saying
/// why, as the server would have answered.
pub(super) fn bad_idempotency_key(
    stats: &mut CallStats,
    error: &stormguard_core::wire::IdempotencyKeyError,
) -> Status {
    stats.outcome(Code::InvalidArgument);
    Status::invalid_argument(format!("stormguard: call not sent: {error}"))
}

/// The caller's deadline had passed before the call was sent.
pub(super) fn expired_before_sent(stats: &mut CallStats) -> Status {
    stats.deadline_exceeded();
    stats.outcome(Code::DeadlineExceeded);
    Status::deadline_exceeded("stormguard: the call's deadline had passed before it was sent")
}

/// The caller's deadline ran out: `DEADLINE_EXCEEDED`, never retried, whatever the
/// attempt's answer was. (The call's retry state recorded what it had to.)
pub(super) fn expired<B>(stats: &mut CallStats) -> CallResult<B> {
    stats.deadline_exceeded();
    stats.outcome(Code::DeadlineExceeded);
    Err(Box::new(Status::deadline_exceeded(
        "stormguard: the call's deadline was exceeded",
    )))
}

/// The caller's deadline ran out while the attempt waited for a replica to take it
/// (`why`: what for, as the channel says).
pub(super) fn expired_waiting<B>(stats: &mut CallStats, why: &str) -> CallResult<B> {
    stats.deadline_exceeded();
    stats.outcome(Code::DeadlineExceeded);
    Err(Box::new(Status::deadline_exceeded(format!(
        "stormguard: the call's deadline was exceeded waiting for a replica: {why}"
    ))))
}

/// The channel could not be readied for a retry: the call ends like every other give-up,
/// as a status marked "do not retry".
pub(super) fn not_ready<B>(stats: &mut CallStats, err: BoxError) -> CallResult<B> {
    let err = crate::replicas::unwrap_error(err);
    let code = classify_error(&*err).code;
    stats.outcome(code);
    Err(Box::new(status_do_not_retry(status_from_error(err, code))))
}

/// The layer will not retry the failed attempt (`timed_out`: it ran out of its
/// per-attempt timeout). A timed-out attempt answers `DEADLINE_EXCEEDED` marked "do not
/// retry" (the call already took its time; a layer above that retried it would multiply
/// the load on a slow dependency). Any other failure goes to the caller as it came, marked
/// "do not retry" when stormguard refused to retry a retryable failure; a pushback that
/// refused the retry is recorded in the request scope too.
pub(super) fn give_up<B>(
    stats: &mut CallStats,
    refusal: Refusal,
    last: Last<B>,
    timed_out: bool,
) -> CallResult<B> {
    stats.refused(refusal);
    if timed_out {
        stats.outcome(Code::DeadlineExceeded);
        return Err(Box::new(status_do_not_retry(Status::deadline_exceeded(
            format!("stormguard: the attempt timed out and was not retried ({refusal})"),
        ))));
    }
    stats.outcome(last.code());
    let mark = refusal.is_retryable_but_refused();
    if refusal == Refusal::Pushback {
        // The server said not to retry (or to wait longer than the policy allows): its
        // answer goes up as it came, and the request scope learns that this call was
        // refused, so that a handler's own answer is marked too.
        context::mark_downstream_refused();
    }
    match last {
        Last::Response(mut response) => {
            if mark {
                mark_do_not_retry(response.headers_mut());
            }
            Ok(response.map(ResponseBody::passthrough))
        }
        Last::Error(status) if mark => Err(Box::new(status_do_not_retry(status))),
        Last::Error(status) => Err(Box::new(status)),
    }
}

/// A retry was refused: a DEBUG event with its cause, the attempt it followed and the time
/// left on the call's deadline; and, for the refusals that mean a dependency is failing
/// beyond what the policy pays for (budget, breaker, attempts, deadline, the request's
/// allowance), a count in the layer's summary, written at INFO at most once a second (see
/// [`events`](super::events)).
pub(super) fn log_refusal(
    stats: &CallStats,
    uri: &Uri,
    refusal: Refusal,
    attempt: u32,
    left: Option<Duration>,
) {
    let events = stats.events();
    tracing::debug!(
        stormguard.layer = events.name().get().map_or("", |n| &**n),
        rpc.method = uri.path(),
        retry.refused = refusal.as_str(),
        retry.attempt = attempt,
        deadline.left_ms = left.map(|d| d.as_millis() as u64),
        "stormguard: retry refused"
    );
    events.refused(refusal, uri.path());
}
