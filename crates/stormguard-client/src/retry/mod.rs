//! The retry middleware: [`RetryLayer`](crate::RetryLayer) wraps a tonic channel in a
//! [`Retry`](crate::Retry) service; this module holds its [`ResponseFuture`] and, with the
//! `opentelemetry` feature, its metrics.
//!
//! An attempt cap bounds one call, not the load: at a 100 % failure rate three attempts
//! still triple what a failing dependency receives. So before each retry the service asks
//! the shared [`RetryController`](stormguard_core::RetryController), which retries only a
//! transient failure of a method safe to repeat, with time left, a closed breaker and a
//! budget that successes filled (the crate docs say why a budget).
//!
//! ```
//! use stormguard_client::{ClientConfig, RetryLayer};
//! use tower::ServiceBuilder;
//!
//! # let channel = tower::service_fn(|_: http::Request<tonic::body::Body>| async {
//! #     Ok::<_, std::convert::Infallible>(http::Response::new(tonic::body::Body::empty()))
//! # });
//! let layer = RetryLayer::from_config(&ClientConfig::default())?;
//! let service = ServiceBuilder::new().layer(layer.clone()).service(channel);
//! // Every service the layer built shares one budget, one breaker and these counters.
//! assert_eq!(layer.stats().snapshot().logical, 0);
//! # let _ = service;
//! # Ok::<(), stormguard_client::ConfigError>(())
//! ```
//!
//! What the layer retries (only before a call commits), what counts as a success for the
//! budget and the breaker (only `OK`), how a call's deadline is resolved and held, and its
//! readiness contract: the repository's `docs/retry.md`. Hedging: `docs/hedging.md`.

mod attempt;
pub(crate) mod body;
mod classify;
mod end;
mod events;
mod future;
pub(crate) mod layer;
mod load;
#[cfg(feature = "opentelemetry")]
pub mod metrics;
#[cfg(not(feature = "opentelemetry"))]
mod metrics {
    //! Without the `opentelemetry` feature a call counts nothing by method: this is empty.
    use stormguard_core::Code;

    #[derive(Debug, Default)]
    pub(crate) struct CallMetrics;

    impl CallMetrics {
        pub(crate) fn none() -> Self {
            CallMetrics
        }

        #[inline(always)]
        pub(crate) fn attempt(&mut self) {}

        #[inline(always)]
        pub(crate) fn retry(&mut self, _transparent: bool) {}

        #[inline(always)]
        pub(crate) fn hedge(&mut self) {}

        #[inline(always)]
        pub(crate) fn waiting(&mut self, _now: stormguard_core::Instant) {}

        #[inline(always)]
        pub(crate) fn ended(&mut self, _code: Code) {}
    }
}
mod record;
pub(crate) mod replay;
pub(crate) mod service;
mod shared;
pub(crate) mod stats;
mod throttle;
mod timer;

// The layer, its service and body, and its counters are at the crate's root (one path
// each); this module holds what is only read through them: the response future and, with
// the `opentelemetry` feature, the metrics.
pub use self::future::ResponseFuture;
