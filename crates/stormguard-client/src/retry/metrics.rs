//! OpenTelemetry metrics of a [`RetryLayer`](crate::RetryLayer) (feature `opentelemetry`).
//!
//! [`RetryLayer::with_meter`](crate::RetryLayer::with_meter) registers the instruments
//! below on a [`Meter`] the application passes in: no global provider is read or set.
//! The counters and gauges are *observable*: the SDK reads the layer's own counters (the
//! ones [`RetryStats::snapshot`](crate::RetryStats::snapshot) returns) when it collects, so
//! the exported values are those counters and a call adds no OpenTelemetry work. Calls and
//! attempts by method and final code come from a small lock-free table the layer keeps
//! only when a meter is set ([`MAX_METHODS`] methods, then `_OTHER`). The two histograms
//! are recorded once per logical call, when it ends, through instruments *bound* to the
//! method's (and code's) attributes the first time they are seen (OpenTelemetry's `Bind`
//! capability): a call's record then looks nothing up and hashes no attribute, which is
//! what keeps a layer exported to Prometheus within 1 % of one with no meter
//! (`docs/observability.md` has the figure and its command).
//!
//! Every series carries `rpc.system = grpc` and `stormguard.layer`, the layer's name
//! ([`RetryLayer::with_name`](crate::RetryLayer::with_name), else the service of its first
//! call), so that two layers on one meter export series of their own. A layer named by its
//! first call exports nothing before that call.
//!
//! | name | kind | unit | attributes (besides `rpc.system`, `stormguard.layer`) |
//! |---|---|---|---|
//! | `stormguard.client.calls` | counter | `{call}` | `rpc.service`, `rpc.method` |
//! | `stormguard.client.calls.ended` | counter | `{call}` | the same and `rpc.grpc.status_code` |
//! | `stormguard.client.attempts` | counter | `{attempt}` | `rpc.service`, `rpc.method` |
//! | `stormguard.client.attempts_per_call` | histogram | `{attempt}` | `rpc.service`, `rpc.method` |
//! | `rpc.client.duration` | histogram | `s` | `rpc.service`, `rpc.method`, `rpc.grpc.status_code` |
//! | `stormguard.client.retries` | counter | `{retry}` | |
//! | `stormguard.client.retries.transparent` | counter | `{attempt}` | |
//! | `stormguard.client.retries.refused` | counter | `{retry}` | `stormguard.refusal.cause` |
//! | `stormguard.client.retry.delays` | counter | `{retry}` | `stormguard.delay.source` (`backoff`, `pushback`) |
//! | `stormguard.client.attempt.timeouts` | counter | `{attempt}` | |
//! | `stormguard.client.hedges` | counter | `{attempt}` | |
//! | `stormguard.client.hedges.won` | counter | `{call}` | |
//! | `stormguard.client.hedges.refused` | counter | `{attempt}` | `stormguard.refusal.cause` |
//! | `stormguard.client.throttled` | counter | `{call}` | `stormguard.criticality` (`sheddable`, `default`, `critical`): calls the adaptive throttle refused locally |
//! | `stormguard.client.load_reports` | counter | `{report}` | |
//! | `stormguard.client.load_reports.ignored` | counter | `{report}` | |
//! | `stormguard.client.budget.balance` | gauge | `{retry}` | |
//! | `stormguard.client.breaker.state` | gauge | `1` | `stormguard.breaker.state` (`closed`, `open`, `half_open`: 1 for the current one) |
//!
//! Beside them, the four per-call histograms of gRFC A96 (OpenTelemetry metrics for
//! retries), with A96's attributes only: `grpc.method`, the full method name without its
//! leading slash (`pkg.Service/Method`; `other` for the methods past [`MAX_METHODS`], as
//! gRFC A66 names methods it does not keep apart), and `grpc.target`, the target given to
//! [`RetryLayer::with_target`](crate::RetryLayer::with_target), else the layer's name (the
//! layer cannot see its channel's target). Each is recorded when a call ends, and only for
//! a call that sent more than one attempt: a call without retries or hedges records none
//! of them, and a method none of whose calls did exports no series of them.
//!
//! | name | kind | unit | bucket bounds | recorded |
//! |---|---|---|---|---|
//! | `grpc.client.call.retries` | histogram (u64) | `{retry}` | 1, 2, 3, 4, 5 | the call's retries, not transparent ones, when above 0 |
//! | `grpc.client.call.transparent_retries` | histogram (u64) | `{transparent_retry}` | 1, 2, 3, 4, 5, 10 | its transparent retries, when above 0 |
//! | `grpc.client.call.hedges` | histogram (u64) | `{hedge}` | 1, 2, 3, 4, 5 | the hedges it sent, when above 0 |
//! | `grpc.client.call.retry_delay` | histogram (f64) | `s` | gRFC A66's latency bounds, 0 to 100 s | the total time it had no attempt in flight, waiting out backoff and pushback delays (until the next attempt was sent, or the call ended), when it retried or hedged |
//!
//! The amplification ratio is `sum(stormguard.client.attempts) / sum(stormguard.client.calls)`.
//! A call's final code is recorded when it is known (for a committed call, when its
//! response body ends); a call whose body the caller drops before its end has none, and
//! records neither histogram. `rpc.client.duration` is the logical call's time, from the
//! moment the layer took it to its end: every attempt and every backoff delay, in the shape
//! of OpenTelemetry's RPC conventions (`rpc.method` is the method's name, `rpc.service`
//! its service, `rpc.grpc.status_code` the final code as an integer).

