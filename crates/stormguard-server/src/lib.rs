//! stormguard-server (being written)
