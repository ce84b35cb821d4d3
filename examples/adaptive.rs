//! A fixed worker count against an adaptive concurrency limit, on a server whose real
//! capacity the admission queue cannot see.
//!
//! ```text
//! cargo run --release --example adaptive -- [--json FILE] [--secs 8] [--warmup 4]
//!     [--capacity 16] [--service-ms 20] [--load 2.0] [--only NAME] [--storm]
//! ```
//!
//! `--help` describes every flag.
//!
//! The server is real tonic over loopback with a `ShedLayer`. Its `Reserve` handler
//! uses an inner resource of fixed capacity C: a pool of C permits (a FIFO semaphore,
//! like a database connection pool) held for `--service-ms` of wall time each. Calls
//! beyond C that the layer lets through wait *inside the handler*, where the layer
//! cannot order, expire or shed them.
//!
//! Clients: one tonic channel through a `RetryLayer` (standard policy: retry budget,
//! full-jitter backoff, pushback honoured), 150 ms logical deadline, 50 ms per attempt;
//! open-loop arrivals at `--load` × the measured capacity.
//!
//! Policies (the layer's worker limit):
//! - `fixed-right`: `workers = C`, the number an operator who knew C would set;
//! - `fixed-high`: `workers = 4C`;
//! - `fixed-low`: `workers = C/4`;
//! - `adaptive`: `AdmissionConfig::default()`, whose limit is learned from latency,
//!   told nothing about C.
//!
//! For each: goodput (successful logical calls per second during the measured window)
//! as a share of capacity, p99 latency of the successful calls, the limit over time and
//! where it ended. Capacity is measured first, as completions per second of C
//! concurrent loops over the same pool (a 20 ms sleep takes a little longer than 20 ms).
//! `--json FILE` writes
//! `{"policies":[{"name":..,"goodput_share_of_capacity":..,"p99_ms":..,"final_limit":..},..],"capacity":C}`.
//!
//! `--storm` then runs the storm scenario on the same server (C permits × 10 ms, so a
//! slowed call still fits in one attempt) with `fixed-right`, `fixed-high` and
//! `adaptive`: 75 % of capacity offered, the pool's service time ×2.5 for 3 s (capacity
//! drops below the offered load), and reports when the share of calls served is back
//! above 90 % for good.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Parser;
use clap::builder::{PossibleValuesParser, RangedU64ValueParser};
use stormguard::client::ClientConfig;
use stormguard::client::{RetryLayer, RetryStats};
use stormguard::server::{AdmissionConfig, WorkerLimit};
use stormguard::server::{ShedLayer, ShedStats};
use stormguard_demo::pool::PoolInventory;
use stormguard_demo::{InventoryClient, InventoryServer, ReserveRequest};
use tokio::net::TcpListener;
use tokio::time::{Instant, MissedTickBehavior};
use tonic::Request;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Endpoint, Server};
use tower::ServiceBuilder;

#[path = "support/cli.rs"]
mod cli;

const DEADLINE: Duration = Duration::from_millis(150);
const PER_ATTEMPT: Duration = Duration::from_millis(50);
const STORM_SERVICE: Duration = Duration::from_millis(10);
/// The worker limits compared, in the order they run.
const POLICIES: [&str; 4] = ["fixed-right", "fixed-high", "fixed-low", "adaptive"];

