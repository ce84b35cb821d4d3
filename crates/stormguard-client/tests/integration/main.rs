//! The client layer against scripted inner services (`retry_layer`) and against the
//! simulator's client (`parity`) and hedged call (`hedge_parity`), in one binary.

mod hedge_parity;
mod parity;
mod retry_layer;
mod scripted;
