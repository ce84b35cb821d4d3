//! Fuzz targets for every parser of a value that a peer or a config author controls, and a
//! seeded driver that runs them on the stable toolchain.
//!
//! A gRPC peer controls `grpc-retry-pushback-ms`, `grpc-status-details-bin` and
//! `endpoint-load-metrics-bin` (on answers), `grpc-previous-rpc-attempts`,
//! `x-retry-attempt` and `grpc-timeout` (on requests); whoever writes the config controls
//! the service config and stormguard's client and admission JSON. Each has a
//! [target](targets::TARGETS) that checks the parser against its contract, not only that
//! it returns:
//!
//! ```text
//! cargo run --release -p stormguard-fuzz -- --inputs 1000000 [--seed N] [--target NAME]
//! ```
//!
//! Two targets drive hedging rather than a parser: `hedge` runs a config's hedged methods
//! through a script of events read from the input ([`hedged`]), the way the client's
//! hedged future drives them, and `hedge-delay` feeds the learned hedge delay hostile
//! latencies; every accepted config of the config targets runs its hedged methods too.
//!
//! The driver prints, per target, how many inputs ran, how many were accepted and refused,
//! how many distinct answers were seen and the slowest input. The same seed runs the same inputs, so
//! a crash report (target, seed, input number and the input itself) reproduces. The crate's
//! tests run every target on a fixed seed, and property tests check the same contracts on
//! generated inputs.
//!
//! ```
//! use stormguard_fuzz::{driver, targets};
//!
//! let report = driver::run(targets::target("pushback").unwrap(), 1, 1_000).unwrap();
//! assert_eq!(report.inputs, 1_000);
//! ```

pub mod driver;
pub mod hedged;
pub mod targets;
