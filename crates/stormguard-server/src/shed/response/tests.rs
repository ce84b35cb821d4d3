#![allow(clippy::unwrap_used)]
use super::*;
use stormguard_core::Pushback;
use stormguard_core::wire::parse_retry_info;

#[test]
fn shed_answer_is_trailers_only_with_pushback() {
    let r: http::Response<String> = shed(
        Code::Unavailable,
        ShedReason::RetryThreshold,
        ShedPushback::After(Duration::from_millis(37)),
        false,
    );
    assert!(r.body().is_empty());
    let h = r.headers();
    assert_eq!(h["content-type"], "application/grpc");
    assert_eq!(h["grpc-status"], "14");
    assert_eq!(h["grpc-message"], MESSAGE_RETRY_SHED);
    assert_eq!(h["grpc-retry-pushback-ms"], "37");
    assert_eq!(h["stormguard-unprocessed"], "1");
    let r: http::Response<String> = shed(
        Code::ResourceExhausted,
        ShedReason::QueueFull,
        ShedPushback::DoNotRetry,
        false,
    );
    assert_eq!(r.headers()["grpc-status"], "8");
    assert_eq!(r.headers()["grpc-retry-pushback-ms"], "-1");
    let r: http::Response<String> = shutting_down(false);
    assert!(r.body().is_empty());
    assert_eq!(r.headers()["grpc-status"], "14");
    assert_eq!(r.headers()["grpc-message"], MESSAGE_SHUTTING_DOWN);
    assert_eq!(r.headers()["grpc-retry-pushback-ms"], "1");
    assert!(r.headers().get("grpc-status-details-bin").is_none());
    let r: http::Response<String> = expired();
    assert_eq!(r.headers()["grpc-status"], "4");
    assert!(r.headers().get("grpc-retry-pushback-ms").is_none());
    let r: http::Response<String> = deadline_cut();
    assert!(r.body().is_empty());
    assert_eq!(r.headers()["content-type"], "application/grpc");
    assert_eq!(r.headers()["grpc-status"], "4");
    assert_eq!(r.headers()["grpc-message"], MESSAGE_DEADLINE_CUT);
    assert!(r.headers().get("grpc-retry-pushback-ms").is_none());
    // The handler ran: a client must not take it for work never started.
    assert!(r.headers().get("stormguard-unprocessed").is_none());
}

#[test]
fn with_retry_info_a_pushback_answer_carries_it_too() {
    let read = |r: &http::Response<String>| {
        parse_retry_info(
            r.headers()
                .get_all("grpc-status-details-bin")
                .iter()
                .map(|v| v.as_bytes()),
        )
    };
    let after = |ms| Ok(Some(Pushback::RetryAfter(Duration::from_millis(ms))));
    let pushback = ShedPushback::After(Duration::from_millis(37));
    let r = shed(Code::Unavailable, ShedReason::QueueFull, pushback, true);
    assert_eq!(r.headers()["grpc-retry-pushback-ms"], "37");
    assert_eq!(read(&r), after(37));
    let off = shed(Code::Unavailable, ShedReason::QueueFull, pushback, false);
    assert_eq!(read(&off), Ok(None), "off by default");
    // "Do not retry" has no RetryInfo: the header alone says it.
    let r = shed(
        Code::ResourceExhausted,
        ShedReason::QueueFull,
        ShedPushback::DoNotRetry,
        true,
    );
    assert_eq!(read(&r), Ok(None));
    assert_eq!(r.headers()["grpc-retry-pushback-ms"], "-1");
    assert_eq!(read(&shutting_down(true)), after(1));
}

#[test]
fn only_a_retryable_answer_without_pushback_is_marked_do_not_retry() {
    let answer = |status: &'static str, pushback: Option<&'static str>| {
        let mut r = http::Response::new(());
        r.headers_mut()
            .insert(GRPC_STATUS, HeaderValue::from_static(status));
        if let Some(p) = pushback {
            r.headers_mut()
                .insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static(p));
        }
        r
    };
    for status in ["14", "8", "10", "4"] {
        let mut r = answer(status, None);
        assert!(mark_downstream_refused(&mut r), "{status}");
        assert_eq!(r.headers()["grpc-retry-pushback-ms"], "-1");
    }
    for status in ["0", "2", "13", "x"] {
        assert!(
            !mark_downstream_refused(&mut answer(status, None)),
            "{status}"
        );
    }
    // The handler's own pushback stands.
    let mut r = answer("14", Some("250"));
    assert!(!mark_downstream_refused(&mut r));
    assert_eq!(r.headers()["grpc-retry-pushback-ms"], "250");
    // A response that is not trailers-only (no status yet) is left alone.
    assert!(!mark_downstream_refused(&mut http::Response::new(())));
}
