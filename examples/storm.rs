//! The storm on real tonic: a metastable failure, and what six retry policies do with it
//! (and hedging, with `--policies ...,hedging`).
//!
//! ```text
//! cargo run --release --example storm -- [--quick] [--json FILE] [--svg FILE] [--seed N]
//!     [--model cancelling|pool] [--policies LIST] [--load SHARE] [--deadline-ms MS]
//!     [--limit fixed|adaptive] [--overload X] [--reject-cost-us N] [--client tonic|grpc]
//! ```
//!
//! `--help` describes every flag.
//!
//! One tonic Inventory server on loopback with a fixed capacity (8 workers × 10 ms), an
//! open-loop Poisson fleet at ~78 % of the measured capacity, every call with a 200 ms
//! deadline and 50 ms per attempt; the service time rises ×2.5 for a few seconds, then
//! comes back. The same timeline runs for each policy; then a table, and `storm.svg`
//! (goodput and attempts per second, one line per policy, the trigger shaded).
//!
//! `--overload X` replaces the trigger with a sustained overload (the whole run at X times
//! the measured capacity, the service time unchanged) and `--reject-cost-us N` makes every
//! answer the `ShedLayer` sheds cost the server N µs of CPU: the case of the `throttle`
//! policy (stormguard plus the client's adaptive throttle), e.g.
//! `--policies stormguard,throttle --overload 10 --reject-cost-us 300`. The `reports`
//! policy is `stormguard` with load reports (ORCA) on both layers: `--policies
//! stormguard,reports`. The `unguarded` policy is the naive loop built from stormguard's
//! layers with every protection off, so that its metrics can be seen. The peers' policies
//! (`tower`, `tower-sized`, `resilience`, `resilience-sized`: tower with tonic's own limits,
//! and tower-resilience, each as its docs recommend) run on request; `docs/comparison.md`
//! has their run: `--policies naive,tower,tower-sized,resilience,resilience-sized,stormguard,defaults`.
//!
//! `--client grpc` runs the policies whose client is stormguard's retry decision
//! (`stormguard`, `defaults`, `client-only`, `grpc-throttle`, `hedging`, `unguarded`) on the official
//! `grpc` crate's channel under stormguard's `RetryInterceptor` instead of tonic's under the
//! `RetryLayer` (`docs/grpc.md`), e.g. `--client grpc --policies stormguard,defaults`.
//!
//! `--metrics-addr ADDR` serves every policy's layers' metrics to Prometheus at
//! `http://ADDR/metrics`, each layer named after its policy (`stormguard_layer`), and writes
//! on stderr when each policy's run starts (`storm: POLICY started at unix ms N`); needs
//! `--features otel-examples`. The rules and dashboard that read them are in `ops/`.

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Parser, ValueEnum};
use indicatif::ProgressBar;
use plotters::prelude::*;
use stormguard_demo::storm::{
    ClientKind, LoopbackStorm, Policy, Second, ServerModel, StormReport, run_storm,
};
use stormguard_sim::StormConfig;
#[path = "support/chart.rs"]
mod chart;
#[path = "support/cli.rs"]
mod cli;
#[path = "support/meters.rs"]
mod meters;
#[path = "support/otel.rs"]
mod otel;

