//! Admission policy: which work a saturated server keeps, and what it tells the rest.
//!
//! See [`AdmissionController`](crate::AdmissionController) for what it does and why.

pub(crate) mod config;
mod dedup;
mod limit;
mod queue;
mod rates;

pub use config::{AdmissionConfig, CallClass, QueueOrder, RetryThreshold, WorkerLimit};
pub use dedup::{Begin, DedupCounts, DedupTable, Digest, IdempotencyConfig};
pub use limit::AdaptiveLimitConfig;
pub use queue::{AdmissionQueue, Arrival, Dispatch, Left, QueuedId};
pub use rates::RateMeter;

use std::time::Duration;

use tokio::time::Instant;

use crate::criticality::Criticality;
use crate::error::ConfigError;
use crate::wire::AttemptClass;

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

/// The oldest waiting call, as the queue order reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Oldest {
    /// When it was queued.
    pub(crate) enqueued_at: Instant,
    /// When it stops being worth running.
    pub(crate) expiry: Instant,
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
    /// ([`AdmissionQueue`](crate::AdmissionQueue)).
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
pub(crate) enum Admission {
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
pub(crate) struct CompletionRate {
    last: Option<Instant>,
    mean_gap_secs: Option<f64>,
}

impl CompletionRate {
    const WEIGHT: f64 = 1.0 / 16.0;

