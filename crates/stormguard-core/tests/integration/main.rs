//! The engine through its public API: config files, the properties of hedged calls, and
//! the adaptive limit in a model of the storm. One binary.

mod config_files;
mod hedge_properties;
mod limit_storm_model;
