//! The examples, run: quick runs of the storm, tail and fleet examples and of the fleet on
//! turmoil, the process faults on the real server process, every example's `--help`, and
//! the example client and server compiled in as modules. One binary.
#![allow(clippy::unwrap_used)]
// The example client and server, compiled in here as modules, each bring the examples'
// `support/otel.rs` module of their own.
#![allow(clippy::duplicate_mod)]

#[path = "../support/client.rs"]
mod client_support;

mod support;
#[path = "../support/turns.rs"]
mod turns_support;

mod client;
mod fleet;
mod fleet_sim;
mod help;
mod never_stall;
mod process_faults;
mod server;
mod storm;
mod tail;
