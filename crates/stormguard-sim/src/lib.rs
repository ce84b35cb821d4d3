//! stormguard-sim: a deterministic fleet simulator over stormguard's real policy objects.

mod engine;
mod tables;

pub use engine::*;
pub use tables::*;

use stormguard_core::config::ConfigError;

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// A scenario parameter is out of range.
    #[error("invalid scenario: {field}: {reason}")]
    Scenario {
        /// The parameter.
        field: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A core configuration (budget, throttle, breaker, retry policy, admission) was
    /// refused by the core object it configures.
    #[error(transparent)]
    Config(#[from] ConfigError),
}
