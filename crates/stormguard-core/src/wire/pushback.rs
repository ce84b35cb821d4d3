//! Server pushback: `grpc-retry-pushback-ms` (gRPC proposal A6).
//!
//! See [`Pushback`](crate::Pushback) for what it does and why.

use std::time::Duration;

/// What a server's pushback says about retrying.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Pushback;
/// use stormguard_core::{wire::encode_pushback, wire::response_pushback};
///
/// let p = Pushback::RetryAfter(Duration::from_millis(250));
/// let read = response_pushback([encode_pushback(p).as_bytes()], std::iter::empty());
/// assert_eq!(read, Some(p));
/// ```
///
/// A server that knows it is overloaded can tell clients when to come back, or not to come
/// back at all. A6 gives the header exact semantics, and stormguard follows them, with one
/// deliberate difference from gRPC C-core:
///
/// | value | meaning |
/// |---|---|
/// | a non-negative decimal integer `N` | retry after exactly `N` ms; the backoff sequence then restarts |
/// | `"0"` | retry now (C-core waits until the deadline instead; stormguard does not copy that) |
/// | negative, unparseable, empty, above [`MAX_PUSHBACK_MS`], or the header repeated | do not retry |
///
/// The value comes from a peer, so it can only make the client *more* careful: a pushback
/// longer than the time left on the call means no retry at all (see
/// [`RetryController`](crate::RetryController)), and a pushback never unlocks a retry that
/// the budget, the attempt limit or the breaker refused.
///
/// A server may also say when to come back in a `google.rpc.RetryInfo` inside
/// `grpc-status-details-bin` ([`parse_retry_info`]). When an answer carries both, the
/// longer delay wins: pushbacks are ordered by how long they hold the client back
/// (`RetryAfter` by its delay, and `DoNotRetry` above every delay), so the reading is
/// `header.max(retry_info)`, and a peer can only delay a retry with either, never hurry it.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Pushback;
///
/// let short = Some(Pushback::RetryAfter(Duration::from_millis(10)));
/// let long = Some(Pushback::RetryAfter(Duration::from_millis(900)));
/// assert_eq!(short.max(long), long);
/// assert_eq!(long.max(Some(Pushback::DoNotRetry)), Some(Pushback::DoNotRetry));
/// assert_eq!(None.max(short), short);
/// ```
///
/// This module is what a pushback means; reading and writing the header is
/// [`crate::wire`]'s ([`response_pushback`], [`encode_pushback`]).
///
/// [`MAX_PUSHBACK_MS`]: crate::wire::MAX_PUSHBACK_MS
/// [`response_pushback`]: crate::wire::response_pushback
/// [`encode_pushback`]: crate::wire::encode_pushback
/// [`parse_retry_info`]: crate::wire::parse_retry_info
// The order of the variants is the order of `Ord`: keep `DoNotRetry` last.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Pushback {
    /// Retry after exactly this long (possibly zero: retry now).
    RetryAfter(Duration),
    /// Do not retry this call.
    DoNotRetry,
}
