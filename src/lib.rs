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
//! * [`engine`]: the decisions both layers make (budgets, breaker, replica set, admission
//!   queue, the wire vocabulary), for a custom call loop or a simulator, with no tonic
//!   dependency.
//!
//! Every type has one path. What a layer's API names is in that layer's module, and what
//! both layers name is at the root ([`Code`], [`ConfigError`], [`Criticality`],
//! [`CriticalityTable`], [`Format`], [`UnknownCode`]).
//!
//! Why budgets and not attempt caps: a cap bounds one request, not the fleet. At 100 %
//! failure, 3 attempts are 3× the load on a dependency that is already down, and through
//! three layers of services 27×. A budget of retries ≤ 10 % of recent successes holds the
//! whole process near 1.1×, however bad the failure, while still hiding the occasional
//! blip.
//!
//! ```no_run
//! use stormguard::client::{ClientConfig, RetryLayer};
//! use tonic::transport::Endpoint;
//! use tower::ServiceBuilder;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let channel = Endpoint::from_static("http://127.0.0.1:50051").connect().await?;
//! let channel = ServiceBuilder::new()
//!     .layer(RetryLayer::from_config(&ClientConfig::default())?)
//!     .service(channel);
//! // let mut client = InventoryClient::new(channel); // the generated client, unchanged
//! # let _ = channel;
//! # Ok(())
//! # }
//! ```

// One path per type. The types both layers name are at the root; each layer's module holds
// what only that layer names; the engine holds the rest of `stormguard-core` that a loop of
// its own needs. (`tests/docs/api.rs` checks that no item has two paths and that every item
// of either layer is here.)
pub use stormguard_core::{Code, ConfigError, Criticality, CriticalityTable, Format, UnknownCode};

/// The retry layer for tonic channels: [`RetryLayer`](client::RetryLayer), its config and
/// counters, and [`Replicas`](client::replicas::Replicas), the balancer under it.
///
/// Everything of the crate `stormguard-client` but what both layers share, which is at
/// this crate's root ([`Code`], [`ConfigError`], [`Criticality`], [`CriticalityTable`],
/// [`Format`], [`UnknownCode`]). [`stormguard_client`]'s documentation says how the layer
/// decides and how to set it up.
pub mod client {
    pub use stormguard_client::{
        A6BudgetConfig, AdaptiveThrottle, AdaptiveThrottleConfig, BackoffConfig, BoxError,
        BreakerConfig, BudgetChoice, BudgetConfig, ClientConfig, CodeSet, ContextInterceptor,
        CriticalityLayer, DEFAULT_REPLAY_LIMIT, EjectReason, EjectionConfig, Floor,
        HealthCheckConfig, HedgeDelay, HedgingPolicy, LearnedDelay, LoadConfig, MethodScope,
        MethodTable, NotApplied, NotAppliedReason, Notice, RefreshConfig, RefusedCounts,
        ReplicaConfig, ReplicaId, ReplicaSnapshot, ReplicaState, ReportWeightConfig, ResponseBody,
        Retry, RetryController, RetryLayer, RetryPolicy, RetrySnapshot, RetryStats,
        SaturationConfig, ServingStatus, SlowStartConfig, StampCriticality, ThrottledCounts,
        code_from_tonic, code_to_tonic, context, replicas, retry,
    };
}

/// The admission queue for tonic servers: [`ShedLayer`](server::ShedLayer), its config and
/// counters, and the [`idempotency`](server::idempotency) layer.
///
/// Everything of the crate `stormguard-server` but what both layers share, which is at
/// this crate's root ([`Code`], [`ConfigError`], [`Criticality`], [`CriticalityTable`],
/// [`Format`], [`UnknownCode`]). [`stormguard_server`]'s documentation says how the queue
/// decides and how to run it.
pub mod server {
    pub use stormguard_server::{
        AdaptiveLimitConfig, AdmissionConfig, AdmissionController, DrainCounts, IdempotencyConfig,
        Occupancy, QueueOrder, ResponseFuture, RetryThreshold, ShedBody, ShedLayer, ShedPushback,
        ShedService, ShedSettings, ShedSnapshot, ShedStats, ShutdownHandle, WorkerLimit,
        idempotency, shed,
    };
}