    /// An estimator with no observations.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// Records one completion at `now`.
    pub(crate) fn record_at(&mut self, now: Instant) {
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
    pub(crate) fn mean_gap_at(&self, now: Instant) -> Option<Duration> {
        let mean = self.mean_gap_secs?;
        let silence = self.last.map_or(0.0, |last| {
            now.saturating_duration_since(last).as_secs_f64()
        });
        Duration::try_from_secs_f64(mean.max(silence)).ok()
    }

    #[cfg(test)]
    /// Completions per second as seen at `now` (`None` before two completions, or when
    /// they all happened at the same instant).
    pub(crate) fn per_second_at(&self, now: Instant) -> Option<f64> {
        let gap = self.mean_gap_at(now)?.as_secs_f64();
        (gap > 0.0).then(|| 1.0 / gap)
    }

    /// The time for `depth` queued calls to drain at the estimated rate.
    pub(crate) fn drain_time_at(&self, now: Instant, depth: usize) -> Option<Duration> {
        let gap = self.mean_gap_at(now)?;
        let depth = u32::try_from(depth).unwrap_or(u32::MAX);
        Some(gap.saturating_mul(depth))
    }
}

/// The admission decision, the completion-rate estimate and the pushback jitter of one
/// server. Not shared: wrap it in a lock if several tasks decide.
///
/// A server that cannot serve everything must choose. Queueing everything turns a short
/// overload into a long one (every queued call times out at the client, is retried, and
/// the retry joins the queue again: the metastable loop in the crate docs). Shedding at
/// random punishes first attempts as much as retries, so users whose *first* call would
/// have succeeded fail too, and their clients retry as well.
///
/// This module is the decision alone, with no queue, no runtime and no transport, so the
/// tower layer in `stormguard-server` and the fleet simulator (which runs on a virtual
/// clock) drive the same code:
///
/// - [`CallClass`]: the call's [`AttemptClass`] (first attempt or retry, read from
///   `grpc-previous-rpc-attempts`, what standard gRPC clients send on retries, or
///   `x-retry-attempt`, by [`wire::attempt_class`](crate::wire::attempt_class); a
///   malformed value counts as a retry: a peer cannot buy priority with garbage) and its
///   [`Criticality`]: sheddable work is shed before retries, retries before the rest
///   (`CallClass::rank`).
/// - `AdmissionController::decide_at`: admit at once, queue, or shed. **Retries are shed
///   first**: once the queue passes the [`RetryThreshold`] a retry is answered at once,
///   while a first attempt is shed only when the queue is full. Under sustained overload
///   the retries absorb the shedding and first attempts keep the capacity.
/// - `AdmissionController::pushback_at`: the `grpc-retry-pushback-ms` to send with a shed
///   answer: the estimated time for the queue to drain (from the observed completion
///   rate), clamped to `[1 ms, pushback_max]` and jittered so that
///   the clients told to come back do not all come back together. It is **never 0**:
///   gRPC C-core clients never finish a call told "retry after 0 ms".
/// - `AdmissionController::shed_pushback_at`: whether the shed answer says "come back
///   after the pushback" or "do not retry" (`-1`). A standard gRPC client (gRPC A6)
///   comes back after every pushback until its attempts run out, so a pushback is an
///   invitation to send one more attempt; it is worth sending only when that attempt
///   can succeed. Two rules, both on by default, say when it cannot:
///   - **the deadline rule** ([`AdmissionConfig::no_retry_margin`]): the caller's
///     deadline (`grpc-timeout`) leaves no room for the pushback, the drain of the queue
///     and a service time (`AdmissionController::cannot_serve_in_time_at`). The attempt
///     would come back too late to be served, for a first attempt as for a retry;
///   - **the sustained-overload rule** ([`AdmissionConfig::no_retry_after_shedding`]):
///     the server has been shedding without a break for long enough that the calls it
///     told to come back have come back into the same overload and been shed again
///     (`AdmissionController::shedding_since`). From then on retries only feed the
///     overload: each costs a shed answer and a wait and cannot be served.
///
///   `docs/admission.md` has what they change for a gRPC C-core client that retries on
///   its own. `no_retry_depth` (off by default) is a third, static rule for
///   retries.
/// - `AdmissionController::expiry`: when queued work stops being worth running (its
///   `grpc-timeout` leaves less than [`AdmissionConfig::min_time_left`], or it has waited
///   [`AdmissionConfig::max_time_queued`]).
/// - `AdmissionController::serve_newest`: FIFO, newest-first once the oldest waiter is late
///   ([`QueueOrder::LifoWhenLate`]), or once a queue has formed
///   ([`QueueOrder::AdaptiveLifo`]).
///
/// Every time-dependent method has an `_at(now)` form taking the instant explicitly. The
/// queue that asks these questions at the right moments is
/// [`AdmissionQueue`](crate::AdmissionQueue).
///
/// # Configuration from JSON
///
/// [`AdmissionConfig::from_json`] reads the same fields under `admission`, with durations
/// written with their unit and codes by name or number ([`AdmissionConfig::from_path`]
/// reads YAML and TOML too). Every field is optional and defaults as in
/// [`AdmissionConfig::default`]; unknown fields are errors, and every error names the
/// field as the document spells it (`admission.retry_threshold.queue_delay`).
/// `AdmissionConfig` implements `serde::Deserialize` for the fields of the `admission`
/// object, with the same checks, so an application can hold it in its own config (see
/// [`ClientConfig`](crate::ClientConfig), beside whose reader it lives).
///
/// ```json
/// { "admission": {
///     "queue_capacity": 1024,
///     "retry_threshold": { "depth": 8, "queue_delay": "20ms" },
///     "max_time_queued": "1s", "min_time_left": "2ms",
///     "queue_order": "lifo_when_late",
///     "pushback_max": "1s", "shed_code": "UNAVAILABLE", "no_retry_depth": 48,
///     "no_retry_margin": "5ms", "no_retry_after_shedding": "500ms",
///     "seed": 7,
///     "sheddable_threshold": { "depth": 0, "queue_delay": null },
///     "adaptive": { "initial_limit": 16, "min_limit": 2, "max_limit": 256, "window": "100ms",
///                   "min_window_samples": 16, "probe_interval": "30s" } } }
/// ```
///
/// `queue_order` is `"lifo_when_late"` (the default), `"fifo"` or `"adaptive_lifo"` (newest
/// first from `lifo_from_depth` queued calls, default 8); `null` turns off `retry_threshold.depth`,
/// `retry_threshold.queue_delay`, `sheddable_threshold.*`, `no_retry_depth`,
/// `no_retry_margin` or `no_retry_after_shedding`.
///
/// The worker limit: **without `workers` it is adaptive** (learned from latency, see
/// [`AdaptiveLimitConfig`](crate::AdaptiveLimitConfig)), with the settings of the `adaptive` object
/// when there is one; `workers: N` alone is a fixed limit of `N` ([`WorkerLimit`]). The
/// documents of earlier versions read as they did: `workers` beside an `adaptive` object
/// is where the adaptive limit starts, and `adaptive: null` is a fixed limit of
/// `workers` (64 when absent).
///
/// ```
/// use stormguard_core::Instant;
/// use stormguard_core::{AdmissionConfig, AdmissionController, AdmissionQueue, Arrival};
/// use stormguard_core::{Dispatch, RetryThreshold, WorkerLimit};
/// use stormguard_core::wire::attempt_class;
///
/// let config = AdmissionConfig {
///     workers: WorkerLimit::Fixed(1),
///     queue_capacity: 3,
///     retry_threshold: RetryThreshold { depth: Some(2), queue_delay: None },
///     ..AdmissionConfig::default()
/// };
/// let mut queue = AdmissionQueue::new(AdmissionController::new(config).expect("valid config"));
/// let now = Instant::now();
/// let ignore = |_: Dispatch<()>| {};
///
/// let first = attempt_class(None, None);
/// let retry = attempt_class(Some(b"1"), None);
/// assert_eq!(queue.arrive_at(now, first, None, (), ignore), Arrival::Run);
/// for _ in 0..2 {
///     assert!(matches!(queue.arrive_at(now, first, None, (), ignore), Arrival::Queued { .. }));
/// }
/// // Two queued: past the retry threshold, a retry is shed, a first attempt still queues.
/// assert!(matches!(queue.arrive_at(now, retry, None, (), ignore), Arrival::Shed(_)));
/// assert!(matches!(queue.arrive_at(now, first, None, (), ignore), Arrival::Queued { .. }));
/// // The queue is full: a first attempt is shed too.
/// assert!(matches!(queue.arrive_at(now, first, None, (), ignore), Arrival::Shed(_)));
/// ```
#[derive(Debug)]
pub struct AdmissionController {
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

impl AdmissionController {
    /// A policy for a valid `config`.
    pub fn new(config: AdmissionConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let mut config = config;
        // Drawn once and kept, so the adaptive limit built from this policy's config
        // (see `AdmissionQueue::new`) is seeded alike.
        let seed = *config.seed.get_or_insert_with(|| fastrand::u64(..));
        let rng = fastrand::Rng::with_seed(seed);
        Ok(AdmissionController {
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

    #[cfg(test)]
    /// The completion-rate estimate.
    pub(crate) fn completion_rate(&self) -> &CompletionRate {
        &self.rate
    }

    #[cfg(test)]
    /// Decides what to do with a call of `class` (an [`AttemptClass`], or a
    /// [`CallClass`] with its criticality) arriving at `now` on a queue in state `load`.
    /// A shed decision carries its jittered pushback.
    ///
    /// With no worker free: a full queue sheds; a sheddable call is shed past the
    /// sheddable threshold, a retry past the retry threshold; anything else queues.
    /// (Whether a full queue gives a lower-ranked waiter's place to the call instead is
    /// the queue's business: [`crate::AdmissionQueue`].)
    ///
    /// The call's deadline is not known here, so the deadline rule
    /// ([`AdmissionConfig::no_retry_margin`]) does not apply; the queue uses
    /// `AdmissionController::decide_with_deadline_at`.
    pub(crate) fn decide_at(
        &mut self,
        now: Instant,
        load: QueueLoad,
        class: impl Into<CallClass>,
    ) -> Admission {
        self.decide_with_deadline_at(now, load, class, None)
    }

    /// `AdmissionController::decide_at` for a call with `deadline` (from its
    /// `grpc-timeout`): a shed answer's pushback is decided by
    /// `AdmissionController::shed_pushback_at` with it. An arrival that finds a worker free
    /// ends the current stretch of shedding ([`AdmissionController::shedding_since`]).
    pub(crate) fn decide_with_deadline_at(
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

    /// Records a call finishing on a worker at `now` (feeds the drain estimate).
    pub(crate) fn record_completion_at(&mut self, now: Instant) {
        self.rate.record_at(now);
    }

    /// The un-jittered estimate of the time until `depth` queued calls have drained and
    /// a worker is free for one more (`(depth + 1) × gap`), clamped to
    /// `[1 ms, pushback_max]`. Before any rate is known it is `pushback_max`.
    ///
    /// The `+ 1` matters without a queue: a call shed with every worker busy and
    /// nothing queued is told to come back when a worker frees up, not "now".
    pub(crate) fn drain_estimate_at(&self, now: Instant, depth: usize) -> Duration {
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
    /// (`AdmissionController::drain_estimate_at`), jittered uniformly over `[e/2, e]` in
    /// whole milliseconds. Always within `[1 ms, pushback_max]`; never 0.
    pub(crate) fn pushback_at(&mut self, now: Instant, depth: usize) -> Duration {
        let estimate = u64::try_from(self.drain_estimate_at(now, depth).as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let low = estimate.div_ceil(2).max(1);
        Duration::from_millis(self.rng.u64(low..=estimate))
    }

    /// What a call of `class` with `deadline`, shed at `now` with `depth` queued, is told.
    /// This is the one place that decides it. "Do not retry" (`-1`):
    ///
    /// 1. for a retry at or past [`AdmissionConfig::no_retry_depth`];
    /// 2. for any call once the server has been shedding without a break for
    ///    [`AdmissionConfig::no_retry_after_shedding`] (the sustained-overload rule);
    /// 3. for any call whose deadline leaves no room for the pushback, the drain and
    ///    [`AdmissionConfig::no_retry_margin`]
    ///    (`AdmissionController::cannot_serve_in_time_at`, the deadline rule).
    ///
    /// Otherwise the jittered `AdmissionController::pushback_at`. Every call of this method
    /// is a shed, and counts towards the current stretch of shedding.
    ///
    /// Why the second rule: a standard client (gRPC A6) comes back after the pushback
    /// until its attempts run out. Once shedding has gone on for longer than a round of
    /// pushback, the calls told to come back have come back into the same overload, past
    /// the retry threshold, and been shed again: each retry only adds a shed answer to
    /// the server's work and a wait to the caller's. A first attempt shed then (the
    /// queue is full) would come back as such a retry, so it is told `-1` as well.
    pub(crate) fn shed_pushback_at(
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
    /// drain estimate (`AdmissionController::drain_estimate_at`) and `S`
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
    pub(crate) fn cannot_serve_in_time_at(
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

    #[cfg(test)]
    /// When the current stretch of shedding without a break began, if the server is
    /// shedding: the first shed after a break. A break is an arrival
    /// ([`AdmissionController::decide_with_deadline_at`]) that finds a worker free, or a
    /// queue short enough that a retry would wait in it (not full, below the
    /// [`RetryThreshold`]). So an overload that comes and goes, where retries do get in
    /// between, is not a sustained one; a lull in shedding while the queue stays past
    /// the retry threshold (waiters expiring make room for first attempts) is not a
    /// break, since a retry would still be shed.
    pub(crate) fn shedding_since(&self) -> Option<Instant> {
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
    pub(crate) fn expiry(&self, enqueued_at: Instant, deadline: Option<Instant>) -> Instant {
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
    /// oldest) at `now`, when `depth` calls are queued and `oldest` is the oldest of them.
    pub(crate) fn serve_newest(&self, now: Instant, depth: usize, oldest: Option<Oldest>) -> bool {
        match self.config.queue_order {
            QueueOrder::Fifo => false,
            QueueOrder::AdaptiveLifo { from_depth } => depth >= from_depth,
            QueueOrder::LifoWhenLate => oldest.is_some_and(|oldest| {
                now.saturating_duration_since(oldest.enqueued_at)
                    >= oldest.expiry.saturating_duration_since(now)
            }),
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
