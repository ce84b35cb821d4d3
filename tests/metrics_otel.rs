//! OpenTelemetry metrics (feature `opentelemetry`): after a scripted run over real tonic,
//! what the SDK's in-memory exporter received equals the layers' own counters; every
//! series names its layer, so two layers on one meter stay apart; the order of
//! `with_meter` and `with_stats` does not matter.
//!
//! Beside them, the example client and server (`examples/client.rs`, `examples/server.rs`)
//! with the feature on (their `--otel-stdout`): their tests, in the examples' test binary
//! too, run here with it, so that the larger binary is built once.
#![allow(clippy::unwrap_used)]
// The example client and server each bring the examples' `support/otel.rs` module of their own.
#![allow(clippy::duplicate_mod)]

#[path = "support/client.rs"]
mod client_support;
#[path = "examples/support.rs"]
mod support;

#[path = "examples/client.rs"]
mod client;
#[path = "examples/server.rs"]
mod server;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, SdkMeterProvider};
use stormguard_client::{RetryLayer, RetryStats};
use stormguard_core::MethodScope;
use stormguard_core::RetryController;
use stormguard_core::WorkerLimit;
use stormguard_core::{AdmissionConfig, RetryThreshold};
use stormguard_core::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::{MethodTable, RetryPolicy};
use stormguard_demo::server::{DemoConfig, DemoInventory};
use stormguard_demo::storm::Instruments;
use stormguard_demo::storm::chain::{ChainConfig, run_chain};
use stormguard_demo::{InventoryClient, InventoryServer, ReserveRequest};
use stormguard_server::ShedLayer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tower::ServiceBuilder;

/// Attributes of a data point, as sorted `(key, value)` pairs.
type Attributes = Vec<(String, String)>;

/// One exported metric's data points as `(attributes, value)`; `value` is the sum of a
/// counter, the value of a gauge, or the count of a histogram (its sum with `sums`).
fn data_points(metrics: &ResourceMetrics, name: &str, sums: bool) -> Vec<(Attributes, f64)> {
    let metric = metrics
        .scope_metrics()
        .flat_map(|s| s.metrics())
        .find(|m| m.name() == name)
        .unwrap_or_else(|| panic!("{name} was not exported"));
    fn attrs<'a>(kv: impl Iterator<Item = &'a opentelemetry::KeyValue>) -> Attributes {
        let mut v: Vec<_> = kv
            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect();
        v.sort();
        v
    }
    match metric.data() {
        AggregatedMetrics::U64(MetricData::Sum(s)) => s
            .data_points()
            .map(|p| (attrs(p.attributes()), p.value() as f64))
            .collect(),
        AggregatedMetrics::U64(MetricData::Gauge(g)) => g
            .data_points()
            .map(|p| (attrs(p.attributes()), p.value() as f64))
            .collect(),
        AggregatedMetrics::F64(MetricData::Gauge(g)) => g
            .data_points()
            .map(|p| (attrs(p.attributes()), p.value()))
            .collect(),
        AggregatedMetrics::F64(MetricData::Histogram(h)) => h
            .data_points()
            .map(|p| {
                let value = if sums { p.sum() } else { p.count() as f64 };
                (attrs(p.attributes()), value)
            })
            .collect(),
        AggregatedMetrics::U64(MetricData::Histogram(h)) => h
            .data_points()
            .map(|p| {
                let value = if sums {
                    p.sum() as f64
                } else {
                    p.count() as f64
                };
                (attrs(p.attributes()), value)
            })
            .collect(),
        _ => panic!("{name}: unexpected data"),
    }
}

/// One exported metric's data points (see [`data_points`]).
fn points(metrics: &ResourceMetrics, name: &str) -> Vec<(Attributes, f64)> {
    data_points(metrics, name, false)
}

/// The sums of a histogram's data points.
fn sums(metrics: &ResourceMetrics, name: &str) -> Vec<(Attributes, f64)> {
    data_points(metrics, name, true)
}

/// The total of `points` whose attributes include every pair of `with`.
fn sum_of(points: Vec<(Attributes, f64)>, with: &[(&str, &str)]) -> u64 {
    points
        .into_iter()
        .filter(|(attrs, _)| {
            with.iter()
                .all(|(k, v)| attrs.iter().any(|(ak, av)| ak == k && av == v))
        })
        .map(|(_, v)| v as u64)
        .sum()
}

