//! What the layer tells on-call about the calls it does not run: each one at DEBUG, and at
//! most once a second an INFO summary with the counts by cause.
//!
//! | event | level | fields |
//! |---|---|---|
//! | `stormguard: call shed` (each one) | DEBUG | `stormguard.layer`, `rpc.method`, `shed.class`, `shed.criticality`, `shed.reason`, `shed.queued` (it gave its place up in a full queue), `queue.depth`, `pushback_ms` |
//! | `stormguard: call expired before it could run`, `stormguard: call expired while queued` | DEBUG | `stormguard.layer`, `rpc.method`, `shed.class`, `shed.criticality` |
//! | `stormguard: call cut at its deadline` (each one) | DEBUG | `stormguard.layer`, `rpc.method`, `shed.class`, `shed.criticality`, `cut.streaming` (the handler had answered and its response was streaming) |
//! | `stormguard: N calls shed and M expired in the last S s (worker limit L, adaptive)` | INFO | `stormguard.layer`, `rpc.method` (of the latest), `shed.queue_full`, `shed.retry_threshold`, `shed.sheddable`, `expired`, `queue.depth`, `worker.limit` (where the limit stands), `worker.adaptive` (`false`: a fixed limit), `summary.window_ms` |
//!
//! The summary is written by the first such call at least a second after the previous
//! summary ([`EventSummary`]): a lone shed after a quiet spell is written at once, an
//! overload gives one line a second, and the calls after the last summary wait for the
//! next one.

use std::sync::Arc;

use http::uri::PathAndQuery;
use stormguard_core::CallClass;
use stormguard_core::Instant;
use stormguard_core::{DEFAULT_SUMMARY_INTERVAL, EventSummary, LayerName};
use stormguard_core::{Shed, ShedReason};

use super::gate::Gate;

/// Index of expiries in the summary's counts, after the shed reasons.
const EXPIRED: usize = ShedReason::ALL.len();

/// The event state of one layer (one queue), shared by every call through it.
#[derive(Debug)]
pub(crate) struct ShedEvents {
    name: Arc<LayerName>,
    gate: Arc<Gate>,
    summary: EventSummary<{ ShedReason::ALL.len() + 1 }>,
}

impl ShedEvents {
    pub(crate) fn new(name: Arc<LayerName>, gate: Arc<Gate>) -> Self {
        ShedEvents {
            name,
            gate,
            summary: EventSummary::new(DEFAULT_SUMMARY_INTERVAL, Instant::now()),
        }
    }

    /// The layer's name, shared with its metrics.
    pub(crate) fn name(&self) -> &Arc<LayerName> {
        &self.name
    }

    fn layer(&self) -> &str {
        self.name.get().map_or("", |n| n)
    }

    /// A call to `path` of `class` was shed (`queued`: after waiting, its place given to a
    /// call of a higher criticality).
    pub(crate) fn shed(&self, path: &str, class: CallClass, shed: &Shed, queued: bool) {
        tracing::debug!(
            stormguard.layer = self.layer(),
            rpc.method = path,
            shed.class = class.attempt.as_str(),
            shed.criticality = class.criticality.as_str(),
            shed.reason = shed.reason.as_str(),
            shed.queued = queued,
            queue.depth = self.gate.counters().depth(),
            pushback_ms = shed.pushback.millis(),
            "stormguard: call shed"
        );
        let reason = ShedReason::ALL
            .iter()
            .position(|r| *r == shed.reason)
            .unwrap_or(0);
        self.count(reason, path);
    }

    /// A call to `path` of `class` was answered `DEADLINE_EXCEEDED` before it ran: on
    /// arrival, or while it waited (`queued`).
    pub(crate) fn expired(&self, path: &str, class: CallClass, queued: bool) {
        macro_rules! expired {
            ($message:literal) => {
                tracing::debug!(
                    stormguard.layer = self.layer(),
                    rpc.method = path,
                    shed.class = class.attempt.as_str(),
                    shed.criticality = class.criticality.as_str(),
                    $message
                )
            };
        }
        if queued {
            expired!("stormguard: call expired while queued");
        } else {
            expired!("stormguard: call expired before it could run");
        }
        self.count(EXPIRED, path);
    }

    /// A running call to `path` of `class` was cut at its deadline: before its handler
    /// answered, or while its response streamed (`streaming`).
    pub(crate) fn cut(&self, path: &str, class: CallClass, streaming: bool) {
        tracing::debug!(
            stormguard.layer = self.layer(),
            rpc.method = path,
            shed.class = class.attempt.as_str(),
            shed.criticality = class.criticality.as_str(),
            cut.streaming = streaming,
            "stormguard: call cut at its deadline"
        );
    }

    fn count(&self, cause: usize, path: &str) {
        let Some(summary) = self.summary.record_at(cause, Instant::now()) else {
            return;
        };
        let [queue_full, retry_threshold, sheddable, expired] = summary.counts;
        tracing::info!(
            stormguard.layer = self.layer(),
            rpc.method = path,
            shed.queue_full = queue_full,
            shed.retry_threshold = retry_threshold,
            shed.sheddable = sheddable,
            expired,
            queue.depth = self.gate.counters().depth(),
            worker.limit = self.gate.counters().workers(),
            worker.adaptive = self.gate.counters().adaptive(),
            summary.window_ms = summary.elapsed.as_millis() as u64,
            "stormguard: {} calls shed and {} expired in the last {:.1} s (worker limit {}, {})",
            queue_full + retry_threshold + sheddable,
            expired,
            summary.elapsed.as_secs_f64(),
            self.gate.counters().workers(),
            if self.gate.counters().adaptive() {
                "adaptive"
            } else {
                "fixed"
            },
        );
    }
}

/// What a call's future needs to report how it left the queue (a queued call), or that it
/// was cut at its deadline (a call with a deadline, queued or not).
#[derive(Debug)]
pub(crate) struct QueuedEvents {
    events: Arc<ShedEvents>,
    path: Option<PathAndQuery>,
    class: CallClass,
}

impl QueuedEvents {
    pub(crate) fn new(events: &Arc<ShedEvents>, uri: &http::Uri, class: CallClass) -> Self {
        QueuedEvents {
            events: Arc::clone(events),
            path: uri.path_and_query().cloned(),
            class,
        }
    }

    fn path(&self) -> &str {
        self.path.as_ref().map_or("", |p| p.path())
    }

    /// The call gave its place up in a full queue.
    pub(crate) fn shed(&self, shed: &Shed) {
        self.events.shed(self.path(), self.class, shed, true);
    }

    /// The call expired while it waited.
    pub(crate) fn expired(&self) {
        self.events.expired(self.path(), self.class, true);
    }

    /// The call was cut at its deadline (`streaming`: while its response streamed).
    pub(crate) fn cut(&self, streaming: bool) {
        self.events.cut(self.path(), self.class, streaming);
    }
}
