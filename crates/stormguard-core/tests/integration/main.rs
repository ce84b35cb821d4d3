//! The engine through its public API: config files and the adaptive limit in a model of
//! the storm. One binary.

mod config_files;
mod limit_storm_model;
