//! The response body of [`Retry`](super::Retry): records how a committed call ended.
//!
//! Once response headers without `grpc-status` arrive, the call is committed (gRPC A6): it
//! is passed through and never retried. Its outcome is not known yet, though: a stream, or
//! a unary call whose status comes in the trailers, may still end with `UNAVAILABLE`.
//! Counting it as a success when the headers arrive would let failures mint retry budget
//! (or A6 tokens) and keep the breaker closed while the dependency fails. So the layer
//! hands the caller a [`ResponseBody`] that holds what the call's end records (core's
//! `CommittedCall`: the budget, the breaker permit, the deadline) and records the final
//! outcome when the body ends; the rules are on [`ResponseBody`].

use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::uri::PathAndQuery;
use http::{HeaderMap, HeaderValue};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use stormguard_core::Code;
use stormguard_core::CommittedCall;
use stormguard_core::wire::encode_grpc_status;
use stormguard_core::{DeadlineCut, Instant, Polled};
use stormguard_core::{wire::http::GRPC_MESSAGE, wire::http::GRPC_STATUS};

use super::record::CallStats;
use crate::replicas::Route;

pin_project! {
    /// The response body of a call through [`Retry`](super::Retry).
    ///
    /// Data, size hint and end of stream are forwarded from the inner body unchanged, as
    /// are its errors. Other responses (trailers-only answers, whose status the layer read
    /// from the headers) are only forwarded. When the call was committed (response headers
    /// without `grpc-status`), the body also records the call's final outcome in the
    /// layer's budget, breaker and [counters](crate::RetrySnapshot) when it ends, once:
    ///
    /// | how the body ends | code recorded |
    /// |---|---|
    /// | a trailers frame with `grpc-status` | that code (a malformed value reads as `UNKNOWN`) |
    /// | a trailers frame without `grpc-status`, or the end of the body without trailers | `UNAVAILABLE` |
    /// | an error from the body | `UNAVAILABLE` |
    /// | dropped before any of these | nothing |
    ///
    /// The recorded code then counts as
    /// [`CallRetry::on_committed_at`](stormguard_core::CallRetry::on_committed_at)
    /// says: `OK` deposits into the budget and is a breaker success; a code the method's
    /// policy retries (default: `UNAVAILABLE`) is a breaker failure and costs an A6 token;
    /// any other code neither mints nor costs anything, and counts for the breaker as a sign
    /// of life when it is an application answer (`NOT_FOUND`, ...), never when it is an
    /// overload or expiry answer. A call that began as a half-open probe had its probe
    /// settled when it committed, so its end is recorded in the budget only.
    ///
    /// A body error means the stream broke before the server sent its final status: the
    /// connection was lost, the stream was reset, or the connection received `GOAWAY`. That
    /// is the failure a transport error before the response headers is, which the layer
    /// reads as `UNAVAILABLE`, and it is recorded the same way whatever code tonic attaches
    /// to it: tonic maps most h2 reset reasons to `INTERNAL`, `UNKNOWN` or `CANCELLED`,
    /// codes a policy takes for application answers, which would let a dying connection
    /// mint budget. A `200` response that ends without a final status is the same kind of
    /// failure: hyper turns a `RST_STREAM` with `NO_ERROR` or `CANCEL` (a proxy cutting the
    /// stream, say) into a clean end of the body. tonic shows the caller `UNKNOWN` there;
    /// for the budget and the breaker it is `UNAVAILABLE`, as the dependency did not finish
    /// the call. (Only HTTP `200` answers are committed: another HTTP status without
    /// `grpc-status` is a proxy's error, a failure before commit that the layer decides on.)
    ///
    /// A body dropped before its end means the caller lost interest: nothing is known about
    /// the dependency, so nothing is recorded (the call counts as `committed_abandoned`),
    /// and the breaker permit the call held is released without an outcome.
    ///
    /// # The deadline
    ///
    /// A committed call is still held to its deadline, the one the layer resolved when the
    /// call began (the caller's `grpc-timeout`, the inbound call's deadline, the method's
    /// service-config `timeout` or the layer's default:
    /// [`resolve_deadline_at`](stormguard_core::resolve_deadline_at)). When it
    /// passes before the body ended, the body drops the inner body, which resets the HTTP/2
    /// stream (the server's handler sees the call cancelled), and yields a trailers frame
    /// with `grpc-status: 4` instead: tonic's `Streaming::message()` (and a unary call)
    /// then returns `DEADLINE_EXCEEDED`. The call is recorded as if its trailers had said
    /// so, and counted in [`deadline_exceeded`](crate::RetrySnapshot::deadline_exceeded)
    /// and [`committed_deadline_exceeded`](crate::RetrySnapshot::committed_deadline_exceeded).
    ///
    /// What it costs: nothing for a call without a deadline. With one, a frame the inner
    /// body has ready is forwarded after one clock read (data frames only; a stream that
    /// always has a frame ready is still cut); the first time the inner body has nothing
    /// ready, a timer is armed at the deadline and polled before the inner body from then
    /// on. A unary answer whose frames are ready when the caller reads them never arms it.
    pub struct ResponseBody<B> {
        // The inner body, held to the call's deadline while a committed body has not ended
        // (see "The deadline"); cut, it drops the inner body (resetting the stream).
        #[pin]
        body: DeadlineCut<B>,
        pending: Option<Pending>,
    }
}