/// The storm on real tonic: a metastable failure, and what six retry policies do with it.
///
/// One Inventory server (8 workers x 10 ms) on loopback, an open-loop fleet at 78 % of
/// its measured capacity, the service time x2.5 for 4 s; the same timeline for each
/// policy. Prints a table and draws the picture. With --overload and --reject-cost-us: a
/// sustained overload against a server whose refusals cost CPU, the case of the `throttle`
/// policy (stormguard plus the client's adaptive throttle). --quick: 1 s before the
/// trigger, 2 s of it, 3 s after (about 40 s in all). The JSON holds the trigger, and per
/// policy the summary and the timeline second by second.
#[derive(Debug, Parser)]
#[command(name = "storm")]
struct Args {
    #[command(flatten)]
    run: cli::RunArgs,
    /// What the server does with work whose caller left
    #[arg(long, value_name = "M", value_enum, default_value_t = Model::Cancelling)]
    model: Model,
    /// The policies to run, comma-separated, in the table's order [default: all but
    /// hedging, throttle, reports, unguarded and the peers' tower, tower-sized, resilience
    /// and resilience-sized]
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = policy())]
    policies: Vec<Policy>,
    /// Offered load as a share of the measured capacity
    #[arg(long, value_name = "SHARE", value_parser = cli::positive,
          default_value_t = StormConfig::loopback().load)]
    load: f64,
    /// Deadline of each logical call, in milliseconds
    #[arg(long = "deadline-ms", value_name = "MS", value_parser = clap::value_parser!(u64).range(1..),
          default_value_t = StormConfig::loopback().deadline.as_millis() as u64)]
    deadline_ms: u64,
    /// The worker limit of the shed layer of `server-only`, `stormguard` and the rows
    /// built on them (`defaults` always runs the default, adaptive)
    #[arg(long, value_name = "L", value_enum, default_value_t = Limit::Fixed)]
    limit: Limit,
    /// Instead of the trigger, a sustained overload: offer X times the measured capacity
    /// for the whole run, service time unchanged (--load is then not used); the table
    /// shows goodput as a share of capacity and the CPU spent rejecting
    #[arg(long, value_name = "X", value_parser = cli::positive)]
    overload: Option<f64>,
    /// CPU each answer the server's shed layer sheds costs it before it is sent, in
    /// microseconds (a busy loop on the server's runtime thread) [default: 0]
    #[arg(long = "reject-cost-us", value_name = "N")]
    reject_cost_us: Option<u64>,
    /// Serve the layers' metrics to Prometheus at http://ADDR/metrics, each layer named
    /// after its policy (needs `--features otel-examples`)
    #[arg(long = "metrics-addr", value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// The client library: tonic under the RetryLayer, or the official `grpc` crate
    /// (0.9) under stormguard's RetryInterceptor (only the policies whose client is
    /// stormguard's retry decision run on it)
    #[arg(long, value_name = "C", value_enum, default_value_t = Client::Tonic)]
    client: Client,
}

/// `--client`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Client {
    /// tonic's channel
    Tonic,
    /// The official `grpc` crate's channel
    Grpc,
}

/// `--model`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Model {
    /// Drops it: a tonic handler behind a semaphore
    Cancelling,
    /// Finishes it: a worker pool
    Pool,
}

/// `--limit`.
#[derive(Clone, Copy, Debug, ValueEnum)]
enum Limit {
    /// Fixed at the server's real concurrency (8), as an operator who measured it sets it
    Fixed,
    /// The default: adaptive, learned from latency, told nothing
    Adaptive,
}

/// `--policies`: the names of [`Policy::ALL`].
fn policy() -> impl TypedValueParser<Value = Policy> {
    PossibleValuesParser::new(Policy::ALL.map(Policy::as_str)).try_map(|name| {
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| format!("unknown policy {name:?}"))
    })
}

impl Args {
    /// The run the flags describe.
    fn config(&self) -> LoopbackStorm {
        let mut config = if self.run.quick {
            LoopbackStorm::quick()
        } else {
            LoopbackStorm::standard()
        };
        config.storm.seed = self.run.seed;
        config.model = match self.model {
            Model::Cancelling => ServerModel::Cancelling,
            Model::Pool => ServerModel::Pool,
        };
        config.storm.load = self.load;
        config.storm.deadline = Duration::from_millis(self.deadline_ms);
        config.fixed_limit = matches!(self.limit, Limit::Fixed);
        config.overload = self.overload;
        config.reject_cost = Duration::from_micros(self.reject_cost_us.unwrap_or(0));
        config.client = match self.client {
            Client::Tonic => ClientKind::Tonic,
            Client::Grpc => ClientKind::Grpc,
        };
        config
    }

