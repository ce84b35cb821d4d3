//! Circuit breaker: fail fast while a dependency is dead, and probe it back gently.
//!
//! See [`CircuitBreaker`](crate::CircuitBreaker) for what it does and why.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::budget::ring::{BUCKETS, BucketClock, BucketRing};
use crate::error::ConfigError;
use crate::field::check;

/// Number of rolling buckets the sliding window is split into.
///
/// An outcome counts from the moment it is recorded until its bucket rotates out, which
/// happens between `0.9 · window` and `window` later: never longer than the configured
/// window.
pub(crate) const WINDOW_BUCKETS: usize = BUCKETS;

/// Longest accepted [`BreakerConfig::open_for`]: one hour. A breaker that stays open
/// longer than that is an outage switch, not a latency guard.
const MAX_OPEN_FOR: Duration = Duration::from_secs(3600);
const MIN_WINDOW_SECS: u64 = 1;
const MAX_WINDOW_SECS: u64 = 600;
const MAX_OPEN_JITTER: f64 = 10.0;

/// How many of its latest transitions a breaker keeps for its [`TransitionWatch`]es.
pub(crate) const TRANSITION_LOG: usize = 8;

/// Configuration of a [`CircuitBreaker`].
///
/// Deserializes from an object of these fields (stormguard's `breaker`), each optional
/// (its default when absent), durations with their unit (`"5s"`); unknown fields are
/// refused. [`CircuitBreaker::new`] validates it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(
    default,
    deny_unknown_fields,
    expecting = "an object of breaker settings"
)]
pub struct BreakerConfig {
    /// Open when `failures / total` over the window is at least this. In `(0, 1]`;
    /// default `0.5`.
    #[serde(deserialize_with = "crate::field::finite")]
    pub failure_rate: f64,
    /// Length of the sliding window the rate is computed over. From 1 s to 600 s;
    /// default 10 s.
    #[serde(with = "crate::field::duration")]
    pub window: Duration,
    /// Minimum number of outcomes in the window before the breaker may open, so that a
    /// single early failure does not trip it. At least 1; default 20.
    #[serde(deserialize_with = "crate::field::whole")]
    pub min_requests: u32,
    /// Base duration of the open state. Greater than zero and at most one hour;
    /// default 5 s.
    #[serde(with = "crate::field::duration")]
    pub open_for: Duration,
    /// Each open period lasts `open_for · (1 + U[0, open_jitter])`, so that breakers that
    /// opened together do not probe together. In `[0, 10]`; default `0.5`.
    #[serde(deserialize_with = "crate::field::finite")]
    pub open_jitter: f64,
    /// Probes admitted at once in the half-open state, and probe successes needed to
    /// close. At least 1; default 3.
    #[serde(deserialize_with = "crate::field::whole")]
    pub half_open_probes: u32,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        BreakerConfig {
            failure_rate: 0.5,
            window: Duration::from_secs(10),
            min_requests: 20,
            open_for: Duration::from_secs(5),
            open_jitter: 0.5,
            half_open_probes: 3,
        }
    }
}

impl BreakerConfig {
    /// Checks every field; the error names the first invalid one (`breaker.failure_rate`,
    /// `breaker.window`, …).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        // Written so that NaN fails every check.
        check::share("breaker.failure_rate", self.failure_rate, false)?;
        check::window_secs(
            "breaker.window",
            self.window,
            MIN_WINDOW_SECS,
            MAX_WINDOW_SECS,
        )?;
        check::at_least_one("breaker.min_requests", u64::from(self.min_requests))?;
        if self.open_for.is_zero() || self.open_for > MAX_OPEN_FOR {
            return Err(ConfigError::invalid(
                "breaker.open_for",
                format!(
                    "must be greater than zero and at most 1 h, got {:?}",
                    self.open_for
                ),
            ));
        }
        if !(self.open_jitter >= 0.0 && self.open_jitter <= MAX_OPEN_JITTER) {
            return Err(ConfigError::invalid(
                "breaker.open_jitter",
                format!("must be in [0, 10], got {}", self.open_jitter),
            ));
        }
        check::at_least_one("breaker.half_open_probes", u64::from(self.half_open_probes))?;
        Ok(())
    }
}

