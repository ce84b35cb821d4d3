//! gRPC A6 `retryThrottling`: the standard gRPC client's retry budget, as a [`Budget`].
//!
//! See [`A6Budget`](crate::A6Budget) for what it does and why.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;

use super::Budget;
use crate::budget::truncate_decimal;
use crate::error::ConfigError;

const MILLI: u64 = 1000;

/// Configuration of an [`A6Budget`]: the service config's `retryThrottling` object.
///
/// Deserializes from that object (`{"maxTokens": 10, "tokenRatio": 0.1}`, both
/// required, numbers or numeric strings as proto3 JSON allows); other fields are skipped,
/// as gRPC skips them. [`A6Budget::new`] validates it.
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase", expecting = "a `retryThrottling` object")]
pub struct A6BudgetConfig {
    /// `maxTokens`: the bucket's size, and where it starts. In (0, 1000], kept to 3
    /// decimal places.
    #[serde(deserialize_with = "crate::field::finite")]
    pub max_tokens: f64,
    /// `tokenRatio`: tokens added per success. Greater than 0 and finite; truncated to
    /// 3 decimal places, and at least 0.001 once truncated.
    #[serde(deserialize_with = "crate::field::finite")]
    pub token_ratio: f64,
}

impl A6BudgetConfig {
    /// Checks both fields; the error names the field as the service config spells it.
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let max = self.max_tokens;
        if !max.is_finite() || max <= 0.0 || max > 1000.0 {
            return Err(ConfigError::invalid(
                "retryThrottling.maxTokens",
                format!("must be greater than 0 and at most 1000, got {max}"),
            ));
        }
        if truncate_decimal(max, MILLI as f64) == 0 {
            return Err(ConfigError::invalid(
                "retryThrottling.maxTokens",
                format!("must be at least 0.001 (3 decimal places are kept), got {max}"),
            ));
        }
        let ratio = self.token_ratio;
        if !ratio.is_finite() || ratio <= 0.0 {
            return Err(ConfigError::invalid(
                "retryThrottling.tokenRatio",
                format!("must be finite and greater than 0, got {ratio}"),
            ));
        }
        if truncate_decimal(ratio, MILLI as f64) == 0 {
            return Err(ConfigError::invalid(
                "retryThrottling.tokenRatio",
                format!("must be at least 0.001 (3 decimal places are kept), got {ratio}"),
            ));
        }
        Ok(())
    }
}

/// gRPC A6 `retryThrottling` token bucket (see the [docs](A6Budget)).
///
/// Lock-free (one atomic word); clones share one bucket, as gRPC keeps one per server.
///
/// # Why
///
/// An attempt cap bounds one request, not the fleet (see the [crate docs](crate)). gRPC's
/// retry design (proposal A6) bounds retries with a token bucket per server instead:
/// failures drain it, successes refill it, and once it is half empty no call is retried
/// until successes refill it. When every call fails, retries stop after a handful of
/// failures; at low failure rates the bucket stays full and retries flow.
///
/// Use this implementation to behave exactly like other gRPC clients configured with the
/// same service config (`"retryThrottling": {"maxTokens": 10, "tokenRatio": 0.1}`);
/// [`crate::RetryBudget`] is the time-windowed alternative, which bounds retries
/// by a ratio of recent successes.
///
/// # The rules (gRPC A6)
///
/// - The bucket starts full, at `maxTokens`.
/// - Every failed attempt (a retryable status, or a pushback saying "do not retry")
///   removes 1 token ([`Budget::record_failure_at`]); the count never goes below 0.
/// - Every success adds `tokenRatio` tokens ([`Budget::deposit_at`]); the count never
///   exceeds `maxTokens`.
/// - A retry may go out only while the count is strictly greater than `maxTokens / 2`
///   ([`Budget::withdraw_at`]); asking does not consume anything: the failure of the retry
///   is what costs a token.
/// - `tokenRatio` keeps 3 decimal places (further places are ignored), so counts are kept
///   in integer milli-tokens.
///
/// The bucket does not depend on time; the `now` arguments are ignored.
///
/// With the `tower` feature the bucket is also a `tower::retry::budget::Budget`, for a
/// `tower::retry::Policy`: see that implementation on [`A6Budget`] for what tower's two
/// calls mean here.
///
/// ```
/// use stormguard_core::Instant;
/// use stormguard_core::Budget;
/// use stormguard_core::{A6Budget, A6BudgetConfig};
///
/// let throttle = A6Budget::new(A6BudgetConfig { max_tokens: 10.0, token_ratio: 0.1 })?;
/// let now = Instant::now();
/// for _ in 0..4 {
///     throttle.record_failure_at(now);
/// }
/// assert!(throttle.withdraw_at(now)); // 6 > 5
/// throttle.record_failure_at(now);
/// assert!(!throttle.withdraw_at(now)); // 5 is not > 5: throttled
/// throttle.deposit_at(now);
/// assert!(throttle.withdraw_at(now)); // 5.1 > 5
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[derive(Clone)]
pub struct A6Budget {
    shared: Arc<Shared>,
}

struct Shared {
    config: A6BudgetConfig,
    max_milli: u64,
    ratio_milli: u64,
    /// Current tokens, in milli-tokens, in `0..=max_milli`.
    tokens_milli: AtomicU64,
}

