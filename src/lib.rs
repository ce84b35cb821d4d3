//! stormguard stops retry storms and metastable failures in gRPC systems built on tonic.
//!
//! One dependency gives you all of it:
//!
//! * [`client`]: `RetryLayer`, the retry controller for tonic channels. It retries only
//!   when the failure is transient, the method is safe to repeat, time is left, the breaker
//!   is closed and a **retry budget** minted by successes can pay for it.
//! * [`server`]: `ShedLayer`, a depth-aware admission queue for tonic servers that **sheds
//!   retries before first attempts**, drops work whose deadline has passed and answers with
//!   `grpc-retry-pushback-ms`.
//! * [`engine`]: the decisions both layers make (retry controller, budgets, breaker,
//!   replica set, admission queue), for a custom call loop or a simulator, with no tonic
//!   dependency. What a layer's user configures is at that layer's root.
//!
//! Why budgets and not attempt caps: a cap bounds one request, not the fleet. At 100 %
//! failure, 3 attempts are 3× the load on a dependency that is already down, and through
//! three layers of services 27×. A budget of retries ≤ 10 % of recent successes holds the
//! whole process near 1.1×, however bad the failure, while still hiding the occasional
//! blip.
//!
//! ```no_run
//! use stormguard::client::RetryLayer;
//! use stormguard::client::ClientConfig;
//! use tonic::transport::Endpoint;
//! use tower::ServiceBuilder;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let channel = Endpoint::from_static("http://127.0.0.1:50051").connect().await?;
//! let channel = ServiceBuilder::new()
//!     .layer(RetryLayer::from_config(&ClientConfig::standard())?)
//!     .service(channel);
//! // let mut client = InventoryClient::new(channel); // the generated client, unchanged
//! # let _ = channel;
//! # Ok(())
//! # }
//! ```

pub use stormguard_client as client;
pub use stormguard_server as server;

/// The engine under both layers, for a custom call loop or a simulator: the retry
/// decision, budgets, breaker, replica set, admission queue and the wire vocabulary.
///
/// The types a layer's user configures are not repeated here: they are at the root of
/// [`client`] (`ClientConfig`, `RetryPolicy`, `BudgetConfig`, ...) and [`server`]
/// (`AdmissionConfig`, `AdmissionController`, ...). Everything else of `stormguard-core`
/// that a loop of its own needs is here, at one path each.
pub mod engine {
    pub use stormguard_core::{
        A6Budget, AdaptiveThrottle, AdmissionQueue, Arrival, AttemptEnd, AttemptPlan, Backoff,
        Begin, BreakerOpen, BreakerPermit, BreakerState, BreakerTransition, Budget, BudgetChoice,
        CONNECT_SLOT_WAIT, CallClass, CallDeadline, CallRetry, CallTimes, CircuitBreaker, CodeSet,
        Deadline, DeadlineSource, Decision, DedupCounts, DedupTable, Digest, Dispatch,
        EventSummary, Failure, HedgeDecision, Instant, KeyedBudgets, LayerName, Left, LoadReport,
        LoadReportError, MethodMap, NotApplied, NotAppliedReason, Notice, OrcaLoadReport, Pushback,
        QueueLoad, QueuedId, RateMeter, Refusal, ReplicaEvent, ReplicaId, ReplicaOutcome,
        ReplicaSet, ReplicaState, RetryBudget, RetryController, Saturation, Shed, ShedPushback,
        ShedReason, Summary, TRANSPARENT_RETRIES, Throttled, TransitionWatch, Transitions,
        UnknownCode, Unlimited, Verdict, WindowCounts, a58_weight, parse_duration,
        resolve_deadline_at, wire,
    };
}

// The README's Rust, compiled (and run where it can be) as doc tests of this crate. The
// `docs/` pages are not in the published package; their Rust is tested by
// `stormguard-demo`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
