//! What a client makes of its dependency's load reports (ORCA): no retry to a server that
//! says it is saturated before it starts shedding. The report itself is [`LoadReport`].

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ConfigError;
use crate::wire::MAX_UTILIZATION;
use crate::wire::orca::LoadReport;

/// When a client reads a server as saturated, and for how long it remembers (config key
/// `retry.load_reports`, see `docs/config.md`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SaturationConfig {
    /// A report says "saturated" when its utilization is at least this. Above 0, at most
    /// [`MAX_UTILIZATION`]. Default 0.95.
    pub utilization: f64,
    /// ... and its queue depth is at least this (0: utilization alone decides; a report
    /// without a queue depth then counts by utilization alone too). Default 1.
    pub queue_depth: f64,
    /// Reports fade over this time: each one's weight halves every `window`, and a server
    /// that sent nothing for 4 windows is no longer read as saturated. Above zero.
    /// Default 1 s.
    pub window: Duration,
}

impl Default for SaturationConfig {
    /// Utilization 0.95 with at least 1 call queued, a 1 s window.
    fn default() -> Self {
        SaturationConfig {
            utilization: 0.95,
            queue_depth: 1.0,
            window: Duration::from_secs(1),
        }
    }
}

impl SaturationConfig {
    /// Checks the bounds of every field; the error names it (`retry.load_reports.<field>`).
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !(self.utilization > 0.0 && self.utilization <= MAX_UTILIZATION) {
            return Err(ConfigError::invalid(
                "retry.load_reports.utilization",
                format!("must be above 0 and at most {MAX_UTILIZATION}"),
            ));
        }
        if !(self.queue_depth.is_finite() && self.queue_depth >= 0.0) {
            return Err(ConfigError::invalid(
                "retry.load_reports.queue_depth",
                "must be a finite number, at least 0",
            ));
        }
        if self.window.is_zero() {
            return Err(ConfigError::invalid(
                "retry.load_reports.window",
                "must be above zero",
            ));
        }
        Ok(())
    }

    /// Whether `report` alone says "saturated".
    pub(crate) fn is_saturated(&self, report: &LoadReport) -> bool {
        report.utilization >= self.utilization
            && (self.queue_depth == 0.0 || report.queue_depth.unwrap_or(0.0) >= self.queue_depth)
    }
}

/// At most this many endpoints are remembered; the one heard from longest ago makes room.
pub(crate) const MAX_ENDPOINTS: usize = 1024;

#[derive(Clone, Copy, Debug)]
struct Heard {
    /// Decayed weight of the saturated reports, and of all reports, at `at`.
    saturated: f64,
    all: f64,
    at: Instant,
}

/// What a client's recent load reports say about each endpoint it calls: saturated or
/// not, decayed over [`SaturationConfig::window`]. An endpoint is a key the client
/// chooses (the replica over an endpoint-aware channel, one key for a plain channel).
///
/// An endpoint is *saturated* at `now` when it was heard from within 4 windows and at
/// least half the decayed weight of its reports said "saturated". A retry is refused
/// ([`Refusal::Saturated`](crate::Refusal::Saturated)) when every endpoint heard
/// from is saturated: over several replicas, a retry can still go to one that is not.
///
/// The layer feeds it each attempt's report ([`CallRetry::record_load_report_at`](crate::CallRetry::record_load_report_at))
/// and the retry decision reads it; give it to a controller with
/// [`RetryController::with_saturation`](crate::RetryController::with_saturation).
///
/// ```
/// use std::sync::Arc;
/// use stormguard_core::{Budget, BudgetConfig, MethodTable, RetryBudget, RetryController};
/// use stormguard_core::{RetryPolicy, Saturation, SaturationConfig};
///
/// let sat = Arc::new(Saturation::new(SaturationConfig::default())?);
/// let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default())?);
/// let controller = RetryController::new(MethodTable::uniform(RetryPolicy::default()), budget, None, 1)?
///     .with_saturation(sat);
/// assert!(controller.saturation().is_some());
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Debug)]
pub struct Saturation {
    config: SaturationConfig,
    endpoints: std::sync::Mutex<HashMap<u64, Heard>>,
}

impl Saturation {
    /// A tracker for a valid `config`.
    pub fn new(config: SaturationConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        Ok(Saturation {
            config,
            endpoints: std::sync::Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Heard>> {
        self.endpoints
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn decay(&self, from: Instant, to: Instant) -> f64 {
        let dt = to.saturating_duration_since(from).as_secs_f64();
        0.5f64.powf(dt / self.config.window.as_secs_f64())
    }

    fn fresh(&self, heard: &Heard, now: Instant) -> bool {
        now.saturating_duration_since(heard.at) < self.config.window.saturating_mul(4)
    }

    fn saturated(&self, heard: &Heard, now: Instant) -> bool {
        // Both weights decay alike: their ratio is what the recent reports say.
        self.fresh(heard, now) && heard.all > 0.0 && heard.saturated * 2.0 >= heard.all
    }

    /// `endpoint` answered with `report` at `now`.
    pub(crate) fn record_at(&self, endpoint: u64, report: &LoadReport, now: Instant) {
        let saturated = if self.config.is_saturated(report) {
            1.0
        } else {
            0.0
        };
        let mut endpoints = self.lock();
        if !endpoints.contains_key(&endpoint) && endpoints.len() >= MAX_ENDPOINTS {
            let oldest = endpoints.iter().min_by_key(|(_, h)| h.at).map(|(k, _)| *k);
            if let Some(oldest) = oldest {
                endpoints.remove(&oldest);
            }
        }
        let heard = endpoints.entry(endpoint).or_insert(Heard {
            saturated: 0.0,
            all: 0.0,
            at: now,
        });
        let w = self.decay(heard.at, now);
        heard.saturated = heard.saturated * w + saturated;
        heard.all = heard.all * w + 1.0;
        heard.at = heard.at.max(now);
    }

    /// Whether `endpoint`'s recent reports say it is saturated at `now`.
    #[cfg(test)]
    pub(crate) fn is_saturated_at(&self, endpoint: u64, now: Instant) -> bool {
        self.lock()
            .get(&endpoint)
            .is_some_and(|h| self.saturated(h, now))
    }

    /// Whether a retry must be refused at `now` when the dependency has `endpoints`
    /// endpoints (1 for a single channel; the replicas of an endpoint-aware channel): at
    /// least `endpoints` of them (and at least one) were heard from recently and said
    /// "saturated", and none heard from recently said otherwise. An endpoint not heard
    /// from may take the retry.
    pub(crate) fn refuses_retry_at(&self, endpoints: usize, now: Instant) -> bool {
        let heard = self.lock();
        let mut saturated = 0;
        for h in heard.values().filter(|h| self.fresh(h, now)) {
            if !self.saturated(h, now) {
                return false;
            }
            saturated += 1;
        }
        saturated >= endpoints.max(1)
    }
}

#[cfg(test)]
mod tests;
