//! The four experiments, each a table of rows, printable and serializable.
//!
//! Every row is one or more seeded runs of [`crate::run`]; the figures are
//! reproducible bit for bit for a seed. [`Options::quick`] shortens the runs (and trims
//! the largest fleets) so that the tests can check the shape of every table in a few
//! seconds of a debug build.

use std::fmt::{self, Write as _};
use std::time::Duration;

use serde::Serialize;
use stormguard_core::admission::AdmissionConfig;
use stormguard_core::backoff::BackoffConfig;
use stormguard_core::breaker::BreakerConfig;
use stormguard_core::budget::BudgetConfig;
use stormguard_core::code::{Code, CodeSet};
use stormguard_core::policy::RetryPolicy;
use stormguard_core::throttle::ThrottleConfig;

use crate::SimError;
use crate::engine::{
    BudgetKind, ClientPolicy, QueueServer, RunStats, Scenario, ServerKind, Shard, Window, mix,
    ratio, run,
};

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
    /// All four, in table order.
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

/// The retry policy every retrying client uses: 3 attempts of an idempotent method.
/// `retry_timeouts` adds `DEADLINE_EXCEEDED` (a per-attempt timeout) to `UNAVAILABLE`.
fn three_attempts(backoff: BackoffConfig, retry_timeouts: bool) -> RetryPolicy {
    let mut codes = CodeSet::single(Code::Unavailable);
    if retry_timeouts {
        codes = [Code::Unavailable, Code::DeadlineExceeded]
            .into_iter()
            .collect();
    }
    RetryPolicy {
        max_attempts: 3,
        retryable_codes: codes,
        backoff,
        ..RetryPolicy::default()
    }
}

/// The backoff of a standard gRPC client: A6 with `initial`, no growth.
fn a6_backoff(initial: Duration) -> BackoffConfig {
    BackoffConfig::A6 {
        initial,
        max: initial,
        multiplier: 1.0,
    }
}

/// A6 `retryThrottling` as in the reference points.
pub fn a6_throttle_config() -> ThrottleConfig {
    ThrottleConfig {
        max_tokens: 10.0,
        token_ratio: 0.1,
    }
}

/// The client policy `name`, with `deadline`, `attempt_timeout`, the backoff of the
/// standard clients (`std_backoff`) and whether timeouts are retried. stormguard keeps
/// its own default backoff (full jitter).
fn client(
    name: PolicyName,
    deadline: Duration,
    attempt_timeout: Option<Duration>,
    std_backoff: BackoffConfig,
    retry_timeouts: bool,
) -> ClientPolicy {
    let (retry, budget) = match name {
        PolicyName::NoRetries => (None, BudgetKind::Unlimited),
        PolicyName::ThreeAttempts => (
            Some(three_attempts(std_backoff, retry_timeouts)),
            BudgetKind::Unlimited,
        ),
        PolicyName::A6Throttle => (
            Some(three_attempts(std_backoff, retry_timeouts)),
            BudgetKind::Throttle(a6_throttle_config()),
        ),
        PolicyName::Stormguard => (
            Some(three_attempts(BackoffConfig::default(), retry_timeouts)),
            BudgetKind::Budget(BudgetConfig::default()),
        ),
    };
    ClientPolicy {
        name: name.as_str().to_owned(),
        retry,
        budget,
        breaker: None,
        attempt_timeout,
        deadline: Some(deadline),
        budget_per_shard: false,
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
        shards: vec![Shard {
            server: ServerKind::Unbounded { latency: ms(2) },
            failure_rate,
            outage: None,
        }],
        policy: client(policy, secs(1.0), None, a6_backoff(ms(20)), false),
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
