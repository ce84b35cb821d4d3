//! What one logical call counts, and where: the layer's counters and, with a meter, its
//! method's metrics. The layer's future and a committed call's response body record
//! through it; neither the counters ([`stats`](crate::stats)) nor the metrics
//! ([`metrics`](crate::metrics)) know of the other.

use stormguard_core::code::Code;

use crate::metrics::CallMetrics;
use crate::stats::RetryStats;

/// What one logical call counts into: the layer's counters, and its method's counters
/// when the layer records metrics (without the `opentelemetry` feature, nothing more).
#[derive(Debug)]
pub(crate) struct CallStats {
    layer: RetryStats,
    metrics: CallMetrics,
}

impl std::ops::Deref for CallStats {
    type Target = RetryStats;

    fn deref(&self) -> &RetryStats {
        &self.layer
    }
}

impl CallStats {
    pub(crate) fn new(layer: RetryStats, metrics: CallMetrics) -> Self {
        layer.logical();
        CallStats { layer, metrics }
    }

    pub(crate) fn attempt(&self, retry: bool) {
        self.layer.attempt(retry);
        self.metrics.attempt();
    }

    /// The call ended with `code` (counted once by method and code).
    pub(crate) fn outcome(&mut self, code: Code) {
        self.layer.outcome(code == Code::Ok);
        self.metrics.ended(code);
    }

    /// A committed call's body ended with `code`.
    pub(crate) fn committed_ended(&mut self, code: Code) {
        self.layer.committed_ended(code == Code::Ok);
        self.metrics.ended(code);
    }

    /// Hands the call's counting on (to the response body of a committed call).
    pub(crate) fn take(&mut self) -> CallStats {
        CallStats {
            layer: self.layer.clone(),
            metrics: std::mem::take(&mut self.metrics),
        }
    }
}
