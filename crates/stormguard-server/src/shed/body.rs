//! The response body: the handler's, holding the call's worker until it ends.

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

use super::gate::WorkerPermit;
use super::load::CallReport;

pin_project! {
    /// The response body of a [`ShedService`](super::ShedService).
    ///
    /// For a call that ran, it is the handler's body, and it holds the call's worker
    /// until the body ends (its last frame or its trailers were read) or is dropped
    /// (the caller went away, or the transport gave up): a server-streaming or
    /// bidirectional call counts against the workers for as long as it streams, not
    /// only while its handler builds the stream. For the layer's own answers it is
    /// empty. With load reports on, it adds the call's report to the handler's
    /// trailers.
    pub struct ShedBody<B> {
        #[pin]
        inner: Option<B>,
        permit: Option<WorkerPermit>,
        report: Option<CallReport>,
    }
}

impl<B> ShedBody<B> {
    /// An empty body: the layer's own answers (trailers-only).
    pub(crate) fn empty() -> Self {
        ShedBody {
            inner: None,
            permit: None,
            report: None,
        }
    }

    /// The handler's `body`, which holds `permit` until it ends or is dropped, and adds
    /// `report` to its trailers.
    pub(crate) fn holding(body: B, permit: Option<WorkerPermit>, report: Option<CallReport>) -> Self
    where
        B: Body,
    {
        let permit = match permit {
            // Already over (a trailers-only answer, an empty body): the worker is free now.
            Some(permit) if body.is_end_stream() => {
                permit.finished();
                None
            }
            permit => permit,
        };
        ShedBody {
            inner: Some(body),
            permit,
            report,
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
        let Some(inner) = this.inner.as_pin_mut() else {
            return Poll::Ready(None);
        };
        let mut frame = std::task::ready!(inner.poll_frame(cx));
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

impl<B> fmt::Debug for ShedBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShedBody")
            .field("answered_by_layer", &self.inner.is_none())
            .field("holds_worker", &self.permit.is_some())
            .finish()
    }
}
