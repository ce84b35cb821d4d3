//! A call that committed: what its end still records.

use std::fmt;
use std::sync::Arc;

use tokio::time::Instant;

use super::{record_outcome, record_success};
use crate::retry::breaker::BreakerPermit;
use crate::retry::shared::Shared;
use crate::wire::code::{Code, CodeSet};
use crate::wire::orca::LoadReport;

/// A call that committed ([`CallRetry::commit_at`](super::CallRetry::commit_at)): response
/// headers without a status arrived, so it is never retried, and its outcome comes with
/// its trailers. It holds only what that outcome is recorded in (the budget, the breaker
/// permit, the budget key) and the call's deadline, so that the response body that carries
/// it to the end of the call stays small.
///
/// ```
/// use std::sync::Arc;
/// use stormguard_core::{Budget, BudgetConfig, CallTimes, Code, Instant, MethodTable};
/// use stormguard_core::{RetryBudget, RetryController, RetryPolicy};
///
/// let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default())?);
/// let controller = RetryController::new(MethodTable::uniform(RetryPolicy::default()), budget, None, 1)?;
/// let now = Instant::now();
/// let mut call = controller.begin_call_at("/pkg.Svc/Watch", &CallTimes::default(), now).unwrap();
/// call.first_attempt_at(now);
/// let mut committed = call.commit_at(now);
/// // The stream ends `OK`: a success, as `CallRetry::on_committed_at` records it.
/// committed.on_ended_at(Code::Ok, now);
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
pub struct CommittedCall {
    pub(super) shared: Arc<Shared>,
    /// The codes that count as failures of the dependency for this method.
    pub(super) retryable: CodeSet,
    pub(super) permit: Option<BreakerPermit>,
    pub(super) key: Option<u64>,
    pub(super) deadline: Option<Instant>,
}

impl CommittedCall {
    /// The caller's deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.deadline
    }

    /// The call ended at `now` with `code` (its trailers' status): recorded in the budget
    /// and the breaker exactly as [`CallRetry::on_committed_at`](super::CallRetry::on_committed_at)
    /// records it.
    pub fn on_ended_at(&mut self, code: Code, now: Instant) {
        if code == Code::Ok {
            record_success(&self.shared, &mut self.permit, self.key, now);
        } else {
            let retryable = self.retryable.contains(code);
            record_outcome(&self.shared, &mut self.permit, retryable, code, None, now);
        }
    }

    /// A load report arrived with the call's end from `endpoint` (see
    /// [`CallRetry::record_load_report_at`](super::CallRetry::record_load_report_at)).
    pub fn record_load_report_at(&self, endpoint: u64, report: &LoadReport, now: Instant) {
        if let Some(saturation) = &self.shared.saturation {
            saturation.record_at(endpoint, report, now);
        }
    }
}

impl fmt::Debug for CommittedCall {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommittedCall")
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}
