//! The layer on tonic's `Router`: several services behind one layer share one queue;
//! a layer on one service (via `NamedService`) leaves the others alone.

use crate::server_support;

use std::convert::Infallible;
use std::future::{Ready, ready};
use std::net::SocketAddr;
use std::task::{Context, Poll};

use server_support::{channel, hold_worker, one_worker_no_queue, release, reserve, start_with};
use stormguard_demo::InventoryClient;
use stormguard_demo::server::DemoConfig;
use tonic::server::NamedService;
use tonic::transport::{Channel, Server};
use tower::{Layer, Service, ServiceExt};

/// A second gRPC service, `test.Echo`, that answers OK at once.
#[derive(Clone, Debug)]
struct Echo;

impl NamedService for Echo {
    const NAME: &'static str = "test.Echo";
}

impl Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Ready<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        ready(Ok(tonic::Status::new(tonic::Code::Ok, "").into_http()))
    }
}

/// Calls `/test.Echo/Ping` and returns its `grpc-status`.
async fn echo(channel: &Channel, addr: SocketAddr) -> String {
    let request = http::Request::builder()
        .method("POST")
        .uri(format!("http://{addr}/test.Echo/Ping"))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::empty())
        .expect("request");
    let response = channel.clone().oneshot(request).await.expect("response");
    response.headers()["grpc-status"]
        .to_str()
        .expect("ascii")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_behind_one_layer_share_one_queue() {
    let server = start_with(
        one_worker_no_queue(),
        DemoConfig::default(),
        true,
        |layer, inventory, incoming| {
            Server::builder()
                .layer(layer)
                .add_service(inventory)
                .add_service(Echo)
                .serve_with_incoming(incoming)
        },
    )
    .await;
    let (addr, control) = (server.addr, &server.control);

    let channel = channel(addr).await;
    assert_eq!(echo(&channel, addr).await, "0", "a free worker serves Echo");
    let hold = hold_worker(&InventoryClient::new(channel.clone()), control).await;
    // The one worker is busy with Inventory: Echo, behind the same queue, is shed.
    assert_eq!(echo(&channel, addr).await, "14");
    assert_eq!(server.stats.snapshot().shed_first, 1);
    release(control, hold).await;
    assert_eq!(echo(&channel, addr).await, "0");
    assert_eq!(server.stats.snapshot().completed, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_on_one_service_keeps_its_route_and_leaves_the_others_alone() {
    let server = start_with(
        one_worker_no_queue(),
        DemoConfig::default(),
        true,
        |layer, inventory, incoming| {
            Server::builder()
                .add_service(layer.layer(inventory))
                .add_service(Echo)
                .serve_with_incoming(incoming)
        },
    )
    .await;
    let (addr, control) = (server.addr, &server.control);

    let channel = channel(addr).await;
    let hold = hold_worker(&InventoryClient::new(channel.clone()), control).await;
    assert_eq!(
        echo(&channel, addr).await,
        "0",
        "Echo is not behind the queue"
    );
    let status = InventoryClient::new(channel.clone())
        .reserve(reserve("", None))
        .await
        .expect_err("Inventory is");
    assert_eq!(status.code(), tonic::Code::Unavailable);
    release(control, hold).await;
    assert_eq!(server.stats.snapshot().shed_first, 1);
}
