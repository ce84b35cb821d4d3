//! What a replica's load reports (ORCA) do to its share: gRPC A58's weight, as a factor
//! that can only lower it.

use tokio::time::Instant;

use super::{ReplicaId, ReplicaSet};
use crate::wire::orca::LoadReport;

/// gRPC A58's weight of an endpoint from its report:
/// `qps / (utilization + eps / qps * error_utilization_penalty)`; `None` when the report
/// cannot weight (no requests, or no utilization), as A58 ignores such reports.
pub fn a58_weight(report: &LoadReport, error_utilization_penalty: f64) -> Option<f64> {
    if report.rps <= 0.0 {
        return None;
    }
    let penalty = report.eps / report.rps * error_utilization_penalty;
    let denominator = report.utilization + penalty;
    (denominator > 0.0).then(|| report.rps / denominator)
}

/// A replica's latest A58 weight from its load reports.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReportWeight {
    pub(super) weight: f64,
    /// Since when it has sent reports without a gap of `expiration_period`.
    pub(super) non_empty_since: Instant,
    pub(super) last_update: Instant,
}

impl ReplicaSet {
    /// `id` answered with the load report `report` at `now` (from the trailers of an
    /// attempt the channel sent it). A report whose A58 weight is not defined (no requests,
    /// no utilization) is ignored, as A58 ignores it; a replica not in the set, too.
    pub fn record_load_at(&mut self, id: ReplicaId, report: &LoadReport, now: Instant) {
        let config = &self.config.reports;
        if !config.enabled {
            return;
        }
        let Some(weight) = a58_weight(report, config.error_utilization_penalty) else {
            return;
        };
        let expiration = config.expiration_period;
        let Some(i) = self.index(id) else {
            return;
        };
        let r = &mut self.replicas[i];
        let non_empty_since = match r.report {
            Some(w) if now.saturating_duration_since(w.last_update) < expiration => {
                w.non_empty_since
            }
            _ => now,
        };
        r.report = Some(ReportWeight {
            weight,
            non_empty_since,
            last_update: now,
        });
    }

    #[cfg(test)]
    /// What `id`'s load reports multiply its share by at `now`: its A58 weight over the
    /// largest A58 weight among the replicas whose reports count, at least
    /// [`ReportWeightConfig::min_factor`](crate::ReportWeightConfig::min_factor) and at most 1; 1 when its reports do not count
    /// (none, in blackout, expired, or reports disabled). Never above 1: a report only
    /// lowers a share. `None` for a replica not in the set.
    pub(crate) fn report_factor_at(&self, id: ReplicaId, now: Instant) -> Option<f64> {
        self.index(id)
            .map(|i| self.factor_at(&self.replicas[i], now))
    }
}
