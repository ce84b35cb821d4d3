//! The retry layer against scripted inner services: tower's readiness contract, the
//! attempts it sends, what it records. Black-box: only the crate's public API.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::task::{Context, Poll};

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use stormguard_client::{BoxError, RetryLayer};
use tonic::body::Body;
use tower_service::Service;

use std::time::Duration;
use stormguard_core::RetryController;
use stormguard_core::{A6Budget, A6BudgetConfig};
use stormguard_core::{BreakerConfig, CircuitBreaker};
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::{MethodTable, RetryPolicy};
use tower::ServiceExt;
use tower_layer::Layer;

/// A service that enforces tower's readiness contract: `call` panics unless
/// `poll_ready` returned ready on this very instance since its last call; clones start
/// unready. It answers with scripted `grpc-status` values (`None` = committed headers).
struct Strict {
    ready: bool,
    script: Arc<Mutex<VecDeque<Option<&'static str>>>>,
    calls: Arc<AtomicUsize>,
}

impl Clone for Strict {
    fn clone(&self) -> Self {
        Strict {
            ready: false,
            script: self.script.clone(),
            calls: self.calls.clone(),
        }
    }
}

impl Service<http::Request<Body>> for Strict {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<http::Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.ready = true;
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        assert!(self.ready, "call without poll_ready");
        self.ready = false;
        self.calls.fetch_add(1, Ordering::SeqCst);
        let attempt = req.headers().get("grpc-previous-rpc-attempts").cloned();
        let mut response = http::Response::new(Body::empty());
        if let Some(status) = self.script.lock().unwrap().pop_front().flatten() {
            response
                .headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static(status));
        }
        if let Some(a) = attempt {
            response.headers_mut().insert("x-attempt", a);
        }
        std::future::ready(Ok(response))
    }
}

fn layer() -> RetryLayer {
    idempotent_layer(None)
}

fn request() -> http::Request<Body> {
    http::Request::builder()
        .uri("http://svc/pkg.Svc/Get")
        .body(Body::empty())
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn retries_ready_the_service_before_calling_it() {
    let script = Arc::new(Mutex::new(VecDeque::from([Some("14"), Some("14"), None])));
    let calls = Arc::new(AtomicUsize::new(0));
    let strict = Strict {
        ready: false,
        script,
        calls: calls.clone(),
    };
    let mut svc = layer().layer(strict);
    let response = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert!(
        response.headers().get("grpc-status").is_none(),
        "committed response passed through"
    );
    assert_eq!(response.headers().get("x-attempt").unwrap(), "2");
    assert_eq!(calls.load(Ordering::SeqCst), 3);
}

#[tokio::test(start_paused = true)]
async fn an_absurd_default_timeout_saturates_instead_of_panicking() {
    let script = Arc::new(Mutex::new(VecDeque::from([None])));
    let strict = Strict {
        ready: false,
        script,
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let mut svc = layer()
        .with_default_timeout(std::time::Duration::MAX)
        .layer(strict);
    let response = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert!(response.headers().get("grpc-status").is_none());
}

/// Answers every call with a trailers-only `grpc-status: 1` (CANCELLED, what a tonic
/// server sends when its `grpc-timeout` runs out) that becomes visible together with
/// the caller's deadline: its future moves the paused clock by `late` and is ready in
/// the same poll, before the runtime's timer has fired the layer's deadline.
#[derive(Clone)]
struct LateCancel {
    late: std::time::Duration,
}

impl Service<http::Request<Body>> for LateCancel {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<http::Response<Body>, BoxError>> + Send>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Body>) -> Self::Future {
        let late = self.late;
        Box::pin(async move {
            let mut advance = std::pin::pin!(tokio::time::advance(late));
            std::future::poll_fn(|cx| {
                // Moves the clock; the yield it then asks for is not waited for.
                let _ = advance.as_mut().poll(cx);
                Poll::Ready(())
            })
            .await;
            let mut response = http::Response::new(Body::empty());
            response
                .headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static("1"));
            Ok(response)
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_failure_that_arrives_after_the_deadline_ends_as_deadline_exceeded() {
    use stormguard_core::{Code, CodeSet};

    let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default()).unwrap());
    let policy = RetryPolicy {
        retryable_codes: [Code::Unavailable, Code::Cancelled]
            .into_iter()
            .collect::<CodeSet>(),
        idempotent: true,
        ..RetryPolicy::default()
    };
    let layer = RetryLayer::new(
        RetryController::new(MethodTable::uniform(policy), budget, None, 3).unwrap(),
    )
    .with_default_timeout(std::time::Duration::from_millis(100));
    let stats = layer.stats();
    let mut svc = layer.layer(LateCancel {
        late: std::time::Duration::from_millis(150),
    });
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .expect_err("the caller's deadline ran out");
    let status = err.downcast::<tonic::Status>().unwrap();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.deadline_exceeded, s.failed), (1, 1, 1));
    assert_eq!(s.refused.deadline, 0, "an expiry, not a refused retry");
}

