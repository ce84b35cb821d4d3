//! `google.rpc.RetryInfo` in `grpc-status-details-bin`: the pushback of Google's APIs and
//! other gRPC servers that use the richer error model.
//!
//! Those servers tell a client when to come back in a `google.rpc.Status` whose `details`
//! hold a `google.rpc.RetryInfo`, rather than (or beside) `grpc-retry-pushback-ms`. A
//! client that reads only the header would retry such a server on its own backoff, sooner
//! than it asked. The messages here are the fields of the published protos that are
//! needed, with the same numbers and types, so no generated code is required.
//!
//! ```
//! use std::time::Duration;
//! use stormguard_core::{Code, Pushback};
//! use stormguard_core::{wire::encode_retry_info, wire::parse_retry_info};
//!
//! let value = encode_retry_info(Code::Unavailable, "busy", Duration::from_millis(300));
//! assert_eq!(
//!     parse_retry_info([value.as_bytes()]),
//!     Ok(Some(Pushback::RetryAfter(Duration::from_millis(300))))
//! );
//! ```

use std::time::Duration;

use super::code::Code;
use super::pushback::Pushback;
use super::{BIN_BASE64, MAX_PUSHBACK_MS};

/// The type URL of a `google.rpc.RetryInfo` detail.
pub const RETRY_INFO_TYPE_URL: &str = "type.googleapis.com/google.rpc.RetryInfo";

/// The largest `google.rpc.Status` read from [`GRPC_STATUS_DETAILS_BIN`](super::GRPC_STATUS_DETAILS_BIN),
/// in bytes after base64: 16 KiB, the default limit on a whole header list of the HTTP/2
/// client under tonic. A larger one is not read.
pub const MAX_STATUS_DETAILS_BYTES: usize = 16 * 1024;

/// `google.rpc.Status`.
#[derive(Clone, PartialEq, prost::Message)]
struct RpcStatus {
    #[prost(int32, tag = "1")]
    code: i32,
    #[prost(string, tag = "2")]
    message: String,
    #[prost(message, repeated, tag = "3")]
    details: Vec<Any>,
}

/// `google.protobuf.Any`.
#[derive(Clone, PartialEq, prost::Message)]
struct Any {
    #[prost(string, tag = "1")]
    type_url: String,
    #[prost(bytes = "vec", tag = "2")]
    value: Vec<u8>,
}

/// `google.rpc.RetryInfo`.
#[derive(Clone, PartialEq, prost::Message)]
struct RetryInfo {
    #[prost(message, optional, tag = "1")]
    retry_delay: Option<ProtoDuration>,
}

/// `google.protobuf.Duration`.
#[derive(Clone, Copy, PartialEq, prost::Message)]
struct ProtoDuration {
    #[prost(int64, tag = "1")]
    seconds: i64,
    #[prost(int32, tag = "2")]
    nanos: i32,
}

/// Why a [`GRPC_STATUS_DETAILS_BIN`](super::GRPC_STATUS_DETAILS_BIN) value was not read.
/// Such a value says nothing about retrying: tonic lets a server put any bytes there, so
/// the answer is retried (or not) as if it had none.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StatusDetailsError {
    /// The header appeared more than once.
    #[error("grpc-status-details-bin is repeated")]
    Repeated,
    /// The value, or the message it decodes to, is larger than [`MAX_STATUS_DETAILS_BYTES`].
    #[error("grpc-status-details-bin larger than {MAX_STATUS_DETAILS_BYTES} bytes")]
    Oversize,
    /// The value is not base64.
    #[error("grpc-status-details-bin is not base64")]
    Base64,
    /// The bytes are not a `google.rpc.Status`.
    #[error("grpc-status-details-bin is not a google.rpc.Status: {0}")]
    Decode(String),
}

