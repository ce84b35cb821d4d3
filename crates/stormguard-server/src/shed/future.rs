//! Future types.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use pin_project_lite::pin_project;
use stormguard_core::Instant;
use stormguard_core::wire::http::grpc_status;
use stormguard_core::{
    context, context::CallContext, context::RequestScope, context::RequestScoped, context::Scoped,
};
use tokio::time::Sleep;
use tower_service::Service;

use super::body::ShedBody;
use super::drain::Discard;
use super::events::QueuedEvents;
use super::gate::{Ticket, Turn, WorkerPermit};
use super::load::{self, CallReport};
use super::response;

pin_project! {
    #[project = FutureProj]
    /// The response future of [`ShedService`](super::ShedService).
    ///
    /// A hand-written state machine, the inner future not boxed: a queued call holds its
    /// place ([`Ticket`]), a timer for its expiry, the readied inner service and the request
    /// (in one allocation, which a call admitted at once never makes);
    /// once a worker is granted it calls the inner service and holds the worker
    /// ([`WorkerPermit`]) until the inner future finishes, then hands it to the response
    /// body ([`ShedBody`]), which holds it until the body ends. The inner future runs with the
    /// call's [`CallContext`] set (its deadline from the inbound `grpc-timeout`), so the
    /// handler's outgoing calls through a `RetryLayer` inherit the deadline. Dropping the
    /// future at any point gives back what it holds.
    ///
    /// A call with a deadline is cut when it passes
    /// ([`AdmissionConfig::cut_at`](stormguard_core::AdmissionConfig::cut_at)):
    /// while the handler has not answered, the handler's future is dropped, the worker given
    /// back at once and the caller answered `DEADLINE_EXCEEDED` (trailers-only); once it
    /// answered, the response body carries the same rule (see [`ShedBody`]).
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        // The call's load report, when the layer sends them: attached to whichever
        // answer the call ends with.
        report: Option<CallReport>,
        // One timer: a queued call's expiry, then, for a call with a deadline, when the
        // running call is cut.
        #[pin]
        timer: Option<Sleep>,
        // When a call with a deadline is cut while it runs.
        cut_at: Option<Instant>,
        // What tells how a queued call left the queue, or that a call was cut.
        events: Option<QueuedEvents>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        // Boxed: the happy path never waits, and a running call's future stays small as
        // the server's stack moves it.
        Queued {
            queued: Box<Queued<S, Req>>,
        },
        Running {
            #[pin]
            future: RequestScoped<Scoped<S::Future>>,
            permit: Option<WorkerPermit>,
        },
        Answered {
            response: Option<http::Response<()>>,
        },
    }
}

/// What a queued call keeps until its turn: its place, the readied inner service and the
/// request, and what its handler runs with.
struct Queued<S, Req> {
    ticket: Ticket,
    service: Option<S>,
    request: Discard<Req>,
    context: CallContext,
    scope: Option<RequestScope>,
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    /// A call given a worker at once; `cut`: when it is cut, for a call with a deadline,
    /// and what tells of it.
    pub(crate) fn running(
        context: CallContext,
        scope: RequestScope,
        future: S::Future,
        permit: WorkerPermit,
        report: Option<CallReport>,
        cut: Option<(Instant, QueuedEvents)>,
    ) -> Self {
        let (cut_at, events) = cut.unzip();
        ResponseFuture {
            state: State::Running {
                future: context::request_scope(scope, context::scope(context, future)),
                permit: Some(permit),
            },
            report,
            timer: cut_at.map(tokio::time::sleep_until),
            cut_at,
            events,
        }
    }

    pub(crate) fn queued(
        context: CallContext,
        scope: RequestScope,
        ticket: Ticket,
        service: S,
        request: Discard<Req>,
        events: QueuedEvents,
        report: Option<CallReport>,
    ) -> Self {
        let timer = tokio::time::sleep_until(ticket.expiry());
        ResponseFuture {
            state: State::Queued {
                queued: Box::new(Queued {
                    ticket,
                    service: Some(service),
                    request,
                    context,
                    scope: Some(scope),
                }),
            },
            report,
            timer: Some(timer),
            cut_at: None,
            events: Some(events),
        }
    }

    /// A queued call with a deadline: once it runs, it is cut at `at`.
    pub(crate) fn cut_at(mut self, at: Option<Instant>) -> Self {
        self.cut_at = at;
        self
    }

