//! The chain on real tonic: gateway → orders → inventory, each hop retrying.
//!
//! ```text
//! cargo run --release --example chain -- [--quick] [--json FILE] [--seed N]
//! ```
//!
//! Three tonic services on loopback; users call the gateway, which calls orders, which
//! calls inventory. `naive`: every hop retries 3 times, no budget, no signal.
//! `stormguard`: a `RetryLayer` on every client and a `ShedLayer` on every server, all with
//! defaults. Once with inventory dead (always `UNAVAILABLE`), once with it failing 20 % of
//! calls at random. Prints how many calls reached inventory per user request.

use std::process::ExitCode;

use stormguard_demo::storm::chain::{ChainConfig, run_chain};
#[path = "support/cli.rs"]
mod cli;

const USAGE: &str = "usage: chain [--quick] [--json FILE] [--seed N]

  --quick      25 requests/s for 2 s instead of 100/s for 8 s
  --json FILE  also write the result as JSON to FILE
  --seed N     seed of failures and jitter (default 1)";

fn parse(
    mut args: impl Iterator<Item = String>,
) -> Result<Option<(ChainConfig, Option<String>)>, String> {
    let mut quick = false;
    let mut seed = None;
    let mut json = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--seed" => seed = Some(cli::value("--seed", &mut args)?),
            "--json" => json = Some(args.next().ok_or("--json needs a file name")?),
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let mut config = if quick {
        ChainConfig::quick()
    } else {
        ChainConfig::standard()
    };
    config.seed = seed.unwrap_or(config.seed);
    Ok(Some((config, json)))
}

#[tokio::main]
async fn main() -> ExitCode {
    let (config, json) = match parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("chain: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    println!(
        "gateway -> orders -> inventory, {:.0} user requests/s for {:?}, {:?} deadline",
        config.rate, config.duration, config.deadline
    );
    let report = match run_chain(&config).await {
        Ok(report) => report,
        Err(e) => {
            eprintln!("chain: {e}");
            return ExitCode::FAILURE;
        }
    };
    print!("{}", report.table(config.flaky_rate));
    if let Some(path) = json {
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
