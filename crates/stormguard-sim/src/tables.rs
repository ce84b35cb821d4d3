//! The six experiments, each a table of rows, printable and serializable.
//!
//! Every row is one or more seeded runs of [`crate::run`]; the figures are
//! reproducible bit for bit for a seed. [`Options::quick`] shortens the runs (and trims
//! the largest fleets) so that the tests can check the shape of every table in a few
//! seconds of a debug build.

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use stormguard_core::A6BudgetConfig;
use stormguard_core::BackoffConfig;
use stormguard_core::BreakerConfig;
use stormguard_core::BudgetConfig;
use stormguard_core::Floor;
use stormguard_core::RetryPolicy;
use stormguard_core::{AdmissionConfig, QueueOrder, WorkerLimit};
use stormguard_core::{Code, CodeSet};
use stormguard_core::{HedgeDelay, HedgingPolicy};

use crate::SimError;
use crate::event_loop::run;
use crate::scenario::{
    BudgetKind, ClientPolicy, QueueServer, Scenario, ServerKind, Shard, Tier, Window, mix,
};
use crate::stats::{RunStats, ratio};
use crate::text_table::{Column, TextTable, fixed, percent, seconds_or_never};

/// How long and how large the runs are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Short runs and smaller fleets (for tests): the same shapes, noisier figures.
    pub quick: bool,
    /// Seed of every run (each row derives its own from it).
    pub seed: u64,
}

impl Default for Options {
    /// Full runs, seed 1.
    fn default() -> Self {
        Options {
            quick: false,
            seed: 1,
        }
    }
}

/// The client policies compared.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    /// One attempt per call.
    NoRetries,
    /// Up to 3 attempts, every retry granted.
    ThreeAttempts,
    /// Up to 3 attempts, gRPC A6 `retryThrottling` (maxTokens 10, tokenRatio 0.1).
    A6Throttle,
    /// Up to 3 attempts, stormguard's retry budget with its defaults.
    Stormguard,
}

impl PolicyName {
    /// All of them, in table order.
    pub const ALL: [PolicyName; 4] = [
        PolicyName::NoRetries,
        PolicyName::ThreeAttempts,
        PolicyName::A6Throttle,
        PolicyName::Stormguard,
    ];

    /// The name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            PolicyName::NoRetries => "no-retries",
            PolicyName::ThreeAttempts => "three-attempts",
            PolicyName::A6Throttle => "a6-throttle",
            PolicyName::Stormguard => "stormguard",
        }
    }
}

/// The retry policy every retrying client uses: 3 attempts of an idempotent method,
/// `UNAVAILABLE` retried, and `per_attempt_timeout` (a timed-out attempt is retried
/// whatever the codes).
fn three_attempts(backoff: BackoffConfig, per_attempt_timeout: Option<Duration>) -> RetryPolicy {
    RetryPolicy {
        max_attempts: 3,
        retryable_codes: CodeSet::single(Code::Unavailable),
        backoff,
        idempotent: true,
        per_attempt_timeout,
        ..RetryPolicy::default()
    }
}

/// The backoff of a standard gRPC client: A6 with `initial`, no growth.
pub(crate) fn a6_backoff(initial: Duration) -> BackoffConfig {
    BackoffConfig::A6 {
        initial,
        max: initial,
        multiplier: 1.0,
    }
}

/// A6 `retryThrottling` with gRPC C-core's commonly used values (10 tokens, ratio 0.1).
pub fn a6_throttle_config() -> A6BudgetConfig {
    A6BudgetConfig {
        max_tokens: 10.0,
        token_ratio: 0.1,
    }
}

/// The client policy `name`, with `deadline`, `attempt_timeout`, and the backoff of the
/// standard clients (`std_backoff`). stormguard keeps its own default backoff (full
/// jitter). The attempt timeout is the retry policy's; a client that never retries has
/// no policy, so its one attempt gets it from the layer's own setting instead.
pub(crate) fn client(
    name: PolicyName,
    deadline: Duration,
    attempt_timeout: Option<Duration>,
    std_backoff: BackoffConfig,
) -> ClientPolicy {
    let (retry, budget) = match name {
        PolicyName::NoRetries => (None, BudgetKind::Unlimited),
        PolicyName::ThreeAttempts => (
            Some(three_attempts(std_backoff, attempt_timeout)),
            BudgetKind::Unlimited,
        ),
        PolicyName::A6Throttle => (
            Some(three_attempts(std_backoff, attempt_timeout)),
            BudgetKind::Throttle(a6_throttle_config()),
        ),
        PolicyName::Stormguard => (
            Some(three_attempts(BackoffConfig::default(), attempt_timeout)),
            BudgetKind::Budget(BudgetConfig::default()),
        ),
    };
    let layer_per_attempt_timeout = if retry.is_none() {
        attempt_timeout
    } else {
        None
    };
    ClientPolicy {
        name: name.as_str().to_owned(),
        retry,
        hedging: None,
        budget,
        breaker: None,
        layer_per_attempt_timeout,
        deadline: Some(deadline),
        budget_per_shard: false,
        pushback_on_give_up: name == PolicyName::Stormguard,
    }
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

// ---------------------------------------------------------------------------------------
// Table 1

/// One row of table 1.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AmplificationRow {
    /// The client policy.
    pub policy: PolicyName,
    /// Probability that an attempt fails `UNAVAILABLE`.
    pub failure_rate: f64,
    /// Attempts per logical call.
    pub amplification: f64,
    /// Fraction of logical calls that succeeded.
    pub success: f64,
}

