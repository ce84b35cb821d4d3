//! Admission policy: which work a saturated server keeps, and what it tells the rest.
//!
//! A server that cannot serve everything must choose. Queueing everything turns a short
//! overload into a long one (every queued call times out at the client, is retried, and
//! the retry joins the queue again: the metastable loop in the crate docs). Shedding at
//! random punishes first attempts as much as retries, so users whose *first* call would
//! have succeeded fail too, and their clients retry as well.
//!
//! This module is the decision alone, with no queue, no runtime and no transport, so the
//! tower layer in `stormguard-server` and the fleet simulator (which runs on a virtual
//! clock) drive the same code:
//!
//! - [`AttemptClass`]: first attempt or retry, read from `grpc-previous-rpc-attempts`
//!   (what standard gRPC clients send on retries) or `x-retry-attempt`. A malformed value
//!   counts as a retry: a peer cannot buy priority with garbage. With the call's
//!   [`Criticality`] it makes a [`CallClass`] ([`crate::criticality`]): sheddable work is
//!   shed before retries, retries before the rest.
//! - [`AdmissionPolicy::decide_at`]: admit at once, queue, or shed. **Retries are shed
//!   first**: once the queue passes the [`RetryThreshold`] a retry is answered at once,
//!   while a first attempt is shed only when the queue is full. Under sustained overload
//!   the retries absorb the shedding and first attempts keep the capacity.
//! - [`AdmissionPolicy::pushback_at`]: the `grpc-retry-pushback-ms` to send with a shed
//!   answer: the estimated time for the queue to drain (from the observed completion
//!   rate, [`CompletionRate`]), clamped to `[1 ms, pushback_max]` and jittered so that
//!   the clients told to come back do not all come back together. It is **never 0**:
//!   gRPC C-core clients never finish a call told "retry after 0 ms".
//! - [`AdmissionPolicy::expiry`]: when queued work stops being worth running (its
//!   `grpc-timeout` leaves less than [`AdmissionConfig::min_time_left`], or it has waited
//!   [`AdmissionConfig::max_time_queued`]).
//! - [`AdmissionPolicy::serve_newest`]: FIFO, or newest-first once a queue has formed
//!   ([`QueueOrder::AdaptiveLifo`]).
//!
//! Every time-dependent method has an `_at(now)` form taking the instant explicitly. The
//! queue that asks these questions at the right moments is [`crate::queue`].
//!
//! # Configuration from JSON
//!
//! [`AdmissionConfig::from_json`] reads the same fields under `admission`, with durations
//! written with their unit and codes by name or number ([`AdmissionConfig::from_path`]
//! reads YAML and TOML too). Every field is optional and defaults as in
//! [`AdmissionConfig::default`]; unknown fields are errors, and every error names the
//! field as the document spells it (`admission.retry_threshold.queue_delay`).
//! `AdmissionConfig` implements `serde::Deserialize` for the fields of the `admission`
//! object, with the same checks, so an application can hold it in its own config (see
//! [`crate::config`], where the reader lives).
//!
//! ```json
//! { "admission": {
//!     "workers": 16, "queue_capacity": 64,
//!     "retry_threshold": { "depth": 8, "queue_delay": "20ms" },
//!     "max_time_queued": "1s", "min_time_left": "2ms",
//!     "queue_order": "adaptive_lifo", "lifo_from_depth": 8,
//!     "pushback_max": "1s", "shed_code": "UNAVAILABLE", "no_retry_depth": 48,
//!     "seed": 7,
//!     "sheddable_threshold": { "depth": 0, "queue_delay": null },
//!     "adaptive": { "min_limit": 2, "max_limit": 256, "window": "100ms",
//!                   "min_window_samples": 16, "probe_interval": "30s" } } }
//! ```
//!
//! `queue_order` is `"fifo"` or `"adaptive_lifo"` (newest first from `lifo_from_depth`
//! queued calls, default 8); `null` turns off `retry_threshold.depth`,
//! `retry_threshold.queue_delay`, `sheddable_threshold.*`, `no_retry_depth` or
//! `adaptive` (a fixed limit of `workers`). With `adaptive`, `workers` is the starting
//! limit (see [`crate::limit`]).
//!
//! ```
//! use std::time::Duration;
//! use stormguard_core::Instant;
//! use stormguard_core::admission::*;
//!
//! let config = AdmissionConfig {
//!     workers: 2,
//!     queue_capacity: 8,
//!     retry_threshold: RetryThreshold { depth: Some(2), queue_delay: None },
//!     ..AdmissionConfig::default()
//! };
//! let mut policy = AdmissionPolicy::new(config).expect("valid config");
//! let now = Instant::now();
//! let busy = |depth| QueueLoad { free_workers: 0, depth, oldest_enqueued: Some(now) };
//!
//! let first = AttemptClass::from_headers(None, None);
//! let retry = AttemptClass::from_headers(Some(b"1"), None);
//! assert_eq!(policy.decide_at(now, busy(3), first), Decision::Queue);
//! assert!(matches!(policy.decide_at(now, busy(3), retry), Decision::Shed(_)));
//! assert!(matches!(policy.decide_at(now, busy(8), first), Decision::Shed(_)));
//! ```

use std::time::Duration;

use crate::Instant;

use crate::code::Code;
use crate::criticality::{CallClass, Criticality};
use crate::error::ConfigError;
use crate::limit::AdaptiveLimitConfig;

