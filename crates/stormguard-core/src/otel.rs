//! What both retry clients record into OpenTelemetry (feature `opentelemetry`): the tonic
//! `RetryLayer` of `stormguard-client` and the `grpc` crate's `RetryInterceptor` of
//! `stormguard-grpc` register the same instruments through this module, so that each name,
//! unit, bucket bound and attribute is written once.
//!
//! - [`MethodMetrics`]: the counters by method (`stormguard.client.calls`,
//!   `stormguard.client.calls.ended`, `stormguard.client.attempts`), the per-call
//!   histograms (`rpc.client.duration`, `stormguard.client.attempts_per_call`) and gRFC
//!   A96's four per-call retry histograms (`grpc.client.call.retries`,
//!   `grpc.client.call.transparent_retries`, `grpc.client.call.hedges`,
//!   `grpc.client.call.retry_delay`), each recorded through an instrument *bound* to its
//!   attributes the first time they are seen, so that a call's record looks nothing up
//!   and hashes nothing; a call records through its [`CallMetrics`].
//! - [`ControllerGauges`]: the budget's balance and the breaker's state, read from the
//!   [`RetryController`] when the SDK collects.
//! - The layer-wide counters: each client reads its own counters, through
//!   [`layer_counter`] and [`labelled_counter`], under the names listed here
//!   ([`RETRIES`], [`RETRIES_REFUSED`], ...).
//!
//! Every series of stormguard's own carries `rpc.system = grpc` and `stormguard.layer`
//! (the layer's [`LayerName`]); A96's carry `grpc.method` and `grpc.target` only. The
//! repository's `docs/observability.md` lists them all.
//!
//! ```
//! use std::sync::Arc;
//! use opentelemetry::metrics::MeterProvider as _;
//! use stormguard_core::otel::MethodMetrics;
//! use stormguard_core::{Code, LayerName};
//!
//! let meter = opentelemetry::metrics::noop::NoopMeterProvider::new().meter("demo");
//! let metrics = Arc::new(MethodMetrics::register(&meter, &Arc::new(LayerName::named("inventory")), None));
//! let mut call = metrics.call("/pkg.Svc/Method");
//! call.attempt();
//! call.ended(Code::Ok);
//! ```

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{
    AsyncInstrument, BoundHistogram, Histogram, Meter, ObservableCounter, ObservableGauge,
};

use crate::observe::{LayerName, split_path};
use crate::retry::RetryController;
use crate::wire::code::Code;
use tokio::time::Instant;

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

