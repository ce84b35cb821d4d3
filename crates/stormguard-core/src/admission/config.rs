//! What a server's admission decides by: [`AdmissionConfig`] and its parts.

use std::time::Duration;

use tokio::time::Instant;

use super::ShedPushback;
use super::limit::AdaptiveLimitConfig;
use crate::criticality::Criticality;
use crate::error::ConfigError;
use crate::field::check;
use crate::wire::AttemptClass;
use crate::wire::code::Code;

/// The largest `pushback_max` accepted: one hour. Longer advice is no advice.
pub(crate) const MAX_PUSHBACK: Duration = Duration::from_secs(3600);

/// The largest `max_time_queued` accepted: one hour. A call waiting longer has no
/// caller left; and a bound near `Duration::MAX` would not fit in an `Instant`.
pub(crate) const MAX_TIME_QUEUED: Duration = Duration::from_secs(3600);

/// The default [`AdmissionConfig::no_retry_margin`]: 5 ms.
pub(crate) const DEFAULT_NO_RETRY_MARGIN: Duration = Duration::from_millis(5);

/// The default [`AdmissionConfig::no_retry_after_shedding`]: 500 ms.
pub(crate) const DEFAULT_NO_RETRY_AFTER_SHEDDING: Duration = Duration::from_millis(500);

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
    pub(crate) fn rank(self) -> u8 {
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
/// [`LifoWhenLate`](QueueOrder::LifoWhenLate) is the default: under a capacity drop,
/// serving the newest calls keeps the work whose callers are still waiting, and the server
/// both serves more and abandons less mid-run than with FIFO; while the queue drains within
/// its callers' deadlines, the oldest are served first, so a crowd of callers is served in
/// turn (`docs/admission.md`, "Queue order", has the runs).
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
    /// Oldest first while the oldest waiter has waited less than the time it has left
    /// before its expiry; newest first from then on.
    ///
    /// A queue's depth does not tell a crowd from an overload: 256 callers of a service
    /// that answers each within a few milliseconds keep a deep queue that drains well
    /// within every deadline, and serving it newest first would leave its oldest calls
    /// waiting until they expire. Time does tell: once the oldest call has spent half of
    /// what it could wait, the queue is not draining within its callers' deadlines, and
    /// from then on serving the oldest serves calls whose callers are about to give up.
    LifoWhenLate,
}

/// How many calls the admission queue lets run at once.
///
/// [`Adaptive`](WorkerLimit::Adaptive) is the default: the limit is learned from
/// measured latency ([`AdaptiveLimitConfig`](crate::AdaptiveLimitConfig)), so a server needs no
/// number to keep its real capacity busy and the rest of its work in the queue, where it
/// is ordered, expired and shed. [`Fixed`](WorkerLimit::Fixed) is for a handler whose
/// capacity is known and does not move (`docs/admission.md` says when, and what it costs
/// when the number is wrong).
///
/// ```
/// use stormguard_core::{AdmissionConfig, WorkerLimit};
///
/// // Learned from latency: nothing to size.
/// assert!(AdmissionConfig::default().workers.is_adaptive());
/// // Exactly 8 at once: the handler runs a pool of 8.
/// let sized = AdmissionConfig { workers: WorkerLimit::Fixed(8), ..AdmissionConfig::default() };
/// assert_eq!(sized.workers.fixed(), Some(8));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum WorkerLimit {
    /// Learned from latency, between the bounds and at the pace given here.
    Adaptive(AdaptiveLimitConfig),
    /// Exactly this many (at least 1).
    Fixed(usize),
}

impl Default for WorkerLimit {
    /// Adaptive, with [`AdaptiveLimitConfig::default`].
    fn default() -> Self {
        WorkerLimit::Adaptive(AdaptiveLimitConfig::default())
    }
}

impl WorkerLimit {
    /// Whether the limit is learned from latency.
    pub fn is_adaptive(&self) -> bool {
        matches!(self, WorkerLimit::Adaptive(_))
    }

    /// The fixed number, if the limit is fixed.
    pub fn fixed(&self) -> Option<usize> {
        match self {
            WorkerLimit::Fixed(n) => Some(*n),
            WorkerLimit::Adaptive(_) => None,
        }
    }

    /// The limit before any call has been measured: the fixed number, or where the
    /// adaptive limit starts.
    pub(crate) fn initial(&self) -> usize {
        match self {
            WorkerLimit::Fixed(n) => *n,
            WorkerLimit::Adaptive(c) => c.initial_limit.clamp(c.min_limit, c.max_limit),
        }
    }
}

