//! stormguard-core: the shared policy of stormguard.
#![cfg_attr(not(test), warn(clippy::unwrap_used))]

pub use tokio::time::Instant;

pub mod admission;
pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod code;
pub mod config;
pub mod deadline;
pub mod policy;
pub mod pushback;
pub mod retry;
pub mod throttle;
