//! What the parity tests' scripted inner services answer, and how a call's end is read:
//! shared by `parity` (retries) and `hedge_parity` (hedges).
#![allow(clippy::unwrap_used)]

use stormguard_core::Code;
use tonic::body::Body;

/// The error a scripted service (and the layer over it) returns.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A trailers-only gRPC answer with `code` (and `pushback`, a header value).
pub(crate) fn response(code: Code, pushback: Option<&'static str>) -> http::Response<Body> {
    let mut response = http::Response::new(Body::empty());
    let headers = response.headers_mut();
    headers.insert("content-type", "application/grpc".parse().unwrap());
    headers.insert("grpc-status", code.as_i32().into());
    if let Some(p) = pushback {
        headers.insert("grpc-retry-pushback-ms", p.parse().unwrap());
    }
    response
}

/// The code of what the layer returned.
pub(crate) fn code_of(result: Result<http::Response<impl Sized>, BoxError>) -> Code {
    match result {
        Ok(r) => r
            .headers()
            .get("grpc-status")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .and_then(Code::from_i32)
            .unwrap_or(Code::Ok),
        Err(e) => match e.downcast::<tonic::Status>() {
            Ok(status) => Code::from_i32(status.code() as i32).unwrap(),
            Err(e) => panic!("not a status: {e}"),
        },
    }
}