/// Failure rates of table 1.
pub const FAILURE_RATES: [f64; 12] = [0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];

/// The scenario of table 1: 10 client processes × 100 calls/s against a server of
/// unlimited capacity (2 ms round trip) whose attempts fail at random with `failure_rate`;
/// 1 s deadline; measured after a 10 s warm-up (2 s quick).
pub fn amplification_scenario(
    policy: PolicyName,
    failure_rate: f64,
    options: &Options,
) -> Scenario {
    let (duration, warmup) = if options.quick {
        (12.0, 2.0)
    } else {
        (70.0, 10.0)
    };
    Scenario {
        clients: 10,
        rate_per_client: 100.0,
        duration: secs(duration),
        measure_from: secs(warmup),
        bin: secs(1.0),
        network: ms(1),
        tiers: vec![],
        shards: vec![Shard {
            server: ServerKind::Unbounded { latency: ms(2) },
            failure_rate,
            outage: None,
        }],
        policy: client(policy, secs(1.0), None, a6_backoff(ms(20))),
        seed: mix(options.seed, (failure_rate * 1000.0) as u64),
    }
}

/// Table 1: amplification and success against the failure rate, per policy.
pub fn amplification(options: &Options) -> Result<Vec<AmplificationRow>, SimError> {
    let mut rows = Vec::new();
    for policy in PolicyName::ALL {
        for failure_rate in FAILURE_RATES {
            let stats = run(&amplification_scenario(policy, failure_rate, options))?;
            rows.push(AmplificationRow {
                policy,
                failure_rate,
                amplification: stats.amplification(),
                success: stats.success_rate(),
            });
        }
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------
// Table 2

/// The variants of table 2.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FleetVariant {
    /// 3 attempts, every retry granted (the reference).
    ThreeAttempts,
    /// stormguard's budget with its default floor, per process (5 retries/s each).
    PerProcessFloor,
    /// The same budget with the floor divided by the fleet size.
    FleetAwareFloor,
    /// The per-process floor plus stormguard's default circuit breaker.
    PerProcessFloorWithBreaker,
    /// stormguard's defaults: the per-process floor lent only while the dependency answers
    /// ([`Floor::WhileAnswering`](stormguard_core::Floor::WhileAnswering)), no fleet size,
    /// no breaker.
    Defaults,
}

impl FleetVariant {
    /// All variants, in table order.
    pub const ALL: [FleetVariant; 5] = [
        FleetVariant::ThreeAttempts,
        FleetVariant::PerProcessFloor,
        FleetVariant::FleetAwareFloor,
        FleetVariant::PerProcessFloorWithBreaker,
        FleetVariant::Defaults,
    ];

    /// The name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            FleetVariant::ThreeAttempts => "three-attempts",
            FleetVariant::PerProcessFloor => "per-process-floor",
            FleetVariant::FleetAwareFloor => "fleet-aware-floor",
            FleetVariant::PerProcessFloorWithBreaker => "per-process-floor+breaker",
            FleetVariant::Defaults => "defaults",
        }
    }
}

/// One row of table 2.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct FleetRow {
    /// Client processes.
    pub fleet_size: usize,
    /// The variant.
    pub variant: FleetVariant,
    /// Logical calls per second offered by the whole fleet.
    pub calls_per_second: f64,
    /// Retries per second reaching the dead dependency (mean over the measured window).
    pub retries_per_second: f64,
    /// Attempts per second reaching it (first attempts and retries).
    pub attempts_per_second: f64,
    /// The largest attempts per second over any 100 ms bin of the measured window: how
    /// synchronised the fleet's attempts are (breaker probes, reserve refills).
    pub peak_attempts_per_second: f64,
    /// Attempts per logical call.
    pub amplification: f64,
    /// What the variant costs when the dependency is healthy but flaky: the success rate
    /// of the same fleet when 5 % of attempts fail instead of all of them.
    pub success_at_5_percent: f64,
}

/// Fleet sizes of table 2 (quick: the first three).
pub const FLEET_SIZES: [usize; 5] = [1, 10, 100, 500, 1000];