/// Records each attempt's `grpc-timeout`; the attempts listed in `hang` never answer,
/// the others answer a trailers-only OK.
#[derive(Clone)]
struct Hang {
    hang: Arc<Mutex<VecDeque<bool>>>,
    timeouts: Arc<Mutex<Vec<std::time::Duration>>>,
    raw: Arc<Mutex<Vec<String>>>,
}

impl Hang {
    fn new(hang: impl IntoIterator<Item = bool>) -> Self {
        Hang {
            hang: Arc::new(Mutex::new(hang.into_iter().collect())),
            timeouts: Arc::default(),
            raw: Arc::default(),
        }
    }
}

impl Service<http::Request<Body>> for Hang {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<http::Response<Body>, BoxError>> + Send>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let timeout = req
            .headers()
            .get("grpc-timeout")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| stormguard_core::wire::decode_grpc_timeout(v.as_bytes()).ok());
        if let Some(t) = timeout {
            self.timeouts.lock().unwrap().push(t);
        }
        if let Some(v) = req.headers().get("grpc-timeout") {
            self.raw
                .lock()
                .unwrap()
                .push(v.to_str().unwrap().to_owned());
        }
        let hang = self.hang.lock().unwrap().pop_front().unwrap_or(false);
        Box::pin(async move {
            if hang {
                std::future::pending::<()>().await;
            }
            let mut response = http::Response::new(Body::empty());
            response
                .headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static("0"));
            Ok(response)
        })
    }
}

fn timeout_layer(budget: Arc<dyn Budget>, breaker: Option<CircuitBreaker>) -> RetryLayer {
    let policy = RetryPolicy {
        per_attempt_timeout: Some(Duration::from_millis(50)),
        backoff: stormguard_core::BackoffConfig::FullJitter {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(1),
            multiplier: 1.0,
        },
        idempotent: true,
        ..RetryPolicy::default()
    };
    RetryLayer::new(RetryController::new(MethodTable::uniform(policy), budget, breaker, 3).unwrap())
}

#[tokio::test(start_paused = true)]
async fn an_attempt_that_times_out_is_retried_and_paid_for() {
    let throttle: Arc<dyn Budget> = Arc::new(
        A6Budget::new(A6BudgetConfig {
            max_tokens: 10.0,
            token_ratio: 0.1,
        })
        .unwrap(),
    );
    let layer =
        timeout_layer(throttle.clone(), None).with_default_timeout(Duration::from_millis(80));
    let stats = layer.stats();
    let hang = Hang::new([true, false]);
    let mut svc = layer.layer(hang.clone());
    let started = tokio::time::Instant::now();
    let response = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(response.headers().get("grpc-status").unwrap(), "0");
    // The first attempt timed out at 50 ms, not at the call's 80 ms deadline.
    let elapsed = started.elapsed();
    assert!(elapsed >= Duration::from_millis(50) && elapsed < Duration::from_millis(60));
    let timeouts = hang.timeouts.lock().unwrap().clone();
    assert_eq!(timeouts.len(), 2);
    assert_eq!(
        timeouts[0],
        Duration::from_millis(50),
        "the per-attempt limit"
    );
    assert!(
        timeouts[1] <= Duration::from_millis(30),
        "the time left on the call's deadline: {timeouts:?}"
    );
    let s = stats.snapshot();
    assert_eq!((s.attempts, s.attempt_timeouts, s.ok), (2, 1, 1));
    // The timeout cost a token (10 → 9); the OK gave back 0.1.
    let now = stormguard_core::Instant::now();
    assert!(
        (throttle.balance_at(now) - 4.1).abs() < 1e-9,
        "{}",
        throttle.balance_at(now)
    );
}

