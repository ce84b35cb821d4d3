//! Replicas as real processes: one bad replica of N behind a client-side balancer, and
//! what three retry policies do with it.
//!
//! ```text
//! cargo run --release --example fleet -- [--quick] [--replicas N] [--scenarios LIST]
//!     [--policies LIST] [--seed N] [--json FILE] [--svg FILE] [--load SHARE]
//!     [--deadline-ms MS] [--discovery list|dns] [--metrics-addr ADDR]
//! ```
//!
//! `--discovery dns` (see `fleet/dns.rs`) finds the replicas through a DNS server on
//! loopback whose records change (scale up and down, a rolling deploy to new addresses, a
//! killed pod whose record stays, the DNS server down), each replica on its own loopback
//! address, through the `stormguard` policy over `Replicas::from_dns`.
//!
//! `--help` describes every flag.
//!
//! Each replica is this example run again as a child process (`--replica`, hidden): a tonic
//! Inventory server behind the `ShedLayer`, 4 workers × 2 ms (see `fleet/replica.rs`). The
//! client is this process: an open-loop fleet at half the replicas' capacity, every call
//! with a 200 ms deadline and 50 ms per attempt, through one of the policies. Each
//! scenario runs once per policy, each run with fresh replica processes, on the same
//! timeline: healthy, then the fault. Then a table, the JSON (`--json`) and `fleet.svg`.
//! `docs/examples.md` ("The fleet") describes the figures and how they are measured.

use std::error::Error;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use clap::builder::RangedU64ValueParser;
use indicatif::ProgressBar;

#[path = "support/chart.rs"]
mod chart;
#[path = "support/cli.rs"]
mod cli;
#[path = "fleet/dns.rs"]
mod dns;
#[path = "support/meters.rs"]
mod meters;
#[path = "support/otel.rs"]
mod otel;
#[path = "fleet/peers.rs"]
mod peers;
#[path = "fleet/process.rs"]
mod process;
#[path = "fleet/replica.rs"]
mod replica;
#[path = "fleet/report.rs"]
mod report;
#[path = "fleet/run.rs"]
mod run;
#[path = "fleet/svg.rs"]
mod svg;

use report::{FleetReport, ScenarioReport};
use run::{BAD, BUCKET, Policy, RunConfig, Scenario, Timing};

/// Replicas as real processes: one bad replica of N behind a client-side balancer, and
/// what three retry policies do with it.
///
/// N replicas, each its own process (a tonic server behind the ShedLayer, 4 workers x
/// 2 ms), an open-loop client at half their capacity; each scenario runs once per policy
/// on the same timeline, 2 s healthy, then the fault. Prints a table and draws the
/// picture. The seed also picks the replicas' pushback. --quick: 1 s healthy, 4 s of fault
/// per run (about a minute and a quarter in all). The JSON holds per scenario and policy
/// the figures and the timeline in 100 ms buckets.
#[derive(Debug, Parser)]
#[command(name = "fleet")]
struct Args {
    #[command(flatten)]
    run: cli::RunArgs,
    /// Replicas, each its own process
    #[arg(long, value_name = "N", default_value_t = 5,
          value_parser = RangedU64ValueParser::<usize>::new().range(2..=32))]
    replicas: usize,
    /// The scenarios to run, comma-separated, in the table's order [default: all of the
    /// discovery's]: fail-fast, slow, killed, restart, rolling; with --discovery dns:
    /// scale-up, scale-down, rolling-new-addresses, killed-record-stays, dns-down, not-serving
    #[arg(long, value_name = "LIST", value_parser = scenario_name, value_delimiter = ',')]
    scenarios: Vec<ScenarioName>,
    /// How the client finds the replicas: a list of their addresses, or a DNS name whose
    /// records change during the run (each replica on its own loopback address)
    #[arg(long, value_enum, default_value_t = Discovery::List)]
    discovery: Discovery,
    /// With --discovery dns: the client without its health checks (they are on by
    /// default: the not-serving scenario's comparison)
    #[arg(long = "no-health-checks")]
    no_health_checks: bool,
    /// The policies to run, comma-separated, in the table's order [default: naive, layer,
    /// stormguard; the peers' tower-p2c and resilience on request]
    #[arg(long, value_name = "LIST", value_enum, value_delimiter = ',')]
    policies: Vec<Policy>,
    /// Offered load as a share of the fleet's capacity
    #[arg(long, value_name = "SHARE", value_parser = cli::positive, default_value_t = 0.5)]
    load: f64,
    /// Deadline of each logical call, in milliseconds
    #[arg(long = "deadline-ms", value_name = "MS", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..))]
    deadline_ms: u64,
    /// Serve the client's metrics to Prometheus at http://ADDR/metrics: each run's
    /// `RetryLayer` named `SCENARIO.POLICY`, and its `Replicas` by replica (with
    /// --discovery dns, also their resolutions) (needs `--features otel-examples`)
    #[arg(long = "metrics-addr", value_name = "ADDR")]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Run as one replica (the parent starts its children so)
    #[arg(long, hide = true)]
    replica: bool,
    /// The replica's port (0: any free one)
    #[arg(long, hide = true, default_value_t = 0)]
    port: u16,
    /// The replica's address
    #[arg(long, hide = true, default_value = "127.0.0.1")]
    ip: std::net::IpAddr,
    /// The replica starts cold for this long
    #[arg(long = "cold-ms", hide = true, default_value_t = 0)]
    cold_ms: u64,
}

