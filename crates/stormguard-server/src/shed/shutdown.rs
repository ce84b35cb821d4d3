//! Graceful shutdown: the queue answers what it holds instead of dropping it.
//!
//! # Why
//!
//! A rolling deploy stops every replica in turn. tonic's graceful shutdown
//! (`serve_with_shutdown`) sends HTTP/2 `GOAWAY`, stops accepting connections and waits for
//! the streams it had accepted; but a call waiting in the `ShedLayer`'s queue is such a
//! stream, and it would wait for a worker, run late, or be cut off when the process exits.
//! Its caller learns nothing useful until then. Begun with [`ShutdownHandle::begin`], the
//! queue answers every call it holds, and every call that still arrives, with
//! `UNAVAILABLE`, `grpc-retry-pushback-ms: 1` ([`SHUTDOWN_PUSHBACK_MS`]) and
//! [`MESSAGE_SHUTTING_DOWN`]: the call never reached the handler, and a retrying client
//! (stormguard's `RetryLayer`, or any gRPC client with a retry policy for `UNAVAILABLE`)
//! tries again at once, on another replica behind a balancer. Calls already running finish;
//! their workers are given back as usual. Calls that are never shed (health checks) still
//! run, so a health service can report `NOT_SERVING` while the server drains.
//!
//! # Order
//!
//! On Kubernetes, on `SIGTERM`: the pod is already leaving the Service's endpoints, and a
//! `preStop` delay (a few seconds, longer than the clients' DNS re-resolution) keeps it
//! serving while clients see it go; then begin the queue's shutdown (with
//! `ShedLayer::with_readiness`, the health service says `NOT_SERVING` at the same moment,
//! so the readiness probe agrees), then let tonic's graceful shutdown run within
//! `terminationGracePeriodSeconds`:
//! [`ShutdownHandle::begun`] is a future to give `serve_with_shutdown`, which resolves once
//! [`begin`](ShutdownHandle::begin) is called (from a signal handler, say). The queued calls
//! are answered at once; tonic then sends `GOAWAY` and waits for the running ones.
//!
//! [`SHUTDOWN_PUSHBACK_MS`]: crate::shed::SHUTDOWN_PUSHBACK_MS
//! [`MESSAGE_SHUTTING_DOWN`]: crate::shed::MESSAGE_SHUTTING_DOWN

use std::fmt;
use std::future::Future;
use std::sync::Arc;

use stormguard_core::Instant;

use super::gate::Gate;

/// Shuts one [`ShedLayer`](crate::ShedLayer)'s queue down gracefully; cloneable, every
/// clone acts on the same queue. From [`ShedLayer::shutdown_handle`](crate::ShedLayer::shutdown_handle).
///
/// ```no_run
/// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
/// use stormguard_server::AdmissionConfig;
/// use stormguard_server::ShedLayer;
///
/// let layer = ShedLayer::from_config(&AdmissionConfig::default())?;
/// let shutdown = layer.shutdown_handle();
/// // On SIGTERM (from `tokio::signal`, say): answer the queue, then let tonic drain the
/// // running calls.
/// # let sigterm = std::future::pending::<()>();
/// let on_signal = shutdown.clone();
/// tokio::spawn(async move {
///     sigterm.await;
///     on_signal.begin();
/// });
/// tonic::transport::Server::builder()
///     .layer(layer)
///     // .add_service(InventoryServer::new(svc))
/// #   .add_routes(tonic::service::Routes::default())
///     .serve_with_shutdown("127.0.0.1:50051".parse()?, shutdown.begun())
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ShutdownHandle {
    gate: Arc<Gate>,
    #[cfg(feature = "health")]
    readiness: super::health::ReadinessCell,
}

impl ShutdownHandle {
    pub(crate) fn new(
        gate: Arc<Gate>,
        #[cfg(feature = "health")] readiness: super::health::ReadinessCell,
    ) -> Self {
        ShutdownHandle {
            gate,
            #[cfg(feature = "health")]
            readiness,
        }
    }

    /// Begins the shutdown: every call waiting in the queue is answered `UNAVAILABLE` with
    /// a pushback of 1 ms at once, and so is every call that arrives from now on; calls
    /// that already hold a worker run to their end. With a health service handed to the
    /// layer (`ShedLayer::with_readiness`, feature `health`), that service is set
    /// `NOT_SERVING` as well (on a task of the current runtime), so that the readiness
    /// probe fails and clients with health checks stop sending new calls. Returns `true` the first time, `false`
    /// when the shutdown had begun already (it cannot be undone: build a new layer for a
    /// new server).
    ///
    /// ```
    /// use stormguard_server::AdmissionConfig;
    /// use stormguard_server::ShedLayer;
    ///
    /// let layer = ShedLayer::from_config(&AdmissionConfig::default())?;
    /// let shutdown = layer.shutdown_handle();
    /// assert!(!shutdown.is_shutting_down());
    /// assert!(shutdown.begin());
    /// assert!(!shutdown.begin(), "once");
    /// assert!(shutdown.is_shutting_down());
    /// # Ok::<(), stormguard_server::ConfigError>(())
    /// ```
    pub fn begin(&self) -> bool {
        let begun = self.gate.begin_shutdown(Instant::now());
        #[cfg(feature = "health")]
        if begun && let Some(readiness) = super::health::get(&self.readiness) {
            readiness.not_serving();
        }
        if begun {
            tracing::info!(
                queue.answered = self.gate.counters().snapshot().shutting_down,
                "stormguard: shutting down, queued calls answered UNAVAILABLE"
            );
        }
        begun
    }

    /// Whether [`begin`](Self::begin) has been called.
    pub fn is_shutting_down(&self) -> bool {
        self.gate.is_closing()
    }

    /// A future that resolves once [`begin`](Self::begin) has been called (at once if it
    /// has been): the signal to give tonic's `Server::serve_with_shutdown`, so that the
    /// queue is answered before tonic's graceful shutdown sends `GOAWAY`.
    pub fn begun(&self) -> impl Future<Output = ()> + Send + use<> {
        let gate = Arc::clone(&self.gate);
        async move { gate.closed().await }
    }
}

impl fmt::Debug for ShutdownHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShutdownHandle")
            .field("shutting_down", &self.is_shutting_down())
            .finish()
    }
}
