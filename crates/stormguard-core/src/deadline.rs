//! Deadlines of logical calls and the `grpc-timeout` header.
//!
//! A retry must not get a fresh timeout: the caller waits for the *logical* call, so every
//! attempt carries what is left of the original deadline. This module keeps that deadline
//! ([`Deadline`]) and speaks the header's wire format from the gRPC over HTTP/2 spec:
//! `TimeoutValue TimeoutUnit`, at most 8 ASCII digits followed by one of
//! `H` (hours), `M` (minutes), `S` (seconds), `m` (milliseconds), `u` (microseconds),
//! `n` (nanoseconds).

use std::fmt;
use std::time::Duration;

use crate::Instant;

/// The header that carries a call's timeout.
pub const GRPC_TIMEOUT_HEADER: &str = "grpc-timeout";

/// The largest value the 8 digits allow.
const MAX_VALUE: u64 = 99_999_999;

/// A malformed `grpc-timeout` value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TimeoutError {
    /// The value is empty or has no unit.
    #[error("grpc-timeout is empty or has no unit")]
    Empty,
    /// The digits are missing, not ASCII digits, or more than 8.
    #[error("grpc-timeout must be 1 to 8 ASCII digits followed by a unit, got {0:?}")]
    BadValue(String),
    /// The unit is not one of `H M S m u n`.
    #[error("grpc-timeout unit must be one of H M S m u n, got {0:?}")]
    BadUnit(char),
}

/// Decodes a `grpc-timeout` header value.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::deadline::decode_grpc_timeout;
///
/// assert_eq!(decode_grpc_timeout("250m"), Ok(Duration::from_millis(250)));
/// assert_eq!(decode_grpc_timeout("2S"), Ok(Duration::from_secs(2)));
/// assert!(decode_grpc_timeout("123456789m").is_err()); // 9 digits
/// assert!(decode_grpc_timeout("5x").is_err());
/// ```
pub fn decode_grpc_timeout(value: &str) -> Result<Duration, TimeoutError> {
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
/// use stormguard_core::deadline::{decode_grpc_timeout, encode_grpc_timeout};
///
/// assert_eq!(encode_grpc_timeout(Duration::from_millis(250)).as_str(), "250000u");
/// assert_eq!(encode_grpc_timeout(Duration::from_secs(3600)).as_str(), "3600000m");
/// let d = Duration::from_millis(1234);
/// assert_eq!(decode_grpc_timeout(encode_grpc_timeout(d).as_str()), Ok(d));
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
        .find(|&(v, _)| v <= u128::from(MAX_VALUE))
        .unwrap_or((u128::from(MAX_VALUE), b'H'));
    let mut buf = [0u8; 9];
    let mut digits = [0u8; 8];
    let mut n = value as u64; // value <= MAX_VALUE
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

/// The deadline of a logical call: the instant by which the caller stops waiting.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::{deadline::Deadline, Instant};
///
/// let t0 = Instant::now();
/// let d = Deadline::after_at(t0, Duration::from_millis(500));
/// assert_eq!(d.remaining_at(t0 + Duration::from_millis(200)), Duration::from_millis(300));
/// assert!(d.is_expired_at(t0 + Duration::from_millis(500)));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    /// A deadline at `at`.
    pub fn at(at: Instant) -> Self {
        Deadline { at }
    }

    /// A deadline `timeout` after `now`.
    pub fn after_at(now: Instant, timeout: Duration) -> Self {
        Deadline {
            at: now.checked_add(timeout).unwrap_or(now + MAX_DEADLINE),
        }
    }

    /// A deadline `timeout` from now.
    pub fn after(timeout: Duration) -> Self {
        Self::after_at(Instant::now(), timeout)
    }

    /// The instant of the deadline.
    pub fn instant(self) -> Instant {
        self.at
    }

    /// Time left at `now` (zero once passed).
    pub fn remaining_at(self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }

    /// Time left now.
    pub fn remaining(self) -> Duration {
        self.remaining_at(Instant::now())
    }

    /// Whether the deadline has passed at `now`.
    pub fn is_expired_at(self, now: Instant) -> bool {
        now >= self.at
    }

    /// The `grpc-timeout` value for an attempt sent at `now`, or `None` once expired.
    pub fn grpc_timeout_at(self, now: Instant) -> Option<GrpcTimeout> {
        let left = self.remaining_at(now);
        (!left.is_zero()).then(|| encode_grpc_timeout(left))
    }

    /// The earlier of two deadlines: a deadline from a peer may shorten a local one, never
    /// extend it.
    pub fn min(self, other: Deadline) -> Deadline {
        if other.at < self.at { other } else { self }
    }
}

