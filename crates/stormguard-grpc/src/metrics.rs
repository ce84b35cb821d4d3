//! OpenTelemetry metrics of a [`RetryInterceptor`](crate::RetryInterceptor) (feature
//! `opentelemetry`): the instruments of the tonic `RetryLayer`, registered through the
//! same code (`stormguard_core::otel`), so that a dashboard reads either client alike.
//!
//! [`RetryInterceptor::with_meter`](crate::RetryInterceptor::with_meter) registers them on
//! a `Meter` the application passes in (nothing global is read or set), when the
//! interceptor starts its first call. Every series carries `rpc.system = grpc` and
//! `stormguard.layer`, the interceptor's name
//! ([`with_name`](crate::RetryInterceptor::with_name), else the service of its first call).
//!
//! | name | kind | unit | attributes (besides `rpc.system`, `stormguard.layer`) |
//! |---|---|---|---|
//! | `stormguard.client.calls` | counter | `{call}` | `rpc.service`, `rpc.method` |
//! | `stormguard.client.calls.ended` | counter | `{call}` | the same and `rpc.grpc.status_code` |
//! | `stormguard.client.attempts` | counter | `{attempt}` | `rpc.service`, `rpc.method` |
//! | `stormguard.client.attempts_per_call` | histogram | `{attempt}` | `rpc.service`, `rpc.method` |
//! | `rpc.client.duration` | histogram | `s` | `rpc.service`, `rpc.method`, `rpc.grpc.status_code` |
//! | `stormguard.client.retries` | counter | `{retry}` | |
//! | `stormguard.client.retries.refused` | counter | `{retry}` | `stormguard.refusal.cause` |
//! | `stormguard.client.retry.delays` | counter | `{retry}` | `stormguard.delay.source` (`backoff`, `pushback`) |
//! | `stormguard.client.attempt.timeouts` | counter | `{attempt}` | |
//! | `stormguard.client.hedges` | counter | `{attempt}` | |
//! | `stormguard.client.hedges.won` | counter | `{call}` | |
//! | `stormguard.client.hedges.refused` | counter | `{attempt}` | `stormguard.refusal.cause` |
//! | `stormguard.client.budget.balance` | gauge | `{retry}` | |
//! | `stormguard.client.breaker.state` | gauge | `1` | `stormguard.breaker.state` |
//!
//! The tonic layer's transparent-retry, throttle and load-report counters are not
//! registered: the interceptor makes no transparent retry (`grpc` 0.9 does not say which
//! attempts were never sent), has no adaptive throttle and reads no load report.
//!
//! Beside them, gRFC A96's four per-call histograms, with `grpc.method` and `grpc.target`
//! (the target given to [`with_target`](crate::RetryInterceptor::with_target), else the
//! interceptor's name), recorded when a call ends and only for a call that sent more than
//! one attempt: `grpc.client.call.retries` (`{retry}`, bounds 1–5),
//! `grpc.client.call.transparent_retries` (`{transparent_retry}`, bounds 1–5 and 10; a
//! call's count is always 0 here, and a count of 0 is not recorded, so this one stays
//! empty), `grpc.client.call.hedges` (`{hedge}`, bounds 1–5) and
//! `grpc.client.call.retry_delay` (`s`, the time the call had no attempt in flight: from
//! an attempt's end to the next attempt handed to the channel).

use std::sync::Arc;

use opentelemetry::metrics::{Meter, ObservableCounter};
use stormguard_core::otel::{self, ControllerGauges, MethodMetrics, Spec};
use stormguard_core::{LayerName, Refusal, RetryController};

pub(crate) use stormguard_core::otel::CallMetrics;

use crate::stats::{InterceptorSnapshot, InterceptorStats};

/// Reads one counter from a snapshot.
type Read = fn(&InterceptorSnapshot) -> u64;

/// The interceptor-wide counters: `read` picks one from a snapshot.
const COUNTERS: [(Spec, Read); 4] = [
    (otel::RETRIES, |s| s.retries),
    (otel::ATTEMPT_TIMEOUTS, |s| s.attempts_timed_out),
    (otel::HEDGES, |s| s.hedges),
    (otel::HEDGES_WON, |s| s.hedges_won),
];

/// Lists a snapshot's counts by one label's values, to `observe`.
type ReadLabelled = fn(&InterceptorSnapshot, observe: &mut dyn FnMut(&'static str, u64));

/// The interceptor-wide counters by one label: its key, and `read` lists each value's
/// count (every cause, 0 included, as the tonic layer's).
const LABELLED: [(Spec, &str, ReadLabelled); 3] = [
    (otel::RETRIES_REFUSED, otel::REFUSAL_CAUSE, |s, o| {
        by_refusal(&s.refused, o)
    }),
    (otel::HEDGES_REFUSED, otel::REFUSAL_CAUSE, |s, o| {
        by_refusal(&s.hedges_refused, o)
    }),
    (otel::RETRY_DELAYS, otel::DELAY_SOURCE, |s, o| {
        o("backoff", s.delayed_by_backoff);
        o("pushback", s.delayed_by_pushback);
    }),
];

/// Lists `counts` (in the order of [`Refusal::ALL`]) by cause.
fn by_refusal(counts: &[u64; Refusal::ALL.len()], observe: &mut dyn FnMut(&'static str, u64)) {
    for (refusal, count) in Refusal::ALL.iter().zip(counts) {
        observe(refusal.as_str(), *count);
    }
}

/// An interceptor's instruments, registered once per configuration (a meter keeps every
/// callback registered on it).
#[derive(Debug)]
pub(crate) struct InterceptorMetrics {
    methods: Arc<MethodMetrics>,
    _counters: Vec<ObservableCounter<u64>>,
    _gauges: ControllerGauges,
}

impl InterceptorMetrics {
    pub(crate) fn register(
        meter: &Meter,
        stats: &InterceptorStats,
        controller: &RetryController,
        name: &Arc<LayerName>,
        target: Option<Arc<str>>,
    ) -> Self {
        let mut counters = Vec::with_capacity(COUNTERS.len() + LABELLED.len());
        for (spec, read) in COUNTERS {
            let s = stats.clone();
            counters.push(otel::layer_counter(meter, spec, name, move || {
                read(&s.snapshot())
            }));
        }
        for (spec, key, read) in LABELLED {
            let s = stats.clone();
            counters.push(otel::labelled_counter(meter, spec, key, name, move |o| {
                read(&s.snapshot(), o)
            }));
        }
        InterceptorMetrics {
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
