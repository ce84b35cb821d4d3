//! The wire: every header stormguard writes or reads, and the one parser and encoder of
//! each.
//!
//! The client and server layers, the demo, the fuzz targets and the tests all read and
//! write these headers through this module, so a name or a rule for a malformed value is
//! stated once. Every parser takes what a peer sent and never fails the call: a value
//! that cannot be read gets the reading that gives the peer nothing (last column).
//!
//! | header | direction | written by | read by | values | malformed means |
//! |---|---|---|---|---|---|
//! | [`GRPC_TIMEOUT`] | request | `RetryLayer` (what is left of the logical deadline, on every attempt), `ContextInterceptor`, any gRPC client | `ShedLayer` (the deadline of queued work), `RetryLayer` (a timeout the caller set) | 1 to 8 ASCII digits and a unit `H M S m u n` ([`decode_grpc_timeout`]) | no deadline, as tonic reads it |
//! | [`GRPC_PREVIOUS_RPC_ATTEMPTS`] | request | `RetryLayer` on retries, `ContextInterceptor`, any standard gRPC client | `ShedLayer` ([`attempt_class`]) | attempts before this one, decimal; absent or `0` on a first attempt | a retry: a peer cannot buy priority with garbage |
//! | [`X_RETRY_ATTEMPT`] | request | older, non-standard clients (stormguard never sends it) | `ShedLayer`, only when [`GRPC_PREVIOUS_RPC_ATTEMPTS`] is absent | as above | a retry |
//! | [`GRPC_RETRY_PUSHBACK_MS`] | response | `ShedLayer` on a shed answer (`N` ≥ 1, or `-1`); `RetryLayer` and `ShedLayer` (`-1`) on an answer whose retries stormguard refused | `RetryLayer` ([`response_pushback`]) | `N` in `0..=`[`MAX_PUSHBACK_MS`]: retry after exactly `N` ms; `-1`: do not retry (gRPC A6) | do not retry, as is a repeated header |
//! | [`GRPC_STATUS`] | response (trailers-only headers, or trailers) | `ShedLayer`'s own answers ([`encode_grpc_status`]), tonic | `RetryLayer` (how an attempt ended), `ShedLayer` (whether a handler's answer is one clients retry) ([`parse_grpc_status`]) | a code number `0..=16` | `UNKNOWN`, as the gRPC spec asks |
//! | [`GRPC_MESSAGE`] | response | `ShedLayer`'s own answers (fixed texts) | nothing in stormguard | text | — |
//! | [`GRPC_STATUS_DETAILS_BIN`] | response (trailers-only headers, or trailers) | `ShedLayer` with [`AdmissionConfig::retry_info`](crate::AdmissionConfig::retry_info) on its pushback answers (a `google.rpc.Status` with the same code and message and a `google.rpc.RetryInfo` of the pushback's delay), Google's APIs, any server using the rich error model | `RetryLayer` and `Replicas` ([`response_pushback`]): its RetryInfo is a pushback, read with `grpc-retry-pushback-ms` and the longer of the two wins | a `google.rpc.Status`, base64 without padding (padding accepted), at most [`MAX_STATUS_DETAILS_BYTES`] | a Status that cannot be read is ignored; a RetryInfo in it that is malformed, negative or above [`MAX_PUSHBACK_MS`] (or repeated) means do not retry |
//! | [`X_RETRY_BUDGET`] | request | `RetryLayer` inside a request with an allowance (the retries left, on every attempt) | `ShedLayer` with `with_retry_allowance` ([`RequestScope::with_peer_allowance`](crate::context::RequestScope::with_peer_allowance)) | the retries left for the whole logical operation, decimal, at most [`MAX_ALLOWANCE`]; it can lower the server's allowance, never raise it | ignored: the server's own allowance stands |
//! | [`STORMGUARD_UNPROCESSED`] | response (trailers-only headers) | `ShedLayer` on its own answers (shed, shutting down, expired while queued): the handler never ran | `RetryLayer` ([`is_unprocessed`]): a non-idempotent method may be retried, paid and counted as any retry | exactly `1` | processed (the method's idempotency decides) |
//! | [`STORMGUARD_CRITICALITY`] | request | the client's `CriticalityLayer` | `ShedLayer` ([`parse_criticality`], then capped by its table) | exactly `critical`, `default` or `sheddable` | `default` |
//! | [`ENDPOINT_LOAD_METRICS_BIN`] | response (trailers, or trailers-only headers) | `ShedLayer` with `with_load_reports` ([`encode_load_report`]) | `RetryLayer` on every attempt ([`parse_load_report`]): with `with_load_reports` it refuses retries to a saturated server; over `Replicas` it weights the replica that answered | an ORCA `OrcaLoadReport` ([`LoadReport`](crate::LoadReport)), base64 without padding as tonic writes `-bin` keys (padding accepted) | ignored and counted |
//! | [`IDEMPOTENCY_KEY`] | request | `RetryLayer` for methods configured with an idempotency key: one UUID v4 per logical call, the same on every attempt and hedge (a key the caller set is kept) | the server's `IdempotencyLayer` ([`parse_idempotency_key`]): the handler's `IdempotencyKey`, and the key its store deduplicates by | 1 to [`MAX_IDEMPOTENCY_KEY_LEN`] visible ASCII characters (`!` to `~`) | refused: `INVALID_ARGUMENT`, the handler does not run, nothing is stored |
//!
//! The header names are `&str` constants, which is what tonic's metadata and the
//! simulator need. With the `http` feature, `wire::http` has each one as an
//! `http::HeaderName` constant as well, built at compile time: the
//! layers look headers up with those (a lookup by `&str` parses and checks the name again
//! on every call).
//!
//! "Allowance" is the per-request count of retries that [`X_RETRY_BUDGET`] carries; it is
//! not the success-funded [`RetryBudget`](crate::RetryBudget), whatever the
//! header's historical name says.

