//! The response future of [`Retry`](super::Retry): one logical call, attempt by attempt.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::{HeaderMap, HeaderValue, Method, Uri, Version};
use pin_project_lite::pin_project;
use stormguard_core::Instant;
use stormguard_core::code::Code;
use stormguard_core::deadline::{
    Deadline, GRPC_TIMEOUT_HEADER, decode_grpc_timeout, encode_grpc_timeout,
};
use stormguard_core::retry::{CallRetry, Decision, Failure, Refusal};
use tokio::time::Sleep;
use tonic::Status;
use tonic::body::Body;
use tower_service::Service;

use super::body::ResponseBody;
use super::layer::Shared;
use crate::body::Replay;
use crate::context::CallContext;
use crate::stats::RetryStats;
use crate::status::{
    BoxError, PREVIOUS_ATTEMPTS_HEADER, classify_error, code_from_http_status, mark_do_not_retry,
    pushback, status_do_not_retry, status_from_error, trailers_only_code,
};

pin_project! {
    /// The future of one logical call through the retry layer.
    pub struct ResponseFuture<S, B>
    where
        S: Service<http::Request<Body>, Response = http::Response<B>>,
    {
        svc: S,
        call: Option<CallRetry>,
        template: Template,
        replay: Option<Replay>,
        stats: RetryStats,
        // The failure the next attempt retries, returned if the retry cannot be sent.
        last: Option<Last<B>>,
        // `retry.reason` of the next attempt.
        reason: &'static str,
        span: tracing::Span,
        #[pin]
        state: State<S::Future>,
        // The caller's deadline, if any.
        logical: Option<Instant>,
        // How long each attempt may take, if limited.
        attempt_timeout: Option<Duration>,
        // When the attempt in flight times out, if before `logical`.
        attempt_deadline: Option<Instant>,
        // Fires at the earlier of `logical` and `attempt_deadline`; races every attempt.
        #[pin]
        timer: Option<Sleep>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // An attempt is in flight.
        Calling { #[pin] fut: F },
        // Waiting out the retry delay.
        Delaying { #[pin] sleep: Sleep },
        // The delay is over: readying the service for the retry.
        Readying,
        // The call ends without (another) attempt.
        Finished { status: Option<Status> },
    }
}

/// What is kept of a request to build the next attempt.
struct Template {
    method: Method,
    uri: Uri,
    version: Version,
    headers: HeaderMap,
    extensions: http::Extensions,
}

enum Last<B> {
    Response(http::Response<B>),
    Error(Status),
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("call", &self.call)
            .field("uri", &self.template.uri)
            .finish_non_exhaustive()
    }
}

/// The logical deadline of a call: the earliest of the caller's `grpc-timeout` and the
/// context's deadline; the layer's default only when neither is set.
fn logical_deadline(
    headers: &HeaderMap,
    default: Option<Duration>,
    now: Instant,
) -> Option<Instant> {
    let own = headers
        .get(GRPC_TIMEOUT_HEADER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| decode_grpc_timeout(v).ok())
        .map(|t| Deadline::after_at(now, t).instant());
    let ctx = CallContext::current().and_then(|c| c.deadline());
    match (own, ctx) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (Some(a), None) | (None, Some(a)) => Some(a),
        // Saturates: a default of `Duration::MAX` means "no practical limit", not a panic.
        (None, None) => default.map(|t| Deadline::after_at(now, t).instant()),
    }
}

