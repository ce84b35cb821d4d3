//! Overload soak: ten times the example server's capacity for a minute, from clients behind
//! the `RetryLayer`, and a check that nothing wears out.
//!
//! ```text
//! cargo build --example server --example soak && target/debug/examples/soak
//! # --seconds 60 --overload 10 --clients 4 --deadline-ms 300 [--server PATH]
//! ```
//!
//! `--help` describes every flag.
//!
//! Starts the example server (`--server`, by default the `server` binary next to this one)
//! with 4 workers × 20 ms, measures its capacity with a short saturating run, then offers
//! `--overload` × that capacity from `--clients` channels, each behind its own `RetryLayer`
//! (standard policy, `Reserve` idempotent), each call with a `--deadline-ms` deadline, arrivals at a fixed rate
//! whatever the answers (open loop). Every 5 s it prints the server's and its own resident
//! memory and what was served. At the end it checks, and exits non-zero if any fails:
//!
//! - first attempts kept being served: the clients got at least half the measured capacity
//!   answered OK over the run, and at least a tenth of it in every 5 s window (a window is
//!   allowed to dip when something else on the machine takes the CPU, not to starve);
//! - memory stayed flat: after the first 10 s, the server's RSS never rose more than
//!   25 % (and 4 MiB) above its level at 10 s;
//! - everything returns to zero: once the load stops, the server's queue, workers and
//!   decided-but-unsettled slots are empty, its runtime holds as many tasks as it did at rest
//!   before the soak (no stream or call task left behind), and so does this process's, with
//!   every client call ended;
//! - the server did not panic and exits cleanly on SIGINT;
//! - no connection was lost: each client made exactly one TCP connection (counted by its
//!   connector), so no call saw a GOAWAY or a reset connection.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use clap::Parser;
use stormguard::client::RetryLayer;
use tokio::time::Instant;

#[path = "support/child.rs"]
mod child;
#[path = "support/cli.rs"]
mod cli;

use child::{BOUND, ServerProcess, rss_kib};

const WINDOW: Duration = Duration::from_secs(5);
const WARM_UP: Duration = Duration::from_secs(10);

/// Overload soak: ten times the example server's capacity for a minute, from clients
/// behind the RetryLayer, and a check that nothing wears out.
///
/// Exits non-zero unless first attempts kept being served, the server's memory stayed
/// flat, everything came back to rest, no connection was lost and the server exited
/// cleanly.
#[derive(Debug, Parser)]
#[command(name = "soak")]
struct Args {
    /// Seconds of overload
    #[arg(long, value_name = "N", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..))]
    seconds: u64,
    #[command(flatten)]
    run: cli::OverloadArgs,
}