#[tokio::test(start_paused = true)]
async fn the_callers_own_grpc_timeout_goes_out_as_written_and_retries_carry_what_is_left() {
    let hang = Hang::new([false]);
    let mut svc = layer().layer(hang.clone());
    let mut req = request();
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("250m"));
    svc.ready().await.unwrap().call(req).await.unwrap();
    assert_eq!(*hang.raw.lock().unwrap(), ["250m"]);
    // Shortened by a per-attempt timeout: encoded anew.
    let hang = Hang::new([true, false]);
    let layer = timeout_layer(
        Arc::new(RetryBudget::new(BudgetConfig::default()).unwrap()),
        None,
    );
    let mut svc = layer.layer(hang.clone());
    let mut req = request();
    req.headers_mut()
        .insert("grpc-timeout", http::HeaderValue::from_static("250m"));
    svc.ready().await.unwrap().call(req).await.unwrap();
    let raw = hang.raw.lock().unwrap().clone();
    assert_eq!(raw[0], "50000000n");
    assert_eq!(raw.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn attempt_timeouts_open_the_breaker_and_the_caller_gets_deadline_exceeded() {
    let breaker = CircuitBreaker::new(
        BreakerConfig {
            min_requests: 2,
            failure_rate: 0.5,
            ..BreakerConfig::default()
        },
        1,
    )
    .unwrap();
    let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default()).unwrap());
    let layer = timeout_layer(budget, Some(breaker));
    let stats = layer.stats();
    let mut svc = layer.layer(Hang::new([true, true, true]));
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .expect_err("every attempt hangs");
    let status = err.downcast::<tonic::Status>().unwrap();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "-1"
    );
    let s = stats.snapshot();
    // Two timeouts of two calls: the breaker opened and refused the second retry.
    assert_eq!(
        (s.attempts, s.attempt_timeouts, s.refused.breaker),
        (2, 2, 1)
    );
    assert_eq!(s.deadline_exceeded, 0);
}

fn breaker(min_requests: u32, probes: u32) -> CircuitBreaker {
    CircuitBreaker::new(
        BreakerConfig {
            min_requests,
            failure_rate: 0.5,
            half_open_probes: probes,
            open_for: Duration::from_secs(1),
            open_jitter: 0.0,
            ..BreakerConfig::default()
        },
        1,
    )
    .unwrap()
}

fn breaker_layer(breaker: CircuitBreaker) -> RetryLayer {
    idempotent_layer(Some(breaker))
}

/// Every method idempotent, the default budget, `breaker` if any.
fn idempotent_layer(breaker: Option<CircuitBreaker>) -> RetryLayer {
    let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default()).unwrap());
    let policy = RetryPolicy {
        idempotent: true,
        ..RetryPolicy::default()
    };
    RetryLayer::new(RetryController::new(MethodTable::uniform(policy), budget, breaker, 3).unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_callers_short_deadline_does_not_open_the_shared_breaker() {
    // A batch path with 5 ms deadlines on a method that takes longer.
    let layer = breaker_layer(breaker(2, 1)).with_default_timeout(Duration::from_millis(5));
    let stats = layer.stats();
    let mut svc = layer.layer(Hang::new([true; 10]));
    for _ in 0..10 {
        let err = svc
            .ready()
            .await
            .unwrap()
            .call(request())
            .await
            .expect_err("every call runs out of its deadline");
        let status = err.downcast::<tonic::Status>().unwrap();
        assert_eq!(status.code(), tonic::Code::DeadlineExceeded);
    }
    let s = stats.snapshot();
    assert_eq!(
        (s.attempts, s.deadline_exceeded, s.refused.breaker),
        (10, 10, 0)
    );
    // Every other caller of the channel still gets through.
    let response = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(response.headers().get("grpc-status").unwrap(), "0");
}

/// A body that never ends (a long stream).
struct Endless;

impl http_body::Body for Endless {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<bytes::Bytes>, tonic::Status>>> {
        Poll::Pending
    }
}

/// Answers `UNAVAILABLE` (trailers-only) while `fail` is set, else commits a response
/// whose body never ends.
#[derive(Clone)]
struct StreamOrFail {
    fail: Arc<std::sync::atomic::AtomicBool>,
}

impl Service<http::Request<Body>> for StreamOrFail {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<http::Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<Body>) -> Self::Future {
        let response = if self.fail.load(Ordering::SeqCst) {
            let mut r = http::Response::new(Body::empty());
            r.headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static("14"));
            r
        } else {
            http::Response::new(Body::new(Endless))
        };
        std::future::ready(Ok(response))
    }
}

#[tokio::test(start_paused = true)]
async fn a_long_stream_that_began_as_a_probe_does_not_hold_its_probe_slot() {
    let fail = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let layer = breaker_layer(breaker(1, 1));
    let stats = layer.stats();
    let mut svc = layer.layer(StreamOrFail { fail: fail.clone() });
    // One failure opens the breaker (its retry is refused).
    let response = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert_eq!(response.headers().get("grpc-status").unwrap(), "14");
    assert_eq!(stats.snapshot().refused.breaker, 1);
    tokio::time::advance(Duration::from_secs(2)).await;
    fail.store(false, Ordering::SeqCst);
    // The probe commits: a stream that stays open.
    let stream = svc.ready().await.unwrap().call(request()).await.unwrap();
    assert!(stream.headers().get("grpc-status").is_none());
    // While it stays open, other calls get through: the probe settled at commit.
    let other = svc.ready().await.unwrap().call(request()).await;
    assert!(other.is_ok(), "{:?}", other.err());
    drop(stream);
}

