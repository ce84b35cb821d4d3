//! The response future of [`Retry`](super::Retry): one logical call, attempt by attempt.
//!
//! A state machine in five states, each holding the data it alone needs:
//!
//! - `Called`: an attempt is in flight (its future, its span, when it was sent); for a
//!   hedged call, the first copy (its hedges are in `copies`; see `hedged`);
//! - `Hedging`: a hedged call whose first copy ended without winning, its hedges running;
//! - `Waiting`: a retry was granted and waits out its delay, then readies the service;
//!   it keeps the failure the caller gets if the retry cannot start;
//! - `Deciding`: an attempt failed while the task's cooperative budget was spent; the
//!   failure waits for the next poll to be decided on;
//! - `Done`: the call ended (or was refused before its first attempt).
//!
//! What lives across states is the call's retry state (core's `CallRetry`: deadlines,
//! attempts, breaker permit, granted retry), what is kept to resend the request
//! ([`Attempts`]), the call's counters and the layer's one timer. Every decision is made by
//! the retry state; this file only moves data between it, the inner service and the caller.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::Uri;
use pin_project_lite::pin_project;
use stormguard_core::Code;
use stormguard_core::Instant;
use stormguard_core::Pushback;
use stormguard_core::{AttemptEnd, CallRetry, Decision};
use stormguard_core::{CallTimes, Deadline};
use tonic::Status;
use tonic::body::Body;
use tower_service::Service;

use super::attempt::{Attempts, caller_timeout, stamp_idempotency_key};
use super::body::ResponseBody;
use super::classify::{Last, Outcome, classify};
use super::end::{self, CallResult, log_refusal};
use super::record::CallStats;
use super::shared::Shared;
use super::throttle::CallThrottle;
use super::timer::Timer;
use crate::context::CallContext;
use crate::replicas::Route;
use crate::status::BoxError;

mod hedged;

pin_project! {
    /// The future of one logical call through the retry layer.
    #[project = FutureProj]
    pub struct ResponseFuture<S, B>
    where
        S: Service<http::Request<Body>, Response = http::Response<B>>,
    {
        // The service retries go out on: cloned from `spare` when the first retry starts.
        svc: Option<S>,
        spare: Arc<Mutex<S>>,
        // The call's retry state; `None` once the call ended or committed (a committed
        // response's body carries what its end records).
        call: Option<CallRetry>,
        attempts: Attempts,
        // The replicas the call used, when the layer is over an endpoint-aware channel.
        route: Option<Route>,
        // Whether the route's latest replica is the budget key (not the request's own).
        keyed_by_route: bool,
        stats: CallStats,
        // The layer's adaptive throttle and the call's class, when the layer has one: every
        // attempt's answer is recorded in it.
        throttle: Option<CallThrottle>,
        // The hedges in flight of a hedged call (the first copy is in `State::Called`):
        // empty, and never allocated, until a hedge is sent.
        copies: Vec<hedged::Copy<S::Future>>,
        // What a hedged call answers if every copy fails: the latest non-fatal failure.
        hedge_last: Option<Box<Last<B>>>,
        #[pin]
        timer: Timer,
        #[pin]
        state: State<S::Future, B>,
    }
}

pin_project! {
    #[project = StateProj]
    #[project_replace = StateReplace]
    enum State<F, B> {
        // An attempt is in flight (sent at `started`).
        Called {
            #[pin]
            fut: F,
            span: tracing::Span,
            started: Instant,
        },
        // A hedged call whose first copy ended without winning: its hedges are in flight
        // (or one is due).
        Hedging,
        // A granted retry waits out its delay on the layer's timer (`slept` once it is
        // over), then readies the service. `last` is what the caller gets if the retry
        // cannot start (boxed: the happy path never waits, and this keeps the future small).
        Waiting {
            slept: bool,
            last: Box<Last<B>>,
            reason: &'static str,
            delay: Duration,
        },
        // An attempt failed while the task's cooperative budget was spent: the layer
        // decides on it at the next poll.
        Deciding {
            held: Box<(AttemptEnd, Last<B>, tracing::Span)>,
        },
        // The call ended; `status` when it ended before any attempt was sent.
        Done { status: Option<BoxError> },
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("call", &self.call)
            .field("uri", self.attempts.uri())
            .finish_non_exhaustive()
    }
}

