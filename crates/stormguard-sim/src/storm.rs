//! The storm as the real layers run it, parameter for parameter: a fleet of client
//! processes over a few replicas of a server with a fixed worker count, a capacity drop,
//! and the storm's four policies (`naive`, `client-only`, `server-only`, `stormguard`).
//!
//! # Why
//!
//! Table 3 ([`recovery_scenario`](crate::recovery_scenario)) is the storm scaled ×10 on
//! one server; the fleet run on turmoil (`examples/fleet_sim.rs`) puts the real
//! `RetryLayer`, `Replicas` and `ShedLayer` on many simulated hosts. To set the two side by
//! side, the simulator must run *the same* parameters: the same fleet, servers, workers,
//! service time, offered rate, trigger, deadline, per-attempt timeout, backoff and network
//! delay. [`storm_scenario`] builds that [`Scenario`] from [`StormConfig`]; everything it
//! needs already exists in the model (shards stand for the replicas, each a
//! [`QueueServer`]), so this module only chooses values.

use std::time::Duration;

use stormguard_core::AdmissionConfig;

use stormguard_core::WorkerLimit;

use crate::scenario::{QueueServer, Scenario, ServerKind, Shard, Window, mix};
use crate::tables::{PolicyName, a6_backoff, client};

/// The storm's policies, as the `storm` example names them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StormPolicy {
    /// 3 attempts, a fixed backoff, no budget; plain FIFO servers.
    Naive,
    /// stormguard's retry budget (defaults); plain FIFO servers.
    ClientOnly,
    /// 3 attempts, no budget, against servers with stormguard's admission policy.
    ServerOnly,
    /// stormguard's budget against servers with stormguard's admission policy.
    Stormguard,
}

impl StormPolicy {
    /// The four, in the storm's order.
    pub const ALL: [StormPolicy; 4] = [
        StormPolicy::Naive,
        StormPolicy::ClientOnly,
        StormPolicy::ServerOnly,
        StormPolicy::Stormguard,
    ];

    /// The storm's name for it.
    pub fn as_str(self) -> &'static str {
        match self {
            StormPolicy::Naive => "naive",
            StormPolicy::ClientOnly => "client-only",
            StormPolicy::ServerOnly => "server-only",
            StormPolicy::Stormguard => "stormguard",
        }
    }

    fn client(self) -> PolicyName {
        match self {
            StormPolicy::Naive | StormPolicy::ServerOnly => PolicyName::ThreeAttempts,
            StormPolicy::ClientOnly | StormPolicy::Stormguard => PolicyName::Stormguard,
        }
    }

    fn sheds(self) -> bool {
        matches!(self, StormPolicy::ServerOnly | StormPolicy::Stormguard)
    }
}

/// The storm's settings, one type for every run of it: on real tonic over loopback
/// (`stormguard_demo::storm::run_storm`), on turmoil (`stormguard_demo::storm::fleet_sim`)
/// and in this simulator ([`storm_scenario`]). Each run adds only what its world needs
/// (the loopback run its capacity measurement and server model, turmoil its network).
///
/// A fleet of `clients` offers `load` of the servers' capacity as Poisson calls; the
/// service time is multiplied by `slowdown` for `trigger_s` seconds after `warmup_s`, and
/// the run goes on `after_s` seconds more.
#[derive(Clone, Debug, PartialEq)]
pub struct StormConfig {
    /// Client processes (hosts), each with its own retry policy and budget.
    pub clients: usize,
    /// Server replicas every client balances over.
    pub servers: usize,
    /// Calls each server runs at once.
    pub workers: usize,
    /// Time one call holds a worker at normal speed.
    pub service_time: Duration,
    /// The trigger multiplies the service time by this.
    pub slowdown: f64,
    /// Offered load as a share of the capacity, `servers × workers / service_time` (the
    /// loopback run measures its server's capacity instead).
    pub load: f64,
    /// Deadline of a logical call.
    pub deadline: Duration,
    /// The longest one attempt may take, for every policy.
    pub per_attempt: Duration,
    /// The naive clients' fixed delay between attempts (and the first window of the
    /// jittered one).
    pub naive_backoff: Duration,
    /// Attempts of the naive clients.
    pub naive_attempts: u32,
    /// Seconds before the trigger.
    pub warmup_s: u32,
    /// Seconds of the trigger.
    pub trigger_s: u32,
    /// Seconds after the trigger.
    pub after_s: u32,
    /// Seed of the whole run: arrivals, jitter, every layer's RNG.
    pub seed: u64,
}

