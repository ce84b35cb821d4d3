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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{
    AsyncInstrument, BoundHistogram, Histogram, Meter, ObservableCounter, ObservableGauge,
};
use stormguard_core::Code;
use stormguard_core::Instant;
use stormguard_core::RetryController;
use stormguard_core::{LayerName, split_path};

use super::stats::RetryStats;
use crate::RetrySnapshot;

/// Distinct methods a layer keeps apart; further ones are counted under `_OTHER` (as
/// OpenTelemetry's RPC conventions advise for unbounded method sets).
pub const MAX_METHODS: usize = 128;

/// Bucket bounds of `rpc.client.duration`, in seconds: those OpenTelemetry's semantic
/// conventions advise for durations in seconds.
const DURATION_BOUNDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// Bucket bounds of `stormguard.client.attempts_per_call` (A6 caps attempts at 5).
const ATTEMPTS_BOUNDS: [f64; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];

/// Bucket bounds of `grpc.client.call.retries` and `grpc.client.call.hedges` (gRFC A96).
const RETRIES_BOUNDS: [f64; 5] = [1.0, 2.0, 3.0, 4.0, 5.0];

/// Bucket bounds of `grpc.client.call.transparent_retries` (gRFC A96).
const TRANSPARENT_BOUNDS: [f64; 6] = [1.0, 2.0, 3.0, 4.0, 5.0, 10.0];

/// Bucket bounds of `grpc.client.call.retry_delay`, in seconds: gRFC A66's latency bounds
/// (the ones gRPC's own per-call durations use).
const RETRY_DELAY_BOUNDS: [f64; 41] = [
    0.0, 0.000_01, 0.000_05, 0.000_1, 0.000_3, 0.000_6, 0.000_8, 0.001, 0.002, 0.003, 0.004, 0.005,
    0.006, 0.008, 0.01, 0.013, 0.016, 0.02, 0.025, 0.03, 0.04, 0.05, 0.065, 0.08, 0.1, 0.13, 0.16,
    0.2, 0.25, 0.3, 0.4, 0.5, 0.65, 0.8, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0,
];

/// `rpc.system = grpc`, on every series.
fn system() -> KeyValue {
    KeyValue::new("rpc.system", "grpc")
}

/// `stormguard.layer = name`.
fn layer(name: &Arc<str>) -> KeyValue {
    KeyValue::new("stormguard.layer", Arc::clone(name))
}

/// `[rpc.system, stormguard.layer]`, once the layer has a name.
fn base(name: &LayerName) -> Option<[KeyValue; 2]> {
    Some([system(), layer(name.get()?)])
}

/// One method's counters.
#[derive(Debug, Default)]
struct Slot {
    /// The hash of the path; 0 while free.
    key: AtomicU64,
    /// `(rpc.service, rpc.method)`, set once by the thread that claimed the slot.
    name: OnceLock<(Arc<str>, Arc<str>)>,
    calls: AtomicU64,
    attempts: AtomicU64,
    ended: [AtomicU64; Code::ALL.len()],
    /// The histograms bound to this method's attributes, once a call of it has ended.
    bound: OnceLock<Box<Bound>>,
}

/// One method's histograms, bound to its attributes: recording into them looks nothing up.
#[derive(Debug)]
struct Bound {
    /// `[rpc.system, stormguard.layer, rpc.service, rpc.method]`.
    attrs: [KeyValue; 4],
    attempts_per_call: BoundHistogram<u64>,
    /// `rpc.client.duration` by final code, bound when a call first ends with it.
    duration: [OnceLock<BoundHistogram<f64>>; Code::ALL.len()],
    /// gRFC A96's histograms, each bound to `[grpc.method, grpc.target]` when a call of the
    /// method first records into it (so that a method that never retried, or never hedged,
    /// exports no series of them).
    a96: OnceLock<BoundA96>,
}

/// gRFC A96's four per-call histograms: `U` counts, `F` the delay.
#[derive(Debug)]
struct A96<U, F> {
    /// `grpc.client.call.retries`.
    retries: U,
    /// `grpc.client.call.transparent_retries`.
    transparent_retries: U,
    /// `grpc.client.call.hedges`.
    hedges: U,
    /// `grpc.client.call.retry_delay`.
    retry_delay: F,
}

