//! The admission queue as a tower middleware: [`ShedLayer`](crate::ShedLayer) wraps each
//! service in a [`ShedService`](crate::ShedService); this module holds what its answers
//! say, the limits of reading the bodies it discards ([`drain`]), the services it never
//! sheds ([`exempt`]) and, with `opentelemetry`, its metrics.
//!
//! # Readiness contract
//!
//! [`ShedService`](crate::ShedService) is ready exactly when its inner service is. It never waits for a
//! worker in `poll_ready`: admission happens in `call`, where the call's attempt class
//! and deadline are known, and where a call that must not wait can be answered at once.
//! Waiting in `poll_ready` would stall hyper's connection task and could shed nothing.
//!
//! # What `call` does
//!
//! 1. Lets a call that is never shed ([`exempt`]: health checks by default) through to
//!    the inner service at once, without a worker.
//! 2. Reads the attempt class (`grpc-previous-rpc-attempts`, else `x-retry-attempt`),
//!    the criticality (`stormguard-criticality`, capped by the layer's table for the
//!    method's path; see [`ShedLayer::with_criticality`](crate::ShedLayer::with_criticality)) and the deadline
//!    (`grpc-timeout`, malformed = none) from the request headers.
//! 3. Answers `DEADLINE_EXCEEDED` at once when the deadline leaves less than
//!    `min_time_left`, even with a worker free.
//! 4. Asks the [`AdmissionController`](stormguard_core::AdmissionController):
//!    - *admit*: a worker is free; the inner service is called now;
//!    - *queue*: the readied inner service and the request wait in the returned future
//!      for a worker; the inner service is called only when one is granted, so a call
//!      that expires or whose caller leaves never reaches the handler;
//!    - *shed*: the future answers at once with the shed status and
//!      `grpc-retry-pushback-ms`.
//! 5. A queued call whose expiry passes (too little `grpc-timeout` left, or queued for
//!    `max_time_queued`) is answered `DEADLINE_EXCEEDED` without running.
//! 6. Once the server is shutting down ([`ShutdownHandle::begin`](crate::ShutdownHandle::begin)), every queued call and
//!    every arrival is answered `UNAVAILABLE` with a pushback of
//!    [`SHUTDOWN_PUSHBACK_MS`], while the calls already running finish.
//!
//! After every answer the layer gives before the handler has the request (shed,
//! expired on arrival or while queued, or a queued call dropped by the transport), the
//! request body is read and discarded within bounds ([`drain`]), so the connection
//! survives any number of them.
//!
//! The worker is given back when the response body ([`ShedBody`](crate::ShedBody)) ends, is
//! dropped, or first has nothing to send, or when the future is dropped before that: a
//! streaming response holds its worker while its handler works, not while it waits for its
//! next message; the call's deadline still cuts it.
//!
//! # Where it goes, and the deadline
//!
//! `Server::builder().layer(ShedLayer::from_config(..)?)` puts all the services of a tonic
//! router behind one queue. A call still running when its deadline, less `min_time_left`
//! ([`AdmissionConfig::cut_at`](stormguard_core::AdmissionConfig::cut_at)), passes is cut,
//! streams included, so the caller reads `DEADLINE_EXCEEDED` ([`MESSAGE_DEADLINE_CUT`])
//! before tonic's own timer answers `CANCELLED`; how that timer and `Server::timeout` meet
//! the layer: the repository's `docs/config.md` ("Held to the deadline end to end"). The
//! worker limit, criticality and "do not retry": `docs/admission.md`.

pub(crate) mod body;
pub(crate) mod counters;
pub mod drain;
mod events;
pub mod exempt;
pub(crate) mod future;
pub(crate) mod gate;
#[cfg(feature = "health")]
mod health;
pub(crate) mod layer;
pub(crate) mod load;
#[cfg(feature = "opentelemetry")]
pub mod metrics;
pub(crate) mod response;
pub(crate) mod service;
pub(crate) mod shutdown;
pub(crate) mod stats;

// The layer, its service, body and future, its counters and its shutdown handle are at
// the crate's root (one path each); this module holds the rest: what the answers say, the
// limits of draining, the exempt services and, with `opentelemetry`, the metrics.
pub use response::{
    MESSAGE_DEADLINE_CUT, MESSAGE_EXPIRED, MESSAGE_QUEUE_FULL, MESSAGE_RETRY_SHED,
    MESSAGE_SHEDDABLE, MESSAGE_SHUTTING_DOWN, SHUTDOWN_PUSHBACK_MS,
};

pub(crate) use service::Shared;
