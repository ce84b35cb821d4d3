//! Counters of the admission queue: where its gate counts ([`Counters`]) and what the
//! [`ShedStats`](crate::ShedStats) handle reads ([`ShedSnapshot`], [`Occupancy`],
//! [`DrainCounts`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde::Serialize;
use stormguard_core::Criticality;
use stormguard_core::wire::AttemptClass;
use stormguard_core::{CallClass, ShedReason};

/// Where one admission gate counts what happens to its calls.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    admitted: AtomicU64,
    completed: AtomicU64,
    shed_first: AtomicU64,
    shed_retry: AtomicU64,
    shed_sheddable: AtomicU64,
    shed_displaced: AtomicU64,
    expired: AtomicU64,
    cancelled_queued: AtomicU64,
    cut_at_deadline: AtomicU64,
    shutting_down: AtomicU64,
    dequeued: AtomicU64,
    time_queued_us: AtomicU64,
    max_time_queued_us: AtomicU64,
    queue_depth: AtomicUsize,
    in_flight: AtomicUsize,
    workers: AtomicUsize,
    /// Whether the worker limit is adaptive (set once, when the gate is built).
    adaptive: bool,
    /// Where each call's time queued is also recorded, once a meter is set.
    #[cfg(feature = "opentelemetry")]
    time_queued: std::sync::OnceLock<TimeQueuedRecorder>,
    /// The adaptive limit's no-load latency in microseconds; 0 until measured.
    min_latency_us: AtomicU64,
    /// Calls shed by attempt class, criticality and reason (see `shed_index`).
    shed_by: [AtomicU64; SHED_CELLS],
}

const CRITICALITIES: [Criticality; 3] = [
    Criticality::Sheddable,
    Criticality::Default,
    Criticality::Critical,
];
const SHED_CELLS: usize = 2 * CRITICALITIES.len() * ShedReason::ALL.len();