/// `[rpc.system, stormguard.layer]`, once the layer has a name: the attributes of every
/// layer-wide series.
pub fn base(name: &LayerName) -> Option<[KeyValue; 2]> {
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
struct Methods {
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

/// The counters by method and the per-call histograms of one client, registered once on a
/// meter (the meter keeps calling the counters' callbacks as long as it lives: an SDK never
/// unregisters them). Calls and attempts by method and final code come from a small
/// lock-free table ([`MAX_METHODS`] methods, then `_OTHER`).
pub struct MethodMetrics {
    methods: Arc<Methods>,
    name: Arc<LayerName>,
    duration: Histogram<f64>,
    attempts_per_call: Histogram<u64>,
    a96: A96<Histogram<u64>, Histogram<f64>>,
    /// `grpc.target` of the A96 histograms; `None`: the layer's name.
    target: Option<Arc<str>>,
    _counters: Vec<ObservableCounter<u64>>,
}

impl std::fmt::Debug for MethodMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MethodMetrics")
            .field("target", &self.target)
            .finish_non_exhaustive()
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
pub type Spec = (&'static str, &'static str, &'static str);

/// Registers the observable counter `spec` on `meter`; `observe` reports its values. The
/// clients' layer-wide counters and the `ShedLayer`'s register through it.
pub fn counter(
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

/// `stormguard.client.retries`: attempts that were retries.
pub const RETRIES: Spec = (
    "stormguard.client.retries",
    "Attempts that were retries",
    "{retry}",
);

/// `stormguard.client.retries.transparent`: attempts sent again for free.
pub const TRANSPARENT_RETRIES: Spec = (
    "stormguard.client.retries.transparent",
    "Attempts sent again, for free, because the one before never reached the server's application",
    "{attempt}",
);

/// `stormguard.client.attempt.timeouts`: attempts abandoned at their own timeout.
pub const ATTEMPT_TIMEOUTS: Spec = (
    "stormguard.client.attempt.timeouts",
    "Attempts abandoned when their per-attempt timeout ran out",
    "{attempt}",
);

/// `stormguard.client.hedges`: copies of hedged calls sent after the first.
pub const HEDGES: Spec = (
    "stormguard.client.hedges",
    "Copies of hedged calls sent after the first",
    "{attempt}",
);

/// `stormguard.client.hedges.won`: hedged calls a copy other than the first answered.
pub const HEDGES_WON: Spec = (
    "stormguard.client.hedges.won",
    "Hedged calls answered by a copy other than the first",
    "{call}",
);

/// `stormguard.client.load_reports`: load reports read from answers.
pub const LOAD_REPORTS: Spec = (
    "stormguard.client.load_reports",
    "Load reports (ORCA) read from attempts' answers",
    "{report}",
);

/// `stormguard.client.load_reports.ignored`: load reports ignored.
pub const LOAD_REPORTS_IGNORED: Spec = (
    "stormguard.client.load_reports.ignored",
    "Load reports ignored as malformed or absurd",
    "{report}",
);

/// `stormguard.client.hedges.refused`, by [`REFUSAL_CAUSE`].
pub const HEDGES_REFUSED: Spec = (
    "stormguard.client.hedges.refused",
    "Hedges that were due and not sent, by the rule that refused them",
    "{attempt}",
);

/// `stormguard.client.retries.refused`, by [`REFUSAL_CAUSE`].
pub const RETRIES_REFUSED: Spec = (
    "stormguard.client.retries.refused",
    "Failures not retried, by the rule that refused the retry",
    "{retry}",
);

/// `stormguard.client.throttled`, by [`CRITICALITY`].
pub const THROTTLED: Spec = (
    "stormguard.client.throttled",
    "Calls the adaptive throttle refused locally (never sent), by criticality",
    "{call}",
);

/// `stormguard.client.retry.delays`, by [`DELAY_SOURCE`] (`backoff`, `pushback`).
pub const RETRY_DELAYS: Spec = (
    "stormguard.client.retry.delays",
    "Retries granted, by where their delay came from",
    "{retry}",
);

/// The attribute of a refusal's cause ([`Refusal::as_str`](crate::Refusal::as_str)).
pub const REFUSAL_CAUSE: &str = "stormguard.refusal.cause";

/// The attribute of a throttled call's criticality.
pub const CRITICALITY: &str = "stormguard.criticality";

/// The attribute of where a retry's delay came from: `backoff` or `pushback`.
pub const DELAY_SOURCE: &str = "stormguard.delay.source";

/// Registers the layer-wide counter `spec` of the layer `name` on `meter`: `read` gives
/// its value when the SDK collects (nothing is exported before the layer has a name).
pub fn layer_counter(
    meter: &Meter,
    spec: Spec,
    name: &Arc<LayerName>,
    read: impl Fn() -> u64 + Send + Sync + 'static,
) -> ObservableCounter<u64> {
    let name = Arc::clone(name);
    counter(meter, spec, move |o| {
        if let Some(attrs) = base(&name) {
            o.observe(read(), &attrs);
        }
    })
}

/// Registers the layer-wide counter `spec` of the layer `name` on `meter`, by the
/// attribute `key`: `read` lists each value's count when the SDK collects.
pub fn labelled_counter(
    meter: &Meter,
    spec: Spec,
    key: &'static str,
    name: &Arc<LayerName>,
    read: impl Fn(&mut dyn FnMut(&'static str, u64)) + Send + Sync + 'static,
) -> ObservableCounter<u64> {
    let name = Arc::clone(name);
    counter(meter, spec, move |o| {
        let Some([system, layer]) = base(&name) else {
            return;
        };
        read(&mut |value, count| {
            let label = KeyValue::new(key, value);
            o.observe(count, &[system.clone(), layer.clone(), label]);
        });
    })
}

impl MethodMetrics {
    /// Registers the counters by method and the per-call histograms of the layer `name` on
    /// `meter`; A96's carry `target` as their `grpc.target` (`None`: the layer's name).
    pub fn register(meter: &Meter, name: &Arc<LayerName>, target: Option<Arc<str>>) -> Self {
        let methods = Arc::new(Methods::new());
        let counters = method_counters(meter, &methods, name);
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
        MethodMetrics {
            methods,
            name: Arc::clone(name),
            duration,
            attempts_per_call,
            a96: A96::register(meter),
            target,
            _counters: counters,
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
    pub fn call(self: &Arc<Self>, path: &str) -> CallMetrics {
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

/// The budget's balance and the breaker's state of a [`RetryController`], as gauges:
/// `stormguard.client.budget.balance` and `stormguard.client.breaker.state`.
pub struct ControllerGauges {
    _balance: ObservableGauge<f64>,
    _breaker: ObservableGauge<u64>,
}

impl std::fmt::Debug for ControllerGauges {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerGauges").finish_non_exhaustive()
    }
}

impl ControllerGauges {
    /// Registers the gauges of `controller`, for the layer `name`, on `meter`.
    pub fn register(meter: &Meter, controller: &RetryController, name: &Arc<LayerName>) -> Self {
        ControllerGauges {
            _balance: balance_gauge(meter, controller, name),
            _breaker: breaker_gauge(meter, controller, name),
        }
    }
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
pub struct CallMetrics {
    call: Option<Call>,
}

/// A call of a layer with a meter: its method's slot, when it started and how many
/// attempts it made so far.
#[derive(Debug)]
struct Call {
    metrics: Arc<MethodMetrics>,
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
    pub fn none() -> Self {
        CallMetrics { call: None }
    }

    /// An attempt was sent.
    pub fn attempt(&mut self) {
        if let Some(call) = &mut self.call {
            call.attempts += 1;
            let slot = &call.metrics.methods.slots[call.slot];
            slot.attempts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A retry was sent (`transparent`: a transparent one), ending the wait before it.
    pub fn retry(&mut self, transparent: bool) {
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
    pub fn hedge(&mut self) {
        self.attempt();
        if let Some(call) = &mut self.call {
            call.retries.hedges += 1;
        }
    }

    /// From `now`, the call has no attempt in flight and waits to send its next one.
    pub fn waiting(&mut self, now: Instant) {
        if let Some(call) = &mut self.call {
            call.retries.waiting_since.get_or_insert(now);
        }
    }

    /// The call ended with `code`: counted once by method and code, and its attempts and
    /// duration recorded, and gRFC A96's histograms when it retried or hedged.
    pub fn ended(&mut self, code: Code) {
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