impl StormConfig {
    /// The storm on one server over loopback: 8 workers × 10 ms, 78 % load, 200 ms
    /// deadline (room for three whole attempts and their delays), 50 ms per attempt,
    /// service time × 2.5 from 5 s to 9 s, 16 s after.
    pub fn loopback() -> Self {
        StormConfig {
            clients: 1,
            servers: 1,
            workers: 8,
            service_time: Duration::from_millis(10),
            slowdown: 2.5,
            load: 0.78,
            deadline: Duration::from_millis(200),
            per_attempt: Duration::from_millis(50),
            naive_backoff: Duration::from_millis(10),
            naive_attempts: 3,
            warmup_s: 5,
            trigger_s: 4,
            after_s: 16,
            seed: 1,
        }
    }

    /// [`loopback`](Self::loopback), shorter for tests: 1 s before, 2 s of trigger, 3 s
    /// after.
    pub fn loopback_quick() -> Self {
        StormConfig {
            warmup_s: 1,
            trigger_s: 2,
            after_s: 3,
            ..StormConfig::loopback()
        }
    }

    /// The storm at fleet scale: 20 client hosts, 2 servers of 8 workers × 10 ms
    /// (1,600 calls/s), 78 % load, 200 ms deadline, 50 ms per attempt, service time × 2.5
    /// from 5 s to 8 s, 12 s after.
    pub fn fleet() -> Self {
        StormConfig {
            clients: 20,
            servers: 2,
            trigger_s: 3,
            after_s: 12,
            ..StormConfig::loopback()
        }
    }

    /// [`fleet`](Self::fleet), shorter: 2 s before, 2 s of trigger, 4 s after.
    pub fn fleet_quick() -> Self {
        StormConfig {
            warmup_s: 2,
            trigger_s: 2,
            after_s: 4,
            ..StormConfig::fleet()
        }
    }

    /// Seconds of one policy's run.
    pub fn total_s(&self) -> u32 {
        self.warmup_s + self.trigger_s + self.after_s
    }

    /// Completions per second of all servers at the normal service time.
    pub fn capacity(&self) -> f64 {
        (self.servers * self.workers) as f64 / self.service_time.as_secs_f64()
    }

    /// Logical calls offered per second by the whole fleet: `load` of the capacity.
    pub fn offered_per_second(&self) -> f64 {
        self.load * self.capacity()
    }

    /// When the service time is slowed.
    pub fn trigger(&self) -> Window {
        Window {
            from: secs(self.warmup_s),
            until: secs(self.warmup_s + self.trigger_s),
        }
    }
}

fn secs(s: u32) -> Duration {
    Duration::from_secs(u64::from(s))
}

/// The scenario of `policy` over `storm`, with `network` one-way delay between a client
/// and a server, in 1 s bins.
///
/// The servers of the shedding policies use the admission defaults with the server's
/// worker count (as the storm's `ShedLayer` does: a queue of 64, adaptive LIFO, retries
/// shed first); the others are plain FIFO servers that drop the work of a caller that
/// reset its stream, as the storm's (its cancelling model). Totals count from the start: read the
/// bins for before, during and after the trigger.
///
/// ```
/// use std::time::Duration;
/// use stormguard_sim::{StormConfig, StormPolicy, run, storm_scenario};
///
/// let storm = StormConfig {
///     clients: 4,
///     warmup_s: 1,
///     trigger_s: 1,
///     after_s: 2,
///     seed: 7,
///     ..StormConfig::fleet()
/// };
/// let scenario = storm_scenario(StormPolicy::Stormguard, &storm, Duration::from_millis(1));
/// let stats = run(&scenario)?;
/// // Healthy before the trigger: every call of the first second succeeds.
/// assert_eq!(stats.bins[0].successes, stats.bins[0].calls);
/// # Ok::<(), stormguard_sim::SimError>(())
/// ```
pub fn storm_scenario(policy: StormPolicy, storm: &StormConfig, network: Duration) -> Scenario {
    let mut client_policy = client(
        policy.client(),
        storm.deadline,
        Some(storm.per_attempt),
        a6_backoff(storm.naive_backoff),
    );
    client_policy.name = policy.as_str().to_owned();
    let server = QueueServer {
        workers: storm.workers,
        service_time: storm.service_time,
        queue_capacity: 10_000,
        slowdown: Some((storm.trigger(), storm.slowdown)),
        // The storm's servers are tonic handlers waiting for a worker: a caller that
        // resets its stream drops its work.
        drops_abandoned: true,
        shedding: policy.sheds().then(|| AdmissionConfig {
            workers: WorkerLimit::Fixed(storm.workers),
            ..AdmissionConfig::default()
        }),
    };
    Scenario {
        clients: storm.clients,
        rate_per_client: storm.offered_per_second() / storm.clients.max(1) as f64,
        duration: secs(storm.total_s()),
        measure_from: Duration::ZERO,
        bin: Duration::from_secs(1),
        network,
        tiers: vec![],
        shards: (0..storm.servers)
            .map(|_| Shard {
                server: ServerKind::Queue(server.clone()),
                failure_rate: 0.0,
                outage: None,
            })
            .collect(),
        policy: client_policy,
        seed: mix(storm.seed, 21_000),
    }
}
