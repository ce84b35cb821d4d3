//! OpenTelemetry metrics of a [`RetryLayer`](crate::RetryLayer) (feature `opentelemetry`).
//!
//! [`RetryLayer::with_meter`](crate::RetryLayer::with_meter) registers the instruments
//! below on a [`Meter`] the application passes in: no global provider is read or set.
//! Every instrument is *observable*: the SDK reads the layer's own counters (the ones
//! [`RetryStats::snapshot`](crate::RetryStats::snapshot) returns) when it collects, so the
//! exported values are those counters and a call adds no OpenTelemetry work. Calls and
//! attempts by method and final code come from a small lock-free table the layer keeps
//! only when a meter is set ([`MAX_METHODS`] methods, then `_OTHER`).
//!
//! | name | kind | unit | attributes |
//! |---|---|---|---|
//! | `stormguard.client.calls` | counter | `{call}` | `rpc.system`, `rpc.service`, `rpc.method` |
//! | `stormguard.client.calls.ended` | counter | `{call}` | the same and `rpc.grpc.status_code` |
//! | `stormguard.client.attempts` | counter | `{attempt}` | `rpc.system`, `rpc.service`, `rpc.method` |
//! | `stormguard.client.retries` | counter | `{retry}` | `rpc.system` |
//! | `stormguard.client.retries.refused` | counter | `{retry}` | `rpc.system`, `stormguard.refusal.cause` |
//! | `stormguard.client.retry.delays` | counter | `{retry}` | `rpc.system`, `stormguard.delay.source` (`backoff`, `pushback`) |
//! | `stormguard.client.attempt.timeouts` | counter | `{attempt}` | `rpc.system` |
//! | `stormguard.client.budget.balance` | gauge | `{retry}` | `rpc.system` |
//! | `stormguard.client.breaker.state` | gauge | `1` | `rpc.system`, `stormguard.breaker.state` (`closed`, `open`, `half_open`: 1 for the current one) |
//!
//! The amplification ratio is `sum(stormguard.client.attempts) / sum(stormguard.client.calls)`.
//! A call's final code is recorded when it is known (for a committed call, when its
//! response body ends); a call whose body the caller drops before its end has none.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Meter, ObservableCounter, ObservableGauge};
use stormguard_core::breaker::BreakerState;
use stormguard_core::code::Code;
use stormguard_core::retry::RetryController;

use crate::stats::RetryStats;

/// Distinct methods a layer keeps apart; further ones are counted under `_OTHER` (as
/// OpenTelemetry's RPC conventions advise for unbounded method sets).
pub const MAX_METHODS: usize = 128;

/// `rpc.system = grpc`, on every series.
fn system() -> KeyValue {
    KeyValue::new("rpc.system", "grpc")
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

/// `(service, method)` of a gRPC path.
fn split(path: &str) -> (Arc<str>, Arc<str>) {
    let path = path.strip_prefix('/').unwrap_or(path);
    match path.rsplit_once('/') {
        Some((service, method)) => (Arc::from(service), Arc::from(method)),
        None => (Arc::from(""), Arc::from(path)),
    }
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// A layer's instruments; they stay registered as long as the layer (or a service it
/// built) lives.
pub(crate) struct ClientMetrics {
    methods: Arc<Methods>,
    _counters: Vec<ObservableCounter<u64>>,
    _gauges: (ObservableGauge<f64>, ObservableGauge<u64>),
}

impl std::fmt::Debug for ClientMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientMetrics").finish_non_exhaustive()
    }
}

/// The attributes of one method slot, if it has been claimed.
fn method_attributes(slot: &Slot) -> Option<[KeyValue; 3]> {
    let (service, method) = slot.name.get()?;
    Some([
        system(),
        KeyValue::new("rpc.service", service.to_string()),
        KeyValue::new("rpc.method", method.to_string()),
    ])
}

