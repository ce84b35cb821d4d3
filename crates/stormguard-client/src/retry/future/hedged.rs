//! A hedged call: several copies in flight, the first useful answer wins.
//!
//! The first copy is the attempt in [`State::Called`]; the hedges sent after it are
//! [`Copy`]s in the future's `copies` (a `Vec` that stays unallocated until the first
//! hedge: a hedged call that is answered before its delay costs nothing more than any
//! other call). Each poll, in this order:
//!
//! 1. the call's deadline: when it has passed, every copy is cancelled and the call ends
//!    with `DEADLINE_EXCEEDED`;
//! 2. a hedge that is due ([`CallRetry::next_hedge_at`]) is sent once a clone of the
//!    service is ready, if the call's retry state grants it
//!    ([`CallRetry::start_hedge_at`]: deadline, attempts, pushback, breaker, allowance,
//!    budget); a refused hedge is counted and stops the call's hedges;
//! 3. every copy in flight is polled; the first that ends decides: `OK` or a commit wins
//!    (every other copy is dropped, which resets its stream), a fatal status ends the call
//!    with that answer, a non-fatal one lets the others run and makes the next hedge due at
//!    once (or after the server's pushback);
//! 4. the layer's one timer is set to the earlier of the deadline and the next hedge.
//!
//! Every copy that ends, whichever way, tells the method's learned hedge delay how long it
//! ran ([`CallRetry::record_hedge_latency_at`]), the losers and those cut off included.

use std::future::Future;
use std::pin::Pin;
use std::sync::PoisonError;
use std::task::{Context, Poll};
use std::time::Duration;

use stormguard_core::Code;
use stormguard_core::Instant;
use stormguard_core::{AttemptEnd, HedgeDecision, Refusal};
use tonic::Status;
use tonic::body::Body;
use tower_service::Service;

use super::{FutureProj, State, StateProj, attempt_span, commit};
use crate::retry::body::ResponseBody;
use crate::retry::classify::{Last, Outcome, classify};
use crate::retry::end::{self, CallResult, log_refusal};
use crate::status::BoxError;

/// A hedge in flight.
pub(in crate::retry) struct Copy<F> {
    fut: Pin<Box<F>>,
    started: Instant,
    span: tracing::Span,
}

/// The earlier of two optional instants.
pub(super) fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// Which copy ended, with what.
struct Ended<R> {
    /// Whether it was the first copy (not a hedge).
    first: bool,
    started: Instant,
    span: tracing::Span,
    result: R,
}

/// Polls a hedged call (its first copy in `Called`, or only hedges left in `Hedging`).
pub(super) fn poll<S, B>(
    this: &mut FutureProj<'_, S, B>,
    cx: &mut Context<'_>,
) -> Poll<CallResult<B>>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: Into<BoxError>,
    B: http_body::Body,
{
    loop {
        if matches!(this.state.as_mut().project(), StateProj::Done { .. }) {
            return Poll::Ready(Err(Box::new(Status::internal(
                "stormguard: call polled after completion",
            ))));
        }
        let now = Instant::now();
        let Some(call) = this.call.as_mut() else {
            return Poll::Ready(end::expired(this.stats));
        };
        if call.deadline().is_some_and(|d| now >= d) {
            return Poll::Ready(expired(this, now));
        }
        let readying =
            call.next_hedge_at().is_some_and(|at| at <= now) && send_hedge(this, cx, now);
        if let Some(ended) = all_failed(this, readying, now) {
            return Poll::Ready(ended);
        }
        if timer_fired(this, readying, cx) {
            continue;
        }
        let Some(ended) = poll_copies(this, cx) else {
            return Poll::Pending;
        };
        if let Some(ended) = copy_ended(this, ended) {
            return Poll::Ready(ended);
        }
    }
}

/// The call's deadline passed at `now`: every copy is cancelled, the call ends
/// `DEADLINE_EXCEEDED`.
fn expired<S, B>(this: &mut FutureProj<'_, S, B>, now: Instant) -> CallResult<B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    cancel_all(this, now);
    this.state.set(State::Done { status: None });
    drop(this.call.take());
    end::expired(this.stats)
}