/// The largest `pushback_max` accepted: one hour. Longer advice is no advice.
pub const MAX_PUSHBACK: Duration = Duration::from_secs(3600);

/// The largest `max_time_queued` accepted: one hour. A call waiting longer has no
/// caller left; and a bound near `Duration::MAX` would not fit in an `Instant`.
pub const MAX_TIME_QUEUED: Duration = Duration::from_secs(3600);

/// An older, non-standard attempt header, read when [`PREVIOUS_ATTEMPTS_HEADER`] is absent.
///
/// [`PREVIOUS_ATTEMPTS_HEADER`]: crate::retry::PREVIOUS_ATTEMPTS_HEADER
pub const X_RETRY_ATTEMPT_HEADER: &str = "x-retry-attempt";

/// Whether a call is a first attempt or a retry, as the client declared it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttemptClass {
    /// The first attempt of a logical call (no attempt header, or a value of 0).
    First,
    /// A retry (a positive value), or a call whose attempt header could not be read.
    Retry,
}

impl AttemptClass {
    /// Classifies a call from its `grpc-previous-rpc-attempts` value and, when that header
    /// is absent, its `x-retry-attempt` value (the number of retries before this one; an
    /// older convention, read the same way).
    ///
    /// Values are decimal digits, surrounding ASCII whitespace ignored. All-zero digits
    /// mean [`AttemptClass::First`]; any other value, including an empty, signed,
    /// non-decimal or huge one, means [`AttemptClass::Retry`]. Never panics.
    ///
    /// ```
    /// use stormguard_core::admission::AttemptClass;
    ///
    /// assert_eq!(AttemptClass::from_headers(None, None), AttemptClass::First);
    /// assert_eq!(AttemptClass::from_headers(Some(b"0"), None), AttemptClass::First);
    /// assert_eq!(AttemptClass::from_headers(Some(b"2"), None), AttemptClass::Retry);
    /// assert_eq!(AttemptClass::from_headers(Some(b"two"), None), AttemptClass::Retry);
    /// assert_eq!(AttemptClass::from_headers(None, Some(b"1")), AttemptClass::Retry);
    /// ```
    pub fn from_headers(
        previous_rpc_attempts: Option<&[u8]>,
        x_retry_attempt: Option<&[u8]>,
    ) -> AttemptClass {
        match previous_rpc_attempts.or(x_retry_attempt) {
            None => AttemptClass::First,
            Some(value) => AttemptClass::from_value(value),
        }
    }

    /// Classifies one header value (see [`AttemptClass::from_headers`]).
    pub fn from_value(value: &[u8]) -> AttemptClass {
        let value = value.trim_ascii();
        if !value.is_empty() && value.iter().all(|b| *b == b'0') {
            AttemptClass::First
        } else {
            AttemptClass::Retry
        }
    }

    /// `"first"` or `"retry"`, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            AttemptClass::First => "first",
            AttemptClass::Retry => "retry",
        }
    }
}

/// When retries start to be shed, before the queue is full.
///
/// A retry is shed once **either** set condition holds; with neither set, retries are
/// shed only when the queue is full, like first attempts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryThreshold {
    /// Shed retries once this many calls are queued (at most `queue_capacity`).
    pub depth: Option<usize>,
    /// Shed retries once the oldest queued call has waited this long. This follows the
    /// real backlog when service times vary, where a depth does not.
    pub queue_delay: Option<Duration>,
}

impl Default for RetryThreshold {
    /// Depth 8, no delay condition.
    fn default() -> Self {
        RetryThreshold {
            depth: Some(8),
            queue_delay: None,
        }
    }
}

/// The order in which queued calls get a free worker.
///
/// # Which is better
///
/// Measured with `examples/server_measure.rs` (8 workers × 10 ms, a naive client at
/// 540 logical calls/s: 3 attempts, 10 ms backoff, 50 ms per attempt; service time
/// ×2.5 from 5 s to 8 s). Share of logical calls that succeeded per 3 s window:
///
/// | server | 0–3 s | 3–6 s | 6–9 s | 9–12 s | after |
/// |---|---|---|---|---|---|
/// | bounded pool, deep FIFO queue, no shedding | 1.00 | 0.66 | 0.01 | 0.00 | ≤ 0.02 (metastable) |
/// | stormguard, FIFO | 1.00 | 0.67 | 0.35 | 1.00 | 1.00 |
/// | stormguard, adaptive LIFO from 8 | 1.00 | 0.84 | 0.70 | 1.00 | 1.00 |
///
/// Both recover as soon as the trigger ends; adaptive LIFO keeps twice the goodput
/// during it, with fewer attempts per call (1.61 against 2.30 in the worst window) and
/// almost no work abandoned mid-run (36 calls against 1 551), because the newest calls
/// are the ones whose callers are still waiting. Hence the default.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueOrder {
    /// Oldest first, always.
    Fifo,
    /// Oldest first while fewer than `from_depth` calls are queued; newest first from
    /// then on. Under overload the oldest calls are the ones whose callers are about to
    /// give up; serving the newest keeps the work that still has a caller waiting for
    /// it (the "adaptive LIFO" of Facebook's and Netflix's servers).
    AdaptiveLifo {
        /// The queue depth from which the newest call is served first.
        from_depth: usize,
    },
}

