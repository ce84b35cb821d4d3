//! Future types.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use pin_project_lite::pin_project;
use stormguard_core::context::{self, CallContext, RequestScope, RequestScoped, Scoped};
use stormguard_core::wire::http::GRPC_STATUS;
use tokio::time::Sleep;
use tower_service::Service;

use super::body::ShedBody;
use super::drain::Unread;
use super::events::QueuedEvents;
use super::gate::{Ticket, Turn, WorkerPermit};
use super::load::CallReport;
use super::response;

pin_project! {
    /// The response future of [`ShedService`](super::ShedService).
    ///
    /// A hand-written state machine, no boxing: a queued call holds its place
    /// ([`Ticket`]), a timer for its expiry, the readied inner service and the request;
    /// once a worker is granted it calls the inner service and holds the worker
    /// ([`WorkerPermit`]) until the inner future finishes, then hands it to the response
    /// body ([`ShedBody`]), which holds it until the body ends. The inner future runs with the
    /// call's [`CallContext`] set (its deadline from the inbound `grpc-timeout`), so the
    /// handler's outgoing calls through a `RetryLayer` inherit the deadline. Dropping the
    /// future at any point gives back what it holds.
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        // The call's load report, when the layer sends them: attached to whichever
        // answer the call ends with.
        report: Option<CallReport>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        Queued {
            ticket: Ticket,
            #[pin]
            timer: Sleep,
            service: Option<S>,
            request: Unread<Req>,
            context: CallContext,
            scope: Option<RequestScope>,
            events: QueuedEvents,
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

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    pub(crate) fn running(
        context: CallContext,
        scope: RequestScope,
        future: S::Future,
        permit: WorkerPermit,
        report: Option<CallReport>,
    ) -> Self {
        ResponseFuture {
            state: State::Running {
                future: context::request_scope(scope, context::scope(context, future)),
                permit: Some(permit),
            },
            report,
        }
    }

    pub(crate) fn queued(
        context: CallContext,
        scope: RequestScope,
        ticket: Ticket,
        service: S,
        request: Unread<Req>,
        events: QueuedEvents,
        report: Option<CallReport>,
    ) -> Self {
        let timer = tokio::time::sleep_until(ticket.expiry());
        ResponseFuture {
            state: State::Queued {
                ticket,
                timer,
                service: Some(service),
                request,
                context,
                scope: Some(scope),
                events,
            },
            report,
        }
    }

    /// A call that bypasses the queue: no worker to hold.
    pub(crate) fn bypass(context: CallContext, scope: RequestScope, future: S::Future) -> Self {
        ResponseFuture {
            state: State::Running {
                future: context::request_scope(scope, context::scope(context, future)),
                permit: None,
            },
            report: None,
        }
    }

    pub(crate) fn answered(response: http::Response<()>) -> Self {
        ResponseFuture {
            state: State::Answered {
                response: Some(response),
            },
            report: None,
        }
    }
}

impl<S, Req, B> Future for ResponseFuture<S, Req>
where
    S: Service<Req, Response = http::Response<B>>,
    B: http_body::Body,
{
    type Output = Result<http::Response<ShedBody<B>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut state = this.state;
        let report = this.report;
        loop {
            match state.as_mut().project() {
                StateProj::Queued {
                    ticket,
                    timer,
                    service,
                    request,
                    context,
                    scope,
                    events,
                } => {
                    let fired = timer.poll(cx).is_ready();
                    match ticket.poll_turn(cx.waker(), fired) {
                        Turn::Wait => return Poll::Pending,
                        Turn::Expired => {
                            events.expired();
                            // Dropping the queued state discards the unread request body.
                            state.set(State::Answered { response: None });
                            let answer =
                                response::with_report(response::expired(), report.as_ref(), false);
                            return Poll::Ready(Ok(with_empty_body(answer)));
                        }
                        Turn::Closing => {
                            // As when expired, dropping the queued state discards the unread
                            // request body.
                            state.set(State::Answered { response: None });
                            let answer = response::with_report(
                                response::shutting_down(),
                                report.as_ref(),
                                false,
                            );
                            return Poll::Ready(Ok(with_empty_body(answer)));
                        }
                        Turn::Shed(shed) => {
                            // Gave its place up in a full queue; as when expired, dropping
                            // the queued state discards the unread request body.
                            events.shed(&shed);
                            let code = ticket.shed_code(shed.pushback);
                            state.set(State::Answered { response: None });
                            let answer = response::shed(code, shed.reason, shed.pushback);
                            let answer = response::with_report(answer, report.as_ref(), true);
                            return Poll::Ready(Ok(with_empty_body(answer)));
                        }
                        Turn::Run(permit) => {
                            if let Some(report) = report.as_mut() {
                                report.started_at(stormguard_core::Instant::now());
                            }
                            let (Some(mut service), Some(request), Some(scope)) =
                                (service.take(), request.take(), scope.take())
                            else {
                                // The state only holds both until this transition.
                                unreachable_state();
                                return Poll::Ready(Ok(with_empty_body(response::expired())));
                            };
                            let future = context::request_scope(
                                scope,
                                context::scope(*context, service.call(request)),
                            );
                            state.set(State::Running {
                                future,
                                permit: Some(permit),
                            });
                        }
                    }
                }
                StateProj::Running { mut future, permit } => {
                    let output = std::task::ready!(future.as_mut().poll(cx));
                    let permit = permit.take();
                    // A client layer inside the handler gave up on a retryable failure:
                    // the handler's own answer must not invite a retry from above either.
                    let refused = future
                        .take_value()
                        .is_some_and(|scope| scope.downstream_refused());
                    let output = output.map(|mut response| {
                        if refused && response::mark_downstream_refused(&mut response) {
                            tracing::debug!("stormguard: answer marked do-not-retry");
                        }
                        response
                    });
                    let mut report = report.take();
                    return Poll::Ready(match output {
                        // The body holds the worker until it ends (see `ShedBody`).
                        Ok(mut response) => {
                            // A trailers-only answer (its status in the headers) carries the
                            // report there; any other in its trailers (see `ShedBody`).
                            if response.headers().contains_key(GRPC_STATUS)
                                && let Some(report) = report.take()
                            {
                                report.attach_at(
                                    response.headers_mut(),
                                    stormguard_core::Instant::now(),
                                );
                            }
                            Ok(response.map(|body| ShedBody::holding(body, permit, report)))
                        }
                        Err(error) => {
                            if let Some(permit) = permit {
                                permit.finished();
                            }
                            Err(error)
                        }
                    });
                }
                StateProj::Answered { response } => {
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
