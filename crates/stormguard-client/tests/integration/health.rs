//! Client-side health checks (gRFC A17) end to end: `Replicas::from_endpoints` with
//! `ReplicaConfig::health_check` over real tonic replicas on loopback, each with a real
//! tonic-health service beside its Inventory (or none). Each step waits on the channel's
//! health changes (`Replicas::health_changes`), never on the clock; the replicas' own
//! counters say where the attempts went.
//!
//! - a replica whose health service says `NOT_SERVING` gets no new attempt from the moment
//!   the client has the report, with no call failed on it first; it gets attempts again
//!   once it says `SERVING`;
//! - with every replica `NOT_SERVING`, a call fails at once with `NotServing`;
//! - a replica whose server has no health service (`UNIMPLEMENTED`) counts as healthy;
//! - with health checks off (the default) no `Watch` is sent;
//! - a removed replica's `Watch` stream ends.
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use stormguard_client::replicas::{EndpointKey, ReplicaReport, Replicas};
use stormguard_client::{HealthCheckConfig, ReplicaConfig};
use stormguard_core::ServingStatus;
use stormguard_demo::server::{DemoConfig, DemoControl, DemoInventory};
use stormguard_demo::{InventoryClient, InventoryServer, ReserveRequest};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic_health::ServingStatus as Status;
use tonic_health::server::HealthReporter;

/// Every wait is bounded by this, so a missing behaviour fails the test instead of hanging.
const PATIENCE: Duration = Duration::from_secs(10);

/// A replica: the demo Inventory and, unless asked not to, a tonic-health service that
/// counts the `Watch` streams opened and open.
struct Replica {
    addr: SocketAddr,
    control: DemoControl,
    health: Option<HealthReporter>,
    watches: Arc<Watches>,
    task: tokio::task::JoinHandle<()>,
}

/// `Watch` calls the health service received, and its streams still open.
#[derive(Default)]
struct Watches {
    opened: AtomicU64,
    open: tokio::sync::watch::Sender<u64>,
}

/// Counts one open stream; dropped with it.
struct Open(Arc<Watches>);

impl Drop for Open {
    fn drop(&mut self) {
        self.0.open.send_modify(|n| *n -= 1);
    }
}

impl Replica {
    async fn start(with_health: bool) -> Replica {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let inventory = DemoInventory::new(DemoConfig {
            service_time: Duration::from_millis(1),
            ..DemoConfig::default()
        });
        let control = inventory.control();
        let watches = Arc::new(Watches::default());
        let mut routes = tonic::service::Routes::new(InventoryServer::new(inventory));
        let health = with_health.then(|| {
            let (reporter, service) = tonic_health::server::health_reporter();
            routes = routes.clone().add_service(Counted {
                inner: service,
                watches: Arc::clone(&watches),
            });
            reporter
        });
        let router = Server::builder().add_routes(routes);
        let task = tokio::spawn(async move {
            let _ = router
                .serve_with_incoming(TcpIncoming::from(listener))
                .await;
        });
        Replica {
            addr,
            control,
            health,
            watches,
            task,
        }
    }

    async fn set(&self, status: Status) {
        let reporter = self.health.as_ref().unwrap();
        reporter.set_service_status("", status).await;
    }

    fn entered(&self) -> u64 {
        self.control.counts().entered
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::from_shared(format!("http://{}", self.addr)).unwrap()
    }