/// Configuration of the admission queue. [`AdmissionConfig::validate`] says what is
/// accepted; [`AdmissionPolicy::new`] refuses anything else.
#[derive(Clone, Debug, PartialEq)]
pub struct AdmissionConfig {
    /// Calls served at the same time. At least 1. Default 64.
    pub workers: usize,
    /// Calls that may wait for a worker; beyond it every call is shed. 0 means no queue.
    /// Default 64.
    pub queue_capacity: usize,
    /// When retries start to be shed. Default: 8 queued calls.
    pub retry_threshold: RetryThreshold,
    /// The longest a call may wait for a worker; after it the call is answered
    /// `DEADLINE_EXCEEDED` without running. Above zero, at most [`MAX_TIME_QUEUED`].
    /// Default 1 s.
    pub max_time_queued: Duration,
    /// Queued work whose `grpc-timeout` leaves less than this is answered
    /// `DEADLINE_EXCEEDED` without running: it could not finish in time, and running it
    /// would only take a worker from a call that can. It also makes the queue answer
    /// before the transport's own timeout fires (tonic answers that one `CANCELLED`).
    /// Default 2 ms.
    pub min_time_left: Duration,
    /// FIFO or adaptive LIFO. Default: adaptive LIFO from 8 queued, which measured
    /// better than FIFO under a capacity drop (see [`QueueOrder`]).
    pub queue_order: QueueOrder,
    /// The largest `grpc-retry-pushback-ms` sent. Between 1 ms and [`MAX_PUSHBACK`].
    /// Default 1 s.
    pub pushback_max: Duration,
    /// The status of a shed answer. Not `OK`. Default `UNAVAILABLE`, so standard clients
    /// may come back after the pushback.
    pub shed_code: Code,
    /// Retries shed while at least this many calls are queued are told "do not retry"
    /// (`grpc-retry-pushback-ms: -1`) instead of a delay. At most `queue_capacity`.
    /// Default `None` (never).
    pub no_retry_depth: Option<usize>,
    /// Seed of the pushback jitter. Default `None`: a seed drawn for each policy when it is
    /// built, so that replicas of a service do not all draw the same jitter sequence (and
    /// send their clients back together); set one only to reproduce a run.
    pub seed: Option<u64>,
    /// When calls of [`Criticality::Sheddable`] start to be shed: once either set
    /// condition holds. Default depth 0: a sheddable call runs if a worker is free and
    /// is shed rather than queued otherwise, before any retry is.
    pub sheddable_threshold: RetryThreshold,
    /// An adaptive worker limit: `workers` is then only the starting point, and the
    /// limit follows measured latency between the bounds given here (see
    /// [`crate::limit`]). Default `None`: `workers` is fixed.
    pub adaptive: Option<AdaptiveLimitConfig>,
}

impl Default for AdmissionConfig {
    /// 64 workers, 64 queued, retries shed from 8 queued, 1 s in queue at most, 2 ms
    /// minimum time left, adaptive LIFO from 8 queued, pushback at most 1 s, shed with
    /// `UNAVAILABLE`.
    fn default() -> Self {
        AdmissionConfig {
            workers: 64,
            queue_capacity: 64,
            retry_threshold: RetryThreshold::default(),
            max_time_queued: Duration::from_secs(1),
            min_time_left: Duration::from_millis(2),
            queue_order: QueueOrder::AdaptiveLifo { from_depth: 8 },
            pushback_max: Duration::from_secs(1),
            shed_code: Code::Unavailable,
            no_retry_depth: None,
            seed: None,
            sheddable_threshold: RetryThreshold {
                depth: Some(0),
                queue_delay: None,
            },
            adaptive: None,
        }
    }
}

impl AdmissionConfig {
    /// Checks every field; the error names the first bad one (`admission.<field>`).
    ///
    /// ```
    /// use stormguard_core::admission::AdmissionConfig;
    ///
    /// assert!(AdmissionConfig::default().validate().is_ok());
    /// let bad = AdmissionConfig { workers: 0, ..AdmissionConfig::default() };
    /// assert!(bad.validate().unwrap_err().to_string().contains("admission.workers"));
    /// ```
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.workers == 0 {
            return Err(ConfigError::invalid(
                "admission.workers",
                "must be at least 1",
            ));
        }
        if let Some(depth) = self.retry_threshold.depth
            && depth > self.queue_capacity
        {
            return Err(ConfigError::invalid(
                "admission.retry_threshold.depth",
                format!("{depth} is above queue_capacity ({})", self.queue_capacity),
            ));
        }
        if self.max_time_queued.is_zero() || self.max_time_queued > MAX_TIME_QUEUED {
            return Err(ConfigError::invalid(
                "admission.max_time_queued",
                format!(
                    "{:?} is outside (0, {:?}]",
                    self.max_time_queued, MAX_TIME_QUEUED
                ),
            ));
        }
        if self.pushback_max < Duration::from_millis(1) || self.pushback_max > MAX_PUSHBACK {
            return Err(ConfigError::invalid(
                "admission.pushback_max",
                format!(
                    "{:?} is outside [1ms, {:?}]: pushback is sent in whole milliseconds and \
                     must never be 0",
                    self.pushback_max, MAX_PUSHBACK
                ),
            ));
        }
        if self.shed_code == Code::Ok {
            return Err(ConfigError::invalid(
                "admission.shed_code",
                "a shed answer cannot be OK",
            ));
        }
        if let Some(depth) = self.no_retry_depth
            && depth > self.queue_capacity
        {
            return Err(ConfigError::invalid(
                "admission.no_retry_depth",
                format!("{depth} is above queue_capacity ({})", self.queue_capacity),
            ));
        }
        if let Some(depth) = self.sheddable_threshold.depth
            && depth > self.queue_capacity
        {
            return Err(ConfigError::invalid(
                "admission.sheddable_threshold.depth",
                format!("{depth} is above queue_capacity ({})", self.queue_capacity),
            ));
        }
        if let Some(adaptive) = &self.adaptive {
            adaptive.validate()?;
        }
        Ok(())
    }
}

