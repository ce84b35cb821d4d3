//! The layer's own answers: trailers-only gRPC responses.
//!
//! A shed answer must cost less than the work it refuses, or shedding itself becomes
//! the overload. So these responses are put together from static header values (one
//! per status code, fixed messages) plus one small integer for the pushback: no
//! `tonic::Status`, no `String`, no metadata map (unless `AdmissionConfig::retry_info` asks
//! for the pushback as a RetryInfo too: one short base64 string per answer). The body is
//! empty (`B::default()`), so hyper sends the headers with END_STREAM: a trailers-only
//! response, which every gRPC client reads as the call's status (and which is retryable
//! under gRPC A6).

use http::HeaderMap;
use http::header::{CONTENT_TYPE, HeaderValue};
use std::time::Duration;
use stormguard_core::Code;
use stormguard_core::{ShedPushback, ShedReason};

use stormguard_core::wire::{encode_grpc_status, encode_retry_info};
use stormguard_core::{
    wire::http::DO_NOT_RETRY, wire::http::GRPC_MESSAGE, wire::http::GRPC_RETRY_PUSHBACK_MS,
    wire::http::GRPC_STATUS, wire::http::GRPC_STATUS_DETAILS_BIN,
    wire::http::STORMGUARD_UNPROCESSED, wire::http::UNPROCESSED, wire::http::grpc_status,
};

/// The `grpc-message` of a call shed because the queue was full.
pub const MESSAGE_QUEUE_FULL: &str = "stormguard: overloaded, queue full";
/// The `grpc-message` of a retry shed past the retry threshold.
pub const MESSAGE_RETRY_SHED: &str = "stormguard: overloaded, retries shed first";
/// The `grpc-message` of a sheddable call shed first, or of a queued call that gave
/// its place to a call of a higher criticality.
pub const MESSAGE_SHEDDABLE: &str = "stormguard: overloaded, lower-priority work shed first";
/// The `grpc-message` of a call answered, queued or on arrival, because the server is
/// shutting down (see [`ShutdownHandle`](crate::ShutdownHandle)).
pub const MESSAGE_SHUTTING_DOWN: &str = "stormguard: server shutting down, try another replica";
/// The `grpc-retry-pushback-ms` of a call answered because the server is shutting down:
/// come back at once, to another replica. 1, not 0: gRPC C-core clients never finish a
/// call told to retry after 0 ms (stormguard clients read 0 as "now" too).
pub const SHUTDOWN_PUSHBACK_MS: i64 = 1;
/// The `grpc-message` of a call dropped before running because its deadline was too
/// close or it waited too long.
pub const MESSAGE_EXPIRED: &str = "stormguard: deadline expired while queued";

/// The `grpc-message` of a call cut at its deadline while its handler still ran or its
/// response still streamed.
pub const MESSAGE_DEADLINE_CUT: &str = "stormguard: deadline exceeded while running";

fn trailers_only<B: Default>(code: Code, message: &'static str) -> http::Response<B> {
    let mut response = http::Response::new(B::default());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    headers.insert(
        GRPC_STATUS,
        HeaderValue::from_static(encode_grpc_status(code)),
    );
    headers.insert(GRPC_MESSAGE, HeaderValue::from_static(message));
    // The handler never ran: a client may retry even a method that is not idempotent.
    headers.insert(STORMGUARD_UNPROCESSED, UNPROCESSED);
    response
}

/// Adds the pushback of `millis` (at least 1) as a `google.rpc.RetryInfo` in
/// `grpc-status-details-bin`, with the answer's `code` and `message`
/// ([`AdmissionConfig::retry_info`](stormguard_core::AdmissionConfig::retry_info)).
fn add_retry_info(headers: &mut http::HeaderMap, code: Code, message: &str, millis: u64) {
    let value = encode_retry_info(code, message, Duration::from_millis(millis));
    // Base64 is always a valid header value.
    if let Ok(value) = HeaderValue::try_from(value) {
        headers.insert(GRPC_STATUS_DETAILS_BIN, value);
    }
}

/// The answer to a shed call: `code`, a fixed message, and `grpc-retry-pushback-ms`; with
/// `retry_info`, the same delay as a RetryInfo (not on a "do not retry" answer).
pub(crate) fn shed<B: Default>(
    code: Code,
    reason: ShedReason,
    pushback: ShedPushback,
    retry_info: bool,
) -> http::Response<B> {
    let message = match reason {
        ShedReason::QueueFull => MESSAGE_QUEUE_FULL,
        ShedReason::RetryThreshold => MESSAGE_RETRY_SHED,
        ShedReason::Sheddable => MESSAGE_SHEDDABLE,
    };
    let mut response = trailers_only(code, message);
    let headers = response.headers_mut();
    let millis = pushback.millis();
    headers.insert(GRPC_RETRY_PUSHBACK_MS, HeaderValue::from(millis));
    if let (true, Ok(millis)) = (retry_info, u64::try_from(millis)) {
        add_retry_info(headers, code, message, millis);
    }
    response
}