/// Where a call's deadline came from (see [`resolve_deadline_at`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DeadlineSource {
    /// The caller's own timeout: the request's `grpc-timeout`, from `Request::set_timeout`.
    Caller,
    /// The inbound call this one is made for (the [`CallContext`](crate::context::CallContext)'s deadline).
    Inbound,
    /// The method's own limit (a service config's `timeout`), which caps the others.
    Method,
    /// The layer's default for calls that carry none.
    Layer,
}

/// A call's deadline and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallDeadline {
    /// The instant the caller stops waiting.
    pub at: Instant,
    /// Which of the limits set it.
    pub source: DeadlineSource,
}

/// What a layer knows about a new call's time limits when it starts (the method's own
/// default comes from the method table). The [`RetryController`](crate::retry::RetryController)
/// resolves them: see [`resolve_deadline_at`] and [`CallRetry`](crate::retry::CallRetry).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CallTimes {
    /// The caller's own timeout (the request's `grpc-timeout`, decoded).
    pub caller: Option<Duration>,
    /// The deadline of the inbound call this call is made for, if any.
    pub inbound: Option<Instant>,
    /// The layer's default for calls that carry no deadline.
    pub default: Option<Duration>,
    /// The layer's per-attempt timeout, for methods whose policy sets none.
    pub per_attempt: Option<Duration>,
}

/// The deadline of a call that starts at `now`, in one place for the layer and the
/// simulator: the earliest of the caller's own timeout, the inbound call's deadline and the
/// method's own limit (`method`, a service config's `timeout`: as gRPC specifies, "the
/// actual deadline used will be the minimum of the value specified here and the value set
/// by the application"); when none of them is set, the layer's default. Every limit
/// saturates: `Duration::MAX` means "no practical limit", not a panic. A tie goes to the
/// caller, then to the inbound call (the caller's header is then already what an attempt
/// must say).
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::{Instant, deadline::{resolve_deadline_at, CallTimes, DeadlineSource}};
///
/// let now = Instant::now();
/// let ms = Duration::from_millis;
/// let times = CallTimes { caller: Some(ms(300)), inbound: Some(now + ms(200)), ..CallTimes::default() };
/// let d = resolve_deadline_at(&times, None, now).unwrap();
/// assert_eq!((d.at, d.source), (now + ms(200), DeadlineSource::Inbound));
/// // The service owner's limit caps what the application asked for.
/// let capped = resolve_deadline_at(&times, Some(ms(50)), now).unwrap();
/// assert_eq!((capped.at, capped.source), (now + ms(50), DeadlineSource::Method));
/// let none = CallTimes { default: Some(ms(150)), ..CallTimes::default() };
/// assert_eq!(resolve_deadline_at(&none, None, now).unwrap().source, DeadlineSource::Layer);
/// assert!(resolve_deadline_at(&CallTimes::default(), None, now).is_none());
/// ```
pub fn resolve_deadline_at(
    times: &CallTimes,
    method: Option<Duration>,
    now: Instant,
) -> Option<CallDeadline> {
    let after = |t: Duration| Deadline::after_at(now, t).instant();
    let limits = [
        times.caller.map(|t| (after(t), DeadlineSource::Caller)),
        times.inbound.map(|at| (at, DeadlineSource::Inbound)),
        method.map(|t| (after(t), DeadlineSource::Method)),
    ];
    // `min_by_key` keeps the first of equal keys: the order above breaks ties.
    limits
        .into_iter()
        .flatten()
        .min_by_key(|(at, _)| *at)
        .or_else(|| times.default.map(|t| (after(t), DeadlineSource::Layer)))
        .map(|(at, source)| CallDeadline { at, source })
}