impl A96<Histogram<u64>, Histogram<f64>> {
    fn register(meter: &Meter) -> Self {
        let count = |metric: &'static str, description: &'static str, unit, bounds: &[f64]| {
            meter
                .u64_histogram(metric)
                .with_description(description)
                .with_unit(unit)
                .with_boundaries(bounds.to_vec())
                .build()
        };
        A96 {
            retries: count(
                "grpc.client.call.retries",
                "Retries (not transparent ones) a call made; calls with none record nothing",
                "{retry}",
                &RETRIES_BOUNDS,
            ),
            transparent_retries: count(
                "grpc.client.call.transparent_retries",
                "Transparent retries a call made; calls with none record nothing",
                "{transparent_retry}",
                &TRANSPARENT_BOUNDS,
            ),
            hedges: count(
                "grpc.client.call.hedges",
                "Hedges a call sent; calls with none record nothing",
                "{hedge}",
                &RETRIES_BOUNDS,
            ),
            retry_delay: meter
                .f64_histogram("grpc.client.call.retry_delay")
                .with_description(
                    "Total time of a call with no attempt in flight, waiting between attempts",
                )
                .with_unit("s")
                .with_boundaries(RETRY_DELAY_BOUNDS.to_vec())
                .build(),
        }
    }
}

/// gRFC A96's histograms of one method: its attributes, and each histogram bound to them
/// the first time a call records into it.
#[derive(Debug)]
struct BoundA96 {
    /// `[grpc.method, grpc.target]`.
    attrs: [KeyValue; 2],
    histograms: A96<OnceLock<BoundHistogram<u64>>, OnceLock<BoundHistogram<f64>>>,
}

impl BoundA96 {
    /// Records `count` into `histogram` of `instruments`, bound on first use.
    fn count(
        &self,
        count: u64,
        pick: impl Fn(
            &A96<OnceLock<BoundHistogram<u64>>, OnceLock<BoundHistogram<f64>>>,
        ) -> &OnceLock<BoundHistogram<u64>>,
        histogram: &Histogram<u64>,
    ) {
        if count > 0 {
            pick(&self.histograms)
                .get_or_init(|| histogram.bind(&self.attrs))
                .record(count);
        }
    }
}

/// Counters by method: open addressing over a fixed array, claimed with one
/// compare-and-swap, never locked; the last slot is `_OTHER`.
#[derive(Debug)]
pub(crate) struct Methods {
    slots: Box<[Slot]>,
}

impl Methods {
    fn new() -> Self {
        let slots: Vec<Slot> = (0..=MAX_METHODS).map(|_| Slot::default()).collect();
        Methods {
            slots: slots.into_boxed_slice(),
        }
    }

    /// The slot of `path` (`/package.Service/Method`), claiming a free one on first use.
    fn index(&self, path: &str) -> usize {
        let key = fnv1a(path.as_bytes()) | 1;
        let start = (key as usize) % MAX_METHODS;
        for probe in 0..MAX_METHODS {
            let i = (start + probe) % MAX_METHODS;
            let slot = &self.slots[i];
            // A plain load first: after its first call a method finds its slot without a
            // read-modify-write on every call.
            match slot.key.load(Ordering::Acquire) {
                k if k == key => return i,
                0 => {}
                _ => continue,
            }
            match slot
                .key
                .compare_exchange(0, key, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => {
                    let _ = slot.name.set(split(path));
                    return i;
                }
                Err(k) if k == key => return i,
                Err(_) => {}
            }
        }
        // Named on first use, so that it is exported only once a call lands in it.
        let other = &self.slots[MAX_METHODS];
        let _ = other
            .name
            .get_or_init(|| (Arc::from("_OTHER"), Arc::from("_OTHER")));
        MAX_METHODS
    }
}

/// gRFC A66's `grpc.method` of a slot named `(service, method)`: the full name without its
/// leading slash (`pkg.Service/Method`), `other` for the slot of the methods past
/// [`MAX_METHODS`].
fn grpc_method(service: &str, method: &str) -> String {
    match (service, method) {
        ("_OTHER", "_OTHER") => "other".to_owned(),
        ("", method) => method.to_owned(),
        (service, method) => format!("{service}/{method}"),
    }
}

