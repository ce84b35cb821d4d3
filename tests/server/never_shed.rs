//! Health checks are never shed: a shed health check gets a busy server restarted,
//! which makes the overload worse. Users can name more paths, or turn the default off.
//! Run over real tonic, with tonic-health's `grpc.health.v1.Health` served beside the
//! demo behind one layer whose only worker is held, so everything else is shed.

use crate::server_support;

use server_support::{
    TestServer, channel, hold_worker, one_worker_no_queue, release, reserve, start_with,
};
use stormguard_demo::server::DemoConfig;
use stormguard_demo::{InventoryClient, WatchStockRequest};
use stormguard_server::ShedLayer;
use stormguard_server::shed::MESSAGE_QUEUE_FULL;
use tonic::Code;
use tonic::transport::{Channel, Server};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// The demo and tonic-health's service behind `configure(layer)`.
async fn serve(configure: fn(ShedLayer) -> ShedLayer) -> TestServer {
    start_with(
        one_worker_no_queue(),
        DemoConfig::default(),
        true,
        move |layer, inventory, incoming| {
            let (_reporter, health) = tonic_health::server::health_reporter();
            Server::builder()
                .layer(configure(layer))
                .add_service(health)
                .add_service(inventory)
                .serve_with_incoming(incoming)
        },
    )
    .await
}

async fn check(channel: &Channel) -> Result<ServingStatus, tonic::Status> {
    let reply = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    Ok(reply.into_inner().status())
}

fn assert_shed(outcome: Result<impl std::fmt::Debug, tonic::Status>) {
    let status = outcome.expect_err("shed");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert_eq!(status.message(), MESSAGE_QUEUE_FULL);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_checks_are_served_while_everything_else_is_shed() {
    let server = serve(|layer| layer).await;
    let channel = channel(server.addr).await;
    let client = InventoryClient::new(channel.clone());
    let hold = hold_worker(&client, &server.control).await;

    for _ in 0..50 {
        assert_eq!(
            check(&channel).await.expect("served"),
            ServingStatus::Serving
        );
        assert_shed(client.clone().reserve(reserve("", None)).await);
    }
    assert_eq!(server.stats.never_shed(), 50);
    assert_eq!(server.stats.snapshot().shed_first, 50);
    // The health checks took no worker: the held call still has the only one.
    assert_eq!(server.stats.snapshot().admitted, 1);
    release(&server.control, hold).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_default_can_be_turned_off() {
    let server = serve(ShedLayer::shed_health_checks).await;
    let channel = channel(server.addr).await;
    let client = InventoryClient::new(channel.clone());
    let hold = hold_worker(&client, &server.control).await;
    assert_shed(check(&channel).await);
    assert_eq!(server.stats.never_shed(), 0);
    release(&server.control, hold).await;
    // With a worker free it is an ordinary call, and served.
    assert_eq!(
        check(&channel).await.expect("served"),
        ServingStatus::Serving
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_name_more_paths_by_list_or_predicate() {
    fn by_list(layer: ShedLayer) -> ShedLayer {
        layer
            .never_shed(["/stormguard.demo.v1.Inventory/WatchStock"])
            .expect("a valid method path")
    }
    fn by_predicate(layer: ShedLayer) -> ShedLayer {
        layer.never_shed_if(|path| path.ends_with("/WatchStock"))
    }
    for configure in [by_list as fn(ShedLayer) -> ShedLayer, by_predicate] {
        let server = serve(configure).await;
        let channel = channel(server.addr).await;
        let client = InventoryClient::new(channel.clone());
        let hold = hold_worker(&client, &server.control).await;
        let mut stream = client
            .clone()
            .watch_stock(WatchStockRequest {
                sku: "sku-1".into(),
                count: 3,
                interval_ms: 0,
            })
            .await
            .expect("never shed")
            .into_inner();
        let mut levels = 0;
        while stream.message().await.expect("stream").is_some() {
            levels += 1;
        }
        assert_eq!(levels, 3);
        // Naming a path keeps the health default, and sheds the rest as before.
        assert_eq!(
            check(&channel).await.expect("served"),
            ServingStatus::Serving
        );
        assert_shed(client.clone().reserve(reserve("", None)).await);
        assert_eq!(server.stats.never_shed(), 2);
        release(&server.control, hold).await;
    }
}
