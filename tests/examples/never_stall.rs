//! The README's client and the `fleet` example's `stormguard` client, each in a fleet of
//! callers' plain loops (spawned tasks, a client each, no `yield_now`) against a
//! dependency that refuses connections, on a current-thread runtime: a task beside them
//! keeps getting turns. Each client is built as its source builds it: the README's "Use"
//! section (an `Endpoint` connected at once, `RetryLayer::from_config(&ClientConfig::default())`,
//! a 300 ms deadline per call), whose calls the connection backoff refuses without I/O;
//! and `examples/fleet/dns.rs` (`Replicas::from_dns` with health checks under the
//! `RetryLayer` of `stormguard_client_config` over replicas), whose calls fail at once
//! once every replica's health check could not connect. (The fleet's default client,
//! `Replicas::from_endpoints` without health checks, dials on every call against replicas
//! that refuse: each call waits for the network, so its loop yields without the budget.)
//! No timed assertion: the task counts its turns; every wait is bounded.
#![allow(clippy::unwrap_used)]

use crate::turns_support::turns_beside_tasks;
use std::future::Future;
use std::time::Duration;

use stormguard::client::replicas::Replicas;
use stormguard::client::{ClientConfig, ReplicaConfig, RetryLayer};
use stormguard_demo::server::{DemoConfig, DemoInventory};
use stormguard_demo::storm::stormguard_client_config;
use stormguard_demo::{InventoryClient, InventoryServer, ReserveRequest};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tower::ServiceBuilder;

/// The callers: spawned tasks, as a user's own.
const CALLERS: u64 = 16;

/// Calls per caller: 64 rounds of a task's cooperative budget (128).
const PER_CALLER: u64 = 64 * 128;

/// Every wait is bounded by this: a caller that does not end fails the test instead of
/// hanging it.
const PATIENCE: Duration = Duration::from_secs(60);

/// The turns the task beside the callers must get: half of one per round of 128 calls per
/// caller (a task that spends the budget yields once per 128 calls).
const TURNS: u64 = PER_CALLER / 256;

fn request() -> tonic::Request<ReserveRequest> {
    let mut request = tonic::Request::new(ReserveRequest {
        sku: "sku-1".into(),
        quantity: 1,
        request_id: "r".into(),
        payload: Vec::new(),
    });
    // as the README's client: one deadline for all its attempts
    request.set_timeout(Duration::from_millis(300));
    request
}

/// Runs `CALLERS` spawned tasks, each the loop `caller()` makes, beside a task that counts
/// its turns; returns the turns it got while they ran.
async fn turns_beside_callers<F, Fut>(caller: F) -> u64
where
    F: Fn() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let callers = (0..CALLERS).map(|_| tokio::spawn(caller())).collect();
    turns_beside_tasks(callers, PATIENCE).await
}

/// An address where nothing listens: connections to it are refused.
fn refusing_address() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test(flavor = "current_thread")]
async fn the_readmes_client_in_a_loop_against_a_dependency_that_refuses_connections_never_stalls() {
    // The dependency is up when the client connects (the README connects at once), then
    // goes away: its port refuses connections.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(
        Server::builder()
            .add_service(InventoryServer::new(DemoInventory::new(
                DemoConfig::default(),
            )))
            .serve_with_incoming_shutdown(TcpIncoming::from(listener), async {
                let _ = stopped.await;
            }),
    );
    // The README's client, as its "Use" section builds it.
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .http2_max_local_error_reset_streams(None)
        .connect()
        .await
        .unwrap();
    let layer = RetryLayer::from_config(&ClientConfig::default()).unwrap();
    let stats = layer.stats();
    let client = InventoryClient::new(ServiceBuilder::new().layer(layer).service(channel));
    // The dependency goes away: its connection closes, and its port refuses.
    let _ = stop.send(());
    let ended = tokio::time::timeout(PATIENCE, server).await;
    assert!(
        matches!(ended, Ok(Ok(Ok(())))),
        "the server did not stop: {ended:?}"
    );
    let turns = turns_beside_callers(|| {
        let mut client = client.clone();
        async move {
            for _ in 0..PER_CALLER {
                let _ = client.reserve(request()).await;
            }
        }
    })
    .await;
    let refused = stats.snapshot().refused;
    assert!(
        refused.connect_backoff >= CALLERS * PER_CALLER * 9 / 10,
        "{refused:?}"
    );
    assert!(
        turns >= TURNS,
        "the README's client: the task beside {CALLERS} callers ran {turns} times in {} calls (want ≥ {TURNS})",
        CALLERS * PER_CALLER
    );
}

#[tokio::test(flavor = "current_thread")]
async fn the_fleet_examples_dns_client_with_health_checks_against_replicas_that_refuse_connections_never_stalls()
 {
    use stormguard::client::HealthCheckConfig;
    use stormguard::client::replicas::Dns;
    use stormguard_demo::dns::DnsServer;
    // `examples/fleet/dns.rs`: a name a DNS server on loopback resolves to the replicas
    // (here three loopback addresses on a port where nothing listens), health checks on,
    // the `RetryLayer` of `stormguard_client_config` over replicas.
    let port = refusing_address().port();
    let ips = (2..5).map(|i| std::net::IpAddr::from([127, 0, 0, i]));
    let dns = DnsServer::start("inventory.fleet.test", ips, 30)
        .await
        .unwrap();
    let target = Dns::new("inventory.fleet.test")
        .unwrap()
        .port(port)
        .name_servers([dns.addr()])
        .endpoint(|e| {
            e.http2_max_local_error_reset_streams(None)
                .tcp_nodelay(true)
        });
    let checked = ReplicaConfig {
        health_check: Some(HealthCheckConfig::service("")),
        ..ReplicaConfig::default()
    };
    let replicas = Replicas::from_dns(checked, target).unwrap();
    let layer = RetryLayer::from_config(&stormguard_client_config(None).with_seed(3))
        .unwrap()
        .over_replicas();
    let client = InventoryClient::new(ServiceBuilder::new().layer(layer).service(replicas));
    let turns = turns_beside_callers(|| {
        let mut client = client.clone();
        async move {
            for _ in 0..PER_CALLER {
                let _ = client.reserve(request()).await;
            }
        }
    })
    .await;
    // The calls failed at once: every replica's health check could not connect.
    let last = client.clone().reserve(request()).await;
    assert!(
        last.as_ref()
            .is_err_and(|s| s.message().contains("no replica serving")),
        "{last:?}"
    );
    assert!(
        turns >= TURNS,
        "the fleet example's DNS client: the task beside {CALLERS} callers ran {turns} times in {} calls (want ≥ {TURNS})",
        CALLERS * PER_CALLER
    );
}
