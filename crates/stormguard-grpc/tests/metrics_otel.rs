//! The interceptor's OpenTelemetry metrics over loopback (feature `opentelemetry`): gRFC
//! A96's four per-call histograms and stormguard's own instruments, read back through the
//! SDK's in-memory exporter, as the workspace's `tests/metrics_otel.rs` reads the tonic layer's.

#![allow(clippy::unwrap_used)]

use grpc::client::CallOptions;
use grpc::client::interceptor::InvokeExt;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, Metric, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, SdkMeterProvider};
use stormguard_core::Code;
use stormguard_demo::{StockLevel, WatchStockRequest};
use stormguard_grpc::{MethodScope, RetryInterceptor, RetryPolicy};

#[path = "integration/support.rs"]
mod support;

use support::{Answer, HEDGE_DELAY, Scripted, a6, call, channel, hedged, reserve, serve};

/// The target the interceptor is given for A96's `grpc.target`.
const TARGET: &str = "dns:///inventory.test:50051";

/// Attributes of a data point, as sorted `(key, value)` pairs.
type Attributes = Vec<(String, String)>;

/// One histogram data point: its attributes, count, sum, and bucket bounds.
#[derive(Debug)]
struct Point {
    attrs: Attributes,
    count: u64,
    sum: f64,
    bounds: Vec<f64>,
}

fn attributes<'a>(kv: impl Iterator<Item = &'a opentelemetry::KeyValue>) -> Attributes {
    let mut v: Vec<_> = kv
        .map(|kv| (kv.key.to_string(), kv.value.to_string()))
        .collect();
    v.sort();
    v
}

fn metric<'a>(metrics: &'a ResourceMetrics, name: &str) -> Option<&'a Metric> {
    metrics
        .scope_metrics()
        .flat_map(|s| s.metrics())
        .find(|m| m.name() == name)
}

/// A histogram's unit and data points (none when it recorded nothing).
fn histogram(metrics: &ResourceMetrics, name: &str) -> (String, Vec<Point>) {
    let Some(metric) = metric(metrics, name) else {
        return (String::new(), Vec::new());
    };
    let points = match metric.data() {
        AggregatedMetrics::U64(MetricData::Histogram(h)) => h
            .data_points()
            .map(|p| Point {
                attrs: attributes(p.attributes()),
                count: p.count(),
                sum: p.sum() as f64,
                bounds: p.bounds().collect(),
            })
            .collect(),
        AggregatedMetrics::F64(MetricData::Histogram(h)) => h
            .data_points()
            .map(|p| Point {
                attrs: attributes(p.attributes()),
                count: p.count(),
                sum: p.sum(),
                bounds: p.bounds().collect(),
            })
            .collect(),
        _ => panic!("{name}: not a histogram"),
    };
    (metric.unit().to_owned(), points)
}

/// A counter's data points as `(attributes, value)`.
fn counter(metrics: &ResourceMetrics, name: &str) -> Vec<(Attributes, u64)> {
    let metric = metric(metrics, name).unwrap_or_else(|| panic!("{name} was not exported"));
    match metric.data() {
        AggregatedMetrics::U64(MetricData::Sum(s)) => s
            .data_points()
            .map(|p| (attributes(p.attributes()), p.value()))
            .collect(),
        _ => panic!("{name}: not a u64 counter"),
    }
}

/// The total of `name` over the points whose attributes include every pair of `with`.
fn total(metrics: &ResourceMetrics, name: &str, with: &[(&str, &str)]) -> u64 {
    counter(metrics, name)
        .into_iter()
        .filter(|(attrs, _)| {
            with.iter()
                .all(|(k, v)| attrs.iter().any(|(ak, av)| ak == k && av == v))
        })
        .map(|(_, v)| v)
        .sum()
}

fn a96_attrs(method: &str) -> Attributes {
    vec![
        ("grpc.method".to_owned(), method.to_owned()),
        ("grpc.target".to_owned(), TARGET.to_owned()),
    ]
}

const RESERVE: &str = "stormguard.demo.v1.Inventory/Reserve";
const WATCH: &str = "stormguard.demo.v1.Inventory/WatchStock";

