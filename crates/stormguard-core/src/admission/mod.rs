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
//! - [`CallClass`]: the call's [`AttemptClass`] (first attempt or retry, read from
//!   `grpc-previous-rpc-attempts`, what standard gRPC clients send on retries, or
//!   `x-retry-attempt`, by [`wire::attempt_class`](crate::wire::attempt_class); a
//!   malformed value counts as a retry: a peer cannot buy priority with garbage) and its
//!   [`Criticality`] ([`crate::criticality`]): sheddable work is shed before retries,
//!   retries before the rest ([`CallClass::rank`]).
//! - [`AdmissionPolicy::decide_at`]: admit at once, queue, or shed. **Retries are shed
//!   first**: once the queue passes the [`RetryThreshold`] a retry is answered at once,
//!   while a first attempt is shed only when the queue is full. Under sustained overload
//!   the retries absorb the shedding and first attempts keep the capacity.
//! - [`AdmissionPolicy::pushback_at`]: the `grpc-retry-pushback-ms` to send with a shed
//!   answer: the estimated time for the queue to drain (from the observed completion
//!   rate, [`CompletionRate`]), clamped to `[1 ms, pushback_max]` and jittered so that
//!   the clients told to come back do not all come back together. It is **never 0**:
//!   gRPC C-core clients never finish a call told "retry after 0 ms".
//! - [`AdmissionPolicy::shed_pushback_at`]: whether the shed answer says "come back
//!   after the pushback" or "do not retry" (`-1`). A standard gRPC client (gRPC A6)
//!   comes back after every pushback until its attempts run out, so a pushback is an
//!   invitation to send one more attempt; it is worth sending only when that attempt
//!   can succeed. Two rules, both on by default, say when it cannot:
//!   - **the deadline rule** ([`AdmissionConfig::no_retry_margin`]): the caller's
//!     deadline (`grpc-timeout`) leaves no room for the pushback, the drain of the queue
//!     and a service time ([`AdmissionPolicy::cannot_serve_in_time_at`]). The attempt
//!     would come back too late to be served, for a first attempt as for a retry;
//!   - **the sustained-overload rule** ([`AdmissionConfig::no_retry_after_shedding`]):
//!     the server has been shedding without a break for long enough that the calls it
//!     told to come back have come back into the same overload and been shed again
//!     ([`AdmissionPolicy::shedding_since`]). From then on retries only feed the
//!     overload: each costs a shed answer and a wait and cannot be served.
//!
//!   Measured with a grpcio (C-core) client of 5 attempts against the example server at
//!   1.5× its capacity (`tests/interop/interop.py`, direction 4): without the rules the
//!   server saw about 2.3 attempts per logical call; see `docs/admission.md` for the
//!   figures with them. `no_retry_depth` (off by default) is a third, static rule for
//!   retries.
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
//!     "no_retry_margin": "5ms", "no_retry_after_shedding": "500ms",
//!     "seed": 7,
//!     "sheddable_threshold": { "depth": 0, "queue_delay": null },
//!     "adaptive": { "min_limit": 2, "max_limit": 256, "window": "100ms",
//!                   "min_window_samples": 16, "probe_interval": "30s" } } }
//! ```
//!
//! `queue_order` is `"fifo"` or `"adaptive_lifo"` (newest first from `lifo_from_depth`
//! queued calls, default 8); `null` turns off `retry_threshold.depth`,
//! `retry_threshold.queue_delay`, `sheddable_threshold.*`, `no_retry_depth`,
//! `no_retry_margin`, `no_retry_after_shedding` or `adaptive` (a fixed limit of
//! `workers`). With `adaptive`, `workers` is the starting limit (see [`crate::limit`]).
//!
//! ```
//! use std::time::Duration;
//! use stormguard_core::Instant;
//! use stormguard_core::admission::*;
//! use stormguard_core::wire::attempt_class;
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
//! let first = attempt_class(None, None);
//! let retry = attempt_class(Some(b"1"), None);
//! assert_eq!(policy.decide_at(now, busy(3), first), Admission::Queue);
//! assert!(matches!(policy.decide_at(now, busy(3), retry), Admission::Shed(_)));
//! assert!(matches!(policy.decide_at(now, busy(8), first), Admission::Shed(_)));
//! ```

pub mod dedup;
pub mod limit;
pub mod queue;

