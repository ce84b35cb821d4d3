//! The load report each answer carries when the layer is built
//! [`with_load_reports`](super::ShedLayer::with_load_reports): an ORCA `OrcaLoadReport`
//! in the `endpoint-load-metrics-bin` trailer (see [`stormguard_core::LoadReport`]).
//!
//! Why the server says it: its clients can then stop retrying into it *before* it
//! sheds (a stormguard `RetryLayer` refuses retries to a saturated dependency), and an
//! endpoint-aware channel moves calls to replicas with room. The report is built from
//! the queue's lock-free gauges and two rate meters, at the moment the answer ends: a
//! handler's answer carries it in its trailers (its trailers-only header block when it
//! has no body), the layer's own answers (shed, expired, shutting down) in their
//! trailers-only headers.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use http::HeaderMap;
use http::header::HeaderValue;
use stormguard_core::Instant;
use stormguard_core::wire::encode_load_report;
use stormguard_core::wire::http::ENDPOINT_LOAD_METRICS_BIN;
use stormguard_core::{OrcaLoadReport, RateMeter, wire::QUEUE_DEPTH, wire::TIME_QUEUED_MS};

use super::gate::Gate;

/// The layer's rate meters: calls that arrived and calls it shed, per second.
pub(crate) struct LoadReporter {
    meters: Mutex<Meters>,
}

struct Meters {
    arrived: RateMeter,
    shed: RateMeter,
}

impl LoadReporter {
    pub(crate) fn new() -> Self {
        let now = Instant::now();
        LoadReporter {
            meters: Mutex::new(Meters {
                arrived: RateMeter::new_at(now),
                shed: RateMeter::new_at(now),
            }),
        }
    }

    fn meters(&self) -> std::sync::MutexGuard<'_, Meters> {
        self.meters.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A call arrived at `now` (every call the queue sees).
    pub(crate) fn arrived_at(&self, now: Instant) {
        self.meters().arrived.record_at(now);
    }

    /// A call was shed at `now` (the errors of the report's `eps`).
    pub(crate) fn shed_at(&self, now: Instant) {
        self.meters().shed.record_at(now);
    }

    /// The report at `now`, for a call that waited `time_queued` for a worker.
    pub(crate) fn report_at(
        &self,
        gate: &Gate,
        now: Instant,
        time_queued: Duration,
    ) -> OrcaLoadReport {
        let (rps, eps) = {
            let mut m = self.meters();
            (m.arrived.rate_at(now), m.shed.rate_at(now))
        };
        let counters = gate.counters();
        let limit = counters.workers().max(1);
        let mut report = OrcaLoadReport {
            application_utilization: counters.in_flight() as f64 / limit as f64,
            rps_fractional: rps,
            eps,
            ..OrcaLoadReport::default()
        };
        // A metric at zero is left out (a reader takes an absent one for zero): a report
        // from a server with room is 27 bytes of protobuf (36 in base64), one with both
        // named metrics 69 (92).
        let depth = counters.depth();
        if depth > 0 {
            report
                .named_metrics
                .insert(QUEUE_DEPTH.to_owned(), depth as f64);
        }
        if !time_queued.is_zero() {
            report.named_metrics.insert(
                TIME_QUEUED_MS.to_owned(),
                time_queued.as_secs_f64() * 1000.0,
            );
        }
        report
    }
}

impl fmt::Debug for LoadReporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoadReporter").finish_non_exhaustive()
    }
}

/// What one call needs to attach its report: the layer's meters and queue, and when the
/// call arrived and got its worker.
pub(crate) struct CallReport {
    reporter: Arc<LoadReporter>,
    gate: Arc<Gate>,
    arrived: Instant,
    started: Option<Instant>,
}

impl CallReport {
    pub(crate) fn new(reporter: Arc<LoadReporter>, gate: Arc<Gate>, arrived: Instant) -> Self {
        CallReport {
            reporter,
            gate,
            arrived,
            started: None,
        }
    }

    /// The call got a worker at `now` (its time queued ends).
    pub(crate) fn started_at(&mut self, now: Instant) {
        self.started.get_or_insert(now);
    }

    /// The call was shed at `now`.
    pub(crate) fn shed_at(&self, now: Instant) {
        self.reporter.shed_at(now);
    }

    /// Inserts the report at `now` into `headers` (trailers, or trailers-only headers).
    pub(crate) fn attach_at(&self, headers: &mut HeaderMap, now: Instant) {
        let queued = self
            .started
            .unwrap_or(now)
            .saturating_duration_since(self.arrived);
        let report = self.reporter.report_at(&self.gate, now, queued);
        // Base64 is always a valid header value.
        if let Ok(value) = HeaderValue::from_str(&encode_load_report(&report)) {
            headers.insert(ENDPOINT_LOAD_METRICS_BIN, value);
        }
    }
}

impl fmt::Debug for CallReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CallReport")
            .field("started", &self.started.is_some())
            .finish_non_exhaustive()
    }
}

/// Adds the call's load report, when the layer sends them, to one of the layer's own
/// trailers-only answers; `shed` counts it among the errors the report's `eps` gives.
pub(crate) fn with_report<B>(
    mut response: http::Response<B>,
    report: Option<&CallReport>,
    shed: bool,
) -> http::Response<B> {
    if let Some(report) = report {
        let now = stormguard_core::Instant::now();
        if shed {
            report.shed_at(now);
        }
        report.attach_at(response.headers_mut(), now);
    }
    response
}
