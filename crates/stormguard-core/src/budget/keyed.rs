//! Budgets per key: a replica's (or a shard's) failures paid from its own successes.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Mutex, PoisonError};

use tokio::time::Instant;

use super::{Budget, BudgetConfig, RetryBudget};
use crate::error::ConfigError;
use crate::field::check;

/// The most keys a [`KeyedBudgets`] tracks by default.
pub(crate) const DEFAULT_MAX_KEYS: usize = 256;

/// One [`RetryBudget`] per key (a replica, a shard), each minted only by the successes of
/// its key, beside the shared budget that still bounds the whole dependency.
///
/// # Why
///
/// With one shared budget, the hardest case is lost: one bad shard returns
/// errors while nine are healthy, the healthy ones' successes keep refilling the budget,
/// and the bad shard's retries spend it; once it is empty, calls that met only healthy
/// shards lose their retries too. Charged per key, a retry after a failure on key *k* must
/// be affordable by *k*'s own account (its successes × `retry_ratio`, plus the standing
/// reserve, so a key with no successes still gets the floor) **and** by the shared budget,
/// and is withdrawn from both; a success deposits into both. A failing key can spend at
/// most its own floor of the shared budget.
///
/// The map is bounded: beyond `max_keys` the key used longest ago is forgotten (its
/// account starts again from the floor), so a key taken from request metadata cannot grow
/// memory without bound.
///
/// A controller charges them when it has them
/// ([`RetryController::with_key_budgets`](crate::RetryController::with_key_budgets)), each
/// retry to the key its failed attempt went to
/// ([`CallRetry::set_budget_key`](crate::CallRetry::set_budget_key)).
pub struct KeyedBudgets {
    config: BudgetConfig,
    max_keys: usize,
    keys: Mutex<HashMap<u64, Entry>>,
}

struct Entry {
    budget: RetryBudget,
    used: Instant,
}

impl fmt::Debug for KeyedBudgets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("KeyedBudgets")
            .field("config", &self.config)
            .field("max_keys", &self.max_keys)
            .finish_non_exhaustive()
    }
}

impl KeyedBudgets {
    /// Accounts with `config` each (validated first), at most `max_keys` of them (at least
    /// one).
    pub fn new(config: BudgetConfig, max_keys: usize) -> Result<Self, ConfigError> {
        config.validate()?;
        check::at_least_one("retry.budget.max_keys", max_keys as u64)?;
        Ok(KeyedBudgets {
            config,
            max_keys,
            keys: Mutex::new(HashMap::new()),
        })
    }

    /// Runs `f` on `key`'s account, creating it (and forgetting the least recently used
    /// one when full) if needed.
    fn with<T>(&self, key: u64, now: Instant, f: impl FnOnce(&RetryBudget) -> T) -> T {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if !keys.contains_key(&key) && keys.len() >= self.max_keys {
            let oldest = keys.iter().min_by_key(|(_, e)| e.used).map(|(&k, _)| k);
            if let Some(oldest) = oldest {
                keys.remove(&oldest);
            }
        }
        let entry = match keys.entry(key) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                let Ok(budget) = RetryBudget::new(self.config.clone()) else {
                    unreachable!("the config was validated in new")
                };
                v.insert(Entry { budget, used: now })
            }
        };
        entry.used = entry.used.max(now);
        f(&entry.budget)
    }

    /// A call whose last attempt went to `key` succeeded.
    pub(crate) fn deposit_at(&self, key: u64, now: Instant) {
        self.with(key, now, |b| b.deposit_at(now));
    }

    /// May a retry after a failure on `key` go out? `true` consumes it from `key`'s account.
    pub(crate) fn withdraw_at(&self, key: u64, now: Instant) -> bool {
        self.with(key, now, |b| b.withdraw_at(now))
    }

    /// Gives back a retry [`withdraw_at`](Self::withdraw_at)`(key, granted_at)` granted.
    pub(crate) fn refund_at(&self, key: u64, granted_at: Instant) {
        self.with(key, granted_at, |b| b.refund_at(granted_at));
    }

    #[cfg(test)]
    /// `key`'s balance at `now`, if it is tracked.
    pub(crate) fn balance_at(&self, key: u64, now: Instant) -> Option<f64> {
        let keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        keys.get(&key).map(|e| e.budget.balance_at(now))
    }

    #[cfg(test)]
    /// How many keys are tracked now.
    pub(crate) fn len(&self) -> usize {
        self.keys
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

#[cfg(test)]
mod tests;