use std::time::Duration;

use crate::Instant;

use crate::code::Code;
use crate::criticality::Criticality;
use crate::error::ConfigError;
use crate::limit::AdaptiveLimitConfig;
use crate::wire::AttemptClass;

/// The largest `pushback_max` accepted: one hour. Longer advice is no advice.
pub const MAX_PUSHBACK: Duration = Duration::from_secs(3600);

/// The largest `max_time_queued` accepted: one hour. A call waiting longer has no
/// caller left; and a bound near `Duration::MAX` would not fit in an `Instant`.
pub const MAX_TIME_QUEUED: Duration = Duration::from_secs(3600);

/// The default [`AdmissionConfig::no_retry_margin`]: 5 ms.
pub const DEFAULT_NO_RETRY_MARGIN: Duration = Duration::from_millis(5);

/// The default [`AdmissionConfig::no_retry_after_shedding`]: 500 ms.
pub const DEFAULT_NO_RETRY_AFTER_SHEDDING: Duration = Duration::from_millis(500);

/// What the admission queue knows about a call: its attempt class and its criticality.
///
/// An [`AttemptClass`] alone converts into a `CallClass` of [`Criticality::Default`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct CallClass {
    /// First attempt or retry.
    pub attempt: AttemptClass,
    /// How much the call matters (already capped by the server's table).
    pub criticality: Criticality,
}

impl CallClass {
    /// A call of `attempt` and `criticality`.
    pub fn new(attempt: AttemptClass, criticality: Criticality) -> Self {
        CallClass {
            attempt,
            criticality,
        }
    }

    /// The shed order, lowest shed first: 0 sheddable (any attempt), 1 a retry, 2 a
    /// retry of a critical call, 3 a first attempt, 4 a critical first attempt. When a
    /// full queue gives a waiter's place to a call of higher criticality, it is the
    /// lowest-ranked waiter of lower criticality.
    ///
    /// ```
    /// use stormguard_core::admission::CallClass;
    /// use stormguard_core::criticality::Criticality::*;
    /// use stormguard_core::wire::AttemptClass::{First, Retry};
    ///
    /// let rank = |a, c| CallClass::new(a, c).rank();
    /// assert!(rank(First, Sheddable) < rank(Retry, Default));
    /// // A retry of a critical call is still a retry.
    /// assert!(rank(Retry, Critical) < rank(First, Default));
    /// assert!(rank(First, Default) < rank(First, Critical));
    /// ```
    pub fn rank(self) -> u8 {
        match (self.criticality, self.attempt) {
            (Criticality::Sheddable, _) => 0,
            (Criticality::Default, AttemptClass::Retry) => 1,
            (Criticality::Critical, AttemptClass::Retry) => 2,
            (Criticality::Default, AttemptClass::First) => 3,
            (Criticality::Critical, AttemptClass::First) => 4,
        }
    }
}

