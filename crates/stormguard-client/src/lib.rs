//! stormguard-client: retries that a failing system can afford, as a tower layer for tonic
//! channels.
//!
//! # Why
//!
//! Retries multiply: three attempts at each of three layers is 27 calls to the bottom
//! service for one user request, and a per-call attempt cap does nothing against a fleet
//! of callers that all retry at once. When a dependency slows down, the retry load alone
//! can keep it saturated after the trigger is gone (a metastable failure). This crate puts
//! one [`RetryController`] per dependency in front
//! of a tonic channel: a retry goes out only when the failure is retryable, the server did
//! not push back, the deadline leaves room, the breaker is closed and the shared budget
//! (retries ≤ ~10 % of successes) can pay for it.
//!
//! For a dependency whose refusals cost it real work, the layer can also refuse calls
//! locally while the dependency refuses most of them for overload
//! ([`RetryLayer::with_adaptive_throttle`], the SRE book's client-side throttling).
//!
//! # Use
//!
//! ```no_run
//! use std::time::Duration;
//! use stormguard_client::{ClientConfig, MethodScope, RetryLayer, RetryPolicy};
//! use tower::ServiceBuilder;
//! # use tonic::transport::Endpoint;
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let channel = Endpoint::from_static("http://127.0.0.1:50051")
//!     // A storm of expiring calls must not get the connection closed (see `retry`).
//!     .http2_max_local_error_reset_streams(None)
//!     .connect()
//!     .await?;
//! // Every method: retry only requests that never reached the server (a failed
//! // connection), paid from the default budget (retries ≤ 10 % of recent successes).
//! let mut config = ClientConfig::default();
//! // Reserve carries a request id, so repeating it is harmless: retry its UNAVAILABLE
//! // answers too.
//! let reserve = RetryPolicy {
//!     idempotent: true,
//!     // Abandon (and retry) an attempt after 50 ms; see "Timeouts" below.
//!     per_attempt_timeout: Some(Duration::from_millis(50)),
//!     ..RetryPolicy::default()
//! };
//! let scope = MethodScope::Method("stormguard.demo.v1.Inventory", "Reserve");
//! config.methods.set_retry(scope, Some(reserve));
//! // Calls that set no deadline of their own get 150 ms for all their attempts.
//! let layer = RetryLayer::from_config(&config)?.with_default_timeout(Duration::from_millis(150));
//! let stats = layer.stats();
//! let svc = ServiceBuilder::new().layer(layer).service(channel);
//! // let mut client = InventoryClient::new(svc);   // the generated client, unchanged
//! # let _ = (svc, stats);
//! # Ok(()) }
//! ```
//!
//! # Several replicas
//!
//! Over tonic's `Channel::balance_list`, a retry cannot avoid the replica that just failed
//! it, and one failing replica spends the retries the healthy ones earned. Put the layer
//! over [`replicas::Replicas`] instead, and build it with
//! [`RetryLayer::over_replicas`]: a replica is picked per attempt, seeing what the call
//! tried; failing replicas are ejected; returning ones ramp up; each retry is charged to
//! the replica that failed. The [`replicas`] module says how and why.
//!
//! # Timeouts
//!
//! A call has one deadline for all its attempts and, optionally, a shorter limit per
//! attempt. Four knobs set them; this is how each one meets the layer.
//!
//! | knob | bounds | the server learns it | when it runs out |
//! |---|---|---|---|
//! | `tonic::Request::set_timeout` | the whole call: every attempt, every backoff delay and, once committed, the response stream (see [`ResponseBody`]) | yes: each attempt's `grpc-timeout` is what is left | `DEADLINE_EXCEEDED`, final (never retried) |
//! | per-attempt timeout: [`RetryPolicy::per_attempt_timeout`], `retry.per_attempt_timeout`, `retryPolicy.perAttemptRecvTimeout`, [`RetryLayer::with_per_attempt_timeout`] | one attempt | yes: `grpc-timeout` is the smaller of it and what is left of the call | a failure of the dependency (budget, breaker), retried; when the layer gives up, `DEADLINE_EXCEEDED` with `grpc-retry-pushback-ms: -1` |
//! | `Endpoint::timeout`, or a `tower::timeout` layer *under* the `RetryLayer` | one attempt (the channel takes the smaller of it and `grpc-timeout`) | no | read by the layer exactly as a per-attempt timeout |
//! | a `tower::timeout` layer *above* the `RetryLayer` | the whole call | no | the layer's future is dropped: the attempt in flight is cancelled, nothing is recorded for the budget or the breaker, the caller gets `tower`'s `Elapsed`, not a gRPC status |
//!
//! Prefer `Request::set_timeout` (or [`RetryLayer::with_default_timeout`], or a deadline in
//! the [`CallContext`](context::CallContext)) for the call and the per-attempt timeout for
//! attempts: the server then knows both and can drop work nobody waits for. The call's
//! deadline is the earliest of the request's `grpc-timeout`, the context's deadline and the
//! method's limit from the service config (a cap, as gRPC specifies); the layer's default
//! applies only when none is set. The layer's own timer also counts the
//! time an attempt waits in the channel's buffer, which the channel's `grpc-timeout` timer
//! does not. An attempt whose `grpc-timeout` was its own per-attempt limit (shorter than
//! what was left of the call) and that is answered `DEADLINE_EXCEEDED` or `CANCELLED`
//! (tonic's answer to an expired `grpc-timeout`) counts as timed out too, whenever the answer
//! comes: a `ShedLayer` answers at once when a queued attempt cannot finish within its
//! `grpc-timeout`, and that is the attempt timing out early, not a final answer. The same
//! codes answered to an attempt that carried what was left of the call's own deadline are
//! the server's answer about the call, and are final.
//!
//! # Layer or interceptor?
//!
//! The [`RetryLayer`] owns retries: use it unless your code keeps its own call loop. The
//! [`ContextInterceptor`] only stamps the deadline and attempt number of the current
//! [`CallContext`](context::CallContext) onto requests, for code that retries by itself or
//! must never retry; see [`ContextInterceptor`] for which to use.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod criticality;
mod interceptor;

