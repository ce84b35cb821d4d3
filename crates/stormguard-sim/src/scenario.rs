//! What a run simulates: the fleet and its client policy, the middle tiers, the shards
//! at the bottom and how each answers, and the seed.

use std::time::Duration;

use stormguard_core::A6BudgetConfig;
use stormguard_core::AdmissionConfig;
use stormguard_core::BreakerConfig;
use stormguard_core::BudgetConfig;
use stormguard_core::HedgingPolicy;
use stormguard_core::RetryPolicy;

use crate::SimError;

/// The method every simulated call invokes.
pub const PATH: &str = "/stormguard.demo.v1.Inventory/Reserve";

/// What pays for a client's retries.
#[derive(Clone, Debug, PartialEq)]
pub enum BudgetKind {
    /// Every retry is granted ([`Unlimited`](stormguard_core::Unlimited)): the classic "N attempts" client.
    Unlimited,
    /// gRPC A6 `retryThrottling` ([`A6Budget`](stormguard_core::A6Budget)).
    Throttle(A6BudgetConfig),
    /// stormguard's [`RetryBudget`](stormguard_core::RetryBudget).
    Budget(BudgetConfig),
    /// stormguard's [`RetryBudget`](stormguard_core::RetryBudget) with its floor shared by `fleet_size` processes
    /// ([`RetryBudget::with_fleet_size`](stormguard_core::RetryBudget::with_fleet_size)).
    FleetBudget {
        /// The budget's configuration.
        config: BudgetConfig,
        /// Processes sharing the floor.
        fleet_size: u32,
    },
}

/// How one simulated client process retries.
#[derive(Clone, Debug, PartialEq)]
pub struct ClientPolicy {
    /// A short name for tables (`"three-attempts"`, `"stormguard"`, ...).
    pub name: String,
    /// The retry policy of the called method; `None` never retries.
    pub retry: Option<RetryPolicy>,
    /// The hedging policy of the called method instead of a retry policy (`retry` must
    /// then be `None`): every call is driven as the layer drives a hedged call, several
    /// copies in flight, the first `OK` wins (see [`HedgedCall`](crate::HedgedCall)).
    /// Hedges are paid from `budget`, as retries are.
    pub hedging: Option<HedgingPolicy>,
    /// What pays for retries (one per process, or one per shard and process).
    pub budget: BudgetKind,
    /// The circuit breaker of each process (one per shard with `budget_per_shard`).
    pub breaker: Option<BreakerConfig>,
    /// The client layer's own per-attempt timeout (`RetryLayer::with_per_attempt_timeout`
    /// of `stormguard-client`): it limits the attempts of a method whose retry policy sets
    /// no [`per_attempt_timeout`](RetryPolicy::per_attempt_timeout), and of a method with
    /// no retry policy at all, such as the one attempt of a client that never retries.
    /// The policy's own value, when set, wins, as in the layer. `None`: only the policy's.
    pub layer_per_attempt_timeout: Option<Duration>,
    /// Deadline of a logical call, from its arrival.
    pub deadline: Option<Duration>,
    /// One budget and breaker per (process, shard) instead of one per process.
    pub budget_per_shard: bool,
    /// When a middle tier's client gives up on a retryable failure (budget, breaker,
    /// attempts, deadline), its answer upstream carries `grpc-retry-pushback-ms: -1`, so
    /// no tier above retries the same failure (what stormguard's client layer does; a
    /// standard client passes the status up without it).
    pub pushback_on_give_up: bool,
}

/// A middle tier between the fleet and the shards: server processes that handle each
/// attempt by making a call of their own to the next tier, through their own client
/// (with the fleet's [`ClientPolicy`] and its own budget and breaker per process), and
/// answer with its outcome. The inbound attempt's deadline is the outbound call's.
#[derive(Clone, Debug, PartialEq)]
pub struct Tier {
    /// Server processes of the tier; an attempt goes to one chosen at random.
    pub processes: usize,
    /// Round trip between the tier above and this one.
    pub latency: Duration,
}

