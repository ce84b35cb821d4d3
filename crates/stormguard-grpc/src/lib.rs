//! stormguard-grpc: stormguard's retry decision for the official `grpc` crate's client, as
//! an interceptor.
//!
//! The `grpc` crate (0.9, a client-only preview built on tonic's transport) has no retries
//! of its own yet. [`RetryInterceptor`] brings the ones stormguard's tonic `RetryLayer`
//! makes, decided by the same engine ([`RetryController`], one `CallRetry` per call): a
//! retry goes out only when the failure is retryable, the method is safe to repeat, the
//! server did not push back, time is left on the call's one deadline, the breaker is
//! closed and the budget (retries ≤ ~10 % of recent successes) can pay for it.
//!
//! ```no_run
//! use std::sync::Arc;
//! use grpc::client::{Channel, ChannelOptions};
//! use grpc::client::interceptor::InvokeExt;
//! use grpc::credentials::LocalChannelCredentials;
//! use stormguard_grpc::{ClientConfig, MethodScope, RetryInterceptor, RetryPolicy};
//!
//! # fn demo() -> Result<(), stormguard_grpc::ConfigError> {
//! let mut config = ClientConfig::default();
//! // Reserve is safe to repeat: retry its UNAVAILABLE answers too.
//! let reserve = RetryPolicy { idempotent: true, ..RetryPolicy::default() };
//! config.methods.set_retry(MethodScope::Method("stormguard.demo.v1.Inventory", "Reserve"), Some(reserve));
//! let channel = Channel::new(
//!     "dns:///127.0.0.1:50051",
//!     Arc::new(LocalChannelCredentials::new()),
//!     ChannelOptions::default(),
//! )
//! .with_interceptor(RetryInterceptor::from_config(&config)?);
//! # let _ = channel;
//! # Ok(()) }
//! ```
//!
//! # What each attempt carries, and what is read from its answer
//!
//! As with the tonic layer: `grpc-timeout` with what is left of the call's deadline (or
//! the attempt's own shorter limit), `grpc-previous-rpc-attempts` on retries, what is left
//! of the request's retry allowance as `x-retry-budget`, and a keyed method's
//! `idempotency-key`. A failed attempt's trailers are read for `grpc-retry-pushback-ms`, a
//! `google.rpc.RetryInfo` and `stormguard-unprocessed`. A call given up on a retryable
//! failure ends with `grpc-retry-pushback-ms: -1` in its trailers.
//!
//! The call's deadline is the earliest of its `CallOptions` deadline, a `grpc-timeout` in
//! its metadata, the current [`CallContext`](stormguard_core::context::CallContext)'s and
//! the method's limit from the service config; else the interceptor's default. The
//! interceptor holds every attempt, every delay and the committed stream to it (the `grpc`
//! 0.9 channel neither enforces `CallOptions`' deadline nor sends it).
//!
//! # Commit
//!
//! A call commits when response headers (or a message) arrive: its items then pass
//! through and it is never retried, as gRPC A6 says. Before that, each attempt's request is
//! written from a log of the caller's encoded messages ([`RetrySendStream`]), within the
//! replay limit, so that unary, server-streaming and client-streaming calls are retried
//! alike.
//!
//! # Hedging
//!
//! A method with a hedging policy is hedged as the tonic layer hedges it, by the same
//! engine calls: copies sent on the policy's schedule, each its own `invoke` on the
//! channel and paid from the budget's upper half, the first headers or `OK` winning and the
//! other copies cancelled. A copy is sent only while the whole request is in the call's log
//! (unary and server-streaming calls).
//!
//! # Metrics
//!
//! With the `opentelemetry` feature, `RetryInterceptor::with_meter` records the tonic
//! layer's instruments, gRFC A96's per-call retry histograms among them, through the same
//! code (`stormguard_core::otel`); the `metrics` module lists them.
//!
//! # What the preview does not allow yet
//!
//! `docs/grpc.md` in the repository lists them, each with the upstream change it waits on:
//! the pushback and `RetryInfo` of a trailers-only answer (the common form of a failure)
//! are dropped by `grpc` 0.9's transport before an interceptor sees them, and an attempt
//! that never reached the server cannot be told from one the server failed.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod interceptor;
#[cfg(feature = "opentelemetry")]
pub mod metrics;
#[cfg(not(feature = "opentelemetry"))]
mod metrics {
    //! Without the `opentelemetry` feature a call records nothing: this is empty.
    use stormguard_core::{Code, Instant};

    #[derive(Debug, Default)]
    pub(crate) struct CallMetrics;

    impl CallMetrics {
        pub(crate) fn none() -> Self {
            CallMetrics
        }

        #[inline(always)]
        pub(crate) fn attempt(&mut self) {}

        #[inline(always)]
        pub(crate) fn retry(&mut self, _transparent: bool) {}

        #[inline(always)]
        pub(crate) fn hedge(&mut self) {}

        #[inline(always)]
        pub(crate) fn waiting(&mut self, _now: Instant) {}

        #[inline(always)]
        pub(crate) fn ended(&mut self, _code: Code) {}
    }
}
mod recv;
mod send;
mod stats;
mod wire;

pub use interceptor::{DEFAULT_REPLAY_LIMIT, RetryInterceptor};
pub use recv::RetryRecvStream;
pub use send::RetrySendStream;
pub use stats::{InterceptorSnapshot, InterceptorStats};

// What a user configures, and every type the interceptor's API names, so that one
// `use stormguard_grpc::{..}` holds it (the same config vocabulary as the tonic layer's
// crate). `RetryController` is the engine's object the interceptor takes built: its own
// methods are the engine's API.
pub use stormguard_core::{
    A6BudgetConfig, AdaptiveThrottleConfig, BackoffConfig, BreakerConfig, BudgetChoice,
    BudgetConfig, ClientConfig, Code, CodeSet, ConfigError, Floor, Format, HedgeDelay,
    HedgingPolicy, LearnedDelay, MethodScope, MethodTable, NotApplied, NotAppliedReason, Notice,
    Refusal, RetryController, RetryPolicy, SaturationConfig, UnknownCode,
};
