//! The storm and a dead dependency at fleet scale on turmoil, the real layers on every
//! host, set beside the simulator's figures for the same parameters.
//!
//! ```text
//! cargo run --release --example fleet_sim -- [--quick] [--seed N] [--clients N] [--json FILE]
//! ```
//!
//! `--help` describes every flag.
//!
//! 1. The storm: `--clients` client hosts (default 20) and 2 server hosts, real tonic in
//!    every one (`stormguard_demo::storm::fleet_sim`). Each server is the demo Inventory
//!    behind 8 workers × 10 ms, and for `server-only` and `stormguard` behind the
//!    `ShedLayer` with the storm's admission config; each client offers its share of 78 %
//!    of the capacity through its own retry policy over its own `Replicas` of the two
//!    servers. Service time × 2.5 from 5 s to 8 s.
//! 2. A dead dependency (the simulator's table 2): 50 client hosts × 10 calls/s against a
//!    server that answers every attempt `UNAVAILABLE`, 30 s measured, for each variant
//!    (`defaults`: `ClientConfig::default()` with the method marked idempotent).
//! 3. A dependency that refuses connections: the same 50 hosts against a host that
//!    listens on nothing; connection attempts counted by each client's connector.
//! 4. A blip: the same 50 hosts against a healthy server that answers `UNAVAILABLE` for
//!    one second; goodput by the second the calls arrived, the defaults beside the floor
//!    lent always.
//!
//! Then the simulator (`stormguard_sim`) runs the same parameters, and both are printed
//! side by side with the difference in points; wall time (of this build) and virtual time
//! of every run. `docs/simulator.md` ("On turmoil") explains the differences.

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use clap::builder::RangedU64ValueParser;
use serde::Serialize;
use stormguard_demo::storm::fleet_sim::{
    DeadDependencyConfig, DeadDependencyRun, DeadVariant, Network, fleet_storm_report, run_blip,
    run_dead_dependency, run_refusing_dependency, run_storm_policy,
};
use stormguard_demo::storm::{Policy, PolicyRun, PolicySummary, Second};
use stormguard_sim::{
    FleetVariant, Options, SimError, StormConfig, StormPolicy, fleet_scenario, run, storm_scenario,
};

/// The storm and a dead dependency at fleet scale on turmoil (real tonic and both layers
/// on every simulated host, in one thread on virtual time), beside the simulator's
/// figures for the same parameters.
#[derive(Debug, Parser)]
#[command(name = "fleet_sim")]
struct Args {
    /// Shorter runs: the storm 2 s before, 2 s of trigger, 4 s after; the dead dependency
    /// measured for 10 s after 5 s
    #[arg(long)]
    quick: bool,
    /// Seed of every run (turmoil's network, arrivals, every layer's RNG, the simulator)
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,
    /// Client hosts of the storm
    #[arg(long, value_name = "N", default_value_t = StormConfig::fleet().clients,
          value_parser = RangedU64ValueParser::<usize>::new().range(1..=500))]
    clients: usize,
    /// Also write the figures as JSON to FILE
    #[arg(long, value_name = "FILE")]
    json: Option<String>,
}

/// The storm's policies on turmoil and their simulator equivalents.
const POLICIES: [(Policy, StormPolicy); 4] = [
    (Policy::Naive, StormPolicy::Naive),
    (Policy::ClientOnly, StormPolicy::ClientOnly),
    (Policy::ServerOnly, StormPolicy::ServerOnly),
    (Policy::Stormguard, StormPolicy::Stormguard),
];

/// One policy of the storm, both ways.
#[derive(Debug, Serialize)]
struct StormRow {
    policy: &'static str,
    turmoil: PolicySummary,
    sim: PolicySummary,
    turmoil_wall_s: f64,
    turmoil_virtual_s: f64,
    sim_wall_s: f64,
}

/// One variant of the dead dependency, both ways.
#[derive(Debug, Serialize)]
struct DeadRow {
    variant: &'static str,
    clients: usize,
    turmoil_retries_per_second: f64,
    turmoil_amplification: f64,
    sim_retries_per_second: f64,
    sim_amplification: f64,
    turmoil_wall_s: f64,
    turmoil_virtual_s: f64,
    sim_wall_s: f64,
}

