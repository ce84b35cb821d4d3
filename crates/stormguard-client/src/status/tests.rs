#![allow(clippy::unwrap_used)]
use super::*;
use std::time::Duration;

fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for (k, v) in pairs {
        h.append(*k, HeaderValue::from_static(v));
    }
    h
}

#[test]
fn http_statuses_map_as_tonic_maps_them() {
    use http::StatusCode as S;
    let cases = [
        (S::BAD_REQUEST, Code::Internal),
        (S::UNAUTHORIZED, Code::Unauthenticated),
        (S::FORBIDDEN, Code::PermissionDenied),
        (S::NOT_FOUND, Code::Unimplemented),
        (S::TOO_MANY_REQUESTS, Code::Unavailable),
        (S::BAD_GATEWAY, Code::Unavailable),
        (S::SERVICE_UNAVAILABLE, Code::Unavailable),
        (S::GATEWAY_TIMEOUT, Code::Unavailable),
        (S::OK, Code::Unknown),
        (S::INTERNAL_SERVER_ERROR, Code::Unknown),
    ];
    for (http, code) in cases {
        assert_eq!(code_from_http_status(http), code, "{http}");
    }
}

#[test]
fn pushback_is_read_from_headers() {
    assert_eq!(pushback(&headers(&[])), None);
    assert_eq!(
        pushback(&headers(&[("grpc-retry-pushback-ms", "250")])),
        Some(Pushback::RetryAfter(Duration::from_millis(250)))
    );
    assert_eq!(
        pushback(&headers(&[("grpc-retry-pushback-ms", "-1")])),
        Some(Pushback::DoNotRetry)
    );
}

#[test]
fn a_retry_info_is_a_pushback_and_the_longer_one_wins() {
    let info = wire::encode_retry_info(Code::Unavailable, "busy", Duration::from_millis(700));
    let mut h = headers(&[]);
    h.insert(
        wire::http::GRPC_STATUS_DETAILS_BIN,
        HeaderValue::from_str(&info).unwrap(),
    );
    let later = Some(Pushback::RetryAfter(Duration::from_millis(700)));
    assert_eq!(pushback(&h), later);
    h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("30"));
    assert_eq!(pushback(&h), later);
    h.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from_static("5000"));
    assert_eq!(
        pushback(&h),
        Some(Pushback::RetryAfter(Duration::from_secs(5)))
    );
    // Giving up still wins over the server's RetryInfo.
    mark_do_not_retry(&mut h);
    assert_eq!(pushback(&h), Some(Pushback::DoNotRetry));
}

#[test]
fn giving_up_replaces_the_servers_pushback_with_minus_one() {
    let mut h = headers(&[
        ("grpc-retry-pushback-ms", "250"),
        ("grpc-retry-pushback-ms", "9"),
    ]);
    mark_do_not_retry(&mut h);
    assert_eq!(h.get_all(GRPC_RETRY_PUSHBACK_MS).iter().count(), 1);
    assert_eq!(pushback(&h), Some(Pushback::DoNotRetry));
}

#[test]
fn tonic_codes_round_trip() {
    for n in 0..17 {
        let code = tonic::Code::from_i32(n);
        assert_eq!(code_to_tonic(code_from_tonic(code)), code);
    }
}

#[test]
fn an_error_without_a_status_is_unavailable() {
    let err: BoxError = "connection reset".into();
    let f = classify_error(&*err);
    assert_eq!(f.code, Code::Unavailable);
    assert!(!f.unsent);
    let status = status_from_error(err, f.code);
    assert_eq!(status.code(), tonic::Code::Unavailable);
    assert_eq!(status.message(), "connection reset");
}

#[test]
fn a_connect_error_is_unsent_and_unavailable() {
    let err: BoxError = Box::new(tonic::ConnectError("refused".into()));
    let f = classify_error(&*err);
    assert_eq!(f.code, Code::Unavailable);
    assert!(f.unsent && f.connect);
}

/// An error whose source is `inner`, as tonic's channel wraps what hyper returns.
#[derive(Debug)]
struct Wrapped(BoxError);

impl std::fmt::Display for Wrapped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("transport error")
    }
}

impl std::error::Error for Wrapped {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

#[test]
fn only_errors_of_the_peers_making_are_read_as_refused_by_h2() {
    // Outside h2, an `h2::Error` can be built only from a reason (this end's, not the
    // peer's); the peer's resets and GOAWAYs come from real connections (see
    // `tests/client/transparent.rs`).
    let local: BoxError = Box::new(Wrapped(Box::new(h2::Error::from(
        h2::Reason::REFUSED_STREAM,
    ))));
    let f = classify_error(&*local);
    assert_eq!(f.code, Code::Unavailable);
    assert!(
        !f.unsent,
        "a reason of this end's own making proves nothing"
    );
}

#[test]
fn a_status_in_the_chain_keeps_its_code_and_metadata() {
    let mut st = Status::resource_exhausted("full");
    st.metadata_mut().insert("x-k", "v".parse().unwrap());
    let err: BoxError = Box::new(st);
    let f = classify_error(&*err);
    assert_eq!(f.code, Code::ResourceExhausted);
    let back = status_from_error(err, f.code);
    assert_eq!(back.code(), tonic::Code::ResourceExhausted);
    assert_eq!(back.metadata().get("x-k").unwrap(), "v");
}

#[test]
fn a_given_up_status_carries_minus_one() {
    let st = status_do_not_retry(Status::unavailable("down"));
    assert_eq!(
        st.metadata().get(wire::GRPC_RETRY_PUSHBACK_MS).unwrap(),
        "-1"
    );
}
