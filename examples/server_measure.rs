//! Measures the admission queue's disciplines under a capacity drop that sends a naive
//! client metastable (the storm measured on tonic, as `examples/storm.rs` runs it), in one process over loopback.
//!
//! ```text
//! cargo run --release --example server_measure -- [--secs 30] [--load 540] [--only NAME]
//!     [--seed 7]
//! ```
//!
//! `--help` describes every flag.
//!
//! Server: the demo Inventory, 8 workers × 10 ms of sleep. Client: one tonic `Channel`,
//! open-loop Poisson arrivals at `--load` logical calls/s, up to 3 attempts with a fixed
//! 10 ms backoff, 50 ms per attempt (a `tokio::time::timeout` around the call, with the
//! same `grpc-timeout` sent), retries marked with `grpc-previous-rpc-attempts`, server
//! pushback ignored (a naive client). Trigger: service time × 2.5 from 5 s to 8 s.
//! Prints, per scenario, the share of logical calls that succeeded in each 3 s window
//! (by arrival time) and the server's counters.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use clap::builder::PossibleValuesParser;
use stormguard::server::WorkerLimit;
use stormguard::server::{AdmissionConfig, QueueOrder, RetryThreshold};
use stormguard::server::{ShedLayer, ShedSnapshot};
use stormguard_demo::server::{DemoConfig, DemoInventory};
use stormguard_demo::{InventoryClient, InventoryServer, ReserveRequest};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};

#[path = "support/cli.rs"]
mod cli;

const WORKERS: usize = 8;
const SERVICE: Duration = Duration::from_millis(10);
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(50);
const BACKOFF: Duration = Duration::from_millis(10);
const WINDOW: Duration = Duration::from_secs(3);
const TRIGGER_AT: Duration = Duration::from_secs(5);
const TRIGGER_FOR: Duration = Duration::from_secs(3);

fn scenarios() -> Vec<(&'static str, AdmissionConfig)> {
    let base = AdmissionConfig {
        workers: WorkerLimit::Fixed(WORKERS),
        ..AdmissionConfig::default()
    };
    vec![
        // A plain bounded worker pool: deep FIFO queue, no retry threshold, no expiry
        // short of the deadline itself. The naive baseline.
        (
            "pool-fifo",
            AdmissionConfig {
                queue_capacity: 10_000,
                retry_threshold: RetryThreshold {
                    depth: None,
                    queue_delay: None,
                },
                max_time_queued: Duration::from_secs(60),
                min_time_left: Duration::ZERO,
                queue_order: QueueOrder::Fifo,
                ..base.clone()
            },
        ),
        // Every variant names its queue order: the default is one of the things measured.
        (
            "stormguard-fifo",
            AdmissionConfig {
                queue_order: QueueOrder::Fifo,
                ..base.clone()
            },
        ),
        (
            "stormguard-lifo",
            AdmissionConfig {
                queue_order: QueueOrder::AdaptiveLifo { from_depth: 8 },
                ..base.clone()
            },
        ),
        (
            "stormguard-lifo-when-late",
            AdmissionConfig {
                queue_order: QueueOrder::LifoWhenLate,
                ..base.clone()
            },
        ),
        (
            "stormguard-fifo-minleft10",
            AdmissionConfig {
                queue_order: QueueOrder::Fifo,
                min_time_left: SERVICE,
                ..base.clone()
            },
        ),
        (
            "stormguard-lifo-minleft10",
            AdmissionConfig {
                queue_order: QueueOrder::AdaptiveLifo { from_depth: 8 },
                min_time_left: SERVICE,
                ..base
            },
        ),
    ]
}

struct Windows {
    offered: Vec<AtomicU64>,
    ok: Vec<AtomicU64>,
    attempts: Vec<AtomicU64>,
}

impl Windows {
    fn new(n: usize) -> Self {
        let v = || (0..n).map(|_| AtomicU64::new(0)).collect();
        Windows {
            offered: v(),
            ok: v(),
            attempts: v(),
        }
    }
}