/// One variant against a dependency that refuses connections.
#[derive(Debug, Serialize)]
struct RefusedRow {
    variant: &'static str,
    clients: usize,
    /// Connection attempts per call after the first second.
    connections_per_call: f64,
    max_connections_per_host_second: u64,
    turmoil_wall_s: f64,
}

/// One variant through a blip: calls offered and succeeded by the second they arrived.
#[derive(Debug, Serialize)]
struct BlipRow {
    variant: &'static str,
    clients: usize,
    offered: Vec<u64>,
    goodput: Vec<u64>,
    turmoil_wall_s: f64,
}

#[derive(Debug, Serialize)]
struct Report {
    seed: u64,
    quick: bool,
    storm_clients: usize,
    storm_servers: usize,
    offered_per_second: f64,
    storm: Vec<StormRow>,
    dead_dependency: Vec<DeadRow>,
    refusing_dependency: Vec<RefusedRow>,
    blip: Vec<BlipRow>,
}

/// The simulator's run of `policy` as the storm's per-second timeline.
fn sim_run(
    policy: Policy,
    sim_policy: StormPolicy,
    storm: &StormConfig,
    network: &Network,
) -> Result<PolicyRun, SimError> {
    let stats = run(&storm_scenario(sim_policy, storm, network.latency))?;
    let timeline = stats
        .bins
        .iter()
        .take(storm.total_s() as usize)
        .enumerate()
        .map(|(t, b)| Second {
            t: t as u32,
            offered: b.calls,
            goodput: b.successes,
            attempts: b.attempts,
            shed: 0,
        })
        .collect();
    Ok(PolicyRun {
        policy,
        timeline,
        budget_refusals: None,
        connection_errors: 0,
        reject_cpu: Duration::ZERO,
        throttled: None,
        saturated_refusals: None,
        hedges: None,
    })
}

fn wall<T>(f: impl FnOnce() -> T) -> (T, f64) {
    // Wall time of this build, for the report only; nothing depends on it.
    let start = std::time::Instant::now();
    let out = f();
    (out, start.elapsed().as_secs_f64())
}

fn pct(x: f64) -> String {
    format!("{:.1}", x * 100.0)
}

fn points(a: f64, b: f64) -> String {
    format!("{:+.1}", (a - b) * 100.0)
}

fn recovery(s: Option<u32>) -> String {
    s.map_or_else(|| "never".to_owned(), |s| format!("{s} s"))
}

fn main() -> ExitCode {
    let args = Args::parse();
    match fleet_sim(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet_sim: {e}");
            ExitCode::FAILURE
        }
    }
}

fn fleet_sim(args: &Args) -> Result<(), String> {
    let mut storm = if args.quick {
        StormConfig::fleet_quick()
    } else {
        StormConfig::fleet()
    };
    let network = Network::default();
    storm.clients = args.clients;
    storm.seed = args.seed;
    let mut dead = if args.quick {
        DeadDependencyConfig::quick()
    } else {
        DeadDependencyConfig::standard()
    };
    dead.seed = args.seed;

    print_storm_header(&storm, &network);
    let storm_rows = storm_rows(&storm, &network)?;
    println!(
        "\nA dead dependency: {} client hosts × {} calls/s, every attempt UNAVAILABLE, {} s measured after {} s",
        dead.clients, dead.rate_per_client, dead.measured_s, dead.warmup_s
    );
    let options = Options {
        quick: args.quick,
        seed: args.seed,
    };
    let dead_rows = dead_rows(&dead, &options)?;
    let refused_rows = refused_rows(&dead)?;
    let blip_rows = blip_rows(&dead)?;
    if let Some(path) = &args.json {
        let report = Report {
            seed: args.seed,
            quick: args.quick,
            storm_clients: storm.clients,
            storm_servers: storm.servers,
            offered_per_second: storm.offered_per_second(),
            storm: storm_rows,
            dead_dependency: dead_rows,
            refusing_dependency: refused_rows,
            blip: blip_rows,
        };
        let json = serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(path, json).map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("figures written to {path}");
    }
    Ok(())
}