/// A histogram's unit and bucket bounds (those of its first data point).
fn histogram_shape(metrics: &ResourceMetrics, name: &str) -> (String, Vec<f64>) {
    let metric = metrics
        .scope_metrics()
        .flat_map(|s| s.metrics())
        .find(|m| m.name() == name)
        .unwrap_or_else(|| panic!("{name} was not exported"));
    let bounds: Vec<f64> = match metric.data() {
        AggregatedMetrics::U64(MetricData::Histogram(h)) => {
            h.data_points().next().unwrap().bounds().collect()
        }
        AggregatedMetrics::F64(MetricData::Histogram(h)) => {
            h.data_points().next().unwrap().bounds().collect()
        }
        _ => panic!("{name}: not a histogram"),
    };
    (metric.unit().to_owned(), bounds)
}

/// The total of `name` over the points whose attributes include every pair of `with`.
fn total(metrics: &ResourceMetrics, name: &str, with: &[(&str, &str)]) -> u64 {
    sum_of(points(metrics, name), with)
}

/// Every exported series as `(metric, attributes)`, sorted.
fn series(metrics: &ResourceMetrics) -> Vec<(String, Attributes)> {
    let mut all: Vec<_> = metrics
        .scope_metrics()
        .flat_map(|s| s.metrics())
        .flat_map(|m| {
            let name = m.name().to_owned();
            points(metrics, &name)
                .into_iter()
                .map(move |(attrs, _)| (name.clone(), attrs))
        })
        .collect();
    all.sort();
    all
}