/// The answer to a call the server will not run because it is shutting down:
/// `UNAVAILABLE` (whatever the shed code: this is no overload, and every gRPC client
/// retries `UNAVAILABLE` most readily), a pushback of [`SHUTDOWN_PUSHBACK_MS`] and
/// [`MESSAGE_SHUTTING_DOWN`]; with `retry_info`, the pushback as a RetryInfo too.
pub(crate) fn shutting_down<B: Default>(retry_info: bool) -> http::Response<B> {
    let mut response = trailers_only(Code::Unavailable, MESSAGE_SHUTTING_DOWN);
    let headers = response.headers_mut();
    headers.insert(
        GRPC_RETRY_PUSHBACK_MS,
        HeaderValue::from(SHUTDOWN_PUSHBACK_MS),
    );
    if retry_info {
        let millis = SHUTDOWN_PUSHBACK_MS.unsigned_abs();
        add_retry_info(headers, Code::Unavailable, MESSAGE_SHUTTING_DOWN, millis);
    }
    response
}

/// The answer to a call dropped before it ran: `DEADLINE_EXCEEDED`, no pushback (the
/// caller's deadline is gone or nearly so; there is nothing to come back for).
pub(crate) fn expired<B: Default>() -> http::Response<B> {
    trailers_only(Code::DeadlineExceeded, MESSAGE_EXPIRED)
}

/// The status of a call cut at its deadline: `DEADLINE_EXCEEDED` and
/// [`MESSAGE_DEADLINE_CUT`], no pushback, and not marked unprocessed (the handler ran).
/// As the headers of a trailers-only answer (the handler had not answered yet), or as the
/// trailers after the messages sent so far.
pub(crate) fn deadline_cut_status(headers: &mut http::HeaderMap) {
    headers.insert(
        GRPC_STATUS,
        HeaderValue::from_static(encode_grpc_status(Code::DeadlineExceeded)),
    );
    headers.insert(GRPC_MESSAGE, HeaderValue::from_static(MESSAGE_DEADLINE_CUT));
}

/// The answer to a call cut at its deadline before its handler answered: trailers-only
/// `DEADLINE_EXCEEDED` (see [`deadline_cut_status`]).
pub(crate) fn deadline_cut<B: Default>() -> http::Response<B> {
    let mut response = http::Response::new(B::default());
    let headers = response.headers_mut();
    headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    deadline_cut_status(headers);
    response
}

/// Codes that standard clients are commonly configured to retry (gRPC A6
/// `retryableStatusCodes`): a handler's answer with one of them is marked "do not retry"
/// when a downstream call of the same request was refused a retry.
const RETRYABLE: [Code; 4] = [
    Code::Unavailable,
    Code::ResourceExhausted,
    Code::Aborted,
    Code::DeadlineExceeded,
];

/// Whether an answer whose status is in `status` (the headers of a trailers-only answer,
/// else the trailers) was not served: its `grpc-status` is an overload or expiry code
/// ([`Code::is_overload`]: `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `DEADLINE_EXCEEDED`,
/// `CANCELLED`). No status at all is no such answer.
pub(crate) fn is_not_served(status: &HeaderMap) -> bool {
    grpc_status(status).is_some_and(Code::is_overload)
}

/// Marks a handler's trailers-only answer with `grpc-retry-pushback-ms: -1` when its code
/// is one clients retry ([`RETRYABLE`]: `UNAVAILABLE`, `RESOURCE_EXHAUSTED`, `ABORTED`,
/// `DEADLINE_EXCEEDED`) and it carries no pushback of its own. Called only when a client
/// layer inside the request gave up on a retryable failure: the caller must not retry
/// what the layer below already refused to. Returns whether it marked.
pub(crate) fn mark_downstream_refused<B>(response: &mut http::Response<B>) -> bool {
    let headers = response.headers_mut();
    let retryable = grpc_status(headers).is_some_and(|code| RETRYABLE.contains(&code));
    if !retryable || headers.contains_key(GRPC_RETRY_PUSHBACK_MS) {
        return false;
    }
    headers.insert(GRPC_RETRY_PUSHBACK_MS, DO_NOT_RETRY);
    true
}

#[cfg(test)]
mod tests;
