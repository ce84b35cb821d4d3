//! OpenTelemetry metrics of a [`ShedLayer`](crate::ShedLayer) (feature `opentelemetry`).
//!
//! [`ShedLayer::with_meter`](crate::ShedLayer::with_meter) registers these on a [`Meter`]
//! the application passes in; no global provider is read or set. The counters and gauges
//! are *observable*: the SDK reads the layer's own counters
//! ([`ShedStats::snapshot`](crate::ShedStats::snapshot)) when it collects, so the exported
//! values are those counters and a call adds no OpenTelemetry work. The time-queued
//! histogram is recorded when a call leaves the queue, a path that already takes the
//! queue's lock; calls admitted at once record nothing.
//!
//! Every series carries `rpc.system = grpc` and `stormguard.layer`, the layer's name
//! ([`ShedLayer::with_name`](crate::ShedLayer::with_name), else the service of its first
//! call that could be shed), so that two layers on one meter export series of their own.
//! A layer named by its first call exports nothing before that call.
//!
//! | name | kind | unit | attributes (besides `rpc.system`, `stormguard.layer`) |
//! |---|---|---|---|
//! | `stormguard.server.admitted` | counter | `{call}` | |
//! | `stormguard.server.shed` | counter | `{call}` | `stormguard.attempt.class` (`first`, `retry`), `stormguard.criticality` (`sheddable`, `default`, `critical`), `stormguard.shed.reason` (`queue_full`, `retry_threshold`, `sheddable`) |
//! | `stormguard.server.expired` | counter | `{call}` | |
//! | `stormguard.server.cancelled_queued` | counter | `{call}` | |
//! | `stormguard.server.cut_at_deadline` | counter | `{call}` | |
//! | `stormguard.server.completed` | counter | `{call}` | |
//! | `stormguard.server.queue.depth` | gauge | `{call}` | |
//! | `stormguard.server.in_flight` | gauge | `{call}` | |
//! | `stormguard.server.workers` | gauge | `{worker}` | |
//! | `stormguard.server.workers.min`, `stormguard.server.workers.max` | gauge | `{worker}` | (the adaptive limit's bounds; not exported for a fixed limit) |
//! | `stormguard.server.queue.time` | histogram | `s` | |

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter, ObservableCounter, ObservableGauge};
use stormguard_core::LayerName;
use stormguard_core::otel::{Spec, counter};

use crate::shed::counters::{Counters, TimeQueuedRecorder};
use crate::shed::gate::Gate;

/// `[rpc.system, stormguard.layer]`, once the layer has a name.
fn base(name: &LayerName) -> Option<[KeyValue; 2]> {
    Some([
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("stormguard.layer", Arc::clone(name.get()?)),
    ])
}

/// Bucket bounds of the time-queued histogram, in seconds (100 µs to 10 s).
const QUEUE_TIME_BOUNDS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0,
];

/// A layer's registered instruments. The meter keeps calling their callbacks as long as
/// it lives, so each queue registers them once.
pub(crate) struct ServerMetrics {
    _counters: Vec<ObservableCounter<u64>>,
    _gauges: Vec<ObservableGauge<u64>>,
    _bounds: Vec<ObservableGauge<u64>>,
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerMetrics").finish_non_exhaustive()
    }
}

/// The histogram a queue records each call's time queued into, with the layer's name.
#[derive(Debug)]
pub(crate) struct QueueTime {
    histogram: Histogram<f64>,
    name: Arc<LayerName>,
}

impl QueueTime {
    fn new(meter: &Meter, name: &Arc<LayerName>) -> Self {
        let histogram = meter
            .f64_histogram("stormguard.server.queue.time")
            .with_description("Time calls spent waiting for a worker (those that queued)")
            .with_unit("s")
            .with_boundaries(QUEUE_TIME_BOUNDS.to_vec())
            .build();
        QueueTime {
            histogram,
            name: Arc::clone(name),
        }
    }

    /// One call waited `waited` for a worker.
    pub(crate) fn record(&self, waited: Duration) {
        if let Some(attrs) = base(&self.name) {
            self.histogram.record(waited.as_secs_f64(), &attrs);
        }
    }
}

/// Registers the observable gauge `spec` on `meter`: `read`'s value, with the layer
/// `name`'s attributes (nothing while it has none).
fn gauge(
    meter: &Meter,
    (metric, description, unit): Spec,
    name: &Arc<LayerName>,
    read: impl Fn() -> u64 + Send + Sync + 'static,
) -> ObservableGauge<u64> {
    let n = Arc::clone(name);
    meter
        .u64_observable_gauge(metric)
        .with_description(description)
        .with_unit(unit)
        .with_callback(move |o| {
            if let Some(attrs) = base(&n) {
                o.observe(read(), &attrs);
            }
        })
        .build()
}

