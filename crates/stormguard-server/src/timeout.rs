//! Reading the caller's `grpc-timeout`.
//!
//! A private decoder: `stormguard_core::deadline` holds the shared one once it lands.
//! Only the admission queue's expiry uses this value, and a malformed header must never
//! fail the call (tonic's own timeout handling ignores it too), so errors read as "no
//! deadline".

use std::time::Duration;

/// The `grpc-timeout` header name.
pub(crate) const GRPC_TIMEOUT: &str = "grpc-timeout";

/// Decodes a `grpc-timeout` value: 1 to 8 ASCII digits and a unit (`H`, `M`, `S`, `m`,
/// `u`, `n`). Anything else is `None`.
pub(crate) fn decode(value: &[u8]) -> Option<Duration> {
    let (unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits
        .iter()
        .fold(0u64, |acc, d| acc * 10 + u64::from(d - b'0'));
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_every_unit() {
        assert_eq!(decode(b"2H"), Some(Duration::from_secs(7200)));
        assert_eq!(decode(b"3M"), Some(Duration::from_secs(180)));
        assert_eq!(decode(b"4S"), Some(Duration::from_secs(4)));
        assert_eq!(decode(b"250m"), Some(Duration::from_millis(250)));
        assert_eq!(
            decode(b"99999999u"),
            Some(Duration::from_micros(99_999_999))
        );
        assert_eq!(decode(b"0n"), Some(Duration::ZERO));
        assert_eq!(
            decode(b"99999999H"),
            Some(Duration::from_secs(99_999_999 * 3600))
        );
    }

    #[test]
    fn malformed_is_no_deadline() {
        for bad in [
            &b""[..],
            b"m",
            b"100",
            b"100ms",
            b"123456789m",
            b"-5m",
            b"+5m",
            b"5 m",
            b"5x",
            b"\xff\xfem",
        ] {
            assert_eq!(decode(bad), None, "{bad:?}");
        }
    }
}
