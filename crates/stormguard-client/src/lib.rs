//! stormguard-client: retries that a failing system can afford, as a tower layer for tonic
//! channels.
//!
//! # Why
//!
//! Retries multiply: three attempts at each of three layers is 27 calls to the bottom
//! service for one user request, and a per-call attempt cap does nothing against a fleet
//! of callers that all retry at once. When a dependency slows down, the retry load alone
//! can keep it saturated after the trigger is gone (a metastable failure). This crate puts
//! one [`RetryController`](stormguard_core::retry::RetryController) per dependency in front
//! of a tonic channel: a retry goes out only when the failure is retryable, the server did
//! not push back, the deadline leaves room, the breaker is closed and the shared budget
//! (retries ≤ ~10 % of successes) can pay for it.
//!
//! # Use
//!
//! ```no_run
//! use std::sync::Arc;
//! use stormguard_client::RetryLayer;
//! use stormguard_core::{
//!     budget::{Budget, BudgetConfig, RetryBudget},
//!     policy::{MethodTable, RetryPolicy},
//!     retry::RetryController,
//! };
//! use tower::ServiceBuilder;
//! # use tonic::transport::Endpoint;
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let channel = Endpoint::from_static("http://127.0.0.1:50051")
//!     // A storm of expiring calls must not get the connection closed (see `retry`).
//!     .http2_max_local_error_reset_streams(None)
//!     .connect()
//!     .await?;
//! let budget: Arc<dyn Budget> = Arc::new(RetryBudget::new(BudgetConfig::default())?);
//! let controller = RetryController::new(MethodTable::uniform(RetryPolicy::default()), budget, None, 7);
//! let layer = RetryLayer::new(controller);
//! let stats = layer.stats();
//! let svc = ServiceBuilder::new().layer(layer).service(channel);
//! // let mut client = InventoryClient::new(svc);   // the generated client, unchanged
//! # let _ = (svc, stats);
//! # Ok(()) }
//! ```
//!
//! # Layer or interceptor?
//!
//! The [`RetryLayer`] owns retries: use it unless your code keeps its own call loop. The
//! [`ContextInterceptor`] only stamps the deadline and attempt number of the current
//! [`CallContext`](context::CallContext) onto requests, for code that retries by itself or
//! must never retry; see [`interceptor`] for details.

#![cfg_attr(not(test), warn(clippy::unwrap_used))]

mod body;
pub mod interceptor;

/// The call context (deadline and attempt number) that outgoing calls inherit; it lives in
/// the policy crate so that the server layer can set it. See [`stormguard_core::context`].
pub use stormguard_core::context;
pub mod retry;
pub mod stats;
mod status;

pub use body::DEFAULT_REPLAY_LIMIT;
pub use interceptor::ContextInterceptor;
pub use retry::{ResponseBody, Retry, RetryLayer};
pub use stats::{RefusedCounts, RetryStats, StatsSnapshot};
pub use status::{BoxError, PREVIOUS_ATTEMPTS_HEADER, code_from_tonic, code_to_tonic};