/// The state of the queue a decision is made against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueLoad {
    /// Workers free right now.
    pub free_workers: usize,
    /// Calls waiting for a worker.
    pub depth: usize,
    /// When the oldest waiting call was queued (`None` when none waits).
    pub oldest_enqueued: Option<Instant>,
}

/// Why a call was shed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShedReason {
    /// The queue was full.
    QueueFull,
    /// A retry arrived after the queue passed the retry threshold.
    RetryThreshold,
    /// A sheddable call arrived after the queue passed the sheddable threshold, or a
    /// queued call gave its place in a full queue to a call of a higher criticality
    /// ([`crate::queue`]).
    Sheddable,
}

impl ShedReason {
    /// Every reason, in declaration order.
    pub const ALL: [ShedReason; 3] = [
        ShedReason::QueueFull,
        ShedReason::RetryThreshold,
        ShedReason::Sheddable,
    ];

    /// `"queue_full"`, `"retry_threshold"` or `"sheddable"`, for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            ShedReason::QueueFull => "queue_full",
            ShedReason::RetryThreshold => "retry_threshold",
            ShedReason::Sheddable => "sheddable",
        }
    }
}

/// What a shed answer tells the client about coming back.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ShedPushback {
    /// Retry no sooner than this (whole milliseconds, at least 1 ms).
    After(Duration),
    /// Do not retry (`grpc-retry-pushback-ms: -1`).
    DoNotRetry,
}

impl ShedPushback {
    /// The `grpc-retry-pushback-ms` value: milliseconds (at least 1), or -1.
    pub fn millis(self) -> i64 {
        match self {
            ShedPushback::After(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1),
            ShedPushback::DoNotRetry => -1,
        }
    }
}

/// A decision to shed a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shed {
    /// Why.
    pub reason: ShedReason,
    /// What to tell the client.
    pub pushback: ShedPushback,
}

/// What to do with an arriving call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// A worker is free: run it now.
    Admit,
    /// Wait for a worker.
    Queue,
    /// Answer at once with the shed status.
    Shed(Shed),
}

/// Whether a queue in state `load` at `now` has passed `threshold`.
fn passed(threshold: RetryThreshold, now: Instant, load: QueueLoad) -> bool {
    let RetryThreshold { depth, queue_delay } = threshold;
    let by_depth = depth.is_some_and(|d| load.depth >= d);
    let by_delay = match (queue_delay, load.oldest_enqueued) {
        (Some(limit), Some(oldest)) => now.saturating_duration_since(oldest) >= limit,
        _ => false,
    };
    by_depth || by_delay
}

/// Estimates the server's completion rate from the gaps between completions.
///
/// Keeps an exponentially weighted mean of the time between consecutive completions
/// (weight 1/16 per sample): the drain time of `n` queued calls is then `n × gap`,
/// whatever the number of workers. When no completion has happened for longer than the
/// mean gap, that silence is used instead, so a stalled server does not look fast.
/// Constant memory.
#[derive(Clone, Debug, Default)]
pub struct CompletionRate {
    last: Option<Instant>,
    mean_gap_secs: Option<f64>,
}

impl CompletionRate {
    const WEIGHT: f64 = 1.0 / 16.0;

    /// An estimator with no observations.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one completion at `now`.
    pub fn record_at(&mut self, now: Instant) {
        if let Some(last) = self.last {
            let gap = now.saturating_duration_since(last).as_secs_f64();
            self.mean_gap_secs = Some(match self.mean_gap_secs {
                None => gap,
                Some(mean) => mean + Self::WEIGHT * (gap - mean),
            });
        }
        if self.last.is_none_or(|last| now > last) {
            self.last = Some(now);
        }
    }

    /// The mean time between completions as seen at `now`, or `None` before two
    /// completions have been seen.
    pub fn mean_gap_at(&self, now: Instant) -> Option<Duration> {
        let mean = self.mean_gap_secs?;
        let silence = self.last.map_or(0.0, |last| {
            now.saturating_duration_since(last).as_secs_f64()
        });
        Duration::try_from_secs_f64(mean.max(silence)).ok()
    }

    /// Completions per second as seen at `now` (`None` before two completions, or when
    /// they all happened at the same instant).
    pub fn per_second_at(&self, now: Instant) -> Option<f64> {
        let gap = self.mean_gap_at(now)?.as_secs_f64();
        (gap > 0.0).then(|| 1.0 / gap)
    }

    /// The time for `depth` queued calls to drain at the estimated rate.
    pub fn drain_time_at(&self, now: Instant, depth: usize) -> Option<Duration> {
        let gap = self.mean_gap_at(now)?;
        let depth = u32::try_from(depth).unwrap_or(u32::MAX);
        Some(gap.saturating_mul(depth))
    }
}