use std::sync::Arc;

use opentelemetry::metrics::{Meter, ObservableCounter};
use stormguard_core::LayerName;
use stormguard_core::RetryController;
use stormguard_core::otel::{self, ControllerGauges, MethodMetrics, Spec};

pub(crate) use stormguard_core::otel::CallMetrics;

use super::stats::RetryStats;
use crate::RetrySnapshot;

/// Distinct methods a layer keeps apart; further ones are counted under `_OTHER` (as
/// OpenTelemetry's RPC conventions advise for unbounded method sets).
pub const MAX_METHODS: usize = otel::MAX_METHODS;

/// Reads one counter from a snapshot.
type Read = fn(&RetrySnapshot) -> u64;

/// The layer-wide counters: `read` picks one from a snapshot.
const LAYER_COUNTERS: [(Spec, Read); 7] = [
    (otel::RETRIES, |s| s.retries),
    (otel::TRANSPARENT_RETRIES, |s| s.transparent_retries),
    (otel::ATTEMPT_TIMEOUTS, |s| s.attempt_timeouts),
    (otel::HEDGES, |s| s.hedges),
    (otel::HEDGES_WON, |s| s.hedges_won),
    (otel::LOAD_REPORTS, |s| s.load_reports),
    (otel::LOAD_REPORTS_IGNORED, |s| s.load_reports_ignored),
];

/// Lists a snapshot's counts by one label's values, to `observe`.
type ReadLabelled = fn(&RetrySnapshot, observe: &mut dyn FnMut(&'static str, u64));

/// The layer-wide counters by one label: its key, and `read` lists each value's count.
const LABELLED_COUNTERS: [(Spec, &str, ReadLabelled); 4] = [
    (otel::HEDGES_REFUSED, otel::REFUSAL_CAUSE, |s, o| {
        s.hedges_refused.iter().for_each(|(cause, n)| o(cause, n))
    }),
    (otel::RETRIES_REFUSED, otel::REFUSAL_CAUSE, |s, o| {
        s.refused.iter().for_each(|(cause, n)| o(cause, n))
    }),
    (otel::THROTTLED, otel::CRITICALITY, |s, o| {
        s.throttled.iter().for_each(|(class, n)| o(class, n))
    }),
    (otel::RETRY_DELAYS, otel::DELAY_SOURCE, |s, o| {
        o("backoff", s.delayed_by_backoff);
        o("pushback", s.delayed_by_pushback);
    }),
];

/// A layer's instruments: the counters by method and the per-call histograms (shared with
/// the `grpc` interceptor, in `stormguard_core::otel`), the layer-wide counters read from
/// its [`RetryStats`], and its controller's gauges. The meter keeps calling their
/// callbacks as long as it lives (an SDK never unregisters them), so each layer registers
/// them once.
#[derive(Debug)]
pub(crate) struct ClientMetrics {
    methods: Arc<MethodMetrics>,
    _counters: Vec<ObservableCounter<u64>>,
    _gauges: ControllerGauges,
}

impl ClientMetrics {
    pub(crate) fn register(
        meter: &Meter,
        stats: &RetryStats,
        controller: &RetryController,
        name: &Arc<LayerName>,
        target: Option<Arc<str>>,
    ) -> Self {
        let mut counters = Vec::with_capacity(LAYER_COUNTERS.len() + LABELLED_COUNTERS.len());
        for (spec, read) in LAYER_COUNTERS {
            let s = stats.clone();
            counters.push(otel::layer_counter(meter, spec, name, move || {
                read(&s.snapshot())
            }));
        }
        for (spec, key, read) in LABELLED_COUNTERS {
            let s = stats.clone();
            counters.push(otel::labelled_counter(meter, spec, key, name, move |o| {
                read(&s.snapshot(), o)
            }));
        }
        ClientMetrics {
            methods: Arc::new(MethodMetrics::register(meter, name, target)),
            _counters: counters,
            _gauges: ControllerGauges::register(meter, controller, name),
        }
    }

    /// Starts counting one logical call to `path`.
    pub(crate) fn call(&self, path: &str) -> CallMetrics {
        self.methods.call(path)
    }
}
