//! What the `ShedLayer` costs a healthy service: steady closed-loop load on real tonic
//! over loopback, the default layer against no layer (and a fixed limit), interleaved.
//!
//! ```text
//! cargo run --release --example steady -- [--handler-ms 1,2,10,20] [--callers 32,256]
//!     [--watchers 0] [--rounds 3] [--secs 5] [--guards bare,default,fixed64] [--limits]
//! ```
//!
//! `--help` describes every flag.
//!
//! The server's `Reserve` waits `--handler-ms` of wall time (a handler that waits on I/O:
//! latency flat with concurrency), `--callers` call it in closed loops with a 300 ms
//! deadline, and `--watchers` hold a `WatchStock` stream each, one level every 500 ms.
//! Each round runs every guard once per load, in turn; the table gives the median over the
//! rounds of the calls served in the run, the default's share of no layer's (its median of
//! per-round ratios), the calls the default failed and shed, the levels the watchers got
//! (as a share of their due), and the default's worker limit at the end of its last run.

use std::time::Duration;

use clap::Parser;
use stormguard_demo::steady::{Guard, Steady, SteadyOutcome, run_steady};

#[path = "support/cli.rs"]
mod cli;

#[derive(Parser, Debug)]
#[command(
    name = "steady",
    about = "What the ShedLayer costs a healthy service: steady closed-loop load, the \
             default layer against no layer, interleaved rounds."
)]
struct Args {
    /// Wall time of each `Reserve` handler, in ms (a comma-separated list).
    #[arg(long, value_delimiter = ',', default_values_t = [1u64, 2, 10, 20])]
    handler_ms: Vec<u64>,
    /// Closed-loop callers (a comma-separated list).
    #[arg(long, value_delimiter = ',', default_values_t = [32usize, 256])]
    callers: Vec<usize>,
    /// Idle `WatchStock` streams held open beside the callers (a comma-separated list).
    #[arg(long, value_delimiter = ',', default_values_t = [0usize])]
    watchers: Vec<usize>,
    /// Rounds; every guard runs once per load in each.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Seconds counted per run (after a 1 s warm-up).
    #[arg(long, default_value_t = 5)]
    secs: u64,
    /// Guards compared: `bare` (no layer), `default`, `fixedN` (a fixed limit of N).
    #[arg(long, value_delimiter = ',', default_values_t = ["bare".to_owned(), "default".to_owned()])]
    guards: Vec<String>,
    /// Also print, after each run, the layer's worker limit and no-load latency (µs) every
    /// 250 ms.
    #[arg(long)]
    limits: bool,
}

fn guard(name: &str) -> Result<Guard, String> {
    match name {
        "bare" => Ok(Guard::Bare),
        "default" => Ok(Guard::Default),
        fixed => fixed
            .strip_prefix("fixed")
            .and_then(|n| n.parse().ok())
            .filter(|n| *n > 0)
            .map(Guard::Fixed)
            .ok_or_else(|| format!("unknown guard {name:?}: bare, default or fixedN")),
    }
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::process::ExitCode {
    cli::exit_code("steady", run(Args::parse()).await)
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let guards = args
        .guards
        .iter()
        .map(|g| guard(g))
        .collect::<Result<Vec<_>, _>>()?;
    let mut loads = Vec::new();
    for &watchers in &args.watchers {
        for &callers in &args.callers {
            for &ms in &args.handler_ms {
                let mut steady = Steady::new(Duration::from_millis(ms), callers);
                steady.watchers = watchers;
                steady.run = Duration::from_secs(args.secs);
                loads.push(steady);
            }
        }
    }
    // results[load][guard][round]
    let mut results: Vec<Vec<Vec<SteadyOutcome>>> =
        vec![vec![Vec::new(); guards.len()]; loads.len()];
    for round in 0..args.rounds {
        for (l, steady) in loads.iter().enumerate() {
            for (g, &guard) in guards.iter().enumerate() {
                let outcome = run_steady(*steady, guard).await?;
                eprintln!(
                    "round {round}: handler {:?}, {} callers, {} watchers, {}: {} ok, {} failed, {} levels of {}",
                    steady.handler,
                    steady.callers,
                    steady.watchers,
                    guard.name(),
                    outcome.ok,
                    outcome.failed,
                    outcome.levels,
                    outcome.levels_due,
                );
                if args.limits {
                    eprintln!("  limits: {:?}", outcome.limits);
                }
                results[l][g].push(outcome);
            }
        }
    }
    let mut header = "| handler | callers | watchers |".to_owned();
    let mut rule = "|---|---:|---:|".to_owned();
    for guard in &guards {
        header.push_str(&format!(" {} ok | failed | levels |", guard.name()));
        rule.push_str("---:|---:|---:|");
    }
    if guards.len() > 1 {
        for guard in &guards[1..] {
            header.push_str(&format!(" {} / {} |", guard.name(), guards[0].name()));
            rule.push_str("---:|");
        }
        header.push_str(" limit at end |");
        rule.push_str("---:|");
    }
    println!("{header}\n{rule}");
    for (l, steady) in loads.iter().enumerate() {
        let mut row = format!(
            "| {} ms | {} | {} |",
            steady.handler.as_millis(),
            steady.callers,
            steady.watchers
        );
        for runs in &results[l] {
            let ok = median(runs.iter().map(|o| o.ok as f64).collect());
            let failed = median(runs.iter().map(|o| o.failed as f64).collect());
            let levels = median(
                runs.iter()
                    .map(|o| o.levels as f64 / o.levels_due.max(1) as f64)
                    .collect(),
            );
            let levels = if steady.watchers == 0 {
                "—".to_owned()
            } else {
                format!("{:.2}", levels)
            };
            row.push_str(&format!(" {ok:.0} | {failed:.0} | {levels} |"));
        }
        if guards.len() > 1 {
            for runs in &results[l][1..] {
                let ratios = runs
                    .iter()
                    .zip(&results[l][0])
                    .map(|(o, base)| o.ok as f64 / base.ok.max(1) as f64)
                    .collect();
                row.push_str(&format!(" {:.2}× |", median(ratios)));
            }
            let limit = results[l]
                .iter()
                .zip(&guards)
                .find(|(_, g)| **g == Guard::Default)
                .and_then(|(runs, _)| runs.last())
                .and_then(|o| o.snapshot.as_ref())
                .map_or("—".to_owned(), |s| s.worker_limit.to_string());
            row.push_str(&format!(" {limit} |"));
        }
        println!("{row}");
    }
    Ok(())
}
