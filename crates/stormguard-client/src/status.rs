//! Reading a failed attempt: its gRPC status, its pushback, whether it was committed.
//!
//! gRPC A6 draws the line a retrying client must respect: a call is *committed* once the
//! server has sent response headers without a status, because from then on the caller may
//! have seen messages. Before that, two kinds of failure are visible to a tower layer:
//!
//! - a **trailers-only** response: the headers already carry `grpc-status` (tonic answers
//!   every handler error returned before the first message this way), with the status's
//!   metadata such as `grpc-retry-pushback-ms` beside it;
//! - a **transport error** from the inner service (connection refused or reset, stream
//!   refused), which the layer treats as `UNAVAILABLE` unless the error carries a status.
//!
//! Some transport errors prove that the request never reached the server's application,
//! and so may be retried *transparently* (gRPC A6; see
//! [`CallRetry::on_attempt_end_at`](stormguard_core::CallRetry::on_attempt_end_at)):
//! they are read as *unsent* ([`classify_error`]). What tonic 0.14's channel (hyper 1 over
//! h2) returns for each, found in the error's source chain:
//!
//! | what happened | in the chain | unsent |
//! |---|---|---|
//! | the connection could not be made | `tonic::ConnectError` | yes |
//! | the server reset the stream with `REFUSED_STREAM` (RFC 9113 §8.7: not processed) | `h2::Error`, `reason() == REFUSED_STREAM`, from the peer | yes |
//! | the stream was above the last stream id of the server's `GOAWAY` (RFC 9113 §6.8: not processed), or was opened after it | `h2::Error`, `is_go_away() && is_remote()` | yes |
//! | hyper never handed the request to the connection (it was closing, or not ready) | `hyper::Error`, `is_canceled()` | yes |
//! | the connection broke under a stream it had sent (`GOAWAY` received, then closed) | `h2::Error` with an I/O error (`BrokenPipe`) | no: the server may have run it |
//! | any other reset (`CANCEL`, `INTERNAL_ERROR`, ...) | `h2::Error`, `is_reset()` | no |
//!
//! (hyper's "connection closed before message completed" is an HTTP/1 error; a tonic
//! channel speaks HTTP/2 only.)
//!
//! Everything here maps between those wire facts and `stormguard_core` types, in one place.

use http::{HeaderMap, HeaderValue};
use stormguard_core::Code;
use stormguard_core::Pushback;
use stormguard_core::{wire, wire::response_pushback};
use stormguard_core::{wire::http::DO_NOT_RETRY, wire::http::GRPC_RETRY_PUSHBACK_MS};
use tonic::Status;

/// The boxed error type of the retry service.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The code of a response that ended without a `grpc-status`, from its HTTP status, as
/// tonic maps it for the caller (after gRPC's `http-grpc-status-mapping.md`).
pub(crate) fn code_from_http_status(status: http::StatusCode) -> Code {
    use http::StatusCode as S;
    match status {
        S::BAD_REQUEST => Code::Internal,
        S::UNAUTHORIZED => Code::Unauthenticated,
        S::FORBIDDEN => Code::PermissionDenied,
        S::NOT_FOUND => Code::Unimplemented,
        S::TOO_MANY_REQUESTS | S::BAD_GATEWAY | S::SERVICE_UNAVAILABLE | S::GATEWAY_TIMEOUT => {
            Code::Unavailable
        }
        _ => Code::Unknown,
    }
}

/// The server's pushback in `headers`, if it sent one: `grpc-retry-pushback-ms`, or a
/// `google.rpc.RetryInfo` in `grpc-status-details-bin`, the longer when both
/// ([`response_pushback`]).
pub(crate) fn pushback(headers: &HeaderMap) -> Option<Pushback> {
    let values = |name| headers.get_all(name).into_iter().map(HeaderValue::as_bytes);
    response_pushback(
        values(GRPC_RETRY_PUSHBACK_MS),
        values(wire::http::GRPC_STATUS_DETAILS_BIN),
    )
}

/// Whether a stormguard server said its application never ran the call
/// (`stormguard-unprocessed: 1`).
pub(crate) fn unprocessed(headers: &HeaderMap) -> bool {
    stormguard_core::wire::is_unprocessed(
        headers
            .get_all(wire::http::STORMGUARD_UNPROCESSED)
            .iter()
            .map(HeaderValue::as_bytes),
    )
}

