//! What a caller still sends after an early answer is read and thrown away, within bounds.
//!
//! # Why
//!
//! The layer answers some calls before their request body is read: a shed call, a call
//! whose deadline is gone on arrival or while queued, a queued call the transport gave
//! up on. HTTP/2 lets a server answer early, but h2 (the HTTP/2 implementation under
//! hyper and tonic) keeps a per-connection budget of framing overhead: every request
//! DATA frame without END_STREAM that carries less than 256 bytes is charged
//! `256 - len` bytes, given back when the application reads the frame or drops a body
//! with the frame still buffered. A frame that arrives *after* the body was dropped (or
//! after the stream was reset, which is what dropping an unfinished body does) is
//! charged and never given back. A gRPC unary request is exactly such a frame (the
//! message, then an empty END_STREAM frame), so every early answer that beats the
//! caller's DATA frame to the server leaks about 240 bytes of a budget of half the
//! connection window (512 KiB with tonic's defaults). After a few thousand leaks h2 sends
//! `GOAWAY ENHANCE_YOUR_CALM "too_many_data_frames"` and every call on the connection
//! fails. Resetting the stream at once does not help (frames already on the wire are
//! charged on arrival just the same); reading them does.
//!
//! # What the layer does
//!
//! After an early answer the request body is read until it ends and each frame is
//! dropped as it comes, which gives the budget and the flow-control window back. It is
//! bounded three ways, so an early answer never buys a caller unbounded server work:
//!
//! - at most [`MAX_BYTES`] are read; past that the body is dropped (h2 then resets the
//!   stream with `NO_ERROR`, telling the caller to stop sending): frames that large are
//!   not charged by h2 anyway;
//! - at most [`MAX_TIME`] is spent waiting for the body to end (a caller trickling a
//!   stream after its answer gets the same reset);
//! - at most [`MAX_DRAINS`] bodies are read at once per layer; past that the body is
//!   dropped at once, as before.
//!
//! A body that has already ended, or whose frames are already buffered, is read in
//! place; only a body still on the wire is handed to a small tokio task.

use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Buf;
use http_body::Body;

use super::counters::DrainCounts;

/// The most request bytes read after an early answer.
pub const MAX_BYTES: usize = 64 * 1024;
/// The longest a request body is waited for after an early answer.
pub const MAX_TIME: Duration = Duration::from_secs(1);
/// The most request bodies read at once, per layer, after early answers.
pub const MAX_DRAINS: usize = 1024;

/// The layer's drains in progress and their counters.
#[derive(Debug, Default)]
pub(crate) struct Drains {
    active: AtomicUsize,
    ended: AtomicU64,
    cut: AtomicU64,
    skipped: AtomicU64,
}

impl Drains {
    pub(crate) fn counts(&self) -> DrainCounts {
        DrainCounts {
            ended: self.ended.load(Ordering::Relaxed),
            cut: self.cut.load(Ordering::Relaxed),
            skipped: self.skipped.load(Ordering::Relaxed),
            active: self.active.load(Ordering::Relaxed),
        }
    }
}

/// Reads and discards `request`'s body after an early answer (see the module docs).
pub(crate) fn discard_request<B>(request: http::Request<B>, drains: &Arc<Drains>)
where
    B: Body + Send + Unpin + 'static,
{
    discard(request.into_body(), drains);
}

/// Reads and discards `body` within the bounds of the module docs.
pub(crate) fn discard<B>(body: B, drains: &Arc<Drains>)
where
    B: Body + Send + Unpin + 'static,
{
    let mut drain = Drain {
        body,
        left: MAX_BYTES,
    };
    // Most bodies are complete or already buffered when the answer is sent: read them
    // here, without a task. The no-op waker is replaced by the task's on its first poll.
    match drain.step(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(Step::Ended) => {
            drains.ended.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Poll::Ready(Step::Cut) => {
            drains.cut.fetch_add(1, Ordering::Relaxed);
            return;
        }
        Poll::Pending => {}
    }
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        drains.skipped.fetch_add(1, Ordering::Relaxed);
        return;
    };
    let admitted = drains
        .active
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            (n < MAX_DRAINS).then_some(n + 1)
        });
    if admitted.is_err() {
        drains.skipped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    let drains = Arc::clone(drains);
    runtime.spawn(async move {
        let outcome = tokio::time::timeout(MAX_TIME, poll_fn(|cx| drain.step(cx))).await;
        // Drop the body (resetting an unfinished stream) before counting it done.
        drop(drain);
        let counter = match outcome {
            Ok(Step::Ended) => &drains.ended,
            Ok(Step::Cut) | Err(_) => &drains.cut,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        drains.active.fetch_sub(1, Ordering::AcqRel);
    });
}

enum Step {
    /// The body ended (or failed: the caller reset it, nothing more will come).
    Ended,
    /// More than [`MAX_BYTES`] came.
    Cut,
}

struct Drain<B> {
    body: B,
    left: usize,
}

impl<B: Body + Unpin> Drain<B> {
    fn step(&mut self, cx: &mut Context<'_>) -> Poll<Step> {
        loop {
            if self.body.is_end_stream() {
                return Poll::Ready(Step::Ended);
            }
            match std::task::ready!(Pin::new(&mut self.body).poll_frame(cx)) {
                None | Some(Err(_)) => return Poll::Ready(Step::Ended),
                Some(Ok(frame)) => {
                    let len = frame.data_ref().map_or(0, Buf::remaining);
                    match self.left.checked_sub(len) {
                        Some(left) => self.left = left,
                        None => return Poll::Ready(Step::Cut),
                    }
                }
            }
        }
    }
}

/// A queued call's request, until it is handed to the inner service. Dropped unused (the
/// call expired, or the transport dropped the call), it discards its body as above.
pub(crate) struct Discard<Req> {
    request: Option<Req>,
    drains: Arc<Drains>,
    discard: fn(Req, &Arc<Drains>),
}

impl<B> Discard<http::Request<B>>
where
    B: Body + Send + Unpin + 'static,
{
    pub(crate) fn new(request: http::Request<B>, drains: &Arc<Drains>) -> Self {
        Discard {
            request: Some(request),
            drains: Arc::clone(drains),
            discard: discard_request::<B>,
        }
    }
}

impl<Req> Discard<Req> {
    /// The request, to hand to the inner service; it is then no longer discarded here.
    pub(crate) fn take(&mut self) -> Option<Req> {
        self.request.take()
    }
}

impl<Req> Drop for Discard<Req> {
    fn drop(&mut self) {
        if let Some(request) = self.request.take() {
            (self.discard)(request, &self.drains);
        }
    }
}

#[cfg(test)]
mod tests;