/// A retried Reserve (one `UNAVAILABLE`, then `OK`) and a hedged WatchStock (a first copy
/// that never answers, a hedge that does), through one interceptor with a meter: A96's
/// retries, hedges and retry delay are recorded above zero, each with A96's unit, bounds
/// and attributes, and equal to stormguard's own counters. Transparent retries cannot be
/// driven through `grpc` 0.9 (it does not say which attempts were never sent, so the
/// interceptor makes none): every call records 0 of them, which A96 records as nothing, so
/// the histogram has no data point.
#[tokio::test]
async fn the_a96_histograms_and_stormguards_own_are_recorded() {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_periodic_exporter(exporter.clone())
        .build();
    let inventory = Scripted::default();
    let addr = serve(inventory.clone()).await;
    // WatchStock hedged, Reserve retried (50 ms full-jitter backoff).
    let mut config = hedged(a6());
    config.methods.set_retry(
        MethodScope::Method("stormguard.demo.v1.Inventory", "Reserve"),
        Some(RetryPolicy {
            idempotent: true,
            ..RetryPolicy::default()
        }),
    );
    let interceptor = RetryInterceptor::from_config(&config)
        .unwrap()
        .with_meter(&provider.meter("stormguard-grpc-test"))
        .with_name("inventory")
        .with_target(TARGET);
    let stats = interceptor.stats();
    let chan = channel(addr).with_interceptor(interceptor);

    // A call with one attempt records none of A96's histograms.
    let plain = reserve(&chan, CallOptions::new()).await;
    assert_eq!(plain.code(), Code::Ok);
    inventory.script([Answer::Fail(tonic::Code::Unavailable, None)]);
    let retried = reserve(&chan, CallOptions::new()).await;
    assert_eq!((retried.code(), retried.messages[0].attempt), (Code::Ok, 2));
    inventory.script([Answer::Hang]);
    let request = WatchStockRequest {
        sku: "sku-2".into(),
        count: 2,
        interval_ms: 0,
    };
    let hedged =
        call::<_, _, StockLevel>(&chan, support::WATCH, &request, CallOptions::new()).await;
    assert_eq!((hedged.code(), hedged.messages.len()), (Code::Ok, 2));

    provider.force_flush().unwrap();
    let m = exporter.get_finished_metrics().unwrap().pop().unwrap();

    // grpc.client.call.retries: the retried call's one retry, by Reserve.
    let (unit, points) = histogram(&m, "grpc.client.call.retries");
    assert_eq!(unit, "{retry}");
    assert_eq!(points.len(), 1, "{points:?}");
    assert_eq!(points[0].attrs, a96_attrs(RESERVE));
    assert_eq!((points[0].count, points[0].sum), (1, 1.0));
    assert_eq!(points[0].bounds, [1.0, 2.0, 3.0, 4.0, 5.0]);

    // grpc.client.call.hedges: the hedged call's one hedge, by WatchStock.
    let (unit, points) = histogram(&m, "grpc.client.call.hedges");
    assert_eq!(unit, "{hedge}");
    assert_eq!(points.len(), 1, "{points:?}");
    assert_eq!(points[0].attrs, a96_attrs(WATCH));
    assert_eq!((points[0].count, points[0].sum), (1, 1.0));
    assert_eq!(points[0].bounds, [1.0, 2.0, 3.0, 4.0, 5.0]);

    // grpc.client.call.retry_delay: one value for each call that retried or hedged; the
    // retry waited out its backoff, the hedged call always had a copy in flight.
    let (unit, mut points) = histogram(&m, "grpc.client.call.retry_delay");
    assert_eq!(unit, "s");
    points.sort_by(|a, b| a.attrs.cmp(&b.attrs));
    assert_eq!(points.len(), 2, "{points:?}");
    assert_eq!(points[0].attrs, a96_attrs(RESERVE));
    assert_eq!(points[0].count, 1);
    assert!(
        points[0].sum > 0.0 && points[0].sum < 1.0,
        "the retry's delay: {} s",
        points[0].sum
    );
    assert_eq!(points[1].attrs, a96_attrs(WATCH));
    assert_eq!((points[1].count, points[1].sum), (1, 0.0));
    assert_eq!(points[0].bounds.len(), 41, "gRFC A66's latency bounds");
    assert_eq!(
        (points[0].bounds[0], points[0].bounds[40]),
        (0.0, 100.0),
        "from 0 to 100 s"
    );

    // grpc.client.call.transparent_retries: 0 for every call, and a count of 0 is not
    // recorded (A96): no data point.
    let (_, points) = histogram(&m, "grpc.client.call.transparent_retries");
    assert!(points.is_empty(), "{points:?}");

    // stormguard's own, by the same interceptor: the sums of A96's equal its counters.
    let s = stats.snapshot();
    assert_eq!((s.logical, s.attempts, s.retries, s.hedges), (3, 5, 1, 1));
    let layer = [("stormguard.layer", "inventory")];
    assert_eq!(total(&m, "stormguard.client.retries", &layer), s.retries);
    assert_eq!(total(&m, "stormguard.client.hedges", &layer), s.hedges);
    assert_eq!(total(&m, "stormguard.client.hedges.won", &layer), 1);
    assert_eq!(
        total(
            &m,
            "stormguard.client.retry.delays",
            &[("stormguard.delay.source", "backoff")]
        ),
        1
    );
    assert_eq!(
        total(&m, "stormguard.client.calls", &[("rpc.method", "Reserve")]),
        2
    );
    assert_eq!(
        total(
            &m,
            "stormguard.client.attempts",
            &[("rpc.method", "WatchStock")]
        ),
        2
    );
    assert_eq!(
        total(
            &m,
            "stormguard.client.calls.ended",
            &[("rpc.grpc.status_code", "0")]
        ),
        3
    );
    let (_, durations) = histogram(&m, "rpc.client.duration");
    assert_eq!(durations.iter().map(|p| p.count).sum::<u64>(), 3);
    assert!(
        durations
            .iter()
            .filter(|p| p
                .attrs
                .contains(&("rpc.method".to_owned(), "WatchStock".to_owned())))
            .all(|p| p.sum >= HEDGE_DELAY.as_secs_f64()),
        "the hedged call took its hedge delay: {durations:?}"
    );
    assert!(metric(&m, "stormguard.client.budget.balance").is_some());
}
