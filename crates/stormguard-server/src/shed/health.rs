//! The readiness a shutdown takes away (feature `health`): a `tonic-health` service set to
//! `NOT_SERVING` when the queue's shutdown begins.

use std::sync::{Arc, Mutex, PoisonError};

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// The readiness of one queue, shared by its layer, the layer's clones and every
/// [`ShutdownHandle`](crate::ShutdownHandle): empty until `ShedLayer::with_readiness`.
pub(crate) type ReadinessCell = Arc<Mutex<Option<Arc<Readiness>>>>;

/// Gives `cell` its readiness (the last one given wins).
pub(crate) fn set(cell: &ReadinessCell, readiness: Readiness) {
    // A poisoned lock holds an `Option`, whole: nothing to repair.
    *cell.lock().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(readiness));
}

/// The readiness `cell` holds now.
pub(crate) fn get(cell: &ReadinessCell) -> Option<Arc<Readiness>> {
    cell.lock().unwrap_or_else(PoisonError::into_inner).clone()
}

/// The health service [`ShutdownHandle::begin`](crate::ShutdownHandle::begin) sets to
/// `NOT_SERVING`.
#[derive(Clone, Debug)]
pub(crate) struct Readiness {
    reporter: HealthReporter,
    service: String,
}

impl Readiness {
    pub(crate) fn new(reporter: HealthReporter, service: String) -> Self {
        Readiness { reporter, service }
    }

    /// Sets the service `NOT_SERVING`, on a task of the current tokio runtime (the
    /// reporter's lock is async); outside a runtime, only logs that it could not.
    ///
    /// Then it ends the service's open `Watch` streams (clients that watch, as gRFC A17's
    /// client-side health checks do, have the `NOT_SERVING` first): tonic's graceful
    /// shutdown waits for every open stream, and a `Watch` never ends by itself, so without
    /// this a watching client would hold the shutdown until the process is killed. From
    /// then on the service is unknown to the health service (a `Check` or a new `Watch` is
    /// answered `NOT_FOUND`, which a readiness probe and a watching client both take as
    /// not serving) and answered at once, so nothing holds the drain.
    pub(crate) fn not_serving(&self) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                service = %self.service,
                "stormguard: shutdown begun outside a tokio runtime; the health service stays as it is"
            );
            return;
        };
        let (reporter, service) = (self.reporter.clone(), self.service.clone());
        runtime.spawn(async move {
            let mut reporter = reporter;
            reporter
                .set_service_status(&service, ServingStatus::NotServing)
                .await;
            // The streams see NOT_SERVING, then their end (a watch's last value is read
            // before its closing).
            reporter.clear_service_status(&service).await;
            tracing::info!(
                service,
                "stormguard: health set to NOT_SERVING for the shutdown"
            );
        });
    }
}