    /// A call that bypasses the queue: no worker to hold.
    pub(crate) fn bypass(context: CallContext, scope: RequestScope, future: S::Future) -> Self {
        ResponseFuture {
            state: State::Running {
                future: context::request_scope(scope, context::scope(context, future)),
                permit: None,
            },
            report: None,
            timer: None,
            cut_at: None,
            events: None,
        }
    }

    pub(crate) fn answered(response: http::Response<()>) -> Self {
        ResponseFuture {
            state: State::Answered {
                response: Some(response),
            },
            report: None,
            timer: None,
            cut_at: None,
            events: None,
        }
    }
}

impl<S, Req, B> Future for ResponseFuture<S, Req>
where
    S: Service<Req, Response = http::Response<B>>,
    B: http_body::Body,
{
    type Output = Answer<B, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Queued { .. } => {
                    // A queued call may be answered by the layer (shed, expired, closing):
                    // it spends the task's cooperative budget as tokio's resources do.
                    let coop = ready!(tokio::task::coop::poll_proceed(cx));
                    let answer = ready!(poll_queued(&mut this, cx));
                    coop.made_progress();
                    if let Some(answer) = answer {
                        return Poll::Ready(answer);
                    }
                }
                StateProj::Running { .. } => return poll_running(&mut this, cx),
                StateProj::Answered { response } => {
                    // Answered without I/O: a caller's loop of such calls still yields.
                    ready!(tokio::task::coop::poll_proceed(cx)).made_progress();
                    return match response.take() {
                        Some(response) => Poll::Ready(Ok(with_empty_body(response))),
                        None => {
                            unreachable_state();
                            Poll::Pending
                        }
                    };
                }
            }
        }
    }
}

/// What the future answers.
type Answer<B, E> = Result<http::Response<ShedBody<B>>, E>;

/// `Queued`: the call waits for its turn; it runs, or is answered by the layer (expired,
/// shed, the server closing). `None` once it runs.
fn poll_queued<S, Req, B>(
    this: &mut FutureProj<'_, S, Req>,
    cx: &mut Context<'_>,
) -> Poll<Option<Answer<B, S::Error>>>
where
    S: Service<Req, Response = http::Response<B>>,
{
    let StateProj::Queued { queued } = this.state.as_mut().project() else {
        return Poll::Ready(None);
    };
    let Queued {
        ticket,
        service,
        request,
        context,
        scope,
    } = &mut **queued;
    let fired = poll_timer(this.timer.as_mut(), cx);
    let (answer, shed) = match ticket.poll_turn(cx.waker(), fired) {
        Turn::Wait => return Poll::Pending,
        Turn::Expired => {
            if let Some(events) = this.events.as_ref() {
                events.expired();
            }
            (response::expired(), false)
        }
        Turn::Closing => (response::shutting_down(ticket.sends_retry_info()), false),
        Turn::Shed(shed) => {
            // Gave its place up in a full queue.
            if let Some(events) = this.events.as_ref() {
                events.shed(&shed);
            }
            let code = ticket.shed_code(shed.pushback);
            let retry_info = ticket.sends_retry_info();
            let answer = response::shed(code, shed.reason, shed.pushback, retry_info);
            (answer, true)
        }
        Turn::Run(permit) => {
            let taken = (service.take(), request.take(), scope.take());
            let context = *context;
            return Poll::Ready(run(this, permit, context, taken));
        }
    };
    // Dropping the queued state discards the unread request body.
    this.state.set(State::Answered { response: None });
    let answer = load::with_report(answer, this.report.as_ref(), shed);
    Poll::Ready(Some(Ok(with_empty_body(answer))))
}

/// A queued call's turn came: it calls the inner service with what it kept, holding
/// `permit`. `None` once it runs.
fn run<S, Req, B>(
    this: &mut FutureProj<'_, S, Req>,
    permit: WorkerPermit,
    context: CallContext,
    taken: (Option<S>, Option<Req>, Option<RequestScope>),
) -> Option<Answer<B, S::Error>>
where
    S: Service<Req, Response = http::Response<B>>,
{
    if let Some(report) = this.report.as_mut() {
        report.started_at(stormguard_core::Instant::now());
    }
    let (Some(mut service), Some(request), Some(scope)) = taken else {
        // The state only holds both until this transition.
        unreachable_state();
        return Some(Ok(with_empty_body(response::expired())));
    };
    let future = context::request_scope(scope, context::scope(context, service.call(request)));
    // The expiry's timer now watches when the running call is cut.
    match *this.cut_at {
        Some(at) if this.timer.is_some() => {
            if let Some(sleep) = this.timer.as_mut().as_pin_mut() {
                sleep.reset(at);
            }
        }
        _ => this.timer.set(None),
    }
    this.state.set(State::Running {
        future,
        permit: Some(permit),
    });
    None
}

