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

use http::{HeaderMap, HeaderValue, Uri};
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;
use stormguard_core::Code;
use stormguard_core::CommittedCall;
use stormguard_core::wire::encode_grpc_status;
use stormguard_core::{DeadlineCut, Instant, Polled};
use stormguard_core::{wire::http::GRPC_MESSAGE, wire::http::GRPC_STATUS};

use super::record::CallStats;
use crate::replicas::Route;
use crate::status::trailers_only_code;

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
    /// The call's URI (its path names the method in the event of a cut).
    uri: Uri,
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
        uri: Uri,
    ) -> Self {
        let deadline = call.as_ref().and_then(CommittedCall::deadline);
        let pending = Pending {
            call,
            stats,
            route,
            uri,
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
            End::Trailers(trailers) => {
                super::load::read(
                    trailers,
                    self.call.as_ref(),
                    self.route.as_ref(),
                    &self.stats,
                );
                trailers_only_code(trailers).unwrap_or(Code::Unavailable)
            }
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
            rpc.method = pending.uri.path(),
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
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::RetryStats;
    use std::collections::VecDeque;
    use std::sync::Arc;

    use std::time::Duration;

    use bytes::Bytes;
    use http_body_util::BodyExt;
    use stormguard_core::Budget;
    use stormguard_core::CallTimes;
    use stormguard_core::{A6Budget, A6BudgetConfig};
    use stormguard_core::{BreakerConfig, CircuitBreaker};
    use stormguard_core::{MethodTable, RetryPolicy};
    use stormguard_core::{Refusal, RetryController};
    use tonic::Status;

    const PATH: &str = "/pkg.Svc/Watch";

    /// A body that yields the given frames one by one.
    struct Frames(VecDeque<Result<Frame<Bytes>, Status>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = Status;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            Poll::Ready(self.get_mut().0.pop_front())
        }
        fn is_end_stream(&self) -> bool {
            self.0.is_empty()
        }
        fn size_hint(&self) -> SizeHint {
            SizeHint::with_exact(7)
        }
    }

    fn data(s: &'static str) -> Result<Frame<Bytes>, Status> {
        Ok(Frame::data(Bytes::from_static(s.as_bytes())))
    }

    fn trailers(status: Option<&'static str>) -> Result<Frame<Bytes>, Status> {
        let mut map = HeaderMap::new();
        if let Some(s) = status {
            map.insert("grpc-status", HeaderValue::from_static(s));
        }
        Ok(Frame::trailers(map))
    }

    /// A controller paying from an A6 throttle of 10 tokens, ratio 0.5 (balance 5 when
    /// full: each failure costs 1, each success adds 0.5), and its throttle.
    fn a6(breaker: Option<CircuitBreaker>) -> (RetryController, Arc<dyn Budget>) {
        let throttle: Arc<dyn Budget> = Arc::new(
            A6Budget::new(A6BudgetConfig {
                max_tokens: 10.0,
                token_ratio: 0.5,
            })
            .unwrap(),
        );
        let c = RetryController::new(
            MethodTable::uniform(RetryPolicy {
                idempotent: true,
                ..RetryPolicy::default()
            }),
            Arc::clone(&throttle),
            breaker,
            1,
        )
        .unwrap();
        (c, throttle)
    }

    fn body(
        c: &RetryController,
        stats: &RetryStats,
        frames: Vec<Result<Frame<Bytes>, Status>>,
    ) -> ResponseBody<Frames> {
        let call = c
            .begin_call_at(PATH, &CallTimes::default(), Instant::now())
            .unwrap();
        ResponseBody::committed(
            Frames(frames.into()),
            Some(call.commit_at(Instant::now())),
            CallStats::new(stats.clone(), crate::retry::metrics::CallMetrics::none()),
            None,
            Uri::from_static(PATH),
        )
    }

    /// Drains `body`, returning how many data frames it gave and whether it ended in error.
    async fn drain(mut body: ResponseBody<Frames>) -> (usize, bool) {
        let mut n = 0;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(f) if f.is_data() => n += 1,
                Ok(_) => {}
                Err(_) => return (n, true),
            }
        }
        (n, false)
    }

    fn balance(b: &Arc<dyn Budget>) -> f64 {
        b.balance_at(Instant::now())
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[tokio::test]
    async fn a_failure_in_the_trailers_costs_a_token_and_counts_as_failed() {
        let (c, throttle) = a6(None);
        let stats = RetryStats::new();
        let b = body(&c, &stats, vec![data("a"), data("b"), trailers(Some("14"))]);
        assert!(close(balance(&throttle), 5.0));
        assert_eq!(drain(b).await, (2, false));
        assert!(close(balance(&throttle), 4.0), "{}", balance(&throttle));
        let s = stats.snapshot();
        assert_eq!((s.ok, s.failed, s.committed_failed), (0, 1, 1));
        assert_eq!(s.committed_abandoned, 0);
    }

    #[tokio::test]
    async fn ok_in_the_trailers_deposits_and_counts_as_ok() {
        let (c, throttle) = a6(None);
        throttle.record_failure_at(Instant::now());
        let stats = RetryStats::new();
        let b = body(&c, &stats, vec![data("a"), trailers(Some("0"))]);
        assert_eq!(drain(b).await, (1, false));
        assert!(close(balance(&throttle), 4.5), "{}", balance(&throttle));
        let s = stats.snapshot();
        assert_eq!((s.ok, s.failed, s.committed_failed), (1, 0, 0));
    }

    #[tokio::test]
    async fn an_application_error_in_the_trailers_neither_mints_nor_costs() {
        let (c, throttle) = a6(None);
        throttle.record_failure_at(Instant::now());
        let stats = RetryStats::new();
        let b = body(&c, &stats, vec![trailers(Some("5"))]);
        drain(b).await;
        // Only OK is a success for the throttle; NOT_FOUND is not a failure either.
        assert!(close(balance(&throttle), 4.0), "{}", balance(&throttle));
        let s = stats.snapshot();
        assert_eq!((s.ok, s.failed, s.committed_failed), (0, 1, 1));
    }

    #[tokio::test]
    async fn a_body_error_is_recorded_as_unavailable() {
        let (c, throttle) = a6(None);
        let stats = RetryStats::new();
        // tonic reads an h2 reset as INTERNAL: still a failure of the dependency.
        let b = body(
            &c,
            &stats,
            vec![data("a"), Err(Status::internal("h2 protocol error"))],
        );
        assert_eq!(drain(b).await, (1, true));
        assert!(close(balance(&throttle), 4.0));
        assert_eq!(stats.snapshot().committed_failed, 1);
    }

    #[tokio::test]
    async fn a_stream_cut_without_a_status_is_recorded_as_unavailable() {
        for frames in [vec![data("a")], vec![data("a"), trailers(None)]] {
            let (c, throttle) = a6(None);
            let stats = RetryStats::new();
            drain(body(&c, &stats, frames)).await;
            assert!(close(balance(&throttle), 4.0));
            let s = stats.snapshot();
            assert_eq!((s.ok, s.failed, s.committed_failed), (0, 1, 1));
        }
    }

    #[tokio::test]
    async fn a_body_ended_at_the_headers_is_recorded_at_once() {
        let (c, throttle) = a6(None);
        let stats = RetryStats::new();
        let b = body(&c, &stats, vec![]);
        // Recorded before any poll: tonic drops a body that is already at its end.
        assert!(close(balance(&throttle), 4.0));
        drop(b);
        let s = stats.snapshot();
        assert_eq!(
            (s.failed, s.committed_failed, s.committed_abandoned),
            (1, 1, 0)
        );
    }

    #[tokio::test]
    async fn a_body_dropped_before_its_end_records_nothing() {
        let breaker = CircuitBreaker::new(
            BreakerConfig {
                min_requests: 1,
                failure_rate: 1.0,
                half_open_probes: 1,
                ..BreakerConfig::default()
            },
            2,
        )
        .unwrap();
        let (c, throttle) = a6(Some(breaker));
        throttle.record_failure_at(Instant::now());
        let stats = RetryStats::new();
        let mut b = body(&c, &stats, vec![data("a"), data("b"), trailers(Some("14"))]);
        b.frame().await.unwrap().unwrap();
        drop(b);
        assert!(
            close(balance(&throttle), 4.0),
            "neither a deposit nor a cost"
        );
        let s = stats.snapshot();
        assert_eq!((s.ok, s.failed, s.committed_abandoned), (0, 0, 1));
        // A failure would have opened this breaker (one outcome, all failed).
        assert!(
            c.begin_call_at(PATH, &CallTimes::default(), Instant::now())
                .is_ok(),
            "the breaker heard nothing"
        );
        // The same stream read to its end does open it.
        let b = body(&c, &stats, vec![trailers(Some("14"))]);
        drain(b).await;
        assert_eq!(
            c.begin_call_at(PATH, &CallTimes::default(), Instant::now())
                .err(),
            Some(Refusal::Breaker)
        );
    }

    #[tokio::test]
    async fn frames_size_hint_and_end_are_forwarded() {
        let (c, _) = a6(None);
        let stats = RetryStats::new();
        let mut b = body(&c, &stats, vec![data("ab"), trailers(Some("0"))]);
        assert_eq!(b.size_hint().exact(), Some(7));
        assert!(!b.is_end_stream());
        let frame = b.frame().await.unwrap().unwrap();
        assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"ab"));
        let frame = b.frame().await.unwrap().unwrap();
        assert_eq!(frame.trailers_ref().unwrap()["grpc-status"], "0");
        assert!(b.is_end_stream());
        assert!(b.frame().await.is_none());
        // Recorded once, whatever is polled after the end.
        assert_eq!(stats.snapshot().ok, 1);
    }

    /// A body that yields `ready` data frames at once, then waits forever.
    struct Stalls(u32);

    impl Body for Stalls {
        type Data = Bytes;
        type Error = Status;
        fn poll_frame(
            self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            let left = &mut self.get_mut().0;
            if *left == 0 {
                return Poll::Pending;
            }
            *left -= 1;
            Poll::Ready(Some(data("x")))
        }
    }

    /// A committed body of `inner` whose call has a deadline `timeout` from now.
    fn with_deadline<B: Body>(
        c: &RetryController,
        stats: &RetryStats,
        inner: B,
        timeout: Duration,
    ) -> ResponseBody<B> {
        let times = CallTimes {
            caller: Some(timeout),
            ..CallTimes::default()
        };
        let call = c.begin_call_at(PATH, &times, Instant::now()).unwrap();
        ResponseBody::committed(
            inner,
            Some(call.commit_at(Instant::now())),
            CallStats::new(stats.clone(), crate::retry::metrics::CallMetrics::none()),
            None,
            Uri::from_static(PATH),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_still_waiting_at_the_deadline_ends_deadline_exceeded_at_the_deadline() {
        let (c, throttle) = a6(None);
        let stats = RetryStats::new();
        let start = Instant::now();
        let mut b = with_deadline(&c, &stats, Stalls(1), Duration::from_millis(300));
        assert!(b.frame().await.unwrap().unwrap().is_data());
        let trailers = b.frame().await.unwrap().unwrap().into_trailers().unwrap();
        assert_eq!(Instant::now() - start, Duration::from_millis(300));
        assert_eq!(trailers["grpc-status"], "4");
        assert_eq!(trailers["grpc-message"], MESSAGE_DEADLINE);
        assert!(b.get_ref().is_none(), "the inner body was dropped");
        assert!(b.is_end_stream());
        assert!(b.frame().await.is_none());
        let s = stats.snapshot();
        assert_eq!((s.deadline_exceeded, s.committed_deadline_exceeded), (1, 1));
        assert_eq!((s.ok, s.failed, s.committed_failed), (0, 1, 1));
        // DEADLINE_EXCEEDED is not a code the policy retries: it costs no token.
        assert!(close(balance(&throttle), 5.0));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_never_waits_is_cut_at_its_deadline_too() {
        let (c, _) = a6(None);
        let stats = RetryStats::new();
        let mut b = with_deadline(&c, &stats, Stalls(u32::MAX), Duration::from_millis(50));
        for _ in 0..3 {
            assert!(b.frame().await.unwrap().unwrap().is_data());
        }
        tokio::time::advance(Duration::from_millis(50)).await;
        let frame = b.frame().await.unwrap().unwrap();
        assert_eq!(frame.trailers_ref().unwrap()["grpc-status"], "4");
        assert_eq!(stats.snapshot().committed_deadline_exceeded, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_ends_before_its_deadline_is_not_cut() {
        let (c, _) = a6(None);
        let stats = RetryStats::new();
        let frames = Frames(vec![data("a"), trailers(Some("0"))].into());
        let mut b = with_deadline(&c, &stats, frames, Duration::from_millis(50));
        assert!(b.frame().await.unwrap().unwrap().is_data());
        assert!(b.frame().await.unwrap().unwrap().is_trailers());
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(b.frame().await.is_none());
        let s = stats.snapshot();
        assert_eq!((s.ok, s.deadline_exceeded), (1, 0));
    }

    #[test]
    fn tonic_clients_accept_the_body_of_a_channel() {
        // The bounds tonic's generated clients put on a service's response body.
        fn grpc_body<T>()
        where
            T: Body<Data = Bytes> + Send + 'static,
            T::Error: Into<crate::BoxError> + Send,
        {
        }
        grpc_body::<ResponseBody<tonic::body::Body>>();
        // Read with `BodyExt::frame`, which needs `Unpin`: the deadline's timer is boxed.
        fn unpin<T: Unpin>() {}
        unpin::<ResponseBody<tonic::body::Body>>();
    }
}
