//! The response future of [`Replicas`](super::Replicas): readies the chosen replica, sends
//! the attempt, and reports how it ended.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use http::StatusCode;
use pin_project_lite::pin_project;
use stormguard_core::Code;
use stormguard_core::Instant;
use stormguard_core::Pushback;
use stormguard_core::{ReplicaId, ReplicaOutcome};
use tower_service::Service;

use stormguard_core::wire::{GRPC_TIMEOUT, decode_grpc_timeout};
use stormguard_core::{Deadline, FIRST_PICK_WAIT};

use super::route::Route;
use super::{EndAttempt, Pick, Picked};
use stormguard_core::wire::http::grpc_status;

use crate::status::{BoxError, classify_error, code_from_http_status, pushback};

/// The error of a call made while the channel holds no replica.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("stormguard: no replica to send the call to")]
pub struct NoReplica;

/// The error of a call made while every replica's client-side health check (gRFC A17,
/// [`ReplicaConfig::health_check`](stormguard_core::ReplicaConfig::health_check)) says it
/// does not serve: `NOT_SERVING`, `SERVICE_UNKNOWN`, or no answer yet. The call fails at
/// once rather than wait, as a gRPC channel's balancer fails a call (without
/// wait-for-ready) while no subchannel is ready; a retry layer above sees it as
/// `UNAVAILABLE`.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error(
    "stormguard: no replica serving: the health check of each of the {replicas} replicas says NOT_SERVING, SERVICE_UNKNOWN or has not answered"
)]
pub struct NotServing {
    /// How many replicas the channel holds.
    pub replicas: usize,
}

impl NotServing {
    pub(super) fn of(replicas: usize) -> Self {
        NotServing { replicas }
    }
}

/// The error of a call made while a channel found by DNS holds no replica because its
/// name has not resolved ([`Replicas::from_dns`](super::Replicas::from_dns)): the name
/// and why.
#[derive(Debug, Clone, thiserror::Error)]
#[error("stormguard: `{name}` has not resolved to any replica: {reason}")]
pub struct Unresolved {
    /// The name.
    pub name: Arc<str>,
    /// The last resolution's error.
    pub reason: Arc<str>,
}

/// The error of a call that waited for a replica to take it until its deadline (or
/// [`FIRST_PICK_WAIT`](stormguard_core::FIRST_PICK_WAIT), 10 s, for a call without one):
/// a replica had not answered its first health check, or the channel's first DNS lookup
/// had not ended (see [`Unpicked::Wait`](stormguard_core::Unpicked::Wait)). `why` says which.
#[derive(Debug, Clone, thiserror::Error)]
#[error("stormguard: no replica took the call within {waited:?}: {why}")]
pub struct NotYet {
    /// How long the call waited.
    pub waited: Duration,
    /// What it waited for.
    pub why: Arc<str>,
}

