//! Load reports from the server (gRPC ORCA): with `ShedLayer::with_load_reports` every
//! answer carries an `xds.data.orca.v3.OrcaLoadReport` in `endpoint-load-metrics-bin`
//! (its trailers, or the headers of a trailers-only answer), decoded here with the types
//! generated from the vendored published proto; without it, none.

use crate::server_support;

use std::time::Duration;

use prost::Message as _;
use server_support::{
    Background, TestServer, channel, eventually, hold_worker, release, reserve, start, start_with,
};
use stormguard_demo::InventoryClient;
use stormguard_demo::orca::OrcaLoadReport;
use stormguard_demo::server::DemoConfig;
use stormguard_server::WorkerLimit;
use stormguard_server::{AdmissionConfig, RetryThreshold};
use tonic::metadata::MetadataMap;
use tonic::transport::Server;

const KEY: &str = "endpoint-load-metrics-bin";

/// Two workers and a queue of one, nothing shed by threshold: with both workers held and
/// one call queued, the next is shed.
fn two_workers_queue_of_one() -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(2),
        queue_capacity: 1,
        max_time_queued: Duration::from_secs(60),
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        ..AdmissionConfig::default()
    }
}

async fn start_reporting(admission: AdmissionConfig, gated: bool) -> TestServer {
    start_with(
        admission,
        DemoConfig::default(),
        gated,
        |layer, inventory, incoming| {
            Server::builder()
                .layer(layer.with_load_reports())
                .add_service(inventory)
                .serve_with_incoming(incoming)
        },
    )
    .await
}

/// The report in `metadata`, decoded with the published proto's generated types.
fn report(metadata: &MetadataMap) -> Option<OrcaLoadReport> {
    let value = metadata.get_bin(KEY)?;
    let bytes = value.to_bytes().expect("base64 of a -bin key");
    Some(OrcaLoadReport::decode(bytes).expect("an OrcaLoadReport"))
}

/// A named metric; the server leaves out those at zero.
fn named(r: &OrcaLoadReport, key: &str) -> f64 {
    r.named_metrics.get(key).copied().unwrap_or(0.0)
}