/// `(service, method)` of a gRPC path.
fn split(path: &str) -> (Arc<str>, Arc<str>) {
    let (service, method) = split_path(path);
    (Arc::from(service), Arc::from(method))
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A layer's instruments. The meter keeps calling their callbacks as long as it lives
/// (an SDK never unregisters them), so each layer registers them once.
pub(crate) struct ClientMetrics {
    methods: Arc<Methods>,
    name: Arc<LayerName>,
    duration: Histogram<f64>,
    attempts_per_call: Histogram<u64>,
    a96: A96<Histogram<u64>, Histogram<f64>>,
    /// `grpc.target` of the A96 histograms; `None`: the layer's name.
    target: Option<Arc<str>>,
    _counters: Vec<ObservableCounter<u64>>,
    _gauges: (ObservableGauge<f64>, ObservableGauge<u64>),
}

impl std::fmt::Debug for ClientMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientMetrics").finish_non_exhaustive()
    }
}

/// The attributes of one method slot of the layer `name`, if both are known.
fn method_attributes(name: &LayerName, slot: &Slot) -> Option<[KeyValue; 4]> {
    let (service, method) = slot.name.get()?;
    Some([
        system(),
        layer(name.get()?),
        KeyValue::new("rpc.service", Arc::clone(service)),
        KeyValue::new("rpc.method", Arc::clone(method)),
    ])
}