impl A6Budget {
    /// A full bucket for `config`, or the validation error.
    pub fn new(config: A6BudgetConfig) -> Result<Self, ConfigError> {
        config.validate()?;
        let max_milli = truncate_decimal(config.max_tokens, MILLI as f64);
        let ratio_milli = truncate_decimal(config.token_ratio, MILLI as f64);
        Ok(A6Budget {
            shared: Arc::new(Shared {
                config,
                max_milli,
                ratio_milli,
                tokens_milli: AtomicU64::new(max_milli),
            }),
        })
    }

    #[cfg(test)]
    /// The configuration this bucket was built with.
    pub(crate) fn config(&self) -> &A6BudgetConfig {
        &self.shared.config
    }

    /// The current token count (A6's `token_count`), to 3 decimal places.
    pub fn tokens(&self) -> f64 {
        self.shared.tokens_milli.load(Ordering::SeqCst) as f64 / MILLI as f64
    }

    /// Applies `f` to the tokens atomically; returns the tokens after it.
    fn update(&self, f: impl Fn(u64) -> u64) -> u64 {
        let result =
            self.shared
                .tokens_milli
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |t| Some(f(t)));
        // The closure always returns `Some`, so the update always succeeds.
        debug_assert!(result.is_ok());
        f(result.unwrap_or_else(|t| t))
    }

    /// A6's retry threshold: strictly more than `maxTokens / 2`.
    fn above_threshold(&self, tokens_milli: u64) -> bool {
        2 * tokens_milli > self.shared.max_milli
    }

    /// A failed attempt: `-1` token, never below 0; returns the tokens after it.
    fn take_token(&self) -> u64 {
        self.update(|t| t.saturating_sub(MILLI))
    }
}

impl Budget for A6Budget {
    /// A success: `+tokenRatio`, capped at `maxTokens`.
    fn deposit_at(&self, _now: Instant) {
        let (max, ratio) = (self.shared.max_milli, self.shared.ratio_milli);
        self.update(|t| t.saturating_add(ratio).min(max));
    }

    /// A failed attempt: `-1`, never below 0.
    fn record_failure_at(&self, _now: Instant) {
        self.take_token();
    }

    /// `true` while the tokens are strictly above `maxTokens / 2`; consumes nothing.
    fn withdraw_at(&self, _now: Instant) -> bool {
        self.above_threshold(self.shared.tokens_milli.load(Ordering::SeqCst))
    }

    /// Tokens above the `maxTokens / 2` threshold (0 when throttled): retries stop once
    /// that many more attempts have failed.
    fn balance_at(&self, _now: Instant) -> f64 {
        let tokens = self.shared.tokens_milli.load(Ordering::SeqCst);
        (2 * tokens).saturating_sub(self.shared.max_milli) as f64 / (2 * MILLI) as f64
    }
}

/// With the `tower` feature: the A6 bucket as a tower retry budget.
///
/// A6 has three events and tower's budget two calls. A `tower::retry::Policy` deposits
/// when an attempt succeeded and withdraws when one failed and it would retry, so:
///
/// - `deposit()` is a success: `+tokenRatio`, capped at `maxTokens`
///   ([`Budget::deposit_at`]).
/// - `withdraw()` is a failed attempt asking for a retry: `-1` token
///   ([`Budget::record_failure_at`]), then `true` while the tokens are still strictly
///   above `maxTokens / 2` ([`Budget::withdraw_at`]). gRPC's own clients count the
///   failure and then check the threshold in the same way.
///
/// Unlike a [`crate::RetryBudget`], where a granted withdrawal is a spent retry and
/// is asked for last, here every `withdraw()` *is* the failure: call it for every attempt
/// that failed with a retryable status (or a pushback saying not to retry), before the
/// policy's own limits such as a maximum number of attempts, as A6 counts the last
/// attempt's failure too; and for no other outcome (an `INVALID_ARGUMENT` is neither a
/// success nor a failure to A6).
///
/// If stormguard's [`Budget`] is in scope as well, name the trait:
/// `tower::retry::budget::Budget::withdraw(&throttle)`.
///
/// ```
/// use stormguard_core::{A6Budget, A6BudgetConfig};
/// use tower::retry::budget::Budget;
///
/// let throttle = A6Budget::new(A6BudgetConfig { max_tokens: 4.0, token_ratio: 0.5 })?;
/// assert!(throttle.withdraw()); // a failure: 4 -> 3 tokens, above 2: retry
/// assert!(!throttle.withdraw()); // another: 3 -> 2, not above 2: no retry
/// for _ in 0..3 {
///     throttle.deposit(); // three successes: 2 -> 3.5
/// }
/// assert!(throttle.withdraw()); // 3.5 -> 2.5: retry
/// assert_eq!(throttle.tokens(), 2.5);
/// # Ok::<(), stormguard_core::ConfigError>(())
/// ```
#[cfg(feature = "tower")]
impl tower::retry::budget::Budget for A6Budget {
    fn deposit(&self) {
        self.deposit_at(Instant::now());
    }

    /// The failure and the check in one atomic step: each caller sees the tokens its own
    /// failure left, whatever other threads do meanwhile.
    fn withdraw(&self) -> bool {
        self.above_threshold(self.take_token())
    }
}

impl fmt::Debug for A6Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("A6Budget")
            .field("config", &self.shared.config)
            .field("tokens", &self.tokens())
            .finish()
    }
}

#[cfg(test)]
mod tests;