#[cfg(feature = "http")]
pub(crate) mod body;
pub(crate) mod code;
pub(crate) mod orca;
pub(crate) mod pushback;
pub(crate) mod retry_info;

pub use orca::{MAX_RATE, MAX_REPORT_BYTES, MAX_UTILIZATION, QUEUE_DEPTH, TIME_QUEUED_MS};
pub use retry_info::{
    MAX_STATUS_DETAILS_BYTES, RETRY_INFO_TYPE_URL, StatusDetailsError, encode_retry_info,
    parse_retry_info,
};

use std::fmt;
use std::time::Duration;

use crate::criticality::Criticality;
use code::Code;
use pushback::Pushback;

/// The request header with the call's timeout: `grpc-timeout`.
pub const GRPC_TIMEOUT: &str = "grpc-timeout";
/// The standard request header with the number of attempts of this call made before:
/// `grpc-previous-rpc-attempts` (absent or `0` on a first attempt).
pub const GRPC_PREVIOUS_RPC_ATTEMPTS: &str = "grpc-previous-rpc-attempts";
/// The response header with a server's pushback: `grpc-retry-pushback-ms` (gRPC A6).
pub const GRPC_RETRY_PUSHBACK_MS: &str = "grpc-retry-pushback-ms";
/// The status of a call, in trailers or in a trailers-only response: `grpc-status`.
pub const GRPC_STATUS: &str = "grpc-status";
/// The status message beside [`GRPC_STATUS`]: `grpc-message`.
pub const GRPC_MESSAGE: &str = "grpc-message";
/// The trailer with a call's rich status: `grpc-status-details-bin`, a `google.rpc.Status`
/// (base64 on the wire). stormguard reads the `google.rpc.RetryInfo` among its details as a
/// pushback ([`parse_retry_info`]), and a `ShedLayer` with
/// [`AdmissionConfig::retry_info`](crate::AdmissionConfig::retry_info) writes one.
pub const GRPC_STATUS_DETAILS_BIN: &str = "grpc-status-details-bin";
/// An older, non-standard attempt header, read when [`GRPC_PREVIOUS_RPC_ATTEMPTS`] is
/// absent: `x-retry-attempt`.
pub const X_RETRY_ATTEMPT: &str = "x-retry-attempt";
/// The request header with what is left of a logical operation's retry allowance, from
/// one service to the next: `x-retry-budget: N`, a decimal count of retries.
pub const X_RETRY_BUDGET: &str = "x-retry-budget";
/// The request header with a call's criticality: `stormguard-criticality`.
pub const STORMGUARD_CRITICALITY: &str = "stormguard-criticality";
/// The response header a stormguard server puts on an answer its application never ran
/// (a shed, a shutdown, an expiry in the queue): `stormguard-unprocessed: 1`. A client may
/// then retry even a method that is not idempotent: the server says it did nothing. A peer
/// can use it only to have the client retry a call against itself, which changes no local
/// limit (the budget, the attempts and the deadline still apply).
pub const STORMGUARD_UNPROCESSED: &str = "stormguard-unprocessed";

/// The trailer with a server's load report (gRPC ORCA, gRFC A51):
/// `endpoint-load-metrics-bin`, a binary (`-bin`) key whose value is an
/// `xds.data.orca.v3.OrcaLoadReport`, base64 on the wire (see
/// [`LoadReport`](crate::LoadReport)).
pub const ENDPOINT_LOAD_METRICS_BIN: &str = "endpoint-load-metrics-bin";

/// The request header that carries a logical call's idempotency key: `idempotency-key`
/// (the name of the IETF `Idempotency-Key` draft, lower-cased as HTTP/2 sends it). Every
/// attempt and hedge of one logical call carries the same value, so a server that records
/// the key can answer a retry of a call it already ran with the answer it recorded.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The longest [`IDEMPOTENCY_KEY`] value accepted, in bytes. A UUID is 36; the bound leaves
/// room for a caller's own scheme (a prefix, a hash) and keeps what a peer can make a
/// server store small.
pub const MAX_IDEMPOTENCY_KEY_LEN: usize = 128;

