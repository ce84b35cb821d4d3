//! What the layers cost on the happy path, as ratios against bare tonic in the same run.
//!
//! One process serves a 16-byte unary echo (`Reserve` with a 16-byte payload) on loopback
//! and calls it from 64 callers over one channel, in four variants:
//!
//! - `bare`: a plain tonic channel to a plain tonic server;
//! - `retry`: the channel wrapped in a `RetryLayer` (the method marked idempotent, so the
//!   request is kept for a replay that never comes), same plain server;
//! - `shed`: the plain channel to a server behind a `ShedLayer` (default admission);
//! - `both`: the `RetryLayer` channel to the `ShedLayer` server.
//!
//! Rounds are interleaved (every variant once per round, each round starting with the next
//! variant), each variant running for the same time per round, and each round's figures
//! are divided by that round's `bare`,
//! so a machine that gets busier or quieter during the run moves every variant alike. Per
//! variant and round it prints calls per second, the ratio to bare, allocations per call
//! (a counting global allocator: client and server together, as both live in this process)
//! and CPU time per call (all threads of the process, from `/proc/self/task/*/schedstat`).
//!
//! Run: `cargo bench --bench client_overhead` (options after `--`: `--rounds N`,
//! `--secs S` per variant and round, `--callers C`).
//!
//! Instructions per call, repeatable on a noisy machine: run one variant for a fixed number
//! of calls under callgrind (on a single-threaded runtime, so that the count does not
//! depend on scheduling), twice with different counts, and divide the difference by the
//! difference in calls (start-up cancels out):
//!
//! ```text
//! cargo bench --bench client_overhead --no-run
//! BIN=$(ls -t target/release/deps/client_overhead-* | grep -v '\.d$' | head -1)
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null $BIN --variant retry --calls 2000
//! valgrind --tool=callgrind --callgrind-out-file=/dev/null $BIN --variant retry --calls 4000
//! ```
//!
//! (`Collected : N` in each run's output is the instruction count.)

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use stats_alloc::{INSTRUMENTED_SYSTEM, StatsAlloc};
use stormguard_client::{Retry, RetryLayer};
use stormguard_core::budget::{Budget, BudgetConfig, RetryBudget};
use stormguard_core::policy::{MethodTable, RetryPolicy};
use stormguard_core::retry::RetryController;
use stormguard_demo::{
    Inventory, InventoryClient, InventoryServer, ReserveReply, ReserveRequest, StockLevel,
    WatchStockRequest,
};
use stormguard_server::{AdmissionConfig, ShedLayer};
use tokio::net::TcpListener;
use tonic::codegen::tokio_stream::{self, Stream};
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Answers every `Reserve` at once.
#[derive(Clone, Default)]
struct Echo;

type LevelStream = std::pin::Pin<Box<dyn Stream<Item = Result<StockLevel, Status>> + Send>>;

#[tonic::codegen::async_trait]
impl Inventory for Echo {
    async fn reserve(
        &self,
        req: Request<ReserveRequest>,
    ) -> Result<Response<ReserveReply>, Status> {
        Ok(Response::new(ReserveReply {
            reserved: !req.get_ref().payload.is_empty(),
            attempt: 1,
            timeout_ms: 0,
        }))
    }

    type WatchStockStream = LevelStream;

    async fn watch_stock(
        &self,
        _: Request<WatchStockRequest>,
    ) -> Result<Response<LevelStream>, Status> {
        Ok(Response::new(Box::pin(tokio_stream::empty())))
    }
}

async fn listener() -> (TcpListener, SocketAddr) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    (listener, addr)
}

async fn serve_bare() -> SocketAddr {
    let (listener, addr) = listener().await;
    tokio::spawn(
        Server::builder()
            .serve_with_incoming(InventoryServer::new(Echo), TcpIncoming::from(listener)),
    );
    addr
}

async fn serve_shed() -> SocketAddr {
    let (listener, addr) = listener().await;
    let shed = ShedLayer::from_config(AdmissionConfig::default()).expect("admission config");
    // Served exactly as the bare server, the layer aside (no router in either).
    tokio::spawn(
        Server::builder()
            .layer(shed)
            .serve_with_incoming(InventoryServer::new(Echo), TcpIncoming::from(listener)),
    );
    addr
}

