//! Deadlines of logical calls.
//!
//! See [`Deadline`](crate::Deadline) for what it does and why.

use std::time::Duration;

use tokio::time::Instant;

#[cfg(test)]
use crate::wire::{GrpcTimeout, encode_grpc_timeout};

/// The deadline of a logical call: the instant by which the caller stops waiting.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::{Deadline, Instant};
///
/// let t0 = Instant::now();
/// let d = Deadline::after_at(t0, Duration::from_millis(500));
/// assert_eq!(d.instant(), t0 + Duration::from_millis(500));
/// ```
///
/// A retry must not get a fresh timeout: the caller waits for the *logical* call, so every
/// attempt carries what is left of the original deadline. This module keeps that deadline
/// ([`Deadline`]); the `grpc-timeout` header that carries it from hop to hop is
/// [`crate::wire`]'s ([`decode_grpc_timeout`](crate::wire::decode_grpc_timeout),
/// `encode_grpc_timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Deadline {
    at: Instant,
}

impl Deadline {
    /// A deadline `timeout` after `now`. A timeout past the clock's range is "no practical
    /// limit", never a panic: the deadline goes about a century after `now`, or as far as
    /// the clock reaches when even that is past it.
    pub fn after_at(now: Instant, timeout: Duration) -> Self {
        if let Some(at) = now.checked_add(timeout) {
            return Deadline { at };
        }
        let mut timeout = MAX_DEADLINE;
        loop {
            // Halving ends: `now + 0` is `now`.
            match now.checked_add(timeout) {
                Some(at) => return Deadline { at },
                None => timeout /= 2,
            }
        }
    }

    /// A deadline `timeout` from now.
    pub(crate) fn after(timeout: Duration) -> Self {
        Self::after_at(Instant::now(), timeout)
    }

    /// The instant of the deadline.
    pub fn instant(self) -> Instant {
        self.at
    }

    /// Time left at `now` (zero once passed).
    #[cfg(test)]
    pub(crate) fn remaining_at(self, now: Instant) -> Duration {
        self.at.saturating_duration_since(now)
    }

    /// Whether the deadline has passed at `now`.
    #[cfg(test)]
    pub(crate) fn is_expired_at(self, now: Instant) -> bool {
        now >= self.at
    }

    #[cfg(test)]
    /// The `grpc-timeout` value for an attempt sent at `now`, or `None` once expired.
    pub(crate) fn grpc_timeout_at(self, now: Instant) -> Option<GrpcTimeout> {
        let left = self.remaining_at(now);
        (!left.is_zero()).then(|| encode_grpc_timeout(left))
    }

    #[cfg(test)]
    /// The earlier of two deadlines: a deadline from a peer may shorten a local one, never
    /// extend it.
    pub(crate) fn min(self, other: Deadline) -> Deadline {
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
/// default comes from the method table). The [`RetryController`](crate::RetryController)
/// resolves them: see [`resolve_deadline_at`] and [`CallRetry`](crate::CallRetry).
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
/// use stormguard_core::{Instant, resolve_deadline_at, CallTimes, DeadlineSource};
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
    // The earliest of the three; of equal ones the first in this order (every call resolves
    // one: plain comparisons, not an iterator over them).
    let mut earliest = times.caller.map(|t| CallDeadline {
        at: after(t),
        source: DeadlineSource::Caller,
    });
    let candidates = [
        times.inbound.map(|at| (at, DeadlineSource::Inbound)),
        method.map(|t| (after(t), DeadlineSource::Method)),
    ];
    for (at, source) in candidates.into_iter().flatten() {
        if earliest.is_none_or(|e| at < e.at) {
            earliest = Some(CallDeadline { at, source });
        }
    }
    earliest.or_else(|| {
        times.default.map(|t| CallDeadline {
            at: after(t),
            source: DeadlineSource::Layer,
        })
    })
}

/// Where a deadline goes when its timeout is past the clock's range: about a century, so
/// later `Instant` arithmetic on it does not overflow.
const MAX_DEADLINE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

#[cfg(test)]
mod tests;