/// Why an [`IDEMPOTENCY_KEY`] value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdempotencyKeyError {
    /// The value is empty.
    #[error("idempotency-key is empty")]
    Empty,
    /// The value is longer than [`MAX_IDEMPOTENCY_KEY_LEN`].
    #[error("idempotency-key is {len} bytes, more than the {max} allowed", max = MAX_IDEMPOTENCY_KEY_LEN)]
    TooLong {
        /// The value's length in bytes.
        len: usize,
    },
    /// A byte is not visible ASCII (`!` to `~`): a space, a control character or non-ASCII.
    #[error("idempotency-key byte {at} is {byte:#04x}, not visible ASCII ('!' to '~')")]
    BadByte {
        /// Its position.
        at: usize,
        /// The byte.
        byte: u8,
    },
    /// The request carries the header more than once.
    #[error("idempotency-key is repeated: a call has one key")]
    Repeated,
}

/// Reads the [`IDEMPOTENCY_KEY`] values of a request: `Ok(None)` when there is none,
/// `Ok(Some(key))` for exactly one well-formed value (1 to [`MAX_IDEMPOTENCY_KEY_LEN`]
/// visible ASCII bytes), else why it is refused. A refused key is never stored nor passed
/// to a handler: the server answers `INVALID_ARGUMENT`. Never panics.
///
/// ```
/// use stormguard_core::{wire::IdempotencyKeyError, wire::parse_idempotency_key};
///
/// let key = "0b5d0b1e-8a3c-4f7e-9d2a-6c1f0e9b7a45";
/// assert_eq!(parse_idempotency_key([key.as_bytes()]), Ok(Some(key)));
/// assert_eq!(parse_idempotency_key(std::iter::empty::<&[u8]>()), Ok(None));
/// assert_eq!(parse_idempotency_key([&b""[..]]), Err(IdempotencyKeyError::Empty));
/// assert!(matches!(parse_idempotency_key([&b"a b"[..]]), Err(IdempotencyKeyError::BadByte { at: 1, .. })));
/// assert!(matches!(parse_idempotency_key([&[b'k'; 129][..]]), Err(IdempotencyKeyError::TooLong { len: 129 })));
/// assert_eq!(parse_idempotency_key([&b"a"[..], &b"a"[..]]), Err(IdempotencyKeyError::Repeated));
/// ```
pub fn parse_idempotency_key<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Option<&'a str>, IdempotencyKeyError> {
    let mut values = values.into_iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(IdempotencyKeyError::Repeated);
    }
    if value.is_empty() {
        return Err(IdempotencyKeyError::Empty);
    }
    if value.len() > MAX_IDEMPOTENCY_KEY_LEN {
        return Err(IdempotencyKeyError::TooLong { len: value.len() });
    }
    if let Some(at) = value.iter().position(|b| !(b'!'..=b'~').contains(b)) {
        return Err(IdempotencyKeyError::BadByte {
            at,
            byte: value[at],
        });
    }
    // Visible ASCII is UTF-8.
    std::str::from_utf8(value)
        .map(Some)
        .map_err(|_| IdempotencyKeyError::BadByte {
            at: 0,
            byte: value[0],
        })
}

/// A generated [`IDEMPOTENCY_KEY`] value: a UUID version 4 in its standard 36-character
/// form (`xxxxxxxx-xxxx-4xxx-yxxx-xxxxxxxxxxxx`, lower-case hex), kept on the stack.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct UuidKey {
    buf: [u8; 36],
}

impl UuidKey {
    /// The header value.
    pub fn as_str(&self) -> &str {
        // Only hex digits and dashes are ever written.
        std::str::from_utf8(&self.buf).unwrap_or("00000000-0000-4000-8000-000000000000")
    }
}

impl fmt::Display for UuidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for UuidKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "UuidKey({})", self.as_str())
    }
}

/// The UUID version 4 (RFC 9562) made of `random`'s bits: 122 of them, with the version
/// (`4`) and variant (`10`) bits set as the RFC asks. The layers draw `random` from their
/// seeded RNG, so a seeded run stamps the same keys.
pub(crate) fn uuid_v4(random: u128) -> UuidKey {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bits = (random & !(0xF << 76) & !(0x3 << 62)) | (0x4 << 76) | (0x2 << 62);
    let mut buf = [b'-'; 36];
    let mut nibble = 0;
    for (i, slot) in buf.iter_mut().enumerate() {
        if matches!(i, 8 | 13 | 18 | 23) {
            continue;
        }
        *slot = HEX[((bits >> (124 - 4 * nibble)) & 0xF) as usize];
        nibble += 1;
    }
    UuidKey { buf }
}