fn attempt_span(uri: &Uri, attempt: u32, reason: &'static str) -> tracing::Span {
    tracing::debug_span!(
        "stormguard.attempt",
        rpc.method = uri.path(),
        retry.attempt = attempt,
        retry.reason = reason,
    )
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
{
    pub(super) fn start(svc: S, request: http::Request<Body>, shared: &Shared) -> Self {
        let now = Instant::now();
        let stats = shared.stats.clone();
        stats.logical();
        let (parts, body) = request.into_parts();
        let template = Template {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            headers: parts.headers,
            extensions: parts.extensions,
        };
        let deadline = logical_deadline(&template.headers, shared.default_timeout, now);
        // Begun before the template moves into the future, so the path is borrowed, not copied.
        let begun = shared
            .controller
            .begin_at(template.uri.path(), deadline, now);

        let mut fut = ResponseFuture {
            svc,
            call: None,
            template,
            replay: None,
            stats,
            last: None,
            reason: "initial",
            span: tracing::Span::none(),
            state: State::Finished { status: None },
            logical: deadline,
            attempt_timeout: None,
            attempt_deadline: None,
            timer: None,
        };

        let call = match begun {
            Ok(call) => call,
            Err(refusal) => {
                // Only an open breaker rejects a first attempt: fail fast, and tell callers
                // above not to retry into it either.
                fut.stats.refused(refusal);
                fut.stats.outcome(false);
                let status = Status::unavailable(format!(
                    "stormguard: call not sent ({refusal}): the circuit breaker is open"
                ));
                fut.state = State::Finished {
                    status: Some(status_do_not_retry(status)),
                };
                return fut;
            }
        };
        if deadline.is_some_and(|d| d <= now) {
            fut.stats.deadline_exceeded();
            fut.stats.outcome(false);
            fut.state = State::Finished {
                status: Some(Status::deadline_exceeded(
                    "stormguard: the call's deadline had passed before it was sent",
                )),
            };
            return fut;
        }
        fut.attempt_timeout = call.per_attempt_timeout().or(shared.per_attempt_timeout);
        let timers = AttemptTimers::at(deadline, fut.attempt_timeout, now);
        if let Some(at) = timers.fire_at {
            set_timeout(&mut fut.template.headers, at.saturating_duration_since(now));
            fut.timer = Some(tokio::time::sleep_until(at));
        }
        fut.attempt_deadline = timers.attempt_deadline;

        let body = if call.is_retryable_method() {
            match Replay::new(body, shared.replay_limit) {
                Ok((replay, first)) => {
                    fut.replay = Some(replay);
                    Body::new(first)
                }
                // The body announced a length over the bound: sent once, never copied.
                Err(body) => body,
            }
        } else {
            body
        };
        // Only a replayable body can be resent (see `Failure::replayable`): any other request
        // goes out once, so its parts are moved instead of copied.
        let request = if fut.replay.is_some() {
            fut.template.request(body)
        } else {
            fut.template.take_request(body)
        };
        fut.call = Some(call);
        fut.span = attempt_span(&fut.template.uri, 0, "initial");
        fut.stats.attempt(false);
        let inner = {
            let _enter = fut.span.enter();
            fut.svc.call(request)
        };
        fut.state = State::Calling { fut: inner };
        fut
    }
}

impl Template {
    fn request(&self, body: Body) -> http::Request<Body> {
        let mut request = http::Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers.clone();
        *request.extensions_mut() = self.extensions.clone();
        request
    }

    fn take_request(&mut self, body: Body) -> http::Request<Body> {
        let mut request = http::Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = self.version;
        *request.headers_mut() = std::mem::take(&mut self.headers);
        *request.extensions_mut() = std::mem::take(&mut self.extensions);
        request
    }
}

/// When an attempt sent at some instant must end.
struct AttemptTimers {
    /// The attempt's own deadline, when its timeout ends it before the call's deadline.
    attempt_deadline: Option<Instant>,
    /// The earlier of the call's deadline and the attempt's: the attempt's `grpc-timeout`
    /// and the layer's timer.
    fire_at: Option<Instant>,
}

impl AttemptTimers {
    fn at(logical: Option<Instant>, attempt_timeout: Option<Duration>, now: Instant) -> Self {
        // Saturates: an absurd timeout means "no practical limit", not a panic.
        let attempt = attempt_timeout.map(|t| Deadline::after_at(now, t).instant());
        match (logical, attempt) {
            (Some(l), Some(a)) if a < l => AttemptTimers {
                attempt_deadline: Some(a),
                fire_at: Some(a),
            },
            (Some(l), _) => AttemptTimers {
                attempt_deadline: None,
                fire_at: Some(l),
            },
            (None, a) => AttemptTimers {
                attempt_deadline: a,
                fire_at: a,
            },
        }
    }
}

/// Points `timer` at `at` (or disarms it), reusing its registration when it has one.
fn arm(mut timer: Pin<&mut Option<Sleep>>, at: Option<Instant>) {
    match at {
        Some(at) => {
            if let Some(sleep) = timer.as_mut().as_pin_mut() {
                if sleep.deadline() != at {
                    sleep.reset(at);
                }
            } else {
                timer.set(Some(tokio::time::sleep_until(at)));
            }
        }
        None => timer.set(None),
    }
}

fn set_timeout(headers: &mut HeaderMap, left: Duration) {
    if let Ok(value) = HeaderValue::from_str(encode_grpc_timeout(left).as_str()) {
        headers.insert(GRPC_TIMEOUT_HEADER, value);
    }
}

/// What an attempt ended in, as the retry decision needs it.
enum Outcome<B> {
    /// A trailers-only `OK`.
    Ok(http::Response<B>),
    /// Response headers without a status: the call is committed, its outcome comes with the
    /// trailers.
    Committed(http::Response<B>),
    /// A failure before commit: decide. `timed_out`: a timer below the layer ended the
    /// attempt (`Endpoint::timeout` or the `grpc-timeout` in tonic's channel, or a
    /// `tower::timeout` layer).
    Failed {
        failure: Failure,
        last: Last<B>,
        timed_out: bool,
    },
}

impl<S, B> Future for ResponseFuture<S, B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
    B: http_body::Body,
{
    type Output = Result<http::Response<ResponseBody<B>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Finished { status } => {
                    let status = status.take().unwrap_or_else(|| {
                        Status::internal("stormguard: call polled after completion")
                    });
                    return Poll::Ready(Err(Box::new(status)));
                }
                StateProj::Calling { fut } => {
                    let (failure, last, timed_out, now) = if timer_fired(this.timer.as_mut(), cx) {
                        if this.attempt_deadline.is_none() {
                            // The caller's deadline ran out mid-attempt: final, whatever the
                            // server would have said. Dropping the attempt cancels its stream.
                            this.state.set(State::Finished { status: None });
                            return Poll::Ready(expire(this.call, this.stats, &EXPIRED));
                        }
                        // The attempt's own timeout ran out: dropping it cancels its stream
                        // (and tells the server through `RST_STREAM`).
                        this.state.set(State::Finished { status: None });
                        let failure = Failure {
                            code: Code::DeadlineExceeded,
                            pushback: None,
                            replayable: this.replay.as_ref().is_some_and(Replay::is_replayable),
                            unsent: false,
                        };
                        let last = Last::Error(Status::deadline_exceeded(
                            "stormguard: the attempt's timeout ran out",
                        ));
                        (failure, last, true, Instant::now())
                    } else {
                        let result = {
                            let _enter = this.span.enter();
                            ready!(fut.poll(cx))
                        };
                        let replayable = this.replay.as_ref().is_some_and(Replay::is_replayable);
                        let now = Instant::now();
                        match classify(result, replayable) {
                            Outcome::Ok(response) => {
                                // A trailers-only `OK`: the outcome is known now.
                                if let Some(call) = this.call.as_mut() {
                                    call.on_success_at(now);
                                }
                                this.stats.outcome(true);
                                this.state.set(State::Finished { status: None });
                                return Poll::Ready(Ok(response.map(ResponseBody::passthrough)));
                            }
                            Outcome::Committed(response) => {
                                // Passed through, never retried; the outcome is recorded when
                                // the body ends (see `body`).
                                this.stats.committed();
                                this.state.set(State::Finished { status: None });
                                let (parts, body) = response.into_parts();
                                let body = ResponseBody::committed(
                                    body,
                                    this.call.take(),
                                    this.stats.clone(),
                                );
                                return Poll::Ready(Ok(http::Response::from_parts(parts, body)));
                            }
                            Outcome::Failed {
                                failure,
                                last,
                                timed_out,
                            } => {
                                if this.logical.is_some_and(|d| now >= d) {
                                    // The caller's deadline ran out while this answer was on
                                    // its way (the channel's `grpc-timeout` timer, or a
                                    // server's late `CANCELLED`, beat our timer to it): final,
                                    // as if our timer had fired first. The answer is still
                                    // recorded as it came.
                                    this.state.set(State::Finished { status: None });
                                    return Poll::Ready(expire(this.call, this.stats, &failure));
                                }
                                // Past the attempt's own deadline, the expiry answers of the
                                // channel's timer and of the server (tonic's `CANCELLED`) are
                                // that attempt's timeout, whichever came first.
                                let attempt_expired =
                                    this.attempt_deadline.is_some_and(|a| now >= a)
                                        && matches!(
                                            failure.code,
                                            Code::DeadlineExceeded | Code::Cancelled
                                        );
                                (failure, last, timed_out || attempt_expired, now)
                            }
                        }
                    };
                    let decision = match this.call.as_mut() {
                        Some(call) if timed_out => call.on_attempt_timeout_at(&failure, now),
                        Some(call) => call.on_failure_at(&failure, now),
                        None => Decision::GiveUp(Refusal::NotRetryable),
                    };
                    if timed_out {
                        this.stats.attempt_timed_out();
                    }
                    match decision {
                        Decision::Retry { delay } => {
                            tracing::debug!(
                                parent: &*this.span,
                                code = failure.code.name(),
                                timed_out,
                                delay_ms = delay.as_millis() as u64,
                                "stormguard: retrying"
                            );
                            *this.reason = if timed_out {
                                "per_attempt_timeout"
                            } else {
                                failure.code.name()
                            };
                            *this.last = Some(last);
                            if this.attempt_deadline.take().is_some() {
                                // Until the next attempt only the call's deadline matters.
                                arm(this.timer.as_mut(), *this.logical);
                            }
                            this.state.set(State::Delaying {
                                sleep: tokio::time::sleep(delay),
                            });
                        }
                        Decision::GiveUp(refusal) => {
                            this.state.set(State::Finished { status: None });
                            if timed_out {
                                return Poll::Ready(give_up_timed_out(this.stats, refusal));
                            }
                            return Poll::Ready(give_up(this.stats, refusal, last));
                        }
                    }
                }
                StateProj::Delaying { sleep } => {
                    ready!(sleep.poll(cx));
                    let started = match this.call.as_mut() {
                        Some(call) => call.start_retry_at(Instant::now()),
                        None => Err(Refusal::NotRetryable),
                    };
                    if let Err(refusal) = started {
                        this.state.set(State::Finished { status: None });
                        let last = this.last.take().unwrap_or_else(|| {
                            Last::Error(Status::unavailable("stormguard: retry refused"))
                        });
                        return Poll::Ready(give_up(this.stats, refusal, last));
                    }
                    this.state.set(State::Readying);
                }
                StateProj::Readying => {
                    if timer_fired(this.timer.as_mut(), cx) {
                        this.state.set(State::Finished { status: None });
                        return Poll::Ready(expire(this.call, this.stats, &EXPIRED));
                    }
                    if let Err(err) = ready!(this.svc.poll_ready(cx)) {
                        this.state.set(State::Finished { status: None });
                        this.stats.outcome(false);
                        return Poll::Ready(Err(err.into()));
                    }
                    let Some(call) = this.call.as_ref() else {
                        this.state.set(State::Finished { status: None });
                        return Poll::Ready(Err(Box::new(Status::internal(
                            "stormguard: no call state",
                        ))));
                    };
                    let attempt = call.previous_attempts();
                    let now = Instant::now();
                    let headers = &mut this.template.headers;
                    headers.insert(PREVIOUS_ATTEMPTS_HEADER, HeaderValue::from(attempt));
                    let timers = AttemptTimers::at(*this.logical, *this.attempt_timeout, now);
                    if let Some(at) = timers.fire_at {
                        set_timeout(headers, at.saturating_duration_since(now));
                        arm(this.timer.as_mut(), Some(at));
                    }
                    *this.attempt_deadline = timers.attempt_deadline;
                    let body = match this.replay.as_ref() {
                        Some(replay) => Body::new(replay.body()),
                        None => Body::empty(),
                    };
                    let request = this.template.request(body);
                    *this.last = None;
                    *this.span = attempt_span(&this.template.uri, attempt, this.reason);
                    this.stats.attempt(true);
                    let fut = {
                        let _enter = this.span.enter();
                        this.svc.call(request)
                    };
                    this.state.set(State::Calling { fut });
                }
            }
        }
    }
}

