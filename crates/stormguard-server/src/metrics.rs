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
//! | name | kind | unit | attributes |
//! |---|---|---|---|
//! | `stormguard.server.admitted` | counter | `{call}` | `rpc.system` |
//! | `stormguard.server.shed` | counter | `{call}` | `rpc.system`, `stormguard.attempt.class` (`first`, `retry`), `stormguard.criticality` (`sheddable`, `default`, `critical`), `stormguard.shed.reason` (`queue_full`, `retry_threshold`, `sheddable`) |
//! | `stormguard.server.expired` | counter | `{call}` | `rpc.system` |
//! | `stormguard.server.cancelled_queued` | counter | `{call}` | `rpc.system` |
//! | `stormguard.server.completed` | counter | `{call}` | `rpc.system` |
//! | `stormguard.server.queue.depth` | gauge | `{call}` | `rpc.system` |
//! | `stormguard.server.in_flight` | gauge | `{call}` | `rpc.system` |
//! | `stormguard.server.workers` | gauge | `{worker}` | `rpc.system` |
//! | `stormguard.server.queue.time` | histogram | `s` | none (recorded without attributes, the SDK's cheapest path) |

use std::sync::Arc;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Histogram, Meter, ObservableCounter, ObservableGauge};

use crate::shed::gate::Gate;
use crate::stats::{Counters, StatsSnapshot};

fn system() -> KeyValue {
    KeyValue::new("rpc.system", "grpc")
}

/// Bucket bounds of the time-queued histogram, in seconds (100 µs to 10 s).
const QUEUE_TIME_BOUNDS: [f64; 14] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 10.0,
];

/// A layer's registered instruments; they stay registered while the layer lives.
pub(crate) struct ServerMetrics {
    _counters: Vec<ObservableCounter<u64>>,
    _gauges: Vec<ObservableGauge<u64>>,
}

impl std::fmt::Debug for ServerMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerMetrics").finish_non_exhaustive()
    }
}

/// The histogram a queue records each call's time queued into.
pub(crate) fn queue_time(meter: &Meter) -> Histogram<f64> {
    meter
        .f64_histogram("stormguard.server.queue.time")
        .with_description("Time calls spent waiting for a worker (those that queued)")
        .with_unit("s")
        .with_boundaries(QUEUE_TIME_BOUNDS.to_vec())
        .build()
}

impl ServerMetrics {
    pub(crate) fn register(meter: &Meter, gate: &Arc<Gate>) -> Self {
        type Read = fn(&StatsSnapshot) -> u64;
        let counters: [(&'static str, &'static str, Read); 4] = [
            (
                "stormguard.server.admitted",
                "Calls given a worker, at once or after queuing",
                |s| s.admitted,
            ),
            (
                "stormguard.server.expired",
                "Calls answered DEADLINE_EXCEEDED before running",
                |s| s.expired,
            ),
            (
                "stormguard.server.cancelled_queued",
                "Calls whose caller went away while they were queued",
                |s| s.cancelled_queued,
            ),
            (
                "stormguard.server.completed",
                "Calls that finished on a worker",
                |s| s.completed,
            ),
        ];
        let mut observable: Vec<ObservableCounter<u64>> = counters
            .into_iter()
            .map(|(name, description, read)| {
                let g = Arc::clone(gate);
                meter
                    .u64_observable_counter(name)
                    .with_description(description)
                    .with_unit("{call}")
                    .with_callback(move |o| {
                        o.observe(read(&g.counters().snapshot()), &[system()]);
                    })
                    .build()
            })
            .collect();
        let g = Arc::clone(gate);
        observable.push(
            meter
                .u64_observable_counter("stormguard.server.shed")
                .with_description("Calls answered with the shed status, by class and reason")
                .with_unit("{call}")
                .with_callback(move |o| {
                    for (attempt, criticality, reason, n) in g.counters().shed_breakdown() {
                        let attrs = [
                            system(),
                            KeyValue::new("stormguard.attempt.class", attempt.as_str()),
                            KeyValue::new("stormguard.criticality", criticality.as_str()),
                            KeyValue::new("stormguard.shed.reason", reason.as_str()),
                        ];
                        o.observe(n, &attrs);
                    }
                })
                .build(),
        );

        // (name, description, unit, read)
        type GaugeSpec = (
            &'static str,
            &'static str,
            &'static str,
            fn(&Counters) -> u64,
        );
        let gauges: [GaugeSpec; 3] = [
            (
                "stormguard.server.queue.depth",
                "Calls waiting for a worker",
                "{call}",
                |c| c.depth() as u64,
            ),
            (
                "stormguard.server.in_flight",
                "Calls holding a worker",
                "{call}",
                |c| c.snapshot().in_flight as u64,
            ),
            (
                "stormguard.server.workers",
                "The current worker limit (calls that may run at once)",
                "{worker}",
                |c| c.workers() as u64,
            ),
        ];
        let gauges = gauges
            .into_iter()
            .map(|(name, description, unit, read)| {
                let g = Arc::clone(gate);
                meter
                    .u64_observable_gauge(name)
                    .with_description(description)
                    .with_unit(unit)
                    .with_callback(move |o| o.observe(read(g.counters()), &[system()]))
                    .build()
            })
            .collect();
        ServerMetrics {
            _counters: observable,
            _gauges: gauges,
        }
    }
}