/// Whether a [`STORMGUARD_UNPROCESSED`] value says the call was not run: exactly `1`
/// (anything else, or a repeated header, says nothing).
///
/// ```
/// use stormguard_core::wire::is_unprocessed;
///
/// assert!(is_unprocessed([&b"1"[..]]));
/// assert!(!is_unprocessed([&b"yes"[..]]));
/// assert!(!is_unprocessed([&b"1"[..], &b"1"[..]]));
/// assert!(!is_unprocessed(std::iter::empty::<&[u8]>()));
/// ```
pub fn is_unprocessed<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> bool {
    let mut values = values.into_iter();
    values.next() == Some(b"1") && values.next().is_none()
}

/// The [`GRPC_RETRY_PUSHBACK_MS`] value that says "do not retry".
pub const DO_NOT_RETRY: &str = "-1";

/// The largest [`X_RETRY_BUDGET`] value read from a peer; a larger one is ignored as
/// malformed (no operation needs more retries than this across its services). Also the
/// most a request's allowance ever holds.
pub const MAX_ALLOWANCE: u32 = 1_000;

/// The largest pushback taken at face value: `i32::MAX` ms, about 24.8 days. A6 defines the
/// header as a signed 32-bit integer, so a larger value is not a valid pushback and parses
/// as [`Pushback::DoNotRetry`], like any other malformed value.
pub const MAX_PUSHBACK_MS: u64 = i32::MAX as u64;

/// The largest value the 8 digits of a `grpc-timeout` allow.
const MAX_TIMEOUT_VALUE: u64 = 99_999_999;

/// A malformed `grpc-timeout` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeoutError {
    /// The value is empty or has no unit.
    #[error("grpc-timeout is empty or has no unit")]
    Empty,
    /// The value is not UTF-8, or its digits are missing, not ASCII digits, or more than 8.
    #[error("grpc-timeout must be 1 to 8 ASCII digits followed by a unit, got {0:?}")]
    BadValue(String),
    /// The unit is not one of `H M S m u n`.
    #[error("grpc-timeout unit must be one of H M S m u n, got {0:?}")]
    BadUnit(char),
}

/// Decodes a `grpc-timeout` value as it came off the wire, in the format of the gRPC over
/// HTTP/2 spec: `TimeoutValue TimeoutUnit`, at most 8 ASCII digits followed by one of `H`
/// (hours), `M` (minutes), `S` (seconds), `m` (milliseconds), `u` (microseconds), `n`
/// (nanoseconds). The layers read an error as "no deadline", as tonic does.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::wire::decode_grpc_timeout;
///
/// assert_eq!(decode_grpc_timeout(b"250m"), Ok(Duration::from_millis(250)));
/// assert_eq!(decode_grpc_timeout(b"2S"), Ok(Duration::from_secs(2)));
/// assert!(decode_grpc_timeout(b"123456789m").is_err()); // 9 digits
/// assert!(decode_grpc_timeout(b"5x").is_err());
/// assert!(decode_grpc_timeout(b"250ms").is_err());
/// assert!(decode_grpc_timeout(b"\xff1S").is_err()); // not UTF-8
/// ```
pub fn decode_grpc_timeout(value: &[u8]) -> Result<Duration, TimeoutError> {
    let value = std::str::from_utf8(value)
        .map_err(|_| TimeoutError::BadValue(String::from_utf8_lossy(value).into_owned()))?;
    let unit = value.chars().last().ok_or(TimeoutError::Empty)?;
    let digits = &value[..value.len() - unit.len_utf8()];
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(TimeoutError::BadValue(value.to_owned()));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| TimeoutError::BadValue(value.to_owned()))?;
    Ok(match unit {
        'H' => Duration::from_secs(n * 3600),
        'M' => Duration::from_secs(n * 60),
        'S' => Duration::from_secs(n),
        'm' => Duration::from_millis(n),
        'u' => Duration::from_micros(n),
        'n' => Duration::from_nanos(n),
        other => return Err(TimeoutError::BadUnit(other)),
    })
}

/// An encoded `grpc-timeout` value: at most 8 digits and a unit, kept on the stack.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct GrpcTimeout {
    buf: [u8; 9],
    len: u8,
}

impl GrpcTimeout {
    /// The header value, e.g. `"250m"`.
    pub fn as_str(&self) -> &str {
        // Only ASCII digits and a unit letter are ever written.
        std::str::from_utf8(&self.buf[..usize::from(self.len)]).unwrap_or("0n")
    }
}

impl fmt::Display for GrpcTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl fmt::Debug for GrpcTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GrpcTimeout({:?})", self.as_str())
    }
}