/// Polls the timer, if it is armed.
fn timer_fired(timer: Pin<&mut Option<Sleep>>, cx: &mut Context<'_>) -> bool {
    timer.as_pin_mut().is_some_and(|d| d.poll(cx).is_ready())
}

/// What [`expire`] records when the layer's own timer ended the call.
const EXPIRED: Failure = Failure {
    code: Code::DeadlineExceeded,
    pushback: None,
    replayable: false,
    unsent: false,
};

/// The caller's deadline ran out: the call ends with `DEADLINE_EXCEEDED`, never retried,
/// whatever the attempt's `failure` was. The breaker still hears of it (a slow dependency
/// is a failing one).
fn expire<B>(
    call: &mut Option<CallRetry>,
    stats: &RetryStats,
    failure: &Failure,
) -> Result<http::Response<ResponseBody<B>>, BoxError> {
    if let Some(call) = call.as_mut() {
        // Past the deadline the decision is always "give up" (no budget is spent).
        let _ = call.on_failure_at(failure, Instant::now());
    }
    stats.deadline_exceeded();
    stats.outcome(false);
    Err(Box::new(Status::deadline_exceeded(
        "stormguard: the call's deadline was exceeded",
    )))
}

/// Sorts an attempt's result into "pass it to the caller" and "a failure before commit".
fn classify<B, E: Into<BoxError>>(
    result: Result<http::Response<B>, E>,
    replayable: bool,
) -> Outcome<B> {
    match result {
        Ok(response) => match trailers_only_code(response.headers()) {
            // Not a gRPC answer: a proxy or load balancer in front of the server said
            // 502/503/504 (or worse) before any gRPC response began. Nothing was committed;
            // classify it as tonic will report it to the caller.
            None if response.status() != http::StatusCode::OK => Outcome::Failed {
                failure: Failure {
                    code: code_from_http_status(response.status()),
                    pushback: pushback(response.headers()),
                    replayable,
                    unsent: false,
                },
                last: Last::Response(response),
                timed_out: false,
            },
            None => Outcome::Committed(response),
            Some(Code::Ok) => Outcome::Ok(response),
            Some(code) => Outcome::Failed {
                failure: Failure {
                    code,
                    pushback: pushback(response.headers()),
                    replayable,
                    unsent: false,
                },
                last: Last::Response(response),
                timed_out: false,
            },
        },
        Err(err) => {
            let err: BoxError = err.into();
            let transport = classify_error(&*err);
            let (code, status) = if transport.timed_out {
                // The per-attempt timer in the channel (our `grpc-timeout`) ran out.
                (
                    Code::DeadlineExceeded,
                    Status::deadline_exceeded(err.to_string()),
                )
            } else {
                (transport.code, status_from_error(err, transport.code))
            };
            Outcome::Failed {
                failure: Failure {
                    code,
                    pushback: None,
                    replayable,
                    unsent: transport.unsent,
                },
                last: Last::Error(status),
                timed_out: transport.timed_out,
            }
        }
    }
}

