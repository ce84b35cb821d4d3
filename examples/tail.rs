//! The tail: 1.5 % of the attempts a server receives take ten times longer, and what
//! hedging does to the tail latency and to the load, at a normal load and at twice the
//! capacity.
//!
//! ```text
//! cargo run --release --example tail -- [--quick] [--json FILE] [--svg FILE]
//!     [--policies LIST] [--seed N]
//! ```
//!
//! `--help` describes every flag.
//!
//! One tonic Inventory server on loopback (8 workers × 10 ms, behind the `ShedLayer`), where
//! a seeded 1.5 % of the attempts it receives take 100 ms; the capacity is measured first.
//! For each policy a fresh server and client: a warm-up and the measured phase at 40 % of
//! the capacity, then twice the capacity, open loop at a fixed rate, every call with a
//! 200 ms deadline. Then a table, the JSON (`--json`) and `tail.svg`. `docs/examples.md`
//! ("The tail") describes the figures and how they are measured.

use std::process::ExitCode;
use std::time::Duration;
use tower::BoxError;

use clap::Parser;

#[path = "support/chart.rs"]
mod chart;
#[path = "support/cli.rs"]
mod cli;
#[path = "tail/client.rs"]
mod client;
#[path = "tail/report.rs"]
mod report;
#[path = "tail/run.rs"]
mod run;
#[path = "tail/server.rs"]
mod server;
#[path = "tail/svg.rs"]
mod svg;

use client::{FIXED_DELAY, Policy};
use report::TailReport;
use run::{RunConfig, Timing};

/// The tail: 1.5 % of the attempts a server receives take ten times longer, and what
/// hedging does to the tail latency and to the load.
///
/// One Inventory server (8 workers x 10 ms, behind the ShedLayer) on loopback; each policy
/// runs at 40 % of the measured capacity, then at twice it, on a fresh server. Prints a
/// table and draws the picture. The seed also picks the slow attempts. --quick: 1.5 s of
/// warm-up, 3 s measured, 2 s of overload per policy (about 30 s in all). The JSON holds
/// per policy the latency percentiles and the extra attempts, at the normal load and under
/// overload.
#[derive(Debug, Parser)]
#[command(name = "tail")]
struct Args {
    #[command(flatten)]
    run: cli::RunArgs,
    /// The policies to run, comma-separated, in the table's order [default: all but the
    /// peer's resilience-hedge]
    #[arg(long, value_name = "LIST", value_enum, value_delimiter = ',')]
    policies: Vec<Policy>,
}

/// The normal load, as a share of the measured capacity.
const LOAD: f64 = 0.4;
/// The overload, as a multiple of the measured capacity.
const OVERLOAD: f64 = 2.0;
/// The deadline of every logical call.
const DEADLINE: Duration = Duration::from_millis(200);

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    cli::exit_code("tail", tail(&args).await)
}

async fn tail(args: &Args) -> Result<(), BoxError> {
    let timing = if args.run.quick {
        Timing::quick()
    } else {
        Timing::standard()
    };
    let policies = if args.policies.is_empty() {
        &Policy::DEFAULT[..]
    } else {
        &args.policies
    };
    eprintln!(
        "measuring the server's capacity ({} workers x {:?}, {} of {} attempts x{})...",
        server::WORKERS,
        server::SERVICE_TIME,
        server::SLOW_PER_BLOCK,
        server::BLOCK,
        server::SLOWDOWN,
    );
    let capacity = run::capacity(args.run.seed, timing.calibration).await?;
    let config = RunConfig {
        rate: LOAD * capacity,
        overload_rate: OVERLOAD * capacity,
        deadline: DEADLINE,
        seed: args.run.seed,
        timing,
    };
    eprintln!(
        "capacity ~{capacity:.0} calls/s; offering {:.0}/s ({:?} warm-up, {:?} measured), then \
         {:.0}/s for {:?}; deadline {DEADLINE:?}",
        config.rate, timing.warmup, timing.normal, config.overload_rate, timing.overload,
    );

    let (_bars, policy_bars) = cli::progress_bars(policies.iter().map(|p| p.as_str()), 16)?;
    let mut report = TailReport {
        policies: Vec::new(),
        capacity: capacity.round(),
        rate: config.rate.round(),
        overload_rate: config.overload_rate.round(),
        workers: server::WORKERS,
        service_time_ms: server::SERVICE_TIME.as_secs_f64() * 1000.0,
        slow_share: server::SLOW_PER_BLOCK as f64 / server::BLOCK as f64,
        slowdown: server::SLOWDOWN,
        hedge_delay_ms: FIXED_DELAY.as_secs_f64() * 1000.0,
        deadline_ms: DEADLINE.as_millis() as u64,
        warmup_s: timing.warmup.as_secs_f64(),
        normal_s: timing.normal.as_secs_f64(),
        overload_s: timing.overload.as_secs_f64(),
        seed: args.run.seed,
    };
    for (&policy, bar) in policies.iter().zip(&policy_bars) {
        let progress = |done: f64| bar.set_position((done * 1000.0) as u64);
        let data = run::run(policy, &config, &progress)
            .await
            .map_err(|e| format!("{}: {e}", policy.as_str()))?;
        bar.finish_with_message("done");
        report.policies.push(report::summarize(
            policy.as_str(),
            &data,
            capacity,
            timing.overload.as_secs_f64(),
        ));
    }
    print!("{}", report::table(&report));
    args.run
        .write_report("tail", &report, svg::draw)
        .map_err(|e| e.to_string().into())
}