/// A window of virtual time, `[from, until)`, measured from the start of the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// Start (inclusive).
    pub from: Duration,
    /// End (exclusive).
    pub until: Duration,
}

impl Window {
    pub(crate) fn contains(self, t: u64) -> bool {
        nanos(self.from) <= t && t < nanos(self.until)
    }
}

/// A server with a bounded number of workers and a wait queue.
#[derive(Clone, Debug, PartialEq)]
pub struct QueueServer {
    /// Calls served at once.
    pub workers: usize,
    /// Time one call holds a worker.
    pub service_time: Duration,
    /// Longest wait queue of the plain FIFO server; beyond it calls fail `UNAVAILABLE`
    /// at once. (The shedding server uses its admission config instead.)
    pub queue_capacity: usize,
    /// A capacity drop: service time multiplied by `factor` during `window`.
    pub slowdown: Option<(Window, f64)>,
    /// Whether the plain FIFO server drops the work of a caller that reset its stream,
    /// queued or running (a tonic handler waiting for a semaphore: the storm's default
    /// server model), instead of running it anyway (a worker pool). The shedding server
    /// always drops it, as the `ShedLayer` does.
    pub drops_abandoned: bool,
    /// `None`: a plain FIFO that runs everything it queued, even work whose caller has
    /// given up (unless `drops_abandoned`). `Some`: stormguard's admission policy (shed
    /// retries first, pushback, drop expired work, queue order); its `workers` must equal
    /// `workers`.
    pub shedding: Option<AdmissionConfig>,
}

/// How a shard answers.
// A description built once per shard, not state moved about while a run goes: its size
// does not matter, and a box would only make scenarios harder to write.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq)]
pub enum ServerKind {
    /// Unlimited capacity: every attempt is answered after `latency` (round trip).
    Unbounded {
        /// Round-trip time of one attempt.
        latency: Duration,
    },
    /// Bounded capacity, see [`QueueServer`].
    Queue(QueueServer),
}

/// One shard (or tier) of the called service. Calls pick a shard uniformly at random.
#[derive(Clone, Debug, PartialEq)]
pub struct Shard {
    /// Capacity model.
    pub server: ServerKind,
    /// Probability that an attempt fails `UNAVAILABLE` at once, in `[0, 1]`.
    pub failure_rate: f64,
    /// A full outage: every attempt fails `UNAVAILABLE` during the window.
    pub outage: Option<Window>,
}

/// A simulated fleet and what it calls.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Client processes, each with its own controller (budget, breaker).
    pub clients: usize,
    /// Poisson arrivals of logical calls per process per second.
    pub rate_per_client: f64,
    /// Arrivals stop at this virtual time; the run then finishes every call in flight.
    pub duration: Duration,
    /// Calls arriving before this time are not counted in the totals (warm-up); the
    /// per-bin series covers the whole run.
    pub measure_from: Duration,
    /// Width of one bin of the time series.
    pub bin: Duration,
    /// One-way network delay between a client and a queueing server.
    pub network: Duration,
    /// Middle tiers the fleet's calls go through before reaching the shards (a call
    /// chain: fleet, `tiers[0]`, `tiers[1]`, ..., a shard). Empty: the fleet calls the
    /// shards directly.
    pub tiers: Vec<Tier>,
    /// The shards of the service at the bottom.
    pub shards: Vec<Shard>,
    /// The client policy of every process.
    pub policy: ClientPolicy,
    /// Seed of the whole run.
    pub seed: u64,
}

