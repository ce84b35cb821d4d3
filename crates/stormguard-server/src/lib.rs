//! stormguard-server: an admission queue for tonic servers that sheds retries first.
//!
//! # Why
//!
//! When a server falls behind, its queue fills, callers time out, and their clients
//! retry: the retries join the same queue, so the server works on calls whose callers
//! have already left while new callers time out in turn. The retry load alone can keep
//! the server saturated after whatever slowed it is gone (a *metastable* failure). Two
//! things break the loop:
//!
//! - **Bound the work.** A bounded number of workers (learned from latency unless
//!   [`WorkerLimit::Fixed`] says how many) and a bounded wait queue: memory stays bounded
//!   under any offered load, and work that can no longer finish in time (its `grpc-timeout`
//!   leaves less than `min_time_left`, on arrival or while queued, or it has waited
//!   `max_time_queued`) is answered `DEADLINE_EXCEEDED` instead of being given a worker.
//! - **Choose what to drop.** A retry is evidence of load already being amplified; a
//!   first attempt is a user's only chance so far. Retries are shed as soon as the queue
//!   passes a threshold; first attempts only when the queue is full. Under sustained
//!   overload retries absorb the shedding and first attempts keep the capacity.
//!
//! Every shed answer tells the client when to come back: `grpc-retry-pushback-ms` is the
//! estimated time for the queue to drain, jittered, and never `0` (gRPC C-core clients
//! never finish a call told to retry after 0 ms), or `-1` ("do not retry") for retries
//! under deep overload when configured.
//!
//! # Use
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use stormguard_server::{AdmissionConfig, AdmissionController};
//! use stormguard_server::ShedLayer;
//!
//! // Validated once, at start-up: a bad value is an error that names the field. The
//! // worker limit is learned from latency unless `workers` says `WorkerLimit::Fixed(n)`.
//! let admission = AdmissionController::new(AdmissionConfig {
//!     queue_capacity: 128,
//!     ..AdmissionConfig::default()
//! })?;
//! tonic::transport::Server::builder()
//!     .layer(ShedLayer::new(admission))
//!     // .add_service(InventoryServer::new(svc))
//!     // .add_service(OtherServer::new(other))
//! #   .add_routes(tonic::service::Routes::default())
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # Across hops
//!
//! Each call the layer runs is polled with its
//! [`CallContext`](stormguard_core::context::CallContext) set: the deadline from the
//! inbound `grpc-timeout`. A handler's outgoing calls through the client's `RetryLayer`
//! inherit what is left of it, with no code in the handler. Futures the handler spawns onto
//! other tasks do not inherit it; wrap them in
//! [`context::scope`](stormguard_core::context::scope).
//!
//! # Idempotency keys
//!
//! [`IdempotencyLayer`](idempotency::IdempotencyLayer), a layer of its own inside the
//! `ShedLayer`, hands each call's `idempotency-key` to its handler and, with a store, runs
//! each key once: a repeat of a completed call gets the recorded answer, a repeat of one
//! still running gets `ABORTED`. With it, a client may retry a write after it may have
//! run (see the [`idempotency`] module).
//!
//! # Operating notes
//!
//! - **Raise h2's pending-reset limit.** Callers that time out reset their HTTP/2
//!   streams. During a storm they can do so faster than a busy connection accepts new
//!   streams, and past h2's default of 20 such resets the server sends GOAWAY
//!   (`ENHANCE_YOUR_CALM`) and every call on the connection fails (the callers see
//!   `RESOURCE_EXHAUSTED "h2 protocol error"` or a broken pipe); raise it with
//!   `Server::builder().http2_max_pending_accept_reset_streams(..)`. The queue frees the
//!   slots of those callers either way. The repository's `docs/operating.md` ("HTTP/2
//!   resets") gives each h2 setting with its cost and the abuse its guard stops.
//! - **Early answers cost the connection nothing.** A shed or expired call is answered
//!   before its request body is read; the layer then reads and discards what the caller
//!   still sends, within bounds, because h2 closes a connection on which too many small
//!   request DATA frames arrive unread (see [`shed::drain`]).
//! - **Health checks are never shed** (`grpc.health.v1.Health`, see [`shed::exempt`]):
//!   [`ShedLayer::never_shed`] and [`ShedLayer::never_shed_if`] name more methods,
//!   [`ShedLayer::shed_health_checks`] turns the default off.
//! - **The worker is held until the response ends**: the response body ([`ShedBody`])
//!   holds it until its last frame is read or it is dropped. For a unary call that is
//!   the handler plus writing out one message; a server-streaming call holds its worker
//!   for as long as it streams, and a client-streaming call for as long as its caller
//!   sends. So streams never escape the concurrency bound; to keep them from taking the
//!   workers of unary calls, serve streaming services behind a layer of their own.
//! - **One layer is one queue**: wrap the router (`Server::builder().layer(..)`) to
//!   share workers between services, or wrap one service to bound it alone (a separate
//!   limit for a streaming service, say).
//!
//! The decision itself (attempt classes, thresholds, pushback, expiry, queue order) is
//! [`AdmissionController`], shared with the fleet simulator; this crate is the
//! queue and the tower plumbing around it.

pub mod idempotency;
pub mod shed;
#[cfg(feature = "test-util")]
pub mod test_util;

pub use shed::body::ShedBody;
pub use shed::counters::{DrainCounts, Occupancy, ShedSnapshot};
pub use shed::future::ResponseFuture;
pub use shed::layer::ShedLayer;
pub use shed::service::ShedService;
pub use shed::shutdown::ShutdownHandle;
pub use shed::stats::ShedStats;
// What a user of the layer configures, and every type the layer's API names, so that one
// `use stormguard_server::{..}` holds it. `AdmissionController` is the engine's object the
// layer takes built: its own methods are the engine's API.
pub use stormguard_core::{
    AdaptiveLimitConfig, AdmissionConfig, AdmissionController, Code, ConfigError, Criticality,
    CriticalityTable, Format, IdempotencyConfig, QueueOrder, RetryThreshold, ShedPushback,
    ShedSettings, UnknownCode, WorkerLimit,
};
