//! Between the `grpc` crate's types and the engine's: status codes, what a failed attempt's
//! trailers say (pushback, "unprocessed"), and what each attempt carries in its request
//! metadata. The values are read and written by `stormguard_core::wire`, as the tonic
//! layer reads and writes them: one parser per header.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD_NO_PAD;
use grpc::core::Trailers;
use grpc::metadata::{AsciiMetadataValue, MetadataMap};
use grpc::{StatusCodeError, StatusError};
use stormguard_core::wire::{self, UuidKey};
use stormguard_core::{AttemptPlan, Code, Pushback, context};

/// A `grpc` status code as the engine's.
pub(crate) fn code_from_grpc(code: StatusCodeError) -> Code {
    Code::from_i32(code as i32).unwrap_or(Code::Unknown)
}

/// The engine's code as a `grpc` status code (they share numbers; `OK` is not one).
pub(crate) fn code_to_grpc(code: Code) -> StatusCodeError {
    StatusCodeError::from(code.as_i32())
}

/// The code of an attempt's trailers (`OK` for a success).
pub(crate) fn trailers_code(trailers: &Trailers) -> Code {
    match trailers.status() {
        Ok(()) => Code::Ok,
        Err(e) => code_from_grpc(e.code()),
    }
}

/// The server's pushback in a failed attempt's trailers: `grpc-retry-pushback-ms`, or a
/// `google.rpc.RetryInfo` in `grpc-status-details-bin`, the longer when both
/// ([`wire::response_pushback`], as the tonic layer reads them). The `grpc` crate keeps a
/// `-bin` value decoded; it is read in its wire form (base64) here, on the failure path
/// only.
pub(crate) fn pushback(metadata: &MetadataMap) -> Option<Pushback> {
    let ms = metadata.get_all(wire::GRPC_RETRY_PUSHBACK_MS);
    let details: Vec<String> = metadata
        .get_all_bin(wire::GRPC_STATUS_DETAILS_BIN)
        .iter()
        .map(|v| STANDARD_NO_PAD.encode(bytes::Bytes::from(v.clone())))
        .collect();
    wire::response_pushback(
        ms.iter().map(|v| v.as_bytes()),
        details.iter().map(String::as_bytes),
    )
}

/// Whether a stormguard server said its application never ran the call
/// (`stormguard-unprocessed: 1`).
pub(crate) fn unprocessed(metadata: &MetadataMap) -> bool {
    wire::is_unprocessed(
        metadata
            .get_all(wire::STORMGUARD_UNPROCESSED)
            .iter()
            .map(|v| v.as_bytes()),
    )
}

/// The caller's own `grpc-timeout`, if its metadata carries one that can be read.
pub(crate) fn caller_timeout(metadata: &MetadataMap) -> Option<Duration> {
    let value = metadata.get(wire::GRPC_TIMEOUT)?;
    wire::decode_grpc_timeout(value.as_bytes()).ok()
}

/// Writes what `plan` says an attempt carries: `grpc-timeout` (what is left of the call, or
/// the attempt's own shorter limit), `grpc-previous-rpc-attempts` on retries, and what is
/// left of the request's retry allowance as `x-retry-budget`.
pub(crate) fn stamp(metadata: &mut MetadataMap, plan: &AttemptPlan) {
    if let Some(left) = plan.grpc_timeout
        && let Ok(value) = AsciiMetadataValue::try_from(wire::encode_grpc_timeout(left).as_str())
    {
        metadata.insert(wire::GRPC_TIMEOUT, value);
    }
    if plan.previous_attempts > 0 {
        metadata.insert(
            wire::GRPC_PREVIOUS_RPC_ATTEMPTS,
            AsciiMetadataValue::from(plan.previous_attempts),
        );
    }
    if let Some(left) = context::remaining_allowance() {
        metadata.insert(wire::X_RETRY_BUDGET, AsciiMetadataValue::from(left));
    }
}

/// Writes the call's idempotency key, unless the caller set one (the caller's is kept, as
/// the tonic layer keeps it).
pub(crate) fn stamp_idempotency_key(metadata: &mut MetadataMap, key: &UuidKey) {
    if metadata.contains_key(wire::IDEMPOTENCY_KEY) {
        return;
    }
    if let Ok(value) = AsciiMetadataValue::try_from(key.as_str()) {
        metadata.insert(wire::IDEMPOTENCY_KEY, value);
    }
}

/// Marks trailers `grpc-retry-pushback-ms: -1` (replacing any pushback the server sent):
/// stormguard gave up on a retryable failure, and no caller above should retry it. The
/// give-up is recorded in the current request scope too, so that a server layer around the
/// handler marks the handler's own answer.
pub(crate) fn mark_do_not_retry(trailers: &mut Trailers) {
    context::mark_downstream_refused();
    trailers.metadata_mut().insert(
        wire::GRPC_RETRY_PUSHBACK_MS,
        AsciiMetadataValue::from_static(wire::DO_NOT_RETRY),
    );
}

/// Trailers with a failure of `code` and `message`.
pub(crate) fn failure(code: Code, message: impl Into<String>) -> Trailers {
    Trailers::new(Err(StatusError::new(code_to_grpc(code), message)))
}

#[cfg(test)]
mod tests;