/// Encodes a duration as a `grpc-timeout` value, in the finest unit whose value fits in
/// 8 digits. A value that must be coarsened is rounded *up*, so that a non-zero timeout
/// never becomes zero; durations beyond 99 999 999 hours saturate.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::{wire::decode_grpc_timeout, wire::encode_grpc_timeout};
///
/// assert_eq!(encode_grpc_timeout(Duration::from_millis(250)).as_str(), "250000u");
/// assert_eq!(encode_grpc_timeout(Duration::from_secs(3600)).as_str(), "3600000m");
/// let d = Duration::from_millis(1234);
/// assert_eq!(decode_grpc_timeout(encode_grpc_timeout(d).as_str().as_bytes()), Ok(d));
/// ```
pub fn encode_grpc_timeout(duration: Duration) -> GrpcTimeout {
    let nanos = duration.as_nanos();
    let units: [(u128, u8); 6] = [
        (1, b'n'),
        (1_000, b'u'),
        (1_000_000, b'm'),
        (1_000_000_000, b'S'),
        (60_000_000_000, b'M'),
        (3_600_000_000_000, b'H'),
    ];
    let (value, unit) = units
        .iter()
        .map(|&(per, unit)| (nanos.div_ceil(per), unit))
        .find(|&(v, _)| v <= u128::from(MAX_TIMEOUT_VALUE))
        .unwrap_or((u128::from(MAX_TIMEOUT_VALUE), b'H'));
    let mut buf = [0u8; 9];
    let mut digits = [0u8; 8];
    let mut n = value as u64; // value <= MAX_TIMEOUT_VALUE
    let mut len = 0;
    loop {
        digits[len] = b'0' + (n % 10) as u8;
        len += 1;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    for i in 0..len {
        buf[i] = digits[len - 1 - i];
    }
    buf[len] = unit;
    GrpcTimeout {
        buf,
        len: (len + 1) as u8,
    }
}

/// Reads the pushback from every value of the `grpc-retry-pushback-ms` header in a response.
///
/// Returns `None` when the header is absent. Anything but exactly one well-formed
/// non-negative decimal integer of at most [`MAX_PUSHBACK_MS`] means
/// [`Pushback::DoNotRetry`]: a server that sends garbage is not one to hammer. What each
/// reading means for the retry is [`Pushback`](crate::Pushback)'s.
pub(crate) fn parse_pushback<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<Pushback> {
    let mut values = values.into_iter();
    let first = values.next()?;
    if values.next().is_some() {
        return Some(Pushback::DoNotRetry);
    }
    Some(match parse_millis(first) {
        Some(ms) => Pushback::RetryAfter(Duration::from_millis(ms)),
        None => Pushback::DoNotRetry,
    })
}

/// The pushback of a response: its [`GRPC_RETRY_PUSHBACK_MS`] values
/// (exactly one well-formed non-negative decimal integer of at most [`MAX_PUSHBACK_MS`];
/// anything else means [`Pushback::DoNotRetry`]) and its [`GRPC_STATUS_DETAILS_BIN`] values ([`parse_retry_info`]),
/// the longer when both say something. A status detail that cannot be read is ignored.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::{Code, Pushback};
/// use stormguard_core::wire::{encode_retry_info, response_pushback};
///
/// let info = encode_retry_info(Code::Unavailable, "busy", Duration::from_millis(800));
/// let later = Some(Pushback::RetryAfter(Duration::from_millis(800)));
/// assert_eq!(response_pushback([&b"20"[..]], [info.as_bytes()]), later);
/// assert_eq!(response_pushback([&b"-1"[..]], [info.as_bytes()]), Some(Pushback::DoNotRetry));
/// assert_eq!(response_pushback(std::iter::empty(), [info.as_bytes()]), later);
/// assert_eq!(response_pushback([&b"20"[..]], [&b"%%"[..]]), Some(Pushback::RetryAfter(Duration::from_millis(20))));
/// ```
pub fn response_pushback<'a, 'b>(
    pushback_ms: impl IntoIterator<Item = &'a [u8]>,
    status_details: impl IntoIterator<Item = &'b [u8]>,
) -> Option<Pushback> {
    let header = parse_pushback(pushback_ms);
    let retry_info = parse_retry_info(status_details).ok().flatten();
    header.max(retry_info)
}

/// A decimal integer of ASCII digits only (no sign, no spaces, no `+`), at most
/// [`MAX_PUSHBACK_MS`].
fn parse_millis(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 20 {
        return None;
    }
    let mut ms: u64 = 0;
    for &b in value {
        if !b.is_ascii_digit() {
            return None;
        }
        ms = ms.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    (ms <= MAX_PUSHBACK_MS).then_some(ms)
}

/// The `grpc-retry-pushback-ms` value that encodes `pushback`: whole milliseconds (at most
/// [`MAX_PUSHBACK_MS`]), or [`DO_NOT_RETRY`].
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Pushback;
/// use stormguard_core::wire::encode_pushback;
///
/// assert_eq!(encode_pushback(Pushback::RetryAfter(Duration::from_millis(250))), "250");
/// assert_eq!(encode_pushback(Pushback::DoNotRetry), "-1");
/// ```
pub fn encode_pushback(pushback: Pushback) -> String {
    match pushback {
        Pushback::RetryAfter(d) => d.as_millis().min(u128::from(MAX_PUSHBACK_MS)).to_string(),
        Pushback::DoNotRetry => DO_NOT_RETRY.to_owned(),
    }
}

/// Whether a call is a first attempt or a retry, as the client declared it
/// ([`attempt_class`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptClass {
    /// The first attempt of a logical call (no attempt header, or a value of 0).
    First,
    /// A retry (a positive value), or a call whose attempt header could not be read.
    Retry,
}

impl AttemptClass {
    /// `"first"` or `"retry"`, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptClass::First => "first",
            AttemptClass::Retry => "retry",
        }
    }
}