/// The observable state of a [`CircuitBreaker`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    /// Admitting everything and counting outcomes.
    Closed,
    /// Refusing everything until `until`.
    Open {
        /// When the breaker goes half-open.
        until: Instant,
    },
    /// Admitting a bounded number of probes.
    HalfOpen,
}

impl BreakerState {
    /// `"closed"`, `"open"` or `"half_open"`, for logs and metrics labels.
    pub fn as_str(&self) -> &'static str {
        match self {
            BreakerState::Closed => "closed",
            BreakerState::Open { .. } => "open",
            BreakerState::HalfOpen => "half_open",
        }
    }
}

/// One change of a breaker's state (see [`TransitionWatch`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerTransition {
    /// The state left.
    pub from: BreakerState,
    /// The state entered.
    pub to: BreakerState,
    /// When: the outcome or the request that caused it. An open breaker goes half-open
    /// when it is next asked (an attempt, or [`CircuitBreaker::state_at`]) at or after its
    /// `until`, so `at` is then that moment, not `until`.
    pub at: Instant,
    /// For an opening from closed: `failures / outcomes` over the window that tripped it.
    /// `None` for the other transitions (a failed probe re-opens without a window).
    pub failure_rate: Option<f64>,
}

impl BreakerTransition {
    /// For an opening: how long the breaker stays open (its jittered open period).
    pub fn open_for(&self) -> Option<Duration> {
        match self.to {
            BreakerState::Open { until } => Some(until.saturating_duration_since(self.at)),
            _ => None,
        }
    }
}

/// The breaker refused an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("circuit breaker open; retry after {retry_after:?}")]
pub struct BreakerOpen {
    /// When open: the time left until the breaker goes half-open. When half-open with all
    /// probe slots taken: a hint drawn uniformly from `[0, open_for)` (when a probe
    /// finishes is unknown; spreading the callers that honour the hint keeps them from
    /// coming back together).
    pub retry_after: Duration,
}