/// The scenario of table 2: `fleet_size` processes × 10 calls/s against a dead dependency
/// (every attempt fails `UNAVAILABLE` after 1 ms, as a refused connection does);
/// 1 s deadline; measured from 10 s to 40 s (5 s to 15 s quick).
pub fn fleet_scenario(fleet_size: usize, variant: FleetVariant, options: &Options) -> Scenario {
    let (duration, warmup) = if options.quick {
        (15.0, 5.0)
    } else {
        (40.0, 10.0)
    };
    let name = match variant {
        FleetVariant::ThreeAttempts => PolicyName::ThreeAttempts,
        _ => PolicyName::Stormguard,
    };
    let mut policy = client(name, secs(1.0), None, a6_backoff(ms(20)));
    policy.name = variant.as_str().to_owned();
    // The floor variants lend their floor always, as the budgets the table compares do.
    let always = BudgetConfig {
        floor: Floor::Always,
        ..BudgetConfig::default()
    };
    match variant {
        FleetVariant::ThreeAttempts | FleetVariant::Defaults => {}
        FleetVariant::FleetAwareFloor => {
            policy.budget = BudgetKind::FleetBudget {
                config: always,
                fleet_size: u32::try_from(fleet_size).unwrap_or(u32::MAX),
            };
        }
        FleetVariant::PerProcessFloor | FleetVariant::PerProcessFloorWithBreaker => {
            policy.budget = BudgetKind::Budget(always);
        }
    }
    if variant == FleetVariant::PerProcessFloorWithBreaker {
        policy.breaker = Some(BreakerConfig::default());
    }
    Scenario {
        clients: fleet_size,
        rate_per_client: 10.0,
        duration: secs(duration),
        measure_from: secs(warmup),
        bin: ms(100),
        network: ms(1),
        tiers: vec![],
        shards: vec![Shard {
            server: ServerKind::Unbounded { latency: ms(1) },
            failure_rate: 1.0,
            outage: None,
        }],
        policy,
        seed: mix(options.seed, 2_000 + fleet_size as u64),
    }
}

/// The largest per-second rate of `attempts` over the bins from `from_bin` on.
fn peak_rate(stats: &RunStats, from_bin: usize) -> f64 {
    let peak = stats
        .bins
        .iter()
        .skip(from_bin)
        .map(|b| b.attempts)
        .max()
        .unwrap_or(0);
    peak as f64 / stats.bin_seconds
}

/// Table 2: retries per second reaching a dead dependency, by fleet size.
pub fn fleet_floor(options: &Options) -> Result<Vec<FleetRow>, SimError> {
    let sizes: &[usize] = if options.quick {
        &FLEET_SIZES[..3]
    } else {
        &FLEET_SIZES
    };
    let mut rows = Vec::new();
    for &fleet_size in sizes {
        for variant in FleetVariant::ALL {
            let scenario = fleet_scenario(fleet_size, variant, options);
            let from_bin = (scenario.measure_from.as_nanos() / scenario.bin.as_nanos()) as usize;
            let stats = run(&scenario)?;
            let flaky = run(&Scenario {
                shards: vec![Shard {
                    failure_rate: 0.05,
                    ..scenario.shards[0].clone()
                }],
                ..scenario.clone()
            })?;
            rows.push(FleetRow {
                fleet_size,
                variant,
                calls_per_second: ratio(stats.calls, 1) / stats.measured_seconds,
                retries_per_second: stats.retries_per_second(),
                attempts_per_second: stats.attempts_per_second(),
                peak_attempts_per_second: peak_rate(&stats, from_bin),
                amplification: stats.amplification(),
                success_at_5_percent: flaky.success_rate(),
            });
        }
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------
// Table 3

/// The variants of table 3: a client policy and a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RecoveryVariant {
    /// One attempt, plain FIFO server.
    NoRetries,
    /// 3 attempts, every retry granted, plain FIFO server.
    ThreeAttempts,
    /// 3 attempts, A6 throttle, plain FIFO server.
    A6Throttle,
    /// 3 attempts, stormguard budget, plain FIFO server.
    Stormguard,
    /// 3 attempts, stormguard budget, stormguard admission (shedding) server.
    StormguardShedding,
    /// As `StormguardShedding`, plus stormguard's default circuit breaker in each client.
    StormguardSheddingBreaker,
    /// As `StormguardShedding`, with the queue served oldest first instead of the default
    /// adaptive LIFO.
    StormguardSheddingFifo,
}

impl RecoveryVariant {
    /// All variants, in table order.
    pub const ALL: [RecoveryVariant; 7] = [
        RecoveryVariant::NoRetries,
        RecoveryVariant::ThreeAttempts,
        RecoveryVariant::A6Throttle,
        RecoveryVariant::Stormguard,
        RecoveryVariant::StormguardShedding,
        RecoveryVariant::StormguardSheddingBreaker,
        RecoveryVariant::StormguardSheddingFifo,
    ];

    /// The name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            RecoveryVariant::NoRetries => "no-retries",
            RecoveryVariant::ThreeAttempts => "three-attempts",
            RecoveryVariant::A6Throttle => "a6-throttle",
            RecoveryVariant::Stormguard => "stormguard",
            RecoveryVariant::StormguardShedding => "stormguard+shedding",
            RecoveryVariant::StormguardSheddingBreaker => "stormguard+shedding+breaker",
            RecoveryVariant::StormguardSheddingFifo => "stormguard+shedding, FIFO",
        }
    }

    fn policy(self) -> PolicyName {
        match self {
            RecoveryVariant::NoRetries => PolicyName::NoRetries,
            RecoveryVariant::ThreeAttempts => PolicyName::ThreeAttempts,
            RecoveryVariant::A6Throttle => PolicyName::A6Throttle,
            _ => PolicyName::Stormguard,
        }
    }
}

