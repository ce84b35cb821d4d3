//! Load client for the demo `Inventory` service, through stormguard's `RetryLayer`.
//!
//! ```text
//! cargo run --release --example client -- --target http://127.0.0.1:50051 \
//!     --requests 1000 --concurrency 16 --deadline-ms 1000
//! ```
//!
//! Calls `stormguard.demo.v1.Inventory/Reserve` `--requests` times from `--concurrency`
//! tasks over one channel, each call with a `--deadline-ms` deadline, and prints one JSON
//! line with what happened:
//!
//! ```text
//! {"logical":1000,"ok":0,"failed":1000,"attempts":1050,"retries":50,"amplification":1.05,
//!  "refused":{"budget":950,...},"codes":{"UNAVAILABLE":1000},...}
//! ```
//!
//! `--help` describes every flag.

use std::collections::BTreeMap;
use std::error::Error;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use stormguard_client::RetryLayer;
use stormguard_core::ClientConfig;
use stormguard_demo::{InventoryClient, ReserveRequest};
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tower::ServiceBuilder;

#[path = "support/cli.rs"]
mod cli;
#[path = "support/otel.rs"]
mod otel;

/// Load client for the demo Inventory service, through stormguard's RetryLayer.
///
/// Calls `stormguard.demo.v1.Inventory/Reserve` `--requests` times from `--concurrency`
/// tasks over one channel and prints one JSON line: logical calls, ok, failed, attempts,
/// retries, amplification, retries refused by cause, status codes.
#[derive(Clone, Debug, Parser)]
#[command(name = "client")]
pub struct Args {
    /// Server URL
    #[arg(long, value_name = "URL", default_value = "http://127.0.0.1:50051")]
    pub target: String,
    /// Logical calls to make
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub requests: u64,
    /// Calls in flight at once
    #[arg(long, value_name = "N", default_value_t = 16,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub concurrency: u64,
    /// Deadline of each call, in milliseconds
    #[arg(long = "deadline-ms", value_name = "MS", default_value = "1000",
          value_parser = cli::millis)]
    pub deadline: Duration,
    /// The retry policy
    #[arg(long, value_name = "P", value_enum, default_value_t = PolicyName::Default)]
    pub policy: PolicyName,
    /// A config file instead of `--policy`: JSON, YAML or TOML by its extension, a
    /// standard gRPC service config or stormguard's own shape
    #[arg(
        long = "service-config",
        value_name = "FILE",
        conflicts_with = "policy"
    )]
    pub service_config: Option<String>,
    /// Seed of the retry jitter [default: random]
    #[arg(long, value_name = "N")]
    pub seed: Option<u64>,
    /// Size of each request's payload, in bytes
    #[arg(long = "payload-bytes", value_name = "N", default_value_t = 0)]
    pub payload_bytes: usize,
    /// Also export the layer's OpenTelemetry metrics to stdout, before the report (needs
    /// `--features otel-examples`)
    #[arg(long = "otel-stdout")]
    pub otel_stdout: bool,
    /// Also serve the layer's metrics to Prometheus at http://ADDR/metrics while the load
    /// runs (needs `--features otel-examples`)
    #[arg(long = "metrics-addr", value_name = "ADDR")]
    pub metrics_addr: Option<std::net::SocketAddr>,
}

/// `--policy`.
#[derive(Clone, Copy, Debug, PartialEq, ValueEnum)]
pub enum PolicyName {
    /// Retry UNAVAILABLE, 3 attempts, full jitter, the default budget; `Reserve` idempotent
    Default,
    /// No retries: one attempt per call
    None,
}

/// Which retry configuration to use.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicyArg {
    /// `ClientConfig::default()`, with the demo's `Reserve` marked idempotent (each call
    /// carries a request id), so that its failures are retried.
    Default,
    /// `ClientConfig::no_retries()`.
    None,
    /// A config file (`--service-config`).
    ServiceConfig(String),
}

impl Args {
    /// The retry configuration the flags choose.
    pub fn policy(&self) -> PolicyArg {
        match (&self.service_config, self.policy) {
            (Some(path), _) => PolicyArg::ServiceConfig(path.clone()),
            (None, PolicyName::Default) => PolicyArg::Default,
            (None, PolicyName::None) => PolicyArg::None,
        }
    }
}

/// Parses the arguments after the program name.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Args, clap::Error> {
    Args::try_parse_from(std::iter::once("client".to_owned()).chain(args))
}