/// A circuit breaker; see the [docs](CircuitBreaker).
///
/// Clones share one state: clone it into every task that calls the same dependency.
///
/// # Why a breaker, when there is already a retry budget
///
/// The two pieces answer different questions.
///
/// - The **retry budget** is about *load*: it caps how many extra attempts this process
///   sends, so that retries cannot multiply the traffic on a struggling server. It still
///   lets every *first* attempt through, and each of those waits for its own timeout.
/// - The **breaker** is about *latency*: when the dependency is dead (the failure rate over
///   a sliding window crossed a threshold with enough volume to be meaningful), waiting
///   for yet another timeout helps nobody. The breaker *opens* and refuses attempts at
///   once with [`BreakerOpen`], so callers get an answer in microseconds instead of
///   seconds, and can degrade, serve stale data or report the outage upstream.
///
/// # Why the half-open transition is jittered
///
/// After a fixed open period a classic breaker goes *half-open* and lets a few probe calls
/// through. If 500 pods saw the same outage, they all opened within the same second — and
/// with a fixed open period they would all go half-open and send their probes within the
/// same second too: a synchronised pulse aimed at a service that is just coming back,
/// which is exactly the trigger of a metastable failure. Here each open period lasts
/// `open_for · (1 + U[0, open_jitter])` drawn from a per-breaker seeded RNG, so the fleet's
/// probes are spread over the whole `[open_for, open_for · (1 + open_jitter)]` range; and
/// each breaker admits at most `half_open_probes` probes at once, so even a single process
/// with many concurrent callers sends a bounded trickle.
///
/// # The state machine
///
/// - **Closed** admits everything. Outcomes go into a sliding window of
///   `WINDOW_BUCKETS` rolling buckets; when the window holds at least `min_requests`
///   outcomes and `failures / total ≥ failure_rate`, the breaker opens.
/// - **Open { until }** refuses every attempt with the time left until `until`.
/// - **Half-open** (from `until` on) admits at most `half_open_probes` permits in flight.
///   Once `half_open_probes` probes have succeeded the breaker closes with an empty
///   window; any probe failure re-opens it with a freshly drawn duration.
///
/// Every transition starts a new *generation*, and each [`BreakerPermit`] remembers the
/// generation it was issued in. An outcome reported for an older generation — a slow call
/// that started while closed and finished after the breaker opened, or a probe of an
/// earlier half-open round — is ignored, so it can neither close an open breaker nor
/// re-open a fresh one. Dropping a permit without an outcome (a cancelled call) records
/// nothing and frees its half-open probe slot.
///
/// # Who hears of a transition
///
/// Every transition is recorded as a [`BreakerTransition`] (from, to, when, and for an opening the
/// failure rate that tripped it and how long it stays open), without a logging dependency.
/// A layer that reports them takes a [`TransitionWatch`] ([`CircuitBreaker::watch`]) and
/// calls [`TransitionWatch::take`] where it is convenient (after its calls): the check is one
/// atomic load while nothing changed, and each transition is handed out exactly once per
/// watch, whatever the number of threads taking. The breaker keeps the last
/// `TRANSITION_LOG` transitions; a watch that falls further behind learns how many it
/// missed.
///
/// Time comes only from the `now` arguments of the `*_at` methods (the convenience forms
/// read [`Instant::now`]), so the fleet simulator can drive a breaker on a virtual clock.
/// The state sits behind a [`std::sync::Mutex`] that is held for a handful of arithmetic
/// operations only, never across anything that can block; the breaker is touched once per
/// attempt, so this is not a contention point.
///
/// # Example
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::{BreakerConfig, BreakerState, CircuitBreaker};
///
/// let config = BreakerConfig {
///     min_requests: 4,
///     half_open_probes: 1,
///     ..BreakerConfig::default()
/// };
/// let breaker = CircuitBreaker::new(config, 42)?;
/// let t0 = Instant::now();
///
/// // The dependency is dead: four failures out of four.
/// for _ in 0..4 {
///     let permit = breaker.acquire_at(t0).expect("a closed breaker admits");
///     permit.failure_at(t0);
/// }
///
/// // Now the breaker answers at once instead of letting callers wait for a timeout.
/// let refused = breaker.acquire_at(t0).expect_err("the breaker is open");
/// assert!(refused.retry_after >= Duration::from_secs(5)); // open_for, plus jitter
/// println!("{refused}"); // "circuit breaker open; retry after 6.1s" (for example)
///
/// // When the open period ends, one probe goes through; its success closes the breaker.
/// let later = t0 + refused.retry_after;
/// assert_eq!(breaker.state_at(later), BreakerState::HalfOpen);
/// let probe = breaker.acquire_at(later).expect("a probe is admitted");
/// assert!(breaker.acquire_at(later).is_err(), "only one probe at a time");
/// probe.success_at(later);
/// assert_eq!(breaker.state_at(later), BreakerState::Closed);
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Debug, Clone)]
pub struct CircuitBreaker {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    config: BreakerConfig,
    inner: Mutex<Inner>,
    /// Transitions so far: `Inner::log.recorded`, published for lock-free reading.
    transitions: AtomicU64,
}

impl Shared {
    fn lock(&self) -> Locked<'_> {
        // Nothing inside the critical section can panic, but if a poisoned lock ever
        // appears the state is still consistent: every update is a few plain assignments.
        Locked {
            inner: self.inner.lock().unwrap_or_else(PoisonError::into_inner),
            transitions: &self.transitions,
        }
    }
}

/// The locked state; publishes the transition count when released, so that a
/// [`TransitionWatch`] reads it without the lock.
struct Locked<'a> {
    inner: MutexGuard<'a, Inner>,
    transitions: &'a AtomicU64,
}

impl Deref for Locked<'_> {
    type Target = Inner;

    fn deref(&self) -> &Inner {
        &self.inner
    }
}

impl DerefMut for Locked<'_> {
    fn deref_mut(&mut self) -> &mut Inner {
        &mut self.inner
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        // Still under the lock (the guard is dropped after this), so stores are in order.
        let recorded = self.inner.log.recorded;
        if self.transitions.load(Ordering::Relaxed) != recorded {
            self.transitions.store(recorded, Ordering::Release);
        }
    }
}

/// The latest [`TRANSITION_LOG`] transitions, each with its sequence number.
#[derive(Debug, Default)]
struct TransitionLog {
    /// Transitions ever recorded; the next one's sequence number.
    recorded: u64,
    entries: [Option<(u64, BreakerTransition)>; TRANSITION_LOG],
}