/// The error of a call through [`Replicas`](super::Replicas): a typed error, so that
/// middleware bounded on `S::Error: std::error::Error` sits over the channel as over a tonic
/// `Channel`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The channel held no replica.
    #[error(transparent)]
    NoReplica(#[from] NoReplica),
    /// The channel is found by DNS and its name has not resolved.
    #[error(transparent)]
    Unresolved(#[from] Unresolved),
    /// Every replica's health check says it does not serve.
    #[error(transparent)]
    NotServing(#[from] NotServing),
    /// The call waited for a replica until its deadline.
    #[error(transparent)]
    NotYet(#[from] NotYet),
    /// The chosen replica's service failed: its error is this one's source, and its message
    /// this one's (so a status built from it reads as the replica's error does).
    #[error("{0}")]
    Replica(#[source] BoxError),
}

impl Error {
    /// The replica's own error (or [`NoReplica`]), boxed.
    pub fn into_inner(self) -> BoxError {
        match self {
            Error::NoReplica(e) => Box::new(e),
            Error::Unresolved(e) => Box::new(e),
            Error::NotServing(e) => Box::new(e),
            Error::NotYet(e) => Box::new(e),
            Error::Replica(e) => e,
        }
    }
}

/// An inner service's error as the retry layer reads it: a [`Replicas`](super::Replicas)
/// error is unwrapped to the replica's own, so that it is classified (and its status built)
/// exactly as the replica's error would be without the channel.
pub(crate) fn unwrap_error(err: BoxError) -> BoxError {
    match err.downcast::<Error>() {
        Ok(err) => err.into_inner(),
        Err(err) => err,
    }
}

pin_project! {
    /// The future of one attempt through [`Replicas`](super::Replicas).
    pub struct ResponseFuture<S, B>
    where
        S: Service<http::Request<B>>,
    {
        svc: Option<S>,
        request: Option<http::Request<B>>,
        attempt: Option<Attempt>,
        // While the call waits for a replica (boxed: only a call at start waits).
        wait: Option<Box<Wait<S>>>,
        #[pin]
        state: State<S::Future>,
    }
}

/// A call waiting for a replica to take it: it picks again after each change of the
/// channel, until its deadline.
struct Wait<S> {
    picker: Arc<dyn Pick<S>>,
    route: Option<Route>,
    changed: Pin<Box<dyn Future<Output = Changes> + Send>>,
    deadline: Pin<Box<tokio::time::Sleep>>,
    why: Arc<str>,
    since: Instant,
}

type Changes = tokio::sync::watch::Receiver<u64>;

/// Waits for the next change of the channel.
fn next_change(mut changes: Changes) -> Pin<Box<dyn Future<Output = Changes> + Send>> {
    Box::pin(async move {
        // An error: the channel is gone; picking again then fails the call.
        let _ = changes.changed().await;
        changes
    })
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        // No replica can take the call yet: it waits (see `Wait`).
        Waiting,
        // The chosen replica's service is being readied.
        Ready,
        // The attempt is in flight.
        Called { #[pin] fut: F },
        // Nothing to send it to, and why.
        Empty { error: Option<Error> },
    }
}

/// The attempt's replica; reports a cut-off attempt when dropped before it ended.
struct Attempt {
    ends: Arc<dyn EndAttempt>,
    id: ReplicaId,
    started: Instant,
    ended: bool,
}

impl Attempt {
    fn end(mut self, outcome: ReplicaOutcome) {
        self.ended = true;
        self.ends.end(self.id, outcome, self.started);
    }
}

impl Drop for Attempt {
    fn drop(&mut self) {
        if !self.ended {
            self.ends.end(self.id, ReplicaOutcome::CutOff, self.started);
        }
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<http::Request<B>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseFuture")
            .field("replica", &self.attempt.as_ref().map(|a| a.id))
            .finish_non_exhaustive()
    }
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<http::Request<B>>,
{
    pub(super) fn new(
        svc: S,
        request: http::Request<B>,
        ends: Arc<dyn EndAttempt>,
        id: ReplicaId,
        started: Instant,
    ) -> Self {
        ResponseFuture {
            svc: Some(svc),
            request: Some(request),
            attempt: Some(Attempt {
                ends,
                id,
                started,
                ended: false,
            }),
            wait: None,
            state: State::Ready,
        }
    }

    /// A call that waits for a replica (`why`) until its deadline, read from `request`'s
    /// `grpc-timeout` (or [`FIRST_PICK_WAIT`] without one).
    pub(super) fn waiting(
        picker: Arc<dyn Pick<S>>,
        request: http::Request<B>,
        route: Option<Route>,
        changes: Changes,
        why: Arc<str>,
        now: Instant,
    ) -> Self {
        let timeout = request
            .headers()
            .get(GRPC_TIMEOUT)
            .and_then(|v| decode_grpc_timeout(v.as_bytes()).ok())
            .unwrap_or(FIRST_PICK_WAIT);
        if let Some(route) = &route {
            route.set_waiting(Some(Arc::clone(&why)));
        }
        ResponseFuture {
            svc: None,
            request: Some(request),
            attempt: None,
            wait: Some(Box::new(Wait {
                picker,
                route,
                changed: next_change(changes),
                deadline: Box::pin(tokio::time::sleep_until(
                    Deadline::after_at(now, timeout).instant(),
                )),
                why,
                since: now,
            })),
            state: State::Waiting,
        }
    }

    /// A call that fails with `error` without an attempt.
    pub(super) fn failed(error: Error) -> Self {
        ResponseFuture {
            svc: None,
            request: None,
            attempt: None,
            wait: None,
            state: State::Empty { error: Some(error) },
        }
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
    S::Error: Into<BoxError>,
{
    type Output = Result<http::Response<RB>, Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            match this.state.as_mut().project() {
                StateProj::Empty { error } => {
                    // Answered without I/O: a caller's loop of such calls still yields.
                    ready!(tokio::task::coop::poll_proceed(cx)).made_progress();
                    return Poll::Ready(Err(error.take().unwrap_or(Error::NoReplica(NoReplica))));
                }
                StateProj::Waiting => {
                    let Some(wait) = this.wait.as_mut() else {
                        return Poll::Ready(Err(NoReplica.into()));
                    };
                    let next = match poll_wait(wait, cx) {
                        Poll::Pending => return Poll::Pending,
                        Poll::Ready(next) => next,
                    };
                    *this.wait = None;
                    match next {
                        Ok((svc, attempt)) => {
                            *this.svc = Some(svc);
                            *this.attempt = Some(attempt);
                            this.state.set(State::Ready);
                        }
                        Err(error) => this.state.set(State::Empty { error: Some(error) }),
                    }
                }
                StateProj::Ready => {
                    let (Some(svc), Some(request)) = (this.svc.as_mut(), this.request.take())
                    else {
                        return Poll::Ready(Err(NoReplica.into()));
                    };
                    match svc.poll_ready(cx) {
                        Poll::Pending => {
                            *this.request = Some(request);
                            return Poll::Pending;
                        }
                        Poll::Ready(Err(err)) => {
                            let err = err.into();
                            finish(this.attempt, outcome_of_error(&*err));
                            return Poll::Ready(Err(Error::Replica(err)));
                        }
                        Poll::Ready(Ok(())) => {
                            let fut = svc.call(request);
                            this.state.set(State::Called { fut });
                        }
                    }
                }
                StateProj::Called { fut } => {
                    let result = ready!(fut.poll(cx)).map_err(Into::into);
                    let outcome = match &result {
                        Ok(response) => outcome_of_response(response),
                        Err(err) => outcome_of_error(&**err),
                    };
                    finish(this.attempt, outcome);
                    *this.svc = None;
                    return Poll::Ready(result.map_err(Error::Replica));
                }
            }
        }
    }
}

/// A waiting call: picks again after each change of the channel, until a replica takes
/// it (its service and attempt), the channel says it fails, or its deadline passes.
fn poll_wait<S>(wait: &mut Wait<S>, cx: &mut Context<'_>) -> Poll<Result<(S, Attempt), Error>> {
    while let Poll::Ready(changes) = wait.changed.as_mut().poll(cx) {
        let now = Instant::now();
        match Arc::clone(&wait.picker).pick(wait.route.as_ref(), now) {
            Picked::Replica { svc, id, ends } => {
                let attempt = Attempt {
                    ends,
                    id,
                    started: now,
                    ended: false,
                };
                return Poll::Ready(Ok((svc, attempt)));
            }
            Picked::Failed(error) => {
                if let Some(route) = &wait.route {
                    route.set_waiting(None);
                }
                return Poll::Ready(Err(error));
            }
            Picked::Wait {
                changes: fresh,
                why,
            } => {
                drop(changes);
                if let Some(route) = &wait.route {
                    route.set_waiting(Some(Arc::clone(&why)));
                }
                wait.why = why;
                wait.changed = next_change(fresh);
            }
        }
    }
    ready!(wait.deadline.as_mut().poll(cx));
    Poll::Ready(Err(NotYet {
        waited: Instant::now().saturating_duration_since(wait.since),
        why: Arc::clone(&wait.why),
    }
    .into()))
}

fn finish(attempt: &mut Option<Attempt>, outcome: ReplicaOutcome) {
    if let Some(attempt) = attempt.take() {
        attempt.end(outcome);
    }
}

/// What a response says of the replica: read from a trailers-only status, or a success
/// when the headers commit the call.
fn outcome_of_response<RB>(response: &http::Response<RB>) -> ReplicaOutcome {
    let code = match grpc_status(response.headers()) {
        Some(code) => code,
        None if response.status() == StatusCode::OK => return ReplicaOutcome::Success,
        None => code_from_http_status(response.status()),
    };
    outcome_of_code(code, pushback(response.headers()))
}

fn outcome_of_error(err: &(dyn std::error::Error + 'static)) -> ReplicaOutcome {
    let failure = classify_error(err);
    if failure.timed_out {
        ReplicaOutcome::CutOff
    } else if failure.connect {
        ReplicaOutcome::Refused
    } else {
        outcome_of_code(failure.code, None)
    }
}

/// The one place an answer's code is sorted for a replica's health (see
/// [`ReplicaOutcome`]).
pub(super) fn outcome_of_code(code: Code, pushback: Option<Pushback>) -> ReplicaOutcome {
    if pushback.is_some() {
        return ReplicaOutcome::Overload;
    }
    match code {
        Code::Unavailable | Code::Internal | Code::Unknown | Code::DataLoss => {
            ReplicaOutcome::Failure
        }
        Code::ResourceExhausted | Code::DeadlineExceeded | Code::Cancelled => {
            ReplicaOutcome::Overload
        }
        _ => ReplicaOutcome::Success,
    }
}

#[cfg(test)]
mod tests;
