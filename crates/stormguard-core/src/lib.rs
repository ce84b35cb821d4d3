//! stormguard-core: the policy that stormguard's client and server layers share.
//!
//! # Why
//!
//! Retries are how a gRPC system survives a blip, and how it turns a blip into an outage.
//! Three layers that each try 3 times send 27 calls to the bottom service for one user
//! request. A per-request attempt cap bounds one request, not the fleet: at 100 % failure,
//! 3 attempts are still 3× the load, exactly when the dependency can least take it. Worse,
//! a short trigger (a slow deploy, a GC pause) fills queues, calls time out, clients retry,
//! and the retry load alone keeps the service saturated after the trigger is gone: a
//! *metastable* failure that does not recover by itself.
//!
//! stormguard's answer is a policy that asks *can the system afford another attempt?*
//! rather than *has this request been tried enough?*:
//!
//! * a **retry budget** ([`budget`]) minted by successes — retries ≤ 10 % of recent
//!   successes plus a small floor — holds amplification near 1.1× however bad the failure;
//!   the gRPC A6 token bucket ([`throttle`]) is there for users who want the standard one;
//! * **full-jitter backoff** ([`backoff`]) so retries do not arrive as pulses;
//! * **server pushback** ([`pushback`], `grpc-retry-pushback-ms`) honoured exactly;
//! * **client-side adaptive throttling** ([`adaptive_throttle`], the SRE book's formula):
//!   a client refuses calls locally while the dependency refuses most of them for
//!   overload, for servers whose refusals cost real work;
//! * a **circuit breaker** ([`breaker`]) for latency: fail fast while a dependency is dead,
//!   probe it back on a jittered schedule;
//! * **deadlines** ([`deadline`]): a retry gets what is left of the caller's time, never a
//!   fresh timeout, and a handler's downstream calls inherit the inbound deadline through
//!   the task-local [`context`];
//! * **classification** ([`code`], [`policy`]): only transient codes of idempotent methods
//!   are retried;
//! * **idempotency keys** ([`idempotency`]): one key per logical call of a keyed write,
//!   the same on every attempt, and the bounded record a server keeps of the keys it ran,
//!   so a write can be retried after it may have run without being done twice;
//! * the **retry decision** ([`retry`]) that combines them, in one place;
//! * the server's **admission policy** ([`admission`]): which work to keep when it cannot
//!   serve all of it — retries are shed before first attempts — and the **admission
//!   queue** ([`queue`]) that applies it to workers and waiters, shared by the server layer
//!   and the simulator;
//! * **configuration** ([`config`]) in stormguard's shape (with per-method policies) or
//!   the standard gRPC service config, from JSON, YAML or TOML, or held in an
//!   application's own config through `serde`, validated either way;
//! * the **wire** ([`wire`]): every header the layers write or read, with its one parser
//!   and encoder (and, with the `http` feature, its `http::HeaderName`);
//! * **load reports** ([`orca`], gRPC ORCA): the report a server sends on every answer,
//!   and what a client makes of it: no retry to a saturated server, replica weights that
//!   a report can only lower;
//! * what the layers **tell operators** ([`observe`]): a layer's name, and the per-second
//!   summary that keeps INFO readable during an incident.
//!
//! This crate knows nothing of tonic or a runtime, and of http only behind the `http`
//! feature (header names as `http::HeaderName` constants): plain types that the
//! `stormguard-client` and `stormguard-server` tower layers adapt, and that the fleet
//! simulator drives on a virtual clock. Time is [`Instant`] (`tokio::time::Instant`, so
//! tests run on paused time), and every time-dependent method has an `*_at(now)` form.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]

/// The clock every policy object reads: `tokio::time::Instant`, which works without a
/// runtime and follows `tokio::time::pause()` in tests.
pub use tokio::time::Instant;

pub mod adaptive_throttle;
pub mod admission;
pub mod backoff;
pub mod breaker;
pub mod budget;
pub mod code;
pub mod config;
pub mod context;
pub mod criticality;
pub mod deadline;
pub mod error;
pub mod hedge;
pub mod idempotency;
pub mod limit;
pub mod observe;
pub mod orca;
pub mod policy;
pub mod pushback;
pub mod queue;
pub mod replica;
pub mod retry;
pub mod throttle;
pub mod wire;

#[cfg(feature = "http")]
mod body;

#[cfg(feature = "http")]
pub use body::{DeadlineCut, HeldFrames, Polled};
pub use code::Code;
pub use config::{ClientConfig, ConfigError};
pub use retry::{CallRetry, Decision, Failure, Refusal, RetryController};