/// Configuration of the admission queue. Each field says what it accepts;
/// [`AdmissionController::new`](crate::AdmissionController::new) refuses anything else, with an
/// error that names the first bad field (`admission.<field>`).
#[derive(Clone, Debug, PartialEq)]
pub struct AdmissionConfig {
    /// How many calls are served at the same time. Default: adaptive, learned from
    /// latency ([`WorkerLimit`]); `WorkerLimit::Fixed(n)` (n at least 1) for exactly `n`.
    pub workers: WorkerLimit,
    /// Calls that may wait for a worker; beyond it every call is shed. 0 means no queue.
    /// Default 1 024: a bound on memory, not the overload's limit. A crowd of callers that
    /// the service answers well within their deadlines waits here rather than being shed
    /// (256 callers of a healthy service keep hundreds queued); under overload, retries
    /// are shed from [`retry_threshold`](Self::retry_threshold) on, and queued calls
    /// expire at their deadlines and are served newest first
    /// ([`QueueOrder::LifoWhenLate`]) long before the queue is full.
    pub queue_capacity: usize,
    /// When retries start to be shed. Default: 8 queued calls.
    pub retry_threshold: RetryThreshold,
    /// The longest a call may wait for a worker; after it the call is answered
    /// `DEADLINE_EXCEEDED` without running. Above zero, at most one hour.
    /// Default 1 s.
    pub max_time_queued: Duration,
    /// Queued work whose `grpc-timeout` leaves less than this is answered
    /// `DEADLINE_EXCEEDED` without running: it could not finish in time, and running it
    /// would only take a worker from a call that can. It also makes the queue answer
    /// before the transport's own timeout fires (tonic answers that one `CANCELLED`).
    /// Default 2 ms.
    pub min_time_left: Duration,
    /// FIFO or adaptive LIFO. Default: adaptive LIFO from 8 queued (see [`QueueOrder`]).
    pub queue_order: QueueOrder,
    /// The largest `grpc-retry-pushback-ms` sent. Between 1 ms and one hour.
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
    /// `AdmissionController::cannot_serve_in_time_at` for why this estimate). Applies to
    /// first attempts as well as retries; a call without a deadline is never told `-1`
    /// by it. At most one hour. Default 5 ms (about one service time of a
    /// small handler); `None` turns the rule off.
    pub no_retry_margin: Option<Duration>,
    /// The sustained-overload rule: once the server has been shedding without a break
    /// for this long, every shed call is told "do not retry" (`-1`). A break is an
    /// arrival that finds a worker free or the queue below the retry threshold (see
    /// `AdmissionController::shedding_since`). At most
    /// one hour. Default 500 ms; `None` turns the rule off.
    pub no_retry_after_shedding: Option<Duration>,
    /// Whether a shed answer that tells the client when to come back also carries it as a
    /// `google.rpc.RetryInfo` in `grpc-status-details-bin` (a `google.rpc.Status` with the
    /// answer's code and message), for clients of Google's rich error model that do not
    /// read `grpc-retry-pushback-ms`. The delay is the header's; a "do not retry" answer
    /// has no RetryInfo (it cannot say "never"). Default `false`: a shed answer stays a few
    /// static headers.
    pub retry_info: bool,
    /// Seed of the pushback jitter. Default `None`: a seed drawn for each policy when it is
    /// built, so that replicas of a service do not all draw the same jitter sequence (and
    /// send their clients back together); set one only to reproduce a run.
    pub seed: Option<u64>,
    /// When calls of [`Criticality::Sheddable`] start to be shed: once either set
    /// condition holds. Default depth 0: a sheddable call runs if a worker is free and
    /// is shed rather than queued otherwise, before any retry is.
    pub sheddable_threshold: RetryThreshold,
}

impl Default for AdmissionConfig {
    /// An adaptive worker limit, 1 024 queued, retries shed from 8 queued, 1 s in queue at most,
    /// 2 ms minimum time left, newest first once the oldest call is late
    /// ([`QueueOrder::LifoWhenLate`]), pushback at most 1 s, shed with
    /// `UNAVAILABLE`; "do not retry" for a shed call whose deadline leaves no room
    /// (5 ms margin) and for every shed call after 500 ms of shedding without a break.
    fn default() -> Self {
        AdmissionConfig {
            workers: WorkerLimit::default(),
            queue_capacity: 1024,
            retry_threshold: RetryThreshold::default(),
            max_time_queued: Duration::from_secs(1),
            min_time_left: Duration::from_millis(2),
            queue_order: QueueOrder::LifoWhenLate,
            pushback_max: Duration::from_secs(1),
            shed_code: Code::Unavailable,
            no_retry_code: Some(Code::ResourceExhausted),
            no_retry_depth: None,
            no_retry_margin: Some(DEFAULT_NO_RETRY_MARGIN),
            no_retry_after_shedding: Some(DEFAULT_NO_RETRY_AFTER_SHEDDING),
            retry_info: false,
            seed: None,
            sheddable_threshold: RetryThreshold {
                depth: Some(0),
                queue_delay: None,
            },
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
    /// use stormguard_core::AdmissionConfig;
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
    /// use stormguard_core::{AdmissionConfig, ShedPushback};
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
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match &self.workers {
            WorkerLimit::Fixed(n) => check::at_least_one("admission.workers", *n as u64)?,
            WorkerLimit::Adaptive(adaptive) => adaptive.validate()?,
        }
        let capacity = self.queue_capacity;
        let depth = self.retry_threshold.depth;
        check::within_capacity("admission.retry_threshold.depth", depth, capacity)?;
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
        for (field, code) in [
            ("admission.shed_code", Some(self.shed_code)),
            ("admission.no_retry_code", self.no_retry_code),
        ] {
            if code == Some(Code::Ok) {
                return Err(ConfigError::invalid(field, "a shed answer cannot be OK"));
            }
        }
        check::within_capacity("admission.no_retry_depth", self.no_retry_depth, capacity)?;
        check::not_above(
            "admission.no_retry_margin",
            self.no_retry_margin,
            MAX_TIME_QUEUED,
        )?;
        let after = self.no_retry_after_shedding;
        check::not_above("admission.no_retry_after_shedding", after, MAX_TIME_QUEUED)?;
        let depth = self.sheddable_threshold.depth;
        check::within_capacity("admission.sheddable_threshold.depth", depth, capacity)?;
        Ok(())
    }
}