/// Classifies a call from its `grpc-previous-rpc-attempts` value and, when that header
/// is absent, its `x-retry-attempt` value (the number of retries before this one; an
/// older convention, read the same way).
///
/// Values are decimal digits, surrounding ASCII whitespace ignored. All-zero digits
/// mean [`AttemptClass::First`]; any other value, including an empty, signed,
/// non-decimal or huge one, means [`AttemptClass::Retry`]. Never panics.
///
/// ```
/// use stormguard_core::{wire::AttemptClass, wire::attempt_class};
///
/// assert_eq!(attempt_class(None, None), AttemptClass::First);
/// assert_eq!(attempt_class(Some(b"0"), None), AttemptClass::First);
/// assert_eq!(attempt_class(Some(b"2"), None), AttemptClass::Retry);
/// assert_eq!(attempt_class(Some(b"two"), None), AttemptClass::Retry);
/// assert_eq!(attempt_class(None, Some(b"1")), AttemptClass::Retry);
/// ```
pub fn attempt_class(
    previous_rpc_attempts: Option<&[u8]>,
    x_retry_attempt: Option<&[u8]>,
) -> AttemptClass {
    match previous_rpc_attempts.or(x_retry_attempt) {
        None => AttemptClass::First,
        Some(value) => attempt_class_of_value(value),
    }
}

/// Classifies one attempt header value (see [`attempt_class`]).
pub(crate) fn attempt_class_of_value(value: &[u8]) -> AttemptClass {
    let value = value.trim_ascii();
    if !value.is_empty() && value.iter().all(|b| *b == b'0') {
        AttemptClass::First
    } else {
        AttemptClass::Retry
    }
}

/// Reads an `x-retry-budget` value, the retries a peer allows the rest of the request:
/// ASCII decimal digits (surrounding spaces allowed), at most [`MAX_ALLOWANCE`]. Anything
/// else (empty, a sign, a fraction, a larger number) is `None`: it is ignored, never an
/// error the request fails with.
pub(crate) fn parse_allowance(value: &[u8]) -> Option<u32> {
    let digits = value.trim_ascii();
    if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    u32::try_from(n).ok().filter(|n| *n <= MAX_ALLOWANCE)
}

/// The criticality a call claims in its `stormguard-criticality` value: missing or
/// malformed is [`Criticality::Default`] (only the exact lowercase tokens `critical`,
/// `default` and `sheddable` count). Never panics. This is the peer's *claim*; a server
/// caps it with [`CriticalityTable::resolve`](crate::CriticalityTable::resolve).
///
/// ```
/// use stormguard_core::Criticality;
/// use stormguard_core::wire::parse_criticality;
///
/// assert_eq!(parse_criticality(Some(b"sheddable")), Criticality::Sheddable);
/// assert_eq!(parse_criticality(Some(b"CRITICAL")), Criticality::Default);
/// assert_eq!(parse_criticality(None), Criticality::Default);
/// ```
pub fn parse_criticality(value: Option<&[u8]>) -> Criticality {
    value.and_then(Criticality::from_value).unwrap_or_default()
}

/// The code a `grpc-status` value carries: a decimal code number (surrounding whitespace
/// aside). A value that is not a valid code reads as [`Code::Unknown`], as the gRPC spec
/// asks.
///
/// ```
/// use stormguard_core::Code;
/// use stormguard_core::wire::parse_grpc_status;
///
/// assert_eq!(parse_grpc_status(b"14"), Code::Unavailable);
/// assert_eq!(parse_grpc_status(b"99"), Code::Unknown);
/// assert_eq!(parse_grpc_status(b"UNAVAILABLE"), Code::Unknown);
/// ```
pub fn parse_grpc_status(value: &[u8]) -> Code {
    // Every answer carries one: the usual forms, one or two digits, read without the parser.
    let digit = |b: u8| b.is_ascii_digit().then(|| i32::from(b - b'0'));
    let number = match *value {
        [a] => digit(a),
        [a, b] => digit(a).zip(digit(b)).map(|(a, b)| a * 10 + b),
        _ => None,
    };
    if let Some(n) = number {
        return Code::from_i32(n).unwrap_or(Code::Unknown);
    }
    std::str::from_utf8(value)
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .and_then(Code::from_i32)
        .unwrap_or(Code::Unknown)
}