    fn key(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The health service, counting its `Watch` streams (a stream is counted open until its
/// response body is dropped).
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    watches: Arc<Watches>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Counted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> tower::Service<http::Request<tonic::body::Body>> for Counted<S>
where
    S: tower::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
        > + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, S::Error>> + Send>,
    >;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let watch = request.uri().path() == "/grpc.health.v1.Health/Watch";
        let watches = Arc::clone(&self.watches);
        let answer = self.inner.call(request);
        Box::pin(async move {
            let response = answer.await?;
            if !watch {
                return Ok(response);
            }
            watches.opened.fetch_add(1, Ordering::SeqCst);
            watches.open.send_modify(|n| *n += 1);
            let open = Open(watches);
            Ok(response.map(|body| {
                use http_body_util::BodyExt;
                tonic::body::Body::new(body.map_frame(move |frame| {
                    let _held = &open;
                    frame
                }))
            }))
        })
    }
}

type Client = InventoryClient<Replicas<Channel, EndpointKey>>;

/// The channel over `replicas`, with health checks of the whole server if `checks`.
fn client(replicas: &[&Replica], checks: bool) -> (Replicas<Channel, EndpointKey>, Client) {
    let config = ReplicaConfig {
        seed: Some(3),
        health_check: checks.then(|| HealthCheckConfig::service("")),
        ..ReplicaConfig::default()
    };
    let channel = Replicas::from_endpoints(config, replicas.iter().map(|r| r.endpoint())).unwrap();
    (channel.clone(), InventoryClient::new(channel))
}

/// `n` calls at once, each sent once (no retry layer: a failed attempt fails its call);
/// how many failed.
async fn batch(client: &Client, n: usize) -> usize {
    let mut calls = JoinSet::new();
    for i in 0..n {
        let mut c = client.clone();
        calls.spawn(async move {
            c.reserve(ReserveRequest {
                sku: "sku-1".into(),
                quantity: 1,
                request_id: format!("call-{i}"),
                payload: Vec::new(),
            })
            .await
        });
    }
    let mut failed = 0;
    while let Some(done) = calls.join_next().await {
        if !matches!(done, Ok(Ok(_))) {
            failed += 1;
        }
    }
    failed
}

/// The statuses of the channel's replicas, by key.
fn statuses(replicas: &Replicas<Channel, EndpointKey>) -> Vec<(String, ServingStatus)> {
    replicas
        .snapshot()
        .into_iter()
        .map(|r: ReplicaReport<EndpointKey>| (r.key.to_string(), r.snapshot.serving))
        .collect()
}

/// Waits until the health checks have reported `want` for every replica.
async fn wait_for(replicas: &Replicas<Channel, EndpointKey>, want: &[(&Replica, ServingStatus)]) {
    let want: Vec<(String, ServingStatus)> = want.iter().map(|(r, s)| (r.key(), *s)).collect();
    // Subscribed before the first look: no change between the look and the wait is lost.
    let mut changes = replicas.health_changes();
    let waited = tokio::time::timeout(PATIENCE, async {
        while statuses(replicas) != want {
            changes.changed().await.unwrap();
        }
    })
    .await;
    assert!(
        waited.is_ok(),
        "not within {PATIENCE:?}: want {want:?}, have {:?}",
        statuses(replicas)
    );
}

#[tokio::test]
async fn a_replica_that_says_not_serving_gets_no_new_attempt_until_it_serves_again() {
    let (a, b) = (Replica::start(true).await, Replica::start(true).await);
    let (replicas, client) = client(&[&a, &b], true);
    wait_for(
        &replicas,
        &[(&a, ServingStatus::Serving), (&b, ServingStatus::Serving)],
    )
    .await;
    let mut failed = 0;
    for _ in 0..5 {
        failed += batch(&client, 20).await;
    }
    assert!(a.entered() > 0 && b.entered() > 0, "both serve");

    a.set(Status::NotServing).await;
    wait_for(
        &replicas,
        &[
            (&a, ServingStatus::NotServing),
            (&b, ServingStatus::Serving),
        ],
    )
    .await;
    // From the report on, no attempt reaches `a`; no call failed on it to get there.
    let entered = a.entered();
    for _ in 0..10 {
        failed += batch(&client, 20).await;
    }
    assert_eq!(a.entered(), entered, "attempts reached a after its report");
    let report = &replicas.snapshot()[0];
    assert_eq!(
        (report.snapshot.failures, report.snapshot.ejections),
        (0, 0)
    );
    assert_eq!(
        report.snapshot.serving_changes, 2,
        "unknown → serving → not serving"
    );

    a.set(Status::Serving).await;
    wait_for(
        &replicas,
        &[(&a, ServingStatus::Serving), (&b, ServingStatus::Serving)],
    )
    .await;
    for _ in 0..5 {
        failed += batch(&client, 20).await;
    }
    assert!(a.entered() > entered, "a serves again");
    assert_eq!(failed, 0);
}

#[tokio::test]
async fn with_no_replica_serving_a_call_fails_at_once() {
    let a = Replica::start(true).await;
    a.set(Status::NotServing).await;
    let (replicas, client) = client(&[&a], true);
    wait_for(&replicas, &[(&a, ServingStatus::NotServing)]).await;
    let err = client
        .clone()
        .reserve(ReserveRequest::default())
        .await
        .unwrap_err();
    assert!(err.message().contains("no replica serving"), "{err:?}");
    assert_eq!(a.entered(), 0);
}

#[tokio::test]
async fn a_server_without_a_health_service_counts_as_healthy() {
    let (a, bare) = (Replica::start(true).await, Replica::start(false).await);
    let (replicas, client) = client(&[&a, &bare], true);
    // UNIMPLEMENTED: checks disabled for it, as if they were off.
    wait_for(
        &replicas,
        &[
            (&a, ServingStatus::Serving),
            (&bare, ServingStatus::Unchecked),
        ],
    )
    .await;
    let mut failed = 0;
    for _ in 0..5 {
        failed += batch(&client, 20).await;
    }
    assert_eq!(failed, 0);
    assert!(bare.entered() > 0, "it takes attempts");
}

#[tokio::test]
async fn with_health_checks_off_no_watch_is_sent() {
    let (a, b) = (Replica::start(true).await, Replica::start(true).await);
    let (replicas, off) = client(&[&a, &b], false);
    assert_eq!(batch(&off, 40).await, 0);
    assert!(a.entered() > 0 && b.entered() > 0);
    assert!(
        statuses(&replicas)
            .iter()
            .all(|(_, s)| *s == ServingStatus::Unchecked)
    );
    // Checks on, over the same servers: each gets its Watch (so the count can tell).
    let (on, _) = client(&[&a, &b], true);
    wait_for(
        &on,
        &[(&a, ServingStatus::Serving), (&b, ServingStatus::Serving)],
    )
    .await;
    drop(on);
    assert_eq!(batch(&off, 40).await, 0);
    let opened: Vec<u64> = [&a, &b]
        .iter()
        .map(|r| r.watches.opened.load(Ordering::SeqCst))
        .collect();
    assert_eq!(
        opened,
        [1, 1],
        "one Watch each, from the channel with checks on"
    );
}

#[tokio::test]
async fn a_removed_replica_s_watch_stream_ends() {
    let (a, b) = (Replica::start(true).await, Replica::start(true).await);
    let (replicas, _client) = client(&[&a, &b], true);
    wait_for(
        &replicas,
        &[(&a, ServingStatus::Serving), (&b, ServingStatus::Serving)],
    )
    .await;
    let mut open = a.watches.open.subscribe();
    assert_eq!(*open.borrow(), 1);
    assert!(replicas.remove(&EndpointKey::from(a.endpoint().uri().clone())));
    tokio::time::timeout(PATIENCE, open.wait_for(|n| *n == 0))
        .await
        .expect("a's Watch stream ended")
        .unwrap();
    assert_eq!(*b.watches.open.borrow(), 1, "b's goes on");
}

/// Cold start: calls made at once, before any replica's first health answer (gRFC A17:
/// connecting), wait for the first replica that can take them instead of failing; 0 calls
/// lost. Then, with every replica `NOT_SERVING`, calls fail at once again.
#[tokio::test]
async fn calls_made_before_the_first_health_answer_wait_for_it() {
    let (a, b, c) = (
        Replica::start(true).await,
        Replica::start(true).await,
        Replica::start(true).await,
    );
    for r in [&a, &b, &c] {
        r.set(Status::Serving).await;
    }
    let mut failed = 0;
    for _ in 0..5 {
        let (replicas, client) = client(&[&a, &b, &c], true);
        assert!(
            statuses(&replicas)
                .iter()
                .all(|(_, s)| *s == ServingStatus::Unknown),
            "no answer yet"
        );
        failed += batch(&client, 64).await;
    }
    assert_eq!(failed, 0, "calls lost at cold start");
}