fn print_storm_header(storm: &StormConfig, network: &Network) {
    println!(
        "The storm on turmoil: {} client hosts, {} servers × {} workers × {:?} ({:.0} calls/s), \
         offered {:.0}/s ({:.0} %); service time ×{} from {} s to {} s; deadline {:?}, {:?} per attempt; \
         {:?} each way, {:?} tick",
        storm.clients,
        storm.servers,
        storm.workers,
        storm.service_time,
        storm.capacity(),
        storm.offered_per_second(),
        storm.load * 100.0,
        storm.slowdown,
        storm.warmup_s,
        storm.warmup_s + storm.trigger_s,
        storm.deadline,
        storm.per_attempt,
        network.latency,
        network.tick,
    );
}

/// Runs every policy of the storm on turmoil and in the simulator, prints them side by
/// side and second by second.
fn storm_rows(storm: &StormConfig, network: &Network) -> Result<Vec<StormRow>, String> {
    let mut turmoil_runs = Vec::new();
    let mut sim_runs = Vec::new();
    let mut times = Vec::new();
    for (policy, sim_policy) in POLICIES {
        let (result, turmoil_wall) = wall(|| run_storm_policy(policy, storm, network));
        let (run, virtual_time) = result.map_err(|e| format!("{}: {e}", policy.as_str()))?;
        let (sim, sim_wall) = wall(|| sim_run(policy, sim_policy, storm, network));
        let sim = sim.map_err(|e| format!("simulator: {e}"))?;
        eprintln!(
            "  {}: turmoil {turmoil_wall:.1} s of wall time for {:.1} s of virtual time; simulator {sim_wall:.2} s",
            policy.as_str(),
            virtual_time.as_secs_f64()
        );
        turmoil_runs.push(run);
        sim_runs.push(sim);
        times.push((turmoil_wall, virtual_time.as_secs_f64(), sim_wall));
    }
    let turmoil_report = fleet_storm_report(&turmoil_runs, storm);
    let sim_report = fleet_storm_report(&sim_runs, storm);
    println!(
        "\n| policy | goodput before: turmoil / sim (Δ) | during | after | attempts/call during | recovery | turmoil wall / virtual |"
    );
    println!("|---|---:|---:|---:|---:|---|---:|");
    let mut storm_rows = Vec::new();
    for ((t, s), (turmoil_wall_s, turmoil_virtual_s, sim_wall_s)) in turmoil_report
        .policies
        .iter()
        .zip(&sim_report.policies)
        .zip(times)
    {
        println!(
            "| {} | {} / {} ({}) | {} / {} ({}) | {} / {} ({}) | {:.2} / {:.2} | {} / {} | {:.1} s / {:.0} s |",
            t.name,
            pct(t.goodput_before),
            pct(s.goodput_before),
            points(t.goodput_before, s.goodput_before),
            pct(t.goodput_during),
            pct(s.goodput_during),
            points(t.goodput_during, s.goodput_during),
            pct(t.goodput_after),
            pct(s.goodput_after),
            points(t.goodput_after, s.goodput_after),
            t.amplification_during_trigger,
            s.amplification_during_trigger,
            recovery(t.recovery_s),
            recovery(s.recovery_s),
            turmoil_wall_s,
            turmoil_virtual_s,
        );
        storm_rows.push(StormRow {
            policy: t.name,
            turmoil: t.clone(),
            sim: s.clone(),
            turmoil_wall_s,
            turmoil_virtual_s,
            sim_wall_s,
        });
    }
    println!("\nturmoil, second by second (goodput % of offered):");
    print_series(&turmoil_report.policies);
    println!("simulator:");
    print_series(&sim_report.policies);
    Ok(storm_rows)
}

/// Goodput as a share of the offered calls, second by second, a line per policy.
fn print_series(policies: &[PolicySummary]) {
    for p in policies {
        let series: Vec<String> = p
            .timeline
            .iter()
            .map(|s| format!("{:.0}", 100.0 * s.goodput as f64 / s.offered.max(1) as f64))
            .collect();
        println!("  {:<12} {}", p.name, series.join(" "));
    }
}