/// One row of table 3.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RecoveryRow {
    /// Client policy and server.
    pub variant: RecoveryVariant,
    /// Client processes.
    pub clients: usize,
    /// Whether the success rate came back (see `time_to_recover_s`) before the run ended.
    pub recovered: bool,
    /// Seconds from the end of the capacity drop to the start of the first 1 s bin from
    /// which every bin's success rate is at least 95 %; `None` if that never happened.
    pub time_to_recover_s: Option<f64>,
    /// Success rate of the calls arriving from the start of the drop to the end.
    pub success_after_trigger: f64,
    /// Attempts per logical call over the same calls.
    pub amplification_after_trigger: f64,
    /// Success rate per 1 s bin, the whole run (the shape of the recovery).
    pub success_by_second: Vec<f64>,
}

/// The capacity drop of table 3, as in the storm measured on tonic: service time × 2.5 for 3 s, after a
/// 5 s warm-up.
pub const TRIGGER: Window = Window {
    from: Duration::from_secs(5),
    until: Duration::from_secs(8),
};

/// The scenario of table 3: the server of the storm measured on tonic (8 workers × 11.1 ms, ~720/s) scaled
/// by 10 (80 workers, ~7,200/s) and offered 75 % of it (5,400 calls/s) by 100 client
/// processes, 100× that storm's single client; 50 ms per-attempt timeout (the
/// retry policy's, so a timed-out attempt is retried with only `UNAVAILABLE` in the
/// retryable codes; the layer's own for the client that never retries), 200 ms deadline,
/// 0.5 ms each way. Quick: the unscaled server, 10 clients.
pub fn recovery_scenario(variant: RecoveryVariant, options: &Options) -> Scenario {
    let (scale, clients, duration) = if options.quick {
        (1, 10, 20.0)
    } else {
        (10, 100, 30.0)
    };
    let workers = 8 * scale;
    let offered = 540.0 * scale as f64;
    let shedding = matches!(
        variant,
        RecoveryVariant::StormguardShedding
            | RecoveryVariant::StormguardSheddingBreaker
            | RecoveryVariant::StormguardSheddingFifo
    );
    let mut policy = client(variant.policy(), ms(200), Some(ms(50)), a6_backoff(ms(10)));
    policy.name = variant.as_str().to_owned();
    if variant == RecoveryVariant::StormguardSheddingBreaker {
        policy.breaker = Some(BreakerConfig::default());
    }
    let server = QueueServer {
        workers,
        service_time: Duration::from_micros(11_100),
        queue_capacity: 10_000,
        slowdown: Some((TRIGGER, 2.5)),
        drops_abandoned: false,
        // The admission defaults (retries shed from 8 queued, adaptive LIFO from 8 queued,
        // pushback at most 1 s) with a queue of 2 × workers: 55 ms of work at the
        // degraded rate, more than the 50 ms deadline.
        shedding: shedding.then(|| AdmissionConfig {
            workers: WorkerLimit::Fixed(workers),
            queue_capacity: 2 * workers,
            queue_order: if variant == RecoveryVariant::StormguardSheddingFifo {
                QueueOrder::Fifo
            } else {
                AdmissionConfig::default().queue_order
            },
            ..AdmissionConfig::default()
        }),
    };
    Scenario {
        clients,
        rate_per_client: offered / clients as f64,
        duration: secs(duration),
        measure_from: TRIGGER.from,
        bin: secs(1.0),
        network: Duration::from_micros(500),
        tiers: vec![],
        shards: vec![Shard {
            server: ServerKind::Queue(server),
            failure_rate: 0.0,
            outage: None,
        }],
        policy,
        seed: mix(options.seed, 3_000),
    }
}

/// Table 3: time to recover from a capacity drop, per policy and server.
pub fn recovery(options: &Options) -> Result<Vec<RecoveryRow>, SimError> {
    let mut rows = Vec::new();
    for variant in RecoveryVariant::ALL {
        let scenario = recovery_scenario(variant, options);
        let stats = run(&scenario)?;
        let (time_to_recover_s, success_by_second) = recovery_of(&stats);
        rows.push(RecoveryRow {
            variant,
            clients: scenario.clients,
            recovered: time_to_recover_s.is_some(),
            time_to_recover_s,
            success_after_trigger: stats.success_rate(),
            amplification_after_trigger: stats.amplification(),
            success_by_second,
        });
    }
    Ok(rows)
}

