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
//! delay. [`storm_scenario`] builds that [`Scenario`] from [`StormParams`]; everything it
//! needs already exists in the model (shards stand for the replicas, each a
//! [`QueueServer`]), so this module only chooses values.

use std::time::Duration;

use stormguard_core::AdmissionConfig;

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

/// Every parameter of a storm run.
#[derive(Clone, Debug, PartialEq)]
pub struct StormParams {
    /// Client processes, each with its own budget.
    pub clients: usize,
    /// Server replicas; a call goes to one at random.
    pub servers: usize,
    /// Workers of each server.
    pub workers: usize,
    /// Time one call holds a worker, at normal speed.
    pub service_time: Duration,
    /// Logical calls offered per second by the whole fleet (Poisson).
    pub offered_per_second: f64,
    /// The trigger multiplies the service time by this...
    pub slowdown: f64,
    /// ...during this window.
    pub trigger: Window,
    /// Length of the run (arrivals stop then).
    pub duration: Duration,
    /// Deadline of a logical call.
    pub deadline: Duration,
    /// Per-attempt timeout of every policy.
    pub per_attempt: Duration,
    /// The naive clients' fixed delay between attempts.
    pub naive_backoff: Duration,
    /// One-way network delay between a client and a server.
    pub network: Duration,
    /// Width of one bin of the time series.
    pub bin: Duration,
}

/// The scenario of `policy` over `params`, seeded with `seed`.
///
/// The servers of the shedding policies use the admission defaults with the server's
/// worker count (as the storm's `ShedLayer` does: a queue of 64, adaptive LIFO, retries
/// shed first); the others are plain FIFO servers that drop the work of a caller that
/// reset its stream, as the storm's (its cancelling model). Totals count from the start: read the
/// bins for before, during and after the trigger.
///
/// ```
/// use std::time::Duration;
/// use stormguard_sim::{StormParams, StormPolicy, Window, run, storm_scenario};
///
/// let params = StormParams {
///     clients: 4,
///     servers: 2,
///     workers: 8,
///     service_time: Duration::from_millis(10),
///     offered_per_second: 1_000.0,
///     slowdown: 2.5,
///     trigger: Window { from: Duration::from_secs(1), until: Duration::from_secs(2) },
///     duration: Duration::from_secs(4),
///     deadline: Duration::from_millis(200),
///     per_attempt: Duration::from_millis(50),
///     naive_backoff: Duration::from_millis(10),
///     network: Duration::from_millis(1),
///     bin: Duration::from_secs(1),
/// };
/// let stats = run(&storm_scenario(StormPolicy::Stormguard, &params, 7))?;
/// // Healthy before the trigger: every call of the first second succeeds.
/// assert_eq!(stats.bins[0].successes, stats.bins[0].calls);
/// # Ok::<(), stormguard_sim::SimError>(())
/// ```
pub fn storm_scenario(policy: StormPolicy, params: &StormParams, seed: u64) -> Scenario {
    let mut client_policy = client(
        policy.client(),
        params.deadline,
        Some(params.per_attempt),
        a6_backoff(params.naive_backoff),
    );
    client_policy.name = policy.as_str().to_owned();
    let server = QueueServer {
        workers: params.workers,
        service_time: params.service_time,
        queue_capacity: 10_000,
        slowdown: Some((params.trigger, params.slowdown)),
        // The storm's servers are tonic handlers waiting for a worker: a caller that
        // resets its stream drops its work.
        drops_abandoned: true,
        shedding: policy.sheds().then(|| AdmissionConfig {
            workers: params.workers,
            ..AdmissionConfig::default()
        }),
    };
    Scenario {
        clients: params.clients,
        rate_per_client: params.offered_per_second / params.clients.max(1) as f64,
        duration: params.duration,
        measure_from: Duration::ZERO,
        bin: params.bin,
        network: params.network,
        tiers: vec![],
        shards: (0..params.servers)
            .map(|_| Shard {
                server: ServerKind::Queue(server.clone()),
                failure_rate: 0.0,
                outage: None,
            })
            .collect(),
        policy: client_policy,
        seed: mix(seed, 21_000),
    }
}
