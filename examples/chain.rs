//! The chain on real tonic: gateway → orders → inventory, each hop retrying.
//!
//! ```text
//! cargo run --release --example chain -- [--quick] [--json FILE] [--seed N]
//!     [--metrics-addr ADDR]
//! ```
//!
//! `--help` describes every flag.
//!
//! Three tonic services on loopback; users call the gateway, which calls orders, which
//! calls inventory. `naive`: every hop retries 3 times, no budget, no signal.
//! `stormguard`: a `RetryLayer` on every client and a `ShedLayer` on every server, all with
//! defaults. Once with inventory dead (always `UNAVAILABLE`), once with it failing 20 % of
//! calls at random. Prints how many calls reached inventory per user request.

use std::process::ExitCode;

use clap::Parser;
use stormguard_demo::storm::chain::{ChainConfig, run_chain};

#[path = "support/meters.rs"]
mod meters;
#[path = "support/otel.rs"]
mod otel;

/// The chain on real tonic: gateway -> orders -> inventory, each hop retrying.
///
/// Once with inventory dead (always UNAVAILABLE), once with it failing 20 % of calls;
/// `naive` hops retry 3 times, `stormguard` hops run both layers with defaults. Prints how
/// many calls reached inventory per user request.
#[derive(Debug, Parser)]
#[command(name = "chain")]
struct Args {
    /// 25 requests/s for 2 s instead of 100/s for 8 s
    #[arg(long)]
    quick: bool,
    /// Also write the result as JSON to FILE (the dead case under `policies`, the flaky
    /// one under `flaky.policies`)
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
    /// Seed of failures and jitter
    #[arg(long, value_name = "N", default_value_t = ChainConfig::standard().seed)]
    seed: u64,
    /// Serve the layers' metrics to Prometheus at http://ADDR/metrics, each layer named
    /// after its case and hop (`dead.orders`: the client layer calling orders and orders'
    /// ShedLayer, in the dead case), as the dashboard's `chain` variable picks them (needs
    /// `--features otel-examples`)
    #[arg(long = "metrics-addr", value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
}

#[tokio::main]
async fn main() -> ExitCode {
    let args = Args::parse();
    let mut config = if args.quick {
        ChainConfig::quick()
    } else {
        ChainConfig::standard()
    };
    config.seed = args.seed;
    println!(
        "gateway -> orders -> inventory, {:.0} user requests/s for {:?}, {:?} deadline",
        config.rate, config.duration, config.deadline
    );
    let sinks = otel::Sinks {
        stdout: None,
        metrics_addr: args.metrics_addr,
    };
    let export = match otel::Export::start(sinks).await {
        Ok(export) => export,
        Err(e) => {
            eprintln!("chain: {e}");
            return ExitCode::FAILURE;
        }
    };
    let instruments = meters::Meters::of(export.as_ref()).instruments();
    let report = run_chain(&config, &instruments).await;
    if let Some(export) = export {
        export.finish();
    }
    let report = match report {
        Ok(report) => report,
        Err(e) => {
            eprintln!("chain: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", report.table(config.flaky_rate));
    if let Some(path) = args.json {
        let written = serde_json::to_string_pretty(&report)
            .map_err(|e| e.to_string())
            .and_then(|text| std::fs::write(&path, text).map_err(|e| e.to_string()));
        if let Err(e) = written {
            eprintln!("chain: cannot write {path}: {e}");
            return ExitCode::FAILURE;
        }
        println!("result written to {path}");
    }
    ExitCode::SUCCESS
}