/// Seconds from the end of [`TRIGGER`] to the first 1 s bin from which every bin's success
/// rate is at least 95 % (`None`: never), and the success rate per bin, rounded.
fn recovery_of(stats: &RunStats) -> (Option<f64>, Vec<f64>) {
    let success: Vec<f64> = stats
        .bins
        .iter()
        .map(|b| ratio(b.successes, b.calls))
        .collect();
    let end = TRIGGER.until.as_secs() as usize;
    // The first bin from which every later bin is healthy.
    let mut first_healthy = success.len();
    while first_healthy > end && success[first_healthy - 1] >= 0.95 {
        first_healthy -= 1;
    }
    let recovered = first_healthy < success.len();
    (
        recovered.then(|| (first_healthy - end) as f64),
        success
            .iter()
            .map(|s| (s * 1000.0).round() / 1000.0)
            .collect(),
    )
}

// ---------------------------------------------------------------------------------------
// Table 4

/// The variants of table 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ShardVariant {
    /// 3 attempts, every retry granted (the reference).
    ThreeAttempts,
    /// One stormguard budget per process, shared by all shards.
    SharedBudget,
    /// One stormguard budget per process and shard.
    PerShardBudget,
    /// One budget per process and shard, each shard's floor shared by the fleet
    /// ([`RetryBudget::with_fleet_size`](stormguard_core::RetryBudget::with_fleet_size)
    /// with the number of processes).
    PerShardFleetFloor,
}

impl ShardVariant {
    /// All variants, in table order.
    pub const ALL: [ShardVariant; 4] = [
        ShardVariant::ThreeAttempts,
        ShardVariant::SharedBudget,
        ShardVariant::PerShardBudget,
        ShardVariant::PerShardFleetFloor,
    ];

    /// The name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            ShardVariant::ThreeAttempts => "three-attempts",
            ShardVariant::SharedBudget => "shared-budget",
            ShardVariant::PerShardBudget => "per-shard-budget",
            ShardVariant::PerShardFleetFloor => "per-shard-fleet-floor",
        }
    }
}

/// One row of table 4.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ShardRow {
    /// The budget layout.
    pub variant: ShardVariant,
    /// Success rate of calls to the nine healthy shards.
    pub healthy_success: f64,
    /// Attempts per call to the healthy shards.
    pub healthy_amplification: f64,
    /// Success rate of calls to the bad shard (it is down: 0).
    pub bad_success: f64,
    /// Attempts per call to the bad shard: the extra load aimed at it.
    pub bad_amplification: f64,
}

/// Shards in table 4; shard 0 is the bad one.
pub const SHARDS: usize = 10;

/// Client processes in table 4.
const CLIENTS: usize = 10;

/// Failure rate of the healthy shards in table 4.
pub const HEALTHY_FAILURE_RATE: f64 = 0.05;

/// The scenario of table 4: 10 processes × 200 calls/s spread uniformly over 10 shards of
/// unlimited capacity (2 ms); shard 0 fails every attempt, the others 5 % at random;
/// 1 s deadline; measured after 10 s (2 s quick).
pub fn partial_failure_scenario(variant: ShardVariant, options: &Options) -> Scenario {
    let (duration, warmup) = if options.quick {
        (12.0, 2.0)
    } else {
        (70.0, 10.0)
    };
    let name = match variant {
        ShardVariant::ThreeAttempts => PolicyName::ThreeAttempts,
        _ => PolicyName::Stormguard,
    };
    let mut policy = client(name, secs(1.0), None, a6_backoff(ms(20)));
    policy.name = variant.as_str().to_owned();
    policy.budget_per_shard = matches!(
        variant,
        ShardVariant::PerShardBudget | ShardVariant::PerShardFleetFloor
    );
    if variant == ShardVariant::PerShardFleetFloor {
        policy.budget = BudgetKind::FleetBudget {
            config: BudgetConfig::default(),
            fleet_size: CLIENTS as u32,
        };
    }
    let shards = (0..SHARDS)
        .map(|i| Shard {
            server: ServerKind::Unbounded { latency: ms(2) },
            failure_rate: if i == 0 { 1.0 } else { HEALTHY_FAILURE_RATE },
            outage: None,
        })
        .collect();
    Scenario {
        clients: CLIENTS,
        rate_per_client: 200.0,
        duration: secs(duration),
        measure_from: secs(warmup),
        bin: secs(1.0),
        network: ms(1),
        tiers: vec![],
        shards,
        policy,
        seed: mix(options.seed, 4_000),
    }
}

