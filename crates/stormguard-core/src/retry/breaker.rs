//! Circuit breaker: fail fast while a dependency is dead, and probe it back gently.
//!
//! # Why a breaker, when there is already a retry budget
//!
//! The two pieces answer different questions.
//!
//! - The **retry budget** is about *load*: it caps how many extra attempts this process
//!   sends, so that retries cannot multiply the traffic on a struggling server (at 100 %
//!   failure the budget holds the fleet to ~1.1× instead of 3×). It still lets every
//!   *first* attempt through, and each of those waits for its own timeout.
//! - The **breaker** is about *latency*: when the dependency is dead (the failure rate over
//!   a sliding window crossed a threshold with enough volume to be meaningful), waiting
//!   for yet another timeout helps nobody. The breaker *opens* and refuses attempts at
//!   once with [`BreakerOpen`], so callers get an answer in microseconds instead of
//!   seconds, and can degrade, serve stale data or report the outage upstream.
//!
//! # Why the half-open transition is jittered
//!
//! After a fixed open period a classic breaker goes *half-open* and lets a few probe calls
//! through. If 500 pods saw the same outage, they all opened within the same second — and
//! with a fixed open period they would all go half-open and send their probes within the
//! same second too: a synchronised pulse aimed at a service that is just coming back,
//! which is exactly the trigger of a metastable failure. Here each open period lasts
//! `open_for · (1 + U[0, open_jitter])` drawn from a per-breaker seeded RNG, so the fleet's
//! probes are spread over the whole `[open_for, open_for · (1 + open_jitter)]` range; and
//! each breaker admits at most `half_open_probes` probes at once, so even a single process
//! with many concurrent callers sends a bounded trickle.
//!
//! # The state machine
//!
//! - **Closed** admits everything. Outcomes go into a sliding window of
//!   [`WINDOW_BUCKETS`] rolling buckets; when the window holds at least `min_requests`
//!   outcomes and `failures / total ≥ failure_rate`, the breaker opens.
//! - **Open { until }** refuses every attempt with the time left until `until`.
//! - **Half-open** (from `until` on) admits at most `half_open_probes` permits in flight.
//!   Once `half_open_probes` probes have succeeded the breaker closes with an empty
//!   window; any probe failure re-opens it with a freshly drawn duration.
//!
//! Every transition starts a new *generation*, and each [`BreakerPermit`] remembers the
//! generation it was issued in. An outcome reported for an older generation — a slow call
//! that started while closed and finished after the breaker opened, or a probe of an
//! earlier half-open round — is ignored, so it can neither close an open breaker nor
//! re-open a fresh one. Dropping a permit without an outcome (a cancelled call) records
//! nothing and frees its half-open probe slot.
//!
//! # Who hears of a transition
//!
//! Every transition is recorded as a [`Transition`] (from, to, when, and for an opening the
//! failure rate that tripped it and how long it stays open), without a logging dependency.
//! A layer that reports them takes a [`TransitionWatch`] ([`CircuitBreaker::watch`]) and
//! calls [`TransitionWatch::take`] where it is convenient (after its calls): the check is one
//! atomic load while nothing changed, and each transition is handed out exactly once per
//! watch, whatever the number of threads taking. The breaker keeps the last
//! [`TRANSITION_LOG`] transitions; a watch that falls further behind learns how many it
//! missed.
//!
//! Time comes only from the `now` arguments of the `*_at` methods (the convenience forms
//! read [`Instant::now`]), so the fleet simulator can drive a breaker on a virtual clock.
//! The state sits behind a [`std::sync::Mutex`] that is held for a handful of arithmetic
//! operations only, never across anything that can block; the breaker is touched once per
//! attempt, so this is not a contention point.
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stormguard_core::Instant;
//! use stormguard_core::breaker::{BreakerConfig, BreakerState, CircuitBreaker};
//!
//! let config = BreakerConfig {
//!     min_requests: 4,
//!     half_open_probes: 1,
//!     ..BreakerConfig::default()
//! };
//! let breaker = CircuitBreaker::new(config, 42)?;
//! let t0 = Instant::now();
//!
//! // The dependency is dead: four failures out of four.
//! for _ in 0..4 {
//!     let permit = breaker.acquire_at(t0).expect("a closed breaker admits");
//!     permit.failure_at(t0);
//! }
//!
//! // Now the breaker answers at once instead of letting callers wait for a timeout.
//! let refused = breaker.acquire_at(t0).expect_err("the breaker is open");
//! assert!(refused.retry_after >= Duration::from_secs(5)); // open_for, plus jitter
//! println!("{refused}"); // "circuit breaker open; retry after 6.1s" (for example)
//!
//! // When the open period ends, one probe goes through; its success closes the breaker.
//! let later = t0 + refused.retry_after;
//! assert_eq!(breaker.state_at(later), BreakerState::HalfOpen);
//! let probe = breaker.acquire_at(later).expect("a probe is admitted");
//! assert!(breaker.acquire_at(later).is_err(), "only one probe at a time");
//! probe.success_at(later);
//! assert_eq!(breaker.state_at(later), BreakerState::Closed);
//! # Ok::<(), stormguard_core::config::ConfigError>(())
//! ```

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::Instant;
use crate::error::ConfigError;