/// `Running`: the handler answers, or its deadline passes first and the call is cut.
///
/// The handler's answer is taken where the state holds it, not handed through helpers:
/// the future runs on every call, and each hand-over copies the response.
fn poll_running<S, Req, B>(
    this: &mut FutureProj<'_, S, Req>,
    cx: &mut Context<'_>,
) -> Poll<Answer<B, S::Error>>
where
    S: Service<Req, Response = http::Response<B>>,
    B: http_body::Body,
{
    let StateProj::Running { mut future, permit } = this.state.as_mut().project() else {
        unreachable_state();
        return Poll::Pending;
    };
    let output = match future.as_mut().poll(cx) {
        Poll::Ready(output) => output,
        Poll::Pending => {
            if !poll_timer(this.timer.as_mut(), cx) {
                return Poll::Pending;
            }
            return Poll::Ready(Ok(cut(this)));
        }
    };
    // Whether a client layer inside the handler gave up on a retryable failure.
    let refused = future
        .take_value()
        .is_some_and(|scope| scope.downstream_refused());
    let permit = permit.take();
    let mut response = match output {
        Ok(response) => response,
        Err(error) => {
            if let Some(permit) = permit {
                permit.finished();
            }
            return Poll::Ready(Err(error));
        }
    };
    // The handler's own answer must not invite a retry from above either.
    if refused && response::mark_downstream_refused(&mut response) {
        tracing::debug!("stormguard: answer marked do-not-retry");
    }
    // A trailers-only answer (its status in the headers) carries the report there; any
    // other in its trailers (see `ShedBody`).
    let mut report = this.report.take();
    let status = grpc_status(response.headers());
    if status.is_some()
        && let Some(report) = report.take()
    {
        report.attach_at(response.headers_mut(), stormguard_core::Instant::now());
    }
    let cut = this.cut_at.take().zip(this.events.take());
    let permit = permit.map(|mut permit| {
        permit.answered();
        if let Some(code) = status {
            permit.answered_with_code(code);
        }
        permit
    });
    // The body holds the worker until it ends (see `ShedBody`).
    Poll::Ready(Ok(
        response.map(|body| ShedBody::holding(body, permit, report, cut))
    ))
}

/// The deadline passed before the handler answered: its future is dropped, then its worker
/// given back, and the caller answered `DEADLINE_EXCEEDED`.
fn cut<S, Req, B>(this: &mut FutureProj<'_, S, Req>) -> http::Response<ShedBody<B>>
where
    S: Service<Req>,
{
    let permit = this.state.as_mut().take_permit();
    this.state.set(State::Answered { response: None });
    this.timer.set(None);
    if let Some(events) = this.events.as_ref() {
        events.cut(false);
    }
    let answer = load::with_report(response::deadline_cut(), this.report.as_ref(), false);
    if let Some(permit) = permit {
        permit.cut();
    }
    with_empty_body(answer)
}

impl<S, Req> State<S, Req>
where
    S: Service<Req>,
{
    /// The worker a running call holds.
    fn take_permit(self: Pin<&mut Self>) -> Option<WorkerPermit> {
        match self.project() {
            StateProj::Running { permit, .. } => permit.take(),
            _ => None,
        }
    }
}

/// Whether `timer` is armed and has fired (registers `cx` to be woken when it does).
fn poll_timer(timer: Pin<&mut Option<Sleep>>, cx: &mut Context<'_>) -> bool {
    timer
        .as_pin_mut()
        .is_some_and(|sleep| sleep.poll(cx).is_ready())
}

fn with_empty_body<B>(response: http::Response<()>) -> http::Response<ShedBody<B>> {
    response.map(|()| ShedBody::empty())
}

/// Logs a state the future cannot reach (polled after completion); never panics.
fn unreachable_state() {
    tracing::error!("stormguard ShedService future polled after completion");
}

impl<S, Req> fmt::Debug for ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Queued { .. } => "queued",
            State::Running { .. } => "running",
            State::Answered { .. } => "answered",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .finish()
    }
}
