//! The service a [`RetryLayer`](crate::RetryLayer) wraps a channel in.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tonic::body::Body;
use tower_service::Service;

use super::body::ResponseBody;
use super::future::ResponseFuture;
use super::shared::Shared;
use super::stats::RetryStats;
use crate::status::BoxError;

/// A tonic channel wrapped in stormguard's retry controller; built by
/// [`RetryLayer`](crate::RetryLayer).
///
/// Responses pass through unchanged (their body wrapped in a [`ResponseBody`], which
/// forwards it and records how a committed call ended) except when the layer gives up on a retryable failure
/// (budget, breaker, attempts, deadline): then the returned status carries
/// `grpc-retry-pushback-ms: -1`, so that a handler passing it up tells standard gRPC
/// clients above it not to retry either.
#[derive(Clone)]
pub struct Retry<S> {
    inner: S,
    // What a retry clones its service from (the first attempt uses `inner` itself).
    spare: Arc<Mutex<S>>,
    shared: Arc<Shared>,
}

impl<S> Retry<S> {
    /// `inner` behind the layer that `shared` describes.
    pub(super) fn new(inner: S, shared: Arc<Shared>) -> Self
    where
        S: Clone,
    {
        Retry {
            spare: Arc::new(Mutex::new(inner.clone())),
            inner,
            shared,
        }
    }

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
    B: http_body::Body,
{
    type Response = http::Response<ResponseBody<B>>;
    type Error = BoxError;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        ResponseFuture::start(&mut self.inner, &self.spare, request, &self.shared)
    }
}
