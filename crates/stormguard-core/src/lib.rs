//! stormguard-core: the engine under stormguard's client and server layers, for custom
//! call loops and simulators.
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
//! stormguard asks *can the system afford another attempt?* rather than *has this request
//! been tried enough?*. A [`RetryBudget`] minted by successes (retries ≤ 10 % of recent
//! successes plus a small floor) holds amplification near 1.1× however bad the failure,
//! and a server that sheds retries before first attempts ([`AdmissionController`]) keeps
//! its capacity for the calls that are someone's only chance so far.
//!
//! # What is here
//!
//! The decisions, as plain types that know nothing of tonic or a runtime (http only behind
//! the `http` feature), grouped by what they decide:
//!
//! * **the retry decision**: [`RetryController`] per dependency and [`CallRetry`] per
//!   call, one ordered list of checks with a typed [`Refusal`]; its settings
//!   ([`RetryPolicy`], [`HedgingPolicy`], [`MethodTable`]), [`Backoff`] with full jitter,
//!   the [`CircuitBreaker`], the SRE client throttle ([`AdaptiveThrottle`]) and what load
//!   reports say ([`Saturation`]);
//! * **budgets**: the [`Budget`] trait, stormguard's [`RetryBudget`], per-key accounts
//!   ([`KeyedBudgets`]) and gRPC A6's token bucket ([`A6Budget`]);
//! * **the balancer**: [`ReplicaSet`], which picks a replica per attempt and ejects
//!   failing ones, and [`Refresh`], which decides when a set found by DNS is resolved
//!   again and what an answer changes;
//! * **admission**: [`AdmissionController`], the [`AdmissionQueue`] that applies it, its adaptive
//!   worker limit ([`AdaptiveLimitConfig`]) and the idempotency [`DedupTable`];
//! * **the wire** ([`wire`]): every header the layers read or write, with its one parser
//!   and encoder, and the ORCA [`LoadReport`];
//! * **configuration**: [`ClientConfig`], [`AdmissionConfig`], [`ReplicaConfig`] from
//!   JSON, YAML or TOML (see `docs/config.md`), validated with errors that name the field;
//! * the task-local call [`context`] that carries a deadline across hops.
//! * with the `opentelemetry` feature, `otel`: the OpenTelemetry instruments both retry
//!   clients record into (the tonic layer's and the `grpc` interceptor's), written once.
//!
//! Time is [`Instant`] (`tokio::time::Instant`, so tests run on paused time), and every
//! time-dependent method has an `*_at(now)` form. The `stormguard-client` and
//! `stormguard-server` layers re-export what their users configure; use this crate
//! directly to drive the same decisions from a loop of your own, as the fleet simulator
//! does.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]

/// The clock every policy object reads: `tokio::time::Instant`, which works without a
/// runtime and follows `tokio::time::pause()` in tests.
pub use tokio::time::Instant;

mod admission;
mod balance;
mod budget;
mod config;
pub mod context;
mod criticality;
mod deadline;
mod error;
mod field;
mod observe;
#[cfg(feature = "opentelemetry")]
pub mod otel;
mod retry;
pub mod wire;

#[cfg(feature = "http")]
pub use wire::body::{DeadlineCut, HeldFrames, Polled};

pub use admission::{
    AdaptiveLimitConfig, AdmissionConfig, AdmissionController, AdmissionQueue, Arrival, Begin,
    CallClass, DedupCounts, DedupTable, Digest, Dispatch, IdempotencyConfig, Left, QueueLoad,
    QueueOrder, QueuedId, RateMeter, RetryThreshold, Shed, ShedPushback, ShedReason, WorkerLimit,
};
pub use balance::weights::a58_weight;
pub use balance::{
    EjectReason, EjectionConfig, FIRST_PICK_WAIT, HealthCheckConfig, LoadConfig, ReplicaConfig,
    ReplicaEvent, ReplicaId, ReplicaOutcome, ReplicaSet, ReplicaSnapshot, ReplicaState,
    ReportWeightConfig, ServingStatus, SlowStartConfig, Unpicked,
};
pub use balance::{
    Refresh, RefreshAnswer, RefreshConfig, RefreshCounts, RefreshHealth, RefreshUpdate,
};
pub use budget::{
    A6Budget, A6BudgetConfig, Budget, BudgetConfig, FLOOR_WITHHELD_AFTER, Floor, KeyedBudgets,
    MAX_FLEET_SIZE, RetryBudget, Unlimited,
};
pub use config::{
    BudgetChoice, ClientConfig, Format, IDEMPOTENT_SETTING, NotApplied, NotAppliedReason, Notice,
    ShedSettings, parse_duration,
};
pub use criticality::{Criticality, CriticalityTable};
pub use deadline::{CallDeadline, CallTimes, Deadline, DeadlineSource, resolve_deadline_at};
pub use error::ConfigError;
pub use observe::{DEFAULT_SUMMARY_INTERVAL, EventSummary, LayerName, Summary, split_path};
pub use retry::{
    AdaptiveThrottle, AdaptiveThrottleConfig, AttemptEnd, AttemptPlan, Backoff, BackoffConfig,
    BreakerConfig, BreakerOpen, BreakerPermit, BreakerState, BreakerTransition, CONNECT_SLOT_WAIT,
    CallRetry, CircuitBreaker, CommittedCall, Decision, Failure, HedgeDecision, HedgeDelay,
    HedgingPolicy, LearnedDelay, MAX_ATTEMPTS_CAP, MethodMap, MethodScope, MethodTable, Refusal,
    RetryController, RetryPolicy, Saturation, SaturationConfig, TRANSPARENT_RETRIES, Throttled,
    TransitionWatch, Transitions, Verdict, WindowCounts,
};
pub use wire::code::{Code, CodeSet, UnknownCode};

pub use wire::orca::{LoadReport, LoadReportError, OrcaLoadReport};
pub use wire::pushback::Pushback;
