//! The interceptor's tests, one binary: over loopback with `grpc`'s own channel and a tonic
//! server (`e2e`, `hedging`, and with the `opentelemetry` feature `metrics`), and beside the
//! tonic layer on one script (`parity`).

#![allow(clippy::unwrap_used)]

mod e2e;
mod hedging;
#[cfg(feature = "opentelemetry")]
mod metrics;
mod parity;
mod support;
