//! The client side of load reports (gRPC ORCA): the `RetryLayer` reads the
//! `endpoint-load-metrics-bin` report of every attempt, refuses retries to a dependency
//! whose reports say it is saturated (`Refusal::Saturated`), ignores and counts malformed
//! reports, and over `Replicas` weights each replica by its reports, never above its
//! report-free weight.
#![allow(clippy::unwrap_used)]

use crate::client_support;
use crate::server_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use client_support::{controller, quick_policy};
use prost::Message as _;
use stormguard_client::ReplicaConfig;
use stormguard_client::RetryLayer;
use stormguard_client::replicas::Replicas;
use stormguard_core::ReportWeightConfig;
use stormguard_core::SaturationConfig;
use stormguard_demo::orca::OrcaLoadReport;
use stormguard_demo::server::DemoConfig;
use stormguard_demo::{
    Inventory, InventoryClient, InventoryServer, ReserveReply, ReserveRequest, StockLevel,
    WatchStockRequest,
};
use stormguard_server::WorkerLimit;
use stormguard_server::{AdmissionConfig, RetryThreshold};
use tokio::net::TcpListener;
use tonic::codegen::tokio_stream::Stream;
use tonic::metadata::MetadataValue;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};
use tower::ServiceBuilder;

const KEY: &str = "endpoint-load-metrics-bin";

/// A server that fails every `Reserve` with `UNAVAILABLE` carrying the values in `reports`
/// as `endpoint-load-metrics-bin` (raw bytes, base64-encoded by tonic; none when empty).
#[derive(Clone, Default)]
struct Reporting {
    reports: Arc<Mutex<Vec<Vec<u8>>>>,
}

impl Reporting {
    fn set(&self, reports: Vec<Vec<u8>>) {
        *self.reports.lock().unwrap() = reports;
    }
}

type Levels = std::pin::Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send>>;

#[tonic::codegen::async_trait]
impl Inventory for Reporting {
    async fn reserve(&self, _: Request<ReserveRequest>) -> Result<Response<ReserveReply>, Status> {
        let mut status = Status::unavailable("busy");
        for r in self.reports.lock().unwrap().iter() {
            status
                .metadata_mut()
                .append_bin(KEY, MetadataValue::from_bytes(r));
        }
        Err(status)
    }

    type WatchStockStream = Levels;

    async fn watch_stock(&self, _: Request<WatchStockRequest>) -> Result<Response<Levels>, Status> {
        Err(Status::unimplemented("not here"))
    }
}

async fn serve(svc: Reporting) -> Channel {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .serve_with_incoming(InventoryServer::new(svc), TcpIncoming::from(listener)),
    );
    client_support::channel(addr).await
}

/// A report encoded with the published proto's generated types.
fn orca(utilization: f64, queue: f64) -> Vec<u8> {
    let mut r = OrcaLoadReport {
        application_utilization: utilization,
        rps_fractional: 50.0,
        ..OrcaLoadReport::default()
    };
    r.named_metrics.insert("queue_depth".into(), queue);
    r.encode_to_vec()
}

fn reading_layer() -> RetryLayer {
    RetryLayer::new(controller(quick_policy()))
        .with_load_reports(SaturationConfig::default())
        .unwrap()
}

