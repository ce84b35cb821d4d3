//! What a [`RetryController`](super::RetryController) and every call it starts share: the
//! dependency's method table, budget, breaker and the rest, in one allocation. The
//! controller builds it; a call ([`CallRetry`](super::CallRetry)) holds it for its life.

use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use super::breaker::CircuitBreaker;
use super::connect::ConnectBackoff;
use super::delay::DelayEstimator;
use super::policy::{HedgingPolicy, MethodTable};
use super::saturation::Saturation;
use crate::budget::{Budget, KeyedBudgets};

/// The state of one dependency's retry policy, shared by its controller's clones and the
/// calls they start.
pub(in crate::retry) struct Shared {
    pub(in crate::retry) methods: MethodTable,
    pub(in crate::retry) budget: Arc<dyn Budget>,
    pub(in crate::retry) breaker: Option<CircuitBreaker>,
    /// Accounts per key (replica or shard), when the budget is stormguard's.
    pub(in crate::retry) keyed: Option<Arc<KeyedBudgets>>,
    /// What the dependency's load reports say, when the layer reads them.
    pub(in crate::retry) saturation: Option<Arc<Saturation>>,
    /// The learned hedge delays, one per hedging policy of the table that learns its delay
    /// (found by the policy's address: a lookup allocates nothing).
    pub(in crate::retry) estimators: Vec<(Arc<HedgingPolicy>, Arc<DelayEstimator>)>,
    pub(in crate::retry) seed: u64,
    pub(in crate::retry) calls: AtomicU64,
    /// How long a transparent retry waits after a refused connection, and whether a first
    /// attempt may be sent meanwhile.
    pub(in crate::retry) connect: Arc<ConnectBackoff>,
}