async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect")
}

fn retry_layer() -> RetryLayer {
    let budget: Arc<dyn Budget> =
        Arc::new(RetryBudget::new(BudgetConfig::default()).expect("budget"));
    let policy = RetryPolicy {
        idempotent: true,
        ..RetryPolicy::default()
    };
    RetryLayer::new(RetryController::new(
        MethodTable::uniform(policy),
        budget,
        None,
        1,
    ))
}

#[derive(Clone)]
enum Client {
    Bare(InventoryClient<Channel>),
    Retry(InventoryClient<Retry<Channel>>),
}

impl Client {
    async fn call(&mut self) {
        let request = ReserveRequest {
            sku: String::new(),
            quantity: 0,
            request_id: String::new(),
            payload: vec![7; 16],
        };
        let reply = match self {
            Client::Bare(c) => c.reserve(request).await,
            Client::Retry(c) => c.reserve(request).await,
        };
        assert!(reply.expect("echo").get_ref().reserved);
    }
}

const VARIANTS: [&str; 4] = ["bare", "retry", "shed", "both"];

async fn client(variant: &str, bare: SocketAddr, shed: SocketAddr) -> Client {
    let (addr, layered) = match variant {
        "bare" => (bare, false),
        "retry" => (bare, true),
        "shed" => (shed, false),
        "both" => (shed, true),
        other => panic!("unknown variant {other:?}; expected one of {VARIANTS:?}"),
    };
    let channel = channel(addr).await;
    if layered {
        Client::Retry(InventoryClient::new(
            tower::ServiceBuilder::new()
                .layer(retry_layer())
                .service(channel),
        ))
    } else {
        Client::Bare(InventoryClient::new(channel))
    }
}

/// CPU time used so far by every thread of this process.
fn cpu_time() -> Duration {
    let mut total = 0u64;
    if let Ok(tasks) = std::fs::read_dir("/proc/self/task") {
        for task in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat"))
                && let Some(ns) = s
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
            {
                total += ns;
            }
        }
    }
    Duration::from_nanos(total)
}

struct Sample {
    calls: u64,
    secs: f64,
    allocations: u64,
    cpu: Duration,
}

