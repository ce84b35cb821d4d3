//! stormguard facade
pub use stormguard_client as client;
pub use stormguard_core as core;
pub use stormguard_server as server;
