//! OpenTelemetry metrics of a [`Replicas`] channel (feature `opentelemetry`).
//!
//! [`Replicas::with_meter`] registers these on a [`Meter`] the application passes in. They
//! are *observable*: the SDK reads the channel's own counters when it collects, so a call
//! adds no OpenTelemetry work. Every series carries `rpc.system = grpc` and
//! `stormguard.replica`, the replica's key (for [`Replicas::from_endpoints`], its URI).
//!
//! | name | kind | unit | attributes (besides `rpc.system`, `stormguard.replica`) |
//! |---|---|---|---|
//! | `stormguard.client.replica.attempts` | counter | `{attempt}` | |
//! | `stormguard.client.replica.failures` | counter | `{attempt}` | |
//! | `stormguard.client.replica.overloads` | counter | `{attempt}` | |
//! | `stormguard.client.replica.ejections` | counter | `{ejection}` | |
//! | `stormguard.client.replica.in_flight` | gauge | `{attempt}` | |
//! | `stormguard.client.replica.state` | gauge | `1` | `stormguard.replica.state` (`active`, `warming`, `ejected`, `probing`: 1 for the current one) |
//! | `stormguard.client.replica.health_changes` | counter | `{change}` | |
//! | `stormguard.client.replica.health` | gauge | `1` | `stormguard.replica.health` (`unchecked`, `unknown`, `serving`, `not_serving`, `service_unknown`: 1 for the current one) |
//!
//! The last two are the replica's client-side health check
//! ([`ReplicaConfig::health_check`](stormguard_core::ReplicaConfig::health_check)):
//! `unchecked` while checks are off.
//!
//! A replica's series stop when it is removed.
//!
//! A channel found by DNS ([`Replicas::from_dns`], feature `dns`) also records its
//! resolutions, with `rpc.system = grpc` and `stormguard.dns.name`, the name:
//!
//! | name | kind | unit |
//! |---|---|---|
//! | `stormguard.client.dns.resolutions` | counter | `{resolution}` |
//! | `stormguard.client.dns.failures` | counter | `{resolution}` |
//! | `stormguard.client.dns.added` | counter | `{record}` |
//! | `stormguard.client.dns.removed` | counter | `{record}` |
//! | `stormguard.client.dns.records` | gauge | `{record}` |

use std::fmt;
use std::hash::Hash;
use std::sync::{Arc, Weak};

use opentelemetry::KeyValue;
use opentelemetry::metrics::Meter;
use stormguard_core::Instant;
use stormguard_core::{ReplicaSnapshot, ServingStatus};

use super::{Replicas, Shared};

type Snapshots = Arc<dyn Fn() -> Vec<(Arc<str>, ReplicaSnapshot)> + Send + Sync>;

const STATES: [&str; 4] = ["active", "warming", "ejected", "probing"];
const HEALTH: [ServingStatus; 5] = [
    ServingStatus::Unchecked,
    ServingStatus::Unknown,
    ServingStatus::Serving,
    ServingStatus::NotServing,
    ServingStatus::ServiceUnknown,
];

/// A counter: name, unit, description, and what it reads from a replica's snapshot.
type Counter = (
    &'static str,
    &'static str,
    &'static str,
    fn(&ReplicaSnapshot) -> u64,
);

/// The counters.
const COUNTERS: [Counter; 5] = [
    (
        "stormguard.client.replica.attempts",
        "{attempt}",
        "Attempts sent to the replica",
        |s| s.attempts,
    ),
    (
        "stormguard.client.replica.failures",
        "{attempt}",
        "Attempts the replica answered as broken (transport failure, UNAVAILABLE without pushback, INTERNAL, UNKNOWN, DATA_LOSS)",
        |s| s.failures,
    ),
    (
        "stormguard.client.replica.overloads",
        "{attempt}",
        "Attempts the replica answered as busy (a pushback, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED)",
        |s| s.overloads,
    ),
    (
        "stormguard.client.replica.ejections",
        "{ejection}",
        "Times the replica was ejected",
        |s| s.ejections,
    ),
    (
        "stormguard.client.replica.health_changes",
        "{change}",
        "Times the replica's client-side health-check status changed",
        |s| s.serving_changes,
    ),
];