/// An instrument's name, description and unit.
type Spec = (&'static str, &'static str, &'static str);

/// Registers the observable counter `spec` on `meter`; `observe` reports its values.
fn counter(
    meter: &Meter,
    (metric, description, unit): Spec,
    observe: impl Fn(&dyn AsyncInstrument<u64>) + Send + Sync + 'static,
) -> ObservableCounter<u64> {
    meter
        .u64_observable_counter(metric)
        .with_description(description)
        .with_unit(unit)
        .with_callback(observe)
        .build()
}

/// Reads one counter from a snapshot.
type Read = fn(&RetrySnapshot) -> u64;

/// The layer-wide counters: `read` picks one from a snapshot.
const LAYER_COUNTERS: [(Spec, Read); 7] = [
    (
        (
            "stormguard.client.retries",
            "Attempts that were retries",
            "{retry}",
        ),
        |s| s.retries,
    ),
    (
        (
            "stormguard.client.retries.transparent",
            "Attempts sent again, for free, because the one before never reached the server's application",
            "{attempt}",
        ),
        |s| s.transparent_retries,
    ),
    (
        (
            "stormguard.client.attempt.timeouts",
            "Attempts abandoned when their per-attempt timeout ran out",
            "{attempt}",
        ),
        |s| s.attempt_timeouts,
    ),
    (
        (
            "stormguard.client.hedges",
            "Copies of hedged calls sent after the first",
            "{attempt}",
        ),
        |s| s.hedges,
    ),
    (
        (
            "stormguard.client.hedges.won",
            "Hedged calls answered by a copy other than the first",
            "{call}",
        ),
        |s| s.hedges_won,
    ),
    (
        (
            "stormguard.client.load_reports",
            "Load reports (ORCA) read from attempts' answers",
            "{report}",
        ),
        |s| s.load_reports,
    ),
    (
        (
            "stormguard.client.load_reports.ignored",
            "Load reports ignored as malformed or absurd",
            "{report}",
        ),
        |s| s.load_reports_ignored,
    ),
];

/// Lists a snapshot's counts by one label's values, to `observe`.
type ReadLabelled = fn(&RetrySnapshot, observe: &mut dyn FnMut(&'static str, u64));

/// The layer-wide counters by one label: its key, and `read` lists each value's count.
const LABELLED_COUNTERS: [(Spec, &str, ReadLabelled); 4] = [
    (
        (
            "stormguard.client.hedges.refused",
            "Hedges that were due and not sent, by the rule that refused them",
            "{attempt}",
        ),
        "stormguard.refusal.cause",
        |s, o| s.hedges_refused.iter().for_each(|(cause, n)| o(cause, n)),
    ),
    (
        (
            "stormguard.client.retries.refused",
            "Failures not retried, by the rule that refused the retry",
            "{retry}",
        ),
        "stormguard.refusal.cause",
        |s, o| s.refused.iter().for_each(|(cause, n)| o(cause, n)),
    ),
    (
        (
            "stormguard.client.throttled",
            "Calls the adaptive throttle refused locally (never sent), by criticality",
            "{call}",
        ),
        "stormguard.criticality",
        |s, o| s.throttled.iter().for_each(|(class, n)| o(class, n)),
    ),
    (
        (
            "stormguard.client.retry.delays",
            "Retries granted, by where their delay came from",
            "{retry}",
        ),
        "stormguard.delay.source",
        |s, o| {
            o("backoff", s.delayed_by_backoff);
            o("pushback", s.delayed_by_pushback);
        },
    ),
];

impl ClientMetrics {
    pub(crate) fn register(
        meter: &Meter,
        stats: &RetryStats,
        controller: &RetryController,
        name: &Arc<LayerName>,
        target: Option<Arc<str>>,
    ) -> Self {
        let methods = Arc::new(Methods::new());
        let mut counters = method_counters(meter, &methods, name);
        for (spec, read) in LAYER_COUNTERS {
            let (s, n) = (stats.clone(), Arc::clone(name));
            counters.push(counter(meter, spec, move |o| {
                if let Some(attrs) = base(&n) {
                    o.observe(read(&s.snapshot()), &attrs);
                }
            }));
        }
        for (spec, key, read) in LABELLED_COUNTERS {
            let (s, n) = (stats.clone(), Arc::clone(name));
            counters.push(counter(meter, spec, move |o| {
                let Some([system, layer]) = base(&n) else {
                    return;
                };
                read(&s.snapshot(), &mut |value, count| {
                    let label = KeyValue::new(key, value);
                    o.observe(count, &[system.clone(), layer.clone(), label]);
                });
            }));
        }
        let gauges = (
            balance_gauge(meter, controller, name),
            breaker_gauge(meter, controller, name),
        );
        let duration = meter
            .f64_histogram("rpc.client.duration")
            .with_description("Duration of logical calls, from the layer taking them to their end")
            .with_unit("s")
            .with_boundaries(DURATION_BOUNDS.to_vec())
            .build();
        let attempts_per_call = meter
            .u64_histogram("stormguard.client.attempts_per_call")
            .with_description("Attempts each logical call made (first attempt and retries)")
            .with_unit("{attempt}")
            .with_boundaries(ATTEMPTS_BOUNDS.to_vec())
            .build();
        ClientMetrics {
            methods,
            name: Arc::clone(name),
            duration,
            attempts_per_call,
            a96: A96::register(meter),
            target,
            _counters: counters,
            _gauges: gauges,
        }
    }

    /// `slot`'s histograms, bound on first use; `None` while the layer or the method has
    /// no name yet.
    fn bound<'a>(&self, slot: &'a Slot) -> Option<&'a Bound> {
        if let Some(bound) = slot.bound.get() {
            return Some(bound);
        }
        let attrs = method_attributes(&self.name, slot)?;
        Some(slot.bound.get_or_init(|| {
            Box::new(Bound {
                attempts_per_call: self.attempts_per_call.bind(&attrs),
                attrs,
                duration: Default::default(),
                a96: OnceLock::new(),
            })
        }))
    }

    /// gRFC A96's histograms of `slot`, whose histograms are `bound`, bound on first use to
    /// `grpc.method` and `grpc.target` (the target given, else the layer's name).
    fn a96<'a>(&self, slot: &Slot, bound: &'a Bound) -> Option<&'a BoundA96> {
        if let Some(a96) = bound.a96.get() {
            return Some(a96);
        }
        let (service, method) = slot.name.get()?;
        let target = self.target.as_ref().or(self.name.get())?;
        Some(bound.a96.get_or_init(|| BoundA96 {
            attrs: [
                KeyValue::new("grpc.method", grpc_method(service, method)),
                KeyValue::new("grpc.target", Arc::clone(target)),
            ],
            histograms: A96 {
                retries: OnceLock::new(),
                transparent_retries: OnceLock::new(),
                hedges: OnceLock::new(),
                retry_delay: OnceLock::new(),
            },
        }))
    }

    /// Starts counting one logical call to `path`.
    pub(crate) fn call(self: &Arc<Self>, path: &str) -> CallMetrics {
        let index = self.methods.index(path);
        self.methods.slots[index]
            .calls
            .fetch_add(1, Ordering::Relaxed);
        CallMetrics {
            call: Some(Call {
                metrics: Arc::clone(self),
                slot: index,
                start: Instant::now(),
                attempts: 0,
                retries: Retries::default(),
            }),
        }
    }
}