/// Table 4: one bad shard of ten, shared budget against per-shard budgets.
pub fn partial_failure(options: &Options) -> Result<Vec<ShardRow>, SimError> {
    let mut rows = Vec::new();
    for variant in ShardVariant::ALL {
        let stats = run(&partial_failure_scenario(variant, options))?;
        let bad = &stats.shards[0];
        let healthy = stats.shards[1..].iter().fold((0, 0, 0), |(c, s, a), sh| {
            (c + sh.calls, s + sh.successes, a + sh.attempts)
        });
        rows.push(ShardRow {
            variant,
            healthy_success: ratio(healthy.1, healthy.0),
            healthy_amplification: ratio(healthy.2, healthy.0),
            bad_success: ratio(bad.successes, bad.calls),
            bad_amplification: ratio(bad.attempts, bad.calls),
        });
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------
// Table 5: a call chain

/// One row of table 5.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ChainRow {
    /// The client policy, at every hop.
    pub policy: PolicyName,
    /// Probability that an attempt at the bottom service fails `UNAVAILABLE`.
    pub failure_rate: f64,
    /// Attempts reaching the bottom service per logical call of the fleet.
    pub bottom_amplification: f64,
    /// Fraction of the fleet's logical calls that succeeded.
    pub success: f64,
}

/// Failure rates of table 5.
pub const CHAIN_FAILURE_RATES: [f64; 4] = [0.05, 0.2, 0.5, 1.0];

/// The scenario of table 5: the fleet of table 1 (10 processes × 100 calls/s) calls
/// tier A, which calls tier B (10 processes each, 1 ms round trip), which calls the
/// bottom service (unlimited capacity, 2 ms) whose attempts fail with `failure_rate`.
/// Every hop runs the same client policy; 1 s deadline from the top, propagated down;
/// measured from 10 s to 40 s (1 s to 4 s quick).
pub fn chain_scenario(policy: PolicyName, failure_rate: f64, options: &Options) -> Scenario {
    let tier = Tier {
        processes: 10,
        latency: ms(1),
    };
    let base = amplification_scenario(policy, failure_rate, options);
    let (duration, warmup) = if options.quick {
        (4.0, 1.0)
    } else {
        (40.0, 10.0)
    };
    Scenario {
        tiers: vec![tier.clone(), tier],
        duration: secs(duration),
        measure_from: secs(warmup),
        seed: mix(options.seed, 5_000 + (failure_rate * 1000.0) as u64),
        ..base
    }
}

/// Table 5: amplification through a chain of three hops.
pub fn call_chain(options: &Options) -> Result<Vec<ChainRow>, SimError> {
    let mut rows = Vec::new();
    for policy in PolicyName::ALL {
        for failure_rate in CHAIN_FAILURE_RATES {
            let stats = run(&chain_scenario(policy, failure_rate, options))?;
            rows.push(ChainRow {
                policy,
                failure_rate,
                bottom_amplification: stats.bottom_amplification(),
                success: stats.success_rate(),
            });
        }
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------
// Table 6: hedging under a capacity drop

/// The variants of the hedging table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HedgeVariant {
    /// One attempt, no hedge (the reference), plain FIFO server.
    NoHedging,
    /// Two copies, the second after [`HEDGE_DELAY`], every hedge granted, plain FIFO server.
    Unbudgeted,
    /// The same hedging paid from stormguard's retry budget (defaults: 10 % of the
    /// successes, a floor of 5/s per process), plain FIFO server.
    Budgeted,
    /// As `Budgeted`, against stormguard's admission policy (a hedge is shed as a retry).
    BudgetedShedding,
}

impl HedgeVariant {
    /// All variants, in table order.
    pub const ALL: [HedgeVariant; 4] = [
        HedgeVariant::NoHedging,
        HedgeVariant::Unbudgeted,
        HedgeVariant::Budgeted,
        HedgeVariant::BudgetedShedding,
    ];

    /// The name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            HedgeVariant::NoHedging => "no-hedging",
            HedgeVariant::Unbudgeted => "hedging, unbudgeted",
            HedgeVariant::Budgeted => "hedging+budget",
            HedgeVariant::BudgetedShedding => "hedging+budget+shedding",
        }
    }
}

/// The hedge delay of the hedging table: about twice the healthy latency (11.1 ms of
/// service and a 1 ms round trip), so a healthy server is almost never hedged.
pub const HEDGE_DELAY: Duration = Duration::from_millis(25);

/// One row of the hedging table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HedgeRow {
    /// Hedging policy, budget and server.
    pub variant: HedgeVariant,
    /// Client processes.
    pub clients: usize,
    /// Seconds from the end of the drop until success stays at 95 % or more; `None`:
    /// never within the run.
    pub time_to_recover_s: Option<f64>,
    /// Success rate of the calls arriving from the start of the drop to the end.
    pub success_after_trigger: f64,
    /// Attempts (copies) per logical call over the same calls.
    pub amplification_after_trigger: f64,
    /// Hedges sent per logical call.
    pub hedges_per_call: f64,
    /// Calls won by a hedge, per logical call.
    pub hedges_won_per_call: f64,
    /// Success rate per 1 s bin, the whole run.
    pub success_by_second: Vec<f64>,
}

