//! The engine through its public API: the configuration files of every layer, read as a
//! user writes them. One binary.

mod config_files;
