//! A stormguard service in the middle of a call chain: the demo `Inventory` served behind a
//! `ShedLayer`, whose handler forwards every `Reserve` to another `Inventory` server through
//! a `RetryLayer` and passes the answer, or the status, back up.
//!
//! ```text
//! cargo run --example relay -- --addr 127.0.0.1:0 --target http://127.0.0.1:50052
//! ```
//!
//! `--help` describes every flag.
//!
//! The handler holds no retry logic of its own: the layers give the downstream call what is
//! left of the inbound deadline, retry it under the standard client policy
//! (`stormguard_demo::client_config()`, or `--service-config FILE`: JSON, YAML or TOML, either
//! shape), and when they give up, mark the status with `grpc-retry-pushback-ms: -1` so
//! that no caller above retries the same failure, whatever gRPC implementation it runs.
//!
//! Prints `listening on ADDR` once bound, then one JSON line per second with the inbound
//! queue's and the downstream client's cumulative counters:
//! `{"admitted":N,"completed":N,"shed":N,"logical":N,"attempts":N,"retries":N}`.

use std::net::SocketAddr;
use std::pin::Pin;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;
use stormguard::client::ClientConfig;
use stormguard::client::{Retry, RetryLayer, RetryStats};
use stormguard::server::AdmissionConfig;
use stormguard::server::{ShedLayer, ShedStats};
use stormguard_demo::{
    Inventory, InventoryClient, InventoryServer, ReserveReply, ReserveRequest, StockLevel,
    WatchStockRequest,
};
use tokio::net::TcpListener;
use tonic::codegen::tokio_stream::Stream;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};
use tower::ServiceBuilder;

#[path = "support/cli.rs"]
mod cli;

/// A stormguard service in the middle of a call chain: the demo Inventory behind a
/// ShedLayer, forwarding every call to another Inventory server through a RetryLayer.
///
/// Prints `listening on ADDR` once bound, then one JSON line of counters per second.
#[derive(Debug, Parser)]
#[command(name = "relay")]
struct Args {
    /// Address to listen on (port 0: any free port)
    #[arg(long, value_name = "ADDR")]
    addr: SocketAddr,
    /// URL of the Inventory server every call is forwarded to
    #[arg(long, value_name = "URL")]
    target: String,
    /// The downstream client's retry configuration from FILE (JSON, YAML or TOML, a
    /// standard gRPC service config or stormguard's own shape) [default: the standard
    /// policy, `Reserve` idempotent]
    #[arg(long = "service-config", value_name = "FILE")]
    service_config: Option<String>,
}

/// Forwards `Reserve` downstream; the layers around it do the rest.
#[derive(Clone)]
struct Relay {
    downstream: InventoryClient<Retry<Channel>>,
}

#[tonic::async_trait]
impl Inventory for Relay {
    async fn reserve(
        &self,
        request: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        let mut downstream = self.downstream.clone();
        downstream.reserve(request.into_inner()).await
    }

    type WatchStockStream = Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send>>;

    async fn watch_stock(
        &self,
        request: Request<WatchStockRequest>,
    ) -> Result<Response<Self::WatchStockStream>, Status> {
        let mut downstream = self.downstream.clone();
        let stream = downstream.watch_stock(request.into_inner()).await?;
        Ok(Response::new(Box::pin(stream.into_inner())))
    }
}

/// One stats line.
#[derive(Serialize)]
struct Line {
    admitted: u64,
    completed: u64,
    shed: u64,
    logical: u64,
    attempts: u64,
    retries: u64,
}

fn line(shed: &ShedStats, client: &RetryStats) -> Line {
    let s = shed.snapshot();
    let c = client.snapshot();
    Line {
        admitted: s.admitted,
        completed: s.completed,
        shed: s.shed_first + s.shed_retry,
        logical: c.logical,
        attempts: c.attempts,
        retries: c.retries,
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    cli::exit_code("relay", run(args).await)
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let config = match &args.service_config {
        None => stormguard_demo::client_config(),
        Some(path) => ClientConfig::from_path(path)?,
    };
    let retry = RetryLayer::from_config(&config)?;
    let client_stats = retry.stats();
    let channel = Endpoint::from_shared(args.target)?
        .http2_max_local_error_reset_streams(None)
        .connect_lazy();
    let relay = Relay {
        downstream: InventoryClient::new(ServiceBuilder::new().layer(retry).service(channel)),
    };
    let shed = ShedLayer::from_config(&AdmissionConfig::default())?;
    let shed_stats = shed.stats();

    let listener = TcpListener::bind(args.addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let reporter = tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        tick.tick().await;
        loop {
            tick.tick().await;
            match serde_json::to_string(&line(&shed_stats, &client_stats)) {
                Ok(json) => println!("{json}"),
                Err(error) => eprintln!("relay: stats line: {error}"),
            }
        }
    });
    let served = Server::builder()
        .layer(shed)
        .add_service(InventoryServer::new(relay))
        .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true)))
        .await;
    reporter.abort();
    served?;
    Ok(())
}