/// Reads one value from `T`.
type Read<T> = fn(&T) -> u64;

/// The counters of calls: `read` picks one from a snapshot.
const COUNTERS: [(Spec, Read<crate::ShedSnapshot>); 5] = [
    (
        (
            "stormguard.server.admitted",
            "Calls given a worker, at once or after queuing",
            "{call}",
        ),
        |s| s.admitted,
    ),
    (
        (
            "stormguard.server.expired",
            "Calls answered DEADLINE_EXCEEDED before running",
            "{call}",
        ),
        |s| s.expired,
    ),
    (
        (
            "stormguard.server.cancelled_queued",
            "Calls whose caller went away while they were queued",
            "{call}",
        ),
        |s| s.cancelled_queued,
    ),
    (
        (
            "stormguard.server.cut_at_deadline",
            "Calls cut on their worker at their deadline, still running or streaming",
            "{call}",
        ),
        |s| s.cut_at_deadline,
    ),
    (
        (
            "stormguard.server.completed",
            "Calls that finished on a worker",
            "{call}",
        ),
        |s| s.completed,
    ),
];

/// The gauges: `read` takes one from the queue's counters.
const GAUGES: [(Spec, Read<Counters>); 3] = [
    (
        (
            "stormguard.server.queue.depth",
            "Calls waiting for a worker",
            "{call}",
        ),
        |c| c.depth() as u64,
    ),
    (
        (
            "stormguard.server.in_flight",
            "Calls holding a worker",
            "{call}",
        ),
        |c| c.snapshot().in_flight as u64,
    ),
    (
        (
            "stormguard.server.workers",
            "The current worker limit (calls that may run at once)",
            "{worker}",
        ),
        |c| c.workers() as u64,
    ),
];

impl ServerMetrics {
    /// Registers the instruments of `queue`, named `name`, on `meter`; `bounds` are an
    /// adaptive limit's (`min_limit`, `max_limit`).
    pub(crate) fn register(
        meter: &Meter,
        gate: &Arc<Gate>,
        name: &Arc<LayerName>,
        bounds: Option<(usize, usize)>,
    ) -> Self {
        let time_queued = QueueTime::new(meter, name);
        gate.counters()
            .record_time_queued_into(TimeQueuedRecorder(Box::new(move |waited| {
                time_queued.record(waited)
            })));
        let mut counters: Vec<ObservableCounter<u64>> = COUNTERS
            .into_iter()
            .map(|(spec, read)| {
                let (g, n) = (Arc::clone(gate), Arc::clone(name));
                counter(meter, spec, move |o| {
                    if let Some(attrs) = base(&n) {
                        o.observe(read(&g.counters().snapshot()), &attrs);
                    }
                })
            })
            .collect();
        counters.push(shed_counter(meter, gate, name));
        let gauges = GAUGES
            .into_iter()
            .map(|(spec, read)| {
                let g = Arc::clone(gate);
                gauge(meter, spec, name, move || read(g.counters()))
            })
            .collect();
        ServerMetrics {
            _counters: counters,
            _gauges: gauges,
            _bounds: bounds.map_or_else(Vec::new, |b| limit_bounds(meter, name, b)),
        }
    }
}

/// `stormguard.server.workers.min` and `.max`: the adaptive limit's bounds, so that a rule
/// can tell a limit pinned at one of them.
fn limit_bounds(
    meter: &Meter,
    name: &Arc<LayerName>,
    (min, max): (usize, usize),
) -> Vec<ObservableGauge<u64>> {
    [
        (
            "stormguard.server.workers.min",
            "The adaptive worker limit's minimum",
            min,
        ),
        (
            "stormguard.server.workers.max",
            "The adaptive worker limit's maximum",
            max,
        ),
    ]
    .into_iter()
    .map(|(metric, description, value)| {
        gauge(meter, (metric, description, "{worker}"), name, move || {
            value as u64
        })
    })
    .collect()
}

/// `stormguard.server.shed`: calls shed, by attempt class, criticality and reason.
fn shed_counter(meter: &Meter, gate: &Arc<Gate>, name: &Arc<LayerName>) -> ObservableCounter<u64> {
    let (g, n) = (Arc::clone(gate), Arc::clone(name));
    let spec = (
        "stormguard.server.shed",
        "Calls answered with the shed status, by class and reason",
        "{call}",
    );
    counter(meter, spec, move |o| {
        let Some([system, layer]) = base(&n) else {
            return;
        };
        for (attempt, criticality, reason, count) in g.counters().shed_breakdown() {
            let attrs = [
                system.clone(),
                layer.clone(),
                KeyValue::new("stormguard.attempt.class", attempt.as_str()),
                KeyValue::new("stormguard.criticality", criticality.as_str()),
                KeyValue::new("stormguard.shed.reason", reason.as_str()),
            ];
            o.observe(count, &attrs);
        }
    })
}