/// Runs every variant of the dead dependency on turmoil and in the simulator, and prints
/// them side by side.
fn dead_rows(dead: &DeadDependencyConfig, options: &Options) -> Result<Vec<DeadRow>, String> {
    println!(
        "| variant | retries/s: turmoil / sim | attempts per call: turmoil / sim | turmoil wall / virtual |"
    );
    println!("|---|---:|---:|---:|");
    let mut dead_rows = Vec::new();
    for (variant, sim_variant) in DeadVariant::ALL.into_iter().zip(FleetVariant::ALL) {
        let (result, turmoil_wall_s) = wall(|| run_dead_dependency(variant, dead));
        let t: DeadDependencyRun = result.map_err(|e| format!("{}: {e}", variant.as_str()))?;
        let (stats, sim_wall_s) = wall(|| run(&fleet_scenario(dead.clients, sim_variant, options)));
        let s = stats.map_err(|e| format!("simulator: {e}"))?;
        println!(
            "| {} | {:.1} / {:.1} | {:.3} / {:.3} | {:.1} s / {:.0} s |",
            variant.as_str(),
            t.retries_per_second,
            s.retries_per_second(),
            t.amplification,
            s.amplification(),
            turmoil_wall_s,
            t.virtual_time.as_secs_f64(),
        );
        dead_rows.push(DeadRow {
            variant: variant.as_str(),
            clients: dead.clients,
            turmoil_retries_per_second: t.retries_per_second,
            turmoil_amplification: t.amplification,
            sim_retries_per_second: s.retries_per_second(),
            sim_amplification: s.amplification(),
            turmoil_wall_s,
            turmoil_virtual_s: t.virtual_time.as_secs_f64(),
            sim_wall_s,
        });
    }
    Ok(dead_rows)
}

/// The naive loop and the defaults against a dependency that refuses connections.
fn refused_rows(dead: &DeadDependencyConfig) -> Result<Vec<RefusedRow>, String> {
    println!(
        "\nA dependency that refuses connections: {} client hosts × {} calls/s for {} s",
        dead.clients,
        dead.rate_per_client,
        dead.warmup_s + dead.measured_s
    );
    println!(
        "| variant | connection attempts per call after 1 s | most per host and second | turmoil wall |"
    );
    println!("|---|---:|---:|---:|");
    let mut rows = Vec::new();
    for variant in [DeadVariant::ThreeAttempts, DeadVariant::Defaults] {
        let (result, turmoil_wall_s) = wall(|| run_refusing_dependency(variant, dead));
        let r = result.map_err(|e| format!("{}: {e}", variant.as_str()))?;
        println!(
            "| {} | {:.3} | {} | {turmoil_wall_s:.1} s |",
            variant.as_str(),
            r.connections_per_call,
            r.max_connections_per_host_second
        );
        rows.push(RefusedRow {
            variant: variant.as_str(),
            clients: dead.clients,
            connections_per_call: r.connections_per_call,
            max_connections_per_host_second: r.max_connections_per_host_second,
            turmoil_wall_s,
        });
    }
    Ok(rows)
}

/// The defaults and the floor lent always through a one-second blip.
fn blip_rows(dead: &DeadDependencyConfig) -> Result<Vec<BlipRow>, String> {
    let blip = DeadDependencyConfig {
        warmup_s: 3,
        measured_s: 3,
        ..dead.clone()
    };
    println!(
        "\nA blip: {} client hosts × {} calls/s; every answer UNAVAILABLE from {} s to {} s \
         (goodput % of the calls that arrived in each second)",
        blip.clients,
        blip.rate_per_client,
        blip.warmup_s,
        blip.warmup_s + 1
    );
    let mut rows = Vec::new();
    for variant in [DeadVariant::PerProcessFloor, DeadVariant::Defaults] {
        let (result, turmoil_wall_s) = wall(|| run_blip(variant, &blip));
        let timeline = result.map_err(|e| format!("{}: {e}", variant.as_str()))?;
        let series: Vec<String> = timeline
            .iter()
            .map(|s| format!("{:.1}", 100.0 * s.goodput as f64 / s.offered.max(1) as f64))
            .collect();
        println!("  {:<18} {}", variant.as_str(), series.join(" "));
        rows.push(BlipRow {
            variant: variant.as_str(),
            clients: blip.clients,
            offered: timeline.iter().map(|s| s.offered).collect(),
            goodput: timeline.iter().map(|s| s.goodput).collect(),
            turmoil_wall_s,
        });
    }
    Ok(rows)
}
