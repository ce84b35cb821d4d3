//! End-to-end across two hops over real tonic on loopback:
//! caller → (RetryLayer) → front server (ShedLayer, handler calls on) → (RetryLayer) → back.
//!
//! The front's handler does nothing special: it forwards with a generated client through a
//! `RetryLayer` and passes the answer (or the status) up. stormguard must still make
//! - the back see the caller's deadline, shortened by the time already spent, because the
//!   `ShedLayer` sets the call context that the `RetryLayer` reads; and
//! - one layer own the retry: when the front's layer gives up, its status carries
//!   `grpc-retry-pushback-ms: -1`, so the caller's layer does not retry the same failure.
#![allow(clippy::unwrap_used)]

use crate::hops_support;

use std::net::SocketAddr;
use std::time::Duration;

use hops_support::{Client, client, retry_layer};
use stormguard_client::RetryLayer;
use stormguard_core::AdmissionConfig;
use stormguard_demo::server::{DemoConfig, DemoInventory};
use stormguard_demo::{
    Inventory, InventoryServer, ReserveReply, ReserveRequest, StockLevel, WatchStockRequest,
};
use stormguard_server::ShedLayer;
use tokio::net::TcpListener;
use tonic::codegen::tokio_stream::Stream;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Code, Request, Response, Status};

/// The front service: forwards `Reserve` to the back through its own client.
#[derive(Clone)]
struct Front {
    back: Client,
}

#[tonic::async_trait]
impl Inventory for Front {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let mut back = self.back.clone();
        back.reserve(request.into_inner()).await
    }

    type WatchStockStream =
        std::pin::Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send + 'static>>;

    async fn watch_stock(
        &self,
        _request: Request<WatchStockRequest>,
    ) -> Result<Response<Self::WatchStockStream>, Status> {
        Err(Status::unimplemented("not used here"))
    }
}

async fn serve_back(fail_rate: f64) -> (SocketAddr, stormguard_demo::server::DemoControl) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let demo = DemoInventory::new(DemoConfig {
        service_time: Duration::from_millis(1),
        fail_rate,
        seed: 3,
    });
    let control = demo.control();
    tokio::spawn(
        Server::builder()
            .serve_with_incoming(InventoryServer::new(demo), TcpIncoming::from(listener)),
    );
    (addr, control)
}

/// The front behind a `ShedLayer`, forwarding to `back` through `front_layer`.
async fn serve_front(back: SocketAddr, front_layer: RetryLayer) -> SocketAddr {
    let front = Front {
        back: client(back, front_layer).await,
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(
        Server::builder()
            .layer(ShedLayer::from_config(&AdmissionConfig::default()).unwrap())
            .serve_with_incoming(InventoryServer::new(front), TcpIncoming::from(listener)),
    );
    addr
}

#[tokio::test]
async fn the_back_inherits_what_is_left_of_the_callers_deadline() {
    let (back, _) = serve_back(0.0).await;
    let front = serve_front(back, retry_layer(3)).await;
    let mut caller = client(front, retry_layer(3)).await;

    let mut request = Request::new(ReserveRequest::default());
    request.set_timeout(Duration::from_millis(800));
    let reply = caller.reserve(request).await.unwrap().into_inner();
    // The front's handler set no timeout: the back saw the caller's, less the time spent.
    assert!(
        reply.timeout_ms > 0 && reply.timeout_ms < 800,
        "back saw grpc-timeout of {} ms",
        reply.timeout_ms
    );

    // Without a caller deadline there is nothing to inherit.
    let reply = caller
        .reserve(ReserveRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.timeout_ms, 0);
}

#[tokio::test]
async fn only_the_hop_next_to_the_failure_retries() {
    let (back, back_control) = serve_back(1.0).await;
    let front_layer = retry_layer(3);
    let front_stats = front_layer.stats();
    let front = serve_front(back, front_layer).await;
    let caller_layer = retry_layer(3);
    let caller_stats = caller_layer.stats();
    let mut caller = client(front, caller_layer).await;

    let status = caller.reserve(ReserveRequest::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);

    // The front's layer tried the back 3 times and gave up with "do not retry" ...
    let front = front_stats.snapshot();
    assert_eq!((front.logical, front.attempts), (1, 3));
    assert_eq!(front.refused.attempts, 1);
    assert_eq!(back_control.counts().entered, 3);
    // ... so the caller's layer made one attempt: 3 calls reach the back, not 3 × 3.
    let caller = caller_stats.snapshot();
    assert_eq!((caller.logical, caller.attempts), (1, 1));
    assert_eq!(caller.refused.pushback, 1);
    assert_eq!(
        status
            .metadata()
            .get("grpc-retry-pushback-ms")
            .map(|v| v.to_str().unwrap()),
        Some("-1")
    );
}