/// A committed call whose outcome is not known yet.
struct Pending {
    call: Option<CommittedCall>,
    stats: CallStats,
    /// The replicas the call used, when the layer is over an endpoint-aware channel.
    route: Option<Route>,
    /// The call's path (it names the method in the event of a cut): not the whole URI,
    /// which would more than double what the body moves with it.
    path: Option<PathAndQuery>,
    ended: bool,
}

/// How a committed body ended.
enum End<'a> {
    /// A trailers frame.
    Trailers(&'a HeaderMap),
    /// The end of the body, without trailers.
    Eos,
    /// An error from the body.
    Error,
}

impl<B: Body> ResponseBody<B> {
    /// A committed call's body: records the outcome of `call` when it ends.
    /// A load report in its trailers is read as every attempt's is (see `load`).
    pub(super) fn committed(
        inner: B,
        call: Option<CommittedCall>,
        stats: CallStats,
        route: Option<Route>,
        path: Option<PathAndQuery>,
    ) -> Self {
        let deadline = call.as_ref().and_then(CommittedCall::deadline);
        let pending = Pending {
            call,
            stats,
            route,
            path,
            ended: false,
        };
        if inner.is_end_stream() {
            // Headers that ended the stream without a status: nothing more will come (and
            // `tonic::body::Body::new` would drop this body unpolled).
            pending.end(End::Eos);
            return ResponseBody::passthrough(inner);
        }
        ResponseBody {
            body: DeadlineCut::new(inner, deadline),
            pending: Some(pending),
        }
    }
}

/// An empty response body with nothing to record, as tonic's generated clients require of
/// a channel's body for `FooClient::with_interceptor` (`T::ResponseBody: Default`).
impl<B: Default> Default for ResponseBody<B> {
    fn default() -> Self {
        ResponseBody::passthrough(B::default())
    }
}

impl<B> ResponseBody<B> {
    /// A body whose outcome is already recorded, or not the layer's to record.
    pub(super) fn passthrough(inner: B) -> Self {
        ResponseBody {
            body: DeadlineCut::new(inner, None),
            pending: None,
        }
    }

    /// The inner body; `None` once the layer cut the body at the call's deadline.
    pub fn get_ref(&self) -> Option<&B> {
        self.body.get_ref()
    }
}

impl Pending {
    fn end(mut self, end: End<'_>) {
        let code = match end {
            // Without a final status the stream was cut before the server finished the call.
            End::Trailers(trailers) => super::load::read(
                trailers,
                self.call.as_ref(),
                self.route.as_ref(),
                &self.stats,
            )
            .unwrap_or(Code::Unavailable),
            End::Eos | End::Error => Code::Unavailable,
        };
        if let Some(call) = self.call.as_mut() {
            call.on_ended_at(code, Instant::now());
        }
        self.stats.committed_ended(code);
        self.ended = true;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if !self.ended {
            // The caller dropped the body before its end: the call's permit is released
            // without an outcome, and the budget hears nothing.
            self.stats.committed_abandoned();
        }
    }
}

impl<B: Body> Body for ResponseBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let frame = match ready!(this.body.poll_frame(cx)) {
            Polled::Frame(frame) => frame,
            Polled::Cut => return Poll::Ready(Some(Ok(cut(this.pending)))),
        };
        let end = match &frame {
            Some(Ok(frame)) => frame.trailers_ref().map(End::Trailers),
            Some(Err(_)) => Some(End::Error),
            None => Some(End::Eos),
        };
        if let Some(end) = end
            && let Some(pending) = this.pending.take()
        {
            pending.end(end);
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

/// The `grpc-message` of a committed call cut at its deadline.
pub(super) const MESSAGE_DEADLINE: &str = "stormguard: the call's deadline was exceeded";

/// The call's deadline passed before its body ended (the inner body is dropped, which
/// resets the stream): records the call as ended `DEADLINE_EXCEEDED`, and returns the
/// trailers the caller reads that status from.
fn cut<D>(pending: &mut Option<Pending>) -> Frame<D> {
    let mut trailers = HeaderMap::with_capacity(2);
    trailers.insert(
        GRPC_STATUS,
        HeaderValue::from_static(encode_grpc_status(Code::DeadlineExceeded)),
    );
    trailers.insert(GRPC_MESSAGE, HeaderValue::from_static(MESSAGE_DEADLINE));
    if let Some(pending) = pending.take() {
        pending.stats.committed_deadline_exceeded();
        let events = pending.stats.events();
        tracing::debug!(
            stormguard.layer = events.name().get().map_or("", |n| &**n),
            rpc.method = pending.path.as_ref().map_or("", PathAndQuery::path),
            "stormguard: committed call cut at its deadline"
        );
        pending.end(End::Trailers(&trailers));
    }
    Frame::trailers(trailers)
}

impl<B: fmt::Debug> fmt::Debug for ResponseBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResponseBody")
            .field("inner", &self.body.get_ref())
            .field("recording", &self.pending.is_some())
            .field("deadline", &self.body.cut_at())
            .finish()
    }
}

#[cfg(test)]
mod tests;