/// The scenario of the hedging table: table 3's capacity drop (service time × 2.5 for
/// 3 s at 75 % load, 200 ms deadline) with a hedged method instead of a retried one: two
/// copies, the second after [`HEDGE_DELAY`], no per-attempt timeout (a copy is answered by
/// the next copy, not by a timer).
pub fn hedging_scenario(variant: HedgeVariant, options: &Options) -> Scenario {
    let base = match variant {
        HedgeVariant::BudgetedShedding => RecoveryVariant::StormguardShedding,
        _ => RecoveryVariant::NoRetries,
    };
    let mut sc = recovery_scenario(base, options);
    sc.policy.name = variant.as_str().to_owned();
    sc.policy.retry = None;
    sc.policy.layer_per_attempt_timeout = None;
    sc.policy.pushback_on_give_up = variant != HedgeVariant::NoHedging;
    sc.policy.hedging = (variant != HedgeVariant::NoHedging).then(|| HedgingPolicy {
        max_attempts: 2,
        delay: HedgeDelay::Fixed(HEDGE_DELAY),
        ..HedgingPolicy::default()
    });
    sc.policy.budget = match variant {
        HedgeVariant::NoHedging | HedgeVariant::Unbudgeted => BudgetKind::Unlimited,
        _ => BudgetKind::Budget(BudgetConfig::default()),
    };
    sc.seed = mix(options.seed, 6_000);
    sc
}

/// The hedging table: what hedges do to a capacity drop, with and without the budget.
pub fn hedging(options: &Options) -> Result<Vec<HedgeRow>, SimError> {
    let mut rows = Vec::new();
    for variant in HedgeVariant::ALL {
        let scenario = hedging_scenario(variant, options);
        let stats = run(&scenario)?;
        let (time_to_recover_s, success_by_second) = recovery_of(&stats);
        rows.push(HedgeRow {
            variant,
            clients: scenario.clients,
            time_to_recover_s,
            success_after_trigger: stats.success_rate(),
            amplification_after_trigger: stats.amplification(),
            hedges_per_call: ratio(stats.hedges, stats.calls),
            hedges_won_per_call: ratio(stats.hedges_won, stats.calls),
            success_by_second,
        });
    }
    Ok(rows)
}

// ---------------------------------------------------------------------------------------
// All six

/// The six tables.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Tables {
    /// Table 1.
    pub amplification: Vec<AmplificationRow>,
    /// Table 2.
    pub fleet_floor: Vec<FleetRow>,
    /// Table 3.
    pub recovery: Vec<RecoveryRow>,
    /// Table 4.
    pub partial_failure: Vec<ShardRow>,
    /// Table 5: amplification through a call chain.
    pub call_chain: Vec<ChainRow>,
    /// Table 6: hedging through a capacity drop, with and without the budget.
    pub hedging: Vec<HedgeRow>,
}

impl Tables {
    /// Runs all six experiments.
    pub fn run(options: &Options) -> Result<Tables, SimError> {
        Ok(Tables {
            amplification: amplification(options)?,
            fleet_floor: fleet_floor(options)?,
            recovery: recovery(options)?,
            partial_failure: partial_failure(options)?,
            call_chain: call_chain(options)?,
            hedging: hedging(options)?,
        })
    }

