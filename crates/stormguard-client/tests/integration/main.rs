//! The client layer against scripted inner services (`retry_layer`) and against the
//! simulator's client (`parity`), in one binary.

mod parity;
mod retry_layer;