/// Marks response headers with `grpc-retry-pushback-ms: -1`, replacing any pushback the
/// server sent: stormguard gave up on a retryable failure, and no layer above should retry.
/// Also records the give-up in the current request scope, if any (see
/// [`RequestScope`](stormguard_core::context::RequestScope)), so that the server layer
/// around the handler can mark the handler's own answer the same way.
pub(crate) fn mark_do_not_retry(headers: &mut HeaderMap) {
    stormguard_core::context::mark_downstream_refused();
    headers.insert(GRPC_RETRY_PUSHBACK_MS, DO_NOT_RETRY);
}

/// A `tonic::Code` as a core code (they share numbers).
pub fn code_from_tonic(code: tonic::Code) -> Code {
    Code::from_i32(code as i32).unwrap_or(Code::Unknown)
}

/// A core code as a `tonic::Code`.
pub fn code_to_tonic(code: Code) -> tonic::Code {
    tonic::Code::from_i32(code.as_i32())
}

/// How the layer reads an error from the inner service.
#[derive(Debug)]
pub(crate) struct TransportFailure {
    /// The code used for the retry decision.
    pub(crate) code: Code,
    /// The request never reached the server's application (see the [module docs](self)).
    pub(crate) unsent: bool,
    /// A timer below the layer ended the attempt: tonic's channel (`grpc-timeout`, or
    /// `Endpoint::timeout`) or a `tower::timeout` layer.
    pub(crate) timed_out: bool,
    /// No connection could be made (`tonic::ConnectError`).
    pub(crate) connect: bool,
}

/// Classifies an error of the inner service: a status found in the error's source chain
/// keeps its code; a connection that could not be made, or any other transport failure
/// before response headers, is `UNAVAILABLE`. It is *unsent* when the chain proves the
/// request never reached the server's application (the table in the [module docs](self)).
pub(crate) fn classify_error(err: &(dyn std::error::Error + 'static)) -> TransportFailure {
    let mut unsent = false;
    let mut timed_out = false;
    let mut connect = false;
    let mut code = None;
    let mut source = Some(err);
    while let Some(e) = source {
        if let Some(status) = e.downcast_ref::<Status>() {
            code.get_or_insert(code_from_tonic(status.code()));
        }
        if e.downcast_ref::<tonic::ConnectError>().is_some() {
            connect = true;
        }
        if connect
            || e.downcast_ref::<h2::Error>().is_some_and(refused_by_h2)
            || e.downcast_ref::<hyper::Error>()
                .is_some_and(hyper::Error::is_canceled)
        {
            unsent = true;
        }
        if e.downcast_ref::<tonic::TimeoutExpired>().is_some()
            || e.downcast_ref::<tower::timeout::error::Elapsed>().is_some()
        {
            timed_out = true;
        }
        source = e.source();
    }
    TransportFailure {
        code: code.unwrap_or(Code::Unavailable),
        unsent,
        timed_out,
        connect,
    }
}

/// Whether an HTTP/2 error proves that the server did not process the stream: a reset
/// with `REFUSED_STREAM`, or a `GOAWAY` the server sent whose last stream id is below the
/// stream (h2 gives the streams above it, and every stream opened after it, that error).
/// Resets and `GOAWAY`s of this end's own making prove nothing.
fn refused_by_h2(e: &h2::Error) -> bool {
    e.is_remote() && (e.is_go_away() || e.reason() == Some(h2::Reason::REFUSED_STREAM))
}

/// The status a caller sees for an inner-service error the layer does not retry.
///
/// A status in the error's chain is kept (with its metadata); otherwise the status has the
/// classified code and the error's message, and keeps the error as its source.
pub(crate) fn status_from_error(err: BoxError, code: Code) -> Status {
    match Status::try_from_error(err) {
        Ok(status) if status.code() != tonic::Code::Unknown || code == Code::Unknown => status,
        Ok(status) => Status::new(code_to_tonic(code), status.message().to_owned()),
        Err(err) => Status::new(code_to_tonic(code), err.to_string()),
    }
}

/// Adds `grpc-retry-pushback-ms: -1` to a status's metadata (and records the give-up in
/// the current request scope, as [`mark_do_not_retry`] does).
pub(crate) fn status_do_not_retry(mut status: Status) -> Status {
    stormguard_core::context::mark_downstream_refused();
    status.metadata_mut().insert(
        wire::GRPC_RETRY_PUSHBACK_MS,
        tonic::metadata::MetadataValue::from_static(wire::DO_NOT_RETRY),
    );
    status
}

#[cfg(test)]
mod tests;
