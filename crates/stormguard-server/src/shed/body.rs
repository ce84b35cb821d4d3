//! The response body: the handler's, holding the call's worker until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use stormguard_core::{DeadlineCut, Instant, Polled};

use super::events::QueuedEvents;
use super::gate::WorkerPermit;
use super::load::CallReport;

pin_project! {
    #[project = ShedBodyProj]
    /// The response body of a [`ShedService`](super::ShedService).
    ///
    /// For a call that ran, it is the handler's body, and it holds the call's worker
    /// until the body ends (its last frame or its trailers were read), is dropped (the
    /// caller went away, or the transport gave up), or first has nothing to send: a
    /// streaming call counts against the workers while its handler works, not while its
    /// stream sits idle waiting for its next message, so a server with many open watches
    /// serves its unary callers as it does without them. A unary answer is complete when
    /// the handler returns, and holds its worker to its end. A stream that yields to the
    /// runtime while it still has messages to send (`tokio_stream::iter` does every 32)
    /// gives its worker back at that first yield too: from then on its messages are the
    /// transport's work, not a worker's. For the layer's own answers it is empty. With load
    /// reports on, it adds the call's report to the handler's trailers.
    ///
    /// A call with a deadline is held to it while it streams: when its cut-off passes
    /// ([`AdmissionConfig::cut_at`](stormguard_core::AdmissionConfig::cut_at))
    /// before the body ended, the handler's body (its stream) is dropped, the worker given
    /// back at once, and the body ends with trailers carrying `grpc-status: 4` after the
    /// messages sent so far. A frame the handler has ready is forwarded after one clock read
    /// (data frames only); the first time it has none, a timer is armed at the cut-off.
    pub struct ShedBody<B> {
        // The handler's body (none for the layer's own answers), held to the call's
        // cut-off while it streams.
        #[pin]
        body: DeadlineCut<B>,
        permit: Option<WorkerPermit>,
        report: Option<CallReport>,
        // What tells of a cut.
        events: Option<QueuedEvents>,
    }
}

impl<B> ShedBody<B> {
    /// An empty body: the layer's own answers (trailers-only).
    pub(crate) fn empty() -> Self {
        ShedBody {
            body: DeadlineCut::empty(),
            permit: None,
            report: None,
            events: None,
        }
    }

    /// The handler's `body`, which holds `permit` until it ends or is dropped, and adds
    /// `report` to its trailers; `cut`: when it is cut, for a call with a deadline, and
    /// what tells of it.
    #[inline]
    pub(crate) fn holding(
        body: B,
        permit: Option<WorkerPermit>,
        report: Option<CallReport>,
        cut: Option<(Instant, QueuedEvents)>,
    ) -> Self
    where
        B: Body,
    {
        let (permit, cut) = match permit {
            // Already over (a trailers-only answer, an empty body): the worker is free now.
            Some(permit) if body.is_end_stream() => {
                permit.finished();
                (None, None)
            }
            permit => (permit, cut),
        };
        let (cut_at, events) = cut.unzip();
        ShedBody {
            body: DeadlineCut::new(body, cut_at),
            permit,
            report,
            events,
        }
    }
}

impl<B> Default for ShedBody<B> {
    fn default() -> Self {
        ShedBody::empty()
    }
}

impl<B: Body> Body for ShedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let polled = match this.body.poll_frame(cx) {
            Poll::Ready(polled) => polled,
            Poll::Pending => {
                // Nothing to send yet: the response waits for its next message (a stream
                // idle between messages). The handler's work is done, and the worker goes
                // back until the call ends (a unary answer is never pending here).
                if let Some(permit) = this.permit.as_mut() {
                    permit.idle();
                }
                return Poll::Pending;
            }
        };
        let mut frame = match polled {
            Polled::Frame(frame) => frame,
            Polled::Cut => {
                return Poll::Ready(Some(Ok(cut(this.report, this.events, this.permit))));
            }
        };
        if let Some(Ok(f)) = &mut frame
            && let Some(trailers) = f.trailers_mut()
        {
            // The answer's status: whether the call was served.
            if let Some(permit) = this.permit.as_mut() {
                permit.answered_with(trailers);
            }
            if let Some(report) = this.report.take() {
                // Built now, while the call still holds its worker: what the server
                // carries as this answer ends.
                report.attach_at(trailers, stormguard_core::Instant::now());
            }
        }
        let ended = match &frame {
            None => true,
            // Trailers are the last frame of a body.
            Some(Ok(frame)) => frame.is_trailers(),
            Some(Err(_)) => {
                // The call failed mid-stream: the worker is given back, not counted
                // as a completion.
                this.permit.take();
                false
            }
        };
        if ended && let Some(permit) = this.permit.take() {
            permit.finished();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The call's cut-off passed before its body ended (the handler's body, its stream, is
/// dropped): gives the worker back and returns the trailers that end the call
/// `DEADLINE_EXCEEDED` (with the call's load report, when the layer sends them).
fn cut<D>(
    report: &mut Option<CallReport>,
    events: &mut Option<QueuedEvents>,
    permit: &mut Option<WorkerPermit>,
) -> Frame<D> {
    let mut trailers = HeaderMap::new();
    super::response::deadline_cut_status(&mut trailers);
    if let Some(report) = report.take() {
        // Built while the call still holds its worker, as for any other ending.
        report.attach_at(&mut trailers, Instant::now());
    }
    if let Some(events) = events.take() {
        events.cut(true);
    }
    if let Some(permit) = permit.take() {
        permit.cut();
    }
    Frame::trailers(trailers)
}

impl<B> fmt::Debug for ShedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShedBody")
            .field("answered_by_layer", &self.body.get_ref().is_none())
            .field("holds_worker", &self.permit.is_some())
            .field("cut_at", &self.body.cut_at())
            .finish()
    }
}