/// Runs the load and returns the JSON report.
pub async fn run(args: &Args) -> Result<serde_json::Value, Box<dyn Error + Send + Sync>> {
    let layer = retry_layer(args)?;
    let export = otel::Export::start(otel::Sinks {
        stdout: args.otel_stdout.then_some(Duration::from_secs(3600)),
        metrics_addr: args.metrics_addr,
    })
    .await?;
    #[cfg(feature = "otel-examples")]
    let layer = match &export {
        Some(export) => layer.with_meter(&export.meter()),
        None => layer,
    };
    let stats = layer.stats();
    let channel = Endpoint::from_shared(args.target.clone())?
        // A server of ours: calls that give up in bulk must not get the connection closed
        // (docs/operating.md, "HTTP/2 resets").
        .http2_max_local_error_reset_streams(None)
        .connect_lazy();
    let client = InventoryClient::new(ServiceBuilder::new().layer(layer).service(channel));
    let started = Instant::now();
    let codes = call_all(&client, args).await?;
    let elapsed = started.elapsed();
    if let Some(export) = export {
        export.finish();
    }
    Ok(report(&stats.snapshot(), &codes, elapsed))
}

/// The retry layer of `--policy` (or `--service-config`), seeded with `--seed`.
fn retry_layer(args: &Args) -> Result<RetryLayer, Box<dyn Error + Send + Sync>> {
    let config = match args.policy() {
        PolicyArg::Default => stormguard_demo::client_config(),
        PolicyArg::None => ClientConfig::no_retries(),
        PolicyArg::ServiceConfig(path) => {
            ClientConfig::from_path(&path).map_err(|e| format!("--service-config {path}: {e}"))?
        }
    };
    Ok(match args.seed {
        Some(seed) => RetryLayer::from_config(&config.clone().with_seed(seed))?,
        None => RetryLayer::from_config(&config)?,
    })
}

/// The client of the load: the demo Inventory through the retry layer.
type Client = InventoryClient<stormguard_client::Retry<tonic::transport::Channel>>;

/// Makes the `--requests` calls from `--concurrency` tasks; the calls per final code.
async fn call_all(
    client: &Client,
    args: &Args,
) -> Result<BTreeMap<&'static str, u64>, Box<dyn Error + Send + Sync>> {
    let next = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.min(args.requests.max(1)) {
        let (total, deadline, payload) = (args.requests, args.deadline, args.payload_bytes);
        workers.push(tokio::spawn(call_until(
            client.clone(),
            next.clone(),
            total,
            deadline,
            payload,
        )));
    }
    let mut codes: BTreeMap<&'static str, u64> = BTreeMap::new();
    for worker in workers {
        for (code, n) in worker.await? {
            *codes.entry(code).or_default() += n;
        }
    }
    Ok(codes)
}

/// One task of the load: takes the next call's number until `total` are taken; the
/// calls it made per final code.
async fn call_until(
    mut client: Client,
    next: Arc<AtomicU64>,
    total: u64,
    deadline: Duration,
    payload: usize,
) -> BTreeMap<&'static str, u64> {
    let mut codes: BTreeMap<&'static str, u64> = BTreeMap::new();
    loop {
        let i = next.fetch_add(1, Ordering::Relaxed);
        if i >= total {
            break codes;
        }
        let mut request = tonic::Request::new(ReserveRequest {
            sku: format!("sku-{}", i % 100),
            quantity: 1,
            request_id: format!("req-{i}"),
            payload: vec![0; payload],
        });
        request.set_timeout(deadline);
        let code = match client.reserve(request).await {
            Ok(_) => "OK",
            Err(status) => code_name(status.code()),
        };
        *codes.entry(code).or_default() += 1;
    }
}

/// The JSON line of the run: the layer's counters `s`, the final `codes`, the time taken.
fn report(
    s: &stormguard_client::RetrySnapshot,
    codes: &BTreeMap<&'static str, u64>,
    elapsed: Duration,
) -> serde_json::Value {
    let refused: serde_json::Map<String, serde_json::Value> = s
        .refused
        .iter()
        .map(|(name, n)| (name.to_owned(), n.into()))
        .collect();
    serde_json::json!({
        "logical": s.logical,
        "ok": s.ok,
        "failed": s.failed,
        "attempts": s.attempts,
        "retries": s.retries,
        "amplification": (s.amplification() * 1000.0).round() / 1000.0,
        "refused": refused,
        "deadline_exceeded": s.deadline_exceeded,
        "codes": codes,
        "elapsed_ms": elapsed.as_millis() as u64,
    })
}

fn code_name(code: tonic::Code) -> &'static str {
    stormguard_client::code_from_tonic(code).name()
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match run(&args).await {
        Ok(report) => println!("{report}"),
        Err(e) => {
            eprintln!("client: {e}");
            std::process::exit(1);
        }
    }
}
