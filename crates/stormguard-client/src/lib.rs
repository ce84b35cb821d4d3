//! stormguard-client (being written)
