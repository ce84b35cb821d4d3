//! Runs the fuzz targets: `stormguard-fuzz [--inputs N] [--seed N] [--target NAME]`.

use std::process::ExitCode;
use std::time::Instant;

use stormguard_fuzz::driver;
use stormguard_fuzz::targets::{TARGETS, Target, target};

const USAGE: &str = "usage: stormguard-fuzz [--inputs N per target] [--seed N] [--target NAME]";

fn main() -> ExitCode {
    let mut inputs: u64 = 200_000;
    let mut seed: u64 = 1;
    let mut only: Option<&'static Target> = None;
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args.next();
        let parsed = match (flag.as_str(), value.as_deref()) {
            ("--inputs", Some(v)) => v.parse().map(|n| inputs = n).map_err(|_| v.to_owned()),
            ("--seed", Some(v)) => v.parse().map(|n| seed = n).map_err(|_| v.to_owned()),
            ("--target", Some(v)) => target(v).map(|t| only = Some(t)).ok_or(v.to_owned()),
            _ => Err(flag.clone()),
        };
        if let Err(bad) = parsed {
            let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
            eprintln!(
                "cannot read {bad:?}\n{USAGE}\ntargets: {}",
                names.join(", ")
            );
            return ExitCode::from(2);
        }
    }
    let started = Instant::now();
    let mut total = 0;
    for t in TARGETS
        .iter()
        .filter(|t| only.is_none_or(|o| o.name == t.name))
    {
        match driver::run(t, seed, inputs) {
            Ok(r) => {
                total += r.inputs;
                println!(
                    "{:<16} {:>9} inputs  accepted {:>9}  refused {:>9}  distinct answers {:>5}  slowest {:?}",
                    r.target, r.inputs, r.accepted, r.rejected, r.features, r.slowest
                );
            }
            Err(crash) => {
                eprintln!("{crash}\n(seed {seed})");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "{total} inputs, seed {seed}, no panic, no hang, every answer as documented ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    ExitCode::SUCCESS
}
