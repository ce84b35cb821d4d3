//! The http bodies both layers build on (feature `http`): layer plumbing, not policy.
//!
//! The client's `RetryLayer` and the server's `ShedLayer` each hold a streaming response
//! to the call's deadline, and each hands out a body whose first frames were already read:
//! [`DeadlineCut`] is the one deadline cut, [`HeldFrames`] the one body that yields held
//! frames, then the rest. Each layer adds what is its own (the client records a committed
//! call's outcome, the server gives its worker back and sends a load report) around them.
//! An application that uses the layers never names these types.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Buf;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use tokio::time::Instant;
use tokio::time::Sleep;

pin_project! {
    #[project = DeadlineCutProj]
    /// A response body held to a deadline.
    ///
    /// Frames, size hint and end of stream are the inner body's until the deadline passes
    /// before the body ended: then the inner body is dropped (for an HTTP/2 stream, that
    /// resets it) and [`poll_frame`](Self::poll_frame) says [`Cut`](Polled::Cut) once; the
    /// layer answers with the trailers its side of the call ends with. The body ends, and
    /// the deadline stops mattering, at its end of stream, its trailers or an error.
    ///
    /// What it costs: nothing without a deadline. With one, a data frame the inner body has
    /// ready is forwarded after one clock read (so a stream that always has a frame ready
    /// is still cut); the first time the inner body has nothing ready, a timer is armed at
    /// the deadline (boxed, so the body stays `Unpin`; a body that never waits allocates
    /// none) and polled before the inner body from then on.
    pub struct DeadlineCut<B> {
        // `None` for an empty body, and once the body was cut.
        #[pin]
        inner: Option<B>,
        // The deadline, while the body has not ended.
        cut_at: Option<Instant>,
        // Armed at `cut_at` the first time the inner body has nothing ready.
        timer: Option<Pin<Box<Sleep>>>,
    }
}

/// What [`DeadlineCut::poll_frame`] read: the inner body's frame (or its end), or the cut.
#[derive(Debug)]
pub enum Polled<D, E> {
    /// The inner body's next frame, `None` at its end.
    Frame(Option<Result<Frame<D>, E>>),
    /// The deadline passed before the body ended: the inner body was dropped.
    Cut,
}

impl<B> DeadlineCut<B> {
    /// `inner`, cut at `cut_at` if it has not ended by then.
    pub fn new(inner: B, cut_at: Option<Instant>) -> Self {
        DeadlineCut {
            inner: Some(inner),
            cut_at,
            timer: None,
        }
    }

    /// An empty body: it ends at once.
    pub fn empty() -> Self {
        DeadlineCut {
            inner: None,
            cut_at: None,
            timer: None,
        }
    }

    /// The inner body; `None` for an empty body and once the body was cut.
    pub fn get_ref(&self) -> Option<&B> {
        self.inner.as_ref()
    }

    /// The deadline, while the body has not ended.
    pub fn cut_at(&self) -> Option<Instant> {
        self.cut_at
    }
}

impl<B: Body> DeadlineCut<B> {
    /// Reads the next frame, or cuts the body at its deadline.
    pub fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Polled<B::Data, B::Error>> {
        let mut this = self.project();
        let Some(inner) = this.inner.as_mut().as_pin_mut() else {
            // Empty, or cut: the cut's trailers were the last frame.
            return Poll::Ready(Polled::Frame(None));
        };
        if this.cut_at.is_none() {
            // No deadline (or the body ended): nothing to watch, the inner body's frames as
            // they are. A body without a timer never holds one.
            return inner.poll_frame(cx).map(Polled::Frame);
        }
        if let Some(sleep) = this.timer.as_mut()
            && sleep.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(cut(this));
        }
        let frame = match inner.poll_frame(cx) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                // The first wait: from now on the timer watches the deadline.
                if let Some(at) = *this.cut_at
                    && this.timer.is_none()
                {
                    let sleep = this.timer.insert(Box::pin(tokio::time::sleep_until(at)));
                    if sleep.as_mut().poll(cx).is_ready() {
                        return Poll::Ready(cut(this));
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
            return Poll::Ready(cut(this));
        }
        let ended = match &frame {
            Some(Ok(frame)) => frame.is_trailers(),
            Some(Err(_)) | None => true,
        };
        if ended {
            *this.cut_at = None;
            *this.timer = None;
        }
        Poll::Ready(Polled::Frame(frame))
    }

    /// Whether the body has ended.
    pub fn is_end_stream(&self) -> bool {
        self.inner.as_ref().is_none_or(Body::is_end_stream)
    }

    /// The inner body's size hint (exactly 0 once it is gone).
    pub fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

/// The deadline passed: drops the inner body and the timer.
fn cut<B, D, E>(mut this: DeadlineCutProj<'_, B>) -> Polled<D, E> {
    this.inner.set(None);
    *this.timer = None;
    *this.cut_at = None;
    Polled::Cut
}

impl<B> std::fmt::Debug for DeadlineCut<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeadlineCut")
            .field("ended", &self.inner.is_none())
            .field("cut_at", &self.cut_at)
            .finish_non_exhaustive()
    }
}

/// A body whose first frames were already read: yields them, then the rest of the body.
///
/// The held frames come first, in order (data, trailers or an error), then the frames of
/// the rest, if there is one. The client's retry layer puts back what it read of a request
/// body before the first attempt; the server's idempotency layer sends a recorded answer
/// again, or the part of a live answer it read, followed by the rest of it.
#[derive(Debug)]
pub struct HeldFrames<B: Body> {
    held: VecDeque<Result<Frame<B::Data>, B::Error>>,
    rest: Option<B>,
}

impl<B: Body> HeldFrames<B> {
    /// `held`, then the frames of `rest`.
    pub fn new(
        held: impl IntoIterator<Item = Result<Frame<B::Data>, B::Error>>,
        rest: Option<B>,
    ) -> Self {
        HeldFrames {
            held: held.into_iter().collect(),
            rest,
        }
    }
}

// The held frames are never pinned: only the rest is polled in place.
impl<B: Body + Unpin> Unpin for HeldFrames<B> {}

impl<B: Body + Unpin> Body for HeldFrames<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.get_mut();
        if let Some(frame) = this.held.pop_front() {
            return Poll::Ready(Some(frame));
        }
        match this.rest.as_mut() {
            Some(rest) => Pin::new(rest).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.held.is_empty() && self.rest.as_ref().is_none_or(Body::is_end_stream)
    }

    /// The held data's length, plus the rest's hint.
    fn size_hint(&self) -> SizeHint {
        let held: u64 = self
            .held
            .iter()
            .filter_map(|f| f.as_ref().ok()?.data_ref())
            .map(|d| d.remaining() as u64)
            .sum();
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

#[cfg(test)]
mod tests;