/// Number of rolling buckets the sliding window is split into.
///
/// An outcome counts from the moment it is recorded until its bucket rotates out, which
/// happens between `0.9 · window` and `window` later: never longer than the configured
/// window.
pub const WINDOW_BUCKETS: usize = 10;

/// Longest accepted [`BreakerConfig::open_for`]: one hour. A breaker that stays open
/// longer than that is an outage switch, not a latency guard.
const MAX_OPEN_FOR: Duration = Duration::from_secs(3600);
const MIN_WINDOW: Duration = Duration::from_secs(1);
const MAX_WINDOW: Duration = Duration::from_secs(600);
const MAX_OPEN_JITTER: f64 = 10.0;

/// How many of its latest transitions a breaker keeps for its [`TransitionWatch`]es.
pub const TRANSITION_LOG: usize = 8;

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
    #[serde(deserialize_with = "crate::config::finite")]
    pub failure_rate: f64,
    /// Length of the sliding window the rate is computed over. From 1 s to 600 s;
    /// default 10 s.
    #[serde(with = "crate::config::duration")]
    pub window: Duration,
    /// Minimum number of outcomes in the window before the breaker may open, so that a
    /// single early failure does not trip it. At least 1; default 20.
    #[serde(deserialize_with = "crate::config::whole")]
    pub min_requests: u32,
    /// Base duration of the open state. Greater than zero and at most one hour;
    /// default 5 s.
    #[serde(with = "crate::config::duration")]
    pub open_for: Duration,
    /// Each open period lasts `open_for · (1 + U[0, open_jitter])`, so that breakers that
    /// opened together do not probe together. In `[0, 10]`; default `0.5`.
    #[serde(deserialize_with = "crate::config::finite")]
    pub open_jitter: f64,
    /// Probes admitted at once in the half-open state, and probe successes needed to
    /// close. At least 1; default 3.
    #[serde(deserialize_with = "crate::config::whole")]
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
    pub fn validate(&self) -> Result<(), ConfigError> {
        // Written so that NaN fails every check.
        if !(self.failure_rate > 0.0 && self.failure_rate <= 1.0) {
            return Err(ConfigError::invalid(
                "breaker.failure_rate",
                format!("must be in (0, 1], got {}", self.failure_rate),
            ));
        }
        if self.window < MIN_WINDOW || self.window > MAX_WINDOW {
            return Err(ConfigError::invalid(
                "breaker.window",
                format!("must be between 1 s and 600 s, got {:?}", self.window),
            ));
        }
        if self.min_requests == 0 {
            return Err(ConfigError::invalid(
                "breaker.min_requests",
                "must be at least 1",
            ));
        }
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
        if self.half_open_probes == 0 {
            return Err(ConfigError::invalid(
                "breaker.half_open_probes",
                "must be at least 1",
            ));
        }
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
pub struct Transition {
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

impl Transition {
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

/// A circuit breaker; see the [module docs](self).
///
/// Clones share one state: clone it into every task that calls the same dependency.
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
    entries: [Option<(u64, Transition)>; TRANSITION_LOG],
}

impl TransitionLog {
    fn push(&mut self, transition: Transition) {
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
        self.log.push(Transition {
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

    /// [`acquire_at`](Self::acquire_at) with [`Instant::now`].
    pub fn acquire(&self) -> Result<BreakerPermit, BreakerOpen> {
        self.acquire_at(Instant::now())
    }

    /// The state at `now` (an open breaker whose time is up reports, and becomes,
    /// half-open).
    pub fn state_at(&self, now: Instant) -> BreakerState {
        let mut inner = self.shared.lock();
        inner.refresh(now);
        inner.state
    }

    /// The configuration this breaker was built with.
    pub fn config(&self) -> &BreakerConfig {
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

/// Hands out a breaker's transitions, each exactly once (see the [module docs](self)).
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::Instant;
/// use stormguard_core::breaker::{BreakerConfig, BreakerState, CircuitBreaker};
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
/// # Ok::<(), stormguard_core::config::ConfigError>(())
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
    entries: [Option<Transition>; TRANSITION_LOG],
    len: usize,
    next: usize,
    missed: u64,
}

impl Transitions {
    fn push(&mut self, t: Transition) {
        if let Some(slot) = self.entries.get_mut(self.len) {
            *slot = Some(t);
            self.len += 1;
        }
    }

    /// Transitions that happened since the last take but fell out of the breaker's log
    /// ([`TRANSITION_LOG`]) before this one: they are counted here, not handed out.
    pub fn missed(&self) -> u64 {
        self.missed
    }
}

impl Iterator for Transitions {
    type Item = Transition;

    fn next(&mut self) -> Option<Transition> {
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
    pub fn is_probe(&self) -> bool {
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

    /// [`success_at`](Self::success_at) with [`Instant::now`].
    pub fn success(self) {
        self.success_at(Instant::now());
    }

    /// [`failure_at`](Self::failure_at) with [`Instant::now`].
    pub fn failure(self) {
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

/// Sliding window of outcomes in [`WINDOW_BUCKETS`] rolling buckets, expired by time.
#[derive(Debug)]
struct Window {
    bucket_width: Duration,
    /// Bucket indices count from the first instant the window saw.
    origin: Option<Instant>,
    /// Newest bucket index seen; time inside the window never runs backwards, so an
    /// outcome reported with a slightly older `now` lands in the newest bucket.
    newest: u64,
    buckets: [Bucket; WINDOW_BUCKETS],
}

#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    index: u64,
    successes: u32,
    failures: u32,
}

impl Window {
    fn new(window: Duration) -> Self {
        Window {
            // window ≥ 1 s (validated), so the width is ≥ 100 ms and never zero.
            bucket_width: window / WINDOW_BUCKETS as u32,
            origin: None,
            newest: 0,
            buckets: [Bucket::default(); WINDOW_BUCKETS],
        }
    }

    fn reset(&mut self) {
        self.buckets = [Bucket::default(); WINDOW_BUCKETS];
    }

    /// Records one outcome at `now`; returns `(total, failures)` over the window.
    fn record(&mut self, now: Instant, failed: bool) -> (u64, u64) {
        let origin = *self.origin.get_or_insert(now);
        let elapsed = now.saturating_duration_since(origin);
        let index = u64::try_from(elapsed.as_nanos() / self.bucket_width.as_nanos().max(1))
            .unwrap_or(u64::MAX);
        self.newest = self.newest.max(index);
        let current = self.newest;

        let bucket = &mut self.buckets[(current % WINDOW_BUCKETS as u64) as usize];
        if bucket.index != current {
            *bucket = Bucket {
                index: current,
                ..Bucket::default()
            };
        }
        if failed {
            bucket.failures = bucket.failures.saturating_add(1);
        } else {
            bucket.successes = bucket.successes.saturating_add(1);
        }

        self.buckets
            .iter()
            .filter(|b| b.index <= current && current - b.index < WINDOW_BUCKETS as u64)
            .fold((0, 0), |(total, failures), b| {
                (
                    total + u64::from(b.successes) + u64::from(b.failures),
                    failures + u64::from(b.failures),
                )
            })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const MS: Duration = Duration::from_millis(1);
    const SEC: Duration = Duration::from_secs(1);

    /// Default config without jitter, so open durations are exact.
    fn exact() -> BreakerConfig {
        BreakerConfig {
            open_jitter: 0.0,
            ..BreakerConfig::default()
        }
    }

    fn breaker(config: BreakerConfig) -> CircuitBreaker {
        CircuitBreaker::new(config, 1).expect("valid config")
    }

    fn record(b: &CircuitBreaker, now: Instant, successes: u32, failures: u32) {
        for _ in 0..successes {
            b.acquire_at(now).expect("admitted").success_at(now);
        }
        for _ in 0..failures {
            b.acquire_at(now).expect("admitted").failure_at(now);
        }
    }

    /// Trips a breaker with the default min volume (20) at `now`.
    fn trip(b: &CircuitBreaker, now: Instant) -> Instant {
        record(b, now, 0, b.config().min_requests);
        match b.state_at(now) {
            BreakerState::Open { until } => until,
            other => panic!("expected open, got {other:?}"),
        }
    }

    #[test]
    fn opens_only_with_min_volume() {
        let b = breaker(exact());
        let t0 = Instant::now();
        record(&b, t0, 0, 19);
        assert_eq!(b.state_at(t0), BreakerState::Closed, "19 < min_requests");
        assert!(b.acquire_at(t0).is_ok());
        record(&b, t0, 0, 1);
        assert_eq!(
            b.state_at(t0),
            BreakerState::Open {
                until: t0 + 5 * SEC
            }
        );
    }

    #[test]
    fn opens_at_the_rate_threshold_and_not_below() {
        let t0 = Instant::now();

        // 9 / 20 = 0.45 < 0.5
        let below = breaker(exact());
        record(&below, t0, 11, 9);
        assert_eq!(below.state_at(t0), BreakerState::Closed);
        // More successes keep it below.
        record(&below, t0, 5, 0);
        assert_eq!(below.state_at(t0), BreakerState::Closed);

        // 10 / 20 = 0.5 exactly: opens on the 20th outcome.
        let at = breaker(exact());
        record(&at, t0, 10, 9);
        assert_eq!(at.state_at(t0), BreakerState::Closed);
        record(&at, t0, 0, 1);
        assert!(matches!(at.state_at(t0), BreakerState::Open { .. }));

        // Volume reached by a success while the rate is over: opens too.
        let by_success = breaker(exact());
        record(&by_success, t0, 0, 19);
        record(&by_success, t0, 1, 0);
        assert!(matches!(by_success.state_at(t0), BreakerState::Open { .. }));

        // A custom threshold: 0.3 with 3 / 10 opens, 2 / 10 does not.
        let cfg = BreakerConfig {
            failure_rate: 0.3,
            min_requests: 10,
            ..exact()
        };
        let b = breaker(cfg.clone());
        record(&b, t0, 8, 2);
        assert_eq!(b.state_at(t0), BreakerState::Closed);
        let b = breaker(cfg);
        record(&b, t0, 7, 3);
        assert!(matches!(b.state_at(t0), BreakerState::Open { .. }));
    }

    #[test]
    fn window_slides_and_old_failures_expire() {
        let t0 = Instant::now();

        // 19 failures, then one more half a window later: all still in the window.
        let b = breaker(exact());
        record(&b, t0, 0, 19);
        record(&b, t0 + 5 * SEC, 0, 1);
        assert!(matches!(
            b.state_at(t0 + 5 * SEC),
            BreakerState::Open { .. }
        ));

        // The same, one full window later: the first 19 have expired.
        let b = breaker(exact());
        record(&b, t0, 0, 19);
        record(&b, t0 + 10 * SEC, 0, 1);
        assert_eq!(b.state_at(t0 + 10 * SEC), BreakerState::Closed);
        // Only the new failures count now: 18 more make 19, still below the volume.
        record(&b, t0 + 10 * SEC, 0, 18);
        assert_eq!(b.state_at(t0 + 10 * SEC), BreakerState::Closed);
        record(&b, t0 + 10 * SEC, 0, 1);
        assert!(matches!(
            b.state_at(t0 + 10 * SEC),
            BreakerState::Open { .. }
        ));

        // Expiry by age, not only by a bucket being reused: 15 s later the new outcome
        // lands in another bucket while the old failures still sit in theirs.
        let b = breaker(exact());
        record(&b, t0, 0, 19);
        record(&b, t0 + 15 * SEC, 0, 1);
        assert_eq!(b.state_at(t0 + 15 * SEC), BreakerState::Closed);
        // Long idle gaps (many windows) expire everything too.
        record(&b, t0 + 3600 * SEC, 0, 19);
        assert_eq!(b.state_at(t0 + 3600 * SEC), BreakerState::Closed);

        // Partial slide: failures at 0 s expire, those at 6 s remain.
        let b = breaker(exact());
        record(&b, t0, 0, 10);
        record(&b, t0 + 6 * SEC, 0, 9);
        record(&b, t0 + 10 * SEC + 500 * MS, 0, 1); // window: 9 + 1 = 10 outcomes
        assert_eq!(b.state_at(t0 + 10 * SEC + 500 * MS), BreakerState::Closed);
        record(&b, t0 + 10 * SEC + 500 * MS, 0, 10); // 20 outcomes
        assert!(matches!(
            b.state_at(t0 + 10 * SEC + 500 * MS),
            BreakerState::Open { .. }
        ));
    }

    #[test]
    fn refuses_while_open_with_the_time_left() {
        let b = breaker(exact());
        let t0 = Instant::now();
        let until = trip(&b, t0);
        assert_eq!(until, t0 + 5 * SEC);

        let err = b.acquire_at(t0).expect_err("open");
        assert_eq!(err.retry_after, 5 * SEC);
        let err = b.acquire_at(t0 + 2 * SEC).expect_err("open");
        assert_eq!(err.retry_after, 3 * SEC);
        let err = b.acquire_at(t0 + 5 * SEC - MS).expect_err("open");
        assert_eq!(err.retry_after, MS);
        assert_eq!(
            err.to_string(),
            "circuit breaker open; retry after 1ms",
            "message names the wait"
        );

        // From `until` on: half-open, a probe is admitted.
        assert_eq!(b.state_at(t0 + 5 * SEC), BreakerState::HalfOpen);
        assert!(b.acquire_at(t0 + 5 * SEC).is_ok());
    }

    fn open_duration(config: &BreakerConfig, seed: u64) -> Duration {
        let b = CircuitBreaker::new(config.clone(), seed).expect("valid");
        let t0 = Instant::now();
        trip(&b, t0) - t0
    }

    #[test]
    fn jitter_spreads_open_durations_across_seeds() {
        let config = BreakerConfig::default(); // 5 s, jitter 0.5 → [5 s, 7.5 s]
        let lo = config.open_for;
        let hi = config.open_for.mul_f64(1.0 + config.open_jitter);

        let a = open_duration(&config, 1);
        let b = open_duration(&config, 2);
        assert_ne!(a, b, "different seeds open for different durations");
        for d in [a, b] {
            assert!(lo <= d && d <= hi, "{d:?} outside [{lo:?}, {hi:?}]");
        }

        // 1000 breakers (a fleet): durations cover the range evenly, so their half-open
        // probes do not arrive together. Ten bins of 250 ms; each should hold ~100.
        let mut bins = [0u32; 10];
        for seed in 0..1000 {
            let d = open_duration(&config, seed);
            assert!(lo <= d && d <= hi, "{d:?} outside [{lo:?}, {hi:?}]");
            let frac = (d - lo).as_secs_f64() / (hi - lo).as_secs_f64();
            bins[((frac * 10.0) as usize).min(9)] += 1;
        }
        for (i, &n) in bins.iter().enumerate() {
            assert!(
                (50..=150).contains(&n),
                "bin {i} holds {n} of 1000: {bins:?}"
            );
        }

        // The same seed is reproducible (the simulator relies on it).
        assert_eq!(open_duration(&config, 7), open_duration(&config, 7));
        // No jitter: exactly open_for.
        assert_eq!(open_duration(&exact(), 3), 5 * SEC);
    }

    #[test]
    fn half_open_admits_exactly_n_probes_at_once() {
        let b = breaker(exact());
        let t0 = Instant::now();
        let t1 = trip(&b, t0);
        let probes: Vec<_> = (0..3)
            .map(|_| b.acquire_at(t1).expect("probe admitted"))
            .collect();
        let err = b.acquire_at(t1).expect_err("a fourth probe is refused");
        assert!(err.retry_after < 5 * SEC, "hint within [0, open_for)");
        assert!(b.acquire_at(t1 + SEC).is_err(), "still refused later");
        assert_eq!(b.state_at(t1), BreakerState::HalfOpen);
        drop(probes);
    }

    #[test]
    fn dropped_permits_free_probe_slots_and_record_nothing() {
        let b = breaker(exact());
        let t0 = Instant::now();

        // Closed: 20 cancelled calls count for nothing (as successes they would have
        // made 19 failures reach the volume and open the breaker).
        let cancelled: Vec<_> = (0..20).map(|_| b.acquire_at(t0).expect("closed")).collect();
        drop(cancelled);
        record(&b, t0, 0, 19);
        assert_eq!(b.state_at(t0), BreakerState::Closed);
        record(&b, t0, 0, 1);
        let t1 = match b.state_at(t0) {
            BreakerState::Open { until } => until,
            s => panic!("expected open, got {s:?}"),
        };

        // Half-open: a dropped probe frees its slot and does not count as a success.
        let p1 = b.acquire_at(t1).expect("probe");
        let p2 = b.acquire_at(t1).expect("probe");
        let p3 = b.acquire_at(t1).expect("probe");
        assert!(b.acquire_at(t1).is_err());
        drop(p2);
        let p4 = b
            .acquire_at(t1)
            .expect("the freed slot admits another probe");
        assert!(b.acquire_at(t1).is_err());
        p1.success_at(t1);
        p3.success_at(t1);
        assert_eq!(b.state_at(t1), BreakerState::HalfOpen, "2 of 3 successes");
        p4.success_at(t1);
        assert_eq!(b.state_at(t1), BreakerState::Closed);
    }

    #[test]
    fn probe_failure_reopens_with_a_new_jittered_duration() {
        let config = BreakerConfig::default();
        let b = CircuitBreaker::new(config.clone(), 9).expect("valid");
        let t0 = Instant::now();
        let t1 = trip(&b, t0);
        let first = t1 - t0;

        let p1 = b.acquire_at(t1).expect("probe");
        let p2 = b.acquire_at(t1).expect("probe");
        p1.success_at(t1);
        let t2 = t1 + 100 * MS;
        p2.failure_at(t2);
        let until = match b.state_at(t2) {
            BreakerState::Open { until } => until,
            s => panic!("expected open, got {s:?}"),
        };
        let second = until - t2;
        assert!(5 * SEC <= second && second <= 7500 * MS, "{second:?}");
        assert_ne!(first, second, "each open period is drawn afresh");
        assert_eq!(
            b.acquire_at(t2).expect_err("open").retry_after,
            second,
            "refused again for the new period"
        );

        // The next half-open round starts with all slots free and no successes.
        let ps: Vec<_> = (0..3)
            .map(|_| b.acquire_at(until).expect("probe"))
            .collect();
        assert!(b.acquire_at(until).is_err());
        let mut ps = ps.into_iter();
        ps.next().expect("p").success_at(until);
        ps.next().expect("p").success_at(until);
        assert_eq!(b.state_at(until), BreakerState::HalfOpen);
        ps.next().expect("p").success_at(until);
        assert_eq!(b.state_at(until), BreakerState::Closed);
    }

    #[test]
    fn n_probe_successes_close_and_reset_the_window() {
        let b = breaker(exact());
        let t0 = Instant::now();
        let t1 = trip(&b, t0); // 20 failures in the window at t0
        for i in 0..3 {
            assert_eq!(
                b.state_at(t1),
                BreakerState::HalfOpen,
                "after {i} successes"
            );
            b.acquire_at(t1).expect("probe").success_at(t1);
        }
        assert_eq!(b.state_at(t1), BreakerState::Closed);
        // Still inside the 10 s window of the old failures, yet they no longer count.
        record(&b, t1, 0, 19);
        assert_eq!(b.state_at(t1), BreakerState::Closed);
        // Closed again: admits everything.
        let many: Vec<_> = (0..100)
            .map(|_| b.acquire_at(t1).expect("closed"))
            .collect();
        drop(many);
    }

    #[test]
    fn every_transition_is_recorded_once_with_its_details() {
        let b = breaker(BreakerConfig {
            half_open_probes: 1,
            ..exact()
        });
        let watch = b.watch();
        let t0 = Instant::now();
        record(&b, t0, 5, 15); // 15 / 20 failed: opens on the 20th outcome
        let t1 = t0 + 5 * SEC;
        b.acquire_at(t1).expect("probe").failure_at(t1); // re-opens
        let t2 = t1 + 5 * SEC;
        assert_eq!(b.state_at(t2), BreakerState::HalfOpen);
        b.acquire_at(t2).expect("probe").success_at(t2); // closes

        let got: Vec<_> = watch.take().unwrap().collect();
        let open_at = |at: Instant| BreakerState::Open {
            until: at + 5 * SEC,
        };
        assert_eq!(
            got,
            [
                Transition {
                    from: BreakerState::Closed,
                    to: open_at(t0),
                    at: t0,
                    failure_rate: Some(0.75),
                },
                Transition {
                    from: open_at(t0),
                    to: BreakerState::HalfOpen,
                    at: t1,
                    failure_rate: None,
                },
                Transition {
                    from: BreakerState::HalfOpen,
                    to: open_at(t1),
                    at: t1,
                    failure_rate: None,
                },
                Transition {
                    from: open_at(t1),
                    to: BreakerState::HalfOpen,
                    at: t2,
                    failure_rate: None,
                },
                Transition {
                    from: BreakerState::HalfOpen,
                    to: BreakerState::Closed,
                    at: t2,
                    failure_rate: None,
                },
            ]
        );
        assert_eq!(got[0].open_for(), Some(5 * SEC));
        assert_eq!(got[4].open_for(), None);
        assert!(watch.take().is_none(), "each is handed out once");
        // A watch made now hears only what comes next; each watch hears everything.
        let late = b.watch();
        trip(&b, t2);
        assert_eq!(late.take().unwrap().count(), 1);
        assert_eq!(watch.take().unwrap().count(), 1);
    }

    #[test]
    fn a_watch_far_behind_counts_what_the_log_lost() {
        let b = breaker(BreakerConfig {
            min_requests: 1,
            half_open_probes: 1,
            ..exact()
        });
        let watch = b.watch();
        let mut t = Instant::now();
        // Ten rounds of open → half-open → closed: 30 transitions.
        for _ in 0..10 {
            record(&b, t, 0, 1);
            t += 5 * SEC;
            b.acquire_at(t).expect("probe").success_at(t);
        }
        let mut taken = watch.take().unwrap();
        assert_eq!(taken.missed(), 30 - TRANSITION_LOG as u64);
        let kept: Vec<_> = taken.by_ref().collect();
        assert_eq!(kept.len(), TRANSITION_LOG);
        assert_eq!(kept.last().map(|t| t.to), Some(BreakerState::Closed));
    }

    #[test]
    fn concurrent_takers_share_out_each_transition_exactly_once() {
        let b = breaker(BreakerConfig {
            min_requests: 1,
            half_open_probes: 1,
            ..exact()
        });
        let watch = Arc::new(b.watch());
        let t0 = Instant::now();
        let threads: Vec<_> = (0..4)
            .map(|n| {
                let (b, watch) = (b.clone(), Arc::clone(&watch));
                std::thread::spawn(move || {
                    let mut seen = 0;
                    for i in 0..500u32 {
                        let now = t0 + SEC * (i * 4 + n);
                        // Each thread flips the breaker (one failure opens it; after 5 s a
                        // probe's success closes it) and takes what there is.
                        if let Ok(permit) = b.acquire_at(now) {
                            if permit.is_probe() {
                                permit.success_at(now);
                            } else {
                                permit.failure_at(now);
                            }
                        }
                        // Handed out or counted as missed: each exactly once.
                        seen += watch.take().map_or(0, |t| t.missed() + t.count() as u64);
                    }
                    seen
                })
            })
            .collect();
        let taken: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
        let last = watch.take().map_or(0, |t| t.missed() + t.count() as u64);
        let recorded = b.shared.lock().log.recorded;
        assert!(recorded > 100, "the breaker flipped often: {recorded}");
        assert_eq!(taken + last, recorded);
    }

    #[test]
    fn stale_permits_are_ignored() {
        let b = breaker(exact());
        let t0 = Instant::now();

        // Slow calls started while closed.
        let slow_ok = b.acquire_at(t0).expect("closed");
        let slow_fail = b.acquire_at(t0).expect("closed");
        let t1 = trip(&b, t0);

        // A stale success does not close an open breaker.
        slow_ok.success_at(t0 + SEC);
        assert_eq!(b.state_at(t0 + SEC), BreakerState::Open { until: t1 });

        // Half-open: a stale failure does not re-open, and takes no probe slot.
        let p1 = b.acquire_at(t1).expect("probe");
        let p2 = b.acquire_at(t1).expect("probe");
        slow_fail.failure_at(t1);
        assert_eq!(b.state_at(t1), BreakerState::HalfOpen);
        let p3 = b.acquire_at(t1).expect("third slot still free");
        assert!(b.acquire_at(t1).is_err());

        // A probe failure re-opens; the other probes of that round are now stale.
        p1.failure_at(t1);
        let t2 = match b.state_at(t1) {
            BreakerState::Open { until } => until,
            s => panic!("expected open, got {s:?}"),
        };
        p2.success_at(t1 + MS);
        assert!(matches!(b.state_at(t1 + MS), BreakerState::Open { .. }));

        // Next round: the stale probe's drop frees nothing and its success counts nothing.
        let q: Vec<_> = (0..3).map(|_| b.acquire_at(t2).expect("probe")).collect();
        drop(p3);
        assert!(b.acquire_at(t2).is_err(), "stale drop freed no slot");
        let mut q = q.into_iter();
        q.next().expect("q").success_at(t2);
        q.next().expect("q").success_at(t2);
        assert_eq!(b.state_at(t2), BreakerState::HalfOpen);
        q.next().expect("q").success_at(t2);
        assert_eq!(b.state_at(t2), BreakerState::Closed);

        // A probe from the half-open round finishing after the close is ignored too.
        let t3 = t2 + SEC;
        let b2 = breaker(exact());
        let u = trip(&b2, t3);
        let late = b2.acquire_at(u).expect("probe");
        let others: Vec<_> = (0..2).map(|_| b2.acquire_at(u).expect("probe")).collect();
        for p in others {
            p.success_at(u);
        }
        b2.acquire_at(u).expect("probe").success_at(u);
        assert_eq!(b2.state_at(u), BreakerState::Closed);
        late.failure_at(u);
        assert_eq!(
            b2.state_at(u),
            BreakerState::Closed,
            "late probe failure ignored"
        );
    }

    #[test]
    fn clones_share_state() {
        let a = breaker(exact());
        let b = a.clone();
        let t0 = Instant::now();
        let until = trip(&a, t0);
        assert_eq!(b.state_at(t0), BreakerState::Open { until });
        assert!(b.acquire_at(t0).is_err());
        // Probes are shared too: three through one clone fill the slots of the other.
        let ps: Vec<_> = (0..3)
            .map(|_| a.acquire_at(until).expect("probe"))
            .collect();
        assert!(b.acquire_at(until).is_err());
        for p in ps {
            p.success_at(until);
        }
        assert_eq!(b.state_at(until), BreakerState::Closed);
        assert_eq!(b.config(), a.config());

        // Across threads: four clones each see 10 failures; only together do they reach
        // the volume of 40.
        fn send_sync<T: Send + Sync + 'static>() {}
        send_sync::<CircuitBreaker>();
        send_sync::<BreakerPermit>();
        let shared = breaker(BreakerConfig {
            min_requests: 40,
            ..exact()
        });
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let b = shared.clone();
                std::thread::spawn(move || record(&b, t0, 0, 10))
            })
            .collect();
        for t in threads {
            t.join().expect("no panic");
        }
        assert!(matches!(shared.state_at(t0), BreakerState::Open { .. }));
    }

    #[test]
    fn config_validation_names_the_field() {
        let field_of = |c: BreakerConfig| match c.validate() {
            Err(ConfigError::Invalid { field, .. }) => field,
            other => panic!("expected an invalid field, got {other:?}"),
        };
        let d = BreakerConfig::default;
        assert_eq!(d().validate(), Ok(()));

        for rate in [0.0, -0.1, 1.01, f64::NAN, f64::INFINITY] {
            let c = BreakerConfig {
                failure_rate: rate,
                ..d()
            };
            assert_eq!(field_of(c), "breaker.failure_rate", "rate {rate}");
        }
        for window in [Duration::ZERO, 999 * MS, 601 * SEC] {
            let c = BreakerConfig { window, ..d() };
            assert_eq!(field_of(c), "breaker.window", "{window:?}");
        }
        let c = BreakerConfig {
            min_requests: 0,
            ..d()
        };
        assert_eq!(field_of(c), "breaker.min_requests");
        for open_for in [Duration::ZERO, 3601 * SEC, Duration::MAX] {
            let c = BreakerConfig { open_for, ..d() };
            assert_eq!(field_of(c), "breaker.open_for", "{open_for:?}");
        }
        for jitter in [-0.01, 10.01, f64::NAN] {
            let c = BreakerConfig {
                open_jitter: jitter,
                ..d()
            };
            assert_eq!(field_of(c), "breaker.open_jitter", "{jitter}");
        }
        let c = BreakerConfig {
            half_open_probes: 0,
            ..d()
        };
        assert_eq!(field_of(c.clone()), "breaker.half_open_probes");
        let err = CircuitBreaker::new(c, 0).expect_err("new validates");
        assert!(
            err.to_string().contains("breaker.half_open_probes"),
            "{err}"
        );

        // The edges of each range are accepted.
        let edges = BreakerConfig {
            failure_rate: 1.0,
            window: SEC,
            min_requests: 1,
            open_for: 3600 * SEC,
            open_jitter: 10.0,
            half_open_probes: 1,
        };
        assert_eq!(edges.validate(), Ok(()));
        let edges = BreakerConfig {
            window: 600 * SEC,
            open_for: Duration::from_nanos(1),
            open_jitter: 0.0,
            ..d()
        };
        assert_eq!(edges.validate(), Ok(()));
    }

    #[tokio::test(start_paused = true)]
    async fn convenience_forms_use_the_clock() {
        let b = breaker(BreakerConfig {
            min_requests: 1,
            ..exact()
        });
        b.acquire().expect("closed").success();
        assert_eq!(b.state_at(Instant::now()), BreakerState::Closed);
        b.acquire().expect("closed").failure(); // 1 of 2 = 0.5 → opens
        // Paused clock: no time passes between the calls.
        assert_eq!(b.acquire().expect_err("open").retry_after, 5 * SEC);
        tokio::time::advance(2 * SEC).await;
        assert_eq!(b.acquire().expect_err("open").retry_after, 3 * SEC);
        tokio::time::advance(3 * SEC).await;
        b.acquire().expect("half-open probe").success();
        assert_eq!(b.state_at(Instant::now()), BreakerState::HalfOpen, "1 of 3");
    }

    // ---- property test: a model of the state machine ------------------------------

    #[derive(Debug, Clone)]
    enum Op {
        Acquire,
        Success(usize),
        Failure(usize),
        Drop(usize),
        Advance(u64),
        Back(u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Acquire),
            3 => any::<usize>().prop_map(Op::Success),
            3 => any::<usize>().prop_map(Op::Failure),
            1 => any::<usize>().prop_map(Op::Drop),
            2 => (0u64..4000).prop_map(Op::Advance),
            1 => (0u64..500).prop_map(Op::Back),
        ]
    }

    fn config() -> impl Strategy<Value = BreakerConfig> {
        (
            0.05f64..=1.0,
            1u64..=30,
            1u32..6,
            1u64..3000,
            0.0f64..=2.0,
            1u32..5,
        )
            .prop_map(
                |(rate, window, min, open_ms, jitter, probes)| BreakerConfig {
                    failure_rate: rate,
                    window: Duration::from_secs(window),
                    min_requests: min,
                    open_for: Duration::from_millis(open_ms),
                    open_jitter: jitter,
                    half_open_probes: probes,
                },
            )
    }

    struct Held {
        permit: BreakerPermit,
        /// Model epoch (count of observed transitions) when it was issued.
        epoch: u64,
        probe: bool,
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Never panics; never admits more than N concurrent probes in one half-open
        /// round (and admits exactly while fewer are in flight); N probe successes close,
        /// a probe failure opens for a jittered duration; stale outcomes change nothing.
        #[test]
        fn state_machine_matches_the_model(
            cfg in config(),
            seed in any::<u64>(),
            ops in proptest::collection::vec(op(), 1..200),
        ) {
            let b = CircuitBreaker::new(cfg.clone(), seed).expect("valid");
            let n = cfg.half_open_probes;
            let base = Instant::now();
            let mut offset = Duration::ZERO;
            let mut held: Vec<Held> = Vec::new();
            let mut epoch = 0u64;
            let mut successes = 0u32; // probe successes in the current half-open round
            let mut state = b.state_at(base);
            prop_assert_eq!(state, BreakerState::Closed);

            let open_range = |now: Instant| {
                (now + cfg.open_for, now + cfg.open_for.mul_f64(1.0 + cfg.open_jitter) + Duration::from_nanos(1))
            };

            for op in ops {
                let now = base + offset;
                let before = state;
                let mut expect_change_ok = false;
                match op {
                    Op::Advance(ms) => offset += Duration::from_millis(ms),
                    Op::Back(ms) => offset = offset.saturating_sub(Duration::from_millis(ms)),
                    Op::Acquire => {
                        let live = held.iter().filter(|h| h.probe && h.epoch == epoch).count() as u32;
                        match (b.acquire_at(now), before) {
                            (Ok(permit), BreakerState::Closed) => {
                                held.push(Held { permit, epoch, probe: false });
                            }
                            (Ok(permit), BreakerState::HalfOpen) => {
                                prop_assert!(live < n, "admitted probe {} of {}", live + 1, n);
                                held.push(Held { permit, epoch, probe: true });
                            }
                            (Err(e), BreakerState::Open { until }) => {
                                prop_assert_eq!(e.retry_after, until.saturating_duration_since(now));
                            }
                            (Err(e), BreakerState::HalfOpen) => {
                                prop_assert!(live >= n, "refused with {} of {} probes", live, n);
                                prop_assert!(e.retry_after < cfg.open_for);
                            }
                            (r, s) => prop_assert!(false, "acquire in {:?} gave {:?}", s, r.map(|_| ())),
                        }
                    }
                    Op::Success(i) | Op::Failure(i) | Op::Drop(i) => {
                        if held.is_empty() {
                            continue;
                        }
                        let h = held.swap_remove(i % held.len());
                        let current = h.epoch == epoch;
                        match (&op, h.probe) {
                            (Op::Success(_), true) => {
                                h.permit.success_at(now);
                                if current {
                                    successes += 1;
                                }
                            }
                            (Op::Success(_), false) => h.permit.success_at(now),
                            (Op::Failure(_), _) => h.permit.failure_at(now),
                            _ => drop(h.permit),
                        }
                        let after = b.state_at(now);
                        match (&op, current, h.probe) {
                            (Op::Drop(_), _, _) | (_, false, _) => {
                                prop_assert_eq!(after, before, "stale or dropped permit changed state");
                            }
                            (Op::Success(_), true, true) => {
                                if successes >= n {
                                    prop_assert_eq!(after, BreakerState::Closed);
                                } else {
                                    prop_assert_eq!(after, BreakerState::HalfOpen);
                                }
                            }
                            (Op::Failure(_), true, true) => {
                                let (lo, hi) = open_range(now);
                                match after {
                                    BreakerState::Open { until } => prop_assert!(lo <= until && until <= hi),
                                    s => prop_assert!(false, "probe failure left {:?}", s),
                                }
                            }
                            (_, true, false) => expect_change_ok = true,
                            _ => unreachable!(),
                        }
                    }
                }
                let after = b.state_at(base + offset);
                if after != before {
                    match (before, after) {
                        (BreakerState::Closed, BreakerState::Open { until }) => {
                            prop_assert!(expect_change_ok, "opened without a closed outcome");
                            let (lo, hi) = open_range(now);
                            prop_assert!(lo <= until && until <= hi);
                        }
                        (BreakerState::Open { until }, BreakerState::HalfOpen) => {
                            prop_assert!(base + offset >= until);
                        }
                        (BreakerState::HalfOpen, BreakerState::Open { .. } | BreakerState::Closed) => {}
                        (x, y) => prop_assert!(false, "transition {:?} -> {:?}", x, y),
                    }
                    epoch += 1;
                    successes = 0;
                }
                state = after;
                // Invariant: never more than N live probes of the current round.
                if state == BreakerState::HalfOpen {
                    let live = held.iter().filter(|h| h.probe && h.epoch == epoch).count() as u32;
                    prop_assert!(live <= n);
                }
            }
        }
    }
}