/// Counters shared by every call task.
#[derive(Default)]
struct Counts {
    started: AtomicU64,
    skipped: AtomicU64,
    ended: AtomicU64,
    ok: AtomicU64,
    failed: AtomicU64,
    connections: AtomicU64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    match run(args).await {
        Ok(failures) if failures.is_empty() => {
            println!("soak: passed");
            ExitCode::SUCCESS
        }
        Ok(failures) => {
            for f in failures {
                eprintln!("soak: FAILED: {f}");
            }
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("soak: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<Vec<String>, String> {
    let (mut server, addr) = ServerProcess::start(&args.run.server()?, "127.0.0.1:0", &[])?;
    let counts = Arc::new(Counts::default());
    let counted = counts.clone();
    let on_connect: Arc<dyn Fn(bool) + Send + Sync> = Arc::new(move |_: bool| {
        counted.connections.fetch_add(1, Ordering::Relaxed);
    });
    let (clients, layers) = child::clients(&addr, args.run.clients, &on_connect)?;

    // Capacity: what the server completes per second when 64 callers keep it saturated,
    // measured between two of its stats lines.
    let capacity = child::capacity(&mut server, &clients, "soak", 1, 2).await?;
    let server_tasks_before = server
        .at_rest()?
        .ok_or("the server did not come to rest after the capacity run")?["tasks"]
        .as_u64();
    let own_tasks_before = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    if capacity < 1.0 {
        return Err(format!("measured capacity {capacity}/s"));
    }
    let rate = capacity * args.run.overload;
    println!(
        "capacity {capacity:.0} calls/s (4 workers x 20 ms); offering {rate:.0} calls/s ({}x) \
         for {} s from {} RetryLayer clients, deadline {:?}",
        args.run.overload, args.seconds, args.run.clients, args.run.deadline
    );

    // The soak: open-loop arrivals at `rate`, spread over the clients.
    let soak_start = counts.ok.load(Ordering::Relaxed);
    let mut generators = spawn_generators(&args, &clients, &counts, rate);
    let sampled = sample(&args, &mut server, &counts, soak_start)?;
    while let Some(done) = generators.join_next().await {
        done.map_err(|e| format!("a client task panicked: {e}"))?;
    }

    // Back to zero: the queue, the workers and the slots empty, no task left behind.
    let idle = server.at_rest()?;
    let mut failures = evaluate(
        &args,
        capacity,
        &sampled.windows,
        &sampled.rss,
        idle.as_ref(),
        &counts,
    );
    let own_tasks_after = tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks();
    failures.extend(task_failures(
        server_tasks_before,
        idle.as_ref(),
        own_tasks_before,
        own_tasks_after,
    ));
    println!(
        "tasks at rest: server {} before, {} after; client {own_tasks_before} before, \
         {own_tasks_after} after",
        server_tasks_before.unwrap_or(0),
        idle.as_ref()
            .map_or(serde_json::Value::Null, |s| s["tasks"].clone()),
    );
    print_totals(
        &args,
        &sampled.rss,
        &counts,
        &layers,
        idle.as_ref().unwrap_or(&sampled.last_stats),
    );

    // A clean exit on SIGINT, and no panic on the way.
    failures.extend(child::stop(&mut server)?);
    Ok(failures)
}

/// One open-loop generator per client, offering its share of `rate` for the run, each
/// call counted in `counts`.
fn spawn_generators(
    args: &Args,
    clients: &[child::Client],
    counts: &Arc<Counts>,
    rate: f64,
) -> tokio::task::JoinSet<()> {
    let per_client = rate / args.run.clients as f64;
    let begin = Instant::now();
    let end = begin + Duration::from_secs(args.seconds);
    let mut generators = tokio::task::JoinSet::new();
    for (k, c) in clients.iter().enumerate() {
        let (c, counts, deadline) = (c.clone(), counts.clone(), args.run.deadline);
        generators.spawn(async move {
            let calls = counts.clone();
            child::open_loop(
                begin,
                end,
                per_client,
                (k as u64) << 40,
                &counts.skipped,
                |i| {
                    let (mut c, counts) = (c.clone(), calls.clone());
                    counts.started.fetch_add(1, Ordering::Relaxed);
                    let r = child::request("soak", i);
                    async move {
                        let mut r = tonic::Request::new(r);
                        r.set_timeout(deadline);
                        let counter = match c.reserve(r).await {
                            Ok(_) => &counts.ok,
                            Err(_) => &counts.failed,
                        };
                        counter.fetch_add(1, Ordering::Relaxed);
                        counts.ended.fetch_add(1, Ordering::Relaxed);
                    }
                },
            )
            .await;
        });
    }
    generators
}

/// What the soak sampled: (second, server KiB, client KiB) every window, the calls
/// served OK in each window, and the server's last stats line.
struct Sampled {
    rss: Vec<(u64, u64, u64)>,
    windows: Vec<u64>,
    last_stats: serde_json::Value,
}

/// Samples memory and goodput every window for the run, paced by the server's stats
/// lines (one a second), printing each window.
fn sample(
    args: &Args,
    server: &mut ServerProcess,
    counts: &Counts,
    soak_start: u64,
) -> Result<Sampled, String> {
    let own_status = "/proc/self/status";
    let mut sampled = Sampled {
        rss: Vec::new(),
        windows: Vec::new(),
        last_stats: serde_json::Value::Null,
    };
    let mut last_ok = soak_start;
    let mut second = 0;
    while second < args.seconds {
        // The server's stats line paces the sampling: one a second.
        sampled.last_stats = server.stats()?;
        second += 1;
        if second % WINDOW.as_secs() == 0 {
            let ok = counts.ok.load(Ordering::Relaxed);
            let window = ok - last_ok;
            sampled.windows.push(window);
            last_ok = ok;
            let s = server.rss_kib().unwrap_or(0);
            let c = rss_kib(own_status).unwrap_or(0);
            sampled.rss.push((second, s, c));
            let last_stats = &sampled.last_stats;
            println!(
                "t={second:>3}s  server RSS {:>6} KiB  client RSS {:>6} KiB  ok in window {:>5} \
                 ({:.0}/s)  server: completed {} shed_first {} shed_retry {} expired {} queue {}",
                s,
                c,
                window,
                window as f64 / WINDOW.as_secs_f64(),
                last_stats["completed"],
                last_stats["shed_first"],
                last_stats["shed_retry"],
                last_stats["expired"],
                last_stats["queue_depth"],
            );
        }
    }
    Ok(sampled)
}

/// Tasks left behind: the server's at rest against before the soak, this process's.
fn task_failures(
    server_before: Option<u64>,
    idle: Option<&serde_json::Value>,
    own_before: usize,
    own_after: usize,
) -> Vec<String> {
    let mut failures = Vec::new();
    if let Some(s) = idle
        && s["tasks"].as_u64() != server_before
    {
        failures.push(format!(
            "server tasks at rest: {} before the soak, {} after",
            server_before.unwrap_or(0),
            s["tasks"]
        ));
    }
    if own_after != own_before {
        failures.push(format!(
            "client tasks: {own_before} before the soak, {own_after} after"
        ));
    }
    failures
}

/// The run's totals: memory peaks, calls, connections, the retry layers' counters and
/// the server's last state.
fn print_totals(
    args: &Args,
    rss: &[(u64, u64, u64)],
    counts: &Counts,
    layers: &[RetryLayer],
    server: &serde_json::Value,
) {
    let peak = rss.iter().map(|s| s.1).max().unwrap_or(0);
    let client_peak = rss.iter().map(|s| s.2).max().unwrap_or(0);
    let totals: BTreeMap<&str, u64> = child::retry_totals(layers).into_iter().collect();
    println!(
        "server RSS peak {peak} KiB, client RSS peak {client_peak} KiB; calls started {} \
         ({:.0}/s; {} arrivals skipped while a generator was stalled), ended {}, ok {}, \
         failed {}; connections {} for {} clients; RetryLayer totals {totals:?}; server at \
         rest {}",
        counts.started.load(Ordering::Relaxed),
        counts.started.load(Ordering::Relaxed) as f64 / args.seconds as f64,
        counts.skipped.load(Ordering::Relaxed),
        counts.ended.load(Ordering::Relaxed),
        counts.ok.load(Ordering::Relaxed),
        counts.failed.load(Ordering::Relaxed),
        counts.connections.load(Ordering::Relaxed),
        args.run.clients,
        server,
    );
}

fn evaluate(
    args: &Args,
    capacity: f64,
    windows: &[u64],
    samples: &[(u64, u64, u64)],
    idle: Option<&serde_json::Value>,
    counts: &Counts,
) -> Vec<String> {
    let mut failures = Vec::new();
    let floor = capacity * WINDOW.as_secs_f64() / 10.0;
    for (i, ok) in windows.iter().enumerate() {
        if (*ok as f64) < floor {
            failures.push(format!(
                "window {i}: {ok} calls served, below a tenth of the capacity ({floor:.0})"
            ));
        }
    }
    let served: u64 = windows.iter().sum();
    let expected = capacity * WINDOW.as_secs_f64() * windows.len() as f64;
    if (served as f64) < expected / 2.0 {
        failures.push(format!(
            "{served} calls served over the run, below half the capacity ({expected:.0})"
        ));
    }
    let base = samples
        .iter()
        .find(|s| s.0 >= WARM_UP.as_secs())
        .map(|s| s.1);
    if let Some(base) = base {
        let limit = (base + base / 4).max(base + 4096);
        for (t, kib, _) in samples.iter().filter(|s| s.0 > WARM_UP.as_secs()) {
            if *kib > limit {
                failures.push(format!(
                    "server RSS grew after warm-up: {kib} KiB at {t} s, {base} KiB at 10 s"
                ));
            }
        }
    } else if args.seconds > WARM_UP.as_secs() {
        failures.push("no RSS sample after warm-up".into());
    }
    if idle.is_none() {
        failures.push(format!("the server did not come to rest within {BOUND:?}"));
    }
    let (started, ended) = (
        counts.started.load(Ordering::Relaxed),
        counts.ended.load(Ordering::Relaxed),
    );
    if started != ended {
        failures.push(format!("{started} calls started, {ended} ended"));
    }
    let offered = started as f64 / args.seconds as f64;
    let target = capacity * args.run.overload;
    if offered < target / 2.0 {
        failures.push(format!(
            "offered {offered:.0} calls/s, not even half the {target:.0}/s intended: the \
             machine could not generate the load"
        ));
    }
    let connections = counts.connections.load(Ordering::Relaxed);
    if connections != args.run.clients as u64 {
        failures.push(format!(
            "{connections} connections for {} clients: a connection was lost",
            args.run.clients
        ));
    }
    failures
}
