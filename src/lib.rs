//! stormguard facade
pub use stormguard_core as core;