/// The call context (deadline and attempt number) that outgoing calls inherit; it lives in
/// the policy crate so that the server layer can set it. See [`stormguard_core::context`].
pub use stormguard_core::context;
pub mod replicas;
pub mod retry;
mod status;

pub use criticality::{CriticalityLayer, StampCriticality};
pub use interceptor::ContextInterceptor;
pub use retry::body::ResponseBody;
pub use retry::layer::RetryLayer;
pub use retry::replay::DEFAULT_REPLAY_LIMIT;
pub use retry::service::Retry;
pub use retry::stats::{RefusedCounts, RetrySnapshot, RetryStats, ThrottledCounts};
pub use status::{BoxError, code_from_tonic, code_to_tonic};

// What a user of the layer configures, and every type the layer's API names, so that one
// `use stormguard_client::{..}` holds it. `RetryController` and `AdaptiveThrottle` are the
// engine's objects the layer takes built: their own methods are the engine's API.
pub use stormguard_core::{
    A6BudgetConfig, AdaptiveThrottle, AdaptiveThrottleConfig, BackoffConfig, BreakerConfig,
    BudgetChoice, BudgetConfig, ClientConfig, Code, CodeSet, ConfigError, Criticality,
    CriticalityTable, EjectReason, EjectionConfig, Floor, Format, HealthCheckConfig, HedgeDelay,
    HedgingPolicy, LearnedDelay, LoadConfig, MethodScope, MethodTable, NotApplied,
    NotAppliedReason, Notice, RefreshConfig, ReplicaConfig, ReplicaId, ReplicaSnapshot,
    ReplicaState, ReportWeightConfig, RetryController, RetryPolicy, SaturationConfig,
    ServingStatus, SlowStartConfig, UnknownCode,
};