impl TransitionLog {
    fn push(&mut self, transition: BreakerTransition) {
        let seq = self.recorded;
        self.entries[(seq % TRANSITION_LOG as u64) as usize] = Some((seq, transition));
        self.recorded = seq.wrapping_add(1);
    }
}

#[derive(Debug)]
struct Inner {
    state: BreakerState,
    /// Bumped on every transition; permits of another generation are stale.
    generation: u64,
    window: Window,
    probes_in_flight: u32,
    probe_successes: u32,
    rng: fastrand::Rng,
    log: TransitionLog,
}

impl Inner {
    /// Applies the time-driven transition Open → HalfOpen.
    fn refresh(&mut self, now: Instant) {
        if let BreakerState::Open { until } = self.state
            && now >= until
        {
            self.transition(BreakerState::HalfOpen, now, None);
        }
    }

    fn transition(&mut self, state: BreakerState, now: Instant, failure_rate: Option<f64>) {
        self.log.push(BreakerTransition {
            from: self.state,
            to: state,
            at: now,
            failure_rate,
        });
        self.state = state;
        self.generation = self.generation.wrapping_add(1);
        self.probes_in_flight = 0;
        self.probe_successes = 0;
        self.window.reset();
    }

    /// Opens the breaker at `now`; `failure_rate` is the window's when it opens from closed.
    fn trip(&mut self, now: Instant, config: &BreakerConfig, failure_rate: Option<f64>) {
        let factor = 1.0 + self.rng.f64() * config.open_jitter;
        // open_for ≤ 1 h and factor ≤ 11, so this is finite; saturate anyway.
        let open = Duration::try_from_secs_f64(config.open_for.as_secs_f64() * factor)
            .unwrap_or(config.open_for);
        // Only an instant at the very end of the clock's range could overflow; then the
        // best available answer is to skip straight to half-open.
        let until = now.checked_add(open).unwrap_or(now);
        self.transition(BreakerState::Open { until }, now, failure_rate);
    }
}

impl CircuitBreaker {
    /// A closed breaker. `seed` seeds the RNG that jitters the open durations: give each
    /// process (or each simulated client) a different seed so that their probes spread.
    pub fn new(config: BreakerConfig, seed: u64) -> Result<Self, ConfigError> {
        config.validate()?;
        let window = Window::new(config.window);
        Ok(CircuitBreaker {
            shared: Arc::new(Shared {
                config,
                inner: Mutex::new(Inner {
                    state: BreakerState::Closed,
                    generation: 0,
                    window,
                    probes_in_flight: 0,
                    probe_successes: 0,
                    rng: fastrand::Rng::with_seed(seed),
                    log: TransitionLog::default(),
                }),
                transitions: AtomicU64::new(0),
            }),
        })
    }

    /// Asks to make one attempt at `now`. Closed: always granted. Open: refused with the
    /// time left. Half-open: granted while fewer than `half_open_probes` probes are in
    /// flight.
    ///
    /// Report the outcome on the permit ([`BreakerPermit::success_at`] /
    /// [`BreakerPermit::failure_at`]); dropping it records nothing.
    pub fn acquire_at(&self, now: Instant) -> Result<BreakerPermit, BreakerOpen> {
        let config = &self.shared.config;
        let (generation, probe) = {
            let mut inner = self.shared.lock();
            inner.refresh(now);
            match inner.state {
                BreakerState::Closed => (inner.generation, false),
                BreakerState::Open { until } => {
                    return Err(BreakerOpen {
                        retry_after: until.saturating_duration_since(now),
                    });
                }
                BreakerState::HalfOpen => {
                    if inner.probes_in_flight >= config.half_open_probes {
                        let hint = config.open_for.mul_f64(inner.rng.f64());
                        return Err(BreakerOpen { retry_after: hint });
                    }
                    inner.probes_in_flight += 1;
                    (inner.generation, true)
                }
            }
        };
        Ok(BreakerPermit {
            shared: Some(Arc::clone(&self.shared)),
            generation,
            probe,
        })
    }

