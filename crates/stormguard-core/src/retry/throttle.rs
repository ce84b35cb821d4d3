//! Client-side adaptive throttling: refuse calls locally while the dependency refuses
//! most of them anyway.
//!
//! See [`AdaptiveThrottle`](crate::AdaptiveThrottle) for what it does and why.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::ring::{BUCKETS, BucketClock, BucketRing};
use crate::criticality::Criticality;
use crate::error::ConfigError;
use crate::field::check;
use crate::wire::code::{Code, CodeSet};

/// Number of time buckets each class's window is split into: a count is forgotten
/// between `0.9 · window` and `window` after it was recorded.
pub(crate) const WINDOW_BUCKETS: usize = BUCKETS;

const MIN_WINDOW_SECS: u64 = 1;
const MAX_WINDOW_SECS: u64 = 600;
const MAX_K: f64 = 1000.0;

/// Configuration of an [`AdaptiveThrottle`] (stormguard's `adaptive_throttle`).
///
/// Deserializes from an object of these fields, each optional (its default when absent),
/// durations with their unit (`"10s"`), codes by name or number; unknown fields are
/// refused. [`AdaptiveThrottle::new`] validates it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    expecting = "an object of adaptive throttle settings"
)]
pub struct AdaptiveThrottleConfig {
    /// `K` of [`Criticality::Default`] calls: they are refused locally once fewer than
    /// `1/K` of their recent requests were accepted. From 1 to 1000; default 2 (the SRE
    /// book's).
    #[serde(deserialize_with = "crate::field::finite")]
    pub k: f64,
    /// `K` of [`Criticality::Sheddable`] calls. From 1 to `k`; default 1.5.
    #[serde(deserialize_with = "crate::field::finite")]
    pub sheddable_k: f64,
    /// `K` of [`Criticality::Critical`] calls. From `k` to 1000; default 3.
    #[serde(deserialize_with = "crate::field::finite")]
    pub critical_k: f64,
    /// The highest probability of refusing a call locally, so that some calls always go
    /// out as probes and the first accepts bring the probability down. In `[0, 1)`;
    /// default 0.9.
    #[serde(deserialize_with = "crate::field::finite")]
    pub max_reject_probability: f64,
    /// How far back requests and accepts are counted. From 1 s to 600 s; default 10 s.
    #[serde(with = "crate::field::duration")]
    pub window: Duration,
    /// Codes that are a refusal for overload whatever the answer carries. Default
    /// `[RESOURCE_EXHAUSTED]`.
    pub reject_codes: CodeSet,
    /// Codes that are a refusal for overload when the answer says the server shed the
    /// call: it carries `grpc-retry-pushback-ms` or `stormguard-unprocessed: 1` (what a
    /// `ShedLayer` sends when it sheds a call, `UNAVAILABLE`, or drops a queued one whose
    /// deadline came too close, `DEADLINE_EXCEEDED`). Without either, such an answer is
    /// the application's and counts as an accept. Default
    /// `[DEADLINE_EXCEEDED, UNAVAILABLE]`.
    pub shed_codes: CodeSet,
}

impl Default for AdaptiveThrottleConfig {
    fn default() -> Self {
        AdaptiveThrottleConfig {
            k: 2.0,
            sheddable_k: 1.5,
            critical_k: 3.0,
            max_reject_probability: 0.9,
            window: Duration::from_secs(10),
            reject_codes: CodeSet::single(Code::ResourceExhausted),
            shed_codes: CodeSet::from_iter([Code::DeadlineExceeded, Code::Unavailable]),
        }
    }
}