/// The admission decision, the completion-rate estimate and the pushback jitter of one
/// server. Not shared: wrap it in a lock if several tasks decide.
#[derive(Debug)]
pub struct AdmissionPolicy {
    config: AdmissionConfig,
    rate: CompletionRate,
    rng: fastrand::Rng,
}

impl AdmissionPolicy {
    /// A policy for a valid `config`.
    pub fn new(config: AdmissionConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut config = config;
        // Drawn once and kept, so the adaptive limit built from this policy's config
        // (see `AdmissionQueue::new`) is seeded alike.
        let seed = *config.seed.get_or_insert_with(|| fastrand::u64(..));
        let rng = fastrand::Rng::with_seed(seed);
        Ok(AdmissionPolicy {
            config,
            rate: CompletionRate::new(),
            rng,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &AdmissionConfig {
        &self.config
    }

    /// The completion-rate estimate.
    pub fn completion_rate(&self) -> &CompletionRate {
        &self.rate
    }

    /// Decides what to do with a call of `class` (an [`AttemptClass`], or a
    /// [`CallClass`] with its criticality) arriving at `now` on a queue in state `load`.
    /// A shed decision carries its jittered pushback.
    ///
    /// With no worker free: a full queue sheds; a sheddable call is shed past the
    /// sheddable threshold, a retry past the retry threshold; anything else queues.
    /// (Whether a full queue gives a lower-ranked waiter's place to the call instead is
    /// the queue's business: [`crate::queue::AdmissionQueue`].)
    pub fn decide_at(
        &mut self,
        now: Instant,
        load: QueueLoad,
        class: impl Into<CallClass>,
    ) -> Decision {
        let class = class.into();
        if load.free_workers > 0 {
            return Decision::Admit;
        }
        let reason = if load.depth >= self.config.queue_capacity {
            ShedReason::QueueFull
        } else if class.criticality == Criticality::Sheddable
            && passed(self.config.sheddable_threshold, now, load)
        {
            ShedReason::Sheddable
        } else if class.attempt == AttemptClass::Retry
            && passed(self.config.retry_threshold, now, load)
        {
            ShedReason::RetryThreshold
        } else {
            return Decision::Queue;
        };
        let pushback = self.shed_pushback_at(now, load.depth, class.attempt);
        Decision::Shed(Shed { reason, pushback })
    }

    /// [`AdmissionPolicy::decide_at`] at `Instant::now()`.
    pub fn decide(&mut self, load: QueueLoad, class: impl Into<CallClass>) -> Decision {
        self.decide_at(Instant::now(), load, class)
    }

    /// Records a call finishing on a worker at `now` (feeds the drain estimate).
    pub fn record_completion_at(&mut self, now: Instant) {
        self.rate.record_at(now);
    }

    /// [`AdmissionPolicy::record_completion_at`] at `Instant::now()`.
    pub fn record_completion(&mut self) {
        self.record_completion_at(Instant::now());
    }

    /// The un-jittered estimate of the time until `depth` queued calls have drained and
    /// a worker is free for one more (`(depth + 1) × gap`), clamped to
    /// `[1 ms, pushback_max]`. Before any rate is known it is `pushback_max`.
    ///
    /// The `+ 1` matters without a queue: a call shed with every worker busy and
    /// nothing queued is told to come back when a worker frees up, not "now".
    pub fn drain_estimate_at(&self, now: Instant, depth: usize) -> Duration {
        let max = self.max_pushback_millis();
        let slots = depth.saturating_add(1);
        let estimate = self.rate.drain_time_at(now, slots).map_or(max, |d| {
            // Whole milliseconds, rounded up: 0.3 ms of backlog is 1 ms, not 0.
            let ms = d.as_nanos().div_ceil(1_000_000);
            u64::try_from(ms).unwrap_or(u64::MAX)
        });
        Duration::from_millis(estimate.clamp(1, max))
    }

    /// The pushback for a call shed at `now` with `depth` queued: the drain estimate `e`
    /// ([`AdmissionPolicy::drain_estimate_at`]), jittered uniformly over `[e/2, e]` in
    /// whole milliseconds. Always within `[1 ms, pushback_max]`; never 0.
    pub fn pushback_at(&mut self, now: Instant, depth: usize) -> Duration {
        let estimate = u64::try_from(self.drain_estimate_at(now, depth).as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let low = estimate.div_ceil(2).max(1);
        Duration::from_millis(self.rng.u64(low..=estimate))
    }

    /// [`AdmissionPolicy::pushback_at`] at `Instant::now()`.
    pub fn pushback(&mut self, depth: usize) -> Duration {
        self.pushback_at(Instant::now(), depth)
    }

    /// What a call of `class` shed at `now` with `depth` queued is told: "do not retry"
    /// for a retry at or past [`AdmissionConfig::no_retry_depth`], else
    /// [`AdmissionPolicy::pushback_at`].
    pub fn shed_pushback_at(
        &mut self,
        now: Instant,
        depth: usize,
        class: AttemptClass,
    ) -> ShedPushback {
        let deep = self.config.no_retry_depth.is_some_and(|d| depth >= d);
        if class == AttemptClass::Retry && deep {
            ShedPushback::DoNotRetry
        } else {
            ShedPushback::After(self.pushback_at(now, depth))
        }
    }

    /// When a call queued at `enqueued_at` with deadline `deadline` stops being worth
    /// running: the earlier of `enqueued_at + max_time_queued` and
    /// `deadline - min_time_left`.
    pub fn expiry(&self, enqueued_at: Instant, deadline: Option<Instant>) -> Instant {
        let by_queue = enqueued_at
            .checked_add(self.config.max_time_queued)
            .unwrap_or(enqueued_at);
        match deadline {
            None => by_queue,
            Some(deadline) => {
                let by_deadline = deadline
                    .checked_sub(self.config.min_time_left)
                    .unwrap_or(enqueued_at);
                by_queue.min(by_deadline)
            }
        }
    }

    /// Whether the next free worker goes to the newest queued call (rather than the
    /// oldest) when `depth` calls are queued.
    pub fn serve_newest(&self, depth: usize) -> bool {
        match self.config.queue_order {
            QueueOrder::Fifo => false,
            QueueOrder::AdaptiveLifo { from_depth } => depth >= from_depth,
        }
    }

    fn max_pushback_millis(&self) -> u64 {
        u64::try_from(self.config.pushback_max.as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Twenty pushbacks with no completions yet (the estimate is `pushback_max`).
    fn pushbacks(seed: Option<u64>) -> Vec<Duration> {
        let mut p = AdmissionPolicy::new(AdmissionConfig { seed, ..config() }).unwrap();
        let now = Instant::now();
        (0..20).map(|_| p.pushback_at(now, 8)).collect()
    }

    #[test]
    fn replicas_draw_their_own_pushback_jitter_unless_a_seed_is_set() {
        // Two servers built from the same default config must not send their clients back
        // at the same instants.
        assert_ne!(pushbacks(None), pushbacks(None));
        assert_eq!(pushbacks(Some(7)), pushbacks(Some(7)));
        let policy = AdmissionPolicy::new(config()).unwrap();
        assert!(policy.config().seed.is_some(), "the drawn seed is kept");
    }

    fn config() -> AdmissionConfig {
        AdmissionConfig {
            workers: 2,
            queue_capacity: 10,
            retry_threshold: RetryThreshold {
                depth: Some(4),
                queue_delay: None,
            },
            pushback_max: Duration::from_millis(500),
            ..AdmissionConfig::default()
        }
    }

    fn busy(depth: usize, oldest: Option<Instant>) -> QueueLoad {
        QueueLoad {
            free_workers: 0,
            depth,
            oldest_enqueued: oldest,
        }
    }

    #[test]
    fn class_parsing() {
        use AttemptClass::*;
        type Case = (Option<&'static [u8]>, Option<&'static [u8]>, AttemptClass);
        let cases: &[Case] = &[
            (None, None, First),
            (Some(b"0"), None, First),
            (Some(b"000"), None, First),
            (Some(b" 0 "), None, First),
            (Some(b"1"), None, Retry),
            (Some(b"4294967296000"), None, Retry),
            (Some(b""), None, Retry),
            (Some(b"-1"), None, Retry),
            (Some(b"+0"), None, Retry),
            (Some(b"0x0"), None, Retry),
            (Some(b"\xff"), None, Retry),
            (None, Some(b"0"), First),
            (None, Some(b"3"), Retry),
            (None, Some(b"zero"), Retry),
            // The standard header wins over the older one.
            (Some(b"0"), Some(b"2"), First),
            (Some(b"1"), Some(b"0"), Retry),
        ];
        for (prev, x, want) in cases {
            assert_eq!(
                AttemptClass::from_headers(*prev, *x),
                *want,
                "{prev:?} {x:?}"
            );
        }
    }

    #[test]
    fn validate_names_each_bad_field() {
        let field = |c: AdmissionConfig| match c.validate().unwrap_err() {
            ConfigError::Invalid { field, .. } => field,
            other => panic!("unexpected {other:?}"),
        };
        let base = config();
        assert!(base.validate().is_ok());
        assert_eq!(
            field(AdmissionConfig {
                workers: 0,
                ..base.clone()
            }),
            "admission.workers"
        );
        assert_eq!(
            field(AdmissionConfig {
                retry_threshold: RetryThreshold {
                    depth: Some(11),
                    queue_delay: None
                },
                ..base.clone()
            }),
            "admission.retry_threshold.depth"
        );
        for bad in [
            Duration::ZERO,
            MAX_TIME_QUEUED + Duration::from_millis(1),
            Duration::MAX,
        ] {
            assert_eq!(
                field(AdmissionConfig {
                    max_time_queued: bad,
                    ..base.clone()
                }),
                "admission.max_time_queued"
            );
        }
        for bad in [
            Duration::ZERO,
            Duration::from_micros(999),
            MAX_PUSHBACK + Duration::from_millis(1),
        ] {
            assert_eq!(
                field(AdmissionConfig {
                    pushback_max: bad,
                    ..base.clone()
                }),
                "admission.pushback_max"
            );
        }
        assert_eq!(
            field(AdmissionConfig {
                shed_code: Code::Ok,
                ..base.clone()
            }),
            "admission.shed_code"
        );
        assert_eq!(
            field(AdmissionConfig {
                no_retry_depth: Some(11),
                ..base.clone()
            }),
            "admission.no_retry_depth"
        );
        assert!(AdmissionPolicy::new(AdmissionConfig { workers: 0, ..base }).is_err());
    }

    #[test]
    fn admits_when_a_worker_is_free() {
        let mut p = AdmissionPolicy::new(config()).unwrap();
        let now = Instant::now();
        let load = QueueLoad {
            free_workers: 1,
            depth: 0,
            oldest_enqueued: None,
        };
        assert_eq!(p.decide_at(now, load, AttemptClass::Retry), Decision::Admit);
        assert_eq!(p.decide_at(now, load, AttemptClass::First), Decision::Admit);
    }

    #[test]
    fn retries_are_shed_from_the_threshold_first_attempts_only_when_full() {
        let mut p = AdmissionPolicy::new(config()).unwrap();
        let now = Instant::now();
        for depth in 0..4 {
            assert_eq!(
                p.decide_at(now, busy(depth, Some(now)), AttemptClass::Retry),
                Decision::Queue
            );
        }
        for depth in 4..10 {
            let d = p.decide_at(now, busy(depth, Some(now)), AttemptClass::Retry);
            assert!(
                matches!(
                    d,
                    Decision::Shed(Shed {
                        reason: ShedReason::RetryThreshold,
                        ..
                    })
                ),
                "{depth}: {d:?}"
            );
            assert_eq!(
                p.decide_at(now, busy(depth, Some(now)), AttemptClass::First),
                Decision::Queue
            );
        }
        for class in [AttemptClass::First, AttemptClass::Retry] {
            let d = p.decide_at(now, busy(10, Some(now)), class);
            assert!(
                matches!(
                    d,
                    Decision::Shed(Shed {
                        reason: ShedReason::QueueFull,
                        ..
                    })
                ),
                "{d:?}"
            );
        }
    }

    #[test]
    fn retry_threshold_by_queue_delay() {
        let mut p = AdmissionPolicy::new(AdmissionConfig {
            retry_threshold: RetryThreshold {
                depth: None,
                queue_delay: Some(Duration::from_millis(20)),
            },
            ..config()
        })
        .unwrap();
        let t0 = Instant::now();
        let load = busy(1, Some(t0));
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(
            p.decide_at(at(19), load, AttemptClass::Retry),
            Decision::Queue
        );
        assert!(matches!(
            p.decide_at(at(20), load, AttemptClass::Retry),
            Decision::Shed(_)
        ));
        assert_eq!(
            p.decide_at(at(500), load, AttemptClass::First),
            Decision::Queue
        );
        // No queue, no delay: nothing to shed by.
        assert_eq!(
            p.decide_at(at(500), busy(0, None), AttemptClass::Retry),
            Decision::Queue
        );
    }

    #[test]
    fn without_thresholds_retries_wait_like_first_attempts() {
        let mut p = AdmissionPolicy::new(AdmissionConfig {
            retry_threshold: RetryThreshold {
                depth: None,
                queue_delay: None,
            },
            ..config()
        })
        .unwrap();
        let now = Instant::now();
        assert_eq!(
            p.decide_at(now, busy(9, Some(now)), AttemptClass::Retry),
            Decision::Queue
        );
        assert!(matches!(
            p.decide_at(now, busy(10, Some(now)), AttemptClass::Retry),
            Decision::Shed(_)
        ));
    }

    #[test]
    fn no_retry_depth_tells_deep_retries_not_to_come_back() {
        let mut p = AdmissionPolicy::new(AdmissionConfig {
            no_retry_depth: Some(8),
            ..config()
        })
        .unwrap();
        let now = Instant::now();
        let shed = |d| match d {
            Decision::Shed(s) => s.pushback,
            other => panic!("not shed: {other:?}"),
        };
        assert!(matches!(
            shed(p.decide_at(now, busy(7, Some(now)), AttemptClass::Retry)),
            ShedPushback::After(_)
        ));
        assert_eq!(
            shed(p.decide_at(now, busy(8, Some(now)), AttemptClass::Retry)),
            ShedPushback::DoNotRetry
        );
        assert_eq!(ShedPushback::DoNotRetry.millis(), -1);
        // First attempts are never told not to retry.
        assert!(matches!(
            shed(p.decide_at(now, busy(10, Some(now)), AttemptClass::First)),
            ShedPushback::After(_)
        ));
    }

    #[test]
    fn drain_estimate_follows_the_completion_rate() {
        let mut p = AdmissionPolicy::new(config()).unwrap();
        let t0 = Instant::now();
        // Unknown rate: the maximum.
        assert_eq!(p.drain_estimate_at(t0, 5), Duration::from_millis(500));
        // One completion every 2 ms.
        for i in 0..50 {
            p.record_completion_at(t0 + Duration::from_millis(2 * i));
        }
        let now = t0 + Duration::from_millis(98);
        // 10 queued and this one: 11 completions, 2 ms apart.
        assert_eq!(p.drain_estimate_at(now, 10), Duration::from_millis(22));
        assert_eq!(
            p.completion_rate().per_second_at(now).map(|r| r.round()),
            Some(500.0)
        );
        // Nothing queued: one gap, until a worker frees up.
        assert_eq!(p.drain_estimate_at(now, 0), Duration::from_millis(2));
        // Clamped above.
        assert_eq!(p.drain_estimate_at(now, 10_000), Duration::from_millis(500));
        // A stalled server looks slow, not fast: 50 ms of silence per completion.
        let later = now + Duration::from_millis(50);
        assert_eq!(p.drain_estimate_at(later, 3), Duration::from_millis(200));
    }

    #[test]
    fn drain_estimate_is_never_below_one_millisecond() {
        let mut p = AdmissionPolicy::new(config()).unwrap();
        let t0 = Instant::now();
        // A completion every 10 µs.
        for i in 0..100 {
            p.record_completion_at(t0 + Duration::from_micros(10 * i));
        }
        let now = t0 + Duration::from_micros(990);
        assert_eq!(p.drain_estimate_at(now, 0), Duration::from_millis(1));
        assert_eq!(p.pushback_at(now, 0), Duration::from_millis(1));
        // All at the same instant: a zero gap still gives 1 ms.
        let mut q = AdmissionPolicy::new(config()).unwrap();
        for _ in 0..10 {
            q.record_completion_at(t0);
        }
        assert_eq!(q.drain_estimate_at(t0, 5), Duration::from_millis(1));
    }

    #[test]
    fn pushback_is_jittered_within_half_to_full_estimate() {
        let mut p = AdmissionPolicy::new(config()).unwrap();
        let t0 = Instant::now();
        for i in 0..50 {
            p.record_completion_at(t0 + Duration::from_millis(2 * i));
        }
        let now = t0 + Duration::from_millis(98);
        let values: Vec<u128> = (0..200)
            .map(|_| p.pushback_at(now, 50).as_millis())
            .collect();
        assert!(values.iter().all(|v| (51..=102).contains(v)), "{values:?}");
        let distinct: std::collections::BTreeSet<_> = values.iter().collect();
        assert!(distinct.len() > 20, "not jittered: {distinct:?}");
    }

    #[test]
    fn expiry_is_the_earlier_of_queue_bound_and_deadline() {
        let p = AdmissionPolicy::new(AdmissionConfig {
            max_time_queued: Duration::from_millis(100),
            min_time_left: Duration::from_millis(5),
            ..config()
        })
        .unwrap();
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        assert_eq!(p.expiry(t0, None), t0 + ms(100));
        assert_eq!(p.expiry(t0, Some(t0 + ms(50))), t0 + ms(45));
        assert_eq!(p.expiry(t0, Some(t0 + ms(500))), t0 + ms(100));
        assert_eq!(p.expiry(t0 + ms(10), Some(t0 + ms(12))), t0 + ms(7));
    }

    #[test]
    fn longest_accepted_max_time_queued_does_not_expire_calls_at_once() {
        // `Duration::MAX` used to be accepted, overflowed the instant and made every
        // queued call expire the moment it arrived; the bound keeps expiry in range.
        let p = AdmissionPolicy::new(AdmissionConfig {
            max_time_queued: MAX_TIME_QUEUED,
            ..config()
        })
        .unwrap();
        let t0 = Instant::now();
        assert_eq!(p.expiry(t0, None), t0 + MAX_TIME_QUEUED);
        assert!(
            AdmissionPolicy::new(AdmissionConfig {
                max_time_queued: Duration::MAX,
                ..config()
            })
            .is_err()
        );
    }

    #[test]
    fn adaptive_lifo_switches_at_its_depth() {
        let fifo = AdmissionPolicy::new(AdmissionConfig {
            queue_order: QueueOrder::Fifo,
            ..config()
        })
        .unwrap();
        assert!(!fifo.serve_newest(0) && !fifo.serve_newest(10));
        let lifo = AdmissionPolicy::new(AdmissionConfig {
            queue_order: QueueOrder::AdaptiveLifo { from_depth: 3 },
            ..config()
        })
        .unwrap();
        assert!(!lifo.serve_newest(2));
        assert!(lifo.serve_newest(3));
    }

    proptest! {
        #[test]
        fn class_parsing_never_panics(
            prev in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24)),
            x in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..24)),
        ) {
            let class = AttemptClass::from_headers(prev.as_deref(), x.as_deref());
            if prev.is_none() && x.is_none() {
                prop_assert_eq!(class, AttemptClass::First);
            }
        }

        #[test]
        fn digits_parse_as_their_value(n in any::<u64>()) {
            let want = if n == 0 { AttemptClass::First } else { AttemptClass::Retry };
            prop_assert_eq!(AttemptClass::from_value(n.to_string().as_bytes()), want);
        }

        #[test]
        fn pushback_never_zero_never_above_max(
            max_ms in 1u64..5_000,
            gaps in proptest::collection::vec(0u64..100_000, 0..40),
            silence_us in 0u64..10_000_000,
            depth in 0usize..100_000,
            seed in any::<u64>(),
        ) {
            let mut p = AdmissionPolicy::new(AdmissionConfig {
                pushback_max: Duration::from_millis(max_ms),
                seed: Some(seed),
                ..config()
            }).unwrap();
            let mut now = Instant::now();
            for gap in gaps {
                now += Duration::from_micros(gap);
                p.record_completion_at(now);
            }
            now += Duration::from_micros(silence_us);
            for class in [AttemptClass::First, AttemptClass::Retry] {
                let pb = p.pushback_at(now, depth);
                prop_assert!(pb >= Duration::from_millis(1), "{pb:?}");
                prop_assert!(pb <= Duration::from_millis(max_ms), "{pb:?}");
                let ms = p.shed_pushback_at(now, depth, class).millis();
                prop_assert!((1..=max_ms as i64).contains(&ms), "{ms}");
            }
        }
    }
}