/// The layers (`stormguard.layer`) with a series of `metric`, sorted.
fn layers(metrics: &ResourceMetrics, metric: &str) -> Vec<String> {
    let mut names: Vec<_> = points(metrics, metric)
        .into_iter()
        .filter_map(|(attrs, _)| {
            attrs
                .into_iter()
                .find(|(k, _)| k == "stormguard.layer")
                .map(|(_, v)| v)
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// A meter provider exporting into memory, and its exporter.
fn provider() -> (SdkMeterProvider, InMemoryMetricExporter) {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_periodic_exporter(exporter.clone())
        .build();
    (provider, exporter)
}

/// Flushes `provider` and returns its last export.
fn collect(provider: &SdkMeterProvider, exporter: &InMemoryMetricExporter) -> ResourceMetrics {
    provider.force_flush().unwrap();
    exporter.get_finished_metrics().unwrap().pop().unwrap()
}

/// A controller that retries UNAVAILABLE on every method with a tiny backoff.
fn controller(seed: u64) -> RetryController {
    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 20,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    let policy = RetryPolicy {
        idempotent: true,
        backoff: stormguard_core::BackoffConfig::FullJitter {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(5),
            multiplier: 2.0,
        },
        ..RetryPolicy::default()
    };
    RetryController::new(MethodTable::uniform(policy), budget, None, seed).unwrap()
}

/// Serves the demo Inventory with `demo` (behind `shed`, if given) on a loopback port
/// bound before this returns.
async fn serve(demo: DemoConfig, shed: Option<ShedLayer>) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = InventoryServer::new(DemoInventory::new(demo));
    let incoming = TcpIncoming::from(listener);
    match shed {
        Some(shed) => tokio::spawn(
            Server::builder()
                .layer(shed)
                .serve_with_incoming(service, incoming),
        ),
        None => tokio::spawn(Server::builder().serve_with_incoming(service, incoming)),
    };
    addr
}

/// `n` concurrent calls through `layer` to `addr`; how many succeeded.
async fn run(addr: SocketAddr, layer: RetryLayer, n: usize) -> usize {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = InventoryClient::new(ServiceBuilder::new().layer(layer).service(channel));
    let calls: Vec<_> = (0..n)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move { client.reserve(ReserveRequest::default()).await.is_ok() })
        })
        .collect();
    let mut ok = 0;
    for call in calls {
        ok += usize::from(call.await.unwrap());
    }
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_values_equal_the_layers_own_counters() {
    let (provider, exporter) = provider();
    let meter = provider.meter("stormguard-test");

    // A small server that must queue and shed: 2 workers, 4 places, retries shed once one
    // call waits; a third of the calls fail. Named after the meter is given: either order.
    let shed = ShedLayer::from_config(&AdmissionConfig {
        workers: WorkerLimit::Fixed(2),
        queue_capacity: 4,
        retry_threshold: RetryThreshold {
            depth: Some(1),
            queue_delay: None,
        },
        ..AdmissionConfig::default()
    })
    .unwrap()
    .with_meter(&meter)
    .with_name("inventory-server");
    let server_stats = shed.stats();
    let demo = DemoConfig {
        service_time: Duration::from_millis(5),
        fail_rate: 0.3,
        seed: 5,
    };
    let addr = serve(demo, Some(shed)).await;

    // A client layer without a name: its first call names it after the service.
    let layer = RetryLayer::new(controller(9)).with_meter(&meter);
    let client_stats = layer.stats();
    run(addr, layer, 48).await;
    let m = &collect(&provider, &exporter);

    // Client: calls and attempts apart, by method; final codes; refusals by cause.
    let c = client_stats.snapshot();
    assert_eq!(c.logical, 48);
    let method = [
        ("rpc.system", "grpc"),
        ("stormguard.layer", "stormguard.demo.v1.Inventory"),
        ("rpc.service", "stormguard.demo.v1.Inventory"),
        ("rpc.method", "Reserve"),
    ];
    assert_eq!(total(m, "stormguard.client.calls", &method), c.logical);
    assert_eq!(total(m, "stormguard.client.attempts", &method), c.attempts);
    assert_eq!(total(m, "stormguard.client.retries", &[]), c.retries);
    assert_eq!(
        total(m, "stormguard.client.retries.transparent", &[]),
        c.transparent_retries
    );
    assert!(c.attempts > c.logical, "the run retried: {c:?}");
    let ok = total(
        m,
        "stormguard.client.calls.ended",
        &[("rpc.grpc.status_code", "0")],
    );
    assert_eq!(ok, c.ok);
    assert_eq!(
        total(m, "stormguard.client.calls.ended", &method),
        c.ok + c.failed
    );
    for (cause, n) in c.refused.iter() {
        let exported = total(
            m,
            "stormguard.client.retries.refused",
            &[("stormguard.refusal.cause", cause)],
        );
        assert_eq!(exported, n, "{cause}");
    }
    assert_eq!(
        total(
            m,
            "stormguard.client.retry.delays",
            &[("stormguard.delay.source", "pushback")]
        ),
        c.delayed_by_pushback
    );
    assert_eq!(
        total(
            m,
            "stormguard.client.retry.delays",
            &[("stormguard.delay.source", "backoff")]
        ),
        c.delayed_by_backoff
    );
    assert_eq!(
        total(m, "stormguard.client.attempt.timeouts", &[]),
        c.attempt_timeouts
    );
    assert_eq!(total(m, "stormguard.client.hedges", &[]), c.hedges);
    assert_eq!(total(m, "stormguard.client.hedges.won", &[]), c.hedges_won);
    assert_eq!(
        total(m, "stormguard.client.hedges.refused", &[]),
        c.hedges_refused.iter().map(|(_, n)| n).sum::<u64>()
    );
    assert!(!points(m, "stormguard.client.budget.balance").is_empty());
    // One histogram point per call, when it ended: its attempts and its duration, by method
    // (and final code for the duration).
    let ended = c.ok + c.failed;
    assert_eq!(
        total(m, "stormguard.client.attempts_per_call", &method),
        ended
    );
    assert_eq!(
        sum_of(sums(m, "stormguard.client.attempts_per_call"), &method),
        c.attempts,
        "every call ended, so their attempts add up to all attempts"
    );
    assert_eq!(total(m, "rpc.client.duration", &method), ended);
    assert_eq!(
        total(m, "rpc.client.duration", &[("rpc.grpc.status_code", "0")]),
        c.ok
    );

    // Every series names its layer: gRFC A96's as their `grpc.target`, the layer having
    // no target given.
    for (metric, attrs) in series(m) {
        let key = if metric.starts_with("grpc.client.call.") {
            "grpc.target"
        } else {
            "stormguard.layer"
        };
        let layer = attrs.iter().find(|(k, _)| k == key);
        let want = if metric.starts_with("stormguard.server") {
            "inventory-server"
        } else {
            "stormguard.demo.v1.Inventory"
        };
        assert_eq!(
            layer.map(|(_, v)| v.as_str()),
            Some(want),
            "{metric} {attrs:?}"
        );
    }

    // Server: admitted, shed by class and reason, expired, cancelled, queued time.
    let s = server_stats.snapshot();
    assert_eq!(total(m, "stormguard.server.admitted", &[]), s.admitted);
    assert_eq!(
        total(
            m,
            "stormguard.server.shed",
            &[("stormguard.attempt.class", "first")]
        ),
        s.shed_first
    );
    assert_eq!(
        total(
            m,
            "stormguard.server.shed",
            &[("stormguard.attempt.class", "retry")]
        ),
        s.shed_retry
    );
    assert_eq!(
        total(
            m,
            "stormguard.server.shed",
            &[("stormguard.criticality", "sheddable")]
        ),
        s.shed_sheddable
    );
    assert!(s.shed() > 0, "the run shed: {s:?}");
    assert_eq!(total(m, "stormguard.server.expired", &[]), s.expired);
    assert_eq!(
        total(m, "stormguard.server.cancelled_queued", &[]),
        s.cancelled_queued
    );
    assert_eq!(
        total(m, "stormguard.server.cut_at_deadline", &[]),
        s.cut_at_deadline
    );
    assert_eq!(total(m, "stormguard.server.queue.time", &[]), s.dequeued);
    assert!(s.dequeued > 0, "calls queued: {s:?}");
    assert_eq!(total(m, "stormguard.server.workers", &[]), 2);
    assert_eq!(total(m, "stormguard.server.queue.depth", &[]), 0);
    // Amplification, from the exported values alone.
    let amplification = total(m, "stormguard.client.attempts", &[]) as f64
        / total(m, "stormguard.client.calls", &[]) as f64;
    assert_eq!(amplification, c.amplification());
    provider.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_layers_on_one_meter_export_series_of_their_own() {
    let (provider, exporter) = provider();
    let meter = provider.meter("stormguard-test");
    let addr = serve(DemoConfig::default(), None).await;
    // Two layers to the same service: one named, one named by its first call.
    let eu = RetryLayer::new(controller(1))
        .with_name("inventory-eu")
        .with_meter(&meter);
    let other = RetryLayer::new(controller(2)).with_meter(&meter);
    let (eu_stats, other_stats) = (eu.stats(), other.stats());
    assert_eq!(other.name(), None, "no call yet");
    assert_eq!(run(addr, eu, 3).await, 3);
    assert_eq!(run(addr, other, 5).await, 5);
    let m = &collect(&provider, &exporter);

    let calls = |layer| total(m, "stormguard.client.calls", &[("stormguard.layer", layer)]);
    assert_eq!(calls("inventory-eu"), eu_stats.snapshot().logical);
    assert_eq!(
        calls("stormguard.demo.v1.Inventory"),
        other_stats.snapshot().logical
    );
    assert_eq!(total(m, "stormguard.client.calls", &[]), 8);
    let layers = |metric| layers(m, metric);
    for metric in [
        "stormguard.client.retries",
        "stormguard.client.budget.balance",
        "stormguard.client.attempts_per_call",
        "rpc.client.duration",
    ] {
        assert_eq!(
            layers(metric),
            ["inventory-eu", "stormguard.demo.v1.Inventory"],
            "{metric}"
        );
    }
    provider.shutdown().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_meter_and_with_stats_in_either_order_export_the_same_series() {
    let mut exports = Vec::new();
    for meter_first in [true, false] {
        let (provider, exporter) = provider();
        let meter = provider.meter("stormguard-test");
        let stats = RetryStats::new();
        let layer = RetryLayer::new(controller(3)).with_name("inventory");
        let layer = if meter_first {
            layer.with_meter(&meter).with_stats(stats.clone())
        } else {
            layer.with_stats(stats.clone()).with_meter(&meter)
        };
        // Half the calls fail (the same ones each time: a fresh seeded server, calls one
        // after another), so the counters read from the stats are not all zero.
        let demo = DemoConfig {
            service_time: Duration::from_millis(1),
            fail_rate: 0.5,
            seed: 7,
        };
        let addr = serve(demo, None).await;
        for _ in 0..8 {
            run(addr, layer.clone(), 1).await;
        }
        let m = &collect(&provider, &exporter);
        // The instruments read the counters given to `with_stats`, whatever the order.
        let s = stats.snapshot();
        assert_eq!(s.logical, 8);
        assert!(s.retries > 0, "{s:?}");
        assert_eq!(
            total(m, "stormguard.client.retries", &[]),
            s.retries,
            "meter first: {meter_first}"
        );
        assert_eq!(
            total(m, "stormguard.client.retry.delays", &[]),
            s.delayed_by_backoff + s.delayed_by_pushback
        );
        assert_eq!(total(m, "stormguard.client.calls", &[]), 8);
        exports.push(series(m));
        provider.shutdown().unwrap();
    }
    assert!(exports[0].len() > 10, "{:?}", exports[0]);
    assert_eq!(exports[0], exports[1]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_export_each_replicas_counters_and_state() {
    use stormguard_client::ReplicaConfig;
    use stormguard_client::replicas::Replicas;
    let (provider, exporter) = provider();
    let good = serve(DemoConfig::default(), None).await;
    // A port bound and released: connections to it are refused.
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let endpoints = [good, gone].map(|a| Endpoint::from_shared(format!("http://{a}")).unwrap());
    let replicas = Replicas::from_endpoints(
        ReplicaConfig {
            seed: Some(5),
            ..ReplicaConfig::default()
        },
        endpoints,
    )
    .unwrap()
    .with_meter(&provider.meter("replicas"));
    let layer = RetryLayer::new(controller(5)).over_replicas();
    let mut client =
        InventoryClient::new(ServiceBuilder::new().layer(layer).service(replicas.clone()));
    for _ in 0..50 {
        client.reserve(ReserveRequest::default()).await.unwrap();
    }
    let metrics = collect(&provider, &exporter);
    for report in replicas.snapshot() {
        let key = report.key.to_string();
        let with = [("stormguard.replica", key.as_str())];
        let s = report.snapshot;
        assert_eq!(
            total(&metrics, "stormguard.client.replica.attempts", &with),
            s.attempts
        );
        assert_eq!(
            total(&metrics, "stormguard.client.replica.failures", &with),
            s.failures
        );
        assert_eq!(
            total(&metrics, "stormguard.client.replica.ejections", &with),
            s.ejections
        );
        let states = points(&metrics, "stormguard.client.replica.state");
        let current = [
            ("stormguard.replica", key.as_str()),
            ("stormguard.replica.state", report.snapshot.state.as_str()),
        ];
        assert_eq!(sum_of(states.clone(), &current), 1);
        assert_eq!(sum_of(states, &with), 1, "one state at a time");
        // Health checks off: every replica `unchecked`, no change.
        let health = points(&metrics, "stormguard.client.replica.health");
        let unchecked = [
            ("stormguard.replica", key.as_str()),
            ("stormguard.replica.health", "unchecked"),
        ];
        assert_eq!(sum_of(health.clone(), &unchecked), 1);
        assert_eq!(sum_of(health, &with), 1, "one status at a time");
        assert_eq!(
            total(&metrics, "stormguard.client.replica.health_changes", &with),
            s.serving_changes
        );
    }
    let gone_key = format!("http://{gone}");
    assert!(
        total(
            &metrics,
            "stormguard.client.replica.failures",
            &[("stormguard.replica", gone_key.as_str())]
        ) >= 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_found_by_dns_export_their_resolutions() {
    use stormguard_client::replicas::{Dns, Replicas};
    use stormguard_client::{RefreshConfig, ReplicaConfig};
    use stormguard_demo::dns::DnsServer;
    let (provider, exporter) = provider();
    let good = serve(DemoConfig::default(), None).await;
    let name = "inventory.metrics.test";
    let dns = DnsServer::start(name, [good.ip()], 1).await.unwrap();
    let target = Dns::new(name)
        .unwrap()
        .port(good.port())
        .name_servers([dns.addr()])
        .refresh(RefreshConfig {
            min_interval: Duration::from_millis(20),
            max_interval: Duration::from_millis(50),
            timeout: Duration::from_millis(100),
            ..RefreshConfig::default()
        });
    let replicas = Replicas::from_dns(ReplicaConfig::default(), target)
        .unwrap()
        .with_meter(&provider.meter("replicas"));
    let layer = RetryLayer::new(controller(5)).over_replicas();
    let mut client =
        InventoryClient::new(ServiceBuilder::new().layer(layer).service(replicas.clone()));
    client.reserve(ReserveRequest::default()).await.unwrap();
    // The server stops answering: a failed resolution, the record kept.
    dns.set_answering(false);
    let mut reports = replicas.dns_reports().unwrap();
    let report = reports
        .wait_for(|r| r.counts.failures >= 1)
        .await
        .unwrap()
        .clone();
    let metrics = collect(&provider, &exporter);
    let with = [("stormguard.dns.name", name)];
    let counts = report.counts;
    // Read after the report: at least its counts (a resolution may have ended since).
    assert!(total(&metrics, "stormguard.client.dns.resolutions", &with) >= counts.resolutions);
    assert!(total(&metrics, "stormguard.client.dns.failures", &with) >= 1);
    assert_eq!(total(&metrics, "stormguard.client.dns.added", &with), 1);
    assert_eq!(total(&metrics, "stormguard.client.dns.removed", &with), 0);
    assert_eq!(total(&metrics, "stormguard.client.dns.records", &with), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_the_adaptive_throttle_refuses_are_exported_by_criticality() {
    let (provider, exporter) = provider();
    let meter = provider.meter("stormguard-test");
    // A real ShedLayer with one worker and one place: most of a wave of calls is shed.
    let shed = ShedLayer::from_config(&AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 1,
        retry_threshold: RetryThreshold {
            depth: Some(1),
            queue_delay: None,
        },
        ..AdmissionConfig::default()
    })
    .unwrap();
    let demo = DemoConfig {
        service_time: Duration::from_millis(5),
        fail_rate: 0.0,
        seed: 5,
    };
    let addr = serve(demo, Some(shed)).await;
    let throttle = stormguard_core::AdaptiveThrottle::new(
        stormguard_core::AdaptiveThrottleConfig {
            window: Duration::from_secs(60),
            ..Default::default()
        },
        3,
    )
    .unwrap();
    let layer = RetryLayer::new(controller(9))
        .with_adaptive_throttle(throttle)
        .with_meter(&meter)
        .with_name("throttled");
    let stats = layer.stats();
    // The first wave goes out whole (the throttle has seen nothing yet) and is mostly
    // shed; the next ones are mostly refused locally.
    for _ in 0..3 {
        run(addr, layer.clone(), 60).await;
    }
    let c = stats.snapshot();
    assert!(c.throttled.default > 0, "{c:?}");
    let m = &collect(&provider, &exporter);
    let class = |name| {
        total(
            m,
            "stormguard.client.throttled",
            &[
                ("stormguard.layer", "throttled"),
                ("stormguard.criticality", name),
            ],
        )
    };
    assert_eq!(class("default"), c.throttled.default);
    assert_eq!(class("sheddable"), 0);
    assert_eq!(class("critical"), 0);
}

/// The series a plain run leaves at zero, each driven above it: hedges (sent, won and
/// refused), attempt timeouts, calls the server cut at their deadline, and transparent
/// retries. The exported values equal the layers' own counters.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hedges_timeouts_cuts_and_transparent_retries_are_exported() {
    use stormguard_client::ReplicaConfig;
    use stormguard_client::replicas::Replicas;
    use stormguard_core::{Code, CodeSet};
    use stormguard_core::{HedgeDelay, HedgingPolicy};

    let (provider, exporter) = provider();
    let meter = provider.meter("stormguard-test");
    // 50 ms a call; a third of the calls fail at once, from a seeded draw.
    let shed = ShedLayer::from_config(&AdmissionConfig::default())
        .unwrap()
        .with_meter(&meter)
        .with_name("inventory-server");
    let server_stats = shed.stats();
    let demo = DemoConfig {
        service_time: Duration::from_millis(50),
        fail_rate: 0.3,
        seed: 5,
    };
    let addr = serve(demo, Some(shed)).await;

    // Hedging: a second copy after 10 ms, or at once after an UNAVAILABLE, paid from a
    // budget of 20 retries of which hedges may spend half. Calls one after another: the
    // same draws every run.
    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 2,
            retry_ratio: 0.01,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    let mut table = MethodTable::none();
    table.set_hedging(
        MethodScope::Default,
        Some(HedgingPolicy {
            max_attempts: 2,
            delay: HedgeDelay::Fixed(Duration::from_millis(10)),
            non_fatal_codes: CodeSet::single(Code::Unavailable),
            ..HedgingPolicy::default()
        }),
    );
    let hedging = RetryLayer::new(RetryController::new(table, budget, None, 4).unwrap())
        .with_name("hedging")
        .with_meter(&meter);
    let hedging_stats = hedging.stats();
    for _ in 0..30 {
        run(addr, hedging.clone(), 1).await;
    }

    // Attempts cut off by the layer's per-attempt timeout, shorter than the service time.
    let timeouts = RetryLayer::new(controller(6))
        .with_per_attempt_timeout(Duration::from_millis(20))
        .with_name("timeouts")
        .with_meter(&meter);
    let timeouts_stats = timeouts.stats();
    run(addr, timeouts, 4).await;

    // Calls with a 600 ms deadline to a server whose handler takes 1 s and that cuts a
    // call 500 ms before its deadline (long before the client gives up, however slow the
    // machine): every one is cut while its handler runs.
    let cutting = ShedLayer::from_config(&AdmissionConfig {
        min_time_left: Duration::from_millis(500),
        ..AdmissionConfig::default()
    })
    .unwrap()
    .with_meter(&meter)
    .with_name("cutting-server");
    let cutting_stats = cutting.stats();
    let slow = DemoConfig {
        service_time: Duration::from_millis(1000),
        fail_rate: 0.0,
        seed: 5,
    };
    let cutting_addr = serve(slow, Some(cutting)).await;
    let channel = Endpoint::from_shared(format!("http://{cutting_addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut plain = InventoryClient::new(channel);
    for _ in 0..3 {
        let mut request = tonic::Request::new(ReserveRequest::default());
        request.set_timeout(Duration::from_millis(600));
        plain.reserve(request).await.unwrap_err();
    }

    // A replica whose port refuses connections: its attempts are retried transparently.
    let gone = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let endpoints = [addr, gone].map(|a| Endpoint::from_shared(format!("http://{a}")).unwrap());
    let replicas = Replicas::from_endpoints(
        ReplicaConfig {
            seed: Some(5),
            ..ReplicaConfig::default()
        },
        endpoints,
    )
    .unwrap();
    let transparent = RetryLayer::new(controller(5))
        .over_replicas()
        .with_name("transparent")
        .with_target("dns:///inventory.test:443")
        .with_meter(&meter);
    let transparent_stats = transparent.stats();
    let mut client =
        InventoryClient::new(ServiceBuilder::new().layer(transparent).service(replicas));
    for _ in 0..20 {
        let _ = client.reserve(ReserveRequest::default()).await;
    }

    let m = &collect(&provider, &exporter);
    let of = |layer: &'static str| [("stormguard.layer", layer)];
    let h = hedging_stats.snapshot();
    assert!(h.hedges > 0 && h.hedges_won > 0, "{h:?}");
    let refused: u64 = h.hedges_refused.iter().map(|(_, n)| n).sum();
    assert!(refused > 0, "{h:?}");
    assert_eq!(
        total(m, "stormguard.client.hedges", &of("hedging")),
        h.hedges
    );
    assert_eq!(
        total(m, "stormguard.client.hedges.won", &of("hedging")),
        h.hedges_won
    );
    assert_eq!(
        total(m, "stormguard.client.hedges.refused", &of("hedging")),
        refused
    );
    for (cause, n) in h.hedges_refused.iter() {
        let exported = total(
            m,
            "stormguard.client.hedges.refused",
            &[
                ("stormguard.layer", "hedging"),
                ("stormguard.refusal.cause", cause),
            ],
        );
        assert_eq!(exported, n, "{cause}");
    }

    let t = timeouts_stats.snapshot();
    assert!(t.attempt_timeouts > 0, "{t:?}");
    assert_eq!(
        total(m, "stormguard.client.attempt.timeouts", &of("timeouts")),
        t.attempt_timeouts
    );

    let s = cutting_stats.snapshot();
    assert_eq!(s.cut_at_deadline, 3, "{s:?}");
    assert_eq!(
        total(
            m,
            "stormguard.server.cut_at_deadline",
            &of("cutting-server")
        ),
        s.cut_at_deadline
    );
    let s = server_stats.snapshot();
    assert_eq!(
        total(
            m,
            "stormguard.server.cut_at_deadline",
            &of("inventory-server")
        ),
        s.cut_at_deadline
    );

    let r = transparent_stats.snapshot();
    assert!(r.transparent_retries > 0, "{r:?}");
    assert_eq!(
        total(
            m,
            "stormguard.client.retries.transparent",
            &of("transparent")
        ),
        r.transparent_retries
    );

    // gRFC A96's per-call histograms: by `grpc.method` and `grpc.target` alone (the
    // target given, else the layer's name), their sums the layers' own counters.
    let reserve = ("grpc.method", "stormguard.demo.v1.Inventory/Reserve");
    let target = |t: &'static str| [reserve, ("grpc.target", t)];
    let a96 = [
        (
            "grpc.client.call.retries",
            "{retry}",
            &[1.0, 2.0, 3.0, 4.0, 5.0][..],
        ),
        (
            "grpc.client.call.transparent_retries",
            "{transparent_retry}",
            &[1.0, 2.0, 3.0, 4.0, 5.0, 10.0][..],
        ),
        (
            "grpc.client.call.hedges",
            "{hedge}",
            &[1.0, 2.0, 3.0, 4.0, 5.0][..],
        ),
    ];
    for (name, unit, bounds) in a96 {
        assert_eq!(histogram_shape(m, name), (unit.to_owned(), bounds.to_vec()));
    }
    let (unit, bounds) = histogram_shape(m, "grpc.client.call.retry_delay");
    assert_eq!(unit, "s");
    assert_eq!(bounds.first(), Some(&0.0));
    assert_eq!(bounds.last(), Some(&100.0));
    for name in a96
        .map(|(name, ..)| name)
        .iter()
        .chain(&["grpc.client.call.retry_delay"])
    {
        for (attrs, _) in points(m, name) {
            let keys: Vec<_> = attrs.iter().map(|(k, _)| k.as_str()).collect();
            assert_eq!(keys, ["grpc.method", "grpc.target"], "{name}");
            assert_eq!(
                (attrs[0].0.as_str(), attrs[0].1.as_str()),
                reserve,
                "{name}"
            );
        }
    }
    let hedges = sum_of(sums(m, "grpc.client.call.hedges"), &target("hedging"));
    assert_eq!(hedges, h.hedges);
    let transparent = sum_of(
        sums(m, "grpc.client.call.transparent_retries"),
        &target("dns:///inventory.test:443"),
    );
    assert_eq!(transparent, r.transparent_retries);
    let mut retries = 0;
    for (layer, paid) in [
        ("hedging", h.retries),
        ("timeouts", t.retries),
        ("dns:///inventory.test:443", r.retries),
    ] {
        let exported = sum_of(sums(m, "grpc.client.call.retries"), &target(layer));
        assert_eq!(exported, paid, "{layer}");
        retries += paid;
    }
    assert!(retries > 0, "the run retried");
    // Every call that retried or hedged records its delay, and only those.
    let delays = points(m, "grpc.client.call.retry_delay");
    assert!(!delays.is_empty());
    let waited: f64 = sums(m, "grpc.client.call.retry_delay")
        .iter()
        .map(|(_, s)| s)
        .sum();
    assert!(waited > 0.0, "{delays:?}");
    let retried_or_hedged = sum_of(points(m, "grpc.client.call.retries"), &[])
        + sum_of(points(m, "grpc.client.call.hedges"), &[]);
    assert!(sum_of(delays, &[]) <= retried_or_hedged);
    provider.shutdown().unwrap();
}

/// A layer with an adaptive limit exports its bounds beside the limit, so that a rule can
/// tell a limit pinned at one of them; a fixed limit has none to export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_adaptive_limit_exports_its_bounds_and_a_fixed_one_none() {
    let (provider, exporter) = provider();
    let meter = provider.meter("stormguard-test");
    let adaptive = AdmissionConfig {
        workers: stormguard_core::WorkerLimit::Adaptive(stormguard_core::AdaptiveLimitConfig {
            min_limit: 3,
            max_limit: 40,
            ..stormguard_core::AdaptiveLimitConfig::default()
        }),
        ..AdmissionConfig::default()
    };
    let fixed = AdmissionConfig {
        workers: stormguard_core::WorkerLimit::Fixed(64),
        ..AdmissionConfig::default()
    };
    let demo = DemoConfig {
        service_time: Duration::from_millis(1),
        fail_rate: 0.0,
        seed: 1,
    };
    for (name, config) in [("adaptive", adaptive), ("fixed", fixed)] {
        let shed = ShedLayer::from_config(&config)
            .unwrap()
            .with_meter(&meter)
            .with_name(name);
        let addr = serve(demo, Some(shed)).await;
        assert_eq!(run(addr, RetryLayer::new(controller(1)), 1).await, 1);
    }
    let m = &collect(&provider, &exporter);
    for (metric, bound) in [
        ("stormguard.server.workers.min", 3),
        ("stormguard.server.workers.max", 40),
    ] {
        let exported = points(m, metric);
        assert_eq!(exported.len(), 1, "{metric}: {exported:?}");
        assert_eq!(total(m, metric, &[("stormguard.layer", "adaptive")]), bound);
    }
    assert_eq!(
        total(
            m,
            "stormguard.server.workers",
            &[("stormguard.layer", "fixed")]
        ),
        64
    );
    provider.shutdown().unwrap();
}

/// The chain example's `--metrics-addr`: each layer is named after its case and hop, the
/// client layer calling a service and that service's `ShedLayer` alike (how the
/// dashboard's `chain` variable picks one layer per hop), and the inventory hop's exported
/// attempts are the attempts the chain counted reaching inventory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chain_names_each_hop_after_its_case_and_service() {
    let (provider, exporter) = provider();
    let meter = provider.meter("stormguard-test");
    let (client, server) = (meter.clone(), meter);
    let instruments = Instruments::new(
        move |layer, name| layer.with_meter(&client).with_name(name),
        move |layer, name| layer.with_meter(&server).with_name(name),
    );
    let config = ChainConfig {
        duration: Duration::from_millis(400),
        ..ChainConfig::quick()
    };
    let report = run_chain(&config, &instruments).await.unwrap();
    let m = &collect(&provider, &exporter);

    let hops = ["gateway", "inventory", "orders"];
    let named: Vec<String> = ["dead", "flaky"]
        .iter()
        .flat_map(|case| hops.map(|hop| format!("{case}.{hop}")))
        .collect();
    assert_eq!(layers(m, "stormguard.client.calls"), named);
    assert_eq!(layers(m, "stormguard.server.admitted"), named);
    for (case, name) in [(&report.dead, "dead"), (&report.flaky, "flaky")] {
        let stormguard = case.policies.iter().find(|p| p.name == "stormguard");
        let bottom = stormguard.expect("a stormguard run").bottom_calls;
        let layer = format!("{name}.inventory");
        let attempts = total(
            m,
            "stormguard.client.attempts",
            &[("stormguard.layer", &layer)],
        );
        assert_eq!(attempts, bottom, "{layer}");
        assert!(bottom > 0, "{layer}: calls reached inventory");
    }
    provider.shutdown().unwrap();
}
