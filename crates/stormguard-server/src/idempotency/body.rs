//! The body of an answer the layer held: a recorded answer sent again, or the part of a
//! live answer read so far followed by the rest of it.

use std::collections::VecDeque;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tonic::Status;

/// Data frames, then the rest of a live body (when the layer stopped reading it), or an
/// error (the live body failed), or trailers; then the end.
#[derive(Debug, Default)]
pub(super) struct HeldBody {
    pub(super) data: VecDeque<Bytes>,
    pub(super) rest: Option<tonic::body::Body>,
    pub(super) error: Option<Status>,
    pub(super) trailers: Option<HeaderMap>,
}

impl Body for HeldBody {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let this = self.get_mut();
        if let Some(data) = this.data.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(data))));
        }
        if let Some(rest) = this.rest.as_mut() {
            return Pin::new(rest).poll_frame(cx);
        }
        if let Some(error) = this.error.take() {
            return Poll::Ready(Some(Err(error)));
        }
        Poll::Ready(this.trailers.take().map(|t| Ok(Frame::trailers(t))))
    }

    fn is_end_stream(&self) -> bool {
        self.data.is_empty()
            && self.rest.as_ref().is_none_or(Body::is_end_stream)
            && self.error.is_none()
            && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let held: u64 = self.data.iter().map(|d| d.len() as u64).sum();
        let rest = self
            .rest
            .as_ref()
            .map_or(SizeHint::with_exact(0), Body::size_hint);
        let mut hint = SizeHint::new();
        hint.set_lower(held + rest.lower());
        if let Some(upper) = rest.upper() {
            hint.set_upper(held + upper);
        }
        hint
    }
}
