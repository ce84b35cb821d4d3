//! The response body: the handler's, holding the call's worker until it ends.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use stormguard_core::Instant;
use tokio::time::Sleep;

use super::events::QueuedEvents;
use super::gate::WorkerPermit;
use super::load::CallReport;

pin_project! {
    #[project = ShedBodyProj]
    /// The response body of a [`ShedService`](super::ShedService).
    ///
    /// For a call that ran, it is the handler's body, and it holds the call's worker
    /// until the body ends (its last frame or its trailers were read) or is dropped
    /// (the caller went away, or the transport gave up): a server-streaming or
    /// bidirectional call counts against the workers for as long as it streams, not
    /// only while its handler builds the stream. For the layer's own answers it is
    /// empty. With load reports on, it adds the call's report to the handler's
    /// trailers.
    ///
    /// A call with a deadline is held to it while it streams: when its cut-off passes
    /// ([`AdmissionConfig::cut_at`](stormguard_core::AdmissionConfig::cut_at))
    /// before the body ended, the handler's body (its stream) is dropped, the worker given
    /// back at once, and the body ends with trailers carrying `grpc-status: 4` after the
    /// messages sent so far. A frame the handler has ready is forwarded after one clock read
    /// (data frames only); the first time it has none, a timer is armed at the cut-off.
    pub struct ShedBody<B> {
        #[pin]
        inner: Option<B>,
        permit: Option<WorkerPermit>,
        report: Option<CallReport>,
        // When the call is cut, until its body ends; and what tells of it.
        cut_at: Option<Instant>,
        events: Option<QueuedEvents>,
        // Armed at `cut_at` the first time the handler's body has nothing ready (boxed: the
        // body stays `Unpin`, and a body that never waits allocates none).
        timer: Option<Pin<Box<Sleep>>>,
    }
}

impl<B> ShedBody<B> {
    /// An empty body: the layer's own answers (trailers-only).
    pub(crate) fn empty() -> Self {
        ShedBody {
            inner: None,
            permit: None,
            report: None,
            cut_at: None,
            events: None,
            timer: None,
        }
    }

    /// The handler's `body`, which holds `permit` until it ends or is dropped, and adds
    /// `report` to its trailers; `cut`: when it is cut, for a call with a deadline, and
    /// what tells of it.
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
            inner: Some(body),
            permit,
            report,
            cut_at,
            events,
            timer: None,
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
        let mut this = self.project();
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            return Poll::Ready(None);
        };
        if this.cut_at.is_some()
            && let Some(sleep) = this.timer.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Some(Ok(cut(&mut this))));
        }
        let mut frame = match inner.poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                // The first wait: from now on the timer watches the cut-off.
                if let Some(at) = *this.cut_at
                    && this.timer.is_none()
                {
                    let sleep = this.timer.insert(Box::pin(tokio::time::sleep_until(at)));
                    if sleep.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(Some(Ok(cut(&mut this))));
                    }
                }
                return Poll::Pending;
            }
        };
        if let (Some(Ok(f)), Some(at)) = (&frame, *this.cut_at)
            && f.is_data()
            && this.timer.is_none()
            && Instant::now() >= at
        {
            // A stream that never waited is held to its deadline too.
            return Poll::Ready(Some(Ok(cut(&mut this))));
        }
        if let Some(Ok(f)) = &mut frame
            && let Some(trailers) = f.trailers_mut()
            && let Some(report) = this.report.take()
        {
            // Built now, while the call still holds its worker: what the server carries
            // as this answer ends.
            report.attach_at(trailers, stormguard_core::Instant::now());
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
        if ended || matches!(frame, Some(Err(_))) {
            *this.cut_at = None;
            *this.timer = None;
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

/// The call's cut-off passed before its body ended: drops the handler's body (its stream),
/// gives the worker back and returns the trailers that end the call `DEADLINE_EXCEEDED`
/// (with the call's load report, when the layer sends them).
fn cut<B, D>(this: &mut ShedBodyProj<'_, B>) -> Frame<D> {
    this.inner.set(None);
    *this.timer = None;
    *this.cut_at = None;
    let mut trailers = HeaderMap::new();
    super::response::deadline_cut_status(&mut trailers);
    if let Some(report) = this.report.take() {
        // Built while the call still holds its worker, as for any other ending.
        report.attach_at(&mut trailers, Instant::now());
    }
    if let Some(events) = this.events.take() {
        events.cut(true);
    }
    if let Some(permit) = this.permit.take() {
        permit.cut();
    }
    Frame::trailers(trailers)
}

impl<B> fmt::Debug for ShedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShedBody")
            .field("answered_by_layer", &self.inner.is_none())
            .field("holds_worker", &self.permit.is_some())
            .field("cut_at", &self.cut_at)
            .finish()
    }
}
