//! The [`ShedStats`] handle: one layer's counters, read from its gate, its drains and the
//! calls it never sheds.

use std::sync::Arc;

use super::counters::{DrainCounts, Occupancy, ShedSnapshot};
use super::drain::Drains;
use super::exempt::Bypassed;
use super::gate::Gate;

/// A cloneable handle on one [`ShedLayer`](crate::ShedLayer)'s counters.
///
/// Take it from the layer before handing the layer to the server builder:
///
/// ```
/// use stormguard_server::{AdmissionConfig, ShedLayer};
///
/// let layer = ShedLayer::from_config(&AdmissionConfig::default()).expect("valid config");
/// let stats = layer.stats();
/// // ... Server::builder().layer(layer) ...
/// assert_eq!(stats.snapshot().admitted, 0);
/// ```
#[derive(Clone)]
pub struct ShedStats {
    gate: Arc<Gate>,
    drains: Arc<Drains>,
    bypassed: Arc<Bypassed>,
}

impl ShedStats {
    pub(crate) fn new(gate: Arc<Gate>, drains: Arc<Drains>, bypassed: Arc<Bypassed>) -> Self {
        ShedStats {
            gate,
            drains,
            bypassed,
        }
    }

    /// Calls that bypassed the queue because they are never shed (health checks and
    /// the paths named with [`ShedLayer::never_shed`](crate::ShedLayer::never_shed)).
    pub fn never_shed(&self) -> u64 {
        self.bypassed.get()
    }

    /// What happened to the request bodies of calls answered before they were read
    /// (see [`drain`](crate::shed::drain)).
    pub fn drains(&self) -> DrainCounts {
        self.drains.counts()
    }

    /// The counters now.
    pub fn snapshot(&self) -> ShedSnapshot {
        self.gate.counters().snapshot()
    }

    /// The number of workers (the concurrency bound; with an adaptive limit, where it
    /// stands now).
    pub fn workers(&self) -> usize {
        self.gate.counters().workers()
    }

    /// Exact occupancy read under the queue's lock: free workers, calls waiting, and
    /// calls taken off the queue whose future has not yet seen its outcome. At rest
    /// (no call in progress) it is `(workers, 0, 0)`: anything else is a leak.
    pub fn occupancy(&self) -> Occupancy {
        self.gate.occupancy()
    }
}

impl std::fmt::Debug for ShedStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShedStats")
            .field("snapshot", &self.snapshot())
            .field("drains", &self.drains())
            .finish()
    }
}
