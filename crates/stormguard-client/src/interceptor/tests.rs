#![allow(clippy::unwrap_used)]
use super::*;

/// Stamps `ctx` at `now` on a request whose own timeout is `request_timeout`; returns
/// the stamped request and its `grpc-timeout`, decoded.
fn stamp_with_timeout(
    ctx: CallContext,
    now: Instant,
    request_timeout: Duration,
) -> (Request<()>, Duration) {
    let mut req = Request::new(());
    req.set_timeout(request_timeout);
    let req = ContextInterceptor::stamp(ctx, now, req).unwrap();
    let v = req.metadata().get("grpc-timeout").unwrap();
    let timeout = decode_grpc_timeout(v.as_bytes()).unwrap();
    (req, timeout)
}

#[test]
fn without_a_context_the_request_is_untouched() {
    let mut req = Request::new(());
    req.set_timeout(Duration::from_secs(3));
    let before = req.metadata().clone().into_headers();
    let after = ContextInterceptor::new().call(req).unwrap();
    assert_eq!(after.metadata().clone().into_headers(), before);
}

#[test]
fn stamps_the_remaining_deadline_and_attempt() {
    let now = Instant::now();
    let ctx = CallContext::new()
        .with_deadline(now + Duration::from_millis(1500))
        .with_previous_attempts(3);
    let req = ContextInterceptor::stamp(ctx, now, Request::new(())).unwrap();
    assert_eq!(req.metadata().get("grpc-timeout").unwrap(), "1500000u");
    assert_eq!(
        req.metadata().get("grpc-previous-rpc-attempts").unwrap(),
        "3"
    );
}

#[test]
fn a_shorter_request_timeout_is_kept() {
    let now = Instant::now();
    let ctx = CallContext::new().with_deadline(now + Duration::from_secs(10));
    let (req, timeout) = stamp_with_timeout(ctx, now, Duration::from_millis(200));
    assert_eq!(timeout, Duration::from_millis(200));
    assert!(req.metadata().get("grpc-previous-rpc-attempts").is_none());
}

#[test]
fn a_longer_request_timeout_is_cut_to_the_context() {
    let now = Instant::now();
    let ctx = CallContext::new().with_deadline(now + Duration::from_millis(300));
    let (_, timeout) = stamp_with_timeout(ctx, now, Duration::from_secs(30));
    assert_eq!(timeout, Duration::from_millis(300));
}

#[test]
fn an_expired_context_fails_fast() {
    let now = Instant::now();
    let ctx = CallContext::new().with_deadline(now);
    let err = ContextInterceptor::stamp(ctx, now, Request::new(())).unwrap_err();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded);
}