/// The cell of `shed_by` that counts calls of `class` shed for `reason`.
fn shed_index(class: CallClass, reason: ShedReason) -> usize {
    let a = match class.attempt {
        AttemptClass::First => 0,
        AttemptClass::Retry => 1,
    };
    let c = CRITICALITIES
        .iter()
        .position(|x| *x == class.criticality)
        .unwrap_or(1);
    let r = ShedReason::ALL
        .iter()
        .position(|x| *x == reason)
        .unwrap_or(0);
    (a * CRITICALITIES.len() + c) * ShedReason::ALL.len() + r
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl Counters {
    /// Zeroed counters of a gate whose worker limit is `adaptive` or fixed.
    pub(crate) fn new(adaptive: bool) -> Self {
        Counters {
            adaptive,
            ..Counters::default()
        }
    }

    /// Whether the worker limit is adaptive.
    pub(crate) fn adaptive(&self) -> bool {
        self.adaptive
    }

    /// A call was given a worker (at once, or after queuing).
    pub(crate) fn record_admitted(&self) {
        bump(&self.admitted);
    }

    /// A call finished on its worker.
    pub(crate) fn record_completed(&self) {
        bump(&self.completed);
    }

    /// A call was answered `DEADLINE_EXCEEDED` before it ran.
    pub(crate) fn record_expired(&self) {
        bump(&self.expired);
    }

    /// A running call was cut at its deadline.
    pub(crate) fn record_cut(&self) {
        bump(&self.cut_at_deadline);
    }

    /// A queued call's caller went away.
    pub(crate) fn record_cancelled_queued(&self) {
        bump(&self.cancelled_queued);
    }

    /// A queued or arriving call was answered because the server is shutting down.
    pub(crate) fn record_shutting_down(&self) {
        bump(&self.shutting_down);
    }

    /// A call of `class` was shed for `reason` on arrival.
    pub(crate) fn record_shed(&self, class: CallClass, reason: ShedReason) {
        let counter = match (class.criticality, class.attempt) {
            (Criticality::Sheddable, _) => &self.shed_sheddable,
            (_, AttemptClass::First) => &self.shed_first,
            (_, AttemptClass::Retry) => &self.shed_retry,
        };
        bump(counter);
        bump(&self.shed_by[shed_index(class, reason)]);
    }

    /// A queued call of `class` was shed for `reason`: a call of a higher criticality
    /// took its place.
    pub(crate) fn record_displaced(&self, class: CallClass, reason: ShedReason) {
        self.record_shed(class, reason);
        bump(&self.shed_displaced);
    }

    /// A call left the queue after waiting `waited`.
    pub(crate) fn record_time_queued(&self, waited: Duration) {
        let us = micros(waited);
        bump(&self.dequeued);
        self.time_queued_us.fetch_add(us, Ordering::Relaxed);
        self.max_time_queued_us.fetch_max(us, Ordering::Relaxed);
        #[cfg(feature = "opentelemetry")]
        if let Some(recorder) = self.time_queued.get() {
            (recorder.0)(waited);
        }
    }

    /// The gauges after a change: calls queued, calls on a worker, the worker limit, and
    /// the adaptive limit's no-load latency once measured.
    pub(crate) fn set_gauges(
        &self,
        depth: usize,
        in_flight: usize,
        workers: usize,
        min_latency: Option<Duration>,
    ) {
        self.queue_depth.store(depth, Ordering::Relaxed);
        self.in_flight.store(in_flight, Ordering::Relaxed);
        self.workers.store(workers, Ordering::Relaxed);
        if let Some(m) = min_latency {
            let us = micros(m).max(1);
            self.min_latency_us.store(us, Ordering::Relaxed);
        }
    }

    /// Calls waiting for a worker now.
    pub(crate) fn depth(&self) -> usize {
        self.queue_depth.load(Ordering::Relaxed)
    }

    /// Calls on a worker now.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The number of workers (the concurrency limit) now.
    pub(crate) fn workers(&self) -> usize {
        self.workers.load(Ordering::Relaxed)
    }

    /// Every counter now.
    pub(crate) fn snapshot(&self) -> ShedSnapshot {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ShedSnapshot {
            admitted: get(&self.admitted),
            completed: get(&self.completed),
            shed_first: get(&self.shed_first),
            shed_retry: get(&self.shed_retry),
            shed_sheddable: get(&self.shed_sheddable),
            shed_displaced: get(&self.shed_displaced),
            expired: get(&self.expired),
            cancelled_queued: get(&self.cancelled_queued),
            cut_at_deadline: get(&self.cut_at_deadline),
            shutting_down: get(&self.shutting_down),
            queue_depth: self.depth(),
            in_flight: self.in_flight.load(Ordering::Relaxed),
            dequeued: get(&self.dequeued),
            time_queued_us: get(&self.time_queued_us),
            max_time_queued_us: get(&self.max_time_queued_us),
            worker_limit: self.workers(),
            adaptive_limit: self.adaptive(),
            min_latency_us: Some(get(&self.min_latency_us)).filter(|us| *us > 0),
        }
    }

    /// Records each call's time queued into `histogram` from now on (the first one set
    /// stays).
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn record_time_queued_into(&self, recorder: TimeQueuedRecorder) {
        let _ = self.time_queued.set(recorder);
    }

    /// Calls shed so far by attempt class, criticality and reason (every combination, zeros
    /// included): `(attempt, criticality, reason, count)`.
    #[cfg(feature = "opentelemetry")]
    pub(crate) fn shed_breakdown(
        &self,
    ) -> impl Iterator<Item = (AttemptClass, Criticality, ShedReason, u64)> + '_ {
        [AttemptClass::First, AttemptClass::Retry]
            .into_iter()
            .flat_map(|a| CRITICALITIES.into_iter().map(move |c| (a, c)))
            .flat_map(|(a, c)| ShedReason::ALL.into_iter().map(move |r| (a, c, r)))
            .map(|(a, c, r)| {
                let n = self.shed_by[shed_index(CallClass::new(a, c), r)].load(Ordering::Relaxed);
                (a, c, r, n)
            })
    }
}

/// The queue's exact occupancy (see [`ShedStats::occupancy`](crate::ShedStats::occupancy)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Occupancy {
    /// Workers not running a call.
    pub free_workers: usize,
    /// Calls waiting for a worker.
    pub waiting: usize,
    /// Calls granted a worker or expired whose future has not yet looked.
    pub unsettled: usize,
}

