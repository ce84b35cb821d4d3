//! What a run measured: totals over the measured window, per shard, per level of a call
//! chain, and bin by bin.

use std::collections::BTreeMap;

use serde::Serialize;

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
    /// Hedges sent in the bin (copies of a hedged call after its first).
    pub hedges: u64,
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
    /// Hedges sent (copies of a hedged call after its first): with the first attempts
    /// and the retries, they make up `attempts`.
    pub hedges: u64,
    /// Calls a hedge won (its `OK` came before any other copy's).
    pub hedges_won: u64,
    /// Why failed calls stopped, by [`Refusal`](stormguard_core::Refusal) name; `"rejected_by_breaker"` counts calls
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
