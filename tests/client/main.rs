//! End-to-end tests of the client layer (`RetryLayer`, `Replicas`, the interceptor) over
//! real tonic, one module per behaviour. One binary, so that tonic, hyper and tokio are
//! linked once; the tests that count allocations are binaries of their own
//! (`tests/client_*_allocations.rs`), since each installs its own global allocator.
#![allow(clippy::unwrap_used)]

#[path = "../support/client.rs"]
mod client_support;
#[path = "../support/server.rs"]
mod server_support;
#[path = "../support/tracing.rs"]
mod tracing_support;

mod body;
mod committed;
mod config_notices;
mod coop;
mod hedging;
mod http2;
mod http_status;
mod interceptor;
mod load_reports;
mod method_timeout;
mod observe;
mod replicas;
mod retry;
mod retry_info;
mod shed_expiry;
mod stream;
mod throttle;
mod timeout;
mod transparent;
#[path = "../support/turns.rs"]
mod turns_support;