    /// The policies to run: those named, else the default set.
    fn policies(&self) -> &[Policy] {
        if self.policies.is_empty() {
            &Policy::DEFAULT
        } else {
            &self.policies
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    cli::exit_code("storm", run(&args).await)
}

async fn run(args: &Args) -> Result<(), Box<dyn Error>> {
    let config = &args.config();
    let policies = args.policies();
    eprintln!(
        "measuring the server's capacity ({} workers x {:?}, {} model)...",
        config.storm.workers,
        config.storm.service_time,
        config.model.as_str()
    );
    let (_bars, each) = cli::progress_bars(policies.iter().map(|p| p.as_str()), 14)?;
    let policy_bars: Vec<(Policy, ProgressBar)> = policies.iter().copied().zip(each).collect();
    let export = otel::Export::start(otel::Sinks {
        stdout: None,
        metrics_addr: args.metrics_addr,
    })
    .await?;
    let instruments = meters::Meters::of(export.as_ref()).instruments();
    let progress = |policy: Policy, done: f64| {
        if done == 0.0 && export.is_some() {
            let unix_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            eprintln!("storm: {} started at unix ms {unix_ms}", policy.as_str());
        }
        if let Some((_, bar)) = policy_bars.iter().find(|(p, _)| *p == policy) {
            bar.set_position((done * 1000.0) as u64);
            if done >= 1.0 {
                bar.finish_with_message("done");
            }
        }
    };
    let report = run_storm(config, policies, &progress, &instruments).await?;
    if let Some(export) = export {
        export.finish();
    }
    if config.client != ClientKind::Tonic {
        println!("client: {}", config.client.as_str());
    }
    println!(
        "{}\n",
        report.headline(
            config.storm.slowdown,
            config.storm.per_attempt,
            config.storm.deadline,
        )
    );
    print!("{}", report.table());
    for p in report.policies.iter().filter(|p| p.connection_errors > 0) {
        println!(
            "{}: {} attempts failed with their connection",
            p.name, p.connection_errors
        );
    }
    for p in &report.policies {
        if let Some(hedges) = &p.hedges {
            println!("{}: {hedges}", p.name);
        }
    }
    args.run.write_report("storm", &report, draw)
}

/// One colour per policy, in [`Policy::ALL`]'s order.
const COLOURS: [RGBColor; 15] = [
    RGBColor(214, 39, 40),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(31, 119, 180),
    RGBColor(140, 86, 75),
    RGBColor(44, 160, 44),
    RGBColor(23, 190, 207),
    RGBColor(227, 119, 194),
    RGBColor(188, 189, 34),
    RGBColor(127, 127, 127),
    RGBColor(0, 0, 0),
    RGBColor(174, 199, 232),
    RGBColor(255, 187, 120),
    RGBColor(152, 223, 138),
    RGBColor(197, 176, 213),
];

/// What one panel plots, per second.
type Metric = fn(&Second) -> u64;

fn draw(report: &StormReport, path: &str) -> Result<(), Box<dyn Error>> {
    let seconds = report
        .policies
        .iter()
        .map(|p| p.timeline.len())
        .max()
        .unwrap_or(1) as f64;
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(380);
    let panels: [(_, &str, Metric); 2] = [
        (top, "goodput (successful logical calls per second)", |s| {
            s.goodput
        }),
        (bottom, "attempts sent per second", |s| s.attempts),
    ];
    let frame = chart::Frame {
        caption: 18,
        margin: 12,
        x_labels: 32,
        y_labels: 56,
    };
    let window = (
        f64::from(report.trigger.start_s),
        f64::from(report.trigger.end_s),
    );
    let mid = |s: &Second| f64::from(s.t) + 0.5;
    for (panel, (area, title, value)) in panels.into_iter().enumerate() {
        let peak = report
            .policies
            .iter()
            .flat_map(|p| p.timeline.iter().map(|s| value(s).max(s.offered)))
            .max()
            .unwrap_or(1) as f64;
        let mut lines = Vec::new();
        if let Some(first) = report.policies.first() {
            lines.push(chart::offered(
                first
                    .timeline
                    .iter()
                    .map(|s| (mid(s), s.offered as f64))
                    .collect(),
            ));
        }
        for policy in &report.policies {
            let points = policy.timeline.iter();
            lines.push(chart::policy_line(
                policy.name,
                &Policy::ALL.map(Policy::as_str),
                &COLOURS,
                points.map(|s| (mid(s), value(s) as f64)).collect(),
            ));
        }
        let panel = chart::LinePanel {
            title,
            x_max: seconds,
            y_max: peak * 1.1,
            window,
            window_label: "trigger (service time x2.5)",
            window_alpha: 0.35,
            lines,
            // One legend, where the lines of the first panel leave room for it.
            legend: (panel == 0).then_some(SeriesLabelPosition::MiddleRight),
        };
        chart::draw_lines(&area, frame, panel)?;
    }
    root.present()?;
    Ok(())
}
