//! The readiness a shutdown takes away (feature `health`): a `tonic-health` service set to
//! `NOT_SERVING` when the queue's shutdown begins.

use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

/// The health service [`ShutdownHandle::begin`](super::ShutdownHandle::begin) sets to
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
            reporter
                .set_service_status(&service, ServingStatus::NotServing)
                .await;
            tracing::info!(
                service,
                "stormguard: health set to NOT_SERVING for the shutdown"
            );
        });
    }
}