/// The `grpc-status` value of `code`: its number, as a static string.
///
/// ```
/// use stormguard_core::Code;
/// use stormguard_core::wire::encode_grpc_status;
///
/// assert_eq!(encode_grpc_status(Code::Unavailable), "14");
/// ```
pub fn encode_grpc_status(code: Code) -> &'static str {
    match code {
        Code::Ok => "0",
        Code::Cancelled => "1",
        Code::Unknown => "2",
        Code::InvalidArgument => "3",
        Code::DeadlineExceeded => "4",
        Code::NotFound => "5",
        Code::AlreadyExists => "6",
        Code::PermissionDenied => "7",
        Code::ResourceExhausted => "8",
        Code::FailedPrecondition => "9",
        Code::Aborted => "10",
        Code::OutOfRange => "11",
        Code::Unimplemented => "12",
        Code::Internal => "13",
        Code::Unavailable => "14",
        Code::DataLoss => "15",
        Code::Unauthenticated => "16",
    }
}

/// The base64 of `-bin` metadata as tonic writes it (no padding) and reads it (padding
/// or none).
const BIN_BASE64: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

/// Reads an [`ENDPOINT_LOAD_METRICS_BIN`] value as it came off the wire: `None` when the
/// header is absent, else the report or why it is ignored (a repeated header, more than
/// [`MAX_REPORT_BYTES`], not base64, not the message, or a
/// field out of range: every number finite and non-negative, utilizations at most
/// [`MAX_UTILIZATION`], rates at most [`MAX_RATE`], named metrics and request costs finite).
///
/// ```
/// use stormguard_core::{LoadReportError, OrcaLoadReport};
/// use stormguard_core::{wire::encode_load_report, wire::parse_load_report};
///
/// let sent = OrcaLoadReport { application_utilization: 0.5, rps_fractional: 20.0, ..Default::default() };
/// let value = encode_load_report(&sent);
/// let read = parse_load_report([value.as_bytes()]).unwrap().unwrap();
/// assert_eq!((read.utilization, read.rps), (0.5, 20.0));
/// assert_eq!(parse_load_report([&b"%%%"[..]]), Some(Err(LoadReportError::Base64)));
/// assert_eq!(parse_load_report(std::iter::empty::<&[u8]>()), None);
/// ```
pub fn parse_load_report<'a>(
    values: impl IntoIterator<Item = &'a [u8]>,
) -> Option<Result<orca::LoadReport, orca::LoadReportError>> {
    use crate::wire::MAX_REPORT_BYTES;
    use base64::Engine as _;
    use orca::{LoadReport, LoadReportError};

    let mut values = values.into_iter();
    let value = values.next()?;
    if values.next().is_some() {
        return Some(Err(LoadReportError::Repeated));
    }
    Some((|| {
        // Base64 is 4 characters for 3 bytes: a longer value cannot decode to less.
        if value.len() > MAX_REPORT_BYTES.div_ceil(3) * 4 {
            return Err(LoadReportError::Oversize);
        }
        let bytes = BIN_BASE64
            .decode(value)
            .map_err(|_| LoadReportError::Base64)?;
        LoadReport::decode(&bytes)
    })())
}

/// Encodes a load report as an [`ENDPOINT_LOAD_METRICS_BIN`] value: the message's bytes in
/// base64 without padding, as tonic encodes `-bin` metadata.
pub fn encode_load_report(report: &orca::OrcaLoadReport) -> String {
    use base64::Engine as _;
    use prost::Message as _;
    BIN_BASE64.encode(report.encode_to_vec())
}

/// The header names as [`http::HeaderName`](::http::HeaderName) constants, and the
/// "do not retry" pushback as a [`HeaderValue`](::http::HeaderValue) (feature `http`).
///
/// ```
/// use stormguard_core::{wire, wire::http};
///
/// let mut headers = ::http::HeaderMap::new();
/// headers.insert(http::GRPC_RETRY_PUSHBACK_MS, http::DO_NOT_RETRY);
/// assert_eq!(headers[wire::GRPC_RETRY_PUSHBACK_MS], wire::DO_NOT_RETRY);
/// ```
#[cfg(feature = "http")]
pub mod http {
    use ::http::{HeaderMap, HeaderName, HeaderValue};