async fn one_call(channel: Channel, layer: RetryLayer) -> stormguard_client::RetrySnapshot {
    let stats = layer.stats();
    let mut client = client_support::client(channel, layer);
    let err = client
        .reserve(client_support::reserve("r"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    stats.snapshot()
}

#[tokio::test]
async fn a_retry_is_refused_after_saturated_reports_and_not_after_unsaturated_ones() {
    let server = Reporting::default();
    let channel = serve(server.clone()).await;

    server.set(vec![orca(1.0, 3.0)]);
    let s = one_call(channel.clone(), reading_layer()).await;
    assert_eq!(s.attempts, 1, "{s:?}");
    assert_eq!(s.refused.saturated, 1);
    assert_eq!(s.load_reports, 1);

    // The same answers to a layer that does not act on reports: retried.
    let s = one_call(channel.clone(), RetryLayer::new(controller(quick_policy()))).await;
    assert_eq!((s.attempts, s.refused.saturated), (3, 0), "{s:?}");

    // Busy but nothing queued, and lightly loaded: retried.
    for report in [orca(1.0, 0.0), orca(0.5, 0.0)] {
        server.set(vec![report]);
        let s = one_call(channel.clone(), reading_layer()).await;
        assert_eq!((s.attempts, s.refused.saturated), (3, 0), "{s:?}");
        assert_eq!(s.refused.attempts, 1);
        assert_eq!(s.load_reports, 3);
    }
}

#[tokio::test]
async fn malformed_reports_are_counted_and_ignored() {
    let server = Reporting::default();
    let channel = serve(server.clone()).await;
    let absurd = |f: fn(&mut OrcaLoadReport)| {
        let mut r = OrcaLoadReport {
            application_utilization: 1.0,
            ..OrcaLoadReport::default()
        };
        r.named_metrics.insert("queue_depth".into(), 5.0);
        f(&mut r);
        r.encode_to_vec()
    };
    let oversize = absurd(|r| {
        for i in 0..100 {
            r.named_metrics.insert(format!("metric-{i}"), 1.0);
        }
    });
    assert!(oversize.len() > stormguard_core::wire::MAX_REPORT_BYTES);
    let cases = [
        vec![b"\xff\xff not a protobuf".to_vec()],
        vec![absurd(|r| r.application_utilization = f64::NAN)],
        vec![absurd(|r| r.application_utilization = 1e6)],
        vec![absurd(|r| r.cpu_utilization = -1.0)],
        vec![absurd(|r| r.eps = f64::INFINITY)],
        vec![oversize],
        // Each saturated on its own, but repeated.
        vec![orca(1.0, 3.0), orca(1.0, 3.0)],
    ];
    for (i, reports) in cases.into_iter().enumerate() {
        server.set(reports);
        let s = one_call(channel.clone(), reading_layer()).await;
        assert_eq!((s.attempts, s.refused.saturated), (3, 0), "case {i}: {s:?}");
        assert_eq!((s.load_reports, s.load_reports_ignored), (0, 3), "case {i}");
    }
}

/// Two workers and a queue of one: with both held and one call waiting, the next is shed.
fn full_when_three() -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 1,
        max_time_queued: Duration::from_secs(60),
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        // Retries come back after the pushback, in real time: keep it short.
        pushback_max: Duration::from_millis(20),
        // The server's own "do not retry" (a deadline it cannot meet, shedding without a
        // break) would stop the retries too: off, so that only the reports decide.
        no_retry_margin: None,
        no_retry_after_shedding: None,
        ..AdmissionConfig::default()
    }
}

async fn start_reporting(
    admission: AdmissionConfig,
    demo: DemoConfig,
    gated: bool,
) -> server_support::TestServer {
    server_support::start_with(admission, demo, gated, |layer, inventory, incoming| {
        Server::builder()
            .layer(layer.with_load_reports())
            .add_service(inventory)
            .serve_with_incoming(incoming)
    })
    .await
}

#[tokio::test]
async fn a_real_server_at_its_limit_with_a_queue_gets_no_retry() {
    let server = start_reporting(full_when_three(), DemoConfig::default(), true).await;
    let direct = InventoryClient::new(server_support::channel(server.addr).await);
    let held = server_support::hold_worker(&direct, &server.control).await;
    let mut queued = server_support::Background::new(&direct);
    queued.send(server_support::reserve("queued", None));
    server_support::eventually("one call queued", || {
        server.stats.snapshot().queue_depth == 1
    })
    .await;
    // Attempts that reach the server while it is saturated (its worker busy, a call
    // queued) are the ones it sheds: without reports the client's retries arrive there too.
    let without = RetryLayer::new(controller(quick_policy()));
    let plain = without.stats();
    let mut client = client_support::client(server_support::channel(server.addr).await, without);
    client
        .reserve(client_support::reserve("shed"))
        .await
        .unwrap_err();
    assert_eq!(plain.snapshot().attempts, 3, "{:?}", plain.snapshot());
    assert_eq!(
        server.stats.snapshot().shed(),
        3,
        "every attempt met a saturated server"
    );

    let layer = reading_layer();
    let stats = layer.stats();
    let mut client = client_support::client(server_support::channel(server.addr).await, layer);
    let err = client
        .reserve(client_support::reserve("shed"))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unavailable);
    let s = stats.snapshot();
    assert_eq!(
        (s.attempts, s.refused.saturated, s.load_reports),
        (1, 1, 1),
        "{s:?}"
    );
    assert_eq!(
        server.stats.snapshot().shed(),
        4,
        "with reports only the first attempt met the saturated server"
    );
    server_support::release(&server.control, held).await;
    queued.serve_all(&server.control).await;
}

fn endpoint(addr: std::net::SocketAddr) -> Endpoint {
    Endpoint::from_shared(format!("http://{addr}")).unwrap()
}

fn reports_at_once() -> ReplicaConfig {
    ReplicaConfig {
        seed: Some(5),
        reports: ReportWeightConfig {
            blackout_period: Duration::ZERO,
            ..ReportWeightConfig::default()
        },
        ..ReplicaConfig::default()
    }
}

fn roomy(workers: usize) -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(workers),
        queue_capacity: 64,
        ..AdmissionConfig::default()
    }
}