/// A fixed worker count against an adaptive concurrency limit, on a server whose real
/// capacity (a pool of C permits inside the handler) the admission queue cannot see.
///
/// Offers `--load` x the measured capacity through RetryLayer clients (150 ms deadline,
/// 50 ms per attempt) to `fixed-right` (workers = C), `fixed-high` (4C), `fixed-low`
/// (C/4) and `adaptive` (the default, learned from latency); prints goodput, p99 and the limit.
#[derive(Clone, Debug, Parser)]
#[command(name = "adaptive")]
struct Args {
    /// Also write the results as JSON to FILE
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
    /// Seconds measured per policy, after the warm-up
    #[arg(long, value_name = "N", default_value_t = 8,
          value_parser = clap::value_parser!(u64).range(1..))]
    secs: u64,
    /// Seconds of load before the measured window
    #[arg(long, value_name = "N", default_value_t = 4)]
    warmup: u64,
    /// C: the permits of the handler's pool, at least 4
    #[arg(long, value_name = "C", default_value_t = 16,
          value_parser = RangedU64ValueParser::<usize>::new().range(4..))]
    capacity: usize,
    /// How long each call holds a permit, in milliseconds
    #[arg(long = "service-ms", value_name = "MS", default_value = "20",
          value_parser = cli::millis)]
    service: Duration,
    /// Offered load as a multiple of the measured capacity
    #[arg(long, value_name = "X", default_value_t = 2.0, value_parser = cli::positive)]
    load: f64,
    /// Run only this policy [default: all]
    #[arg(long, value_name = "NAME", value_parser = PossibleValuesParser::new(POLICIES))]
    only: Option<String>,
    /// Then run the storm scenario on the same server (C permits x 10 ms, 75 % load,
    /// service time x2.5 for 3 s) with `fixed-right`, `fixed-high` and `adaptive`
    #[arg(long)]
    storm: bool,
}