/// The furthest a deadline is ever placed: about a century, so `Instant` arithmetic never
/// overflows.
const MAX_DEADLINE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn decodes_every_unit() {
        assert_eq!(decode_grpc_timeout("1H"), Ok(Duration::from_secs(3600)));
        assert_eq!(decode_grpc_timeout("2M"), Ok(Duration::from_secs(120)));
        assert_eq!(decode_grpc_timeout("3S"), Ok(Duration::from_secs(3)));
        assert_eq!(decode_grpc_timeout("4m"), Ok(Duration::from_millis(4)));
        assert_eq!(decode_grpc_timeout("5u"), Ok(Duration::from_micros(5)));
        assert_eq!(decode_grpc_timeout("6n"), Ok(Duration::from_nanos(6)));
        assert_eq!(
            decode_grpc_timeout("99999999H"),
            Ok(Duration::from_secs(99_999_999 * 3600))
        );
        assert_eq!(decode_grpc_timeout("0m"), Ok(Duration::ZERO));
    }

    #[test]
    fn rejects_malformed_values() {
        assert_eq!(decode_grpc_timeout(""), Err(TimeoutError::Empty));
        assert!(matches!(
            decode_grpc_timeout("m"),
            Err(TimeoutError::BadValue(_))
        ));
        assert!(matches!(
            decode_grpc_timeout("123456789S"),
            Err(TimeoutError::BadValue(_))
        ));
        assert!(matches!(
            decode_grpc_timeout("-1S"),
            Err(TimeoutError::BadValue(_))
        ));
        assert!(matches!(
            decode_grpc_timeout("+1S"),
            Err(TimeoutError::BadValue(_))
        ));
        assert!(matches!(
            decode_grpc_timeout(" 1S"),
            Err(TimeoutError::BadValue(_))
        ));
        assert!(matches!(
            decode_grpc_timeout("1.5S"),
            Err(TimeoutError::BadValue(_))
        ));
        assert_eq!(decode_grpc_timeout("10s"), Err(TimeoutError::BadUnit('s')));
        assert_eq!(decode_grpc_timeout("10é"), Err(TimeoutError::BadUnit('é')));
    }

    #[test]
    fn encodes_in_the_finest_unit_that_fits() {
        assert_eq!(encode_grpc_timeout(Duration::from_nanos(1)).as_str(), "1n");
        assert_eq!(
            encode_grpc_timeout(Duration::from_nanos(99_999_999)).as_str(),
            "99999999n"
        );
        assert_eq!(
            encode_grpc_timeout(Duration::from_nanos(100_000_000)).as_str(),
            "100000u"
        );
        assert_eq!(
            encode_grpc_timeout(Duration::from_millis(1500)).as_str(),
            "1500000u"
        );
        assert_eq!(encode_grpc_timeout(Duration::ZERO).as_str(), "0n");
        assert_eq!(
            encode_grpc_timeout(Duration::from_secs(u64::MAX)).as_str(),
            "99999999H"
        );
    }

    #[test]
    fn coarsening_rounds_up_never_to_zero() {
        // 100 000 000 ns + 1 ns does not fit in ns; in µs it rounds up.
        assert_eq!(
            encode_grpc_timeout(Duration::from_nanos(100_000_001)).as_str(),
            "100001u"
        );
    }

    #[test]
    fn deadline_arithmetic() {
        let t0 = Instant::now();
        let d = Deadline::after_at(t0, Duration::from_millis(100));
        assert_eq!(d.remaining_at(t0), Duration::from_millis(100));
        assert_eq!(d.remaining_at(t0 + Duration::from_secs(1)), Duration::ZERO);
        assert!(!d.is_expired_at(t0 + Duration::from_millis(99)));
        assert!(d.is_expired_at(t0 + Duration::from_millis(100)));
        assert_eq!(
            d.grpc_timeout_at(t0 + Duration::from_millis(40))
                .map(|t| t.to_string()),
            Some("60000000n".to_owned())
        );
        assert_eq!(d.grpc_timeout_at(t0 + Duration::from_millis(100)), None);
        let shorter = Deadline::after_at(t0, Duration::from_millis(10));
        assert_eq!(d.min(shorter), shorter);
        assert_eq!(shorter.min(d), shorter);
        // An absurd timeout from a peer does not overflow.
        let far = Deadline::after_at(t0, Duration::MAX);
        assert!(far.remaining_at(t0) > Duration::from_secs(365 * 24 * 3600));
    }

    proptest! {
        #[test]
        fn decode_never_panics(s in ".{0,16}") {
            let _ = decode_grpc_timeout(&s);
        }

        #[test]
        fn encode_is_well_formed_and_never_shorter(nanos in 0u64..u64::MAX) {
            let d = Duration::from_nanos(nanos);
            let enc = encode_grpc_timeout(d);
            prop_assert!(enc.as_str().len() <= 9);
            let back = decode_grpc_timeout(enc.as_str()).expect("encoder output decodes");
            prop_assert!(back >= d);
            // A coarser unit is chosen only when the finer value passed 8 digits, so rounding
            // up adds less than one part in 10^5.
            prop_assert!(back - d <= d / 100_000 + Duration::from_nanos(1));
        }
    }
}
