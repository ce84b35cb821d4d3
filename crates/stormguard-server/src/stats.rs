//! Counters of the admission queue.
//!
//! Counters are atomics updated where the event happens and read without the queue's
//! lock, so reading them costs the server nothing. Every count is cumulative since the
//! layer was built; gauges (`queue_depth`, `in_flight`) are the value at the read.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::shed::drain::{DrainCounts, Drains};
use crate::shed::exempt::Bypassed;
use crate::shed::queue::Queue;

/// A cloneable handle on one [`ShedLayer`](crate::ShedLayer)'s counters.
///
/// Take it from the layer before handing the layer to the server builder:
///
/// ```
/// use stormguard_core::admission::AdmissionConfig;
/// use stormguard_server::ShedLayer;
///
/// let layer = ShedLayer::from_config(AdmissionConfig::default()).expect("valid config");
/// let stats = layer.stats();
/// // ... Server::builder().layer(layer) ...
/// assert_eq!(stats.snapshot().admitted, 0);
/// ```
#[derive(Clone)]
pub struct ShedStats {
    queue: Arc<Queue>,
    drains: Arc<Drains>,
    bypassed: Arc<Bypassed>,
}

impl ShedStats {
    pub(crate) fn new(queue: Arc<Queue>, drains: Arc<Drains>, bypassed: Arc<Bypassed>) -> Self {
        ShedStats {
            queue,
            drains,
            bypassed,
        }
    }

    /// Calls that bypassed the queue because they are never shed (health checks and
    /// the paths named with [`ShedLayer::never_shed`](crate::ShedLayer::never_shed)).
    pub fn never_shed(&self) -> u64 {
        self.bypassed.get()
    }

    /// What happened to the request bodies of calls answered before they were read
    /// (see [`drain`](crate::shed::drain)).
    pub fn drains(&self) -> DrainCounts {
        self.drains.counts()
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        self.queue.snapshot()
    }

    /// The number of workers (the concurrency bound; with an adaptive limit, where it
    /// stands now).
    pub fn workers(&self) -> usize {
        self.queue.workers()
    }

    /// Exact occupancy read under the queue's lock: free workers, calls waiting, and
    /// calls taken off the queue whose future has not yet seen its outcome. At rest
    /// (no call in progress) it is `(workers, 0, 0)`: anything else is a leak.
    pub fn occupancy(&self) -> Occupancy {
        let (free_workers, waiting, unsettled) = self.queue.occupancy();
        Occupancy {
            free_workers,
            waiting,
            unsettled,
        }
    }
}

impl fmt::Debug for ShedStats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShedStats")
            .field("snapshot", &self.snapshot())
            .field("drains", &self.drains())
            .finish()
    }
}

/// The queue's exact occupancy (see [`ShedStats::occupancy`]).
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StatsSnapshot {
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
    /// Calls that may run at once now: the configured workers, or where the adaptive
    /// limit stands.
    pub worker_limit: usize,
    /// The adaptive limit's measured no-load latency, in microseconds (`None` with a
    /// fixed limit, or before its first measurement).
    pub min_latency_us: Option<u64>,
}

impl StatsSnapshot {
    /// Calls shed, whatever their class.
    pub fn shed(&self) -> u64 {
        self.shed_first + self.shed_retry + self.shed_sheddable
    }

    /// Mean time queued of the calls that left the queue (`None` when none did).
    pub fn mean_time_queued(&self) -> Option<Duration> {
        (self.dequeued > 0).then(|| Duration::from_micros(self.time_queued_us / self.dequeued))
    }
}