impl From<AttemptClass> for CallClass {
    fn from(attempt: AttemptClass) -> Self {
        CallClass::new(attempt, Criticality::Default)
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
    /// The status of a shed answer that says "do not retry" (`grpc-retry-pushback-ms:
    /// -1`), when it should differ from `shed_code`. Not `OK`. Default
    /// `RESOURCE_EXHAUSTED`: a client that reads the pushback does not retry either way,
    /// but most retry loops and library retry policies look only at the code, and retry
    /// `UNAVAILABLE` (gRPC's `retryableStatusCodes` usually list it alone) while leaving
    /// `RESOURCE_EXHAUSTED` alone, so the code carries the advice to them too. `None`:
    /// `shed_code` for every shed answer.
    pub no_retry_code: Option<Code>,
    /// Retries shed while at least this many calls are queued are told "do not retry"
    /// (`grpc-retry-pushback-ms: -1`) instead of a delay. At most `queue_capacity`.
    /// Default `None` (never).
    pub no_retry_depth: Option<usize>,
    /// The deadline rule: a shed call whose deadline leaves no room for the pushback, the
    /// drain of the queue and this much service time is told "do not retry" (`-1`): a
    /// call shed at `now` with `P` of pushback, `E` of drain estimate and deadline `D` is
    /// told `-1` when `now + P + E + no_retry_margin >= D` (see
    /// [`AdmissionPolicy::cannot_serve_in_time_at`] for why this estimate). Applies to
    /// first attempts as well as retries; a call without a deadline is never told `-1`
    /// by it. At most [`MAX_TIME_QUEUED`]. Default 5 ms (about one service time of a
    /// small handler); `None` turns the rule off.
    pub no_retry_margin: Option<Duration>,
    /// The sustained-overload rule: once the server has been shedding without a break
    /// for this long, every shed call is told "do not retry" (`-1`). A break is an
    /// arrival that finds a worker free or the queue below the retry threshold (see
    /// [`AdmissionPolicy::shedding_since`]). At most
    /// [`MAX_TIME_QUEUED`]. Default 500 ms; `None` turns the rule off.
    pub no_retry_after_shedding: Option<Duration>,
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
    /// `UNAVAILABLE`; "do not retry" for a shed call whose deadline leaves no room
    /// (5 ms margin) and for every shed call after 500 ms of shedding without a break.
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
            no_retry_code: Some(Code::ResourceExhausted),
            no_retry_depth: None,
            no_retry_margin: Some(DEFAULT_NO_RETRY_MARGIN),
            no_retry_after_shedding: Some(DEFAULT_NO_RETRY_AFTER_SHEDDING),
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
    /// When a call that got a worker is cut if it is still running (its handler not done,
    /// or its response still streaming), given its caller's `deadline`: `min_time_left`
    /// before it, the instant from which a queued call is no longer worth running. Past it
    /// the caller cannot use the answer; cutting then frees the worker for a call that
    /// can, and answers `DEADLINE_EXCEEDED` before the transport's own timer (tonic's
    /// answers `CANCELLED`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_core::Instant;
    /// use stormguard_core::admission::AdmissionConfig;
    ///
    /// let deadline = Instant::now() + Duration::from_millis(100);
    /// let c = AdmissionConfig { min_time_left: Duration::from_millis(2), ..AdmissionConfig::default() };
    /// assert_eq!(c.cut_at(deadline), deadline - Duration::from_millis(2));
    /// ```
    pub fn cut_at(&self, deadline: Instant) -> Instant {
        deadline.checked_sub(self.min_time_left).unwrap_or(deadline)
    }

    /// The status of a shed answer carrying `pushback`: [`no_retry_code`](Self::no_retry_code)
    /// (when set) for "do not retry", else [`shed_code`](Self::shed_code).
    ///
    /// ```
    /// use stormguard_core::Code;
    /// use stormguard_core::admission::{AdmissionConfig, ShedPushback};
    /// use std::time::Duration;
    ///
    /// let c = AdmissionConfig::default();
    /// assert_eq!(c.code_for(ShedPushback::DoNotRetry), Code::ResourceExhausted);
    /// let later = ShedPushback::After(Duration::from_millis(20));
    /// assert_eq!(c.code_for(later), Code::Unavailable);
    /// ```
    pub fn code_for(&self, pushback: ShedPushback) -> Code {
        match (pushback, self.no_retry_code) {
            (ShedPushback::DoNotRetry, Some(code)) => code,
            _ => self.shed_code,
        }
    }

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
        if self.no_retry_code == Some(Code::Ok) {
            return Err(ConfigError::invalid(
                "admission.no_retry_code",
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
        if let Some(margin) = self.no_retry_margin
            && margin > MAX_TIME_QUEUED
        {
            return Err(ConfigError::invalid(
                "admission.no_retry_margin",
                format!("{margin:?} is above {MAX_TIME_QUEUED:?}"),
            ));
        }
        if let Some(after) = self.no_retry_after_shedding
            && after > MAX_TIME_QUEUED
        {
            return Err(ConfigError::invalid(
                "admission.no_retry_after_shedding",
                format!("{after:?} is above {MAX_TIME_QUEUED:?}"),
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
pub enum Admission {
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
    shedding: Option<Shedding>,
}

/// The current stretch of shedding without a break.
#[derive(Clone, Copy, Debug)]
struct Shedding {
    /// The first shed of the stretch.
    since: Instant,
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
            shedding: None,
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
    ///
    /// The call's deadline is not known here, so the deadline rule
    /// ([`AdmissionConfig::no_retry_margin`]) does not apply; the queue uses
    /// [`AdmissionPolicy::decide_with_deadline_at`].
    pub fn decide_at(
        &mut self,
        now: Instant,
        load: QueueLoad,
        class: impl Into<CallClass>,
    ) -> Admission {
        self.decide_with_deadline_at(now, load, class, None)
    }

    /// [`AdmissionPolicy::decide_at`] for a call with `deadline` (from its
    /// `grpc-timeout`): a shed answer's pushback is decided by
    /// [`AdmissionPolicy::shed_pushback_at`] with it. An arrival that finds a worker free
    /// ends the current stretch of shedding ([`AdmissionPolicy::shedding_since`]).
    pub fn decide_with_deadline_at(
        &mut self,
        now: Instant,
        load: QueueLoad,
        class: impl Into<CallClass>,
        deadline: Option<Instant>,
    ) -> Admission {
        let class = class.into();
        if load.free_workers > 0 {
            // A worker is free: the server is keeping up, whatever it shed before.
            self.shedding = None;
            return Admission::Admit;
        }
        let full = load.depth >= self.config.queue_capacity;
        if !full && !passed(self.config.retry_threshold, now, load) {
            // A retry arriving now would wait for a worker, not be shed: retries are not
            // only feeding the overload.
            self.shedding = None;
        }
        let reason = if full {
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
            return Admission::Queue;
        };
        let pushback = self.shed_pushback_at(now, load.depth, class.attempt, deadline);
        Admission::Shed(Shed { reason, pushback })
    }

    /// [`AdmissionPolicy::decide_at`] at `Instant::now()`.
    pub fn decide(&mut self, load: QueueLoad, class: impl Into<CallClass>) -> Admission {
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

    /// What a call of `class` with `deadline`, shed at `now` with `depth` queued, is told.
    /// This is the one place that decides it. "Do not retry" (`-1`):
    ///
    /// 1. for a retry at or past [`AdmissionConfig::no_retry_depth`];
    /// 2. for any call once the server has been shedding without a break for
    ///    [`AdmissionConfig::no_retry_after_shedding`] (the sustained-overload rule);
    /// 3. for any call whose deadline leaves no room for the pushback, the drain and
    ///    [`AdmissionConfig::no_retry_margin`]
    ///    ([`AdmissionPolicy::cannot_serve_in_time_at`], the deadline rule).
    ///
    /// Otherwise the jittered [`AdmissionPolicy::pushback_at`]. Every call of this method
    /// is a shed, and counts towards the current stretch of shedding.
    ///
    /// Why the second rule: a standard client (gRPC A6) comes back after the pushback
    /// until its attempts run out. Once shedding has gone on for longer than a round of
    /// pushback, the calls told to come back have come back into the same overload, past
    /// the retry threshold, and been shed again: each retry only adds a shed answer to
    /// the server's work and a wait to the caller's. A first attempt shed then (the
    /// queue is full) would come back as such a retry, so it is told `-1` as well.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_core::Instant;
    /// use stormguard_core::admission::{AdmissionConfig, AdmissionPolicy, ShedPushback};
    /// use stormguard_core::wire::AttemptClass;
    ///
    /// let mut policy = AdmissionPolicy::new(AdmissionConfig {
    ///     pushback_max: Duration::from_millis(100),
    ///     no_retry_after_shedding: Some(Duration::from_millis(300)),
    ///     ..AdmissionConfig::default()
    /// }).expect("valid");
    /// let t0 = Instant::now();
    /// let ms = Duration::from_millis;
    /// // No rate known yet: pushback in [50, 100] ms, drain estimate 100 ms.
    /// // 1 s left: room for both and the 5 ms margin.
    /// let p = policy.shed_pushback_at(t0, 4, AttemptClass::Retry, Some(t0 + ms(1000)));
    /// assert!(matches!(p, ShedPushback::After(_)));
    /// // 120 ms left: no room for 50..100 ms of pushback and 100 ms of drain.
    /// let p = policy.shed_pushback_at(t0, 4, AttemptClass::First, Some(t0 + ms(120)));
    /// assert_eq!(p, ShedPushback::DoNotRetry);
    /// // Shedding without a break (no arrival found a free worker or a short queue)...
    /// for t in (50..300).step_by(50) {
    ///     policy.shed_pushback_at(t0 + ms(t), 4, AttemptClass::Retry, None);
    /// }
    /// // ...for 300 ms: every shed call is told not to come back.
    /// let p = policy.shed_pushback_at(t0 + ms(300), 4, AttemptClass::Retry, None);
    /// assert_eq!(p, ShedPushback::DoNotRetry);
    /// ```
    pub fn shed_pushback_at(
        &mut self,
        now: Instant,
        depth: usize,
        class: AttemptClass,
        deadline: Option<Instant>,
    ) -> ShedPushback {
        let shedding_for = self.record_shed_at(now);
        let deep =
            class == AttemptClass::Retry && self.config.no_retry_depth.is_some_and(|d| depth >= d);
        let sustained = self
            .config
            .no_retry_after_shedding
            .is_some_and(|after| shedding_for >= after);
        if deep || sustained {
            return ShedPushback::DoNotRetry;
        }
        let pushback = self.pushback_at(now, depth);
        if self.cannot_serve_in_time_at(now, depth, pushback, deadline) {
            ShedPushback::DoNotRetry
        } else {
            ShedPushback::After(pushback)
        }
    }

    /// Whether a call shed at `now` with `depth` queued and told to come back after
    /// `pushback` could not be served before `deadline`: with `P` the pushback, `E` the
    /// drain estimate ([`AdmissionPolicy::drain_estimate_at`]) and `S`
    /// [`AdmissionConfig::no_retry_margin`], when `now + P + E + S >= deadline`. Never
    /// without a deadline, or with the rule off.
    ///
    /// Why `P + E` and not `max(P, E)`: the server sheds only while it is overloaded, and
    /// a call that comes back into a steady overload finds a queue about as deep as the
    /// one it left, which needs about `E` to drain before a worker is free for it (its
    /// retry is not served before that queue has gone: under adaptive LIFO it may be
    /// served sooner, but only by being preferred over work that is then shed, and past
    /// the retry threshold it is not queued at all). `S` is the time it then needs on a
    /// worker. A call told to come back that cannot finish in time would spend an
    /// attempt, a shed answer and its caller's wait for nothing; a first attempt that
    /// cannot be served in time will not be either when it comes back.
    ///
    /// ```
    /// use std::time::Duration;
    /// use stormguard_core::Instant;
    /// use stormguard_core::admission::{AdmissionConfig, AdmissionPolicy};
    ///
    /// let policy = AdmissionPolicy::new(AdmissionConfig {
    ///     pushback_max: Duration::from_millis(100),
    ///     ..AdmissionConfig::default()
    /// }).expect("valid");
    /// let t0 = Instant::now();
    /// let ms = Duration::from_millis;
    /// // No rate yet: E = 100 ms. P 60 + E 100 + S 5 = 165 ms.
    /// assert!(policy.cannot_serve_in_time_at(t0, 3, ms(60), Some(t0 + ms(165))));
    /// assert!(!policy.cannot_serve_in_time_at(t0, 3, ms(60), Some(t0 + ms(166))));
    /// assert!(!policy.cannot_serve_in_time_at(t0, 3, ms(60), None));
    /// ```
    pub fn cannot_serve_in_time_at(
        &self,
        now: Instant,
        depth: usize,
        pushback: Duration,
        deadline: Option<Instant>,
    ) -> bool {
        let (Some(margin), Some(deadline)) = (self.config.no_retry_margin, deadline) else {
            return false;
        };
        let left = deadline.saturating_duration_since(now);
        let needed = pushback
            .saturating_add(self.drain_estimate_at(now, depth))
            .saturating_add(margin);
        needed >= left
    }

    /// When the current stretch of shedding without a break began, if the server is
    /// shedding: the first shed after a break. A break is an arrival
    /// ([`AdmissionPolicy::decide_with_deadline_at`]) that finds a worker free, or a
    /// queue short enough that a retry would wait in it (not full, below the
    /// [`RetryThreshold`]). So an overload that comes and goes, where retries do get in
    /// between, is not a sustained one; a lull in shedding while the queue stays past
    /// the retry threshold (waiters expiring make room for first attempts) is not a
    /// break, since a retry would still be shed.
    pub fn shedding_since(&self) -> Option<Instant> {
        self.shedding.map(|s| s.since)
    }

    /// Counts a shed at `now`; returns how long the server has been shedding without a
    /// break.
    fn record_shed_at(&mut self, now: Instant) -> Duration {
        let since = self.shedding.map_or(now, |s| s.since.min(now));
        self.shedding = Some(Shedding { since });
        now.saturating_duration_since(since)
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
mod tests;
