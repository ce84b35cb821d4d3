//! The fleet simulator's command line: prints the four tables of `stormguard-sim` and
//! optionally writes them as JSON.
//!
//! ```text
//! cargo run --release --example sim -- [--quick] [--seed N] [--json FILE]
//! ```
//!
//! Runs in seconds: the clock is virtual. The same seed prints the same figures and writes
//! the same JSON bytes.

use std::process::ExitCode;

use stormguard_sim::{Options, Tables};
#[path = "support/cli.rs"]
mod cli;

const USAGE: &str = "usage: sim [--quick] [--seed N] [--json FILE]

  --quick      shorter runs and smaller fleets (the shapes of the full tables, noisier)
  --seed N     seed of every run (default 1)
  --json FILE  also write the tables as JSON to FILE";

struct Args {
    options: Options,
    json: Option<String>,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Option<Args>, String> {
    let mut options = Options::default();
    let mut json = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => options.quick = true,
            "--seed" => options.seed = cli::value("--seed", &mut args)?,
            "--json" => json = Some(args.next().ok_or("--json needs a file name")?),
            "-h" | "--help" => return Ok(None),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(Some(Args { options, json }))
}

fn main() -> ExitCode {
    let args = match parse(std::env::args().skip(1)) {
        Ok(Some(args)) => args,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("sim: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let tables = match Tables::run(&args.options) {
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