fn demo(service_ms: u64) -> DemoConfig {
    DemoConfig {
        service_time: Duration::from_millis(service_ms),
        ..DemoConfig::default()
    }
}

#[tokio::test]
async fn replicas_move_calls_away_from_a_replica_reporting_high_utilization() {
    // `busy` is the faster replica (a report-free choice prefers it), but it runs every
    // call at its limit of one worker: utilization 1.0 against `roomy`'s 1/64.
    let busy = start_reporting(roomy(1), demo(1), false).await;
    let spare = start_reporting(roomy(64), demo(8), false).await;
    let replicas = Replicas::from_endpoints(
        reports_at_once(),
        [endpoint(busy.addr), endpoint(spare.addr)],
    )
    .unwrap();
    let layer = RetryLayer::new(controller(quick_policy())).over_replicas();
    let stats = layer.stats();
    let mut client =
        InventoryClient::new(ServiceBuilder::new().layer(layer).service(replicas.clone()));
    for i in 0..200 {
        client
            .reserve(client_support::reserve(&format!("c-{i}")))
            .await
            .unwrap();
    }
    let to_busy = busy.stats.snapshot().admitted;
    let to_spare = spare.stats.snapshot().admitted;
    assert_eq!(to_busy + to_spare, 200);
    assert!(to_busy < 40, "busy {to_busy}, spare {to_spare}");
    assert_eq!(stats.snapshot().load_reports, 200);
    let snapshot = replicas.snapshot();
    let factor = |addr| {
        snapshot
            .iter()
            .find(|r| r.key == *endpoint(addr).uri())
            .unwrap()
            .snapshot
            .report_factor
    };
    assert!(factor(busy.addr) < 0.2, "{}", factor(busy.addr));
    assert_eq!(
        factor(spare.addr),
        1.0,
        "the best replica keeps its report-free weight"
    );
}

#[tokio::test]
async fn a_replica_reporting_no_load_gets_no_more_than_its_report_free_weight() {
    // `liar` reports (it has 64 workers: next to no utilization); `quiet` sends no reports.
    let liar = start_reporting(roomy(64), demo(2), false).await;
    let quiet = server_support::start(roomy(64), demo(2), false).await;
    let replicas = Replicas::from_endpoints(
        reports_at_once(),
        [endpoint(liar.addr), endpoint(quiet.addr)],
    )
    .unwrap();
    let layer = RetryLayer::new(controller(quick_policy())).over_replicas();
    let mut client =
        InventoryClient::new(ServiceBuilder::new().layer(layer).service(replicas.clone()));
    for i in 0..50 {
        client
            .reserve(client_support::reserve(&format!("c-{i}")))
            .await
            .unwrap();
    }
    for r in replicas.snapshot() {
        assert_eq!(r.snapshot.report_factor, 1.0, "{r:?}");
    }
}

#[tokio::test]
async fn over_replicas_a_retry_to_an_unsaturated_replica_is_allowed() {
    // `full` sheds with saturated reports (its worker held, its queue full); `free` serves
    // and sends no reports: the client has heard only of a saturated replica, and still
    // knows another may take the retry.
    let full = start_reporting(full_when_three(), DemoConfig::default(), true).await;
    let free = server_support::start(roomy(64), DemoConfig::default(), false).await;
    let direct = InventoryClient::new(server_support::channel(full.addr).await);
    let held = server_support::hold_worker(&direct, &full.control).await;
    let mut queued = server_support::Background::new(&direct);
    queued.send(server_support::reserve("queued", None));
    server_support::eventually("one call queued", || full.stats.snapshot().queue_depth == 1).await;
    // Reports do not weight the choice here (a long blackout), so the channel keeps
    // sending first attempts to `full`.
    let replicas = Replicas::from_endpoints(
        ReplicaConfig {
            seed: Some(9),
            ..ReplicaConfig::default()
        },
        [endpoint(full.addr), endpoint(free.addr)],
    )
    .unwrap();
    let layer = reading_layer().over_replicas();
    let stats = layer.stats();
    let mut client = InventoryClient::new(ServiceBuilder::new().layer(layer).service(replicas));
    for i in 0..30 {
        client
            .reserve(client_support::reserve(&format!("c-{i}")))
            .await
            .unwrap();
    }
    let s = stats.snapshot();
    assert!(
        full.stats.snapshot().shed() >= 1,
        "some first attempts went to `full`"
    );
    assert_eq!(s.refused.saturated, 0, "{s:?}");
    assert_eq!(
        s.retries,
        full.stats.snapshot().shed(),
        "each shed attempt retried on `free`"
    );
    server_support::release(&full.control, held).await;
    queued.serve_all(&full.control).await;
}
