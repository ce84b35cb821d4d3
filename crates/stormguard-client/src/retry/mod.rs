//! The retry middleware: a tower [`Layer`](tower_layer::Layer) for tonic channels.
//!
//! # Why a budget, not just an attempt cap
//!
//! An attempt cap bounds one call: at a 100 % failure rate, three attempts still triple the
//! load on a dependency that is already failing, and the retry load alone can keep it down
//! after the trigger is gone (a metastable failure). [`Retry`] asks the shared
//! [`RetryController`](stormguard_core::retry::RetryController) before each retry, whose
//! budget lets retries be at most a fraction of successes (plus a small floor), so the load
//! stays near `1.1 ×` however badly the dependency fails.
//!
//! # What is retried
//!
//! Per gRPC A6, only failures before the call is *committed*: a trailers-only response
//! (`grpc-status` in the response headers, which is how tonic answers a handler error), or a
//! transport error before any response headers (read as `UNAVAILABLE`). Once response
//! headers without a status arrive, the response is passed through untouched, streams
//! included, and never retried.
//!
//! # Readiness contract
//!
//! `poll_ready` readies the inner service. `call` takes that readied service for the first
//! attempt and leaves a fresh clone in its place (clone-and-swap), so the first attempt is
//! sent without waiting. A retry uses the same service after its delay and calls
//! `poll_ready` on it inside the response future before sending. The inner service must
//! therefore be `Clone`, and clones must share the connection (tonic's `Channel` does).
//!
//! # Keeping the connection healthy
//!
//! A storm of calls whose deadlines expire makes many streams end in resets. h2 closes a
//! connection that sees more than 1024 such local error resets (`GOAWAY
//! ENHANCE_YOUR_CALM`), failing every call in flight on it with `RESOURCE_EXHAUSTED` and
//! flushing the server's queue, which looks like a recovery but is an artifact. Build the
//! channel with `Endpoint::http2_max_local_error_reset_streams(None)` when calls may time
//! out in bulk.

mod future;
mod layer;

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tower_service::Service;

pub use self::future::ResponseFuture;
pub use self::layer::RetryLayer;
use crate::stats::RetryStats;
use crate::status::BoxError;

/// A tonic channel wrapped in stormguard's retry controller; built by [`RetryLayer`].
///
/// Responses pass through unchanged except when the layer gives up on a retryable failure
/// (budget, breaker, attempts, deadline): then the returned status carries
/// `grpc-retry-pushback-ms: -1`, so that a handler passing it up tells standard gRPC
/// clients above it not to retry either.
#[derive(Clone)]
pub struct Retry<S> {
    inner: S,
    shared: Arc<layer::Shared>,
}

impl<S> Retry<S> {
    /// The counters of the layer this service came from.
    pub fn stats(&self) -> RetryStats {
        self.shared.stats.clone()
    }

    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: fmt::Debug> fmt::Debug for Retry<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Retry")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B> Service<http::Request<Body>> for Retry<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>> + Clone,
    S::Error: Into<BoxError>,
{
    type Response = http::Response<B>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        let clone = self.inner.clone();
        let ready = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::start(ready, request, &self.shared)
    }
}