/// An attempt timed out and the layer will not retry it: the caller gets
/// `DEADLINE_EXCEEDED`, marked "do not retry" (the call already took its time; a layer
/// above that retried it would multiply the load on a slow dependency).
fn give_up_timed_out<B>(
    stats: &RetryStats,
    refusal: Refusal,
) -> Result<http::Response<ResponseBody<B>>, BoxError> {
    stats.refused(refusal);
    stats.outcome(false);
    Err(Box::new(status_do_not_retry(Status::deadline_exceeded(
        format!("stormguard: the attempt timed out and was not retried ({refusal})"),
    ))))
}

/// The caller gets the last failure; marked "do not retry" when stormguard refused to
/// retry a retryable failure.
fn give_up<B>(
    stats: &RetryStats,
    refusal: Refusal,
    last: Last<B>,
) -> Result<http::Response<ResponseBody<B>>, BoxError> {
    stats.refused(refusal);
    stats.outcome(false);
    let mark = refusal.is_retryable_but_refused();
    match last {
        Last::Response(mut response) => {
            if mark {
                mark_do_not_retry(response.headers_mut());
            }
            Ok(response.map(ResponseBody::passthrough))
        }
        Last::Error(status) => Err(Box::new(if mark {
            status_do_not_retry(status)
        } else {
            status
        })),
    }
}