    #[cfg(test)]
    /// [`acquire_at`](Self::acquire_at) with [`Instant::now`].
    pub(crate) fn acquire(&self) -> Result<BreakerPermit, BreakerOpen> {
        self.acquire_at(Instant::now())
    }

    /// The state at `now` (an open breaker whose time is up reports, and becomes,
    /// half-open).
    pub fn state_at(&self, now: Instant) -> BreakerState {
        let mut inner = self.shared.lock();
        inner.refresh(now);
        inner.state
    }

    #[cfg(test)]
    /// The configuration this breaker was built with.
    pub(crate) fn config(&self) -> &BreakerConfig {
        &self.shared.config
    }

    /// A watch on this breaker's transitions from now on (earlier ones are not handed out).
    /// Each watch hands out every transition once; two watches each hand it out.
    pub fn watch(&self) -> TransitionWatch {
        TransitionWatch {
            shared: Arc::clone(&self.shared),
            seen: AtomicU64::new(self.shared.transitions.load(Ordering::Acquire)),
        }
    }
}

/// Hands out a breaker's transitions, each exactly once (see the [docs](CircuitBreaker)).
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::{BreakerConfig, BreakerState, CircuitBreaker};
///
/// let config = BreakerConfig { min_requests: 2, open_jitter: 0.0, ..BreakerConfig::default() };
/// let breaker = CircuitBreaker::new(config, 1)?;
/// let watch = breaker.watch();
/// let t0 = Instant::now();
/// breaker.acquire_at(t0).expect("closed").failure_at(t0);
/// assert!(watch.take().is_none(), "one failure is below the volume");
/// breaker.acquire_at(t0).expect("closed").failure_at(t0);
///
/// let opened = watch.take().and_then(|mut t| t.next()).expect("it opened");
/// assert_eq!((opened.from, opened.failure_rate), (BreakerState::Closed, Some(1.0)));
/// assert_eq!(opened.open_for(), Some(Duration::from_secs(5)));
/// assert!(watch.take().is_none(), "handed out once");
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
pub struct TransitionWatch {
    shared: Arc<Shared>,
    /// Sequence number of the first transition not handed out yet.
    seen: AtomicU64,
}

impl fmt::Debug for TransitionWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransitionWatch")
            .field("seen", &self.seen.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl TransitionWatch {
    /// The transitions since the last `take` (of any thread), oldest first; `None` when
    /// there are none. While nothing changed this is two atomic loads, without the
    /// breaker's lock.
    pub fn take(&self) -> Option<Transitions> {
        loop {
            let recorded = self.shared.transitions.load(Ordering::Acquire);
            let seen = self.seen.load(Ordering::Acquire);
            if recorded == seen {
                return None;
            }
            if self
                .seen
                .compare_exchange(seen, recorded, Ordering::AcqRel, Ordering::Acquire)
                .is_err()
            {
                continue; // another thread took them first; look again
            }
            // This thread owns the transitions numbered `seen..recorded`; those older than
            // the log's reach are only counted.
            let start = seen.max(recorded.saturating_sub(TRANSITION_LOG as u64));
            let mut taken = Transitions {
                missed: start - seen,
                ..Transitions::default()
            };
            let inner = self.shared.lock();
            for seq in start..recorded {
                match inner.log.entries[(seq % TRANSITION_LOG as u64) as usize] {
                    Some((s, t)) if s == seq => taken.push(t),
                    // Overwritten by transitions recorded since `recorded` was read.
                    _ => taken.missed += 1,
                }
            }
            return Some(taken);
        }
    }
}

/// Transitions handed out by one [`TransitionWatch::take`], oldest first.
#[derive(Debug, Clone, Default)]
pub struct Transitions {
    entries: [Option<BreakerTransition>; TRANSITION_LOG],
    len: usize,
    next: usize,
    missed: u64,
}

impl Transitions {
    fn push(&mut self, t: BreakerTransition) {
        if let Some(slot) = self.entries.get_mut(self.len) {
            *slot = Some(t);
            self.len += 1;
        }
    }

    /// Transitions that happened since the last take but fell out of the breaker's log
    /// (the last 8 transitions) before this one: they are counted here, not handed out.
    pub fn missed(&self) -> u64 {
        self.missed
    }
}

impl Iterator for Transitions {
    type Item = BreakerTransition;

    fn next(&mut self) -> Option<BreakerTransition> {
        if self.next >= self.len {
            return None;
        }
        let t = self.entries[self.next].take();
        self.next += 1;
        t
    }
}

/// Permission for one attempt, issued by [`CircuitBreaker::acquire_at`].
///
/// Consume it with the attempt's outcome. Dropping it without one (the call was cancelled)
/// records nothing and, for a half-open probe, frees the probe slot. Outcomes of permits
/// issued before the breaker's last transition are ignored.
#[must_use = "report the attempt's outcome with success_at/failure_at; dropping the permit records nothing"]
pub struct BreakerPermit {
    /// `None` once the outcome has been applied.
    shared: Option<Arc<Shared>>,
    generation: u64,
    probe: bool,
}

impl fmt::Debug for BreakerPermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BreakerPermit")
            .field("generation", &self.generation)
            .field("probe", &self.probe)
            .field("settled", &self.shared.is_none())
            .finish()
    }
}