/// The call's answer when every copy failed and no other may follow (none is in flight or
/// waits for the channel, and no hedge is due).
fn all_failed<S, B>(
    this: &mut FutureProj<'_, S, B>,
    readying: bool,
    now: Instant,
) -> Option<CallResult<B>>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    let Some(call) = this.call.as_mut() else {
        return Some(end::expired(this.stats));
    };
    let running = in_flight(this.state.as_mut().project(), this.copies.len());
    if running > 0 || readying || call.next_hedge_at().is_some() {
        return None;
    }
    let why = call.hedges_stopped().unwrap_or(Refusal::Attempts);
    let last = this.hedge_last.take().map_or_else(
        || {
            Last::Error(Status::unavailable(
                "stormguard: no copy of the call was sent",
            ))
        },
        |last| *last,
    );
    this.state.set(State::Done { status: None });
    log_refusal(
        this.stats,
        this.attempts.uri(),
        why,
        call.hedges_sent(),
        call.remaining_at(now),
    );
    Some(end::give_up(this.stats, why, last, false))
}

/// Arms the timer at the deadline, and at the next hedge unless it is due and waits for
/// the channel (which wakes the call when it is ready); whether it fired.
fn timer_fired<S, B>(this: &mut FutureProj<'_, S, B>, readying: bool, cx: &mut Context<'_>) -> bool
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    if let Some(call) = this.call.as_ref() {
        let next = call.next_hedge_at().filter(|_| !readying);
        this.timer.as_mut().arm(earlier(call.deadline(), next));
    }
    this.timer.as_mut().poll_fired(cx)
}

/// A copy ended: `OK` or a commit wins, a failure lets the others run or ends the call.
fn copy_ended<S, B>(
    this: &mut FutureProj<'_, S, B>,
    ended: Ended<Result<http::Response<B>, S::Error>>,
) -> Option<CallResult<B>>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body,
{
    let now = Instant::now();
    let Some(call) = this.call.as_mut() else {
        return Some(end::expired(this.stats));
    };
    call.record_hedge_latency_at(now.saturating_duration_since(ended.started), now);
    let Ended {
        first,
        span,
        result,
        ..
    } = ended;
    // Copies interleave, so the route's latest replica need not be this copy's: the
    // report feeds the call's saturation under the channel's key only.
    let status = result.as_ref().ok().and_then(|response| {
        crate::retry::load::read(response.headers(), Some(&*call), None, this.stats)
    });
    let outcome = classify(result, status, this.attempts.is_replayable());
    if let Some(throttle) = this.throttle.as_ref() {
        throttle.record(&outcome, now);
    }
    match outcome {
        Outcome::Ok(response) => {
            won(this, first, now);
            if let Some(call) = this.call.as_mut() {
                call.on_success_at(now);
            }
            this.stats.outcome(Code::Ok);
            this.state.set(State::Done { status: None });
            Some(Ok(response.map(ResponseBody::passthrough)))
        }
        Outcome::Committed(response) => {
            won(this, first, now);
            Some(Ok(commit(this, response)))
        }
        Outcome::Failed { end, last, .. } => copy_failed(this, end, last, &span, now),
    }
}

/// A copy failed (`end`; `last` is the caller's answer if the call ends now): the others
/// go on, or the call ends.
fn copy_failed<S, B>(
    this: &mut FutureProj<'_, S, B>,
    end: AttemptEnd,
    last: Last<B>,
    span: &tracing::Span,
    now: Instant,
) -> Option<CallResult<B>>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    let in_flight = in_flight(this.state.as_mut().project(), this.copies.len());
    let call = this.call.as_mut()?;
    match call.on_hedge_end_at(end, in_flight, now) {
        HedgeDecision::Wait => {
            tracing::debug!(
                parent: span,
                code = last.code().name(),
                "stormguard: copy failed, the others go on"
            );
            *this.hedge_last = Some(Box::new(last));
            None
        }
        HedgeDecision::GiveUp(refusal) => {
            cancel_all(this, now);
            this.state.set(State::Done { status: None });
            if let Some(call) = this.call.as_ref()
                && refusal != Refusal::NotRetryable
            {
                let sent = call.hedges_sent();
                log_refusal(
                    this.stats,
                    this.attempts.uri(),
                    refusal,
                    sent,
                    call.remaining_at(now),
                );
            }
            Some(end::give_up(this.stats, refusal, last, false))
        }
        HedgeDecision::Expired => Some(expired(this, now)),
    }
}

