//! OpenTelemetry metrics (feature `opentelemetry`): after a scripted run over real tonic,
//! what the SDK's in-memory exporter received equals the layers' own counters.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, SdkMeterProvider};
use stormguard_client::RetryLayer;
use stormguard_core::admission::{AdmissionConfig, RetryThreshold};
use stormguard_core::budget::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::policy::{MethodTable, RetryPolicy};
use stormguard_core::retry::RetryController;
use stormguard_demo::server::{DemoConfig, DemoInventory};
use stormguard_demo::{InventoryClient, InventoryServer, ReserveRequest};
use stormguard_server::ShedLayer;
use tokio::net::TcpListener;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tower::ServiceBuilder;

/// One exported metric's data points as `(attributes, value)`; `value` is the sum of a
/// counter, the value of a gauge, or the count of a histogram.
fn points(metrics: &ResourceMetrics, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
    let metric = metrics
        .scope_metrics()
        .flat_map(|s| s.metrics())
        .find(|m| m.name() == name)
        .unwrap_or_else(|| panic!("{name} was not exported"));
    fn attrs<'a>(kv: impl Iterator<Item = &'a opentelemetry::KeyValue>) -> Vec<(String, String)> {
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
            .map(|p| (attrs(p.attributes()), p.count() as f64))
            .collect(),
        _ => panic!("{name}: unexpected data"),
    }
}

/// The total of `name` over the points whose attributes include every pair of `with`.
fn total(metrics: &ResourceMetrics, name: &str, with: &[(&str, &str)]) -> u64 {
    points(metrics, name)
        .into_iter()
        .filter(|(attrs, _)| {
            with.iter()
                .all(|(k, v)| attrs.iter().any(|(ak, av)| ak == k && av == v))
        })
        .map(|(_, v)| v as u64)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exported_values_equal_the_layers_own_counters() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_periodic_exporter(exporter.clone())
        .build();
    let meter = provider.meter("stormguard-test");

    // A small server that must queue and shed: 2 workers, 4 places, retries shed once one
    // call waits; a third of the calls fail.
    let shed = ShedLayer::from_config(AdmissionConfig {
        workers: 2,
        queue_capacity: 4,
        retry_threshold: RetryThreshold {
            depth: Some(1),
            queue_delay: None,
        },
        ..AdmissionConfig::default()
    })
    .unwrap()
    .with_meter(&meter);
    let server_stats = shed.stats();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let demo = DemoInventory::new(DemoConfig {
        service_time: Duration::from_millis(5),
        fail_rate: 0.3,
        seed: 5,
    });
    tokio::spawn(
        Server::builder()
            .layer(shed)
            .serve_with_incoming(InventoryServer::new(demo), TcpIncoming::from(listener)),
    );

    let budget: Arc<dyn Budget> = Arc::new(
        RetryBudget::new(BudgetConfig {
            min_retries_per_second: 20,
            ..BudgetConfig::default()
        })
        .unwrap(),
    );
    let policy = RetryPolicy {
        idempotent: true,
        backoff: stormguard_core::backoff::BackoffConfig::FullJitter {
            base: Duration::from_millis(1),
            cap: Duration::from_millis(5),
            multiplier: 2.0,
        },
        ..RetryPolicy::default()
    };
    let layer = RetryLayer::new(RetryController::new(
        MethodTable::uniform(policy),
        budget,
        None,
        9,
    ))
    .with_meter(&meter);
    let client_stats = layer.stats();
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let client = InventoryClient::new(ServiceBuilder::new().layer(layer).service(channel));

    let calls: Vec<_> = (0..3)
        .flat_map(|_| 0..16)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move { client.reserve(ReserveRequest::default()).await.is_ok() })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }

    provider.force_flush().unwrap();
    let exported = exporter.get_finished_metrics().unwrap();
    let m = exported.last().unwrap();

    // Client: calls and attempts apart, by method; final codes; refusals by cause.
    let c = client_stats.snapshot();
    assert_eq!(c.logical, 48);
    let method = [
        ("rpc.system", "grpc"),
        ("rpc.service", "stormguard.demo.v1.Inventory"),
        ("rpc.method", "Reserve"),
    ];
    assert_eq!(total(m, "stormguard.client.calls", &method), c.logical);
    assert_eq!(total(m, "stormguard.client.attempts", &method), c.attempts);
    assert_eq!(total(m, "stormguard.client.retries", &[]), c.retries);
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
    assert!(!points(m, "stormguard.client.budget.balance").is_empty());

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
