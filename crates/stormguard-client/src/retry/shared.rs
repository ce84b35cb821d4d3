//! What a [`RetryLayer`](crate::RetryLayer) shares with every service it builds, their
//! response futures and the counting of their calls: the controller, the counters and the
//! layer's settings.

use std::sync::Arc;
use std::time::Duration;

use stormguard_core::AdaptiveThrottle;
use stormguard_core::RetryController;

use super::attempt::Stamps;
use super::events::LayerEvents;
use super::stats::RetryStats;

/// A function from a request to its budget key.
pub(super) type BudgetKey =
    Arc<dyn Fn(&http::Request<tonic::body::Body>) -> Option<u64> + Send + Sync>;

#[derive(Clone)]
pub(super) struct Shared {
    pub(super) controller: RetryController,
    pub(super) stats: RetryStats,
    pub(super) replay_limit: usize,
    pub(super) default_timeout: Option<Duration>,
    pub(super) per_attempt_timeout: Option<Duration>,
    /// Whether each call carries a [`Route`](crate::replicas::Route) for the channel below.
    pub(super) over_replicas: bool,
    /// The budget key of a call, from its request (`budget_key`).
    pub(super) budget_key: Option<BudgetKey>,
    pub(super) stamps: Arc<Stamps>,
    /// The layer's name, refusal summary and breaker watch.
    pub(super) events: Arc<LayerEvents>,
    /// The client-side adaptive throttle, if any (off by default).
    pub(super) throttle: Option<AdaptiveThrottle>,
    #[cfg(feature = "opentelemetry")]
    pub(super) meter: Option<opentelemetry::metrics::Meter>,
    /// The instruments, registered on `meter` when the layer first builds a service: by
    /// then `with_stats`, `with_meter` and `with_name` have all been applied, in whatever
    /// order. (A meter keeps every callback registered on it, so registering once per
    /// configuration is the only way not to export a series twice.)
    /// The `grpc.target` of the per-call retry histograms (`with_target`).
    #[cfg(feature = "opentelemetry")]
    pub(super) target: Option<Arc<str>>,
    #[cfg(feature = "opentelemetry")]
    pub(super) metrics: std::sync::OnceLock<Arc<crate::retry::metrics::ClientMetrics>>,
}

impl Shared {
    /// The per-method counters of a new call to `path` (none without a meter).
    pub(super) fn call_metrics(&self, path: &str) -> crate::retry::metrics::CallMetrics {
        #[cfg(feature = "opentelemetry")]
        if let Some(metrics) = self.metrics.get() {
            return metrics.call(path);
        }
        let _ = path;
        crate::retry::metrics::CallMetrics::none()
    }

    /// Registers the instruments, once, if the layer has a meter.
    pub(super) fn register_metrics(&self) {
        #[cfg(feature = "opentelemetry")]
        if let Some(meter) = &self.meter {
            self.metrics.get_or_init(|| {
                Arc::new(crate::retry::metrics::ClientMetrics::register(
                    meter,
                    &self.stats,
                    &self.controller,
                    self.events.name(),
                    self.target.clone(),
                ))
            });
        }
    }
}
