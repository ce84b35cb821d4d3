//! Server pushback: `grpc-retry-pushback-ms` (gRPC proposal A6).
//!
//! A server that knows it is overloaded can tell clients when to come back, or not to come
//! back at all. A6 gives the header exact semantics, and stormguard follows them, with one
//! deliberate difference from gRPC C-core:
//!
//! | value | meaning |
//! |---|---|
//! | a non-negative decimal integer `N` | retry after exactly `N` ms; the backoff sequence then restarts |
//! | `"0"` | retry now (C-core waits until the deadline instead; stormguard does not copy that) |
//! | negative, unparseable, empty, or the header repeated | do not retry |
//!
//! The value comes from a peer, so it can only make the client *more* careful: a pushback
//! longer than the time left on the call means no retry at all (see
//! [`retry`](crate::retry)), and a pushback never unlocks a retry that the budget, the
//! attempt limit or the breaker refused.

use std::time::Duration;

/// The header a server sets to push back on retries.
pub const PUSHBACK_HEADER: &str = "grpc-retry-pushback-ms";

/// The largest pushback taken at face value: `i32::MAX` ms, about 24.8 days. A6 defines the
/// header as a signed 32-bit integer, so a larger value is not a valid pushback and parses
/// as [`Pushback::DoNotRetry`], like any other malformed value.
pub const MAX_PUSHBACK_MS: u64 = i32::MAX as u64;

/// What a server's pushback says about retrying.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Pushback {
    /// Retry after exactly this long (possibly zero: retry now).
    RetryAfter(Duration),
    /// Do not retry this call.
    DoNotRetry,
}

impl Pushback {
    /// The header value that encodes this pushback (`"-1"` for [`Pushback::DoNotRetry`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_core::pushback::Pushback;
    ///
    /// assert_eq!(Pushback::RetryAfter(Duration::from_millis(250)).to_header_value(), "250");
    /// assert_eq!(Pushback::DoNotRetry.to_header_value(), "-1");
    /// ```
    pub fn to_header_value(self) -> String {
        match self {
            Pushback::RetryAfter(d) => d.as_millis().min(u128::from(MAX_PUSHBACK_MS)).to_string(),
            Pushback::DoNotRetry => "-1".to_owned(),
        }
    }
}

/// Reads the pushback from every value of the `grpc-retry-pushback-ms` header in a response.
///
/// Returns `None` when the header is absent. Anything but exactly one well-formed
/// non-negative decimal integer means [`Pushback::DoNotRetry`]: a server that sends garbage
/// is not one to hammer.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::pushback::{parse_pushback, Pushback};
///
/// assert_eq!(parse_pushback([b"120".as_slice()]), Some(Pushback::RetryAfter(Duration::from_millis(120))));
/// assert_eq!(parse_pushback([b"0".as_slice()]), Some(Pushback::RetryAfter(Duration::ZERO)));
/// assert_eq!(parse_pushback([b"-1".as_slice()]), Some(Pushback::DoNotRetry));
/// assert_eq!(parse_pushback([b"soon".as_slice()]), Some(Pushback::DoNotRetry));
/// assert_eq!(parse_pushback([b"5".as_slice(), b"5".as_slice()]), Some(Pushback::DoNotRetry));
/// assert_eq!(parse_pushback(std::iter::empty::<&[u8]>()), None);
/// ```
pub fn parse_pushback<'a>(values: impl IntoIterator<Item = &'a [u8]>) -> Option<Pushback> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn one(v: &str) -> Option<Pushback> {
        parse_pushback([v.as_bytes()])
    }

    #[test]
    fn well_formed_values_are_exact() {
        assert_eq!(one("0"), Some(Pushback::RetryAfter(Duration::ZERO)));
        assert_eq!(
            one("1"),
            Some(Pushback::RetryAfter(Duration::from_millis(1)))
        );
        assert_eq!(
            one("007"),
            Some(Pushback::RetryAfter(Duration::from_millis(7)))
        );
        assert_eq!(
            one("2147483647"),
            Some(Pushback::RetryAfter(Duration::from_millis(2_147_483_647)))
        );
    }

    #[test]
    fn values_beyond_a_signed_32_bit_integer_mean_do_not_retry() {
        for v in [
            "2147483648",
            "4294967295",
            "4294967296",
            "99999999999999999999",
        ] {
            assert_eq!(one(v), Some(Pushback::DoNotRetry), "{v}");
        }
        assert_eq!(
            Pushback::RetryAfter(Duration::MAX).to_header_value(),
            "2147483647"
        );
    }

    #[test]
    fn everything_else_means_do_not_retry() {
        for bad in [
            "-1",
            "-0",
            "+5",
            " 5",
            "5 ",
            "5ms",
            "1.5",
            "",
            "abc",
            "4294967296",
            "99999999999999999999999",
            "0x10",
        ] {
            assert_eq!(one(bad), Some(Pushback::DoNotRetry), "value {bad:?}");
        }
        assert_eq!(
            parse_pushback([&[0xff, 0xfe][..]]),
            Some(Pushback::DoNotRetry)
        );
    }

    #[test]
    fn repeated_header_means_do_not_retry() {
        assert_eq!(
            parse_pushback([b"10".as_slice(), b"20".as_slice()]),
            Some(Pushback::DoNotRetry)
        );
    }

    #[test]
    fn absent_header_is_none() {
        assert_eq!(parse_pushback(Vec::<&[u8]>::new()), None);
    }

    proptest! {
        #[test]
        fn any_bytes_parse_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..32)) {
            let _ = parse_pushback([bytes.as_slice()]);
        }

        #[test]
        fn encode_then_parse_round_trips(ms in 0u64..=MAX_PUSHBACK_MS) {
            let p = Pushback::RetryAfter(Duration::from_millis(ms));
            let v = p.to_header_value();
            prop_assert_eq!(parse_pushback([v.as_bytes()]), Some(p));
        }

        #[test]
        fn negative_numbers_never_retry(n in i64::MIN..0) {
            prop_assert_eq!(one(&n.to_string()), Some(Pushback::DoNotRetry));
        }
    }
}
