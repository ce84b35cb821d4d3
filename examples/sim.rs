//! The fleet simulator's command line: prints the six tables of `stormguard-sim` and
//! optionally writes them as JSON.
//!
//! ```text
//! cargo run --release --example sim -- [--quick] [--seed N] [--json FILE]
//! ```
//!
//! `--help` describes every flag.
//!
//! Runs in seconds: the clock is virtual. The same seed prints the same figures and writes
//! the same JSON bytes.

use std::process::ExitCode;

use clap::Parser;
use stormguard_sim::{Options, Tables};

/// The fleet simulator: the same policy objects the layers use, on a virtual clock, at
/// fleet scale. Prints its six tables; the same seed prints the same figures.
#[derive(Debug, Parser)]
#[command(name = "sim")]
struct Args {
    /// Shorter runs and smaller fleets (the shapes of the full tables, noisier)
    #[arg(long)]
    quick: bool,
    /// Seed of every run
    #[arg(long, value_name = "N", default_value_t = Options::default().seed)]
    seed: u64,
    /// Also write the tables as JSON to FILE
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let options = Options {
        quick: args.quick,
        seed: args.seed,
    };
    let tables = match Tables::run(&options) {
        Ok(tables) => tables,
        Err(e) => {
            eprintln!("sim: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!("{tables}");
    if let Some(path) = args.json {
        if let Err(e) = std::fs::write(&path, tables.to_json()) {
            eprintln!("sim: cannot write {path}: {e}");
            return ExitCode::FAILURE;
        }
        println!("tables written to {path}");
    }
    ExitCode::SUCCESS
}