/// Completions per second of `capacity` loops over the pool, for 2 s.
async fn measure_capacity(capacity: usize, service: Duration) -> f64 {
    let pool = PoolInventory::new(capacity, service);
    let done = Arc::new(AtomicU64::new(0));
    let end = Instant::now() + Duration::from_secs(2);
    let start = Instant::now();
    let mut loops = Vec::new();
    for _ in 0..capacity {
        let (pool, done) = (pool.clone(), done.clone());
        loops.push(tokio::spawn(async move {
            while Instant::now() < end {
                if pool.use_once().await.is_ok() {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    for l in loops {
        let _ = l.await;
    }
    done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64()
}

struct Outcome {
    name: String,
    goodput_share: f64,
    p99_ms: f64,
    final_limit: usize,
    mean_limit: f64,
    limits: Vec<usize>,
    min_latency_ms: Option<f64>,
    attempts_per_call: f64,
    shed: u64,
}

fn admission(name: &str, c: usize) -> AdmissionConfig {
    let fixed = |n: usize| AdmissionConfig {
        workers: WorkerLimit::Fixed(n.max(1)),
        ..AdmissionConfig::default()
    };
    match name {
        "fixed-right" => fixed(c),
        "fixed-high" => fixed(4 * c),
        "fixed-low" => fixed(c / 4),
        // The default: adaptive.
        _ => AdmissionConfig::default(),
    }
}

async fn serve(
    pool: PoolInventory,
    layer: ShedLayer,
) -> Result<SocketAddr, Box<dyn std::error::Error>> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    tokio::spawn(
        Server::builder()
            .http2_max_pending_accept_reset_streams(Some(10_000))
            .layer(layer)
            .add_service(InventoryServer::new(pool))
            .serve_with_incoming(incoming),
    );
    Ok(addr)
}

type Client = InventoryClient<stormguard::client::Retry<tonic::transport::Channel>>;

/// A tonic channel to `addr` through a `RetryLayer` (standard policy, 50 ms per attempt).
async fn connect(addr: SocketAddr) -> Result<(Client, RetryStats), Box<dyn std::error::Error>> {
    let retry = RetryLayer::from_config(&ClientConfig::default().with_seed(7))?
        .with_per_attempt_timeout(PER_ATTEMPT);
    let stats = retry.stats();
    let channel = Endpoint::from_shared(format!("http://{addr}"))?
        .http2_max_local_error_reset_streams(None)
        .tcp_nodelay(true)
        .connect()
        .await?;
    Ok((
        InventoryClient::new(ServiceBuilder::new().layer(retry).service(channel)),
        stats,
    ))
}

fn request(i: u64) -> Request<ReserveRequest> {
    let mut request = Request::new(ReserveRequest {
        sku: "sku".into(),
        quantity: 1,
        request_id: format!("req-{i}"),
        payload: Vec::new(),
    });
    request.set_timeout(DEADLINE);
    request
}

/// The storm scenario on this server, with a 10 ms service time (as in the storm
/// scenario, so that a slowed call still fits in one 50 ms attempt): offered 75 % of
/// `capacity` (measured for that service time); from 5 s to 8 s the pool's service time
/// is ×2.5 (capacity drops to 40 %, the offered load is 1.9× it); then back. Returns the share of logical calls that succeeded per 500 ms (by send
/// time) over 16 s, the limit every 500 ms, and the recovery: the time from the end of
/// the trigger to the first window that starts 2 s of windows serving at least 90 %.
async fn storm(
    name: &str,
    args: &Args,
    capacity: f64,
) -> Result<(Vec<f64>, Vec<usize>, Option<Duration>), Box<dyn std::error::Error>> {
    const WINDOW: Duration = Duration::from_millis(500);
    const WINDOWS: usize = 32;
    let (trigger_from, trigger_until) = (10, 16);
    let layer = ShedLayer::from_config(&admission(name, args.capacity))?;
    let stats = layer.stats();
    let pool = PoolInventory::new(args.capacity, STORM_SERVICE);
    let addr = serve(pool.clone(), layer).await?;
    let (client, _) = connect(addr).await?;
    let sent: Arc<Vec<AtomicU64>> = Arc::new((0..WINDOWS).map(|_| AtomicU64::new(0)).collect());
    let ok: Arc<Vec<AtomicU64>> = Arc::new((0..WINDOWS).map(|_| AtomicU64::new(0)).collect());
    let mut limits = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / (capacity * 0.75)));
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let start = Instant::now();
    let end = start + WINDOW * u32::try_from(WINDOWS).unwrap_or(u32::MAX);
    let mut calls = Vec::new();
    let mut window = 0;
    let mut i = 0u64;
    while Instant::now() < end {
        tick.tick().await;
        let w = usize::try_from(start.elapsed().as_millis() / WINDOW.as_millis()).unwrap_or(0);
        if w != window {
            window = w;
            limits.push(stats.workers());
            if w == trigger_from {
                pool.set_service_time(STORM_SERVICE.mul_f64(2.5));
            } else if w == trigger_until {
                pool.set_service_time(STORM_SERVICE);
            }
        }
        let Some(slot) = sent.get(w) else { break };
        slot.fetch_add(1, Ordering::Relaxed);
        i += 1;
        let (mut client, ok) = (client.clone(), ok.clone());
        calls.push(tokio::spawn(async move {
            if client.reserve(request(i)).await.is_ok() {
                ok[w].fetch_add(1, Ordering::Relaxed);
            }
        }));
        if calls.len() > 4096 {
            calls.retain(|c| !c.is_finished());
        }
    }
    for c in calls {
        let _ = c.await;
    }
    let share: Vec<f64> = (0..WINDOWS)
        .map(|w| {
            let n = sent[w].load(Ordering::Relaxed).max(1) as f64;
            ok[w].load(Ordering::Relaxed) as f64 / n
        })
        .collect();
    // Recovered: the first window that starts 2 s (4 windows) of >= 90 % served.
    let recovered =
        (trigger_until..WINDOWS - 3).find(|&w| share[w..w + 4].iter().all(|s| *s >= 0.9));
    let recovery = recovered.map(|w| WINDOW * u32::try_from(w - trigger_until).unwrap_or(0));
    Ok((share, limits, recovery))
}

async fn run(
    name: &str,
    args: &Args,
    capacity: f64,
) -> Result<Outcome, Box<dyn std::error::Error>> {
    let layer = ShedLayer::from_config(&admission(name, args.capacity))?;
    let stats: ShedStats = layer.stats();
    let addr = serve(PoolInventory::new(args.capacity, args.service), layer).await?;

    let (client, client_stats) = connect(addr).await?;

    let start = Instant::now();
    let measure_from = start + Duration::from_secs(args.warmup);
    let end = measure_from + Duration::from_secs(args.secs);
    let sampler = sample_limits(stats.clone(), end);
    let measured = offer(
        &client,
        &client_stats,
        capacity * args.load,
        measure_from,
        end,
    )
    .await;
    let limits = sampler.await?;
    Ok(outcome(
        name,
        args,
        capacity,
        &measured,
        &client_stats,
        &stats,
        limits,
    ))
}

/// The worker limit of `stats` every 250 ms until `end`.
fn sample_limits(stats: ShedStats, end: Instant) -> tokio::task::JoinHandle<Vec<usize>> {
    tokio::spawn(async move {
        let mut limits = Vec::new();
        let mut tick = tokio::time::interval(Duration::from_millis(250));
        while Instant::now() < end {
            tick.tick().await;
            limits.push(stats.workers());
        }
        limits
    })
}

/// What the calls sent from `measure_from` to `end` left: how many were served and in how
/// long (µs), and the client's attempts and logical calls when the window opened.
struct Measured {
    ok: u64,
    latencies: Vec<u32>,
    attempts_at_measure: u64,
    logical_at_measure: u64,
}

/// Sends calls at `rate` per second until `end`; returns when every call has ended.
async fn offer(
    client: &Client,
    client_stats: &RetryStats,
    rate: f64,
    measure_from: Instant,
    end: Instant,
) -> Measured {
    let latencies: Arc<Mutex<Vec<u32>>> = Arc::new(Mutex::new(Vec::new()));
    let ok = Arc::new(AtomicU64::new(0));
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    tick.set_missed_tick_behavior(MissedTickBehavior::Burst);
    let mut calls = Vec::new();
    let mut i = 0u64;
    let mut attempts_at_measure = u64::MAX;
    let mut logical_at_measure = u64::MAX;
    while Instant::now() < end {
        tick.tick().await;
        if Instant::now() >= measure_from && attempts_at_measure == u64::MAX {
            let s = client_stats.snapshot();
            attempts_at_measure = s.attempts;
            logical_at_measure = s.logical;
        }
        i += 1;
        let mut client = client.clone();
        let (latencies, ok) = (latencies.clone(), ok.clone());
        calls.push(tokio::spawn(async move {
            let sent = Instant::now();
            let result = client.reserve(request(i)).await;
            if result.is_ok() && sent >= measure_from && sent < end {
                ok.fetch_add(1, Ordering::Relaxed);
                let us = u32::try_from(sent.elapsed().as_micros()).unwrap_or(u32::MAX);
                latencies
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .push(us);
            }
        }));
        if calls.len() > 4096 {
            calls.retain(|c| !c.is_finished());
        }
    }
    for c in calls {
        let _ = c.await;
    }
    let latencies = latencies
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    Measured {
        ok: ok.load(Ordering::Relaxed),
        latencies,
        attempts_at_measure,
        logical_at_measure,
    }
}

/// The outcome of policy `name` from what was `measured`, the client's and the server's
/// counters, and the worker limit every 250 ms.
fn outcome(
    name: &str,
    args: &Args,
    capacity: f64,
    measured: &Measured,
    client_stats: &RetryStats,
    stats: &ShedStats,
    limits: Vec<usize>,
) -> Outcome {
    let s = client_stats.snapshot();
    let attempts = s.attempts - measured.attempts_at_measure.min(s.attempts);
    let logical = s.logical - measured.logical_at_measure.min(s.logical);
    let mut lat = measured.latencies.clone();
    lat.sort_unstable();
    let p99 = lat
        .get((lat.len() * 99 / 100).min(lat.len().saturating_sub(1)))
        .map_or(0.0, |us| f64::from(*us) / 1000.0);
    let in_window: Vec<usize> = limits
        .iter()
        .skip(usize::try_from(args.warmup * 4).unwrap_or(0))
        .copied()
        .collect();
    let snapshot = stats.snapshot();
    Outcome {
        name: name.to_owned(),
        goodput_share: measured.ok as f64 / args.secs as f64 / capacity,
        p99_ms: p99,
        final_limit: stats.workers(),
        mean_limit: in_window.iter().sum::<usize>() as f64 / in_window.len().max(1) as f64,
        limits,
        min_latency_ms: snapshot.min_latency_us.map(|us| us as f64 / 1000.0),
        attempts_per_call: attempts as f64 / logical.max(1) as f64,
        shed: snapshot.shed(),
    }
}

fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let capacity = measure_capacity(args.capacity, args.service).await;
    println!(
        "capacity: C = {} permits × {:?} = {:.0} completions/s measured; offered {:.0} calls/s \
         ({}×), {:?} deadline, {:?} per attempt",
        args.capacity,
        args.service,
        capacity,
        capacity * args.load,
        args.load,
        DEADLINE,
        PER_ATTEMPT
    );
    let mut outcomes = Vec::new();
    for name in POLICIES {
        if args.only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let o = run(name, &args, capacity).await?;
        print_outcome(&o);
        outcomes.push(o);
        // Let the previous server's connections wind down before the next run.
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let get = |n: &str| outcomes.iter().find(|o| o.name == n);
    if let (Some(a), Some(r), Some(h)) = (get("adaptive"), get("fixed-right"), get("fixed-high")) {
        println!(
            "adaptive / fixed-right goodput {:.2}; adaptive / fixed-high {:.2}; final limit / C {:.2}",
            a.goodput_share / r.goodput_share.max(1e-9),
            a.goodput_share / h.goodput_share.max(1e-9),
            a.final_limit as f64 / args.capacity as f64
        );
    }
    if args.storm {
        storms(&args).await?;
    }
    if let Some(path) = &args.json {
        write_json(path, &outcomes, args.capacity)?;
    }
    Ok(())
}

/// Prints the line of one policy (and the limit's series, for the adaptive one).
fn print_outcome(o: &Outcome) {
    println!(
        "{:<12} goodput {:>5.1} % of capacity  p99 {:>6.1} ms  attempts/call {:.2}  \
         shed {:>6}  limit: final {:>3}, mean {:>5.1} over the measured window{}",
        o.name,
        o.goodput_share * 100.0,
        o.p99_ms,
        o.attempts_per_call,
        o.shed,
        o.final_limit,
        o.mean_limit,
        o.min_latency_ms
            .map(|m| format!(", no-load latency {m:.1} ms"))
            .unwrap_or_default()
    );
    if o.name == "adaptive" {
        let series: Vec<String> = o.limits.iter().map(usize::to_string).collect();
        println!("             limit every 250 ms: {}", series.join(" "));
    }
}

/// `--storm`: the capacity drop, for each policy that `--only` leaves.
async fn storms(args: &Args) -> Result<(), Box<dyn std::error::Error>> {
    let capacity = measure_capacity(args.capacity, STORM_SERVICE).await;
    println!(
        "storm: C = {} permits x {STORM_SERVICE:?} = {capacity:.0} completions/s measured; \
         75 % of capacity offered; pool service time x2.5 from 5 s to 8 s; share of \
         calls served per 500 ms (by send time); recovery = from 8 s to the first window \
         that starts 2 s of windows serving >= 90 %",
        args.capacity
    );
    for name in ["fixed-right", "fixed-high", "adaptive"] {
        if args.only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let (share, limits, recovery) = storm(name, args, capacity).await?;
        let share: Vec<String> = share.iter().map(|s| format!("{:.2}", s)).collect();
        let limits: Vec<String> = limits.iter().map(usize::to_string).collect();
        println!(
            "storm {name:<12} recovery {}\n  served: {}\n  limit:  {}",
            recovery.map_or("never (within 8 s)".to_owned(), |d| format!("{d:?}")),
            share.join(" "),
            limits.join(" ")
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

/// `--json`: each policy's goodput, p99 and final limit, and the capacity `C`.
fn write_json(path: &str, outcomes: &[Outcome], capacity: usize) -> std::io::Result<()> {
    let policies: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|o| {
            serde_json::json!({
                "name": o.name,
                "goodput_share_of_capacity": round(o.goodput_share, 4),
                "p99_ms": round(o.p99_ms, 2),
                "final_limit": o.final_limit,
            })
        })
        .collect();
    let report = serde_json::json!({ "policies": policies, "capacity": capacity });
    std::fs::write(path, format!("{report}\n"))
}