/// `--discovery`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Discovery {
    /// The replicas' addresses, given once
    List,
    /// A DNS name on a DNS server on loopback whose records change
    Dns,
}

/// A scenario of either discovery.
#[derive(Clone, Copy, Debug)]
enum ScenarioName {
    List(Scenario),
    Dns(dns::DnsScenario),
}

fn scenario_name(name: &str) -> Result<ScenarioName, String> {
    use clap::ValueEnum;
    Scenario::from_str(name, false)
        .map(ScenarioName::List)
        .or_else(|_| dns::DnsScenario::from_str(name, false).map(ScenarioName::Dns))
        .map_err(|_| format!("no scenario {name:?}"))
}

/// `--discovery dns`: each scenario through the `stormguard` policy over `Replicas::from_dns`.
async fn dns_fleet(args: &Args, meters: &meters::Meters) -> Result<(), Box<dyn Error>> {
    let scenarios = chosen_scenarios(args, &dns::DnsScenario::ALL, |s| match s {
        ScenarioName::Dns(s) => Ok(s),
        ScenarioName::List(s) => Err(format!(
            "--scenarios {}: not a scenario of --discovery dns",
            s.as_str()
        )),
    })?;
    if args.policies.iter().any(|p| *p != Policy::Stormguard) {
        return Err("--discovery dns runs the stormguard policy only".into());
    }
    let timing = timing(args);
    // The rate of a five-replica fleet at --load: every scenario has three at least.
    let rate = args.load * capacity(3).await;
    let config = RunConfig {
        replicas: 5,
        rate,
        deadline: Duration::from_millis(args.deadline_ms),
        per_attempt: PER_ATTEMPT,
        seed: args.run.seed,
        timing,
    };
    eprintln!(
        "--discovery dns: offering {rate:.0} calls/s; change at {:?}, runs of {:?}",
        timing.fault, timing.total
    );
    let mut report = dns::DnsReport {
        discovery: "dns",
        scenarios: Vec::new(),
        rate: rate.round(),
        deadline_ms: args.deadline_ms,
        fault_s: timing.fault.as_secs_f64(),
        seed: args.run.seed,
    };
    for scenario in scenarios {
        let (policy, resolutions, dns_failures) =
            dns::run(scenario, &config, (!args.no_health_checks, meters), &|_| {})
                .await
                .map_err(|e| format!("{}: {e}", scenario.as_str()))?;
        report.scenarios.push(dns::DnsScenarioReport {
            name: scenario.as_str(),
            resolutions,
            dns_failures,
            policies: vec![policy],
        });
    }
    print!("{}", dns::table(&report));
    if let Some(path) = &args.run.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)
            .map_err(|e| format!("cannot write {path}: {e}"))?;
        println!("result written to {path}");
    }
    Ok(())
}

/// The longest one attempt may take.
const PER_ATTEMPT: Duration = Duration::from_millis(50);

