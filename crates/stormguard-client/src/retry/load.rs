//! Load reports (gRPC ORCA) read from every attempt's answer: the trailers-only headers of
//! an answer before commit, the trailers of a committed one.
//!
//! Why here: this is where the layer already knows how each attempt ended and which
//! replica served it. A report feeds two things, both of which can only lower what the
//! client sends: the controller's [`Saturation`](stormguard_core::Saturation) (a
//! retry or hedge is refused while every endpoint heard from says it is saturated:
//! [`Refusal::Saturated`](stormguard_core::Refusal::Saturated)), and, over an
//! endpoint-aware channel, the weight of the replica that answered (through the call's
//! [`Route`]). A malformed or absurd report is ignored and counted
//! (`load_reports_ignored`), never an error of the call.

use http::{HeaderMap, HeaderName};
use stormguard_core::CallRetry;
use stormguard_core::Code;
use stormguard_core::CommittedCall;
use stormguard_core::Instant;
use stormguard_core::LoadReport;
use stormguard_core::wire::http::{ENDPOINT_LOAD_METRICS_BIN, GRPC_STATUS, first_values};
use stormguard_core::wire::{parse_grpc_status, parse_load_report};

use super::stats::RetryStats;
use crate::replicas::Route;

/// What a report feeds: a call's retry state, or a committed call's.
pub(super) trait Reports {
    fn record_load_report_at(&self, endpoint: u64, report: &LoadReport, now: Instant);
}

impl Reports for CallRetry {
    fn record_load_report_at(&self, endpoint: u64, report: &LoadReport, now: Instant) {
        CallRetry::record_load_report_at(self, endpoint, report, now);
    }
}

impl Reports for CommittedCall {
    fn record_load_report_at(&self, endpoint: u64, report: &LoadReport, now: Instant) {
        CommittedCall::record_load_report_at(self, endpoint, report, now);
    }
}

/// The endpoint key of an attempt over a plain channel (one endpoint as far as the layer
/// can tell).
const CHANNEL: u64 = 0;

/// Reads an answer's `headers` (a trailers-only answer's headers, or a committed answer's
/// trailers) in one pass: feeds its load report, if it has one, to `call`'s saturation and
/// to the replica the route's latest attempt went to, and returns its `grpc-status` (as
/// [`grpc_status`](stormguard_core::wire::http::grpc_status) reads it).
pub(super) fn read(
    headers: &HeaderMap,
    call: Option<&impl Reports>,
    route: Option<&Route>,
    stats: &RetryStats,
) -> Option<Code> {
    // Every answer is read, and few carry a report: a pass over the handful of headers
    // costs less than hashing the names, and the status is found in the same pass.
    // Statics, as a `const` name is built and dropped at each use.
    static STATUS: HeaderName = GRPC_STATUS;
    static REPORT: HeaderName = ENDPOINT_LOAD_METRICS_BIN;
    let [status, report] = first_values(headers, [&STATUS, &REPORT]);
    if report.is_some() {
        feed(headers, call, route, stats);
    }
    status.map(|v| parse_grpc_status(v.as_bytes()))
}

/// Feeds the load report in `headers` (see [`read`]).
fn feed(
    headers: &HeaderMap,
    call: Option<&impl Reports>,
    route: Option<&Route>,
    stats: &RetryStats,
) {
    let Some(parsed) = parse_load_report(
        headers
            .get_all(ENDPOINT_LOAD_METRICS_BIN)
            .iter()
            .map(|v| v.as_bytes()),
    ) else {
        return;
    };
    let report = match parsed {
        Ok(report) => report,
        Err(why) => {
            stats.load_report_ignored();
            tracing::debug!(error = %why, "stormguard: load report ignored");
            return;
        }
    };
    stats.load_report();
    let endpoint = route
        .and_then(Route::last)
        .map_or(CHANNEL, |id| id.get().saturating_add(1));
    if let Some(call) = call {
        call.record_load_report_at(endpoint, &report, Instant::now());
    }
    if let Some(route) = route {
        route.record_load(&report);
    }
}