impl AdaptiveThrottleConfig {
    /// Checks every field; the error names the first invalid one
    /// (`adaptive_throttle.k`, `adaptive_throttle.window`, …).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let k_range = |field: &str, value: f64, low: f64, low_name: &str| {
            // Written so that NaN fails.
            if value >= low && value <= MAX_K {
                Ok(())
            } else {
                Err(ConfigError::invalid(
                    format!("adaptive_throttle.{field}"),
                    format!("must be between {low_name} and 1000, got {value}"),
                ))
            }
        };
        k_range("k", self.k, 1.0, "1")?;
        k_range("sheddable_k", self.sheddable_k, 1.0, "1")?;
        if self.sheddable_k > self.k {
            return Err(ConfigError::invalid(
                "adaptive_throttle.sheddable_k",
                format!(
                    "must be at most `k` ({}), so that sheddable calls are refused first, got {}",
                    self.k, self.sheddable_k
                ),
            ));
        }
        k_range("critical_k", self.critical_k, self.k, "`k`")?;
        if !(self.max_reject_probability >= 0.0 && self.max_reject_probability < 1.0) {
            return Err(ConfigError::invalid(
                "adaptive_throttle.max_reject_probability",
                format!(
                    "must be in [0, 1) (at 1 a client that saw only refusals would never \
                     send again), got {}",
                    self.max_reject_probability
                ),
            ));
        }
        check::window_secs(
            "adaptive_throttle.window",
            self.window,
            MIN_WINDOW_SECS,
            MAX_WINDOW_SECS,
        )?;
        for (field, codes) in [
            ("reject_codes", self.reject_codes),
            ("shed_codes", self.shed_codes),
        ] {
            if codes.contains(Code::Ok) {
                return Err(ConfigError::invalid(
                    format!("adaptive_throttle.{field}"),
                    "must not hold OK: an OK is an accept",
                ));
            }
        }
        if self.reject_codes.is_empty() && self.shed_codes.is_empty() {
            return Err(ConfigError::invalid(
                "adaptive_throttle.reject_codes",
                "`reject_codes` and `shed_codes` are both empty: no answer would ever count \
                 as a refusal, and the throttle would never act",
            ));
        }
        Ok(())
    }

    /// The `K` of calls of `class`.
    pub(crate) fn k_for(&self, class: Criticality) -> f64 {
        match class {
            Criticality::Sheddable => self.sheddable_k,
            Criticality::Default => self.k,
            Criticality::Critical => self.critical_k,
        }
    }

    /// Whether an answer with `code` is a refusal for overload; `shed_mark`: the answer
    /// carries `grpc-retry-pushback-ms` or `stormguard-unprocessed: 1`.
    pub(crate) fn is_rejection(&self, code: Code, shed_mark: bool) -> bool {
        self.reject_codes.contains(code) || (shed_mark && self.shed_codes.contains(code))
    }
}

/// A call refused locally by an [`AdaptiveThrottle`].
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error(
    "rejected locally by the adaptive throttle: the dependency has been refusing {} \
     calls for overload (local rejection probability {probability:.2})",
    .class.as_str()
)]
pub struct Throttled {
    /// The class of the call refused.
    pub class: Criticality,
    /// The probability it was refused with.
    pub probability: f64,
}

/// Requests and accepts of one class over the window.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WindowCounts {
    /// Requests: answered attempts and calls refused locally.
    pub requests: u64,
    /// Requests the backend did not refuse for overload.
    pub accepts: u64,
}