    /// The tables as pretty-printed JSON.
    pub fn to_json(&self) -> String {
        // Serializing plain structs of numbers and strings cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

impl Tables {
    /// Table 1 (and 5's shape): a row per failure rate, a cell per policy with attempts
    /// (or attempts reaching the bottom) per call and the success rate. The policies'
    /// headers are two wider than their cells, as the table has always been printed.
    fn policy_grid(
        title: &str,
        rates: &[f64],
        cell: impl Fn(PolicyName, f64) -> Option<(f64, f64)>,
    ) -> TextTable {
        let mut columns = vec![Column::right("failure", 8)];
        columns.extend(PolicyName::ALL.map(|p| Column::right(format!("{:>22}", p.as_str()), 20)));
        let mut table = TextTable::new(title, columns);
        for &rate in rates {
            let mut cells = vec![percent(rate, 0)];
            cells.extend(PolicyName::ALL.map(|p| match cell(p, rate) {
                Some((calls, success)) => format!("{calls:>8.3}x {:>10}", percent(success, 3)),
                None => format!("{:>22}", "-"),
            }));
            table.row(cells);
        }
        table
    }

    fn amplification_table(&self) -> TextTable {
        Tables::policy_grid(
            "Table 1: amplification (attempts / logical calls) and success rate",
            &FAILURE_RATES,
            |p, rate| {
                self.amplification
                    .iter()
                    .find(|r| r.policy == p && r.failure_rate == rate)
                    .map(|r| (r.amplification, r.success))
            },
        )
    }

    fn fleet_floor_table(&self) -> TextTable {
        rows_table(
            "Table 2: a dead dependency, by fleet size (10 calls/s per process)",
            vec![
                cell(Column::right("fleet", 6), |r: &FleetRow| {
                    r.fleet_size.to_string()
                }),
                cell(Column::left("variant", 26), |r| {
                    r.variant.as_str().to_owned()
                }),
                cell(Column::right("calls/s", 9), |r| {
                    fixed(r.calls_per_second, 0)
                }),
                cell(Column::right("retries/s", 10), |r| {
                    fixed(r.retries_per_second, 1)
                }),
                cell(Column::right("attempts/s", 10), |r| {
                    fixed(r.attempts_per_second, 1)
                }),
                cell(Column::right("peak att/s", 11), |r| {
                    fixed(r.peak_attempts_per_second, 0)
                }),
                cell(Column::right("ampl", 6), |r| fixed(r.amplification, 3)),
                cell(Column::right("success@5%", 11), |r| {
                    percent(r.success_at_5_percent, 3)
                }),
            ],
            &self.fleet_floor,
            None,
        )
    }

    fn recovery_table(&self) -> TextTable {
        rows_table(
            "Table 3: recovery from a 3 s capacity drop (x2.5 service time) at 75 % load",
            vec![
                cell(Column::left("variant", 31), |r: &RecoveryRow| {
                    r.variant.as_str().to_owned()
                }),
                cell(Column::right("clients", 7), |r| r.clients.to_string()),
                cell(Column::right("recover s", 10), |r| {
                    seconds_or_never(r.time_to_recover_s)
                }),
                cell(Column::right("success", 9), |r| {
                    percent(r.success_after_trigger, 2)
                }),
                cell(Column::right("ampl", 6), |r| {
                    fixed(r.amplification_after_trigger, 3)
                }),
            ],
            &self.recovery,
            Some(|r| &r.success_by_second),
        )
    }

    fn partial_failure_table(&self) -> TextTable {
        rows_table(
            "Table 4: one bad shard of ten (healthy shards fail 5 % at random)",
            vec![
                cell(Column::left("variant", 21), |r: &ShardRow| {
                    r.variant.as_str().to_owned()
                }),
                cell(Column::right("healthy success", 15), |r| {
                    percent(r.healthy_success, 3)
                }),
                cell(Column::right("healthy ampl", 12), |r| {
                    fixed(r.healthy_amplification, 3)
                }),
                cell(Column::right("bad success", 11), |r| {
                    percent(r.bad_success, 3)
                }),
                cell(Column::right("bad ampl", 9), |r| {
                    fixed(r.bad_amplification, 3)
                }),
            ],
            &self.partial_failure,
            None,
        )
    }

    fn call_chain_table(&self) -> TextTable {
        Tables::policy_grid(
            "Table 5: a call chain (fleet -> A -> B -> bottom), attempts reaching the bottom per call",
            &CHAIN_FAILURE_RATES,
            |p, rate| {
                self.call_chain
                    .iter()
                    .find(|r| r.policy == p && r.failure_rate == rate)
                    .map(|r| (r.bottom_amplification, r.success))
            },
        )
    }

    fn hedging_table(&self) -> TextTable {
        let title = format!(
            "Table 6: hedging (2 copies, the second after {} ms) through a 3 s capacity drop (x2.5) at 75 % load",
            HEDGE_DELAY.as_millis()
        );
        rows_table(
            title,
            vec![
                cell(Column::left("variant", 23), |r: &HedgeRow| {
                    r.variant.as_str().to_owned()
                }),
                cell(Column::right("clients", 7), |r| r.clients.to_string()),
                cell(Column::right("recover s", 9), |r| {
                    seconds_or_never(r.time_to_recover_s)
                }),
                cell(Column::right("success", 8), |r| {
                    percent(r.success_after_trigger, 2)
                }),
                cell(Column::right("ampl", 6), |r| {
                    fixed(r.amplification_after_trigger, 3)
                }),
                cell(Column::right("hedges", 7), |r| fixed(r.hedges_per_call, 3)),
                cell(Column::right("won", 6), |r| fixed(r.hedges_won_per_call, 3)),
            ],
            &self.hedging,
            Some(|r| &r.success_by_second),
        )
    }
}

/// How a row of type `R` prints its cell in one column.
type Print<R> = fn(&R) -> String;

/// A column of a table of `R` rows, and how a row prints its cell in it.
type Cell<R> = (Column, Print<R>);

/// The column `column`, filled by `print` (a function, so every table's columns are one
/// list whatever the closures).
fn cell<R>(column: Column, print: Print<R>) -> Cell<R> {
    (column, print)
}

/// Tables 2, 3, 4 and 6: `title`, the columns of `cells`, a row per element of `rows`
/// and, with `series`, each row's success rate per second after its cells.
fn rows_table<R>(
    title: impl Into<String>,
    cells: Vec<Cell<R>>,
    rows: &[R],
    series: Option<fn(&R) -> &[f64]>,
) -> TextTable {
    let (columns, prints): (Vec<Column>, Vec<Print<R>>) = cells.into_iter().unzip();
    let mut table = TextTable::new(title, columns);
    if series.is_some() {
        table = table.with_series("success per second");
    }
    for r in rows {
        let row = prints.iter().map(|print| print(r)).collect();
        match series {
            Some(series) => table.row_with_series(row, series(r)),
            None => table.row(row),
        }
    }
    table
}

impl fmt::Display for Tables {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tables = [
            self.amplification_table(),
            self.fleet_floor_table(),
            self.recovery_table(),
            self.partial_failure_table(),
            self.call_chain_table(),
            self.hedging_table(),
        ];
        for (i, table) in tables.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{table}")?;
        }
        Ok(())
    }
}
