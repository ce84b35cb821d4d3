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
//! Options:
//! - `--policy default` (retry UNAVAILABLE, 3 attempts, full jitter, default budget) or
//!   `--policy none` (no retries: one attempt per call);
//! - `--service-config FILE`: a config file instead of `--policy`: JSON, YAML or TOML by its
//!   extension, either a standard gRPC service config (`methodConfig[].retryPolicy` and
//!   `retryThrottling`) or stormguard's own shape (`retry:`, `breaker:`);
//! - `--seed N`: seed of the retry jitter (random by default);
//! - `--payload-bytes N`: size of each request's payload (default 0);
//! - `--otel-stdout`: also export the layer's OpenTelemetry metrics to stdout, before the
//!   report (needs `--features otel-examples`).

use std::collections::BTreeMap;
use std::error::Error;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use stormguard_client::RetryLayer;
use stormguard_core::config::ClientConfig;
use stormguard_demo::{InventoryClient, ReserveRequest};
use tokio::time::Instant;
use tonic::transport::Endpoint;
use tower::ServiceBuilder;

#[path = "support/otel.rs"]
mod otel;

const USAGE: &str = "usage: client [--target URL] [--requests N] [--concurrency N] \
[--deadline-ms N] [--policy default|none] [--service-config FILE] [--seed N] [--payload-bytes N] \
[--otel-stdout]";

/// Which retry configuration to use.
#[derive(Clone, Debug, PartialEq)]
pub enum PolicyArg {
    /// `ClientConfig::standard()`, with the demo's `Reserve` marked idempotent (each call
    /// carries a request id), so that its failures are retried.
    Default,
    /// `ClientConfig::no_retries()`.
    None,
    /// A gRPC service config JSON file.
    ServiceConfig(String),
}

/// The parsed command line.
#[derive(Clone, Debug, PartialEq)]
pub struct Args {
    /// Server URL.
    pub target: String,
    /// Logical calls to make.
    pub requests: u64,
    /// Calls in flight at once.
    pub concurrency: u64,
    /// Deadline of each call.
    pub deadline: Duration,
    /// Retry configuration.
    pub policy: PolicyArg,
    /// Jitter seed.
    pub seed: Option<u64>,
    /// Payload size of each request.
    pub payload_bytes: usize,
    /// Export the layer's metrics to stdout (`--otel-stdout`).
    pub otel_stdout: bool,
}

impl Default for Args {
    fn default() -> Self {
        Args {
            target: "http://127.0.0.1:50051".into(),
            requests: 1000,
            concurrency: 16,
            deadline: Duration::from_millis(1000),
            policy: PolicyArg::Default,
            seed: None,
            payload_bytes: 0,
            otel_stdout: false,
        }
    }
}

/// A command line that could not be parsed.
#[derive(Debug, PartialEq)]
pub struct ArgError(pub String);

impl fmt::Display for ArgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\n{USAGE}", self.0)
    }
}

impl Error for ArgError {}

fn number<T: std::str::FromStr>(flag: &str, value: &str) -> Result<T, ArgError> {
    value
        .parse()
        .map_err(|_| ArgError(format!("{flag}: `{value}` is not a valid number")))
}

/// Parses the arguments after the program name.
pub fn parse_args<I: IntoIterator<Item = String>>(args: I) -> Result<Args, ArgError> {
    let mut out = Args::default();
    let mut policy_given = false;
    let mut config_given = false;
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .ok_or_else(|| ArgError(format!("{flag} needs a value")))
        };
        match flag.as_str() {
            "--target" => out.target = value()?,
            "--requests" => out.requests = number(&flag, &value()?)?,
            "--concurrency" => out.concurrency = number(&flag, &value()?)?,
            "--deadline-ms" => out.deadline = Duration::from_millis(number(&flag, &value()?)?),
            "--seed" => out.seed = Some(number(&flag, &value()?)?),
            "--payload-bytes" => out.payload_bytes = number(&flag, &value()?)?,
            "--policy" => {
                policy_given = true;
                out.policy = match value()?.as_str() {
                    "default" => PolicyArg::Default,
                    "none" => PolicyArg::None,
                    other => return Err(ArgError(format!("--policy: unknown policy `{other}`"))),
                }
            }
            "--service-config" => {
                config_given = true;
                out.policy = PolicyArg::ServiceConfig(value()?);
            }
            "--otel-stdout" => out.otel_stdout = true,
            "-h" | "--help" => return Err(ArgError("help".into())),
            other => return Err(ArgError(format!("unknown argument `{other}`"))),
        }
    }
    if policy_given && config_given {
        return Err(ArgError(
            "--policy and --service-config exclude each other".into(),
        ));
    }
    if out.concurrency == 0 {
        return Err(ArgError("--concurrency must be at least 1".into()));
    }
    if out.deadline.is_zero() {
        return Err(ArgError("--deadline-ms must be at least 1".into()));
    }
    Ok(out)
}

/// Runs the load and returns the JSON report.
pub async fn run(args: &Args) -> Result<serde_json::Value, Box<dyn Error + Send + Sync>> {
    let config = match &args.policy {
        PolicyArg::Default => stormguard_demo::client_config(),
        PolicyArg::None => ClientConfig::no_retries(),
        PolicyArg::ServiceConfig(path) => {
            ClientConfig::from_path(path).map_err(|e| format!("--service-config {path}: {e}"))?
        }
    };
    let layer = match args.seed {
        Some(seed) => RetryLayer::from_config_seeded(&config, seed)?,
        None => RetryLayer::from_config(&config)?,
    };
    let export = if args.otel_stdout {
        Some(otel::Export::stdout(Duration::from_secs(3600))?)
    } else {
        None
    };
    #[cfg(feature = "otel-examples")]
    let layer = match &export {
        Some(export) => layer.with_meter(&export.meter()),
        None => layer,
    };
    let stats = layer.stats();
    let channel = Endpoint::from_shared(args.target.clone())?
        // Calls that time out in bulk must not get the connection closed (h2 GOAWAY).
        .http2_max_local_error_reset_streams(None)
        .connect_lazy();
    let client = InventoryClient::new(ServiceBuilder::new().layer(layer).service(channel));

    let next = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency.min(args.requests.max(1)) {
        let mut client = client.clone();
        let next = next.clone();
        let (total, deadline, payload) = (args.requests, args.deadline, args.payload_bytes);
        workers.push(tokio::spawn(async move {
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
        }));
    }
    let mut codes: BTreeMap<&'static str, u64> = BTreeMap::new();
    for worker in workers {
        for (code, n) in worker.await? {
            *codes.entry(code).or_default() += n;
        }
    }
    let elapsed = started.elapsed();
    if let Some(export) = export {
        export.finish();
    }
    let s = stats.snapshot();
    let refused: serde_json::Map<String, serde_json::Value> = s
        .refused
        .iter()
        .map(|(name, n)| (name.to_owned(), n.into()))
        .collect();
    Ok(serde_json::json!({
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
    }))
}

fn code_name(code: tonic::Code) -> &'static str {
    stormguard_client::code_from_tonic(code).name()
}

#[tokio::main]
async fn main() {
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(2);
        }
    };
    match run(&args).await {
        Ok(report) => println!("{report}"),
        Err(e) => {
            eprintln!("client: {e}");
            std::process::exit(1);
        }
    }
}