fn main() -> ExitCode {
    let args = Args::parse();
    if args.replica {
        return replica::main(
            args.ip,
            args.port,
            args.run.seed,
            Duration::from_millis(args.cold_ms),
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build();
    let result = match runtime {
        Ok(runtime) => runtime.block_on(exported(&args)),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("fleet: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The fleet's capacity in calls per second: every replica's workers, each busy for one
/// service time per call as the timer really sleeps it (a 2 ms sleep takes longer: the
/// timer has a 1 ms granularity), measured here.
async fn capacity(replicas: usize) -> f64 {
    let rounds = 50;
    let started = tokio::time::Instant::now();
    for _ in 0..rounds {
        tokio::time::sleep(replica::SERVICE_TIME).await;
    }
    let service = started.elapsed().as_secs_f64() / f64::from(rounds);
    (replicas * replica::WORKERS) as f64 / service
}

/// The fleet of `--discovery`, its layers' metrics served at `--metrics-addr` while it runs.
async fn exported(args: &Args) -> Result<(), Box<dyn Error>> {
    let export = otel::Export::start(otel::Sinks {
        stdout: None,
        metrics_addr: args.metrics_addr,
    })
    .await?;
    let meters = meters::Meters::of(export.as_ref());
    let result = match args.discovery {
        Discovery::Dns => dns_fleet(args, &meters).await,
        Discovery::List => fleet(args, &meters).await,
    };
    if let Some(export) = export {
        export.finish();
    }
    result
}

async fn fleet(args: &Args, meters: &meters::Meters) -> Result<(), Box<dyn Error>> {
    let timing = timing(args);
    let scenarios = chosen_scenarios(args, &Scenario::ALL, |s| match s {
        ScenarioName::List(s) => Ok(s),
        ScenarioName::Dns(s) => Err(format!(
            "--scenarios {}: a scenario of --discovery dns",
            s.as_str()
        )),
    })?;
    let capacity = capacity(args.replicas).await;
    let config = RunConfig {
        replicas: args.replicas,
        rate: args.load * capacity,
        deadline: Duration::from_millis(args.deadline_ms),
        per_attempt: PER_ATTEMPT,
        seed: args.run.seed,
        timing,
    };
    eprintln!(
        "{} replicas x {} workers x {:?}: capacity ~{capacity:.0} calls/s; offering {:.0}/s; \
         deadline {:?}, {PER_ATTEMPT:?} per attempt; fault at {:?}, runs of {:?}",
        args.replicas,
        replica::WORKERS,
        replica::SERVICE_TIME,
        config.rate,
        config.deadline,
        timing.fault,
        timing.total,
    );
    let (_bars, scenario_bars) = cli::progress_bars(scenarios.iter().map(|s| s.as_str()), 10)?;
    let mut report = FleetReport {
        replicas: args.replicas,
        scenarios: Vec::new(),
        rate: config.rate.round(),
        capacity: capacity.round(),
        deadline_ms: args.deadline_ms,
        per_attempt_ms: PER_ATTEMPT.as_millis() as u64,
        bucket_s: BUCKET.as_secs_f64(),
        seed: args.run.seed,
    };
    for (&scenario, bar) in scenarios.iter().zip(&scenario_bars) {
        let report_of = run_scenario(args, scenario, &config, meters, bar).await?;
        report.scenarios.push(report_of);
    }
    print!("{}", report::table(&report));
    args.run.write_report("fleet", &report, svg::draw)
}

/// The timing of the runs: `--quick` or the standard one.
fn timing(args: &Args) -> Timing {
    if args.run.quick {
        Timing::quick()
    } else {
        Timing::standard()
    }
}

/// The scenarios of `--scenarios` (none: `all`), each taken by `of`, which names the
/// error of a scenario of the other discovery.
fn chosen_scenarios<T: Copy>(
    args: &Args,
    all: &[T],
    of: impl Fn(ScenarioName) -> Result<T, String>,
) -> Result<Vec<T>, String> {
    if args.scenarios.is_empty() {
        return Ok(all.to_vec());
    }
    args.scenarios.iter().map(|s| of(*s)).collect()
}

/// Runs every policy of `--policies` (none: all) through `scenario`, its progress on `bar`.
async fn run_scenario(
    args: &Args,
    scenario: Scenario,
    config: &RunConfig,
    meters: &meters::Meters,
    bar: &ProgressBar,
) -> Result<ScenarioReport, Box<dyn Error>> {
    let policies = if args.policies.is_empty() {
        &Policy::DEFAULT[..]
    } else {
        &args.policies
    };
    let mut runs = Vec::new();
    for (i, &policy) in policies.iter().enumerate() {
        bar.set_message(policy.as_str());
        let progress = |done: f64| {
            let overall = (i as f64 + done) / policies.len() as f64;
            bar.set_position((overall * 1000.0) as u64);
        };
        let data = run::run((scenario, policy), config, meters, &progress)
            .await
            .map_err(|e| format!("{} / {}: {e}", scenario.as_str(), policy.as_str()))?;
        runs.push(report::summarize(
            policy.as_str(),
            scenario,
            &config.timing,
            args.replicas,
            &data,
        ));
    }
    bar.finish_with_message("done");
    Ok(ScenarioReport {
        name: scenario.as_str(),
        policies: runs,
        fault_s: config.timing.fault.as_secs_f64(),
        bad_replica: (scenario != Scenario::Rolling).then_some(BAD),
    })
}
