//! stormguard-sim: a deterministic fleet simulator over stormguard's real policy objects.
//!
//! # Why
//!
//! End-to-end tests run real tonic on one machine: tens of clients, one server. Users run
//! hundreds of client pods against tiers of services, and some effects only appear at
//! that scale: a retry-budget floor of 5 retries/s *per pod* is 5,000 retries/s from
//! 1,000 pods against a dead dependency; breakers that opened together probe together;
//! one bad shard drains a budget shared with nine healthy ones. This crate shows those
//! effects on a virtual clock, in seconds of wall time, before users meet them.
//!
//! # No copies of the policy
//!
//! The simulator decides nothing about retries itself. Each simulated client process owns
//! a real [`RetryController`](stormguard_core::retry::RetryController) with its own
//! budget ([`RetryBudget`](stormguard_core::budget::RetryBudget),
//! [`A6Throttle`](stormguard_core::throttle::A6Throttle) or
//! [`Unlimited`](stormguard_core::budget::Unlimited)) and its own optional
//! [`CircuitBreaker`](stormguard_core::breaker::CircuitBreaker), exactly as the client
//! layer builds them; each logical call is a real
//! [`CallRetry`](stormguard_core::retry::CallRetry), so backoff, pushback, deadlines,
//! attempt limits, breaker and budget are the production code paths. The calls are made at
//! the moments the client layer makes them: a success, a failure, an attempt that ran out
//! of its per-attempt timeout (a failure of the dependency, retried whatever the codes),
//! the caller's own deadline running out (final, and recorded nowhere), the start of a
//! retry; and the per-attempt timeout is the one the layer would use (the method's retry
//! policy's, else the layer's own). A shedding server
//! ([`SimServer`]) is the same
//! [`AdmissionQueue`](stormguard_core::queue::AdmissionQueue) the server layer wraps: it
//! decides what to admit, queue or shed, what pushback to send, which work is refused for
//! lack of time, which queued call a freed worker goes to and when queued work has
//! expired, and it cannot drift from the layer (a test in `stormguard-server` runs one
//! script through both and compares every decision). What the simulator adds is only the
//! world around them: Poisson arrivals, network delay, failure injection.
//!
//! # Layout
//!
//! `scenario` (what a run simulates), `event` (the events and the virtual clock they wait
//! on), `fleet` (the clients and their calls), `server` ([`SimServer`]), `event_loop`
//! ([`run`]: takes each event off the clock and hands it to the fleet or the servers,
//! which know nothing of each other or of the loop), `stats` ([`RunStats`]), `tables`
//! (the experiments) and `text_table` (the one printer of their tables).
//!
//! # Determinism
//!
//! Events run in (virtual time, sequence) order from a binary heap, all randomness comes
//! from seeded generators, and the instants given to the core objects are
//! `base + offset` where only differences matter. The same [`Scenario`] gives the same
//! [`RunStats`], and the same [`Options`] give the same [`Tables`] and JSON bytes.
//!
//! # The six tables
//!
//! [`Tables::run`] produces them (`cargo run --release --example sim -- --json FILE`
//! prints them and writes the JSON):
//!
//! 1. [`amplification`]: attempts per logical call and success rate against the failure
//!    rate, for no retries, 3 attempts, the A6 throttle and stormguard's budget;
//! 2. [`fleet_floor`]: retries per second reaching a dead dependency from 1 to 1,000
//!    client processes, per-process floor against fleet-aware floor;
//! 3. [`recovery`]: time to recover from a capacity drop per policy, with a plain FIFO
//!    server and with stormguard's admission policy;
//! 4. [`partial_failure`]: one bad shard of ten, one budget per process against one per
//!    shard;
//! 5. [`call_chain`]: attempts reaching the bottom of a call chain;
//! 6. [`hedging`]: a hedged method through a capacity drop, every hedge granted against
//!    hedges paid from the budget.
//!
//! A hedged
//! call is driven by [`HedgedCall`], which makes core's hedging calls in the order the
//! client layer's hedged future makes them; a scenario hedges when its
//! [`ClientPolicy::hedging`] is set. [`storm_scenario`] runs the storm of a
//! [`StormConfig`] (the one type of the storm's settings), for setting its figures beside the real layers' on
//! turmoil (`examples/fleet_sim.rs`).
//!
//! # Example
//!
//! ```
//! use std::time::Duration;
//! use stormguard_sim::{Options, PolicyName, amplification_scenario, run};
//!
//! // Three attempts against a server that fails every call: 3 attempts per call.
//! let options = Options { quick: true, seed: 7 };
//! let mut scenario = amplification_scenario(PolicyName::ThreeAttempts, 1.0, &options);
//! scenario.duration = Duration::from_secs(4);
//! let stats = run(&scenario)?;
//! assert_eq!(stats.amplification(), 3.0);
//! assert_eq!(stats.success_rate(), 0.0);
//! # Ok::<(), stormguard_sim::SimError>(())
//! ```

mod client;
mod event;
mod event_loop;
mod fleet;
mod hedged;
mod scenario;
mod server;
mod stats;
mod storm;
mod tables;
mod text_table;

pub use client::{End, SimCall, Step};
pub use event::Job;
pub use event_loop::run;
pub use hedged::{Action, HedgedCall};
pub use scenario::{
    BudgetKind, ClientPolicy, PATH, QueueServer, Scenario, ServerKind, Shard, Tier, Window,
};
pub use server::{ServerAction, SimServer};
pub use stats::{Bin, RunStats, ShardStats};
pub use storm::{StormConfig, StormPolicy, storm_scenario};
pub use tables::*;

use stormguard_core::config::ConfigError;

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A scenario parameter is out of range.
    #[error("invalid scenario: {field}: {reason}")]
    Scenario {
        /// The parameter.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A core configuration (budget, throttle, breaker, retry policy, admission) was
    /// refused by the core object it configures.
    #[error(transparent)]
    Config(#[from] ConfigError),
}