/// The counters by method: calls, calls ended by code, attempts.
fn method_counters(
    meter: &Meter,
    methods: &Arc<Methods>,
    name: &Arc<LayerName>,
) -> Vec<ObservableCounter<u64>> {
    let by_method = |spec: Spec, read: fn(&Slot) -> u64| {
        let (m, n) = (Arc::clone(methods), Arc::clone(name));
        counter(meter, spec, move |o| {
            for slot in m.slots.iter() {
                if let Some(attrs) = method_attributes(&n, slot) {
                    o.observe(read(slot), &attrs);
                }
            }
        })
    };
    let calls = by_method(
        (
            "stormguard.client.calls",
            "Logical calls started (what callers asked for)",
            "{call}",
        ),
        |slot| slot.calls.load(Ordering::Relaxed),
    );
    let (m, n) = (Arc::clone(methods), Arc::clone(name));
    let ended = counter(
        meter,
        (
            "stormguard.client.calls.ended",
            "Logical calls ended, by final gRPC status code",
            "{call}",
        ),
        move |o| {
            for slot in m.slots.iter() {
                let Some([system, layer, service, method]) = method_attributes(&n, slot) else {
                    continue;
                };
                for code in Code::ALL {
                    let count = slot.ended[code.as_i32() as usize].load(Ordering::Relaxed);
                    if count > 0 {
                        let attrs = [
                            system.clone(),
                            layer.clone(),
                            service.clone(),
                            method.clone(),
                            status_code(code),
                        ];
                        o.observe(count, &attrs);
                    }
                }
            }
        },
    );
    let attempts = by_method(
        (
            "stormguard.client.attempts",
            "Physical attempts sent (first attempts and retries)",
            "{attempt}",
        ),
        |slot| slot.attempts.load(Ordering::Relaxed),
    );
    vec![calls, ended, attempts]
}

/// `stormguard.client.budget.balance`: the retries the budget would grant now.
fn balance_gauge(
    meter: &Meter,
    controller: &RetryController,
    name: &Arc<LayerName>,
) -> ObservableGauge<f64> {
    let (budget, n) = (Arc::clone(controller.budget()), Arc::clone(name));
    meter
        .f64_observable_gauge("stormguard.client.budget.balance")
        .with_description("Retries the budget would grant now")
        .with_unit("{retry}")
        .with_callback(move |o| {
            let b = budget.balance();
            if let Some(attrs) = base(&n)
                && b.is_finite()
            {
                o.observe(b, &attrs);
            }
        })
        .build()
}

/// `stormguard.client.breaker.state`: 1 for the breaker's current state.
fn breaker_gauge(
    meter: &Meter,
    controller: &RetryController,
    name: &Arc<LayerName>,
) -> ObservableGauge<u64> {
    let (breaker, n) = (controller.breaker().cloned(), Arc::clone(name));
    meter
        .u64_observable_gauge("stormguard.client.breaker.state")
        .with_description("The circuit breaker's state: 1 for the current one")
        .with_unit("1")
        .with_callback(move |o| {
            let (Some(breaker), Some([system, layer])) = (&breaker, base(&n)) else {
                return;
            };
            let now = breaker.state_at(Instant::now()).as_str();
            for state in ["closed", "open", "half_open"] {
                let state_kv = KeyValue::new("stormguard.breaker.state", state);
                let attrs = [system.clone(), layer.clone(), state_kv];
                o.observe(u64::from(state == now), &attrs);
            }
        })
        .build()
}

/// `rpc.grpc.status_code = code`, an integer as OpenTelemetry's RPC conventions have it.
fn status_code(code: Code) -> KeyValue {
    KeyValue::new("rpc.grpc.status_code", i64::from(code.as_i32()))
}