    /// The first value of each of `names` in `headers` (what [`HeaderMap::get`] gives for
    /// each), found in one pass over the map.
    ///
    /// A call's headers are a handful, and both layers read several names from each:
    /// comparing them in one pass costs less than hashing every name for a lookup.
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue};
    /// use stormguard_core::wire::http::{GRPC_STATUS, GRPC_TIMEOUT, first_values};
    ///
    /// let mut headers = HeaderMap::new();
    /// headers.insert(GRPC_STATUS, HeaderValue::from_static("14"));
    /// let [status, timeout] = first_values(&headers, [&GRPC_STATUS, &GRPC_TIMEOUT]);
    /// assert_eq!(status.map(HeaderValue::as_bytes), Some(&b"14"[..]));
    /// assert_eq!(timeout, None);
    /// ```
    pub fn first_values<'a, const N: usize>(
        headers: &'a HeaderMap,
        names: [&HeaderName; N],
    ) -> [Option<&'a HeaderValue>; N] {
        let mut found = [None; N];
        let mut left = N;
        // A name's values follow one another, its first first: the first seen is `get`'s.
        for (name, value) in headers {
            if let Some(i) = names.iter().position(|n| *n == name)
                && found[i].is_none()
            {
                found[i] = Some(value);
                left -= 1;
                if left == 0 {
                    break;
                }
            }
        }
        found
    }

    /// The code of the `grpc-status` in `headers` (a trailers-only answer's headers, or
    /// trailers), `None` without one. A value that is not a valid code reads as `UNKNOWN`,
    /// as the gRPC spec asks ([`parse_grpc_status`](super::parse_grpc_status)).
    ///
    /// ```
    /// use http::{HeaderMap, HeaderValue};
    /// use stormguard_core::Code;
    /// use stormguard_core::wire::http::{GRPC_STATUS, grpc_status};
    ///
    /// let mut headers = HeaderMap::new();
    /// assert_eq!(grpc_status(&headers), None);
    /// headers.insert(GRPC_STATUS, HeaderValue::from_static("14"));
    /// assert_eq!(grpc_status(&headers), Some(Code::Unavailable));
    /// ```
    #[inline]
    pub fn grpc_status(headers: &HeaderMap) -> Option<crate::Code> {
        // A static, not the `const`: a `const` name is built and dropped at every use, and
        // both layers read every answer.
        static STATUS: HeaderName = GRPC_STATUS;
        let [status] = first_values(headers, [&STATUS]);
        status.map(|v| super::parse_grpc_status(v.as_bytes()))
    }

    /// [`super::GRPC_TIMEOUT`].
    pub const GRPC_TIMEOUT: HeaderName = HeaderName::from_static(super::GRPC_TIMEOUT);
    /// [`super::GRPC_PREVIOUS_RPC_ATTEMPTS`].
    pub const GRPC_PREVIOUS_RPC_ATTEMPTS: HeaderName =
        HeaderName::from_static(super::GRPC_PREVIOUS_RPC_ATTEMPTS);
    /// [`super::GRPC_RETRY_PUSHBACK_MS`].
    pub const GRPC_RETRY_PUSHBACK_MS: HeaderName =
        HeaderName::from_static(super::GRPC_RETRY_PUSHBACK_MS);
    /// [`super::GRPC_STATUS`].
    pub const GRPC_STATUS: HeaderName = HeaderName::from_static(super::GRPC_STATUS);
    /// [`super::GRPC_MESSAGE`].
    pub const GRPC_MESSAGE: HeaderName = HeaderName::from_static(super::GRPC_MESSAGE);
    /// [`super::GRPC_STATUS_DETAILS_BIN`].
    pub const GRPC_STATUS_DETAILS_BIN: HeaderName =
        HeaderName::from_static(super::GRPC_STATUS_DETAILS_BIN);
    /// [`super::X_RETRY_ATTEMPT`].
    pub const X_RETRY_ATTEMPT: HeaderName = HeaderName::from_static(super::X_RETRY_ATTEMPT);
    /// [`super::X_RETRY_BUDGET`].
    pub const X_RETRY_BUDGET: HeaderName = HeaderName::from_static(super::X_RETRY_BUDGET);
    /// [`super::STORMGUARD_CRITICALITY`].
    pub const STORMGUARD_CRITICALITY: HeaderName =
        HeaderName::from_static(super::STORMGUARD_CRITICALITY);
    /// [`super::STORMGUARD_UNPROCESSED`].
    pub const STORMGUARD_UNPROCESSED: HeaderName =
        HeaderName::from_static(super::STORMGUARD_UNPROCESSED);
    /// [`super::ENDPOINT_LOAD_METRICS_BIN`].
    pub const ENDPOINT_LOAD_METRICS_BIN: HeaderName =
        HeaderName::from_static(super::ENDPOINT_LOAD_METRICS_BIN);
    /// [`super::IDEMPOTENCY_KEY`].
    pub const IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static(super::IDEMPOTENCY_KEY);
    /// `1`, the [`super::STORMGUARD_UNPROCESSED`] value.
    pub const UNPROCESSED: HeaderValue = HeaderValue::from_static("1");
    /// [`super::DO_NOT_RETRY`], the [`GRPC_RETRY_PUSHBACK_MS`] value that says "do not
    /// retry".
    pub const DO_NOT_RETRY: HeaderValue = HeaderValue::from_static(super::DO_NOT_RETRY);
}

#[cfg(test)]
mod tests;