impl<S, K> Replicas<S, K>
where
    S: Send + 'static,
    K: Clone + Eq + Hash + fmt::Display + Send + 'static,
{
    /// Records this channel's per-replica metrics into `meter` (the
    /// [module docs](self) list them). Call it once per channel: a meter keeps every
    /// callback registered on it.
    ///
    /// ```
    /// use stormguard_client::ReplicaConfig;
    /// use stormguard_client::replicas::Replicas;
    ///
    /// // The application's meter (here the global one).
    /// let meter = opentelemetry::global::meter("inventory-client");
    /// let answer = tower::service_fn(|_: http::Request<()>| async {
    ///     Ok::<_, std::convert::Infallible>(http::Response::new(()))
    /// });
    /// let replicas = Replicas::from_services(ReplicaConfig::default(), [("a", answer)])?
    ///     .with_meter(&meter);
    /// # let _ = replicas;
    /// # Ok::<(), stormguard_client::ConfigError>(())
    /// ```
    pub fn with_meter(self, meter: &Meter) -> Self {
        let weak: Weak<Shared<S, K>> = Arc::downgrade(&self.shared);
        let snapshots: Snapshots = Arc::new(move || {
            let Some(shared) = weak.upgrade() else {
                return Vec::new();
            };
            let now = Instant::now();
            let inner = shared.lock();
            inner
                .members
                .iter()
                .filter_map(|m| Some((Arc::clone(&m.name), inner.set.snapshot_at(m.id, now)?)))
                .collect()
        });
        for (name, unit, doc, read) in COUNTERS {
            let snapshots = Arc::clone(&snapshots);
            meter
                .u64_observable_counter(name)
                .with_description(doc)
                .with_unit(unit)
                .with_callback(move |o| {
                    for (replica, s) in snapshots() {
                        o.observe(read(&s), &attributes(&replica));
                    }
                })
                .build();
        }
        let s = Arc::clone(&snapshots);
        meter
            .u64_observable_gauge("stormguard.client.replica.in_flight")
            .with_description("Attempts in flight on the replica")
            .with_unit("{attempt}")
            .with_callback(move |o| {
                for (replica, snap) in s() {
                    o.observe(u64::from(snap.in_flight), &attributes(&replica));
                }
            })
            .build();
        let s = Arc::clone(&snapshots);
        meter
            .u64_observable_gauge("stormguard.client.replica.state")
            .with_description("The replica's state: 1 for the current one")
            .with_unit("1")
            .with_callback(move |o| {
                for (replica, snap) in s() {
                    for state in STATES {
                        let [a, b] = attributes(&replica);
                        let attrs = [a, b, KeyValue::new("stormguard.replica.state", state)];
                        o.observe(u64::from(snap.state.as_str() == state), &attrs);
                    }
                }
            })
            .build();
        let s = Arc::clone(&snapshots);
        meter
            .u64_observable_gauge("stormguard.client.replica.health")
            .with_description(
                "The replica's client-side health-check status: 1 for the current one",
            )
            .with_unit("1")
            .with_callback(move |o| {
                for (replica, snap) in s() {
                    for status in HEALTH {
                        let [a, b] = attributes(&replica);
                        let attrs = [
                            a,
                            b,
                            KeyValue::new("stormguard.replica.health", status.as_str()),
                        ];
                        o.observe(u64::from(snap.serving == status), &attrs);
                    }
                }
            })
            .build();
        #[cfg(feature = "dns")]
        dns_metrics(meter, &Arc::downgrade(&self.shared));
        self
    }
}

/// A DNS counter: name, unit, description, and what it reads from the counts.
#[cfg(feature = "dns")]
type DnsCounter = (
    &'static str,
    &'static str,
    &'static str,
    fn(&stormguard_core::RefreshCounts) -> u64,
);

#[cfg(feature = "dns")]
const DNS_COUNTERS: [DnsCounter; 4] = [
    (
        "stormguard.client.dns.resolutions",
        "{resolution}",
        "Resolutions of the replicas' name that ended",
        |c| c.resolutions,
    ),
    (
        "stormguard.client.dns.failures",
        "{resolution}",
        "Resolutions that failed, timed out or returned no record (the last good set stays)",
        |c| c.failures,
    ),
    (
        "stormguard.client.dns.added",
        "{record}",
        "Records new in an answer: replicas added",
        |c| c.added,
    ),
    (
        "stormguard.client.dns.removed",
        "{record}",
        "Records an answer no longer listed: replicas removed",
        |c| c.removed,
    ),
];

/// The DNS series of a channel made by `from_dns` (none for any other).
#[cfg(feature = "dns")]
fn dns_metrics<S: Send + 'static, K: Send + 'static>(meter: &Meter, weak: &Weak<Shared<S, K>>) {
    let Some(shared) = weak.upgrade() else { return };
    if shared.dns.is_none() {
        return;
    }
    let report = {
        let weak = Weak::clone(weak);
        Arc::new(move || {
            let shared = weak.upgrade()?;
            let report = shared.dns.as_ref()?.borrow().clone();
            Some(report)
        })
    };
    let dns_attributes = |name: &Arc<str>| {
        [
            KeyValue::new("rpc.system", "grpc"),
            KeyValue::new("stormguard.dns.name", Arc::clone(name)),
        ]
    };
    for (name, unit, doc, read) in DNS_COUNTERS {
        let report = Arc::clone(&report);
        meter
            .u64_observable_counter(name)
            .with_description(doc)
            .with_unit(unit)
            .with_callback(move |o| {
                if let Some(r) = report() {
                    o.observe(read(&r.counts), &dns_attributes(&r.name));
                }
            })
            .build();
    }
    meter
        .u64_observable_gauge("stormguard.client.dns.records")
        .with_description("Records in the last good answer: the replicas found by DNS")
        .with_unit("{record}")
        .with_callback(move |o| {
            if let Some(r) = report() {
                o.observe(r.records.len() as u64, &dns_attributes(&r.name));
            }
        })
        .build();
}

fn attributes(replica: &Arc<str>) -> [KeyValue; 2] {
    [
        KeyValue::new("rpc.system", "grpc"),
        KeyValue::new("stormguard.replica", Arc::clone(replica)),
    ]
}