/// Copies in flight: the first, while it runs, and the hedges.
fn in_flight<F, B>(state: StateProj<'_, F, B>, hedges: usize) -> usize {
    hedges + usize::from(matches!(state, StateProj::Called { .. }))
}

/// Sends the hedge that is due, once a clone of the service is ready; whether it waits for
/// the channel to be ready.
fn send_hedge<S, B>(this: &mut FutureProj<'_, S, B>, cx: &mut Context<'_>, now: Instant) -> bool
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: Into<BoxError>,
{
    let Some(call) = this.call.as_mut() else {
        return false;
    };
    let svc = this.svc.get_or_insert_with(|| {
        this.spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    });
    match svc.poll_ready(cx) {
        Poll::Pending => return true,
        Poll::Ready(Err(_)) => {
            // The channel cannot take another copy: those in flight go on.
            call.stop_hedges(Refusal::Attempts);
            this.stats.hedge_refused(Refusal::Attempts);
            return false;
        }
        Poll::Ready(Ok(())) => {}
    }
    let plan = match call.start_hedge_at(now) {
        Ok(plan) => plan,
        Err(refusal) => {
            this.stats.hedge_refused(refusal);
            tracing::debug!(
                rpc.method = this.attempts.uri().path(),
                hedge.refused = refusal.as_str(),
                hedge.copies = call.hedges_sent(),
                "stormguard: hedge refused"
            );
            return false;
        }
    };
    let mut request = this.attempts.retry(&plan, this.stats.stamps());
    if let Some(route) = this.route.as_ref() {
        // The channel avoids the replicas the call's copies went to.
        request.extensions_mut().insert(route.clone());
    }
    let span = attempt_span(
        this.attempts.uri(),
        plan.previous_attempts,
        "hedge",
        Duration::ZERO,
    );
    this.stats.hedge_attempt();
    let fut = {
        let _enter = span.enter();
        svc.call(request)
    };
    this.copies.push(Copy {
        fut: Box::pin(fut),
        started: now,
        span,
    });
    false
}

/// Polls the first copy, then the hedges; the first that ended, taken out of the call.
fn poll_copies<S, B>(
    this: &mut FutureProj<'_, S, B>,
    cx: &mut Context<'_>,
) -> Option<Ended<Result<http::Response<B>, S::Error>>>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    if let StateProj::Called { fut, span, started } = this.state.as_mut().project() {
        let polled = {
            let _enter = span.enter();
            fut.poll(cx)
        };
        if let Poll::Ready(result) = polled {
            let ended = Ended {
                first: true,
                started: *started,
                span: std::mem::replace(span, tracing::Span::none()),
                result,
            };
            // Drops the first copy's future (it has ended).
            this.state.set(State::Hedging);
            return Some(ended);
        }
    }
    for i in 0..this.copies.len() {
        let copy = &mut this.copies[i];
        let polled = {
            let _enter = copy.span.enter();
            copy.fut.as_mut().poll(cx)
        };
        if let Poll::Ready(result) = polled {
            let copy = this.copies.swap_remove(i);
            return Some(Ended {
                first: false,
                started: copy.started,
                span: copy.span,
                result,
            });
        }
    }
    None
}

/// A copy won at `now`: every other copy is cancelled (dropping its future resets its
/// stream, which tells the server).
fn won<S, B>(this: &mut FutureProj<'_, S, B>, first: bool, now: Instant)
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    if !first {
        this.stats.hedge_won();
    }
    cancel_all(this, now);
}

/// Cancels every copy still in flight at `now`, telling the learned delay how long each ran.
fn cancel_all<S, B>(this: &mut FutureProj<'_, S, B>, now: Instant)
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    let started = match this.state.as_mut().project() {
        StateProj::Called { started, .. } => Some(*started),
        _ => None,
    };
    if let Some(call) = this.call.as_ref() {
        for at in started
            .into_iter()
            .chain(this.copies.iter().map(|c| c.started))
        {
            call.record_hedge_latency_at(now.saturating_duration_since(at), now);
        }
    }
    if started.is_some() {
        this.state.set(State::Hedging);
    }
    this.copies.clear();
}