impl Scenario {
    /// Checks the scenario; every core config is validated by the core object itself
    /// when the run builds it.
    pub fn validate(&self) -> Result<(), SimError> {
        self.validate_run()?;
        if self.shards.is_empty() || self.shards.len() > u32::MAX as usize {
            return bad("shards", "must name at least one shard".into());
        }
        for shard in &self.shards {
            shard.validate()?;
        }
        if self.tiers.len() > 8 {
            return bad("tiers", format!("at most 8, got {}", self.tiers.len()));
        }
        for tier in &self.tiers {
            if tier.processes == 0 || tier.processes > 100_000 {
                return bad(
                    "tiers.processes",
                    format!("must be in [1, 100000], got {}", tier.processes),
                );
            }
        }
        self.policy.validate()
    }

    /// The fleet, its rate and the run's times.
    fn validate_run(&self) -> Result<(), SimError> {
        if self.clients == 0 {
            return bad("clients", "must be at least 1".into());
        }
        if self.clients > u32::MAX as usize {
            return bad(
                "clients",
                format!("must fit in 32 bits, got {}", self.clients),
            );
        }
        if !(self.rate_per_client.is_finite() && self.rate_per_client > 0.0) {
            return bad(
                "rate_per_client",
                format!("must be finite and above 0, got {}", self.rate_per_client),
            );
        }
        if self.duration.is_zero() || self.duration > Duration::from_secs(24 * 3600) {
            return bad(
                "duration",
                format!("must be in (0, 24 h], got {:?}", self.duration),
            );
        }
        if self.measure_from >= self.duration {
            return bad(
                "measure_from",
                format!(
                    "must be before the end of the run, got {:?}",
                    self.measure_from
                ),
            );
        }
        if self.bin.is_zero() || self.duration.as_nanos() / self.bin.as_nanos() > 1_000_000 {
            return bad(
                "bin",
                format!(
                    "must be above 0 and give at most 10^6 bins, got {:?}",
                    self.bin
                ),
            );
        }
        Ok(())
    }
}

/// A scenario error on `field`.
fn bad(field: &'static str, reason: String) -> Result<(), SimError> {
    Err(SimError::Scenario { field, reason })
}

impl Shard {
    fn validate(&self) -> Result<(), SimError> {
        if !(0.0..=1.0).contains(&self.failure_rate) {
            return bad(
                "shards.failure_rate",
                format!("must be in [0, 1], got {}", self.failure_rate),
            );
        }
        let ServerKind::Queue(q) = &self.server else {
            return Ok(());
        };
        if q.workers == 0 {
            return bad("shards.server.workers", "must be at least 1".into());
        }
        if q.service_time.is_zero() {
            return bad("shards.server.service_time", "must be above 0".into());
        }
        // The engine counts free workers from `workers`; a different number in the
        // admission config would be silently ignored.
        if let Some(c) = &q.shedding
            && c.workers.fixed() != Some(q.workers)
        {
            return bad(
                "shards.server.shedding.workers",
                format!(
                    "must be the fixed limit of workers ({}), got {:?}",
                    q.workers, c.workers
                ),
            );
        }
        if let Some((_, factor)) = q.slowdown
            && !(factor.is_finite() && factor > 0.0 && factor <= 1000.0)
        {
            return bad(
                "shards.server.slowdown",
                format!("factor must be in (0, 1000], got {factor}"),
            );
        }
        Ok(())
    }
}

impl ClientPolicy {
    fn validate(&self) -> Result<(), SimError> {
        if self.layer_per_attempt_timeout.is_some_and(|t| t.is_zero()) {
            return bad(
                "policy.layer_per_attempt_timeout",
                "must be above 0; leave it out for no per-attempt timeout".into(),
            );
        }
        // The policies themselves are checked by the controller built from them.
        if self.hedging.is_some() && self.retry.is_some() {
            return bad(
                "policy.hedging",
                "a method is retried or hedged, not both: set `retry` to None".into(),
            );
        }
        Ok(())
    }
}

pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Mixes a seed with a stream number, so every object gets an unrelated seed.
pub(crate) fn mix(seed: u64, stream: u64) -> u64 {
    let mut x = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}
