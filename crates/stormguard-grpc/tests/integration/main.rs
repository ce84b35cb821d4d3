//! The interceptor's tests, one binary: over loopback with `grpc`'s own channel and a tonic
//! server (`e2e`, `hedging`; the metrics are read in `metrics_otel.rs`), and beside the
//! tonic layer on one script (`parity`).

#![allow(clippy::unwrap_used)]

mod e2e;
mod hedging;
mod parity;
mod support;