/// `callers` callers calling as fast as they can for `secs`.
async fn run_for(client: &Client, callers: usize, secs: f64) -> Sample {
    let stop = Arc::new(AtomicBool::new(false));
    let calls = Arc::new(AtomicU64::new(0));
    let allocs0 = GLOBAL.stats().allocations;
    let cpu0 = cpu_time();
    let t0 = Instant::now();
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let mut client = client.clone();
            let (stop, calls) = (Arc::clone(&stop), Arc::clone(&calls));
            tokio::spawn(async move {
                let mut n = 0;
                while !stop.load(Ordering::Relaxed) {
                    client.call().await;
                    n += 1;
                }
                calls.fetch_add(n, Ordering::Relaxed);
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.expect("caller");
    }
    Sample {
        calls: calls.load(Ordering::Relaxed),
        secs: t0.elapsed().as_secs_f64(),
        allocations: (GLOBAL.stats().allocations - allocs0) as u64,
        cpu: cpu_time() - cpu0,
    }
}

/// Exactly `total` calls shared by `callers` callers (for instruction counts).
async fn run_calls(client: &Client, callers: usize, total: u64) {
    let next = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let mut client = client.clone();
            let next = Arc::clone(&next);
            tokio::spawn(async move {
                while next.fetch_add(1, Ordering::Relaxed) < total {
                    client.call().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("caller");
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

struct Options {
    rounds: usize,
    secs: f64,
    callers: usize,
    variant: Option<String>,
    calls: Option<u64>,
}

fn options() -> Options {
    let mut o = Options {
        rounds: 5,
        secs: 2.0,
        callers: 64,
        variant: None,
        calls: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| panic!("{a} needs a value"));
        match a.as_str() {
            "--rounds" => o.rounds = value().parse().expect("--rounds N"),
            "--secs" => o.secs = value().parse().expect("--secs S"),
            "--callers" => o.callers = value().parse().expect("--callers C"),
            "--variant" => o.variant = Some(value()),
            "--calls" => o.calls = Some(value().parse().expect("--calls N")),
            // Passed by `cargo bench`.
            "--bench" => {}
            other => panic!("unknown option {other:?}"),
        }
    }
    o
}

fn main() {
    let o = options();
    // A fixed number of calls is for instruction counts: one thread, so that the count
    // does not depend on how the scheduler happened to spread the work.
    let runtime = if o.calls.is_some() {
        tokio::runtime::Builder::new_current_thread()
    } else {
        tokio::runtime::Builder::new_multi_thread()
    }
    .enable_all()
    .build()
    .expect("runtime");
    runtime.block_on(async {
        let (bare, shed) = (serve_bare().await, serve_shed().await);
        if let (Some(variant), Some(calls)) = (&o.variant, o.calls) {
            let client = client(variant, bare, shed).await;
            run_calls(&client, o.callers, calls).await;
            println!("{variant}: {calls} calls");
            return;
        }
        let mut clients = Vec::new();
        for v in VARIANTS {
            let c = client(v, bare, shed).await;
            // Warm up: connections, h2 windows, allocator caches.
            run_for(&c, o.callers, 0.3).await;
            clients.push((v, c));
        }
        println!(
            "{} callers, one channel per variant, {} rounds of {} s per variant",
            o.callers, o.rounds, o.secs
        );
        println!(
            "{:>5} {:>6} {:>10} {:>7} {:>12} {:>11}",
            "round", "variant", "calls/s", "ratio", "allocs/call", "cpu µs/call"
        );
        let mut ratios: Vec<Vec<f64>> = vec![Vec::new(); VARIANTS.len()];
        let mut allocs: Vec<Vec<f64>> = vec![Vec::new(); VARIANTS.len()];
        let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); VARIANTS.len()];
        for round in 1..=o.rounds {
            // Each round starts with a different variant, so that no variant always runs
            // first (or right after the same other one).
            let mut samples: Vec<Option<Sample>> = (0..clients.len()).map(|_| None).collect();
            for k in 0..clients.len() {
                let i = (round - 1 + k) % clients.len();
                samples[i] = Some(run_for(&clients[i].1, o.callers, o.secs).await);
            }
            let rate = |s: &Sample| s.calls as f64 / s.secs;
            let base = samples[0].as_ref().map_or(f64::NAN, rate);
            for (i, s) in samples.iter().enumerate() {
                let Some(s) = s else { continue };
                let name = clients[i].0;
                let per_call_allocs = s.allocations as f64 / s.calls as f64;
                let cpu = s.cpu.as_secs_f64() * 1e6 / s.calls as f64;
                ratios[i].push(rate(s) / base);
                allocs[i].push(per_call_allocs);
                cpus[i].push(cpu);
                println!(
                    "{round:>5} {name:>7} {:>10.0} {:>7.3} {per_call_allocs:>12.2} {cpu:>11.2}",
                    rate(s),
                    rate(s) / base
                );
            }
        }
        println!("medians over rounds (ratio to the same round's bare):");
        let base_allocs = median(allocs[0].clone());
        let base_cpu = median(cpus[0].clone());
        for (i, name) in VARIANTS.iter().enumerate() {
            let (r, a, c) = (
                median(ratios[i].clone()),
                median(allocs[i].clone()),
                median(cpus[i].clone()),
            );
            println!(
                "{name:>7}: throughput {r:.3}x (min {:.3}, max {:.3}), allocs/call {a:.2} ({:+.2}), cpu/call {c:.2} µs ({:+.2})",
                ratios[i].iter().copied().fold(f64::INFINITY, f64::min),
                ratios[i].iter().copied().fold(f64::NEG_INFINITY, f64::max),
                a - base_allocs,
                c - base_cpu,
            );
        }
    });
}