/// The adaptive throttle of one dependency; see the [docs](AdaptiveThrottle).
///
/// Clones share one state: one throttle per dependency, shared by every caller of it.
///
/// # Why
///
/// A server that sheds load (stormguard's `ShedLayer`) keeps its goodput under overload
/// only as long as saying "no" is cheap. When rejecting a call costs the server real work
/// (decoding the request, authenticating it, a cache miss before the shed decision), a
/// 10× overload makes the server spend its capacity refusing calls, and goodput falls
/// however well it chooses what to shed. The only cure is for the clients to stop sending
/// what would be refused.
///
/// Google's SRE book ("Handling Overload", client-side throttling) has each client keep,
/// over a recent window, the number of **requests** it attempted and the number of
/// **accepts** (requests the backend did not refuse for overload), and refuse each new
/// request locally with probability
///
/// ```text
/// p = max(0, (requests − K · accepts) / (requests + 1))
/// ```
///
/// While the backend accepts everything, `requests = accepts` and `p` is 0 for any
/// `K ≥ 1`. Once it accepts fewer than `1/K` of the requests, the client starts refusing
/// locally, so that what reaches the backend settles near `K ×` what it accepts: the
/// backend still sees a little more than it takes (it keeps learning how much it can take)
/// without spending most of its time refusing. A request refused locally is counted as a
/// request and not as an accept, as the book does, so refusing feeds itself only as long as
/// the backend keeps refusing too. `K = 2` is the book's default; a lower `K` throttles
/// sooner and harder (less wasted work, slower to notice the backend recover).
///
/// # Why a ceiling
///
/// If `p` could reach 1, a client that saw only refusals would stop sending altogether,
/// and with no calls going out it would never see an accept again: it would learn of the
/// recovery only when the window forgets the overload. [`AdaptiveThrottleConfig::max_reject_probability`]
/// (default 0.9) caps `p`, so at least one call in ten always goes out as a probe and the
/// first accepts bring `p` down at once.
///
/// # Why only overload answers
///
/// The throttle protects a server from the cost of refusing work, so only refusals for
/// overload count against the accepts: by default any `RESOURCE_EXHAUSTED`
/// ([`AdaptiveThrottleConfig::reject_codes`]), and `UNAVAILABLE` or `DEADLINE_EXCEEDED`
/// ([`AdaptiveThrottleConfig::shed_codes`]) when the answer says the server shed the call
/// (it carries a `grpc-retry-pushback-ms`, or `stormguard-unprocessed: 1`: what a
/// `ShedLayer` sends when it sheds a call, or drops a queued one whose deadline came too
/// close). An application error (`NOT_FOUND`, `INVALID_ARGUMENT`, a plain `UNAVAILABLE`
/// from a handler) is an answer the server chose to give after doing the work: refusing
/// the next calls locally would save it nothing.
///
/// An attempt that ran out of time without an answer is a request that was not seen to
/// be accepted, as the book counts it: a request, not an accept
/// ([`record_timeout_at`](AdaptiveThrottle::record_timeout_at)); under overload it is
/// usually a call the server queued until its caller left. An attempt that failed in
/// transport is recorded nowhere: it says nothing about whether the server would take
/// more work (a dead dependency is the circuit breaker's business).
///
/// # Criticality: sheddable first, critical last
///
/// Each [`Criticality`] has a window of its own, as the SRE book advises: a backend that
/// sheds sheddable calls first (as a `ShedLayer` does) and still accepts critical ones
/// must not have the client throttle its critical calls for the sheddable ones' refusals.
/// And each class has its own `K`: [`sheddable_k`](AdaptiveThrottleConfig::sheddable_k)
/// (1.5) ≤ [`k`](AdaptiveThrottleConfig::k) (2) ≤ [`critical_k`](AdaptiveThrottleConfig::critical_k)
/// (3), checked in that order, so at the same counts a sheddable call is refused at least
/// as often as a default one, and a critical one least: sheddable traffic starts being
/// refused once fewer than two thirds of it is accepted, default traffic below one half,
/// critical traffic below one third. Critical calls are throttled too, only later: when
/// the backend refuses even them, sending more of them costs it what it has least of. A
/// service that wants them (almost) never refused sets `critical_k` high (up to 1000).
///
/// # Memory and time
///
/// Each class's window is `WINDOW_BUCKETS` time buckets of two counters over
/// [`window`](AdaptiveThrottleConfig::window) (default 10 s): fixed memory whatever the
/// traffic. Time comes only from the `now` arguments of the `*_at` methods, so tests and the
/// simulator drive it on injected instants; the draw comes from a seeded RNG. The state
/// sits behind a mutex held for a few arithmetic operations per call and per answer.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::{AdaptiveThrottle, AdaptiveThrottleConfig, WindowCounts};
/// use stormguard_core::Code;
/// use stormguard_core::Criticality;
///
/// let throttle = AdaptiveThrottle::new(AdaptiveThrottleConfig::default(), 7)?;
/// let (now, class) = (Instant::now(), Criticality::Default);
/// // The backend accepted 10 calls and shed 30 (UNAVAILABLE with a pushback).
/// for _ in 0..10 {
///     throttle.record_answer_at(class, Code::Ok, false, now);
/// }
/// for _ in 0..30 {
///     throttle.record_answer_at(class, Code::Unavailable, true, now);
/// }
/// // A call is now refused with p = (40 − 2 · 10) / 41.
/// assert_eq!(throttle.counts_at(class, now), WindowCounts { requests: 40, accepts: 10 });
/// // A plain UNAVAILABLE from a handler is an application answer: an accept.
/// throttle.record_answer_at(class, Code::Unavailable, false, now);
/// assert_eq!(throttle.counts_at(class, now), WindowCounts { requests: 41, accepts: 11 });
/// // Ten seconds later the window has forgotten all of it.
/// assert_eq!(throttle.counts_at(class, now + Duration::from_secs(10)), WindowCounts::default());
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct AdaptiveThrottle {
    shared: Arc<Shared>,
}

struct Shared {
    config: AdaptiveThrottleConfig,
    inner: Mutex<Inner>,
}

struct Inner {
    /// Which bucket is current, shared by the three windows.
    clock: BucketClock,
    /// One window per class, by `Criticality` order: (requests, accepts).
    windows: [BucketRing; 3],
    rng: fastrand::Rng,
}

impl fmt::Debug for AdaptiveThrottle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdaptiveThrottle")
            .field("config", &self.shared.config)
            .finish_non_exhaustive()
    }
}

fn slot(class: Criticality) -> usize {
    match class {
        Criticality::Sheddable => 0,
        Criticality::Default => 1,
        Criticality::Critical => 2,
    }
}

impl Inner {
    /// The current bucket index at `now`.
    fn advance(&mut self, now: Instant, width: Duration) -> u64 {
        self.clock.advance(now, width)
    }

    fn counts(&self, class: Criticality, current: u64) -> WindowCounts {
        let [requests, accepts] = self.windows[slot(class)].sums(current);
        WindowCounts { requests, accepts }
    }

