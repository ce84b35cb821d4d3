//! The discrete-event engine: one scenario, one seeded run, one [`RunStats`].
//!
//! Time is virtual. Every event sits in a binary heap ordered by (time, sequence number),
//! so two events at the same instant run in the order they were scheduled and a seed fixes
//! the whole run. Instants handed to the core objects are `base + offset`, with `base`
//! taken once per run: the core objects only ever look at differences between instants,
//! so the base does not change any result.
//!
//! The engine decides nothing about retries itself. Each simulated client process holds a
//! real [`RetryController`] (its own budget and breaker, as in production); every logical
//! call is a real [`CallRetry`](stormguard_core::retry::CallRetry) driven through
//! `begin_at`, `on_failure_at`, `on_success_at` and `start_retry_at`. A server that sheds
//! asks a real [`AdmissionPolicy`] for its decision, its pushback, its queue order and the
//! expiry of queued work.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use stormguard_core::Instant;
use stormguard_core::admission::{
    AdmissionConfig, AdmissionPolicy, AttemptClass, Decision as Admission, QueueLoad, ShedPushback,
};
use stormguard_core::breaker::{BreakerConfig, CircuitBreaker};
use stormguard_core::budget::{Budget, BudgetConfig, RetryBudget, Unlimited};
use stormguard_core::code::Code;
use stormguard_core::policy::{MethodTable, RetryPolicy};
use stormguard_core::pushback::Pushback;
use stormguard_core::retry::{CallRetry, Decision, Failure, Refusal, RetryController};
use stormguard_core::throttle::{A6Throttle, ThrottleConfig};

use crate::SimError;

/// The method every simulated call invokes.
pub const PATH: &str = "/stormguard.demo.v1.Inventory/Reserve";

/// What pays for a client's retries.
#[derive(Clone, Debug, PartialEq)]
pub enum BudgetKind {
    /// Every retry is granted ([`Unlimited`]): the classic "N attempts" client.
    Unlimited,
    /// gRPC A6 `retryThrottling` ([`A6Throttle`]).
    Throttle(ThrottleConfig),
    /// stormguard's [`RetryBudget`].
    Budget(BudgetConfig),
    /// stormguard's [`RetryBudget`] with its floor shared by `fleet_size` processes
    /// ([`RetryBudget::with_fleet_size`]).
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
    /// What pays for retries (one per process, or one per shard and process).
    pub budget: BudgetKind,
    /// The circuit breaker of each process (one per shard with `budget_per_shard`).
    pub breaker: Option<BreakerConfig>,
    /// Per-attempt timeout set by the client (`None`: only the logical deadline).
    /// A timed-out attempt fails with `DEADLINE_EXCEEDED`.
    pub attempt_timeout: Option<Duration>,
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
    fn contains(self, t: u64) -> bool {
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
    /// `None`: a plain FIFO that runs everything it queued, even work whose caller has
    /// given up. `Some`: stormguard's admission policy (shed retries first, pushback,
    /// drop expired work, queue order); its `workers` must equal `workers`.
    pub shedding: Option<AdmissionConfig>,
}

/// How a shard answers.
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
        let bad = |field: &'static str, reason: String| Err(SimError::Scenario { field, reason });
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
        if self.shards.is_empty() || self.shards.len() > u32::MAX as usize {
            return bad("shards", "must name at least one shard".into());
        }
        for shard in &self.shards {
            if !(0.0..=1.0).contains(&shard.failure_rate) {
                return bad(
                    "shards.failure_rate",
                    format!("must be in [0, 1], got {}", shard.failure_rate),
                );
            }
            if let ServerKind::Queue(q) = &shard.server {
                if q.workers == 0 {
                    return bad("shards.server.workers", "must be at least 1".into());
                }
                if q.service_time.is_zero() {
                    return bad("shards.server.service_time", "must be above 0".into());
                }
                // The engine counts free workers from `workers`; a different number in the
                // admission config would be silently ignored.
                if let Some(c) = &q.shedding
                    && c.workers != q.workers
                {
                    return bad(
                        "shards.server.shedding.workers",
                        format!("must equal workers ({}), got {}", q.workers, c.workers),
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
            }
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
        if let Some(retry) = &self.policy.retry {
            retry.validate("policy.retry")?;
        }
        Ok(())
    }
}

/// Counts for one bin of virtual time.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Bin {
    /// Logical calls that arrived in the bin.
    pub calls: u64,
    /// Of those, how many succeeded.
    pub successes: u64,
    /// Attempts sent in the bin (first attempts and retries).
    pub attempts: u64,
    /// Retries sent in the bin.
    pub retries: u64,
}

/// Totals of one shard over the measured window.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ShardStats {
    /// Logical calls.
    pub calls: u64,
    /// Successful logical calls.
    pub successes: u64,
    /// Attempts those calls made.
    pub attempts: u64,
}

/// What one run measured. Totals count the logical calls that arrived in
/// `[measure_from, duration)` and every attempt those calls made.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct RunStats {
    /// Logical calls.
    pub calls: u64,
    /// Logical calls that succeeded before their deadline.
    pub successes: u64,
    /// Attempts sent (a call rejected by an open breaker sends none).
    pub attempts: u64,
    /// Retries sent.
    pub retries: u64,
    /// Why failed calls stopped, by [`Refusal`] name; `"rejected_by_breaker"` counts calls
    /// whose first attempt an open breaker refused.
    pub gave_up: BTreeMap<String, u64>,
    /// Per-shard totals (of the fleet's own calls; empty when there are middle tiers).
    pub shards: Vec<ShardStats>,
    /// Attempts that reached each level of the chain for the measured calls: index 0 is
    /// the fleet's own attempts, the last the attempts reaching the shards.
    pub attempts_by_level: Vec<u64>,
    /// The whole run, bin by bin.
    pub bins: Vec<Bin>,
    /// Width of a bin, seconds.
    pub bin_seconds: f64,
    /// Seconds in the measured window.
    pub measured_seconds: f64,
    /// Events processed (a measure of the run's cost, not of the system).
    pub events: u64,
}