/// The demo Inventory behind `admission`, serving on a loopback port; its address, the
/// layer's stats, the knob of its service time, and the task serving it.
struct Served {
    addr: std::net::SocketAddr,
    stats: stormguard::server::ShedStats,
    control: stormguard_demo::server::DemoControl,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

async fn serve(admission: AdmissionConfig, seed: u64) -> Served {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let layer = ShedLayer::from_config(&admission).expect("config");
    let stats = layer.stats();
    let inventory = DemoInventory::new(DemoConfig {
        service_time: SERVICE,
        fail_rate: 0.0,
        seed,
    });
    let control = inventory.control();
    let server = tokio::spawn(
        Server::builder()
            .layer(layer)
            .add_service(InventoryServer::new(inventory))
            .serve_with_incoming(TcpIncoming::from(listener).with_nodelay(Some(true))),
    );
    Served {
        addr,
        stats,
        control,
        server,
    }
}

async fn connect(addr: std::net::SocketAddr) -> InventoryClient<tonic::transport::Channel> {
    let channel = Endpoint::from_shared(format!("http://{addr}"))
        .expect("uri")
        .http2_max_local_error_reset_streams(None)
        .tcp_nodelay(true)
        .connect()
        .await
        .expect("connect");
    InventoryClient::new(channel)
}

async fn run(name: &str, admission: AdmissionConfig, secs: u64, load: f64, seed: u64) {
    let served = serve(admission, seed).await;
    let client = connect(served.addr).await;
    let n_windows = usize::try_from(secs.div_ceil(WINDOW.as_secs())).expect("windows");
    let windows = Arc::new(Windows::new(n_windows));
    let transport_errors = Arc::new(AtomicU64::new(0));
    offer(
        &client,
        &served.control,
        &windows,
        &transport_errors,
        Duration::from_secs(secs),
        load,
        seed,
    )
    .await;
    report(
        name,
        &windows,
        served.stats.snapshot(),
        transport_errors.load(Ordering::Relaxed),
    );
    served.server.abort();
}

/// Poisson arrivals at `load` per second for `length`, each call counted in its window;
/// the service time x2.5 from `TRIGGER_AT` for `TRIGGER_FOR`. Returns when every call
/// has ended.
async fn offer(
    client: &InventoryClient<tonic::transport::Channel>,
    control: &stormguard_demo::server::DemoControl,
    windows: &Arc<Windows>,
    transport_errors: &Arc<AtomicU64>,
    length: Duration,
    load: f64,
    seed: u64,
) {
    let start = Instant::now();
    let end = start + length;
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut next = start;
    let mut triggered = false;
    let mut restored = false;
    let mut tasks = tokio::task::JoinSet::new();
    while next < end {
        tokio::time::sleep_until(next).await;
        let now = Instant::now();
        if !triggered && now >= start + TRIGGER_AT {
            control.set_service_time(SERVICE.mul_f64(2.5));
            triggered = true;
        }
        if !restored && now >= start + TRIGGER_AT + TRIGGER_FOR {
            control.set_service_time(SERVICE);
            restored = true;
        }
        let window = ((next - start).as_secs() / WINDOW.as_secs()) as usize;
        windows.offered[window].fetch_add(1, Ordering::Relaxed);
        tasks.spawn(call(
            client.clone(),
            Arc::clone(windows),
            window,
            Arc::clone(transport_errors),
        ));
        // Exponential inter-arrival times: a Poisson process at `load` per second.
        let gap = -(1.0 - rng.f64()).ln() / load;
        next += Duration::from_secs_f64(gap);
        // Reap finished tasks so the set stays small.
        while tasks.try_join_next().is_some() {}
    }
    while tasks.join_next().await.is_some() {}
}

/// One logical call of the naive client: up to 3 attempts, `BACKOFF` apart, each cut at
/// `ATTEMPT_TIMEOUT`, counted in `window`.
async fn call(
    mut client: InventoryClient<tonic::transport::Channel>,
    windows: Arc<Windows>,
    window: usize,
    transport_errors: Arc<AtomicU64>,
) {
    for attempt in 0..3u32 {
        windows.attempts[window].fetch_add(1, Ordering::Relaxed);
        let mut request = tonic::Request::new(ReserveRequest::default());
        request.set_timeout(ATTEMPT_TIMEOUT);
        if attempt > 0 {
            request.metadata_mut().insert(
                "grpc-previous-rpc-attempts",
                attempt.to_string().parse().expect("ascii"),
            );
        }
        match tokio::time::timeout(ATTEMPT_TIMEOUT, client.reserve(request)).await {
            Ok(Ok(_)) => {
                windows.ok[window].fetch_add(1, Ordering::Relaxed);
                return;
            }
            Ok(Err(status)) if status.message().contains("h2 protocol error") => {
                transport_errors.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        tokio::time::sleep(BACKOFF).await;
    }
}

/// Prints the scenario `name`: success and attempts per offered call in each window, and
/// the server's counters `s`.
fn report(name: &str, windows: &Windows, s: ShedSnapshot, transport_errors: u64) {
    // Per window, `counts` per offered call.
    let per_offered = |counts: &[AtomicU64]| -> Vec<String> {
        (0..windows.offered.len())
            .map(|w| {
                let offered = windows.offered[w].load(Ordering::Relaxed).max(1);
                format!(
                    "{:.2}",
                    counts[w].load(Ordering::Relaxed) as f64 / offered as f64
                )
            })
            .collect()
    };
    let share = per_offered(&windows.ok);
    let amplification = per_offered(&windows.attempts);
    println!(
        "{name:<28} success/3s: {}\n{:<28} attempts/call: {}\n{:<28} server: admitted {} completed {} \
         shed_first {} shed_retry {} expired {} cancelled_queued {} mean queued {:?}; h2 errors {}",
        share.join(" "),
        "",
        amplification.join(" "),
        "",
        s.admitted,
        s.completed,
        s.shed_first,
        s.shed_retry,
        s.expired,
        s.cancelled_queued,
        s.mean_time_queued().unwrap_or_default(),
        transport_errors,
    );
}

/// Measures the admission queue's disciplines under the capacity drop of the storm: the
/// demo Inventory (8 workers x 10 ms) behind five admission configurations, a naive client
/// (3 attempts, 10 ms backoff, 50 ms per attempt, pushback ignored), service time x2.5
/// from 5 s to 8 s. Prints the share of calls served per 3 s window.
#[derive(Debug, Parser)]
#[command(name = "server_measure")]
struct Args {
    /// Seconds each scenario runs
    #[arg(long, value_name = "N", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..))]
    secs: u64,
    /// Logical calls per second, Poisson arrivals
    #[arg(long, value_name = "PER_SECOND", default_value_t = 540.0, value_parser = cli::positive)]
    load: f64,
    /// Run only this scenario [default: all]
    #[arg(long, value_name = "NAME", value_parser = scenario_names())]
    only: Option<String>,
    /// Seed of arrivals and of the server's jitter
    #[arg(long, value_name = "N", default_value_t = 7)]
    seed: u64,
}

/// `--only`: the names [`scenarios`] runs.
fn scenario_names() -> PossibleValuesParser {
    PossibleValuesParser::new(scenarios().into_iter().map(|(name, _)| name))
}

#[tokio::main]
async fn main() {
    let Args {
        secs,
        load,
        only,
        seed,
    } = Args::parse();
    println!(
        "{WORKERS} workers x {SERVICE:?}, load {load}/s Poisson, 3 attempts, {BACKOFF:?} backoff, \
         {ATTEMPT_TIMEOUT:?} per attempt, trigger x2.5 at {TRIGGER_AT:?} for {TRIGGER_FOR:?}, {secs} s"
    );
    for (name, admission) in scenarios() {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        run(name, admission, secs, load, seed).await;
    }
}