/// The counters of one admission queue at one moment. Serializes to one JSON object.
///
/// Counters are atomics updated where the event happens and read without the queue's
/// lock, so reading them costs the server nothing. Every count is cumulative since the
/// layer was built; gauges (`queue_depth`, `in_flight`) are the value at the read. A
/// layer's [`ShedStats`](crate::ShedStats) handle reads them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ShedSnapshot {
    /// Calls given a worker (at once or after queuing).
    pub admitted: u64,
    /// Calls that finished (with any status) on a worker: the handler returned and the
    /// response body ended (for a stream, its last message and trailers were read).
    pub completed: u64,
    /// First attempts answered with the shed status (sheddable ones are counted apart).
    pub shed_first: u64,
    /// Retries answered with the shed status (sheddable ones are counted apart).
    pub shed_retry: u64,
    /// Calls of the `sheddable` criticality answered with the shed status.
    pub shed_sheddable: u64,
    /// Of the calls counted in `shed_first`, `shed_retry` and `shed_sheddable`, those
    /// answered after queuing, because a call of a higher criticality took their place
    /// in a full queue.
    pub shed_displaced: u64,
    /// Calls answered `DEADLINE_EXCEEDED` before running: too little time left, or
    /// queued longer than `max_time_queued`.
    pub expired: u64,
    /// Calls whose caller went away (cancelled, timed out, reset) while queued.
    pub cancelled_queued: u64,
    /// Calls cut on their worker because their deadline (`grpc-timeout`, less
    /// `min_time_left`) passed while the handler still ran or its response still streamed:
    /// answered `DEADLINE_EXCEEDED` (trailers-only, or trailers after the messages sent so
    /// far), the handler's future or stream dropped and the worker given back at once. Not
    /// in `completed`.
    pub cut_at_deadline: u64,
    /// Calls answered `UNAVAILABLE` because the server was shutting down (see
    /// [`ShutdownHandle`](crate::ShutdownHandle)): the ones queued when it began,
    /// and every call that arrived after.
    pub shutting_down: u64,
    /// Calls waiting for a worker now.
    pub queue_depth: usize,
    /// Calls holding a worker now (running, or streaming their response).
    pub in_flight: usize,
    /// Calls that left the queue (to run, expired or cancelled).
    pub dequeued: u64,
    /// Total time spent queued by the calls that left the queue, in microseconds.
    pub time_queued_us: u64,
    /// The longest time one call spent queued, in microseconds.
    pub max_time_queued_us: u64,
    /// Calls that may run at once now: where the adaptive limit stands, or the fixed
    /// number.
    pub worker_limit: usize,
    /// Whether the worker limit is adaptive, learned from latency (the default), rather
    /// than a fixed number (`WorkerLimit::Fixed`).
    pub adaptive_limit: bool,
    /// The adaptive limit's measured no-load latency, in microseconds (`None` with a
    /// fixed limit, or before its first measurement).
    pub min_latency_us: Option<u64>,
}

impl ShedSnapshot {
    /// Calls shed, whatever their class.
    pub fn shed(&self) -> u64 {
        self.shed_first + self.shed_retry + self.shed_sheddable
    }

    /// Mean time queued of the calls that left the queue (`None` when none did).
    pub fn mean_time_queued(&self) -> Option<Duration> {
        (self.dequeued > 0).then(|| Duration::from_micros(self.time_queued_us / self.dequeued))
    }
}

/// Where each call's time queued goes once a meter is set (the metrics module's histogram
/// with the layer's name), as a function so that these counters depend on nothing else.
#[cfg(feature = "opentelemetry")]
pub(crate) struct TimeQueuedRecorder(pub(crate) Box<dyn Fn(Duration) + Send + Sync>);

#[cfg(feature = "opentelemetry")]
impl std::fmt::Debug for TimeQueuedRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TimeQueuedRecorder")
    }
}

/// Counters of the request bodies read after early answers (see
/// [`ShedStats::drains`](crate::ShedStats::drains)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DrainCounts {
    /// Bodies read to their end.
    pub ended: u64,
    /// Bodies dropped unfinished at [`MAX_BYTES`](crate::shed::drain::MAX_BYTES) or [`MAX_TIME`](crate::shed::drain::MAX_TIME) (the stream is reset).
    pub cut: u64,
    /// Bodies dropped unread because [`MAX_DRAINS`](crate::shed::drain::MAX_DRAINS) were already being read.
    pub skipped: u64,
    /// Bodies being read now.
    pub active: usize,
}

/// `d` in whole microseconds, saturating: in 64-bit arithmetic, as the gauges are set on
/// every call (`Duration::as_micros` divides a 128-bit integer).
fn micros(d: Duration) -> u64 {
    d.as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()))
}