#[derive(Clone, Copy)]
enum Outcome {
    Success,
    Failure,
}

impl BreakerPermit {
    /// Whether this permit is one of the half-open state's probes (it holds a probe slot
    /// until it is settled or dropped).
    pub(crate) fn is_probe(&self) -> bool {
        self.probe
    }

    /// The attempt succeeded at `now`.
    pub fn success_at(mut self, now: Instant) {
        self.settle(Some((Outcome::Success, now)));
    }

    /// The attempt failed at `now` (in the way the caller classifies as a dependency
    /// failure).
    pub fn failure_at(mut self, now: Instant) {
        self.settle(Some((Outcome::Failure, now)));
    }

    #[cfg(test)]
    /// [`success_at`](Self::success_at) with [`Instant::now`].
    pub(crate) fn success(self) {
        self.success_at(Instant::now());
    }

    #[cfg(test)]
    /// [`failure_at`](Self::failure_at) with [`Instant::now`].
    pub(crate) fn failure(self) {
        self.failure_at(Instant::now());
    }

    fn settle(&mut self, outcome: Option<(Outcome, Instant)>) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        let config = &shared.config;
        let mut inner = shared.lock();
        if inner.generation != self.generation {
            return; // stale: issued before the last transition
        }
        if self.probe {
            // Same generation as a probe ⇒ still half-open.
            inner.probes_in_flight = inner.probes_in_flight.saturating_sub(1);
            match outcome {
                None => {}
                Some((Outcome::Success, now)) => {
                    inner.probe_successes += 1;
                    if inner.probe_successes >= config.half_open_probes {
                        inner.transition(BreakerState::Closed, now, None);
                    }
                }
                Some((Outcome::Failure, now)) => inner.trip(now, config, None),
            }
        } else if let Some((outcome, now)) = outcome {
            // Same generation as a closed permit ⇒ still closed.
            let (total, failures) = inner
                .window
                .record(now, matches!(outcome, Outcome::Failure));
            let rate = failures as f64 / total as f64;
            if total >= u64::from(config.min_requests) && rate >= config.failure_rate {
                inner.trip(now, config, Some(rate));
            }
        }
    }
}

impl Drop for BreakerPermit {
    fn drop(&mut self) {
        self.settle(None);
    }
}

/// Sliding window of outcomes: one bucket ring of (successes, failures).
#[derive(Debug)]
struct Window {
    bucket_width: Duration,
    clock: BucketClock,
    ring: BucketRing,
}

impl Window {
    fn new(window: Duration) -> Self {
        Window {
            // window ≥ 1 s (validated), so the width is ≥ 100 ms and never zero.
            bucket_width: window / WINDOW_BUCKETS as u32,
            clock: BucketClock::default(),
            ring: BucketRing::default(),
        }
    }

    fn reset(&mut self) {
        self.ring = BucketRing::default();
    }

    /// Records one outcome at `now`; returns `(total, failures)` over the window.
    fn record(&mut self, now: Instant, failed: bool) -> (u64, u64) {
        let current = self.clock.advance(now, self.bucket_width);
        self.ring.add(current, [!failed, failed]);
        let [successes, failures] = self.ring.sums(current);
        (successes + failures, failures)
    }
}

#[cfg(test)]
mod tests;
