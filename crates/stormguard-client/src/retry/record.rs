//! What one logical call counts, and where: the layer's counters, with a meter its
//! method's metrics, and the layer's events (its name, its breaker's transitions). The
//! layer's future and a committed call's response body record through it; neither the
//! counters ([`RetryStats`](crate::RetryStats)) nor the metrics ([`metrics`](crate::retry::metrics)) know
//! of the other.

use std::sync::Arc;

use stormguard_core::AttemptPlan;
use stormguard_core::Code;
use stormguard_core::Instant;

use super::attempt::Stamps;
use super::events::LayerEvents;
use super::shared::Shared;
use super::stats::RetryStats;
use crate::retry::metrics::CallMetrics;

/// What one logical call counts into: the layer's counters, and its method's counters
/// when the layer records metrics (without the `opentelemetry` feature, nothing more).
///
/// When the call's outcome is recorded, and when it is dropped, it reports the breaker's
/// transitions that no call has reported yet (see [`events`](super::events)).
///
/// It holds the layer's shared state (one reference for the counters, the events and what
/// stamps the call's retries), not a reference to each.
pub(crate) struct CallStats {
    shared: Arc<Shared>,
    metrics: CallMetrics,
}

impl std::fmt::Debug for CallStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CallStats")
            .field("layer", &self.shared.stats)
            .field("metrics", &self.metrics)
            .finish()
    }
}

impl std::ops::Deref for CallStats {
    type Target = RetryStats;

    fn deref(&self) -> &RetryStats {
        &self.shared.stats
    }
}

impl CallStats {
    /// Starts counting a call to `path` through the layer of `shared` (the call names the
    /// layer when it has no name yet).
    pub(crate) fn start(shared: &Arc<Shared>, path: &str) -> Self {
        shared.events.name().get_or_name_after(path);
        Self::with(Arc::clone(shared), shared.call_metrics(path))
    }

    fn with(shared: Arc<Shared>, metrics: CallMetrics) -> Self {
        shared.stats.logical();
        CallStats { shared, metrics }
    }

    /// A call counted into `layer` only, for tests of what counts.
    #[cfg(test)]
    pub(crate) fn new(layer: RetryStats, metrics: CallMetrics) -> Self {
        let controller = stormguard_core::RetryController::new(
            stormguard_core::MethodTable::default(),
            Arc::new(stormguard_core::Unlimited),
            None,
            0,
        )
        .expect("an empty table is valid");
        let layer_shared = crate::RetryLayer::new(controller).with_stats(layer).shared;
        Self::with(layer_shared, metrics)
    }

    /// The layer's events.
    pub(crate) fn events(&self) -> &LayerEvents {
        &self.shared.events
    }

    /// How the layer stamps its attempts.
    pub(crate) fn stamps(&self) -> &Stamps {
        &self.shared.stamps
    }

    pub(crate) fn attempt(&mut self, retry: bool) {
        self.shared.stats.attempt(retry);
        self.metrics.attempt();
    }

    /// A retry is sent as `plan` says: a paid retry, or a transparent one.
    pub(crate) fn retry_attempt(&mut self, plan: &AttemptPlan) {
        if plan.transparent {
            self.shared.stats.transparent_retry();
        } else {
            self.shared.stats.attempt(true);
        }
        self.metrics.retry(plan.transparent);
    }

    /// A hedge was sent.
    pub(crate) fn hedge_attempt(&mut self) {
        self.shared.stats.hedge();
        self.metrics.hedge();
    }

    /// A retry was granted at `now`: the call waits, with no attempt in flight, until it
    /// is sent or the call ends.
    pub(crate) fn retry_waiting(&mut self, now: Instant) {
        self.metrics.waiting(now);
    }

    /// The call ended with `code` (counted once by method and code).
    pub(crate) fn outcome(&mut self, code: Code) {
        self.shared.stats.outcome(code == Code::Ok);
        self.metrics.ended(code);
        self.shared.events.report_breaker();
    }

    /// A committed call's body ended with `code`.
    pub(crate) fn committed_ended(&mut self, code: Code) {
        self.shared.stats.committed_ended(code == Code::Ok);
        self.metrics.ended(code);
        self.shared.events.report_breaker();
    }

    /// Hands the call's counting on (to the response body of a committed call).
    pub(crate) fn take(&mut self) -> CallStats {
        CallStats {
            shared: Arc::clone(&self.shared),
            metrics: std::mem::take(&mut self.metrics),
        }
    }
}

impl Drop for CallStats {
    fn drop(&mut self) {
        // A call dropped before its end (or a committed body dropped before its last frame)
        // still tells what its breaker did.
        self.shared.events.report_breaker();
    }
}
