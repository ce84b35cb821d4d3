//! stormguard-sim (being written)
