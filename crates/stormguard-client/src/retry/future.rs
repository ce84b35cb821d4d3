//! The response future of [`Retry`](super::Retry): one logical call, attempt by attempt.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::header::HeaderName;
use http::{HeaderMap, HeaderValue, Method, Uri, Version};
use pin_project_lite::pin_project;
use stormguard_core::Instant;
use stormguard_core::code::Code;
use stormguard_core::deadline::{
    Deadline, GRPC_TIMEOUT_HEADER, decode_grpc_timeout, encode_grpc_timeout,
};
use stormguard_core::retry::{CallRetry, Decision, Failure, Refusal};
use tokio::time::Sleep;
use tonic::body::Body;
use tonic::{GrpcMethod, Status};
use tower_service::Service;

use super::body::ResponseBody;
use super::layer::Shared;
use crate::body::{Buffered, Replay, buffer};
use crate::context::{self, CallContext, RETRY_BUDGET_HEADER};
use crate::stats::CallStats;
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
        resend: Resend,
        stats: CallStats,
        // The failure the next attempt retries, returned if the retry cannot be sent.
        last: Option<Last<B>>,
        // `retry.reason` of the next attempt.
        reason: &'static str,
        // `retry.delay_ms` of the next attempt: the delay waited before it.
        delay: Duration,
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

/// What is kept of a request to build a retry.
struct Template {
    method: Method,
    uri: Uri,
    version: Version,
    headers: SavedHeaders,
    extensions: SavedExtensions,
}

enum Last<B> {
    Response(http::Response<B>),
    Error(Status),
}