    fn record(&mut self, class: Criticality, current: u64, accepted: bool) {
        self.windows[slot(class)].add(current, [true, accepted]);
    }
}

/// The SRE book's formula, capped at `ceiling`.
fn probability(counts: WindowCounts, k: f64, ceiling: f64) -> f64 {
    let requests = counts.requests as f64;
    let p = (requests - k * counts.accepts as f64) / (requests + 1.0);
    p.clamp(0.0, ceiling)
}

impl AdaptiveThrottle {
    /// A throttle with empty windows. `seed` seeds the draw: give each process a different
    /// one.
    pub fn new(config: AdaptiveThrottleConfig, seed: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(AdaptiveThrottle {
            shared: Arc::new(Shared {
                config,
                inner: Mutex::new(Inner {
                    clock: BucketClock::default(),
                    windows: [BucketRing::default(); 3],
                    rng: fastrand::Rng::with_seed(seed),
                }),
            }),
        })
    }

    /// The configuration this throttle was built with.
    pub fn config(&self) -> &AdaptiveThrottleConfig {
        &self.shared.config
    }

    fn width(&self) -> Duration {
        // window ≥ 1 s (validated): the width is ≥ 100 ms.
        self.shared.config.window / WINDOW_BUCKETS as u32
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // Every update is a few plain assignments: a poisoned state is still consistent.
        self.shared
            .inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a call of `class` may be sent at `now`: refused with probability `max(0,
    /// (requests − K · accepts) / (requests + 1))` over the class's window
    /// ([`counts_at`](Self::counts_at)), with its `K`, capped at
    /// [`max_reject_probability`](AdaptiveThrottleConfig::max_reject_probability), drawn
    /// from the seeded RNG. A refused call
    /// is counted as a request (and not an accept); an admitted one is counted when its
    /// answer is recorded ([`record_answer_at`](Self::record_answer_at)).
    pub fn admit_at(&self, class: Criticality, now: Instant) -> Result<(), Throttled> {
        let config = &self.shared.config;
        let width = self.width();
        let mut inner = self.lock();
        let current = inner.advance(now, width);
        let counts = inner.counts(class, current);
        let p = probability(counts, config.k_for(class), config.max_reject_probability);
        // `f64()` is in [0, 1): a probability of 0 never refuses.
        if p > 0.0 && inner.rng.f64() < p {
            inner.record(class, current, false);
            return Err(Throttled {
                class,
                probability: p,
            });
        }
        Ok(())
    }

    /// An attempt of a call of `class` was answered by the server at `now` with `code`
    /// (`Code::Ok` for a success, or for response headers that commit the call);
    /// `shed_mark`: the answer carries `grpc-retry-pushback-ms` or
    /// `stormguard-unprocessed: 1`. Counted as a request, and as an accept unless
    /// `AdaptiveThrottleConfig::is_rejection` says it was refused for overload. Retries
    /// and hedges are requests too. Only answers the server sent are recorded here (an
    /// attempt that timed out goes to [`record_timeout_at`](Self::record_timeout_at), one
    /// that failed in transport nowhere).
    pub fn record_answer_at(&self, class: Criticality, code: Code, shed_mark: bool, now: Instant) {
        let accepted = !self.shared.config.is_rejection(code, shed_mark);
        let width = self.width();
        let mut inner = self.lock();
        let current = inner.advance(now, width);
        inner.record(class, current, accepted);
    }

    /// An attempt of a call of `class` ran out of time at `now` without an answer (its
    /// per-attempt timeout, or the call's deadline): a request, not an accept.
    pub fn record_timeout_at(&self, class: Criticality, now: Instant) {
        let width = self.width();
        let mut inner = self.lock();
        let current = inner.advance(now, width);
        inner.record(class, current, false);
    }

    /// The probability of refusing a call of `class` at `now`: `max(0, (requests − K ·
    /// accepts) / (requests + 1))` over the class's window, with its `K`, capped at
    /// [`max_reject_probability`](AdaptiveThrottleConfig::max_reject_probability).
    #[cfg(test)]
    pub(crate) fn probability_at(&self, class: Criticality, now: Instant) -> f64 {
        let config = &self.shared.config;
        let counts = self.counts_at(class, now);
        probability(counts, config.k_for(class), config.max_reject_probability)
    }

    /// Requests and accepts of `class` in the window at `now`.
    pub fn counts_at(&self, class: Criticality, now: Instant) -> WindowCounts {
        let width = self.width();
        let mut inner = self.lock();
        let current = inner.advance(now, width);
        inner.counts(class, current)
    }
}

#[cfg(test)]
mod tests;