#[tokio::test]
async fn no_report_unless_enabled() {
    let server = start(two_workers_queue_of_one(), DemoConfig::default(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let h1 = hold_worker(&client, &server.control).await;
    let h2 = hold_worker(&client, &server.control).await;
    let mut queued = Background::new(&client);
    queued.send(reserve("queued", None));
    eventually("one call queued", || {
        server.stats.snapshot().queue_depth == 1
    })
    .await;
    let shed = client
        .clone()
        .reserve(reserve("shed", None))
        .await
        .expect_err("shed");
    assert!(shed.metadata().get_bin(KEY).is_none(), "{shed:?}");
    server.control.open_gate();
    let held = h1.await.expect("task").expect("served");
    assert!(held.metadata().get_bin(KEY).is_none());
    release(&server.control, h2).await;
    queued.serve_all(&server.control).await;
    let ok = client
        .clone()
        .reserve(reserve("plain", None))
        .await
        .expect("served");
    assert!(report(ok.metadata()).is_none());
}

#[tokio::test]
async fn reports_track_the_queue_on_every_kind_of_answer() {
    let server = start_reporting(two_workers_queue_of_one(), true).await;
    let client = InventoryClient::new(channel(server.addr).await);
    let h1 = hold_worker(&client, &server.control).await;
    let mut c2 = client.clone();
    let h2 = tokio::spawn(async move { c2.reserve(reserve("hold-2", None)).await });
    server.control.wait_running(2).await;
    let mut c3 = client.clone();
    let queued = tokio::spawn(async move { c3.reserve(reserve("queued", None)).await });
    eventually("one call queued", || {
        server.stats.snapshot().queue_depth == 1
    })
    .await;

    // A shed answer (trailers-only): both workers busy, one call waiting, one shed.
    let shed = client
        .clone()
        .reserve(reserve("shed", None))
        .await
        .expect_err("shed");
    let r = report(shed.metadata()).expect("a shed answer carries a report");
    assert_eq!(r.application_utilization, 1.0, "{r:?}");
    assert_eq!(named(&r, "queue_depth"), 1.0);
    assert_eq!(named(&r, "time_queued_ms"), 0.0);
    assert!(r.rps_fractional >= 4.0, "four arrivals: {r:?}");
    assert!(r.eps >= 1.0, "the shed counts as an error: {r:?}");
    assert_eq!(r.cpu_utilization, 0.0);
    assert_eq!(r.mem_utilization, 0.0);
    assert!(r.utilization.is_empty() && r.request_cost.is_empty());
    // The size on the wire: base64 of the message, under load.
    let encoded = shed
        .metadata()
        .get_bin(KEY)
        .expect("report")
        .as_encoded_bytes()
        .len();
    assert!(encoded <= 100, "a few dozen bytes, got {encoded}");
    println!("endpoint-load-metrics-bin under load: {encoded} bytes on the wire");

    // The queued call waits a measured time before its worker frees up.
    tokio::time::sleep(Duration::from_millis(50)).await;
    server.control.open_gate();
    let held = h1.await.expect("task").expect("served");
    let r = report(held.metadata()).expect("a unary answer's trailers carry a report");
    assert!(r.application_utilization > 0.0 && r.application_utilization <= 1.0);
    assert_eq!(named(&r, "time_queued_ms"), 0.0, "admitted at once");
    h2.await.expect("task").expect("served");
    let q = queued.await.expect("task").expect("served");
    let r = report(q.metadata()).expect("report");
    assert!(named(&r, "time_queued_ms") >= 50.0, "{r:?}");

    // At rest: one call running (the one answered), nothing queued.
    let idle = client
        .clone()
        .reserve(reserve("idle", None))
        .await
        .expect("served");
    let r = report(idle.metadata()).expect("report");
    assert_eq!(r.application_utilization, 0.5, "1 running of 2: {r:?}");
    assert!(r.named_metrics.is_empty(), "nothing queued: {r:?}");
    let encoded = idle
        .metadata()
        .get_bin(KEY)
        .expect("report")
        .as_encoded_bytes()
        .len();
    assert!(encoded <= 40, "{encoded}");
    println!("endpoint-load-metrics-bin with room: {encoded} bytes on the wire");
}

#[tokio::test]
async fn a_stream_carries_its_report_in_its_trailers() {
    let server = start_reporting(two_workers_queue_of_one(), false).await;
    let mut client = InventoryClient::new(channel(server.addr).await);
    let mut stream = client
        .watch_stock(stormguard_demo::WatchStockRequest {
            sku: "sku-1".into(),
            count: 3,
            interval_ms: 0,
        })
        .await
        .expect("stream")
        .into_inner();
    let mut n = 0;
    while stream.message().await.expect("message").is_some() {
        n += 1;
    }
    assert_eq!(n, 3);
    let trailers = stream.trailers().await.expect("trailers").expect("some");
    let r = report(&trailers).expect("the stream's trailers carry a report");
    assert_eq!(
        r.application_utilization, 0.5,
        "the stream held 1 of 2: {r:?}"
    );
}

#[tokio::test]
async fn the_admission_key_turns_reports_on() {
    let settings = stormguard_core::ShedSettings::from_json(
        r#"{"admission": {"workers": 2, "load_reports": true}}"#,
    )
    .expect("valid");
    let layer = stormguard_server::ShedLayer::from_settings(&settings).expect("valid");
    assert!(layer.sends_load_reports());
    let off = stormguard_core::ShedSettings::from_json(r#"{"admission": {}}"#).expect("valid");
    assert!(
        !stormguard_server::ShedLayer::from_settings(&off)
            .expect("valid")
            .sends_load_reports()
    );
}
