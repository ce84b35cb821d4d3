//! Both layers together: across hops and chains of services, deadlines on streams, network
//! faults on a simulated network, idempotency keys with lost answers, and what the layers
//! log. One module per subject, in one binary.
#![allow(clippy::unwrap_used)]

#[path = "../support/client.rs"]
mod client_support;
#[path = "../support/lossy.rs"]
mod lossy_support;
#[path = "../support/server.rs"]
mod server_support;
#[path = "../support/tracing.rs"]
mod tracing_support;

mod faults_support;
mod hops_support;

mod across_hops;
mod chain;
mod deadline_streams;
mod faults;
mod idempotency;
mod idempotency_scope;
mod tracing_events;