/// The retry decision as an interceptor for the official `grpc` crate's client (a preview,
/// pinned exactly): [`RetryInterceptor`](grpc::RetryInterceptor), on the same engine as
/// [`client::RetryLayer`], and its counters. With the `grpc` feature (off by default).
///
/// Its config is the retry layer's ([`client::ClientConfig`]) and the controller it takes
/// is [`client::RetryController`]; [`stormguard_grpc`]'s documentation and the
/// repository's `docs/grpc.md` say what it does and what the preview does not allow yet.
#[cfg(feature = "grpc")]
pub mod grpc {
    #[cfg(feature = "opentelemetry")]
    pub use stormguard_grpc::metrics;
    pub use stormguard_grpc::{
        DEFAULT_REPLAY_LIMIT, InterceptorSnapshot, InterceptorStats, RetryInterceptor,
        RetryRecvStream, RetrySendStream,
    };
}

/// The engine under both layers, for a custom call loop or a simulator: the retry
/// decision, budgets, breaker, replica set, admission queue and the wire vocabulary.
///
/// A type a layer's API names is not repeated here: it is at that layer's module
/// ([`client`]: `ClientConfig`, `RetryPolicy`, and the engine objects the retry layer takes
/// built, `RetryController` and `AdaptiveThrottle`; [`server`]: `AdmissionConfig`,
/// `AdmissionController`, ...) or, when both layers name it, at the crate's root ([`Code`],
/// [`ConfigError`], ...). Everything else of `stormguard-core` that a loop of its own needs
/// is here, at one path each.
pub mod engine {
    pub use stormguard_core::{
        A6Budget, AdmissionQueue, Arrival, AttemptEnd, AttemptPlan, Backoff, BreakerOpen,
        BreakerPermit, BreakerState, BreakerTransition, Budget, CONNECT_SLOT_WAIT, CallClass,
        CallDeadline, CallRetry, CallTimes, CircuitBreaker, CommittedCall, Deadline,
        DeadlineSource, Decision, DedupTable, Dispatch, EventSummary, Failure, HedgeDecision,
        Instant, KeyedBudgets, LayerName, Left, LoadReport, LoadReportError, MethodMap,
        OrcaLoadReport, Pushback, QueueLoad, QueuedId, RateMeter, Refusal, ReplicaEvent,
        ReplicaOutcome, ReplicaSet, RetryBudget, Saturation, Shed, ShedReason, Summary,
        TRANSPARENT_RETRIES, Throttled, TransitionWatch, Transitions, Unlimited, Unpicked, Verdict,
        WindowCounts, a58_weight, parse_duration, resolve_deadline_at,
    };

    /// The wire vocabulary: the gRPC and stormguard header names and their encoders and
    /// parsers (`grpc-timeout`, `grpc-retry-pushback-ms`, the attempt number, criticality,
    /// ORCA load reports, RetryInfo). The idempotency key's error is at
    /// [`server::idempotency`](crate::server::idempotency), beside the layer that reads it.
    pub mod wire {
        pub use stormguard_core::wire::{
            AttemptClass, DO_NOT_RETRY, ENDPOINT_LOAD_METRICS_BIN, GRPC_MESSAGE,
            GRPC_PREVIOUS_RPC_ATTEMPTS, GRPC_RETRY_PUSHBACK_MS, GRPC_STATUS,
            GRPC_STATUS_DETAILS_BIN, GRPC_TIMEOUT, GrpcTimeout, IDEMPOTENCY_KEY, MAX_ALLOWANCE,
            MAX_IDEMPOTENCY_KEY_LEN, MAX_PUSHBACK_MS, MAX_RATE, MAX_REPORT_BYTES,
            MAX_STATUS_DETAILS_BYTES, MAX_UTILIZATION, QUEUE_DEPTH, RETRY_INFO_TYPE_URL,
            STORMGUARD_CRITICALITY, STORMGUARD_UNPROCESSED, StatusDetailsError, TIME_QUEUED_MS,
            TimeoutError, UuidKey, X_RETRY_ATTEMPT, X_RETRY_BUDGET, attempt_class,
            decode_grpc_timeout, encode_grpc_status, encode_grpc_timeout, encode_load_report,
            encode_pushback, encode_retry_info, http, is_unprocessed, parse_criticality,
            parse_grpc_status, parse_idempotency_key, parse_load_report, parse_retry_info,
            response_pushback,
        };
    }
}

// The README's Rust, compiled (and run where it can be) as doc tests of this crate. The
// `docs/` pages are not in the published package; their Rust is tested by
// `stormguard-demo`.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