/// Reads the `google.rpc.RetryInfo` in the values of a response's
/// [`GRPC_STATUS_DETAILS_BIN`](super::GRPC_STATUS_DETAILS_BIN) header, as a pushback.
///
/// - `Ok(None)`: no header, or a `Status` without a RetryInfo detail (details of other
///   types are skipped).
/// - `Ok(Some(RetryAfter(d)))`: one RetryInfo whose `retry_delay` is `d`, a valid
///   `Duration` of at most [`MAX_PUSHBACK_MS`] (the bound of `grpc-retry-pushback-ms`).
/// - `Ok(Some(DoNotRetry))`: a RetryInfo that does not decode, has no `retry_delay`, a
///   negative one, `nanos` outside `0..1e9` (or of the wrong sign), one above the bound, or
///   more than one RetryInfo: the rules of a malformed `grpc-retry-pushback-ms`.
/// - `Err(_)`: the value is not a `Status` that can be read ([`StatusDetailsError`]).
///
/// Reads at most [`MAX_STATUS_DETAILS_BYTES`]; never panics.
///
/// ```
/// use stormguard_core::wire::{StatusDetailsError, parse_retry_info};
///
/// assert_eq!(parse_retry_info(std::iter::empty::<&[u8]>()), Ok(None));
/// assert_eq!(parse_retry_info([&b"%%%"[..]]), Err(StatusDetailsError::Base64));
/// ```
pub fn parse_retry_info<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<Pushback>, StatusDetailsError> {
    use base64::Engine as _;
    use prost::Message as _;

    let mut values = values.into_iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(StatusDetailsError::Repeated);
    }
    // Base64 is 4 characters for 3 bytes: a longer value cannot decode to less.
    if value.len() > MAX_STATUS_DETAILS_BYTES.div_ceil(3) * 4 {
        return Err(StatusDetailsError::Oversize);
    }
    let bytes = BIN_BASE64
        .decode(value)
        .map_err(|_| StatusDetailsError::Base64)?;
    if bytes.len() > MAX_STATUS_DETAILS_BYTES {
        return Err(StatusDetailsError::Oversize);
    }
    let status = RpcStatus::decode(bytes.as_slice())
        .map_err(|e| StatusDetailsError::Decode(e.to_string()))?;
    let mut infos = status
        .details
        .iter()
        .filter(|any| any.type_url == RETRY_INFO_TYPE_URL);
    let Some(info) = infos.next() else {
        return Ok(None);
    };
    if infos.next().is_some() {
        return Ok(Some(Pushback::DoNotRetry));
    }
    Ok(Some(
        RetryInfo::decode(info.value.as_slice())
            .ok()
            .and_then(|info| info.retry_delay)
            .and_then(delay)
            .map_or(Pushback::DoNotRetry, Pushback::RetryAfter),
    ))
}

/// A `google.protobuf.Duration` as a delay: `None` when negative, not normalized (`nanos`
/// outside `0..1e9`) or above [`MAX_PUSHBACK_MS`].
fn delay(d: ProtoDuration) -> Option<Duration> {
    let seconds = u64::try_from(d.seconds).ok()?;
    let nanos = u32::try_from(d.nanos).ok().filter(|n| *n < 1_000_000_000)?;
    let delay = Duration::new(seconds.min(MAX_PUSHBACK_MS), nanos);
    (delay <= Duration::from_millis(MAX_PUSHBACK_MS)).then_some(delay)
}

/// The [`GRPC_STATUS_DETAILS_BIN`](super::GRPC_STATUS_DETAILS_BIN) value of a `google.rpc.Status`
/// with `code`, `message` and one RetryInfo detail of `delay` (whole nanoseconds, at most
/// [`MAX_PUSHBACK_MS`]): base64 without padding, as tonic writes `-bin` metadata.
pub fn encode_retry_info(code: Code, message: &str, delay: Duration) -> String {
    use base64::Engine as _;
    use prost::Message as _;

    let delay = delay.min(Duration::from_millis(MAX_PUSHBACK_MS));
    let info = RetryInfo {
        retry_delay: Some(ProtoDuration {
            // At most MAX_PUSHBACK_MS / 1000 seconds and 999 999 999 nanoseconds.
            seconds: i64::try_from(delay.as_secs()).unwrap_or(i64::MAX),
            nanos: i32::try_from(delay.subsec_nanos()).unwrap_or(0),
        }),
    };
    let status = RpcStatus {
        code: code as i32,
        message: message.to_owned(),
        details: vec![Any {
            type_url: RETRY_INFO_TYPE_URL.to_owned(),
            value: info.encode_to_vec(),
        }],
    };
    BIN_BASE64.encode(status.encode_to_vec())
}

#[cfg(test)]
mod tests;