impl RunStats {
    /// Attempts per logical call.
    pub fn amplification(&self) -> f64 {
        ratio(self.attempts, self.calls)
    }

    /// Fraction of logical calls that succeeded.
    pub fn success_rate(&self) -> f64 {
        ratio(self.successes, self.calls)
    }

    /// Retries sent per second over the measured window.
    pub fn retries_per_second(&self) -> f64 {
        self.retries as f64 / self.measured_seconds
    }

    /// Attempts sent per second over the measured window.
    pub fn attempts_per_second(&self) -> f64 {
        self.attempts as f64 / self.measured_seconds
    }

    /// Attempts reaching the bottom of the chain (the shards) per logical call of the
    /// fleet: the amplification a call chain multiplies.
    pub fn bottom_amplification(&self) -> f64 {
        ratio(
            self.attempts_by_level.last().copied().unwrap_or(0),
            self.calls,
        )
    }
}

pub(crate) fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Mixes a seed with a stream number, so every object gets an unrelated seed.
pub(crate) fn mix(seed: u64, stream: u64) -> u64 {
    let mut x = seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// What comes back to a client for one attempt.
#[derive(Clone, Copy, Debug)]
enum Outcome {
    Ok,
    Failed(Failure),
}

#[derive(Clone, Copy, Debug)]
enum Event {
    Arrival,
    /// An attempt's answer reaches its client.
    Response {
        slot: u32,
        id: u64,
        outcome: Outcome,
    },
    /// The client's timer for an attempt fires.
    Timeout {
        slot: u32,
        id: u64,
    },
    /// A retry's delay has passed.
    RetryStart {
        slot: u32,
        id: u64,
    },
    /// An attempt reaches a middle tier.
    RelayArrive {
        level: u8,
        slot: u32,
        id: u64,
        deadline: Option<u64>,
    },
    /// An attempt reaches a queueing server.
    ServerArrive {
        shard: u32,
        slot: u32,
        id: u64,
        retry: bool,
        deadline: Option<u64>,
    },
    /// A worker finishes an attempt.
    ServiceDone {
        shard: u32,
        slot: u32,
        id: u64,
    },
}

#[derive(Debug)]
struct Scheduled {
    at: u64,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed: the heap pops the earliest (time, sequence) first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

struct Call {
    retry: CallRetry,
    /// 0 for the fleet's calls, k for calls made by tier k - 1.
    level: u8,
    /// The attempt this call serves, for calls made by a middle tier.
    parent: Option<(u32, u64)>,
    shard: u32,
    arrived: u64,
    deadline: Option<u64>,
    /// Id of the current attempt (or of the pending retry).
    id: u64,
    in_flight: bool,
    attempts: u64,
    measured: bool,
}

#[derive(Clone, Copy)]
struct Job {
    slot: u32,
    id: u64,
    enqueued: u64,
    expiry: Option<u64>,
}

struct Server {
    busy: usize,
    queue: VecDeque<Job>,
    admission: Option<AdmissionPolicy>,
}

struct Sim<'a> {
    sc: &'a Scenario,
    base: Instant,
    now: u64,
    seq: u64,
    heap: BinaryHeap<Scheduled>,
    rng: fastrand::Rng,
    controllers: Vec<RetryController>,
    /// The clients of each middle tier's processes.
    relays: Vec<Vec<RetryController>>,
    calls: Vec<Option<Call>>,
    free: Vec<u32>,
    next_id: u64,
    servers: Vec<Server>,
    stats: RunStats,
    end: u64,
    measure_from: u64,
    bin: u64,
    fleet_rate: f64,
}

/// Runs `scenario` to the end and returns what it measured.
///
/// Reproducible: the same scenario (seed included) gives the same [`RunStats`].
pub fn run(scenario: &Scenario) -> Result<RunStats, SimError> {
    run_from(scenario, Instant::now())
}

/// [`run`] with virtual time starting at `base`.
fn run_from(scenario: &Scenario, base: Instant) -> Result<RunStats, SimError> {
    scenario.validate()?;
    let mut sim = Sim::new(scenario, base)?;
    sim.run();
    Ok(sim.stats)
}

fn build_controller(
    policy: &ClientPolicy,
    seed: u64,
    stream: u64,
) -> Result<RetryController, SimError> {
    let methods = match &policy.retry {
        Some(p) => MethodTable::uniform(p.clone()),
        None => MethodTable::none(),
    };
    let budget: Arc<dyn Budget> = match &policy.budget {
        BudgetKind::Unlimited => Arc::new(Unlimited),
        BudgetKind::Throttle(c) => Arc::new(A6Throttle::new(c.clone())?),
        BudgetKind::Budget(c) => Arc::new(RetryBudget::new(c.clone())?),
        BudgetKind::FleetBudget { config, fleet_size } => {
            Arc::new(RetryBudget::with_fleet_size(config.clone(), *fleet_size)?)
        }
    };
    let breaker = match &policy.breaker {
        Some(c) => Some(CircuitBreaker::new(c.clone(), mix(seed, 2 * stream + 1))?),
        None => None,
    };
    Ok(RetryController::new(
        methods,
        budget,
        breaker,
        mix(seed, 2 * stream),
    ))
}

impl<'a> Sim<'a> {
    fn new(sc: &'a Scenario, base: Instant) -> Result<Self, SimError> {
        let per_client = if sc.policy.budget_per_shard {
            sc.shards.len()
        } else {
            1
        };
        let mut controllers = Vec::with_capacity(sc.clients * per_client);
        for i in 0..sc.clients * per_client {
            controllers.push(build_controller(&sc.policy, sc.seed, i as u64 + 1)?);
        }
        let mut relays = Vec::with_capacity(sc.tiers.len());
        let mut stream = controllers.len() as u64 + 1;
        for tier in &sc.tiers {
            let mut processes = Vec::with_capacity(tier.processes);
            for _ in 0..tier.processes {
                processes.push(build_controller(&sc.policy, sc.seed, stream)?);
                stream += 1;
            }
            relays.push(processes);
        }
        let mut servers = Vec::with_capacity(sc.shards.len());
        for (i, shard) in sc.shards.iter().enumerate() {
            let admission = match &shard.server {
                ServerKind::Queue(QueueServer {
                    shedding: Some(c), ..
                }) => {
                    let config = AdmissionConfig {
                        seed: mix(sc.seed ^ c.seed, 1 << 40 | i as u64),
                        ..c.clone()
                    };
                    Some(AdmissionPolicy::new(config)?)
                }
                _ => None,
            };
            servers.push(Server {
                busy: 0,
                queue: VecDeque::new(),
                admission,
            });
        }
        let end = nanos(sc.duration);
        let bin = nanos(sc.bin);
        let bins = end.div_ceil(bin) as usize;
        let shard_stats = if sc.tiers.is_empty() {
            sc.shards.len()
        } else {
            0
        };
        let stats = RunStats {
            shards: vec![ShardStats::default(); shard_stats],
            attempts_by_level: vec![0; sc.tiers.len() + 1],
            bins: vec![Bin::default(); bins],
            bin_seconds: sc.bin.as_secs_f64(),
            measured_seconds: (sc.duration - sc.measure_from).as_secs_f64(),
            ..RunStats::default()
        };
        Ok(Sim {
            sc,
            base,
            now: 0,
            seq: 0,
            heap: BinaryHeap::new(),
            rng: fastrand::Rng::with_seed(mix(sc.seed, 0)),
            controllers,
            relays,
            calls: Vec::new(),
            free: Vec::new(),
            next_id: 0,
            servers,
            stats,
            end,
            measure_from: nanos(sc.measure_from),
            bin,
            fleet_rate: sc.rate_per_client * sc.clients as f64,
        })
    }

    fn at(&self, t: u64) -> Instant {
        self.base + Duration::from_nanos(t)
    }

    fn instant(&self) -> Instant {
        self.at(self.now)
    }

    fn schedule(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.heap.push(Scheduled {
            at,
            seq: self.seq,
            event,
        });
    }

    fn bin_of(&mut self, t: u64) -> Option<&mut Bin> {
        let i = (t / self.bin) as usize;
        self.stats.bins.get_mut(i)
    }

    fn next_arrival(&mut self) {
        // Exponential gaps: the fleet's arrivals are one Poisson process, each call going
        // to a uniformly chosen process, which is N independent Poisson processes.
        let u = 1.0 - self.rng.f64();
        let gap = (-u.ln() / self.fleet_rate * 1e9) as u64;
        let at = self.now.saturating_add(gap.max(1));
        if at < self.end {
            self.schedule(at, Event::Arrival);
        }
    }

    fn run(&mut self) {
        self.next_arrival();
        while let Some(Scheduled { at, event, .. }) = self.heap.pop() {
            self.now = at;
            self.stats.events += 1;
            match event {
                Event::Arrival => {
                    self.arrival();
                    self.next_arrival();
                }
                Event::Response { slot, id, outcome } => self.response(slot, id, outcome),
                Event::Timeout { slot, id } => self.timeout(slot, id),
                Event::RetryStart { slot, id } => self.retry_start(slot, id),
                Event::RelayArrive {
                    level,
                    slot,
                    id,
                    deadline,
                } => self.relay_arrive(level, slot, id, deadline),
                Event::ServerArrive {
                    shard,
                    slot,
                    id,
                    retry,
                    deadline,
                } => self.server_arrive(shard, slot, id, retry, deadline),
                Event::ServiceDone { shard, slot, id } => self.service_done(shard, slot, id),
            }
        }
    }

    fn arrival(&mut self) {
        let client = self.rng.usize(0..self.sc.clients);
        let shard = self.rng.usize(0..self.sc.shards.len());
        let index = if self.sc.policy.budget_per_shard {
            client * self.sc.shards.len() + shard
        } else {
            client
        };
        let measured = self.now >= self.measure_from;
        if let Some(bin) = self.bin_of(self.now) {
            bin.calls += 1;
        }
        if measured {
            self.stats.calls += 1;
            if let Some(stats) = self.stats.shards.get_mut(shard) {
                stats.calls += 1;
            }
        }
        let deadline = self
            .sc
            .policy
            .deadline
            .map(|d| self.now.saturating_add(nanos(d)));
        let now = self.instant();
        let begun = self.controllers[index].begin_at(PATH, deadline.map(|d| self.at(d)), now);
        let retry = match begun {
            Ok(retry) => retry,
            Err(_) => {
                if measured {
                    *self
                        .stats
                        .gave_up
                        .entry("rejected_by_breaker".into())
                        .or_default() += 1;
                }
                return;
            }
        };
        self.start_call(retry, 0, None, shard, deadline, measured);
    }

    /// Starts a call at `level` (see [`Call`]) arriving now, and sends its first attempt.
    fn start_call(
        &mut self,
        retry: CallRetry,
        level: u8,
        parent: Option<(u32, u64)>,
        shard: usize,
        deadline: Option<u64>,
        measured: bool,
    ) {
        let call = Call {
            retry,
            level,
            parent,
            shard: shard as u32,
            arrived: self.now,
            deadline,
            id: 0,
            in_flight: false,
            attempts: 0,
            measured,
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.calls[slot as usize] = Some(call);
                slot
            }
            None => {
                self.calls.push(Some(call));
                (self.calls.len() - 1) as u32
            }
        };
        self.send_attempt(slot);
    }

    fn send_attempt(&mut self, slot: u32) {
        self.next_id += 1;
        let id = self.next_id;
        let now = self.now;
        let Some(call) = self.calls[slot as usize].as_mut() else {
            return;
        };
        call.id = id;
        call.in_flight = true;
        call.attempts += 1;
        let retry = call.retry.previous_attempts() > 0;
        let shard_index = call.shard;
        let deadline = call.deadline;
        let measured = call.measured;
        let level = call.level;
        if measured {
            self.stats.attempts_by_level[level as usize] += 1;
        }
        if level == 0 {
            if let Some(bin) = self.bin_of(now) {
                bin.attempts += 1;
                if retry {
                    bin.retries += 1;
                }
            }
            if measured {
                self.stats.attempts += 1;
                if let Some(stats) = self.stats.shards.get_mut(shard_index as usize) {
                    stats.attempts += 1;
                }
                if retry {
                    self.stats.retries += 1;
                }
            }
        }
        // The client's timer: the attempt timeout, cut by the logical deadline.
        let timer = match (self.sc.policy.attempt_timeout, deadline) {
            (Some(t), Some(d)) => Some(now.saturating_add(nanos(t)).min(d)),
            (Some(t), None) => Some(now.saturating_add(nanos(t))),
            (None, d) => d,
        };
        if let Some(at) = timer {
            self.schedule(at, Event::Timeout { slot, id });
        }
        if let Some(tier) = self.sc.tiers.get(level as usize) {
            let at = now.saturating_add(nanos(tier.latency) / 2);
            let deadline = timer;
            self.schedule(
                at,
                Event::RelayArrive {
                    level,
                    slot,
                    id,
                    deadline,
                },
            );
            return;
        }
        let shard = &self.sc.shards[shard_index as usize];
        let down = shard.outage.is_some_and(|w| w.contains(now));
        let fails = down || (shard.failure_rate > 0.0 && self.rng.f64() < shard.failure_rate);
        match &shard.server {
            ServerKind::Unbounded { latency } => {
                let outcome = if fails {
                    Outcome::Failed(Failure::status(Code::Unavailable))
                } else {
                    Outcome::Ok
                };
                self.schedule(
                    now.saturating_add(nanos(*latency)),
                    Event::Response { slot, id, outcome },
                );
            }
            ServerKind::Queue(_) => {
                let net = nanos(self.sc.network);
                if fails {
                    let outcome = Outcome::Failed(Failure::status(Code::Unavailable));
                    self.schedule(
                        now.saturating_add(net.saturating_mul(2)),
                        Event::Response { slot, id, outcome },
                    );
                } else {
                    self.schedule(
                        now.saturating_add(net),
                        Event::ServerArrive {
                            shard: shard_index,
                            slot,
                            id,
                            retry,
                            deadline: timer,
                        },
                    );
                }
            }
        }
    }

    /// The current attempt of `slot`, if `id` is still it and it is still in flight.
    fn live(&mut self, slot: u32, id: u64) -> bool {
        self.calls
            .get(slot as usize)
            .and_then(Option::as_ref)
            .is_some_and(|c| c.id == id && c.in_flight)
    }

    fn response(&mut self, slot: u32, id: u64, outcome: Outcome) {
        if !self.live(slot, id) {
            return; // the caller gave up on this attempt already
        }
        match outcome {
            Outcome::Ok => {
                let now = self.instant();
                if let Some(call) = self.calls[slot as usize].as_mut() {
                    call.retry.on_success_at(now);
                }
                self.finish(slot, None);
            }
            Outcome::Failed(failure) => self.failed(slot, failure),
        }
    }

    fn timeout(&mut self, slot: u32, id: u64) {
        if self.live(slot, id) {
            self.failed(slot, Failure::status(Code::DeadlineExceeded));
        }
    }

    fn failed(&mut self, slot: u32, failure: Failure) {
        let now = self.instant();
        let Some(call) = self.calls[slot as usize].as_mut() else {
            return;
        };
        call.in_flight = false;
        match call.retry.on_failure_at(&failure, now) {
            Decision::Retry { delay } => {
                let id = call.id;
                let at = self.now.saturating_add(nanos(delay));
                self.schedule(at, Event::RetryStart { slot, id });
            }
            Decision::GiveUp(refusal) => self.finish(slot, Some(refusal)),
        }
    }

    fn retry_start(&mut self, slot: u32, id: u64) {
        let now = self.instant();
        let Some(call) = self.calls[slot as usize].as_mut() else {
            return;
        };
        if call.id != id || call.in_flight {
            return;
        }
        match call.retry.start_retry_at(now) {
            Ok(()) => self.send_attempt(slot),
            Err(refusal) => self.finish(slot, Some(refusal)),
        }
    }

    /// Ends a logical call: `None` is a success.
    fn finish(&mut self, slot: u32, refusal: Option<Refusal>) {
        let Some(call) = self.calls[slot as usize].take() else {
            return;
        };
        self.free.push(slot);
        let success = refusal.is_none() && call.deadline.is_none_or(|d| self.now <= d);
        if let Some((parent, parent_id)) = call.parent {
            self.answer_parent(&call, parent, parent_id, success, refusal);
            return;
        }
        if success && let Some(bin) = self.bin_of(call.arrived) {
            bin.successes += 1;
        }
        if !call.measured {
            return;
        }
        if success {
            self.stats.successes += 1;
            if let Some(stats) = self.stats.shards.get_mut(call.shard as usize) {
                stats.successes += 1;
            }
        } else {
            let name = refusal.map_or("late", Refusal::as_str);
            *self.stats.gave_up.entry(name.to_owned()).or_default() += 1;
        }
    }

    /// A middle tier's call ended: its process answers the attempt it was serving.
    fn answer_parent(
        &mut self,
        call: &Call,
        parent: u32,
        parent_id: u64,
        success: bool,
        refusal: Option<Refusal>,
    ) {
        let outcome = if success {
            Outcome::Ok
        } else {
            Outcome::Failed(self.upstream_failure(refusal))
        };
        let tier = &self.sc.tiers[call.level as usize - 1];
        let at = self.now.saturating_add(nanos(tier.latency) / 2);
        self.schedule(
            at,
            Event::Response {
                slot: parent,
                id: parent_id,
                outcome,
            },
        );
    }

    /// What a middle tier answers when its own call failed: the status passes up
    /// (`UNAVAILABLE`, or `DEADLINE_EXCEEDED` when time ran out), with "do not retry"
    /// when the policy says so and the tier's client refused a retryable failure or was
    /// itself told not to retry.
    fn upstream_failure(&self, refusal: Option<Refusal>) -> Failure {
        let code = match refusal {
            Some(Refusal::Deadline) | None => Code::DeadlineExceeded,
            Some(_) => Code::Unavailable,
        };
        // A "do not retry" from below passes up as it came (the status is returned with
        // its metadata), and the tier's own refusals of a retryable failure add one.
        let refused =
            refusal.is_some_and(|r| r == Refusal::Pushback || r.is_retryable_but_refused());
        let pushback =
            (self.sc.policy.pushback_on_give_up && refused).then_some(Pushback::DoNotRetry);
        Failure::status(code).with_pushback(pushback)
    }

    /// An attempt reaches middle tier `level`: one of its processes starts its own call
    /// to the next level, with the attempt's deadline.
    fn relay_arrive(&mut self, level: u8, slot: u32, id: u64, deadline: Option<u64>) {
        let Some(parent) = self.calls.get(slot as usize).and_then(Option::as_ref) else {
            return;
        };
        let measured = parent.measured;
        let processes = &self.relays[level as usize];
        let process = self.rng.usize(0..processes.len());
        let shard = self.rng.usize(0..self.sc.shards.len());
        let now = self.instant();
        let begun =
            self.relays[level as usize][process].begin_at(PATH, deadline.map(|d| self.at(d)), now);
        match begun {
            Ok(retry) => self.start_call(
                retry,
                level + 1,
                Some((slot, id)),
                shard,
                deadline,
                measured,
            ),
            Err(refusal) => {
                let failure = self.upstream_failure(Some(refusal));
                let tier = &self.sc.tiers[level as usize];
                let at = self.now.saturating_add(nanos(tier.latency) / 2);
                let outcome = Outcome::Failed(failure);
                self.schedule(at, Event::Response { slot, id, outcome });
            }
        }
    }

    /// The queueing server of `shard` (only those get server events).
    fn queue_server(&self, shard: u32) -> Option<&'a QueueServer> {
        match &self.sc.shards[shard as usize].server {
            ServerKind::Queue(q) => Some(q),
            ServerKind::Unbounded { .. } => None,
        }
    }

    fn service_time(&self, shard: u32) -> u64 {
        let Some(q) = self.queue_server(shard) else {
            return 0;
        };
        let base = q.service_time;
        match q.slowdown {
            // `mul_f64` panics past `Duration::MAX`; a service time that long saturates.
            Some((window, factor)) if window.contains(self.now) => {
                Duration::try_from_secs_f64(base.as_secs_f64() * factor).map_or(u64::MAX, nanos)
            }
            _ => nanos(base),
        }
    }

    fn answer(&mut self, slot: u32, id: u64, outcome: Outcome) {
        let at = self.now.saturating_add(nanos(self.sc.network));
        self.schedule(at, Event::Response { slot, id, outcome });
    }

    fn start_service(&mut self, shard: u32, slot: u32, id: u64) {
        self.servers[shard as usize].busy += 1;
        let at = self.now.saturating_add(self.service_time(shard));
        self.schedule(at, Event::ServiceDone { shard, slot, id });
    }

    fn server_arrive(
        &mut self,
        shard: u32,
        slot: u32,
        id: u64,
        retry: bool,
        deadline: Option<u64>,
    ) {
        let Some(q) = self.queue_server(shard) else {
            return;
        };
        let now = self.instant();
        let t = self.now;
        let base = self.base;
        let server = &mut self.servers[shard as usize];
        let Some(policy) = server.admission.as_mut() else {
            // Plain FIFO: run it, queue it, or refuse it when the queue is full.
            if server.busy < q.workers {
                self.start_service(shard, slot, id);
            } else if server.queue.len() < q.queue_capacity {
                server.queue.push_back(Job {
                    slot,
                    id,
                    enqueued: t,
                    expiry: None,
                });
            } else {
                let outcome = Outcome::Failed(Failure::status(Code::Unavailable));
                self.answer(slot, id, outcome);
            }
            return;
        };
        // Work that expired while queued is answered before it is counted as load, as the
        // real queue's per-call timer takes it out. Anywhere in the queue: expiries are
        // not in arrival order (a retry has less of its deadline left than the first
        // attempt queued before it).
        let mut expired = Vec::new();
        server.queue.retain(|job| {
            let live = job.expiry.is_none_or(|e| e > t);
            if !live {
                expired.push(*job);
            }
            live
        });
        let load = QueueLoad {
            free_workers: q.workers.saturating_sub(server.busy),
            depth: server.queue.len(),
            oldest_enqueued: server
                .queue
                .front()
                .map(|j| base + Duration::from_nanos(j.enqueued)),
        };
        let class = if retry {
            AttemptClass::Retry
        } else {
            AttemptClass::First
        };
        let mut reply = None;
        let mut admit = false;
        match policy.decide_at(now, load, class) {
            Admission::Admit => admit = true,
            Admission::Queue => {
                let expiry = policy.expiry(now, deadline.map(|d| base + Duration::from_nanos(d)));
                let expiry = nanos(expiry.saturating_duration_since(base));
                let job = Job {
                    slot,
                    id,
                    enqueued: t,
                    expiry: Some(expiry),
                };
                // Too close to its deadline to be worth queuing: answered at once, as
                // the real queue does, not held as load until the next event.
                if expiry <= t {
                    expired.push(job);
                } else {
                    server.queue.push_back(job);
                }
            }
            Admission::Shed(shed) => {
                let pushback = match shed.pushback {
                    ShedPushback::After(d) => Pushback::RetryAfter(d),
                    ShedPushback::DoNotRetry => Pushback::DoNotRetry,
                };
                let code = policy.config().shed_code;
                reply = Some(Failure::status(code).with_pushback(Some(pushback)));
            }
        }
        if admit {
            self.start_service(shard, slot, id);
        }
        if let Some(failure) = reply {
            self.answer(slot, id, Outcome::Failed(failure));
        }
        self.answer_expired(expired);
    }

    /// Queued work whose time ran out is answered `DEADLINE_EXCEEDED` without running.
    fn answer_expired(&mut self, expired: Vec<Job>) {
        for job in expired {
            let failure = Failure::status(Code::DeadlineExceeded);
            self.answer(job.slot, job.id, Outcome::Failed(failure));
        }
    }

    fn service_done(&mut self, shard: u32, slot: u32, id: u64) {
        let now = self.instant();
        let t = self.now;
        self.answer(slot, id, Outcome::Ok);
        let server = &mut self.servers[shard as usize];
        server.busy -= 1;
        let mut expired = Vec::new();
        let next = match server.admission.as_mut() {
            None => server.queue.pop_front(),
            Some(policy) => {
                policy.record_completion_at(now);
                loop {
                    let newest = policy.serve_newest(server.queue.len());
                    let job = if newest {
                        server.queue.pop_back()
                    } else {
                        server.queue.pop_front()
                    };
                    match job {
                        Some(job) if job.expiry.is_some_and(|e| e <= t) => expired.push(job),
                        other => break other,
                    }
                }
            }
        };
        if let Some(job) = next {
            self.start_service(shard, job.slot, job.id);
        }
        self.answer_expired(expired);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(retry: Option<RetryPolicy>, budget: BudgetKind) -> ClientPolicy {
        ClientPolicy {
            name: "test".into(),
            retry,
            budget,
            breaker: None,
            attempt_timeout: None,
            deadline: Some(Duration::from_secs(1)),
            budget_per_shard: false,
            pushback_on_give_up: false,
        }
    }

    fn scenario(failure_rate: f64, policy: ClientPolicy) -> Scenario {
        Scenario {
            clients: 4,
            rate_per_client: 50.0,
            duration: Duration::from_secs(6),
            measure_from: Duration::ZERO,
            bin: Duration::from_millis(500),
            network: Duration::from_millis(1),
            tiers: vec![],
            shards: vec![Shard {
                server: ServerKind::Unbounded {
                    latency: Duration::from_millis(2),
                },
                failure_rate,
                outage: None,
            }],
            policy,
            seed: 11,
        }
    }

    fn field(err: SimError) -> &'static str {
        match err {
            SimError::Scenario { field, .. } => field,
            other => panic!("not a scenario error: {other}"),
        }
    }

    #[test]
    fn bad_scenarios_name_their_field() {
        let ok = scenario(0.1, policy(None, BudgetKind::Unlimited));
        assert!(ok.validate().is_ok());
        let cases: Vec<(Scenario, &str)> = vec![
            (
                Scenario {
                    clients: 0,
                    ..ok.clone()
                },
                "clients",
            ),
            (
                Scenario {
                    rate_per_client: f64::NAN,
                    ..ok.clone()
                },
                "rate_per_client",
            ),
            (
                Scenario {
                    rate_per_client: 0.0,
                    ..ok.clone()
                },
                "rate_per_client",
            ),
            (
                Scenario {
                    duration: Duration::ZERO,
                    ..ok.clone()
                },
                "duration",
            ),
            (
                Scenario {
                    measure_from: ok.duration,
                    ..ok.clone()
                },
                "measure_from",
            ),
            (
                Scenario {
                    bin: Duration::ZERO,
                    ..ok.clone()
                },
                "bin",
            ),
            (
                Scenario {
                    shards: vec![],
                    ..ok.clone()
                },
                "shards",
            ),
            (scenario(1.5, ok.policy.clone()), "shards.failure_rate"),
        ];
        for (bad, name) in cases {
            let err = run(&bad).expect_err("invalid scenario");
            assert_eq!(field(err), name);
        }
    }

    #[test]
    fn a_shedding_config_with_another_worker_count_is_refused() {
        // The engine runs `QueueServer::workers` workers; an admission config that says
        // otherwise used to be ignored without a word.
        let mut sc = one_worker_shard(None);
        if let ServerKind::Queue(QueueServer {
            shedding: Some(c), ..
        }) = &mut sc.shards[0].server
        {
            c.workers = 4;
        }
        let err = run(&sc).expect_err("mismatched workers");
        assert_eq!(field(err), "shards.server.shedding.workers");
        assert!(run(&one_worker_shard(None)).is_ok());
    }

    #[test]
    fn a_huge_service_time_under_a_slowdown_saturates_instead_of_panicking() {
        let mut sc = one_worker_shard(None);
        if let ServerKind::Queue(q) = &mut sc.shards[0].server {
            q.service_time = Duration::MAX;
            q.slowdown = Some((
                Window {
                    from: Duration::ZERO,
                    until: sc.duration,
                },
                2.0,
            ));
        }
        let stats = run(&sc).expect("valid scenario");
        assert_eq!(stats.successes, 0, "no call finishes within the run");
    }

    #[test]
    fn a_huge_network_delay_saturates_instead_of_overflowing() {
        // A failed attempt on a queueing shard is answered after a round trip (2 × network).
        let mut sc = one_worker_shard(None);
        sc.network = Duration::MAX;
        sc.shards[0].failure_rate = 1.0;
        let stats = run(&sc).expect("valid scenario");
        assert_eq!(stats.successes, 0, "no answer comes back within the run");
    }

    #[test]
    fn core_configs_are_validated_by_the_core() {
        let bad_budget = BudgetKind::Budget(BudgetConfig {
            retry_ratio: 0.0,
            ..BudgetConfig::default()
        });
        let err = run(&scenario(
            0.1,
            policy(
                Some(RetryPolicy {
                    idempotent: true,
                    ..RetryPolicy::default()
                }),
                bad_budget,
            ),
        ))
        .expect_err("invalid budget");
        assert!(matches!(err, SimError::Config(_)), "{err}");
        assert!(err.to_string().contains("retry_ratio"), "{err}");
        let bad_retry = RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy {
                idempotent: true,
                ..RetryPolicy::default()
            }
        };
        let err = run(&scenario(
            0.1,
            policy(Some(bad_retry), BudgetKind::Unlimited),
        ))
        .expect_err("invalid retry policy");
        assert!(err.to_string().contains("maxAttempts"), "{err}");
    }

    #[test]
    fn results_do_not_depend_on_the_base_instant() {
        let sc = scenario(
            0.3,
            policy(
                Some(RetryPolicy {
                    idempotent: true,
                    ..RetryPolicy::default()
                }),
                BudgetKind::Budget(BudgetConfig::default()),
            ),
        );
        let now = Instant::now();
        let a = run_from(&sc, now).expect("valid");
        let b = run_from(&sc, now + Duration::from_secs(3 * 3600)).expect("valid");
        assert_eq!(a, b);
        assert!(a.retries > 0);
    }

    #[test]
    fn bins_add_up_to_the_totals_when_everything_is_measured() {
        let sc = scenario(
            0.5,
            policy(
                Some(RetryPolicy {
                    idempotent: true,
                    ..RetryPolicy::default()
                }),
                BudgetKind::Unlimited,
            ),
        );
        let stats = run(&sc).expect("valid");
        let sum = |f: fn(&Bin) -> u64| stats.bins.iter().map(f).sum::<u64>();
        assert_eq!(stats.bins.len(), 12);
        assert_eq!(sum(|b| b.calls), stats.calls);
        assert_eq!(sum(|b| b.successes), stats.successes);
        // Bins count attempts by send time: only retries can be sent after the last
        // arrival, while the run finishes the calls in flight.
        let late_retries = stats.retries - sum(|b| b.retries);
        assert_eq!(sum(|b| b.attempts) + late_retries, stats.attempts);
        assert!(late_retries < stats.retries / 10, "{late_retries}");
        assert_eq!(stats.attempts, stats.calls + stats.retries);
        let failed: u64 = stats.gave_up.values().sum();
        assert_eq!(stats.successes + failed, stats.calls);
        // Unlimited retries at 50 %: calls that failed used all three attempts.
        assert_eq!(stats.gave_up.get("attempts").copied(), Some(failed));
    }

    #[test]
    fn an_open_breaker_rejects_calls_without_an_attempt() {
        let mut p = policy(
            Some(RetryPolicy {
                idempotent: true,
                ..RetryPolicy::default()
            }),
            BudgetKind::Budget(BudgetConfig::default()),
        );
        p.breaker = Some(BreakerConfig::default());
        let stats = run(&scenario(1.0, p)).expect("valid");
        let rejected = stats
            .gave_up
            .get("rejected_by_breaker")
            .copied()
            .unwrap_or(0);
        assert!(rejected > stats.calls / 2, "{stats:?}");
        assert!(stats.attempts < stats.calls / 2, "{stats:?}");
    }

    #[test]
    fn the_attempt_timeout_cuts_slow_attempts_and_is_retried_when_configured() {
        // A server slower than the attempt timeout: every attempt times out.
        let retry = RetryPolicy {
            retryable_codes: [Code::Unavailable, Code::DeadlineExceeded]
                .into_iter()
                .collect(),
            ..RetryPolicy {
                idempotent: true,
                ..RetryPolicy::default()
            }
        };
        let mut p = policy(Some(retry), BudgetKind::Unlimited);
        p.attempt_timeout = Some(Duration::from_millis(20));
        let mut sc = scenario(0.0, p);
        sc.shards[0].server = ServerKind::Unbounded {
            latency: Duration::from_millis(30),
        };
        let stats = run(&sc).expect("valid");
        assert_eq!(stats.successes, 0);
        assert_eq!(stats.amplification(), 3.0);
        // Without DEADLINE_EXCEEDED in the retryable codes the timeout is final.
        sc.policy.retry = Some(RetryPolicy {
            idempotent: true,
            ..RetryPolicy::default()
        });
        let stats = run(&sc).expect("valid");
        assert_eq!(stats.amplification(), 1.0);
        assert_eq!(stats.gave_up.get("not_retryable"), Some(&stats.calls));
    }

    #[test]
    fn a_chain_multiplies_retries_unless_give_ups_say_do_not_retry() {
        // Delays of at most 1 ms keep the 27 attempts of a call inside its deadline.
        let fast = RetryPolicy {
            backoff: stormguard_core::backoff::BackoffConfig::FullJitter {
                base: Duration::from_millis(1),
                cap: Duration::from_millis(1),
                multiplier: 1.0,
            },
            ..RetryPolicy {
                idempotent: true,
                ..RetryPolicy::default()
            }
        };
        let mut sc = scenario(1.0, policy(Some(fast), BudgetKind::Unlimited));
        let tier = Tier {
            processes: 3,
            latency: Duration::from_millis(1),
        };
        sc.tiers = vec![tier.clone(), tier];
        let stats = run(&sc).expect("valid");
        let n = stats.calls;
        assert_eq!(stats.attempts_by_level, [3 * n, 9 * n, 27 * n]);
        assert_eq!(stats.bottom_amplification(), 27.0);
        assert!(stats.shards.is_empty());
        // With "do not retry" on give-ups only the bottom hop retries.
        sc.policy.pushback_on_give_up = true;
        let stats = run(&sc).expect("valid");
        let n = stats.calls;
        assert_eq!(stats.attempts_by_level, [n, n, 3 * n]);
        assert_eq!(stats.gave_up.get("pushback"), Some(&n));
        // Without retries every level sees each call once, and healthy chains succeed.
        sc.policy.retry = None;
        sc.shards[0].failure_rate = 0.0;
        let stats = run(&sc).expect("valid");
        let n = stats.calls;
        assert_eq!(stats.attempts_by_level, [n, n, n]);
        assert_eq!(stats.successes, n);
    }

    #[test]
    fn an_outage_window_fails_only_inside_it() {
        let mut sc = scenario(0.0, policy(None, BudgetKind::Unlimited));
        sc.shards[0].outage = Some(Window {
            from: Duration::from_secs(2),
            until: Duration::from_secs(4),
        });
        let stats = run(&sc).expect("valid");
        for (i, bin) in stats.bins.iter().enumerate() {
            let inside = (4..8).contains(&i);
            let expect = if inside { 0 } else { bin.calls };
            assert_eq!(bin.successes, expect, "bin {i}: {bin:?}");
        }
    }

    /// A one-worker shedding shard for driving `server_arrive` directly.
    fn one_worker_shard(depth: Option<usize>) -> Scenario {
        let mut sc = scenario(0.0, policy(None, BudgetKind::Unlimited));
        sc.shards[0].server = ServerKind::Queue(QueueServer {
            workers: 1,
            service_time: Duration::from_millis(10),
            queue_capacity: 8,
            slowdown: None,
            shedding: Some(AdmissionConfig {
                workers: 1,
                queue_capacity: 8,
                retry_threshold: stormguard_core::admission::RetryThreshold {
                    depth,
                    queue_delay: None,
                },
                min_time_left: Duration::from_millis(2),
                ..AdmissionConfig::default()
            }),
        });
        sc
    }

    /// The codes of the failures answered to `slot` so far.
    fn answered(sim: &Sim<'_>, slot: u32) -> Vec<Code> {
        sim.heap
            .iter()
            .filter_map(|s| match &s.event {
                Event::Response {
                    slot: to,
                    outcome: Outcome::Failed(f),
                    ..
                } if *to == slot => Some(f.code),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn work_expired_on_arrival_is_answered_at_once_not_queued() {
        let sc = one_worker_shard(None);
        let mut sim = Sim::new(&sc, Instant::now()).expect("valid");
        let ms = 1_000_000;
        sim.server_arrive(0, 0, 0, false, None); // takes the worker
        // 1 ms left, under min_time_left: the real queue answers DEADLINE_EXCEEDED now.
        sim.server_arrive(0, 1, 1, false, Some(ms));
        assert!(sim.servers[0].queue.is_empty());
        assert_eq!(answered(&sim, 1), [Code::DeadlineExceeded]);
    }

    #[test]
    fn expired_work_behind_live_work_is_not_counted_as_depth() {
        // Retries shed from 2 queued. A (no deadline) and B (10 ms) queue behind the
        // running call; 20 ms later B has expired behind A. The real queue's timer has
        // taken B out, so a retry arriving now sees depth 1 and queues.
        let sc = one_worker_shard(Some(2));
        let mut sim = Sim::new(&sc, Instant::now()).expect("valid");
        let ms = 1_000_000;
        sim.server_arrive(0, 0, 0, false, None);
        sim.server_arrive(0, 1, 1, false, None);
        sim.server_arrive(0, 2, 2, false, Some(10 * ms));
        assert_eq!(sim.servers[0].queue.len(), 2);
        sim.now = 20 * ms;
        sim.server_arrive(0, 3, 3, true, Some(500 * ms));
        let queued: Vec<u32> = sim.servers[0].queue.iter().map(|j| j.slot).collect();
        assert_eq!(queued, [1, 3]);
        assert_eq!(answered(&sim, 2), [Code::DeadlineExceeded]);
        assert!(answered(&sim, 3).is_empty());
    }

    #[test]
    fn a_shedding_server_sheds_retries_with_pushback_and_serves_first_attempts() {
        // One worker, twice as much work as it can do: the admission policy queues a
        // little, sheds retries first and tells them when to come back.
        let retry = RetryPolicy {
            idempotent: true,
            ..RetryPolicy::default()
        };
        let p = policy(Some(retry), BudgetKind::Unlimited);
        let mut sc = scenario(0.0, p);
        sc.clients = 2;
        sc.rate_per_client = 100.0;
        sc.shards[0].server = ServerKind::Queue(QueueServer {
            workers: 1,
            service_time: Duration::from_millis(10),
            queue_capacity: 1000,
            slowdown: None,
            shedding: Some(AdmissionConfig {
                workers: 1,
                queue_capacity: 4,
                retry_threshold: stormguard_core::admission::RetryThreshold {
                    depth: Some(1),
                    queue_delay: None,
                },
                ..AdmissionConfig::default()
            }),
        });
        let stats = run(&sc).expect("valid");
        // Capacity is 100/s of 200/s offered: about half succeed, and no more attempts
        // than the capacity can serve are wasted on long queues.
        let rate = stats.success_rate();
        assert!((0.35..=0.6).contains(&rate), "{rate}: {stats:?}");
        // The same load on a plain FIFO of the same capacity: the queue grows and every
        // call waits past its deadline.
        if let ServerKind::Queue(q) = &mut sc.shards[0].server {
            q.shedding = None;
        }
        let fifo = run(&sc).expect("valid");
        assert!(fifo.success_rate() < rate / 2.0, "{fifo:?}");
    }
}
