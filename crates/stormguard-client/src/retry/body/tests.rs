#![allow(clippy::unwrap_used)]
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
        Some(http::uri::PathAndQuery::from_static(PATH)),
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
        Some(http::uri::PathAndQuery::from_static(PATH)),
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