fn attempt_span(uri: &Uri, attempt: u32, reason: &'static str, delay: Duration) -> tracing::Span {
    tracing::debug_span!(
        "stormguard.attempt",
        rpc.method = uri.path(),
        retry.attempt = attempt,
        retry.delay_ms = delay.as_millis() as u64,
        retry.reason = reason,
    )
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
{
    /// Begins a call: admits it (its retry state, refused while the breaker is open, while
    /// the dependency is in connection backoff but for the slot's probe, or once the
    /// deadline passed; the throttle's admission; its idempotency key stamped on
    /// `request`), then sends its first attempt on `svc`.
    ///
    /// One function with early returns, not helpers passing `Result`s: the call's state is
    /// large, and each hand-over would copy it.
    pub(super) fn start(
        svc: &mut S,
        spare: &Arc<Mutex<S>>,
        mut request: http::Request<Body>,
        shared: &Arc<Shared>,
    ) -> Self {
        let now = Instant::now();
        let mut stats = CallStats::start(shared, request.uri().path());
        let times = CallTimes {
            caller: caller_timeout(request.headers()),
            inbound: CallContext::current().and_then(|c| c.deadline()),
            default: shared.default_timeout,
            per_attempt: shared.per_attempt_timeout,
        };
        let mut call = match shared
            .controller
            .begin_call_at(request.uri().path(), &times, now)
        {
            Ok(call) if call.deadline().is_none_or(|d| d > now) => call,
            // An open breaker, or a dependency in connection backoff: fail fast. Dropping a
            // call state that is not sent releases its breaker permit unused.
            Err(refusal) => {
                let status = end::not_sent(&mut stats, refusal);
                return Self::refused(spare, request.uri(), stats, status);
            }
            Ok(_) => {
                let status = end::expired_before_sent(&mut stats);
                return Self::refused(spare, request.uri(), stats, status);
            }
        };
        let throttle = match &shared.throttle {
            None => None,
            Some(throttle) => match CallThrottle::admit(throttle, request.headers(), now) {
                Ok(admitted) => Some(admitted),
                Err(throttled) => {
                    let status = end::throttled(&mut stats, request.uri(), throttled);
                    return Self::refused(spare, request.uri(), stats, status);
                }
            },
        };
        if let Some(key) = call.idempotency_key()
            && let Err(e) = stamp_idempotency_key(request.headers_mut(), key)
        {
            let status = end::bad_idempotency_key(&mut stats, &e);
            return Self::refused(spare, request.uri(), stats, status);
        }
        let plan = call.first_attempt_at(now);
        let retryable = call.is_retryable_method();
        if let Some(key) = &shared.budget_key {
            call.set_budget_key(key(&request));
        }
        let attempts = Attempts::first(
            &mut request,
            &plan,
            retryable,
            shared.replay_limit,
            &shared.stamps,
            call.deadline(),
        );
        if call.is_hedged() && !attempts.can_copy() {
            // A streaming request body is read by one copy at a time: sent once.
            let why = stormguard_core::Refusal::ReplayLimit;
            call.stop_hedges(why);
            stats.hedge_refused(why);
        }
        let route = shared.over_replicas.then(Route::new);
        if let Some(route) = &route {
            request.extensions_mut().insert(route.clone());
        }
        let span = attempt_span(attempts.uri(), 0, "initial", Duration::ZERO);
        stats.attempt(false);
        let fut = {
            let _enter = span.enter();
            svc.call(request)
        };
        // A hedged call's copies pay from the shared budget only (they do not follow a
        // failure of one replica).
        let keyed_by_route = route.is_some() && shared.budget_key.is_none() && !call.is_hedged();
        let fire_at = hedged::earlier(plan.fire_at, call.next_hedge_at());
        ResponseFuture {
            svc: None,
            spare: Arc::clone(spare),
            call: Some(call),
            attempts,
            keyed_by_route,
            route,
            stats,
            throttle,
            copies: Vec::new(),
            hedge_last: None,
            timer: Timer::at(fire_at),
            state: State::Called {
                fut,
                span,
                started: now,
            },
        }
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    /// A call that ends before its first attempt, with `status` (while a breaker is open,
    /// every call: it allocates only the boxed status).
    #[cold]
    #[inline(never)]
    fn refused(spare: &Arc<Mutex<S>>, uri: &Uri, stats: CallStats, status: Status) -> Self {
        ResponseFuture {
            svc: None,
            spare: Arc::clone(spare),
            call: None,
            attempts: Attempts::unsent(uri.clone()),
            route: None,
            keyed_by_route: false,
            stats,
            throttle: None,
            copies: Vec::new(),
            hedge_last: None,
            timer: Timer::at(None),
            state: State::Done {
                status: Some(Box::new(status)),
            },
        }
    }
}

impl<S, B> Future for ResponseFuture<S, B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: Into<BoxError>,
    B: http_body::Body,
{
    type Output = CallResult<B>;

    /// Every answer the layer makes itself, without I/O (a refusal, a failure it decides
    /// not to retry), spends a unit of the task's cooperative budget, so that a caller's
    /// loop of such calls yields to the runtime as a call through tonic's own buffer does.
    /// An answer that comes from the channel was paid for there: the happy path spends
    /// nothing here.
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.poll_call(cx)
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: Into<BoxError>,
    B: http_body::Body,
{
    fn poll_call(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<CallResult<B>> {
        let mut this = self.project();
        if this.call.as_ref().is_some_and(CallRetry::is_hedged) {
            // A unit of the budget per poll, given back unless the call ends.
            let coop = ready!(tokio::task::coop::poll_proceed(cx));
            let answer = hedged::poll(&mut this, cx);
            if answer.is_ready() {
                coop.made_progress();
            }
            return answer;
        }
        loop {
            let step = match this.state.as_mut().project() {
                StateProj::Done { status } => {
                    ready!(tokio::task::coop::poll_proceed(cx)).made_progress();
                    let status = status.take().unwrap_or_else(|| {
                        Box::new(Status::internal("stormguard: call polled after completion"))
                    });
                    return Poll::Ready(Err(status));
                }
                StateProj::Hedging => {
                    // Only a hedged call gets here, and it is polled above while it runs.
                    return Poll::Ready(end::expired(this.stats));
                }
                StateProj::Called { .. } => poll_called(&mut this, cx),
                StateProj::Deciding { .. } => {
                    ready!(tokio::task::coop::poll_proceed(cx)).made_progress();
                    let StateReplace::Deciding { held } = this
                        .state
                        .as_mut()
                        .project_replace(State::Done { status: None })
                    else {
                        unreachable!("the state was Deciding a moment ago");
                    };
                    let (end, last, span) = *held;
                    Poll::Ready(failed(&mut this, end, last, &span))
                }
                StateProj::Waiting { slept, .. } => {
                    let deadline = this.call.as_ref().and_then(CallRetry::deadline);
                    if ready!(poll_delay(this.timer.as_mut(), slept, deadline, cx)) {
                        // The caller's deadline ran out during the delay: dropping the call
                        // state gives the granted retry back to the budget.
                        this.state.set(State::Done { status: None });
                        drop(this.call.take());
                        return Poll::Ready(end::expired(this.stats));
                    }
                    poll_retry(&mut this, cx)
                }
            };
            if let Some(ended) = ready!(step) {
                return Poll::Ready(ended);
            }
        }
    }
}

/// What polling one state gives: the call's answer, or `None` when the call moved on to
/// another state.
type Step<B> = Poll<Option<CallResult<B>>>;

/// `Called`: the attempt in flight ends (or the layer's timer cuts it); a failure is
/// decided on by the call's retry state.
fn poll_called<S, B>(this: &mut FutureProj<'_, S, B>, cx: &mut Context<'_>) -> Step<B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body,
{
    let outcome = if this.timer.as_mut().poll_fired(cx) {
        timed_out(this)
    } else {
        let Some(result) = ready!(this.state.as_mut().poll_attempt(cx)) else {
            return Poll::Ready(Some(end::expired(this.stats)));
        };
        answered(this, result)
    };
    let (end, last) = match outcome {
        Outcome::Ok(response) => {
            // A trailers-only `OK`: the outcome is known now.
            if let Some(call) = this.call.as_mut() {
                call.on_success_at(Instant::now());
            }
            this.stats.outcome(Code::Ok);
            this.state.set(State::Done { status: None });
            return Poll::Ready(Some(Ok(response.map(ResponseBody::passthrough))));
        }
        Outcome::Committed(response) => return Poll::Ready(Some(Ok(commit(this, response)))),
        Outcome::Failed { end, last, connect } => {
            // Over `Replicas`, the balancer routes around a replica that refused.
            if connect
                && this.route.is_none()
                && let Some(call) = this.call.as_mut()
            {
                call.on_connect_refused_at(Instant::now());
            }
            (end, last)
        }
    };
    let span = this.state.as_mut().take_span();
    // Drops the attempt in flight, if it is still running.
    this.state.set(State::Done { status: None });
    // The layer decides, and may answer itself: a unit of the budget (see `poll`). Spent,
    // the failure waits for the next poll, held in `Deciding` (boxed: rare).
    match tokio::task::coop::poll_proceed(cx) {
        Poll::Ready(coop) => {
            coop.made_progress();
            Poll::Ready(failed(this, end, last, &span))
        }
        Poll::Pending => {
            this.state.set(State::Deciding {
                held: Box::new((end, last, span)),
            });
            Poll::Pending
        }
    }
}

/// The layer's timer fired (the call's deadline or the attempt's own timeout): the attempt
/// is dropped by the caller, which cancels its stream and tells the server through
/// `RST_STREAM`.
fn timed_out<S, B>(this: &mut FutureProj<'_, S, B>) -> Outcome<B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    set_key(this.call, this.route, *this.keyed_by_route);
    if let Some(throttle) = this.throttle.as_ref() {
        throttle.timed_out(Instant::now());
    }
    Outcome::Failed {
        end: AttemptEnd::TimedOut {
            replayable: this.attempts.is_replayable(),
            unsent: false,
        },
        last: Last::Error(Status::deadline_exceeded(
            "stormguard: the attempt's timeout ran out",
        )),
        connect: false,
    }
}

/// The attempt in flight answered `result`: recorded (route, load report, throttle) and
/// classified.
fn answered<S, B>(
    this: &mut FutureProj<'_, S, B>,
    result: Result<http::Response<B>, S::Error>,
) -> Outcome<B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body,
{
    set_key(this.call, this.route, *this.keyed_by_route);
    // A trailers-only answer's status and load report (a committed answer's come in its
    // trailers, read by its body).
    let status = result.as_ref().ok().and_then(|response| {
        super::load::read(
            response.headers(),
            this.call.as_ref(),
            this.route.as_ref(),
            this.stats,
        )
    });
    let outcome = classify(result, status, this.attempts.is_replayable());
    if let Some(throttle) = this.throttle.as_ref() {
        throttle.record(&outcome, Instant::now());
    }
    outcome
}

/// An attempt failed (`end`, the caller's answer `last` if no retry follows): the call's
/// retry state grants a retry (the call then waits out its delay), or the call ends.
fn failed<S, B>(
    this: &mut FutureProj<'_, S, B>,
    end: AttemptEnd,
    last: Last<B>,
    span: &tracing::Span,
) -> Option<CallResult<B>>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    let Some(call) = this.call.as_mut() else {
        return Some(end::expired(this.stats));
    };
    let now = Instant::now();
    let verdict = call.on_attempt_end_at(end, now);
    let timed_out = verdict.attempt_timed_out;
    if timed_out {
        this.stats.attempt_timed_out();
    }
    match verdict.decision {
        Decision::Retry { delay } => {
            let reason = retry_reason(&end, timed_out, verdict.transparent, delay, span);
            if !verdict.transparent {
                this.stats.delayed(matches!(
                    end,
                    AttemptEnd::Failed(f) if matches!(f.pushback, Some(Pushback::RetryAfter(_)))
                ));
            }
            this.stats.retry_waiting(now);
            // The delay runs on the layer's timer (a granted delay ends before the call's
            // deadline).
            let until = Deadline::after_at(now, delay).instant();
            this.timer.as_mut().arm(Some(until));
            this.state.set(State::Waiting {
                slept: false,
                last: Box::new(last),
                reason,
                delay,
            });
            None
        }
        Decision::GiveUp(refusal) => {
            let attempt = call.previous_attempts();
            let left = call.remaining_at(now);
            log_refusal(this.stats, this.attempts.uri(), refusal, attempt, left);
            Some(end::give_up(this.stats, refusal, last, timed_out))
        }
        Decision::Expired => {
            // Dropping the call state gives back a retry granted but not started (there is
            // none here) and releases its permit.
            drop(this.call.take());
            // An attempt that waited for a replica until the deadline says what for.
            Some(match this.route.as_ref().and_then(Route::waiting) {
                Some(why) => end::expired_waiting(this.stats, &why),
                None => end::expired(this.stats),
            })
        }
    }
}

/// Why a retry is sent after the attempt that ended with `end` (its span's `retry.reason`),
/// logged at DEBUG in the ended attempt's `span`.
fn retry_reason(
    end: &AttemptEnd,
    timed_out: bool,
    transparent: bool,
    delay: Duration,
    span: &tracing::Span,
) -> &'static str {
    let code = ended_code(end, timed_out);
    tracing::debug!(
        parent: span,
        code = code.name(),
        timed_out,
        delay_ms = delay.as_millis() as u64,
        "stormguard: retrying"
    );
    if timed_out {
        "per_attempt_timeout"
    } else if transparent {
        "transparent"
    } else {
        code.name()
    }
}

/// `Waiting`, first part: the granted retry's delay runs out on `timer`, which then watches
/// the call's `deadline` alone until the retry starts. Whether the deadline ran out.
fn poll_delay(
    mut timer: Pin<&mut Timer>,
    slept: &mut bool,
    deadline: Option<Instant>,
    cx: &mut Context<'_>,
) -> Poll<bool> {
    if !*slept {
        if !timer.as_mut().poll_fired(cx) {
            return Poll::Pending;
        }
        *slept = true;
        timer.as_mut().arm(deadline);
    }
    Poll::Ready(timer.poll_fired(cx))
}

/// `Waiting`, once the delay is over: readies a clone of the service and sends the retry
/// (which the call's retry state may still refuse).
fn poll_retry<S, B>(this: &mut FutureProj<'_, S, B>, cx: &mut Context<'_>) -> Step<B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: Into<BoxError>,
{
    let svc = this.svc.get_or_insert_with(|| {
        this.spare
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    });
    if let Err(err) = ready!(svc.poll_ready(cx)) {
        // The channel cannot take the retry (the granted retry goes back to the budget
        // when the call state is dropped).
        this.state.set(State::Done { status: None });
        drop(this.call.take());
        return Poll::Ready(Some(end::not_ready(this.stats, err.into())));
    }
    let StateReplace::Waiting {
        last,
        reason,
        delay,
        ..
    } = this
        .state
        .as_mut()
        .project_replace(State::Done { status: None })
    else {
        unreachable!("the state was Waiting a moment ago");
    };
    let Some(call) = this.call.as_mut() else {
        return Poll::Ready(Some(end::expired(this.stats)));
    };
    let now = Instant::now();
    let plan = match call.start_retry_at(now) {
        Ok(plan) => plan,
        Err(refusal) => {
            let attempt = call.previous_attempts();
            let left = call.remaining_at(now);
            log_refusal(this.stats, this.attempts.uri(), refusal, attempt, left);
            return Poll::Ready(Some(end::give_up(this.stats, refusal, *last, false)));
        }
    };
    let mut request = this.attempts.retry(&plan, this.stats.stamps());
    if let Some(route) = this.route.as_ref() {
        request.extensions_mut().insert(route.clone());
    }
    this.timer.as_mut().arm(plan.fire_at);
    let span = attempt_span(this.attempts.uri(), plan.previous_attempts, reason, delay);
    this.stats.retry_attempt(&plan);
    let fut = {
        let _enter = span.enter();
        svc.call(request)
    };
    this.state.set(State::Called {
        fut,
        span,
        started: now,
    });
    Poll::Ready(None)
}

impl<F: Future, B> State<F, B> {
    /// Polls the attempt in flight, in its span (`None` in any other state).
    fn poll_attempt(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<F::Output>> {
        match self.project() {
            StateProj::Called { fut, span, .. } => {
                let _enter = span.enter();
                fut.poll(cx).map(Some)
            }
            _ => Poll::Ready(None),
        }
    }

    /// The span of the attempt in flight (none in any other state).
    fn take_span(self: Pin<&mut Self>) -> tracing::Span {
        match self.project() {
            StateProj::Called { span, .. } => std::mem::replace(span, tracing::Span::none()),
            _ => tracing::Span::none(),
        }
    }
}

/// The call committed with `response` (headers without a status): passed through, never
/// retried; the outcome is recorded when the body ends (see `body`), and the body holds the
/// call to its deadline from here on. No retry can follow: stop buffering the request body,
/// and settle a half-open probe.
fn commit<S, B>(
    this: &mut FutureProj<'_, S, B>,
    response: http::Response<B>,
) -> http::Response<ResponseBody<B>>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    B: http_body::Body,
{
    this.attempts.commit();
    // What the end records, small enough to travel in the response body.
    let call = this.call.take().map(|call| call.commit_at(Instant::now()));
    this.stats.committed();
    this.state.set(State::Done { status: None });
    let (parts, body) = response.into_parts();
    let body = ResponseBody::committed(
        body,
        call,
        this.stats.take(),
        this.route.clone(),
        this.attempts.path(),
    );
    http::Response::from_parts(parts, body)
}

/// The attempt that just ended went to the route's latest replica: its budget account pays
/// for a retry after it, and its success mints into it.
fn set_key(call: &mut Option<CallRetry>, route: &Option<Route>, keyed_by_route: bool) {
    if let (Some(call), Some(route)) = (call.as_mut(), route) {
        // A retry could go to any of the channel's replicas: saturation is per replica.
        call.set_endpoints(route.replicas());
        if keyed_by_route {
            call.set_budget_key(route.last().map(|id| id.get()));
        }
    }
}

/// The code an ended attempt is logged with: `DEADLINE_EXCEEDED` when it timed out.
fn ended_code(end: &AttemptEnd, timed_out: bool) -> Code {
    match end {
        AttemptEnd::Failed(f) if !timed_out => f.code,
        _ => Code::DeadlineExceeded,
    }
}