impl ClientMetrics {
    pub(crate) fn register(
        meter: &Meter,
        stats: &RetryStats,
        controller: &RetryController,
    ) -> Self {
        let methods = Arc::new(Methods::new());
        let mut counters = Vec::new();

        let m = Arc::clone(&methods);
        counters.push(
            meter
                .u64_observable_counter("stormguard.client.calls")
                .with_description("Logical calls started (what callers asked for)")
                .with_unit("{call}")
                .with_callback(move |o| {
                    for slot in m.slots.iter() {
                        if let Some(attrs) = method_attributes(slot) {
                            o.observe(slot.calls.load(Ordering::Relaxed), &attrs);
                        }
                    }
                })
                .build(),
        );
        let m = Arc::clone(&methods);
        counters.push(
            meter
                .u64_observable_counter("stormguard.client.calls.ended")
                .with_description("Logical calls ended, by final gRPC status code")
                .with_unit("{call}")
                .with_callback(move |o| {
                    for slot in m.slots.iter() {
                        let Some([system, service, method]) = method_attributes(slot) else {
                            continue;
                        };
                        for code in Code::ALL {
                            let n = slot.ended[code.as_i32() as usize].load(Ordering::Relaxed);
                            if n > 0 {
                                let attrs = [
                                    system.clone(),
                                    service.clone(),
                                    method.clone(),
                                    KeyValue::new("rpc.grpc.status_code", i64::from(code.as_i32())),
                                ];
                                o.observe(n, &attrs);
                            }
                        }
                    }
                })
                .build(),
        );
        let m = Arc::clone(&methods);
        counters.push(
            meter
                .u64_observable_counter("stormguard.client.attempts")
                .with_description("Physical attempts sent (first attempts and retries)")
                .with_unit("{attempt}")
                .with_callback(move |o| {
                    for slot in m.slots.iter() {
                        if let Some(attrs) = method_attributes(slot) {
                            o.observe(slot.attempts.load(Ordering::Relaxed), &attrs);
                        }
                    }
                })
                .build(),
        );
        let s = stats.clone();
        counters.push(
            meter
                .u64_observable_counter("stormguard.client.retries")
                .with_description("Attempts that were retries")
                .with_unit("{retry}")
                .with_callback(move |o| o.observe(s.snapshot().retries, &[system()]))
                .build(),
        );
        let s = stats.clone();
        counters.push(
            meter
                .u64_observable_counter("stormguard.client.retries.refused")
                .with_description("Failures not retried, by the rule that refused the retry")
                .with_unit("{retry}")
                .with_callback(move |o| {
                    for (cause, n) in s.snapshot().refused.iter() {
                        o.observe(
                            n,
                            &[system(), KeyValue::new("stormguard.refusal.cause", cause)],
                        );
                    }
                })
                .build(),
        );
        let s = stats.clone();
        counters.push(
            meter
                .u64_observable_counter("stormguard.client.retry.delays")
                .with_description("Retries granted, by where their delay came from")
                .with_unit("{retry}")
                .with_callback(move |o| {
                    let snap = s.snapshot();
                    for (source, n) in [
                        ("backoff", snap.delayed_by_backoff),
                        ("pushback", snap.delayed_by_pushback),
                    ] {
                        o.observe(
                            n,
                            &[system(), KeyValue::new("stormguard.delay.source", source)],
                        );
                    }
                })
                .build(),
        );
        let s = stats.clone();
        counters.push(
            meter
                .u64_observable_counter("stormguard.client.attempt.timeouts")
                .with_description("Attempts abandoned when their per-attempt timeout ran out")
                .with_unit("{attempt}")
                .with_callback(move |o| o.observe(s.snapshot().attempt_timeouts, &[system()]))
                .build(),
        );

        let budget = Arc::clone(controller.budget());
        let balance = meter
            .f64_observable_gauge("stormguard.client.budget.balance")
            .with_description("Retries the budget would grant now")
            .with_unit("{retry}")
            .with_callback(move |o| {
                let b = budget.balance();
                if b.is_finite() {
                    o.observe(b, &[system()]);
                }
            })
            .build();
        let breaker = controller.breaker().cloned();
        let state = meter
            .u64_observable_gauge("stormguard.client.breaker.state")
            .with_description("The circuit breaker's state: 1 for the current one")
            .with_unit("1")
            .with_callback(move |o| {
                let Some(breaker) = &breaker else { return };
                let now = match breaker.state_at(stormguard_core::Instant::now()) {
                    BreakerState::Closed => "closed",
                    BreakerState::Open { .. } => "open",
                    BreakerState::HalfOpen => "half_open",
                };
                for name in ["closed", "open", "half_open"] {
                    let attrs = [system(), KeyValue::new("stormguard.breaker.state", name)];
                    o.observe(u64::from(name == now), &attrs);
                }
            })
            .build();

        ClientMetrics {
            methods,
            _counters: counters,
            _gauges: (balance, state),
        }
    }

    /// Starts counting one logical call to `path`.
    pub(crate) fn call(self: &Arc<Self>, path: &str) -> CallMetrics {
        let index = self.methods.index(path);
        self.methods.slots[index]
            .calls
            .fetch_add(1, Ordering::Relaxed);
        CallMetrics {
            slot: Some((Arc::clone(&self.methods), index)),
        }
    }
}

/// The per-method counters of one logical call (nothing when the layer has no meter).
#[derive(Debug, Default)]
pub(crate) struct CallMetrics {
    slot: Option<(Arc<Methods>, usize)>,
}

impl CallMetrics {
    /// Counters for a call of a layer without a meter: nothing.
    pub(crate) fn none() -> Self {
        CallMetrics { slot: None }
    }

    /// An attempt was sent.
    pub(crate) fn attempt(&self) {
        if let Some((methods, i)) = &self.slot {
            methods.slots[*i].attempts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The call ended with `code`; counted once.
    pub(crate) fn ended(&mut self, code: Code) {
        if let Some((methods, i)) = self.slot.take() {
            methods.slots[i].ended[code.as_i32() as usize].fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn methods_get_a_slot_each_and_the_rest_share_other() {
        let methods = Methods::new();
        let a = methods.index("/pkg.Svc/A");
        assert_eq!(methods.index("/pkg.Svc/A"), a);
        assert_ne!(methods.index("/pkg.Svc/B"), a);
        let name = methods.slots[a].name.get().expect("named");
        assert_eq!((&*name.0, &*name.1), ("pkg.Svc", "A"));
        for n in 0..2 * MAX_METHODS {
            methods.index(&format!("/pkg.Svc/M{n}"));
        }
        assert_eq!(methods.index("/pkg.Svc/Z"), MAX_METHODS, "_OTHER");
        assert_eq!(
            methods.index("/pkg.Svc/A"),
            a,
            "earlier methods keep their slot"
        );
    }
}