impl<B> Last<B> {
    /// The code the caller will see.
    fn code(&self) -> Code {
        match self {
            Last::Response(r) => {
                trailers_only_code(r.headers()).unwrap_or_else(|| code_from_http_status(r.status()))
            }
            Last::Error(status) => crate::status::code_from_tonic(status.code()),
        }
    }
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
/// context's deadline; the layer's default only when neither is set. The flag says
/// whether the caller's own `grpc-timeout` is that deadline (then the first attempt can
/// send it as it is).
fn logical_deadline(
    headers: &HeaderMap,
    default: Option<Duration>,
    now: Instant,
) -> (Option<Instant>, bool) {
    let own = headers
        .get(&GRPC_TIMEOUT)
        .and_then(|v| decode_grpc_timeout(v.to_str().ok()?).ok())
        .map(|t| Deadline::after_at(now, t).instant());
    let ctx = CallContext::current().and_then(|c| c.deadline());
    match (own, ctx) {
        (Some(a), Some(b)) => (Some(a.min(b)), a <= b),
        (Some(a), None) => (Some(a), true),
        (None, Some(b)) => (Some(b), false),
        // Saturates: a default of `Duration::MAX` means "no practical limit", not a panic.
        (None, None) => (default.map(|t| Deadline::after_at(now, t).instant()), false),
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

/// The `x-retry-budget` header, as a name built once.
const X_RETRY_BUDGET: HeaderName = HeaderName::from_static(RETRY_BUDGET_HEADER);

/// Stamps what is left of the request's retry allowance, if it has one, on an attempt.
fn stamp_allowance(headers: &mut HeaderMap) {
    if let Some(left) = context::remaining_allowance() {
        headers.insert(X_RETRY_BUDGET, HeaderValue::from(left));
    }
}

/// A retry was refused: an event with its cause, the attempt it followed and the time left
/// on the call's deadline. Refusals that a healthy service makes all the time (a status
/// that is not retryable, a pushback) are at DEBUG; those that mean a dependency is
/// failing beyond what the policy pays for (budget, breaker, attempts, deadline, the
/// request's allowance) are at INFO.
fn log_refusal(uri: &Uri, refusal: Refusal, attempt: u32, left: Option<Duration>) {
    let left_ms = left.map(|d| d.as_millis() as u64);
    macro_rules! refused {
        ($level:expr) => {
            tracing::event!(
                $level,
                rpc.method = uri.path(),
                retry.refused = refusal.as_str(),
                retry.attempt = attempt,
                deadline.left_ms = left_ms,
                "stormguard: retry refused"
            )
        };
    }
    if refusal.is_retryable_but_refused() {
        refused!(tracing::Level::INFO);
    } else {
        refused!(tracing::Level::DEBUG);
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Error: Into<BoxError>,
{
    pub(super) fn start(svc: S, request: http::Request<Body>, shared: &Shared) -> Self {
        let now = Instant::now();
        let (mut parts, body) = request.into_parts();
        let stats = CallStats::new(shared.stats.clone(), shared.call_metrics(parts.uri.path()));
        // A method's own default deadline (a service config's `timeout`) wins over the
        // layer's; a deadline the caller set wins over both.
        let default = shared
            .controller
            .methods()
            .timeout(parts.uri.path())
            .or(shared.default_timeout);
        let (deadline, own_header) = logical_deadline(&parts.headers, default, now);
        let begun = shared.controller.begin_at(parts.uri.path(), deadline, now);

        let mut fut = ResponseFuture {
            svc,
            call: None,
            template: Template {
                method: parts.method.clone(),
                uri: parts.uri.clone(),
                version: parts.version,
                headers: SavedHeaders::Few(Default::default()),
                extensions: SavedExtensions::Empty,
            },
            resend: Resend::Never,
            stats,
            last: None,
            reason: "initial",
            delay: Duration::ZERO,
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
                fut.stats.outcome(Code::Unavailable);
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
            fut.stats.outcome(Code::DeadlineExceeded);
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
            // The caller's own `grpc-timeout`, when it is what the attempt has, goes out as
            // the caller wrote it (it was encoded a moment ago): no second encoding.
            if !(own_header && timers.attempt_deadline.is_none()) {
                set_timeout(&mut parts.headers, at.saturating_duration_since(now));
            }
            fut.timer = Some(tokio::time::sleep_until(at));
        }
        fut.attempt_deadline = timers.attempt_deadline;
        stamp_allowance(&mut parts.headers);

        let body = if call.is_retryable_method() {
            match buffer(body, shared.replay_limit) {
                Buffered::Whole(data) => {
                    fut.resend = Resend::Whole(data.clone());
                    full(data)
                }
                Buffered::Stream(replay, first) => {
                    fut.resend = Resend::Stream(replay);
                    Body::new(first)
                }
                // The body announced a length over the bound: sent once, never copied.
                Buffered::Once(body) => body,
            }
        } else {
            body
        };
        // Only a replayable body can be resent (see `Failure::replayable`): the parts of any
        // other request go out once and are not copied. The first attempt always takes the
        // caller's parts themselves.
        if !matches!(fut.resend, Resend::Never) {
            fut.template.headers = SavedHeaders::of(&parts.headers);
            fut.template.extensions = SavedExtensions::of(&parts.extensions);
        }
        let request = http::Request::from_parts(parts, body);
        fut.call = Some(call);
        fut.span = attempt_span(&fut.template.uri, 0, "initial", Duration::ZERO);
        fut.stats.attempt(false);
        let inner = {
            let _enter = fut.span.enter();
            fut.svc.call(request)
        };
        fut.state = State::Calling { fut: inner };
        fut
    }
}

/// A body that sends `data`.
fn full(data: Bytes) -> Body {
    if data.is_empty() {
        return Body::empty();
    }
    Body::new(OneChunk(Some(data)))
}

/// A body that sends one chunk of data. Unlike `http_body_util::Full` it announces no
/// exact length, as tonic's own request body does not: hyper then adds no
/// `content-length`, and the attempt is framed exactly as it would be without the layer.
struct OneChunk(Option<Bytes>);

impl http_body::Body for OneChunk {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        Poll::Ready(
            self.get_mut()
                .0
                .take()
                .map(|d| Ok(http_body::Frame::data(d))),
        )
    }
}

/// How a retry resends the request body.
enum Resend {
    /// It cannot: the method is not retried, or the body was too large to keep.
    Never,
    /// The whole body, read before the first attempt.
    Whole(Bytes),
    /// The body as buffered while the first attempt sent it.
    Stream(Replay),
}

impl Resend {
    fn is_replayable(&self) -> bool {
        match self {
            Resend::Never => false,
            Resend::Whole(_) => true,
            Resend::Stream(replay) => replay.is_replayable(),
        }
    }

    fn body(&self) -> Body {
        match self {
            Resend::Never => Body::empty(),
            Resend::Whole(data) => full(data.clone()),
            Resend::Stream(replay) => Body::new(replay.body()),
        }
    }
}

/// Headers kept for a retry: a handful inline (a gRPC request usually carries `te`,
/// `content-type` and little else), more in a copied map.
enum SavedHeaders {
    Few([Option<(HeaderName, HeaderValue)>; FEW_HEADERS]),
    Many(HeaderMap),
}

const FEW_HEADERS: usize = 4;

impl SavedHeaders {
    fn of(headers: &HeaderMap) -> Self {
        if headers.len() > FEW_HEADERS {
            return SavedHeaders::Many(headers.clone());
        }
        let mut few: [Option<(HeaderName, HeaderValue)>; FEW_HEADERS] = Default::default();
        for (slot, (name, value)) in few.iter_mut().zip(headers) {
            *slot = Some((name.clone(), value.clone()));
        }
        SavedHeaders::Few(few)
    }

    fn to_map(&self) -> HeaderMap {
        match self {
            SavedHeaders::Few(few) => {
                let mut map = HeaderMap::with_capacity(FEW_HEADERS + 2);
                for (name, value) in few.iter().flatten() {
                    map.append(name.clone(), value.clone());
                }
                map
            }
            SavedHeaders::Many(map) => map.clone(),
        }
    }
}

/// Extensions kept for a retry. tonic's generated clients add one, the method's name
/// ([`GrpcMethod`]), which is kept as it is; any other set is cloned whole.
enum SavedExtensions {
    Empty,
    Method(GrpcMethod<'static>),
    All(http::Extensions),
}

impl SavedExtensions {
    fn of(extensions: &http::Extensions) -> Self {
        if extensions.is_empty() {
            return SavedExtensions::Empty;
        }
        if extensions.len() == 1
            && let Some(method) = extensions.get::<GrpcMethod<'static>>()
        {
            return SavedExtensions::Method(method.clone());
        }
        SavedExtensions::All(extensions.clone())
    }

    fn to_extensions(&self) -> http::Extensions {
        match self {
            SavedExtensions::Empty => http::Extensions::new(),
            SavedExtensions::Method(method) => {
                let mut extensions = http::Extensions::new();
                extensions.insert(method.clone());
                extensions
            }
            SavedExtensions::All(extensions) => extensions.clone(),
        }
    }
}

impl Template {
    /// A retry's request, with `body`.
    fn request(&self, body: Body) -> http::Request<Body> {
        let mut request = http::Request::new(body);
        *request.method_mut() = self.method.clone();
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers.to_map();
        *request.extensions_mut() = self.extensions.to_extensions();
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

/// The `grpc-timeout` header, as a name built once (a `&str` key is parsed on every use).
const GRPC_TIMEOUT: HeaderName = HeaderName::from_static(GRPC_TIMEOUT_HEADER);

fn set_timeout(headers: &mut HeaderMap, left: Duration) {
    if let Ok(value) = HeaderValue::from_str(encode_grpc_timeout(left).as_str()) {
        headers.insert(GRPC_TIMEOUT, value);
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
                            return Poll::Ready(expire(this.call, this.stats, None));
                        }
                        // The attempt's own timeout ran out: dropping it cancels its stream
                        // (and tells the server through `RST_STREAM`).
                        this.state.set(State::Finished { status: None });
                        let failure = Failure {
                            code: Code::DeadlineExceeded,
                            pushback: None,
                            replayable: this.resend.is_replayable(),
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
                        let replayable = this.resend.is_replayable();
                        let now = Instant::now();
                        match classify(result, replayable) {
                            Outcome::Ok(response) => {
                                // A trailers-only `OK`: the outcome is known now.
                                if let Some(call) = this.call.as_mut() {
                                    call.on_success_at(now);
                                }
                                this.stats.outcome(Code::Ok);
                                this.state.set(State::Finished { status: None });
                                return Poll::Ready(Ok(response.map(ResponseBody::passthrough)));
                            }
                            Outcome::Committed(response) => {
                                // Passed through, never retried; the outcome is recorded when
                                // the body ends (see `body`). No retry can follow: stop
                                // buffering the request body, and settle a half-open probe.
                                if let Resend::Stream(replay) =
                                    std::mem::replace(this.resend, Resend::Never)
                                {
                                    replay.commit();
                                }
                                if let Some(call) = this.call.as_mut() {
                                    call.on_commit_at(now);
                                }
                                this.stats.committed();
                                this.state.set(State::Finished { status: None });
                                let (parts, body) = response.into_parts();
                                let body = ResponseBody::committed(
                                    body,
                                    this.call.take(),
                                    this.stats.take(),
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
                                    let answer = (!timed_out).then_some(&failure);
                                    return Poll::Ready(expire(this.call, this.stats, answer));
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
                            *this.delay = delay;
                            this.stats.delayed(matches!(
                                failure.pushback,
                                Some(stormguard_core::pushback::Pushback::RetryAfter(_))
                            ));
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
                            let attempt =
                                this.call.as_ref().map_or(0, CallRetry::previous_attempts);
                            let left = this.call.as_ref().and_then(|c| c.remaining_at(now));
                            log_refusal(&this.template.uri, refusal, attempt, left);
                            if timed_out {
                                return Poll::Ready(give_up_timed_out(this.stats, refusal));
                            }
                            return Poll::Ready(give_up(this.stats, refusal, last));
                        }
                    }
                }
                StateProj::Delaying { sleep } => {
                    ready!(sleep.poll(cx));
                    this.state.set(State::Readying);
                }
                StateProj::Readying => {
                    if timer_fired(this.timer.as_mut(), cx) {
                        this.state.set(State::Finished { status: None });
                        return Poll::Ready(expire(this.call, this.stats, None));
                    }
                    if let Err(err) = ready!(this.svc.poll_ready(cx)) {
                        // The channel cannot take the retry: the call ends like every other
                        // give-up, as a status marked "do not retry" (the granted retry
                        // goes back to the budget when the call state is dropped).
                        this.state.set(State::Finished { status: None });
                        drop(this.call.take());
                        let err: BoxError = err.into();
                        let code = classify_error(&*err).code;
                        this.stats.outcome(code);
                        return Poll::Ready(Err(Box::new(status_do_not_retry(status_from_error(
                            err, code,
                        )))));
                    }
                    let now = Instant::now();
                    let started = match this.call.as_mut() {
                        Some(call) => call.start_retry_at(now).map(|()| call.previous_attempts()),
                        None => Err(Refusal::NotRetryable),
                    };
                    let attempt = match started {
                        Ok(attempt) => attempt,
                        Err(refusal) => {
                            this.state.set(State::Finished { status: None });
                            let attempt =
                                this.call.as_ref().map_or(0, CallRetry::previous_attempts);
                            let left = this.call.as_ref().and_then(|c| c.remaining_at(now));
                            log_refusal(&this.template.uri, refusal, attempt, left);
                            let last = this.last.take().unwrap_or_else(|| {
                                Last::Error(Status::unavailable("stormguard: retry refused"))
                            });
                            return Poll::Ready(give_up(this.stats, refusal, last));
                        }
                    };
                    let mut request = this.template.request(this.resend.body());
                    let headers = request.headers_mut();
                    headers.insert(PREVIOUS_ATTEMPTS_HEADER, HeaderValue::from(attempt));
                    let timers = AttemptTimers::at(*this.logical, *this.attempt_timeout, now);
                    if let Some(at) = timers.fire_at {
                        set_timeout(headers, at.saturating_duration_since(now));
                        arm(this.timer.as_mut(), Some(at));
                    }
                    *this.attempt_deadline = timers.attempt_deadline;
                    *this.last = None;
                    stamp_allowance(headers);
                    *this.span =
                        attempt_span(&this.template.uri, attempt, this.reason, *this.delay);
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

/// The caller's deadline ran out: the call ends with `DEADLINE_EXCEEDED`, never retried,
/// whatever the attempt's `answer` was (`None`: no answer, the timer fired). The expiry
/// itself is recorded nowhere (see `CallRetry::on_deadline_passed_at`): the caller's
/// deadline says nothing about the dependency.
fn expire<B>(
    call: &mut Option<CallRetry>,
    stats: &mut CallStats,
    answer: Option<&Failure>,
) -> Result<http::Response<ResponseBody<B>>, BoxError> {
    if let Some(mut call) = call.take() {
        // Dropping the call state also gives back a retry granted but not started.
        call.on_deadline_passed_at(answer, Instant::now());
    }
    stats.deadline_exceeded();
    stats.outcome(Code::DeadlineExceeded);
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
    stats: &mut CallStats,
    refusal: Refusal,
) -> Result<http::Response<ResponseBody<B>>, BoxError> {
    stats.refused(refusal);
    stats.outcome(Code::DeadlineExceeded);
    Err(Box::new(status_do_not_retry(Status::deadline_exceeded(
        format!("stormguard: the attempt timed out and was not retried ({refusal})"),
    ))))
}

/// The caller gets the last failure; marked "do not retry" when stormguard refused to
/// retry a retryable failure. Either way, and when a pushback refused the retry, the
/// current request scope records the refusal (see `status::mark_do_not_retry`).
fn give_up<B>(
    stats: &mut CallStats,
    refusal: Refusal,
    last: Last<B>,
) -> Result<http::Response<ResponseBody<B>>, BoxError> {
    stats.refused(refusal);
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
        Last::Error(status) => Err(Box::new(if mark {
            status_do_not_retry(status)
        } else {
            status
        })),
    }
}
