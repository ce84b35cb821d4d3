//! The retry controller a [`ClientConfig`] describes: its method table, the budget or A6
//! bucket it names, its breaker and its load reports, built in one place.

use std::sync::Arc;

use super::{BudgetChoice, ClientConfig};
use crate::budget::{A6Budget, Budget, DEFAULT_MAX_KEYS, KeyedBudgets, RetryBudget};
use crate::error::ConfigError;
use crate::retry::{RetryController, Saturation};

impl RetryController {
    /// A controller for `config` (validated first): its method table, the budget or A6
    /// bucket it names, and its breaker, their random draws seeded by [`ClientConfig::seed`]
    /// (so a seeded run can be reproduced; `None` draws a seed).
    ///
    /// ```
    /// use stormguard_core::{CallTimes, ClientConfig, Instant, RetryController};
    ///
    /// let controller = RetryController::from_config(&ClientConfig::default().with_seed(7)).unwrap();
    /// let call = controller.begin_call_at("/pkg.Svc/Get", &CallTimes::default(), Instant::now());
    /// assert!(call.unwrap().is_retryable_method());
    /// ```
    pub fn from_config(config: &ClientConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let seed = config.seed.unwrap_or_else(|| fastrand::u64(..));
        let budget: Arc<dyn Budget> = match &config.budget {
            BudgetChoice::Stormguard(b) => Arc::new(RetryBudget::new(b.clone())?),
            BudgetChoice::A6(t) => Arc::new(A6Budget::new(t.clone())?),
        };
        let mut controller =
            RetryController::seeded(config.methods.clone(), budget, config.breaker.clone(), seed)?;
        if let Some(load_reports) = config.load_reports {
            controller = controller.with_saturation(Arc::new(Saturation::new(load_reports)?));
        }
        Ok(match &config.budget {
            // One account per replica (or shard) beside the shared budget; an A6 throttle
            // is one token bucket, as A6 defines it.
            BudgetChoice::Stormguard(b) => {
                controller.with_key_budgets(KeyedBudgets::new(b.clone(), DEFAULT_MAX_KEYS)?)
            }
            BudgetChoice::A6(_) => controller,
        })
    }
}