/// Answers `UNAVAILABLE`; readying any clone after the first fails (a channel whose
/// worker is gone).
#[derive(Clone)]
struct BrokenAfterFirst {
    readied: Arc<AtomicUsize>,
}

impl Service<http::Request<Body>> for BrokenAfterFirst {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = std::future::Ready<Result<http::Response<Body>, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.readied.fetch_add(1, Ordering::SeqCst) == 0 {
            Poll::Ready(Ok(()))
        } else {
            Poll::Ready(Err("the channel's worker is gone".into()))
        }
    }

    fn call(&mut self, _: http::Request<Body>) -> Self::Future {
        let mut r = http::Response::new(Body::empty());
        r.headers_mut()
            .insert("grpc-status", http::HeaderValue::from_static("14"));
        std::future::ready(Ok(r))
    }
}

#[tokio::test(start_paused = true)]
async fn an_error_readying_a_retry_reaches_the_caller_as_a_status_marked_do_not_retry() {
    let layer = layer();
    let budget = layer.controller().budget().clone();
    let before = budget.balance();
    let mut svc = layer.layer(BrokenAfterFirst {
        readied: Arc::new(AtomicUsize::new(0)),
    });
    let err = svc
        .ready()
        .await
        .unwrap()
        .call(request())
        .await
        .expect_err("the retry cannot be sent");
    let status = err
        .downcast::<tonic::Status>()
        .expect("a status, not the channel's raw error");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(
        status.metadata().get("grpc-retry-pushback-ms").unwrap(),
        "-1"
    );
    // The retry never went out: the budget has it back.
    assert_eq!(budget.balance(), before);
}

/// Fails the first attempt with `UNAVAILABLE`, answers OK after; records what each
/// attempt carried.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Carried>>>,
}

/// GrpcMethod present, the `Mark` extension, the `x-key` header, the body.
type Carried = (bool, Option<u32>, Option<String>, Vec<u8>);

#[derive(Clone)]
struct Mark(u32);

impl Service<http::Request<Body>> for Recorder {
    type Response = http::Response<Body>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<http::Response<Body>, BoxError>> + Send>,
    >;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let seen = self.seen.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let data = http_body_util::BodyExt::collect(body)
                .await
                .unwrap()
                .to_bytes()
                .to_vec();
            let first = {
                let mut seen = seen.lock().unwrap();
                seen.push((
                    parts
                        .extensions
                        .get::<tonic::GrpcMethod<'static>>()
                        .is_some(),
                    parts.extensions.get::<Mark>().map(|m| m.0),
                    parts
                        .headers
                        .get("x-key")
                        .map(|v| v.to_str().unwrap().to_owned()),
                    data,
                ));
                seen.len() == 1
            };
            let mut response = http::Response::new(Body::empty());
            let status = if first { "14" } else { "0" };
            response
                .headers_mut()
                .insert("grpc-status", http::HeaderValue::from_static(status));
            Ok(response)
        })
    }
}

#[tokio::test(start_paused = true)]
async fn a_retry_carries_the_requests_headers_extensions_and_body() {
    for mark in [None, Some(7)] {
        let recorder = Recorder::default();
        let mut svc = layer().layer(recorder.clone());
        let mut req = http::Request::builder()
            .uri("http://svc/pkg.Svc/Get")
            .header("x-key", "v")
            .header("te", "trailers")
            .header("content-type", "application/grpc")
            .body(Body::new(http_body_util::Full::new(
                bytes::Bytes::from_static(b"payload"),
            )))
            .unwrap();
        req.extensions_mut()
            .insert(tonic::GrpcMethod::new("pkg.Svc", "Get"));
        if let Some(m) = mark {
            req.extensions_mut().insert(Mark(m));
        }
        let response = svc.ready().await.unwrap().call(req).await.unwrap();
        assert_eq!(response.headers().get("grpc-status").unwrap(), "0");
        let seen = recorder.seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        for attempt in seen {
            assert_eq!(
                attempt,
                (true, mark, Some("v".to_owned()), b"payload".to_vec())
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn the_service_left_behind_by_call_must_be_readied_again() {
    let script = Arc::new(Mutex::new(VecDeque::from([None, None])));
    let strict = Strict {
        ready: false,
        script,
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let mut svc = layer().layer(strict);
    // Two calls in flight at once: each takes the readied service, leaving a clone.
    let first = svc.ready().await.unwrap().call(request());
    let second = svc.ready().await.unwrap().call(request());
    let (a, b) = tokio::join!(first, second);
    assert!(a.is_ok() && b.is_ok());
    assert!(
        !svc.get_ref().ready,
        "the service kept by the layer is an unready clone"
    );
}
