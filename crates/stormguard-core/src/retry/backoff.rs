//! Backoff between attempts: full jitter by default, gRPC A6 as an option.
//!
//! See [`BackoffConfig`](crate::BackoffConfig) for what it does and why.

use std::time::Duration;

use crate::error::ConfigError;

/// How delays grow between attempts.
///
/// Retries that wait the same time arrive together, as a pulse that overloads the server
/// again. *Full jitter* draws the whole delay at random, `rand(0, min(cap, base · mult^n))`,
/// which spreads a burst of failures over the window and roughly halves the calls needed
/// to get through compared with exponential backoff plus a little jitter (tower's backoff
/// adds jitter on top of the exponential value). The A6 mode reproduces what standard gRPC
/// clients do, `min(initial · mult^(n−1), max) · rand(0.8, 1.2)`, for users who want
/// stormguard to behave like the service config they already have.
///
/// After a server pushback the sequence restarts from its first step (`Backoff::reset`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BackoffConfig {
    /// `rand(0, min(cap, base · multiplier^n))` for the n-th retry (n from 0).
    FullJitter {
        /// The first window.
        base: Duration,
        /// The largest window.
        cap: Duration,
        /// Growth of the window per retry (≥ 1).
        multiplier: f64,
    },
    /// gRPC A6: `min(initial · multiplier^(n−1), max) · rand(0.8, 1.2)` for the n-th retry
    /// (n from 1).
    A6 {
        /// `initialBackoff`.
        initial: Duration,
        /// `maxBackoff`.
        max: Duration,
        /// `backoffMultiplier` (> 0).
        multiplier: f64,
    },
}

impl Default for BackoffConfig {
    /// Full jitter with a 50 ms base, a 2 s cap and a multiplier of 2.
    fn default() -> Self {
        BackoffConfig::FullJitter {
            base: Duration::from_millis(50),
            cap: Duration::from_secs(2),
            multiplier: 2.0,
        }
    }
}

impl BackoffConfig {
    /// Checks the ranges; `field` prefixes the names in errors (e.g. `"retry.backoff"`).
    pub(crate) fn validate(&self, field: &str) -> Result<(), ConfigError> {
        let (first, first_name, last, last_name, mult, min_mult) = match *self {
            BackoffConfig::FullJitter {
                base,
                cap,
                multiplier,
            } => (base, "base", cap, "cap", multiplier, 1.0),
            BackoffConfig::A6 {
                initial,
                max,
                multiplier,
            } => (
                initial,
                "initialBackoff",
                max,
                "maxBackoff",
                multiplier,
                f64::MIN_POSITIVE,
            ),
        };
        if first.is_zero() {
            return Err(ConfigError::invalid(
                format!("{field}.{first_name}"),
                "must be greater than zero",
            ));
        }
        if last < first {
            return Err(ConfigError::invalid(
                format!("{field}.{last_name}"),
                format!("must be at least {first_name} ({first:?}), got {last:?}"),
            ));
        }
        if !mult.is_finite() || mult < min_mult {
            let bound = if min_mult >= 1.0 {
                "at least 1"
            } else {
                "greater than 0"
            };
            return Err(ConfigError::invalid(
                format!("{field}.multiplier"),
                format!("must be finite and {bound}, got {mult}"),
            ));
        }
        Ok(())
    }
}

/// The delays of one logical call.
///
/// ```
/// use std::time::Duration;
/// use stormguard_core::{Backoff, BackoffConfig};
///
/// let config = BackoffConfig::FullJitter {
///     base: Duration::from_millis(10),
///     cap: Duration::from_millis(100),
///     multiplier: 2.0,
/// };
/// let mut backoff = Backoff::new(config, 7);
/// let windows = [10, 20, 40, 80, 100, 100];
/// for w in windows {
///     assert!(backoff.next_delay() <= Duration::from_millis(w));
/// }
/// ```
#[derive(Debug, Clone)]
pub struct Backoff {
    config: BackoffConfig,
    retries: u32,
    rng: fastrand::Rng,
}

impl Backoff {
    /// A fresh sequence, with its RNG seeded by `seed`.
    pub fn new(config: BackoffConfig, seed: u64) -> Self {
        Backoff {
            config,
            retries: 0,
            rng: fastrand::Rng::with_seed(seed),
        }
    }

    /// The delay before the next retry; advances the sequence.
    pub fn next_delay(&mut self) -> Duration {
        let n = self.retries;
        self.retries = self.retries.saturating_add(1);
        match self.config {
            BackoffConfig::FullJitter {
                base,
                cap,
                multiplier,
            } => {
                let window = scaled(base, multiplier, n, cap);
                mul_saturating(window, self.rng.f64())
            }
            BackoffConfig::A6 {
                initial,
                max,
                multiplier,
            } => {
                let step = scaled(initial, multiplier, n, max);
                mul_saturating(step, 0.8 + 0.4 * self.rng.f64())
            }
        }
    }

    #[cfg(test)]
    /// The upper bound of the next delay, without advancing.
    pub(crate) fn next_window(&self) -> Duration {
        match self.config {
            BackoffConfig::FullJitter {
                base,
                cap,
                multiplier,
            } => scaled(base, multiplier, self.retries, cap),
            BackoffConfig::A6 {
                initial,
                max,
                multiplier,
            } => mul_saturating(scaled(initial, multiplier, self.retries, max), 1.2),
        }
    }

    /// Restarts the sequence from its first step (after a server pushback).
    pub(crate) fn reset(&mut self) {
        self.retries = 0;
    }
}

/// `min(cap, first · multiplier^n)`, without overflow.
fn scaled(first: Duration, multiplier: f64, n: u32, cap: Duration) -> Duration {
    let factor = multiplier.powi(i32::try_from(n).unwrap_or(i32::MAX));
    let secs = first.as_secs_f64() * factor;
    if !secs.is_finite() || secs >= cap.as_secs_f64() {
        cap
    } else {
        Duration::try_from_secs_f64(secs).map_or(cap, |d| d.min(cap))
    }
}

/// `d · factor` (factor ≥ 0), saturating at `Duration::MAX` where `Duration::mul_f64`
/// would panic (a validated config may say `max = Duration::MAX`).
fn mul_saturating(d: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

#[cfg(test)]
mod tests;
