//! Shared set-up for the server, client and end-to-end tests: a real tonic server on a loopback
//! port bound before serving, with the demo Inventory behind a `ShedLayer`.

#![allow(dead_code, unreachable_pub, missing_docs)]

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use stormguard_demo::server::{DemoConfig, DemoControl, DemoInventory};
use stormguard_demo::{InventoryClient, InventoryServer, ReserveReply, ReserveRequest};
use stormguard_server::WorkerLimit;
use stormguard_server::{AdmissionConfig, RetryThreshold, ShedLayer, ShedStats};
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};

pub struct TestServer {
    pub addr: SocketAddr,
    pub stats: ShedStats,
    pub control: DemoControl,
    pub task: tokio::task::JoinHandle<()>,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One worker, no queue, no retry threshold: with the worker held, every other call is
/// shed on arrival.
pub fn one_worker_no_queue() -> AdmissionConfig {
    AdmissionConfig {
        workers: WorkerLimit::Fixed(1),
        queue_capacity: 0,
        retry_threshold: RetryThreshold {
            depth: None,
            queue_delay: None,
        },
        ..AdmissionConfig::default()
    }
}

/// One worker, a queue of 4 that holds calls for up to 60 s, no retry threshold: with the
/// worker held, the next calls wait in the queue.
pub fn one_worker_short_queue() -> AdmissionConfig {
    AdmissionConfig {
        queue_capacity: 4,
        max_time_queued: Duration::from_secs(60),
        ..one_worker_no_queue()
    }
}

/// Binds 127.0.0.1:0, then serves the demo Inventory behind `ShedLayer::from_config(&admission)`.
/// The demo's gate starts closed when `gated`.
pub async fn start(admission: AdmissionConfig, demo: DemoConfig, gated: bool) -> TestServer {
    start_with(admission, demo, gated, |layer, inventory, incoming| {
        Server::builder()
            .layer(layer)
            .add_service(inventory)
            .serve_with_incoming(incoming)
    })
    .await
}

/// Like [`start`], but `serve` decides where the layer goes and what else is served: it
/// gets the layer, the demo Inventory and the bound listener, and returns the server.
pub async fn start_with<F>(
    admission: AdmissionConfig,
    demo: DemoConfig,
    gated: bool,
    serve: impl FnOnce(ShedLayer, InventoryServer<DemoInventory>, TcpIncoming) -> F,
) -> TestServer
where
    F: Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    let layer = ShedLayer::from_config(&admission).expect("valid admission config");
    let stats = layer.stats();
    let inventory = DemoInventory::new(demo);
    let control = inventory.control();
    if gated {
        control.close_gate();
    }
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let server = serve(layer, InventoryServer::new(inventory), incoming);
    let task = tokio::spawn(async move {
        server.await.expect("server runs");
    });
    TestServer {
        addr,
        stats,
        control,
        task,
    }
}

/// A channel to `addr` (the listener is already bound, so this connects at once).
pub async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("valid uri")
        .http2_max_local_error_reset_streams(None)
        .connect()
        .await
        .expect("connect to the test server")
}

/// Waits until `cond` holds, checking every millisecond; panics after 20 s with `what`.
/// For server-side state that has no notification (queue depth after a send, a reset
/// reaching the server); never a fixed sleep.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..20_000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// A `Reserve` request with `request_id`, marked as attempt `previous + 1` when
/// `previous` is given.
pub fn reserve(
    request_id: &str,
    previous: Option<&str>,
) -> tonic::Request<stormguard_demo::ReserveRequest> {
    let mut request = tonic::Request::new(stormguard_demo::ReserveRequest {
        sku: "sku-1".into(),
        quantity: 1,
        request_id: request_id.into(),
        payload: Vec::new(),
    });
    if let Some(previous) = previous {
        request.metadata_mut().insert(
            "grpc-previous-rpc-attempts",
            previous.parse().expect("ascii metadata"),
        );
    }
    request
}

/// Sets `key: value` on a request's metadata.
pub fn with_header<T>(
    mut request: tonic::Request<T>,
    key: &'static str,
    value: &str,
) -> tonic::Request<T> {
    request
        .metadata_mut()
        .insert(key, value.parse().expect("ascii metadata"));
    request
}

/// The `grpc-retry-pushback-ms` of a status, as sent.
pub fn pushback(status: &tonic::Status) -> Option<String> {
    status
        .metadata()
        .get("grpc-retry-pushback-ms")
        .map(|v| v.to_str().expect("ascii pushback").to_owned())
}

/// The outcome of a `Reserve` call.
pub type ReserveResult = Result<tonic::Response<ReserveReply>, tonic::Status>;

/// The call from [`hold_worker`], to hand to [`release`].
pub type HeldCall = JoinHandle<ReserveResult>;

/// Sends `Reserve("hold")` from a task and waits until its handler runs. With the demo's
/// gate closed it keeps one worker busy until [`release`].
pub async fn hold_worker(client: &InventoryClient<Channel>, control: &DemoControl) -> HeldCall {
    let mut client = client.clone();
    let held = tokio::spawn(async move { client.reserve(reserve("hold", None)).await });
    control.wait_running(1).await;
    held
}

/// Opens the demo's gate and waits for the call from [`hold_worker`] to be served.
pub async fn release(control: &DemoControl, held: HeldCall) {
    control.open_gate();
    held.await.expect("task").expect("held call served");
}

/// Calls sent each from its own task, so the test can go on while they queue.
pub struct Background {
    client: InventoryClient<Channel>,
    calls: JoinSet<ReserveResult>,
}

impl Background {
    pub fn new(client: &InventoryClient<Channel>) -> Self {
        Self {
            client: client.clone(),
            calls: JoinSet::new(),
        }
    }

    /// Sends `request` from a new task.
    pub fn send(&mut self, request: tonic::Request<ReserveRequest>) {
        let mut client = self.client.clone();
        self.calls
            .spawn(async move { client.reserve(request).await });
    }

    /// Opens the demo's gate and waits until every call sent has been served.
    pub async fn serve_all(mut self, control: &DemoControl) {
        control.open_gate();
        while let Some(result) = self.calls.join_next().await {
            result.expect("task").expect("background call served");
        }
    }
}