/// The per-method counters of one logical call (nothing when the layer has no meter).
#[derive(Debug, Default)]
pub(crate) struct CallMetrics {
    call: Option<Call>,
}

/// A call of a layer with a meter: its method's slot, when it started and how many
/// attempts it made so far.
#[derive(Debug)]
struct Call {
    metrics: Arc<ClientMetrics>,
    slot: usize,
    start: Instant,
    attempts: u64,
    retries: Retries,
}

/// What gRFC A96 records of a call: its retries, transparent retries and hedges, and the
/// time it waited with no attempt in flight.
#[derive(Debug, Default)]
struct Retries {
    paid: u64,
    transparent: u64,
    hedges: u64,
    /// Time waited between attempts so far.
    delay: Duration,
    /// When the wait under way began.
    waiting_since: Option<Instant>,
}

impl Retries {
    /// Ends the wait under way, if any, at `now`.
    fn stop_waiting(&mut self, now: impl FnOnce() -> Instant) {
        if let Some(since) = self.waiting_since.take() {
            self.delay += now().saturating_duration_since(since);
        }
    }

    /// Records the call into its method's `bound` histograms of `instruments`: each count
    /// only when above zero, the delay when the call retried or hedged.
    fn record(&mut self, instruments: &A96<Histogram<u64>, Histogram<f64>>, bound: &BoundA96) {
        self.stop_waiting(Instant::now);
        bound.count(self.paid, |h| &h.retries, &instruments.retries);
        let transparent = &instruments.transparent_retries;
        bound.count(self.transparent, |h| &h.transparent_retries, transparent);
        bound.count(self.hedges, |h| &h.hedges, &instruments.hedges);
        if self.paid > 0 || self.hedges > 0 {
            bound
                .histograms
                .retry_delay
                .get_or_init(|| instruments.retry_delay.bind(&bound.attrs))
                .record(self.delay.as_secs_f64());
        }
    }
}

impl CallMetrics {
    /// Counters for a call of a layer without a meter: nothing.
    pub(crate) fn none() -> Self {
        CallMetrics { call: None }
    }

    /// An attempt was sent.
    pub(crate) fn attempt(&mut self) {
        if let Some(call) = &mut self.call {
            call.attempts += 1;
            let slot = &call.metrics.methods.slots[call.slot];
            slot.attempts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A retry was sent (`transparent`: a transparent one), ending the wait before it.
    pub(crate) fn retry(&mut self, transparent: bool) {
        self.attempt();
        if let Some(call) = &mut self.call {
            let retries = &mut call.retries;
            retries.stop_waiting(Instant::now);
            if transparent {
                retries.transparent += 1;
            } else {
                retries.paid += 1;
            }
        }
    }

    /// A hedge was sent.
    pub(crate) fn hedge(&mut self) {
        self.attempt();
        if let Some(call) = &mut self.call {
            call.retries.hedges += 1;
        }
    }

    /// From `now`, the call has no attempt in flight and waits to send its next one.
    pub(crate) fn waiting(&mut self, now: Instant) {
        if let Some(call) = &mut self.call {
            call.retries.waiting_since.get_or_insert(now);
        }
    }

    /// The call ended with `code`: counted once by method and code, and its attempts and
    /// duration recorded, and gRFC A96's histograms when it retried or hedged.
    pub(crate) fn ended(&mut self, code: Code) {
        let Some(mut call) = self.call.take() else {
            return;
        };
        let metrics = &call.metrics;
        let slot = &metrics.methods.slots[call.slot];
        slot.ended[code.as_i32() as usize].fetch_add(1, Ordering::Relaxed);
        let Some(bound) = metrics.bound(slot) else {
            return;
        };
        let duration = bound.duration[code.as_i32() as usize].get_or_init(|| {
            let [system, layer, service, method] = bound.attrs.clone();
            let attrs = [system, layer, service, method, status_code(code)];
            metrics.duration.bind(&attrs)
        });
        duration.record(call.start.elapsed().as_secs_f64());
        bound.attempts_per_call.record(call.attempts);
        if call.attempts > 1
            && let Some(a96) = metrics.a96(slot, bound)
        {
            call.retries.record(&metrics.a96, a96);
        }
    }
}

#[cfg(test)]
mod tests;
